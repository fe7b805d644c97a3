"""Checks on what users pass in, shared by every provider, so each bad input gets one clear typed error."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inference.exceptions import InvalidRequestError

ADAPTER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""Adapter ids: letters, digits, ``.``, ``_`` and ``-``; no path separators, spaces or shell characters."""


def validate_adapter_id(adapter_id: object, *, provider: str) -> str:
    """Return ``adapter_id`` if it is a safe adapter name, else raise :class:`InvalidRequestError`."""
    if not isinstance(adapter_id, str) or not ADAPTER_ID_PATTERN.match(adapter_id):
        raise InvalidRequestError(
            f"adapter id {adapter_id!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no path separators, spaces or shell characters)",
            provider=provider,
        )
    return adapter_id


@dataclass(frozen=True)
class GenerationRequest:
    """One validated generation request, as every provider receives it.

    Build it with :meth:`from_arguments`, which checks each argument and raises
    :class:`InvalidRequestError` with a sentence naming the argument and the allowed range.
    """

    prompt: str
    model: str
    adapter_id: str | None = None
    max_tokens: int = 4096
    system_prompt: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_k: int | None = None

    @property
    def is_greedy(self) -> bool:
        """True when decoding is deterministic (temperature 0)."""
        return self.temperature == 0

    @classmethod
    def from_arguments(
        cls,
        *,
        provider: str,
        prompt: object,
        model: object,
        adapter_id: object = None,
        max_tokens: object = 4096,
        system_prompt: object = None,
        temperature: object = None,
        top_p: object = None,
        repetition_penalty: object = None,
        stop: object = None,
        seed: object = None,
        top_k: object = None,
    ) -> GenerationRequest:
        """Check the arguments of ``generate`` and return them as a request.

        Raises:
            InvalidRequestError: An argument has the wrong type or is out of range.
        """

        def fail(message: str) -> InvalidRequestError:
            return InvalidRequestError(message, provider=provider)

        if not isinstance(prompt, str):
            raise fail(f"prompt must be a string, got {type(prompt).__name__}")
        _require_utf8(prompt, "prompt", fail)
        if model is None:
            model = ""
        if not isinstance(model, str):
            raise fail(f"model must be a string, got {type(model).__name__}")
        _require_utf8(model, "model", fail)
        if adapter_id is not None:
            adapter_id = validate_adapter_id(adapter_id, provider=provider)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise fail(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise fail(f"system_prompt must be a string or None, got {type(system_prompt).__name__}")
        if system_prompt is not None:
            _require_utf8(system_prompt, "system_prompt", fail)
        temperature = _number(temperature, "temperature", fail, minimum=0.0, maximum=100.0)
        top_p = _number(top_p, "top_p", fail, minimum=0.0, maximum=1.0, exclusive_minimum=True)
        repetition_penalty = _number(
            repetition_penalty, "repetition_penalty", fail, minimum=0.0, maximum=100.0, exclusive_minimum=True
        )
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
            raise fail(f"top_k must be a non-negative integer or None, got {top_k!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise fail(f"seed must be an integer or None, got {seed!r}")
        return cls(
            prompt=prompt,
            model=model,
            adapter_id=adapter_id,
            max_tokens=max_tokens,
            system_prompt=system_prompt,
            temperature=temperature,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            stop=_stop_sequences(stop, fail),
            seed=seed,
            top_k=top_k,
        )


def _number(
    value: object,
    name: str,
    fail: Callable[[str], InvalidRequestError],
    *,
    minimum: float,
    maximum: float,
    exclusive_minimum: bool = False,
) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or (value <= minimum if exclusive_minimum else value < minimum)
        or value > maximum
    ):
        bound = "(" if exclusive_minimum else "["
        raise fail(f"{name} must be a number in {bound}{minimum:g}, {maximum:g}] or None, got {value!r}")
    return float(value)


def _stop_sequences(stop: object, fail: Callable[[str], InvalidRequestError]) -> tuple[str, ...]:
    if stop is None:
        return ()
    single = isinstance(stop, str)
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
        raise fail(f"stop must be a non-empty string or a list of non-empty strings, got {stop!r}")
    for index, sequence in enumerate(stop):
        _require_utf8(sequence, "stop" if single else f"stop[{index}]", fail)
    return tuple(stop)


def _require_utf8(text: str, name: str, fail: Callable[[str], InvalidRequestError]) -> None:
    """Refuse text that cannot be encoded as UTF-8 (a lone surrogate, such as U+D800).

    Every backend sends or tokenizes UTF-8, and would fail on such text with a ``UnicodeEncodeError``.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise fail(
            f"{name} holds {text[error.start]!r} at position {error.start}, a lone surrogate that cannot be "
            "encoded as UTF-8: remove it, or decode the original bytes with errors='replace'"
        ) from None
