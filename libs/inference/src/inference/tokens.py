"""Token-level types: a prompt given as token ids, a model's vocabulary, and the prefix cache's counters.

These are what the token-level calls of :class:`~inference.InferenceProvider` take and return
(:meth:`~inference.InferenceProvider.tokenize`, :meth:`~inference.InferenceProvider.next_token_logprobs`,
:meth:`~inference.InferenceProvider.token_vocabulary`, :meth:`~inference.InferenceProvider.cache_stats`). The
distributions themselves are ``numpy`` arrays; this module imports no ``numpy``.

Example:
    >>> import asyncio
    >>> from inference import FakeProvider, TokenIds
    >>> async def main():
    ...     fake = FakeProvider()
    ...     ids = await fake.tokenize("Hi", model="m")
    ...     vocabulary = await fake.token_vocabulary("m")
    ...     row = await fake.next_token_logprobs([vocabulary.bos_id, *ids], model="m")
    ...     result = await fake.generate(TokenIds([vocabulary.bos_id, *ids]), model="m", max_tokens=2,
    ...                                  return_token_ids=True)
    ...     return ids, row.shape, len(result.token_ids) > 0
    >>> asyncio.run(main())
    ([75, 108], (259,), True)
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["TokenCacheStats", "TokenIds", "TokenVocabulary"]


@dataclass(frozen=True, init=False)
class TokenIds:
    """A prompt given as the model's token ids, for ``generate``, ``stream`` and ``generate_batch``.

    The ids are the model's whole input, as they are: no chat template, no BOS token added (put the model's
    ``bos_id`` first where the model expects one), ``system_prompt`` refused. Where a provider can take them is
    :attr:`~inference.InferenceProvider.supports_token_prompts`; elsewhere the call is an
    ``UnsupportedOperationError`` before anything is sent.

    Args:
        ids: The token ids (any iterable of integers: a list, a tuple, a ``numpy`` array).

    Attributes:
        ids: The token ids, as a tuple of ``int``.

    Example:
        >>> TokenIds([2, 17, 5]).ids
        (2, 17, 5)
    """

    ids: tuple[int, ...]

    def __init__(self, ids: Iterable[int]) -> None:
        try:
            values = tuple(  # numpy integers too; never a float, and a bool kept to be refused with its position
                value if isinstance(value, bool) else operator.index(value) for value in ids
            )
        except TypeError:
            values = tuple(ids)  # checked (and refused with a sentence) where the request is validated
        object.__setattr__(self, "ids", values)

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)


@dataclass(frozen=True)
class TokenVocabulary:
    """What a model's tokenizer and context allow, for token-level work (:meth:`~inference.InferenceProvider.
    token_vocabulary`).

    Attributes:
        size: How many token ids the model reads and predicts: valid ids are ``0..size-1``, and every row of
            :meth:`~inference.InferenceProvider.next_token_logprobs` has ``size`` entries (the model's logits,
            which may be more than the tokenizer's entries: those have ``b""`` bytes).
        token_bytes: Each id's bytes: what the token adds to the text (a byte-level token's raw bytes, which
            may be part of a UTF-8 character); a special token's text (``b"<eos>"``). ``size`` entries.
        special_ids: The control tokens (BOS, EOS, chat markers...).
        bos_id: The beginning-of-sequence token, or ``None``.
        eos_ids: The end-of-sequence tokens, the tokenizer's own first (``()`` when it has none).
        adds_bos: The model's tokenizer puts ``bos_id`` in front of every prompt (Gemma, Llama); a
            :class:`TokenIds` prompt or a ``next_token_logprobs`` sequence should then start with it.
        context_length: The most tokens the model reads: a longer sequence is a
            :class:`~inference.exceptions.TokenLimitError`.
    """

    size: int
    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int] = frozenset()
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    adds_bos: bool = False
    context_length: int = 2048

    def __post_init__(self) -> None:
        if len(self.token_bytes) != self.size:
            raise ValueError(f"token_bytes has {len(self.token_bytes)} entries for a vocabulary of {self.size}")

    @property
    def eos_id(self) -> int | None:
        """The tokenizer's end-of-sequence token (the first of :attr:`eos_ids`), or ``None``."""
        return self.eos_ids[0] if self.eos_ids else None


@dataclass(frozen=True)
class TokenCacheStats:
    """The counters of a provider's prefix cache (:meth:`~inference.InferenceProvider.cache_stats`).

    A sequence whose first tokens were computed before (for its adapter's current weights) reuses their keys and
    values: ``prefix + [t]`` after ``prefix`` costs one token. Each sequence asked for counts once, as a hit (it
    reused at least one token) or a miss.

    Attributes:
        enabled: The provider keeps a prefix cache (``False``: every sequence is computed whole; the counters
            still count the sequences and the tokens computed).
        hits: Sequences that reused cached tokens.
        misses: Sequences computed from their first token.
        reused_tokens: Tokens taken from the cache instead of computed.
        computed_tokens: Tokens the model computed.
        cached_tokens: Tokens the cache holds now.
        capacity_tokens: The most tokens it holds before evicting the least recently used (``None``: no bound).
        evictions: Tokens evicted to stay within the capacity.
    """

    enabled: bool = False
    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    computed_tokens: int = 0
    cached_tokens: int = 0
    capacity_tokens: int | None = None
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``; ``0.0`` before any sequence."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
