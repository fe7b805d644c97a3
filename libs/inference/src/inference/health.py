"""What ``await provider.health()`` returns: :class:`ProviderHealth`, one :class:`BackendHealth` per backend.

A backend is what answers requests: a server (each replica of a server provider), or the model in this process.
The provider's status follows from its backends: ``"up"`` when every one is up, ``"degraded"`` when some are,
``"down"`` when none is (or the provider is closed). ``inference health`` prints it and exits 0, 1 or 2 for the
three, so it serves as a container health probe (see ``docs/health.md``).

Example:
    >>> import asyncio
    >>> from inference.fake_provider import FakeProvider
    >>> asyncio.run(FakeProvider().health()).status
    'up'
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["EXIT_CODES", "BackendHealth", "HealthStatus", "ProviderHealth", "probe_servers"]

HealthStatus = Literal["up", "degraded", "down"]

EXIT_CODES: Mapping[HealthStatus, int] = {"up": 0, "degraded": 1, "down": 2}
"""The exit status of ``inference health`` for each status (2 also when the configuration is invalid)."""


@dataclass(frozen=True)
class BackendHealth:
    """One backend of a provider, as a health check found it.

    Attributes:
        name: What it is: a server's base URL (credentials hidden), or the model of an in-process provider.
        up: It answers (a server), or it can serve (a model loaded, or one that loads on first use).
        latency_s: Seconds the check took (a server's answer to ``GET /models``), where one was sent.
        models: The models it serves (a server's list; an in-process provider's model).
        adapters: The adapters it holds: those a server lists, those resident in an in-process model.
        model_loaded: In process: whether the model is in memory now (``False`` until the first request loads it);
            ``None`` for a server.
        error: Why it is down (or what is wrong although it answers), as a sentence.
    """

    name: str
    up: bool
    latency_s: float | None = None
    models: tuple[str, ...] = ()
    adapters: tuple[str, ...] = ()
    model_loaded: bool | None = None
    error: str | None = None


@dataclass(frozen=True)
class ProviderHealth:
    """A provider's health: its status and each backend's.

    Attributes:
        provider: The provider type (``vllm``, ``llamacpp``...).
        status: ``"up"`` (every backend up), ``"degraded"`` (some up) or ``"down"`` (none, or the provider closed).
        backends: One entry per backend (each replica of a server provider).
        error: Why the provider as a whole is down (closed, or the check itself failed), where it is.
    """

    provider: str
    status: HealthStatus
    backends: tuple[BackendHealth, ...] = ()
    error: str | None = None

    @classmethod
    def of(cls, provider: str, backends: Sequence[BackendHealth], error: str | None = None) -> ProviderHealth:
        """The health of ``provider`` with these backends: its status follows from how many are up."""
        up = sum(backend.up for backend in backends)
        status: HealthStatus = "up" if backends and up == len(backends) else "degraded" if up else "down"
        if error is not None:
            status = "down"
        return cls(provider, status, tuple(backends), error)

    @property
    def exit_code(self) -> int:
        """0 up, 1 degraded, 2 down: what ``inference health`` exits with."""
        return EXIT_CODES[self.status]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (what ``inference health --json`` prints)."""
        return asdict(self)


async def probe_servers(
    provider: str,
    base_urls: Sequence[str],
    *,
    api_key: str | None = None,
    timeout: float = 5.0,
) -> list[BackendHealth]:
    """``GET /models`` on each server, at once, with no retry: whether it answers, how fast, what it serves.

    The generic check of a server provider (``InferenceProvider._health``); a provider that knows more about its
    servers (replicas marked down, adapters placed) reports that instead. A server is up when it answers 2xx with
    an OpenAI model list (a JSON object whose ``data`` is a list; Ollama's ``null`` when it has no model). Anything
    else means it is down: no such route (a base URL with a wrong path), a 2xx that is no model list (a web page:
    another server at that port), a refused key (401, 403), a 5xx or any other status, a connection that fails or
    no answer within ``timeout`` seconds. Generating would fail at each of these.

    Args:
        provider: The provider type, for messages.
        base_urls: The servers' base URLs (one per replica).
        api_key: Sent as a bearer token, where set.
        timeout: Seconds to wait for each answer.

    Raises:
        MissingDependencyError: httpx is not installed (the provider's extra).
    """
    try:
        import httpx

        from inference._core.deadlines import within
        from inference._servers.http import api_base, base_url_query, is_route_missing
    except ImportError as error:  # a server provider's extra brings httpx
        from inference._core.dependencies import missing_dependency

        raise missing_dependency(error.name or "httpx", provider=provider, error=error) from error
    from inference._core.redaction import redact_url

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def probe(client: httpx.AsyncClient, base_url: str) -> BackendHealth:
        shown = redact_url(base_url)
        routes = [f"{api_base(base_url)}/models"]
        if not api_base(base_url).endswith("/v1"):  # llama-server and Ollama also answer under /v1
            routes.append(f"{api_base(base_url)}/v1/models")
        start = time.perf_counter()

        async def answer() -> httpx.Response:
            for route in routes:
                response = await client.get(route, params=base_url_query(base_url), headers=headers)
                if response.status_code != 404:
                    break
            return response

        try:  # httpx's timeout is per read: a server dripping its answer would hold the probe as long as it drips
            response = await within(timeout, answer())
        except (httpx.TimeoutException, asyncio.TimeoutError):
            return BackendHealth(shown, False, error=f"no answer within {timeout:g} s")
        except httpx.HTTPError as error:
            return BackendHealth(shown, False, error=f"{type(error).__name__}: {_first_line(error)}")
        latency = time.perf_counter() - start
        status = response.status_code
        if status in (401, 403):
            return BackendHealth(shown, False, latency, error=f"HTTP {status}: the server refused the API key")
        if status >= 500:
            return BackendHealth(shown, False, latency, error=f"HTTP {status}: the server failed")
        asked = f"GET {response.request.url.path}"
        if is_route_missing(response):
            problem = f"HTTP {status} for {asked}: the server has no such route"
        elif not 200 <= status < 300:
            problem = f"HTTP {status} for {asked}, not a list of models"
        elif (listed := _listed(response)) is None:
            problem = f"HTTP {status} for {asked} with {_what(response)}, not a list of models"
        else:
            return BackendHealth(shown, True, latency, *listed)
        hint = "no OpenAI-compatible API is served at this base URL; check its host, port and path (often ending /v1)"
        return BackendHealth(shown, False, latency, error=f"{problem}: {hint}")

    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:  # no proxy, as the providers
        return list(await asyncio.gather(*(probe(client, url) for url in base_urls)))


def _listed(response: Any) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The models and adapters of an OpenAI-compatible ``/models`` answer (vLLM lists an adapter with a
    ``parent``: its base model); ``None`` when the answer is not such a list: not JSON, or no ``data`` list in it.
    Ollama's ``/v1/models`` answers ``"data": null`` while it has no model: a list of none."""
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(body, Mapping) or "data" not in body:
        return None
    entries = body["data"] if body["data"] is not None else []
    if not isinstance(entries, list):
        return None
    models: list[str] = []
    adapters: list[str] = []
    for entry in entries:
        if isinstance(entry, Mapping) and isinstance(entry.get("id"), str):
            (adapters if entry.get("parent") else models).append(entry["id"])
    return tuple(models), tuple(adapters)


def _what(response: Any) -> str:
    """What an answer that is not a model list holds, in a few words (``an HTML page``, ``JSON without "data"``)."""
    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if not response.content:
        return "an empty body"
    if kind == "text/html" or response.content.lstrip()[:1] == b"<":
        return "an HTML page"
    if "json" in kind or response.content.lstrip()[:1] in (b"{", b"["):
        return 'JSON without a "data" list'
    return f"a {kind or 'body'} that is not JSON"


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or "no detail"
    return text.splitlines()[0]
