"""A one-line progress bar for terminals (adapters and rows done, rate, time left); silent elsewhere.

While the bar is drawn, whatever else is printed to the terminal (log records, warnings, ``print``) is printed
above it: the bar's line is cleared first and the bar is drawn again below, so a message never starts in the
middle of the bar (as ``rich.live.Live`` and ``tqdm.write`` do).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO, cast

__all__ = ["Progress", "TerminalProgress", "format_duration"]


@dataclass(frozen=True)
class Progress:
    """Where an evaluation stands, passed to ``on_progress`` after each row and each adapter.

    Attributes:
        adapters_done: Adapters finished (skipped ones from an earlier run included).
        adapters_total: Adapters in the run.
        rows_done: Rows finished (rows found in the file from an earlier run included).
        rows_total: Adapters times prompts.
        rows_this_run: Rows produced by this run (the base of the rate).
        elapsed_s: Seconds since this run's work started: after the warm-up request that loads the model, so
            the rate and the time left are those of the work, not of the model's load.
        adapter_id: The adapter being evaluated, or ``None`` when finished.
        score_s: Seconds this run spent scoring (log-likelihoods), summed over the adapters' finished scoring
            phases (with several adapters in flight they overlap).
        generate_s: Seconds this run spent generating, likewise.
    """

    adapters_done: int
    adapters_total: int
    rows_done: int
    rows_total: int
    rows_this_run: int
    elapsed_s: float
    adapter_id: str | None
    score_s: float = 0.0
    generate_s: float = 0.0

    @property
    def rate(self) -> float:
        """Rows per second in this run."""
        return self.rows_this_run / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate, or ``None`` before the first row."""
        return (self.rows_total - self.rows_done) / self.rate if self.rate > 0 else None


def format_duration(seconds: float | None) -> str:
    """``75`` -> ``'1m15s'``; ``None`` -> ``'?'``."""
    if seconds is None:
        return "?"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class TerminalProgress:
    """Draws :class:`Progress` on one terminal line; does nothing when the stream is not a terminal.

    Pass an instance as ``on_progress`` and call :meth:`close` at the end (or use it as a context manager).
    From the first draw to :meth:`close`, text written to the terminal by anything else goes above the bar:
    ``sys.stderr`` (when the bar is drawn there) and ``sys.stdout`` (when it is a terminal) are wrapped, and so
    are the logging handlers that write to them; :meth:`close` puts them back. :meth:`write` prints a line
    above the bar explicitly.

    Args:
        stream: Where to draw (``sys.stderr`` by default).
        enabled: Force drawing on or off; by default only when ``stream`` is a TTY.
        width: Characters of the bar itself.
        min_interval_s: Least time between two redraws (the last state is always drawn).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        width: int = 24,
        min_interval_s: float = 0.1,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self.stream) if enabled is None else enabled
        self.width = width
        self.min_interval_s = min_interval_s
        self._last_draw = 0.0
        self._drawn = False  # the bar was drawn since the last close(): close() ends its line
        self._visible = False  # the bar is on the screen now (not cleared for other output)
        self._line = ""
        self._partial: set[int] = set()  # streams (by id) that wrote text without its end of line yet
        self._lock = threading.RLock()
        self._redirected = False
        self._restore: list[Callable[[], None]] = []

    def __call__(self, progress: Progress) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        finished = progress.rows_done >= progress.rows_total
        if not finished and now - self._last_draw < self.min_interval_s:
            return
        self._last_draw = now
        if not self._redirected:  # outside the lock: a handler's lock is taken there (lock order: handler, bar)
            self._redirected = True
            self._redirect()
        with self._lock:
            self._line = self.render(progress)
            self._draw()

    def render(self, progress: Progress) -> str:
        """The line for ``progress``."""
        fraction = progress.rows_done / progress.rows_total if progress.rows_total else 1.0
        filled = round(fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        current = f" {progress.adapter_id}" if progress.adapter_id else ""
        phases = "".join(
            f" {name} {format_duration(seconds)}"
            for name, seconds in (("scoring", progress.score_s), ("generating", progress.generate_s))
            if seconds > 0
        )
        return (
            f"[{bar}] adapters {progress.adapters_done}/{progress.adapters_total}"
            f" rows {progress.rows_done}/{progress.rows_total}"
            f" {progress.rate:.1f} rows/s left {format_duration(progress.eta_s)}{phases}{current}"
        )

    def write(self, text: str) -> None:
        """Print ``text`` on its own line(s) above the bar, then draw the bar again below it."""
        with self._lock:
            self._write_above(self.stream, text if text.endswith("\n") else text + "\n")

    def close(self) -> None:
        """End the progress line so later output starts on a fresh line, and unwrap the streams. Safe twice."""
        restores, self._restore, self._redirected = self._restore, [], False
        for restore in reversed(restores):  # outside the lock, like _redirect
            restore()
        with self._lock:
            if self._drawn and self._visible:
                self.stream.write("\n")
                self.stream.flush()
            self._drawn = self._visible = False
            self._partial.clear()

    def __enter__(self) -> TerminalProgress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _draw(self) -> None:
        if self._partial:  # another writer is in the middle of a line: draw when it ends it
            return
        self.stream.write("\r" + self._line + "\x1b[K")
        self.stream.flush()
        self._drawn = self._visible = True

    def _write_above(self, target: TextIO, text: str) -> None:
        """Write ``text`` to ``target`` (the bar's stream or another terminal stream) above the bar."""
        if self._visible:
            self.stream.write("\r\x1b[K")  # clear the bar's line: the text starts at its beginning
            self.stream.flush()
            self._visible = False
        target.write(text)
        if not text:
            return
        if text.endswith("\n"):
            self._partial.discard(id(target))
            target.flush()
            if self._drawn and not self._partial:
                self._draw()
        else:
            self._partial.add(id(target))

    def _redirect(self) -> None:
        """Wrap the terminal streams, and the logging handlers writing to them, so their text goes above the bar."""
        streams = [self.stream]
        if sys.stdout is not self.stream and _is_tty(sys.stdout):
            streams.append(sys.stdout)
        wrapped = {id(stream): _AboveBar(self, stream) for stream in streams}
        for name in ("stderr", "stdout"):
            current = getattr(sys, name)
            if id(current) in wrapped:
                setattr(sys, name, wrapped[id(current)])
                self._restore.append(_put_back_sys(name, wrapped[id(current)], current))
        for handler in _stream_handlers():
            stream = handler.stream
            if id(stream) in wrapped:
                handler.setStream(cast(TextIO, wrapped[id(stream)]))
                self._restore.append(_put_back_handler(handler, wrapped[id(stream)], stream))


class _AboveBar:
    """A terminal stream whose writes go above a :class:`TerminalProgress` bar; everything else is the stream's."""

    def __init__(self, bar: TerminalProgress, stream: TextIO) -> None:
        self._bar = bar
        self._stream = stream

    def write(self, text: str) -> int:
        with self._bar._lock:
            self._bar._write_above(self._stream, text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stream_handlers() -> list[logging.StreamHandler[Any]]:
    loggers: list[Any] = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [
        handler
        for logger in loggers
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler)
    ]


def _put_back_sys(name: str, wrapper: _AboveBar, original: TextIO) -> Callable[[], None]:
    def restore() -> None:
        if getattr(sys, name) is wrapper:  # someone else replaced it since: leave theirs
            setattr(sys, name, original)

    return restore


def _put_back_handler(handler: logging.StreamHandler[Any], wrapper: _AboveBar, original: TextIO) -> Callable[[], None]:
    def restore() -> None:
        if handler.stream is wrapper:
            handler.setStream(original)

    return restore


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed stream
        return False
