"""The token level on a Transformers model: the vocabulary as token bytes, and full next-token distributions of
many sequences in right-padded forward passes, each row with its own adapter (or weighted combination).

Everything here runs on the provider's worker thread; torch and numpy are imported on first use. One path,
:func:`next_token_rows`, serves the prefix cache on and off: the sequences of one call run together, each from its
longest cached prefix (:mod:`inference._inprocess.hf_prefix_cache`), in forward passes over only their new tokens;
with the cache off nothing is kept between calls, and a sequence repeated within a call is computed once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inference._core.dependencies import import_optional
from inference._core.validation import AdapterScales, TokenRequest
from inference._inprocess.base import non_finite_logits
from inference._inprocess.hf_model import LoadedModel
from inference._inprocess.hf_prefix_cache import PrefixCache, kept_states, padded_past
from inference._inprocess.peft_slots import PeftSlots
from inference._inprocess.token_bytes import special_ids, token_bytes
from inference.tokens import TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["next_token_rows", "vocabulary"]


def vocabulary(loaded: LoadedModel) -> TokenVocabulary:
    """The model's :class:`~inference.tokens.TokenVocabulary`: as many entries as its output layer has rows."""
    tokenizer = loaded.tokenizer
    size = vocabulary_size(loaded)
    special = special_ids(tokenizer, size)
    bos = tokenizer.bos_token_id
    return TokenVocabulary(
        size=size,
        token_bytes=token_bytes(tokenizer, size),
        special_ids=special,
        bos_id=int(bos) if bos is not None else None,
        eos_ids=tuple(sorted(loaded.eos_ids, key=lambda token: (token != tokenizer.eos_token_id, token))),
        adds_bos=loaded.vocabulary.adds_bos,
        context_length=loaded.context if loaded.context is not None else 2**31 - 1,
    )


def next_token_rows(
    loaded: LoadedModel,
    slots: PeftSlots,
    requests: list[TokenRequest],
    cache: PrefixCache,
    *,
    max_batch_size: int,
    batch_sizes: deque[int],
    provider: str,
) -> NDArray[np.float32]:
    """The log-softmax after each request's last token, one float32 row per request, in order, each computed
    sequence counted in ``cache``'s statistics.

    Requests repeated in the call are computed once. With the cache on
    (:mod:`inference._inprocess.hf_prefix_cache`), a request whose whole sequence is cached gets its row from the
    cache, and the others run from their longest cached prefix (off: from nothing). They run together: longest
    first in right-padded forward passes of up to ``max_batch_size`` rows over only their new tokens (a causal model
    never looks at the padding after a sequence, so no attention mask unless cached prefixes differ in length),
    each row with its own adapter, rows with similar numbers of new tokens in one pass, logits only at the rows'
    last positions; with the cache on, each computed sequence is then kept.

    Raises:
        ProviderError: A row's logits are not finite (an adapter too strong for the model's dtype).
    """
    torch = import_optional("torch", extra="transformers", provider=provider)
    numpy = import_optional("numpy", extra="transformers", provider=provider)
    size = vocabulary_size(loaded)
    out = numpy.empty((len(requests), size), dtype=numpy.float32)
    pending: dict[tuple[AdapterScales, tuple[int, ...]], _Extension] = {}
    for index, request in enumerate(requests):
        ids, adapters = request.token_ids, request.adapters
        repeated = pending.get((adapters, ids))
        if repeated is not None:
            repeated.indices.append(index)
            if cache.enabled:
                cache.counted(len(ids), 0)
            continue
        found = cache.longest(adapters, ids) if cache.enabled else None
        if found is not None and found[0] == len(ids):
            out[index] = found[2]
            cache.counted(len(ids), 0)
            continue
        start, states = (found[0], found[1]) if found is not None else (0, None)
        pending[adapters, ids] = _Extension(request, start, states, [index])
    for chunk in _passes(sorted(pending.values(), key=lambda item: item.new, reverse=True), max_batch_size):
        with torch.inference_mode():
            rows, kept = _extend(torch, loaded, slots, chunk, batch_sizes, size, provider, keep=cache.enabled)
        if isinstance(kept, str):
            cache.refuse_states(kept)
        for row, item in enumerate(chunk):
            request = item.request
            out[item.indices] = rows[row]
            cache.counted(item.start, item.new)
            if kept is not None and not isinstance(kept, str):
                cache.put(request.adapters, request.token_ids, kept[row], rows[row].copy())
    result: NDArray[np.float32] = out
    return result


def vocabulary_size(loaded: LoadedModel) -> int:
    """How many logits the model gives per position (its output layer's rows)."""
    output = loaded.base_model.get_output_embeddings()
    return int(output.weight.shape[0]) if output is not None else len(loaded.tokenizer)


@dataclass
class _Extension:
    """A sequence to compute from its longest cached prefix: ``start`` tokens with their keys and values
    (``states``, ``None`` when ``start`` is 0), and where its row goes in the call's answer."""

    request: TokenRequest
    start: int
    states: Any
    indices: list[int]

    @property
    def new(self) -> int:
        """How many tokens it runs."""
        return len(self.request.token_ids) - self.start


def _passes(items: list[_Extension], max_batch_size: int) -> Iterator[list[_Extension]]:
    """``items`` (most new tokens first) cut into passes of up to ``max_batch_size`` rows; a pass also ends before a
    row with under half its first row's new tokens, so that a few long rows do not pad many short ones."""
    chunk: list[_Extension] = []
    for item in items:
        if chunk and (len(chunk) == max_batch_size or 2 * item.new < chunk[0].new):
            yield chunk
            chunk = []
        chunk.append(item)
    if chunk:
        yield chunk


def _extend(
    torch: Any,
    loaded: LoadedModel,
    slots: PeftSlots,
    chunk: list[_Extension],
    batch_sizes: deque[int],
    size: int,
    provider: str,
    *,
    keep: bool,
) -> tuple[NDArray[np.float32], list[Any] | str | None]:
    """One forward pass over the new tokens of ``chunk``'s rows after their cached prefixes (see
    :mod:`inference._inprocess.hf_prefix_cache`): their log-softmax rows, and with ``keep`` each row's whole
    sequence's keys and values (or why they cannot be kept; ``None`` without ``keep``). Call it under
    ``torch.inference_mode()``."""
    transformers = import_optional("transformers", extra="transformers", provider=provider)
    starts = [item.start for item in chunk]
    news = [item.request.token_ids[item.start :] for item in chunk]
    width, longest = max(starts), max(len(tokens) for tokens in news)
    device = loaded.device
    input_ids = torch.tensor(
        [[*tokens, *[loaded.pad_id] * (longest - len(tokens))] for tokens in news], dtype=torch.long, device=device
    )
    position_ids = torch.arange(longest, device=device)[None, :] + torch.tensor(starts, device=device)[:, None]
    attention_mask = None  # right padding needs none (a causal model never looks at the padding after a row)
    if any(start != width for start in starts):  # left-padded prefixes: hide the padding before them
        attention_mask = torch.ones((len(chunk), width + longest), dtype=torch.long)
        for row, start in enumerate(starts):
            attention_mask[row, : width - start] = 0
        attention_mask = attention_mask.to(device)
    past = padded_past(torch, transformers, [item.states for item in chunk], starts) if keep or width else None
    kept = sorted({len(tokens) - 1 for tokens in news})
    column = {position: index for index, position in enumerate(kept)}
    applied = [(item.request.adapter_id, item.request.adapter_scales) for item in chunk]
    with slots.rows(loaded, applied) as extra:
        batch_sizes.append(len(chunk))
        answer = loaded.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past,
            use_cache=keep,
            logits_to_keep=torch.tensor(kept, dtype=torch.long, device=device),
            **extra,
        )
    overflowed = loaded.overflow.take() if loaded.overflow is not None else None
    columns = torch.tensor([column[len(tokens) - 1] for tokens in news], dtype=torch.long, device=device)
    logits = answer.logits[torch.arange(len(chunk), device=device), columns, :size].float()
    finite = torch.isfinite(logits).all(dim=-1)
    if overflowed is not None:
        finite &= ~overflowed.to(finite.device)
    for row, item in enumerate(chunk):
        if not bool(finite[row]):
            raise non_finite_logits(provider, item.request.adapters)
    rows: NDArray[np.float32] = torch.log_softmax(logits, dim=-1).cpu().numpy()
    if not keep:
        return rows, None
    return rows, kept_states(torch, answer.past_key_values, starts, [len(tokens) for tokens in news], width)
