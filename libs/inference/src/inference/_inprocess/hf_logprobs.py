"""The scores of many sequences read from one forward pass's logits, in a few whole-tensor operations.

A pass of the Transformers provider's scoring holds the logits of every scored position of its sequences (rows x
kept positions x vocabulary). Each sequence's score is the sum of its targets' log-softmax, whether each target
was the argmax, and whether its logits could be used. Read one sequence at a time, that is five small operations
over the vocabulary per sequence (thousands of calls for a batch of short multiple-choice answers, longer than the
pass itself on a small model); here the positions of every sequence are gathered and read together, in chunks of
at most :data:`POSITIONS_PER_READ` rows. The log-softmax of a row does not depend on the other rows read with it,
so the sums are those of one sequence at a time, to the bit.

Everything here runs on the provider's worker thread, under ``torch.inference_mode()``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["POSITIONS_PER_READ", "Scored", "read_scores"]

Scored = tuple[float, int, bool]
"""A sequence's summed logprob (NaN when the logits were not usable), its scored tokens, whether all were greedy."""

POSITIONS_PER_READ = 256
"""The most scored positions read at once (a float32 copy of their logits and their log-softmax: with a 256k
vocabulary, 256 positions are 256 MiB each)."""


def read_scores(
    torch: Any, logits: Any, picks: Sequence[tuple[int, Sequence[int], Sequence[int]]], overflowed: Any
) -> list[Scored]:
    """Each sequence's score from ``logits`` (rows x columns x vocabulary).

    Args:
        torch: The torch module.
        logits: The pass's logits.
        picks: Per sequence, its row, the column of each position that predicts one of its tokens, and those tokens.
        overflowed: Per row, whether the final norm's watch saw its hidden state overflow (``None`` without a
            watch: then logits that are all equal count as an overflow).

    Returns:
        Per sequence, in order: summed logprob (NaN when its logits are not finite, or overflowed), scored tokens,
        whether each token was the argmax.
    """
    rows = [row for row, columns, _ in picks for _ in columns]
    columns = [column for _, row_columns, _ in picks for column in row_columns]
    targets = [token for _, _, tokens in picks for token in tokens]
    logprobs: list[float] = []
    greedy: list[bool] = []
    finite: list[bool] = []
    distinct: list[bool] = []
    device = logits.device
    for begin in range(0, len(rows), POSITIONS_PER_READ):
        end = begin + POSITIONS_PER_READ
        row_index = torch.tensor(rows[begin:end], dtype=torch.long, device=device)
        column_index = torch.tensor(columns[begin:end], dtype=torch.long, device=device)
        wanted = torch.tensor(targets[begin:end], dtype=torch.long, device=device)
        values = logits[row_index, column_index, :].float()
        logprobs.extend(torch.log_softmax(values, dim=-1).gather(1, wanted[:, None]).squeeze(1).tolist())
        greedy.extend((values.argmax(dim=-1) == wanted).tolist())
        lowest, highest = torch.aminmax(values, dim=-1)
        finite.extend(torch.isfinite(highest).tolist())
        distinct.extend((highest > lowest).tolist())
    scores: list[Scored] = []
    begin = 0
    for row, row_columns, _ in picks:
        end = begin + len(row_columns)
        # without a watch, logits that are all equal count as an overflow
        sound = not bool(overflowed[row]) if overflowed is not None else all(distinct[begin:end])
        usable = sound and all(finite[begin:end])
        scores.append((math.fsum(logprobs[begin:end]) if usable else math.nan, end - begin, all(greedy[begin:end])))
        begin = end
    return scores
