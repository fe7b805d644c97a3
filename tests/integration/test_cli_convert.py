"""``inference convert-adapter``: the command a user runs, in a real subprocess, and its exit statuses."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from inference.cli import main
from inference.testing.tiny_models import TinyModel

pytestmark = pytest.mark.integration


def run_cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inference.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_convert_adapter_writes_the_gguf_and_prints_its_path(
    tiny_models: dict[str, TinyModel], tmp_path: Path, repo_root: Path
) -> None:
    model = tiny_models["llama"]
    output = tmp_path / "a0.gguf"
    result = run_cli(
        "convert-adapter", model.adapter_dirs["a0"], "--base", model.gguf_path, "-o", output, cwd=repo_root
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(output)
    assert output.read_bytes()[:4] == b"GGUF"


def test_a_bad_adapter_exits_1_with_the_reason_and_no_traceback(
    tiny_models: dict[str, TinyModel], tmp_path: Path, repo_root: Path
) -> None:
    adapter = tmp_path / "dora"
    shutil.copytree(tiny_models["qwen2"].adapter_dirs["a0"], adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    output = tmp_path / "out.gguf"
    result = run_cli("convert-adapter", adapter, "--base", tiny_models["qwen2"].gguf_path, "-o", output, cwd=repo_root)
    assert result.returncode == 1
    assert "uses DoRA" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not output.exists()


def test_a_missing_option_is_a_usage_error(tmp_path: Path, repo_root: Path) -> None:
    result = run_cli("convert-adapter", tmp_path, "-o", tmp_path / "out.gguf", cwd=repo_root)
    assert result.returncode == 2
    assert "--base" in result.stderr


def test_help_describes_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "convert-adapter" in capsys.readouterr().out
    assert main(["convert-adapter", "--help"]) == 0
    text = capsys.readouterr().out
    for option in ("PEFT_DIR", "--base", "-o OUT.gguf", "example:"):
        assert option in text


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "convert-adapter" in capsys.readouterr().err


def test_a_wrong_base_exits_1_in_process(
    tiny_models: dict[str, TinyModel], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing_base = tmp_path / "missing.gguf"
    status = main(
        ["convert-adapter", str(tiny_models["qwen2"].adapter_dirs["a1"]), "--base", str(missing_base), "-o", "x.gguf"]
    )
    assert status == 1
    assert f"base model {missing_base} does not exist" in capsys.readouterr().err


def test_an_output_that_cannot_be_written_exits_1_with_one_line(
    tiny_models: dict[str, TinyModel], tmp_path: Path, repo_root: Path
) -> None:
    model = tiny_models["llama"]
    blocker = tmp_path / "a-file"
    blocker.write_text("the output's directory would have to be here")
    targets = [blocker / "out.gguf", tmp_path]  # under a file; a directory itself
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        targets.append(locked / "out.gguf")
    for output in targets:
        result = run_cli(
            "convert-adapter", model.adapter_dirs["a0"], "--base", model.gguf_path, "-o", output, cwd=repo_root
        )
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith("inference: error: ") and result.stderr.count("\n") == 1
        assert "Traceback" not in result.stderr and result.stdout == ""


def test_an_output_that_is_not_a_regular_file_is_refused_and_left_alone(
    tiny_models: dict[str, TinyModel], tmp_path: Path, repo_root: Path
) -> None:
    """The file is written beside the output and renamed into place: over a pipe or /dev/stdout (a symlink to
    one), that rename would replace the pipe or the link itself (as root, /dev/stdout or /dev/null)."""
    model = tiny_models["llama"]
    fifo = tmp_path / "out.gguf"
    os.mkfifo(fifo)
    link = tmp_path / "stdout"
    link.symlink_to(fifo)
    for output in (fifo, link):
        result = run_cli(
            "convert-adapter", model.adapter_dirs["a0"], "--base", model.gguf_path, "-o", output, cwd=repo_root
        )
        assert result.returncode == 1, result.stderr
        assert f"output {output} is not a regular file" in result.stderr and "Traceback" not in result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.gguf", "stdout"]  # no temporary left
