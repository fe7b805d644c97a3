"""Chat messages: a prompt may be a string or a conversation of system, user and assistant turns.

A prompt given as a string is one user turn, with the request's ``system_prompt`` (if any) before it, so
``generate(U, system_prompt=S)`` and ``generate([{"role": "system", "content": S}, {"role": "user", "content":
U}])`` are the same request on every backend. Servers receive the messages as chat messages; in-process
providers render them with the model's chat template, or, for a model without one, with
:func:`plain_text`.

Example:
    >>> from inference.exceptions import InvalidRequestError
    >>> from inference.messages import check_messages, plain_text
    >>> fail = InvalidRequestError
    >>> messages = check_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ...                           "prompt", fail)
    >>> plain_text(messages)
    'Be brief.\\n\\nHi'
    >>> check_messages([{"role": "robot", "content": "Hi"}], "prompt", fail)
    Traceback (most recent call last):
    ...
    inference.exceptions.InvalidRequestError: prompt[0] has role 'robot': a message's role must be ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, TypedDict

from inference.options import Fail, require_utf8
from inference.tokens import TokenIds

__all__ = ["ROLES", "Message", "Prompt", "check_messages", "plain_text"]

ROLES = ("system", "user", "assistant")
"""The roles a message may have."""


class Message(TypedDict):
    """One turn of a conversation: ``{"role": "user", "content": "Hello"}``."""

    role: Literal["system", "user", "assistant"]
    content: str


Prompt = str | Sequence[Message] | TokenIds
"""What ``generate``, ``stream`` and ``generate_batch`` take as a prompt: a string, a list of messages, or the model's
token ids as :class:`~inference.tokens.TokenIds` (where ``supports_token_prompts``)."""


def check_messages(value: Sequence[object], name: str, fail: Fail) -> tuple[Message, ...]:
    """Check a message list and return it as a tuple of fresh ``{"role", "content"}`` dicts.

    Raises:
        InvalidRequestError: ``fail(message)`` for an empty list, a message that is not a dict with a known
            ``role`` and a string ``content``, or content that UTF-8 cannot encode; the message names its index.
    """
    if not value:
        raise fail(f"{name} is an empty list of messages: give at least one message, or a string")
    checked: list[Message] = []
    for index, message in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(message, Mapping):
            raise fail(f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise fail(f"{where} has role {role!r}: a message's role must be 'system', 'user' or 'assistant'")
        if not isinstance(content, str):
            raise fail(f"{where} must have string 'content', got {type(content).__name__}")
        extra = sorted(str(key) for key in message if key not in ("role", "content"))
        if extra:
            raise fail(f"{where} has keys {extra}: a message holds only 'role' and 'content'")
        require_utf8(content, f"{where}.content", fail)
        checked.append({"role": role, "content": content})
    return tuple(checked)


def plain_text(messages: Sequence[Message]) -> str:
    """A conversation as text for a model without a chat template: the contents, separated by blank lines.

    A system message then a user message gives ``"S\\n\\nU"``, as ``system_prompt`` does for such models. A message
    with empty content adds nothing (no blank lines for an empty system prompt).
    """
    return "\n\n".join(message["content"] for message in messages if message["content"])
