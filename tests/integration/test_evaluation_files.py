"""The files of an evaluation: prompt sets as JSON Lines define them, one writer per results file, results paths
that are files, each pair counted once, and a full disk named.
"""

from __future__ import annotations

import asyncio
import csv
import errno
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inference.evaluation import (
    AdapterSpec,
    EvalPrompt,
    ResultsFileInUseError,
    evaluate_adapters,
    load_prompts,
    read_rows,
)
from inference.evaluation.rows import row_key
from inference.evaluation.summary import summarise
from inference.exceptions import ConfigurationError, InvalidRequestError
from inference.fake_provider import FakeProvider

pytestmark = pytest.mark.integration

FAKE = {"provider": "fake", "max_tokens": 4}


# Prompt sets --------------------------------------------------------------------------------------------------


def test_unicode_line_separators_inside_a_json_string_are_text(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    texts = ["one\u2028two", "next\x85line", "para\u2029graph", "form\x0cfeed", "group\x1dsep"]
    lines = [json.dumps({"id": index, "prompt": text}, ensure_ascii=False) for index, text in enumerate(texts)]
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))  # Windows line ends too
    assert [prompt.prompt for prompt in load_prompts(path)] == texts
    path.write_bytes(b"\xef\xbb\xbf" + lines[0].encode("utf-8"))  # a byte-order mark, no final newline
    assert load_prompts(path) == [EvalPrompt("0", texts[0])]


def test_a_prompt_set_that_is_not_utf8_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"id": 1, "prompt": "ok"}\n{"id": 2, "prompt": "café"}\n'.encode("latin-1"))
    where = re.escape(str(path))
    with pytest.raises(InvalidRequestError, match=rf"{where} line 2 is not UTF-8 text \(byte 0xe9 at byte 50"):
        load_prompts(path)


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (r'{"id": 1, "prompt": "a\ud800b"}', "'prompt'"),
        (r'{"id": 1, "prompt": "a", "system_prompt": "\udfff"}', "'system_prompt'"),
        (r'{"id": 1, "prompt": "a", "expected": "x\ud800"}', "'expected'"),
        (r'{"id": "\ud800", "prompt": "a"}', "'id'"),
        (r'{"id": 1, "prompt": "a", "choices": ["x", "\ud800"], "answer": 0}', "'choices\\[1\\]'"),
    ],
)
def test_a_lone_surrogate_in_a_prompt_set_is_refused_with_its_line(tmp_path: Path, record: str, field: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 0, "prompt": "fine \\ud83d\\ude00"}\n' + record + "\n")  # an escaped pair is fine
    with pytest.raises(InvalidRequestError, match=rf"line 2: {field} holds .* a lone surrogate"):
        load_prompts(path)


# One writer per results file ------------------------------------------------------------------------------------

GATE = """
import sys
first = True
def score(output, expected, row):
    global first
    if first:  # the run holds its results file now: say so, and wait for the test to let it go on
        first = False
        print("scoring started", file=sys.stderr, flush=True)
        sys.stdin.readline()
    return True
"""


def make_adapters(root: Path, names: list[str]) -> list[Path]:
    paths = []
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "adapter_config.json").write_text("{}")
        paths.append(root / name)
    return paths


def eval_command(tmp_path: Path, output: Path) -> list[str]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}"}) + "\n" for i in range(5)))
    adapters = tmp_path / "adapters"
    if not adapters.exists():
        make_adapters(adapters, ["a0", "a1", "a2"])
    return [
        sys.executable, "-m", "inference.cli", "eval", "--adapters", str(adapters / "*"), "--prompts", str(prompts),
        "--output", str(output), "--provider", "fake", "--max-tokens", "4", "--score", "gate:score", "--no-progress",
    ]


def test_a_second_run_on_the_same_output_is_refused_at_once_while_the_first_writes(tmp_path: Path) -> None:
    (tmp_path / "gate.py").write_text(GATE)
    output = tmp_path / "results.jsonl"
    command = eval_command(tmp_path, output)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    first = subprocess.Popen(
        [*command, "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert first.stderr is not None
        started = first.stderr.readline()  # blocks until the first run scores its first row (or dies)
        assert started == "scoring started\n", started + first.stderr.read()

        second = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60, env=env)
        assert second.returncode == 1
        assert second.stdout == "" and "Traceback" not in second.stderr
        assert second.stderr == (
            f"inference: error: another evaluation run is writing {output} (it holds the file's lock): wait for it "
            "to finish and run again to resume from its rows, or write to another output file\n"
        )

        out, err = first.communicate(input="\n", timeout=60)  # the first run goes on
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    summary = json.loads(out)
    assert (summary["rows_written"], summary["rows_resumed"]) == (20, 0)  # 3 adapters and the base model
    rows = read_rows(output)
    every = ("(base)", "a0", "a1", "a2")
    assert sorted(row_key(row) for row in rows) == [(a, f"p{i}") for a in every for i in range(5)]

    # Released when the run ends (the kernel drops it even after a SIGKILL: see the resume tests): a third run resumes.
    third = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert third.returncode == 0, third.stderr
    assert (json.loads(third.stdout)["rows_written"], json.loads(third.stdout)["rows_resumed"]) == (0, 20)


async def test_a_second_run_in_the_same_process_is_refused_too_and_nothing_is_written(tmp_path: Path) -> None:
    adapters = make_adapters(tmp_path / "adapters", ["a0"])
    output = tmp_path / "results.jsonl"
    prompts = [EvalPrompt("p0", "hello")]
    gate, release = asyncio.Event(), asyncio.Event()

    class Held(FakeProvider):  # the first run's warm-up request waits, with the results file open and locked
        async def _generate(self, request: Any) -> Any:
            result = await super()._generate(request)
            gate.set()
            await release.wait()
            return result

    first = asyncio.ensure_future(evaluate_adapters(adapters, prompts, FAKE, output, provider=Held()))
    await gate.wait()
    before = output.read_bytes()
    with pytest.raises(ResultsFileInUseError, match=f"another evaluation run is writing {re.escape(str(output))}"):
        await evaluate_adapters(adapters, prompts, FAKE, output)
    assert output.read_bytes() == before
    release.set()
    summary = await first
    assert summary.rows_written == 2 and len(read_rows(output)) == 2  # the adapter's row and the base model's


async def test_a_file_holding_pairs_twice_summarises_and_resumes_each_pair_once(tmp_path: Path) -> None:
    adapters = make_adapters(tmp_path / "adapters", ["a0", "a1"])
    output = tmp_path / "results.jsonl"
    prompts = [EvalPrompt(f"p{i}", f"question {i}", None, "x") for i in range(4)]
    first = await evaluate_adapters(adapters, prompts, FAKE, output, scorer=lambda *_: 1.0)
    assert [adapter.score for adapter in first.adapters] == [1.0, 1.0]
    # What two unlocked runs left behind: every row twice, the second copy scored 0 with an error.
    lines = output.read_text(encoding="utf-8").splitlines()
    failed = {"score": 0.0, "error": {"stage": "generate", "type": "X", "message": "x"}}
    copies = [json.loads(line) | failed for line in lines]
    output.write_text("".join(line + "\n" for line in lines) + "".join(json.dumps(row) + "\n" for row in copies))
    assert len(read_rows(output)) == 24  # 2 adapters and the base model, 4 prompts, twice

    again = await evaluate_adapters(adapters, prompts, FAKE, output, scorer=lambda *_: 1.0)
    assert (again.rows_written, again.rows_resumed) == (0, 12)
    assert [(adapter.rows, adapter.errors, adapter.score) for adapter in again.adapters] == [(4, 0, 1.0)] * 2
    with open(again.csv_path, newline="", encoding="utf-8") as handle:
        assert [row["rows"] for row in csv.DictReader(handle)] == ["4", "4", "4"]
    specs = [AdapterSpec(adapter.adapter_id, Path(adapter.adapter_path)) for adapter in again.adapters]
    by_hand = summarise(read_rows(output), specs, [prompt.id for prompt in prompts])
    assert [(adapter.rows, adapter.errors) for adapter in by_hand] == [(4, 0), (4, 0)]


# Results paths that are not files ---------------------------------------------------------------------------


def not_files(tmp_path: Path) -> list[Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    paths = [fifo, tmp_path]
    if Path("/dev/full").exists() and stat.S_ISCHR(os.stat("/dev/full").st_mode):
        paths.append(Path("/dev/full"))
    return paths


async def test_a_results_path_that_is_not_a_regular_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    adapters = make_adapters(tmp_path / "adapters", ["a0"])
    for path in not_files(tmp_path):
        kind = {"fifo": "a pipe", "full": "a character device"}.get(path.name, "a directory")
        with pytest.raises(ConfigurationError, match=rf"results file {re.escape(str(path))} is {kind}, not a regular"):
            await evaluate_adapters(adapters, [EvalPrompt("p0", "hi")], FAKE, path)
        with pytest.raises(ConfigurationError, match="give the path of a file"):
            read_rows(path)
    # The CSV summary's path too, before the results file is created.
    output = tmp_path / "results.jsonl"
    os.mkfifo(tmp_path / "results.summary.csv")
    with pytest.raises(ConfigurationError, match=r"summary file .*results.summary.csv is a pipe"):
        await evaluate_adapters(adapters, [EvalPrompt("p0", "hi")], FAKE, output)
    assert not output.exists()


def test_the_cli_refuses_a_pipe_or_device_as_output_at_once(tmp_path: Path) -> None:
    command = eval_command(tmp_path, tmp_path / "unused.jsonl")
    command[command.index("--score") : command.index("--score") + 2] = []
    outputs = [*not_files(tmp_path), Path("/dev/stdout")]
    for output in outputs:
        command[command.index("--output") + 1] = str(output)
        # stdout is a pipe here, as in `inference eval --output /dev/stdout ... | cat`, which used to hang
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, (output, done.stderr)
        assert done.stderr.startswith(f"inference: error: the results file {output} is ")
        assert done.stderr.count("\n") == 1 and "give the path of a file" in done.stderr
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)  # nothing replaced it


# A full disk names the file ----------------------------------------------------------------------------------


class FullDisk:
    """A results file handle on a disk with ``room`` bytes left: a short write, then ENOSPC, as the kernel does."""

    def __init__(self, handle: Any, room: int) -> None:
        self._handle, self.room = handle, room

    def write(self, data: Any) -> int:
        if self.room == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = int(self._handle.write(bytes(data[: self.room])))
        self.room -= written
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


async def test_a_full_disk_names_the_results_file_and_a_rerun_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapters = make_adapters(tmp_path / "adapters", ["a0", "a1"])
    output = tmp_path / "results.jsonl"
    prompts = [EvalPrompt(f"p{i}", f"question {i}") for i in range(5)]
    opened = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *args, **kwargs: FullDisk(opened(*args, **kwargs), room=1500))
    with pytest.raises(ConfigurationError) as refused:
        await evaluate_adapters(adapters, prompts, FAKE, output)
    assert str(refused.value) == (
        f"cannot write to the results file {output}: No space left on device: free some space, then run again "
        "to resume (the rows written so far are kept)"
    )
    monkeypatch.undo()
    kept = read_rows(output)
    assert 0 < len(kept) < 15
    summary = await evaluate_adapters(adapters, prompts, FAKE, output)  # space again: it resumes
    assert (summary.rows_resumed, summary.rows_written) == (len(kept), 15 - len(kept))
    every = ("(base)", "a0", "a1")
    assert sorted(row_key(row) for row in read_rows(output)) == [(a, f"p{i}") for a in every for i in range(5)]


async def test_a_full_disk_names_the_summary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adapters = make_adapters(tmp_path / "adapters", ["a0"])
    output = tmp_path / "results.jsonl"
    summary = await evaluate_adapters(adapters, [EvalPrompt("p0", "hi")], FAKE, output)
    opened = open

    def full_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = opened(file, mode, *args, **kwargs)
        if "w" in mode:
            handle.write = lambda text: (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        return handle

    monkeypatch.setattr("inference.evaluation.summary.open", full_open, raising=False)
    where = re.escape(str(summary.csv_path))
    with pytest.raises(ConfigurationError, match=rf"cannot write the summary {where}: No space left on device"):
        summary.write_csv()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
async def test_the_lock_is_released_when_the_run_ends_even_if_a_forked_child_holds_the_file(tmp_path: Path) -> None:
    """A backend that forks a worker while the file is open (a process inherits the open file) must not keep the
    next run out: the run releases the lock itself when it ends."""
    adapters = make_adapters(tmp_path / "adapters", ["a0"])
    output = tmp_path / "results.jsonl"
    read_end, write_end = os.pipe()

    class Forking(FakeProvider):
        child = 0

        async def _generate(self, request: Any) -> Any:
            if not Forking.child:
                Forking.child = os.fork()
                if Forking.child == 0:  # the worker: waits until the test closes the pipe, then exits
                    os.close(write_end)
                    os.read(read_end, 1)
                    os._exit(0)
            return await super()._generate(request)

    try:
        await evaluate_adapters(adapters, [EvalPrompt("p0", "hi")], FAKE, output, provider=Forking())
        again = await evaluate_adapters(adapters, [EvalPrompt("p1", "ho")], FAKE, output)  # the worker still lives
        assert again.rows_written == 2  # p1 for the adapter and the base model
    finally:
        os.close(write_end)
        os.close(read_end)
        if Forking.child:
            os.waitpid(Forking.child, 0)
