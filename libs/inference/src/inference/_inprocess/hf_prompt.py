"""The prompt rule of :mod:`inference._inprocess.base`, for a Hugging Face tokenizer: a request's prompt token ids.

Shared by the in-process providers that tokenize with a Hugging Face tokenizer (Transformers + PEFT, vLLM's
engine), so the same request becomes the same tokens on both.
"""

from __future__ import annotations

from typing import Any

from inference._core.thinking import template_variables
from inference._core.validation import GenerationRequest
from inference._inprocess.base import chat_messages, plain_prompt
from inference.exceptions import InvalidRequestError

__all__ = ["model_chat_template", "prompt_token_ids"]


def prompt_token_ids(tokenizer: Any, request: GenerationRequest, *, provider: str) -> list[int]:
    """The token ids the model reads for ``request``.

    A tokenizer with a chat template (or a request with ``chat_template``) renders
    :func:`~inference._inprocess.base.chat_messages` with the generation prompt and the request's
    ``chat_template_kwargs`` as template variables (and the request's ``tools``), then tokenizes the text and the
    request's ``answer_prefix`` without adding special tokens (the template wrote them); one without, or a request
    with ``raw_prompt``, gets :func:`~inference._inprocess.base.plain_prompt` (and the ``answer_prefix``) with the
    special tokens the tokenizer adds (BOS where its vocabulary says so).

    Raises:
        InvalidRequestError: The chat template refused the messages (a system role it does not support, say).
    """
    if request.prompt_token_ids is not None:  # a TokenIds prompt: the model's whole input, as given
        return list(request.prompt_token_ids)
    if request.raw_prompt:  # the text as it is, with the special tokens the tokenizer adds (BOS)
        ids = tokenizer(plain_prompt(request))["input_ids"]
    elif request.chat_template or getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(
                chat_messages(request), tools=list(request.tools) or None, chat_template=request.chat_template,
                add_generation_prompt=True, tokenize=False, **template_variables(request),
            )
        except Exception as error:  # jinja2's TemplateError, e.g. "System role not supported"
            raise InvalidRequestError(
                f"the chat template refused these messages ({error}): drop system_prompt or put it into the prompt"
                + (", or fix the chat_template given" if request.chat_template else ""),
                provider=provider,
            ) from error
        ids = tokenizer(text + request.answer_prefix, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(plain_prompt(request) + request.answer_prefix)["input_ids"]
    return [int(token) for token in ids]


def model_chat_template(tokenizer: Any) -> str | None:
    """The chat template ``apply_chat_template`` renders a request with tools with (a tokenizer may keep several,
    named: its ``"tool_use"`` one then), or ``None`` for a tokenizer without one."""
    try:
        return str(tokenizer.get_chat_template(None, tools=[{}]))
    except ValueError:  # no chat template
        return None
