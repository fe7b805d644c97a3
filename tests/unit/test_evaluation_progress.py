"""The evaluation progress bar on a terminal: log records, warnings and prints start on their own line, above it."""

from __future__ import annotations

import io
import logging
import os
import pty
import subprocess
import sys
from collections.abc import Iterator

import pytest

from inference.evaluation import Progress, TerminalProgress


def screen_lines(output: str) -> list[str]:
    """What a terminal shows after ``output``: carriage returns, new lines and erase-to-end-of-line applied."""
    lines, column = [""], 0
    index = 0
    while index < len(output):
        if output.startswith("\x1b[K", index):
            lines[-1] = lines[-1][:column]
            index += 3
            continue
        character = output[index]
        if character == "\r":
            column = 0
        elif character == "\n":
            lines.append("")
            column = 0
        else:
            line = lines[-1]
            lines[-1] = line[:column] + character + line[column + 1 :]
            column += 1
        index += 1
    return lines[:-1] if lines[-1] == "" else lines


def progress(rows_done: int) -> Progress:
    return Progress(
        adapters_done=0, adapters_total=2, rows_done=rows_done, rows_total=4, rows_this_run=rows_done, elapsed_s=1.0,
        adapter_id="a1",
    )  # fmt: skip


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal_logger() -> Iterator[tuple[Terminal, logging.Logger]]:
    screen = Terminal()
    handler = logging.StreamHandler(screen)
    logger = logging.getLogger("inference.evaluation.test_progress")
    logger.addHandler(handler)
    logger.propagate = False
    yield screen, logger
    logger.removeHandler(handler)
    logger.propagate = True


def test_a_log_record_starts_on_a_fresh_line_and_the_bar_is_drawn_again_below(
    terminal_logger: tuple[Terminal, logging.Logger],
) -> None:
    screen, logger = terminal_logger
    bar = TerminalProgress(screen, min_interval_s=0)
    bar(progress(1))
    logger.warning("adapter a1 (runs/a1) could not be loaded: no adapter_config.json")
    shown_after_warning = screen_lines(screen.getvalue())
    bar(progress(2))
    bar.close()
    logger.warning("after the run")
    assert shown_after_warning == [
        "adapter a1 (runs/a1) could not be loaded: no adapter_config.json",
        bar.render(progress(1)),
    ]
    assert screen_lines(screen.getvalue()) == [
        "adapter a1 (runs/a1) could not be loaded: no adapter_config.json",
        bar.render(progress(2)),
        "after the run",
    ]


def test_write_prints_above_the_bar_and_a_partial_line_is_not_overdrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    with TerminalProgress(min_interval_s=0) as bar:
        bar(progress(1))
        bar.write("note one")
        sys.stderr.write("partial ")
        bar(progress(2))  # not drawn over the unfinished line
        sys.stderr.write("line\n")
        bar(progress(3))
    assert sys.stderr is screen
    assert screen_lines(screen.getvalue()) == ["note one", "partial line", bar.render(progress(3))]


def test_streams_and_handlers_are_put_back_on_close(terminal_logger: tuple[Terminal, logging.Logger]) -> None:
    screen, logger = terminal_logger
    [handler] = [handler for handler in logger.handlers if type(handler) is logging.StreamHandler]
    bar = TerminalProgress(screen, min_interval_s=0)
    bar(progress(1))
    assert isinstance(handler, logging.StreamHandler) and handler.stream is not screen
    bar.close()
    bar.close()
    assert handler.stream is screen


SCRIPT = """
import logging, sys, warnings
from inference.evaluation import Progress, TerminalProgress
bar = TerminalProgress(min_interval_s=0)
assert bar.enabled, "stderr should be a terminal"
bar(Progress(0, 2, 1, 4, 1, 1.0, "a1"))
logging.getLogger("inference.evaluation").warning("adapter a1 could not be loaded")
warnings.warn("a Python warning")
print("printed to stderr", file=sys.stderr)
bar(Progress(1, 2, 4, 4, 4, 2.0, None))
bar.close()
print("after", file=sys.stderr)
"""


def test_in_a_real_terminal_logging_warnings_and_prints_go_above_the_bar() -> None:
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal
    )
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal is closed once the process exits
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    assert process.wait(timeout=60) == 0
    lines = screen_lines(b"".join(chunks).decode())
    bar_line = "[########################] adapters 1/2 rows 4/4 2.0 rows/s left 0s"
    assert lines[0] == "adapter a1 could not be loaded"
    assert lines[1].endswith("UserWarning: a Python warning")
    assert lines[-3:] == ["printed to stderr", bar_line, "after"]
    assert all(not line.startswith("[") for line in lines[:-2])  # no message shares the bar's line
