"""Log-likelihood metrics of the evaluation runner, and the command line's score, logprobs and schema, on the fake."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from inference.cli import main
from inference.evaluation import EvalPrompt, evaluate_adapters, load_prompts
from inference.evaluation.identity import ResultsFileMismatchError
from inference.exceptions import InvalidRequestError, UnsupportedOperationError
from inference.fake_provider import FakeProvider

PROMPTS = [
    EvalPrompt("q1", "The sky is", expected=" blue"),
    EvalPrompt("q2", "Two plus two is", choices=(" four", " five", " a kitchen chair"), answer=0),
    EvalPrompt("q3", "Water is", expected=" wet", choices=(" dry", " wet"), answer=1),
    EvalPrompt("q4", "Hello"),
]
FAKE = {"provider": "fake", "max_tokens": 4}


class NoScores(FakeProvider):
    supports_scoring = False


async def expected_fields(provider: FakeProvider, adapter_id: str, prompt: EvalPrompt) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if prompt.expected:
        fields["nll_per_token"] = (await provider.score(prompt.prompt, prompt.expected, "", adapter_id)).nll_per_token
    if prompt.choices:
        scores = [await provider.score(prompt.prompt, choice, "", adapter_id) for choice in prompt.choices]
        sums = [score.logprob for score in scores]
        per_char = [score.logprob / len(choice) for score, choice in zip(scores, prompt.choices, strict=True)]
        fields |= {
            "choice_logprobs": sums,
            "predicted": sums.index(max(sums)),
            "predicted_norm": per_char.index(max(per_char)),
            "correct": sums.index(max(sums)) == prompt.answer,
            "correct_norm": per_char.index(max(per_char)) == prompt.answer,
        }
    return fields


async def test_rows_summary_and_csv_carry_nll_and_multiple_choice_accuracy(tmp_path: Path) -> None:
    (tmp_path / "style").mkdir()
    provider = FakeProvider()
    output = tmp_path / "out.jsonl"
    summary = await evaluate_adapters([tmp_path / "style"], PROMPTS, FAKE, output, provider=provider)
    lines = map(json.loads, output.read_text().splitlines())
    rows = {row["prompt_id"]: row for row in lines if row["adapter_id"] == "style"}
    await provider.load_adapter("style", str(tmp_path / "style"))
    expected = {prompt.id: await expected_fields(provider, "style", prompt) for prompt in PROMPTS}
    for prompt in PROMPTS:
        recorded = {key: rows[prompt.id][key] for key in expected[prompt.id]}
        assert recorded == expected[prompt.id]  # the same numbers, through JSON
        assert rows[prompt.id]["output"]  # multiple-choice rows still generate
    assert "nll_per_token" not in rows["q4"] and "predicted" not in rows["q4"]
    (adapter,) = summary.adapters
    nll = [expected[key]["nll_per_token"] for key in ("q1", "q3")]
    assert adapter.nll_per_token == pytest.approx(sum(nll) / 2)
    assert adapter.acc == (expected["q2"]["correct"] + expected["q3"]["correct"]) / 2
    assert adapter.acc_norm == (expected["q2"]["correct_norm"] + expected["q3"]["correct_norm"]) / 2
    base, line = csv.DictReader(summary.csv_path.read_text().splitlines())
    assert base["adapter_id"] == "(base)" and float(base["acc"]) == summary.base.acc
    assert float(line["nll_per_token"]) == pytest.approx(adapter.nll_per_token)
    assert float(line["acc"]) == adapter.acc and float(line["acc_norm"]) == adapter.acc_norm
    assert "nll/token" in summary.format_table() and "acc_norm" in summary.format_table()


async def test_a_resume_keeps_the_metrics_and_changed_choices_are_refused(tmp_path: Path) -> None:
    (tmp_path / "style").mkdir()
    output = tmp_path / "out.jsonl"
    first = await evaluate_adapters([tmp_path / "style"], PROMPTS, FAKE, output)
    again = await evaluate_adapters([tmp_path / "style"], PROMPTS, FAKE, output)
    assert again.rows_resumed == 2 * len(PROMPTS) and again.adapters[0].acc == first.adapters[0].acc  # and the base
    changed = [*PROMPTS[:1], EvalPrompt("q2", "Two plus two is", choices=(" four", " five"), answer=0), *PROMPTS[2:]]
    with pytest.raises(ResultsFileMismatchError, match="q2"):
        await evaluate_adapters([tmp_path / "style"], changed, FAKE, output)


async def test_choices_need_a_provider_that_can_score(tmp_path: Path) -> None:
    (tmp_path / "style").mkdir()
    with pytest.raises(UnsupportedOperationError, match="prompts q2, q3 have 'choices'"):
        await evaluate_adapters([tmp_path / "style"], PROMPTS, FAKE, tmp_path / "out.jsonl", provider=NoScores())
    assert not (tmp_path / "out.jsonl").exists()
    summary = await evaluate_adapters(  # without choices it runs; no NLL without scores
        [tmp_path / "style"], [PROMPTS[0]], FAKE, tmp_path / "plain.jsonl", provider=NoScores()
    )
    assert summary.adapters[0].nll_per_token is None and summary.errors == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"id": 1, "prompt": "p", "choices": ["a"], "answer": 0}, "'choices' must be a list of two or more"),
        ({"id": 1, "prompt": "p", "choices": ["a", "b"], "answer": 2}, r"'answer' must be the index .* 0 to 1"),
        ({"id": 1, "prompt": "p", "choices": ["a", "b"]}, "'answer' must be the index"),
        ({"id": 1, "prompt": "p", "answer": 0}, "'choices' must be a list"),
    ],
)
def test_malformed_choices_are_refused_naming_the_line(tmp_path: Path, line: dict[str, Any], message: str) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(InvalidRequestError, match=f"line 1: {message}"):
        load_prompts(path)


def test_the_score_command_prints_the_score(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["score", "The sky is", " blue today", "--provider", "fake", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["num_tokens"] == 2 and printed["nll_per_token"] == pytest.approx(-printed["logprob"] / 2)
    assert main(["score", "The sky is blue", "--rolling", "--provider", "fake"]) == 0
    assert "nll_per_token" in capsys.readouterr().out
    assert main(["score", "only a context", "--provider", "fake"]) == 2  # a continuation, or --rolling


def test_score_on_a_provider_that_cannot_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["score", "a", "b", "--provider", "ollama", "--base-url", "http://127.0.0.1:9"]) == 1
    error = capsys.readouterr().err
    assert "providers that can" in error and "Traceback" not in error


def test_generate_prints_logprobs_and_honours_a_schema_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "Hi", "--provider", "fake", "--logprobs", "2", "--max-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "logprob" in out and "alternatives" in out
    assert main(["generate", "Hi", "--provider", "fake", "--logprobs", "2", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)["logprobs"]
    assert all(len(entry["top_logprobs"]) == 2 for entry in entries)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
    assert main(["generate", "Hi", "--provider", "fake", "--json-schema", str(schema)]) == 0
    assert isinstance(json.loads(capsys.readouterr().out.strip())["n"], int)


def test_generate_takes_a_conversation_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conversation = tmp_path / "chat.json"
    conversation.write_text(json.dumps([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]))
    assert main(["generate", "--messages", str(conversation), "--provider", "fake"]) == 0
    from_file = capsys.readouterr().out
    assert main(["generate", "U", "--system", "S", "--provider", "fake"]) == 0
    assert capsys.readouterr().out == from_file
    assert main(["generate", "U", "--messages", str(conversation), "--provider", "fake"]) == 2
