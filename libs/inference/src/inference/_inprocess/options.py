"""How every in-process provider receives the request options it handles alike (each provider's map adds the rest).

The in-process providers share the prompt rule (:mod:`inference._inprocess.base`: a system prompt is a system
message rendered by the model's chat template) and constrained decoding with llguidance
(:mod:`inference._inprocess.constrained`), and tool calling through the model's chat template
(:mod:`inference._core.tool_formats`). A provider's
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
    "tools": Sent(
        "chat template",
        "the model's chat template renders the tools; calls are read from its text in the template's format "
        "(Hermes/Qwen <tool_call>, Mistral [TOOL_CALLS], a JSON object), see inference._core.tool_formats",
    ),
    "tool_choice": Sent(
        "llguidance / structured outputs",
        "'required' or a named tool: the answer is the call, constrained to the tool's parameters; 'auto': free "
        "text, calls read from it; 'none': the tools are not rendered",
    ),
    "thinking": Sent(
        "chat template variable enable_thinking",
        "a leading <think>...</think> of the text goes to the result's reasoning, and is never streamed",
    ),
    "response_format": RESPONSE_FORMAT_AS_JSON_SCHEMA,
    "extra_body": Refused("extra_body is merged into a server's request body; this backend runs in process"),
    "timeout": TIMEOUT_IN_BASE_CLASS,
}
"""The options every in-process provider receives the same way."""
