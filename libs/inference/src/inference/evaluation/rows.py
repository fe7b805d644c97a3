"""The results file: one JSON object per (adapter, prompt) row, appended as each finishes, safe to resume.

Every row is written as one line with one ``write`` call; the file is fsync'd at adapter boundaries and on close.
A run killed at any point leaves complete lines plus at most one torn last line; :func:`open_results`
cuts that torn tail off before appending, so a rerun sees exactly the rows that were finished.

One run writes a file at a time: :func:`open_results` takes an exclusive advisory lock (``flock``) on the file
before it reads it, and holds it until the writer is closed; the operating system drops it when the process
ends, however it ends (``SIGKILL`` included). A second run on the same file is refused at once with
:class:`ResultsFileInUseError`. The lock is advisory: it keeps evaluation runs apart, not other programs (and
where the platform has no ``flock``, as on Windows, nothing is locked).

A results file must be a regular file (or not exist yet): it is read back to resume and appended to, which a
pipe (``/dev/stdout`` into ``| cat``), a device (``/dev/full``, ``/dev/null``) or a directory cannot do, so such a
path is refused before anything runs (:func:`check_file_path`).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from inference.exceptions import ConfigurationError, InvalidRequestError

__all__ = [
    "ROW_FIELDS",
    "ResultsFileInUseError",
    "ResultsWriter",
    "check_file_path",
    "open_results",
    "read_rows",
    "row_error",
    "row_key",
]

logger = logging.getLogger("inference.evaluation")

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class ResultsFileInUseError(ConfigurationError):
    """Another evaluation run is writing the results file (it holds the file's lock).

    Raised at once, before anything runs or is written. Wait for that run to finish (then run again to resume
    from its rows), or write to another output file.
    """

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
"""The keys of every row, in order. ``error`` is ``null`` or ``{"stage", "type", "message"}``: the stage that failed
(``load``, ``generate``, ``score``), the figures of the other stages being kept (a row whose generation and scoring
both failed has the scoring's in a further key, ``likelihood_error``).

``adapter_path`` is absolute; ``adapter_hash`` and ``prompt_hash`` identify the adapter's files and the prompt's
text, and ``settings`` the run's provider, base model, generation settings and scorer (see
:mod:`inference.evaluation.identity`). Rows written before these three existed lack them.
"""


def row_error(stage: str, error: BaseException) -> dict[str, str]:
    """The ``error`` field of a row: the stage that failed (``load``, ``score``, ``generate``), the type and message."""
    return {"stage": stage, "type": type(error).__name__, "message": str(error) or repr(error)}


def row_key(row: dict[str, Any]) -> tuple[str, str]:
    """The (adapter id, prompt id) pair a row answers."""
    return str(row["adapter_id"]), str(row["prompt_id"])


def check_file_path(path: str | os.PathLike[str], what: str = "results file") -> None:
    """Refuse a path that exists and is not a regular file (a pipe, a device, a directory, a socket).

    Checked without opening it (opening a pipe can block, reading a device can go on forever). A missing path
    is fine: it will be created.

    Raises:
        ConfigurationError: The path names something other than a regular file; the message says what it is.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise ConfigurationError(
            f"cannot use the {what} {os.fspath(path)}: {error.strerror or error}", path=os.fspath(path)
        ) from error
    _require_regular(mode, Path(path), what)


def _require_regular(mode: int, path: Path, what: str) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    raise ConfigurationError(
        f"the {what} {path} is {kind}, not a regular file: give the path of a file (an evaluation reads its "
        "results file back to resume, appends to it and writes its summary next to it)",
        path=str(path),
    )


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read the complete rows of a results file (none if it does not exist); a torn last line is ignored.

    Raises:
        InvalidRequestError: A line other than the last is not a row (the file is not a results file).
        ConfigurationError: The path is not a regular file (a pipe, a device), or cannot be read.
    """
    path = Path(path)
    check_file_path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise ConfigurationError(
            f"cannot read the results file {path}: {error.strerror or error}", path=str(path)
        ) from error
    return _complete_rows(data, path)[0]


def _complete_rows(data: bytes, path: Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of a results file's ``data``, and the byte length of its complete part (where appending starts)."""
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
    """Lock ``path``, read its finished rows and open it for appending (created with its directory if missing).

    The file is locked before it is read, so the rows are exactly those no other run can add to while the
    writer is open. A torn last line (a run killed mid-write) is cut off, so appended rows start on a fresh line.

    Args:
        path: The results file.
        check: Called with the rows before the file is created or changed; whatever it raises leaves the
            file as it was. (When the file is missing it is called with ``[]`` before the file is created,
            and again with the rows read under the lock should another run have written some meanwhile.)

    Returns:
        The rows already there, and the writer to append more (it holds the lock until closed).

    Raises:
        ResultsFileInUseError: Another run is writing the file (it holds the lock).
        ConfigurationError: The path is not a regular file, or the file or its directory cannot be created or
            written.
        InvalidRequestError: The file holds lines that are not result rows.
    """
    path = Path(path)
    check_file_path(path)
    handle = _open_locked(path, create=False)
    checked_empty = handle is None
    if handle is None:  # a new file: check before anything is created
        if check is not None:
            check([])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigurationError(
                f"cannot write the results file {path}: {error.strerror or error}", path=str(path)
            ) from error
        handle = _open_locked(path, create=True)
        if handle is None:  # never: creating it, a missing file or directory is an error (_not_created)
            raise ConfigurationError(f"cannot write the results file {path}", path=str(path))
    try:
        handle.seek(0)
        data = handle.readall()
        rows, end = _complete_rows(data, path)
        if check is not None and (rows or not checked_empty):
            check(rows)
        if len(data) != end:
            handle.truncate(end)
    except OSError as error:
        handle.close()
        raise ConfigurationError(
            f"cannot write the results file {path}: {error.strerror or error}", path=str(path)
        ) from error
    except BaseException:
        handle.close()
        raise
    return rows, ResultsWriter(path, handle)


def _open_locked(path: Path, *, create: bool) -> io.FileIO | None:
    """``path`` opened to read and append (unbuffered), locked for this run; ``None`` if it is missing (and, with
    ``create``, its directory is).

    Opened without blocking (a pipe made between the check and here cannot hang it), then checked to be a
    regular file, then locked without waiting.
    """
    flags = os.O_RDWR | os.O_APPEND | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        descriptor = os.open(path, flags | (os.O_CREAT if create else 0), 0o666)
    except FileNotFoundError as error:
        if not create:
            return None
        raise ConfigurationError(
            f"cannot write the results file {path}: {_not_created(path, error)}", path=str(path)
        ) from error
    except OSError as error:
        raise ConfigurationError(
            f"cannot write the results file {path}: {error.strerror or error}", path=str(path)
        ) from error
    handle = os.fdopen(descriptor, "r+b", buffering=0)
    try:
        _require_regular(os.fstat(descriptor).st_mode, path, "results file")
        if getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(descriptor, True)
        _lock(descriptor, path)
    except BaseException:
        handle.close()
        raise
    return handle


def _not_created(path: Path, error: OSError) -> str:
    """Why creating ``path`` found no such file or directory, though its directory was made just before."""
    where = path.parent
    try:
        if path.is_symlink():
            target = Path(os.path.realpath(path))
            if not target.parent.is_dir():
                return (
                    f"it is a symbolic link to {target}, whose directory {target.parent} does not exist: create that "
                    "directory, or give another path"
                )
            where = target.parent
        elif not where.is_dir():
            return f"its directory {where} was removed meanwhile"
    except OSError:  # the checks themselves failed: the error's own words say it
        pass
    return f"{error.strerror or error} (on creating it in {where}, a directory that exists)"


def _lock(descriptor: int, path: Path) -> None:
    """Take the exclusive lock of a results file for this run, or refuse at once if another run holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; keeping runs apart is the user's to do there
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ResultsFileInUseError(
            f"another evaluation run is writing {path} (it holds the file's lock): wait for it to finish and run "
            "again to resume from its rows, or write to another output file",
            path=str(path),
        ) from None
    except OSError as error:  # a file system without locks (some network mounts): go on, unprotected
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            raise ConfigurationError(
                f"cannot lock the results file {path}: {error.strerror or error}", path=str(path)
            ) from error
        logger.warning(
            "cannot lock %s (%s): two evaluation runs writing it at once would both append rows",
            path,
            error.strerror or error,
        )


def _unlock(descriptor: int) -> None:
    """Release the lock now, not when the last copy of the descriptor closes (a process forked meanwhile holds one)."""
    try:
        import fcntl
    except ImportError:
        return
    with contextlib.suppress(OSError):  # not locked (a file system without locks): nothing to release
        fcntl.flock(descriptor, fcntl.LOCK_UN)


class ResultsWriter:
    """Appends rows to a results file, one ``write`` per line; use :func:`open_results` to make one.

    It holds the file's lock until :meth:`close`. A write the operating system refuses (a full disk) is a
    :class:`~inference.exceptions.ConfigurationError` naming the file; what was written before stays, and a
    rerun resumes from it (a partly written last line is redone).
    """

    def __init__(self, path: Path, handle: io.FileIO) -> None:
        self.path = path
        self._handle = handle

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (it survives the process being killed: no buffer holds it)."""
        data = memoryview((json.dumps(row, ensure_ascii=False, separators=(", ", ": ")) + "\n").encode("utf-8"))
        try:
            while data:
                data = data[self._handle.write(data) or 0 :]  # unbuffered: a short write sends the rest
        except OSError as error:
            raise self._failed(error) from error

    def sync(self) -> None:
        """Make the rows written so far durable on disk (they survive a power cut)."""
        try:
            os.fsync(self._handle.fileno())
        except OSError as error:
            raise self._failed(error) from error

    def close(self) -> None:
        """Sync and close the file, which releases its lock. Safe to call twice."""
        if self._handle.closed:
            return
        try:
            self.sync()
        finally:
            _unlock(self._handle.fileno())
            self._handle.close()

    def _failed(self, error: OSError) -> ConfigurationError:
        advice = (
            ": free some space, then run again to resume (the rows written so far are kept)"
            if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG)
            else ""
        )
        return ConfigurationError(
            f"cannot write to the results file {self.path}: {error.strerror or error}{advice}", path=str(self.path)
        )

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        try:  # the error that stopped the run is the one to see, not a second one from the final sync
            self.close()
        except ConfigurationError as error:
            logger.warning("%s", error)
