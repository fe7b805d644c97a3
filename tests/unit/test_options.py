"""Generation options are defined once (``inference.options``) and reach every place that takes them."""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import inference
from inference._core.validation import GenerationRequest
from inference.cli import build_parser, main
from inference.evaluation import GENERATION_KEYS, EvalPrompt, evaluate_adapters, generation_settings
from inference.evaluation.identity import UNRECORDED_SETTINGS
from inference.exceptions import InvalidRequestError
from inference.fake_provider import FakeProvider
from inference.options import OPTIONS, POSITIONAL_OPTIONS, GenerationOptions
from inference.provider import GenerationResult, InferenceProvider, StreamEvent

EVERY_OPTION_SET: dict[str, Any] = {
    "max_tokens": 7,
    "system_prompt": "Be brief.",
    "temperature": 0.5,
    "top_p": 0.9,
    "repetition_penalty": 1.1,
    "stop": ["END", "STOP"],
    "seed": 11,
    "top_k": 5,
    "logprobs": 2,
    "json_schema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    "tools": [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "Look a word up.", "parameters": {"type": "object"}},
        }
    ],
    "tool_choice": "none",
    "return_token_ids": True,
    "n": 1,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.25,
    "min_p": 0.05,
    "logit_bias": {7: -100.0, 42: 2.5},
    "raw_prompt": False,
    "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
    "chat_template_kwargs": {"enable_thinking": True},
    "thinking": True,
    "response_format": {"type": "text"},
    "extra_body": {"priority": 3},
    "timeout": 30.0,
}
"""A value for every option; on the command line, ``json_schema``, ``tools`` and ``chat_template`` are files holding
them, and the dicts JSON text. ``response_format`` ``text`` asks for no JSON (so it goes with ``json_schema``), and
``n`` is 1: ``stream`` and the evaluation rows take one completion."""

AS_CHECKED = {"response_format": None}
"""What the checks make of values in :data:`EVERY_OPTION_SET` that they change: ``response_format`` is mapped to
``json_schema`` (``text``: to nothing)."""


def command_line_value(name: str, value: Any, directory: Path) -> str:
    """``value`` as the command line gives it: a schema, tools or a template are the path of a file that holds them,
    a dict its JSON text."""
    if name == "chat_template":
        path = directory / "template.jinja"
        path.write_text(value)
        return str(path)
    if name not in ("json_schema", "tools"):
        return json.dumps(value) if isinstance(value, dict) else str(value)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(value))
    return str(path)


def as_json(values: dict[str, Any]) -> Any:
    """``values`` as JSON reads them back (dict keys as strings)."""
    return json.loads(json.dumps(values))


class RecordingProvider(FakeProvider):
    """A fake provider that keeps every request it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[GenerationRequest] = []

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        return await super()._generate(request)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        async for event in super()._stream(request):
            yield event


def test_the_test_sets_every_option() -> None:
    assert list(EVERY_OPTION_SET) == list(GenerationOptions.names()) == list(OPTIONS)


@pytest.mark.parametrize("method", ["generate", "stream", "generate_batch"])
def test_public_signatures_list_exactly_the_options_with_their_defaults(method: str) -> None:
    parameters = inspect.signature(getattr(InferenceProvider, method)).parameters
    taken = [name for name in parameters if name in GenerationOptions.names()]
    assert taken == list(GenerationOptions.names())
    defaults = {name: parameters[name].default for name in taken}
    assert GenerationOptions.from_arguments(provider="test", **defaults) == GenerationOptions()


def test_from_arguments_normalises_what_backends_read() -> None:
    options = GenerationOptions.from_arguments(provider="test", temperature=0, stop="END", top_p=1)
    assert (options.temperature, options.top_p, options.stop, options.is_greedy) == (0.0, 1.0, ("END",), True)
    assert isinstance(options.temperature, float)
    assert GenerationOptions.from_arguments(provider="test") == GenerationOptions()
    assert GenerationOptions().max_tokens == 4096
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("max_tokens", 0, "max_tokens must be a positive integer, got 0"),
        ("max_tokens", True, "max_tokens must be a positive integer, got True"),
        ("system_prompt", 3, "system_prompt must be a string or None, got int"),
        ("temperature", -1, "temperature must be a number in [0, 100] or None, got -1"),
        ("temperature", float("nan"), "temperature must be a number in [0, 100]"),
        ("top_p", 0, "top_p must be a number in (0, 1] or None, got 0"),
        ("repetition_penalty", 0, "repetition_penalty must be a number in (0, 100] or None"),
        ("stop", ["a", ""], "stop must be a non-empty string or a list of non-empty strings"),
        ("stop", ["a", "\ud800"], "stop[1] holds"),
        ("seed", 1.5, "seed must be an integer or None, got 1.5"),
        ("top_k", -1, "top_k must be a non-negative integer or None, got -1"),
        ("return_token_ids", 1, "return_token_ids must be True or False, got 1"),
        ("n", 0, "n must be an integer in 1..128 (how many completions to return), got 0"),
        ("n", 129, "n must be an integer in 1..128"),
        ("presence_penalty", 2.5, "presence_penalty must be a number in [-2, 2] or None, got 2.5"),
        ("frequency_penalty", -3, "frequency_penalty must be a number in [-2, 2] or None, got -3"),
        ("min_p", 1.5, "min_p must be a number in [0, 1] or None, got 1.5"),
        ("logit_bias", {7: 101}, "logit_bias must map token ids (non-negative integers) to biases in [-100, 100]"),
        ("logit_bias", {"x": 1}, "got 'x': 1"),
        ("logit_bias", {-1: 1}, "got -1: 1"),
        ("logit_bias", [7], "logit_bias must map token ids to biases, such as {50256: -100}, got list"),
        ("raw_prompt", "yes", "raw_prompt must be True, False or None (the default), got 'yes'"),
        ("thinking", 1, "thinking must be True, False or None (the default), got 1"),
        ("chat_template", "", "chat_template must be a Jinja chat template (a non-empty string) or None"),
        ("chat_template_kwargs", {1: 2}, "chat_template_kwargs must be a dict with string keys"),
        ("chat_template_kwargs", {"x": float("nan")}, "chat_template_kwargs must hold JSON"),
        ("extra_body", ["priority"], "extra_body must be a dict with string keys"),
        ("extra_body", {"x": object()}, "extra_body must hold JSON"),
        ("response_format", {"type": "yaml"}, "response_format must be OpenAI's"),
        ("timeout", 0, "timeout must be a positive number of seconds or None (no limit), got 0"),
        ("timeout", float("inf"), "timeout must be a positive number of seconds"),
        ("timeout", True, "timeout must be a positive number of seconds"),
    ],
)
def test_each_rule_names_the_option_and_the_provider(name: str, value: object, message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        GenerationOptions.from_arguments(provider="test", **{name: value})
    assert message in str(caught.value)
    assert caught.value.provider == "test"


def test_an_unknown_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="top_n"):
        GenerationOptions.from_arguments(provider="test", top_n=3)


def test_the_request_is_the_options_plus_prompt_model_and_adapter() -> None:
    request = GenerationRequest.from_arguments(provider="test", prompt="Hi", model=None, **EVERY_OPTION_SET)
    assert isinstance(request, GenerationOptions)
    assert (request.prompt, request.model, request.adapter_id) == ("Hi", "", None)
    tools = tuple(EVERY_OPTION_SET["tools"])
    expected = {**EVERY_OPTION_SET, **AS_CHECKED, "stop": (), "tools": tools}  # no stop cuts the JSON
    assert request.as_arguments() == expected
    without_schema = GenerationRequest.from_arguments(provider="test", prompt="Hi", model=None, stop=["END", "STOP"])
    assert without_schema.stop == ("END", "STOP")
    assert GenerationRequest("Hi", "m").max_tokens == 4096  # prompt and model stay positional
    with pytest.raises(InvalidRequestError, match="prompt must be a string"):
        GenerationRequest.from_arguments(provider="test", prompt=3, model="m", temperature=-1)


def test_generation_options_is_exported() -> None:
    assert inference.GenerationOptions is GenerationOptions
    assert "GenerationOptions" in inference.__all__


async def test_generate_stream_and_generate_batch_pass_every_option_to_the_backend() -> None:
    provider = RecordingProvider()
    expected = GenerationRequest.from_arguments(provider="fake", prompt="Hi", model="m", **EVERY_OPTION_SET)
    await provider.generate("Hi", "m", **EVERY_OPTION_SET)
    async for _ in provider.stream("Hi", "m", **EVERY_OPTION_SET):
        pass
    await provider.generate_batch(["Hi", "Hi"], "m", **EVERY_OPTION_SET)
    assert provider.requests == [expected] * 4
    positional = [EVERY_OPTION_SET[name] for name in ("max_tokens", "system_prompt", "temperature", "top_p")]
    keyword = {name: value for name, value in EVERY_OPTION_SET.items() if name not in POSITIONAL_OPTIONS}
    await provider.generate("Hi", "m", None, *positional, 1.1, **keyword)
    assert provider.requests[-1] == expected


EVAL_ARGUMENTS = ["eval", "--adapters", "a", "--prompts", "p", "--output", "o"]


@pytest.mark.parametrize("command", [["generate", "Hi"], EVAL_ARGUMENTS])
def test_the_command_line_has_a_flag_for_every_option(command: list[str], tmp_path: Path) -> None:
    flags = [OPTIONS[name].flag or f"--{name.replace('_', '-')}" for name in OPTIONS]
    argv = [*command]
    for name, flag in zip(OPTIONS, flags, strict=True):
        values = EVERY_OPTION_SET[name]
        for value in values if OPTIONS[name].repeatable else [values]:
            argv += [flag, command_line_value(name, value, tmp_path)]
    args = build_parser().parse_args(argv)
    assert as_json({name: getattr(args, name) for name in OPTIONS}) == as_json(EVERY_OPTION_SET)


def test_eval_takes_every_option_from_flags_or_set_into_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[GenerationRequest] = []
    answer = FakeProvider._answer

    def recording_answer(self: FakeProvider, request: GenerationRequest) -> GenerationResult:
        seen.append(request)
        return answer(self, request)

    monkeypatch.setattr(FakeProvider, "_answer", recording_answer)
    adapter = tmp_path / "style"
    adapter.mkdir()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "q1", "prompt": "Hi"}) + "\n"
        + json.dumps({"id": "q2", "prompt": "Hi", "system_prompt": "Own."}) + "\n"
    )
    output = tmp_path / "out.jsonl"
    argv = ["eval", "--adapters", str(adapter), "--prompts", str(prompts), "--output", str(output)]
    settings = [
        f"--set={name}={command_line_value(name, value, tmp_path)}"
        for name, value in EVERY_OPTION_SET.items()
        if name != "stop"
    ]
    settings += ["--set=stop=END", "--set=stop=STOP"]
    assert main([*argv, "--provider", "fake", "--no-progress", *settings]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines() if '"adapter_id": "style"' in line]
    recorded = {name: rows[0]["settings"][name] for name in OPTIONS if name not in UNRECORDED_SETTINGS}
    # the run's settings: no stop string with a json_schema; timeout and return_token_ids are no experiment settings
    expected = {**EVERY_OPTION_SET, **AS_CHECKED, "stop": []}
    assert recorded == as_json({name: value for name, value in expected.items() if name not in UNRECORDED_SETTINGS})
    assert not set(UNRECORDED_SETTINGS) & set(rows[0]["settings"])
    assert {(request.timeout, request.return_token_ids) for request in seen if request.adapter_id} == {(30.0, True)}
    # What the provider was asked, not its answers: the fake's one-word JSON answers for the two system prompts
    # can coincide, depending on the adapter's (temporary) path it hashes.
    systems = sorted((request.prompt, request.system_prompt) for request in seen if request.adapter_id)
    assert systems == [("Hi", "Be brief."), ("Hi", "Own.")]


async def test_the_runner_uses_its_system_prompt_only_for_prompts_without_one(tmp_path: Path) -> None:
    (tmp_path / "style").mkdir()
    prompts = [EvalPrompt("q1", "Hi"), EvalPrompt("q2", "Hi", system_prompt="Own.")]
    provider = RecordingProvider()
    config = {"provider": "fake", "system_prompt": "Run.", "max_tokens": 3}
    await evaluate_adapters([tmp_path / "style"], prompts, config, tmp_path / "out.jsonl", provider=provider)
    systems = sorted((request.prompt, request.system_prompt) for request in provider.requests if request.adapter_id)
    assert systems == [("Hi", "Own."), ("Hi", "Run.")]


def test_the_dict_options_are_copies_and_empty_ones_ask_nothing() -> None:
    body = {"priority": 3, "nested": {"a": [1, 2]}}
    options = GenerationOptions.from_arguments(provider="test", extra_body=body, chat_template_kwargs={}, logit_bias={})
    body["nested"]["a"].append(3)  # the caller's dict changes later: the request does not
    assert options.extra_body == {"priority": 3, "nested": {"a": [1, 2]}}
    assert (options.chat_template_kwargs, options.logit_bias) == (None, None)
    biases = GenerationOptions.from_arguments(provider="test", logit_bias={"42": 1, 7: -2}).logit_bias
    assert biases == {7: -2.0, 42: 1.0}


def test_n_above_one_is_refused_in_evaluation_rows() -> None:
    with pytest.raises(InvalidRequestError, match="n is 3, and an evaluation row records one completion"):
        generation_settings({"provider": "fake", "n": 3})
    assert generation_settings({"n": 1, "timeout": 5, "thinking": False})["timeout"] == 5.0


def test_an_evaluations_response_format_is_recorded_and_sent_as_the_json_schema_it_maps_to() -> None:
    settings = generation_settings({"response_format": {"type": "json_object"}})
    assert (settings["response_format"], settings["json_schema"]) == (None, {"type": "object"})


def test_runner_settings_are_model_and_every_option_checked() -> None:
    assert GENERATION_KEYS[0] == "model"
    assert GENERATION_KEYS[1:] == GenerationOptions.names()
    settings = generation_settings({"provider": "fake", "temperature": 0, "stop": "END", "n_ctx": 5})
    assert settings == {"model": "", "max_tokens": 256, "temperature": 0.0, "stop": ("END",)}
    with pytest.raises(InvalidRequestError, match="top_k must be"):
        generation_settings({"top_k": -2})


async def test_fake_provider_answers_with_every_option() -> None:
    async with FakeProvider() as fake:
        result = await fake.generate("Hi", "m", **EVERY_OPTION_SET)
    assert result.completion_tokens <= EVERY_OPTION_SET["max_tokens"]


def test_eval_stop_flags_add_to_the_stop_strings_given_with_set(tmp_path: Path) -> None:
    adapter = tmp_path / "style"
    adapter.mkdir()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "q1", "prompt": "Hi"}) + "\n")
    output = tmp_path / "out.jsonl"
    argv = ["eval", "--adapters", str(adapter), "--prompts", str(prompts), "--output", str(output)]
    assert main([*argv, "--provider", "fake", "--no-progress", "--set=stop=END", "--stop", "STOP"]) == 0
    row = json.loads(output.read_text().splitlines()[0])
    assert row["settings"]["stop"] == ["END", "STOP"]  # --stop did not drop the --set one


def test_numpy_numbers_are_numbers_and_come_out_as_python_ones() -> None:
    """A training loop's numbers are often numpy scalars: np.float32(0.7) is a temperature, np.int64(8) a count."""
    np = pytest.importorskip("numpy")
    options = GenerationOptions.from_arguments(
        provider="test", max_tokens=np.int64(8), temperature=np.float32(0.5), top_p=np.float64(0.9),
        seed=np.int32(3), top_k=np.uint8(5), logprobs=np.int16(2),
    )
    assert (options.max_tokens, options.temperature, options.top_p) == (8, 0.5, 0.9)
    assert (options.seed, options.top_k, options.logprobs) == (3, 5, 2)
    assert all(type(value) in (int, float) for value in (options.max_tokens, options.temperature, options.seed))
    with pytest.raises(InvalidRequestError, match="max_tokens must be a positive integer"):
        GenerationOptions.from_arguments(provider="test", max_tokens=np.bool_(True))
    with pytest.raises(InvalidRequestError, match="stop must be") as caught:
        GenerationOptions.from_arguments(provider="test", stop=["x"] * 200_000 + [""])
    assert len(str(caught.value)) < 400  # not 200,000 strings in one message
