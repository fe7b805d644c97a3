"""Score sequences that share a context on a Transformers model: the context once, the continuations branched.

A multiple-choice item scores one context with N continuations, and an evaluation sends them as N score calls.
:func:`shared_context_groups` finds, among a batch's sequences, those with the same adapter and the same tokens
before their first scored token; :func:`score_groups` computes each group's context once (one right-padded pass
over the groups' contexts, their keys and values kept) and then every continuation in one pass that reads its
group's keys and values (a 2D attention mask hides the other contexts' padding; position ids go on after the
context). The first scored token's logprob comes from the context's last position. lm-eval shares contexts only
for one-token answers; here any continuation branches.

Everything here runs on the provider's worker thread, under ``torch.inference_mode()``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inference._core.scoring import ScoreTokens
from inference._inprocess.hf_model import LoadedModel
from inference._inprocess.peft_slots import PeftSlots

__all__ = ["SharedGroup", "score_groups", "shared_context_groups"]

Scored = tuple[float, int, bool]
"""A sequence's summed logprob (NaN when the logits were not usable), its scored tokens, whether all were greedy."""


@dataclass(frozen=True)
class SharedGroup:
    """Sequences that read the same context with the same adapter.

    Attributes:
        adapter_id: The adapter (``None``: the base model).
        context: The tokens before the first scored token.
        members: The sequences' positions in the caller's list.
        continuations: Each member's scored tokens.
    """

    adapter_id: str | None
    context: tuple[int, ...]
    members: tuple[int, ...]
    continuations: tuple[tuple[int, ...], ...]


def shared_context_groups(
    rows: Sequence[tuple[str | None, ScoreTokens]],
) -> tuple[list[SharedGroup], list[int]]:
    """The groups of two or more ``(adapter_id, sequence)`` rows with one context, longest first, and the rows
    left alone (in their order)."""
    found: dict[tuple[str | None, tuple[int, ...]], list[int]] = {}
    for position, (adapter_id, sequence) in enumerate(rows):
        found.setdefault((adapter_id, sequence.tokens[: sequence.start]), []).append(position)
    groups, alone = [], []
    for (adapter_id, context), members in found.items():
        if len(members) < 2:
            alone.extend(members)
            continue
        continuations = tuple(rows[member][1].scored for member in members)
        groups.append(SharedGroup(adapter_id, context, tuple(members), continuations))
    groups.sort(key=lambda group: len(group.context) + max(map(len, group.continuations)), reverse=True)
    return groups, sorted(alone)


def score_groups(
    torch: Any, loaded: LoadedModel, slots: PeftSlots, groups: Sequence[SharedGroup], batch_sizes: deque[int]
) -> dict[int, Scored]:
    """Score every member of ``groups`` in two forward passes: the contexts, then the continuations.

    Returns:
        Per member (its position in the caller's list): summed logprob, scored tokens, all greedy.
    """
    lengths = [len(group.context) for group in groups]
    width = max(lengths)
    ids = torch.full((len(groups), width), loaded.pad_id, dtype=torch.long)
    for row, group in enumerate(groups):
        ids[row, : len(group.context)] = torch.tensor(group.context, dtype=torch.long)
    kept = sorted({length - 1 for length in lengths})
    column = {position: index for index, position in enumerate(kept)}
    with slots.rows(loaded, [(group.adapter_id, ()) for group in groups]) as extra:
        batch_sizes.append(len(groups))
        answer = loaded.model(
            input_ids=ids.to(loaded.device),
            logits_to_keep=torch.tensor(kept, dtype=torch.long, device=loaded.device),
            use_cache=True,
            **extra,
        )
    context_overflow = loaded.overflow.take() if loaded.overflow is not None else None
    first = [answer.logits[row, column[length - 1]] for row, length in enumerate(lengths)]
    owner = [row for row, group in enumerate(groups) for _ in group.continuations]
    continuations = [continuation for group in groups for continuation in group.continuations]
    reads = max(len(continuation) - 1 for continuation in continuations)
    later: Any = None
    later_overflow = None
    if reads > 0:
        past = answer.past_key_values
        past.reorder_cache(torch.tensor(owner, dtype=torch.long, device=loaded.device))  # a copy per continuation
        ids = torch.full((len(owner), reads), loaded.pad_id, dtype=torch.long)
        mask = torch.zeros((len(owner), width + reads), dtype=torch.long)
        positions = torch.zeros((len(owner), reads), dtype=torch.long)
        for row, (source, continuation) in enumerate(zip(owner, continuations, strict=True)):
            ids[row, : len(continuation) - 1] = torch.tensor(continuation[:-1], dtype=torch.long)
            mask[row, : lengths[source]] = 1
            mask[row, width : width + len(continuation) - 1] = 1
            positions[row] = torch.arange(lengths[source], lengths[source] + reads)
        with slots.rows(loaded, [(groups[source].adapter_id, ()) for source in owner]) as extra:
            batch_sizes.append(len(owner))
            later = loaded.model(
                input_ids=ids.to(loaded.device),
                attention_mask=mask.to(loaded.device),
                position_ids=positions.to(loaded.device),
                past_key_values=past,
                use_cache=True,
                **extra,
            ).logits
        later_overflow = loaded.overflow.take() if loaded.overflow is not None else None
    results: dict[int, Scored] = {}
    members = [member for group in groups for member in group.members]
    for row, (source, continuation, member) in enumerate(zip(owner, continuations, members, strict=True)):
        parts = [first[source][None, :]]
        if len(continuation) > 1:
            parts.append(later[row, : len(continuation) - 1])
        row_logits = torch.cat(parts).float()
        targets = torch.tensor(continuation, dtype=torch.long, device=row_logits.device)
        logprobs = torch.log_softmax(row_logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
        greedy = bool((row_logits.argmax(dim=-1) == targets).all())
        lowest, highest = torch.aminmax(row_logits, dim=-1)
        usable = bool(torch.isfinite(highest).all())
        if context_overflow is not None:
            usable = usable and not bool(context_overflow[source])
            usable = usable and not (later_overflow is not None and bool(later_overflow[row]))
        else:
            usable = usable and bool((highest > lowest).all())
        results[member] = (math.fsum(logprobs.double().tolist()) if usable else math.nan, len(targets), greedy)
    return results
