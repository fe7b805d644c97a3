"""A server's 400 for a prompt longer than its context, read as a :class:`ServerTokenLimitError`.

Each server words it its own way; the numbers are read from its answer:

- vLLM: ``This model's maximum context length is 512 tokens. However, your prompt contains 600 input tokens, ...``
  (before the engine), or ``The decoder prompt (length 600) is longer than the maximum model length of 512``
  (``... plus the number of requested output tokens (at least 1) is longer than ...`` when it fills the context
  exactly);
- llama.cpp's llama-server: ``{"error": {"type": "exceed_context_size_error", "n_prompt_tokens": 600,
  "n_ctx": 512, ...}}``;
- OpenAI and llama-cpp-python's ``llama_cpp.server``: ``{"error": {"code": "context_length_exceeded", "message":
  "This model's maximum context length is 512 tokens. However, you requested 700 tokens (600 in the messages,
  100 in the completion) ..."}}`` (``... tokens, however you requested 700 tokens (600 in your prompt; ...`` for
  completions; OpenAI also says ``However, your messages resulted in 600 tokens``).

Ollama is not here: it cuts a long prompt to its ``num_ctx`` instead of refusing it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inference._servers.http import ServerAnswer
from inference.exceptions import ServerTokenLimitError

__all__ = ["context_overflow"]

_MAXIMUM = r"maximum context length is (?P<limit>\d+) tokens[.,] however,? "
_SENTENCES = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        _MAXIMUM + r"your prompt contains (?:at least )?(?P<value>\d+) input tokens",  # vLLM
        _MAXIMUM + r"you requested (?P<total>\d+) tokens \((?P<value>\d+) in (?:the messages|your prompt)",  # OpenAI
        _MAXIMUM + r"your messages resulted in (?P<value>\d+) tokens",  # OpenAI
        _MAXIMUM + r"your prompt contains \d+ characters",  # vLLM, before it counts tokens
        r"prompt \(length (?P<value>\d+)\).* longer than the maximum model length of (?P<limit>\d+)",  # vLLM's engine
    )
)
"""The sentences that name the context (``limit``) and, where they say it, the prompt's length (``value``) and the
prompt's plus the requested completion's (``total``)."""


def context_overflow(answer: ServerAnswer) -> ServerTokenLimitError | None:
    """The :class:`ServerTokenLimitError` a 400 means when it refuses a prompt too long for the context, else ``None``.

    Args:
        answer: The server's 400 answer.
    """
    numbers = _llama_server_numbers(answer) or _sentence_numbers(answer.message)
    if numbers is None:
        return None
    limit, value = numbers
    return ServerTokenLimitError(
        f"{answer.where} refused the prompt: it does not fit the server's context of {limit} tokens "
        f"({answer.message}): shorten it, or serve the model with a longer context",
        request=answer.response.request,
        response=answer.response,
        limit=limit,
        value=value,
        provider=answer.provider,
        url=answer.url,
    )


def _llama_server_numbers(answer: ServerAnswer) -> tuple[int, int] | None:
    """llama-server's ``exceed_context_size_error``: ``(n_ctx, n_prompt_tokens)``."""
    error = _json_error(answer)
    if error is None or error.get("type") != "exceed_context_size_error":
        return None
    limit, value = error.get("n_ctx"), error.get("n_prompt_tokens")
    if not isinstance(limit, int) or not isinstance(value, int):
        return None
    return limit, value


def _sentence_numbers(message: str) -> tuple[int, int] | None:
    """vLLM's or OpenAI's sentence: ``(context, length)``.

    The length is the prompt's; the prompt's plus the completion's where only both together are over the context
    (OpenAI's ``you requested``); the context's own where the server does not count the prompt in tokens.
    """
    for sentence in _SENTENCES:
        found = sentence.search(message)
        if found is None:
            continue
        numbers = {name: int(number) for name, number in found.groupdict().items() if number is not None}
        limit = numbers["limit"]
        value = numbers.get("value", limit)
        return limit, value if value >= limit else numbers.get("total", value)
    return None


def _json_error(answer: ServerAnswer) -> Mapping[str, Any] | None:
    """The answer's JSON ``error`` object, if it has one."""
    try:
        body = answer.response.json()
    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        return None
    error = body.get("error") if isinstance(body, Mapping) else None
    return error if isinstance(error, Mapping) else None
