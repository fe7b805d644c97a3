"""Numbers read from a server's answer, checked for what they stand for: log-probabilities.

A broken or hostile server can send any JSON number, and Python's JSON reader also takes ``NaN``, ``Infinity`` and
``1e999`` (infinity). The answer readers (:mod:`~inference._servers.openai_wire`,
:mod:`~inference._servers.ollama_chat`, :mod:`~inference._servers.prompt_scoring`, the next-token rows) take their
numbers through these checks, so that a NaN never reaches a result: a NaN score makes an evaluation's choice
(``max`` of the choices' sums) depend on where the NaN stands, without an error. Like the readers, the checks raise
``TypeError`` for a field that cannot be read; the readers' callers turn it into a
:class:`~inference.exceptions.ProtocolError` that names the server.
"""

from __future__ import annotations

import math

__all__ = ["LOGPROB_ROUNDING", "logprob"]

LOGPROB_ROUNDING = 1e-4
"""How far above 0 a log-probability may be and still be read (as ``0.0``): a server's log-softmax in float32 can
leave the most likely token's a few units of the last place above 0 (a unit is 2e-6 for logits near 30, 8e-6 near
100). Anything further above 0 is not a log-probability."""


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
        raise TypeError(f"{field} is {value!r:.100}, not a number")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number) or number > LOGPROB_ROUNDING:
        raise TypeError(f"{field} is {value!r:.100}, not a log-probability (a number at most 0)")
    return min(number, 0.0)

