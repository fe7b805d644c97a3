"""The Ollama provider: Ollama's native chat API (every sampling option honoured), adapters as derived models."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

from inference._core.backend_names import Discovered, parse_versioned_name
from inference._core.deadlines import within
from inference._core.paths import directory_problem, expand_path
from inference._core.redaction import redact_url
from inference._core.validation import GenerationRequest, validate_adapter_id
from inference._servers.http import ServerClient, server_root
from inference._servers.ollama_chat import OllamaChat
from inference._servers.ollama_models import (
    OllamaModels,
    base_model_digest,
    default_cache_dir,
    derived_model_name,
    parse_derived_model_name,
)
from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    ConfigurationError,
    InferenceError,
    InvalidRequestError,
    ServerModelNotFoundError,
    ServerResponseError,
    UnsupportedOperationError,
)
from inference.options import (
    NOT_BUILT_YET,
    RESPONSE_FORMAT_AS_JSON_SCHEMA,
    TIMEOUT_IN_BASE_CLASS,
    ByRequests,
    OptionMap,
    Sent,
)
from inference.provider import GenerationResult, InferenceProvider, StreamEvent

if TYPE_CHECKING:
    from inference.health import BackendHealth
from inference.adapters.source import AdapterSource
from inference.adapters.weights import AdapterWeights

__all__ = ["OllamaProvider"]

logger = logging.getLogger("inference.ollama")

_T = TypeVar("_T")


@dataclass(frozen=True)
class _AdapterModel:
    """The derived model that holds one adapter on the server.

    Attributes:
        name: The derived model's name (``inference-lora/<id>:<base digest>``), also the registry's path for
            an adapter discovered on the server.
        base: The base model it was created from; ``None`` when discovered (the name holds only a digest).
        path: The adapter files it was created from; ``None`` when discovered.
    """

    name: str
    base: str | None = None
    path: str | None = None

    @property
    def discovered(self) -> bool:
        """Found in ``/api/tags`` (an earlier provider created it), so it cannot be created again from files."""
        return self.path is None


def _derived_model_of(adapter_id: str, names: list[str], base_model: str | None) -> Discovered | None:
    """The derived model of ``adapter_id`` among the server's model ``names``: the one on ``base_model`` first,
    then the newest weights (a replaced id's ``_.replaced-n`` model); the registry records its name as the path."""
    candidates = [
        (parsed, name)
        for name in names
        if (parsed := parse_derived_model_name(name)) is not None and parsed.adapter_id == adapter_id
    ]
    if not candidates:
        return None
    preferred = base_model_digest(base_model) if base_model else None
    found, name = max(candidates, key=lambda pair: (pair[0].base_digest == preferred, pair[0].version))
    return Discovered(path=name, backend=found.backend_name, version=found.version)


class OllamaProvider(InferenceProvider):
    """Generates through an Ollama server; adapters become models derived from a base model.

    **Generation** goes to the native ``POST /api/chat`` route at the same host as ``base_url`` without
    ``/v1``: Ollama's OpenAI-compatible route drops ``repetition_penalty`` and ``top_k`` and forces
    ``temperature``/``top_p`` to 1.0 when they are omitted, while the native route honours every option.
    Only the options the caller sets are sent, so the model's own defaults apply to the rest.
    :meth:`stream` reads the same route with ``"stream": true`` (NDJSON); stopping the iteration closes the
    response, which makes Ollama stop generating.

    A message list is sent as the chat ``messages``; ``json_schema`` as ``format`` (Ollama turns it into a
    grammar); ``logprobs=k`` as ``logprobs: true, top_logprobs: k`` (Ollama 0.12.11 or later; an older server
    sends none, which is reported). Ollama cannot score (no prompt logprobs).

    **Tools** go as Ollama's ``tools``, a conversation's tool calls and results in its message fields, and the
    answer's ``message.tool_calls`` (in a stream, from every line) become ``GenerationResult.tool_calls``. Ollama has
    no ``tool_choice``: ``"none"`` withholds the tools, and ``"required"`` or a named tool adds ``format``, a JSON
    schema of the call object, so a forced call parses and validates (see :mod:`inference._servers.ollama_tools`).
    ``json_schema`` with tools sent is refused (both need ``format``).

    **Adapters.** Ollama cannot add a LoRA to a running model; it bakes adapters into a model created
    ``FROM`` a base. ``load_adapter(id, path)`` therefore uploads the adapter file(s) as blobs (skipped when
    the server already has them), then creates ``inference-lora/<id>:<base digest>`` from the base model
    (``base_model=`` of ``load_adapter``, else this provider's ``base_model``/``OLLAMA_BASE_MODEL``).
    ``generate(adapter_id=id)`` runs that derived model (the ``model`` argument is then not used), and
    ``unload_adapter`` deletes it. A GGUF LoRA file works for any base architecture; a PEFT directory is sent
    as safetensors for ``llama`` and ``gemma2`` bases (Ollama converts those itself) and converted to a GGUF
    LoRA here, against the base's tensor layout from ``/api/show``, for every other architecture.

    Derived models live on the server, so they outlive this object: :meth:`aclose` keeps them, and
    ``list_adapters`` reads the server's ``/api/tags`` (models in the ``inference-lora`` namespace, whose
    names decode back to adapter ids) merged with what this object loaded. A new provider can generate with,
    and unload, an adapter an earlier one created: the base class asks :meth:`_discover_adapter` about an id
    it does not know, which finds the derived model in ``/api/tags`` (preferring the one on this provider's
    ``base_model``) and records it. Loading such an id again with a local path recreates the model from that
    path. If a derived model disappears from the server (deleted by hand), the next generation with it
    recreates it once from the path it was loaded from.

    Args:
        base_url: Ollama's base URL (the native API is at the same host without ``/v1``); else
            ``OLLAMA_BASE_URL``; else ``http://localhost:11434/v1``.
        timeout: Seconds to wait for one answer; else ``OLLAMA_TIMEOUT``; else 120.
        max_retries: Retries of connect errors and 429/502/503/504; else ``OLLAMA_MAX_RETRIES``; else 2.
        think: Thinking models: ``"auto"`` (not sent: the model's default), ``"true"``, ``"false"`` (no thinking:
            all of ``max_tokens`` goes to the answer), or ``"low"``/``"medium"``/``"high"`` (gpt-oss); else
            ``OLLAMA_THINK``; else ``"auto"``. What the model thinks is in ``GenerationResult.reasoning``, never in
            ``text``.
        base_model: The Ollama model adapters are applied to (``"llama3.2"``); else ``OLLAMA_BASE_MODEL``.
            ``load_adapter(..., base_model=...)`` overrides it per adapter.
        adapter_cache_dir: Where PEFT adapters converted to GGUF are cached; else ``OLLAMA_ADAPTER_CACHE_DIR``;
            else ``~/.cache/inference-adapters``.

    Example:
        >>> OllamaProvider(base_url="http://127.0.0.1:11434/v1")
        OllamaProvider(base_url='http://127.0.0.1:11434/v1')
    """

    name = "ollama"
    options: ClassVar[OptionMap] = {
        "max_tokens": Sent("options.num_predict"),
        "system_prompt": Sent("messages", "a first message of role system"),
        "temperature": Sent("options.temperature"),
        "top_p": Sent("options.top_p"),
        "repetition_penalty": Sent("options.repeat_penalty", "Ollama's name for the same penalty"),
        "stop": Sent("options.stop"),
        "seed": Sent("options.seed"),
        "top_k": Sent("options.top_k"),
        "logprobs": Sent("logprobs", "with top_logprobs"),
        "json_schema": Sent("format"),
        **NOT_BUILT_YET,
        "tools": Sent(
            "tools",
            "OpenAI's function tools; the answer's message.tool_calls (arguments a JSON object) are parsed and "
            "checked; tool turns go as tool_calls and tool_name/tool_call_id",
        ),
        "tool_choice": Sent(
            "tools",
            "Ollama has no tool_choice: auto sends the tools, none withholds them, required or a named tool adds "
            "format, a JSON schema of the call object {name, arguments}",
        ),
        "thinking": Sent("think", "over the provider's think setting; the reasoning is message.thinking"),
        "presence_penalty": Sent(
            "options.presence_penalty",
            "llama.cpp's additive penalty (OpenAI's meaning) over the last repeat_last_n tokens (Ollama's default 64)",
        ),
        "frequency_penalty": Sent(
            "options.frequency_penalty",
            "llama.cpp's additive penalty (OpenAI's meaning) over the last repeat_last_n tokens (Ollama's default 64)",
        ),
        "min_p": Sent("options.min_p"),
        "n": ByRequests(note="n requests of one completion (seeds seed, seed + 1, ...): /api/chat has no n"),
        "raw_prompt": Sent("/api/generate", "the prompt text as it is (raw: true), no template"),
        "extra_body": Sent("extra_body", "merged into the /api/chat body last; a mapping under options joins them"),
        "response_format": RESPONSE_FORMAT_AS_JSON_SCHEMA,
        "timeout": TIMEOUT_IN_BASE_CLASS,
    }
    supports_adapters = True
    hot_swaps_adapters = False

    def __init__(
        self,
        base_url: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        base_model: str | None = None,
        *,
        adapter_cache_dir: str | os.PathLike[str] | None = None,
        think: str | None = None,
    ) -> None:
        super().__init__(locals())
        settings = self._settings
        self.base_url: str = settings["base_url"]
        self.base_model: str | None = settings["base_model"]
        self.think: str = settings["think"]
        self._http = ServerClient(
            provider=self.name,
            server="Ollama",
            base_url=self.base_url,
            timeout=settings["timeout"],
            max_retries=settings["max_retries"],
            env_prefix="OLLAMA",
        )
        self.native_url = server_root(self.base_url)
        self._chat = OllamaChat(self._http, self.native_url, think=self.think, provider=self.name)
        cache_dir = expand_path(settings["adapter_cache_dir"] or default_cache_dir())
        self.adapter_cache_dir = cache_dir
        problem = directory_problem(self.adapter_cache_dir)
        if problem is not None:
            raise ConfigurationError(
                f"adapter_cache_dir {str(self.adapter_cache_dir)!r} {problem}: pass a directory this process can "
                "write to",
                provider=self.name,
            )
        self._models = OllamaModels(self._http, self.native_url, self.adapter_cache_dir)
        self._adapter_models: dict[str, _AdapterModel] = {}  # backend name (id, or id@n once replaced) -> model
        # Per event loop (a cached provider may serve several asyncio.run calls, and a lock is bound to the loop
        # it was first awaited on): "load:<id>" serialises that id's load_adapter calls, "heal" the recreations.
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        base = f", base_model={self.base_model!r}" if self.base_model else ""
        return f"OllamaProvider(base_url={redact_url(self.base_url)!r}{base})"

    @property
    def timeout(self) -> float:
        """Seconds to wait for one answer."""
        return self._http.timeout

    @property
    def max_retries(self) -> int:
        """Retries of transient failures."""
        return self._http.max_retries

    def _lock(self, name: str) -> asyncio.Lock:
        """The lock called ``name`` on the running event loop."""
        locks = self._locks.setdefault(asyncio.get_running_loop(), {})
        return locks.setdefault(name, asyncio.Lock())

    def derived_model(self, adapter_id: str, base_model: str | None = None) -> str:
        """The name of the Ollama model that serves ``adapter_id`` now (loaded, a replaced id's newest, or as it
        would be named).

        Args:
            adapter_id: The adapter id.
            base_model: The base to name it for when the adapter is not loaded; else the provider's.

        Raises:
            ConfigurationError: The adapter is not loaded and no base model is known.
        """
        return self._model_of(self._adapter_registry.backend_name(adapter_id), base_model)  # id@n once replaced

    def _model_of(self, name: str, base_model: str | None = None) -> str:
        """The derived model of a backend name: an id, or ``id@n`` (weights an id was replaced with)."""
        record = self._adapter_models.get(name)
        if record is not None:
            return record.name
        return derived_model_name(name, self._base_for(name, base_model), provider=self.name)

    # Adapters ---------------------------------------------------------------------------------------------

    async def load_adapter(
        self,
        adapter_id: str,
        adapter_path: str | os.PathLike[str] | AdapterWeights,
        *,
        replace: bool = False,
        pin: bool = False,
        base_model: str | None = None,
    ) -> None:
        """Create the Ollama model ``inference-lora/<adapter_id>:<base digest>`` from a base model and the adapter.

        Calls for one id run one after another, so a call that names another base model than a concurrent
        one sees that call's model (and needs ``replace=True``); a call that failed is not shared with the next.

        Args:
            adapter_id: The name to use it by (letters, digits, ``.``, ``_``, ``-``).
            adapter_path: A GGUF LoRA file, or a PEFT LoRA directory, on this machine (it is uploaded); or an
                :class:`~inference.AdapterWeights` (written to a temporary PEFT directory first).
            replace: If the id is loaded from another path, replace it instead of raising.
            pin: Accepted for the common interface (Ollama adapters are never evicted).
            base_model: The Ollama model to apply it to; else the provider's ``base_model``
                (``OLLAMA_BASE_MODEL``).

        Raises:
            ConfigurationError: No base model is given or configured.
            AdapterAlreadyLoadedError: The id is loaded from another path or on another base model, and
                ``replace`` is false.
            InvalidAdapterError: Nothing usable at the path, a GGUF LoRA for another architecture, or Ollama
                refused to create the model (``ServerInvalidAdapterError``, with Ollama's sentence).
            AdapterConversionError: A PEFT adapter that must be converted does not fit the base model.
            ServerModelNotFoundError: The base model is not on the server (``ollama pull`` it).
        """
        adapter_id = validate_adapter_id(adapter_id, provider=self.name)
        base = self._base_for(adapter_id, base_model, loading=True)
        derived_model_name(adapter_id, base, provider=self.name)  # refuse an id too long for Ollama now
        # One load_adapter call per id at a time: the base it asks for is what _load_adapter creates on.
        async with self._lock(f"load:{adapter_id}"):
            registry, looked_up = self._adapter_registry, isinstance(adapter_path, (str, os.PathLike))
            if looked_up:  # a replaced id's model found on the server is replaced (below); weights: in _load_source
                source = AdapterSource(self._adapter_path_argument(adapter_path), base_model=base)
                await self._adopt_replaced_adapter(adapter_id, source)
            known = registry.path_of(adapter_id)
            record = self._adapter_models.get(registry.backend_name(adapter_id))
            if (
                known is not None
                and record is not None
                and record.discovered
                and isinstance(adapter_path, (str, os.PathLike))
                and os.fspath(adapter_path) != known
                and registry.in_flight(adapter_id) == 0
            ):
                # found on the server: create it again from the files the caller names, under its name, or for a
                # replaced id's model (another name) as a replacement, which deletes the model found
                if registry.backend_name(adapter_id) == adapter_id:
                    registry.forget(adapter_id)
                else:
                    replace = True
            current_base = record.base if record is not None else None
            if known is not None and current_base is not None and not _same_model(current_base, base):
                # The registry compares paths only; another base model is another derived model.
                if not replace:
                    raise AdapterAlreadyLoadedError(
                        f"adapter {adapter_id!r} is already applied to base model {current_base!r}: unload it "
                        f"first, choose another id, or pass replace=True to apply it to {base!r} instead",
                        provider=self.name,
                        url=self.base_url,
                    )
                await registry.unload(adapter_id)
            await self._load_source(
                adapter_id, adapter_path, replace=replace, pin=pin, base_model=base, looked_up=looked_up
            )

    def _base_for(self, adapter_id: str, base_model: str | None, *, loading: bool = False) -> str:
        if base_model is not None and (not isinstance(base_model, str) or not base_model.strip()):
            raise InvalidRequestError(
                f"base_model must be an Ollama model name such as 'llama3.2', got {base_model!r}", provider=self.name
            )
        record = None if loading else self._adapter_models.get(adapter_id)
        base = base_model or (record.base if record is not None else None) or self.base_model
        if not base:
            raise ConfigurationError(
                f"Ollama needs a base model to apply adapter {adapter_id!r} to: pass base_model= to load_adapter, "
                "or set OLLAMA_BASE_MODEL (or the provider's base_model argument) to a pulled model such as "
                "'llama3.2'",
                provider=self.name,
                url=self.base_url,
            )
        return base

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        record = self._adapter_models.get(adapter_id)
        if record is not None and record.discovered and adapter_path == record.name:
            raise AdapterNotFoundError(
                f"adapter {adapter_id!r} was created on the server by another process and its model "
                f"{record.name!r} is gone: load it again with load_adapter and its files",
                provider=self.name,
            )
        base = source.base_model or self._base_for(adapter_id, None)
        await self._create(adapter_id, adapter_path, base)

    async def _create(self, adapter_id: str, adapter_path: str, base: str) -> None:
        """Upload the adapter's files and create its derived model on ``base``; delete one on another base."""
        self._adapter_registry.refuse_changed(adapter_id)  # created again after a loss: the same weights
        name = derived_model_name(adapter_id, base, provider=self.name)
        await self._models.check_adapter(adapter_path)  # a bad adapter is refused before the server is asked
        info = await self._models.show(base)
        cache = self._conversion_dir(adapter_path, self.adapter_cache_dir)
        files = await self._models.adapter_files(adapter_path, info, cache_dir=cache)
        digests = {file.name: await self._models.upload_blob(file) for file in files}
        await self._models.create(name, base, digests, adapter_id=adapter_id)
        previous = self._adapter_models.get(adapter_id)
        self._adapter_models[adapter_id] = _AdapterModel(name, base=base, path=adapter_path)
        logger.info("created Ollama model %r for adapter %r (%s on %s)", name, adapter_id, adapter_path, base)
        if previous is not None and previous.name != name:  # made earlier on another base: do not leave it behind
            try:
                await self._models.delete(previous.name)
            except ServerResponseError as error:
                logger.warning(
                    "could not delete the previous model %r of adapter %r: %s", previous.name, adapter_id, error
                )

    async def _check_adapter_source(self, source: AdapterSource) -> None:
        await self._models.check_adapter(source.path)

    async def _unload_adapter(self, adapter_id: str) -> None:
        name = self._model_of(adapter_id)
        if not await self._models.delete(name):
            logger.info("Ollama model %r of adapter %r was already gone", name, adapter_id)
        self._adapter_models.pop(adapter_id, None)

    async def _discover_adapter(self, adapter_id: str) -> str | Discovered | None:
        """Find a derived model made by an earlier provider (``/api/tags``); prefer the one on our base, then the
        newest weights (a replaced id's ``_.replaced-n`` model).

        Returns:
            The derived model's name, which the registry records as the adapter's path (in a :class:`Discovered`
            with its backend name ``id@n`` for a replaced id's model).
        """
        found = await self._find_derived_model(adapter_id)
        if found is None:
            return None
        self._adapter_models[found.backend] = _AdapterModel(found.path)
        return found.path if found.version == 1 else found

    async def _discover_replaced_adapter(self, adapter_id: str) -> Discovered | None:
        """The model :meth:`_discover_adapter` would find, where it is a replaced id's (``_.replaced-n``): asked
        before a first load, which then replaces it (see :meth:`load_adapter`). One ``GET /api/tags``."""
        found = await self._find_derived_model(adapter_id)
        if found is None or found.version == 1:
            return None  # the id's own model: a load creates it again from its files, as always
        self._adapter_models[found.backend] = _AdapterModel(found.path)
        return found

    async def _find_derived_model(self, adapter_id: str) -> Discovered | None:
        """The derived model of ``adapter_id`` in ``/api/tags`` (see :func:`_derived_model_of`)."""
        return _derived_model_of(adapter_id, await self._models.tags(), self.base_model)

    async def _list_adapters(self) -> list[str]:
        loaded = set(self._adapter_registry.ids())
        held = {(parse_versioned_name(name) or (name, 1))[0] for name in self._adapter_models}  # backend names' ids
        being_unloaded = held - loaded
        derived = [parse_derived_model_name(name) for name in await self._models.tags()]
        on_server = {model.adapter_id for model in derived if model is not None}
        return sorted(loaded | (on_server - being_unloaded))

    async def _recreating(self, request: GenerationRequest, send: Callable[[str], Awaitable[_T]]) -> tuple[str, _T]:
        """``(model, await send(model))``; if the server lost the adapter's model, create it again and retry once.

        The model is created from the files it was loaded from, unless another request did that meanwhile; a
        model discovered on the server has no files here, so its loss is raised.
        """
        adapter_id = request.adapter_id
        seen = self._adapter_models.get(adapter_id) if adapter_id is not None else None
        model = self._model_for(request)
        try:
            return model, await send(model)
        except ServerModelNotFoundError:
            if adapter_id is None or seen is None or seen.path is None or seen.base is None:
                raise
        async with self._lock("heal"):
            if self._adapter_models.get(adapter_id) is seen:
                logger.warning("Ollama lost the model of adapter %r; creating it again from %s", adapter_id, seen.path)
                await self._create(adapter_id, seen.path, seen.base)
        model = self._model_for(request)
        return model, await send(model)

    # Generation -------------------------------------------------------------------------------------------

    def _model_for(self, request: GenerationRequest) -> str:
        if request.adapter_id is not None:
            return self._model_of(request.adapter_id)
        if not request.model:
            raise InvalidRequestError(
                "Ollama needs a model name: pass model= (e.g. 'llama3.2'; `ollama list` shows what is pulled)",
                provider=self.name,
            )
        return request.model

    def _refuse_schema_with_tools(self, request: GenerationRequest) -> None:
        """Refuse ``json_schema`` with tools the request sends (any ``tool_choice`` but ``"none"``), before sending.

        Both would need Ollama's one ``format`` field: a forced call's schema is the call object; with ``"auto"``,
        a format-bound answer is never parsed as a call where llama-server renders the chat (Ollama 0.33's default
        for models without an Ollama template), and may be taken for one where Ollama's own parser reads it.
        """
        if request.json_schema is None or not request.tools or request.tool_choice == "none":
            return
        from inference.registry import providers_sending  # the registry imports provider classes lazily

        able = [name for name in providers_sending("tools") if name in providers_sending("json_schema")]
        raise UnsupportedOperationError(
            "OllamaProvider cannot honour json_schema together with tools unless tool_choice is 'none': Ollama has "
            "one format field and no tool_choice, so it cannot let the model choose between a tool call and an "
            "answer in the schema, and a forced call's format is the call object. Ask with tool_choice='none' (the "
            "tools are not sent), or without json_schema (a tool whose parameters are the schema, named in "
            "tool_choice, gives the same object as a call); providers that take both: "
            f"{', '.join(name for name in able if name != self.name) or 'none'}",
            provider=self.name,
        )

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self._refuse_schema_with_tools(request)
        chat = self._chat
        with chat.schema_refusals(request):
            model, response = await self._recreating(request, lambda model: chat.send(request, model))
        return chat.answer(response, request, model)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        self._refuse_schema_with_tools(request)
        chat = self._chat
        async with contextlib.AsyncExitStack() as stack:
            with chat.schema_refusals(request):
                model, lines = await self._recreating(request, lambda model: chat.open(stack, request, model))
            async for event in chat.events(lines, request, model):
                yield event

    async def _health(self, timeout: float) -> Sequence[BackendHealth]:
        """``GET /v1/models`` as for any server, then the native API this provider talks to (``GET /api/tags``): a
        server without it (an OpenAI-compatible one at Ollama's URL) is down, as it cannot serve."""
        started = time.perf_counter()
        backends = await super()._health(timeout)
        if not backends[0].up:
            return backends
        try:  # within what is left of the timeout: the whole probe is bounded by it
            await within(max(timeout - (time.perf_counter() - started), 0.0), self._models.tags())
        except asyncio.TimeoutError:
            problem = f"no answer to GET /api/tags within {timeout:g} s"
        except InferenceError as error:
            problem = f"no Ollama native API: {error}"
        else:
            return backends
        return [dataclasses.replace(backends[0], up=False, error=problem)]

    async def aclose(self) -> None:
        """Close the pooled connections (derived models stay on the server). The provider reconnects if used."""
        await self._http.aclose()


def _same_model(first: str, second: str) -> bool:
    """Whether two names are the same Ollama model (``llama3.2``, ``LLAMA3.2``, ``library/llama3.2`` and
    ``registry.ollama.ai/library/llama3.2:latest`` are): they make the same derived model name."""
    return base_model_digest(first) == base_model_digest(second)
