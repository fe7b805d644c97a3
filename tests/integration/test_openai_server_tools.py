"""Tools through the openai provider on a real ``python -m llama_cpp.server`` (issue 24's tool loop on that server).

llama-cpp-python's server constrains a named ``tool_choice`` with a grammar built from the tool's parameters and
answers ``tool_calls``; it ignores ``"required"`` (a free text comes back), which the SDK refuses to pass off as an
answer (with one tool, ``"required"`` is sent as that tool named); its streamed calls repeat the tool's name in every
piece, which the SDK reads as one name. (Its grammar lets a sampled string hold raw control characters, which JSON
refuses: the SDK reports such a call with its error, so the tool here takes no free string.)
"""

from __future__ import annotations

import asyncio

import pytest
from jsonschema import Draft202012Validator

from inference.exceptions import ProviderError
from inference.openai_provider import OpenAIProvider
from inference.provider import GenerationResult

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen2"  # llama_cpp.server serves one model whatever the name
TIME = {
    "type": "function",
    "function": {"name": "time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}, "dst": {"type": "boolean"}},
        "required": ["zone"], "additionalProperties": False}},
}
NAMED = {"type": "function", "function": {"name": "time"}}
QUESTION = [{"role": "user", "content": "What time is it?"}]


async def test_a_named_call_always_parses_and_validates_when_sampled(llama_server: str) -> None:
    async with OpenAIProvider(base_url=llama_server, api_key="sk-local") as provider:
        results = await asyncio.gather(*(
            provider.generate(QUESTION, model=MODEL, max_tokens=60, temperature=1.0, seed=seed, tools=[TIME],
                              tool_choice=NAMED)
            for seed in range(50)
        ))
    for result in results:
        assert result.finish_reason == "tool_calls"
        (call,) = result.tool_calls or ()
        assert (call.name, call.error) == ("time", None)
        Draft202012Validator(TIME["function"]["parameters"]).validate(call.arguments)
    assert len({(result.tool_calls or ())[0].raw_arguments for result in results}) > 1


async def test_a_streamed_named_call_has_its_name_once(llama_server: str) -> None:
    async with OpenAIProvider(base_url=llama_server, api_key="sk-local") as provider:
        *pieces, final = [event async for event in provider.stream(
            QUESTION, model=MODEL, max_tokens=60, temperature=0, tools=[TIME], tool_choice=NAMED)]
        whole = await provider.generate(QUESTION, model=MODEL, max_tokens=60, temperature=0, tools=[TIME],
                                        tool_choice=NAMED)
    assert isinstance(final, GenerationResult) and "".join(str(piece) for piece in pieces) == ""
    (call,) = final.tool_calls or ()
    assert (call.name, call.error) == ("time", None)
    assert whole.tool_calls is not None and call.arguments == whole.tool_calls[0].arguments


async def test_required_with_one_tool_is_that_tool_and_with_several_ignored_by_the_server_is_an_error(
    llama_server: str,
) -> None:
    """"required" with one tool is sent as that tool named (LangChain's with_structured_output binds one tool with
    "required": llama_cpp.server ignored it, and every such call failed); with several, the server still ignores it."""
    date = {"type": "function", "function": {"name": "date", "parameters": {"type": "object", "properties": {}}}}
    async with OpenAIProvider(base_url=llama_server, api_key="sk-local") as provider:
        one = await provider.generate(QUESTION, model=MODEL, max_tokens=60, temperature=0, tools=[TIME],
                                      tool_choice="required")
        (call,) = one.tool_calls or ()
        assert (call.name, call.error, one.finish_reason) == ("time", None, "tool_calls")
        with pytest.raises(ProviderError, match="answered without a tool call although tool_choice='required'"):
            await provider.generate(QUESTION, model=MODEL, max_tokens=8, temperature=0, tools=[TIME, date],
                                    tool_choice="required")
        assert (await provider.generate("Hello", model=MODEL, max_tokens=3, temperature=0)).text  # still serving


async def test_the_tool_result_reaches_the_next_turn(llama_server: str) -> None:
    async with OpenAIProvider(base_url=llama_server, api_key="sk-local") as provider:
        first = await provider.generate(QUESTION, model=MODEL, max_tokens=60, temperature=0, tools=[TIME],
                                        tool_choice=NAMED)
        assert first.tool_calls is not None
        call = first.tool_calls[0]

        async def prompt_tokens(result: str) -> int:
            answer = await provider.generate([*QUESTION, first.as_message(), call.answer(result)], model=MODEL,
                                             max_tokens=2, temperature=0, tools=[TIME])
            assert answer.prompt_tokens is not None
            return answer.prompt_tokens

        short, longer = await prompt_tokens("12:00"), await prompt_tokens("12:00 and it is sunny in Paris today")
    # the server's template renders the tool message's content: a longer result is a longer prompt
    assert longer > short
