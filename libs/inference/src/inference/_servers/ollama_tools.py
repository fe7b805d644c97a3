"""Tool calling on Ollama's native ``/api/chat``: the tools and a conversation's tool turns in Ollama's fields, the
call object a forced ``tool_choice`` asks for through ``format``, and the calls of an answer, whole or streamed.

Ollama's shapes (``api/types.go``, v0.33): a tool is OpenAI's function tool, sent as it is. A message's
``tool_calls`` are ``{"id", "function": {"index", "name", "arguments"}}`` with ``arguments`` a JSON *object*, not
text (``id`` from Ollama 0.12.10 on; an older server gives none, and one is made up here); a tool message names the
tool it answers in ``tool_name`` (0.9.6 on) and the call in ``tool_call_id`` (0.12.10 on; older servers ignore it).

Ollama has no ``tool_choice``. ``"auto"`` sends the tools; ``"none"`` sends none (the conversation's tool turns are
still sent). ``"required"`` and a named tool send the tools (the chat template shows them to the model) and
``format``, Ollama's guided decoding: a JSON schema of the call object ``{"name": <the tool>, "arguments": <its
parameters>}`` (one such object per tool, ``anyOf``, for ``"required"``). Ollama compiles ``format`` to a grammar
(llama.cpp's JSON-schema converter), so the answer is that object; Ollama's own tool parser may read it into
``message.tool_calls`` (templates whose tool-call tag is ``{``), else it is the message's content, read here. Either
way the call parses and validates against the tool's parameters, as far as llama.cpp's converter supports the
schema.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from inference._core.call_schema import call_schema
from inference._core.validation import GenerationRequest
from inference.messages import Message, arguments_object
from inference.results import ToolCall
from inference.tools import forced_tool, parse_tool_call

__all__ = ["OllamaToolCalls", "forced_names", "new_call_id", "ollama_messages", "tool_fields"]


def ollama_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The checked conversation as Ollama's ``messages``: an assistant turn's calls with their ``arguments`` as JSON
    objects and their place in the turn as ``index``; a tool turn with the ``tool_name`` of the call it answers (the
    latest call with its id, as Ollama's own OpenAI layer resolves it) and its ``tool_call_id``.

    Arguments that are not a JSON object (a call reported with an error, sent back so the model can retry) are sent
    as ``{}``: Ollama takes an object only, and the tool message that follows says what went wrong.
    """
    names: dict[str, str] = {}
    converted: list[dict[str, Any]] = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            names.update((call["id"], call["function"]["name"]) for call in calls)
            converted.append({
                "role": "assistant",
                "content": message["content"],
                "tool_calls": [
                    {"id": call["id"], "function": {
                        "index": index, "name": call["function"]["name"],
                        "arguments": arguments_object(call["function"]["arguments"]) or {},
                    }}
                    for index, call in enumerate(calls)
                ],
            })
        elif message["role"] == "tool":
            call_id = message.get("tool_call_id", "")
            converted.append({"role": "tool", "content": message["content"], "tool_name": names.get(call_id, ""),
                              "tool_call_id": call_id})
        else:
            converted.append({"role": message["role"], "content": message["content"]})
    return converted


def forced_names(request: GenerationRequest) -> list[str] | None:
    """The tools one of which the answer must call (``tool_choice`` ``"required"``: every tool; a named tool: it),
    or ``None`` when the model may answer in text."""
    choice = request.tool_choice
    if not request.tools or choice in (None, "auto", "none"):
        return None
    if isinstance(choice, Mapping):
        return [str(choice["function"]["name"])]
    return [str(tool["function"]["name"]) for tool in request.tools]


def tool_fields(request: GenerationRequest) -> dict[str, Any]:
    """The body's ``tools`` (and, for a forced call, ``format``) for the request's tools and ``tool_choice``;
    nothing without tools or with ``"none"``."""
    if not request.tools or request.tool_choice == "none":
        return {}
    fields: dict[str, Any] = {"tools": [json.loads(json.dumps(tool)) for tool in request.tools]}
    schema = call_schema(request.tools, forced_names(request))
    if schema is not None:
        fields["format"] = schema
    return fields


class OllamaToolCalls:
    """The tool calls of one answer, gathered from each line's ``message.tool_calls``.

    A whole answer holds them in its message; a stream sends them in lines of their own as Ollama's parser finds
    them (templates Ollama renders) or on its done line (chats llama-server renders), so every line is added. For a
    forced call, an answer without ``tool_calls`` holds the call object in its content.

    Args:
        request: The request answered: its tools (to check the calls against) and ``tool_choice``.
    """

    def __init__(self, request: GenerationRequest) -> None:
        self._request = request
        self._calls: list[Any] = []
        self.forced = forced_names(request) is not None
        """Whether the answer is a call (``"required"`` or a named tool): its content is the call, not text."""

    def add(self, message: Mapping[str, Any]) -> None:
        """Take one answer's or stream line's message.

        Raises:
            TypeError: ``tool_calls`` is not a list of calls with a function name.
        """
        calls = message.get("tool_calls")
        if calls is None:
            return
        if not isinstance(calls, list):
            raise TypeError(f"message.tool_calls is {type(calls).__name__}, not a list")
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise TypeError(f"a tool call without a function name: {call!r:.200}")
        self._calls.extend(calls)

    def result(self, content: str, cut: bool) -> tuple[str, list[ToolCall]]:
        """``(text, calls)``: the content and every call, parsed and checked against the request's tools (a call
        whose arguments do not validate is kept, with its error); for a forced call without ``tool_calls``, the
        call read from the content (which is then no text).

        Args:
            content: The answer's content, whole.
            cut: The answer stopped at ``max_tokens`` (a forced call's JSON may be cut short).
        """
        tools = self._request.tools or None
        calls: list[ToolCall] = []
        seen: set[str] = set()
        for call in self._calls:
            function = call["function"]
            call_id = call.get("id")
            if not isinstance(call_id, str) or not call_id or call_id in seen:
                call_id = new_call_id()
            seen.add(call_id)
            arguments = function.get("arguments")
            if arguments is not None and not isinstance(arguments, (str, Mapping)):
                arguments = json.dumps(arguments)  # reported as JSON that is not an object
            calls.append(parse_tool_call(call_id, function["name"], arguments, tools))
        if calls or not self.forced:
            return content, calls
        return "", [self._call_in_content(content, cut)]

    def _call_in_content(self, content: str, cut: bool) -> ToolCall:
        """The call object a forced call's ``format`` asked for, from the content; reported with an error (never
        dropped) when the content is not one."""
        request = self._request
        tools = request.tools or None
        call_id = new_call_id()
        try:
            value = json.loads(content)
        except ValueError as error:
            value, problem = None, f"it is not JSON ({error})"
        else:
            problem = "it is not an object of a string 'name' and an object 'arguments'"
        if (
            isinstance(value, dict)
            and set(value) <= {"name", "arguments"}
            and isinstance(value.get("name"), str)
            and isinstance(value.get("arguments"), dict)
        ):
            return parse_tool_call(call_id, value["name"], value["arguments"], tools)
        named = value.get("name") if isinstance(value, dict) else None
        name = named if isinstance(named, str) else forced_tool(request.tools, request.tool_choice) or ""
        why = "max_tokens cut it short: raise max_tokens" if cut else "Ollama did not hold to the format it was sent"
        return ToolCall(
            call_id, name, {}, content,
            f"the answer to tool_choice {_choice_text(request)} is not the call object its format asked for: "
            f"{problem}; {why}. ToolCall.raw_arguments holds what the model wrote",
        )


def _choice_text(request: GenerationRequest) -> str:
    choice = request.tool_choice
    return f"naming {choice['function']['name']!r}" if isinstance(choice, Mapping) else repr(choice)


def new_call_id() -> str:
    """A call id for a call Ollama gave none (servers before 0.12.10): ``call_`` and 24 random hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"
