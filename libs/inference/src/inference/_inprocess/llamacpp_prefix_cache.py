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

:func:`cached_rows` serves a call's requests together where the context has several sequences (``n_parallel > 1``):
up to ``n_parallel`` of them per ``llama_decode``, each restored into a sequence of its own, so the particles of a
search that each add a token cost one decode of a few tokens, not one decode each.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inference._inprocess.hf_prefix_cache import PrefixCache
from inference._inprocess.llamacpp_logits import clear_memory, evaluated, finite_logits

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from inference._core.validation import TokenRequest

__all__ = ["ALONE_FROM", "cached_row", "cached_rows"]

ALONE_FROM = 16
"""With the cache on, a request with at least this many tokens to compute runs alone, before the requests after it,
which then find its sequence cached (the first step of a search, whose particles all start from the prompt)."""

_Found = tuple[int, Any, Any]  # what PrefixCache.longest finds: the prefix's length, its state and its row


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
    result = _log_softmax(numpy, row)
    cache.counted(start, len(ids) - start)
    if saved is not None:
        cache.put(adapters, ids, saved, result)
    return result


def cached_rows(
    llama_cpp: Any,
    numpy: Any,
    llama: Any,
    requests: Sequence[TokenRequest],
    cache: PrefixCache,
    *,
    sequences: int,
) -> list[NDArray[np.float32] | None]:
    """:func:`cached_row` for each of ``requests`` (all with the adapters active on ``llama``), up to ``sequences``
    of them per ``llama_decode``.

    A request whose whole sequence is cached gets its row from the cache, and one repeated in the call is computed
    once. The others go in groups: each restores its longest cached prefix into a sequence of its own, and their new
    tokens are decoded together, logits at each one's last token; each computed sequence is then kept. A request
    with :data:`ALONE_FROM` or more tokens to compute (cache on), and every request when ``sequences`` is 1, runs
    alone through :func:`cached_row`. ``None`` for a request whose logits are not finite. The KV cache is left
    empty.
    """
    rows: list[NDArray[np.float32] | None] = [None] * len(requests)
    waiting: dict[tuple[int, ...], tuple[TokenRequest, _Found | None, list[int]]] = {}
    cells, room = 0, int(llama.n_ctx())

    def run_waiting() -> None:
        nonlocal cells
        group = list(waiting.values())
        for (_, _, indices), row in zip(group, _together(llama_cpp, numpy, llama, group, cache), strict=True):
            for index in indices:
                rows[index] = row
        waiting.clear()
        cells = 0

    for index, request in enumerate(requests):
        ids = request.token_ids
        if ids in waiting:
            waiting[ids][2].append(index)
            continue
        found = cache.longest(request.adapters, ids)
        if found is not None and found[0] == len(ids):
            cache.counted(len(ids), 0)
            rows[index] = found[2]
            continue
        start = found[0] if found is not None else 0
        if sequences == 1 or (cache.enabled and len(ids) - start >= ALONE_FROM):
            if waiting:
                run_waiting()
            rows[index] = cached_row(llama_cpp, numpy, llama, request, cache)
            continue
        if waiting and (len(waiting) == sequences or cells + len(ids) > room):
            run_waiting()
        waiting[ids] = (request, found, [index])
        cells += len(ids)
    if waiting:
        run_waiting()
    return rows


def _together(
    llama_cpp: Any,
    numpy: Any,
    llama: Any,
    group: Sequence[tuple[TokenRequest, _Found | None, list[int]]],
    cache: PrefixCache,
) -> list[NDArray[np.float32] | None]:
    """The rows of ``group``'s requests, each in sequence ``k`` (its position in ``group``) from its cached prefix,
    their new tokens decoded together in pieces of ``n_batch``; their sequences are then kept in ``cache``."""
    ctx, n_vocab, memory = llama.ctx, int(llama.n_vocab()), llama_cpp.llama_get_memory(llama.ctx)
    llama.reset()
    llama_cpp.llama_memory_seq_rm(memory, -1, -1, -1)
    starts = []
    for seq, (_, found, _) in enumerate(group):
        start = 0
        if found is not None:
            state = found[1]
            if int(llama_cpp.llama_state_seq_set_data(ctx, state, len(state), seq)) == len(state):
                start = found[0]
            else:  # never expected (the cells are free): compute it whole
                llama_cpp.llama_memory_seq_rm(memory, seq, -1, -1)
        starts.append(start)
    feed = [
        (seq, position, request.token_ids[position])
        for seq, ((request, _, _), start) in enumerate(zip(group, starts, strict=True))
        for position in range(start, len(request.token_ids))
    ]
    raw: list[Any] = [None] * len(group)
    batch = llama._batch.batch
    clean = False
    try:
        for begin in range(0, len(feed), llama.n_batch):
            piece = feed[begin : begin + llama.n_batch]
            for row, (seq, position, token) in enumerate(piece):
                batch.token[row], batch.pos[row], batch.n_seq_id[row] = token, position, 1
                batch.seq_id[row][0] = seq
                batch.logits[row] = position == len(group[seq][0].token_ids) - 1
            batch.n_tokens = len(piece)
            code = int(llama_cpp.llama_decode(ctx, batch))
            if code != 0:
                raise RuntimeError(f"llama_decode returned {code}")
            for row, (seq, position, _) in enumerate(piece):
                if position == len(group[seq][0].token_ids) - 1:
                    logits = llama_cpp.llama_get_logits_ith(ctx, row)
                    raw[seq] = numpy.ctypeslib.as_array(logits, shape=(n_vocab,)).copy()
        rows: list[NDArray[np.float32] | None] = []
        for seq, ((request, _, _), start, row) in enumerate(zip(group, starts, raw, strict=True)):
            if row is None or not finite_logits(numpy, row):
                rows.append(None)
                continue
            ids = request.token_ids
            saved = _sequence_state(llama_cpp, ctx, seq) if cache.enabled and len(ids) <= cache.capacity else None
            result = _log_softmax(numpy, row)
            cache.counted(start, len(ids) - start)
            if saved is not None:
                cache.put(request.adapters, ids, saved, result)
            rows.append(result)
        clean = all(row is not None for row in rows)
    finally:
        if clean:
            llama.reset()
            llama_cpp.llama_memory_seq_rm(memory, -1, -1, -1)
        else:  # its data too: a sequence whose logits were not finite may leave NaN in its cells
            clear_memory(llama_cpp, llama)
    return rows


def _log_softmax(numpy: Any, row: Any) -> NDArray[np.float32]:
    """The float32 log-softmax of one row of raw logits (computed in float64)."""
    wide = row.astype(numpy.float64)
    wide -= wide.max()
    wide -= numpy.log(numpy.exp(wide).sum())
    result: NDArray[np.float32] = wide.astype(numpy.float32)
    return result


def _sequence_state(llama_cpp: Any, ctx: Any, seq: int = 0) -> Any:
    """Sequence ``seq``'s state (its KV cells), as bytes llama.cpp can restore (into any sequence)."""
    size = int(llama_cpp.llama_state_seq_get_size(ctx, seq))
    buffer = (ctypes.c_uint8 * size)()
    written = int(llama_cpp.llama_state_seq_get_data(ctx, buffer, size, seq))
    return buffer if written == size else (ctypes.c_uint8 * written).from_buffer_copy(buffer, 0)
