"""Checks on what users pass in, shared by every provider, so each bad input gets one clear typed error.

The rules of the generation options live with the options (:mod:`inference.options`); this module adds the
request's own fields (prompt, model, adapter id) and the adapter id rule the lifecycle uses too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inference.exceptions import InvalidRequestError
from inference.options import Fail, GenerationOptions, require_utf8, spec_field

ADAPTER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""Adapter ids: letters, digits, ``.``, ``_`` and ``-``; no path separators, spaces or shell characters."""


def validate_adapter_id(adapter_id: object, *, provider: str) -> str:
    """Return ``adapter_id`` if it is a safe adapter name, else raise :class:`InvalidRequestError`."""
    return _adapter_id(adapter_id, "adapter_id", lambda message: InvalidRequestError(message, provider=provider))


def _adapter_id(value: object, name: str, fail: Fail) -> str:
    if not isinstance(value, str) or not ADAPTER_ID_PATTERN.match(value):
        raise fail(
            f"adapter id {value!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no path separators, spaces or shell characters)"
        )
    return value


def _adapter_id_or_none(value: object, name: str, fail: Fail) -> str | None:
    return None if value is None else _adapter_id(value, name, fail)


def _text(value: object, name: str, fail: Fail) -> str:
    if not isinstance(value, str):
        raise fail(f"{name} must be a string, got {type(value).__name__}")
    require_utf8(value, name, fail)
    return value


def _model_name(value: object, name: str, fail: Fail) -> str:
    """The model name; ``None`` is ``""`` (in-process providers use their loaded model)."""
    return "" if value is None else _text(value, name, fail)


@dataclass(frozen=True)
class GenerationRequest(GenerationOptions):
    """One validated generation request, as every provider receives it.

    It holds the prompt, the model and the adapter, plus every :class:`~inference.options.GenerationOptions`
    field (``request.temperature``, ``request.stop``, ``request.is_greedy``...). Build it with
    :meth:`~inference.options.GenerationOptions.from_arguments`, which checks each argument and raises
    :class:`InvalidRequestError` with a sentence naming the argument and the allowed range.
    """

    prompt: str = spec_field(check=_text, help="the user's text")
    model: str = spec_field(check=_model_name, help="the base model name (servers) or a label")
    adapter_id: str | None = spec_field(None, check=_adapter_id_or_none, help="a loaded adapter, or None")
