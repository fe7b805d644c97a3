"""How every command runs: on a fresh event loop, its answer on stdout (text or JSON), its failure as one line on
stderr and an exit status (2 for a usage error; a closed pipe or a full disk stopped quietly or named).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


class _UsageError(Exception):
    """The command line does not make sense (exit status 2)."""


def _print_error(message: str) -> None:
    """One line on stderr, whatever line breaks the message holds (a JSON record with INFERENCE_LOG_FORMAT=json)."""
    from inference.cli.logs import log_error

    line = " ".join(message.split())
    if not log_error(line):
        print(f"inference: {line}", file=sys.stderr)


def _os_error_sentence(error: OSError) -> str:
    where = f"{error.filename}: " if error.filename is not None else ""
    if error.errno in _DISK_FULL:
        return f"{where}{error.strerror or error}: free some space and run the command again"
    return f"{where}{error.strerror or error}: check the path and its permissions"


_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}


class _StandardOutput:
    """``sys.stdout`` while a command runs: a write or flush the system refuses (``> file`` on a full disk)
    names ``standard output`` as its file, so the one-line error says which file is full."""

    name = "standard output"

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return int(self._named(self._stream.write, text))

    def flush(self) -> None:
        self._named(self._stream.flush)

    def _named(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as error:
            if error.filename is None and not isinstance(error, BrokenPipeError):
                error.filename = self.name
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_closed() -> int:
    """Stop quietly after the reader of stdout went away (``| head``); the exit status is 128 + SIGPIPE."""
    _drop_stdout()
    return 128 + int(getattr(signal, "SIGPIPE", 13))  # 13 where the platform has no SIGPIPE (Windows)


def _drop_stdout() -> None:
    """Point stdout at devnull so that the flush at exit cannot fail again (Python's recommended handling)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file descriptor (a test's capture): nothing to flush later
        pass


def _run_async(work: Callable[[], Awaitable[_T]]) -> _T:
    """Run ``work`` on a fresh event loop and close every provider it used before returning."""
    from inference.factory import aclose_all_providers

    async def run() -> _T:
        try:
            return await work()
        finally:
            await aclose_all_providers()

    return asyncio.run(run())


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False), flush=True)
