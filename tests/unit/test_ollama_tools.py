"""Tool calling on Ollama's native ``/api/chat`` (issue 24): the tools and a conversation's tool turns in Ollama's
fields, the answer's calls whole and streamed, ``tool_choice`` (Ollama has none: ``"none"`` withholds the tools, a
forced call is a ``format``), and what is refused.

No Ollama runs here; the answers are Ollama's own (v0.33 source, ``github.com/ollama/ollama``):

- ``api/types.go``: ``ChatResponse`` (l. 520-548: ``model``, ``created_at``, ``message``, ``done``, ``done_reason``,
  the counts), ``Message`` (l. 197-207: ``tool_calls``, ``tool_name``, ``tool_call_id``), ``ToolCall`` (l. 221-230:
  ``id`` omitted when empty, ``function.index`` always written, ``function.arguments`` a JSON object).
- ``server/routes.go``: ``toolCallId`` (l. 2305-2312: ``call_`` and 8 of ``[a-z0-9]``); the chat Ollama renders
  sends each parsed call in a line of its own with ``content: ""`` and ``done: false`` (l. 2861-2870); a whole
  answer gathers every line's calls into one message (``writeChatResponse``, l. 2387-2434).
- ``llm/llama_server.go``: the chat llama-server renders (Ollama 0.33's default for models without an Ollama
  template) streams content, then sends every call on the done line (l. 2040-2090), ids from llama-server.
- ``docs/api.md``: "Chat request (with tools)" answers of servers before 0.12.10, calls without ``id``.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import jsonschema
import pytest
import respx

from inference._core.call_schema import call_schema
from inference.exceptions import UnsupportedOperationError
from inference.ollama_provider import OllamaProvider
from inference.results import GenerationResult, ToolCall

ROOT = "http://ollama.test:11434"
CHAT = f"{ROOT}/api/chat"

WEATHER = {  # docs/api.md, "Chat request (Streaming, with tools)"
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a given city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city to get the weather for"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                         "parameters": {"type": "object", "properties": {}}}}
INVOICE = {  # a pydantic model's schema: a nested model in $defs, referred to by "#/$defs/..."
    "type": "function",
    "function": {
        "name": "Invoice",
        "description": "An invoice to file.",
        "parameters": {
            "type": "object",
            "properties": {"number": {"type": "string"}, "to": {"$ref": "#/$defs/Address"}},
            "required": ["number", "to"],
            "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}},
                                  "required": ["city"], "additionalProperties": False}},
        },
    },
}
COUNTS = {"total_duration": 3244883583, "load_duration": 2969184542, "prompt_eval_count": 169,
          "prompt_eval_duration": 141656333, "eval_count": 18, "eval_duration": 133293625}


def answer(content: str = "", tool_calls: list[dict[str, Any]] | None = None, done_reason: str = "stop") -> Any:
    """A whole ``/api/chat`` answer as Ollama marshals ``ChatResponse``."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"model": "llama3.2", "created_at": "2025-07-07T20:32:53.844124Z", "message": message,
            "done_reason": done_reason, "done": True, **COUNTS}


def call(name: str, arguments: dict[str, Any], call_id: str | None = None, index: int = 0) -> dict[str, Any]:
    """One ``api.ToolCall`` as Ollama 0.33 marshals it (``id`` left out when empty, as before 0.12.10)."""
    marshalled: dict[str, Any] = {"function": {"index": index, "name": name, "arguments": arguments}}
    return marshalled if call_id is None else {"id": call_id, **marshalled}


def line(content: str = "", tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A stream line that is not the last (Ollama omits the zero counts)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"model": "llama3.2", "created_at": "2025-07-07T20:22:19.184789Z", "message": message, "done": False}


def ndjson(*lines: Any) -> httpx.Response:
    return httpx.Response(200, content=b"".join(json.dumps(one).encode() + b"\n" for one in lines),
                          headers={"content-type": "application/x-ndjson"})


def sent(route: respx.Route, call_index: int = -1) -> Any:
    return json.loads(route.calls[call_index].request.content)


async def collect(events: AsyncIterator[str | GenerationResult]) -> tuple[list[str], GenerationResult]:
    pieces: list[str] = []
    async for event in events:
        if isinstance(event, str):
            pieces.append(event)
        else:
            return pieces, event
    raise AssertionError("the stream ended without a result")


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.fixture
async def provider() -> AsyncIterator[OllamaProvider]:
    async with OllamaProvider(base_url=f"{ROOT}/v1", max_retries=0) as ollama:
        yield ollama


def test_ollama_takes_tools() -> None:
    assert OllamaProvider.supports_tools


# Calls in answers ---------------------------------------------------------------------------------------------


async def test_a_call_comes_back_parsed_under_ollama_s_id(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer(
        tool_calls=[call("get_weather", {"city": "Tokyo"}, "call_x6s2kd0q")])))
    result = await provider.generate("what is the weather in tokyo?", model="llama3.2", max_tokens=64,
                                     tools=[WEATHER], tool_choice="auto")
    assert sent(route) == {
        "model": "llama3.2", "stream": False, "options": {"num_predict": 64},
        "messages": [{"role": "user", "content": "what is the weather in tokyo?"}], "tools": [WEATHER],
    }
    assert result.tool_calls == (ToolCall("call_x6s2kd0q", "get_weather", {"city": "Tokyo"}, '{"city": "Tokyo"}'),)
    assert (result.text, result.finish_reason, result.prompt_tokens, result.completion_tokens) == (
        "", "tool_calls", 169, 18)
    assert result.as_message() == {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_x6s2kd0q", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}}]}


async def test_calls_of_a_server_without_ids_get_ids_of_their_own(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    docs_answer = {  # docs/api.md, "Chat request (with tools)": Ollama before 0.12.10 (no id, no index)
        "model": "llama3.2", "created_at": "2024-07-22T20:33:28.123648Z",
        "message": {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
        ]},
        "done_reason": "stop", "done": True, "total_duration": 885095291, "load_duration": 3753500,
        "prompt_eval_count": 122, "prompt_eval_duration": 328493000, "eval_count": 33, "eval_duration": 552222000,
    }
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=docs_answer))
    first = await provider.generate("Paris and Rome?", model="llama3.2", tools=[WEATHER])
    second = await provider.generate("Paris and Rome?", model="llama3.2", tools=[WEATHER])
    assert first.tool_calls is not None and second.tool_calls is not None
    assert [one.arguments for one in first.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]
    ids = [one.id for one in (*first.tool_calls, *second.tool_calls)]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", one) for one in ids) and len(set(ids)) == 4
    assert first.finish_reason == "tool_calls"


async def test_one_id_given_twice_is_made_unique(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer(tool_calls=[
        call("get_weather", {"city": "Paris"}, "call_same0000", 0), call("get_time", {}, "call_same0000", 1)])))
    result = await provider.generate("Hi", model="llama3.2", tools=[WEATHER, TIME])
    assert result.tool_calls is not None
    assert result.tool_calls[0].id == "call_same0000" and result.tool_calls[1].id != "call_same0000"
    assert [one.name for one in result.tool_calls] == ["get_weather", "get_time"]


async def test_arguments_that_do_not_fit_the_tool_are_kept_with_an_error(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer(tool_calls=[
        call("get_weather", {"town": "Paris"}, "call_a1b2c3d4", 0),
        call("get_forecast", {"city": "Rome"}, "call_e5f6g7h8", 1),
    ])))
    result = await provider.generate("Hi", model="llama3.2", tools=[WEATHER, TIME])
    assert result.tool_calls is not None and len(result.tool_calls) == 2
    wrong, unknown = result.tool_calls
    assert wrong.arguments == {"town": "Paris"} and wrong.raw_arguments == '{"town": "Paris"}'
    assert wrong.error is not None and "'city' is a required property" in wrong.error
    assert unknown.name == "get_forecast" and unknown.error is not None
    assert "not a tool given (tools: get_weather, get_time)" in unknown.error
    assert result.finish_reason == "tool_calls"


async def test_text_and_calls_together_keep_the_text(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer(
        "Let me look that up.", [call("get_weather", {"city": "Oslo"}, "call_0s1o2o3o")])))
    result = await provider.generate("Oslo?", model="llama3.2", tools=[WEATHER])
    assert result.text == "Let me look that up." and result.tool_calls is not None
    assert result.finish_reason == "tool_calls"


async def test_an_answer_without_calls_is_text(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer("It is sunny.")))
    result = await provider.generate("Oslo?", model="llama3.2", tools=[WEATHER])
    assert (result.text, result.tool_calls, result.finish_reason) == ("It is sunny.", None, "stop")


# Streams ------------------------------------------------------------------------------------------------------


async def test_a_stream_of_a_chat_ollama_renders_yields_the_text_and_ends_with_every_call(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    route = mock.post(CHAT).mock(return_value=ndjson(
        line("Let me"), line(" check."),
        line(tool_calls=[call("get_weather", {"city": "Tokyo"}, "call_k2v9x0aa", 0)]),
        line(tool_calls=[call("get_time", {}, "call_p3m8q1bb", 1)]),
        {**answer(), "created_at": "2025-07-07T20:22:19.19314Z"},  # docs/api.md's final line
    ))
    pieces, result = await collect(provider.stream("Weather and time in Tokyo?", model="llama3.2",
                                                   tools=[WEATHER, TIME]))
    assert sent(route)["stream"] is True and sent(route)["tools"] == [WEATHER, TIME]
    assert pieces == ["Let me", " check."] and result.text == "Let me check."
    assert result.tool_calls == (
        ToolCall("call_k2v9x0aa", "get_weather", {"city": "Tokyo"}, '{"city": "Tokyo"}'),
        ToolCall("call_p3m8q1bb", "get_time", {}, "{}"),
    )
    assert result.finish_reason == "tool_calls"


async def test_a_stream_of_a_chat_llama_server_renders_gets_its_calls_on_the_done_line(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    done = answer(tool_calls=[call("get_weather", {"city": "Lima"}, "CkYTUP3sBx5dGhPOUXpR6rWmHrtRuERG", 0)])
    mock.post(CHAT).mock(return_value=ndjson(line("Checking"), line("..."), done))
    pieces, result = await collect(provider.stream("Lima?", model="qwen3", tools=[WEATHER]))
    assert pieces == ["Checking", "..."]
    assert result.tool_calls == (
        ToolCall("CkYTUP3sBx5dGhPOUXpR6rWmHrtRuERG", "get_weather", {"city": "Lima"}, '{"city": "Lima"}'),)
    assert result.text == "Checking..." and result.finish_reason == "tool_calls"


# The conversation ---------------------------------------------------------------------------------------------


async def test_a_conversation_with_a_call_and_its_result_goes_in_ollama_s_fields(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    reply = {  # docs/api.md, "Chat request (With history, with tools)"
        "model": "llama3.2", "created_at": "2025-07-07T20:43:37.688511Z",
        "message": {"role": "assistant", "content": "The current temperature in Toronto is 11°C."},
        "done_reason": "stop", "done": True, "total_duration": 890771750, "load_duration": 707634750,
        "prompt_eval_count": 94, "prompt_eval_duration": 91703208, "eval_count": 11, "eval_duration": 90282125,
    }
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=reply))
    earlier = ToolCall("call_t0r0nt01", "get_time", {"zone": "EST"})
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "what is the weather in Toronto?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Toronto"}'}},
            earlier,
            {"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Tor'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "11 degrees celsius"},
        earlier.answer({"time": "09:00"}),
        {"role": "tool", "tool_call_id": "call_3", "content": "error: the arguments are not JSON"},
    ]
    result = await provider.generate(messages, model="llama3.2", max_tokens=32, tools=[WEATHER, TIME])
    assert sent(route) == {
        "model": "llama3.2", "stream": False, "options": {"num_predict": 32},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "what is the weather in Toronto?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Toronto"}}},
                {"id": "call_t0r0nt01", "function": {"index": 1, "name": "get_time", "arguments": {"zone": "EST"}}},
                {"id": "call_3", "function": {"index": 2, "name": "get_weather", "arguments": {}}},  # not JSON
            ]},
            {"role": "tool", "content": "11 degrees celsius", "tool_name": "get_weather", "tool_call_id": "call_1"},
            {"role": "tool", "content": '{"time": "09:00"}', "tool_name": "get_time",
             "tool_call_id": "call_t0r0nt01"},
            {"role": "tool", "content": "error: the arguments are not JSON", "tool_name": "get_weather",
             "tool_call_id": "call_3"},
        ],
        "tools": [WEATHER, TIME],
    }
    assert (result.text, result.tool_calls, result.finish_reason) == (
        "The current temperature in Toronto is 11°C.", None, "stop")


async def test_a_loop_sends_back_the_calls_it_received(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=[
        httpx.Response(200, json=answer(tool_calls=[call("get_weather", {"city": "Kyoto"})])),  # no id: made up
        httpx.Response(200, json=answer("Sunny in Kyoto.")),
    ])
    messages: list[Any] = [{"role": "user", "content": "Kyoto?"}]
    first = await provider.generate(messages, model="llama3.2", tools=[WEATHER])
    assert first.tool_calls is not None
    made = first.tool_calls[0]
    messages += [first.as_message(), made.answer("sunny")]
    second = await provider.generate(messages, model="llama3.2", tools=[WEATHER])
    assert second.text == "Sunny in Kyoto."
    assert sent(route)["messages"][1:] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": made.id, "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Kyoto"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather", "tool_call_id": made.id},
    ]


# tool_choice --------------------------------------------------------------------------------------------------


async def test_none_withholds_the_tools_and_still_sends_the_conversation(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer("11 degrees.")))
    messages = [
        {"role": "user", "content": "Toronto?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "T"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "11"},
    ]
    result = await provider.generate(messages, model="llama3.2", tools=[WEATHER], tool_choice="none")
    body = sent(route)
    assert "tools" not in body and "format" not in body
    assert body["messages"][2] == {"role": "tool", "content": "11", "tool_name": "get_weather",
                                   "tool_call_id": "call_1"}
    assert (result.text, result.tool_calls, result.finish_reason) == ("11 degrees.", None, "stop")


NAMED_WEATHER_FORMAT = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER["function"]["parameters"]},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


async def test_a_named_tool_sends_the_call_object_as_format_and_reads_the_call_from_the_content(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    # llama-server (Ollama 0.33's renderer for most models) answers a format as content, never as a call.
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer(
        '{"name": "get_weather", "arguments": {"city": "Paris"}}')))
    result = await provider.generate("Weather in Paris?", model="llama3.2", max_tokens=64, tools=[WEATHER, TIME],
                                     tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert sent(route) == {
        "model": "llama3.2", "stream": False, "options": {"num_predict": 64},
        "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, TIME],
        "format": NAMED_WEATHER_FORMAT,
    }
    assert result.tool_calls is not None and len(result.tool_calls) == 1
    made = result.tool_calls[0]
    assert (made.name, made.arguments, made.error) == ("get_weather", {"city": "Paris"}, None)
    assert re.fullmatch(r"call_[0-9a-f]{24}", made.id)
    assert (result.text, result.finish_reason) == ("", "tool_calls")


async def test_a_forced_call_ollama_parsed_itself_is_taken_from_tool_calls(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    # A template whose tool-call tag is "{" (routes.go l. 2861-2870 with tools/tools.go): the format's object is a
    # call Ollama parses, and the content is emptied.
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer(
        tool_calls=[call("get_weather", {"city": "Paris"}, "call_q7w8e9r0")])))
    result = await provider.generate("Paris?", model="llama3.2", tools=[WEATHER], tool_choice="required")
    assert result.tool_calls == (ToolCall("call_q7w8e9r0", "get_weather", {"city": "Paris"}, '{"city": "Paris"}'),)
    assert (result.text, result.finish_reason) == ("", "tool_calls")


async def test_a_forced_call_streams_no_json_pieces_and_ends_with_the_call(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    route = mock.post(CHAT).mock(return_value=ndjson(
        line('{"name": "get_weather", '), line('"arguments": {"city": '), line('"Paris"}}'), answer()))
    pieces, result = await collect(provider.stream("Paris?", model="llama3.2", tools=[WEATHER],
                                                   tool_choice="required"))
    assert sent(route)["format"] == NAMED_WEATHER_FORMAT  # "required" with one tool: that tool's call
    assert pieces == [] and result.text == ""
    assert result.tool_calls is not None and result.tool_calls[0].arguments == {"city": "Paris"}
    assert result.tool_calls[0].error is None and result.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("content", "done_reason", "name", "why"),
    [
        ('{"name": "get_weather", "arguments": {"city": "Par', "length", "get_weather", "max_tokens cut it short"),
        ("Sure! It is sunny in Paris.", "stop", "get_weather", "did not hold to the format"),
        ('{"name": "get_time", "arguments": []}', "stop", "get_time", "not an object of a string 'name'"),
    ],
)
async def test_a_malformed_answer_to_a_forced_call_is_reported_not_dropped(
    provider: OllamaProvider, mock: respx.MockRouter, content: str, done_reason: str, name: str, why: str
) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer(content, done_reason=done_reason)))
    result = await provider.generate("Paris?", model="llama3.2", tools=[WEATHER, TIME],
                                     tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert result.tool_calls is not None and len(result.tool_calls) == 1
    made = result.tool_calls[0]
    assert (made.name, made.arguments, made.raw_arguments) == (name, {}, content)
    assert made.error is not None and why in made.error and "tool_choice naming 'get_weather'" in made.error
    assert result.text == "" and result.finish_reason == ("length" if done_reason == "length" else "tool_calls")


async def test_required_with_several_tools_allows_a_call_of_each(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer(
        '{"name": "Invoice", "arguments": {"number": "A-1", "to": {"city": "Oslo"}}}')))
    result = await provider.generate("File it.", model="llama3.2", tools=[WEATHER, INVOICE], tool_choice="required")
    schema = sent(route)["format"]
    assert [option["properties"]["name"] for option in schema["anyOf"]] == [
        {"const": "get_weather"}, {"const": "Invoice"}]
    assert schema["anyOf"][1]["properties"]["arguments"] == {"$ref": "#/$defs/Invoice"}
    assert result.tool_calls is not None and result.tool_calls[0].error is None
    assert result.tool_calls[0].arguments == {"number": "A-1", "to": {"city": "Oslo"}}


@pytest.mark.parametrize("names", [["Invoice"], ["get_weather", "Invoice", "get_time"]])
def test_the_forced_format_accepts_exactly_the_calls_of_its_tools(names: list[str]) -> None:
    schema = call_schema([WEATHER, TIME, INVOICE], names)
    assert schema is not None
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    good = {"get_weather": {"city": "Oslo"}, "get_time": {}, "Invoice": {"number": "7", "to": {"city": "Oslo"}}}
    for name, arguments in good.items():
        assert validator.is_valid({"name": name, "arguments": arguments}) is (name in names)
    assert not validator.is_valid({"name": "Invoice", "arguments": {"number": "7", "to": {"town": "Oslo"}}})
    assert not validator.is_valid({"name": "Invoice", "arguments": {"number": "7", "to": {"city": "O"}}, "x": 1})
    # llama.cpp resolves a $ref by walking object keys only: no reference may pass through a list (anyOf's items)
    text = json.dumps(schema)
    for reference in re.findall(r'"\$ref": "([^"]*)"', text):
        target: Any = schema
        for key in reference.removeprefix("#/").split("/"):
            assert isinstance(target, dict) and key in target, reference
            target = target[key]


# Refusals -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tool_choice", [None, "auto", "required", {"type": "function", "function": {"name": "get_time"}}]
)
async def test_json_schema_with_tools_sent_is_refused_before_sending_and_the_provider_keeps_serving(
    provider: OllamaProvider, mock: respx.MockRouter, tool_choice: Any
) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer('{"city": "Oslo"}')))
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    with pytest.raises(UnsupportedOperationError, match="json_schema together with tools") as caught:
        await provider.generate("Hi", model="llama3.2", json_schema=schema, tools=[WEATHER, TIME],
                                tool_choice=tool_choice)
    assert "providers that take both: " in str(caught.value) and "vllm" in str(caught.value)
    with pytest.raises(UnsupportedOperationError, match="json_schema together with tools"):
        await collect(provider.stream("Hi", model="llama3.2", json_schema=schema, tools=[WEATHER, TIME],
                                      tool_choice=tool_choice))
    assert not route.called
    result = await provider.generate("Hi", model="llama3.2", json_schema=schema, tools=[WEATHER], tool_choice="none")
    assert sent(route)["format"] == schema and "tools" not in sent(route)
    assert result.text == '{"city": "Oslo"}' and result.tool_calls is None
