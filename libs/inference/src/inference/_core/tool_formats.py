"""Tool calling where the SDK renders the chat template itself (in process): the call format a model's template
uses, the constrained call of a forced ``tool_choice``, and the calls read back out of the generated text.

A server parses its model's tool calls itself; an in-process backend (Transformers, llama.cpp, vLLM's engine) only
has text. :class:`ToolPlan` turns a request with tools into what such a backend runs, and its answer back into
:class:`~inference.ToolCall` objects:

- The model's chat template renders the tools and the conversation (tool calls with their arguments as objects,
  tool results with the tool's name), as Transformers' ``apply_chat_template(..., tools=...)`` does.
- The template says how the model writes a call (:func:`tool_format`): Hermes/Qwen's
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, Mistral's ``[TOOL_CALLS][{...}]``, or a bare JSON
  object (Llama 3's ``{"name": ..., "parameters": {...}}``). A template that never reads ``tools`` has no tool
  support: ``"auto"`` is refused for it, naming the model; a forced call still works (the model then sees no tool
  descriptions, only the constraint).
- ``"required"`` or a named tool: the answer starts with the format's opening marker (written after the prompt,
  :attr:`~inference._core.validation.GenerationRequest.answer_prefix`) and the rest is constrained by a JSON schema
  of the call (the tool's name and its ``parameters``), so the arguments always parse and validate. One call.
- ``"auto"``: the model writes freely; every call in its text is read (:meth:`ToolPlan.read`), and one whose JSON
  does not parse is reported (:attr:`~inference.ToolCall.error`), never dropped. ``"none"``: the tools are not
  rendered and the text is the answer.
- :class:`ToolCallStream`: the same reading over stream pieces: text outside calls is given out as it comes, a
  call (and anything that may still become one) is held back for the final result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inference._core.call_schema import call_schema
from inference._core.json_schemas import STRICT_JSON, strict_json_loads
from inference.exceptions import UnsupportedOperationError
from inference.tools import forced_tool, parse_tool_call

if TYPE_CHECKING:
    from inference._core.validation import GenerationRequest
    from inference.results import GenerationResult, ToolCall

__all__ = ["ToolCallStream", "ToolFormat", "ToolPlan", "tool_format"]


@dataclass(frozen=True)
class ToolFormat:
    """How a model family writes tool calls in its text.

    Attributes:
        name: ``"hermes"``, ``"mistral"``, ``"json"`` (a bare JSON object) or ``"none"`` (the template has no tool
            support).
        opening: The marker that opens a call (``""``: the call is the whole answer, a JSON object).
        closing: The marker that closes a call (``""``: none).
        arguments_key: The key of the arguments in a call object (``"arguments"``; Llama 3's ``"parameters"``).
        in_list: The calls after the marker are a JSON list (Mistral), not one object per marker.
    """

    name: str
    opening: str = ""
    closing: str = ""
    arguments_key: str = "arguments"
    in_list: bool = False

    @property
    def renders_tools(self) -> bool:
        """The chat template shows the model its tools."""
        return self.name != "none"


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", in_list=True)
NO_TOOLS = ToolFormat("none")
_PYTHON_TAG = "<|python_tag|>"  # Llama 3.1 may open a JSON call with it
_NAME_KEY = re.compile(r'"name"\s*:\s*"([^"]+)"')


def tool_format(template: str | None) -> ToolFormat:
    """The call format a chat template's model writes, read from the template's text.

    A template that writes ``<tool_call>`` is Hermes/Qwen's format, ``[TOOL_CALLS]`` Mistral's; any other template
    that reads ``tools`` takes calls as a bare JSON object (Llama 3 and the generic form), with the arguments under
    ``"parameters"`` where the template names them so. ``None`` (no template) or a template that never reads
    ``tools`` has no tool support.
    """
    if not template or not re.search(r"\btools\b", template):
        return NO_TOOLS
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    return ToolFormat("json", arguments_key="parameters" if '"parameters"' in template else "arguments")


@dataclass(frozen=True)
class ToolPlan:
    """What an in-process backend runs for a request with tools, and how its text becomes tool calls.

    Build it with :meth:`for_request`.

    Attributes:
        format: The model's call format.
        tools: The request's tools (checked definitions).
        forced: The tools a forced call may name (``"required"``: all; a named tool: that one); ``()``: not forced.
        offered: The tools are rendered and calls read (``False`` for ``tool_choice="none"``).
    """

    format: ToolFormat
    tools: tuple[Mapping[str, Any], ...]
    forced: tuple[str, ...] = ()
    offered: bool = True

    @classmethod
    def for_request(cls, request: GenerationRequest, template: str | None, *, model: str, provider: str) -> ToolPlan:
        """The plan of ``request`` for a model whose chat template is ``template`` (``None``: it has none).

        Raises:
            UnsupportedOperationError: ``tool_choice`` leaves the call to the model (``"auto"``) but its template has
                no tool support.
            UnsupportedOperationError: ``json_schema`` is combined with tools the model may call (both would constrain
                the answer here; a server may take both, so a fallback moves on).
        """
        format_ = tool_format(template)
        choice = request.tool_choice
        if choice == "none" or not request.tools:
            return cls(format_, tuple(request.tools), offered=False)
        if request.json_schema is not None:
            raise UnsupportedOperationError(
                "json_schema cannot be combined with tools in process: a tool call and a JSON answer would each "
                "constrain the text; give a tool whose parameters are the schema and force it (tool_choice), leave "
                "the tools out, or send both to a server that takes them together (vllm, openai)",
                provider=provider,
            )
        names = tuple(str(tool["function"]["name"]) for tool in request.tools)
        named = forced_tool(request.tools, choice)
        forced = (named,) if named is not None else names if choice == "required" else ()
        if not forced and not format_.renders_tools:
            whose = "the chat_template given" if request.chat_template else f"the chat template of {model}"
            raise UnsupportedOperationError(
                f"{whose} has no tool support (it never reads tools), so the model cannot choose a call: force one "
                "(tool_choice='required' or {'type': 'function', 'function': {'name': ...}}), whose arguments are "
                "then constrained to the tool's parameters, or give a chat_template that renders tools",
                provider=provider,
            )
        return cls(format_, tuple(request.tools), forced)

    def backend_request(self, request: GenerationRequest) -> GenerationRequest:
        """The request the backend runs: the tools to render (none for ``"none"``), and for a forced call the
        call's opening marker as the answer's start and the call's JSON schema as the constraint."""
        if not self.offered:
            return dataclasses.replace(request, tools=())
        if not self.forced:
            return request
        return dataclasses.replace(
            request,
            json_schema=call_schema(
                self.tools, self.forced, arguments_key=self.format.arguments_key, in_list=self.format.in_list
            ),
            answer_prefix=self.format.opening,
            stop=(),
            tools=request.tools if self.format.renders_tools else (),
        )

    def read(self, result: GenerationResult) -> GenerationResult:
        """``result`` with the calls in its text moved to ``tool_calls`` (``finish_reason`` ``"tool_calls"``); the
        text keeps what the model wrote outside them. A result with no call is returned as it is."""
        if not self.offered:
            return result
        prefix = self.format.opening if self.forced else ""
        text, calls = self.split(prefix + result.text, cut=result.finish_reason == "length")
        if not calls:
            return result
        finish_reason = "tool_calls" if result.finish_reason == "stop" else result.finish_reason
        return dataclasses.replace(result, text=text, tool_calls=tuple(calls), finish_reason=finish_reason)

    def split(self, text: str, *, cut: bool = False) -> tuple[str, list[ToolCall]]:
        """``(text outside calls, calls)`` of a generated text (``cut``: ``max_tokens`` ended it, so a call that runs
        to its end, in a format with no closing marker, may be unfinished)."""
        if not self.format.opening:
            return self._bare_json(text, cut=cut)
        outside: list[str] = []
        calls: list[ToolCall] = []
        rest = text
        while self.format.opening in rest:
            before, _, rest = rest.partition(self.format.opening)
            outside.append(before)
            if self.format.closing:
                body, closed, rest = rest.partition(self.format.closing)
                calls.extend(self._calls(body, closed=bool(closed)))
            else:  # Mistral: a list, then (after its closing "]") text outside the calls
                listed, rest = self._call_list(rest, closed=not cut)
                calls.extend(listed)
        outside.append(rest)
        return "".join(outside), calls

    def _bare_json(self, text: str, *, cut: bool) -> tuple[str, list[ToolCall]]:
        """A whole answer that is a call object (after Llama 3.1's ``<|python_tag|>``), else no call.

        Unless the call is forced, an object is a call only where its ``"name"`` is one of the tools or it has the
        call's arguments key: ``{"name": "Ada Lovelace", "born": 1815}`` is a JSON answer, not a call."""
        body = text.strip().removeprefix(_PYTHON_TAG).strip()
        if not body.startswith("{"):
            return text, []
        try:
            value = strict_json_loads(body)
        except ValueError:
            named = re.match(r'\{\s*"name"\s*:\s*(?:"((?:[^"\\]|\\.)*)")?', body)
            if named is None or not (self.forced or named.group(1) in self._names or self._has_arguments(body)):
                return text, []  # JSON-like text, not a call
            return "", self._calls(body, closed=not cut)  # a call the model began: reported with its error
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
            return text, []
        keys = (self.format.arguments_key, "arguments", "parameters")
        if not (self.forced or value["name"] in self._names or any(key in value for key in keys)):
            return text, []  # a JSON answer that has a "name", not a call
        return "", self._calls(body, closed=True)

    @property
    def _names(self) -> tuple[str, ...]:
        return tuple(str(tool["function"]["name"]) for tool in self.tools)

    def _has_arguments(self, body: str) -> bool:
        """A call object's arguments key appears at the top level of a JSON object that does not parse."""
        keys = "|".join(re.escape(key) for key in dict.fromkeys((self.format.arguments_key, "arguments", "parameters")))
        return _top_level(body, re.compile(rf'"(?:{keys})"\s*:')) is not None

    def _calls(self, body: str, *, closed: bool) -> list[ToolCall]:
        """The calls written in one call block (Mistral: a list of them)."""
        try:
            value = strict_json_loads(body)
        except ValueError as error:
            return [self._unreadable(body, error, closed)]
        return self._read_items([value], closed)

    def _call_list(self, rest: str, *, closed: bool) -> tuple[list[ToolCall], str]:
        """The calls of a Mistral list that opens ``rest``, and the text after the list's closing ``]``."""
        body = rest.lstrip()
        if not body.startswith("["):
            return self._calls(rest, closed=closed), ""
        try:
            value, end = STRICT_JSON.raw_decode(body)
        except ValueError as error:
            return self._list_items(body[1:], error, closed)
        items = value if isinstance(value, list) else [value]
        return self._read_items(items, closed=True), body[end:]

    def _list_items(self, rest: str, error: ValueError, closed: bool) -> tuple[list[ToolCall], str]:
        """A call list that does not parse whole (cut by ``max_tokens``, or an item that is not JSON): its finished
        items as calls, then what is left of the list as one unreadable call; and the text after the list's closing
        ``]``, where one follows the finished items."""
        decoder = STRICT_JSON
        items: list[Any] = []
        position = 0
        while True:
            position = len(rest) - len(rest[position:].lstrip(" \t\r\n,"))
            try:
                item, position = decoder.raw_decode(rest, position)
            except ValueError:
                break
            items.append(item)
        calls = self._read_items(items, True)
        remainder = rest[position:].lstrip()
        if remainder.startswith("]"):  # the list closed after its finished items: the rest is text
            return calls, remainder[1:]
        remainder = remainder.strip().removesuffix("]").strip()
        return ([*calls, self._unreadable(remainder, error, closed)] if remainder else calls), ""

    def _read_items(self, items: list[Any], closed: bool) -> list[ToolCall]:
        calls = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                calls.append(self._unreadable(json.dumps(item, ensure_ascii=False), None, closed))
                continue
            arguments = item.get(self.format.arguments_key, item.get("arguments", item.get("parameters")))
            raw = arguments if isinstance(arguments, (str, Mapping)) or arguments is None else json.dumps(arguments)
            call = parse_tool_call(_call_id(), item["name"], raw, self.tools)
            if arguments is None and call.error is not None:  # no arguments key: what the model wrote, not "{}"
                call = dataclasses.replace(call, raw_arguments=json.dumps(item, ensure_ascii=False))
            calls.append(call)
        return calls

    def _unreadable(self, body: str, error: ValueError | None, closed: bool) -> ToolCall:
        """A call whose JSON cannot be read: reported with what the model wrote, its name read from the text, else
        the one tool it could call (a call forced to one tool, or the only tool given), so that the call and its
        error can go back to the model as the loop in docs/tools.md does; ``""`` only where nothing says which."""
        from inference.results import ToolCall

        named = _top_level(body, _NAME_KEY)  # the call's own (an argument may be called name too)
        names = self.forced or tuple(tool["function"]["name"] for tool in self.tools)
        name = named.group(1) if named else names[0] if len(names) == 1 else ""
        keys = "|".join(re.escape(key) for key in dict.fromkeys((self.format.arguments_key, "arguments", "parameters")))
        begun = re.compile(rf'"(?:{keys})"\s*:\s*').search(body, named.end()) if named and not closed else None
        if begun is not None:  # cut inside its arguments: what was written of them, as a server reports a cut call
            written, what = body[begun.end() :].strip(), "the arguments the model wrote before the cut"
        else:
            written, what = body.strip(), "what the model wrote"
        cut = "" if closed else " (the answer ended inside the call: raise max_tokens)"
        detail = f" ({error})" if error is not None else ""
        return ToolCall(
            _call_id(), name, {}, written,
            f"the model's tool call is not a JSON object with a name and arguments{detail}{cut}: "
            f"ToolCall.raw_arguments holds {what}",
        )


def _top_level(body: str, pattern: re.Pattern[str], start: int = 0) -> re.Match[str] | None:
    """The first match of ``pattern`` (a key, from its opening quote) directly inside the outermost object of the
    JSON text ``body``: not in a nested object or list, not inside a string."""
    depths: dict[int, int] = {}  # position of each key-opening quote -> its depth
    depth, in_string, escaped = 0, False, False
    for position, char in enumerate(body):
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            depths[position], in_string = depth, True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
    return next((match for match in pattern.finditer(body, start) if depths.get(match.start()) == 1), None)


def _call_id() -> str:
    """A fresh call id, in OpenAI's style."""
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallStream:
    """:meth:`ToolPlan.split` over stream pieces: :meth:`feed` returns the text a piece adds outside calls (a call,
    and a tail that may still open one, held back), :meth:`flush` what was held back and is text after all. The
    pieces given out join to the text of :meth:`ToolPlan.read`'s result."""

    def __init__(self, plan: ToolPlan) -> None:
        self._plan = plan
        self._text = plan.format.opening if plan.forced else ""
        self._given = 0  # characters of the outside text given out

    def feed(self, piece: str) -> str:
        """The outside text ``piece`` adds (``""`` while it may be a call)."""
        self._text += piece
        if not self._plan.offered:
            return self._give(self._text)
        if not self._plan.format.opening:  # a bare JSON call is the whole answer: hold all of one that may be
            return "" if self._may_be_bare_call() else self._give(self._text)
        outside, _ = self._plan.split(self._text)  # an unclosed call is left out: held until it closes
        opening = self._plan.format.opening
        tail = max((size for size in range(1, len(opening)) if outside.endswith(opening[:size])), default=0)
        return self._give(outside[: len(outside) - tail])  # "<tool" may still open a call

    def flush(self) -> str:
        """What was held back and is text after all (the whole answer's outside text, less what was given)."""
        return self._give(self._plan.split(self._text)[0] if self._plan.offered else self._text)

    def _may_be_bare_call(self) -> bool:
        start = self._text.lstrip()
        return not start or start.startswith(("{", _PYTHON_TAG)) or _PYTHON_TAG.startswith(start)

    def _give(self, outside: str) -> str:
        piece = outside[self._given:]
        self._given = max(self._given, len(outside))
        return piece


def tool_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A conversation as chat templates read it: an assistant's tool calls with their arguments as objects (where
    they parse) and each tool result with the ``name`` of the tool it answers, beside its ``tool_call_id``
    (Transformers' convention, which Qwen, Llama 3 and Mistral templates follow)."""
    names: dict[str, str] = {}
    rendered: list[dict[str, Any]] = []
    for message in messages:
        out: dict[str, Any] = {"role": message["role"], "content": message["content"]}
        if message.get("tool_calls"):
            out["tool_calls"] = []
            for call in message["tool_calls"]:
                names[call["id"]] = call["function"]["name"]
                arguments: Any = call["function"]["arguments"]
                with contextlib.suppress(ValueError):  # a call written badly, answered with its error: kept as text
                    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
                out["tool_calls"].append(
                    {"id": call["id"], "type": "function",
                     "function": {"name": call["function"]["name"], "arguments": arguments}}
                )
        if message["role"] == "tool":
            out["tool_call_id"] = message["tool_call_id"]
            out["name"] = names.get(message["tool_call_id"], "")
        rendered.append(out)
    return rendered
