"""Tool calling in process (issue 24), on llama.cpp and Transformers + PEFT with the same tiny models and adapter.

The tiny models' own template is plain ChatML (no tool support); a Hermes/Qwen-style template with tools
(:data:`~inference.testing.tiny_models.TOOLS_CHATML_TEMPLATE`) is passed as ``chat_template`` where a test needs one.
Checked: forced calls (``"required"`` and a named tool) always parse and validate, sampled 50 times on each backend;
whole and streamed; the conversation that answers a call renders the call and its result (the same tokens as the
text Transformers' ``apply_chat_template`` renders, on both backends, so both read the same prompt); ``"auto"`` on a
template without tool support is refused naming the model, and the provider keeps serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field

from inference import GenerationResult
from inference.exceptions import UnsupportedOperationError
from inference.provider import InferenceProvider
from inference.testing.tiny_models import TOOLS_CHATML_TEMPLATE
from inference.tools import tool_definition

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

pytest.importorskip("llama_cpp")
pytest.importorskip("peft")

FORECAST = {  # small: the tiny models' context is 512 tokens, and their 512-token vocabulary spells JSON slowly
    "type": "function",
    "function": {
        "name": "forecast",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,7}$"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,  # else a sampled call may add keys until max_tokens
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}}, "required": ["zone"],
                       "additionalProperties": False},
    },
}
TOOLS = [FORECAST, TIME]
NAMED = {"type": "function", "function": {"name": "time"}}
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(params=["llamacpp", "transformers"])
async def provider(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any], tmp_path: Path
) -> AsyncIterator[InferenceProvider]:
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.transformers_provider import TransformersProvider

    model = tiny_models["qwen2"]
    chosen: InferenceProvider
    if request.param == "llamacpp":
        chosen = LlamaCppProvider(model.gguf_path, n_ctx=512, adapter_cache_dir=tmp_path, kv_cache_type="f32")
    else:
        chosen = TransformersProvider(model_name=str(model.hf_dir), device="cpu")
    await chosen.load_adapter("a0", model.adapter_dirs["a0"])
    yield chosen
    await chosen.aclose()


def assert_valid_call(result: GenerationResult, names: set[str]) -> None:
    assert result.finish_reason == "tool_calls", result
    assert result.text == ""
    (call,) = result.tool_calls or ()
    assert call.error is None, call
    assert call.name in names
    tool = next(tool for tool in TOOLS if tool["function"]["name"] == call.name)
    Draft202012Validator(tool["function"]["parameters"]).validate(call.arguments)
    assert call.id.startswith("call_")


@pytest.mark.parametrize("choice", ["required", "named"])
async def test_forced_calls_always_parse_and_validate_when_sampled(provider: InferenceProvider, choice: str) -> None:
    tool_choice: Any = NAMED if choice == "named" else "required"
    names = {"time"} if choice == "named" else {"forecast", "time"}
    results = await asyncio.gather(*(
        provider.generate(QUESTION, "m", adapter_id="a0" if seed % 2 else None, max_tokens=100, temperature=1.0,
                          seed=seed, tools=TOOLS, tool_choice=tool_choice, chat_template=TOOLS_CHATML_TEMPLATE)
        for seed in range(50)
    ))
    for result in results:
        assert_valid_call(result, names)
    calls = [(result.tool_calls or ())[0] for result in results]
    assert len({call.raw_arguments for call in calls}) > 1  # sampled, not one answer
    assert {call.name for call in calls} == names  # "required" lets the model choose the tool


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern="^[A-Z][a-z]{1,5}$")


class Trip(BaseModel):  # a model holding another: its parameters refer to #/$defs/City
    model_config = ConfigDict(extra="forbid")
    origin: City
    days: int = Field(ge=1, le=7)


TRIP = tool_definition(Trip)
_TURNS = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}assistant: "
SHORT_TEMPLATES = {  # each reads tools but renders none of them (the tiny models' context is 512 tokens)
    "hermes": "{% if tools %}Call a tool in <tool_call></tool_call>.\n{% endif %}" + _TURNS,
    "mistral": "{% if tools %}Call tools after [TOOL_CALLS].\n{% endif %}" + _TURNS,
    "json": '{% if tools %}Call a tool as {"name": ..., "parameters": ...}.\n{% endif %}' + _TURNS,
}


@pytest.mark.parametrize("template", list(SHORT_TEMPLATES))
@pytest.mark.parametrize("choice", ["required", "named"])
async def test_a_forced_call_of_a_tool_whose_parameters_refer_to_definitions_validates(
    provider: InferenceProvider, template: str, choice: str
) -> None:
    """A pydantic model holding another (``$defs`` and ``$ref``): its parameters were nested in the call's schema
    with their references left pointing at the root, and the grammar did not compile (an InvalidRequestError about a
    json_schema the user never gave)."""
    tool_choice: Any = {"type": "function", "function": {"name": "Trip"}} if choice == "named" else "required"
    results = await asyncio.gather(*(
        provider.generate(QUESTION, "m", max_tokens=120, temperature=1.0, seed=seed, tools=[TRIP, TIME],
                          tool_choice=tool_choice, chat_template=SHORT_TEMPLATES[template])
        for seed in range(2)
    ))
    for result in results:
        (call,) = result.tool_calls or ()
        assert result.finish_reason == "tool_calls" and call.error is None, result
        tool = TRIP if call.name == "Trip" else TIME
        Draft202012Validator(tool["function"]["parameters"]).validate(call.arguments)
    assert choice == "required" or {(result.tool_calls or ())[0].name for result in results} == {"Trip"}


async def test_a_forced_call_streams_no_text_and_ends_with_the_call(provider: InferenceProvider) -> None:
    events = [event async for event in provider.stream(
        QUESTION, "m", max_tokens=100, temperature=0, tools=[TIME], tool_choice=NAMED,
        chat_template=TOOLS_CHATML_TEMPLATE,
    )]
    *pieces, final = events
    assert pieces == [] and isinstance(final, GenerationResult)
    assert_valid_call(final, {"time"})
    whole = await provider.generate(QUESTION, "m", max_tokens=100, temperature=0, tools=[TIME], tool_choice=NAMED,
                                    chat_template=TOOLS_CHATML_TEMPLATE)
    assert whole.tool_calls is not None and final.tool_calls is not None
    assert whole.tool_calls[0].arguments == final.tool_calls[0].arguments


async def test_a_model_without_tool_support_refuses_auto_but_takes_a_forced_call(provider: InferenceProvider) -> None:
    with pytest.raises(UnsupportedOperationError, match=r"chat template of tiny-qwen2 has no tool support"):
        await provider.generate(QUESTION, "m", max_tokens=8, tools=TOOLS)
    forced = await provider.generate(QUESTION, "m", max_tokens=100, temperature=0, tools=TOOLS, tool_choice=NAMED)
    assert_valid_call(forced, {"time"})
    with pytest.raises(UnsupportedOperationError, match="json_schema cannot be combined with tools"):
        await provider.generate(QUESTION, "m", max_tokens=8, tools=TOOLS, tool_choice="required",
                                json_schema={"type": "object"})
    assert (await provider.generate("hello", "m", max_tokens=4, temperature=0)).token_count > 0  # still serving


async def test_auto_with_a_tool_template_answers_free_text_or_calls(provider: InferenceProvider) -> None:
    result = await provider.generate(QUESTION, "m", max_tokens=12, temperature=0, tools=[FORECAST],
                                     chat_template=TOOLS_CHATML_TEMPLATE)
    none = await provider.generate(QUESTION, "m", max_tokens=12, temperature=0, tools=[FORECAST], tool_choice="none",
                                   chat_template=TOOLS_CHATML_TEMPLATE)
    plain = await provider.generate(QUESTION, "m", max_tokens=12, temperature=0, chat_template=TOOLS_CHATML_TEMPLATE)
    assert none.text == plain.text and none.tool_calls is None  # "none" renders no tools
    assert result.prompt_tokens is not None and plain.prompt_tokens is not None
    assert result.prompt_tokens > plain.prompt_tokens + 50  # the tools' descriptions were rendered
    assert result.tool_calls is None or result.finish_reason == "tool_calls"


async def test_the_tool_result_round_trips_into_the_next_turn(
    provider: InferenceProvider, tiny_models: dict[str, Any]
) -> None:
    import transformers

    first = await provider.generate(QUESTION, "m", max_tokens=100, temperature=0, tools=[FORECAST],
                                    tool_choice="required", chat_template=TOOLS_CHATML_TEMPLATE)
    assert first.tool_calls is not None
    call = first.tool_calls[0]
    conversation = [*QUESTION, first.as_message(), call.answer({"sky": "sunny", "high": 24})]
    answer = await provider.generate(conversation, "m", max_tokens=8, temperature=0, tools=[FORECAST],
                                     chat_template=TOOLS_CHATML_TEMPLATE, return_token_ids=True)

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_models["qwen2"].hf_dir)
    as_templates_read_it = [
        *QUESTION,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        ]},
        {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": '{"sky": "sunny", "high": 24}'},
    ]
    checked = [tool_definition(FORECAST)]  # as every backend receives it ("description": "" filled in)
    text = tokenizer.apply_chat_template(as_templates_read_it, tools=checked, chat_template=TOOLS_CHATML_TEMPLATE,
                                         tokenize=False, add_generation_prompt=True)
    assert '<tool_response>\n{"sky": "sunny", "high": 24}\n</tool_response>' in text
    assert f'"name": "{call.name}", "arguments": ' in text
    raw = await provider.generate(text, "m", max_tokens=8, temperature=0, raw_prompt=True, return_token_ids=True)
    assert (answer.prompt_tokens, answer.token_ids) == (raw.prompt_tokens, raw.token_ids)  # it read that text
    expected_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert answer.prompt_tokens == len(expected_ids)


async def test_the_same_conversation_with_tools_reads_the_same_tokens_on_both_backends(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.transformers_provider import TransformersProvider

    model = tiny_models["qwen2"]
    call = {"id": "call_1", "type": "function", "function": {"name": "time", "arguments": '{"zone": "CET"}'}}
    conversation = [
        {"role": "system", "content": "Be brief. <Ünïcode> & 'quotes'"},
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    async with (
        LlamaCppProvider(model.gguf_path, n_ctx=512, adapter_cache_dir=tmp_path, kv_cache_type="f32") as llamacpp,
        TransformersProvider(model_name=str(model.hf_dir), device="cpu") as hf,
    ):
        answers = [
            await provider.generate(conversation, "m", max_tokens=12, temperature=0, tools=[TIME], tool_choice="none",
                                    chat_template=TOOLS_CHATML_TEMPLATE, return_token_ids=True)
            for provider in (llamacpp, hf)
        ]
        forced = [
            await provider.generate(conversation, "m", max_tokens=100, temperature=0, tools=[TIME],
                                    tool_choice="required", chat_template=TOOLS_CHATML_TEMPLATE, return_token_ids=True)
            for provider in (llamacpp, hf)
        ]
    assert answers[0].prompt_tokens == answers[1].prompt_tokens
    assert answers[0].token_ids == answers[1].token_ids
    assert forced[0].prompt_tokens == forced[1].prompt_tokens
    assert forced[0].token_ids == forced[1].token_ids
    assert forced[0].tool_calls is not None and forced[1].tool_calls is not None
    assert forced[0].tool_calls[0].arguments == forced[1].tool_calls[0].arguments
