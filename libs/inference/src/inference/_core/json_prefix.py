"""Where a text stops being the beginning of a JSON text: the check of an answer cut by ``max_tokens``.

A constrained answer cut short is not JSON yet, but every character of it must be one some JSON text could have
there; free text (a server that ignored the schema) stops being JSON within a few characters. One pass, no
recursion, strict JSON (no raw control characters in strings, no leading zeros).

Example:
    >>> json_prefix_end('{"name": "An'), json_prefix_end("the answer is")
    (None, 0)
"""

from __future__ import annotations

import re

__all__ = ["json_prefix_end"]

_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NUMBER_START = re.compile(r"-?(0|[1-9][0-9]*)?(\.[0-9]*)?([eE][+-]?[0-9]*)?")
_WORD = re.compile(r"[-+.0-9eE]+|[a-z]+")  # a number or a literal, checked against the two above or true/false/null
_HEX = frozenset("0123456789abcdefABCDEF")


def json_prefix_end(text: str) -> int | None:
    """Where ``text`` stops being the beginning of a JSON text (strict: no control characters in strings), or
    ``None`` when some JSON text starts with it. Scans once, without recursion."""
    stack: list[str] = []  # "{" or "[" for each open container
    expect = "value"  # value | first-value | key | first-key | colon | next
    index, size = 0, len(text)
    while index < size:
        char = text[index]
        if char in " \t\n\r":
            index += 1
            continue
        if expect == "next":
            if not stack:
                return index  # something after a complete value
            if char == ",":
                expect = "key" if stack[-1] == "{" else "value"
            elif char == ("}" if stack[-1] == "{" else "]"):
                stack.pop()
            else:
                return index
            index += 1
            continue
        if expect == "colon":
            if char != ":":
                return index
            expect, index = "value", index + 1
            continue
        if (expect == "first-key" and char == "}") or (expect == "first-value" and char == "]"):
            stack.pop()
            expect, index = "next", index + 1
            continue
        if expect in ("key", "first-key"):
            if char != '"':
                return index
            end = _string_end(text, index)
            if end is None or end < 0:
                return None if end is None else -end
            expect, index = "colon", end
            continue
        if char in "{[":
            stack.append(char)
            expect, index = ("first-key" if char == "{" else "first-value"), index + 1
            continue
        if char == '"':
            end = _string_end(text, index)
            if end is None or end < 0:
                return None if end is None else -end
            expect, index = "next", end
            continue
        word = _WORD.match(text, index)
        if word is None:
            return index
        token = word.group()
        whole = index + len(token) < size
        if token[0].isalpha():
            literals = ("true", "false", "null")
            fits = any((literal == token) if whole else literal.startswith(token) for literal in literals)
        else:
            fits = bool((_NUMBER if whole else _NUMBER_START).fullmatch(token))
        if not fits:
            return index
        expect, index = "next", index + len(token)
    return None


def _string_end(text: str, start: int) -> int | None:
    """After the JSON string opening at ``start``: the index past its closing quote, ``None`` when the text ends
    inside it, or minus the index of a character no JSON string holds."""
    index, size = start + 1, len(text)
    while index < size:
        char = text[index]
        if char == '"':
            return index + 1
        if char < " ":
            return -index
        if char == "\\":
            escape = text[index + 1 : index + 2]
            if escape == "u":
                digits = text[index + 2 : index + 6]
                if not all(digit in _HEX for digit in digits):
                    return -index
                index += 6
                continue
            if escape and escape not in '"\\/bfnrt':
                return -index
            index += 2
            continue
        index += 1
    return None
