"""HTTP plumbing shared by the server providers (vLLM, Ollama): pooled client, retries, error mapping.

Everything that talks to a server goes through one :class:`ServerClient` per provider:

- one pooled ``httpx.AsyncClient``, made lazily on the running event loop (and made again when a cached
  provider is reused on another loop, e.g. across ``asyncio.run`` calls);
- on demand, clients that send every request over one TCP connection (:meth:`ServerClient.one_connection`), for
  requests that must reach the same server process: a restarted server cannot answer on the old connection;
- bounded retries with exponential backoff (and ``Retry-After``, capped) for connect errors and the
  statuses 429, 502, 503 and 504 only, in the client's transport (:mod:`inference._servers.transport`), so
  requests sent by the ``openai`` client (its own retries off) and by the providers themselves are retried in
  this one place;
- one translation of failures into the error tree: transport errors, timeouts, malformed JSON, and
  :meth:`ServerClient.error_from_response`, which maps an error answer by status code first and lets each
  provider pass the cases specific to its backend;
- one reading of "the server has no such route" (:func:`is_route_missing`): FastAPI's JSON 404, and the
  plain-text 404 of Go servers (Ollama's ``404 page not found``) or of a proxy, as opposed to a backend's
  own JSON error with status 404 ("model not found").

Nothing here logs or formats request headers, so an API key never reaches a message, a repr or a log; every URL
shown or logged passes through :func:`~inference._core.redaction.redact_url` first, so credentials written into a
base URL (``http://user:KEY@host/v1``, ``?api_key=KEY``) do not either. A query in a base URL is sent with every
request (:func:`api_base` is the URL routes are built on).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging
import re
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import httpx

from inference._core.deadlines import within
from inference._core.redaction import hide_credentials_in_logs, redact_url
from inference._core.settings import refuse_two_credentials, validate_base_url
from inference._servers.answer_reading import (
    AnswerTooLarge,
    hide_request_secrets,
    read_whole,
    redirect_problem,
    server_message,
    shown_request,
)
from inference._servers.event_lines import ErrorLine, json_items
from inference._servers.transport import (
    CONNECT_TIMEOUT_MAX,
    ONE_CONNECTION,
    ONE_CONNECTION_CLIENTS_KEPT,
    RETRY_STATUSES,
    ConnectTimeoutAfterAttempts,
    PooledTransport,
    RetryPolicy,
    ssl_context,
)
from inference.exceptions import (
    ConfigurationError,
    InferenceError,
    ProtocolError,
    ProviderError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    ServerResponseError,
)

__all__ = [
    "RETRY_STATUSES",
    "ErrorHandler",
    "ErrorHandlers",
    "RetryPolicy",
    "ServerAnswer",
    "ServerClient",
    "a_server",
    "api_base",
    "check_base_url",
    "is_connect_failure",
    "is_route_missing",
    "server_root",
]


_ErrorT = TypeVar("_ErrorT", bound=InferenceError)


def _json_or_none(content: bytes) -> Any:
    """The JSON value of a body; ``None`` when it is empty or not JSON."""
    try:
        return json.loads(content) if content else None
    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        return None


def is_connect_failure(error: BaseException) -> bool:
    """True when ``error`` (or what caused it) is a failure to connect: the request never reached a server.

    Such a request is safe to send elsewhere (another replica); an error after the request was sent (a
    reset, a timeout waiting for the answer) is not.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, (httpx.ConnectError, httpx.ConnectTimeout)):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


_ROUTE_MISSING_JSON = frozenset({"Not Found", "Method Not Allowed"})
"""FastAPI's (Starlette's) ``{"detail": ...}`` for a path or method the application does not serve."""

_ROUTE_MISSING_TEXT = re.compile(r"(404\s+)?(page\s+)?not\s+found|(405\s+)?method\s+not\s+allowed", re.IGNORECASE)
"""Plain-text bodies of a missing route: Go's net/http and gin (Ollama) ``404 page not found``, Starlette
without FastAPI ``Not Found``, proxies ``404 Not Found``."""



def is_route_missing(response: httpx.Response) -> bool:
    """True when a 404/405 ``response`` says the server has no such route, not that a resource is missing.

    Backends answer a missing model or adapter with their own JSON error (``{"error": ...}``); a route the
    server lacks gets FastAPI's ``{"detail": "Not Found"}``, or a plain-text or HTML page from Go's HTTP
    server (``404 page not found``: Ollama, any gin server) or a proxy in front of the server.

    Example:
        >>> is_route_missing(httpx.Response(404, text="404 page not found"))
        True
        >>> is_route_missing(httpx.Response(404, json={"error": "model 'x' not found"}))
        False
    """
    if response.status_code not in (404, 405):
        return False
    body = _json_or_none(response.content)
    if isinstance(body, dict):
        return set(body) == {"detail"} and body["detail"] in _ROUTE_MISSING_JSON
    if body is not None:
        return False
    text = response.content.decode("utf-8", errors="replace").strip()
    if "<" in text:  # an HTML error page: look at its title or heading
        match = re.search(r"<(title|h1)[^>]*>([^<]*)<", text, re.IGNORECASE)
        text = match.group(2).strip() if match else text
    return _ROUTE_MISSING_TEXT.fullmatch(text) is not None


def a_server(server: str) -> str:
    """``server`` (a display name: ``"vLLM"``, ``"OpenAI-compatible server"``, ``"llama-server"``) as a noun phrase
    with its article, without a doubled "server".

    Example:
        >>> a_server("vLLM"), a_server("Ollama"), a_server("OpenAI-compatible server"), a_server("llama-server")
        ('a vLLM server', 'an Ollama server', 'an OpenAI-compatible server', 'a llama-server')
    """
    phrase = server if server.lower().endswith("server") else f"{server} server"
    return f"{'an' if phrase[:1].lower() in 'aeiou' else 'a'} {phrase}"


def check_base_url(base_url: str, *, provider: str, env_prefix: str) -> None:
    """Refuse a base URL that no request could be sent to, naming the setting to fix.

    The rule is :func:`inference._core.settings.validate_base_url`'s (the one the settings table applies); this
    names the provider's variable for a client built without going through the settings.

    Raises:
        ConfigurationError: The URL does not parse, has no ``http``/``https`` scheme, no valid host, a port
            outside 1-65535, whitespace or a control character.
    """
    try:
        validate_base_url(base_url, source=f"{env_prefix}_BASE_URL (or base_url)")
    except ConfigurationError as error:
        raise ConfigurationError(str(error), provider=provider, url=error.url) from None  # hidden as written


def api_base(base_url: str) -> str:
    """Return ``base_url`` without its query and trailing ``/``: the URL routes are appended to (the query is sent
    with every request by :class:`ServerClient`).

    Example:
        >>> api_base("https://gateway.example/v1/?api-version=2")
        'https://gateway.example/v1'
    """
    return base_url.partition("#")[0].partition("?")[0].rstrip("/")


def server_root(base_url: str) -> str:
    """Return ``base_url`` without its query and a trailing ``/v1``: where a server's native routes live.

    Example:
        >>> server_root("http://localhost:11434/v1")
        'http://localhost:11434'
    """
    base_url = api_base(base_url)
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


def base_url_query(base_url: str) -> tuple[tuple[str, str], ...]:
    """The parameters of ``base_url``'s query (``?api-version=2``), sent with every request."""
    return tuple(parse_qsl(urlsplit(base_url).query, keep_blank_values=True))




@dataclass(frozen=True)
class ServerAnswer:
    """An error answer from a server, as the provider-specific error handlers see it.

    Attributes:
        response: The ``httpx.Response`` (its ``request`` is the request that was sent).
        status: The HTTP status code.
        message: The server's own error message (JSON ``error.message``, ``error``, ``message`` or
            ``detail``, else the start of the body).
        route_missing: The server has no such route (:func:`is_route_missing`): FastAPI's
            ``{"detail": "Not Found"}`` 404 or a plain-text ``404 page not found``, as opposed to an
            application's own JSON error with status 404.
        operation: What was asked, for messages ("load adapter 'a1'").
        where: "<server> at <base URL>", for messages (credentials in the URL hidden).
        provider: The provider name.
        url: The provider's base URL, credentials hidden.
    """

    response: httpx.Response
    status: int
    message: str
    route_missing: bool
    operation: str
    where: str
    provider: str
    url: str

    def error(
        self, error_class: type[ServerResponseError], sentence: str, *, path: str | None = None
    ) -> ServerResponseError:
        """Build ``error_class`` carrying this answer's request, response, provider and URL."""
        return error_class(
            sentence,
            request=self.response.request,
            response=self.response,
            provider=self.provider,
            url=self.url,
            path=path,
        )


ErrorHandler = Callable[[ServerAnswer], "ServerResponseError | None"]
"""A backend-specific case: the error an answer means, or ``None`` for the generic one."""

ErrorHandlers = Mapping[int, ErrorHandler]
"""Backend-specific cases: status code -> handler returning the error, or ``None`` for the generic one."""


class ServerClient:
    """The HTTP side of one server provider: pooled client, retries and error translation.

    Args:
        provider: The provider name (``"vllm"``), carried by errors.
        server: The server's display name (``"vLLM"``), for messages.
        base_url: The configured base URL (its credentials hidden wherever it is named, its query sent with every
            request).
        timeout: Seconds to wait for one answer (connecting waits at most :data:`CONNECT_TIMEOUT_MAX`).
        max_retries: Retries of transient failures.
        env_prefix: Prefix of the provider's environment variables (``"VLLM"``), for hints.
        headers: Headers sent with every request (e.g. ``Authorization``); never logged or shown.
        retry_policy: Backoff settings; ``max_retries`` overrides its own.

    Raises:
        ConfigurationError: ``base_url`` is not a URL a request could be sent to.
    """

    def __init__(
        self,
        *,
        provider: str,
        server: str,
        base_url: str,
        timeout: float,
        max_retries: int,
        env_prefix: str,
        headers: Mapping[str, str] | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        check_base_url(base_url, provider=provider, env_prefix=env_prefix)
        self.provider = provider
        self.server = server
        self.base_url = base_url
        self.shown_url = redact_url(base_url)
        """The base URL as messages, reprs and logs show it: user information and key parameters hidden."""
        if self.shown_url != base_url:
            hide_credentials_in_logs("httpx")  # its INFO record of each request names the URL
        self.timeout = float(timeout)
        self.env_prefix = env_prefix
        self.where = f"{server} at {self.shown_url}"
        self.retry_policy = dataclasses.replace(retry_policy or RetryPolicy(), max_retries=int(max_retries))
        self.httpx_timeout = httpx.Timeout(self.timeout, connect=min(self.timeout, CONNECT_TIMEOUT_MAX))
        self.logger = logging.getLogger(f"inference.{provider}")
        self._headers = dict(headers or {})
        refuse_two_credentials(base_url, self._headers.get("Authorization"), env_prefix=env_prefix)
        self._params = base_url_query(base_url)
        ssl_context()  # made here, once per process, rather than on the event loop at first request
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: PooledTransport | None = None
        self._single = False  # a one_connection() client: one connection, not the pools
        self._kept: list[ServerClient] = []  # one-connection clients for the next one_connection()

    def __repr__(self) -> str:
        return f"ServerClient(server={self.server!r}, base_url={self.shown_url!r})"

    @property
    def max_retries(self) -> int:
        """Retries of transient failures after the first attempt."""
        return self.retry_policy.max_retries

    def client(self) -> httpx.AsyncClient:
        """The pooled client for the running event loop (made on first use, and again on a new loop)."""
        loop = asyncio.get_running_loop()
        client = self._client
        if client is None or self._loop is not loop or client.is_closed:
            if self._single:
                transport = PooledTransport(self.retry_policy, self.logger, shards=1, limits=ONE_CONNECTION)
            else:
                transport = PooledTransport(self.retry_policy, self.logger)
            # A client left on another (usually closed) loop cannot be closed from here; drop it.
            client = httpx.AsyncClient(
                transport=transport, timeout=self.httpx_timeout, headers=self._headers, params=self._params or None
            )
            self._client, self._loop, self._transport = client, loop, transport
        return client

    @property
    def connection(self) -> object | None:
        """The connection the last answer came on (httpcore's network stream), ``None`` when unknown.

        For a :meth:`one_connection` client: two answers that came on the same connection (``is``) came from the
        same server process.
        """
        return self._transport.last_connection if self._transport is not None else None

    @contextlib.asynccontextmanager
    async def one_connection(self) -> AsyncIterator[ServerClient]:
        """A client of the same server that sends its requests one at a time over one TCP connection.

        For a sequence of requests that must reach one server process (read a server's state, then send a request
        that depends on it): compare :attr:`connection` after each answer. The connection is made again only when
        it was closed (by the server, a restart, a keep-alive limit), which then shows as another
        :attr:`connection`. The client is kept for a later call, with its connection open, when the block ended
        without an error and left the connection idle; otherwise it is closed (a connection left in use would make the
        next call wait its whole timeout).
        """
        client = self._kept.pop() if self._kept else self._single_connection_client()
        clean = False
        try:
            yield client
            clean = True
        finally:
            transport = client._transport
            if clean and (transport is None or transport.at_rest()) and len(self._kept) < ONE_CONNECTION_CLIENTS_KEPT:
                self._kept.append(client)
            else:
                await client.aclose()

    def _single_connection_client(self) -> ServerClient:
        client = copy.copy(self)
        client._client, client._loop, client._transport = None, None, None
        client._single, client._kept = True, []
        return client

    async def aclose(self) -> None:
        """Close the pooled client (and kept one-connection clients) of the running loop; forget them either way."""
        client, loop = self._client, self._loop
        self._client, self._loop, self._transport = None, None, None
        kept, self._kept = self._kept, []
        for single in kept:
            await single.aclose()
        if client is not None and loop is asyncio.get_running_loop():
            await client.aclose()

    async def request(
        self,
        method: str,
        url: str,
        *,
        operation: str,
        json_body: Any = None,
        handlers: ErrorHandlers | None = None,
        content: bytes | AsyncIterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        ok_statuses: frozenset[int] = frozenset(),
    ) -> httpx.Response:
        """Send one request (with retries) and return its successful response.

        Args:
            method: The HTTP method.
            url: The full URL.
            operation: What is asked, for messages ("load adapter 'a1'").
            json_body: A body sent as JSON.
            handlers: Backend-specific error cases by status (see :meth:`error_from_response`).
            content: A raw body (bytes, or an async iterable of bytes streamed as it is read).
            headers: Headers for this request only.
            ok_statuses: Error statuses returned as answers rather than raised (``404`` for "absent"),
                unless the server has no such route (:func:`is_route_missing`).

        Raises:
            ProviderUnavailableError: Nothing answers at the URL.
            ProviderTimeoutError: No answer within the timeout.
            ProtocolError: The answer is over ``MAX_ANSWER_BYTES`` (256 MiB, decompressed).
            ServerResponseError: The server answered with an error status (a subclass chosen by status and
                by ``handlers``).
        """
        client = self.client()
        try:
            request = client.build_request(method, url, json=json_body, content=content, headers=headers)
            response = await client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise self.error_from_exception(error, operation=operation) from error
        try:
            answer = await self._read_whole(response, operation)
        finally:
            await response.aclose()
        if answer.is_error and (answer.status_code not in ok_statuses or is_route_missing(answer)):
            raise self.error_from_response(answer, operation=operation, handlers=handlers)
        if (redirect := redirect_problem(answer)) is not None:
            raise self.protocol_error(operation, redirect)
        return answer

    async def _read_whole(self, response: httpx.Response, operation: str) -> httpx.Response:
        """``response`` read whole (:func:`read_whole`) within the timeout: httpx's timeout is per read, and a server
        dripping its answer byte by byte would never time out."""
        try:
            return await within(self.timeout, read_whole(response))
        except asyncio.TimeoutError:
            raise self.timeout_error(operation, None) from None
        except AnswerTooLarge as error:
            raise self.protocol_error(operation, f"an answer of {error}") from None
        except httpx.HTTPError as error:
            raise self.error_from_exception(error, operation=operation) from error

    def parse_json(self, response: httpx.Response, *, operation: str) -> Any:
        """Return the JSON body of ``response``.

        Raises:
            ProtocolError: The body is not JSON.
        """
        try:
            return json.loads(response.content)
        except (ValueError, RecursionError) as error:  # RecursionError: JSON nested thousands deep
            raise self.protocol_error(operation, f"malformed JSON ({error})") from error

    def _error(self, error_class: type[_ErrorT], sentence: str) -> _ErrorT:
        """``error_class`` with ``sentence``, carrying this client's provider and (redacted) URL."""
        return error_class(sentence, provider=self.provider, url=self.shown_url)

    def protocol_error(self, operation: str, problem: str) -> ProtocolError:
        """An answer that does not follow the protocol, with a hint about the base URL."""
        return self._error(
            ProtocolError,
            f"{self.where} answered {operation} with {problem}: check that {self.env_prefix}_BASE_URL "
            f"(or base_url) points at {a_server(self.server)}",
        )

    def error_from_exception(
        self, error: BaseException, *, operation: str, handlers: ErrorHandlers | None = None
    ) -> InferenceError:
        """Translate an httpx or openai exception into the error tree (chain it with ``from``).

        Error statuses go through :meth:`error_from_response`; timeouts become
        :class:`ProviderTimeoutError`; connection failures :class:`ProviderUnavailableError`; malformed JSON
        :class:`ProtocolError`; a URL httpx cannot send to :class:`ConfigurationError`; an error event in a
        stream (``openai.APIError``) a :class:`ProviderError` with the server's message.
        """
        response = getattr(error, "response", None)
        if isinstance(response, httpx.Response) and response.is_error:  # openai.APIStatusError, HTTPStatusError
            return self.error_from_response(response, operation=operation, handlers=handlers)
        openai = sys.modules.get("openai")
        cause = error if isinstance(error, httpx.HTTPError) else error.__cause__
        if isinstance(cause or error, (httpx.InvalidURL, httpx.UnsupportedProtocol)):
            return self._error(
                ConfigurationError,
                f"{self.where} cannot be asked to {operation}: the URL is not usable ({cause or error}); set "
                f"{self.env_prefix}_BASE_URL (or base_url) to http://HOST:PORT/v1",
            )
        if isinstance(cause, httpx.LocalProtocolError):  # this request is not valid HTTP: not the server's fault
            return self._error(
                ConfigurationError,
                f"{self.where} was not asked to {operation}: the request could not be sent, because a header or the "
                f"URL holds a character HTTP forbids; check the API key (api_key) and {self.env_prefix}_BASE_URL (or "
                "base_url)",
            )
        if isinstance(cause, httpx.TimeoutException) or (
            openai is not None and isinstance(error, openai.APITimeoutError)
        ):
            return self.timeout_error(operation, cause)
        if isinstance(cause, (httpx.TransportError, OSError)) or (
            openai is not None and isinstance(error, openai.APIConnectionError)
        ):
            if is_connect_failure(error):
                return self._unavailable_error(cause if cause is not None else error)
            return self._broken_error(operation, cause if cause is not None else error)
        if isinstance(error, ValueError):  # json.JSONDecodeError from a body that is not JSON
            return self.protocol_error(operation, f"malformed JSON ({error})")
        if openai is not None and isinstance(error, openai.APIError):  # an error event inside a stream
            return self._error(
                ProviderError,
                f"{self.where} reported an error during {operation}: {error.message}. The server failed; its "
                "log says why",
            )
        return self._error(
            ProviderError,
            f"{self.where} failed during {operation}: {type(error).__name__}: {error}",
        )

    def timeout_error(self, operation: str, cause: BaseException | None) -> ProviderTimeoutError:
        """The error for no answer (``cause`` ``None``), or no connection, within the timeout."""
        if isinstance(cause, httpx.ConnectTimeout):
            attempts = cause.attempts if isinstance(cause, ConnectTimeoutAfterAttempts) else 1
            tried = f" ({attempts} attempts)" if attempts > 1 else ""
            what = f"accept a connection within {self.httpx_timeout.connect:g} s{tried}"
        else:
            what = f"answer within {self.timeout:g} s ({operation})"
        return self._error(
            ProviderTimeoutError,
            f"{self.where} did not {what}: check that the server is up and not overloaded, or raise the "
            f"timeout ({self.env_prefix}_TIMEOUT or timeout=)",
        )

    def _unavailable_error(self, cause: BaseException) -> ProviderUnavailableError:
        attempts = self.max_retries + 1
        tried = f"{attempts} attempts" if attempts > 1 else "1 attempt"
        detail = str(cause) or type(cause).__name__
        server = a_server(self.server).partition(" ")[2]  # "vLLM server", "llama-server"
        return self._error(
            ProviderUnavailableError,
            f"nothing answers at {self.shown_url} ({detail}; {tried}): start the {server} there, "
            f"or point {self.env_prefix}_BASE_URL (or base_url) at the running server",
        )

    def _broken_error(self, operation: str, cause: BaseException) -> ProviderUnavailableError:
        detail = str(cause) or type(cause).__name__
        return self._error(
            ProviderUnavailableError,
            f"{self.where} dropped the connection during {operation} ({detail}): the server crashed, "
            "restarted or was stopped while answering; check that it is up (its log says why), then retry",
        )

    @contextlib.asynccontextmanager
    async def stream_json_lines(
        self,
        method: str,
        url: str,
        *,
        operation: str,
        json_body: Any = None,
        handlers: ErrorHandlers | None = None,
        error_line: ErrorLine | None = None,
        sse: bool = False,
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """Send one request and read its answer as JSON lines (NDJSON), each parsed as it arrives.

        With ``sse``, the answer is server-sent events instead: the JSON of each ``data:`` line, until
        ``data: [DONE]`` (other lines, such as comments and ``event:``, are skipped).

        Entering the block sends the request and raises for an error status, mapped like :meth:`request`
        (the error body is read first); the block receives an async iterator of the parsed lines. A line
        that is an object with an ``"error"`` key is the server failing mid-answer: it is raised as
        ``error_line(message, response)``, by default a :class:`ServerResponseError`. Leaving the block
        (at the end, on ``break``, on an error, on cancellation) closes the response, which tells the
        server to stop.

        Raises:
            ProviderUnavailableError: Nothing answers at the URL, or the connection broke mid-answer.
            ProviderTimeoutError: No answer (or no next line) within the timeout.
            ProtocolError: A line is not JSON, or the stream goes over ``MAX_ANSWER_BYTES`` (256 MiB).
            ServerResponseError: The server answered with an error status, or sent an error line.
        """
        try:
            async with self.client().stream(method, url, json=json_body) as response:
                if response.is_error:
                    answer = await self._read_whole(response, operation)
                    raise self.error_from_response(answer, operation=operation, handlers=handlers)
                if (redirect := redirect_problem(response)) is not None:
                    raise self.protocol_error(operation, redirect)
                lines = json_items(self, response, operation, error_line, sse)
                try:
                    yield lines
                finally:
                    await lines.aclose()
        except InferenceError:  # ServerResponseError is an httpx.HTTPStatusError too
            raise
        except httpx.HTTPError as error:
            raise self.error_from_exception(error, operation=operation) from error

    def error_from_response(
        self, response: httpx.Response, *, operation: str, handlers: ErrorHandlers | None = None
    ) -> ServerResponseError:
        """Map an error answer to the error tree: status code first, then the backend's own cases.

        Args:
            response: The error response (its body already read).
            operation: What was asked, for the message ("generate with model 'm'").
            handlers: Backend-specific cases by status; a handler returns ``None`` to fall back to the
                generic error for that status.
        """
        answer = _answer(response, operation=operation, where=self.where, provider=self.provider, url=self.shown_url)
        handler = (handlers or {}).get(answer.status)
        if handler is not None:
            error = handler(answer)
            if error is not None:
                return error
        return answer.error(ServerResponseError, self._generic_sentence(answer))

    def _generic_sentence(self, answer: ServerAnswer) -> str:
        status = answer.status
        said = f": {answer.message}" if answer.message else ""
        head = f"{self.where} answered {status} {answer.response.reason_phrase} to {answer.operation}{said}"
        attempts = self.max_retries + 1
        if answer.route_missing:
            hint = (
                f"the server has no route {answer.response.request.url.path}; check that "
                f"{self.env_prefix}_BASE_URL (or base_url) points at {a_server(self.server)}"
            )
        elif status in (401, 403):
            hint = "the server refused the credentials; check the API key it expects"
        elif status == 429:
            hint = f"the server is rate-limiting (tried {attempts} times); lower the request rate and retry"
        elif status in RETRY_STATUSES:
            hint = (
                f"the server (or a proxy in front of it) is unavailable or overloaded (tried {attempts} "
                "times); check that it is up and retry later"
            )
        elif status >= 500:
            hint = "the server failed; its log says why"
        else:
            hint = "the server rejected the request; fix what its message names"
        return f"{head}. {hint[0].upper()}{hint[1:]}"


def _answer(response: httpx.Response, *, operation: str, where: str, provider: str, url: str) -> ServerAnswer:
    body = _json_or_none(response.content)
    message = server_message(body) if body is not None else response.text.strip()
    message = hide_request_secrets(message, response.request)
    response.request = shown_request(response.request)  # the error built from this answer carries no key
    return ServerAnswer(
        response=response,
        status=response.status_code,
        message=message[:500],
        route_missing=is_route_missing(response),
        operation=operation,
        where=where,
        provider=provider,
        url=url,
    )
