"""The prompt rule of :mod:`inference._inprocess.base`, for a Hugging Face tokenizer: a request's prompt token ids.

Shared by the in-process providers that tokenize with a Hugging Face tokenizer (Transformers + PEFT, vLLM's
engine), so the same request becomes the same tokens on both.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from inference._core.scoring import Vocabulary
from inference._core.thinking import template_variables
from inference._core.validation import GenerationRequest
from inference._inprocess.base import chat_messages, plain_prompt, refuse_template_variables, template_refusal

__all__ = ["encode", "model_chat_template", "prompt_token_ids", "scoring_vocabulary"]


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
        return encode(tokenizer, plain_prompt(request), special=True)
    elif request.chat_template or getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(
                chat_messages(request), tools=list(request.tools) or None, chat_template=request.chat_template,
                add_generation_prompt=True, tokenize=False, **template_variables(request),
            )
        except Exception as error:  # jinja2's TemplateError, e.g. "System role not supported"
            model = getattr(tokenizer, "name_or_path", None) or "the model"
            raise template_refusal(request, error, model=model, provider=provider) from error
        return encode(tokenizer, text + request.answer_prefix, special=False)
    model = getattr(tokenizer, "name_or_path", None) or "the model"
    refuse_template_variables(request, model=model, provider=provider)
    return encode(tokenizer, plain_prompt(request) + request.answer_prefix, special=True)


ENCODED_TEXTS = 4096
"""How many prompt texts each tokenizer's ids are kept for (an evaluation sends the same prompts to every adapter)."""

_encoded: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[str, bool, int], tuple[int, ...]]] = (
    weakref.WeakKeyDictionary()
)
_encoded_lock = threading.Lock()


def encode(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    """``tokenizer(text, add_special_tokens=special)``'s ids, from the last :data:`ENCODED_TEXTS` texts when seen.

    A Hugging Face tokenizer's call costs a fraction of a millisecond of Python for a short prompt, on the thread
    that drives the model; an evaluation of N adapters on M prompts asks for the same M texts N times.
    """
    key = (text, special, len(tokenizer))  # a token added to the tokenizer later makes other ids
    with _encoded_lock:
        cache = _encoded.get(tokenizer)
        ids = cache.get(key) if cache is not None else None
        if ids is not None:
            cache.move_to_end(key)  # type: ignore[union-attr]
            return list(ids)
    ids = tuple(int(token) for token in tokenizer(text, add_special_tokens=special)["input_ids"])
    with _encoded_lock:
        cache = _encoded.setdefault(tokenizer, OrderedDict())
        cache[key] = ids
        if len(cache) > ENCODED_TEXTS:
            cache.popitem(last=False)
    return list(ids)


def encode_ahead(tokenizer: Any, texts: Sequence[str], *, special: bool) -> None:
    """Tokenize those of ``texts`` not kept yet in one call of the tokenizer, and keep them (a batch of score calls
    then reads its ids from :func:`encode`): one call over many texts instead of one per text."""
    size = len(tokenizer)
    with _encoded_lock:
        cache = _encoded.get(tokenizer)
        new = list(dict.fromkeys(text for text in texts if cache is None or (text, special, size) not in cache))
    if len(new) < 2:
        return
    rows = tokenizer(new, add_special_tokens=special)["input_ids"]
    with _encoded_lock:
        cache = _encoded.setdefault(tokenizer, OrderedDict())
        for text, ids in zip(new, rows, strict=True):
            cache[(text, special, size)] = tuple(int(token) for token in ids)
        while len(cache) > ENCODED_TEXTS:
            cache.popitem(last=False)


def scoring_vocabulary(tokenizer: Any) -> Vocabulary:
    """How the scoring rule tokenizes with a Hugging Face tokenizer: plain text without special tokens (through
    :func:`encode`'s kept ids: a multiple-choice item's context comes once per choice), and whether it adds a BOS."""
    bos_id = tokenizer.bos_token_id
    probe = tokenizer("probe")["input_ids"]
    return Vocabulary(
        encode=lambda text: encode(tokenizer, text, special=False),
        adds_bos=bos_id is not None and len(probe) > 0 and int(probe[0]) == int(bos_id),
        bos_id=None if bos_id is None else int(bos_id),
        eos_id=None if tokenizer.eos_token_id is None else int(tokenizer.eos_token_id),
    )


def model_chat_template(tokenizer: Any) -> str | None:
    """The chat template ``apply_chat_template`` renders a request with tools with (a tokenizer may keep several,
    named: its ``"tool_use"`` one then), or ``None`` for a tokenizer without one."""
    try:
        return str(tokenizer.get_chat_template(None, tools=[{}]))
    except ValueError:  # no chat template
        return None
