"""Whether a regular expression can take exponential time to match: the check of the patterns a PEFT config holds.

Python's ``re`` cannot be stopped and holds the GIL while it matches, so one pattern such as ``(.*.*)*X`` in an
adapter's ``target_modules`` froze the whole process. :func:`repeats_a_repetition` finds the shape behind such
patterns: a repetition (``*``, ``+``, ``{m,n}`` with ``n > 1``) inside another. A repeated group whose last item is a
character none of its inner repetitions can match (``(\\w+\\.)*``, the shape of module paths) is left alone: each
round of it ends in one place, so matching stays linear.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = ["repeats_a_repetition"]

_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})
_CATEGORIES = {
    "CATEGORY_DIGIT": r"\d", "CATEGORY_NOT_DIGIT": r"\D", "CATEGORY_SPACE": r"\s", "CATEGORY_NOT_SPACE": r"\S",
    "CATEGORY_WORD": r"\w", "CATEGORY_NOT_WORD": r"\W",
}


def _parser() -> Any:
    try:
        from re import _parser as parser  # type: ignore[attr-defined]  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse as parser
    return parser


def repeats_a_repetition(pattern: str) -> bool:
    """Whether ``pattern`` holds a repetition inside another that can backtrack exponentially (a "regex bomb").

    Raises:
        re.error: ``pattern`` is not a regular expression.
    """
    parser = _parser()

    def parts(value: Any) -> Iterable[Any]:
        """The subpatterns inside an item's argument (groups, branches, assertions)."""
        if isinstance(value, parser.SubPattern):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from parts(item)

    def nested(items: Any, inside: bool) -> bool:
        for op, argument in items:
            if str(op) in _REPEATS:
                least, most, body = argument
                many = most > 1 and least != most  # {2} is a fixed count: no choice of its own to backtrack over
                if many and inside:
                    return True
                apart = many and _ends_apart(body, parser)
                if nested(body, inside or (most > 1 and not apart)):  # a count still multiplies what it repeats
                    return True
            elif any(nested(part, inside) for part in parts(argument)):
                return True
        return False

    parsed = parser.parse(pattern)
    if parsed.state.flags & re.IGNORECASE:
        return _has_nested_repeats(parsed, parser)  # case-folding: which characters match is not worked out here
    return bool(nested(parsed, False))


def _ends_apart(body: Any, parser: Any) -> bool:
    """Whether a repeated ``body`` is one repetition of single characters and single characters, ending in a
    character that nothing before it in the body can match (``\\w+\\.``): then each round has one end, and
    rounds cannot trade characters."""
    items = list(body)
    if len(items) == 1 and str(items[0][0]) == "SUBPATTERN":  # (...) around the body
        group = items[0][1]
        if group[1]:  # flags added inside the group ((?i:...)): not worked out here
            return False
        items = list(group[-1])
    if len(items) < 2 or str(items[-1][0]) != "LITERAL":
        return False
    end = chr(items[-1][1])
    repetitions = 0
    for op, argument in items[:-1]:
        if str(op) in _REPEATS:
            repetitions += 1
            inner = list(argument[2])
            if len(inner) != 1 or _may_match(inner[0], end) is not False:
                return False
        elif _may_match((op, argument), end) is not False:
            return False  # a single character that could be the end, or groups, branches: not looked into
    return repetitions <= 1


def _may_match(item: Any, character: str) -> bool | None:
    """Whether the one-character ``item`` (a literal, ``.``, a class) can match ``character``; ``None``: unknown."""
    op, argument = str(item[0]), item[1]
    if op == "LITERAL":
        return chr(argument) == character
    if op == "NOT_LITERAL":
        return chr(argument) != character
    if op == "ANY":
        return character != "\n"
    if op != "IN":
        return None
    negated, members = False, []
    for kind, value in argument:
        kind = str(kind)
        if kind == "NEGATE":
            negated = True
        elif kind == "LITERAL":
            members.append(re.escape(chr(value)))
        elif kind == "RANGE":
            members.append(f"{re.escape(chr(value[0]))}-{re.escape(chr(value[1]))}")
        elif kind == "CATEGORY" and str(value) in _CATEGORIES:
            members.append(_CATEGORIES[str(value)])
        else:
            return None
    return re.fullmatch(f"[{'^' if negated else ''}{''.join(members)}]", character) is not None


def _has_nested_repeats(parsed: Any, parser: Any) -> bool:
    """The plain rule, with no exemption: a repetition (``*``, ``+``, ``{m,n}``, a count) inside another."""

    def walk(items: Any, inside: bool) -> bool:
        for op, argument in items:
            if str(op) in _REPEATS:
                _, most, body = argument
                if (most > 1 and inside) or walk(body, inside or most > 1):
                    return True
            elif isinstance(argument, (list, tuple)):
                for value in argument:
                    if isinstance(value, parser.SubPattern) and walk(value, inside):
                        return True
                    if isinstance(value, list) and any(
                        isinstance(item, parser.SubPattern) and walk(item, inside) for item in value
                    ):
                        return True
        return False

    return walk(parsed, False)
