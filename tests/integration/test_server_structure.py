"""Conversations, token logprobs and JSON schemas through the HTTP providers, against a real
``python -m llama_cpp.server`` on loopback (the session's ``llama_server`` fixture)."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from inference.openai_provider import OpenAIProvider
from inference.provider import GenerationResult
from inference.vllm_provider import VLLMProvider

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen2"  # llama_cpp.server serves one model whatever the name

# No free-text string: llama_cpp.server's grammar (llama_cpp/llama_grammar.py, rule "char" = [^"\\]) lets raw
# control characters into JSON strings, which strict JSON parsers refuse; an enum keeps the test about the schema.
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "enum": ["Ann", "Bob"]}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("provider_class", [VLLMProvider, OpenAIProvider])
async def test_a_message_list_reaches_the_chat_template(llama_server: str, provider_class: type) -> None:
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Tell me more"},
    ]
    async with provider_class(base_url=llama_server) as provider:
        as_list = await provider.generate(conversation, model=MODEL, max_tokens=4, temperature=0.0)
        same_as_system_prompt = await provider.generate(
            [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"}],
            model=MODEL,
            max_tokens=4,
            temperature=0.0,
        )
        with_system_prompt = await provider.generate(
            "Hello", model=MODEL, max_tokens=4, temperature=0.0, system_prompt="You are terse."
        )
    assert as_list.prompt_tokens > with_system_prompt.prompt_tokens  # the whole conversation was read
    assert same_as_system_prompt.text == with_system_prompt.text
    assert same_as_system_prompt.prompt_tokens == with_system_prompt.prompt_tokens


async def test_token_logprobs_come_with_generate_and_stream(llama_server: str) -> None:
    async with VLLMProvider(base_url=llama_server) as provider:
        result = await provider.generate("Hello", model=MODEL, max_tokens=5, temperature=0.0, logprobs=3)
        events = [
            event async for event in provider.stream("Hello", model=MODEL, max_tokens=5, temperature=0.0, logprobs=3)
        ]
        plain = await provider.generate("Hello", model=MODEL, max_tokens=5, temperature=0.0)
    assert plain.logprobs is None
    assert result.logprobs is not None and len(result.logprobs) == result.completion_tokens
    assert "".join(entry.token for entry in result.logprobs) == result.text
    for entry in result.logprobs:
        assert entry.logprob <= 0.0 and math.isfinite(entry.logprob)
        assert 1 <= len(entry.top_logprobs) <= 3
        values = [value for _, value in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        # greedy: the chosen token is the most likely one
        assert entry.top_logprobs[0][0] == entry.token and entry.top_logprobs[0][1] == pytest.approx(entry.logprob)
    final = events[-1]
    assert isinstance(final, GenerationResult) and final.logprobs is not None
    assert [entry.token for entry in final.logprobs] == [entry.token for entry in result.logprobs]
    assert [entry.logprob for entry in final.logprobs] == pytest.approx([entry.logprob for entry in result.logprobs])


@pytest.mark.parametrize("provider_class", [VLLMProvider, OpenAIProvider])
async def test_json_schema_output_parses_and_validates(llama_server: str, provider_class: type) -> None:
    async with provider_class(base_url=llama_server) as provider:
        result = await provider.generate(
            "Describe a person as JSON", model=MODEL, max_tokens=64, temperature=0.0, json_schema=PERSON
        )
        events = [
            event
            async for event in provider.stream(
                "Describe a person as JSON", model=MODEL, max_tokens=64, temperature=0.0, json_schema=PERSON
            )
        ]
    assert result.finish_reason == "stop", f"the JSON did not finish in 64 tokens: {result.text!r}"
    jsonschema.validate(json.loads(result.text), PERSON)
    final = events[-1]
    assert isinstance(final, GenerationResult) and final.text == result.text
