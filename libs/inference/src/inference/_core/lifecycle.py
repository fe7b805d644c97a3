"""The adapter lifecycle every provider shares: one record of what the user loaded, and the rules around it.

The registry is the single place that decides:

- concurrent ``load_adapter`` calls for one id and path load it once (a failed load fails every caller);
- an id loaded with another path is refused unless the caller asks to replace it; paths are compared by
  what they name (:func:`~inference._core.paths.path_identity`), so ``a/x/`` and ``./a/x`` are one path;
- a replacement is atomic: the new weights load under a new backend name while the old ones keep serving, then
  the id switches to them; requests that started before the switch finish on the old weights, which are
  unloaded after them; a replacement that fails to load leaves the old adapter as it was;
- ``unload_adapter`` waits for the adapter's requests in flight, and refuses new ones meanwhile;
- with a capacity (``max_adapters``), the least recently used adapter that is neither pinned nor in use is
  evicted from the backend, stays listed, and is loaded again transparently when a request needs it; a
  replacement's new weights count as a load (they take the id's place, so the cap holds once the old ones
  are unloaded);
- a pin belongs to the id: ``pin=True`` on a load or a replacement pins it, ``pin=False`` leaves it as it was,
  an unload forgets it;
- an adapter keeps the weights it was loaded with until it is replaced: where its files are on this machine,
  their sizes and modification times are noted at load, and files changed in place since are never loaded
  under the id by an eviction's reload (an error says to replace it) nor ignored by a repeated load (which
  needs ``replace=True``, and then loads them as any replacement).

Backends only do the real work through two callables, ``load(name, source)`` and ``unload(name)``, which the
registry never calls twice at once for the same name. The name is the backend name of the id's current weights:
the id itself until it is first replaced, then ``versioned(id, n)`` (``use()`` yields it, and requests are sent to
the backend under it).

Every backend load, unload, eviction and reload is counted (:meth:`AdapterRegistry.stats`), logged as one
structured record on the ``inference.adapters`` logger (``extra``: ``adapter_event``, ``provider``,
``adapter_id``, ``backend_name``, ``adapter_path``, ``duration_ms``, ``outcome``) and, when
``opentelemetry-api`` is importable, traced as a span ``inference.adapter.<event>`` with the same attributes.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from inference._core.validation import listed
from inference.adapters.peft import CONFIG_NAME, WEIGHT_NAMES
from inference.adapters.source import AdapterSource
from inference.adapters.stats import AdapterStats, ProviderAdapterStats
from inference.exceptions import AdapterAlreadyLoadedError, AdapterNotFoundError, InvalidAdapterError

logger = logging.getLogger("inference.adapters")

BackendLoad = Callable[[str, AdapterSource], Awaitable[None]]
BackendUnload = Callable[[str], Awaitable[None]]
BackendDiscover = Callable[[str], Awaitable["str | Discovered | None"]]
VersionedName = Callable[[str, int], str]


def default_versioned_name(adapter_id: str, version: int) -> str:
    """``id@version``: ``@`` is not allowed in an adapter id, so no id the user loads can take this name."""
    return f"{adapter_id}@{version}"


def parse_versioned_name(name: str) -> tuple[str, int] | None:
    """``(id, version)`` of a :func:`default_versioned_name`, else ``None`` (a plain id)."""
    adapter_id, at, version = name.rpartition("@")
    if not at or not adapter_id or not version.isdigit() or not version.isascii():
        return None
    return adapter_id, int(version)


@dataclass(frozen=True)
class Discovered:
    """An adapter the backend holds under a name other than its id: an id another process replaced.

    Attributes:
        path: Where its weights came from (what a reload reads).
        backend: The name the backend holds it under (``versioned(id, version)``).
        version: Its replacement number; this registry's later replacements are numbered after it, so that
            they never take a name the backend already has.
    """

    path: str
    backend: str
    version: int


FilesState = tuple[tuple[str, int, int], ...] | None
"""The adapter files at a path: (name, size, modification time in ns) each; ``None`` where none can be read here."""


def files_state(path: str) -> FilesState:
    """What the adapter files at ``path`` look like now: a PEFT directory's config and weights, or a file.

    ``None`` for a path this machine cannot read (one on a server, a Hub id, weights kept in memory). Other files
    in the directory (a GGUF converted beside them) do not count.
    """
    try:
        if os.path.isdir(path):
            candidates = [os.path.join(path, name) for name in (CONFIG_NAME, *WEIGHT_NAMES)]
        elif os.path.isfile(path):
            candidates = [path]
        else:
            return None
        state = []
        for candidate in candidates:
            try:
                info = os.stat(candidate)
            except FileNotFoundError:
                continue
            state.append((os.path.basename(candidate), info.st_size, info.st_mtime_ns))
    except (OSError, ValueError):
        return None
    return tuple(state)


def _files(source: AdapterSource) -> FilesState:
    """The state of a source's files (``None`` for weights kept in memory, which have none)."""
    return None if source.weights is not None else files_state(source.path)


def _changed(entry: _Entry) -> bool:
    """True when the entry's files were noted at load and are not what they were then."""
    return entry.files is not None and files_state(entry.path) != entry.files


_tracer: Any = None  # opentelemetry's tracer once looked up; False when opentelemetry-api is not installed


def _span(event: str, attributes: dict[str, str]) -> AbstractContextManager[object]:
    """A span ``inference.adapter.<event>`` when ``opentelemetry-api`` is importable, else nothing."""
    global _tracer
    if _tracer is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _tracer = False
        else:
            _tracer = trace.get_tracer("inference")
    if _tracer is False:
        return nullcontext()
    span: AbstractContextManager[object] = _tracer.start_as_current_span(
        f"inference.adapter.{event}", attributes=attributes
    )
    return span


@dataclass
class _Counters:
    """What happened to one adapter id since it was first loaded (kept across replacements and losses)."""

    loads: int = 0
    evictions: int = 0
    reloads: int = 0
    replacements: int = 0
    last_load_ms: float | None = None
    last_used: float | None = None


@dataclass
class _Totals:
    loads: int = 0
    evictions: int = 0
    reloads: int = 0
    replacements: int = 0
    unloads: int = 0
    failed_loads: int = 0


class AdapterState(enum.Enum):
    """Where one adapter is in its lifecycle (``docs/architecture.md`` draws the transitions).

    ``LOADING`` -> ``RESIDENT``: the backend load finished (a failed load forgets the adapter).
    ``RESIDENT`` -> ``EVICTING`` -> ``EVICTED``: capacity reached, nothing uses it, it is not pinned.
    ``EVICTED`` -> ``LOADING``: a request needs it again (loaded from its remembered path).
    ``RESIDENT``/``EVICTED`` -> ``UNLOADING``: ``unload_adapter``; requests in flight finish first, then the
    backend unload runs and the adapter is forgotten.
    """

    LOADING = "loading"
    RESIDENT = "resident"
    EVICTING = "evicting"
    EVICTED = "evicted"
    UNLOADING = "unloading"


@dataclass
class _Entry:
    """The record of one adapter id.

    The state is derived from three flags and the transition in progress (see :attr:`state`); the three
    waitables let callers wait for a transition (``transition``), for requests in flight to finish
    (``drained``) and for an unload to complete (``unloaded``).
    """

    source: AdapterSource
    backend: str = ""
    identity: str = ""
    pinned: bool = False
    resident: bool = False
    in_flight: int = 0
    last_used: int = 0
    unloading: bool = False
    transition: asyncio.Future[None] | None = None
    drained: asyncio.Event | None = None
    unloaded: asyncio.Future[None] | None = None
    evicting: bool = False
    loads: int = 0
    files: FilesState = None

    @property
    def path(self) -> str:
        """Where the adapter was loaded from (the label of weights kept in memory)."""
        return self.source.path

    @property
    def state(self) -> AdapterState:
        if self.unloading:
            return AdapterState.UNLOADING
        if self.evicting:
            return AdapterState.EVICTING
        if self.resident:
            return AdapterState.RESIDENT
        return AdapterState.LOADING if self.transition is not None else AdapterState.EVICTED


class AdapterRegistry:
    """What a provider has loaded, and the lifecycle rules around it.

    Args:
        provider: The provider's name, for error messages.
        load: Loads an adapter into the backend.
        unload: Removes an adapter from the backend.
        capacity: Returns the most adapters to keep resident (``None`` = unlimited); read on each load.
        discover: Asked about an id the registry does not know; returns the path of an adapter the backend
            already holds (e.g. created by an earlier process), which is then recorded as resident, a
            :class:`Discovered` when the backend holds it under a versioned name, or ``None``.
        versioned: The backend name of an id's ``n``-th replacement (default ``id@n``).
    """

    def __init__(
        self,
        provider: str,
        load: BackendLoad,
        unload: BackendUnload,
        capacity: Callable[[], int | None],
        discover: BackendDiscover,
        versioned: VersionedName = default_versioned_name,
    ) -> None:
        self._provider = provider
        self._versioned = versioned
        self._next_version = 2  # the number of the next replacement's backend name
        self._load = load
        self._unload = unload
        self._capacity = capacity
        self._discover = discover
        self._entries: dict[str, _Entry] = {}
        self._by_backend: dict[str, _Entry] = {}  # backend name -> entry, for replaced ids and draining versions
        self._replacing: dict[str, asyncio.Lock] = {}
        self._retiring: set[asyncio.Future[None]] = set()  # retirements left to run by a cancelled replace
        self._clock = itertools.count(1)
        self._counters: dict[str, _Counters] = {}
        self._totals = _Totals()

    def ids(self) -> list[str]:
        """Ids the user loaded (resident or evicted), not those being unloaded."""
        return [adapter_id for adapter_id, entry in self._entries.items() if not entry.unloading]

    def path_of(self, name: str) -> str | None:
        """The path an adapter id, or a backend name in use now (a replaced id's, or one still draining), was
        loaded from; ``None`` when neither is known."""
        entry = self._entries.get(name) or self._by_backend.get(name)
        return entry.path if entry is not None else None

    def source_of(self, name: str) -> AdapterSource | None:
        """The source an adapter id, or a backend name in use now, was loaded from; ``None`` when neither is known."""
        entry = self._entries.get(name) or self._by_backend.get(name)
        return entry.source if entry is not None else None

    def paths(self) -> set[str]:
        """Every path an adapter in the registry (listed, loading, or replaced and still draining) was loaded from."""
        return {entry.path for entry in [*self._entries.values(), *self._by_backend.values()]}

    def backend_name(self, adapter_id: str) -> str:
        """The backend name of the id's current weights (the id itself until it is replaced)."""
        entry = self._entries.get(adapter_id)
        return entry.backend if entry is not None else adapter_id

    def backend_names(self) -> dict[str, str]:
        """Id -> backend name of every adapter the user loaded (not those being unloaded)."""
        return {adapter_id: entry.backend for adapter_id, entry in self._entries.items() if not entry.unloading}

    def state_of(self, adapter_id: str) -> AdapterState | None:
        """The lifecycle state of ``adapter_id``, or ``None`` when it is not recorded."""
        entry = self._entries.get(adapter_id)
        return entry.state if entry is not None else None

    def is_resident(self, adapter_id: str) -> bool:
        """True when the adapter is loaded in the backend now (not evicted)."""
        entry = self._entries.get(adapter_id)
        return entry is not None and entry.resident

    def in_flight(self, adapter_id: str) -> int:
        """Requests using the adapter right now."""
        entry = self._entries.get(adapter_id)
        return entry.in_flight if entry is not None else 0

    def stats(self) -> ProviderAdapterStats:
        """Per-adapter state and counters, with the provider's totals (see :mod:`inference.adapters.stats`)."""
        adapters = []
        for adapter_id in sorted(self.ids()):
            entry = self._entries[adapter_id]
            counters = self._counters.get(adapter_id, _Counters())
            adapters.append(
                AdapterStats(
                    adapter_id=adapter_id,
                    backend_name=entry.backend,
                    state=entry.state.value,
                    resident=entry.resident,
                    pinned=entry.pinned,
                    in_flight=entry.in_flight,
                    loads=counters.loads,
                    evictions=counters.evictions,
                    reloads=counters.reloads,
                    replacements=counters.replacements,
                    last_load_ms=counters.last_load_ms,
                    last_used=counters.last_used,
                )
            )
        totals = self._totals
        live = [*self._entries.values(), *self._by_backend.values()]  # replaced weights still draining count too
        return ProviderAdapterStats(
            provider=self._provider,
            adapters=tuple(adapters),
            resident=sum(stats.resident for stats in adapters),
            evicted=sum(stats.state == AdapterState.EVICTED.value for stats in adapters),
            in_flight=sum(entry.in_flight for entry in {id(e): e for e in live}.values()),
            loads=totals.loads,
            evictions=totals.evictions,
            reloads=totals.reloads,
            replacements=totals.replacements,
            unloads=totals.unloads,
            failed_loads=totals.failed_loads,
        )

    def note_reload(self, name: str, duration_ms: float, *, ok: bool = True) -> None:
        """Count, log and trace a reload the backend did outside the registry (a server that lost an adapter,
        healed by the provider during a request); ``name`` is the id or the backend name it was loaded under."""
        entry = self._entries.get(name) or self._by_backend.get(name)
        if entry is None:
            return
        adapter_id = next((key for key, value in self._entries.items() if value is entry), name)
        attributes = {"inference.provider": self._provider, "inference.adapter_id": adapter_id,
                      "inference.backend_name": entry.backend, "inference.adapter_path": entry.path}
        with _span("reload", attributes):
            pass
        self._record("reload", adapter_id, entry, duration_ms, "ok" if ok else "error", {"healed": True})

    def refuse_changed(self, name: str) -> None:
        """Raise when the files an adapter (an id, or a backend name in use now) was loaded from changed since:
        for a backend that loads it again by itself (a server that lost it, another replica).

        Raises:
            InvalidAdapterError: The files changed in place since the load.
        """
        entry = self._entries.get(name) or self._by_backend.get(name)
        if entry is not None:
            self._refuse_changed(next((key for key, value in self._entries.items() if value is entry), name), entry)

    def _refuse_changed(self, adapter_id: str, entry: _Entry) -> None:
        if _changed(entry):
            raise InvalidAdapterError(
                f"adapter {adapter_id!r} must be loaded again and its files at {entry.path} changed since it was "
                "loaded, which would serve other weights under the same id: call load_adapter(..., replace=True) "
                "to serve the new files, or put back the ones it was loaded from",
                provider=self._provider,
                path=entry.path,
            )

    def forget(self, adapter_id: str) -> None:
        """Drop the record without touching the backend (the backend lost the adapter itself)."""
        self._entries.pop(adapter_id, None)

    async def load(self, adapter_id: str, source: AdapterSource, *, replace: bool = False, pin: bool = False) -> None:
        """Load ``adapter_id`` from ``source`` (see the module docstring for the rules)."""
        identity, path = source.identity, source.path
        while True:
            entry = self._entries.get(adapter_id)
            if entry is None:
                entry = _Entry(source=source, backend=adapter_id, identity=identity, pinned=pin, files=_files(source))
                self._entries[adapter_id] = entry
                try:
                    await self._make_resident(adapter_id, entry)
                except BaseException:
                    # A cancelled caller may leave the backend holding the adapter: keep the record then.
                    if not entry.resident and self._entries.get(adapter_id) is entry:
                        del self._entries[adapter_id]
                        if not self._counters.get(adapter_id, _Counters(loads=1)).loads:
                            del self._counters[adapter_id]
                    raise
                return
            if entry.transition is not None:
                await asyncio.shield(entry.transition)
                continue
            if entry.unloading:
                await self._wait_unloaded(adapter_id, entry)
                continue
            if entry.identity == identity:
                if _changed(entry):
                    if not replace:
                        raise AdapterAlreadyLoadedError(
                            f"adapter {adapter_id!r} is loaded from {entry.path}, whose files changed since it was "
                            "loaded: pass replace=True to serve the new files (or unload it first)",
                            provider=self._provider,
                            path=path,
                        )
                    await self._replace(adapter_id, entry, source, identity, pin=pin)
                    return
                entry.pinned = entry.pinned or pin
                if not entry.resident:
                    await self._make_resident(adapter_id, entry)
                return
            if not replace:
                raise AdapterAlreadyLoadedError(
                    f"adapter {adapter_id!r} is already loaded from {entry.path}: unload it first, "
                    f"choose another id, or pass replace=True to load {path} in its place",
                    provider=self._provider,
                    path=path,
                )
            await self._replace(adapter_id, entry, source, identity, pin=pin)
            return

    async def unload(self, adapter_id: str) -> None:
        """Unload ``adapter_id`` once its requests in flight have finished."""
        entry = self._entries.get(adapter_id) or await self._discovered(adapter_id)
        if entry is None or entry.unloading:
            raise self._not_found(adapter_id)
        entry.unloading = True
        entry.unloaded = asyncio.get_running_loop().create_future()
        try:
            if entry.in_flight:
                entry.drained = asyncio.Event()
                await entry.drained.wait()
            while entry.transition is not None:
                await asyncio.shield(entry.transition)
            if entry.resident:
                async with self._transition(entry):
                    with self._observed("unload", adapter_id, entry):
                        await self._finish(entry, self._unload(entry.backend), resident_after=False)
        except BaseException:
            entry.unloading = False
            if not entry.resident and self._entries.get(adapter_id) is entry:
                del self._entries[adapter_id]  # the backend did unload it before a cancellation
            raise
        else:
            if self._entries.get(adapter_id) is entry:
                del self._entries[adapter_id]
            self._by_backend.pop(entry.backend, None)
            self._counters.pop(adapter_id, None)
            self._totals.unloads += 1
        finally:
            entry.unloaded.set_result(None)  # a load of the same id waiting for this unload goes on

    @asynccontextmanager
    async def use(self, adapter_id: str) -> AsyncIterator[str]:
        """Hold ``adapter_id`` resident for one request; it cannot be unloaded or evicted meanwhile.

        Yields the backend name to send the request under: the weights current when the request starts, kept
        until it ends even if the id is replaced meanwhile.
        """
        while True:
            entry = self._entries.get(adapter_id) or await self._discovered(adapter_id)
            if entry is None or entry.unloading:
                raise self._not_found(adapter_id)
            if entry.transition is not None:
                await asyncio.shield(entry.transition)
                continue
            if not entry.resident:
                await self._make_resident(adapter_id, entry)
                continue
            break
        entry.in_flight += 1
        entry.last_used = next(self._clock)
        self._counters.setdefault(adapter_id, _Counters()).last_used = time.time()
        try:
            yield entry.backend
        finally:
            entry.in_flight -= 1
            if entry.in_flight == 0 and entry.drained is not None:
                entry.drained.set()

    def clear(self) -> None:
        """Forget every record (the provider is closing and frees its backend itself)."""
        self._entries.clear()
        self._by_backend.clear()

    # Internals ------------------------------------------------------------------------------------------

    async def _replace(self, adapter_id: str, old: _Entry, source: AdapterSource, identity: str, *, pin: bool) -> None:
        """Load ``source`` under a new backend name beside the old weights, switch the id to it, then unload the
        old weights once the requests that use them have finished.

        The old entry stays the id's record (serving, listed) until the new weights are loaded; a failed load
        raises and changes nothing. Concurrent replacements of one id take turns. The id stays pinned if it was,
        and ``pin`` pins it.
        """
        lock = self._replacing.setdefault(adapter_id, asyncio.Lock())
        async with lock:
            restart = self._entries.get(adapter_id) is not old or old.transition is not None or old.unloading
            # (another replacement, an eviction or an unload ran meanwhile: start over with what the id is now)
            interrupted = None if restart else await self._load_beside(adapter_id, old, source, identity, pin=pin)
        if restart:
            await self.load(adapter_id, source, replace=True, pin=pin)
            return
        if interrupted is not None:
            # the caller is gone; finish without it
            self._retiring.add(asyncio.ensure_future(self._retire(adapter_id, old)))
            raise interrupted
        await self._retire(adapter_id, old)

    async def _load_beside(
        self, adapter_id: str, old: _Entry, source: AdapterSource, identity: str, *, pin: bool
    ) -> BaseException | None:
        """Load ``source`` under a new backend name while ``old`` serves, then switch the id to it.

        The capacity rule applies as to any load: the new weights take the id's place, so other adapters are
        evicted until they leave room for one (the old weights, while they drain, are not counted).

        Returns the cancellation that arrived after the backend had loaded the new weights (the switch is made
        anyway: the backend holds them), else ``None``. A failed load raises with ``old`` untouched.
        """
        version, self._next_version = self._next_version, self._next_version + 1
        new = _Entry(
            source=source,
            backend=self._versioned(adapter_id, version),
            identity=identity,
            pinned=old.pinned or pin,
            files=_files(source),
        )
        self._by_backend[new.backend] = new
        interrupted: BaseException | None = None
        try:
            async with self._transition(new):
                await self._evict_for_one_more(exclude=adapter_id)
                with self._observed("load", adapter_id, new, replaces=old.backend):
                    await self._finish(new, self._load(new.backend, new.source), resident_after=True)
        except BaseException as error:
            if not new.resident:
                self._by_backend.pop(new.backend, None)
                raise
            interrupted = error
        new.loads = 1
        new.last_used = next(self._clock)
        self._entries[adapter_id] = new  # the switch: from here on use() hands out the new backend name
        self._by_backend.setdefault(old.backend, old)
        self._counters.setdefault(adapter_id, _Counters()).replacements += 1
        self._totals.replacements += 1
        logger.info("%s: adapter %r now serves %s (was %s)", self._provider, adapter_id, source.path, old.path)
        return interrupted

    async def _retire(self, adapter_id: str, old: _Entry) -> None:
        """Unload replaced weights after the requests still using them."""
        old.unloading = True
        try:
            if old.in_flight:
                old.drained = asyncio.Event()
                await old.drained.wait()
            while old.transition is not None:
                await asyncio.shield(old.transition)
            if old.resident:
                async with self._transition(old):
                    with self._observed("unload", adapter_id, old, replaced=True):
                        await self._finish(old, self._unload(old.backend), resident_after=False)
        except Exception:
            logger.warning(
                "%s: unloading the replaced weights %r failed; they stay in the backend",
                self._provider,
                old.backend,
                exc_info=True,
            )
        finally:
            if not old.resident:
                self._by_backend.pop(old.backend, None)
            self._retiring = {task for task in self._retiring if not task.done()}

    async def _make_resident(self, adapter_id: str, entry: _Entry) -> None:
        self._refuse_changed(adapter_id, entry)
        async with self._transition(entry):
            await self._evict_for_one_more(exclude=adapter_id)
            event = "reload" if self._counters.get(adapter_id, _Counters()).loads else "load"
            with self._observed(event, adapter_id, entry):
                await self._finish(entry, self._load(entry.backend, entry.source), resident_after=True)
        entry.loads += 1
        entry.last_used = next(self._clock)

    @staticmethod
    async def _finish(entry: _Entry, work: Awaitable[None], *, resident_after: bool) -> None:
        """Run a backend load or unload to its end even if the caller is cancelled meanwhile.

        A backend call stopped half-way would leave the backend and this record disagreeing (an adapter
        listed but gone, or a handle nobody frees). The caller's cancellation is re-raised once the backend
        is done, with the record matching what the backend did.
        """
        task = asyncio.ensure_future(work)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])
            if not task.cancelled() and task.exception() is None:
                entry.resident = resident_after
            raise
        entry.resident = resident_after

    @asynccontextmanager
    async def _transition(self, entry: _Entry) -> AsyncIterator[None]:
        """Mark ``entry`` busy (synchronously, before any await) while a backend load or unload runs.

        Other callers wait on ``entry.transition`` and then look at the entry again; a failure is raised
        to them too, so every caller of a failed load sees its error.
        """
        transition: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry.transition = transition
        try:
            yield
        except Exception as error:
            transition.set_exception(error)
            transition.exception()  # retrieved here, so an unobserved failure logs no warning
            raise
        except BaseException:
            transition.set_result(None)  # the owner was cancelled: waiters look at the entry again
            raise
        else:
            transition.set_result(None)
        finally:
            entry.transition = None

    async def _evict_for_one_more(self, *, exclude: str) -> None:
        capacity = self._capacity()
        if capacity is None:
            return
        while True:
            resident = [
                (entry.last_used, adapter_id)
                for adapter_id, entry in self._entries.items()
                if entry.resident and adapter_id != exclude and not entry.evicting
            ]
            if len(resident) < capacity:
                return
            candidates = [
                (last_used, adapter_id)
                for last_used, adapter_id in resident
                if not self._entries[adapter_id].pinned
                and self._entries[adapter_id].in_flight == 0
                and self._entries[adapter_id].transition is None
            ]
            if not candidates:
                logger.warning(
                    "%s: %d adapters are resident, pinned or in use; loading one more than max_adapters=%d",
                    self._provider,
                    len(resident),
                    capacity,
                )
                return
            _, victim = min(candidates)
            entry = self._entries[victim]
            entry.evicting = True
            try:
                async with self._transition(entry):
                    with self._observed("evict", victim, entry):
                        await self._finish(entry, self._unload(entry.backend), resident_after=False)
            finally:
                entry.evicting = False

    @contextmanager
    def _observed(self, event: str, adapter_id: str, entry: _Entry, **detail: object) -> Iterator[None]:
        """Count, log and trace one backend ``event`` (``load``, ``reload``, ``unload``, ``evict``)."""
        attributes = {
            "inference.provider": self._provider,
            "inference.adapter_id": adapter_id,
            "inference.backend_name": entry.backend,
            "inference.adapter_path": entry.path,
            **{f"inference.{key}": str(value) for key, value in detail.items()},
        }
        start = time.perf_counter()
        outcome = "error"
        try:
            with _span(event, attributes):
                yield
            outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._record(event, adapter_id, entry, (time.perf_counter() - start) * 1000, outcome, detail)

    def _record(
        self, event: str, adapter_id: str, entry: _Entry, ms: float, outcome: str, detail: dict[str, object]
    ) -> None:
        totals = self._totals
        counters = self._counters.setdefault(adapter_id, _Counters())
        if outcome == "ok":
            if event in ("load", "reload"):
                counters.loads += 1
                counters.last_load_ms = ms
                totals.loads += 1
                if event == "reload":
                    counters.reloads += 1
                    totals.reloads += 1
            elif event == "evict":
                counters.evictions += 1
                totals.evictions += 1
        elif event in ("load", "reload") and outcome == "error":
            totals.failed_loads += 1
        extra = {
            "adapter_event": event,
            "provider": self._provider,
            "adapter_id": adapter_id,
            "backend_name": entry.backend,
            "adapter_path": entry.path,
            "duration_ms": round(ms, 3),
            "outcome": outcome,
            **detail,
        }
        logger.log(
            logging.INFO if outcome == "ok" else logging.WARNING,
            "%s: adapter %r %s (backend name %r, %s): %s in %.1f ms",
            self._provider,
            adapter_id,
            event,
            entry.backend,
            entry.path,
            outcome,
            ms,
            extra=extra,
        )

    async def _wait_unloaded(self, adapter_id: str, entry: _Entry) -> None:
        if entry.unloaded is not None:
            await asyncio.shield(entry.unloaded)

    async def _discovered(self, adapter_id: str) -> _Entry | None:
        found = await self._discover(adapter_id)
        if found is None:
            return None
        if isinstance(found, str):
            found = Discovered(path=found, backend=adapter_id, version=1)
        entry = self._entries.get(adapter_id)
        if entry is None:
            source = AdapterSource(found.path)
            entry = _Entry(source=source, backend=found.backend, identity=source.identity, resident=True)
            self._entries[adapter_id] = entry
            if found.backend != adapter_id:
                self._by_backend[found.backend] = entry
                self._next_version = max(self._next_version, found.version + 1)
        entry.last_used = next(self._clock)
        return entry

    def _not_found(self, adapter_id: str) -> AdapterNotFoundError:
        entry = self._entries.get(adapter_id)
        if entry is not None and entry.unloading:
            message = f"adapter {adapter_id!r} is being unloaded: load it again before using it"
        else:
            loaded = listed(sorted(self.ids())) or "none"
            message = f"adapter {adapter_id!r} is not loaded (loaded: {loaded}): call load_adapter first"
        return AdapterNotFoundError(message, provider=self._provider)
