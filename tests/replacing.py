"""The replacement half of the "200 generations through 20 replacements" tests, shared by every backend's test."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

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
    outcomes: list[str] | None = None,
) -> list[str]:
    """Replace ``adapter_id`` ``rounds`` times, a good path then a bad one in turn (each list taken in order, then
    again from its start), pausing ``pause_s`` after each; ``"replaced"`` or ``"refused"`` per round, appended to
    ``outcomes`` (when given) as each round ends, so that generations can pace themselves with `after_rounds`."""
    outcomes = [] if outcomes is None else outcomes
    for round_ in range(rounds):
        paths = good if round_ % 2 == 0 else bad
        try:
            await provider.load_adapter(adapter_id, paths[round_ // 2 % len(paths)], replace=True)
            outcomes.append("replaced")
        except InvalidAdapterError:
            outcomes.append("refused")
        await asyncio.sleep(pause_s)
    return outcomes


async def after_rounds(outcomes: list[str], count: int, *, timeout_s: float = 120.0) -> None:
    """Wait until ``count`` replacement rounds have ended (``outcomes`` is the list `replace_alternately` fills).

    A batch of generations that waits for round ``2k`` before it starts runs on a version at least ``k`` replacements
    on, however fast or slow this machine is: the batches are sure to span several versions.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s  # (no asyncio.timeout: the tests run on 3.10 too)
    while len(outcomes) < count:
        assert asyncio.get_running_loop().time() < deadline, f"{count} replacement rounds did not end in {timeout_s} s"
        await asyncio.sleep(0.001)


def bad_adapter_paths(directory: Path) -> list[str]:
    """Two paths a replacement must refuse: one that does not exist, and a directory that holds no adapter."""
    not_an_adapter = directory / "not-an-adapter"
    not_an_adapter.mkdir()
    (not_an_adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    return [str(directory / "missing"), str(not_an_adapter)]
