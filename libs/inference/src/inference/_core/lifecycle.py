"""The adapter lifecycle every provider shares: one record of what the user loaded, and the rules around it.

The registry is the single place that decides:

- concurrent ``load_adapter`` calls for one id and path load it once (a failed load fails every caller);
- an id loaded with another path is refused unless the caller asks to replace it; paths are compared by
  what they name (:func:`~inference._core.paths.path_identity`), so ``a/x/`` and ``./a/x`` are one path;
- a replacement is atomic: the new weights load under a new backend name while the old ones keep serving, then
  the id switches to them; requests that started before the switch finish on the old weights, which are
  unloaded after them; a replacement that fails to load leaves the old adapter as it was;
- ``unload_adapter`` waits for the adapter's requests in flight, and refuses new ones meanwhile;
- the later call wins: a ``load_adapter`` of the id still running when ``unload_adapter`` of it is called (a first
  load, a reload, a replacement) leaves it unloaded, and raises :class:`AdapterNotFoundError` (a replacement's new
  weights are unloaded, never switched to; the unload returns once they are); a load called after the unload
  waits for it, then loads the id again;
- with a capacity (``max_adapters``), the least recently used adapter that is neither pinned nor in use is
  evicted from the backend, stays listed, and is loaded again transparently when a request needs it; a
  replacement's new weights count as a load (they take the id's place, so the cap holds once the old ones
  are unloaded); once the provider is closed nothing is evicted (closing frees every adapter);
- a first load of an id that a backend holds under a versioned name (another process replaced it) is a load of
  a loaded id: the provider records those weights first (:meth:`AdapterRegistry.adopt`), so the same path adopts
  them, and a replacement is numbered after them and unloads them;
- a pin belongs to the id: ``pin=True`` on a load or a replacement pins it, ``pin=False`` leaves it as it was,
  an unload forgets it;
- an adapter keeps the weights it was loaded with until it is replaced: where its files are on this machine,
  their sizes and modification times are noted at load, and files changed in place since are never loaded
  under the id by an eviction's reload (an error says to replace it) nor ignored by a repeated load (which
  needs ``replace=True``, and then loads them as any replacement);
- a load or unload with a ``holder`` (an evaluation run's turn) takes or gives back that holder's hold instead:
  the adapter is unloaded when the last hold is given back, unless the user loaded it (before or meanwhile), see
  :mod:`inference._core.adapter_holds`; a request made for a holder is refused once the id no longer serves the
  weights the hold is on (the user replaced them, or unloaded and loaded the id again), so it never answers with
  weights the holder did not load.

Backends only do the real work through two callables, ``load(name, source)`` and ``unload(name)``, which the
registry never calls twice at once for the same name. The name is the backend name of the id's current weights:
the id itself until it is first replaced, then ``versioned(id, n)`` (``use()`` yields it, and requests are sent to
the backend under it); an id loaded again while its replaced weights still drain under the id itself gets a
``versioned(id, n)`` name too.

Every backend load, unload, eviction and reload is counted (:meth:`AdapterRegistry.stats`), logged and traced
(:mod:`inference._core.lifecycle_events`). The names of replaced weights are in :mod:`inference._core.backend_names`,
the check of files changed in place in :mod:`inference._core.adapter_files`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from inference._core.adapter_entry import AdapterState, Entry, finish, transition
from inference._core.adapter_errors import already_loaded, files_changed_error, not_loaded, superseded
from inference._core.adapter_files import FilesState, files_changed, files_state, source_files_state
from inference._core.adapter_holds import current_holder
from inference._core.backend_names import Discovered, VersionedName, default_versioned_name, parse_versioned_name
from inference._core.lifecycle_events import LifecycleEvents
from inference.adapters.source import AdapterSource
from inference.adapters.stats import AdapterStats, ProviderAdapterStats
from inference.exceptions import AdapterNotFoundError

__all__ = [
    "AdapterRegistry",
    "AdapterState",
    "BackendDiscover",
    "BackendLoad",
    "BackendUnload",
    "Discovered",
    "FilesState",
    "VersionedName",
    "default_versioned_name",
    "files_state",
    "parse_versioned_name",
]

logger = logging.getLogger("inference.adapters")

BackendLoad = Callable[[str, AdapterSource], Awaitable[None]]
BackendUnload = Callable[[str], Awaitable[None]]
BackendDiscover = Callable[[str], Awaitable["str | Discovered | None"]]


class AdapterRegistry:
    """What a provider has loaded, and the lifecycle rules around it.

    Args:
        provider: The provider's name, for error messages.
        load: Loads an adapter into the backend.
        unload: Removes an adapter from the backend.
        capacity: Returns the most adapters to keep resident (``None`` = unlimited); read on each load.
        discover: Asked about an id the registry does not know when a request uses it or an unload names it;
            returns the path of an adapter the backend already holds (e.g. created by an earlier process), which is
            then recorded as resident, a :class:`Discovered` when the backend holds it under a versioned name, or
            ``None``. (Before a first load the provider asks its backend itself, and records a versioned find
            with :meth:`adopt`.)
        versioned: The backend name of an id's ``n``-th replacement (default ``id@n``).
        closed: Whether the provider is closed (or closing): then nothing is evicted any more (closing frees every
            adapter; an eviction started after it would only fail on the closed backend).
    """

    def __init__(
        self,
        provider: str,
        load: BackendLoad,
        unload: BackendUnload,
        capacity: Callable[[], int | None],
        discover: BackendDiscover,
        versioned: VersionedName = default_versioned_name,
        closed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._provider = provider
        self._closed = closed
        self._versioned = versioned
        self._next_version = 2  # the number of the next replacement's backend name
        self._load = load
        self._unload = unload
        self._capacity = capacity
        self._discover = discover
        self._entries: dict[str, Entry] = {}
        self._by_backend: dict[str, Entry] = {}  # backend name -> entry, for replaced ids and draining versions
        self._replacing: dict[str, asyncio.Lock] = {}
        self._retiring: set[asyncio.Future[None]] = set()  # retirements left to run by a cancelled replace
        self._trimming: asyncio.Future[None] | None = None  # evictions back down to capacity after a burst
        self._clock = itertools.count(1)
        self._events = LifecycleEvents(provider)

    def ids(self) -> list[str]:
        """Ids the user loaded (resident or evicted), not those being unloaded."""
        return list(self._listed())

    def path_of(self, name: str) -> str | None:
        """The path an adapter id, or a backend name in use now (a replaced id's, or one still draining), was
        loaded from; ``None`` when neither is known."""
        entry = self._find(name)
        return entry.path if entry is not None else None

    def source_of(self, name: str) -> AdapterSource | None:
        """The source an adapter id, or a backend name in use now, was loaded from; ``None`` when neither is known."""
        entry = self._find(name)
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
        return {adapter_id: entry.backend for adapter_id, entry in self._listed().items()}

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
        adapters = [
            AdapterStats(
                adapter_id=adapter_id,
                backend_name=entry.backend,
                state=entry.state.value,
                resident=entry.resident,
                pinned=entry.pinned,
                in_flight=entry.in_flight,
                **self._events.adapter_counts(adapter_id),
            )
            for adapter_id, entry in sorted(self._listed().items())
        ]
        live = [*self._entries.values(), *self._by_backend.values()]  # replaced weights still draining count too
        return ProviderAdapterStats(
            provider=self._provider,
            adapters=tuple(adapters),
            resident=sum(stats.resident for stats in adapters),
            evicted=sum(stats.state == AdapterState.EVICTED.value for stats in adapters),
            in_flight=sum(entry.in_flight for entry in {id(e): e for e in live}.values()),
            **self._events.provider_counts(),
        )

    def note(self, event: str, name: str, duration_ms: float, *, ok: bool = True, **detail: object) -> None:
        """Count, log and trace a backend ``event`` (``load``, ``reload``, ``evict``) the provider ran outside the
        registry: a server that lost an adapter, healed during a request (``reload``, ``healed=True``); a replica an
        adapter was placed on, or evicted from to make room (on-demand placement, ``replica=URL``). ``name`` is the
        id or the backend name it was loaded under; ``detail`` adds to the record."""
        entry = self._find(name)
        if entry is not None:
            self._events.note(
                event, self._id_of(name, entry), entry.backend, entry.path, duration_ms, ok=ok, detail=detail
            )

    def refuse_changed(self, name: str) -> None:
        """Raise when the files an adapter (an id, or a backend name in use now) was loaded from changed since:
        for a backend that loads it again by itself (a server that lost it, another replica).

        Raises:
            InvalidAdapterError: The files changed in place since the load.
        """
        entry = self._find(name)
        if entry is not None:
            self._refuse_changed(self._id_of(name, entry), entry)

    def _refuse_changed(self, adapter_id: str, entry: Entry) -> None:
        if files_changed(entry.path, entry.files):
            raise files_changed_error(self._provider, adapter_id, entry.path)

    def adopt(self, adapter_id: str, found: Discovered) -> bool:
        """Record ``found``, the weights a backend holds for ``adapter_id`` under a versioned name (another process
        replaced the id), before a first load of the id: the load is then one of a loaded id (the same path adopts
        them; another is refused, or replaces them with ``replace=True``, numbered after them, unloading them).
        Nothing is recorded where the registry knows the id, or the name is of weights it loaded (still draining).

        Returns:
            Whether ``found`` was recorded.
        """
        if adapter_id in self._entries or found.backend in self._by_backend or found.backend == adapter_id:
            return False
        self._record_found(adapter_id, found)
        return True

    def forget(self, adapter_id: str) -> None:
        """Drop the record without touching the backend (the backend lost the adapter itself)."""
        self._entries.pop(adapter_id, None)

    async def load(
        self,
        adapter_id: str,
        source: AdapterSource,
        *,
        replace: bool = False,
        pin: bool = False,
        holder: object | None = None,
    ) -> None:
        """Load ``adapter_id`` from ``source`` (see the module docstring for the rules), for the user, or for
        ``holder``, which then holds it (also when cancelled once the backend has it: its clean-up gives it back)."""
        try:
            await self._load_entry(adapter_id, source, replace=replace, pin=pin, called=next(self._clock))
        except asyncio.CancelledError:
            entry = self._entries.get(adapter_id)
            if entry is not None and entry.transition is None:  # a load still running is another caller's
                self._claim(adapter_id, source, holder)
            raise
        self._claim(adapter_id, source, holder)

    def _claim(self, adapter_id: str, source: AdapterSource, holder: object | None) -> None:
        """Record who loaded ``adapter_id`` from ``source``, if the id holds it now: ``holder``, or the user."""
        entry = self._entries.get(adapter_id)
        if entry is None or entry.unloading or entry.identity != source.identity:
            return
        if holder is None:
            entry.user = True
        else:
            entry.holders.add(holder)

    async def _load_entry(
        self, adapter_id: str, source: AdapterSource, *, replace: bool, pin: bool, called: int
    ) -> None:
        """Load for a ``load_adapter`` call made at ``called`` (the registry's clock): an unload called after it
        wins (see :meth:`_superseded`)."""
        identity, path = source.identity, source.path
        while True:
            entry = self._entries.get(adapter_id)
            if entry is None:
                # replaced weights of an earlier load may still drain under the id itself: never load over them
                backend = self._new_version(adapter_id) if adapter_id in self._by_backend else adapter_id
                entry = Entry(
                    source=source, backend=backend, identity=identity, pinned=pin, files=source_files_state(source)
                )
                self._entries[adapter_id] = entry
                if backend != adapter_id:
                    self._by_backend[backend] = entry
                try:
                    await self._make_resident(adapter_id, entry)
                except BaseException:
                    # A cancelled caller may leave the backend holding the adapter: keep the record then.
                    if not entry.resident and self._entries.get(adapter_id) is entry:
                        del self._entries[adapter_id]
                        if backend != adapter_id:
                            del self._by_backend[backend]
                        self._events.forget_unloaded(adapter_id)
                    raise
                if entry.unload_called:
                    raise self._superseded(adapter_id, path)
                return
            if entry.transition is not None:
                await asyncio.shield(entry.transition)
                if entry.unload_called > called:
                    raise self._superseded(adapter_id, path)
                continue
            if entry.unloading:
                if entry.unload_called > called:
                    raise self._superseded(adapter_id, path)
                await self._wait_unloaded(adapter_id, entry)
                continue
            if entry.identity == identity:
                if files_changed(entry.path, entry.files):
                    if not replace:
                        raise already_loaded(self._provider, adapter_id, entry.path, path, files_changed=True)
                    await self._replace(adapter_id, entry, source, identity, pin=pin, called=called)
                    return
                entry.pinned = entry.pinned or pin
                if not entry.resident:
                    await self._make_resident(adapter_id, entry)
                    if entry.unload_called > called:
                        raise self._superseded(adapter_id, path)
                    if entry.unloading or self._entries.get(adapter_id) is not entry:
                        continue  # a hold given back (not the user) unloads it: once it has, load it again
                return
            if not replace:
                raise already_loaded(self._provider, adapter_id, entry.path, path)
            await self._replace(adapter_id, entry, source, identity, pin=pin, called=called)
            return

    async def unload(self, adapter_id: str, *, holder: object | None = None) -> None:
        """Unload ``adapter_id`` once its requests in flight have finished; for ``holder``, give its hold back
        instead, unloading only what nobody else holds and the user never loaded (a hold not taken: nothing)."""
        if holder is not None:
            held = self._entries.get(adapter_id)
            if held is None or holder not in held.holders:
                return
            held.holders.discard(holder)
            if held.holders or held.user or held.unloading:
                return
        entry = self._entries.get(adapter_id) or await self._discovered(adapter_id)
        if entry is None or entry.unloading:
            raise self._not_found(adapter_id)
        entry.unloading = True
        if holder is None:  # only the user's unload wins over their loads running (a hold given back never does)
            entry.unload_called = next(self._clock)
        entry.unloaded = asyncio.get_running_loop().create_future()
        try:
            await self._drain_and_unload(adapter_id, entry)
            if entry.replacement is not None:  # it will not switch to its weights: they go before this returns
                await asyncio.shield(entry.replacement)
        except BaseException:
            entry.unloading = False
            if not entry.resident and self._entries.get(adapter_id) is entry:
                del self._entries[adapter_id]  # the backend did unload it before a cancellation
            else:
                entry.unload_called = 0  # cancelled before it unloaded anything: loads running go on as asked
            raise
        else:
            if self._entries.get(adapter_id) is entry:
                del self._entries[adapter_id]
            self._by_backend.pop(entry.backend, None)
            self._events.unloaded(adapter_id)
        finally:
            entry.unloaded.set_result(None)  # a load of the same id waiting for this unload goes on

    @asynccontextmanager
    async def use(self, adapter_id: str) -> AsyncIterator[str]:
        """Hold ``adapter_id`` resident for one request; it cannot be unloaded or evicted meanwhile.

        Yields the backend name to send the request under: the weights current when the request starts, kept
        until it ends even if the id is replaced meanwhile. A request made for a holder (inside
        :func:`~inference._core.adapter_holds.holding`) must find the weights that holder holds.
        """
        holder = current_holder()
        while True:
            entry = self._entries.get(adapter_id) or await self._discovered(adapter_id)
            if entry is None or entry.unloading:
                raise self._not_found(adapter_id)
            if holder is not None and holder not in entry.holders:
                raise AdapterNotFoundError(
                    f"adapter {adapter_id!r} no longer serves the weights this evaluation run loaded under it (the "
                    "provider's user replaced them, or unloaded and loaded the id again): its rows from here are "
                    "not evaluated, since they would answer with other weights than the ones the run hashed; run "
                    "again once the id is free to evaluate them",
                    provider=self._provider,
                )
            if entry.transition is not None:
                await asyncio.shield(entry.transition)
                continue
            if not entry.resident:
                await self._make_resident(adapter_id, entry)
                continue
            break
        entry.in_flight += 1
        entry.last_used = next(self._clock)
        self._events.used(adapter_id)
        try:
            yield entry.backend
        finally:
            entry.in_flight -= 1
            if entry.in_flight == 0 and entry.drained is not None:
                entry.drained.set()  # wakes every drainer (an unload_adapter and a replacement's retirement)
                entry.drained = None
            if (
                entry.in_flight == 0
                and not self._closed()
                and self._over_capacity()
                and (self._trimming is None or self._trimming.done())
            ):
                self._trimming = asyncio.ensure_future(self._trim())

    async def finish_evicting(self) -> None:
        """Wait for the eviction back down to ``max_adapters`` that may still be running after a burst (the provider
        is closing: none starts any more, and the one running ends after its current adapter); never raises."""
        trimming = self._trimming
        if trimming is not None and not trimming.done():
            await asyncio.wait([trimming])

    def clear(self) -> None:
        """Forget every record (the provider is closing and frees its backend itself), and stop evicting."""
        if self._trimming is not None:
            self._trimming.cancel()
        self._entries.clear()
        self._by_backend.clear()

    # Internals ------------------------------------------------------------------------------------------

    async def _replace(
        self, adapter_id: str, old: Entry, source: AdapterSource, identity: str, *, pin: bool, called: int
    ) -> None:
        """Load ``source`` under a new backend name beside the old weights, switch the id to it, then unload the
        old weights once the requests that use them have finished.

        The old entry stays the id's record (serving, listed) until the new weights are loaded; a failed load
        raises and changes nothing. Concurrent replacements of one id take turns. The id stays pinned if it was,
        and ``pin`` pins it.
        """
        lock = self._replacing.setdefault(adapter_id, asyncio.Lock())
        async with lock:
            if old.unload_called > called:  # unloaded while this one waited for another replacement
                raise self._superseded(adapter_id, source.path)
            restart = self._entries.get(adapter_id) is not old or old.transition is not None or old.unloading
            # (another replacement, an eviction or an unload ran meanwhile: start over with what the id is now)
            interrupted = None if restart else await self._load_beside(adapter_id, old, source, identity, pin=pin)
        if restart:
            await self._load_entry(adapter_id, source, replace=True, pin=pin, called=called)
            return
        if interrupted is not None:
            # the caller is gone; finish without it
            self._retiring.add(asyncio.ensure_future(self._retire(adapter_id, old)))
            raise interrupted
        await self._retire(adapter_id, old)

    async def _load_beside(
        self, adapter_id: str, old: Entry, source: AdapterSource, identity: str, *, pin: bool
    ) -> BaseException | None:
        """Load ``source`` under a new backend name while ``old`` serves, then switch the id to it.

        The capacity rule applies as to any load: the new weights take the id's place, so other adapters are
        evicted until they leave room for one (the old weights, while they drain, are not counted).

        Returns the cancellation that arrived after the backend had loaded the new weights (the switch is made
        anyway: the backend holds them), else ``None``. A failed load raises with ``old`` untouched.
        """
        new = Entry(
            source=source,
            backend=self._new_version(adapter_id),
            identity=identity,
            pinned=old.pinned or pin,
            files=source_files_state(source),
        )
        self._by_backend[new.backend] = new
        interrupted: BaseException | None = None
        old.replacement = asyncio.get_running_loop().create_future()
        try:
            try:
                async with transition(new):
                    await self._evict_for_one_more(exclude=adapter_id)
                    await self._backend("load", adapter_id, new, replaces=old.backend)
            except BaseException as error:
                if not new.resident:
                    self._by_backend.pop(new.backend, None)
                    raise
                interrupted = error
            if old.unload_called:  # unload_adapter was called meanwhile: it wins, and these weights go
                await self._unload_superseded(adapter_id, new)
                raise interrupted or self._superseded(adapter_id, source.path)
        finally:
            old.replacement.set_result(None)
            old.replacement = None
        new.last_used = next(self._clock)
        self._entries[adapter_id] = new  # the switch: from here on use() hands out the new backend name
        self._by_backend.setdefault(old.backend, old)
        self._events.replaced(adapter_id)
        logger.info("%s: adapter %r now serves %s (was %s)", self._provider, adapter_id, source.path, old.path)
        return interrupted

    async def _unload_superseded(self, adapter_id: str, new: Entry) -> None:
        """Unload the new weights of a replacement that an unload of the id superseded (never switched to)."""
        try:
            async with transition(new):
                await self._backend("unload", adapter_id, new, superseded=True)
        except Exception:
            logger.warning(
                "%s: unloading the weights %r of a replacement superseded by an unload failed; they stay in the "
                "backend", self._provider, new.backend, exc_info=True,
            )
        finally:
            if not new.resident:
                self._by_backend.pop(new.backend, None)

    def _superseded(self, adapter_id: str, path: str) -> AdapterNotFoundError:
        return superseded(self._provider, adapter_id, path)

    def _new_version(self, adapter_id: str) -> str:
        """A backend name for new weights of ``adapter_id`` that no weights in the backend have."""
        version, self._next_version = self._next_version, self._next_version + 1
        return self._versioned(adapter_id, version)

    async def _retire(self, adapter_id: str, old: Entry) -> None:
        """Unload replaced weights after the requests still using them."""
        old.unloading = True
        try:
            await self._drain_and_unload(adapter_id, old, replaced=True)
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

    async def _make_resident(self, adapter_id: str, entry: Entry) -> None:
        self._refuse_changed(adapter_id, entry)
        async with transition(entry):
            await self._evict_for_one_more(exclude=adapter_id)
            await self._backend("reload" if self._events.loaded_before(adapter_id) else "load", adapter_id, entry)
        entry.last_used = next(self._clock)

    def _holding(self, exclude: str | None = None) -> list[tuple[int, str]]:
        """``(last used, id)`` of the adapters that hold a place in the backend or are loading into one (not those
        being evicted: their place is being freed)."""
        return [
            (entry.last_used, adapter_id)
            for adapter_id, entry in self._entries.items()
            if adapter_id != exclude and (entry.state is AdapterState.RESIDENT or entry.state is AdapterState.LOADING)
        ]

    def _over_capacity(self) -> bool:
        capacity = self._capacity()
        return capacity is not None and len(self._holding()) > capacity

    async def _evict_for_one_more(self, *, exclude: str) -> None:
        """Leave room for ``exclude`` to load: evict the least recently used idle adapters while the others that
        hold a place (loads in progress count) fill ``max_adapters``. When every one is pinned, in use or loading,
        it loads over the limit with a warning; the extra ones are evicted once their requests end (:meth:`_trim`)."""
        await self._evict_while(exclude=exclude, room=1)

    async def _trim(self) -> None:
        """Evict idle adapters while more than ``max_adapters`` hold a place (a burst of requests for adapters not
        resident went over it); never raises (it runs on its own, after a request)."""
        try:
            await self._evict_while(exclude=None, room=0)
        except Exception:
            closing = self._closed()  # closing frees every adapter: nothing was left undone
            logger.log(
                logging.DEBUG if closing else logging.WARNING,
                "%s: evicting adapters back down to max_adapters failed%s",
                self._provider,
                " as the provider closed" if closing else "",
                exc_info=True,
            )

    async def _evict_while(self, *, exclude: str | None, room: int) -> None:
        """Evict least recently used idle adapters until the others holding a place leave ``room`` under
        ``max_adapters``."""
        capacity = self._capacity()
        if capacity is None:
            return
        while not self._closed():  # a closed provider frees every adapter itself
            holding = self._holding(exclude)
            if len(holding) <= capacity - room:
                return
            candidates = [
                (last_used, adapter_id)
                for last_used, adapter_id in holding
                if self._entries[adapter_id].resident
                and not self._entries[adapter_id].pinned
                and self._entries[adapter_id].in_flight == 0
                and self._entries[adapter_id].transition is None
            ]
            if not candidates:
                if exclude is not None:
                    logger.warning(
                        "%s: %d adapters are resident or loading, pinned or in use; loading one more than "
                        "max_adapters=%d (evicted again when their requests end)",
                        self._provider,
                        len(holding),
                        capacity,
                    )
                return
            _, victim = min(candidates)
            entry = self._entries[victim]
            entry.evicting = True
            try:
                async with transition(entry):
                    await self._backend("evict", victim, entry)
            finally:
                entry.evicting = False

    async def _backend(self, event: str, adapter_id: str, entry: Entry, **detail: object) -> None:
        """Run the backend's load (``load``, ``reload``) or unload (``unload``, ``evict``) of ``entry`` to its end,
        counted, logged and traced (``detail`` adds to the record)."""
        cancelled: list[asyncio.CancelledError] = []
        try:
            with self._events.observed(event, adapter_id, entry.backend, entry.path, **detail):
                loading = event in ("load", "reload")
                if loading:
                    work = self._load(entry.backend, entry.source)
                else:
                    work = self._evict_unless_closed(entry.backend) if event == "evict" else self._unload(entry.backend)
                await finish(entry, work, resident_after=loading, cancelled=cancelled)
        finally:
            if cancelled:  # the caller's, once the event is recorded as what the backend did
                raise cancelled[0]

    async def _evict_unless_closed(self, name: str) -> None:
        """The backend unload of an eviction, unless the provider closed since the eviction was decided (it frees
        every adapter itself, and its backend refuses calls). Checked in the same step as the backend's own check,
        so a provider that closes meanwhile is never asked."""
        if not self._closed():
            await self._unload(name)

    async def _drain_and_unload(self, adapter_id: str, entry: Entry, **detail: object) -> None:
        """Wait for the requests using ``entry`` and for a transition in progress, then unload its weights from the
        backend where they are. Several may drain one entry at once (an unload of an id whose replacement retires
        the same weights): they share its ``drained`` event, and the first to wake unloads."""
        while entry.in_flight:
            if entry.drained is None:
                entry.drained = asyncio.Event()
            await entry.drained.wait()
        while entry.transition is not None:
            await asyncio.shield(entry.transition)
        if entry.resident:
            async with transition(entry):
                await self._backend("unload", adapter_id, entry, **detail)

    async def _wait_unloaded(self, adapter_id: str, entry: Entry) -> None:
        if entry.unloaded is not None:
            await asyncio.shield(entry.unloaded)

    async def _discovered(self, adapter_id: str) -> Entry | None:
        found = await self._discover(adapter_id)
        if found is None:
            return None
        if isinstance(found, str):
            found = Discovered(path=found, backend=adapter_id, version=1)
        entry = self._entries.get(adapter_id) or self._record_found(adapter_id, found)
        entry.last_used = next(self._clock)
        return entry

    def _record_found(self, adapter_id: str, found: Discovered) -> Entry:
        """Record what the backend was found holding for ``adapter_id``: resident, loaded by the user (elsewhere);
        this registry's replacements are numbered after its version."""
        source = AdapterSource(found.path)
        entry = Entry(source=source, backend=found.backend, identity=source.identity, resident=True, user=True)
        self._entries[adapter_id] = entry
        if found.backend != adapter_id:
            self._by_backend[found.backend] = entry
            self._next_version = max(self._next_version, found.version + 1)
        entry.last_used = next(self._clock)
        return entry

    def _listed(self) -> dict[str, Entry]:
        """The entries of the ids the user loaded, not those being unloaded."""
        return {adapter_id: entry for adapter_id, entry in self._entries.items() if not entry.unloading}

    def _find(self, name: str) -> Entry | None:
        """The entry of an adapter id, or of a backend name in use now (a replaced id's, or one still draining)."""
        return self._entries.get(name) or self._by_backend.get(name)

    def _id_of(self, name: str, entry: Entry) -> str:
        """The id ``entry`` is listed under; ``name`` for weights no longer listed (replaced, still draining)."""
        return next((key for key, value in self._entries.items() if value is entry), name)

    def _not_found(self, adapter_id: str) -> AdapterNotFoundError:
        entry = self._entries.get(adapter_id)
        unloading = entry is not None and entry.unloading
        return not_loaded(self._provider, adapter_id, unloading=unloading, loaded=self.ids())
