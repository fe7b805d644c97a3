"""The rules of ``json_schema`` that hold on every provider, checked on the fake and the checks themselves.

- ``stop`` never cuts the JSON: with a ``json_schema`` no stop string applies (the JSON ends the text);
- a schema no finite value satisfies (a ``$ref`` cycle for one value, a cycle through required values) is an
  ``InvalidRequestError`` naming the cycle, before anything is generated;
- a ``$ref`` that points outside the schema is refused, and nothing is ever fetched (a loopback server in the
  test records any request);
- a schema nested 3,000 levels, or a pydantic model pydantic cannot describe, is an ``InvalidRequestError``;
- a text that does not parse or validate is never returned as finished: a ``ProviderError``.

The in-process providers and the real servers are checked by tests/integration/test_json_schema_output.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from inference import FakeProvider, GenerationOptions, InvalidRequestError, ProviderError
from inference._core.json_schemas import MAX_SCHEMA_DEPTH, validator
from inference._core.validation import GenerationRequest
from inference.provider import GenerationResult, StreamEvent

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


class Node(BaseModel):
    value: int
    next: Node | None = None


class Tree(BaseModel):
    children: list[Tree]


class Endless(BaseModel):
    child: Endless


class Undescribable(BaseModel):
    callback: Callable[[int], int]


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


# stop with json_schema --------------------------------------------------------------------------------


async def test_a_stop_string_inside_the_json_does_not_cut_it() -> None:
    fake = FakeProvider()
    plain = await fake.generate("Describe a person", model="m", json_schema=PERSON)
    assert ":" in plain.text
    result = await fake.generate("Describe a person", model="m", json_schema=PERSON, stop=[":", '"'])
    events = [event async for event in fake.stream("Describe a person", model="m", json_schema=PERSON, stop=":")]
    assert result.text == plain.text and result.finish_reason == "stop"
    jsonschema.validate(json.loads(result.text), PERSON)
    final = events[-1]
    assert isinstance(final, GenerationResult) and final.text == plain.text
    assert "".join(event for event in events if isinstance(event, str)) == plain.text
    assert (await fake.generate("x", model="m", stop="]")).text == "[base"  # without a schema, stop applies


def test_the_request_a_backend_receives_has_no_stop_strings_with_a_json_schema() -> None:
    request = GenerationRequest.from_arguments(provider="t", prompt="Hi", model="m", stop="}", json_schema=PERSON)
    assert request.stop == ()
    assert GenerationRequest.from_arguments(provider="t", prompt="Hi", model="m", stop="}").stop == ("}",)


# Schemas no finite JSON satisfies ---------------------------------------------------------------------

CYCLES: dict[str, tuple[Any, str]] = {
    "itself": ({"$ref": "#"}, "# -> #"),
    "a-b-a": (
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        "#/$defs/a -> #/$defs/b -> #/$defs/a",
    ),
    "through-anyOf": ({"anyOf": [{"$ref": "#"}, {"type": "string"}]}, "# -> #"),
    "through-allOf": ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, "#/$defs/a"),
    "required-itself": ({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}, "# -> #"),
    "required-items": (
        {
            "$defs": {
                "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1},
            },
            "$ref": "#/$defs/a",
        },
        "#/$defs/a -> #/$defs/b -> #/$defs/a",
    ),
    "pydantic": (Endless, "#/$defs/Endless -> #/$defs/Endless"),
}


@pytest.mark.parametrize(("schema", "cycle"), CYCLES.values(), ids=CYCLES.keys())
async def test_a_schema_without_a_finite_value_is_refused_naming_the_cycle(schema: Any, cycle: str) -> None:
    fake = FakeProvider()
    with pytest.raises(InvalidRequestError, match="cycle") as refused:
        await fake.generate("x", model="m", json_schema=schema)
    assert cycle in str(refused.value)
    assert (await fake.generate("x", model="m", json_schema=PERSON)).text  # still serving


async def test_a_required_property_that_nothing_satisfies_is_refused() -> None:
    schema = {"type": "object", "properties": {"x": False}, "required": ["x"]}
    with pytest.raises(InvalidRequestError, match="admits no JSON value"):
        await FakeProvider().generate("x", model="m", json_schema=schema)


@pytest.mark.parametrize(
    "schema",
    [
        Node,
        Tree,
        {"type": "object", "properties": {"next": {"$ref": "#"}}},
        {"$defs": {"a": {"$anchor": "A", "type": "integer"}}, "$ref": "#A"},
        {"$id": "https://example.com/s.json", "$defs": {"a": {"$id": "a.json", "type": "integer"}}, "$ref": "a.json"},
        nested(MAX_SCHEMA_DEPTH),
    ],
    ids=["pydantic-linked-list", "pydantic-tree", "optional-recursion", "anchor", "id", "deepest-allowed"],
)
def test_recursive_and_local_references_with_a_finite_value_are_accepted(schema: Any) -> None:
    assert GenerationOptions.from_arguments(provider="t", json_schema=schema).json_schema is not None


@pytest.mark.parametrize(
    "schema",
    [Node, {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#"}}}],
    ids=["pydantic-linked-list", "optional-recursion-to-the-root"],
)
async def test_a_recursive_schema_gets_valid_json_on_the_fake(schema: Any) -> None:
    result = await FakeProvider().generate("x", model="m", json_schema=schema)
    as_dict = schema.model_json_schema() if isinstance(schema, type) else schema
    jsonschema.validate(json.loads(result.text), as_dict)


# Nothing is fetched ----------------------------------------------------------------------------------


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that serves a schema and records every path asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = json.dumps({"type": "integer"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_loopback_schema_server_answers(schema_server: tuple[str, list[str]]) -> None:
    import urllib.request

    url, asked = schema_server
    with urllib.request.urlopen(f"{url}/check.json") as response:  # the test's own loopback server
        assert json.load(response) == {"type": "integer"}
    assert asked == ["/check.json"]  # so an empty list below means nothing asked


@pytest.mark.parametrize(
    "where",
    [
        lambda url: {"$ref": f"{url}/person.json"},
        lambda url: {"type": "object", "properties": {"age": {"$ref": f"{url}/age.json"}}},
        lambda url: {"$id": f"{url}/root.json", "$ref": "age.json"},
    ],
    ids=["top", "nested", "relative-to-id"],
)
async def test_a_remote_ref_is_refused_and_never_fetched(
    schema_server: tuple[str, list[str]], where: Callable[[str], dict[str, Any]]
) -> None:
    url, asked = schema_server
    fake = FakeProvider()
    with pytest.raises(InvalidRequestError, match="points outside the schema: references must be local"):
        await fake.generate("x", model="m", json_schema=where(url))
    assert asked == []


def test_the_sdk_s_validator_never_fetches_a_remote_ref(schema_server: tuple[str, list[str]]) -> None:
    url, asked = schema_server
    with pytest.raises(Exception, match=r"age\.json"):
        validator({"$ref": f"{url}/age.json"}).is_valid(3)
    assert asked == []


# Inputs that used to raise raw tracebacks --------------------------------------------------------------


def test_a_schema_nested_3000_levels_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match=f"more than {MAX_SCHEMA_DEPTH} levels deep"):
        GenerationOptions.from_arguments(provider="t", json_schema=nested(3000))


def test_a_pydantic_model_without_a_json_schema_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match=r"Undescribable.model_json_schema\(\) failed"):
        GenerationOptions.from_arguments(provider="t", json_schema=Undescribable)


def test_a_schema_with_a_non_finite_number_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="finite numbers"):
        GenerationOptions.from_arguments(provider="t", json_schema={"type": "number", "maximum": float("nan")})


# An answer that does not validate is never a success -----------------------------------------------------


class CuttingProvider(FakeProvider):
    """A backend that answers a fixed text with a fixed finish reason, whatever the schema."""

    def __init__(self, text: str, finish_reason: str) -> None:
        super().__init__()
        self.answer = (text, finish_reason)

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        text, finish_reason = self.answer
        return GenerationResult(text=text, model="m", adapter_id=None, token_count=1, finish_reason=finish_reason)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        result = await self._generate(request)
        yield result.text
        yield result


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"name"', "not complete JSON"),
        ('{"name": "Ann", "age": 300}', r"300 is greater than the maximum of 120, at age"),
        ('{"name": "Ann\n", "age": 3}', "not complete JSON"),  # a raw control character: strict parsers refuse it
    ],
    ids=["cut", "invalid", "control-character"],
)
async def test_a_finished_text_that_does_not_validate_is_a_provider_error(text: str, message: str) -> None:
    provider = CuttingProvider(text, "stop")
    with pytest.raises(ProviderError, match=message):
        await provider.generate("x", model="m", json_schema=PERSON)
    with pytest.raises(ProviderError, match=message):
        async for _ in provider.stream("x", model="m", json_schema=PERSON):
            pass
    results = await provider.generate_batch(["x"], model="m", json_schema=PERSON)
    assert isinstance(results[0], ProviderError)
    assert (await provider.generate("x", model="m")).text == text  # without a schema nothing is checked


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"x": NaN}', r"not strict JSON \(NaN is not JSON\)"),
        ('{"x": Infinity}', r"not strict JSON \(Infinity is not JSON\)"),
        ('{"x": -Infinity}', r"not strict JSON \(-Infinity is not JSON\)"),
        ('{"x": 1, "x": "two"}', r"not strict JSON \(an object holds the key 'x' twice\)"),
        ('{"x": ' + "1" * 5000 + "}", r"not strict JSON \(Exceeds the limit"),
    ],
    ids=["NaN", "Infinity", "-Infinity", "key-twice", "5000-digits"],
)
async def test_a_finished_answer_that_is_not_strict_json_is_a_provider_error(text: str, message: str) -> None:
    """Reviewed defect: json.loads took NaN, Infinity and a key given twice (keeping its last value), so such an
    answer came back as a result although docs/scores.md promises strict JSON (pydantic refuses it); an integer of
    5000 digits raised a bare ValueError out of generate."""
    schema = {"type": "object", "properties": {"x": {"type": ["number", "string"]}}, "required": ["x"]}
    provider = CuttingProvider(text, "stop")
    with pytest.raises(ProviderError, match=message):
        await provider.generate("x", model="m", json_schema=schema)
    assert (await CuttingProvider('{"x": 1.5}', "stop").generate("x", model="m", json_schema=schema)).text


@pytest.mark.parametrize("text", ['{"name"', '{"name": "An', '{"name": "A\\u00', '{"name": "Ann", "age": 1', " ", ""])
async def test_a_text_cut_by_max_tokens_is_returned_as_length(text: str) -> None:
    result = await CuttingProvider(text, "length").generate("x", model="m", json_schema=PERSON)
    assert (result.text, result.finish_reason) == (text, "length")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (" always the same", 1),  # free text: the server ignored the schema
        ("the", 0),
        ('{"name": tru e', 9),
        ('{"name": "Ann\n', 13),
        ('{"age": 01', 8),
        ('[1,]', 3),
        ('{"a": 1} {', 9),
    ],
)
async def test_a_text_cut_by_max_tokens_that_is_not_json_is_a_provider_error(text: str, where: int) -> None:
    provider = CuttingProvider(text, "length")
    with pytest.raises(ProviderError, match=f"stops being JSON at character {where}:"):
        await provider.generate("x", model="m", json_schema=PERSON)
    assert (await provider.generate("x", model="m")).text == text
