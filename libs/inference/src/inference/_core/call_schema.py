"""The JSON schema of a forced tool call: ``{"name": <the tool>, "arguments": <its parameters>}``, the one rule of
every backend that constrains a call (Ollama's ``format``, the in-process providers' grammar).

One tool gives ``{"type": "object", "properties": {"name": {"const": N}, "arguments": <parameters>}, "required":
["name", "arguments"], "additionalProperties": false}``; several give ``{"anyOf": [...]}`` of those; a format whose
calls are a list (Mistral's ``[{...}]``) holds one of them as its only item. The parameters' local ``$ref``\\ s
(a pydantic model that holds another one: ``#/$defs/City``) are rewritten to where the parameters now are, so the
schema compiles. llama.cpp resolves a ``$ref`` by walking object keys only (an ``anyOf`` index is a list position it
cannot walk), so a tool whose parameters hold references is put in the root's ``$defs`` under its name when several
tools are in the ``anyOf``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["call_schema"]


def call_schema(
    tools: Sequence[Mapping[str, Any]],
    names: Sequence[str] | None,
    *,
    arguments_key: str = "arguments",
    in_list: bool = False,
) -> dict[str, Any] | None:
    """The JSON schema of a call of one of the tools ``names`` (``None``: no forced call, no schema).

    Args:
        tools: The request's tools (OpenAI's function tools).
        names: The tools the call may name.
        arguments_key: The key of the arguments in a call (Llama 3's ``"parameters"``).
        in_list: The call is the one item of a JSON list (Mistral).
    """
    if names is None:
        return None
    chosen = [tool["function"] for tool in tools if tool["function"]["name"] in names]
    at = "/items" if in_list else ""
    definitions: dict[str, Any] = {}
    if len(chosen) == 1:
        parameters = _moved(chosen[0]["parameters"], f"{at}/properties/{arguments_key}")
        call: dict[str, Any] = _call_object(chosen[0]["name"], parameters, arguments_key)
    else:
        options = []
        for function in chosen:
            name, parameters = function["name"], function["parameters"]
            if _has_ref(parameters):
                definitions[name] = _moved(parameters, f"/$defs/{name}")
                options.append(_call_object(name, {"$ref": f"#/$defs/{name}"}, arguments_key))
            else:
                options.append(_call_object(name, json.loads(json.dumps(parameters)), arguments_key))
        call = {"anyOf": options}
    schema = {"type": "array", "items": call, "minItems": 1, "maxItems": 1} if in_list else call
    if definitions:
        schema["$defs"] = definitions
    return schema


def _call_object(name: str, arguments: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, arguments_key: arguments},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
"""Schema keywords whose values are data, not schemas: a ``$ref`` key inside them is not a reference."""


def _moved(schema: Any, prefix: str) -> Any:
    """A copy of ``schema`` whose local ``$ref``\\ s (``#...``) point into it once it sits at the JSON pointer
    ``prefix`` of a larger schema."""
    if isinstance(schema, list):
        return [_moved(item, prefix) for item in schema]
    if not isinstance(schema, dict):
        return schema
    moved: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            moved[key] = f"#{prefix}{value[1:]}"
        elif key in _DATA_KEYWORDS:
            moved[key] = json.loads(json.dumps(value))
        else:
            moved[key] = _moved(value, prefix)
    return moved


def _has_ref(schema: Any) -> bool:
    return any(True for _ in _refs(schema))


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, list):
        for item in schema:
            yield from _refs(item)
    elif isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            elif key not in _DATA_KEYWORDS:
                yield from _refs(value)


