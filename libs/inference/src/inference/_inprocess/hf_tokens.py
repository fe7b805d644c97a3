"""The token level on a Transformers model: the vocabulary as token bytes, and full next-token distributions of
many sequences in right-padded forward passes, each row with its own adapter (or weighted combination).

Everything here runs on the provider's worker thread; torch and numpy are imported on first use. With the prefix
cache on (:mod:`inference._inprocess.hf_prefix_cache`), each sequence runs alone from its longest cached prefix;
off, sequences run whole, batched.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from inference._core.dependencies import import_optional
from inference._core.validation import TokenRequest
from inference._inprocess.base import non_finite_logits
from inference._inprocess.hf_model import LoadedModel
from inference._inprocess.hf_prefix_cache import PrefixCache
from inference._inprocess.hf_scoring import right_padded_pass
from inference._inprocess.peft_slots import PeftSlots
from inference._inprocess.token_bytes import token_bytes
from inference.tokens import TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["cached_rows", "next_token_rows", "vocabulary"]


def vocabulary(loaded: LoadedModel) -> TokenVocabulary:
    """The model's :class:`~inference.tokens.TokenVocabulary`: as many entries as its output layer has rows."""
    tokenizer = loaded.tokenizer
    size = vocabulary_size(loaded)
    special = frozenset(int(token) for token in tokenizer.all_special_ids if 0 <= int(token) < size)
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
    *,
    max_batch_size: int,
    batch_sizes: deque[int],
    provider: str,
) -> tuple[NDArray[np.float32], int]:
    """The log-softmax after each request's last token, one float32 row per request, in order; and the number of
    tokens computed. Longest first in right-padded forward passes of up to ``max_batch_size`` rows (a causal model
    never looks at the padding after a sequence, so no attention mask), logits only at the rows' last positions.

    Raises:
        ProviderError: A row's logits are not finite (an adapter too strong for the model's dtype).
    """
    torch = import_optional("torch", extra="transformers", provider=provider)
    numpy = import_optional("numpy", extra="transformers", provider=provider)
    size = vocabulary_size(loaded)
    out = numpy.empty((len(requests), size), dtype=numpy.float32)
    order = sorted(range(len(requests)), key=lambda index: len(requests[index].token_ids), reverse=True)
    for begin in range(0, len(order), max_batch_size):
        chunk = order[begin : begin + max_batch_size]
        reads = [requests[index].token_ids for index in chunk]
        applied = [(requests[index].adapter_id, requests[index].adapter_scales) for index in chunk]
        with torch.inference_mode():
            logits, column, overflowed = right_padded_pass(
                torch, loaded, slots, applied, reads, [len(ids) - 1 for ids in reads], batch_sizes
            )
            rows = torch.stack([logits[row, column[len(ids) - 1], :size] for row, ids in enumerate(reads)]).float()
            finite = torch.isfinite(rows).all(dim=-1)
            if overflowed is not None:
                finite &= ~overflowed.to(finite.device)
            for row, index in enumerate(chunk):
                if not bool(finite[row]):
                    raise non_finite_logits(provider, requests[index].adapters)
            out[chunk] = torch.log_softmax(rows, dim=-1).cpu().numpy()
    return out, sum(len(request.token_ids) for request in requests)


def vocabulary_size(loaded: LoadedModel) -> int:
    """How many logits the model gives per position (its output layer's rows)."""
    output = loaded.base_model.get_output_embeddings()
    return int(output.weight.shape[0]) if output is not None else len(loaded.tokenizer)


def cached_rows(
    loaded: LoadedModel,
    slots: PeftSlots,
    requests: list[TokenRequest],
    cache: PrefixCache,
    *,
    batch_sizes: deque[int],
    provider: str,
) -> NDArray[np.float32]:
    """:func:`next_token_rows` through the prefix cache: each request runs alone from its longest cached prefix
    (only its new tokens), and its keys and values are kept for the requests that extend it."""
    import copy

    torch = import_optional("torch", extra="transformers", provider=provider)
    numpy = import_optional("numpy", extra="transformers", provider=provider)
    size = vocabulary_size(loaded)
    out = numpy.empty((len(requests), size), dtype=numpy.float32)
    for index, request in enumerate(requests):
        ids, adapters = request.token_ids, request.adapters
        found = cache.longest(adapters, ids)
        if found is not None and found[0] == len(ids):
            out[index] = found[2]
            cache.counted(len(ids), 0)
            continue
        start, past = (found[0], copy.deepcopy(found[1])) if found is not None else (0, None)
        with slots.rows(loaded, [(request.adapter_id, request.adapter_scales)]) as extra, torch.inference_mode():
            batch_sizes.append(1)
            answer = loaded.model(
                input_ids=torch.tensor([ids[start:]], dtype=torch.long, device=loaded.device),
                past_key_values=past,
                use_cache=True,
                logits_to_keep=1,
                **extra,
            )
            overflowed = loaded.overflow.take() if loaded.overflow is not None else None
            logits = answer.logits[0, -1, :size].float()
            if not bool(torch.isfinite(logits).all()) or (overflowed is not None and bool(overflowed.any())):
                raise non_finite_logits(provider, adapters)
            row = torch.log_softmax(logits, dim=-1).cpu().numpy()
        out[index] = row
        cache.counted(start, len(ids) - start)
        cache.put(adapters, ids, answer.past_key_values, row)
    rows: NDArray[np.float32] = out
    return rows
