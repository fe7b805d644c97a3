"""The command line's log lines: ``--log-level`` / ``--log-format`` on every command, and its error line."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

__all__ = ["add_log_options", "command_logging", "log_error"]

_json_errors = False
"""True while a command runs with the JSON log format: its error line is then a JSON record too."""


def add_log_options(parser: argparse.ArgumentParser, *, skip: frozenset[str] = frozenset({"lm-eval"})) -> None:
    """Add ``--log-level`` and ``--log-format`` to ``parser`` and to each of its subcommands, at any depth (given
    before or after the command name; lm-eval's arguments are all its own)."""
    from inference.config import LOG_LEVELS

    group = parser.add_argument_group("logging")
    group.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default=argparse.SUPPRESS,
                       help="least severe log record shown on stderr (default: $INFERENCE_LOG_LEVEL, else warning)")
    group.add_argument("--log-format", type=str.lower, choices=("text", "json"), default=argparse.SUPPRESS,
                       help="log lines as text (time, level, logger, message) or JSON objects (default: "
                       "$INFERENCE_LOG_FORMAT, else text)")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                if name not in skip:
                    add_log_options(command, skip=skip)


def command_logging(args: argparse.Namespace) -> Callable[[], None]:
    """Show log lines in the chosen level and format while a command runs; returns what puts the logging state
    back as it was (for ``main`` called in process).

    A ``.env`` file that cannot be read does not stop the command here: its log variables are read from the process
    environment alone, and a command that reads settings refuses the file then (exit 1, as for a bad value in it),
    while one that reads none (``convert-adapter``) runs.

    Raises:
        ConfigurationError: ``INFERENCE_LOG_LEVEL`` or ``INFERENCE_LOG_FORMAT`` is not an allowed value.
    """
    global _json_errors
    from inference._core.env_file import SettingsEnvironment, settings_environment
    from inference.config import resolve_sdk_setting
    from inference.exceptions import ConfigurationError
    from inference.logs import configure_logging

    try:
        environ = settings_environment()
    except ConfigurationError:  # the .env file: the commands that read settings refuse it, with its sentence
        environ = SettingsEnvironment(os.environ, {}, None)
    level = resolve_sdk_setting("log_level", getattr(args, "log_level", None), environ)
    style = resolve_sdk_setting("log_format", getattr(args, "log_format", None), environ)
    root, sdk = logging.getLogger(), logging.getLogger("inference")
    levels = (root.level, sdk.level)
    handler = configure_logging(level, style)
    if sdk.getEffectiveLevel() > logging.INFO:
        handler.addFilter(_failure_also_raised)
    _json_errors = style == "json"

    def restore() -> None:
        global _json_errors
        _json_errors = False
        root.removeHandler(handler)
        root.setLevel(levels[0])
        sdk.setLevel(levels[1])

    return restore


def _failure_also_raised(record: logging.LogRecord) -> bool:
    """Drop the event record of a failed operation (an adapter load with ``outcome`` ``"error"``): its error is
    raised to the command, which prints it as its one error line. ``--log-level info`` shows both."""
    return getattr(record, "outcome", None) not in ("error", "cancelled")


def log_error(line: str) -> bool:
    """Write the command's error ``line`` as a JSON log record when the log format is JSON (and say so)."""
    if _json_errors:
        logging.getLogger("inference.cli").error(line)
    return _json_errors
