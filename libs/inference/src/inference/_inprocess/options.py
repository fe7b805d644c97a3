"""How every in-process provider receives the request options it handles alike (each provider's map adds the rest).

The in-process providers share the prompt rule (:mod:`inference._inprocess.base`: a system prompt is a system
message rendered by the model's chat template) and constrained decoding with llguidance
(:mod:`inference._inprocess.constrained`), and none calls tools yet. A provider's
:attr:`~inference.InferenceProvider.options` starts from :data:`IN_PROCESS_OPTIONS` and declares its own sampling
options; a key it also sets replaces the shared entry.
"""

from __future__ import annotations

from inference.options import OptionMap, Refused, Sent

__all__ = ["IN_PROCESS_OPTIONS"]

IN_PROCESS_OPTIONS: OptionMap = {
    "system_prompt": Sent("chat template", "a system message rendered by the model's chat template"),
    "json_schema": Sent("llguidance", "a token mask per step"),
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
    "response_format": Sent("json_schema", "mapped to json_schema before anything is sent"),
    "extra_body": Refused("extra_body is merged into a server's request body; this backend runs in process"),
    "timeout": Sent("the call's deadline", "the base class cancels the call after timeout seconds"),
}
"""The options every in-process provider receives the same way."""
