"""The agent frameworks on the SDK, with the real packages, on the fake provider (which calls tools).

pydantic-ai: an ``Agent`` with a Python tool and a structured ``output_type`` runs its loop on
:class:`~inference.integrations.pydantic_ai.InferenceModel`, streamed or not. LangChain: a tool loop with
``bind_tools`` and ``with_structured_output`` on :class:`~inference.integrations.langchain.ChatInference`, sync,
async and streamed, and ``n``, ``logprobs`` and ``return_token_ids`` answered where LangChain users read them. (On
llama.cpp in process: tests/integration/test_framework_tools_inprocess.py.)
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, ValidationError
from pydantic_ai import Agent, CachePoint, ImageUrl, NativeOutput
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ThinkingPart, ToolCallPart, ToolReturnPart
from pydantic_ai.settings import ToolOrOutput

from inference._core.validation import GenerationRequest
from inference.exceptions import InvalidRequestError, UnsupportedOperationError
from inference.fake_provider import FakeProvider
from inference.integrations.langchain import ChatInference
from inference.integrations.pydantic_ai import InferenceModel
from inference.options import OptionMap, Refused
from inference.results import GenerationResult, ToolCall
from inference.tools import parse_tool_call


class Recording(FakeProvider):
    """A fake that keeps each request (to see what the framework sent)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[GenerationRequest] = []

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        return await super()._generate(request)

    async def _stream(self, request: GenerationRequest) -> Any:
        self.requests.append(request)
        async for event in super()._stream(request):
            yield event


class Forecast(BaseModel):
    """The forecast the agent reports."""

    city: str
    summary: str
    high: int


def weather_agent(provider: FakeProvider, looked_up: list[str]) -> Agent[None, Forecast]:
    agent = Agent(InferenceModel(provider, "fake-model"), output_type=Forecast, instructions="Answer briefly.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: The city's name.
        """
        looked_up.append(city)
        return f"sunny in {city}"

    return agent


# pydantic-ai --------------------------------------------------------------------------------------------------


async def test_a_pydantic_ai_agent_calls_its_tool_then_returns_structured_output() -> None:
    provider, looked_up = Recording(), []
    result = await weather_agent(provider, looked_up).run("Weather in Paris?")
    assert isinstance(result.output, Forecast)
    assert len(looked_up) == 1  # the Python tool ran once, with arguments the model made
    kinds = [
        [type(part).__name__ for part in message.parts]
        for message in result.all_messages()
        if isinstance(message, (ModelRequest, ModelResponse))
    ]
    assert kinds[:3] == [["UserPromptPart"], ["ToolCallPart"], ["ToolReturnPart"]]
    first, second = provider.requests
    assert [tool["function"]["name"] for tool in first.tools] == ["get_weather", "final_result"]
    assert first.tool_choice == "required"  # structured output: no text answer allowed
    assert first.messages[0] == {"role": "system", "content": "Answer briefly."}
    assert first.tools[0]["function"]["parameters"]["properties"]["city"]["description"] == "The city's name."
    # the tool's result went back to the model as a tool message answering the call
    call = second.messages[-2]["tool_calls"][0]
    assert second.messages[-1] == {"role": "tool", "tool_call_id": call["id"], "content": f"sunny in {looked_up[0]}"}



async def test_a_pydantic_ai_agent_with_native_output_calls_its_tool_then_answers_in_json() -> None:
    provider, looked_up = Recording(), []
    agent = Agent(InferenceModel(provider, "fake-model"), output_type=NativeOutput(Forecast))

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        looked_up.append(city)
        return "sunny"

    result = await agent.run("Weather in Paris?")
    assert isinstance(result.output, Forecast) and len(looked_up) == 1
    first, second = provider.requests
    assert first.json_schema is not None and first.tools is not None  # both sent; the call answered first
    assert second.messages[-1]["role"] == "tool"


class NamelessFirst(Recording):
    """A fake whose model first writes a call that names no tool (as ``"auto"`` with several tools allows)."""

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        if not request.tools or any(message["role"] == "assistant" for message in request.messages):
            return super()._answer(request)
        call = ToolCall("call_nameless", "", {}, 'get_weather(city="Paris")', "the model's tool call is not JSON")
        return GenerationResult(text="", model="m", adapter_id=None, token_count=3, finish_reason="tool_calls",
                                prompt_tokens=1, completion_tokens=2, tool_calls=(call,))


async def test_a_pydantic_ai_agent_gets_past_a_call_without_a_tool_name() -> None:
    """pydantic-ai answers the nameless call with a retry; it goes back as the model's text and a user message (a
    call needs a name), and the run goes on instead of failing on the next request."""
    provider = NamelessFirst()
    agent = Agent(InferenceModel(provider, "fake-model"))

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    result = await agent.run("Weather in Paris?")
    assert isinstance(result.output, str) and result.output.endswith("get_weather returned sunny")
    second = provider.requests[1]  # then the model called the tool by its name, and answered
    assert second.messages[1] == {"role": "assistant", "content": 'get_weather(city="Paris")'}
    assert second.messages[2]["role"] == "user" and "Unknown tool name" in second.messages[2]["content"]

async def test_a_pydantic_ai_agent_streams_on_the_provider() -> None:
    provider, looked_up = Recording(), []
    async with weather_agent(provider, looked_up).run_stream("Weather in Rome?") as run:
        output = await run.get_output()
    assert isinstance(output, Forecast) and len(looked_up) == 1

    text_agent = Agent(InferenceModel(provider, "fake-model"))

    @text_agent.tool_plain
    def get_time() -> str:
        """The time now."""
        return "noon"

    async with text_agent.run_stream("What time is it?") as run:
        pieces = [piece async for piece in run.stream_text(delta=True)]
    text = "".join(pieces)
    assert text.startswith("[base] ") and text.endswith("get_time returned noon")
    assert provider.requests[-1].messages[-1]["role"] == "tool"


async def test_the_model_reports_usage_and_the_tool_call_ids_round_trip() -> None:
    result = await weather_agent(FakeProvider(), []).run("Weather in Oslo?")
    responses = [message for message in result.all_messages() if isinstance(message, ModelResponse)]
    call = next(part for part in responses[0].parts if isinstance(part, ToolCallPart))
    returned = next(
        part for message in result.all_messages() if isinstance(message, ModelRequest)
        for part in message.parts if isinstance(part, ToolReturnPart)
    )
    assert call.tool_call_id == returned.tool_call_id == "call_1"
    assert responses[0].usage.input_tokens > 0 and responses[0].finish_reason == "tool_call"
    assert result.usage.requests == 2


async def test_a_plain_text_agent_gets_the_providers_text() -> None:
    result = await Agent(InferenceModel(FakeProvider(), "m", adapter_id=None)).run("Hi")
    responses = [message for message in result.all_messages() if isinstance(message, ModelResponse)]
    assert isinstance(responses[0].parts[0], TextPart) and result.output.startswith("[base] ")


async def test_pydantic_ais_openai_settings_are_sent_as_the_options_of_the_same_names() -> None:
    provider = Recording()
    settings: Any = {"presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {"7": -100}, "timeout": 30,
                     "extra_body": {"priority": 1}}
    await Agent(InferenceModel(provider, "m")).run("Hi", model_settings=settings)
    (request,) = provider.requests
    assert (request.presence_penalty, request.frequency_penalty, request.logit_bias) == (0.5, -0.5, {7: -100.0})
    assert (request.timeout, request.extra_body) == (30.0, {"priority": 1})

    class NoPenalties(FakeProvider):
        options: ClassVar[OptionMap] = {**FakeProvider.options, "presence_penalty": Refused("not built yet")}

    with pytest.raises(UnsupportedOperationError, match="presence_penalty"):  # refused, never dropped
        await Agent(InferenceModel(NoPenalties(), "m")).run("Hi", model_settings={"presence_penalty": 0.5})


async def test_tool_or_output_offers_the_named_function_tools_and_the_output_tools() -> None:
    """pydantic-ai's ToolOrOutput was ignored: every tool was sent, and the model could call one it was not given."""
    provider = Recording()
    agent = Agent(InferenceModel(provider, "m"), output_type=Forecast)

    @agent.tool_plain
    def alpha() -> str:
        """Alpha."""
        return "a"

    @agent.tool_plain
    def beta() -> str:
        """Beta."""
        return "b"

    await agent.run("Hi", model_settings={"tool_choice": ToolOrOutput(function_tools=["beta"])})
    first = provider.requests[0]
    assert sorted(tool["function"]["name"] for tool in first.tools or ()) == ["beta", "final_result"]
    assert first.tool_choice == "required"  # no text answer allowed: as pydantic-ai resolves it
    with pytest.raises(UserError, match="gamma"):
        await agent.run("Hi", model_settings={"tool_choice": ToolOrOutput(function_tools=["gamma"])})


class Reasoning(FakeProvider):
    """A fake whose model reasons before answering (a thinking model)."""

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        import dataclasses

        return dataclasses.replace(super()._answer(request), reasoning="first, the weather")


async def test_a_streamed_agent_run_keeps_the_reasoning_as_a_run_does() -> None:
    agent = Agent(InferenceModel(Reasoning(), "m"))
    whole = await agent.run("Hi")
    async with agent.run_stream("Hi") as run:
        await run.get_output()
        streamed = run.all_messages()
    for messages in (whole.all_messages(), streamed):
        response = next(message for message in messages if isinstance(message, ModelResponse))
        assert [part.content for part in response.parts if isinstance(part, ThinkingPart)] == ["first, the weather"]


async def test_the_thinking_setting_switches_the_models_thinking_on_and_off() -> None:
    """pydantic-ai's ``thinking`` setting was dropped (the default profile did not declare it): the model never
    thought when asked to, nor stopped when told not to. An effort level switches thinking on (the SDK's ``thinking``
    has no levels)."""
    provider = Recording()
    agent = Agent(InferenceModel(provider, "m"))
    thought = await agent.run("Hi", model_settings={"thinking": True})
    async with agent.run_stream("Hi", model_settings={"thinking": "low"}) as run:
        await run.get_output()
        streamed = run.all_messages()
    for messages in (thought.all_messages(), streamed):
        response = messages[-1]
        assert isinstance(response, ModelResponse)
        (thinking,) = [part.content for part in response.parts if isinstance(part, ThinkingPart)]
        assert thinking.startswith("Thinking: ")  # the fake's made-up reasoning, only when thinking is on
    await agent.run("Hi", model_settings={"thinking": False})
    await agent.run("Hi")
    assert [request.thinking for request in provider.requests] == [True, True, False, None]


async def test_a_cache_point_in_a_user_prompt_is_left_out_and_an_image_is_still_refused() -> None:
    """A ``CachePoint`` (which pydantic-ai's contract says a model without prompt caching filters out) failed the run
    with ``UserError``."""
    provider = Recording()
    agent = Agent(InferenceModel(provider, "m"))
    result = await agent.run(["Summarise this long context.", CachePoint(), "Question: what?"])
    assert result.output.startswith("[base] ")
    (request,) = provider.requests
    assert request.messages == [{"role": "user", "content": "Summarise this long context.\nQuestion: what?"}]
    with pytest.raises(UserError, match="holds ImageUrl"):
        await agent.run(["Look.", CachePoint(), ImageUrl("https://example.com/a.png")])


async def test_a_provider_without_tools_refuses_an_agent_with_tools() -> None:
    class NoTools(FakeProvider):
        options: ClassVar[OptionMap] = {
            **FakeProvider.options, "tools": Refused("not built yet"), "tool_choice": Refused("not built yet")
        }

    with pytest.raises(UnsupportedOperationError, match="option tools"):
        await weather_agent(NoTools(), []).run("Weather?")


# LangChain ----------------------------------------------------------------------------------------------------


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def test_a_langchain_tool_loop_with_bind_tools_runs_synchronously() -> None:
    provider = Recording()
    chat = ChatInference(provider=provider, model="m", max_tokens=32, temperature=0.0)
    bound = chat.bind_tools([get_weather])
    messages: list[BaseMessage] = [HumanMessage("Weather in Paris?")]
    answer = bound.invoke(messages)
    assert isinstance(answer, AIMessage) and answer.content == ""
    (call,) = answer.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str) and call["id"] == "call_1"
    assert answer.response_metadata["finish_reason"] == "tool_calls"
    messages += [answer, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = bound.invoke(messages)
    assert not final.tool_calls and f"get_weather returned sunny in {call['args']['city']}" in str(final.content)
    sent = provider.requests[-1]
    assert (sent.max_tokens, sent.temperature) == (32, 0.0)
    assert sent.messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"


async def test_langchain_structured_output_sync_and_async() -> None:
    chat = ChatInference(provider=FakeProvider(), model="m")
    structured = chat.with_structured_output(Forecast)
    assert isinstance(await structured.ainvoke("Weather in Rome?"), Forecast)
    as_dict = await chat.with_structured_output(Forecast.model_json_schema()).ainvoke("Weather?")
    assert set(as_dict) == {"city", "summary", "high"}
    # a forced tool: LangChain's "any" and a tool's name
    named = await chat.bind_tools([get_weather], tool_choice="get_weather").ainvoke("Hello")
    assert named.tool_calls[0]["name"] == "get_weather"


def test_langchain_structured_output_synchronously() -> None:
    chat = ChatInference(provider=FakeProvider(), model="m")
    assert isinstance(chat.with_structured_output(Forecast).invoke("Weather?"), Forecast)


async def test_langchain_structured_output_sends_the_method_asked_for() -> None:
    """``method="json_schema"`` and ``"json_mode"`` were served as a forced tool call all the same (no ``json_schema``
    sent), and ``method="bogus"`` was accepted: langchain-core's default drops ``method``. Now ``json_schema`` sends
    the schema as the provider's ``json_schema`` and parses the text, ``json_mode`` asks for any JSON object
    (``response_format`` ``json_object``), and another method is refused, as ChatOpenAI refuses it (a ValueError)."""
    provider = Recording()
    chat = ChatInference(provider=provider, model="m")
    forecast = await chat.with_structured_output(Forecast, method="json_schema").ainvoke("Weather in Rome?")
    assert isinstance(forecast, Forecast)
    sent = provider.requests[-1]
    assert sent.json_schema is not None and set(sent.json_schema["properties"]) == {"city", "summary", "high"}
    assert not sent.tools and sent.tool_choice is None
    as_dict = chat.with_structured_output(Forecast.model_json_schema(), method="json_schema").invoke("Weather?")
    assert isinstance(as_dict, dict) and set(as_dict) == {"city", "summary", "high"}
    raw = await chat.with_structured_output(Forecast, method="json_schema", include_raw=True).ainvoke("Weather?")
    assert isinstance(raw, dict) and isinstance(raw["parsed"], Forecast) and raw["parsing_error"] is None
    assert Forecast.model_validate_json(raw["raw"].text) == raw["parsed"]
    streamed = [part async for part in chat.with_structured_output(Forecast, method="json_schema").astream("W?")]
    assert isinstance(streamed[-1], Forecast)
    # JSON mode: any JSON object; the model is not held to the schema, so a pydantic schema may not parse
    anything = await chat.with_structured_output(method="json_mode").ainvoke("Answer in JSON.")
    assert anything == {} and provider.requests[-1].json_schema == {"type": "object"}
    unparsed = await chat.with_structured_output(Forecast, method="json_mode", include_raw=True).ainvoke("JSON!")
    assert isinstance(unparsed, dict) and unparsed["parsed"] is None and unparsed["parsing_error"] is not None
    # function calling stays the default, a forced call
    assert isinstance(await chat.with_structured_output(Forecast, method="function_calling").ainvoke("W?"), Forecast)
    assert provider.requests[-1].tool_choice == "required" and provider.requests[-1].json_schema is None
    for wrong, message in (({"method": "bogus"}, "bogus"), ({"method": "json_mode", "strict": True}, "strict")):
        with pytest.raises(InvalidRequestError, match=message) as refused:
            chat.with_structured_output(Forecast, **wrong)
        assert isinstance(refused.value, ValueError)
    with pytest.raises(InvalidRequestError, match="schema"):
        chat.with_structured_output(None, method="json_schema")

    class NoJsonSchema(FakeProvider):
        options: ClassVar[OptionMap] = {
            **FakeProvider.options, "json_schema": Refused("not built yet"), "response_format": Refused("not built")
        }

    refusing = ChatInference(provider=NoJsonSchema(), model="m")
    for method in ("json_schema", "json_mode"):  # no silent fallback to a tool call
        with pytest.raises(UnsupportedOperationError, match="option json_schema"):
            await refusing.with_structured_output(Forecast, method=method).ainvoke("Weather?")


async def test_langchain_streams_text_then_the_calls() -> None:
    chat = ChatInference(provider=FakeProvider(), model="m")
    pieces = [chunk.content async for chunk in chat.astream("Hi")]
    assert len(pieces) > 2 and "".join(str(piece) for piece in pieces).startswith("[base] ")
    merged: AIMessageChunk | None = None
    async for chunk in chat.bind_tools([get_weather]).astream("Weather?"):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and merged.tool_calls[0]["name"] == "get_weather"
    assert merged.usage_metadata is not None and merged.usage_metadata["output_tokens"] > 0
    sync_pieces = [chunk.content for chunk in chat.stream("Hi")]
    assert "".join(str(piece) for piece in sync_pieces) == "".join(str(piece) for piece in pieces)


def _as_openai_logprobs(result: GenerationResult) -> dict[str, Any]:
    """The result's logprobs as ChatOpenAI's ``response_metadata["logprobs"]`` holds them."""
    return {"content": [
        {"token": entry.token, "logprob": entry.logprob, "bytes": list(entry.token.encode()),
         "top_logprobs": [{"token": token, "logprob": value, "bytes": list(token.encode())}
                          for token, value in entry.top_logprobs]}
        for entry in result.logprobs or ()
    ]}


async def test_langchain_returns_every_completion_with_its_logprobs_and_token_ids() -> None:
    """``n``, ``logprobs`` and ``return_token_ids`` reached the provider, which answered them, but LangChain got one
    generation, with neither logprobs nor token ids anywhere. Now each completion is a generation, with its logprobs
    in ChatOpenAI's shape and its ids in ``response_metadata``; ChatOpenAI's ``logprobs=True``/``top_logprobs`` too."""
    provider = Recording()
    chat = ChatInference(provider=provider, model="m", max_tokens=6, temperature=1.0, seed=3)
    asked: dict[str, Any] = {"n": 2, "logprobs": 2, "return_token_ids": True}
    direct = await provider.generate([{"role": "user", "content": "Hi"}], "m", max_tokens=6, temperature=1.0,
                                     seed=3, **asked)
    assert direct.choices is not None and direct.choices[0].text != direct.choices[1].text
    for result in (await chat.agenerate([[HumanMessage("Hi")]], **asked),
                   chat.generate([[HumanMessage("Hi")]], **asked)):
        (generations,) = result.generations
        assert [generation.text for generation in generations] == [choice.text for choice in direct.choices]
        for generation, choice in zip(generations, direct.choices, strict=True):
            metadata = generation.message.response_metadata
            assert metadata["logprobs"] == _as_openai_logprobs(choice)
            assert len(metadata["logprobs"]["content"][0]["top_logprobs"]) == 2
            assert metadata["token_ids"] == list(choice.token_ids or ())
            assert metadata["finish_reason"] == choice.finish_reason
            assert generation.generation_info is not None and generation.generation_info["logprobs"]
            usage = generation.message.usage_metadata  # the whole request's, as ChatOpenAI reports it
            assert usage is not None and usage["output_tokens"] == direct.completion_tokens
    # bound, and in ChatOpenAI's spelling: logprobs=True, with top_logprobs alternatives (none without)
    one = await chat.bind(logprobs=True, top_logprobs=1, return_token_ids=True).ainvoke("Hi")
    assert one.response_metadata["token_ids"] == list(direct.choices[0].token_ids or ())
    assert provider.requests[-1].logprobs == 1
    assert [len(entry["top_logprobs"]) for entry in one.response_metadata["logprobs"]["content"]] == [1] * len(
        one.response_metadata["logprobs"]["content"])
    assert provider.requests[-1].n == 1 and one.text == direct.choices[0].text  # invoke: one completion, the first
    await chat.ainvoke("Hi", logprobs=True)
    assert provider.requests[-1].logprobs == 0
    plain = await chat.ainvoke("Hi")
    assert "logprobs" not in plain.response_metadata and "token_ids" not in plain.response_metadata
    with pytest.raises(InvalidRequestError, match="top_logprobs"):
        await chat.ainvoke("Hi", top_logprobs=2)
    # a stream: on its last chunk
    merged: AIMessageChunk | None = None
    async for chunk in chat.astream("Hi", logprobs=2, return_token_ids=True):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and merged.text == direct.choices[0].text
    assert merged.response_metadata["logprobs"] == _as_openai_logprobs(direct.choices[0])
    assert merged.response_metadata["token_ids"] == list(direct.choices[0].token_ids or ())
    last = list(chat.stream("Hi", logprobs=2, return_token_ids=True))[-1]
    assert last.response_metadata["token_ids"] == merged.response_metadata["token_ids"]
    with pytest.raises(InvalidRequestError, match="n is 2"):  # a stream is one message: one completion
        list(chat.bind(n=2).stream("Hi"))



async def test_langchain_gives_the_models_reasoning_where_langchain_reads_it() -> None:
    """With ``thinking=True`` the SDK's ``result.reasoning`` was lost: in no message, and in no chunk of a stream."""
    chat = ChatInference(provider=FakeProvider(), model="m", max_tokens=5)
    whole = await chat.ainvoke("Hi", thinking=True)
    reasoning = whole.additional_kwargs["reasoning_content"]  # where several LangChain chat models put it
    assert reasoning.startswith("Thinking: ") and reasoning not in str(whole.content)
    assert whole.content_blocks[0] == {"type": "reasoning", "reasoning": reasoning}
    assert chat.invoke("Hi", thinking=True).additional_kwargs["reasoning_content"] == reasoning
    merged: AIMessageChunk | None = None
    async for chunk in chat.astream("Hi", thinking=True):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and merged.additional_kwargs["reasoning_content"] == reasoning
    assert merged.content_blocks[0] == {"type": "reasoning", "reasoning": reasoning}
    assert merged.text == whole.text
    last = list(chat.stream("Hi", thinking=True))[-1]
    assert last.additional_kwargs["reasoning_content"] == reasoning
    assert "reasoning_content" not in (await chat.ainvoke("Hi")).additional_kwargs  # no thinking, no reasoning


class BadCall(FakeProvider):
    """A fake whose model calls get_weather with arguments that parse but do not validate (as "auto" allows)."""

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        if not request.tools:
            return super()._answer(request)
        call = parse_tool_call("call_bad", "get_weather", '{"city": 42}', request.tools)
        return GenerationResult(text="", model="m", adapter_id=None, token_count=3, finish_reason="tool_calls",
                                prompt_tokens=1, completion_tokens=2, tool_calls=(call,))


async def test_langchain_reports_a_call_that_does_not_validate_whole_and_streamed() -> None:
    chat = ChatInference(provider=BadCall(), model="m").bind_tools([get_weather])
    whole = await chat.ainvoke("Weather?")
    assert isinstance(whole, AIMessage) and whole.tool_calls == []
    (invalid,) = whole.invalid_tool_calls
    assert invalid["id"] == "call_bad" and "city" in (invalid["error"] or "")
    merged: AIMessageChunk | None = None
    async for chunk in chat.astream("Weather?"):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    assert merged.response_metadata["tool_call_errors"] == {"call_bad": invalid["error"]}

async def test_langchain_sends_a_call_without_a_tool_name_back_as_text_and_its_answer_as_a_user_message() -> None:
    """Sending ChatInference's own invalid call back (as LangChain keeps it in the history) failed every later call: a
    call needs a name. It goes back as the text the model wrote, and a tool message answering it as a user message."""
    provider = NamelessFirst()
    chat = ChatInference(provider=provider, model="m").bind_tools([get_weather])
    first = await chat.ainvoke("Weather?")
    assert isinstance(first, AIMessage)
    (invalid,) = first.invalid_tool_calls
    for answer in (ToolMessage("Name the tool.", tool_call_id=invalid["id"] or ""), HumanMessage("Name the tool.")):
        then = await chat.ainvoke([HumanMessage("Weather?"), first, answer])
        assert isinstance(then, AIMessage) and then.tool_calls
        sent = provider.requests[-1].messages
        assert sent[1:] == [{"role": "assistant", "content": 'get_weather(city="Paris")'},
                            {"role": "user", "content": "Name the tool."}]


async def test_langchain_sends_its_own_v1_message_back_and_refuses_an_image_with_the_sdks_error() -> None:
    """With ``output_version="v1"`` the model's AIMessage holds ``reasoning`` and ``tool_call`` blocks: sending it back
    in the next turn raised a bare TypeError. A message's call and reasoning blocks are left out (its calls go from
    ``tool_calls``, as any provider's); content that cannot be sent is refused with the SDK's error."""
    class ReasoningRecording(Recording, Reasoning):
        """A thinking model whose requests are kept."""

    provider = ReasoningRecording()
    chat = ChatInference(provider=provider, model="m", output_version="v1").bind_tools([get_weather])
    first = await chat.ainvoke("Weather in Paris?")
    assert isinstance(first, AIMessage) and isinstance(first.content, list)
    assert [block["type"] for block in first.content if isinstance(block, dict)] == ["reasoning", "tool_call"]
    (call,) = first.tool_calls
    answer = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    final = await chat.ainvoke([HumanMessage("Weather in Paris?"), first, answer])
    assert f"get_weather returned sunny in {call['args']['city']}" in final.text
    sent = provider.requests[-1].messages[1]
    assert (sent["content"], sent["tool_calls"][0]["id"]) == ("", call["id"])
    anthropic = AIMessage(  # another provider's blocks, its calls in tool_calls too
        content=[{"type": "thinking", "thinking": "Rome, then."}, {"type": "text", "text": "Looking it up."},
                 {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}],
        tool_calls=[{"name": "get_weather", "args": {"city": "Rome"}, "id": "toolu_1"}],
    )
    await chat.ainvoke([HumanMessage("Weather in Rome?"), anthropic, ToolMessage("sunny", tool_call_id="toolu_1")])
    sent = provider.requests[-1].messages[1]
    assert (sent["content"], sent["tool_calls"][0]["function"]["name"]) == ("Looking it up.", "get_weather")
    image = HumanMessage([{"type": "text", "text": "What is this?"}, {"type": "image", "url": "https://x.test/a.png"}])
    with pytest.raises(UnsupportedOperationError, match="HumanMessage holds a block of type 'image'"):
        await chat.ainvoke([image])


async def test_chat_inference_sends_its_options_and_refuses_what_it_cannot_send() -> None:
    """stop, timeout and the penalties given to ChatInference did nothing (pydantic dropped them, a typo too), and
    bind_tools(parallel_tool_calls=...) or strict=True ended in a bare TypeError."""
    provider = Recording()
    chat = ChatInference(provider=provider, model="m", stop=["\n"], timeout=5, presence_penalty=0.5,
                         frequency_penalty=-0.5)
    await chat.ainvoke("Hi")
    await chat.ainvoke("Hi", stop=["."])
    first, second = provider.requests
    assert (first.stop, first.timeout, first.presence_penalty, first.frequency_penalty) == (("\n",), 5.0, 0.5, -0.5)
    assert second.stop == (".",)
    with pytest.raises(ValidationError, match="typo_temperature"):
        ChatInference(provider=provider, model="m", typo_temperature=3)  # type: ignore[call-arg]
    strict = await chat.bind_tools([get_weather], strict=True, tool_choice="get_weather").ainvoke("Hi")
    assert isinstance(strict, AIMessage) and strict.tool_calls[0]["name"] == "get_weather"
    with pytest.raises(UnsupportedOperationError, match="parallel_tool_calls"):
        chat.bind_tools([get_weather], parallel_tool_calls=False)


def test_importing_inference_imports_no_framework() -> None:
    code = "import inference, sys; print(any(m.startswith(('pydantic_ai', 'langchain')) for m in sys.modules))"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "False"

