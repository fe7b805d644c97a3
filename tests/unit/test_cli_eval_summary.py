"""``inference eval``'s score-only mode, base-model row, sorting, best lines, timings and plot, on the fake provider."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest

from inference.cli import main
from inference.evaluation import (
    AdapterSummary,
    EvalPrompt,
    EvaluationSummary,
    evaluate_adapters,
    read_rows,
    summary_csv_path,
    summary_plot_path,
)
from inference.exceptions import ConfigurationError, InvalidRequestError, MissingDependencyError

LINES = [
    {"id": "q1", "prompt": "The sky is", "expected": " blue"},
    {"id": "q2", "prompt": "Two plus two is", "choices": [" four", " five", " a chair"], "answer": 0},
    {"id": "q3", "prompt": "Water is", "expected": " wet", "choices": [" dry", " wet"], "answer": 1},
]


@pytest.fixture
def files(tmp_path: Path) -> tuple[list[str], Path]:
    for name in ("a1", "a2", "a3"):
        (tmp_path / "adapters" / name).mkdir(parents=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    output = tmp_path / "out" / "results.jsonl"
    argv = ["eval", "--adapters", str(tmp_path / "adapters" / "*"), "--prompts", str(prompts)]
    return [*argv, "--output", str(output), "--provider", "fake", "--no-progress"], output


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def png_size(path: Path) -> tuple[int, int]:
    """The width and height of a PNG, read from its header (and the header checked)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_score_only_generates_nothing_and_the_table_says_which_is_best(
    files: tuple[list[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv, output = files
    status, out, err = run([*argv, "--score-only", "--sort", "nll_per_token", "--no-plot"], capsys)
    assert status == 0, err
    rows = read_rows(output)
    assert len(rows) == 4 * 3 and all(row["output"] is None and row["settings"]["mode"] == "score" for row in rows)
    table = out.splitlines()
    assert table[0].split() == ["adapter", "rows", "nll/token", "acc", "acc_norm", "errors"]
    assert table[1].split()[0] == "(base)"
    nll = [float(line.split()[2]) for line in table[2:5]]
    assert nll == sorted(nll)  # --sort nll_per_token: lower is better, so lowest first
    assert f"best nll/token: {table[2].split()[0]} {nll[0]:.3f} (lower is better; base model" in out
    assert "best acc:" in out and "(higher is better" in out
    assert "time: scoring" in out and "generating" not in out


def test_no_base_leaves_the_reference_row_out_and_json_says_what_was_best(
    files: tuple[list[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv, output = files
    status, out, err = run([*argv, "--no-base", "--json", "--no-plot", "--max-tokens", "3"], capsys)
    assert status == 0, err
    summary = json.loads(out)
    assert summary["base"] is None and summary["mode"] == "generate" and summary["rows_total"] == 9
    assert "(base)" not in {row["adapter_id"] for row in read_rows(output)}
    assert set(summary["best"]) == {"nll_per_token", "acc", "acc_norm"}  # no --score: no best score
    assert summary["best"]["nll_per_token"]["better"] == "lower"
    assert summary["timings"]["generate_s"] > 0 and summary["timings"]["score_s"] > 0
    assert summary["plot_path"] is None


@pytest.mark.parametrize(
    ("extra", "status", "needle"),
    [
        (["--score-only", "--score", "exact"], 2, "--score judges generated text, and --score-only generates none"),
        (["--score-only", "--generate"], 2, "not allowed with argument"),
        (["--sort", "accuracy"], 2, "--sort 'accuracy': use one of score, nll_per_token, acc"),
        (["--max-tokens", "0"], 1, "got 0: to score the expected answers and choices without generating"),
    ],
)
def test_eval_refuses_contradictions_before_writing(
    files: tuple[list[str], Path], extra: list[str], status: int, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, output = files
    code, _, err = run([*argv, *extra], capsys)
    assert code == status and needle in err
    assert not output.exists()


def test_an_output_that_cannot_be_created_is_refused_with_its_real_cause(
    files: tuple[list[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, _ = files
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "missing" / "r.jsonl")
    status, out, err = run([*argv, "--output", str(dangling), "--no-plot"], capsys)
    missing = Path(os.path.realpath(tmp_path)) / "missing"
    assert status == 1 and out == ""
    assert f"{dangling}: it is a symbolic link to {missing / 'r.jsonl'}, whose directory {missing} does not" in err
    assert "removed meanwhile" not in err
    if os.path.isdir("/proc/self"):  # a directory that exists, whose file system creates no file
        status, out, err = run([*argv, "--output", "/proc/r.jsonl", "--no-plot"], capsys)
        assert status == 1 and "cannot write the results file /proc/r.jsonl: No such file or directory" in err
        assert "removed meanwhile" not in err


def test_the_plot_is_a_png_beside_the_csv(files: tuple[list[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    argv, output = files
    status, out, err = run([*argv, "--score-only"], capsys)
    assert status == 0 and err == "", err
    plot = output.with_name("results.summary.png")
    assert f"plot: {plot}" in out
    width, height = png_size(plot)
    assert width > 400 and height > 200


def test_a_sweep_of_many_checkpoints_is_drawn_as_a_curve_over_the_run_order(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")

    def checkpoint(step: int, nll: float | None) -> AdapterSummary:
        return AdapterSummary(f"ckpt-{step}", None, 10, 0, None, None, 0, None, None, 0, nll_per_token=nll)

    adapters = tuple(checkpoint(step, 3.0 + 1 / (step + 1) if step != 7 else None) for step in range(60))
    summary = EvaluationSummary(
        adapters, tmp_path / "r.jsonl", tmp_path / "r.summary.csv", 0, 0, 0, 0.0, base=checkpoint(0, 3.5)
    )
    assert summary.write_plot() == tmp_path / "r.summary.png"
    width, height = png_size(summary.plot_path)
    assert width >= 600 and height >= 200
    with pytest.raises(InvalidRequestError, match="no adapter has a figure to plot"):
        summary.write_plot(metrics=["acc"])
    with pytest.raises(InvalidRequestError, match="cannot plot 'accuracy'"):
        summary.write_plot(metrics=["accuracy"])


def test_a_plot_that_cannot_be_written_costs_a_note_not_the_results(
    files: tuple[list[str], Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, output = files
    monkeypatch.setattr("inference.evaluation.plot.can_plot", lambda: True)
    plot = output.with_name("results.summary.png")

    def full_disk(self: EvaluationSummary) -> Path:
        raise ConfigurationError(f"cannot write the plot {plot}: No space left on device")

    monkeypatch.setattr(EvaluationSummary, "write_plot", full_disk)
    status, out, err = run([*argv, "--score-only"], capsys)
    assert status == 0 and out.startswith("adapter ") and "plot:" not in out  # the table is printed all the same
    assert err == f"inference: no plot drawn: cannot write the plot {plot}: No space left on device\n"


def test_nothing_to_draw_is_said_only_when_a_plot_was_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "a1").mkdir()
    prompts = tmp_path / "plain.jsonl"
    prompts.write_text('{"id": "p", "prompt": "Hi"}\n')  # no expected answer, no choices, no scorer: no figure
    argv = ["eval", "--adapters", str(tmp_path / "a1"), "--prompts", str(prompts), "--provider", "fake"]
    status, _, err = run([*argv, "--output", str(tmp_path / "one.jsonl")], capsys)
    assert status == 0 and err == ""
    status, _, err = run([*argv, "--output", str(tmp_path / "two.jsonl"), "--plot"], capsys)
    assert status == 0 and err.startswith("inference: no plot drawn: no adapter has a figure to plot")


def test_without_matplotlib_the_cli_says_which_extra_to_install(
    files: tuple[list[str], Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, output = files
    monkeypatch.setattr("inference.evaluation.plot.can_plot", lambda: False)
    status, out, err = run([*argv, "--score-only"], capsys)
    assert status == 0 and "plot:" not in out
    assert err == (
        "inference: no plot drawn: matplotlib is not installed (pip install 'inference-adapters[plot]'; --no-plot "
        "skips this note)\n"
    )
    assert run([*argv, "--score-only", "--no-plot"], capsys)[2] == ""
    output.unlink()
    status, _, err = run([*argv, "--score-only", "--plot"], capsys)  # asked for: refused before the run
    assert status == 1 and "pip install 'inference-adapters[plot]'" in err and not output.exists()


async def test_write_plot_names_the_extra_when_matplotlib_cannot_be_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a1").mkdir()
    summary = await evaluate_adapters(
        [tmp_path / "a1"], [EvalPrompt("q", "Sky:", expected=" blue")], {"provider": "fake"}, tmp_path / "r.jsonl"
    )
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError, as when it is missing
    with pytest.raises(MissingDependencyError, match=r"needs matplotlib.*pip install 'inference-adapters\[plot\]'"):
        summary.write_plot()
    assert not summary.plot_path.exists()


def test_importing_inference_and_the_evaluation_imports_no_matplotlib() -> None:
    import subprocess

    code = "import sys, inference, inference.evaluation, inference.cli; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "False"


def test_two_output_files_never_share_a_summary_or_a_plot(
    files: tuple[list[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``results`` and ``results.jsonl`` both wrote ``results.summary.csv``: the second run's table replaced the
    first's. ``X.jsonl`` keeps ``X.summary.csv``; any other name is kept whole."""
    argv, output = files
    plain = output.with_name("results")
    elsewhere = [str(plain) if item == str(output) else item for item in argv]
    status, out, _ = run([*elsewhere, "--no-plot", "--no-base"], capsys)
    assert status == 0 and f"summary: {plain.with_name('results-summary.csv')}" in out
    first = plain.with_name("results-summary.csv").read_text()
    status, out, _ = run([*argv, "--no-plot"], capsys)
    assert status == 0 and f"summary: {output.with_name('results.summary.csv')}" in out
    assert plain.with_name("results-summary.csv").read_text() == first  # not overwritten by the second run
    assert "(base)" not in first and "(base)" in output.with_name("results.summary.csv").read_text()

    names = ["results", "results.jsonl", "results.json", "results.json.jsonl", "results.summary", "r.x.jsonl", "r.x"]
    csvs = {summary_csv_path(output.with_name(name)) for name in names}
    plots = {summary_plot_path(output.with_name(name)) for name in names}
    assert len(csvs) == len(plots) == len(names)
