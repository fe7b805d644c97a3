"""A row keeps every figure that was computed for it: a failed generation keeps its log-likelihoods, a failed
scoring keeps its generation and score; the summary averages each figure over the rows that have it, and compares
each adapter with the base model over the prompts where both have the figure. On the fake provider."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from inference._core.validation import GenerationRequest, ScoreRequest
from inference.evaluation import BASE_MODEL_ID, EvalPrompt, evaluate_adapters, read_rows
from inference.exceptions import ProviderError
from inference.fake_provider import FakeProvider
from inference.provider import GenerationResult
from inference.results import ScoreResult

FAKE = {"provider": "fake", "max_tokens": 3}
PROMPTS = [
    EvalPrompt(f"q{n}", f"question {n}", expected=" alpha", choices=(" yes", " no"), answer=n % 2) for n in range(5)
]


class Failing(FakeProvider):
    """Adapter a1 fails: q1's generation; q2's score of the choice " no"; q4's generation and every score."""

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        text = str(request.messages)
        if request.adapter_id == "a1" and ("question 1" in text or "question 4" in text):
            raise ProviderError("the generation timed out", provider="fake")
        return await super()._generate(request)

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        if request.adapter_id == "a1" and (
            (request.context == "question 2" and request.continuation == " no") or request.context == "question 4"
        ):
            raise ProviderError("the scoring failed", provider="fake")
        return await super()._score(request)


def squared(output: str, expected: object, row: Mapping[str, Any]) -> float:
    """The prompt's number squared, plus one for the adapter: its true difference from the base is 1 everywhere."""
    number = int(str(row["prompt_id"])[1:])
    return number**2 + (1.0 if row["adapter_id"] == "a1" else 0.0)


def paired_delta(rows: Sequence[Mapping[str, Any]], field: str) -> float:
    """a1's mean of ``field`` minus the base model's, over the prompts where both rows have it."""
    values: dict[str, dict[str, float]] = {"a1": {}, BASE_MODEL_ID: {}}
    for row in rows:
        if row.get(field) is not None:
            values[str(row["adapter_id"])][str(row["prompt_id"])] = float(row[field])
    shared = sorted(set(values["a1"]) & set(values[BASE_MODEL_ID]))
    return sum(values["a1"][p] - values[BASE_MODEL_ID][p] for p in shared) / len(shared)


async def test_a_failed_stage_keeps_the_figures_of_the_others_and_the_deltas_compare_the_same_prompts(
    tmp_path: Path,
) -> None:
    (tmp_path / "a1").mkdir()
    output = tmp_path / "results.jsonl"
    summary = await evaluate_adapters(
        [tmp_path / "a1"], PROMPTS, FAKE, output, provider=Failing(), mode="generate", scorer=squared
    )
    rows = read_rows(output)
    mine = {row["prompt_id"]: row for row in rows if row["adapter_id"] == "a1"}
    clean = await evaluate_adapters(
        [tmp_path / "a1"], PROMPTS, FAKE, tmp_path / "clean.jsonl", provider=FakeProvider(), scorer=squared
    )
    reference = {row["prompt_id"]: row for row in read_rows(clean.output) if row["adapter_id"] == "a1"}

    # The generation failed: the log-likelihood figures scored before it are kept, as a clean run has them.
    assert mine["q1"]["error"]["stage"] == "generate" and mine["q1"]["output"] is None
    for field in ("nll_per_token", "choice_logprobs", "predicted", "correct", "correct_norm"):
        assert mine["q1"][field] == reference["q1"][field], field
    # One choice's score failed: the generation, its score and the expected answer's NLL are kept.
    assert mine["q2"]["error"]["stage"] == "score" and mine["q2"]["error"]["message"] == "the scoring failed"
    assert mine["q2"]["output"] == reference["q2"]["output"] and mine["q2"]["score"] == 5.0
    assert mine["q2"]["nll_per_token"] == reference["q2"]["nll_per_token"] and "correct" not in mine["q2"]
    # Both failed: the generation's error is the row's, the scoring's is kept beside it.
    assert mine["q4"]["error"]["stage"] == "generate"
    assert mine["q4"]["likelihood_error"] == {
        "stage": "score", "type": "ProviderError", "message": "the scoring failed"
    }

    a1 = summary.adapters[0]
    assert (a1.rows, a1.errors, a1.scored) == (5, 3, 3)  # every failed row is counted; q0, q2, q3 have a score
    assert a1.score == pytest.approx((1 + 5 + 10) / 3)
    nll = [mine[p]["nll_per_token"] for p in ("q0", "q1", "q2", "q3")]
    assert a1.nll_per_token == pytest.approx(sum(nll) / 4)
    assert a1.acc == pytest.approx(sum(bool(mine[p]["correct"]) for p in ("q0", "q1", "q3")) / 3)
    # The scorer's true difference is 1 on every prompt: measured over the same prompts, the delta says so (a1's
    # mean over q0 and q3 against the base model's over all five made it -0.5).
    assert a1.score_delta == pytest.approx(1.0)
    for field, figure in (("nll_per_token", "nll_per_token_delta"), ("correct", "acc_delta")):
        assert getattr(a1, figure) == pytest.approx(paired_delta(rows, field)), figure
    assert summary.base is not None and summary.base.errors == 0
