"""Log lines an operator can read or parse: :func:`configure_logging`.

The SDK logs on the ``inference`` logger and its children (``inference.adapters`` for every adapter load, unload,
eviction and reload, with structured fields in the record's ``extra``) and configures nothing by itself, as a
library should. The ``inference`` command line calls :func:`configure_logging`; a service calls it once at start
if it wants the same lines (or keeps its own logging setup: the records and their fields are the same).

Two formats, both one record per line on stderr:

- ``text``: ``2025-06-01T12:00:00.123Z WARNING inference.adapters: vllm: adapter 'support' load ...``;
- ``json``: ``{"time": "...", "level": "WARNING", "logger": "inference.adapters", "message": "...",
  "adapter_event": "load", "adapter_id": "support", "duration_ms": 812.5, ...}``: every field the SDK attaches to
  a record (its ``extra``) is a key, and a traceback is ``"exception"``.

Example:
    >>> import inference
    >>> handler = inference.configure_logging("info", "json")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import time
from typing import Any, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging"]

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}
"""Attributes every record has: the others are what the code logging it attached (``extra``)."""


def _timestamp(record: logging.LogRecord) -> str:
    """The record's time in UTC, ISO 8601 with milliseconds: ``2025-06-01T12:00:00.123Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


_ESCAPED = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, 0x85) if code != 0x09},
    0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029",
}
"""Line breaks and other control characters, as escapes: a message holds text from outside (an adapter's path,
a server's words), and a newline in it would forge a record of its own in the text format."""


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE`` on one line (its line breaks and control characters escaped; a traceback
    follows on its own lines, indented)."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage().translate(_ESCAPED)}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:  # indented: no line of it can pass for a record (an exception quotes outside text)
            line += "\n" + textwrap.indent(record.exc_text, "    ", lambda _: True)
        if record.stack_info:
            line += "\n" + textwrap.indent(self.formatStack(record.stack_info), "    ", lambda _: True)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, ``message``, then the record's own fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class _StandardErrorHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (as logging's last-resort handler does), so a
    redirected or replaced stderr (a test's capture) is followed."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ sets it; stderr is looked up instead
        pass


def configure_logging(
    level: str | int | None = None, format: str | None = None, *, stream: TextIO | None = None
) -> logging.Handler:
    """Show log records on stderr (or ``stream``), one per line, in the text or JSON format.

    The handler goes on the root logger (so warnings of the libraries beneath, httpx's or llama.cpp's, read the
    same), replacing the one an earlier call added. ``level`` applies to the SDK's loggers (``inference.*``);
    other libraries show warnings and above (or ``level``, if it is more severe).

    Args:
        level: ``"debug"``, ``"info"``, ``"warning"``, ``"error"`` or ``"critical"`` (or a ``logging`` level
            number); else ``INFERENCE_LOG_LEVEL`` (process environment, then ``.env``); else ``"warning"``.
        format: ``"text"`` or ``"json"``; else ``INFERENCE_LOG_FORMAT``; else ``"text"``.
        stream: Where to write; by default whatever ``sys.stderr`` is at each record.

    Returns:
        The handler added (remove it from the root logger to undo).

    Raises:
        ConfigurationError: ``level`` or ``format`` (or their variables) is not one of the allowed values.
    """
    from inference.config import resolve_sdk_setting

    if isinstance(level, int) and not isinstance(level, bool):
        level = logging.getLevelName(level).lower()
    name: str = resolve_sdk_setting("log_level", level)
    style: str = resolve_sdk_setting("log_format", format)
    handler: logging.Handler = _StandardErrorHandler() if stream is None else logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if style == "json" else TextFormatter())
    handler._inference_handler = True  # type: ignore[attr-defined]  # the one a later call replaces
    root = logging.getLogger()
    for old in [old for old in root.handlers if getattr(old, "_inference_handler", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    number = logging.getLevelName(name.upper())
    logging.getLogger("inference").setLevel(number)
    root.setLevel(max(number, logging.WARNING))
    return handler
