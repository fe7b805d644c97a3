"""What a results file records as its experiment's settings, and so what a resumed run must repeat; on the fake
provider."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.evaluation import EvalPrompt, ResultsFileMismatchError, evaluate_adapters, read_rows

PROMPTS = [EvalPrompt("q1", "hello", expected="x"), EvalPrompt("q2", "world", expected="y")]


async def test_a_run_resumes_with_another_timeout_even_in_a_file_that_recorded_one(tmp_path: Path) -> None:
    """Raising the timeout and running again is how timed-out rows are retried: the timeout is no experiment
    setting, and neither is return_token_ids (no row records token ids); logprobs still is."""
    (tmp_path / "a1").mkdir()
    output = tmp_path / "results.jsonl"
    first = await evaluate_adapters([tmp_path / "a1"], PROMPTS, {"provider": "fake", "timeout": 30}, output)
    assert first.rows_written == 4
    assert all("timeout" not in row["settings"] for row in read_rows(output))
    for config in ({"timeout": 60}, {}, {"timeout": 5, "return_token_ids": True}):
        again = await evaluate_adapters([tmp_path / "a1"], PROMPTS, {"provider": "fake", **config}, output)
        assert (again.rows_written, again.rows_resumed) == (0, 4), config

    # A file written by the version that recorded them resumes with any timeout, or none.
    rows = read_rows(output)
    for row in rows:
        row["settings"] |= {"timeout": 30.0, "return_token_ids": False}
    output.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for config in ({"timeout": 60}, {}):
        again = await evaluate_adapters([tmp_path / "a1"], PROMPTS, {"provider": "fake", **config}, output)
        assert (again.rows_written, again.rows_resumed) == (0, 4), config

    with pytest.raises(ResultsFileMismatchError, match=r"logprobs was null, now 2"):
        await evaluate_adapters([tmp_path / "a1"], PROMPTS, {"provider": "fake", "logprobs": 2}, output)
