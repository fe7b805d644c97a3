"""Tools in requests and tool calls in results: the contract every backend shares, on the fake provider.

Definitions (dicts, Python functions, pydantic classes) are checked and converted once; bad tools, a choice naming
no tool, duplicate names and tool messages answering no call are ``InvalidRequestError`` naming the item; the
fake calls tools deterministically so a loop runs end to end; a backend that cannot call tools refuses them (and a
conversation holding tool turns) before anything is sent.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import pytest
from pydantic import BaseModel, Field, create_model

import inference
from inference import GenerationResult, ToolCall
from inference._core.validation import GenerationRequest
from inference.cli import main
from inference.exceptions import InvalidRequestError, UnsupportedOperationError
from inference.fake_provider import FakeProvider
from inference.messages import plain_text
from inference.options import OptionMap, Refused
from inference.registry import providers_sending
from inference.tools import parse_tool_call, tool_definition

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def forecast(city: str, days: int = 1, unit: Literal["C", "F"] = "C", tags: list[str] | None = None) -> str:
    """The forecast for a city.

    Longer text that is not the summary.

    Args:
        city: The city's name.
        days: How many days ahead,
            from 1 to 7.
        unit: Celsius or Fahrenheit.
        tags: Labels.
    """
    return f"{city}: sunny"


class Invoice(BaseModel):
    """An invoice to file."""

    number: str
    total: float


class Item(BaseModel):
    sku: str
    qty: int


class Order(BaseModel):
    items: list[Item]


OtherItem = create_model("Item", label=(str, ...))  # another model that pydantic also calls Item
Labels = create_model("Labels", items=(list[OtherItem], ...))  # type: ignore[valid-type]


def place(order: Order, extra: Labels, point: tuple[int, str], path: tuple[int, ...],
          days: Annotated[int, Field(ge=1, le=7, description="How many days")]) -> str:
    """Place an order."""
    return "placed"


# Definitions -------------------------------------------------------------------------------------------------


def test_a_functions_nested_models_tuples_and_field_constraints_reach_its_schema() -> None:
    """Reviewed defects: a pydantic model holding list[Item] was refused ("$ref '#/$defs/Item' points to
    nothing"), tuple[int, str] became an array of integers, and Annotated[int, Field(ge=1, le=7, ...)] lost its
    bounds and description."""
    tools = inference.tools.check_tools([place], "tools", InvalidRequestError)
    parameters = tools[0]["function"]["parameters"]
    assert sorted(parameters["$defs"]) == ["Item", "Item2"]  # the two models called Item kept apart
    assert parameters["properties"]["order"]["properties"]["items"]["items"] == {"$ref": "#/$defs/Item"}
    assert parameters["properties"]["extra"]["properties"]["items"]["items"] == {"$ref": "#/$defs/Item2"}
    assert parameters["properties"]["point"] == {
        "type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2, "maxItems": 2
    }
    assert parameters["properties"]["path"] == {"type": "array", "items": {"type": "integer"}}
    assert parameters["properties"]["days"] == {
        "type": "integer", "minimum": 1, "maximum": 7, "description": "How many days"
    }
    good = {"order": {"items": [{"sku": "a", "qty": 2}]}, "extra": {"items": [{"label": "x"}]}, "point": [3, "north"],
            "path": [1, 2, 3], "days": 2}
    assert parse_tool_call("c", "place", json.dumps(good), tools).error is None
    for key, value, problem in [
        ("order", {"items": [{"sku": "a"}]}, "'qty' is a required property"),
        ("extra", {"items": [{"sku": "a", "qty": 1}]}, "'label' is a required property"),
        ("point", [3, 4], "4 is not of type 'string'"),
        ("days", 9, "9 is greater than the maximum of 7"),
    ]:
        assert problem in (parse_tool_call("c", "place", json.dumps({**good, key: value}), tools).error or "")


def test_a_function_becomes_a_tool_from_its_hints_and_docstring() -> None:
    function = tool_definition(forecast)["function"]
    assert function["name"] == "forecast" and function["description"] == "The forecast for a city."
    parameters = function["parameters"]
    assert parameters["required"] == ["city"]
    assert parameters["properties"]["city"] == {"type": "string", "description": "The city's name."}
    assert parameters["properties"]["days"] == {
        "type": "integer", "description": "How many days ahead, from 1 to 7.", "default": 1
    }
    assert parameters["properties"]["unit"]["enum"] == ["C", "F"]
    assert parameters["properties"]["tags"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}


def test_a_pydantic_class_becomes_a_tool_named_after_it() -> None:
    function = tool_definition(Invoice)["function"]
    assert function["name"] == "Invoice" and function["description"] == "An invoice to file."
    assert function["parameters"]["required"] == ["number", "total"]


def test_tools_are_checked_and_normalised_into_the_request() -> None:
    request = GenerationRequest.from_arguments(
        provider="t", prompt="hi", model="m", tools=[WEATHER, forecast, {"function": TIME["function"]}]
    )
    assert [tool["function"]["name"] for tool in request.tools] == ["get_weather", "forecast", "get_time"]
    assert request.tools[2]["type"] == "function" and request.tools[2]["function"]["description"] == ""
    assert request.tool_choice is None
    choice = GenerationRequest.from_arguments(provider="t", prompt="hi", model="m", tool_choice="none")
    assert choice.tool_choice is None  # without tools, "none" asks nothing of the backend


@pytest.mark.parametrize(
    ("tools", "tool_choice", "message"),
    [
        ([{"type": "function", "function": {"parameters": {}}}], None, "tools[0] has no name"),
        ([TIME, {"type": "function", "function": {"name": ""}}], None, "tools[1] has no name"),
        ([{"type": "function", "function": {"name": "a b"}}], None, "tools[0] is named 'a b'"),
        ([{"type": "function", "function": {"name": "f\n"}}], None, "tools[0] is named 'f\\n'"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
            None,
            "the parameters of tool 'f' (tools[0]) is not a valid JSON schema",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            None,
            "must be a JSON schema of an object",
        ),
        ([{"type": "retrieval"}], None, "tools[0] has type 'retrieval'"),
        ([TIME, WEATHER, TIME], None, "tools[2] and tools[0] are both named 'get_time'"),
        ("get_time", None, "tools must be a list of tools, got str"),
        ([TIME], {"type": "function", "function": {"name": "get_weather"}}, "names the tool 'get_weather', which"),
        ([], "required", "tool_choice is 'required' but no tools are given"),
        ([TIME], "always", "tool_choice must be 'auto', 'none', 'required' or"),
    ],
)
async def test_bad_tools_are_invalid_requests_naming_the_item_and_the_provider_keeps_serving(
    tools: Any, tool_choice: Any, message: str
) -> None:
    provider = FakeProvider()
    with pytest.raises(InvalidRequestError) as caught:
        await provider.generate("hi", model="m", tools=tools, tool_choice=tool_choice)
    assert message in str(caught.value)
    assert caught.value.provider == "fake"
    assert (await provider.generate("hi", model="m", max_tokens=2)).text


# Messages ----------------------------------------------------------------------------------------------------


TIME_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}


def conversation(call: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]


@pytest.mark.parametrize(
    "call",
    [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "call_1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        ToolCall("call_1", "get_weather", {"city": "Paris"}),
    ],
    ids=["openai-dict", "arguments-as-dict", "no-type", "ToolCall"],
)
def test_tool_turns_are_checked_into_openai_shapes(call: Any) -> None:
    request = GenerationRequest.from_arguments(provider="t", prompt=conversation(call), model="m")
    assistant, tool = request.messages[1], request.messages[2]
    assert assistant == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    }
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert plain_text(request.messages) == (
        'Weather in Paris?\n\nCalling get_weather with {"city": "Paris"}\n\nget_weather returned: sunny'
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m[2].pop("tool_call_id"), "prompt[2] is a tool message without a 'tool_call_id'"),
        (lambda m: m[2].update(tool_call_id="call_9"), "prompt[2] answers tool call 'call_9', which no earlier"),
        (lambda m: m.insert(0, m.pop(2)), "prompt[0] answers tool call 'call_1'"),
        (lambda m: m[1]["tool_calls"][0].pop("id"), "prompt[1].tool_calls[0] has no 'id'"),
        (lambda m: m[1]["tool_calls"][0]["function"].pop("name"), "prompt[1].tool_calls[0] has no function name"),
        (lambda m: m[1].update(tool_calls="call_1"), "prompt[1].tool_calls must be a list of tool calls"),
        (lambda m: m[0].update(tool_call_id="x"), "prompt[0] has keys ['tool_call_id']"),
        (lambda m: m[2].update(content={"t": 1}), "prompt[2] must have string 'content', got dict"),
        (lambda m: m[1]["tool_calls"][0].update(type="custom"), "prompt[1].tool_calls[0] has type 'custom'"),
        (lambda m: m[1]["tool_calls"].append(TIME_CALL), "prompt[1].tool_calls[1] has id 'call_1', which "
                                                         "prompt[1].tool_calls[0] has too"),
        (lambda m: m.append({"role": "assistant", "content": None, "tool_calls": [TIME_CALL]}),
         "prompt[3].tool_calls[0] has id 'call_1', which prompt[1].tool_calls[0] has too"),
        (lambda m: m.append({"role": "tool", "tool_call_id": "call_1", "content": "rainy"}),
         "prompt[3] answers tool call 'call_1', which prompt[2] answered already"),
    ],
    ids=["no-tool_call_id", "unknown-call", "answer-first", "no-id", "no-name", "calls-not-a-list", "key-of-tool",
         "content-dict", "type-not-function", "id-twice-in-a-turn", "id-twice-in-a-conversation", "answered-twice"],
)
async def test_bad_tool_turns_are_invalid_requests_naming_the_message(change: Any, message: str) -> None:
    """Reviewed defect: two calls with one id (or one call answered twice) were accepted, and every result went to the
    model as the last such call's tool (the weather as get_time's); a call of type 'custom' was taken as a function."""
    messages = conversation(
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    )
    change(messages)
    provider = FakeProvider()
    with pytest.raises(InvalidRequestError) as caught:
        await provider.generate(messages, model="m", tools=[WEATHER])
    assert message in str(caught.value)
    assert (await provider.generate("hi", model="m", max_tokens=2)).text


# The fake's tool loop ----------------------------------------------------------------------------------------


async def test_the_fake_runs_a_whole_tool_loop() -> None:
    provider = FakeProvider()
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = await provider.generate(messages, model="m", tools=[WEATHER, TIME])
    assert first.finish_reason == "tool_calls" and first.text == ""
    assert first.tool_calls is not None
    (call,) = first.tool_calls
    assert (call.id, call.name, call.error) == ("call_1", "get_weather", None)
    assert isinstance(call.arguments["city"], str) and call.arguments["unit"] in ("C", "F")
    assert json.loads(call.raw_arguments) == call.arguments
    messages += [first.as_message(), call.answer({"forecast": "sunny", "high": 21})]
    second = await provider.generate(messages, model="m", tools=[WEATHER, TIME])
    assert second.tool_calls is None and second.finish_reason == "stop"
    assert 'get_weather returned {"forecast": "sunny", "high": 21}' in second.text
    again = await provider.generate(messages, model="m", tools=[WEATHER, TIME])
    assert again == second  # deterministic


async def test_the_fake_follows_tool_choice() -> None:
    provider = FakeProvider()
    tools = [WEATHER, TIME]
    named = await provider.generate("hi", "m", tools=tools, tool_choice={"type": "function", "function": {
        "name": "get_time"}})
    assert named.tool_calls is not None and named.tool_calls[0].name == "get_time"
    none = await provider.generate("hi", "m", tools=tools, tool_choice="none")
    assert none.tool_calls is None and none.text.startswith("[base] ")
    # required moves through the tools not yet called since the last user message, then keeps the last
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    names = []
    for _ in range(3):
        result = await provider.generate(messages, "m", tools=tools, tool_choice="required")
        assert result.tool_calls is not None
        names.append(result.tool_calls[0].name)
        messages += [result.as_message(), result.tool_calls[0].answer("ok")]
    assert names == ["get_weather", "get_time", "get_time"]
    assert [call["id"] for m in messages if m.get("tool_calls") for call in m["tool_calls"]] == [
        "call_1", "call_2", "call_3"
    ]


async def test_the_fake_never_gives_a_call_an_id_the_conversation_already_uses() -> None:
    """A conversation whose one call has id ``call_2`` (another backend's turn, a hand-written fixture): the fake's
    next call was ``call_2`` too, and the loop's next generate failed with InvalidRequestError (the id twice)."""
    provider = FakeProvider()
    messages: list[Any] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
        {"role": "user", "content": "And Rome?"},
    ]
    first = await provider.generate(messages, "m", tools=[WEATHER])
    assert first.tool_calls is not None and first.tool_calls[0].id == "call_3"
    messages += [first.as_message(), first.tool_calls[0].answer("rainy")]
    second = await provider.generate(messages, "m", tools=[WEATHER])
    assert second.finish_reason == "stop" and "get_weather returned rainy" in second.text


async def test_a_stream_ends_with_a_result_carrying_the_calls() -> None:
    provider = FakeProvider()
    events = [event async for event in provider.stream("hi", "m", tools=[forecast])]
    assert len(events) == 1 and isinstance(events[0], GenerationResult)
    assert events[0].tool_calls is not None and events[0].tool_calls[0].name == "forecast"
    batch = await provider.generate_batch(["a", "b"], "m", tools=[forecast], tool_choice="required")
    assert all(isinstance(item, GenerationResult) and item.tool_calls for item in batch)



async def test_a_json_schema_beside_tools_checks_the_answer_never_the_calls() -> None:
    """A backend that takes both (the fake, vLLM, OpenAI) may answer with calls first: they come back, and the
    answer after the tool results is the one held to the schema."""
    provider = FakeProvider()
    schema = {"type": "object", "properties": {"forecast": {"type": "string"}}, "required": ["forecast"]}
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = await provider.generate(messages, "m", tools=[WEATHER], json_schema=schema)
    assert first.finish_reason == "tool_calls" and first.tool_calls is not None
    events = [event async for event in provider.stream(messages, "m", tools=[WEATHER], json_schema=schema)]
    assert isinstance(events[-1], GenerationResult) and events[-1].tool_calls == first.tool_calls
    messages += [first.as_message(), first.tool_calls[0].answer("sunny")]
    second = await provider.generate(messages, "m", tools=[WEATHER], json_schema=schema)
    assert second.tool_calls is None and isinstance(json.loads(second.text)["forecast"], str)


# Calls the backends read -------------------------------------------------------------------------------------


def test_arguments_that_do_not_parse_are_reported_not_dropped() -> None:
    tools = GenerationRequest.from_arguments(provider="t", prompt="x", model="m", tools=[WEATHER]).tools
    broken = parse_tool_call("c1", "get_weather", '{"city": "Par', tools)
    assert (broken.arguments, broken.raw_arguments) == ({}, '{"city": "Par')
    assert broken.error is not None and "are not JSON" in broken.error
    invalid = parse_tool_call("c2", "get_weather", '{"city": 3}', tools)
    assert invalid.arguments == {"city": 3}
    assert invalid.error is not None and "3 is not of type 'string'" in invalid.error
    unknown = parse_tool_call("c3", "get_wether", "{}", tools)
    assert unknown.error is not None and "not a tool given" in unknown.error
    assert parse_tool_call("c4", "get_weather", {"city": "Paris"}, tools) == ToolCall(
        "c4", "get_weather", {"city": "Paris"}, '{"city": "Paris"}'
    )
    assert parse_tool_call("c5", "get_time", "", None).arguments == {}


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"city": NaN}', "NaN is not JSON"),
        ('{"city": Infinity}', "Infinity is not JSON"),
        ('{"city": "Paris", "city": "Rome"}', "an object holds the key 'city' twice"),
        ({"city": float("nan")}, "NaN is not JSON"),  # Ollama's arguments, from a body json.loads took NaN in
    ],
    ids=["NaN", "Infinity", "key-twice", "dict-with-nan"],
)
def test_arguments_that_are_not_strict_json_are_a_call_error(raw: Any, why: str) -> None:
    """Reviewed defect: arguments with NaN, Infinity or a key twice parsed (the last value kept) as if valid."""
    tools = GenerationRequest.from_arguments(provider="t", prompt="x", model="m", tools=[WEATHER]).tools
    call = parse_tool_call("c1", "get_weather", raw, tools)
    assert call.arguments == {} and call.error == (
        f"the arguments of get_weather are not JSON ({why}): ToolCall.raw_arguments holds what the model wrote"
    )
    assert call.raw_arguments == (raw if isinstance(raw, str) else '{"city": NaN}')


class NoTools(FakeProvider):
    options: ClassVar[OptionMap] = {
        **FakeProvider.options,
        "tools": Refused("not built yet for this backend"),
        "tool_choice": Refused("not built yet for this backend"),
    }


async def test_a_backend_without_tools_refuses_tools_and_tool_turns_before_sending() -> None:
    assert not NoTools.supports_tools and FakeProvider.supports_tools
    provider = NoTools()
    with pytest.raises(UnsupportedOperationError, match=r"option tools \(not built yet for this backend\)"):
        await provider.generate("hi", "m", tools=[TIME])
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    able = providers_sending("tools")
    assert {"vllm", "openai", "ollama", "llamacpp", "transformers", "fake"} <= set(able)
    with pytest.raises(UnsupportedOperationError, match=r"^NoTools cannot take a conversation with tool calls or "
                       r"tool results, which needs the option tools \(not built yet for this backend\); providers "
                       rf"that can: {re.escape(', '.join(able))}$"):
        await provider.generate(conversation(call), "m")
    assert (await provider.generate("hi", "m", tool_choice="auto", max_tokens=2)).text  # auto without tools: fine


def test_tool_call_is_exported_and_results_keep_their_pinned_fields() -> None:
    assert inference.ToolCall is ToolCall and "ToolCall" in inference.__all__
    result = GenerationResult("t", "m", None, 3, "stop")
    assert (result.tool_calls, result.provider) == (None, None)
    assert result.as_message() == {"role": "assistant", "content": "t"}


def test_the_command_line_prints_tool_calls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([TIME]))
    assert main(["generate", "What time is it?", "--provider", "fake", "--tools", str(tools)]) == 0
    assert capsys.readouterr().out == "\ntool call call_1: get_time {}\n"
    assert main(["generate", "hi", "--provider", "fake", "--tools", str(tools), "--tool-choice", "get_time",
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["finish_reason"] == "tool_calls"
    assert printed["tool_calls"] == [
        {"id": "call_1", "name": "get_time", "arguments": {}, "raw_arguments": "{}", "error": None}
    ]
