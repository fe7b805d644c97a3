"""Numbers read from a server's answer, checked for what they stand for: log-probabilities and token counts.

A broken or hostile server can send any JSON number, and Python's JSON reader also takes ``NaN``, ``Infinity`` and
``1e999`` (infinity). The answer readers (:mod:`~inference._servers.openai_wire`,
:mod:`~inference._servers.ollama_chat`, :mod:`~inference._servers.prompt_scoring`, the next-token rows) take their
numbers through these checks, so that a NaN never reaches a result: a NaN score makes an evaluation's choice
(``max`` of the choices' sums) depend on where the NaN stands, without an error; and that a token count no context
can hold never reaches the usage a caller adds up (metrics, costs). Like the readers, the checks raise
``TypeError`` for a field that cannot be read; the readers' callers turn it into a
:class:`~inference.exceptions.ProtocolError` that names the server.
"""

from __future__ import annotations

import json
import math

__all__ = ["LOGPROB_ROUNDING", "MAX_TOKEN_COUNT", "logprob", "token_count"]

LOGPROB_ROUNDING = 1e-4
"""How far above 0 a log-probability may be and still be read (as ``0.0``): a server's log-softmax in float32 can
leave the most likely token's a few units of the last place above 0 (a unit is 2e-6 for logits near 30, 8e-6 near
100). Anything further above 0 is not a log-probability."""

MAX_TOKEN_COUNT = 2**31 - 1
"""The largest token count an answer may report: more tokens than any server's context holds (llama.cpp counts them
in 32-bit integers; the longest contexts served are about 10**7 tokens), so a larger count is not this request's."""


def logprob(value: object, field: str) -> float:
    """``value`` as a log-probability (natural log): a number at most 0. ``-inf`` (probability 0) is one: a scored
    continuation the model cannot produce sums to ``-inf`` and is never the most likely choice. A value above 0 by
    at most :data:`LOGPROB_ROUNDING` is read as ``0.0``.

    Args:
        value: The field's value as parsed from JSON.
        field: Where it is in the answer, for the message (``"logprobs.content[2].logprob"``).

    Raises:
        TypeError: The value is not a number (text, ``null``, a boolean), is NaN or ``+inf``, or is above 0.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{field} is {_as_sent(value)}, not a number")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number) or number > LOGPROB_ROUNDING:
        raise TypeError(f"{field} is {_as_sent(value)}, not a log-probability (a number at most 0)")
    return min(number, 0.0)


def token_count(value: object, field: str) -> int:
    """``value`` as a count of tokens: a whole number from 0 to :data:`MAX_TOKEN_COUNT`.

    Raises:
        TypeError: The value is not an integer (a boolean, a fraction, text), is negative, or is above
            :data:`MAX_TOKEN_COUNT`.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        raise TypeError(f"{field} is {_as_sent(value)}, not a token count (a whole number from 0 to 2**31 - 1)")
    return value


def _as_sent(value: object) -> str:
    """``value`` as JSON spells it (``null``, ``NaN``, ``Infinity``, ``"text"``), cut to 100 characters."""
    try:
        return json.dumps(value)[:100]
    except (TypeError, ValueError):  # not from JSON: an object's attribute
        return repr(value)[:100]
