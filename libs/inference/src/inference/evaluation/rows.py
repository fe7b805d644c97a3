"""The results file: one JSON object per (adapter, prompt) row, appended as each finishes, safe to resume.

Every row is written as one line and flushed at once; the file is fsync'd at adapter boundaries and on close.
A run killed at any point leaves complete lines plus at most one torn last line; :func:`open_results`
cuts that torn tail off before appending, so a rerun sees exactly the rows that were finished.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from inference.exceptions import ConfigurationError, InvalidRequestError

__all__ = ["ROW_FIELDS", "ResultsWriter", "open_results", "read_rows", "row_key"]

ROW_FIELDS = (
    "adapter_id",
    "adapter_path",
    "adapter_hash",
    "prompt_id",
    "prompt_hash",
    "output",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "latency_s",
    "error",
    "score",
    "settings",
)
"""The keys of every row, in order. ``error`` is ``null`` or ``{"stage", "type", "message"}``.

``adapter_path`` is absolute; ``adapter_hash`` and ``prompt_hash`` identify the adapter's files and the prompt's
text, and ``settings`` the run's provider, base model, generation settings and scorer (see
:mod:`inference.evaluation.identity`). Rows written before these three existed lack them.
"""


def row_key(row: dict[str, Any]) -> tuple[str, str]:
    """The (adapter id, prompt id) pair a row answers."""
    return str(row["adapter_id"]), str(row["prompt_id"])


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read the complete rows of a results file (none if it does not exist); a torn last line is ignored.

    Raises:
        InvalidRequestError: A line other than the last is not a row (the file is not a results file).
    """
    return list(_complete_rows(Path(path))[0])


def _complete_rows(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The rows, and the byte length of the file's complete part (where appending may start)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    except OSError as error:
        raise ConfigurationError(
            f"cannot read the results file {path}: {error.strerror or error}", path=str(path)
        ) from error
    *terminated, _torn_tail = data.split(b"\n")  # the part after the last newline was cut by a kill: redo it
    rows: list[dict[str, Any]] = []
    end = 0
    for number, line in enumerate(terminated, start=1):
        if line.strip():
            try:
                row = json.loads(line)
                row_key(row)
            except (ValueError, KeyError, TypeError) as error:
                if number == len(terminated) and not _torn_tail:  # the last line, damaged: redo it too
                    break
                raise InvalidRequestError(
                    f"line {number} of {path} is not a result row: the file is not an evaluation results file "
                    "or was edited; choose another output file or fix the line",
                    path=str(path),
                ) from error
            rows.append(row)
        end += len(line) + 1
    return rows, end


def open_results(
    path: str | os.PathLike[str], *, check: Callable[[list[dict[str, Any]]], object] | None = None
) -> tuple[list[dict[str, Any]], ResultsWriter]:
    """Read the finished rows of ``path`` and open it for appending (created with its directory if missing).

    A torn last line (a run killed mid-write) is cut off first, so appended rows start on a fresh line.

    Args:
        path: The results file.
        check: Called with the rows before the file is created or changed; whatever it raises leaves the
            file as it was.

    Returns:
        The rows already there, and the writer to append more.

    Raises:
        ConfigurationError: The file or its directory cannot be created or written.
        InvalidRequestError: The file holds lines that are not result rows.
    """
    path = Path(path)
    rows, end = _complete_rows(path)
    if check is not None:
        check(rows)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "ab")  # noqa: SIM115 - owned by the writer, closed by its close()
        if handle.tell() != end:
            handle.truncate(end)
            handle.seek(end)
    except OSError as error:
        raise ConfigurationError(
            f"cannot write the results file {path}: {error.strerror or error}", path=str(path)
        ) from error
    return rows, ResultsWriter(path, handle)


class ResultsWriter:
    """Appends rows to a results file, one flushed line each; use :func:`open_results` to make one."""

    def __init__(self, path: Path, handle: IO[bytes]) -> None:
        self.path = path
        self._handle = handle

    def write(self, row: dict[str, Any]) -> None:
        """Append one row and flush it to the operating system (it survives the process being killed)."""
        line = json.dumps(row, ensure_ascii=False, separators=(", ", ": ")) + "\n"
        self._handle.write(line.encode("utf-8"))
        self._handle.flush()

    def sync(self) -> None:
        """Make the rows written so far durable on disk (they survive a power cut)."""
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        """Sync and close the file. Safe to call twice."""
        if not self._handle.closed:
            self.sync()
            self._handle.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
