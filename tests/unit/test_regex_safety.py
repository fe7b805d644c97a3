"""Which regular expressions in a PEFT config are refused as exponential to match, and which real ones pass."""

from __future__ import annotations

import pytest

from inference.adapters.regex_safety import repeats_a_repetition

# target_modules and pattern keys as people write them (PEFT's docs, fine-tuning scripts): all linear to match
REAL = [
    r".*\.(q_proj|v_proj)",
    r"^(?!.*vision).*\.(q|k|v|o)_proj$",
    r"model\.layers\.\d+\.self_attn\.(q|k|v)_proj",
    r".*layers\.(0|1|2)\..*(q|v)_proj",
    r"(\w+\.)*q_proj",
    r"(?:[a-z_]+\.)+(?:q_proj|v_proj)",
    r"([^.]+\.)*v_proj",
    r"(\d+\.)+x",
    r"(a{2})*",
    r"(.*\.)?(q_proj)$",
]
BOMBS = [
    r"(.*.*)*X", r"(a+)+$", r"(x{1,3})*y", r"(.*\.)*q", r"(\w+\.?)*q", r"((a|b)+)*c",
    # what a reviewer found the first exemption let through (each hung on a module name for over a minute)
    r"([^.]*.[^.]*.[^.]*\.)*Q", r"([^.]*[^.]*[^.]*\.)*Q", r"([\w.]*){6}Q", r"(?i)([a-z]+X)*y",
]


@pytest.mark.parametrize("pattern", REAL)
def test_patterns_people_write_are_accepted(pattern: str) -> None:
    assert not repeats_a_repetition(pattern)


@pytest.mark.parametrize("pattern", BOMBS)
def test_a_repetition_inside_a_repetition_that_can_trade_characters_is_refused(pattern: str) -> None:
    assert repeats_a_repetition(pattern)
