"""A prefix KV cache for next-token distributions on a Transformers model: a sequence that extends one computed
before (for the same adapter weights) costs only its new tokens, and the sequences of one call that extend cached
ones run together, in one forward pass over their new tokens only.

**Entries.** Each entry is one computed sequence under one adapter choice: its keys and values as one tensor
``[2 * layers, kv_heads, length, head_dim]`` (each layer's keys, then its values; on the model's device, in its
dtype) and the log-softmax row after it (float32, a copy of its own). An entry holds its whole sequence: entries
share no memory. The cache's memory stays within its token budget times the keys and values of one token
(``2 * layers * kv_heads * head_dim`` numbers: 12 KiB for Qwen2-0.5B in bfloat16, with its 24 layers of 2 heads of
64; 512 bytes on the tiny float32 test models), the rows included (:class:`PrefixCache`).

**Lookup.** A request looks for the longest cached prefix of its ids among the last :data:`LOOKBACK` lengths (an
SMC particle extends its prefix by one token; a resampled one takes another's). Entries are keyed by the adapters'
backend names and scales, so the new weights of a replaced adapter (a new backend name) never meet the old ones'
entries; unloading an adapter drops its entries. The cache holds at most ``capacity`` tokens (the sum of its
entries' lengths), least recently used out.

**The batched pass** (:func:`padded_past`, :func:`kept_states`): the rows of one pass have cached prefixes of
different lengths. Their keys and values are copied into one past, *left*-padded to the longest prefix, so that every
row's new tokens start at the same cache column; the new tokens are right-padded after them. The attention mask hides
the left padding (and is left out when no row has any: a causal model never looks at the right padding), and each
row's position ids continue after its own prefix. Afterwards each row's whole sequence is one contiguous slice of
the pass's keys and values (its prefix, then its new tokens), copied out as the row's new entry. The past is a
``transformers.DynamicCache`` of plain full-attention layers: a sliding-window layer then sees every past token
and its mask keeps the window (the cache holds whole sequences). A model whose cache is something else (linear
attention, layers sharing keys and values) gets its rows computed, but nothing kept (logged once).

Used on the provider's worker thread only; :meth:`PrefixCache.clear` may come from another thread (a lock guards
the entries). Stored tensors are never written to, so a lookup may hand them out while another thread clears.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from inference._core.validation import AdapterScales
from inference.tokens import TokenCacheStats

__all__ = ["LOOKBACK", "PrefixCache", "kept_states", "padded_past"]

logger = logging.getLogger("inference.transformers")

LOOKBACK = 16
"""How many shorter lengths a request's ids are looked up at, after its whole length."""

Key = tuple[AdapterScales, tuple[int, ...]]


class PrefixCache:
    """Computed sequences' keys, values and next-token rows, by adapter choice and token ids (see the module).

    With ``bound_memory`` the capacity bounds the memory too: the entries' keys, values and rows (objects with an
    ``nbytes``) together take at most what ``capacity`` tokens' keys and values take (known from the first entry),
    so where a row is large (a vocabulary of 150k ids is 600 KB a row, as much as 50 tokens' keys and values of
    Qwen2-0.5B) fewer tokens are held. llama.cpp's provider keeps its saved states here without it.

    Args:
        capacity: The most tokens held (``0``: the cache is off).
        bound_memory: Whether the rows count against the capacity too (see above).
    """

    def __init__(self, capacity: int, *, bound_memory: bool = False) -> None:
        self.capacity = capacity
        self.bound_memory = bound_memory
        self._entries: OrderedDict[Key, tuple[Any, Any, int]] = OrderedDict()  # states, row, bytes
        self._tokens = 0
        self._bytes = 0
        self._memory_limit: int | None = None  # bytes: capacity x one token's keys and values
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "reused": 0, "computed": 0, "evictions": 0}
        self._refused = False

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def longest(self, adapters: AdapterScales, ids: tuple[int, ...]) -> tuple[int, Any, Any] | None:
        """``(length, states, row)`` of the longest cached prefix of ``ids`` (``ids`` itself included), or ``None``."""
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

    def put(self, adapters: AdapterScales, ids: tuple[int, ...], states: Any, row: Any) -> None:
        """Keep a computed sequence (``states``: what resumes it; ``row``: its row); then evict the least recently
        used entries beyond the capacity (and beyond the memory bound: see the class)."""
        if not self.enabled or len(ids) > self.capacity:
            return
        size = int(states.nbytes) + int(row.nbytes) if self.bound_memory else 0
        with self._lock:
            if self.bound_memory and self._memory_limit is None:  # the first entry tells one token's bytes
                self._memory_limit = self.capacity * int(states.nbytes) // len(ids)
            key = (adapters, ids)
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            if self._memory_limit is not None and size > self._memory_limit:
                return
            self._entries[key] = (states, row, size)
            self._tokens += len(ids)
            self._bytes += size
            while self._tokens > self.capacity or (self._memory_limit is not None and self._bytes > self._memory_limit):
                (_, old), (_, _, old_size) = self._entries.popitem(last=False)
                self._tokens -= len(old)
                self._bytes -= old_size
                self._counts["evictions"] += len(old)

    def refuse_states(self, reason: str) -> None:
        """Say once that this model's keys and values cannot be kept (``reason``): rows are then computed whole."""
        if not self._refused:
            self._refused = True
            logger.warning("the Transformers prefix cache keeps nothing for this model: %s", reason)

    def drop_adapter(self, name: str) -> None:
        """Forget every entry computed with the adapter of backend name ``name`` (it was unloaded)."""
        with self._lock:
            for key in [key for key in self._entries if any(part == name for part, _ in key[0])]:
                self._bytes -= self._entries.pop(key)[2]
                self._tokens -= len(key[1])

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
            self._tokens = self._bytes = 0

    def stats(self) -> TokenCacheStats:
        counts = self._counts
        return TokenCacheStats(
            enabled=self.enabled, hits=counts["hits"], misses=counts["misses"], reused_tokens=counts["reused"],
            computed_tokens=counts["computed"], cached_tokens=self._tokens,
            capacity_tokens=self.capacity if self.enabled else None, evictions=counts["evictions"],
        )


def padded_past(torch: Any, transformers: Any, states: Sequence[Any], starts: Sequence[int]) -> Any:
    """A ``DynamicCache`` holding each row's cached prefix, left-padded to the longest (an empty one when no row
    has a prefix); ``states[row]`` is the row's entry tensor (``None`` where ``starts[row]`` is 0)."""
    width = max(starts)
    if width == 0:
        return transformers.DynamicCache()
    if all(start == width for start in starts):  # prefixes of one length (SMC particles in step): no padding
        past = torch.stack(list(states), dim=1)
    else:
        first = next(state for state in states if state is not None)
        planes, heads, _, dim = first.shape
        past = torch.zeros((planes, len(starts), heads, width, dim), dtype=first.dtype, device=first.device)
        for row, (state, start) in enumerate(zip(states, starts, strict=True)):
            if start:
                past[:, row, :, width - start :] = state
    planes = past.shape[0]
    return transformers.DynamicCache(ddp_cache_data=[(past[plane], past[plane + 1]) for plane in range(0, planes, 2)])


def kept_states(
    torch: Any, cache: Any, starts: Sequence[int], lengths: Sequence[int], width: int
) -> list[Any] | str:
    """Each row's whole sequence out of a pass's cache (its ``starts[row]`` cached tokens left-padded to ``width``,
    then its ``lengths[row]`` new ones), as entry tensors; or why they cannot be, where the cache is not plain
    full-attention layers of that layout."""
    layers = list(getattr(cache, "layers", ()))
    total = width + max(lengths)
    plain = bool(layers) and all(
        not getattr(layer, "is_sliding", False)
        and getattr(layer, "keys", None) is not None
        and tuple(layer.keys.shape[:1]) + tuple(layer.keys.shape[2:3]) == (len(starts), total)
        and layer.keys.shape == layers[0].keys.shape
        and layer.values.shape == layers[0].values.shape
        for layer in layers
    )
    if not plain:
        return f"its cache has {type(layers[0]).__name__ if layers else 'no'} layers, not plain full-attention ones"
    stacked = torch.stack([tensor for layer in layers for tensor in (layer.keys, layer.values)])
    return [
        stacked[:, row, :, width - start : width + length].clone()
        for row, (start, length) in enumerate(zip(starts, lengths, strict=True))
    ]
