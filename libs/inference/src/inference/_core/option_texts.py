"""How the command line's text becomes an option's value (``--tools FILE``, ``--logit-bias JSON``...).

Each reader is named in its option's :class:`~inference.options.OptionSpec` (``parse``); the value it returns is
then checked by the option's rule like any other, so a file's problem and a bad value read the same way.
"""

from __future__ import annotations

import json
import os
from typing import Any

from inference.exceptions import InvalidRequestError

__all__ = ["chat_template_file", "json_schema_file", "json_text", "parse_flag", "tool_choice_text", "tools_file"]


def parse_flag(text: str) -> bool:
    """Read a yes/no option from the command line: ``true``/``false``, ``yes``/``no``, ``1``/``0``, ``on``/``off``."""
    words = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False, "off": False}
    value = words.get(text.strip().lower())
    if value is None:
        raise ValueError(f"expected true or false, got {text!r}")
    return value


def tools_file(path: str) -> list[Any]:
    """Read the command line's ``--tools FILE``: a JSON list of OpenAI function tools (checked afterwards)."""
    from inference._core.json_files import read_json_file

    loaded: Any = read_json_file(path, "the tools file")
    return loaded if isinstance(loaded, list) else [loaded]


def tool_choice_text(text: str) -> str | dict[str, Any]:
    """Read the command line's ``--tool-choice``: ``auto``, ``none``, ``required``, or the name of a tool."""
    if text in ("auto", "none", "required"):
        return text
    return {"type": "function", "function": {"name": text}}


def json_schema_file(path: str) -> dict[str, Any]:
    """Read the command line's ``--json-schema FILE``: the file's JSON (checked as a schema afterwards).

    Raises:
        InvalidRequestError: The file cannot be read, is not UTF-8 or not JSON, nests too deeply or holds a lone
            surrogate; the message names the file and the line.
    """
    from inference._core.json_files import read_json_file

    loaded: dict[str, Any] = read_json_file(path, "the JSON schema file")
    return loaded


def json_text(text: str) -> Any:
    """Read a JSON value given on the command line (``--logit-bias '{"50256": -100}'``)."""
    try:
        return json.loads(text)
    except ValueError as error:
        raise InvalidRequestError(f"{text[:80]!r} is not JSON ({error})") from None


def chat_template_file(path: str) -> str:
    """Read the command line's ``--chat-template FILE``: a Jinja chat template, UTF-8 text.

    Raises:
        InvalidRequestError: The file cannot be read or is not UTF-8; the message names it.
    """
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise InvalidRequestError(f"cannot read the chat template file {path!r}: {reason}") from None
