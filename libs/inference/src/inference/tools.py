"""Tools a model may call: their definitions, the ``tool_choice`` rule, and reading the calls a model made.

A request's ``tools`` are OpenAI's function tools::

    {"type": "function", "function": {"name": "get_weather", "description": "...", "parameters": <JSON schema>}}

A Python function (its type hints give the parameters' schema, its docstring the description and, from a
Google-style ``Args:`` section, each parameter's description) or a pydantic model class (its
``model_json_schema()``; the tool's name is the class name) is converted to that shape by :func:`tool_definition`.
``tool_choice`` is ``"auto"`` (the model decides; the default when tools are given), ``"none"`` (no call),
``"required"`` (at least one call) or ``{"type": "function", "function": {"name": N}}`` (a call of tool N).

The model's calls come back as :class:`~inference.ToolCall` objects in
:attr:`~inference.GenerationResult.tool_calls`; :func:`parse_tool_call` builds one from the text a backend returned,
reporting arguments that do not parse (or do not validate) in ``ToolCall.error`` instead of dropping the call.

Example:
    >>> def get_weather(city: str, days: int = 1) -> str:
    ...     '''The weather forecast for a city.
    ...
    ...     Args:
    ...         city: The city's name.
    ...         days: How many days ahead.
    ...     '''
    ...     return "sunny"
    >>> function = tool_definition(get_weather).get("function")
    >>> function.get("name"), function.get("parameters").get("required")
    ('get_weather', ['city'])
    >>> parse_tool_call("call_1", "get_weather", '{"city": "Paris"', None).error  # doctest: +ELLIPSIS
    "the arguments of get_weather are not JSON (Expecting ',' delimiter at character 16): ..."
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from inference._core.json_schemas import strict_json_loads
from inference.exceptions import InvalidRequestError
from inference.options import Fail, check_json_schema, require_utf8
from inference.results import ToolCall

__all__ = [
    "ToolChoice",
    "ToolSpec",
    "check_tool_choice",
    "check_tools",
    "forced_tool",
    "parse_tool_call",
    "tool_definition",
]

ToolSpec = Mapping[str, Any] | Callable[..., Any] | type
"""What ``tools`` takes, per tool: OpenAI's function-tool dict, a Python function, or a pydantic model class."""

ToolChoice = Literal["auto", "none", "required"] | Mapping[str, Any]
"""What ``tool_choice`` takes: ``"auto"``, ``"none"``, ``"required"``, or ``{"type": "function", "function":
{"name": N}}``."""

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""Tool names as OpenAI takes them: 1-64 letters, digits, ``_``, ``.`` or ``-``."""


def tool_definition(tool: object, *, name: str = "tools", fail: Fail | None = None) -> dict[str, Any]:
    """One tool in OpenAI's shape, checked: ``{"type": "function", "function": {"name", "description",
    "parameters"}}``.

    Args:
        tool: OpenAI's function-tool dict (``"type"`` may be left out; ``{"name", "description", "parameters"}``
            without the ``"function"`` wrapper is taken too), a Python function, or a pydantic model class.
        name: How error messages name the tool (``"tools[2]"``).
        fail: Builds the error (the provider's :class:`~inference.exceptions.InvalidRequestError`).

    Raises:
        InvalidRequestError: The tool has no name or a name OpenAI would refuse, its parameters are not a JSON
            schema of an object, or a function's parameter has a type that cannot be written as a JSON schema.
    """
    fail = fail or InvalidRequestError
    if isinstance(tool, Mapping):
        if tool.get("type", "function") != "function":
            raise fail(f"{name} has type {tool.get('type')!r}: only function tools ('type': 'function') are known")
        function = tool.get("function", tool if "function" not in tool and "name" in tool else None)
        if not isinstance(function, Mapping):
            raise fail(f"{name} must be {{'type': 'function', 'function': {{'name', 'description', 'parameters'}}}}")
        unknown = sorted(str(key) for key in function if key not in ("name", "description", "parameters", "strict"))
        if unknown:
            raise fail(f"{name}.function has keys {unknown}: a function holds name, description and parameters")
        tool_name, description = function.get("name"), function.get("description", "")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
    elif isinstance(tool, type) and callable(getattr(tool, "model_json_schema", None)):
        tool_name = tool.__name__
        parameters = tool.model_json_schema()  # type: ignore[attr-defined]
        description = parameters.pop("description", None) or _summary(inspect.getdoc(tool))
        parameters.pop("title", None)
    elif callable(tool) and not isinstance(tool, type):
        tool_name = getattr(tool, "__name__", None)
        description, parameters = _function_schema(tool, name, fail)
    else:
        raise fail(
            f"{name} must be a tool dict ({{'type': 'function', 'function': {{...}}}}), a Python function or a "
            f"pydantic model class, got {type(tool).__name__}"
        )
    if not isinstance(tool_name, str) or not tool_name:
        raise fail(f"{name} has no name: give 'function': {{'name': ...}} (1-64 letters, digits, '_', '.' or '-')")
    if not _NAME.fullmatch(tool_name):
        raise fail(f"{name} is named {tool_name!r}: a tool's name is 1-64 letters, digits, '_', '.' or '-'")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise fail(f"{name} ({tool_name}) has a description that is not a string: {type(description).__name__}")
    require_utf8(description, f"{name}.function.description", fail)
    schema = check_json_schema(parameters, f"the parameters of tool {tool_name!r} ({name})", fail)
    if schema.get("type", "object") != "object":
        raise fail(
            f"the parameters of tool {tool_name!r} ({name}) must be a JSON schema of an object "
            f"('type': 'object'), got type {schema.get('type')!r}"
        )
    return {"type": "function", "function": {"name": tool_name, "description": description, "parameters": schema}}


def check_tools(value: object, name: str, fail: Fail) -> tuple[dict[str, Any], ...]:
    """The rule of the ``tools`` option: each tool converted by :func:`tool_definition`, names unique.

    Raises:
        InvalidRequestError: ``tools`` is not a list, a tool is invalid (the message names it: ``tools[1]``), or
            two tools have one name.
    """
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise fail(f"{name} must be a list of tools, got {type(value).__name__}")
    definitions = tuple(tool_definition(tool, name=f"{name}[{index}]", fail=fail) for index, tool in enumerate(value))
    seen: dict[str, int] = {}
    for index, definition in enumerate(definitions):
        tool_name = definition["function"]["name"]
        if tool_name in seen:
            raise fail(
                f"{name}[{index}] and {name}[{seen[tool_name]}] are both named {tool_name!r}: give each tool a "
                "name of its own (the model calls tools by name)"
            )
        seen[tool_name] = index
    return definitions


def check_tool_choice(value: object, name: str, fail: Fail) -> str | dict[str, Any] | None:
    """The rule of the ``tool_choice`` option, alone (how it goes with ``tools`` is :func:`check_tools_together`).

    Returns:
        ``None``, ``"auto"``, ``"none"``, ``"required"``, or a fresh ``{"type": "function", "function": {"name":
        N}}``.
    """
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, Mapping):
        function = value.get("function")
        tool_name = function.get("name") if isinstance(function, Mapping) else None
        if value.get("type", "function") == "function" and isinstance(tool_name, str) and tool_name:
            return {"type": "function", "function": {"name": tool_name}}
    raise fail(
        f"{name} must be 'auto', 'none', 'required' or {{'type': 'function', 'function': {{'name': ...}}}}, "
        f"got {value!r}"
    )


def check_tools_together(
    tools: tuple[dict[str, Any], ...], tool_choice: str | dict[str, Any] | None, fail: Fail
) -> str | dict[str, Any] | None:
    """``tool_choice`` as it goes with ``tools``: a choice naming a tool needs that tool, ``"required"`` needs a
    tool; without tools, ``"auto"`` and ``"none"`` ask nothing and become ``None``.

    Raises:
        InvalidRequestError: ``tool_choice`` names no tool of ``tools``, or is ``"required"`` without tools.
    """
    names = [tool["function"]["name"] for tool in tools]
    if isinstance(tool_choice, dict):
        chosen = tool_choice["function"]["name"]
        if chosen not in names:
            raise fail(
                f"tool_choice names the tool {chosen!r}, which is not in tools (tools: "
                f"{', '.join(repr(name) for name in names) or 'none'}): add it to tools, or name one of them"
            )
    elif tool_choice == "required" and not tools:
        raise fail("tool_choice is 'required' but no tools are given: pass tools=[...], or leave tool_choice out")
    elif not tools and tool_choice in ("auto", "none"):
        return None
    return tool_choice


def forced_tool(tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping[str, Any] | None) -> str | None:
    """The name of the tool a request forces a call of: the named one, the only tool with ``"required"``, else
    ``None``."""
    if isinstance(tool_choice, Mapping):
        return str(tool_choice["function"]["name"])
    if tool_choice == "required" and len(tools) == 1:
        return str(tools[0]["function"]["name"])
    return None


def parse_tool_call(
    call_id: str, name: str, raw_arguments: str | Mapping[str, Any] | None, tools: Sequence[Mapping[str, Any]] | None
) -> ToolCall:
    """A :class:`~inference.ToolCall` from what a backend returned, its arguments parsed and checked.

    Nothing is dropped: arguments that are not JSON, not a JSON object, or (where ``tools`` holds the tool's
    schema) not valid against the tool's ``parameters`` give a call with :attr:`~inference.ToolCall.error` set
    (``arguments`` ``{}`` when they did not parse to an object), and a call of a tool not in ``tools`` too.

    Args:
        call_id: The call's id.
        name: The tool the model called.
        raw_arguments: The arguments as the backend returned them: JSON text (OpenAI, vLLM), a dict (Ollama), or
            ``None`` (no arguments, ``{}``).
        tools: The request's tools (checked definitions), or ``None`` to skip the schema check.
    """
    if raw_arguments is None or (isinstance(raw_arguments, str) and not raw_arguments.strip()):
        raw_arguments = "{}"
    raw = json.dumps(raw_arguments, ensure_ascii=False) if isinstance(raw_arguments, Mapping) else raw_arguments
    try:
        arguments: object = strict_json_loads(raw)  # a dict's NaN (Ollama's JSON parsed leniently) is refused too
    except (ValueError, RecursionError) as error:  # RecursionError: JSON nested thousands deep
        return ToolCall(call_id, name, {}, raw, _bad_json(name, error))
    if not isinstance(arguments, dict):
        return ToolCall(
            call_id, name, {}, raw, f"the arguments of {name} are JSON but not an object: {type(arguments).__name__}"
        )
    if tools is None:
        return ToolCall(call_id, name, arguments, raw)
    schema = next((tool["function"]["parameters"] for tool in tools if tool["function"]["name"] == name), None)
    if schema is None:
        known = ", ".join(str(tool["function"]["name"]) for tool in tools) or "none"
        return ToolCall(call_id, name, arguments, raw, f"the model called {name!r}, which is not a tool given "
                        f"(tools: {known})")
    from jsonschema.validators import validator_for

    problem = next(iter(validator_for(schema)(schema).iter_errors(arguments)), None)
    if problem is not None:
        where = "/".join(str(part) for part in problem.path) or "the top level"
        return ToolCall(call_id, name, arguments, raw, f"the arguments of {name} do not match its parameters: "
                        f"{problem.message} (at {where})")
    return ToolCall(call_id, name, arguments, raw)


def _bad_json(name: str, error: Exception) -> str:
    detail = f"{error.msg} at character {error.pos}" if isinstance(error, json.JSONDecodeError) else str(error)
    return f"the arguments of {name} are not JSON ({detail}): ToolCall.raw_arguments holds what the model wrote"


# Python functions as tools ------------------------------------------------------------------------------------

_SIMPLE: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    dict: {"type": "object"},
    list: {"type": "array"},
    Any: {},
}


def _function_schema(function: Callable[..., Any], name: str, fail: Fail) -> tuple[str, dict[str, Any]]:
    """A function's description and parameters' schema, from its signature, type hints and docstring."""
    try:
        signature = inspect.signature(function)
        hints = typing.get_type_hints(function, include_extras=True)  # Annotated[int, Field(ge=1)] kept
    except (TypeError, ValueError, NameError) as error:
        raise fail(f"{name}: cannot read the parameters of {function!r} ({error}); give a tool dict instead") from None
    doc = inspect.getdoc(function)
    described = _argument_descriptions(doc)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name in ("self", "cls") or _is_context(hints.get(parameter.name)):
            continue
        schema = _annotation_schema(hints.get(parameter.name, Any), f"{name} parameter {parameter.name!r}", fail)
        if parameter.name in described:
            schema = {**schema, "description": described[parameter.name]}
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
        elif _is_json(parameter.default):
            schema = {**schema, "default": parameter.default}
        properties[parameter.name] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    definitions: dict[str, Any] = {}
    parameters = _hoisted(parameters, definitions)
    if definitions:
        parameters["$defs"] = definitions
    return _summary(doc), parameters


def _hoisted(schema: Any, definitions: dict[str, Any]) -> Any:
    """``schema`` with the ``$defs`` pydantic writes at the root of each parameter's schema (whose ``$ref`` point
    at the document's root, ``#/$defs/Item``) moved into ``definitions``, the parameters' own ``$defs``; a name
    that two different definitions share is given a number (``Item2``) and its references follow."""
    if isinstance(schema, list):
        return [_hoisted(item, definitions) for item in schema]
    if not isinstance(schema, dict):
        return schema
    local = schema.get("$defs")
    if isinstance(local, dict):
        renamed: dict[str, str] = {}
        for name in local:
            new, number = name, 1
            while new in definitions and definitions[new] != _renamed(local[name], renamed | {name: new}):
                number += 1
                new = f"{name}{number}"
            renamed[name] = new
        for name, definition in local.items():
            definitions[renamed[name]] = _hoisted(_renamed(definition, renamed), definitions)
        schema = _renamed({key: value for key, value in schema.items() if key != "$defs"}, renamed)
    return {key: _hoisted(value, definitions) for key, value in schema.items()}


def _renamed(schema: Any, renamed: Mapping[str, str]) -> Any:
    """``schema`` with its ``#/$defs/<name>`` references following ``renamed``."""
    if isinstance(schema, list):
        return [_renamed(item, renamed) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _renamed(value, renamed) for key, value in schema.items()}
    reference = out.get("$ref")
    if isinstance(reference, str) and reference.startswith("#/$defs/"):
        name, slash, rest = reference.removeprefix("#/$defs/").partition("/")
        out["$ref"] = f"#/$defs/{renamed.get(name, name)}{slash}{rest}"
    return out


def _is_context(annotation: object) -> bool:
    """A first parameter that a framework fills (pydantic-ai's ``RunContext``), not the model."""
    return getattr(annotation, "__name__", "") == "RunContext" or "RunContext" in str(annotation)


def _annotation_schema(annotation: Any, what: str, fail: Fail) -> dict[str, Any]:
    if annotation in _SIMPLE:
        return dict(_SIMPLE[annotation])
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return {"enum": list(arguments)}
    if origin in (typing.Union, types.UnionType):
        options = [_annotation_schema(argument, what, fail) for argument in arguments]
        return {"anyOf": options}
    if origin is tuple and arguments and arguments[-1] is not Ellipsis:  # tuple[int, str]: one type per place
        fixed = [] if arguments == ((),) else [_annotation_schema(argument, what, fail) for argument in arguments]
        return {"type": "array", "prefixItems": fixed, "minItems": len(fixed), "maxItems": len(fixed)}
    if origin in (list, tuple, set, frozenset, Sequence, typing.Sequence) or origin is getattr(typing, "List", None):
        items = [argument for argument in arguments if argument is not Ellipsis]  # tuple[int, ...]: any length
        return {"type": "array", "items": _annotation_schema(items[0], what, fail)} if items else {"type": "array"}
    if origin in (dict, Mapping):
        value = arguments[1] if len(arguments) == 2 else Any
        return {"type": "object", "additionalProperties": _annotation_schema(value, what, fail)}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [member.value for member in annotation]}
    if origin is typing.Annotated and not _has_pydantic():  # without pydantic its Field constraints are unknown
        return _annotation_schema(arguments[0], what, fail)
    try:  # anything else (a pydantic model, a dataclass, a TypedDict, Annotated with Field(ge=...)...) as pydantic
        # writes it, where installed
        from pydantic import TypeAdapter

        schema: dict[str, Any] = TypeAdapter(annotation).json_schema()
        return schema
    except ImportError:
        pass
    except Exception as error:  # pydantic's own errors (PydanticSchemaGenerationError...) for a type it cannot take
        raise fail(f"{what} has the type {annotation!r}, which cannot be written as a JSON schema ({error})") from None
    raise fail(
        f"{what} has the type {annotation!r}: without pydantic installed, tool parameters may be str, int, float, "
        "bool, list, dict, Literal, Enum or Optional of those; give a tool dict with a JSON schema instead"
    )


def _has_pydantic() -> bool:
    try:
        import pydantic  # noqa: F401
    except ImportError:
        return False
    return True


def _summary(doc: str | None) -> str:
    """The docstring's first paragraph, on one line."""
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _argument_descriptions(doc: str | None) -> dict[str, str]:
    """Parameter -> description, from a Google-style ``Args:`` section."""
    if not doc:
        return {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?|\s*\n)+)", doc, flags=re.M)
    if match is None:
        return {}
    described: dict[str, str] = {}
    current: str | None = None
    for line in match.group(1).splitlines():
        entry = re.match(r"^\s{1,8}(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if entry is not None and (current is None or len(line) - len(line.lstrip()) <= _indent(match.group(1))):
            current = entry.group(1).lstrip("*")
            described[current] = entry.group(2).strip()
        elif current is not None and line.strip():
            described[current] = f"{described[current]} {line.strip()}".strip()
    return described


def _indent(block: str) -> int:
    first = next((line for line in block.splitlines() if line.strip()), "")
    return len(first) - len(first.lstrip())


def _is_json(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
