"""The record :class:`~inference._core.lifecycle.AdapterRegistry` keeps of one adapter id, the states it goes
through (``docs/architecture.md`` draws them), and the two steps every backend load or unload of it takes: marked
busy meanwhile (:func:`transition`), and run to its end whatever the caller does (:func:`finish`)."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from inference._core.adapter_files import FilesState
from inference.adapters.source import AdapterSource

__all__ = ["AdapterState", "Entry", "finish", "transition"]


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
class Entry:
    """The record of one adapter id.

    The state is derived from three flags and the transition in progress (see :attr:`state`); the three
    waitables let callers wait for a transition (``transition``), for requests in flight to finish
    (``drained``) and for an unload to complete (``unloaded``). ``holders`` and ``user`` say who keeps it loaded
    (:mod:`inference._core.adapter_holds`).
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
    files: FilesState = None
    unload_called: int = 0  # when (the registry's clock) unload_adapter was called on it; 0: never
    replacement: asyncio.Future[None] | None = None  # done when the replacement loading beside it has ended
    holders: set[object] = field(default_factory=set)  # the evaluation turns holding it (adapter_holds)
    user: bool = False  # a load_adapter of the user's loaded it, found it loaded or pinned it: holds never unload it

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


async def finish(
    entry: Entry, work: Awaitable[None], *, resident_after: bool, cancelled: list[asyncio.CancelledError]
) -> None:
    """Run a backend load or unload of ``entry`` to its end even if the caller is cancelled meanwhile (each
    cancellation goes into ``cancelled``, for the caller to raise once the event is recorded as what the backend did).

    A backend call stopped half-way would leave the backend and the record disagreeing (an adapter listed but
    gone, or a handle nobody frees). The caller's cancellation is re-raised once the backend is done, with the
    record matching what the backend did, however many times it is cancelled meanwhile (an evaluation cancels its
    adapters' unloads twice; so does Ctrl-C pressed twice).
    """
    task = asyncio.ensure_future(work)
    while not task.done():
        try:
            await asyncio.wait([task])  # waiting never cancels the work
        except asyncio.CancelledError as error:
            cancelled.append(error)
    if not task.cancelled() and task.exception() is None:
        entry.resident = resident_after
    task.result()  # the backend's own error, if it failed


@asynccontextmanager
async def transition(entry: Entry) -> AsyncIterator[None]:
    """Mark ``entry`` busy (synchronously, before any await) while a backend load or unload runs.

    Other callers wait on ``entry.transition`` and then look at the entry again; a failure is raised to them too,
    so every caller of a failed load sees its error.
    """
    busy: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    entry.transition = busy
    try:
        yield
    except Exception as error:
        busy.set_exception(error)
        busy.exception()  # retrieved here, so an unobserved failure logs no warning
        raise
    except BaseException:
        busy.set_result(None)  # the owner was cancelled: waiters look at the entry again
        raise
    else:
        busy.set_result(None)
    finally:
        entry.transition = None
