"""The record :class:`~inference._core.lifecycle.AdapterRegistry` keeps of one adapter id, and the states it goes
through (``docs/architecture.md`` draws them)."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from inference._core.adapter_files import FilesState
from inference.adapters.source import AdapterSource

__all__ = ["AdapterState", "Entry"]


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
