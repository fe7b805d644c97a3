"""JSON schemas: the rule of the ``json_schema`` option, and the check of every constrained answer.

A schema is accepted (:func:`checked_schema`) when it is JSON no deeper than :data:`MAX_SCHEMA_DEPTH`, valid
against its meta-schema, every ``$ref`` in it points inside it, and it admits a finite JSON value: no
``$ref`` cycle that refers to itself for the same value (``{"$ref": "#"}``, a -> b -> a), and no cycle through
required properties or items only (a value would have to contain itself forever). Such schemas compile into
grammars that match nothing, so a backend would answer ``""`` as if it had finished; they are refused up front.

Nothing here reaches the network: every ``jsonschema`` validation in the SDK goes through :func:`validator`,
whose registry refuses remote references, and :func:`checked_schema` refuses a ``$ref`` that points outside
the schema, whatever would validate against it later.

:func:`check_answer` is the promise of ``json_schema`` kept for every provider: a text whose finish reason
is not ``"length"`` parses and validates, one cut by ``max_tokens`` is the beginning of a JSON text, or the request
fails with a :class:`ProviderError`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from inference._core.json_prefix import json_prefix_end
from inference.exceptions import ProviderError

__all__ = ["MAX_SCHEMA_DEPTH", "STRICT_JSON", "check_answer", "checked_schema", "strict_json_loads", "validator"]

MAX_SCHEMA_DEPTH = 64
"""The deepest nesting of objects and arrays a schema may have (Python's own recursion limit allows about 150
when it validates one; a pydantic model's schema keeps its nested models under ``$defs``, a few levels deep)."""

_Fail = Callable[[str], Exception]
_REFS = ("$ref", "$dynamicRef", "$recursiveRef")
_SAME_VALUE = ("allOf", "anyOf", "oneOf")  # lists of schemas applied to the value itself
_SAME_VALUE_ONE = ("not", "if", "then", "else")  # single schemas applied to the value itself
_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")


class _RemoteReference(Exception):
    """A ``$ref`` to another document: the SDK never fetches one."""


def _refuse_remote(uri: str) -> Any:
    raise _RemoteReference(uri)


_SCHEMA_OPTIONS = ("json_schema", "tools", "response_format")


async def import_off_the_loop(options: Mapping[str, object]) -> None:
    """Import ``jsonschema`` on a worker thread before the first request whose options need it is checked.

    Its import can take seconds (with ``rfc3987-syntax`` installed, as Jupyter's environments have it, it builds a
    grammar at import: 2 s on a 2-core machine), which on the event loop would stall every other request.
    """
    if "jsonschema.validators" not in sys.modules and any(options.get(name) for name in _SCHEMA_OPTIONS):
        await asyncio.to_thread(importlib.import_module, "jsonschema.validators")


def _local_registry() -> Any:
    from referencing import Registry

    return Registry(retrieve=_refuse_remote)  # type: ignore[call-arg]


def validator(schema: Mapping[str, Any]) -> Any:
    """A ``jsonschema`` validator for ``schema`` that resolves ``$ref`` inside the schema (and the standard
    meta-schemas) only: a remote reference is an error, never a download."""
    from jsonschema.validators import validator_for

    return validator_for(schema)(schema, registry=_local_registry())


def checked_schema(value: object, name: str, fail: _Fail) -> dict[str, Any]:
    """``value`` (a JSON-schema mapping, or a pydantic model class) as a checked JSON-schema dict.

    Raises:
        Exception: ``fail(message)``, with a sentence naming ``name`` and what to change.
    """
    if isinstance(value, type) and callable(getattr(value, "model_json_schema", None)):
        model = value
        try:
            value = model.model_json_schema()  # type: ignore[attr-defined]
        except Exception as error:  # pydantic's errors for types it cannot describe, or anything a class raises
            raise fail(
                f"{name}: {model.__name__}.model_json_schema() failed ({type(error).__name__}: "
                f"{_first_line(error)}); give a model whose fields pydantic can describe as JSON schema, or a dict"
            ) from None
    if not isinstance(value, Mapping):
        raise fail(f"{name} must be a JSON-schema dict or a pydantic model class, got {type(value).__name__}")
    if _deeper_than(value, MAX_SCHEMA_DEPTH):
        raise fail(
            f"{name} nests objects and arrays more than {MAX_SCHEMA_DEPTH} levels deep: move nested schemas under "
            "$defs and refer to them with $ref"
        )
    try:
        schema: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise fail(
            f"{name} must be JSON (dicts with string keys, lists, strings, finite numbers, booleans, None): {error}"
        ) from None
    from jsonschema.validators import validator_for

    # check_schema(), with the meta-schema's own references resolved by the local-only registry as well
    meta_schema = validator_for(schema).META_SCHEMA
    meta = validator_for(meta_schema)
    checker = meta(meta_schema, format_checker=meta.FORMAT_CHECKER, registry=_local_registry())
    for problem in checker.iter_errors(schema):
        where = "/".join(str(part) for part in problem.path) or "the top level"
        raise fail(f"{name} is not a valid JSON schema: {problem.message} (at {where})")
    _References(schema, name, fail).check()
    return schema


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise ValueError(f"an object holds the key {key!r} twice")
        value[key] = item
    return value


STRICT_JSON = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_unique_keys)
"""A decoder of strict JSON (its ``raw_decode`` reads a JSON value that text follows); see :func:`strict_json_loads`."""


def strict_json_loads(text: str) -> Any:
    """``json.loads`` for strict JSON (RFC 8259): ``NaN``, ``Infinity`` and ``-Infinity`` (which ``json.loads`` takes)
    and an object that holds one key twice (whose last value ``json.loads`` keeps) are refused.

    Raises:
        ValueError: The text is not JSON (a ``json.JSONDecodeError``), or not strict JSON; the message says which
            (``NaN is not JSON``, ``an object holds the key 'x' twice``).
    """
    return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)


def check_answer(text: str, schema: Mapping[str, Any], finish_reason: str, *, provider: str) -> None:
    """Refuse an answer to a ``json_schema`` request that does not parse (strict JSON) or validate; one cut by
    ``max_tokens`` (``finish_reason`` ``"length"``) must at least be the beginning of a JSON text.

    Raises:
        ProviderError: The backend's text is not JSON valid against ``schema``; the message says where.
    """
    shown = text if len(text) <= 200 else text[:200] + "..."
    if finish_reason == "length":
        end = json_prefix_end(text)
        if end is not None:
            raise ProviderError(
                f"the answer stops being JSON at character {end}: {shown!r}; the backend did not constrain its text "
                "to the json_schema (a route or server that ignores it?)",
                provider=provider,
            )
        return
    try:
        error = next(iter(validator(schema).iter_errors(strict_json_loads(text))), None)
    except json.JSONDecodeError as decode:
        raise ProviderError(
            f"the answer is not complete JSON ({decode.msg} at character {decode.pos}) although the backend "
            f"reported it finished: {shown!r}; the backend did not hold to the json_schema",
            provider=provider,
        ) from None
    except ValueError as strict:  # NaN, a key twice, an integer of more digits than Python converts
        raise ProviderError(
            f"the answer is not strict JSON ({strict}) although the backend reported it finished: {shown!r}; the "
            "backend did not hold to the json_schema",
            provider=provider,
        ) from None
    except RecursionError:
        raise ProviderError(
            f"the answer is JSON nested too deeply to check against the json_schema: {shown!r}; bound the "
            "recursion of the schema (fewer levels of its $ref cycle, or maxItems)",
            provider=provider,
        ) from None
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "the top level"
        raise ProviderError(
            f"the answer does not validate against the json_schema ({error.message}, at {where}): {shown!r}; "
            "the backend's grammar did not enforce that part of the schema: simplify it to what the backend "
            "enforces",
            provider=provider,
        )


class _References:
    """The schema's subschemas with their ``$ref`` targets resolved (locally), and the checks that need them."""

    def __init__(self, schema: dict[str, Any], name: str, fail: _Fail) -> None:
        from referencing.jsonschema import DRAFT202012, specification_with

        self.name = name
        self.fail = fail
        self.root = schema
        self.specification = specification_with(str(schema.get("$schema", "")), default=DRAFT202012)
        self._refs: dict[tuple[int, str], tuple[str, Any]] = {}  # (id(node), keyword) -> (ref as written, target)
        root = self.specification.create_resource(schema)
        self._visit(schema, _local_registry().resolver_with_root(root))

    def _visit(self, start: Any, start_resolver: Any) -> None:
        """Resolve every ``$ref`` under ``start`` (and under what they point to), each subschema once."""
        from referencing import Resource
        from referencing.exceptions import Unresolvable, Unretrievable

        seen: set[int] = set()
        pending = [(start, start_resolver)]
        while pending:
            contents, resolver = pending.pop()
            if not isinstance(contents, dict) or id(contents) in seen:
                continue
            seen.add(id(contents))
            resource = Resource.from_contents(contents, default_specification=self.specification)
            resolver = resolver.in_subresource(resource)
            for keyword in _REFS:
                ref = contents.get(keyword)
                if not isinstance(ref, str):
                    continue
                try:
                    resolved = resolver.lookup("#" if keyword == "$recursiveRef" else ref)
                except Unresolvable as error:
                    if isinstance(error.__cause__, Unretrievable):
                        raise self.fail(
                            f"{self.name} has {keyword} {ref!r}, which points outside the schema: references must "
                            "be local ('#/$defs/...'), the SDK never fetches a schema; copy the referenced schema "
                            "under $defs"
                        ) from None
                    raise self.fail(
                        f"{self.name} has {keyword} {ref!r}, which points to nothing in the schema: fix the "
                        "reference, or add what it names"
                    ) from None
                self._refs[(id(contents), keyword)] = (ref, resolved.contents)
                pending.append((resolved.contents, resolved.resolver))
            pending.extend((sub.contents, resolver) for sub in resource.subresources())

    def check(self) -> None:
        """Refuse a ``$ref`` cycle for the same value, or a schema no finite JSON value satisfies."""
        cycle = self._same_value_cycle()
        if cycle:
            raise self.fail(
                f"{self.name} has a $ref cycle that never reaches a value: {' -> '.join(cycle)} (each refers to the "
                "next for the same JSON value, so no value can be checked against it); give the cycle a base case "
                "or remove it"
            )
        productive = self._finite_targets()
        if not self._admits(self.root, productive):
            chain = self._blocking_chain(productive)
            if chain:
                raise self.fail(
                    f"{self.name} admits no finite JSON value: {' -> '.join(chain)} is a $ref cycle through required "
                    "properties or items only (each value would have to contain another forever); make one link "
                    "optional (not in 'required', or minItems 0)"
                )
            raise self.fail(
                f"{self.name} admits no JSON value (a required property or an item whose schema is false, an "
                "empty enum, or the like): fix the schema"
            )

    # A cycle of references for one value -------------------------------------------------------------

    def _same_value(self, node: Any) -> Iterator[tuple[str | None, Any]]:
        """The schemas that apply to the same value as ``node``: ``(ref or None, schema)``."""
        if not isinstance(node, dict):
            return
        for keyword in _REFS:
            if (id(node), keyword) in self._refs:
                yield self._refs[(id(node), keyword)]
        for keyword in _SAME_VALUE:
            for sub in node.get(keyword, ()):
                yield None, sub
        for keyword in _SAME_VALUE_ONE:
            if keyword in node:
                yield None, node[keyword]
        for sub in node.get("dependentSchemas", {}).values():
            yield None, sub

    def _same_value_cycle(self) -> list[str]:
        """The refs of a cycle of schemas each applied to the same value, named as written (``[]``: none).

        A depth-first search from the root and from every ``$ref`` target.
        """
        names = {id(target): ref for ref, target in self._refs.values()}
        names[id(self.root)] = "#"
        done: set[int] = set()
        for start in [self.root, *(target for _, target in self._refs.values())]:
            if id(start) in done:
                continue
            path: list[tuple[Any, str | None]] = [(start, names[id(start)])]
            on_path = {id(start): 0}
            stack = [iter(list(self._same_value(start)))]
            while stack:
                step = next(stack[-1], None)
                if step is None:
                    stack.pop()
                    node, _ = path.pop()
                    del on_path[id(node)]
                    done.add(id(node))
                    continue
                ref, sub = step
                if id(sub) in on_path:
                    cycle = [name for _, name in path[on_path[id(sub)] :] if name is not None]
                    return [*cycle, cycle[0]] if cycle else ["#", "#"]
                if isinstance(sub, dict) and id(sub) not in done:
                    on_path[id(sub)] = len(path)
                    path.append((sub, ref))
                    stack.append(iter(list(self._same_value(sub))))
        return []

    # A finite value ------------------------------------------------------------------------------------

    def _finite_targets(self) -> set[int]:
        """The ``$ref`` targets that admit a finite value (least fixed point: none at first)."""
        productive: set[int] = set()
        changed = True
        while changed:
            changed = False
            for _, target in self._refs.values():
                if id(target) not in productive and self._admits(target, productive):
                    productive.add(id(target))
                    changed = True
        return productive

    def _admits(self, node: Any, productive: set[int], blocked: list[tuple[str, Any]] | None = None) -> bool:
        """Whether some finite value satisfies ``node`` when the targets in ``productive`` do (an estimate that
        never refuses a satisfiable schema: keywords other than these are assumed satisfiable)."""
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            return True
        for keyword in _REFS:
            ref = self._refs.get((id(node), keyword))
            if ref is not None and id(ref[1]) not in productive:
                if blocked is not None:
                    blocked.append(ref)
                return False
        if not all(self._admits(sub, productive, blocked) for sub in node.get("allOf", ())):
            return False
        for keyword in ("anyOf", "oneOf"):
            if keyword in node and not any(self._admits(sub, productive, blocked) for sub in node[keyword]):
                return False
        if "const" in node:
            return True
        if "enum" in node:
            return bool(node["enum"])
        kinds = node.get("type", _TYPES)
        kinds = [kinds] if isinstance(kinds, str) else kinds
        return any(self._admits_type(node, kind, productive, blocked) for kind in kinds)

    def _admits_type(
        self, node: dict[str, Any], kind: str, productive: set[int], blocked: list[tuple[str, Any]] | None
    ) -> bool:
        """Whether a value of type ``kind`` can satisfy ``node``'s required properties and least items."""
        if kind == "object":
            properties = node.get("properties", {})
            for required in node.get("required", ()):
                if required in properties:
                    sub = properties[required]
                elif node.get("patternProperties"):
                    continue  # a name its patterns match may exist: assume so
                else:
                    sub = node.get("additionalProperties", True)
                if not self._admits(sub, productive, blocked):
                    return False
            return True
        if kind == "array":
            least = int(node.get("minItems", 0))
            items = node.get("items", True)
            prefix = node.get("prefixItems", items if isinstance(items, list) else [])
            rest = node.get("additionalItems", True) if isinstance(items, list) else items
            needed = [*prefix[:least], *([rest] if least > len(prefix) else [])]
            if "contains" in node and int(node.get("minContains", 1)) > 0:
                needed.append(node["contains"])
            return all(self._admits(sub, productive, blocked) for sub in needed)
        return True

    def _blocking_chain(self, productive: set[int]) -> list[str]:
        """The refs that keep the root from a finite value, up to the first one seen twice (``[]``: no cycle)."""
        chain = ["#"]
        seen = {id(self.root): 0}
        node = self.root
        while True:
            blocked: list[tuple[str, Any]] = []
            self._admits(node, productive, blocked)
            if not blocked:
                return []
            ref, node = blocked[0]
            if id(node) in seen:
                return [*chain[seen[id(node)] :], ref]
            seen[id(node)] = len(chain)
            chain.append(ref)


def _deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests mappings and lists more than ``limit`` levels (measured without recursion)."""
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
