"""What every provider holds and how its adapters live: settings, the adapter registry, health, closing.

:class:`ProviderBase` is the first part of :class:`~inference.provider.InferenceProvider` (which users see and
subclass): its state (``__init__``), the capability attributes, the public adapter lifecycle (``load_adapter``,
``unload_adapter``, ``list_adapters``, ``adapter_stats``), ``health``, ``aclose`` and the async context manager,
with the hooks a backend overrides for them (``_load_adapter``, ``_unload_adapter``, ``_health``...). The token level
is :mod:`inference._core.provider_tokens`; generation and scoring are :mod:`inference.provider`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from abc import ABC
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from inference._core.adapter_holds import current_holder
from inference._core.hub import HUB_GGUF
from inference._core.lifecycle import AdapterRegistry, Discovered, default_versioned_name
from inference._core.model_loads import ModelLoads
from inference._core.paths import HUB_ID, normalise_path, path_text_problem
from inference._core.telemetry import observed_adapter_hook
from inference._core.validation import GenerationRequest, ScoreRequest, TokenRequest, validate_adapter_id
from inference._core.weights_store import AdapterWeightsStore
from inference.adapters.source import AdapterSource
from inference.adapters.stats import ProviderAdapterStats
from inference.exceptions import (
    AdapterAlreadyLoadedError,
    InvalidRequestError,
    ProviderError,
    ProviderUnavailableError,
    UnsupportedOperationError,
)
from inference.options import OptionMap, Sent
from inference.tokens import TokenVocabulary

if TYPE_CHECKING:
    from inference._core.token_batching import TokenBatcher
    from inference.adapters.weights import AdapterWeights
    from inference.health import BackendHealth, ProviderHealth
    from inference.results import GenerationResult, ScoreResult

__all__ = ["ProviderBase"]

_ProviderT = TypeVar("_ProviderT", bound="ProviderBase")
_HeldT = TypeVar("_HeldT", GenerationRequest, TokenRequest)
_Sent = TypeVar("_Sent", GenerationRequest, ScoreRequest, TokenRequest)
_Answered = TypeVar("_Answered", "GenerationResult", "ScoreResult")


class ProviderBase(ABC):  # noqa: B024 - abstract through InferenceProvider._generate
    """A provider's state, capabilities and adapter lifecycle (documented on
    :class:`~inference.provider.InferenceProvider`, the class to subclass)."""

    name: ClassVar[str] = "base"
    supports_adapters: ClassVar[bool] = False
    hot_swaps_adapters: ClassVar[bool] = False
    batches_mixed_adapters: ClassVar[bool] = False
    runs_in_process: ClassVar[bool] = False
    supports_scoring: ClassVar[bool] = False
    supports_logprobs: ClassVar[bool] = False
    supports_json_schema: ClassVar[bool] = False
    supports_tools: ClassVar[bool] = False
    supports_adapter_scales: ClassVar[bool] = False
    loads_adapter_weights_in_memory: ClassVar[bool] = False
    supports_tokenize: ClassVar[bool] = False
    supports_next_token_logprobs: ClassVar[bool] = False
    supports_token_prompts: ClassVar[bool] = False
    loads_hub_ids: ClassVar[bool] = False
    options: ClassVar[OptionMap] = {}
    max_adapters: int | None = None

    def __init__(self, arguments: Mapping[str, Any] | None = None) -> None:
        """Set up what every provider holds: its settings, its adapter registry and the adapter weights it keeps.

        Subclasses call it first, with their constructor's arguments: ``super().__init__(locals())``.

        Args:
            arguments: The constructor's arguments by name. Those that are settings of this provider type in
                :data:`inference.registry.PROVIDERS` are resolved (argument, else environment variable, else
                default; ``None`` counts as not given) into ``self._settings``; others are left to the subclass.

        Raises:
            ConfigurationError: A setting breaks its rule; the sentence names the argument or the variable.
        """
        from inference.config import SETTINGS, resolve_settings

        keys = {setting.key for setting in SETTINGS.get(self.name, ())}
        given = {
            key: os.fspath(value) if isinstance(value, os.PathLike) else value
            for key, value in (arguments or {}).items()
            if key in keys and value is not None
        }
        self._settings: dict[str, Any] = resolve_settings(self.name, given) if keys else {}
        self._closed = False
        self._model_loads = ModelLoads()  # an in-process model's last load failure, for health
        self._token_vocabularies: dict[str, TokenVocabulary] = {}  # model name -> its vocabulary, asked once
        self._token_batcher_instance: TokenBatcher | None = None
        self._adapter_weights = AdapterWeightsStore(self.name, self, parent=self._adapter_weights_dir)
        self._adapter_registry = AdapterRegistry(
            self.name,
            load=observed_adapter_hook(self.name, "load", self._load_adapter),
            unload=observed_adapter_hook(self.name, "unload", self._unload_adapter),
            capacity=lambda: self.max_adapters,
            discover=self._discover_adapter,
            versioned=self._versioned_adapter_name,
            closed=lambda: self.closed,
        )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "options" in cls.__dict__:  # the capabilities that are options follow from the declaration
            cls.supports_logprobs = isinstance(cls.options.get("logprobs"), Sent)
            cls.supports_json_schema = isinstance(cls.options.get("json_schema"), Sent)
            cls.supports_tools = isinstance(cls.options.get("tools"), Sent)

    async def load_adapter(
        self,
        adapter_id: str,
        adapter_path: str | os.PathLike[str] | AdapterWeights,
        *,
        replace: bool = False,
        pin: bool = False,
    ) -> None:
        """Load a LoRA adapter under ``adapter_id`` so that ``generate(adapter_id=...)`` can use it.

        Loading an id again with the same path does nothing (concurrent calls load it once). "The same path"
        means the same place, however it is written: ``~`` is expanded, ``adapters/a/``, ``./adapters/a`` and
        ``adapters//a`` are one path, and a symlink to a directory on this machine is that directory.

        Args:
            adapter_id: The name to use it by (letters, digits, ``.``, ``_``, ``-``).
            adapter_path: Where the adapter is: a PEFT directory, or a GGUF LoRA file where the backend takes one;
                or the weights themselves, an :class:`~inference.AdapterWeights` (checked like a directory, then
                written to a private temporary PEFT directory that is removed when the adapter is unloaded).
                Each ``AdapterWeights`` is new weights: loading one under a loaded id needs ``replace=True``.
            replace: If the id is loaded from another path, unload it (after its requests in flight) and load
                this path in its place, instead of raising.
            pin: Never evict this adapter when the provider has a capacity (``max_adapters``). The pin belongs to
                the id: a later load or replacement with ``pin=True`` pins it, one with ``pin=False`` leaves it as
                it was (a training loop that replaces a pinned id each step keeps it pinned); ``unload_adapter``
                forgets it.

        Raises:
            UnsupportedOperationError: The provider has no adapter support.
            AdapterAlreadyLoadedError: The id is loaded from another path and ``replace`` is false (on a server,
                also where an earlier process replaced the id and the server serves it as ``id@n``: see
                ``docs/adapters.md``).
            InvalidAdapterError: The adapter is missing, corrupt or unsupported.
            InvalidRequestError: ``adapter_path`` is not a non-empty path the operating system can take.
            ProviderError: The provider is :attr:`closed`.
        """
        adapter_id = validate_adapter_id(adapter_id, provider=self.name)
        await self._load_source(adapter_id, adapter_path, replace=replace, pin=pin)

    async def _load_source(
        self,
        adapter_id: str,
        adapter_path: str | os.PathLike[str] | AdapterWeights,
        *,
        replace: bool,
        pin: bool,
        base_model: str | None = None,
        looked_up: bool = False,
    ) -> None:
        """Make the :class:`~inference.adapters.source.AdapterSource` of ``adapter_path`` (weights are copied, and
        written to a private directory for a backend that reads files) and load it under ``adapter_id``; first, for
        an id not known here, record what the backend holds of it under a versioned name (unless ``looked_up``)."""
        from inference.adapters.weights import AdapterWeights  # light: no torch or numpy until weights are saved

        if not isinstance(adapter_path, AdapterWeights):
            source = AdapterSource(self._adapter_path_argument(adapter_path), base_model=base_model)
            self._require_adapter_support("load_adapter")
            self._check_open()
            if not looked_up:
                await self._adopt_replaced_adapter(adapter_id, source)
            await self._adapter_registry.load(adapter_id, source, replace=replace, pin=pin, holder=current_holder())
            return
        self._require_adapter_support("load_adapter")
        self._check_open()  # before anything is copied or written for a provider that cannot load it
        store = self._adapter_weights.kept if self.loads_adapter_weights_in_memory else self._adapter_weights.written
        copying = asyncio.ensure_future(asyncio.to_thread(store, adapter_path))
        try:
            source = await asyncio.shield(copying)
        except asyncio.CancelledError:  # the thread goes on: what it makes is removed once made, unused
            copying.add_done_callback(self._forget_adapter_weights)
            raise
        if base_model is not None:
            source = dataclasses.replace(source, base_model=base_model)
        try:
            if not looked_up:
                await self._adopt_replaced_adapter(adapter_id, source)
            await self._adapter_registry.load(adapter_id, source, replace=replace, pin=pin, holder=current_holder())
        except AdapterAlreadyLoadedError:  # the registry's words name a private directory the caller never saw
            loaded = self._adapter_registry.path_of(adapter_id) or ""
            private = loaded in self._adapter_weights.directories() or loaded.startswith("<adapter weights")
            raise AdapterAlreadyLoadedError(
                f"adapter {adapter_id!r} is already loaded (from {'other weights' if private else loaded}), and "
                "each AdapterWeights is new weights: pass replace=True to load these in its place, unload it "
                "first, or choose another id",
                provider=self.name,
            ) from None
        finally:
            self._adapter_weights.recorded(source)
            self._remove_unused_adapter_weights()

    async def unload_adapter(self, adapter_id: str) -> None:
        """Unload the adapter ``adapter_id`` and free what it holds.

        Requests already using it finish first; new requests for it are refused from now on. Every provider
        raises for an unknown id.

        Raises:
            UnsupportedOperationError: The provider has no adapter support.
            AdapterNotFoundError: No adapter with this id is loaded.
            ProviderError: The provider is :attr:`closed`.
        """
        adapter_id = validate_adapter_id(adapter_id, provider=self.name)
        self._require_adapter_support("unload_adapter")
        self._check_open()
        try:
            await self._adapter_registry.unload(adapter_id, holder=current_holder())
        finally:
            self._remove_unused_adapter_weights()

    async def list_adapters(self) -> list[str]:
        """Return the ids of the loaded adapters (evicted ones included: they reload on use), sorted.

        Raises:
            ProviderError: The provider is :attr:`closed` (HTTP providers never are: they list what the server has).
        """
        self._check_open()
        return sorted(await self._list_adapters())

    def adapter_stats(self) -> ProviderAdapterStats:
        """What the provider's adapters are doing: state, requests in flight, loads, evictions and reloads.

        Every lifecycle event is also a log record on the ``inference.adapters`` logger and, when
        ``opentelemetry-api`` is installed, a span (see ``docs/adapters.md``).

        Example:
            >>> import asyncio
            >>> from inference.fake_provider import FakeProvider
            >>> async def main():
            ...     provider = FakeProvider()
            ...     await provider.load_adapter("style", "/adapters/style")
            ...     return provider.adapter_stats().get("style").loads
            >>> asyncio.run(main())
            1

        Returns:
            One :class:`~inference.adapters.stats.AdapterStats` per loaded adapter (evicted ones included),
            with the provider's totals.
        """
        return self._adapter_registry.stats()

    async def health(self, *, timeout: float = 5.0) -> ProviderHealth:
        """Whether the provider can serve now, backend by backend: up, latency, models and adapters.

        A server provider asks each server (each replica) ``GET /models``, at once and without retries; an
        in-process provider says whether its model is loaded (it loads on first use: not loaded yet is up, a model
        file that does not exist is down) and which adapters are resident. Nothing is generated and no model is
        loaded. ``inference health`` prints it as a container probe.

        Example:
            >>> import asyncio
            >>> from inference.fake_provider import FakeProvider
            >>> health = asyncio.run(FakeProvider().health())
            >>> health.status, health.backends[0].up
            ('up', True)

        Args:
            timeout: Seconds to wait for each server's answer.

        Returns:
            The status (``"up"``: every backend up, ``"degraded"``: some, ``"down"``: none, or the provider is
            closed) and one :class:`~inference.health.BackendHealth` per backend. A backend that is down is reported,
            never raised.

        Raises:
            InvalidRequestError: ``timeout`` is not a positive number.
        """
        from inference.health import ProviderHealth

        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise InvalidRequestError(f"timeout must be a positive number of seconds, got {timeout!r}",
                                      provider=self.name)
        if self.closed:
            return ProviderHealth.of(self.name, (), error=f"this {type(self).__name__} is closed")
        return ProviderHealth.of(self.name, await self._health(float(timeout)))

    async def aclose(self) -> None:  # noqa: B027 - a no-op by default, on purpose
        """Free what the provider holds (connections, model weights). Safe to call twice."""

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` made the provider unusable (in-process providers free their model).

        HTTP providers stay usable after ``aclose`` (they open new connections), so they never report closed.
        ``get_provider`` replaces a cached provider that is closed with a new one.
        """
        return self._closed

    def _check_open(self) -> None:
        """Refuse a call to a provider that :meth:`aclose` made unusable (:attr:`closed`)."""
        if self.closed:
            raise ProviderError(
                f"this {type(self).__name__} is closed: create a new one (or call get_provider again)",
                provider=self.name,
            )

    async def __aenter__(self: _ProviderT) -> _ProviderT:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _cannot(self, what: str, capability: str) -> UnsupportedOperationError:
        from inference.registry import providers_with  # the registry imports provider classes lazily

        able = ", ".join(providers_with(capability)) or "none"
        return UnsupportedOperationError(
            f"{type(self).__name__} cannot {what}; providers that can: {able} "
            f"(check the provider's {capability} attribute before calling)",
            provider=self.name,
        )

    def _adapter_path_argument(self, adapter_path: object) -> str:
        """``adapter_path`` as the backend receives it: checked, ``~`` expanded, written canonically."""
        text = os.fspath(adapter_path) if isinstance(adapter_path, (str, os.PathLike)) else None
        if not isinstance(text, str) or not text:
            raise InvalidRequestError(
                f"adapter_path must be a non-empty path (a string or os.PathLike), got {adapter_path!r}",
                provider=self.name,
            )
        problem = path_text_problem(text)
        if problem is not None:
            raise InvalidRequestError(
                f"adapter_path {text!r} {problem}: give the path of the adapter as the file system names it",
                provider=self.name,
            )
        return normalise_path(text)

    # Hooks for backends -------------------------------------------------------------------------------

    async def _health(self, timeout: float) -> Sequence[BackendHealth]:
        """One :class:`~inference.health.BackendHealth` per backend (the hook of :meth:`health`, which makes the
        status from them).

        This default: a provider with a ``base_url`` setting asks each of its URLs ``GET /models``
        (:func:`inference.health.probe_servers`: up, latency, models and adapters listed); any other one reports
        its model (the setting that names it; loaded or not, from :meth:`_model_loaded`) with the adapters resident:
        down while it is not loaded and its last load failed (``self._model_loads``, until a load succeeds), or
        its path is one the provider cannot load (:meth:`_model_path_problem`).
        Override it to report what the provider knows better, e.g. a server provider with replicas: each replica's
        own state (marked down since when, its adapters placed), and a probe of those not known to be down. Report
        a backend that is down with its ``error``; never raise for it.
        """
        from inference.health import BackendHealth, probe_servers

        base_url = self._settings.get("base_url")
        if isinstance(base_url, str) and base_url:
            key = self._settings.get("api_key") or getattr(self, "_api_key", None)  # servers keep it apart
            return await probe_servers(self.name, base_url.split(","), api_key=key, timeout=timeout)
        from inference.registry import PROVIDERS

        spec = PROVIDERS.get(self.name)
        key = spec.model_setting if spec is not None else None
        setting = next((setting for setting in spec.settings if setting.key == key), None) if spec else None
        model = (self._settings.get(key) if key else None) or self._given_model_name()
        loaded = self._model_loaded()
        error = None
        failure = None if loaded else self._model_loads.failure
        from_hub = self.loads_hub_ids and not Path(str(model)).exists() and bool(
            HUB_ID.fullmatch(str(model)) or HUB_GGUF.fullmatch(str(model))  # from the Hugging Face cache
        )
        if setting is not None and not model:
            error = f"no model configured: give {setting.key}, or set {setting.env_var}"
        elif failure is not None:
            error = f"the model failed to load: {failure}"
        elif setting is not None and setting.kind == "path" and not loaded and not from_hub:
            error = self._model_path_problem(str(model))
        resident = tuple(sorted(entry.adapter_id for entry in self.adapter_stats().adapters
                                if entry.state == "resident"))
        return [BackendHealth(str(model or self.name), error is None, models=(str(model),) if model else (),
                              adapters=resident, model_loaded=loaded, error=error)]

    def _model_loaded(self) -> bool | None:
        """Whether the model is in memory now, for :meth:`health` (``None``: not a model this process loads)."""
        return None

    def _given_model_name(self) -> str | None:
        """The name of a model handed to the provider as an object (no model setting needed), for :meth:`health`;
        ``None`` when none was."""
        return None

    @staticmethod
    def _model_path_problem(model: str) -> str | None:
        """Why ``model`` (the model setting: a path, or a Hub id the provider does not load) is nothing this provider
        can load, for :meth:`health` before the model loads; ``None`` when it may load. This default: it does not
        exist. A provider with a stricter rule (a file, a directory) states its own."""
        return None if Path(model).exists() else f"the model file {model} does not exist"

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Load the adapter into the backend under ``adapter_id`` (its backend name), from ``source``: a path, or
        weights kept in memory where ``loads_adapter_weights_in_memory``. The registry never calls it twice at once
        for one name, and calls it again with the same source to reload an evicted adapter."""
        raise self._unsupported("load_adapter")

    async def _unload_adapter(self, adapter_id: str) -> None:
        """Remove the adapter from the backend (on unload, and on eviction when nothing uses it)."""
        raise self._unsupported("unload_adapter")

    async def _list_adapters(self) -> list[str]:
        return self._adapter_registry.ids()

    async def _discover_adapter(self, adapter_id: str) -> str | Discovered | None:
        """Path of an adapter the backend holds without this object having loaded it (a :class:`Discovered` when
        it holds it under another name), else ``None``."""
        return None

    async def _discover_replaced_adapter(self, adapter_id: str) -> Discovered | None:
        """Asked before a first load of an id this object does not know: the weights the backend holds for it under
        a versioned name (another process replaced the id), which the load must replace or adopt rather than
        leave behind; ``None`` where it holds none (this default: a backend nothing else loads into)."""
        return None

    async def _check_adapter_source(self, source: AdapterSource) -> None:  # noqa: B027 - a no-op by default
        """Refuse what the backend would refuse of ``source`` before a server is asked anything (this default:
        nothing; the backend's load checks)."""

    async def _adopt_replaced_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Before a first load of ``adapter_id`` from ``source``: check it, then record the weights the backend
        holds for the id under a versioned name. A backend nothing answers at is left to the load, which says so."""
        if self._adapter_registry.path_of(adapter_id) is not None:
            return
        await self._check_adapter_source(source)  # a bad adapter is refused before the server is asked
        try:
            found = await self._discover_replaced_adapter(adapter_id)
        except ProviderUnavailableError:
            return
        if found is not None:
            self._adapter_registry.adopt(adapter_id, found)

    def _versioned_adapter_name(self, adapter_id: str, version: int) -> str:
        """The backend name of an adapter's ``version``-th weights after ``load_adapter(..., replace=True)``."""
        return default_versioned_name(adapter_id, version)

    def _adapter_weights_dir(self) -> str | None:
        """Where to write the temporary PEFT directories of :class:`~inference.AdapterWeights` (``None``: the
        system's temporary directory). A server that reads adapters from its own filesystem needs a shared one."""
        return None

    def _conversion_dir(self, adapter_path: str, cache_dir: Path) -> Path:
        """Where to keep what the adapter at ``adapter_path`` is converted to (a GGUF LoRA): ``cache_dir``, except
        for the private directory of :class:`~inference.AdapterWeights`, whose conversions are removed with it."""
        return self._adapter_weights.conversion_dir(adapter_path, cache_dir)

    def _forget_adapter_weights(self, copying: asyncio.Future[AdapterSource]) -> None:
        """The copy of weights whose load was cancelled, once made: removed (nothing will record it)."""
        if not copying.cancelled() and copying.exception() is None:
            self._adapter_weights.recorded(copying.result())
            self._remove_unused_adapter_weights()

    def _remove_unused_adapter_weights(self) -> None:
        """Remove the weights and private directories no adapter uses any more (unloaded, replaced, failed to load,
        or the provider closed)."""
        self._adapter_weights.remove_unused(self._adapter_registry.paths())

    def _adapter_path(self, adapter_id: str) -> str | None:
        """The path ``adapter_id`` was loaded from (for backends that must load it again)."""
        return self._adapter_registry.path_of(adapter_id)

    def _request_in_use(self, request: _HeldT) -> contextlib.AbstractAsyncContextManager[_HeldT]:
        """Hold every adapter of ``request`` loaded while it runs; gives the request as the backend receives it."""
        return _RequestInUse(self, request)

    def _adapter_in_use(self, adapter_id: str | None) -> contextlib.AbstractAsyncContextManager[str | None]:
        """Hold ``adapter_id`` loaded for the duration of one request (nothing for the base model); gives the
        backend name to send the request under (the id itself until the adapter is replaced)."""
        if adapter_id is None:
            return contextlib.nullcontext()
        self._require_adapter_support("generate with an adapter_id")
        return self._adapter_registry.use(adapter_id)

    def _require_adapter_support(self, operation: str) -> None:
        if not self.supports_adapters:
            raise self._unsupported(operation)

    def _unsupported(self, operation: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(
            f"{type(self).__name__} does not support {operation}; "
            "check the provider's supports_adapters attribute before calling it",
            provider=self.name,
        )


def _sent_as(request: _Sent, backend: str | None) -> _Sent:
    """The request as the backend receives it: under the adapter's backend name (its id until it is replaced)."""
    if backend is None or backend == request.adapter_id:
        return request
    return dataclasses.replace(request, adapter_id=backend)


class _RequestInUse(Generic[_HeldT]):
    """The adapters of one request held for its duration (a class, not a generator: a stream closed by the event
    loop's shutdown must not find its context manager already finalized)."""

    def __init__(self, provider: ProviderBase, request: _HeldT) -> None:
        self.provider = provider
        self.request: _HeldT = request
        self.stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> _HeldT:
        request: _HeldT = self.request
        sent: _HeldT
        async with self.stack as stack:
            if not request.adapter_scales:
                backend = await stack.enter_async_context(self.provider._adapter_in_use(request.adapter_id))
                sent = _sent_as(request, backend)
            else:
                names = []
                for adapter_id, scale in request.adapter_scales:
                    backend = await stack.enter_async_context(self.provider._adapter_in_use(adapter_id))
                    names.append((backend or adapter_id, scale))
                sent = dataclasses.replace(request, adapter_scales=tuple(names))
            self.stack = stack.pop_all()
        return sent

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool | None:
        return await self.stack.__aexit__(exc_type, exc, traceback)


def _as_asked(result: _Answered, adapter_id: str | None) -> _Answered:
    """The result under the adapter id the caller asked for, whatever backend name served it (also as its
    ``model``, where the server named the model it served by that name: vLLM's ``math@2`` once replaced)."""
    if result.adapter_id == adapter_id:
        return result
    if adapter_id is not None and result.adapter_id is not None and result.model == result.adapter_id:
        return dataclasses.replace(result, adapter_id=adapter_id, model=adapter_id)
    return dataclasses.replace(result, adapter_id=adapter_id)
