"""How each backend receives each request option: the tables every provider class declares as ``options``.

:class:`Sent` (where the option goes), :class:`Refused` (why the backend cannot honour it) and :class:`ByRequests`
(``n`` as n requests) are the entries; :data:`NOT_BUILT_YET` is the refusals a backend's table starts from. The
options themselves are :mod:`inference.options`, which re-exports these names (import them from there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "NOT_BUILT_YET",
    "RESPONSE_FORMAT_AS_JSON_SCHEMA",
    "TIMEOUT_IN_BASE_CLASS",
    "ByRequests",
    "OptionMap",
    "Refused",
    "Sent",
]


@dataclass(frozen=True)
class Sent:
    """How a backend receives an option.

    Attributes:
        field: Where it goes: for a server, the dotted path of the field in the request body
            (``"options.repeat_penalty"``); in process, the backend's own name for it (``"temp"`` of llama.cpp's
            sampler, ``"GenerationConfig.top_k"``).
        note: Anything a user should know (an extension field a server may refuse, a value that is mapped).
    """

    field: str
    note: str = ""


@dataclass(frozen=True)
class Refused:
    """A backend that cannot honour an option: a request that sets it is an ``UnsupportedOperationError`` before
    anything is sent.

    Attributes:
        reason: Why, in a few words (``"llama-server's completions give no log-probabilities"``).
    """

    reason: str


@dataclass(frozen=True)
class ByRequests(Sent):
    """How a backend without a native ``n`` receives ``n > 1``: the base class sends ``n`` requests of one
    completion each, at once (seeds ``seed``, ``seed + 1``... when the request has a ``seed``; each samples on its
    own otherwise), and joins their results (:meth:`~inference.GenerationResult.from_choices`). The prompt is
    processed ``n`` times, where a native ``n`` (``Sent``) computes it once; the note says why a backend has none."""

    field: str = "n requests"
    note: str = "n requests of one completion, seeds seed, seed + 1, ... when a seed is given"


TIMEOUT_IN_BASE_CLASS = Sent("the call's deadline", "the base class cancels the call after timeout seconds")
"""How every provider receives ``timeout``: :class:`~inference.InferenceProvider` runs the call under it and
cancels it (an in-process generation stops within a token; a server request is closed)."""

RESPONSE_FORMAT_AS_JSON_SCHEMA = Sent("json_schema", "mapped to json_schema before anything is sent")
"""How a provider that takes ``json_schema`` receives ``response_format`` (a provider that refuses
``json_schema`` refuses it too: the request then sets ``json_schema``)."""


OptionMap = Mapping[str, "Sent | Refused"]
"""Option name -> how one provider receives it: the table each provider class declares as ``options``."""

NOT_BUILT_YET: OptionMap = {
    "tools": Refused("tool calling is not built yet for this backend (the fake provider calls tools, for tests)"),
    "tool_choice": Refused("tool calling is not built yet for this backend"),
    "return_token_ids": Refused("generated token ids are not built yet for this backend"),
    "n": Refused("n > 1 is not built yet for this backend (the fake provider returns n choices, for tests)"),
    "presence_penalty": Refused("presence_penalty is not built yet for this backend"),
    "frequency_penalty": Refused("frequency_penalty is not built yet for this backend"),
    "min_p": Refused("min_p is not built yet for this backend"),
    "logit_bias": Refused("logit_bias is not built yet for this backend"),
    "raw_prompt": Refused("raw prompts are not built yet for this backend"),
    "chat_template": Refused("a chat template override is not built yet for this backend"),
    "chat_template_kwargs": Refused("chat template variables are not built yet for this backend"),
    "thinking": Refused("the thinking switch is not built yet for this backend"),
    "extra_body": Refused("extra_body is not built yet for this backend"),
}
"""The options a backend's table starts from where it does not honour them yet (``{**NOT_BUILT_YET, ...}``): each is
refused with a sentence saying so, until the backend's own entry replaces it."""
