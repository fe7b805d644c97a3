"""What the llama.cpp provider reads from llama.cpp's logits: token logprobs, scores, a JSON-schema mask.

Everything here runs on the provider's worker thread with the ``Llama`` object it owns, and takes the
``llama_cpp`` and ``numpy`` modules as arguments (this module imports neither):

- :func:`token_logprob`: the log-softmax of the logits that chose a generated token (the last logits
  ``llama_decode`` produced, before any sampler), its ``k`` best alternatives;
- :func:`finite_logits`: whether a row of logits can choose a token at all (finite, not all equal), and
  :func:`clear_memory`, which wipes the NaN a failed request leaves in the KV cache;
- :func:`score_sequence`: one evaluation of a sequence with logits requested only at the positions that
  predict the scored tokens (a big vocabulary's output layer is the costly part), summed log-softmax;
- :class:`JsonMask`: an llguidance matcher as a llama-cpp-python logits processor (first in the sampler
  chain, so it sees the raw logits), fed each chosen token.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Generator, Sequence
from typing import Any

from inference._core.scoring import ScoreTokens
from inference.results import TokenLogprob

__all__ = [
    "JsonMask",
    "clear_memory",
    "evaluated",
    "finite_logits",
    "log_normalizer",
    "logprob_of",
    "score_sequence",
    "token_logprob",
]


def finite_logits(numpy: Any, logits: Any) -> bool:
    """True when a row of raw logits can choose a token: its maximum is finite (no NaN, which the maximum
    propagates, no +infinity) and above its minimum.

    All-equal logits are what a float32 overflow inside the model leaves where it does not leave NaN (an RMS norm
    of an overflowed sum of squares is 0, so every logit is 0): they carry no information. Two passes over the
    row, run for every generated token: measured on 2 busy cores, 7 µs for the tiny models' 512 tokens (a
    one-token decode there takes 500 µs) and 40-70 µs for Gemma 3's 262k (whose tokens take about 20 ms).
    """
    highest = logits.max()  # the array's own methods: numpy's function wrappers cost three times as much here
    return math.isfinite(highest) and bool(highest > logits.min())


def clear_memory(llama_cpp: Any, llama: Any) -> None:
    """Empty the context's KV cache, its data too, and reset the ``Llama`` (its next ``generate`` starts afresh).

    Removing a sequence frees its cells but leaves their values. Cells a request filled with NaN then poison
    every later decode that attends over them: a masked cell weighs 0, and 0 x NaN is NaN (llama.cpp's attention
    without flash attention multiplies every cell in range). After a request failed, call this when no other
    sequence is in the context.
    """
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llama.ctx), True)
    llama.reset()


def log_normalizer(numpy: Any, logits: Any) -> float:
    """``log(sum(exp(logits)))`` of one row, in float64 (so sums of log-probabilities over many tokens stay exact
    to 1e-9): a token's log-probability is its logit minus this.

    One float64 temporary and no log-softmax row (which took three): on Gemma 3's 262k tokens 0.36 ms against
    0.45 ms, the same value.
    """
    top = float(logits.max())
    shifted = numpy.subtract(logits, top, dtype=numpy.float64)
    numpy.exp(shifted, out=shifted)
    return top + float(numpy.log(shifted.sum()))


def logprob_of(numpy: Any, logits: Any, token: int) -> float:
    """The log-probability of ``token`` under one row of raw ``logits`` (float64, see :func:`log_normalizer`)."""
    return float(logits[token]) - log_normalizer(numpy, logits)


def token_logprob(
    numpy: Any, logits: Any, token: int, k: int, text_of: Callable[[int], str]
) -> TokenLogprob:
    """The entry of one generated token: its log-probability under ``logits`` and the ``k`` most likely tokens."""
    normalizer = log_normalizer(numpy, logits)
    top: tuple[tuple[str, float], ...] = ()
    if k > 0:  # the most likely tokens are those of the largest logits
        best = numpy.argpartition(-logits, k - 1)[:k]
        best = best[numpy.argsort(-logits[best], kind="stable")]
        top = tuple((text_of(int(index)), float(logits[index]) - normalizer) for index in best)
    return TokenLogprob(text_of(token), float(logits[token]) - normalizer, top, token)


def evaluated(
    numpy: Any, llama: Any, tokens: Sequence[int], wanted: Callable[[int], bool], *, start: int = 0
) -> Generator[tuple[int, Any], None, None]:
    """Evaluate ``tokens`` from an empty KV cache in chunks of the context's batch size, logits requested only at
    the positions ``wanted`` accepts; yield ``(position, logits)`` for each (the logits after ``tokens[position]``,
    valid until the next item). The ``Llama`` object is left reset (its next ``generate`` starts afresh).

    With ``start > 0`` the KV cache holds ``tokens[:start]`` already (in sequence 0, restored from a prefix cache):
    only the rest is evaluated."""
    n_vocab = llama.n_vocab()
    llama.reset()
    if start == 0:
        llama._ctx.kv_cache_seq_rm(-1, 0, -1)
    try:
        for begin in range(start, len(tokens), llama.n_batch):
            chunk = tokens[begin : begin + llama.n_batch]
            llama._batch.set_batch(batch=list(chunk), n_past=begin, logits_all=False)
            flags = [wanted(begin + row) for row in range(len(chunk))]
            for row, flag in enumerate(flags):
                llama._batch.batch.logits[row] = flag
            llama._ctx.decode(llama._batch)
            if not any(flags):
                continue
            logits = numpy.ctypeslib.as_array(llama._ctx.get_logits(), shape=(sum(flags), n_vocab))
            positions = [begin + row for row, flag in enumerate(flags) if flag]
            yield from zip(positions, logits, strict=True)
    finally:
        llama.reset()
        llama._ctx.kv_cache_seq_rm(-1, 0, -1)


def score_sequence(llama_cpp: Any, numpy: Any, llama: Any, sequence: ScoreTokens) -> tuple[float, bool]:
    """Evaluate ``sequence.tokens[:-1]`` (:func:`evaluated`); return the scored tokens' summed logprob and
    whether each was the argmax (a NaN sum where logits are not :func:`finite_logits`)."""
    total, greedy = 0.0, True
    steps = evaluated(numpy, llama, sequence.tokens[:-1], lambda position: position + 1 >= sequence.start)
    with contextlib.closing(steps):
        for position, row in steps:
            target = sequence.tokens[position + 1]
            if not finite_logits(numpy, row):
                steps.close()
                clear_memory(llama_cpp, llama)
                return math.nan, False  # no score can be read from these logits: the caller says so
            total += logprob_of(numpy, row, target)
            greedy = greedy and int(numpy.argmax(row)) == target
    return total, greedy


class JsonMask:
    """An llguidance matcher as a logits processor for ``Llama.generate``, and the stop rule it implies.

    Args:
        numpy: The numpy module.
        matcher: A fresh ``llguidance.LLMatcher`` for this request's schema.
    """

    def __init__(self, numpy: Any, matcher: Any) -> None:
        self.numpy = numpy
        self.matcher = matcher

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Set every token the grammar does not allow now to ``-inf`` (the raw logits, by token id)."""
        numpy = self.numpy
        bits = numpy.frombuffer(bytes(self.matcher.compute_bitmask()), dtype=numpy.uint32)
        allowed = numpy.unpackbits(bits.view(numpy.uint8), bitorder="little").astype(bool)
        if len(allowed) < len(scores):  # logits beyond the grammar's vocabulary are never allowed
            allowed = numpy.concatenate([allowed, numpy.zeros(len(scores) - len(allowed), dtype=bool)])
        scores[~allowed[: len(scores)]] = -numpy.inf
        return scores

    def consume(self, token: int) -> bool:
        """Feed the chosen token; ``True`` once the JSON is complete and only the end may follow."""
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}: {self.matcher.get_error()}")
        return bool(self.matcher.is_stopped())
