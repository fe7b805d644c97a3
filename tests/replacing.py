"""The replacement half of the "200 generations through 20 replacements" tests, shared by every backend's test."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from inference.exceptions import InvalidAdapterError
from inference.provider import InferenceProvider


async def replace_alternately(
    provider: InferenceProvider,
    adapter_id: str,
    good: Sequence[str],
    bad: Sequence[str],
    *,
    rounds: int = 20,
    pause_s: float = 0.001,
) -> list[str]:
    """Replace ``adapter_id`` ``rounds`` times, a good path then a bad one in turn (each list taken in order, then
    again from its start), pausing ``pause_s`` after each; ``"replaced"`` or ``"refused"`` per round."""
    outcomes = []
    for round_ in range(rounds):
        paths = good if round_ % 2 == 0 else bad
        try:
            await provider.load_adapter(adapter_id, paths[round_ // 2 % len(paths)], replace=True)
            outcomes.append("replaced")
        except InvalidAdapterError:
            outcomes.append("refused")
        await asyncio.sleep(pause_s)
    return outcomes
