"""The prompt rule on llama.cpp: a request's messages rendered by the model's chat template, or its plain text, as
token ids (the rule itself: :mod:`inference._inprocess.base`).

A model with a chat template gets its messages (and tools) rendered with the generation prompt, as Transformers
renders them (:mod:`inference._inprocess.chat_templates`), and tokenized with no further special tokens; a model
without one gets its plain text with the special tokens its vocabulary adds (BOS where it says so). Either is
followed by the request's ``answer_prefix``. Text becomes token ids as the model's Hugging Face tokenizer makes them
(:class:`~inference._inprocess.llamacpp_text.TextEncoder`). All on the provider's worker thread.
"""

from __future__ import annotations

from typing import Any

from inference._core.thinking import template_variables
from inference._core.validation import GenerationRequest
from inference._inprocess.base import chat_messages, plain_prompt, refuse_template_variables, template_refusal
from inference._inprocess.chat_templates import ChatTemplate
from inference._inprocess.llamacpp_model import LlamaCppModel
from inference._inprocess.llamacpp_text import TextEncoder

__all__ = ["LlamaPrompts"]


class LlamaPrompts:
    """Token ids of prompts and texts for one provider's model.

    Args:
        model: The provider's model (its chat template's renderer, read after the first load).
    """

    def __init__(self, model: LlamaCppModel) -> None:
        self.model = model
        self._text: TextEncoder | None = None  # text to token ids as the model's HF tokenizer does it
        self._formatters: dict[str, ChatTemplate] = {}  # the renderers of the last requests' chat_template overrides

    def tokens(self, llama: Any, request: GenerationRequest) -> list[int]:
        """Token ids of a request's prompt per the in-process prompt rule."""
        if request.prompt_token_ids is not None:  # a TokenIds prompt: the model's whole input, as given
            return list(request.prompt_token_ids)
        try:
            formatter = self._formatter(request)
            rendered = None if formatter is None else formatter.render(
                chat_messages(request), tools=request.tools, **template_variables(request)
            )
        except Exception as error:  # jinja2 errors (syntax, raise_exception() in the template)
            raise template_refusal(request, error, model=self.model.name, provider=self.model.provider) from error
        if rendered is not None:
            return self.encode(llama, rendered + request.answer_prefix, add_bos=False)
        if not request.raw_prompt:  # (a raw prompt with them is refused earlier, with its own reason)
            refuse_template_variables(request, model=self.model.name, provider=self.model.provider)
        # add_bos=True means "as the model's vocabulary says" (llama_vocab_get_add_bos).
        return self.encode(llama, plain_prompt(request) + request.answer_prefix, add_bos=True)

    def _formatter(self, request: GenerationRequest) -> ChatTemplate | None:
        """The request's chat template renderer: the model's, one for the request's ``chat_template``, or ``None``
        (no template, or a ``raw_prompt``)."""
        if request.raw_prompt:
            return None
        if request.chat_template is None:
            return self.model.formatter
        formatter = self._formatters.get(request.chat_template)
        if formatter is None:
            info = self.model.model_info()
            formatter = ChatTemplate(request.chat_template, bos_token=info.bos_token, eos_token=info.eos_token)
            self._formatters = {**dict(list(self._formatters.items())[-7:]), request.chat_template: formatter}
        return formatter

    def encode(self, llama: Any, text: str, *, add_bos: bool) -> list[int]:
        """Token ids of ``text`` as the model's Hugging Face tokenizer makes them (see :class:`TextEncoder`)."""
        if self._text is None:
            self._text = TextEncoder.for_model(llama)
        return self._text.encode(self.model.llama_cpp(), llama, text, add_bos=add_bos)
