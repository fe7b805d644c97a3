"""The vLLM provider: generation over the OpenAI-compatible API, LoRA adapters over vLLM's runtime routes.

One provider may front several vLLM servers (replicas): adapters are loaded on every replica (all or
nothing), generations are spread across them and skip a replica that does not accept connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inference._core.dependencies import import_optional
from inference._core.validation import GenerationRequest
from inference._servers.http import ServerAnswer, ServerClient, is_connect_failure, server_root
from inference.adapters.peft import read_peft_adapter
from inference.config import resolve_settings
from inference.exceptions import (
    InferenceError,
    InvalidAdapterError,
    ProviderUnavailableError,
    RuntimeLoRADisabledError,
    ServerAdapterAlreadyLoadedError,
    ServerAdapterNotFoundError,
    ServerInvalidAdapterError,
    ServerModelNotFoundError,
    ServerResponseError,
)
from inference.provider import GenerationResult, InferenceProvider, StreamEvent

if TYPE_CHECKING:
    import httpx
    from openai import AsyncOpenAI

__all__ = ["ReconcileReport", "ReplicaReconciliation", "VLLMProvider"]

# Imported with the module (never by ``import inference``), not at first request: importing openai takes
# about half a second, which must not stall a running event loop.
_openai = import_optional("openai", extra="vllm", provider="vllm")

logger = logging.getLogger("inference.vllm")

_NO_API_KEY = "EMPTY"
"""What the openai client sends when no key is configured (vLLM without --api-key ignores it)."""

_RUNTIME_LORA_HINT = "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"
_QUOTED_MODEL = re.compile(r"`([^`]*)`")

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's ``--max-lora-rank`` accepts."""

DOWN_SECONDS = 5.0
"""A replica that refused a connection is tried last for this long (it is still tried if all are down)."""


@dataclass(frozen=True)
class ReplicaReconciliation:
    """What :meth:`VLLMProvider.reconcile_adapters` found and did on one replica.

    Attributes:
        base_url: The replica's base URL.
        reloaded: Adapters the provider had loaded that the server had lost, loaded again.
        failed: Adapters the server had lost that could not be loaded again (the log says why).
        unexpected: LoRA adapters the server serves that this provider did not load (``--lora-modules``,
            a resolver plugin, another client); left alone.
        error: Why the replica could not be reconciled (e.g. it is down), else ``None``.
    """

    base_url: str
    reloaded: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class ReconcileReport:
    """The outcome of :meth:`VLLMProvider.reconcile_adapters`, one entry per replica.

    Attributes:
        replicas: One :class:`ReplicaReconciliation` per replica, in configuration order.
    """

    replicas: tuple[ReplicaReconciliation, ...]

    @property
    def reloaded(self) -> list[str]:
        """Adapters reloaded on at least one replica, sorted."""
        return sorted({adapter_id for replica in self.replicas for adapter_id in replica.reloaded})

    @property
    def unexpected(self) -> list[str]:
        """Adapters some replica serves that this provider did not load, sorted."""
        return sorted({adapter_id for replica in self.replicas for adapter_id in replica.unexpected})

    @property
    def ok(self) -> bool:
        """True when every replica answered and holds every adapter the provider loaded."""
        return all(replica.error is None and not replica.failed for replica in self.replicas)


class _Replica:
    """One vLLM server: its HTTP client, openai client, LoRA routes and load counters."""

    def __init__(self, provider: VLLMProvider, base_url: str, settings: dict[str, Any]) -> None:
        self.base_url = base_url
        self.http = ServerClient(
            provider=provider.name,
            server="vLLM",
            base_url=base_url,
            timeout=settings["timeout"],
            max_retries=settings["max_retries"],
            env_prefix="VLLM",
            headers={"Authorization": f"Bearer {provider._api_key}"} if provider._api_key else None,
        )
        root = server_root(base_url)
        self.load_url = f"{root}/v1/load_lora_adapter"
        self.unload_url = f"{root}/v1/unload_lora_adapter"
        self.models_url = f"{root}/v1/models"
        self.in_flight = 0
        self.down_until = 0.0
        self._api_key = provider._api_key
        self._openai: AsyncOpenAI | None = None
        self._openai_http: httpx.AsyncClient | None = None

    def openai(self) -> AsyncOpenAI:
        """The openai client over the pooled HTTP client (made again when the pooled client changes)."""
        http_client = self.http.client()
        if self._openai is None or self._openai_http is not http_client:
            self._openai = _openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._api_key or _NO_API_KEY,
                http_client=http_client,
                timeout=self.http.httpx_timeout,
                max_retries=0,  # retries live in the pooled client's transport
            )
            self._openai_http = http_client
        return self._openai

    async def aclose(self) -> None:
        self._openai = None
        self._openai_http = None
        await self.http.aclose()


class _ReplicaDown(Exception):
    """A request could not reach a replica (connect failure): another replica may take it."""

    def __init__(self, error: InferenceError) -> None:
        super().__init__(str(error))
        self.error = error


class VLLMProvider(InferenceProvider):
    """Generates through one or more vLLM servers and loads LoRA adapters into them at run time.

    Generation uses the OpenAI-compatible ``/v1/chat/completions`` route through the ``openai`` client;
    an adapter is chosen by sending its id as the ``model``. ``load_adapter``/``unload_adapter`` call
    vLLM's runtime routes, which exist only when the server runs with ``--enable-lora`` and
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``. An adapter directory that exists on this machine is checked
    before it is sent (PEFT LoRA, no DoRA, no bias, rank at most ``max_lora_rank``); another path is sent
    as it is (the server may see another filesystem, or take it as a Hugging Face Hub repo id).

    Self-healing: when a server answers that it does not know an adapter this provider loaded (it was
    restarted), the provider loads it again from the remembered path on that server and retries the
    request once. :meth:`reconcile_adapters` does the same for every adapter at once.

    Replicas: give several base URLs (a list, or comma-separated) to spread generations over several
    independent vLLM servers serving the same model. Adapter loads and unloads go to every replica; a
    load that fails on one is undone on the others.

    Adapters live on the servers, so they outlive this object: ``list_adapters`` reads ``GET /v1/models``
    (the LoRA entries, those with a ``parent``) on every replica and merges them with what this object
    loaded, and an adapter a server lists can be used and unloaded by id from any new provider.

    Args:
        base_url: The server's OpenAI-compatible base URL, ending with ``/v1``, or several (a list or a
            comma-separated string); else ``VLLM_BASE_URL``; else ``http://localhost:8100/v1``.
        api_key: Key the servers were started with (``--api-key``); else ``VLLM_API_KEY``. Never shown.
        timeout: Seconds to wait for one answer; else ``VLLM_TIMEOUT``; else 120.
        max_retries: Retries of connect errors and 429/502/503/504; else ``VLLM_MAX_RETRIES``; else 2.
        max_lora_rank: Largest adapter rank accepted before sending (match the servers'
            ``--max-lora-rank``); else ``VLLM_MAX_LORA_RANK``; else 16.

    Example:
        >>> provider = VLLMProvider(base_url="http://127.0.0.1:8100/v1", api_key="secret")
        >>> provider
        VLLMProvider(base_url='http://127.0.0.1:8100/v1', api_key=***, adapters=[])
    """

    name = "vllm"
    supports_adapters = True
    hot_swaps_adapters = True
    batches_mixed_adapters = True

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        max_lora_rank: int | None = None,
    ) -> None:
        given = {
            "base_url": base_url,
            "api_key": api_key,
            "timeout": timeout,
            "max_retries": max_retries,
            "max_lora_rank": max_lora_rank,
        }
        settings = resolve_settings("vllm", {key: value for key, value in given.items() if value is not None})
        self.base_url: str = settings["base_url"]
        self.max_lora_rank: int = settings["max_lora_rank"]
        self._api_key: str | None = settings["api_key"]
        urls = [url for url in self.base_url.split(",") if url]
        self._replicas = tuple(_Replica(self, url, settings) for url in urls)
        self._cursor = itertools.count()

    def __repr__(self) -> str:
        key = "***" if self._api_key else "None"
        adapters = sorted(self._adapter_registry.ids())
        return f"VLLMProvider(base_url={self.base_url!r}, api_key={key}, adapters={adapters})"

    @property
    def replicas(self) -> tuple[str, ...]:
        """The base URLs of the vLLM servers this provider uses, in configuration order."""
        return tuple(replica.base_url for replica in self._replicas)

    @property
    def timeout(self) -> float:
        """Seconds to wait for one answer."""
        return self._replicas[0].http.timeout

    @property
    def max_retries(self) -> int:
        """Retries of transient failures."""
        return self._replicas[0].http.max_retries

    # Generation -----------------------------------------------------------------------------------------

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        async with self._chat(request, stream=False) as (replica, completion):
            try:
                choice = completion.choices[0]
                text = choice.message.content or ""
                if not isinstance(text, str):
                    raise TypeError(f"message.content is {type(text).__name__}, not text")
                usage = completion.usage
                prompt_tokens, completion_tokens = _token_counts(usage) if usage is not None else (0, 0)
                answered_model = _model_name(completion.model, request)
                finish_reason = choice.finish_reason
            except (AttributeError, IndexError, TypeError) as error:
                raise replica.http.protocol_error(
                    _operation(request), f"an answer that is not a chat completion ({error})"
                ) from error
        return GenerationResult(
            text=text,
            model=answered_model,
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + completion_tokens,
            finish_reason="length" if finish_reason == "length" else "stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """Stream the chat completion, asking for a final usage chunk (``stream_options.include_usage``).

        vLLM sends that chunk, so the counts equal those of :meth:`generate`. A server that ignores the
        option (llama_cpp.server) sends one chunk per generated token: the completion tokens are counted
        from those chunks, and the prompt tokens, which such a server does not report, are ``None``
        (so is ``token_count``).
        """
        operation = _operation(request)
        async with self._chat(request, stream=True) as (replica, events):
            pieces: list[str] = []
            finish_reason: str | None = None
            counts: tuple[int, int] | None = None
            answered_model = request.adapter_id or request.model
            token_chunks = 0
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
                    answered_model = _model_name(chunk.model, request, answered_model)
                    if chunk.usage is not None:
                        counts = _token_counts(chunk.usage)
                    choices = chunk.choices or []
                    delta = choices[0].delta if choices else None
                    content = delta.content if delta is not None else None
                    if content is not None and not isinstance(content, str):
                        raise TypeError(f"delta.content is {type(content).__name__}, not text")
                    finished = choices[0].finish_reason if choices else None
                    announces_role = delta is not None and bool(getattr(delta, "role", None))
                except (AttributeError, IndexError, TypeError) as error:
                    raise replica.http.protocol_error(
                        operation, f"a stream chunk that is not a chat chunk ({error})"
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
        yield GenerationResult(
            text="".join(pieces),
            model=answered_model,
            adapter_id=request.adapter_id,
            token_count=None if prompt_tokens is None else prompt_tokens + completion_tokens,
            finish_reason="length" if finish_reason == "length" else "stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    @asynccontextmanager
    async def _chat(self, request: GenerationRequest, *, stream: bool) -> AsyncIterator[tuple[_Replica, Any]]:
        """Send the chat request to a replica and hold it there until the caller is done with the answer.

        Replicas are tried least-busy first (round-robin among equals); one that cannot be reached is
        skipped. A stream is closed on exit, which makes vLLM abort the generation.
        """
        arguments = _chat_arguments(request, stream=stream)
        failures: list[tuple[_Replica, InferenceError]] = []
        for replica in self._replicas_in_order():
            replica.in_flight += 1
            try:
                try:
                    answer = await self._create(replica, request, arguments)
                except _ReplicaDown as down:
                    replica.down_until = time.monotonic() + DOWN_SECONDS
                    failures.append((replica, down.error))
                    if len(self._replicas) > 1:
                        logger.warning("vLLM replica %s is unreachable; trying another", replica.base_url)
                    continue
                replica.down_until = 0.0
                try:
                    yield replica, answer
                finally:
                    if stream:
                        await answer.close()
                return
            finally:
                replica.in_flight -= 1
        raise self._all_down(failures)

    def _replicas_in_order(self) -> list[_Replica]:
        count = len(self._replicas)
        start = next(self._cursor) % count
        rotated = self._replicas[start:] + self._replicas[:start]
        now = time.monotonic()
        up = sorted((replica for replica in rotated if replica.down_until <= now), key=lambda r: r.in_flight)
        return up + [replica for replica in rotated if replica.down_until > now]

    def _all_down(self, failures: list[tuple[_Replica, InferenceError]]) -> InferenceError:
        if len(failures) == 1:
            return failures[0][1]
        said = "; ".join(f"{replica.base_url}: {error}" for replica, error in failures)
        return ProviderUnavailableError(
            f"none of the {len(failures)} vLLM replicas accepts connections ({said}): start them, or remove "
            "the URLs of stopped servers from VLLM_BASE_URL (or base_url)",
            provider=self.name,
            url=self.base_url,
        )

    async def _create(self, replica: _Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """One chat request on ``replica``; reloads a lost adapter and retries once (self-healing)."""
        operation = _operation(request)
        try:
            return await replica.openai().chat.completions.create(**arguments)
        except Exception as error:
            if is_connect_failure(error):
                raise _ReplicaDown(replica.http.error_from_exception(error, operation=operation)) from error
            mapped = self._generation_error(replica, error, request)
            path = self._adapter_path(request.adapter_id) if request.adapter_id else None
            if not isinstance(mapped, ServerAdapterNotFoundError) or path is None:
                raise mapped from error
            first = mapped
        assert request.adapter_id is not None  # a lost adapter implies one was asked for
        logger.warning(
            "%s lost adapter %r (restarted?); loading it again from %s", replica.http.where, request.adapter_id, path
        )
        await self._load_on(replica, request.adapter_id, path, healing=True)
        try:
            return await replica.openai().chat.completions.create(**arguments)
        except Exception as error:
            raise self._generation_error(replica, error, request, reloaded_from=path) from first

    def _generation_error(
        self, replica: _Replica, error: Exception, request: GenerationRequest, *, reloaded_from: str | None = None
    ) -> InferenceError:
        def not_found(answer: ServerAnswer) -> ServerResponseError | None:
            return self._generation_not_found(answer, request, reloaded_from)

        handlers = {400: _resolver_could_not_load, 404: not_found}
        return replica.http.error_from_exception(error, operation=_operation(request), handlers=handlers)

    def _generation_not_found(
        self, answer: ServerAnswer, request: GenerationRequest, reloaded_from: str | None
    ) -> ServerResponseError | None:
        if answer.route_missing:
            return answer.error(
                ServerResponseError,
                f"{answer.where} has no route {answer.response.request.url.path}: set VLLM_BASE_URL "
                "(or base_url) to the server's OpenAI-compatible base URL, which ends with /v1",
            )
        quoted = _QUOTED_MODEL.search(answer.message)
        named = quoted.group(1) if quoted else None
        if request.adapter_id is not None and named in (None, request.adapter_id):
            if reloaded_from is not None:
                sentence = (
                    f"{answer.where} still has no adapter {request.adapter_id!r} after it was loaded again from "
                    f"{reloaded_from!r} ({answer.message}): check the server's log; unload_adapter and "
                    "load_adapter it again, or call reconcile_adapters()"
                )
            else:
                sentence = (
                    f"{answer.where} has no adapter {request.adapter_id!r} ({answer.message}): load it with "
                    f"load_adapter({request.adapter_id!r}, path) first, or start vLLM with "
                    f"--lora-modules {request.adapter_id}=<path>"
                )
            return answer.error(ServerAdapterNotFoundError, sentence)
        return answer.error(
            ServerModelNotFoundError,
            f"{answer.where} does not serve model {named or request.model!r} ({answer.message}): use the name "
            "the server was started with (--served-model-name, or the --model path); GET /v1/models lists it",
        )

    # Adapters -------------------------------------------------------------------------------------------

    async def load_adapter(
        self,
        adapter_id: str,
        adapter_path: str | os.PathLike[str],
        *,
        replace: bool = False,
        pin: bool = False,
    ) -> None:
        """Load the adapter on every replica (see :meth:`InferenceProvider.load_adapter`).

        A relative path that exists on this machine is sent as an absolute path: vLLM would resolve it
        against its own working directory, or take it for a Hugging Face Hub repo id.
        """
        if isinstance(adapter_path, (str, os.PathLike)) and os.fspath(adapter_path):
            local = os.fspath(adapter_path)
            if not os.path.isabs(local) and os.path.exists(local):
                adapter_path = os.path.abspath(local)
        await super().load_adapter(adapter_id, adapter_path, replace=replace, pin=pin)

    async def _load_adapter(self, adapter_id: str, adapter_path: str) -> None:
        self._check_local_adapter(adapter_path)
        outcomes = await asyncio.gather(
            *(self._load_on(replica, adapter_id, adapter_path) for replica in self._replicas),
            return_exceptions=True,
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if not failures:
            return
        loaded = [replica for replica, outcome in zip(self._replicas, outcomes, strict=True) if outcome is None]
        if loaded:
            logger.warning(
                "loading adapter %r failed on %d of %d vLLM replicas; unloading it from the others",
                adapter_id,
                len(failures),
                len(self._replicas),
            )
            await self._roll_back(loaded, adapter_id)
        raise failures[0]

    async def _roll_back(self, replicas: list[_Replica], adapter_id: str) -> None:
        outcomes = await asyncio.gather(
            *(self._unload_on(replica, adapter_id) for replica in replicas), return_exceptions=True
        )
        for replica, outcome in zip(replicas, outcomes, strict=True):
            if isinstance(outcome, Exception):
                logger.error(
                    "could not unload adapter %r from %s after a failed load elsewhere (%s): unload it by hand",
                    adapter_id,
                    replica.base_url,
                    outcome,
                )

    def _check_local_adapter(self, adapter_path: str) -> None:
        """Refuse, before sending, an adapter directory on this machine that vLLM would refuse."""
        if not os.path.exists(adapter_path):
            return  # the server may see another filesystem, or take it as a Hub repo id
        adapter = read_peft_adapter(adapter_path, provider=self.name)
        if adapter.rank <= self.max_lora_rank:
            return
        fitting = [rank for rank in VLLM_LORA_RANKS if rank >= adapter.rank]
        if not fitting:
            advice = f"vLLM serves ranks up to {VLLM_LORA_RANKS[-1]}: train the adapter with a smaller rank"
        else:
            advice = (
                f"start vLLM with --max-lora-rank {fitting[0]} (or more; it accepts "
                f"{', '.join(map(str, VLLM_LORA_RANKS))}) and set VLLM_MAX_LORA_RANK={fitting[0]} "
                f"(or max_lora_rank={fitting[0]})"
            )
        raise InvalidAdapterError(
            f"adapter at {adapter_path} has rank {adapter.rank}, above max_lora_rank {self.max_lora_rank}: {advice}",
            provider=self.name,
            path=adapter_path,
        )

    async def _load_on(self, replica: _Replica, adapter_id: str, adapter_path: str, *, healing: bool = False) -> None:
        def not_found(answer: ServerAnswer) -> ServerResponseError:
            if answer.route_missing:
                return _runtime_lora_disabled(answer)
            return answer.error(
                ServerInvalidAdapterError,
                f"{answer.where} found no adapter at {adapter_path!r} ({answer.message}): the path must exist "
                "on the vLLM server's machine and hold adapter_config.json and the adapter weights "
                "(a path that does not exist there is tried as a Hugging Face Hub repo id)",
                path=adapter_path,
            )

        def bad_request(answer: ServerAnswer) -> ServerResponseError | None:
            if "already" in answer.message.lower():
                return answer.error(
                    ServerAdapterAlreadyLoadedError,
                    f"{answer.where} already has an adapter named {adapter_id!r} ({answer.message}): "
                    "unload it first or choose another id",
                    path=adapter_path,
                )
            return None

        def server_error(answer: ServerAnswer) -> ServerResponseError:
            if "max_lora_rank" in answer.message:
                advice = (
                    "restart vLLM with a --max-lora-rank at least the adapter's rank "
                    f"(one of {', '.join(map(str, VLLM_LORA_RANKS))}; the default is 16)"
                )
            else:
                advice = (
                    "vLLM refuses adapters whose rank exceeds --max-lora-rank, DoRA adapters, bias other than "
                    "'none' and unsupported modules_to_save; its log says which"
                )
            return answer.error(
                ServerInvalidAdapterError,
                f"{answer.where} could not load adapter {adapter_id!r} from {adapter_path!r} "
                f"({answer.message}): {advice}",
                path=adapter_path,
            )

        try:
            await replica.http.request(
                "POST",
                replica.load_url,
                operation=f"load adapter {adapter_id!r}",
                json_body={"lora_name": adapter_id, "lora_path": adapter_path},
                handlers={400: bad_request, 404: not_found, 500: server_error},
            )
        except ServerAdapterAlreadyLoadedError:
            if healing:
                return  # another request reloaded it first: the server has it again, which is what healing wants
            # A retried POST (after a 504 from a proxy, say) finds the load it already made: when the server
            # serves this very name from this very path, the load succeeded.
            with contextlib.suppress(InferenceError):
                if (await self._served_adapters(replica)).get(adapter_id) == adapter_path:
                    return
            raise

    async def _unload_adapter(self, adapter_id: str) -> None:
        outcomes = await asyncio.gather(
            *(self._unload_on(replica, adapter_id) for replica in self._replicas), return_exceptions=True
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            raise failures[0]  # the adapter stays recorded: unloading again retries where it failed

    async def _unload_on(self, replica: _Replica, adapter_id: str) -> None:
        def not_found(answer: ServerAnswer) -> ServerResponseError | None:
            if answer.route_missing:
                return _runtime_lora_disabled(answer)
            return None

        try:
            await replica.http.request(
                "POST",
                replica.unload_url,
                operation=f"unload adapter {adapter_id!r}",
                json_body={"lora_name": adapter_id},
                handlers={404: not_found},
            )
        except RuntimeLoRADisabledError:
            raise
        except ServerResponseError as error:
            if error.status_code != 404:
                raise
            # The server no longer has it (restarted): the unload's goal is met there.
            logger.info("%s had already lost adapter %r; nothing to unload there", replica.http.where, adapter_id)

    async def reconcile_adapters(self) -> ReconcileReport:
        """Make every replica hold the adapters this provider loaded; report what differed.

        Reads each replica's ``GET /v1/models`` (LoRA entries are those with a ``parent``), loads again the
        adapters a replica lost (a restarted server forgets runtime-loaded adapters), and lists the LoRA
        adapters a replica serves that this provider did not load (left alone). A replica that cannot be
        reached is reported, not raised.

        Returns:
            One :class:`ReplicaReconciliation` per replica.
        """
        expected = {adapter_id: self._adapter_path(adapter_id) for adapter_id in self._adapter_registry.ids()}
        results = await asyncio.gather(*(self._reconcile_one(replica, expected) for replica in self._replicas))
        return ReconcileReport(replicas=tuple(results))

    async def _served_adapters(self, replica: _Replica) -> dict[str, str]:
        """The LoRA adapters ``replica`` lists in ``GET /v1/models``: name -> path (``root``).

        LoRA entries are those with a ``parent`` (the base model's name); the base model's is ``null``, and
        servers without LoRA support (llama_cpp.server) send no ``parent`` at all.
        """
        operation = "list models"
        response = await replica.http.request("GET", replica.models_url, operation=operation)
        body = replica.http.parse_json(response, operation=operation)
        entries = body.get("data") if isinstance(body, dict) else None
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise replica.http.protocol_error(operation, "an answer that is not a model list (no data[] of objects)")
        served: dict[str, str] = {}
        for entry in entries:
            name, parent, root = entry.get("id"), entry.get("parent"), entry.get("root")
            if not isinstance(name, str) or not name:
                raise replica.http.protocol_error(operation, f"a model entry without an id: {entry!r:.200}")
            if parent:
                served[name] = root if isinstance(root, str) else ""
        return served

    async def _served_by_replicas(self) -> list[dict[str, str]]:
        """What each replica that answers lists (see :meth:`_served_adapters`), in configuration order.

        A replica that fails is logged and left out, as long as another one answered: adapters are loaded
        on every replica, so the others say what the provider serves.

        Raises:
            ProviderUnavailableError: No replica accepts connections.
            InferenceError: No replica answered, and one failed otherwise (its error, e.g. a refused key).
        """
        outcomes = await asyncio.gather(
            *(self._served_adapters(replica) for replica in self._replicas), return_exceptions=True
        )
        answered: list[dict[str, str]] = []
        failures: list[tuple[_Replica, InferenceError]] = []
        for replica, outcome in zip(self._replicas, outcomes, strict=True):
            if isinstance(outcome, InferenceError):
                failures.append((replica, outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                answered.append(outcome)
        if not answered:
            other = [error for _, error in failures if not isinstance(error, ProviderUnavailableError)]
            raise other[0] if other else self._all_down(failures)
        for replica, error in failures:
            logger.warning(
                "vLLM replica %s did not list its adapters (%s); using the others' lists", replica.base_url, error
            )
        return answered

    async def _list_adapters(self) -> list[str]:
        """The adapters this object loaded, and every LoRA adapter the servers list in ``GET /v1/models``.

        A new process thus lists what an earlier one loaded (``inference adapters list``), and adapters
        given with ``--lora-modules``. With replicas, the union of what they list: an adapter on any replica
        can be used, since a replica that lacks it gets it loaded again from the path another one reports.
        Adapters this object is unloading are left out. The object's own record covers vLLM versions that
        do not list runtime-loaded adapters.

        Raises:
            ProviderUnavailableError: No replica accepts connections.
            ProtocolError: The answer is not a model list.
        """
        served = {adapter_id for listing in await self._served_by_replicas() for adapter_id in listing}
        registry = self._adapter_registry
        loaded = set(registry.ids())
        being_unloaded = {adapter_id for adapter_id in served - loaded if registry.path_of(adapter_id) is not None}
        return sorted(loaded | (served - being_unloaded))

    async def _discover_adapter(self, adapter_id: str) -> str | None:
        """An adapter the server lists but this object did not load (an earlier process, ``--lora-modules``).

        It is then used and unloaded like one loaded here, so ``inference adapters unload ID`` works from a
        new process. Asks every replica; ``None`` when none that answers lists it.

        Raises:
            ProviderUnavailableError: No replica accepts connections (the id cannot be looked up).
        """
        for served in await self._served_by_replicas():
            if adapter_id in served:
                return served[adapter_id] or adapter_id
        return None

    async def _reconcile_one(self, replica: _Replica, expected: dict[str, str | None]) -> ReplicaReconciliation:
        try:
            served = set(await self._served_adapters(replica))
        except InferenceError as error:
            return ReplicaReconciliation(base_url=replica.base_url, error=str(error))
        reloaded: list[str] = []
        failed: list[str] = []
        for adapter_id in sorted(set(expected) - served):
            path = expected[adapter_id]
            if path is None:
                continue
            try:
                await self._load_on(replica, adapter_id, path)
            except ServerAdapterAlreadyLoadedError:
                continue  # the server has it but does not list it (some vLLM versions)
            except InferenceError as error:
                logger.error("%s: could not load adapter %r again: %s", replica.http.where, adapter_id, error)
                failed.append(adapter_id)
            else:
                reloaded.append(adapter_id)
        return ReplicaReconciliation(
            base_url=replica.base_url,
            reloaded=tuple(reloaded),
            failed=tuple(failed),
            unexpected=tuple(sorted(served - set(expected))),
        )

    async def aclose(self) -> None:
        """Close the pooled connections. The provider makes new ones if it is used again."""
        for replica in self._replicas:
            await replica.aclose()


def _operation(request: GenerationRequest) -> str:
    if request.adapter_id:
        return f"generate with adapter {request.adapter_id!r}"
    return f"generate with model {request.model!r}"


def _token_counts(usage: Any) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` of an OpenAI ``usage`` object.

    Raises:
        TypeError: A count is missing or not a non-negative integer.
    """
    counts = (usage.prompt_tokens, usage.completion_tokens)
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


def _chat_arguments(request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
    """The ``chat.completions.create`` arguments: only what the caller set, vLLM extras in ``extra_body``."""
    messages = []
    if request.system_prompt is not None:
        messages.append({"role": "system", "content": request.system_prompt})
    messages.append({"role": "user", "content": request.prompt})
    model = request.adapter_id or request.model
    arguments: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": request.max_tokens}
    if request.temperature is not None:
        arguments["temperature"] = request.temperature
    if request.top_p is not None:
        arguments["top_p"] = request.top_p
    if request.stop:
        arguments["stop"] = list(request.stop)
    if request.seed is not None:
        arguments["seed"] = request.seed
    extra_body: dict[str, Any] = {}
    if request.repetition_penalty is not None:
        extra_body["repetition_penalty"] = request.repetition_penalty
    if request.top_k is not None:
        extra_body["top_k"] = request.top_k
    if extra_body:
        arguments["extra_body"] = extra_body
    if stream:
        arguments["stream"] = True
        arguments["stream_options"] = {"include_usage": True}
    return arguments


_RESOLVER_FAILED = re.compile(
    r"LoRA adapter '(?P<name>[^']*)' was found but could not be loaded: ?(?P<reason>.*)", re.S
)
"""vLLM's 400 when a LoRA resolver plugin found the adapter a request names but loading it failed."""


def _resolver_could_not_load(answer: ServerAnswer) -> ServerResponseError | None:
    """The 400 of vLLM's LoRA resolver (``VLLM_PLUGINS``): the adapter exists but is broken or unsupported."""
    match = _RESOLVER_FAILED.search(answer.message)
    if match is None:
        return None
    name, reason = match.group("name"), match.group("reason").strip() or "no reason given"
    return answer.error(
        ServerInvalidAdapterError,
        f"{answer.where} found adapter {name!r} through its LoRA resolver plugin but could not load it "
        f"({reason}): fix the adapter the resolver serves (adapter_config.json and weights of a PEFT LoRA, rank "
        "within --max-lora-rank, no DoRA), or load a working one with load_adapter",
    )


def _runtime_lora_disabled(answer: ServerAnswer) -> ServerResponseError:
    return answer.error(
        RuntimeLoRADisabledError,
        f"{answer.where} refused runtime LoRA loading (404 on {answer.response.request.url.path}): "
        f"{_RUNTIME_LORA_HINT}",
    )
