"""Score sequences that share a context on a Transformers model: the context once, the continuations branched.

A multiple-choice item scores one context with N continuations, and an evaluation sends them as N score calls.
:func:`shared_context_groups` finds, among a batch's sequences, those with the same adapter and the same tokens
before their first scored token; :func:`score_groups` packs each group into one row (the context, then every
continuation) and scores all the groups' members in one right-padded forward pass, a 4D attention mask keeping
each continuation to the context and itself, its position ids going on after the context. The context is read
once, no keys and values are copied, and a row holds no padding between its continuations. lm-eval shares
contexts only for one-token answers; here any continuation branches.

Everything here runs on the provider's worker thread, under ``torch.inference_mode()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inference._core.scoring import ScoreTokens
from inference._inprocess.hf_logprobs import Scored, read_scores
from inference._inprocess.hf_model import LoadedModel
from inference._inprocess.peft_slots import PeftSlots

__all__ = ["SharedGroup", "score_groups", "shared_context_groups"]

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
    rows: Sequence[tuple[str | None, ScoreTokens]], limit: int | None
) -> tuple[list[SharedGroup], list[int]]:
    """The groups of two or more ``(adapter_id, sequence)`` rows with one context, longest first, and the rows
    left alone (in their order).

    Args:
        rows: The sequences to score, each with its adapter.
        limit: The longest packed row (:func:`packed_length`) a group may have (:func:`packing_limit`); a group
            beyond it is left alone, and so is every row when ``limit`` is ``None``.
    """
    found: dict[tuple[str | None, tuple[int, ...]], list[int]] = {}
    for position, (adapter_id, sequence) in enumerate(rows):
        found.setdefault((adapter_id, sequence.tokens[: sequence.start]), []).append(position)
    groups, alone = [], []
    for (adapter_id, context), members in found.items():
        continuations = tuple(rows[member][1].scored for member in members)
        group = SharedGroup(adapter_id, context, tuple(members), continuations)
        if len(members) < 2 or limit is None or packed_length(group) > limit:
            alone.extend(members)
        else:
            groups.append(group)
    groups.sort(key=packed_length, reverse=True)
    return groups, sorted(alone)


def packed_length(group: SharedGroup) -> int:
    """The tokens of ``group``'s packed row: its context, then each continuation but its last token."""
    return len(group.context) + sum(len(continuation) - 1 for continuation in group.continuations)


def packing_limit(loaded: LoadedModel) -> int | None:
    """The longest packed row the model reads correctly (its sliding window: one mask serves every layer), or
    ``None`` when its attention takes no prepared mask (then contexts are not shared)."""
    config = getattr(loaded.base_model, "config", None)
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return None
    layer_types = getattr(config, "layer_types", None) or ()
    window = getattr(config, "sliding_window", None)
    sliding = any("sliding" in str(kind) for kind in layer_types) or bool(getattr(config, "use_sliding_window", False))
    limit = loaded.context if loaded.context is not None else 1 << 30
    return min(limit, int(window)) if sliding and window else limit


def score_groups(
    torch: Any, loaded: LoadedModel, slots: PeftSlots, groups: Sequence[SharedGroup], batch_sizes: deque[int]
) -> dict[int, Scored]:
    """Score every member of ``groups`` in one forward pass, a row per group.

    A group's row is its context, then each continuation's tokens but the last, one after the other; a 4D mask
    lets each continuation see the context and itself only (the other continuations are hidden), and its position
    ids go on after the context, so each continuation reads what it would read alone. The first scored token's
    logprob comes from the context's last position, the others from the continuation's own positions.

    Returns:
        Per member (its position in the caller's list): summed logprob, scored tokens, all greedy.
    """
    rows: list[tuple[list[int], list[int], list[int]]] = []  # per group: tokens, segment per token, positions
    for group in groups:
        tokens, segments, positions = list(group.context), [-1] * len(group.context), list(range(len(group.context)))
        for number, continuation in enumerate(group.continuations):
            reads = continuation[:-1]
            tokens.extend(reads)
            segments.extend([number] * len(reads))
            positions.extend(range(len(group.context), len(group.context) + len(reads)))
        rows.append((tokens, segments, positions))
    width = max(len(tokens) for tokens, _, _ in rows)
    ids = torch.full((len(rows), width), loaded.pad_id, dtype=torch.long)
    segment = torch.full((len(rows), width), -2, dtype=torch.long)  # -1: context, -2: padding
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (tokens, segments, positions) in enumerate(rows):
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        segment[row, : len(tokens)] = torch.tensor(segments, dtype=torch.long)
        position_ids[row, : len(tokens)] = torch.tensor(positions, dtype=torch.long)
    index = torch.arange(width)
    query, key = segment[:, :, None], segment[:, None, :]
    seen = (index[None, :] <= index[:, None])[None] & ((key == -1) | (key == query))
    seen |= (query == -2) & (index[None, :] == index[:, None])[None]  # padding sees itself (no all-hidden row)
    mask = seen[:, None]
    if getattr(loaded.base_model.config, "_attn_implementation", "sdpa") == "eager":  # an additive mask
        mask = torch.zeros(mask.shape, dtype=loaded.base_model.dtype).masked_fill(
            ~mask, torch.finfo(loaded.base_model.dtype).min
        )
    wanted: list[list[tuple[int, int]]] = []  # per member: (row, position that predicts each scored token)
    for row, group in enumerate(groups):
        last = len(group.context) - 1
        begin = len(group.context)
        for continuation in group.continuations:
            count = len(continuation) - 1
            wanted.append([(row, last)] + [(row, begin + step) for step in range(count)])
            begin += count
    kept = sorted({position for member in wanted for _, position in member})
    column = {position: number for number, position in enumerate(kept)}
    with slots.rows(loaded, [(group.adapter_id, ()) for group in groups]) as extra:
        batch_sizes.append(len(groups))
        logits = loaded.model(
            input_ids=ids.to(loaded.device),
            attention_mask=mask.to(loaded.device),
            position_ids=position_ids.to(loaded.device),
            logits_to_keep=torch.tensor(kept, dtype=torch.long, device=loaded.device),
            use_cache=False,
            **extra,
        ).logits
    overflowed = loaded.overflow.take() if loaded.overflow is not None else None
    members = [member for group in groups for member in group.members]
    continuations = [continuation for group in groups for continuation in group.continuations]
    picks = [
        (places[0][0], [column[position] for _, position in places], continuation)
        for continuation, places in zip(continuations, wanted, strict=True)
    ]
    return dict(zip(members, read_scores(torch, logits, picks, overflowed), strict=True))
