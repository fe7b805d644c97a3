"""Scoring a row: exact match, regular expression, or a user function named by import path."""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inference.evaluation.inputs import EvalPrompt
from inference.exceptions import ConfigurationError, InvalidRequestError

__all__ = ["SCORERS", "Scorer", "exact_match", "regex_match", "resolve_scorer", "score_value"]

Scorer = Callable[[str, "str | None", dict[str, Any]], "float | bool | None"]
"""``scorer(output, expected, row) -> float | bool | None``; ``None`` means "not scored" (no expected answer).

``row`` is a copy of the row being written, a new ``dict`` for each call (a function that takes a ``Mapping`` is
a scorer too)."""


def exact_match(output: str, expected: str | None, row: Mapping[str, Any]) -> float | None:
    """1.0 when the output equals ``expected`` once leading and trailing whitespace is stripped, else 0.0.

    Prompts without ``expected`` are not scored (``None``).
    """
    if expected is None:
        return None
    return 1.0 if output.strip() == expected.strip() else 0.0


def regex_match(output: str, expected: str | None, row: Mapping[str, Any]) -> float | None:
    """1.0 when the pattern ``expected`` is found anywhere in the output (``re.search``), else 0.0.

    Anchor the pattern (``^...$``) to match the whole output. Prompts without ``expected`` are not scored.
    """
    if expected is None:
        return None
    return 1.0 if re.search(expected, output) else 0.0


SCORERS: dict[str, Scorer] = {"exact": exact_match, "regex": regex_match}
"""The built-in scorers by name."""


def resolve_scorer(spec: str | Scorer | None, prompts: Sequence[EvalPrompt] = ()) -> Scorer | None:
    """Return the scorer ``spec`` names: ``"exact"``, ``"regex"``, ``"pkg.module:function"`` or a callable.

    For ``"regex"``, every ``expected`` of ``prompts`` is compiled first, so a bad pattern fails before the run.

    Raises:
        ConfigurationError: The name is unknown, or the import path does not name a callable.
        InvalidRequestError: A prompt's ``expected`` is not a valid regular expression.
    """
    if spec is None or callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ConfigurationError(f"scorer must be 'exact', 'regex', 'pkg.module:function' or a callable, got {spec!r}")
    if spec in SCORERS:
        if spec == "regex":
            _check_patterns(prompts)
        return SCORERS[spec]
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigurationError(
            f"unknown scorer {spec!r}: use 'exact', 'regex' or an import path 'pkg.module:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigurationError(
            f"cannot import the scorer module {module_name!r} ({error}): is it on PYTHONPATH?"
        ) from error
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigurationError(f"scorer {spec!r}: module {module_name!r} has no function {attribute!r}")
    scorer: Scorer = function
    return scorer


def score_value(value: object) -> float | None:
    """A scorer's answer as a float (``True`` -> 1.0), or ``None``.

    Raises:
        TypeError: The value is not a finite number, a bool or ``None`` (NaN and infinities cannot be averaged, and
            JSON has no way to write them).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    raise TypeError(f"a scorer must return a finite number, a bool or None, got {value!r}")


def _check_patterns(prompts: Sequence[EvalPrompt]) -> None:
    for prompt in prompts:
        if prompt.expected is None:
            continue
        try:
            re.compile(prompt.expected)
        except re.error as error:
            raise InvalidRequestError(
                f"prompt {prompt.id!r}: expected {prompt.expected!r} is not a valid regular expression ({error})"
            ) from error
