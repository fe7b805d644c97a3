"""The tokenization rule of log-likelihood scoring, the same on every backend, as lm-eval-harness does it.

``score(context, continuation)`` scores the continuation's tokens after the context's:

1. Trailing whitespace of the context moves to the start of the continuation (``"Q: 2+2 ="`` + ``" 4"``
   scores the same as ``"Q: 2+2 = "`` + ``"4"``): a tokenizer glues a space to the word after it.
2. ``whole = encode(context + continuation)`` and ``head = encode(context)``, both without added special
   tokens; the continuation's tokens are ``whole[len(head):]`` (lm-eval's rule: a token that merges across the
   boundary counts as the continuation's). ``encode`` is the model's Hugging Face tokenizer as lm-eval's ``hf``
   model calls it: text that spells a special token (``"<|im_end|>"``, ``"<bos>"``) is that one token, and the
   tokenizer's normalizer (Qwen's NFC) applies. Every backend encodes so, llama.cpp included.
3. The sequence the model reads starts with the model's BOS token when its tokenizer puts one in front of
   every prompt (Gemma, Llama: the rule generation follows too). When it does not and the context is empty,
   it starts with the BOS token anyway (the EOS token for a vocabulary without BOS), so the first
   continuation token is predicted from something; this is lm-eval's prefix token. Text that already starts
   with that token (a chat-formatted ``"<bos><start_of_turn>..."``) is not given a second one, as lm-eval does:
   the written token is the start, and it is never scored.

The model reads ``tokens[:-1]`` and each token from ``tokens[start]`` on is scored by the log-softmax of the
logits at the position before it. ``score_rolling(text)`` scores all of ``text`` in the windows of
:func:`rolling_windows`: lm-eval's ``loglikelihood_rolling`` windows, disjoint, each as long as the context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inference.exceptions import InvalidRequestError, TokenLimitError

__all__ = ["ScoreTokens", "Vocabulary", "rolling_windows", "score_tokens", "too_long"]

Encode = Callable[[str], Sequence[int]]
"""Text -> token ids, without added special tokens; special-token text is read as those tokens."""


@dataclass(frozen=True)
class Vocabulary:
    """What the rule needs to know about a model's tokenizer.

    Attributes:
        encode: Text -> token ids as the model's Hugging Face tokenizer gives them without added special tokens
            (``add_special_tokens=False``): special-token text read as those tokens, its normalizer applied.
        adds_bos: The tokenizer puts ``bos_id`` in front of every prompt.
        bos_id: The BOS token, or ``None``.
        eos_id: The EOS token, or ``None``.
    """

    encode: Encode
    adds_bos: bool
    bos_id: int | None
    eos_id: int | None

    def prefix(self, *, context_empty: bool) -> list[int]:
        """The tokens before the context: BOS where the model always has it, else a start token when needed."""
        if self.adds_bos and self.bos_id is not None:
            return [self.bos_id]
        if context_empty:
            start = self.bos_id if self.bos_id is not None else self.eos_id
            return [start] if start is not None else []
        return []


@dataclass(frozen=True)
class ScoreTokens:
    """A sequence to score: the model reads ``tokens[:-1]``; ``tokens[start:]`` are scored.

    Attributes:
        tokens: Prefix, context and continuation token ids.
        start: Index of the first scored token (at least 1).
    """

    tokens: tuple[int, ...]
    start: int

    @property
    def scored(self) -> tuple[int, ...]:
        """The scored tokens (the continuation's)."""
        return self.tokens[self.start :]


def score_tokens(vocabulary: Vocabulary, context: str, continuation: str, *, provider: str) -> ScoreTokens:
    """The sequence that scores ``continuation`` after ``context`` (steps 1-3 of this module's rule).

    Raises:
        InvalidRequestError: The continuation has no tokens of its own, or the context is empty and the
            vocabulary has neither BOS nor EOS to start from.
    """
    stripped = context.rstrip()
    if stripped != context:
        continuation = context[len(stripped) :] + continuation
        context = stripped
    head = list(vocabulary.encode(context)) if context else []
    whole = list(vocabulary.encode(context + continuation))
    prefix = vocabulary.prefix(context_empty=not head)
    if prefix and whole[:1] == prefix:  # the text starts with the start token itself: never a second one
        prefix, head = [], head or whole[:1]
    tokens = (*prefix, *head, *whole[len(head) :])
    start = len(prefix) + len(head)
    if start == 0:
        raise InvalidRequestError(
            "the context is empty and the model has no BOS or EOS token to start from: give a context",
            provider=provider,
        )
    if start >= len(tokens):
        raise InvalidRequestError(
            f"the continuation {continuation!r} has no tokens of its own after the context (it merged into the "
            "context's last token): move text from the context into the continuation",
            provider=provider,
        )
    return ScoreTokens(tokens, start)


def rolling_windows(vocabulary: Vocabulary, text: str, max_length: int, *, provider: str) -> list[ScoreTokens]:
    """Windows that score every token of ``text``, each read by the model as at most ``max_length`` tokens.

    The first window starts with the prefix token (step 3, as for an empty context); each later window
    scores the next ``max_length`` tokens (fewer at the end) conditioned on the tokens just before them.

    Raises:
        InvalidRequestError: ``text`` has no tokens, or the vocabulary has no token to start from.
    """
    tokens = list(vocabulary.encode(text))
    prefix = vocabulary.prefix(context_empty=True)
    if prefix and tokens[:1] == prefix:  # the text starts with the start token itself: it is the start
        tokens = tokens[1:]
    if not tokens:
        raise InvalidRequestError("the text has no tokens: there is nothing to score", provider=provider)
    if not prefix:
        raise InvalidRequestError(
            "the model has no BOS or EOS token to start the text from, so its first token cannot be scored",
            provider=provider,
        )
    first = min(max_length, len(tokens))
    windows = [ScoreTokens((*prefix, *tokens[:first]), len(prefix))]
    done = first
    while done < len(tokens):
        count = min(max_length, len(tokens) - done)
        end = done + count
        begin = max(0, end - max_length - 1)
        windows.append(ScoreTokens(tuple(tokens[begin:end]), end - count - begin))
        done = end
    return windows


def too_long(length: int, limit: int, *, provider: str, setting: str) -> TokenLimitError:
    """The error for context + continuation that do not fit the model's context window (of kind ``"context"``: a
    :class:`~inference.fallback.FallbackProvider` moves it on to the next provider)."""
    return TokenLimitError(
        f"context and continuation are {length} tokens, more than the model's context of {limit} tokens: "
        f"shorten the context, or raise {setting}",
        limit=limit, value=length, kind="context", provider=provider,
    )
