"""Scoring on a Transformers model: ``score`` and ``score_rolling`` calls in batched forward passes, mixed adapters.

Score calls wait in a :class:`~inference._inprocess.batching.BatchQueue` like generation requests (any two may
share a batch; the oldest call's adapter goes first, since a forward pass of one adapter skips PEFT's
mixed-adapter path). :class:`HFScoring` cuts each call into its sequences (one for ``score``, the rolling windows
of :func:`~inference._core.scoring.rolling_windows` for ``score_rolling``), scores them longest first in
right-padded forward passes of up to ``max_batch_size`` rows, each row with its own adapter, and sums each call's
parts into its :class:`~inference.ScoreResult`. ``score`` calls of one batch that share their adapter and their
context (a multiple-choice item's choices) are scored first, the context once per group
(:mod:`inference._inprocess.hf_shared_context`).

Everything here runs on the provider's worker thread; torch is imported on first use.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inference._core.dependencies import import_optional
from inference._core.scoring import ScoreTokens, rolling_windows, score_tokens, too_long
from inference._core.validation import AdapterScales, ScoreRequest
from inference._inprocess.base import non_finite_logits
from inference._inprocess.batching import PendingRequest
from inference._inprocess.hf_logprobs import read_scores
from inference._inprocess.hf_model import LoadedModel, as_inference_error
from inference._inprocess.hf_prompt import encode_ahead
from inference._inprocess.hf_shared_context import (
    SharedGroup,
    packed_length,
    packing_limit,
    score_groups,
    shared_context_groups,
)
from inference._inprocess.peft_slots import PeftSlots
from inference.exceptions import ProviderError
from inference.results import ScoreResult

__all__ = ["LOGITS_BUDGET", "PASSES_PER_BATCH", "HFScoring", "ScoreCall", "fits", "right_padded_pass"]


@dataclass(frozen=True)
class ScoreCall:
    """One ``score`` (``rolling=False``) or ``score_rolling`` call, as it waits in the batch queue."""

    request: ScoreRequest
    rolling: bool

    @property
    def adapter_id(self) -> str | None:
        """The adapter the call scores with (``None``: the base model)."""
        return self.request.adapter_id


PASSES_PER_BATCH = 8
"""A batch of score calls takes up to this many forward passes' worth of the calls waiting: sorted by adapter and
length before they are cut into passes, they pad less, their passes mostly apply one adapter, and a
multiple-choice item's choices meet in one batch."""

LOGITS_BUDGET = 1 << 28
"""The most logits (rows x kept positions x vocabulary) one shared-context pass computes: 1 GiB in float32."""

QueuedScore = PendingRequest[ScoreCall, ScoreResult]
"""A score call on its way to the worker."""


class HFScoring:
    """Scores batches of score calls on a loaded model.

    Args:
        slots: The model's adapter slots (what each row applies).
        max_batch_size: The most rows in one forward pass.
        batch_sizes: Where each forward pass's number of rows is recorded (shared with generation).
        provider: The provider's name, for errors.
    """

    def __init__(self, slots: PeftSlots, max_batch_size: int, batch_sizes: deque[int], *, provider: str) -> None:
        self.slots = slots
        self.max_batch_size = max_batch_size
        self.batch_sizes = batch_sizes
        self.provider = provider

    def run_batch(self, loaded: LoadedModel, batch: list[QueuedScore]) -> None:
        """Score every sequence of ``batch`` in forward passes of up to ``max_batch_size`` rows, mixed adapters;
        each call's future gets its result or its error (a call that fails fails alone)."""
        rows: list[tuple[int, ScoreTokens]] = []
        # the texts the scoring rule tokenizes (each context, and context + continuation), in one tokenizer call
        calls = [entry.request.request for entry in batch if not entry.request.rolling]
        texts = [text for call in calls for text in (call.context, call.context + call.continuation) if text]
        with contextlib.suppress(Exception):  # a text the tokenizer refuses fails its own call below, alone
            encode_ahead(loaded.tokenizer, texts, special=False)
        for index, entry in enumerate(batch):
            if entry.cancel.is_set():
                continue
            try:
                rows.extend((index, sequence) for sequence in self._sequences(loaded, entry.request))
            except BaseException as error:
                entry.future.set_exception(as_inference_error(error, provider=self.provider))
        totals: dict[int, tuple[float, int, bool]] = {}
        failed: dict[int, BaseException] = {}
        rows = self._score_shared(loaded, batch, rows, totals, failed)
        # One adapter per pass where the rows allow, and similar lengths (less padding) within it.
        rows.sort(key=lambda item: (batch[item[0]].request.adapter_id or "", -len(item[1].tokens)))
        for begin in range(0, len(rows), self.max_batch_size):
            chunk = rows[begin : begin + self.max_batch_size]
            if any(batch[index].cancel.is_set() or index in failed for index, _ in chunk):
                chunk = [item for item in chunk if not batch[item[0]].cancel.is_set() and item[0] not in failed]
                if not chunk:
                    continue
            adapters = [batch[index].request.adapter_id for index, _ in chunk]
            try:
                scored = self._score_rows(loaded, [sequence for _, sequence in chunk], adapters)
            except BaseException as error:
                for index, _ in chunk:
                    failed.setdefault(index, error)
                continue
            for (index, _), result in zip(chunk, scored, strict=True):
                self._add(batch, index, result, totals, failed)
        for index, entry in enumerate(batch):
            if entry.future.done():
                continue
            if entry.cancel.is_set():
                entry.future.set_exception(ProviderError("the request was cancelled", provider=self.provider))
            elif index in failed:
                entry.future.set_exception(as_inference_error(failed[index], provider=self.provider))
            else:
                logprob, count, greedy = totals[index]
                entry.future.set_result(
                    ScoreResult(
                        logprob=float(logprob),
                        num_tokens=int(count),
                        is_greedy=bool(greedy),
                        model=loaded.name,
                        adapter_id=entry.request.adapter_id,
                    )
                )

    def _add(
        self,
        batch: list[QueuedScore],
        index: int,
        result: tuple[float, int, bool],
        totals: dict[int, tuple[float, int, bool]],
        failed: dict[int, BaseException],
    ) -> None:
        """Add one scored sequence of call ``index`` to its totals (non-finite logits fail the call)."""
        logprob, count, greedy = result
        if not math.isfinite(logprob):  # NaN or infinite logits (finite ones give a finite log-softmax)
            adapter_id = batch[index].request.adapter_id
            used = () if adapter_id is None else ((adapter_id, 1.0),)
            failed.setdefault(index, non_finite_logits(self.provider, used))
            return
        before = totals.get(index, (0.0, 0, True))
        totals[index] = (before[0] + logprob, before[1] + count, before[2] and greedy)

    def _score_shared(
        self,
        loaded: LoadedModel,
        batch: list[QueuedScore],
        rows: list[tuple[int, ScoreTokens]],
        totals: dict[int, tuple[float, int, bool]],
        failed: dict[int, BaseException],
    ) -> list[tuple[int, ScoreTokens]]:
        """Score the ``score`` calls that share a context with the same adapter, the context once per group
        (:mod:`inference._inprocess.hf_shared_context`); return the rows left to score one sequence per row.

        A pass that fails gives its rows back to the one-sequence-per-row passes, which find the call that fails.
        """
        torch = import_optional("torch", extra="transformers", provider=self.provider)
        alone = [row for row in rows if batch[row[0]].request.rolling]
        plain = [row for row in rows if not batch[row[0]].request.rolling]
        groups, left = shared_context_groups(
            [(batch[index].request.adapter_id, seq) for index, seq in plain], packing_limit(loaded)
        )
        alone.extend(plain[position] for position in left)
        chunk: list[SharedGroup] = []
        for number, group in enumerate(groups):
            chunk.append(group)
            ahead = groups[number + 1] if number + 1 < len(groups) else None
            if ahead is not None and len(chunk) < self.max_batch_size and fits(loaded, [*chunk, ahead]):
                continue
            try:
                with torch.inference_mode():
                    scored = score_groups(torch, loaded, self.slots, chunk, self.batch_sizes)
            except Exception:
                alone.extend(plain[member] for done in chunk for member in done.members)
            else:
                for member, result in scored.items():
                    self._add(batch, plain[member][0], result, totals, failed)
            chunk = []
        return alone

    def _sequences(self, loaded: LoadedModel, call: ScoreCall) -> list[ScoreTokens]:
        """The sequences that score ``call``: one for ``score``, the rolling windows for ``score_rolling``."""
        request = call.request
        if request.adapter_id is not None:
            self.slots.applied(loaded, request.adapter_id)  # refuses an adapter that is not in the model
        if call.rolling:
            if loaded.context is None:
                return [score_tokens(loaded.vocabulary, "", request.continuation, provider=self.provider)]
            return rolling_windows(loaded.vocabulary, request.continuation, loaded.context, provider=self.provider)
        sequence = score_tokens(loaded.vocabulary, request.context, request.continuation, provider=self.provider)
        if loaded.context is not None and len(sequence.tokens) - 1 > loaded.context:
            raise too_long(
                len(sequence.tokens) - 1,
                loaded.context,
                provider=self.provider,
                setting=f"max_position_embeddings in {loaded.name}'s config.json (only if the model supports more)",
            )
        return [sequence]

    def _score_rows(
        self, loaded: LoadedModel, sequences: list[ScoreTokens], adapter_ids: list[str | None]
    ) -> list[tuple[float, int, bool]]:
        """One right-padded forward pass: per sequence, (summed logprob, scored tokens, all greedy).

        Right padding needs no attention mask (a causal model never looks at the padding after a sequence), so
        attention keeps its fastest kernel; logits are computed only at the positions some row scores
        (``logits_to_keep`` as the sorted union of those positions).
        """
        torch = import_optional("torch", extra="transformers", provider=self.provider)
        reads = [sequence.tokens[:-1] for sequence in sequences]
        wanted = sorted({position for s in sequences for position in range(s.start - 1, len(s.tokens) - 1)})
        applied: list[tuple[str | None, AdapterScales]] = [(adapter_id, ()) for adapter_id in adapter_ids]
        with torch.inference_mode():
            logits, column, overflowed = right_padded_pass(
                torch, loaded, self.slots, applied, reads, wanted, self.batch_sizes
            )
            picks = [
                (row, [column[position] for position in range(s.start - 1, len(s.tokens) - 1)], s.scored)
                for row, s in enumerate(sequences)
            ]
            return read_scores(torch, logits, picks, overflowed)


def fits(loaded: LoadedModel, groups: Sequence[SharedGroup]) -> bool:
    """Whether one pass over ``groups`` keeps its logits under :data:`LOGITS_BUDGET` (a large vocabulary times
    every position of a packed row adds up)."""
    width = max(packed_length(group) for group in groups)
    return len(groups) * width * max(len(loaded.tokenizer), 1) <= LOGITS_BUDGET


def right_padded_pass(
    torch: Any,
    loaded: LoadedModel,
    slots: PeftSlots,
    applied: Sequence[tuple[str | None, AdapterScales]],
    reads: Sequence[Sequence[int]],
    positions: Sequence[int],
    batch_sizes: deque[int],
) -> tuple[Any, dict[int, int], Any]:
    """One forward pass over right-padded ``reads`` (each row with its adapter), logits only at ``positions``.

    Right padding needs no attention mask (a causal model never looks at the padding after a sequence), so
    attention keeps its fastest kernel. Call it under ``torch.inference_mode()``.

    Returns:
        The logits (rows x positions x vocabulary), position -> its column there, and the rows the final norm's
        watch saw overflow (``None`` without a watch).
    """
    width = max(len(tokens) for tokens in reads)
    input_ids = torch.full((len(reads), width), loaded.pad_id, dtype=torch.long)
    for row, tokens in enumerate(reads):
        input_ids[row, : len(tokens)] = torch.tensor(list(tokens), dtype=torch.long)
    kept = sorted(set(positions))
    with slots.rows(loaded, applied) as extra:
        batch_sizes.append(len(reads))
        logits = loaded.model(
            input_ids=input_ids.to(loaded.device),
            logits_to_keep=torch.tensor(kept, dtype=torch.long, device=loaded.device),
            use_cache=False,
            **extra,
        ).logits
    overflowed = loaded.overflow.take() if loaded.overflow is not None else None
    return logits, {position: index for index, position in enumerate(kept)}, overflowed
