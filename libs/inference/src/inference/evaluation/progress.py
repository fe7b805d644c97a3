"""A one-line progress bar for terminals (adapters and rows done, rate, time left); silent elsewhere."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO

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
        elapsed_s: Seconds since this run started.
        adapter_id: The adapter being evaluated, or ``None`` when finished.
    """

    adapters_done: int
    adapters_total: int
    rows_done: int
    rows_total: int
    rows_this_run: int
    elapsed_s: float
    adapter_id: str | None

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

    Pass an instance as ``on_progress`` and call :meth:`close` at the end.

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
        self._drawn = False

    def __call__(self, progress: Progress) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        finished = progress.rows_done >= progress.rows_total
        if not finished and now - self._last_draw < self.min_interval_s:
            return
        self._last_draw = now
        self.stream.write("\r" + self.render(progress) + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def render(self, progress: Progress) -> str:
        """The line for ``progress``."""
        fraction = progress.rows_done / progress.rows_total if progress.rows_total else 1.0
        filled = round(fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        current = f" {progress.adapter_id}" if progress.adapter_id else ""
        return (
            f"[{bar}] adapters {progress.adapters_done}/{progress.adapters_total}"
            f" rows {progress.rows_done}/{progress.rows_total}"
            f" {progress.rate:.1f} rows/s left {format_duration(progress.eta_s)}{current}"
        )

    def close(self) -> None:
        """End the progress line so later output starts on a fresh line."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed stream
        return False
