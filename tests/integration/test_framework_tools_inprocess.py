"""The agent frameworks on llama.cpp in process (issue 24 item 3), with the real packages and the tiny Qwen2: a
pydantic-ai ``Agent`` with a structured ``output_type`` (its output tool, forced) and LangChain's
``with_structured_output`` and a named tool, each answered with a call the model made under the tool's schema.

The tiny model's own template has no tool support, so these are the forced calls (the model sees no tool
descriptions; the call is constrained to the schema); an agent whose model may choose ("auto") needs a template that
renders tools (tests/integration/test_inprocess_tools.py). The unit tests run the same on the fake provider.
LangChain also gets each of ``n`` completions with its logprobs and token ids from the real model, and structured
output constrained as ``json_schema`` and JSON mode.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from inference.provider import InferenceProvider

pytestmark = [pytest.mark.integration]

pytest.importorskip("llama_cpp")
pytest.importorskip("pydantic_ai")
pytest.importorskip("langchain_core")


class Forecast(BaseModel):
    """The forecast the agent reports (bounded: a random tiny model writes it)."""

    model_config = ConfigDict(extra="forbid")

    city: str = Field(pattern=r"^[A-Z][a-z]{1,7}$")
    high: int = Field(ge=-40, le=50)


@pytest.fixture
async def llamacpp(tiny_models: dict[str, Any], tmp_path: Path) -> AsyncIterator[InferenceProvider]:
    from inference.llamacpp_provider import LlamaCppProvider

    model = tiny_models["qwen2"]
    async with LlamaCppProvider(model.gguf_path, n_ctx=512, adapter_cache_dir=tmp_path) as provider:
        await provider.load_adapter("a0", model.adapter_dirs["a0"])
        yield provider


async def test_a_pydantic_ai_agent_returns_structured_output_from_llamacpp(llamacpp: InferenceProvider) -> None:
    from pydantic_ai import Agent

    from inference.integrations.pydantic_ai import InferenceModel

    agent = Agent(InferenceModel(llamacpp, "tiny", adapter_id="a0"), output_type=Forecast)
    for seed in range(3):
        result = await agent.run("Weather in Paris?", model_settings={"max_tokens": 80, "temperature": 1.0,
                                                                      "seed": seed})
        assert isinstance(result.output, Forecast)
    async with agent.run_stream("Weather in Rome?", model_settings={"max_tokens": 80, "temperature": 0}) as run:
        assert isinstance(await run.get_output(), Forecast)


async def test_langchain_structured_output_and_a_named_tool_on_llamacpp(llamacpp: InferenceProvider) -> None:
    from inference.integrations.langchain import ChatInference

    get_time = {  # a dict: LangChain's conversion of a function drops additionalProperties, so a sampled call
        # may add keys until max_tokens (then it is an invalid_tool_call, reported with its error)
        "type": "function",
        "function": {"name": "get_time", "description": "The time in a time zone.", "parameters": {
            "type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}}, "required": ["zone"],
            "additionalProperties": False}},
    }
    chat = ChatInference(provider=llamacpp, model="tiny", max_tokens=80, temperature=0)
    assert isinstance(await chat.with_structured_output(Forecast).ainvoke("Weather in Oslo?"), Forecast)
    named = await chat.bind_tools([get_time], tool_choice="get_time").ainvoke("What time is it?")
    (call,) = named.tool_calls
    assert call["name"] == "get_time" and call["args"]["zone"] in ("CET", "UTC")


async def test_langchain_structured_output_as_json_schema_and_json_mode_on_llamacpp(
    llamacpp: InferenceProvider,
) -> None:
    """``method="json_schema"`` and ``"json_mode"`` were forced tool calls: now the text is constrained (llguidance)
    to the schema, or to a JSON object, and parsed; nothing is sent as a tool."""
    from inference.integrations.langchain import ChatInference

    chat = ChatInference(provider=llamacpp, model="tiny", max_tokens=80, temperature=1.0)
    for seed in range(3):
        structured = chat.with_structured_output(Forecast, method="json_schema", include_raw=True)
        answer = await structured.ainvoke("Weather in Oslo?", seed=seed)
        assert isinstance(answer["parsed"], Forecast), answer
        assert not answer["raw"].tool_calls and Forecast.model_validate_json(answer["raw"].text) == answer["parsed"]
    for seed in range(3):  # any JSON object: a random model may write one until max_tokens cuts it
        json_mode = chat.with_structured_output(method="json_mode", include_raw=True)
        answer = await json_mode.ainvoke("JSON, please.", seed=seed)
        assert answer["raw"].text.startswith("{") and not answer["raw"].tool_calls
        if answer["raw"].response_metadata["finish_reason"] == "stop":
            assert isinstance(answer["parsed"], dict), answer


async def test_langchain_gets_every_completion_of_llamacpp_with_its_logprobs_and_token_ids(
    llamacpp: InferenceProvider,
) -> None:
    """``n``, ``logprobs`` and ``return_token_ids`` were answered by llama.cpp and dropped by ChatInference: now each
    completion is a generation whose ``response_metadata`` holds its token ids and its logprobs in ChatOpenAI's
    shape."""
    from langchain_core.messages import HumanMessage

    from inference.integrations.langchain import ChatInference

    chat = ChatInference(provider=llamacpp, model="tiny", max_tokens=12, temperature=1.0, seed=1)
    result = await chat.agenerate([[HumanMessage("Hello")]], n=2, logprobs=2, return_token_ids=True)
    (generations,) = result.generations
    assert len(generations) == 2 and generations[0].text != generations[1].text
    for generation in generations:
        metadata = generation.message.response_metadata
        content = metadata["logprobs"]["content"]
        assert len(content) == len(metadata["token_ids"]) > 0
        assert all(len(entry["top_logprobs"]) == 2 and entry["logprob"] <= 0 for entry in content)
        for entry in content:  # a token that ends inside a character has no bytes to give (its text shows U+FFFD)
            assert entry["bytes"] == (None if "\ufffd" in entry["token"] else list(entry["token"].encode()))
        assert await llamacpp.detokenize(metadata["token_ids"], "tiny") == generation.text
