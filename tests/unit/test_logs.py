"""Log lines: ``--log-level`` / ``INFERENCE_LOG_LEVEL``, the text format (time, level, logger) and JSON lines with
the records' fields (``INFERENCE_LOG_FORMAT=json``), one error line per failure, ``inference.configure_logging``."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest

import inference
from inference.cli import main

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: .+$")
DEAD = "http://127.0.0.1:9/v1"  # the discard port: nothing answers


@pytest.fixture(autouse=True)
def _no_log_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("INFERENCE_LOG_LEVEL", raising=False)
    monkeypatch.delenv("INFERENCE_LOG_FORMAT", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "style").mkdir()  # the fake loads any directory: --adapter style loads it under 'style'


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


GENERATE_WITH_ADAPTER = ["generate", "Hi", "--provider", "fake", "--adapter", "./style", "--max-tokens", "2"]


def test_the_level_comes_from_the_flag_before_or_after_the_command_or_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    status, _, err = run(GENERATE_WITH_ADAPTER, capsys)
    assert (status, err) == (0, "")  # the default level, warning, shows no adapter load
    for argv in (["--log-level", "info", *GENERATE_WITH_ADAPTER], [*GENERATE_WITH_ADAPTER, "--log-level", "INFO"]):
        status, _, err = run(argv, capsys)
        lines = err.splitlines()
        assert status == 0 and len(lines) == 2, err
        assert all(TEXT_LINE.match(line) for line in lines), err
        assert " INFO inference.adapters: fake: adapter 'style' load " in lines[0]
    monkeypatch.setenv("INFERENCE_LOG_LEVEL", "info")
    assert len(run(GENERATE_WITH_ADAPTER, capsys)[2].splitlines()) == 2
    _, _, err = run(["adapters", "list", "--provider", "fake", "--log-level", "debug"], capsys)  # a nested command
    assert "fake" in err and "unrecognized arguments" not in err


def test_json_lines_carry_the_records_fields_and_the_error_is_a_record_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERENCE_LOG_FORMAT", "json")
    status, out, err = run([*GENERATE_WITH_ADAPTER, "--log-level", "info"], capsys)
    assert status == 0 and out
    records = [json.loads(line) for line in err.splitlines()]
    load = records[0]
    assert {key: load[key] for key in ("level", "logger", "adapter_event", "provider", "adapter_id", "outcome")} == {
        "level": "INFO", "logger": "inference.adapters", "adapter_event": "load", "provider": "fake",
        "adapter_id": "style", "outcome": "ok",
    }
    assert load["duration_ms"] >= 0 and load["time"].endswith("Z")

    status, _, err = run(["generate", "Hi", "--provider", "vllm", "--base-url", DEAD, "--set", "max_retries=0"], capsys)
    assert status == 1
    (record,) = [json.loads(line) for line in err.splitlines()]  # one line for the failure
    assert (record["level"], record["logger"]) == ("ERROR", "inference.cli")
    assert record["message"].startswith("error: nothing answers at " + DEAD)


def test_one_error_line_in_text(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["generate", "Hi", "--provider", "vllm", "--base-url", DEAD, "--set", "max_retries=0"],
                           capsys)
    assert (status, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith("inference: error: nothing answers at ")
    load = ["adapters", "load", "x", "/a", "--provider", "vllm", "--base-url", DEAD, "--set", "max_retries=0"]
    status, _, err = run(load, capsys)  # the failed load's event record is not a second line for the same failure
    assert status == 1 and err.count("\n") == 1 and err.startswith("inference: error: ")
    status, _, err = run([*load, "--log-level", "info"], capsys)  # unless asked for
    assert " WARNING inference.adapters: vllm: adapter 'x' load " in err.splitlines()[0]


def test_a_bad_log_variable_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERENCE_LOG_LEVEL", "loud")
    status, out, err = run(["health", "--provider", "fake"], capsys)
    assert (status, out) == (2, "")
    assert "INFERENCE_LOG_LEVEL='loud'" in err and err.count("\n") == 1


def test_the_command_leaves_logging_as_it_found_it(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level, logging.getLogger("inference").level)
    run(["--log-level", "debug", *GENERATE_WITH_ADAPTER], capsys)
    assert (list(root.handlers), root.level, logging.getLogger("inference").level) == before


def test_configure_logging_for_a_service() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    levels = (root.level, logging.getLogger("inference").level)
    handler = inference.configure_logging("debug", "json", stream=stream)
    try:
        again = inference.configure_logging("info", "json", stream=stream)  # replaces the first, never doubles
        assert handler not in root.handlers and again in root.handlers
        logging.getLogger("inference.test").info("replica %s is back", "a", extra={"url": "http://a/v1"})
        logging.getLogger("inference.test").debug("not shown at info")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("inference.test").exception("failed")
    finally:
        root.removeHandler(again)
        root.setLevel(levels[0])
        logging.getLogger("inference").setLevel(levels[1])
    first, second = (json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{"))
    assert (first["message"], first["url"], first["level"]) == ("replica a is back", "http://a/v1", "INFO")
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]
    with pytest.raises(inference.ConfigurationError, match="log_format must be one of 'text', 'json'"):
        inference.configure_logging(format="yaml")


async def test_an_adapter_path_with_a_line_break_cannot_forge_a_text_line(tmp_path: Path) -> None:
    """The text format is one record per line: a path with a newline wrote a second, forged, record."""
    from inference.fake_provider import FakeProvider

    evil = tmp_path / "evil\n2025-06-01T12:00:00.000Z ERROR inference.adapters: FORGED"
    evil.mkdir()
    stream = io.StringIO()
    root = logging.getLogger()
    levels = (root.level, logging.getLogger("inference").level)
    handler = inference.configure_logging("info", "text", stream=stream)
    try:
        provider = FakeProvider()
        await provider.load_adapter("x", evil)
    finally:
        root.removeHandler(handler)
        root.setLevel(levels[0])
        logging.getLogger("inference").setLevel(levels[1])
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and TEXT_LINE.match(lines[0]), lines
    assert "evil\\n2025-06-01T12:00:00.000Z ERROR" in lines[0] and " INFO inference.adapters: " in lines[0]


def test_an_exception_quoting_outside_text_cannot_forge_a_text_line() -> None:
    """The traceback's lines are indented: an exception message with a newline and a timestamp (a path, a server's
    words) made a line that read as a record of its own."""
    stream = io.StringIO()
    root = logging.getLogger()
    levels = (root.level, logging.getLogger("inference").level)
    handler = inference.configure_logging("info", "text", stream=stream)
    try:
        try:
            raise OSError("cannot read /tmp/x\n2025-06-01T12:00:00.000Z INFO inference.adapters: forged")
        except OSError:
            logging.getLogger("inference.adapters").warning("unload failed", exc_info=True)
    finally:
        root.removeHandler(handler)
        root.setLevel(levels[0])
        logging.getLogger("inference").setLevel(levels[1])
    lines = stream.getvalue().splitlines()
    assert TEXT_LINE.match(lines[0]) and "unload failed" in lines[0]
    assert [line for line in lines if TEXT_LINE.match(line)] == [lines[0]]  # the rest is the traceback
    assert all(line.startswith("    ") for line in lines[1:]) and any("OSError" in line for line in lines[1:])
