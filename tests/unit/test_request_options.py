"""The request options that users of the openai client, LiteLLM and pydantic-ai type on day one, on the fake provider
and in the base class: ``n``, the OpenAI penalties, ``min_p``, ``logit_bias``, ``raw_prompt``, the template switches,
``thinking``, ``response_format``, ``extra_body``, ``timeout``, and results that are an engine's error or abort."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar, get_args, get_origin, get_type_hints

import pytest

from inference import FakeProvider
from inference._core.validation import GenerationRequest
from inference.exceptions import (
    AdapterNotFoundError,
    InvalidRequestError,
    ProviderError,
    ProviderTimeoutError,
    TokenLimitError,
)
from inference.options import ByRequests, GenerationOptions, OptionMap, RequestOptions
from inference.results import GenerationResult, StreamEvent


class Recording(FakeProvider):
    """A fake that keeps every request its backend receives."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.requests: list[GenerationRequest] = []

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        return await super()._generate(request)


# n ----------------------------------------------------------------------------------------------------------------


async def test_n_greedy_gives_n_equal_texts_and_sampled_with_a_seed_is_reproducible() -> None:
    fake = FakeProvider()
    greedy = await fake.generate("Write a line.", "m", temperature=0, n=4)
    assert greedy.choices is not None and len(greedy.choices) == 4
    assert len({choice.text for choice in greedy.choices}) == 1
    sampled = await fake.generate("Write a line.", "m", temperature=0.8, seed=7, n=4)
    again = await fake.generate("Write a line.", "m", temperature=0.8, seed=7, n=4)
    assert sampled == again
    assert sampled.choices is not None and len({choice.text for choice in sampled.choices}) == 4


async def test_n_results_are_the_first_choice_with_the_token_counts_added_up() -> None:
    fake = FakeProvider()
    single = await fake.generate("Write a line.", "m", temperature=0.8, seed=7, max_tokens=50)
    result = await fake.generate("Write a line.", "m", temperature=0.8, seed=7, n=3, max_tokens=50)
    assert result.choices is not None
    assert result.choices[0] == single and single.choices is None  # the first choice is the answer to n=1
    assert (result.text, result.finish_reason) == (single.text, single.finish_reason)
    assert result.completion_tokens == sum(choice.completion_tokens for choice in result.choices)
    assert result.prompt_tokens == single.prompt_tokens  # the prompt, counted once
    assert result.token_count == result.prompt_tokens + result.completion_tokens
    assert all(choice.choices is None for choice in result.choices)
    # choice k is seeded seed + k, as on every backend (migrating.md): the choices of n single requests
    seeded = [await fake.generate("Write a line.", "m", temperature=0.8, seed=7 + k, max_tokens=50) for k in range(3)]
    assert [choice.text for choice in result.choices] == [one.text for one in seeded]


async def test_each_choice_is_kept_to_the_json_schema_and_named_by_the_adapter_asked_for() -> None:
    fake = FakeProvider()
    await fake.load_adapter("style", "/adapters/style")
    await fake.load_adapter("style", "/adapters/style-2", replace=True)  # served under its versioned name
    schema = {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}
    result = await fake.generate("Hi", "m", adapter_id="style", json_schema=schema, n=3, temperature=1)
    assert result.choices is not None
    assert [choice.adapter_id for choice in result.choices] == ["style"] * 3
    assert all(set(json.loads(choice.text)) == {"word"} for choice in result.choices)


class ByRequestsFake(Recording):
    """A backend without a native n: the base class sends n requests of one completion each."""

    options: ClassVar[OptionMap] = {**FakeProvider.options, "n": ByRequests()}


async def test_n_by_requests_sends_n_seeded_requests_at_once() -> None:
    provider = ByRequestsFake()
    result = await provider.generate("Hi", "m", temperature=0.8, seed=5, n=3)
    assert [(request.n, request.seed) for request in provider.requests] == [(1, 5), (1, 6), (1, 7)]
    assert result.choices is not None
    assert [choice.text for choice in result.choices] == [
        (await FakeProvider().generate("Hi", "m", temperature=0.8, seed=seed)).text for seed in (5, 6, 7)
    ]
    assert result.completion_tokens == sum(choice.completion_tokens for choice in result.choices)
    provider.requests.clear()
    await provider.generate("Hi", "m", n=2)
    assert [request.seed for request in provider.requests] == [None, None]  # each samples on its own


async def test_n_by_requests_fails_as_one_call_and_stops_the_other_requests() -> None:
    hanging: list[int] = []
    both_hang = asyncio.Event()
    cancelled: list[int] = []

    class OneFails(ByRequestsFake):
        async def _generate(self, request: GenerationRequest) -> GenerationResult:
            if request.seed == 1:
                await both_hang.wait()  # fail while the two others are in flight
                raise ProviderError("the engine failed", provider=self.name)
            hanging.append(request.seed or 0)
            if len(hanging) == 2:
                both_hang.set()
            try:
                await asyncio.Event().wait()  # never answers
            except asyncio.CancelledError:
                cancelled.append(request.seed or 0)
                raise
            raise AssertionError("unreachable")

    provider = OneFails()
    with pytest.raises(ProviderError, match="the engine failed"):
        await provider.generate("Hi", "m", seed=0, n=3)
    assert sorted(cancelled) == [0, 2]  # stopped, not left running
    assert (await FakeProvider().generate("Hi", "m")).text  # and the provider goes on


async def test_stream_refuses_n_above_one() -> None:
    with pytest.raises(InvalidRequestError, match="stream yields the pieces of one completion, and n is 2"):
        async for _ in FakeProvider().stream("Hi", "m", n=2):
            pass


def test_from_choices_of_one_is_that_result_and_of_none_is_an_error() -> None:
    one = GenerationResult("a", "m", None, 3, "stop", prompt_tokens=2, completion_tokens=1)
    assert GenerationResult.from_choices([one]) is one
    with pytest.raises(ValueError, match="at least one"):
        GenerationResult.from_choices([])
    unknown = GenerationResult("b", "m", None, None, "length", prompt_tokens=None, completion_tokens=4)
    joined = GenerationResult.from_choices([unknown, one])
    assert (joined.text, joined.finish_reason, joined.completion_tokens, joined.token_count) == ("b", "length", 5, None)


# Sampling options on the fake -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "other"),
    [
        ("presence_penalty", 0.5, -0.5),
        ("frequency_penalty", 1.0, 2.0),
        ("min_p", 0.05, 0.1),
        ("logit_bias", {7: -100}, {7: 100}),
        ("chat_template", "{{ messages[0].content }}", "{{ messages }}"),
        ("chat_template_kwargs", {"enable_thinking": False}, {"enable_thinking": True}),
        ("extra_body", {"priority": 1}, {"priority": 2}),
        ("raw_prompt", True, None),
    ],
)
async def test_the_fake_answers_each_option_deterministically(name: str, value: Any, other: Any) -> None:
    fake = FakeProvider()
    plain = await fake.generate("Tell me a story.", "m", max_tokens=30)
    first = await fake.generate("Tell me a story.", "m", max_tokens=30, **{name: value})
    assert first == await fake.generate("Tell me a story.", "m", max_tokens=30, **{name: value})
    assert first.text != plain.text
    assert (await fake.generate("Tell me a story.", "m", max_tokens=30, **{name: other})).text != first.text


async def test_options_left_unset_keep_the_fakes_answers() -> None:
    fake = FakeProvider()
    unset = {name: None for name in ("presence_penalty", "frequency_penalty", "min_p", "logit_bias", "raw_prompt",
                                     "chat_template", "chat_template_kwargs", "thinking", "extra_body", "timeout")}
    assert await fake.generate("hi", "m", max_tokens=3, **unset) == await fake.generate("hi", "m", max_tokens=3)
    default = await fake.generate("hi", "m", max_tokens=3)
    assert await fake.generate("hi", "m", max_tokens=3, raw_prompt=False) == default


async def test_logit_bias_ids_are_checked_against_the_vocabulary_where_the_tokenizer_is_at_hand() -> None:
    fake = FakeProvider()
    with pytest.raises(TokenLimitError, match="259"):
        await fake.generate("Hi", "m", logit_bias={"300": -100})
    result = await fake.generate("Hi", "m", logit_bias={"7": -100})  # JSON's string keys: ids
    assert result == await fake.generate("Hi", "m", logit_bias={7: -100.0})


def test_logit_bias_takes_a_dict_keyed_by_int_and_one_keyed_by_str_for_type_checkers() -> None:
    """A ``dict[int, float]`` or ``dict[str, float]`` variable type-checks only against a union member with its own
    key type (Mapping's key type is invariant: ``Mapping[int | str, float]`` refused both)."""
    hint = get_type_hints(RequestOptions)["logit_bias"]
    members = [member for member in get_args(hint) if member is not type(None)]
    assert all(get_origin(member) is Mapping and get_args(member)[1] is float for member in members), hint
    assert {get_args(member)[0] for member in members} >= {int, str}
    # What each key type means at run time is unchanged: ids as integers or as decimal strings.
    assert GenerationOptions.from_arguments(provider="fake", logit_bias={"7": -100}).logit_bias == {7: -100.0}


async def test_thinking_puts_made_up_reasoning_beside_the_text() -> None:
    fake = FakeProvider()
    plain = await fake.generate("Why?", "m")
    thought = await fake.generate("Why?", "m", thinking=True)
    assert thought.text == plain.text and thought.completion_tokens == plain.completion_tokens
    assert thought.reasoning is not None and thought.reasoning.startswith("Thinking: ")
    assert plain.reasoning is None and (await fake.generate("Why?", "m", thinking=False)).reasoning is None
    with pytest.raises(InvalidRequestError, match=r"thinking=False and chat_template_kwargs\['enable_thinking'\]"):
        await fake.generate("Why?", "m", thinking=False, chat_template_kwargs={"enable_thinking": True})


# response_format ----------------------------------------------------------------------------------------------------


async def test_response_format_is_json_schema_in_openais_shape() -> None:
    provider = Recording()
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    openai_shape = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    result = await provider.generate("Hi", "m", response_format=openai_shape)
    assert set(json.loads(result.text)) == {"answer"}
    await provider.generate("Hi", "m", json_schema=schema)
    assert provider.requests[0] == provider.requests[1]  # the same request as json_schema=
    assert provider.requests[0].response_format is None


async def test_response_format_json_object_is_any_json_object_and_text_is_nothing() -> None:
    provider = Recording()
    result = await provider.generate("Hi", "m", response_format={"type": "json_object"})
    assert isinstance(json.loads(result.text), dict)
    assert provider.requests[-1].json_schema == {"type": "object"}
    await provider.generate("Hi", "m", response_format={"type": "text"})
    assert provider.requests[-1].json_schema is None


async def test_response_format_takes_a_pydantic_model_as_the_openai_clients_parse() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Answer(pydantic.BaseModel):
        answer: str

    result = await FakeProvider().generate("Hi", "m", response_format=Answer)
    assert Answer.model_validate_json(result.text).answer


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"type": "xml"}, "response_format must be OpenAI's"),
        ("json_object", "response_format must be OpenAI's"),
        ({"type": "json_schema"}, r"response_format\['json_schema'\] must be a dict with the schema under 'schema'"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}, "x": 1}}, "'schema'"),
        ({"type": "json_object", "schema": {}}, "has keys that OpenAI's"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}, r"\['json_schema'\]\['schema'\]"),
    ],
)
def test_a_response_format_that_is_not_openais_is_refused_with_the_shapes(value: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        GenerationOptions.from_arguments(provider="test", response_format=value)


def test_response_format_and_json_schema_are_one_or_the_other() -> None:
    with pytest.raises(InvalidRequestError, match="json_schema and response_format both constrain the output"):
        GenerationOptions.from_arguments(
            provider="test", json_schema={"type": "object"}, response_format={"type": "json_object"}
        )


# raw_prompt ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"prompt": [{"role": "user", "content": "Hi"}]}, "a list of messages"),
        ({"system_prompt": "Be brief."}, "system_prompt"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),
        ({"thinking": True}, "thinking"),
    ],
)
async def test_a_raw_prompt_refuses_what_only_a_chat_template_carries(arguments: dict[str, Any], message: str) -> None:
    call = {"prompt": "Hi", **arguments}
    with pytest.raises(InvalidRequestError, match=f"raw_prompt .* cannot be combined with {message}"):
        await FakeProvider().generate(call.pop("prompt"), "m", raw_prompt=True, **call)


async def test_the_providers_raw_prompt_setting_is_the_default_of_every_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    off = await FakeProvider(raw_prompt=False).generate("Hi", "m")
    assert off.text == (await FakeProvider().generate("Hi", "m")).text
    provider = Recording(raw_prompt=True)
    await provider.generate("Hi", "m")
    await provider.generate("Hi", "m", raw_prompt=False)
    assert [request.raw_prompt for request in provider.requests] == [True, False]
    with pytest.raises(InvalidRequestError, match="the provider's raw_prompt setting"):
        await provider.generate([{"role": "user", "content": "Hi"}], "m")
    assert (await provider.generate([{"role": "user", "content": "Hi"}], "m", raw_prompt=False)).text
    monkeypatch.setenv("FAKE_RAW_PROMPT", "true")
    from_environment = Recording()
    await from_environment.generate("Hi", "m")
    assert from_environment.requests[-1].raw_prompt is True


async def test_template_options_do_not_go_with_token_ids() -> None:
    from inference.tokens import TokenIds

    with pytest.raises(InvalidRequestError, match="chat_template_kwargs cannot be combined with a TokenIds prompt"):
        await FakeProvider().generate(TokenIds([1, 72]), "m", chat_template_kwargs={"x": 1})


# timeout ------------------------------------------------------------------------------------------------------------


class Hanging(FakeProvider):
    """A backend that never answers, and records that it was cancelled (after ``pieces`` stream pieces)."""

    def __init__(self, pieces: int = 0) -> None:
        super().__init__()
        self.pieces = pieces
        self.cancelled = 0
        self.hang = True

    async def _wait(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        if self.hang:
            await self._wait()
        return await super()._generate(request)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        for index in range(self.pieces):
            yield f"piece {index} "
        await self._wait()
        yield await super()._generate(request)  # pragma: no cover - never reached


async def test_timeout_cancels_the_call_with_a_provider_timeout_error_naming_it() -> None:
    provider = Hanging()
    with pytest.raises(ProviderTimeoutError, match=r"Hanging did not finish within timeout=0.05 s") as caught:
        await provider.generate("Hi", "m", timeout=0.05)
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, asyncio.TimeoutError)
    assert provider.cancelled == 1  # the backend's call was cancelled, not left running
    provider.hang = False
    assert (await provider.generate("Hi", "m", timeout=30)).text  # the provider goes on
    results = await provider.generate_batch(["a", "b"], "m", timeout=30)
    assert all(isinstance(result, GenerationResult) for result in results)


async def test_a_stream_times_out_while_it_waits_for_the_backend_and_stops_it() -> None:
    provider = Hanging(pieces=2)
    pieces: list[str] = []
    with pytest.raises(ProviderTimeoutError, match=r"timeout=0\.5"):
        async for event in provider.stream("Hi", "m", timeout=0.5):
            assert isinstance(event, str)
            pieces.append(event)
    assert pieces == ["piece 0 ", "piece 1 "] and provider.cancelled == 1


async def test_a_stream_timeout_never_cancels_the_consumers_own_code() -> None:
    provider = FakeProvider()
    events = provider.stream("Hi", "m", timeout=0.5)
    first = await events.__anext__()
    await asyncio.sleep(1.0)  # the consumer's own slow work: not cancelled, though the deadline passes meanwhile
    with pytest.raises(ProviderTimeoutError):
        await events.__anext__()  # the next wait for the backend is past the deadline
    assert isinstance(first, str)


async def test_a_call_with_a_timeout_holds_its_adapter_as_any_call_and_lets_it_go() -> None:
    provider = FakeProvider()
    await provider.load_adapter("style", "/adapters/style")
    pieces = [event async for event in provider.stream("Hi", "m", adapter_id="style", timeout=30)]
    assert isinstance(pieces[-1], GenerationResult) and pieces[-1].adapter_id == "style"
    assert (await provider.generate("Hi", "m", adapter_id="style", timeout=30, n=2)).adapter_id == "style"
    stats = provider.adapter_stats().get("style")
    assert stats is not None and stats.in_flight == 0
    await provider.unload_adapter("style")  # nothing holds it: returns at once


async def test_the_backends_own_timeout_error_passes_unchanged() -> None:
    class ServerTimeout(FakeProvider):
        async def _generate(self, request: GenerationRequest) -> GenerationResult:
            raise ProviderTimeoutError("the server did not answer within 120 s", provider=self.name)

    with pytest.raises(ProviderTimeoutError, match="the server did not answer within 120 s"):
        await ServerTimeout().generate("Hi", "m", timeout=30)


# finish_reason ------------------------------------------------------------------------------------------------------


class Aborting(FakeProvider):
    """A backend that reports an abort as a finish reason."""

    reason = "abort"

    def _answer(self, request: GenerationRequest) -> GenerationResult:  # generate's and stream's
        result = super()._answer(request)
        return GenerationResult(result.text, result.model, None, 3, self.reason, 1, 2)


async def test_a_finish_reason_of_an_abort_or_error_is_a_provider_error_never_a_text() -> None:
    provider = Aborting()
    with pytest.raises(ProviderError, match="finish_reason 'abort' \\(an engine error or an abort\\)"):
        await provider.generate("Hi", "m")
    with pytest.raises(ProviderError, match="'abort'"):
        async for _ in provider.stream("Hi", "m"):
            pass
    (item,) = await provider.generate_batch(["Hi"], "m")
    assert isinstance(item, ProviderError)
    provider.reason = "length"
    assert (await provider.generate("Hi", "m")).finish_reason == "length"


# the first version's catch clauses --------------------------------------------------------------------------------


async def test_except_value_error_still_catches_an_adapter_that_is_not_loaded() -> None:
    """The SDK's first version raised ValueError for an adapter that was not loaded (llama.cpp, Transformers)."""
    try:
        await FakeProvider().generate("def hello", model="ignored", adapter_id="never-loaded")
    except ValueError as error:
        assert isinstance(error, AdapterNotFoundError) and isinstance(error, LookupError)
    else:  # pragma: no cover
        raise AssertionError("no error")
