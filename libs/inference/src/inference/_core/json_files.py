"""Reading a JSON file a user names (``--messages``, ``--json-schema``): every failure is one sentence naming it.

A missing file, bytes that are not UTF-8, text that is not JSON, nesting too deep for Python's reader and a
lone surrogate (``"\\ud800"``, which no backend can encode) each become an
:class:`~inference.exceptions.InvalidRequestError` that names the file and, where there is one, the line.
"""

from __future__ import annotations

import json
import os
from typing import Any

from inference.exceptions import InvalidRequestError

__all__ = ["NotUtf8Error", "decode_utf8", "read_json_file"]


class NotUtf8Error(ValueError):
    """Bytes that are not UTF-8 text: the first undecodable ``byte``, its ``offset`` in the bytes and its ``line``."""

    def __init__(self, byte: int, offset: int, line: int) -> None:
        super().__init__(f"byte 0x{byte:02x} at byte {offset} (line {line}) is not UTF-8")
        self.byte, self.offset, self.line = byte, offset, line


def decode_utf8(data: bytes) -> str:
    """``data`` as UTF-8 text, a leading byte-order mark skipped.

    Raises:
        NotUtf8Error: The bytes are not UTF-8; it says where (for the caller's sentence).
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        offset = error.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)  # decode() counts after the mark
        raise NotUtf8Error(data[offset], offset, data.count(b"\n", 0, offset) + 1) from None


def read_json_file(path: str | os.PathLike[str], what: str) -> Any:
    """The JSON document in the file ``path``; ``what`` names it in messages (``"the JSON schema file"``).

    Raises:
        InvalidRequestError: The file cannot be read, is not UTF-8 or not JSON, nests too deeply, or holds a lone
            surrogate; the message names the file (and the line) and says what to do.
    """
    name = os.fspath(path)

    def fail(problem: str) -> InvalidRequestError:
        return InvalidRequestError(f"{what} {name} {problem}", path=name)

    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise fail(f"cannot be read: {error.strerror or error}") from None
    try:
        text = decode_utf8(data)
    except NotUtf8Error as error:
        raise fail(
            f"is not UTF-8 text: byte 0x{error.byte:02x} on line {error.line} cannot be decoded; save it as UTF-8"
        ) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise fail(f"is not JSON: {error.msg} on line {error.lineno}, column {error.colno}") from None
    except RecursionError:
        raise fail("nests its arrays and objects too deeply for Python's JSON reader: flatten it") from None
    where = _lone_surrogate(document)
    if where is not None:
        raise fail(
            f"holds a lone surrogate (such as \\ud800, half of a UTF-16 pair) in {where}, which no backend can "
            "encode: remove it, or write the whole character"
        )
    return document


def _lone_surrogate(document: Any) -> str | None:
    """Where (``$[0].content``) a string or key of ``document`` cannot be encoded as UTF-8, or ``None``.

    Iterative, so a document as deep as the JSON reader took is walked without a ``RecursionError``.
    """
    pending: list[tuple[Any, str]] = [(document, "$")]
    while pending:
        value, where = pending.pop()
        if isinstance(value, str):
            if not _encodable(value):
                return where
        elif isinstance(value, dict):
            if not all(_encodable(key) for key in value):
                return f"a key of {where}"
            pending.extend(reversed([(item, f"{where}.{key}") for key, item in value.items()]))  # in file order
        elif isinstance(value, list):
            pending.extend(reversed([(item, f"{where}[{index}]") for index, item in enumerate(value)]))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
