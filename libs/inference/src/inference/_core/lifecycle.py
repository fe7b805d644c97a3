"""The adapter lifecycle every provider shares: one record of what the user loaded, and the rules around it.

The registry is the single place that decides:

- concurrent ``load_adapter`` calls for one id and path load it once (a failed load fails every caller);
- an id loaded with another path is refused unless the caller asks to replace it; paths are compared by
  what they name (:func:`~inference._core.paths.path_identity`), so ``a/x/`` and ``./a/x`` are one path;
- ``unload_adapter`` waits for the adapter's requests in flight, and refuses new ones meanwhile;
- with a capacity (``max_adapters``), the least recently used adapter that is neither pinned nor in use is
  evicted from the backend, stays listed, and is loaded again transparently when a request needs it.

Backends only do the real work through two callables, ``load(id, path)`` and ``unload(id)``, which the
registry never calls twice at once for the same id.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from inference._core.paths import path_identity
from inference.exceptions import AdapterAlreadyLoadedError, AdapterNotFoundError

logger = logging.getLogger("inference.adapters")

BackendLoad = Callable[[str, str], Awaitable[None]]
BackendUnload = Callable[[str], Awaitable[None]]
BackendDiscover = Callable[[str], Awaitable[str | None]]


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

    path: str
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
            already holds (e.g. created by an earlier process), which is then recorded as resident, or ``None``.
    """

    def __init__(
        self,
        provider: str,
        load: BackendLoad,
        unload: BackendUnload,
        capacity: Callable[[], int | None],
        discover: BackendDiscover,
    ) -> None:
        self._provider = provider
        self._load = load
        self._unload = unload
        self._capacity = capacity
        self._discover = discover
        self._entries: dict[str, _Entry] = {}
        self._clock = itertools.count(1)

    def ids(self) -> list[str]:
        """Ids the user loaded (resident or evicted), not those being unloaded."""
        return [adapter_id for adapter_id, entry in self._entries.items() if not entry.unloading]

    def path_of(self, adapter_id: str) -> str | None:
        """The path ``adapter_id`` was loaded from, or ``None``."""
        entry = self._entries.get(adapter_id)
        return entry.path if entry is not None else None

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

    def forget(self, adapter_id: str) -> None:
        """Drop the record without touching the backend (the backend lost the adapter itself)."""
        self._entries.pop(adapter_id, None)

    async def load(self, adapter_id: str, path: str, *, replace: bool = False, pin: bool = False) -> None:
        """Load ``adapter_id`` from ``path`` (see the module docstring for the rules)."""
        identity = path_identity(path)
        while True:
            entry = self._entries.get(adapter_id)
            if entry is None:
                entry = _Entry(path=path, identity=identity, pinned=pin)
                self._entries[adapter_id] = entry
                try:
                    await self._make_resident(adapter_id, entry)
                except BaseException:
                    # A cancelled caller may leave the backend holding the adapter: keep the record then.
                    if not entry.resident and self._entries.get(adapter_id) is entry:
                        del self._entries[adapter_id]
                    raise
                return
            if entry.transition is not None:
                await asyncio.shield(entry.transition)
                continue
            if entry.unloading:
                await self._wait_unloaded(adapter_id, entry)
                continue
            if (entry.identity or path_identity(entry.path)) == identity:
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
            await self.unload(adapter_id)

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
                    await self._finish(entry, self._unload(adapter_id), resident_after=False)
        except BaseException:
            entry.unloading = False
            if not entry.resident and self._entries.get(adapter_id) is entry:
                del self._entries[adapter_id]  # the backend did unload it before a cancellation
            raise
        else:
            if self._entries.get(adapter_id) is entry:
                del self._entries[adapter_id]
        finally:
            entry.unloaded.set_result(None)  # a load of the same id waiting for this unload goes on

    @asynccontextmanager
    async def use(self, adapter_id: str) -> AsyncIterator[None]:
        """Hold ``adapter_id`` resident for one request; it cannot be unloaded or evicted meanwhile."""
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
        try:
            yield
        finally:
            entry.in_flight -= 1
            if entry.in_flight == 0 and entry.drained is not None:
                entry.drained.set()

    def clear(self) -> None:
        """Forget every record (the provider is closing and frees its backend itself)."""
        self._entries.clear()

    # Internals ------------------------------------------------------------------------------------------

    async def _make_resident(self, adapter_id: str, entry: _Entry) -> None:
        async with self._transition(entry):
            await self._evict_for_one_more(exclude=adapter_id)
            await self._finish(entry, self._load(adapter_id, entry.path), resident_after=True)
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
            logger.info("%s: evicting least recently used adapter %r", self._provider, victim)
            entry.evicting = True
            try:
                async with self._transition(entry):
                    await self._finish(entry, self._unload(victim), resident_after=False)
            finally:
                entry.evicting = False

    async def _wait_unloaded(self, adapter_id: str, entry: _Entry) -> None:
        if entry.unloaded is not None:
            await asyncio.shield(entry.unloaded)

    async def _discovered(self, adapter_id: str) -> _Entry | None:
        path = await self._discover(adapter_id)
        if path is None:
            return None
        entry = self._entries.setdefault(adapter_id, _Entry(path=path, identity=path_identity(path), resident=True))
        entry.last_used = next(self._clock)
        return entry

    def _not_found(self, adapter_id: str) -> AdapterNotFoundError:
        entry = self._entries.get(adapter_id)
        if entry is not None and entry.unloading:
            message = f"adapter {adapter_id!r} is being unloaded: load it again before using it"
        else:
            loaded = ", ".join(sorted(self.ids())) or "none"
            message = f"adapter {adapter_id!r} is not loaded (loaded: {loaded}): call load_adapter first"
        return AdapterNotFoundError(message, provider=self._provider)
