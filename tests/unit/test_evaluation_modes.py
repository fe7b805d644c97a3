"""The evaluation runner's score-only mode, batched scoring, the base model's reference row, in-memory adapters,
the best adapter per figure, and the progress rate; on the fake provider (the real providers are in
tests/integration/test_evaluation_scoring.py)."""

from __future__ import annotations

import csv
import errno
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest

from inference import AdapterWeights
from inference.evaluation import (
    BASE_MODEL_ID,
    AdapterSpec,
    EvalPrompt,
    EvaluationSummary,
    Progress,
    ResultsFileMismatchError,
    TerminalProgress,
    adapter_hash,
    evaluate_adapters,
    read_rows,
)
from inference.evaluation import runner as runner_module
from inference.evaluation.scoring import Scorer
from inference.exceptions import ConfigurationError, InvalidRequestError, UnsupportedOperationError
from inference.fake_provider import FakeProvider
from inference.results import ScoreItem

FAKE = {"provider": "fake", "max_tokens": 4}
PROMPTS = [
    EvalPrompt("q1", "The sky is", expected=" blue"),
    EvalPrompt("q2", "Two plus two is", choices=(" four", " five", " a kitchen chair"), answer=0),
    EvalPrompt("q3", "Water is", expected=" wet", choices=(" dry", " wet"), answer=1),
]
MULTIPLE_CHOICE = [
    EvalPrompt(f"m{i}", f"Question {i}:", choices=(" yes", " no", " maybe", " never"), answer=i % 4) for i in range(5)
]
LIKELIHOOD_FIELDS = ("nll_per_token", "choice_logprobs", "predicted", "predicted_norm", "correct", "correct_norm")


class Recording(FakeProvider):
    """The fake provider, recording its generations, its score_batch calls (their sizes) and its loads."""

    def __init__(self) -> None:
        super().__init__()
        self.generated: list[str | None] = []
        self.batches: list[tuple[str | None, int, int]] = []  # adapter, pairs, max_concurrency
        self.loaded: list[str] = []

    async def generate(self, prompt: Any, model: str = "", adapter_id: Any = None, **options: Any) -> Any:
        self.generated.append(adapter_id)
        return await super().generate(prompt, model, adapter_id, **options)

    async def score_batch(
        self,
        pairs: Sequence[tuple[str, str]],
        model: str,
        adapter_id: str | None = None,
        *,
        max_concurrency: int = 8,
        on_result: Callable[[int, ScoreItem], object] | None = None,
    ) -> list[ScoreItem]:
        self.batches.append((adapter_id, len(pairs), max_concurrency))
        return await super().score_batch(
            pairs, model, adapter_id, max_concurrency=max_concurrency, on_result=on_result
        )

    async def _load_adapter(self, adapter_id: str, adapter_path: str) -> None:
        self.loaded.append(adapter_id)
        await super()._load_adapter(adapter_id, adapter_path)


class InProcessFake(Recording):
    runs_in_process = True


def adapters(root: Path, names: Sequence[str]) -> list[Path]:
    paths = []
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "adapter_config.json").write_text(json.dumps({"name": name}))
        paths.append(root / name)
    return paths


def by_pair(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["adapter_id"], row["prompt_id"]): row for row in read_rows(path)}


def weights(seed: int, scale: float = 1.0) -> AdapterWeights:
    generator = np.random.default_rng(seed)
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    return AdapterWeights(
        {
            f"{prefix}.lora_A.weight": (generator.standard_normal((2, 8)) * scale).astype("float32"),
            f"{prefix}.lora_B.weight": (generator.standard_normal((8, 2)) * scale).astype("float32"),
        },
        {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]},
    )


# Score-only ---------------------------------------------------------------------------------------------------


async def test_score_only_writes_the_likelihoods_of_a_generating_run_without_generating(tmp_path: Path) -> None:
    paths = adapters(tmp_path, ["a1", "a2"])
    generated = await evaluate_adapters(paths, PROMPTS, FAKE, tmp_path / "gen.jsonl", mode="generate")
    provider = Recording()
    scored = await evaluate_adapters(paths, PROMPTS, FAKE, tmp_path / "score.jsonl", provider=provider, mode="score")
    assert provider.generated == []  # not one generation, not even the warm-up
    assert (generated.mode, scored.mode) == ("generate", "score")
    with_generation, only_scores = by_pair(tmp_path / "gen.jsonl"), by_pair(tmp_path / "score.jsonl")
    assert set(only_scores) == set(with_generation)  # the same pairs, the base model's included
    for key, row in only_scores.items():
        assert {name: row.get(name) for name in LIKELIHOOD_FIELDS} == {
            name: with_generation[key].get(name) for name in LIKELIHOOD_FIELDS
        }
        assert row["output"] is None and row["latency_s"] is None and row["error"] is None
        assert row["settings"]["mode"] == "score" and "max_tokens" not in row["settings"]
    for adapter, reference in zip(scored.adapters, generated.adapters, strict=True):
        assert (adapter.nll_per_token, adapter.acc, adapter.acc_norm) == (
            reference.nll_per_token,
            reference.acc,
            reference.acc_norm,
        )
        assert adapter.mean_latency_s is None and adapter.generate_s == 0.0 and (adapter.score_s or 0) > 0
    assert all((adapter.generate_s or 0) > 0 and adapter.score_s is not None for adapter in generated.adapters)
    table = scored.format_table().splitlines()
    assert table[0].split() == ["adapter", "rows", "nll/token", "acc", "acc_norm", "errors"]  # nothing generated
    with open(scored.csv_path, newline="", encoding="utf-8") as handle:
        lines = list(csv.DictReader(handle))
    assert [line["adapter_id"] for line in lines] == [BASE_MODEL_ID, "a1", "a2"]
    assert all(float(line["score_s"]) > 0 for line in lines) and lines[1]["generate_s"] == "0.0"


async def test_every_row_s_choices_and_answers_go_to_the_provider_in_one_batch_per_adapter(tmp_path: Path) -> None:
    paths = adapters(tmp_path, ["a1", "a2"])
    server = Recording()
    await evaluate_adapters(paths, MULTIPLE_CHOICE + PROMPTS, FAKE, tmp_path / "r.jsonl", provider=server)
    pairs = 5 * 4 + (1 + 3 + 3)  # every choice of every row, and every expected answer
    assert server.batches == [(None, pairs, 4), ("a1", pairs, 4), ("a2", pairs, 4)]  # a server: --concurrency
    in_process = InProcessFake()
    await evaluate_adapters(paths, MULTIPLE_CHOICE, FAKE, tmp_path / "r2.jsonl", provider=in_process)
    assert in_process.batches == [(None, 20, 20), ("a1", 20, 20), ("a2", 20, 20)]  # all at once: it batches them


async def test_auto_scores_only_when_nothing_would_use_a_generation(tmp_path: Path) -> None:
    paths = adapters(tmp_path, ["a1"])
    provider = Recording()
    summary = await evaluate_adapters(paths, MULTIPLE_CHOICE, FAKE, tmp_path / "mc.jsonl", provider=provider)
    assert summary.mode == "score" and provider.generated == []
    assert all(row["settings"]["mode"] == "score" for row in read_rows(tmp_path / "mc.jsonl"))
    for prompts, scorer in ((MULTIPLE_CHOICE, "exact"), (PROMPTS, None)):  # a scorer, or a prompt without choices
        output = tmp_path / f"{scorer}-{len(prompts)}.jsonl"
        generated = await evaluate_adapters(paths, prompts, FAKE, output, scorer=scorer)
        assert generated.mode == "generate" and "mode" not in read_rows(output)[0]["settings"]


async def test_score_only_refuses_what_it_cannot_score_before_anything_runs(tmp_path: Path) -> None:
    paths = adapters(tmp_path, ["a1"])
    output = tmp_path / "r.jsonl"
    with pytest.raises(InvalidRequestError, match=r"a scorer judges generated text.*mode='generate'"):
        await evaluate_adapters(paths, PROMPTS, FAKE, output, mode="score", scorer="exact")
    with pytest.raises(InvalidRequestError, match=r"prompts plain have neither 'expected' nor 'choices'"):
        await evaluate_adapters(paths, [*PROMPTS, EvalPrompt("plain", "Hi")], FAKE, output, mode="score")

    class NoScores(FakeProvider):
        supports_scoring = False

    with pytest.raises(UnsupportedOperationError, match="a score-only evaluation needs a provider that can score"):
        await evaluate_adapters(paths, PROMPTS[:1], FAKE, output, mode="score", provider=NoScores())
    with pytest.raises(InvalidRequestError, match="mode must be one of auto, generate, score"):
        await evaluate_adapters(paths, PROMPTS, FAKE, output, mode="fast")
    with pytest.raises(InvalidRequestError, match=r"got 0: to score .* mode='score' \(inference eval --score-only\)"):
        await evaluate_adapters(paths, PROMPTS, {**FAKE, "max_tokens": 0}, output)
    assert not output.exists()


async def test_a_file_of_one_mode_is_not_resumed_in_the_other(tmp_path: Path) -> None:
    paths = adapters(tmp_path, ["a1"])
    output = tmp_path / "r.jsonl"
    await evaluate_adapters(paths, PROMPTS, FAKE, output, mode="score")
    with pytest.raises(ResultsFileMismatchError, match=r'mode was "score", now "generate"'):
        await evaluate_adapters(paths, PROMPTS, FAKE, output, mode="generate")
    again = await evaluate_adapters(paths, PROMPTS, {**FAKE, "max_tokens": 99}, output, mode="score")
    assert again.rows_written == 0  # generation settings do not decide a score-only row
    resumed = await evaluate_adapters(paths, PROMPTS, FAKE, output)  # the default follows the file: score-only
    assert resumed.mode == "score" and resumed.rows_written == 0
    before = output.read_bytes()
    with pytest.raises(InvalidRequestError, match="prompts plain have neither 'expected' nor 'choices'"):
        await evaluate_adapters(paths, [*PROMPTS, EvalPrompt("plain", "Hi")], FAKE, output)  # it would get no row
    assert output.read_bytes() == before


async def test_a_full_disk_during_score_only_stops_the_run_and_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """score_batch logs and swallows its on_result callback's errors: the runner must not lose a full disk there."""
    paths = adapters(tmp_path, ["a1"])
    output = tmp_path / "r.jsonl"
    opened = os.fdopen

    class FullDisk:
        def __init__(self, handle: Any) -> None:
            self._handle = handle

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._handle, name)

    monkeypatch.setattr(os, "fdopen", lambda *args, **kwargs: FullDisk(opened(*args, **kwargs)))
    with pytest.raises(ConfigurationError, match=f"cannot write to the results file {output}: No space left"):
        await evaluate_adapters(paths, MULTIPLE_CHOICE, FAKE, output, mode="score")


# Results files written before the score-only mode and the base model's row -----------------------------------

OLD_ROWS = """\
{"adapter_id": "a1", "adapter_path": "{root}/a1", "adapter_hash": "d557ea8f26fa9924", "prompt_id": "q3", "prompt_hash": "fb7172f510a67841", "output": "[a1] kilo quebec sierra hotel", "prompt_tokens": 1, "completion_tokens": 4, "finish_reason": "length", "latency_s": 0.00023, "error": null, "score": null, "settings": {"provider": "fake", "base_model": {}, "max_tokens": 4, "model": "", "scorer": "exact"}}
{"adapter_id": "a1", "adapter_path": "{root}/a1", "adapter_hash": "d557ea8f26fa9924", "prompt_id": "q1", "prompt_hash": "2b8aa796b1dddb44", "output": "[a1] oscar foxtrot juliet november", "prompt_tokens": 3, "completion_tokens": 4, "finish_reason": "length", "latency_s": 0.00036, "error": null, "score": 0.0, "settings": {"provider": "fake", "base_model": {}, "max_tokens": 4, "model": "", "scorer": "exact"}, "nll_per_token": 6.322815544903278}
{"adapter_id": "a1", "adapter_path": "{root}/a1", "adapter_hash": "d557ea8f26fa9924", "prompt_id": "q2", "prompt_hash": "4013423a48c8b799", "output": "[a1] whiskey india juliet uniform", "prompt_tokens": 4, "completion_tokens": 4, "finish_reason": "length", "latency_s": 0.000261, "error": null, "score": null, "settings": {"provider": "fake", "base_model": {}, "max_tokens": 4, "model": "", "scorer": "exact"}, "choice_logprobs": [-4.986923411488533, -6.256654836237431, -14.95582496933639], "predicted": 0, "predicted_norm": 2, "correct": true, "correct_norm": false}
{"adapter_id": "a2", "adapter_path": "{root}/a2", "adapter_hash": "b3dc7ef724703870", "prompt_id": "q3", "prompt_hash": "fb7172f510a67841", "output": "[a2] delta india oscar juliet", "prompt_tokens": 1, "completion_tokens": 4, "finish_reason": "length", "latency_s": 0.000196, "error": null, "score": null, "settings": {"provider": "fake", "base_model": {}, "max_tokens": 4, "model": "", "scorer": "exact"}}
{"adapter_id": "a2", "adapter_path": "{root}/a2", "adapter_hash": "b3dc7ef724703870", "prompt_id": "q1", "prompt_hash": "2b8aa796b1dddb44", "output": "[a2] kilo golf whiskey india", "prompt_tokens": 3, "completion_tokens": 4, "finish_reason": "length", "latency_s": 0.000328, "error": null, "score": 0.0, "settings": {"provider": "fake", "base_model": {}, "max_tokens": 4, "model": "", "scorer": "exact"}, "nll_per_token": 6.787964917719364}
"""  # noqa: E501 - written by the runner before this change (main at fe7f003), adapter folders moved to {root}
OLD_PROMPTS = [
    EvalPrompt("q1", "The sky is", expected=" blue"),
    EvalPrompt("q2", "Two plus two is", choices=(" four", " five", " a kitchen chair"), answer=0),
    EvalPrompt("q3", "Hello"),
]


def old_adapters(root: Path) -> list[Path]:
    for name, config in (("a1", "{}\n"), ("a2", '{"r": 2}\n')):  # the files the old rows' hashes were made of
        (root / name).mkdir(parents=True)
        (root / name / "adapter_config.json").write_text(config)
    return [root / "a1", root / "a2"]


async def test_a_results_file_written_before_the_score_only_mode_and_the_base_row_resumes(tmp_path: Path) -> None:
    paths = old_adapters(tmp_path / "adapters")
    assert [adapter_hash(path) for path in paths] == ["d557ea8f26fa9924", "b3dc7ef724703870"]
    output = tmp_path / "old.jsonl"
    old = OLD_ROWS.replace("{root}", str(tmp_path / "adapters"))
    output.write_text(old)
    provider = Recording()
    summary = await evaluate_adapters(paths, OLD_PROMPTS, FAKE, output, scorer="exact", provider=provider)
    assert output.read_text().startswith(old)  # the old rows are kept as they are, and reused
    assert (summary.rows_resumed, summary.rows_written) == (5, 1 + 3)  # a2's missing q2, and the base model's rows
    assert provider.loaded == ["a2"] and summary.mode == "generate"
    a1, a2 = summary.adapters
    assert (a1.acc, a1.nll_per_token, a2.nll_per_token) == (1.0, 6.322815544903278, 6.787964917719364)
    assert summary.base is not None and summary.base.rows == 3 and a1.acc_delta == 1.0 - (summary.base.acc or 0)
    # The default mode follows the file: a multiple-choice file written by a generating run goes on generating.
    mc_output = tmp_path / "old-mc.jsonl"
    mc_output.write_text(old.splitlines()[2] + "\n")
    resumed = await evaluate_adapters(paths[:1], OLD_PROMPTS[1:2], FAKE, mc_output, scorer="exact", base=False)
    assert (resumed.mode, resumed.rows_resumed, resumed.rows_written) == ("generate", 1, 0)


# The base model's reference row -------------------------------------------------------------------------------


async def test_each_adapter_is_compared_with_the_base_model(tmp_path: Path) -> None:
    paths = adapters(tmp_path, ["a1", "a2", "a3"])
    provider = Recording()
    summary = await evaluate_adapters(paths, PROMPTS, FAKE, tmp_path / "r.jsonl", provider=provider)
    base = summary.base
    assert base is not None and base.adapter_id == BASE_MODEL_ID and base.adapter_path is None
    assert provider.loaded == ["a1", "a2", "a3"] and provider.generated.count(None) == 1 + len(PROMPTS)  # warm-up
    for adapter in summary.adapters:
        assert adapter.acc_delta == pytest.approx((adapter.acc or 0) - (base.acc or 0))
        assert adapter.nll_per_token_delta == pytest.approx((adapter.nll_per_token or 0) - (base.nll_per_token or 0))
        assert adapter.score_delta is None  # no scorer
    table = summary.format_table().splitlines()
    assert table[1].startswith("(base) ") and f"({summary.adapters[0].acc_delta:+.3f})" in table[2]
    without = await evaluate_adapters(paths, PROMPTS, FAKE, tmp_path / "no-base.jsonl", base=False)
    assert without.base is None and without.adapters[0].acc_delta is None
    assert BASE_MODEL_ID not in {row["adapter_id"] for row in read_rows(tmp_path / "no-base.jsonl")}
    assert without.rows_total == 3 * len(PROMPTS)


# The best adapter per figure ----------------------------------------------------------------------------------


async def test_best_answers_per_figure_with_its_direction_and_none_without_the_figure(tmp_path: Path) -> None:
    paths = adapters(tmp_path, ["a1", "a2", "a3", "a4"])
    summary = await evaluate_adapters(paths, PROMPTS, FAKE, tmp_path / "r.jsonl")
    nll = {adapter.adapter_id: adapter.nll_per_token for adapter in summary.adapters}
    assert len(set(nll.values())) == 4
    assert [adapter.adapter_id for adapter in summary.ranked("nll_per_token")] == sorted(nll, key=lambda a: nll[a])
    best = summary.best("nll_per_token")
    assert best is not None and best.nll_per_token == min(nll.values())  # lower is better
    accuracies = [adapter.acc for adapter in summary.adapters]
    best_acc = summary.best("acc")
    assert best_acc is not None and best_acc.acc == max(accuracies)  # higher is better
    assert best_acc is next(adapter for adapter in summary.adapters if adapter.acc == max(accuracies))  # ties: first
    # No scorer: no adapter has a score. The documented recipe used to be max(..., key=lambda a: a.score or 0),
    # which returned the first adapter; best() says there is none.
    assert summary.best("score") is None and summary.ranked("score") == []
    with pytest.raises(InvalidRequestError, match="unknown metric 'accuracy'"):
        summary.best("accuracy")
    table = summary.format_table(sort_by="nll_per_token").splitlines()
    ranked = [adapter.adapter_id for adapter in summary.ranked("nll_per_token")]
    assert [line.split()[0] for line in table[2:6]] == ranked
    text = "\n".join(table)
    assert f"best nll/token: {best.adapter_id} {best.nll_per_token:.3f} (lower is better; base model" in text
    best_line = {"adapter_id": best_acc.adapter_id, "value": best_acc.acc, "better": "higher"}
    assert summary.to_dict()["best"]["acc"] == best_line


def test_best_of_a_summary_without_adapters_is_none() -> None:
    summary = EvaluationSummary((), Path("r.jsonl"), Path("r.summary.csv"), 0, 0, 0, 0.0)
    assert summary.best("acc") is None
    assert summary.format_table().splitlines() == ["adapter  rows  score  latency_s  tokens/s  errors"]


# Adapters in memory -------------------------------------------------------------------------------------------


async def test_weights_in_memory_are_evaluated_and_resumed_by_their_content(tmp_path: Path) -> None:
    output = tmp_path / "r.jsonl"
    specs = [AdapterSpec("task-1", weights=weights(1)), AdapterSpec("task-2", weights=weights(2))]
    first = await evaluate_adapters(specs, PROMPTS, FAKE, output)  # before: TypeError from os.fspath
    assert [adapter.adapter_id for adapter in first.adapters] == ["task-1", "task-2"]
    assert [adapter.adapter_hash for adapter in first.adapters] == [adapter_hash(weights(1)), adapter_hash(weights(2))]
    assert all(adapter.adapter_path is None and adapter.errors == 0 for adapter in first.adapters)
    rows = by_pair(output)
    assert rows[("task-1", "q1")]["adapter_path"] is None and rows[("task-1", "q1")]["output"].startswith("[task-1]")
    # A hypernetwork loop run again makes new objects with the same values: their rows are reused.
    again = await evaluate_adapters(
        [AdapterSpec("task-1", weights=weights(1)), AdapterSpec("task-2", weights=weights(2))], PROMPTS, FAKE, output
    )
    assert (again.rows_written, again.rows_resumed) == (0, 3 * len(PROMPTS))
    assert [adapter.acc for adapter in again.adapters] == [adapter.acc for adapter in first.adapters]
    with pytest.raises(ResultsFileMismatchError, match="rows of adapter 'task-1' made from other weights"):
        await evaluate_adapters([AdapterSpec("task-1", weights=weights(1, scale=2.0))], PROMPTS, FAKE, output)
    path = adapters(tmp_path / "dirs", ["task-2"])[0]
    with pytest.raises(ResultsFileMismatchError, match=r"adapter id 'task-2' names weights in memory"):
        await evaluate_adapters([AdapterSpec("task-2", path)], PROMPTS, FAKE, output)
    # Bare weights are named after their content; the same weights twice are evaluated once; paths mix in.
    bare = await evaluate_adapters([weights(3), weights(3), path], PROMPTS, FAKE, tmp_path / "bare.jsonl")
    assert [adapter.adapter_id for adapter in bare.adapters] == ["task-2", f"weights-{adapter_hash(weights(3))[:12]}"]


def test_the_content_hash_of_weights_is_that_of_their_values() -> None:
    torch = pytest.importorskip("torch")
    numpy_weights = weights(5)
    tensors = {name: torch.from_numpy(tensor) for name, tensor in numpy_weights.tensors.items()}
    as_torch = AdapterWeights(tensors, numpy_weights.config)
    assert adapter_hash(as_torch) == adapter_hash(numpy_weights) == adapter_hash(weights(5))
    halves = AdapterWeights({name: t.to(torch.bfloat16) for name, t in as_torch.tensors.items()}, numpy_weights.config)
    assert adapter_hash(halves) != adapter_hash(as_torch)  # another dtype is other weights
    other_config = AdapterWeights(numpy_weights.tensors, {**numpy_weights.config, "lora_alpha": 8})
    assert adapter_hash(other_config) != adapter_hash(numpy_weights)


async def test_adapter_specs_need_a_path_or_weights(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="needs either a path or weights"):
        await evaluate_adapters([AdapterSpec("x")], PROMPTS, FAKE, tmp_path / "r.jsonl")
    with pytest.raises(InvalidRequestError, match="needs either a path or weights"):
        await evaluate_adapters([AdapterSpec("x", tmp_path, weights(1))], PROMPTS, FAKE, tmp_path / "r.jsonl")


# Progress -----------------------------------------------------------------------------------------------------


class Clock:
    """Time for the runner: the warm-up (the model's load) takes 100 s, every other request 1 s."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


async def test_the_rate_and_time_left_count_from_the_work_not_from_the_model_s_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(runner_module, "time", clock)

    class SlowToLoad(FakeProvider):
        async def _generate(self, request: Any) -> Any:
            clock.now += 100.0 if request.max_tokens == 1 else 1.0  # the warm-up loads the model
            return await super()._generate(request)

    seen: list[Progress] = []
    prompts = [EvalPrompt(f"p{i}", f"question {i}") for i in range(4)]
    await evaluate_adapters(
        adapters(tmp_path, ["a1"]), prompts, FAKE, tmp_path / "r.jsonl", provider=SlowToLoad(), max_concurrency=1,
        on_progress=seen.append, base=False,
    )  # fmt: skip
    first = seen[0]
    assert first.rows_this_run == 1 and first.elapsed_s == 1.0  # before: 101 s, the load counted as work
    assert first.rate == 1.0 and first.eta_s == 3.0  # 3 rows left at 1 row/s (before: 303 s)
    assert seen[-1].generate_s == 4.0


def test_the_bar_shows_the_scoring_and_generating_time() -> None:
    class Terminal:
        def __init__(self) -> None:
            self.text = ""

        def write(self, text: str) -> int:
            self.text += text
            return len(text)

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return True

    progress = Progress(1, 3, 10, 30, 10, 5.0, "a2", score_s=2.0, generate_s=75.0)
    assert TerminalProgress(Terminal(), enabled=True).render(progress).endswith(
        "left 10s scoring 2s generating 1m15s a2"
    )


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([EvalPrompt("q", "a"), EvalPrompt("q", "b")], r"prompts\[1\]: id 'q' was already used by prompts\[0\]"),
        ([EvalPrompt("q", "a", choices=("x", "y"), answer=7)], "'answer' must be the index of the right choice"),
        ([EvalPrompt("q", "a", choices=("x", "y"))], "'answer' must be the index of the right choice"),
        ([EvalPrompt("q", "a", choices=("x", ""), answer=0)], "'choices' must be a list of two or more non-empty"),
        (["Tell me"], r"prompts\[0\] must be an EvalPrompt, got str"),
    ],
    ids=["duplicate ids", "answer out of range", "choices without answer", "empty choice", "a string"],
)
async def test_a_list_of_prompts_is_checked_as_a_prompt_file_is(
    tmp_path: Path, prompts: list[Any], message: str
) -> None:
    """Before, a list ran unchecked: a repeated id wrote two rows per pair (the summary kept one), and a bad answer
    scored every adapter 0."""
    (tmp_path / "adapter").mkdir()
    output = tmp_path / "r.jsonl"
    with pytest.raises(InvalidRequestError, match=message):
        await evaluate_adapters([tmp_path / "adapter"], prompts, {"max_tokens": 2}, output, provider=FakeProvider())
    assert not output.exists()  # refused before anything ran


async def test_each_scorer_call_gets_a_dict_of_its_own_as_the_scorer_type_says(tmp_path: Path) -> None:
    """``Scorer`` declares ``row: dict[str, Any]``, so the documented ``def f(output, expected, row: dict)``
    type-checks: true, as every call gets a fresh copy of the row, which the scorer may change without effect."""
    assert get_args(Scorer)[0][2] == dict[str, Any]
    for adapter in ("a1", "a2"):
        (tmp_path / adapter).mkdir()
    rows: list[dict[str, Any]] = []

    def scorer(output: str, expected: str | None, row: dict[str, Any]) -> float:
        rows.append(row)
        row["output"], row["adapter_id"] = "changed", None
        return 0.5

    output = tmp_path / "r.jsonl"
    await evaluate_adapters([tmp_path / "a1", tmp_path / "a2"], PROMPTS, FAKE, output, scorer=scorer, mode="generate")
    written = read_rows(output)
    assert len(rows) == len(written) == 3 * len(PROMPTS)  # the base model's rows too
    assert len({id(row) for row in rows}) == len(rows) and all(type(row) is dict for row in rows)
    assert all(row["score"] == 0.5 and row["output"] != "changed" and row["adapter_id"] for row in written)


async def test_a_list_of_prompts_keeps_what_a_scorer_reads_and_takes_numpy_numbers(tmp_path: Path) -> None:
    """What the list check must not refuse: an ``expected`` that is not text (evaluation.md: "anything your scorer
    reads"), and ids and answers that are numpy integers (a data frame's columns)."""
    (tmp_path / "adapter").mkdir()
    seen: list[Any] = []

    def scorer(output: str, expected: Any, row: dict[str, Any]) -> float:
        seen.append(expected)
        return 1.0

    prompts = [
        EvalPrompt("q", "Tell me", expected={"keywords": ["a"]}),  # type: ignore[arg-type]
        EvalPrompt(np.int64(7), "Pick", choices=("x", "y"), answer=np.int64(1)),  # type: ignore[arg-type]
    ]
    summary = await evaluate_adapters(
        [tmp_path / "adapter"], prompts, {"max_tokens": 2}, tmp_path / "r.jsonl", provider=FakeProvider(),
        scorer=scorer, mode="generate",
    )
    assert summary.errors == 0 and {"keywords": ["a"]} in seen
    assert {row["prompt_id"] for row in read_rows(tmp_path / "r.jsonl")} == {"q", "7"}
