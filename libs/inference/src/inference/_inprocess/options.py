"""How every in-process provider receives the request options it handles alike (each provider's map adds the rest).

The in-process providers share the prompt rule (:mod:`inference._inprocess.base`: a system prompt is a system
message rendered by the model's chat template) and constrained decoding with llguidance
(:mod:`inference._inprocess.constrained`), and none calls tools yet. A provider's
:attr:`~inference.InferenceProvider.options` starts from :data:`IN_PROCESS_OPTIONS` and declares its own sampling
options; a key it also sets replaces the shared entry.
"""

from __future__ import annotations

from inference.options import (
    NOT_BUILT_YET,
    RESPONSE_FORMAT_AS_JSON_SCHEMA,
    TIMEOUT_IN_BASE_CLASS,
    OptionMap,
    Refused,
    Sent,
)

__all__ = ["IN_PROCESS_OPTIONS"]

IN_PROCESS_OPTIONS: OptionMap = {
    "system_prompt": Sent("chat template", "a system message rendered by the model's chat template"),
    "json_schema": Sent("llguidance", "a token mask per step"),
    **NOT_BUILT_YET,
    "thinking": Sent(
        "chat template variable enable_thinking",
        "a leading <think>...</think> of the text goes to the result's reasoning, and is never streamed",
    ),
    "response_format": RESPONSE_FORMAT_AS_JSON_SCHEMA,
    "extra_body": Refused("extra_body is merged into a server's request body; this backend runs in process"),
    "timeout": TIMEOUT_IN_BASE_CLASS,
}
"""The options every in-process provider receives the same way."""
