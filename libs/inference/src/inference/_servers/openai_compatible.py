"""Generation over the OpenAI API, shared by the providers that talk to such servers.

:class:`OpenAICompatibleProvider` sends ``/v1/chat/completions`` requests (whole and streamed), or
``/v1/completions`` requests of plain text where a subclass chooses that route (``_route``: vLLM, for a model
without a chat template), as JSON over the pooled :class:`~inference._servers.http.ServerClient` (not through
the ``openai`` client, whose request transforms and response models cost more than the rest of a call), spreads
them over one or more
servers (replicas), skips a replica that refuses connections, and maps every failure into the error tree.
A subclass gives its name, its settings (in :mod:`inference.registry`) and what its backend adds: the vLLM
provider adds runtime LoRA routes and self-healing, the OpenAI provider nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from inference._core.dependencies import import_optional
from inference._core.redaction import redact_url
from inference._core.validation import GenerationRequest
from inference._servers.http import (
    ErrorHandlers,
    ServerAnswer,
    ServerClient,
    api_base,
    is_connect_failure,
    server_root,
)
from inference.exceptions import (
    InferenceError,
    InvalidRequestError,
    ProviderError,
    ProviderUnavailableError,
    ServerModelNotFoundError,
    ServerResponseError,
)
from inference.options import OptionMap, Refused, Sent
from inference.provider import GenerationResult, InferenceProvider, StreamEvent
from inference.results import TokenLogprob

if TYPE_CHECKING:
    import httpx

__all__ = ["CHAT", "COMPLETIONS", "DOWN_SECONDS", "OpenAICompatibleProvider", "Replica", "ReplicaDown"]

CHAT = "chat"
"""The route ``/v1/chat/completions``: the prompt as chat messages, rendered by the server's chat template."""

COMPLETIONS = "completions"
"""The route ``/v1/completions``: the prompt as plain text (:attr:`GenerationRequest.plain_prompt`)."""

DOWN_SECONDS = 5.0
"""A replica that refused a connection is tried last for this long (it is still tried if all are down)."""

_QUOTED_MODEL = re.compile(r"`([^`]*)`")


class Replica:
    """One server: its pooled HTTP client, and how busy and reachable it is."""

    def __init__(self, provider: OpenAICompatibleProvider, base_url: str, settings: Mapping[str, Any]) -> None:
        self.base_url = base_url
        self.root = server_root(base_url)
        self.http = ServerClient(
            provider=provider.name,
            server=provider.server_label,
            base_url=base_url,
            timeout=settings["timeout"],
            max_retries=settings["max_retries"],
            env_prefix=provider.env_prefix,
            headers={"Authorization": f"Bearer {provider._api_key}"} if provider._api_key else None,
        )
        self.in_flight = 0
        self.down_until = 0.0
        self.max_model_len: int | None = None  # vLLM's context size (from /tokenize, or a refused max_tokens)
        self.tokenizers: dict[str, Any] = {}  # model -> what scoring found out about its tokenizer
        self.schema_style = "json_schema"  # "json_object" once the server refused OpenAI's form (llama_cpp.server)
        self.route: asyncio.Future[str] | None = None  # CHAT or COMPLETIONS, once a subclass found out (vLLM)
        root = api_base(base_url)
        self.urls = {CHAT: f"{root}/chat/completions", COMPLETIONS: f"{root}/completions"}

    async def aclose(self) -> None:
        await self.http.aclose()


class ReplicaDown(Exception):
    """A request could not reach a replica (connect failure): another replica may take it."""

    def __init__(self, error: InferenceError) -> None:
        super().__init__(str(error))
        self.error = error


class OpenAICompatibleProvider(InferenceProvider):
    """Generates through ``/v1/chat/completions`` on one or more OpenAI-compatible servers.

    Subclasses set :attr:`name` (a provider type in :mod:`inference.registry`, whose settings must include
    ``base_url``, ``api_key``, ``timeout`` and ``max_retries``), :attr:`server_label` and :attr:`env_prefix`,
    and call ``super().__init__(**arguments)`` with their constructor's arguments.

    Sampling options the OpenAI API lacks (``top_k``, ``repetition_penalty``) are sent as extra body fields,
    only when set. Streams ask for a final usage chunk (``stream_options.include_usage``).

    Attributes:
        server_label: What the server is called in messages (``"vLLM"``).
        env_prefix: Prefix of the provider's environment variables (``"VLLM"``), for hints.
        model_hint: What to do when the server does not serve the model asked for.
    """

    server_label: ClassVar[str] = "OpenAI-compatible server"
    env_prefix: ClassVar[str] = "OPENAI"
    options: ClassVar[OptionMap] = {
        "max_tokens": Sent("max_tokens"),
        "system_prompt": Sent("messages", "a first message of role system; on /v1/completions, text before the prompt"),
        "temperature": Sent("temperature"),
        "top_p": Sent("top_p"),
        "repetition_penalty": Sent("repetition_penalty", "an extension field (vLLM, SGLang); OpenAI refuses it"),
        "stop": Sent("stop"),
        "seed": Sent("seed"),
        "top_k": Sent("top_k", "an extension field (vLLM, SGLang, llama.cpp); OpenAI refuses it"),
        "logprobs": Sent("logprobs", "with top_logprobs on the chat route, a number on /v1/completions"),
        "json_schema": Sent("response_format", "OpenAI's json_schema form (llama_cpp.server: json_object)"),
        "tools": Refused("tool calling is not built yet for this backend (the fake provider calls tools, for tests)"),
        "tool_choice": Refused("tool calling is not built yet for this backend"),
        "return_token_ids": Refused("generated token ids are not built yet for this backend"),
        "n": Refused("n > 1 comes with the server slice (not built yet for this backend)"),
        "presence_penalty": Refused("presence_penalty comes with the server slice (not built yet for this backend)"),
        "frequency_penalty": Refused("frequency_penalty comes with the server slice (not built yet for this backend)"),
        "min_p": Refused("min_p comes with the server slice (not built yet for this backend)"),
        "logit_bias": Refused("logit_bias comes with the server slice (not built yet for this backend)"),
        "raw_prompt": Refused("raw prompts are not built yet for this backend"),
        "chat_template": Refused("a template override comes with the server slice (not built yet for this backend)"),
        "chat_template_kwargs": Refused("template variables come with the server slice (not built yet here)"),
        "thinking": Refused("the thinking switch is not built yet for this backend"),
        "response_format": Sent("json_schema", "mapped to json_schema before anything is sent"),
        "extra_body": Refused("extra_body comes with the server slice (not built yet for this backend)"),
        "timeout": Sent("the call's deadline", "the base class cancels the call after timeout seconds"),
    }
    model_hint: ClassVar[str] = "use a model the server serves; GET /v1/models lists them"

    def __init__(self, **arguments: Any) -> None:
        super().__init__(arguments)
        settings = self._settings
        # Imported with the provider (never by ``import inference``), not at the first request.
        import_optional("httpx", provider=self.name)
        self.base_url: str = settings["base_url"]
        self._api_key: str | None = settings["api_key"]
        self._settings = {key: value for key, value in settings.items() if key != "api_key"}  # the key: once
        self._replicas = tuple(Replica(self, url, settings) for url in self.base_url.split(",") if url)
        self._cursor = itertools.count()
        self._logger = logging.getLogger(f"inference.{self.name}")

    def __repr__(self) -> str:
        key = "***" if self._api_key else "None"
        return f"{type(self).__name__}(base_url={redact_url(self.base_url)!r}, api_key={key})"

    @property
    def replicas(self) -> tuple[str, ...]:
        """The base URLs of the servers this provider uses, in configuration order."""
        return tuple(replica.base_url for replica in self._replicas)

    @property
    def timeout(self) -> float:
        """Seconds to wait for one answer."""
        return self._replicas[0].http.timeout

    @property
    def max_retries(self) -> int:
        """Retries of transient failures."""
        return self._replicas[0].http.max_retries

    async def aclose(self) -> None:
        """Close the pooled connections. The provider makes new ones if it is used again."""
        for replica in self._replicas:
            await replica.aclose()

    # Generation -----------------------------------------------------------------------------------------

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        async with self._chat(request, stream=False) as (replica, route, completion):
            try:
                choice = completion["choices"][0]
                message = choice["message"] if route == CHAT else None
                text = (message.get("content") if message is not None else choice.get("text")) or ""
                if not isinstance(text, str):
                    raise TypeError(f"the answer's text is {type(text).__name__}, not text")
                usage = completion.get("usage")
                # A server that reports no usage: the completion tokens are unknown too, so 0 as before, and
                # the prompt's tokens are None, as in a stream without usage.
                prompt_tokens: int | None
                prompt_tokens, completion_tokens = _token_counts(usage) if usage is not None else (None, 0)
                answered_model = _model_name(completion.get("model"), request)
                finish_reason = choice.get("finish_reason")
                reasoning = reasoning_of(message) if message is not None else ""
                logprobs = (
                    self._logprobs(replica, request, _LOGPROBS[route](choice.get("logprobs"), request.logprobs),
                                   completion_tokens)
                    if request.logprobs is not None
                    else None
                )
            except (AttributeError, IndexError, KeyError, TypeError) as error:
                raise replica.http.protocol_error(
                    operation_of(request), f"an answer that is not a {route} completion ({error!r})"
                ) from error
        return _result(
            request, text, answered_model, finish_reason, prompt_tokens, completion_tokens, logprobs, reasoning
        )

    def _logprobs(
        self, replica: Replica, request: GenerationRequest, entries: list[TokenLogprob], tokens: int
    ) -> list[TokenLogprob]:
        """The token logprobs of an answer; a server that sends none for generated tokens is refused."""
        if not entries and tokens > 0:
            raise replica.http.protocol_error(
                operation_of(request),
                "an answer without the token logprobs asked for (logprobs/top_logprobs): the server does not "
                "support them on chat completions; ask without logprobs, or use a server that has them (vLLM)",
            )
        return entries

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """Stream the chat completion, asking for a final usage chunk (``stream_options.include_usage``).

        A server that sends that chunk (vLLM, OpenAI) gives the counts :meth:`generate` gives. A server that
        ignores the option (llama_cpp.server) sends one chunk per generated token: the completion tokens are
        counted from those chunks, and the prompt tokens, which such a server does not report, are ``None``
        (so is ``token_count``).
        """
        operation = operation_of(request)
        async with self._chat(request, stream=True) as (replica, route, events):
            pieces: list[str] = []
            finish_reason: str | None = None
            counts: tuple[int, int] | None = None
            answered_model = request.adapter_id or request.model
            token_chunks = 0
            logprobs: list[TokenLogprob] = []
            thoughts: list[str] = []
            iterator = events.__aiter__()
            while True:
                try:
                    chunk = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                except InferenceError:
                    raise
                except Exception as error:
                    raise replica.http.error_from_exception(error, operation=operation) from error
                try:
                    answered_model = _model_name(chunk.get("model"), request, answered_model)
                    if chunk.get("usage") is not None:
                        counts = _token_counts(chunk["usage"])
                    choices = chunk.get("choices") or []
                    delta = choices[0].get("delta") if choices and route == CHAT else None
                    content = delta.get("content") if delta is not None else choices[0].get("text") if choices else None
                    if content is not None and not isinstance(content, str):
                        raise TypeError(f"the chunk's text is {type(content).__name__}, not text")
                    finished = choices[0].get("finish_reason") if choices else None
                    if request.logprobs is not None and choices:
                        logprobs.extend(_LOGPROBS[route](choices[0].get("logprobs"), request.logprobs))
                    announces_role = delta is not None and bool(delta.get("role"))
                    if delta is not None:
                        thoughts.append(reasoning_of(delta))
                except (AttributeError, IndexError, KeyError, TypeError) as error:
                    raise replica.http.protocol_error(
                        operation, f"a stream chunk that is not a {route} chunk ({error})"
                    ) from error
                if finished:
                    finish_reason = str(finished)
                # One chunk per token, even an empty piece (part of a multi-byte character); not the chunk
                # that only announces the role, nor an empty closing chunk.
                if content is not None and not ((announces_role or finished) and content == ""):
                    token_chunks += 1
                if content:
                    pieces.append(content)
                    yield content
            if finish_reason is None:
                raise replica.http.protocol_error(
                    operation,
                    "a stream that ended without a finish_reason (it was cut short, or is not an OpenAI "
                    "chat completion stream)",
                )
        prompt_tokens: int | None
        prompt_tokens, completion_tokens = counts if counts is not None else (None, token_chunks)
        if request.logprobs is not None and not logprobs and completion_tokens > 0:
            self._logprobs(replica, request, [], completion_tokens)  # raises: the server sent none
        yield _result(
            request,
            "".join(pieces),
            answered_model,
            finish_reason,
            prompt_tokens,
            completion_tokens,
            logprobs if request.logprobs is not None else None,
            "".join(thoughts),
        )

    @asynccontextmanager
    async def _chat(self, request: GenerationRequest, *, stream: bool) -> AsyncIterator[tuple[Replica, str, Any]]:
        """Send the request to a replica on its route and hold it there until the caller is done with the answer.

        Replicas are tried least-busy first (round-robin among equals); one that cannot be reached is
        skipped. A stream is closed on exit, which makes the server abort the generation.
        """
        failures: list[tuple[Replica, InferenceError]] = []
        for replica in self._replicas_for(request):
            replica.in_flight += 1
            self._started_on(replica, request)
            try:
                try:
                    route = await self._route(replica, request)
                    arguments = request_arguments(
                        request, route, stream=stream, schema_style=replica.schema_style, options=self.options
                    )
                    try:
                        answer = await self._create(replica, request, arguments)
                    except ServerResponseError as refused:
                        other = self._other_route(replica, route, refused)
                        if other is None:
                            raise
                        route = other
                        arguments = request_arguments(
                            request, route, stream=stream, schema_style=replica.schema_style, options=self.options
                        )
                        answer = await self._create(replica, request, arguments)
                except ReplicaDown as down:
                    replica.down_until = time.monotonic() + DOWN_SECONDS
                    failures.append((replica, down.error))
                    if len(self._replicas) > 1:
                        self._logger.warning(
                            "%s replica %s is unreachable; trying another", self.server_label, replica.http.shown_url
                        )
                    continue
                replica.down_until = 0.0
                try:
                    yield replica, route, answer
                finally:
                    if stream:
                        await answer.aclose()
                return
            finally:
                replica.in_flight -= 1
                self._finished_on(replica, request)
        raise self._all_down(failures)

    async def _route(self, replica: Replica, request: GenerationRequest) -> str:
        """The route of ``request`` on ``replica``: :data:`CHAT` here; vLLM also sends :data:`COMPLETIONS`.

        Raises:
            ReplicaDown: Finding out needed the replica, and it did not accept the connection.
        """
        return CHAT

    def _other_route(self, replica: Replica, route: str, refused: ServerResponseError) -> str | None:
        """The route to send a request again on after ``replica`` refused it on ``route``; ``None`` (here): none.

        The OpenAI provider's ``api="auto"`` goes to :data:`COMPLETIONS` when chat is refused for want of a chat
        template.
        """
        return None

    def _replicas_for(self, request: GenerationRequest) -> list[Replica]:
        """The replicas to try for ``request``, in order (least busy first; vLLM places adapters on demand)."""
        return self._replicas_in_order()

    def _started_on(self, replica: Replica, request: GenerationRequest) -> None:
        """``request`` is about to go to ``replica`` (a hook: vLLM's on-demand placement counts it)."""

    def _finished_on(self, replica: Replica, request: GenerationRequest) -> None:
        """``request`` is done with ``replica``, answered or not."""

    def _replicas_in_order(self) -> list[Replica]:
        count = len(self._replicas)
        start = next(self._cursor) % count
        rotated = self._replicas[start:] + self._replicas[:start]
        now = time.monotonic()
        up = sorted((replica for replica in rotated if replica.down_until <= now), key=lambda r: r.in_flight)
        return up + [replica for replica in rotated if replica.down_until > now]

    def _all_down(self, failures: list[tuple[Replica, InferenceError]]) -> InferenceError:
        if len(failures) == 1:
            return failures[0][1]
        said = "; ".join(f"{replica.http.shown_url}: {error}" for replica, error in failures)
        return ProviderUnavailableError(
            f"none of the {len(failures)} {self.server_label} replicas accepts connections ({said}): start them, "
            f"or remove the URLs of stopped servers from {self.env_prefix}_BASE_URL (or base_url)",
            provider=self.name,
            url=self.base_url,
        )

    async def _create(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """One chat request on ``replica``; a ``json_schema`` the server refuses is an invalid request.

        A server that refuses OpenAI's ``response_format`` type ``json_schema`` itself (llama_cpp.server: a 422
        or 500 naming the allowed types) is asked again with ``{"type": "json_object", "schema": ...}``, and the
        replica remembers it.

        Raises:
            ReplicaDown: The replica did not accept the connection (another may take the request).
            InvalidRequestError: The server could not use the ``json_schema`` (a 400 or 422 about it).
            InferenceError: Any other failure, mapped by :meth:`_generation_error`.
        """
        try:
            return await self._send(replica, request, arguments)
        except ServerResponseError as error:
            if request.json_schema is None or error.status_code not in (400, 422, 500):
                raise
            refused = error
        # llama_cpp.server 0.3 answers 500 with pydantic's literal_error ("Input should be 'text' or 'json_object'")
        if replica.schema_style == "json_schema" and _refuses_schema_type(str(refused)):
            replica.schema_style = "json_object"
            retry = {**arguments, "response_format": response_format(request.json_schema, "json_object")}
            try:
                return await self._send(replica, request, retry)
            except ServerResponseError as error:
                if error.status_code not in (400, 422):
                    raise
                refused = error
        if refused.status_code not in (400, 422) or not _about_schema(str(refused)):
            raise refused
        raise InvalidRequestError(
            f"{replica.http.where} could not use the json_schema ({refused}): simplify the schema to what the "
            "server's structured-output backend supports (OpenAI's strict mode needs additionalProperties false "
            "and every property required)",
            provider=self.name,
        ) from refused

    async def _send(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """One chat request on ``replica``, as it is.

        Raises:
            ReplicaDown: The replica did not accept the connection (another may take the request).
            InferenceError: Any other failure, mapped by :meth:`_generation_error`.
        """
        try:
            return await self._call(replica, request, arguments)
        except InferenceError as error:
            if is_connect_failure(error):
                raise ReplicaDown(error) from error
            raise

    async def _call(
        self,
        replica: Replica,
        request: GenerationRequest,
        arguments: dict[str, Any],
        *,
        reloaded_from: str | None = None,
        http: ServerClient | None = None,
    ) -> Any:
        """POST ``arguments`` to their route (``/completions`` when they carry a ``prompt``, else
        ``/chat/completions``): the parsed JSON answer, or for a stream an open :class:`ServerEvents`.

        ``http`` sends it (a :meth:`~ServerClient.one_connection` client); by default the replica's pooled client.

        Raises:
            InferenceError: The request failed, mapped by status with :meth:`_generation_handlers`.
        """
        http = http or replica.http
        url = replica.urls[COMPLETIONS if "prompt" in arguments else CHAT]
        operation = operation_of(request)
        handlers = self._generation_handlers(request, reloaded_from)
        if arguments.get("stream"):
            return await ServerEvents.open(http, url, arguments, operation=operation, handlers=handlers)
        response = await http.request("POST", url, operation=operation, json_body=arguments, handlers=handlers)
        return http.parse_json(response, operation=operation)

    def _generation_handlers(self, request: GenerationRequest, reloaded_from: str | None) -> ErrorHandlers:
        def not_found(answer: ServerAnswer) -> ServerResponseError | None:
            return self._generation_not_found(answer, request, reloaded_from)

        return {404: not_found}

    def _generation_not_found(
        self, answer: ServerAnswer, request: GenerationRequest, reloaded_from: str | None
    ) -> ServerResponseError | None:
        """A 404 to a chat request: a missing route (wrong base URL) or a model the server does not serve."""
        if answer.route_missing:
            return answer.error(
                ServerResponseError,
                f"{answer.where} has no route {answer.response.request.url.path}: set {self.env_prefix}_BASE_URL "
                "(or base_url) to the server's OpenAI-compatible base URL, which ends with /v1",
            )
        return answer.error(
            ServerModelNotFoundError,
            f"{answer.where} does not serve model {quoted_model(answer) or request.model!r} ({answer.message}): "
            f"{self.model_hint}",
        )


def _refuses_schema_type(message: str) -> bool:
    """A validation error refusing ``response_format.type`` ``json_schema`` (llama_cpp.server's 422)."""
    return "json_schema" in message and "json_object" in message


def _about_schema(message: str) -> bool:
    """A 400/422 that names the schema, the grammar or the response format (not, say, ``max_tokens``)."""
    lowered = message.lower()
    return any(word in lowered for word in ("schema", "grammar", "response_format", "structured", "guided"))


def quoted_model(answer: ServerAnswer) -> str | None:
    """The model name an error message quotes in backticks (vLLM, OpenAI: "The model `x` does not exist")."""
    quoted = _QUOTED_MODEL.search(answer.message)
    return quoted.group(1) if quoted else None


def operation_of(request: GenerationRequest) -> str:
    """What the request does, for messages: ``generate with model 'x'`` or ``... with adapter 'a'``."""
    if request.adapter_id:
        return f"generate with adapter {request.adapter_id!r}"
    return f"generate with model {request.model!r}"


def _token_counts(usage: Any) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` of an OpenAI ``usage`` object.

    Raises:
        TypeError: A count is missing or not a non-negative integer.
    """
    counts = (_field(usage, "prompt_tokens"), _field(usage, "completion_tokens"))
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise TypeError(f"usage has token counts {counts!r}, not non-negative integers")
    return counts


def _model_name(answered: Any, request: GenerationRequest, default: str | None = None) -> str:
    """The model the server says answered, else ``default`` (else the adapter or model asked for).

    Raises:
        TypeError: The server's ``model`` is not a string.
    """
    if answered is not None and not isinstance(answered, str):
        raise TypeError(f"model is {type(answered).__name__}, not a name")
    return answered or default or request.adapter_id or request.model


SCHEMA_NAME = "output"
"""The name sent with a JSON schema (OpenAI's ``response_format.json_schema.name`` is required)."""


def response_format(schema: Mapping[str, Any], style: str) -> dict[str, Any]:
    """The ``response_format`` that constrains the output to ``schema``.

    ``"json_schema"`` is OpenAI's form, which vLLM and OpenAI accept; ``"json_object"`` is the form
    llama_cpp.server accepts (``{"type": "json_object", "schema": ...}``, which it compiles to a grammar).
    """
    if style == "json_object":
        return {"type": "json_object", "schema": dict(schema)}
    return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": dict(schema), "strict": True}}


def request_arguments(
    request: GenerationRequest,
    route: str = CHAT,
    *,
    stream: bool,
    schema_style: str = "json_schema",
    options: OptionMap | None = None,
) -> dict[str, Any]:
    """The JSON body for ``route``: only what the caller set, each sampling option under the field its provider's
    ``options`` names (``top_k`` and ``repetition_penalty``, which the OpenAI API lacks, as vLLM's extra fields;
    llama-server's ``repeat_penalty``); ``json_schema`` as ``response_format`` (see :func:`response_format`).

    :data:`CHAT` sends the chat ``messages`` and ``logprobs`` as ``logprobs: true, top_logprobs: k``;
    :data:`COMPLETIONS` sends the plain-text ``prompt`` (the contents separated by blank lines, as for a model
    without a chat template in process) and ``logprobs`` as the number ``k``.
    """
    fields = OpenAICompatibleProvider.options if options is None else options
    model = request.adapter_id or request.model
    arguments: dict[str, Any] = {"model": model}
    if route == CHAT:
        arguments["messages"] = request.messages  # the one message rule (GenerationRequest.messages)
    else:
        arguments["prompt"] = request.plain_prompt
    for name in _SAMPLING:
        value = getattr(request, name)
        sent = fields[name]
        if value is not None and isinstance(sent, Sent):
            arguments[sent.field] = value
    if request.stop:
        arguments["stop"] = list(request.stop)
    if request.logprobs is not None and route == CHAT:
        arguments["logprobs"] = True
        arguments["top_logprobs"] = request.logprobs
    elif request.logprobs is not None:
        arguments["logprobs"] = request.logprobs
    if request.json_schema is not None:
        arguments["response_format"] = response_format(request.json_schema, schema_style)
    if stream:
        arguments["stream"] = True
        arguments["stream_options"] = {"include_usage": True}
    return arguments


_SAMPLING = ("max_tokens", "temperature", "top_p", "seed", "repetition_penalty", "top_k")
"""The options sent as one number each, under the field the provider's ``options`` names."""


def _field(value: Any, name: str) -> Any:
    """``value[name]`` of a JSON object, else ``value.name``; ``None`` when absent."""
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


def token_logprobs(logprobs: Any, k: int) -> list[TokenLogprob]:
    """The entries of an OpenAI ``choices[i].logprobs`` object: ``content[j].{token, logprob, top_logprobs}``.

    The alternatives are sorted best first and cut to ``k`` (llama_cpp.server adds the chosen token to them).

    Raises:
        TypeError: An entry has no text token or no numeric logprob.
    """
    content = _field(logprobs, "content") if logprobs is not None else None
    entries: list[TokenLogprob] = []
    for entry in content or ():
        token, logprob = _field(entry, "token"), _field(entry, "logprob")
        if not isinstance(token, str) or isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
            raise TypeError(f"a logprobs entry without a token and a logprob: {entry!r:.200}")
        top: list[tuple[str, float]] = []
        for alternative in _field(entry, "top_logprobs") or ():
            text, value = _field(alternative, "token"), _field(alternative, "logprob")
            if isinstance(text, str) and isinstance(value, (int, float)) and not isinstance(value, bool):
                top.append((text, float(value)))
        top.sort(key=lambda pair: pair[1], reverse=True)
        entries.append(TokenLogprob(token=token, logprob=float(logprob), top_logprobs=tuple(top[:k])))
    return entries


def completion_logprobs(logprobs: Any, k: int) -> list[TokenLogprob]:
    """The entries of a ``/v1/completions`` ``choices[i].logprobs`` object: parallel lists ``tokens``,
    ``token_logprobs`` and ``top_logprobs`` (one ``{token: logprob}`` map per token), the alternatives sorted best
    first and cut to ``k``.

    Raises:
        TypeError: The lists are not parallel, or a token has no text or no numeric logprob.
    """
    if logprobs is None:
        return []
    tokens = _field(logprobs, "tokens") or []
    values = _field(logprobs, "token_logprobs") or []
    tops = _field(logprobs, "top_logprobs") or [None] * len(tokens)
    if not len(tokens) == len(values) == len(tops):
        raise TypeError(f"logprobs lists of different lengths: {logprobs!r:.200}")
    entries: list[TokenLogprob] = []
    for token, logprob, top in zip(tokens, values, tops, strict=True):
        if not isinstance(token, str) or isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
            raise TypeError(f"a logprobs entry without a token and a logprob: {token!r:.100}, {logprob!r:.100}")
        alternatives = [
            (str(text), float(value))
            for text, value in (top or {}).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        alternatives.sort(key=lambda pair: pair[1], reverse=True)
        entries.append(TokenLogprob(token=token, logprob=float(logprob), top_logprobs=tuple(alternatives[:k])))
    return entries


_LOGPROBS = {CHAT: token_logprobs, COMPLETIONS: completion_logprobs}
"""Route -> the reader of its answers' ``logprobs``."""


def _result(
    request: GenerationRequest,
    text: str,
    model: str,
    finish_reason: str | None,
    prompt_tokens: int | None,
    completion_tokens: int,
    logprobs: list[TokenLogprob] | None = None,
    reasoning: str | None = None,
) -> GenerationResult:
    """The result of a whole or streamed chat completion; ``None`` prompt tokens make the total unknown too."""
    return GenerationResult(
        text=text,
        model=model,
        adapter_id=request.adapter_id,
        token_count=None if prompt_tokens is None else prompt_tokens + completion_tokens,
        finish_reason="length" if finish_reason == "length" else "stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        logprobs=tuple(logprobs or ()) if request.logprobs is not None else None,
        reasoning=reasoning or None,
    )


def reasoning_of(message: Any) -> str:
    """A reasoning model's thinking in a chat message or stream delta: vLLM's ``reasoning`` field (older servers
    and some gateways say ``reasoning_content``); ``""`` when there is none."""
    for name in ("reasoning", "reasoning_content"):
        value = _field(message, name)
        if isinstance(value, str) and value:
            return value
    return ""


class ServerEvents:
    """An open server-sent-events answer (``data: {...}`` lines until ``data: [DONE]``), each event parsed.

    Iterate it for the events; :meth:`aclose` closes the response, which tells the server to stop generating.
    An event with an ``"error"`` key (the server failing mid-answer) is raised as a :class:`ProviderError`.
    """

    def __init__(self, context: contextlib.AbstractAsyncContextManager[AsyncIterator[Any]]) -> None:
        self._context = context
        self._events: AsyncIterator[Any] | None = None

    @classmethod
    async def open(
        cls, http: ServerClient, url: str, body: Any, *, operation: str, handlers: ErrorHandlers
    ) -> ServerEvents:
        """Send the request and return once the answer's status is in (an error status is raised, mapped)."""

        def error_event(message: str, response: httpx.Response) -> InferenceError:
            return ProviderError(
                f"{http.where} reported an error during {operation}: {message}. The server failed; its log says why",
                provider=http.provider,
                url=http.shown_url,
            )

        events = cls(
            http.stream_json_lines(
                "POST", url, operation=operation, json_body=body, handlers=handlers, error_line=error_event, sse=True
            )
        )
        events._events = await events._context.__aenter__()
        return events

    def __aiter__(self) -> AsyncIterator[Any]:
        assert self._events is not None
        return self._events

    async def aclose(self) -> None:
        """Close the answer (the server stops generating). Safe to call twice."""
        if self._events is not None:
            self._events = None
            await self._context.__aexit__(None, None, None)
