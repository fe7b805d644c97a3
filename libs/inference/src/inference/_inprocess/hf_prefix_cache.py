"""A prefix KV cache for next-token distributions on a Transformers model: a sequence that extends one computed
before (for the same adapter weights) costs only its new tokens.

Each entry is one computed sequence under one adapter choice: its keys and values (a ``DynamicCache``) and the
log-softmax row after it. A request looks for the longest cached prefix of its ids among the last
:data:`LOOKBACK` lengths (an SMC particle extends its prefix by one token; a resampled one takes another's), copies
that entry's cache and runs only the rest. Entries are keyed by the adapters' backend names and scales, so the
new weights of a replaced adapter (a new backend name) never meet the old ones' entries; unloading an adapter drops
its entries. The cache holds at most ``capacity`` tokens (the sum of its entries' lengths), least recently used
out. Used on the provider's worker thread only; :meth:`clear` may come from another thread (a lock guards it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from inference._core.validation import AdapterScales
from inference.tokens import TokenCacheStats

__all__ = ["LOOKBACK", "PrefixCache"]

LOOKBACK = 16
"""How many shorter lengths a request's ids are looked up at, after its whole length."""

Key = tuple[AdapterScales, tuple[int, ...]]


class PrefixCache:
    """Computed sequences' keys, values and next-token rows, by adapter choice and token ids (see the module).

    Args:
        capacity: The most tokens held (``0``: the cache is off).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Key, tuple[Any, Any]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "reused": 0, "computed": 0, "evictions": 0}

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def longest(self, adapters: AdapterScales, ids: tuple[int, ...]) -> tuple[int, Any, Any] | None:
        """``(length, cache, row)`` of the longest cached prefix of ``ids`` (``ids`` itself included), or ``None``."""
        with self._lock:
            for length in range(len(ids), max(len(ids) - LOOKBACK, 0), -1):
                entry = self._entries.get((adapters, ids[:length]))
                if entry is not None:
                    self._entries.move_to_end((adapters, ids[:length]))
                    return length, entry[0], entry[1]
        return None

    def counted(self, reused: int, computed: int) -> None:
        """Count one sequence: ``reused`` tokens taken from the cache, ``computed`` ones run."""
        with self._lock:
            self._counts["hits" if reused else "misses"] += 1
            self._counts["reused"] += reused
            self._counts["computed"] += computed

    def put(self, adapters: AdapterScales, ids: tuple[int, ...], cache: Any, row: Any) -> None:
        """Keep a computed sequence (then evict the least recently used entries beyond the capacity)."""
        if not self.enabled or len(ids) > self.capacity:
            return
        with self._lock:
            key = (adapters, ids)
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            self._entries[key] = (cache, row)
            self._tokens += len(ids)
            while self._tokens > self.capacity:
                (_, old), _ = self._entries.popitem(last=False)
                self._tokens -= len(old)
                self._counts["evictions"] += len(old)

    def drop_adapter(self, name: str) -> None:
        """Forget every entry computed with the adapter of backend name ``name`` (it was unloaded)."""
        with self._lock:
            for key in [key for key in self._entries if any(part == name for part, _ in key[0])]:
                del self._entries[key]
                self._tokens -= len(key[1])

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
            self._tokens = 0

    def stats(self) -> TokenCacheStats:
        counts = self._counts
        return TokenCacheStats(
            enabled=self.enabled, hits=counts["hits"], misses=counts["misses"], reused_tokens=counts["reused"],
            computed_tokens=counts["computed"], cached_tokens=self._tokens,
            capacity_tokens=self.capacity if self.enabled else None, evictions=counts["evictions"],
        )
