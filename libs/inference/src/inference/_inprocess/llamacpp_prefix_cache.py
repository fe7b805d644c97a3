"""A prefix cache for next-token distributions on llama.cpp: a sequence that extends one computed before (for the
same adapter weights) costs only its new tokens.

The entries and their rules are the Transformers provider's (:class:`~inference._inprocess.hf_prefix_cache.PrefixCache`:
keyed by the adapters' backend names and scales, the longest cached prefix among the last lengths, LRU within a
token budget, an unloaded adapter's entries dropped). What an entry holds here is llama.cpp's own state of the
computed sequence: its KV cells as ``llama_state_seq_get_data`` writes them (both caches of a sliding-window
model), and the log-softmax row after it. A request restores its longest cached prefix into sequence 0 with
``llama_state_seq_set_data``, evaluates only the rest (logits at its last position), and keeps the state of the whole
sequence for the requests that extend it. The context's cells are left empty after each request, so generations and
scores find the whole context as before. On the provider's worker thread only.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import TYPE_CHECKING, Any

from inference._inprocess.hf_prefix_cache import PrefixCache
from inference._inprocess.llamacpp_logits import clear_memory, evaluated, finite_logits

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from inference._core.validation import TokenRequest

__all__ = ["cached_row"]


def cached_row(
    llama_cpp: Any, numpy: Any, llama: Any, request: TokenRequest, cache: PrefixCache
) -> NDArray[np.float32] | None:
    """The log-softmax after ``request.token_ids`` (``request``'s adapters active on ``llama``) through ``cache``;
    ``None`` where the logits are not finite (nothing is kept then). The KV cache is left empty."""
    ids, adapters = request.token_ids, request.adapters
    found = cache.longest(adapters, ids)
    if found is not None and found[0] == len(ids):
        cache.counted(len(ids), 0)
        kept: NDArray[np.float32] = found[2]
        return kept
    start = 0
    llama.reset()
    llama._ctx.kv_cache_seq_rm(-1, 0, -1)
    if found is not None:
        state = found[1]
        if int(llama_cpp.llama_state_seq_set_data(llama.ctx, state, len(state), 0)) == len(state):
            start = found[0]
        else:  # llama.cpp could not place it (never expected: the cells are free): compute it whole
            llama._ctx.kv_cache_seq_rm(-1, 0, -1)
    row: Any = None
    saved: Any = None
    last = len(ids) - 1
    with contextlib.closing(evaluated(numpy, llama, ids, lambda position: position == last, start=start)) as steps:
        for _, logits in steps:
            row = numpy.array(logits)
            if finite_logits(numpy, row) and cache.enabled and len(ids) <= cache.capacity:
                saved = _sequence_state(llama_cpp, llama.ctx)
    if row is None or not finite_logits(numpy, row):
        clear_memory(llama_cpp, llama)
        return None
    row = row.astype(numpy.float64)
    row -= row.max()
    row -= numpy.log(numpy.exp(row).sum())
    result: NDArray[np.float32] = row.astype(numpy.float32)
    cache.counted(start, len(ids) - start)
    if saved is not None:
        cache.put(adapters, ids, saved, result)
    return result


def _sequence_state(llama_cpp: Any, ctx: Any) -> Any:
    """Sequence 0's state (its KV cells), as bytes llama.cpp can restore."""
    size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
    buffer = (ctypes.c_uint8 * size)()
    written = int(llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0))
    return buffer if written == size else (ctypes.c_uint8 * written).from_buffer_copy(buffer, 0)
