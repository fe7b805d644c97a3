"""Which replica holds which adapter, when adapters are placed on demand (``VLLM_ADAPTER_PLACEMENT=on-demand``).

With placement ``all`` every replica holds every adapter. With ``on-demand`` an adapter is loaded on one replica,
and on more only when its traffic asks for it. :class:`AdapterPlacement` keeps the record and makes the choices;
the provider does the loading and unloading it decides on. The rules, in one place:

- **Load**: the replica that is up, has room, and holds the fewest adapters (then the least busy; then the order
  of the base URLs).
- **Generate**: the holders that are up, least busy first. When every holder is down, or has ``spread_after``
  or more requests in flight, the least busy other replica that is up goes first: the adapter is loaded there
  before the request is sent, and it becomes a holder too.
- **Room**: a replica holds at most ``capacity`` adapters (``VLLM_MAX_LORAS``, the servers' ``--max-cpu-loras``).
  Placing one more on a full replica first unloads there the adapter used least recently that has no request
  in flight on it (several, until there is room: a replica went over capacity when every adapter on it was busy);
  that adapter stays loaded for the user (its next request places it again).
- **Down**: a holder that stops answering keeps its record; the request goes elsewhere (and places the adapter
  there). A restarted server that lost its adapters is healed by the provider's usual self-healing.

Everything here runs on the event loop; nothing awaits, so each decision is atomic.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Protocol

__all__ = ["AdapterPlacement", "PlacedReplica"]


class PlacedReplica(Protocol):
    """What placement reads of a replica."""

    base_url: str
    in_flight: int
    down_until: float


class AdapterPlacement:
    """The adapters each replica holds, in least-recently-used order, and the requests on each.

    Args:
        replicas: The replicas, in the order of the base URLs.
        capacity: The most adapters one replica holds (``None``: no limit).
        spread_after: Requests in flight on every holder at which the adapter is placed on one more replica.
    """

    def __init__(self, replicas: Sequence[PlacedReplica], capacity: int | None, spread_after: int) -> None:
        self.replicas = list(replicas)
        self.capacity = capacity
        self.spread_after = spread_after
        self._held: dict[int, dict[str, int]] = {index: {} for index in range(len(self.replicas))}  # id -> last use
        self._busy: dict[tuple[int, str], int] = {}  # (replica, adapter) -> requests in flight there
        self._clock = itertools.count()

    # Reading ----------------------------------------------------------------------------------------------

    def holders(self, adapter_id: str) -> list[PlacedReplica]:
        """The replicas that hold ``adapter_id``, in base-URL order."""
        return [self.replicas[index] for index, held in self._held.items() if adapter_id in held]

    def held_by(self, replica: PlacedReplica) -> list[str]:
        """The adapters ``replica`` holds, least recently used first."""
        held = self._held[self._index(replica)]
        return sorted(held, key=held.__getitem__)

    def holds(self, replica: PlacedReplica, adapter_id: str) -> bool:
        return adapter_id in self._held[self._index(replica)]

    # Choosing ---------------------------------------------------------------------------------------------

    def ranked_for_load(self) -> list[PlacedReplica]:
        """Where a new adapter goes, best first: up, with room, fewest adapters, least busy, base-URL order."""
        now = time.monotonic()
        ranked = sorted(
            range(len(self.replicas)),
            key=lambda index: (
                self.replicas[index].down_until > now,
                self._full(index),
                len(self._held[index]),
                self.replicas[index].in_flight,
                index,
            ),
        )
        return [self.replicas[index] for index in ranked]

    def order_for(self, adapter_id: str, ordered: Sequence[PlacedReplica]) -> list[PlacedReplica]:
        """The replicas to try for a request with ``adapter_id``, given the usual least-busy-first ``ordered``."""
        now = time.monotonic()
        up = [replica for replica in ordered if replica.down_until <= now]
        down = [replica for replica in ordered if replica.down_until > now]
        holders = [replica for replica in up if self.holds(replica, adapter_id)]
        others = [replica for replica in up if not self.holds(replica, adapter_id)]
        calm = [replica for replica in holders if replica.in_flight < self.spread_after]
        if calm or not others:
            return [*holders, *others, *down]
        return [*others[:1], *holders, *others[1:], *down]  # every holder is busy or down: one more replica

    def to_evict(self, replica: PlacedReplica) -> str | None:
        """The adapter to unload from ``replica`` before one more goes there; ``None`` when it has room.

        Raises:
            LookupError: The replica is full and every adapter on it has a request in flight there.
        """
        index = self._index(replica)
        if not self._full(index):
            return None
        for adapter_id in self.held_by(replica):
            if not self._busy.get((index, adapter_id)):
                return adapter_id
        raise LookupError(replica.base_url)

    # Recording --------------------------------------------------------------------------------------------

    def placed(self, replica: PlacedReplica, adapter_id: str) -> None:
        self._held[self._index(replica)][adapter_id] = next(self._clock)

    def removed(self, adapter_id: str, replica: PlacedReplica | None = None) -> None:
        """``adapter_id`` left ``replica`` (every replica when ``None``)."""
        indexes = range(len(self.replicas)) if replica is None else [self._index(replica)]
        for index in indexes:
            self._held[index].pop(adapter_id, None)

    def started(self, replica: PlacedReplica, adapter_id: str) -> None:
        """A request for ``adapter_id`` runs on ``replica`` (it is used now, and not to be evicted there)."""
        index = self._index(replica)
        if adapter_id in self._held[index]:
            self._held[index][adapter_id] = next(self._clock)
        self._busy[index, adapter_id] = self._busy.get((index, adapter_id), 0) + 1

    def finished(self, replica: PlacedReplica, adapter_id: str) -> None:
        index = self._index(replica)
        remaining = self._busy.get((index, adapter_id), 0) - 1
        if remaining > 0:
            self._busy[index, adapter_id] = remaining
        else:
            self._busy.pop((index, adapter_id), None)

    def _full(self, index: int) -> bool:
        return self.capacity is not None and len(self._held[index]) >= self.capacity

    def _index(self, replica: PlacedReplica) -> int:
        return next(index for index, candidate in enumerate(self.replicas) if candidate is replica)
