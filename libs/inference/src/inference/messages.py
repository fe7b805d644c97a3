"""Chat messages: a prompt may be a string or a conversation of system, user, assistant and tool turns.

A prompt given as a string is one user turn, with the request's ``system_prompt`` (if any) before it, so
``generate(U, system_prompt=S)`` and ``generate([{"role": "system", "content": S}, {"role": "user", "content":
U}])`` are the same request on every backend. Servers receive the messages as chat messages; in-process
providers render them with the model's chat template, or, for a model without one, with
:func:`plain_text`.

A tool loop carries on in the messages, in OpenAI's shapes: the assistant turn that called tools,
``{"role": "assistant", "content": ..., "tool_calls": [...]}`` (OpenAI's dicts or :class:`~inference.ToolCall`
objects; ``content`` may be ``None`` or ``""``), then one ``{"role": "tool", "tool_call_id": ..., "content": ...}``
per call it answers. :meth:`~inference.GenerationResult.as_message` and :meth:`~inference.ToolCall.answer` build
them. Checked messages hold the calls as OpenAI's dicts (``arguments`` as JSON text) and ``content`` as a string.

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

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

from inference.options import Fail, require_utf8
from inference.tokens import TokenIds

__all__ = ["ROLES", "Message", "Prompt", "ToolCallDict", "check_messages", "has_tool_turns", "plain_text"]

ROLES = ("system", "user", "assistant", "tool")
"""The roles a message may have."""


class ToolCallFunction(TypedDict):
    """The function part of a tool call: its name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolCallDict(TypedDict):
    """One tool call in an assistant message, in OpenAI's shape."""

    id: str
    type: Literal["function"]
    function: ToolCallFunction


class _MessageBase(TypedDict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class Message(_MessageBase, total=False):
    """One turn of a conversation: ``{"role": "user", "content": "Hello"}``.

    An assistant turn that called tools also holds ``tool_calls`` (a list of :class:`ToolCallDict`); a tool turn
    holds ``tool_call_id``, the id of the call it answers.
    """

    tool_calls: list[ToolCallDict]
    tool_call_id: str


Prompt = str | Sequence[Message] | TokenIds
"""What ``generate``, ``stream`` and ``generate_batch`` take as a prompt: a string, a list of messages, or the model's
token ids as :class:`~inference.tokens.TokenIds` (where ``supports_token_prompts``)."""

_KEYS = {
    "system": ("role", "content"),
    "user": ("role", "content"),
    "assistant": ("role", "content", "tool_calls"),
    "tool": ("role", "content", "tool_call_id"),
}


def check_messages(value: Sequence[object], name: str, fail: Fail) -> tuple[Message, ...]:
    """Check a message list and return it as a tuple of fresh message dicts.

    Raises:
        InvalidRequestError: ``fail(message)`` for an empty list, a message that is not a dict with a known
            ``role`` and a string ``content``, content that UTF-8 cannot encode, a tool call without an id or a
            name, a tool call whose ``type`` is not ``"function"``, a call id that an earlier call of the
            conversation has, or a tool message without a ``tool_call_id``, answering no call of an earlier
            assistant message, or answering a call that an earlier tool message answered; the message names its
            index.
    """
    if not value:
        raise fail(f"{name} is an empty list of messages: give at least one message, or a string")
    checked: list[Message] = []
    calls: dict[str, str] = {}  # id -> where the call was made, of every call made so far
    answered: dict[str, str] = {}  # id -> the tool message that answered it
    for index, message in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(message, Mapping):
            raise fail(f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise fail(
                f"{where} has role {role!r}: a message's role must be 'system', 'user', 'assistant' or 'tool'"
            )
        extra = sorted(str(key) for key in message if key not in _KEYS[role])
        if extra:
            allowed = " and ".join(repr(key) for key in _KEYS[role])
            raise fail(f"{where} has keys {extra}: a message of role {role!r} holds only {allowed}")
        tool_calls = message.get("tool_calls") if role == "assistant" else None
        if content is None and tool_calls:
            content = ""  # OpenAI's assistant turn that only calls tools
        if not isinstance(content, str):
            raise fail(f"{where} must have string 'content', got {type(content).__name__}")
        require_utf8(content, f"{where}.content", fail)
        if role == "assistant" and tool_calls is not None:
            checked_calls = _tool_calls(tool_calls, f"{where}.tool_calls", fail)
            for call_index, call in enumerate(checked_calls):
                made_at = f"{where}.tool_calls[{call_index}]"
                if call["id"] in calls:
                    raise fail(
                        f"{made_at} has id {call['id']!r}, which {calls[call['id']]} has too: every tool call of a "
                        "conversation needs an id of its own, so that its tool message answers it alone"
                    )
                calls[call["id"]] = made_at
            checked.append({"role": "assistant", "content": content, "tool_calls": checked_calls})
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise fail(
                    f"{where} is a tool message without a 'tool_call_id': give the id of the call it answers "
                    "(ToolCall.answer(content) builds the message)"
                )
            if call_id not in calls:
                known = ", ".join(repr(known) for known in calls) or "none"
                raise fail(
                    f"{where} answers tool call {call_id!r}, which no earlier assistant message made (calls made: "
                    f"{known}): put the assistant message with its tool_calls before the tool results"
                )
            if call_id in answered:
                raise fail(
                    f"{where} answers tool call {call_id!r}, which {answered[call_id]} answered already: give one "
                    "tool message per call"
                )
            answered[call_id] = where
            checked.append({"role": "tool", "content": content, "tool_call_id": call_id})
        else:
            checked.append({"role": role, "content": content})
    return tuple(checked)


def _tool_calls(value: object, where: str, fail: Fail) -> list[ToolCallDict]:
    """An assistant message's tool calls (OpenAI's dicts or :class:`~inference.ToolCall` objects) as OpenAI's dicts."""
    from inference.results import ToolCall

    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise fail(f"{where} must be a list of tool calls, got {type(value).__name__}")
    checked: list[ToolCallDict] = []
    for index, call in enumerate(value):
        item = f"{where}[{index}]"
        call_id: object
        call_name: object
        arguments: object
        if isinstance(call, ToolCall):
            call_id, call_name, arguments = call.id, call.name, call.raw_arguments
        elif isinstance(call, Mapping):
            function = call.get("function")
            if not isinstance(function, Mapping):
                raise fail(f"{item} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}")
            kind = call.get("type", "function")  # Ollama's calls have no type
            if kind != "function":
                raise fail(f"{item} has type {kind!r}: a tool call is a function call, with type 'function' (or none)")
            call_id, call_name, arguments = call.get("id"), function.get("name"), function.get("arguments", "{}")
            if isinstance(arguments, Mapping):  # Ollama's and the chat templates' form: a dict
                arguments = json.dumps(arguments, ensure_ascii=False)
        else:
            raise fail(f"{item} must be a ToolCall or a dict in OpenAI's shape, got {type(call).__name__}")
        if not isinstance(call_id, str) or not call_id:
            raise fail(f"{item} has no 'id': every tool call needs the id its tool message answers")
        if not isinstance(call_name, str) or not call_name:
            raise fail(f"{item} has no function name (a call the model wrote without one, whose ToolCall.error says "
                       "so, cannot go back as a call: answer its error in a user message instead)")
        if not isinstance(arguments, str):
            raise fail(f"{item}'s arguments must be JSON text or a dict, got {type(arguments).__name__}")
        require_utf8(arguments, f"{item}.function.arguments", fail)
        checked.append({"id": call_id, "type": "function", "function": {"name": call_name, "arguments": arguments}})
    return checked


def arguments_object(arguments: str) -> dict[str, Any] | None:
    """A call's ``arguments`` text as a JSON object, ``None`` where it is not one (a call the model wrote badly,
    sent back with its error so that it can retry). Servers that parse a history's arguments refuse anything but an
    object, so the server routes send ``{}`` for such a call; the tool message that follows says what went wrong."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def has_tool_turns(messages: Sequence[Message]) -> bool:
    """True when the conversation holds a tool call or a tool result (a backend must know tools to send it)."""
    return any(message.get("tool_calls") or message["role"] == "tool" for message in messages)


def plain_text(messages: Sequence[Message]) -> str:
    """A conversation as text for a model without a chat template: the contents, separated by blank lines.

    A system message then a user message gives ``"S\\n\\nU"``, as ``system_prompt`` does for such models. A tool
    call reads ``Calling NAME with ARGUMENTS`` (after the assistant's text, if any), its result
    ``NAME returned: CONTENT``. A message with empty content and no calls adds nothing (no blank lines for an
    empty system prompt).
    """
    names: dict[str, str] = {}
    parts: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            name = names.get(message.get("tool_call_id", ""), "the tool")
            parts.append(f"{name} returned: {message['content']}")
            continue
        lines = [message["content"]] if message["content"] else []
        for call in message.get("tool_calls", ()):
            names[call["id"]] = call["function"]["name"]
            lines.append(f"Calling {call['function']['name']} with {call['function']['arguments']}")
        if lines:
            parts.append("\n".join(lines))
    return "\n\n".join(parts)

