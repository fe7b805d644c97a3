"""The public surface of scores and structure, checked the same for every provider (on the fake)."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel

import inference
from inference import FakeProvider, InvalidRequestError, ScoreResult, TokenLogprob, UnsupportedOperationError
from inference.ollama_provider import OllamaProvider

SYSTEM, USER = "Answer in one word.", "What colour is the sky?"


async def test_a_system_and_user_message_list_is_the_same_request_as_system_prompt() -> None:
    fake = FakeProvider()
    as_messages = await fake.generate(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], model="m", max_tokens=5
    )
    as_text = await fake.generate(USER, model="m", system_prompt=SYSTEM, max_tokens=5)
    assert as_messages == as_text


async def test_a_conversation_reaches_the_backend_turn_by_turn() -> None:
    conversation = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And at night?"},
    ]
    fake = FakeProvider()
    full = await fake.generate(conversation, model="m")
    shorter = await fake.generate(conversation[:2], model="m")
    assert full.text != shorter.text
    results = await fake.generate_batch([conversation, USER], model="m")
    assert results[0] == full and isinstance(results[1], inference.GenerationResult)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "empty list of messages"),
        ([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}], r"prompt\[1\] has role 'robot'"),
        ([{"role": "user", "content": 3}], r"prompt\[0\] must have string 'content'"),
        (["hi"], r"prompt\[0\] must be a dict"),
        ([{"role": "user", "content": "hi", "name": "bob"}], r"prompt\[0\] has keys \['name'\]"),
        ([{"role": "user", "content": "\ud800"}], r"prompt\[0\]\.content holds"),
        (3, "prompt must be a string or a list of messages"),
    ],
)
async def test_a_malformed_message_list_names_the_message(prompt: Any, message: str) -> None:
    fake = FakeProvider()
    with pytest.raises(InvalidRequestError, match=message):
        await fake.generate(prompt, model="m")
    assert (await fake.generate("still serving", model="m")).text


async def test_messages_and_system_prompt_together_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="put the system prompt in the list"):
        await FakeProvider().generate([{"role": "user", "content": USER}], model="m", system_prompt=SYSTEM)


async def test_one_conversation_passed_as_the_batch_is_refused_with_the_fix() -> None:
    with pytest.raises(InvalidRequestError, match=r"pass a list of prompts, \[messages\]"):
        await FakeProvider().generate_batch([{"role": "user", "content": USER}], model="m")  # type: ignore[list-item]


async def test_logprobs_come_back_per_token_only_when_asked() -> None:
    fake = FakeProvider()
    assert (await fake.generate(USER, model="m")).logprobs is None
    result = await fake.generate(USER, model="m", logprobs=3)
    assert result.logprobs is not None and "".join(entry.token for entry in result.logprobs) == result.text
    for entry in result.logprobs:
        assert isinstance(entry, TokenLogprob) and entry.logprob <= 0
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0] == (entry.token, entry.logprob)
        assert [value for _, value in entry.top_logprobs] == sorted((v for _, v in entry.top_logprobs), reverse=True)
    streamed = [event async for event in fake.stream(USER, model="m", logprobs=0)]
    final = streamed[-1]
    assert isinstance(final, inference.GenerationResult) and final.logprobs is not None
    assert all(entry.top_logprobs == () for entry in final.logprobs)


@pytest.mark.parametrize("value", [-1, 21, 2.0, True, "3"])
async def test_logprobs_out_of_range_is_refused(value: Any) -> None:
    with pytest.raises(InvalidRequestError, match=r"logprobs must be an integer in 0\.\.20"):
        await FakeProvider().generate(USER, model="m", logprobs=value)


class Pet(BaseModel):
    name: str
    kind: Literal["cat", "dog"]
    age: int


SCHEMAS: list[Any] = [
    Pet,
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}}, "required": ["n"]},
    {"type": "array", "items": {"enum": ["red", "green"]}, "minItems": 2},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["pydantic", "bounded-integer", "array-of-enum"])
async def test_json_schema_output_parses_and_validates(schema: Any) -> None:
    result = await FakeProvider().generate(USER, model="m", json_schema=schema)
    as_dict = schema.model_json_schema() if isinstance(schema, type) else schema
    jsonschema.validate(json.loads(result.text), as_dict)
    assert result.finish_reason == "stop"


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "objectx"}, "not a valid JSON schema"),
        ({"type": "object", "properties": {"a": {"minimum": "one"}}}, "not a valid JSON schema"),
        ("{}", "must be a JSON-schema dict or a pydantic model class"),
        ({"default": object()}, "must be JSON"),
    ],
)
async def test_a_schema_that_is_not_json_schema_is_refused_before_generating(schema: Any, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        await FakeProvider().generate(USER, model="m", json_schema=schema)


async def test_score_sums_token_logprobs_and_score_batch_keeps_order_and_errors_in_place() -> None:
    fake = FakeProvider()
    one = await fake.score("The sky is", " blue today", model="m")
    assert isinstance(one, ScoreResult) and one.num_tokens == 2 and one.logprob < 0
    assert one.nll_per_token == pytest.approx(-one.logprob / 2)
    results = await fake.score_batch([("The sky is", " blue today"), ("x", ""), ("a", " b")], model="m")
    assert results[0] == one
    assert isinstance(results[1], InvalidRequestError) and "continuation is empty" in str(results[1])
    assert isinstance(results[2], ScoreResult)
    assert (await fake.score_rolling("The sky is blue", model="m")).num_tokens == 4


async def test_score_on_a_provider_that_cannot_names_the_ones_that_can() -> None:
    ollama = OllamaProvider(base_url="http://127.0.0.1:9")
    assert not ollama.supports_scoring
    for call in (ollama.score("a", "b", model="m"), ollama.score_rolling("a", model="m")):
        with pytest.raises(UnsupportedOperationError, match=r"providers that can: .*fake"):
            await call
    with pytest.raises(UnsupportedOperationError, match="supports_scoring"):
        await ollama.score_batch([("a", "b")], model="m")


async def test_score_with_an_adapter_holds_it_like_a_generation() -> None:
    fake = FakeProvider()
    await fake.load_adapter("style", "/adapters/style")
    base = await fake.score("a", " b c", model="m")
    styled = await fake.score("a", " b c", model="m", adapter_id="style")
    assert styled.adapter_id == "style" and styled.logprob != base.logprob
    with pytest.raises(inference.AdapterNotFoundError):
        await fake.score("a", " b", model="m", adapter_id="missing")
