"""The adapter evaluation runner: every pair once, resumption after a kill at any point, failing adapters,
scoring, the CSV summary; and one real run on llama.cpp with the tiny model through the CLI.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inference.adapters.source import AdapterSource
from inference.evaluation import (
    BASE_MODEL_ID,
    EvalPrompt,
    Progress,
    TerminalProgress,
    adapter_id_for,
    discover_adapters,
    evaluate_adapters,
    load_prompts,
    read_rows,
)
from inference.exceptions import ConfigurationError, InvalidAdapterError, InvalidRequestError
from inference.fake_provider import FakeProvider
from inference.testing.tiny_models import TinyModel

pytestmark = pytest.mark.integration

FAKE = {"provider": "fake", "max_tokens": 6}
PROMPTS = [EvalPrompt(f"p{i}", f"question number {i}", "Answer briefly." if i % 2 else None) for i in range(5)]


class StrictFake(FakeProvider):
    """The fake provider, refusing adapter directories without adapter_config.json like a real backend,
    and recording what the backend was asked to do."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        if not (Path(adapter_path) / "adapter_config.json").is_file():
            raise InvalidAdapterError(f"adapter at {adapter_path} has no adapter_config.json", path=adapter_path)
        await super()._load_adapter(adapter_id, source)
        self.calls.append(("load", adapter_id))

    async def _unload_adapter(self, adapter_id: str) -> None:
        await super()._unload_adapter(adapter_id)
        self.calls.append(("unload", adapter_id))


def make_adapters(root: Path, names: list[str], *, valid: bool = True) -> list[Path]:
    paths = []
    for name in names:
        path = root / name
        path.mkdir(parents=True)
        if valid:
            (path / "adapter_config.json").write_text("{}")
        paths.append(path)
    return paths


def pairs(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((row["adapter_id"], row["prompt_id"]) for row in rows)


def expected_pairs(adapters: list[str], prompts: list[EvalPrompt], *, base: bool = True) -> list[tuple[str, str]]:
    """Every (adapter, prompt) pair, and the base model's (``(base)``) where the run has its reference row."""
    every = [*([BASE_MODEL_ID] if base else []), *adapters]
    return sorted((adapter, prompt.id) for adapter in every for prompt in prompts)


async def fake_output(prompt: EvalPrompt, adapter_id: str, path: Path) -> str:
    """What the fake answers for the adapter loaded from ``path`` (its text depends on the id and the path)."""
    fake = FakeProvider()
    await fake.load_adapter(adapter_id, path)
    result = await fake.generate(
        prompt.prompt, model="", adapter_id=adapter_id, system_prompt=prompt.system_prompt, max_tokens=6
    )
    return result.text


# Every pair once, the row format, the summary -----------------------------------------------------------------


async def test_every_pair_gets_one_row_with_output_tokens_and_latency(tmp_path: Path) -> None:
    adapters = make_adapters(tmp_path / "adapters", ["a0", "a1", "a2"])
    output = tmp_path / "results.jsonl"
    summary = await evaluate_adapters(adapters, PROMPTS, FAKE, output)
    rows = read_rows(output)
    assert pairs(rows) == expected_pairs(["a0", "a1", "a2"], PROMPTS)
    row = next(row for row in rows if (row["adapter_id"], row["prompt_id"]) == ("a1", "p3"))
    assert row["output"] == await fake_output(PROMPTS[3], "a1", adapters[1])
    assert row["adapter_path"] == str(adapters[1])
    assert row["completion_tokens"] <= 6 and row["prompt_tokens"] == 5  # 3 prompt words + 2 system words
    assert row["finish_reason"] in ("stop", "length") and row["latency_s"] >= 0
    assert row["error"] is None and row["score"] is None
    assert (summary.rows_total, summary.rows_written, summary.rows_resumed, summary.errors) == (20, 20, 0, 0)
    assert [adapter.rows for adapter in summary.adapters] == [5, 5, 5]
    assert summary.base is not None and summary.base.rows == 5  # the base model's reference row
    base_row = next(row for row in rows if (row["adapter_id"], row["prompt_id"]) == (BASE_MODEL_ID, "p3"))
    assert base_row["output"].startswith("[base]") and base_row["adapter_path"] is None


async def test_the_csv_summary_sits_next_to_the_results(tmp_path: Path) -> None:
    adapters = make_adapters(tmp_path, ["x", "y"])
    summary = await evaluate_adapters(adapters, PROMPTS, FAKE, tmp_path / "out" / "run.jsonl", scorer="exact")
    assert summary.csv_path == tmp_path / "out" / "run.summary.csv"
    table = list(csv.DictReader(io.StringIO(summary.csv_path.read_text())))
    assert [line["adapter_id"] for line in table] == ["(base)", "x", "y"]
    for line, adapter in zip(table[1:], summary.adapters, strict=True):
        assert int(line["rows"]) == 5 and int(line["errors"]) == 0
        assert float(line["mean_latency_s"]) == pytest.approx(adapter.mean_latency_s)
        assert int(line["completion_tokens"]) == adapter.completion_tokens
        assert line["score"] == ""  # no prompt has an expected answer: nothing scored
    assert summary.format_table().splitlines()[0].split() == [
        "adapter",
        "rows",
        "score",
        "latency_s",
        "tokens/s",
        "errors",
    ]


async def test_each_adapter_is_loaded_used_and_unloaded_before_the_next(tmp_path: Path) -> None:
    provider = StrictFake()
    adapters = make_adapters(tmp_path, ["a0", "a1"])
    await evaluate_adapters(adapters, PROMPTS, FAKE, tmp_path / "r.jsonl", provider=provider)
    assert provider.calls == [("load", "a0"), ("unload", "a0"), ("load", "a1"), ("unload", "a1")]
    assert await provider.list_adapters() == []


# Resumption ---------------------------------------------------------------------------------------------------


async def test_a_rerun_after_a_kill_at_any_byte_finishes_with_one_row_per_pair(tmp_path: Path) -> None:
    adapters = make_adapters(tmp_path / "adapters", ["a0", "a1", "a2"])
    output = tmp_path / "results.jsonl"
    await evaluate_adapters(adapters, PROMPTS, FAKE, output)
    complete = output.read_bytes()
    reference = {(row["adapter_id"], row["prompt_id"]): row["output"] for row in read_rows(output)}
    line_ends = [index + 1 for index, byte in enumerate(complete) if byte == ord("\n")]
    cuts = [0, 7, line_ends[0], line_ends[3] + 20, line_ends[6] - 1, line_ends[9], len(complete) - 1]
    for cut in cuts:
        output.write_bytes(complete[:cut])
        kept = complete[:cut].count(b"\n")
        summary = await evaluate_adapters(adapters, PROMPTS, FAKE, output)
        rows = read_rows(output)
        assert pairs(rows) == expected_pairs(["a0", "a1", "a2"], PROMPTS), f"cut at byte {cut}"
        assert summary.rows_resumed == kept and summary.rows_written == 20 - kept
        assert {(row["adapter_id"], row["prompt_id"]): row["output"] for row in rows} == reference
        assert output.read_bytes().endswith(b"\n")
        assert all(json.loads(line) for line in output.read_bytes().splitlines())


async def test_a_complete_last_row_without_its_newline_is_redone_once(tmp_path: Path) -> None:
    adapters = make_adapters(tmp_path, ["a0"])
    output = tmp_path / "r.jsonl"
    await evaluate_adapters(adapters, PROMPTS, FAKE, output)
    output.write_bytes(output.read_bytes()[:-1])  # killed between the JSON and its newline
    summary = await evaluate_adapters(adapters, PROMPTS, FAKE, output)
    assert summary.rows_written == 1
    assert pairs(read_rows(output)) == expected_pairs(["a0"], PROMPTS)


class Interrupted(Exception):
    """Stands for Ctrl-C in the middle of an adapter."""


@pytest.mark.parametrize("stop_after", [1, 4, 6, 8])
async def test_an_interrupted_run_resumes_where_it_stopped(tmp_path: Path, stop_after: int) -> None:
    adapters = make_adapters(tmp_path, ["a0", "a1"])
    output = tmp_path / "r.jsonl"
    provider = StrictFake()

    def interrupt(progress: Progress) -> None:
        if progress.rows_this_run >= stop_after:
            raise Interrupted

    with pytest.raises(Interrupted):
        await evaluate_adapters(
            adapters, PROMPTS, FAKE, output, provider=provider, on_progress=interrupt, max_concurrency=2
        )
    kept = len(read_rows(output))  # requests already answered when it stopped were written too
    assert stop_after <= kept <= 15
    assert await provider.list_adapters() == []  # the adapter in use was unloaded on the way out
    summary = await evaluate_adapters(adapters, PROMPTS, FAKE, output, provider=provider)
    assert summary.rows_resumed == kept and summary.rows_written == 15 - kept
    assert pairs(read_rows(output)) == expected_pairs(["a0", "a1"], PROMPTS)


KILLER = """
import os, signal
calls = 0
def score(output, expected, row):
    global calls
    calls += 1
    if calls == int(os.environ.get("KILL_AT", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
    return True
"""


@pytest.mark.parametrize("kill_at", [1, 7, 12])
def test_a_process_killed_with_sigkill_resumes_with_every_pair_once(
    tmp_path: Path, repo_root: Path, kill_at: int
) -> None:
    (tmp_path / "killer.py").write_text(KILLER)
    make_adapters(tmp_path / "adapters", ["a0", "a1", "a2"])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt}) + "\n" for p in PROMPTS))
    output = tmp_path / "results.jsonl"
    command = [sys.executable, "-m", "inference.cli", "eval", "--adapters", str(tmp_path / "adapters" / "*")]
    command += ["--prompts", str(prompts), "--output", str(output), "--provider", "fake", "--score", "killer:score"]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    killed = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**env, "KILL_AT": str(kill_at)})
    assert killed.returncode == -9
    assert len(read_rows(output)) == kill_at - 1  # the row being scored when it died was not written
    resumed = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["rows_resumed"] == kill_at - 1 and summary["rows_written"] == 20 - (kill_at - 1)
    rows = read_rows(output)
    assert pairs(rows) == expected_pairs(["a0", "a1", "a2"], PROMPTS)
    assert all(row["score"] == 1.0 for row in rows)


async def test_a_file_that_is_not_a_results_file_is_refused(tmp_path: Path) -> None:
    output = tmp_path / "notes.jsonl"
    output.write_text("hello\nworld\n")
    with pytest.raises(InvalidRequestError, match=r"line 1 of .* is not a result row"):
        await evaluate_adapters(make_adapters(tmp_path, ["a0"]), PROMPTS, FAKE, output)
    assert output.read_text() == "hello\nworld\n"


# Failures -----------------------------------------------------------------------------------------------------


async def test_an_adapter_that_fails_to_load_is_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    good = make_adapters(tmp_path, ["a0", "a2"])
    bad = make_adapters(tmp_path, ["broken"], valid=False)
    provider = StrictFake()
    output = tmp_path / "r.jsonl"
    summary = await evaluate_adapters([good[0], bad[0], good[1]], PROMPTS, FAKE, output, provider=provider)
    rows = read_rows(output)
    assert pairs(rows) == expected_pairs(["a0", "broken", "a2"], PROMPTS)
    broken = [row for row in rows if row["adapter_id"] == "broken"]
    assert all(row["error"]["stage"] == "load" and row["error"]["type"] == "InvalidAdapterError" for row in broken)
    assert all(row["output"] is None for row in broken)
    assert all(row["error"] is None for row in rows if row["adapter_id"] != "broken")
    by_id = {adapter.adapter_id: adapter for adapter in summary.adapters}
    assert by_id["broken"].errors == 5 and "no adapter_config.json" in (by_id["broken"].load_error or "")
    assert by_id["a2"].errors == 0 and by_id["a2"].load_error is None
    assert "(load failed)" in summary.format_table()
    # The provider still works afterwards.
    assert await provider.list_adapters() == []
    assert (await provider.generate("hi", model="", max_tokens=2)).text.startswith("[base]")


class FlakyFake(FakeProvider):
    """Fails every request whose prompt mentions 3."""

    async def _generate(self, request: Any) -> Any:
        if "3" in request.prompt:
            raise InvalidRequestError("the backend refused prompt 3", provider=self.name)
        return await super()._generate(request)


async def test_a_failing_request_is_one_error_row_and_the_others_are_kept(tmp_path: Path) -> None:
    output = tmp_path / "r.jsonl"
    summary = await evaluate_adapters(make_adapters(tmp_path, ["a0"]), PROMPTS, FAKE, output, provider=FlakyFake())
    rows = {row["prompt_id"]: row for row in read_rows(output)}
    assert rows["p3"]["error"] == {
        "stage": "generate",
        "type": "InvalidRequestError",
        "message": "the backend refused prompt 3",
    }
    assert all(rows[f"p{i}"]["error"] is None for i in (0, 1, 2, 4))
    assert summary.adapters[0].errors == 1 and summary.adapters[0].rows == 5


async def test_bad_inputs_fail_before_anything_is_written(tmp_path: Path) -> None:
    adapters = make_adapters(tmp_path, ["a0"])
    output = tmp_path / "r.jsonl"
    with pytest.raises(InvalidRequestError, match="max_tokens must be a positive integer"):
        await evaluate_adapters(adapters, PROMPTS, {"provider": "fake", "max_tokens": 0}, output)
    with pytest.raises(InvalidRequestError, match="does not exist"):
        await evaluate_adapters([tmp_path / "missing"], PROMPTS, FAKE, output)
    with pytest.raises(ConfigurationError, match="unknown scorer"):
        await evaluate_adapters(adapters, PROMPTS, FAKE, output, scorer="fuzzy")
    with pytest.raises(InvalidRequestError, match="max_concurrency"):
        await evaluate_adapters(adapters, PROMPTS, FAKE, output, max_concurrency=0)
    assert not output.exists()


# Scoring -----------------------------------------------------------------------------------------------------


async def scored_prompts(adapter: Path) -> list[EvalPrompt]:
    right = await fake_output(PROMPTS[0], "a0", adapter)
    return [
        EvalPrompt("right", PROMPTS[0].prompt, None, f"  {right} "),
        EvalPrompt("wrong", PROMPTS[1].prompt, None, "something else"),
        EvalPrompt("unscored", PROMPTS[2].prompt, None, None),
    ]


async def test_exact_match_scoring(tmp_path: Path) -> None:
    output = tmp_path / "r.jsonl"
    summary = await evaluate_adapters(
        [tmp_path / "a0"], await scored_prompts(make_adapters(tmp_path, ["a0"])[0]), FAKE, output, scorer="exact"
    )
    scores = {row["prompt_id"]: row["score"] for row in read_rows(output)}
    assert scores == {"right": 1.0, "wrong": 0.0, "unscored": None}
    assert summary.adapters[0].score == 0.5 and summary.adapters[0].scored == 2


async def test_regex_scoring_searches_the_pattern(tmp_path: Path) -> None:
    prompts = [EvalPrompt("a", "x", None, r"^\[a0\] \w+"), EvalPrompt("b", "y", None, r"^\[a1\]")]
    output = tmp_path / "r.jsonl"
    await evaluate_adapters(make_adapters(tmp_path, ["a0"]), prompts, FAKE, output, scorer="regex")
    assert {row["prompt_id"]: row["score"] for row in read_rows(output)} == {"a": 1.0, "b": 0.0}
    with pytest.raises(InvalidRequestError, match=r"prompt 'bad'.*not a valid regular expression"):
        await evaluate_adapters([tmp_path / "a0"], [EvalPrompt("bad", "x", None, "([")], FAKE, output, scorer="regex")


async def test_a_user_function_by_import_path_gets_output_expected_and_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_scoring.py").write_text(
        "def words(output, expected, row):\n"
        "    assert row['adapter_id'] in ('a0', '(base)') and row['error'] is None\n"
        "    if expected == 'inf':\n"
        "        return float('inf')\n"
        "    return len(output.split()) / 10 if expected != 'boom' else 1 / 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    prompts = [EvalPrompt("p", "hello", None, "x"), EvalPrompt("q", "hello again", None, "boom"),
               EvalPrompt("r", "hi", None, "inf")]
    output = tmp_path / "r.jsonl"
    summary = await evaluate_adapters(make_adapters(tmp_path, ["a0"]), prompts, FAKE, output, scorer="my_scoring:words")
    rows = {row["prompt_id"]: row for row in read_rows(output) if row["adapter_id"] == "a0"}
    assert rows["p"]["score"] == pytest.approx(len(rows["p"]["output"].split()) / 10)
    assert rows["q"]["score"] is None and rows["q"]["score_error"].startswith("ZeroDivisionError")
    assert rows["r"]["score"] is None and "finite number" in rows["r"]["score_error"]  # JSON has no Infinity
    assert "Infinity" not in output.read_text()
    assert summary.adapters[0].score == rows["p"]["score"]


async def test_a_callable_returning_bools_scores_one_and_zero(tmp_path: Path) -> None:
    output = tmp_path / "r.jsonl"
    summary = await evaluate_adapters(
        make_adapters(tmp_path, ["a0"]), PROMPTS, FAKE, output, scorer=lambda out, exp, row: row["prompt_id"] < "p2"
    )
    rows = sorted((row for row in read_rows(output) if row["adapter_id"] == "a0"), key=lambda row: row["prompt_id"])
    assert [row["score"] for row in rows] == [1, 1, 0, 0, 0]
    assert summary.adapters[0].score == pytest.approx(0.4)


# Inputs and progress -------------------------------------------------------------------------------------------


def test_prompt_sets_are_checked_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 1, "prompt": "a", "expected": "b"}\n\n{"id": "x", "prompt": "c", "system_prompt": "s"}\n')
    assert load_prompts(path) == [EvalPrompt("1", "a", None, "b"), EvalPrompt("x", "c", "s", None)]
    path.write_text('{"id": 1, "prompt": "a"}\n{"id": "1", "prompt": "b"}\n')
    with pytest.raises(InvalidRequestError, match="line 2: id '1' was already used on line 1"):
        load_prompts(path)
    path.write_text('{"id": 1}\n')
    with pytest.raises(InvalidRequestError, match="line 1: 'prompt' must be a string"):
        load_prompts(path)
    path.write_text("not json\n")
    with pytest.raises(InvalidRequestError, match="line 1 is not JSON"):
        load_prompts(path)


def test_adapter_ids_come_from_names_and_stay_unique(tmp_path: Path) -> None:
    assert adapter_id_for("runs/step 100/") == "step-100"
    assert adapter_id_for("x/style.gguf") == "style"
    make_adapters(tmp_path / "run1", ["adapter"])
    make_adapters(tmp_path / "run2", ["adapter"])
    specs = discover_adapters([str(tmp_path / "run*" / "adapter"), tmp_path / "run1" / "adapter"])
    assert [spec.id for spec in specs] == ["run1-adapter", "run2-adapter"]
    with pytest.raises(InvalidRequestError, match="matches nothing"):
        discover_adapters([str(tmp_path / "nothing*")])


def test_the_progress_bar_draws_only_on_a_terminal() -> None:
    progress = Progress(
        adapters_done=1, adapters_total=4, rows_done=10, rows_total=40, rows_this_run=5, elapsed_s=2.0, adapter_id="a1"
    )
    assert progress.rate == 2.5 and progress.eta_s == 12.0

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    bar = TerminalProgress(screen, min_interval_s=0)
    bar(progress)
    bar.close()
    assert "adapters 1/4 rows 10/40 2.5 rows/s left 12s a1" in screen.getvalue()
    assert screen.getvalue().startswith("\r") and screen.getvalue().endswith("\n")
    pipe = io.StringIO()
    quiet = TerminalProgress(pipe)
    quiet(progress)
    quiet.close()
    assert pipe.getvalue() == ""


# A real run: llama.cpp, the tiny model and its adapters, through the CLI ------------------------------------


def test_a_real_eval_on_llamacpp_through_the_cli(
    tiny_models: dict[str, TinyModel], tmp_path: Path, repo_root: Path
) -> None:
    pytest.importorskip("llama_cpp")
    model = tiny_models["qwen2"]
    adapters = tmp_path / "adapters"
    for name, path in model.adapter_dirs.items():
        shutil.copytree(path, adapters / name)
    (adapters / "zz-broken").mkdir()
    prompts = tmp_path / "prompts.jsonl"
    lines = [
        {"id": "story", "prompt": "Once upon a time", "expected": r"\S"},
        {
            "id": "system",
            "prompt": "The system works like this:",
            "system_prompt": "Answer briefly.",
            "expected": r"\S",
        },
        {"id": "hello", "prompt": "Hello, world!"},
    ]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    output = tmp_path / "results.jsonl"
    command = [
        sys.executable,
        "-m",
        "inference.cli",
        "eval",
        "--adapters",
        str(adapters / "*"),
        "--prompts",
        str(prompts),
    ]
    command += ["--output", str(output), "--provider", "llamacpp", "--model-path", str(model.gguf_path)]
    command += ["--set", "n_ctx=512", "--set", f"adapter_cache_dir={tmp_path / 'cache'}", "--max-tokens", "8"]
    command += ["--temperature", "0", "--score", "regex", "--concurrency", "2", "--json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    first = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=repo_root, env=env)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["rows_written"] == 15 and summary["errors"] == 3  # 4 adapters and the base model, 3 prompts
    assert summary["base"]["errors"] == 0 and summary["base"]["scored"] == 2
    by_id = {adapter["adapter_id"]: adapter for adapter in summary["adapters"]}
    assert list(by_id) == ["a0", "a1", "a2", "zz-broken"]
    assert "adapter_config.json" in by_id["zz-broken"]["load_error"]
    for name in ("a0", "a1", "a2"):
        assert by_id[name]["errors"] == 0 and by_id[name]["completion_tokens"] > 0 and by_id[name]["scored"] == 2
    rows = {(row["adapter_id"], row["prompt_id"]): row for row in read_rows(output)}
    assert len(rows) == 15
    outputs = {rows[(name, "story")]["output"] for name in ("a0", "a1", "a2")}
    assert len(outputs) == 3  # each adapter changes the greedy answer
    assert all(rows[(name, "story")]["prompt_tokens"] > 0 for name in ("a0", "a1", "a2"))

    # Killed mid-row: the torn row is redone, greedy decoding gives the same text, nothing else is repeated.
    data = output.read_bytes()
    cut = data.index(b"\n", data.index(b'"a1"')) - 10
    output.write_bytes(data[:cut])
    second = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=repo_root, env=env)
    assert second.returncode == 0, second.stderr
    resumed = json.loads(second.stdout)
    assert resumed["rows_written"] == 15 - data[:cut].count(b"\n")
    again = {(row["adapter_id"], row["prompt_id"]): row for row in read_rows(output)}
    assert len(read_rows(output)) == 15
    assert {key: row["output"] for key, row in again.items()} == {key: row["output"] for key, row in rows.items()}


def test_the_api_is_usable_from_plain_asyncio(tmp_path: Path) -> None:
    summary = asyncio.run(evaluate_adapters(make_adapters(tmp_path, ["a0"]), PROMPTS[:1], FAKE, tmp_path / "r.jsonl"))
    assert summary.adapters[0].rows == 1
