"""Files the command line reads (prompt sets, ``--messages``, ``--json-schema``): whatever is wrong with one, the
command prints one line naming the file (and the line) and exits with its status for bad input, never a traceback.

Prompt sets are read by the SDK's evaluation (a refusal: exit 1, as for a line that is not JSON); ``--messages`` and
``--json-schema`` by the command line (a usage error: exit 2, as for a file that is not JSON).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from inference.cli import main

DEEP = "[" * 100_000 + "]" * 100_000


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(argv)
    return status, capsys.readouterr().err


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("inference: "), err
    assert "Traceback" not in err
    return err


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    path = tmp_path / "adapters" / "a1"
    path.mkdir(parents=True)
    return path


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"id": 1, "prompt": "fine"}\n{"id": 2, "prompt": "a\\ud800"}\n', "line 2: 'prompt' holds '\\ud800'"),
        ('{"id": 1, "prompt": "café"}\n'.encode("latin-1"), "line 1 is not UTF-8 text (byte 0xe9"),
    ],
    ids=["lone-surrogate", "latin-1"],
)
def test_a_bad_prompt_set_exits_1_with_one_line_naming_it(
    tmp_path: Path, adapter: Path, content: bytes, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts, output = tmp_path / "prompts.jsonl", tmp_path / "results.jsonl"
    prompts.write_bytes(content)
    argv = ["eval", "--adapters", str(adapter), "--prompts", str(prompts), "--output", str(output)]
    argv += ["--provider", "fake"]
    status, err = run(argv, capsys)
    assert status == 1
    assert f"{prompts} {needle}" in one_line(err)
    assert not output.exists()


def test_a_prompt_with_a_raw_line_separator_is_evaluated(
    tmp_path: Path, adapter: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts, output = tmp_path / "prompts.jsonl", tmp_path / "results.jsonl"
    prompts.write_text('{"id": "a", "prompt": "one\u2028two"}\r\n{"id": "b", "prompt": "x\x85y"}\r\n', encoding="utf-8")
    argv = ["eval", "--adapters", str(adapter), "--prompts", str(prompts), "--output", str(output)]
    argv += ["--provider", "fake"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_written"] == 4  # the adapter's rows and the base model's


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot be read: No such file or directory"),
        (DEEP.encode(), "nests its arrays and objects too deeply"),
        ('{"type": "string",\n "description": "café"}'.encode("latin-1"), "is not UTF-8 text: byte 0xe9 on line 2"),
        (b'{"type": "string",\n "description": "\\udc00"}', "holds a lone surrogate (such as \\ud800"),
        (b'{"type": "string",\n}', "is not JSON: Expecting property name enclosed in double quotes on line 2"),
    ],
    ids=["missing", "deep", "latin-1", "lone-surrogate", "not-json"],
)
@pytest.mark.parametrize("how", ["flag", "set"])
def test_a_bad_json_schema_file_is_a_one_line_usage_error(
    tmp_path: Path, adapter: Path, content: bytes | None, needle: str, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = tmp_path / "schema.json"
    if content is not None:
        schema.write_bytes(content)
    given = ["--json-schema", str(schema)] if how == "flag" else ["--set", f"json_schema={schema}"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 1, "prompt": "hi"}\n')
    argv = ["eval", "--adapters", str(adapter), "--prompts", str(prompts), "--output", str(tmp_path / "r.jsonl")]
    status, err = run([*argv, "--provider", "fake", *given], capsys)
    assert status == 2
    assert f"usage error: {'--json-schema' if how == 'flag' else '--set json_schema'}" in one_line(err)
    assert f"the JSON schema file {schema} {needle}" in err


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot be read: No such file or directory"),
        ('[{"role": "user",\n "content": "café"}]'.encode("latin-1"), "is not UTF-8 text: byte 0xe9 on line 2"),
        (DEEP.encode(), "nests its arrays and objects too deeply"),
        (b'[{"role": "user", "content": "ok"}, {"role": "user", "content": "\\ud800"}]', "in $[1].content"),
    ],
    ids=["missing", "latin-1", "deep", "lone-surrogate"],
)
def test_a_bad_messages_file_is_a_one_line_usage_error(
    tmp_path: Path, content: bytes | None, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = tmp_path / "chat.json"
    if content is not None:
        messages.write_bytes(content)
    status, err = run(["generate", "--messages", str(messages), "--provider", "fake"], capsys)
    assert status == 2
    assert f"usage error: the --messages file {messages} " in one_line(err) and needle in err


def test_a_good_messages_file_in_utf8_with_a_byte_order_mark_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = tmp_path / "chat.json"
    messages.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"role": "user", "content": "caf\u00e9 \U0001f600"}]).encode())
    status, err = run(["generate", "--messages", str(messages), "--provider", "fake"], capsys)
    assert status == 0, err


def test_the_program_prints_no_traceback_for_these_files(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text(DEEP)
    (tmp_path / "chat.json").write_bytes('[{"role": "user", "content": "café"}]'.encode("latin-1"))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "inference.cli", "generate", *args, "--provider", "fake"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        )

    for args in (
        ["hi", "--json-schema", "deep.json"], ["hi", "--json-schema", "gone.json"], ["--messages", "chat.json"]
    ):
        done = cli(*args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert args[-1] in done.stderr


@pytest.mark.skipif(
    not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)), reason="no /dev/full here"
)
@pytest.mark.parametrize("extra", [[], ["--stream"], ["--json"]])
def test_a_full_standard_output_is_named_in_one_line(extra: list[str]) -> None:
    with open("/dev/full", "w") as full:  # `inference generate ... > file` on a full disk
        done = subprocess.run(
            [sys.executable, "-m", "inference.cli", "generate", "Hello", "--provider", "fake", *extra],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr == (
        "inference: error: standard output: No space left on device: free some space and run the command again\n"
    )
