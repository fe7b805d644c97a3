"""No option is silently dropped: every provider declares how its backend receives each option, or refuses it.

The declarations (``InferenceProvider.options``) are checked three ways: every registered provider declares every
option (a new option fails here until each provider maps or refuses it); a refused option is an
``UnsupportedOperationError`` naming the providers that can, before the backend is called; and each server
provider's request body carries every option it declares under the field it names.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar, get_type_hints

import httpx
import pytest
import respx

from inference._core.validation import GenerationRequest
from inference.exceptions import UnsupportedOperationError
from inference.fake_provider import FakeProvider
from inference.options import (
    POSITIONAL_OPTIONS,
    RESPONSE_FORMAT_AS_JSON_SCHEMA,
    TIMEOUT_IN_BASE_CLASS,
    ByRequests,
    GenerationOptions,
    OptionMap,
    Refused,
    RequestOptions,
    Sent,
)
from inference.provider import InferenceProvider
from inference.registry import PROVIDERS, load_provider_class, providers_sending
from inference.results import GenerationResult, StreamEvent

EVERY_OPTION: dict[str, Any] = {
    "max_tokens": 7,
    "system_prompt": "Be brief.",
    "temperature": 0.5,
    "top_p": 0.9,
    "repetition_penalty": 1.1,
    "stop": ["END"],
    "seed": 11,
    "top_k": 5,
    "logprobs": 2,
    "json_schema": {"type": "object"},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "auto",
    "return_token_ids": True,
    "n": 2,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "min_p": 0.05,
    "logit_bias": {7: -100},
    "raw_prompt": False,
    "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
    "chat_template_kwargs": {"enable_thinking": False},
    "thinking": False,
    "response_format": {"type": "text"},
    "extra_body": {"priority": 3},
    "timeout": 30,
}


_TWO_REQUESTS = (
    {name: value for name, value in EVERY_OPTION.items() if name != "json_schema"},
    {"json_schema": EVERY_OPTION["json_schema"], "logprobs": 2},
)
"""Every option over two requests: ``stop`` is not applied with a ``json_schema`` (the JSON decides the end)."""


def test_the_test_sets_every_option() -> None:
    assert set(EVERY_OPTION) == set(GenerationOptions.names())


def _provider_classes() -> list[tuple[str, type[InferenceProvider]]]:
    classes = []
    for name in PROVIDERS:
        try:
            classes.append((name, load_provider_class(name)))
        except ImportError:  # vllm-offline's class needs vLLM, which lives in .venv-vllm: checked there
            continue
    return classes


@pytest.mark.parametrize(("name", "cls"), _provider_classes(), ids=lambda value: getattr(value, "__name__", value))
def test_every_provider_maps_or_refuses_every_option(name: str, cls: type[InferenceProvider]) -> None:
    declared = dict(cls.options)
    missing = [option for option in GenerationOptions.names() if option not in declared]
    assert not missing, f"{cls.__name__}.options neither maps nor refuses {missing}"
    assert set(declared) == set(GenerationOptions.names()), f"{cls.__name__}.options names no option: {declared}"
    for option, how in declared.items():
        assert isinstance(how, (Sent, Refused)), (cls.__name__, option, how)
        assert (how.field if isinstance(how, Sent) else how.reason).strip(), (cls.__name__, option)
    assert cls.supports_logprobs is isinstance(declared["logprobs"], Sent)
    assert cls.supports_json_schema is isinstance(declared["json_schema"], Sent)
    assert cls.supports_tools is isinstance(declared["tools"], Sent)


def test_the_keyword_options_are_the_options_that_are_not_positional() -> None:
    assert list(RequestOptions.__annotations__) == [
        name for name in GenerationOptions.names() if name not in POSITIONAL_OPTIONS
    ]
    assert get_type_hints(RequestOptions)  # every annotation resolves


@pytest.mark.parametrize("method", ["generate", "stream", "generate_batch"])
def test_each_method_lists_every_option_once_in_its_signature(method: str) -> None:
    parameters = inspect.signature(getattr(InferenceProvider, method)).parameters
    assert [name for name in parameters if name in GenerationOptions.names()] == list(GenerationOptions.names())
    for name in RequestOptions.__annotations__:
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY and parameters[name].default is None


class _NoTopK(FakeProvider):
    """A provider whose backend cannot take top_k (and that records whether its backend was reached)."""

    options: ClassVar[OptionMap] = {
        **FakeProvider.options,
        "top_k": Refused("this backend samples without a top-k filter"),
    }

    def __init__(self) -> None:
        super().__init__()
        self.reached = 0

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self.reached += 1
        return await super()._generate(request)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        self.reached += 1
        async for event in super()._stream(request):
            yield event


async def test_a_refused_option_names_the_option_its_reason_and_who_can_before_anything_is_sent() -> None:
    provider = _NoTopK()
    with pytest.raises(UnsupportedOperationError) as caught:
        await provider.generate("Hi", model="m", top_k=3)
    message = str(caught.value)
    assert "top_k" in message and "without a top-k filter" in message
    assert "providers that can: " in message and "fake" in message.split("providers that can: ")[1]
    with pytest.raises(UnsupportedOperationError, match="top_k"):
        async for _ in provider.stream("Hi", model="m", top_k=3):
            pass
    results = await provider.generate_batch(["a", "b"], model="m", top_k=3)
    assert all(isinstance(result, UnsupportedOperationError) for result in results)
    assert provider.reached == 0
    assert (await provider.generate("Hi", model="m", top_k=None, max_tokens=2)).text  # left unset: fine
    assert provider.reached == 1


async def test_an_option_a_provider_does_not_declare_is_refused_not_dropped() -> None:
    class Undeclared(FakeProvider):
        options: ClassVar[OptionMap] = {name: how for name, how in FakeProvider.options.items() if name != "seed"}

    with pytest.raises(UnsupportedOperationError, match=r"seed \(Undeclared.options does not declare it\)"):
        await Undeclared().generate("Hi", model="m", seed=3)


async def test_a_name_that_is_no_option_is_a_type_error_with_a_suggestion() -> None:
    provider = FakeProvider()
    with pytest.raises(TypeError, match=r"generate\(\) got an unexpected keyword argument 'top_n' \(did you mean"):
        await provider.generate("Hi", model="m", top_n=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"generate_batch\(\) got an unexpected keyword argument 'sed'"):
        await provider.generate_batch(["Hi"], model="m", sed=3)  # type: ignore[call-arg]


def test_providers_sending_lists_who_receives_an_option() -> None:
    assert "fake" in providers_sending("top_k")
    assert providers_sending("no_such_option") == []


BEFORE_THE_BACKEND = (TIMEOUT_IN_BASE_CLASS, RESPONSE_FORMAT_AS_JSON_SCHEMA)
"""Declarations of options the base class handles before the backend: nothing of them is in a request body."""


@pytest.mark.parametrize(("name", "cls"), _provider_classes(), ids=lambda value: getattr(value, "__name__", value))
def test_timeout_and_response_format_are_the_base_class_s_for_every_provider(
    name: str, cls: type[InferenceProvider]
) -> None:
    if name == "fallback":
        return  # passes every option on to its providers
    assert cls.options["timeout"] == TIMEOUT_IN_BASE_CLASS
    json_schema = cls.options["json_schema"]
    if isinstance(json_schema, Sent):
        assert cls.options["response_format"] == RESPONSE_FORMAT_AS_JSON_SCHEMA
    else:
        assert isinstance(cls.options["response_format"], Refused)


def _sent_by(cls: type[InferenceProvider], options: dict[str, Any]) -> dict[str, Any]:
    """The ``options`` the provider class declares it sends (a refused one is refused before anything is sent)."""
    return {name: value for name, value in options.items() if isinstance(cls.options[name], Sent)}


def _at(body: dict[str, Any], path: str) -> Any:
    value: Any = body
    for part in path.split("."):
        assert isinstance(value, dict) and part in value, f"{path} is not in the request body {json.dumps(body)}"
        value = value[part]
    return value


_CHAT_ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "{}"},
            "finish_reason": "stop",
            "logprobs": {"content": [{"token": "{}", "logprob": -0.1, "top_logprobs": []}]},
            "token_ids": [90],  # vLLM's answer to return_token_ids (the others ignore the field they are not sent)
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def _chat_answer(request: httpx.Request) -> httpx.Response:
    """:data:`_CHAT_ANSWER` with as many choices as the body's ``n`` asks (vLLM's and OpenAI's answer to ``n``)."""
    n = json.loads(request.content).get("n", 1)
    choices = [{**_CHAT_ANSWER["choices"][0], "index": index} for index in range(n)]
    usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
    return httpx.Response(200, json={**_CHAT_ANSWER, "choices": choices, "usage": usage})


@pytest.mark.parametrize("provider_type", ["vllm", "openai", "llamacpp-server"])
@respx.mock
async def test_an_openai_compatible_body_carries_every_option_under_its_declared_field(provider_type: str) -> None:
    base = "http://127.0.0.1:9/v1" if provider_type != "llamacpp-server" else "http://127.0.0.1:9"
    root = base if base.endswith("/v1") else f"{base}/v1"
    chat = respx.post(f"{root}/chat/completions").mock(side_effect=_chat_answer)
    respx.get(f"{base}/lora-adapters").mock(return_value=httpx.Response(200, json=[]))
    respx.get(f"{base}/props").mock(  # llama-server: a chat template, so the chat route
        return_value=httpx.Response(200, json={"chat_template": "{{ messages }}", "model_path": "/models/m.gguf"})
    )
    respx.get(f"{root}/models").mock(  # llama-server's meta: its vocabulary, which logit_bias's ids are checked against
        return_value=httpx.Response(200, json={"object": "list", "data": [
            {"id": "m", "object": "model", "meta": {"n_vocab": 16, "n_ctx": 512}}]})
    )
    respx.post(f"{base.removesuffix('/v1')}/tokenize").mock(return_value=httpx.Response(200, json={"tokens": [1]}))
    respx.post(f"{base}/apply-template").mock(  # llama-server: it renders with Jinja (template variables are read)
        return_value=httpx.Response(200, json={"prompt": "x"})
    )
    respx.post(f"{base.removesuffix('/v1')}/detokenize").mock(return_value=httpx.Response(200, json={"content": ""}))
    every = [{"id": token, "token": "a", "bytes": [97], "logprob": -2.77} for token in range(16)]
    respx.post(f"{root}/completions").mock(return_value=httpx.Response(200, json={"choices": [{  # every probability
        "text": "a", "index": 0, "finish_reason": "length",
        "logprobs": {"content": [{"id": 1, "token": "a", "bytes": [97], "logprob": -2.77, "top_logprobs": every}]}}]}))
    cls = load_provider_class(provider_type)
    kwargs: dict[str, Any] = {"base_url": base}
    if provider_type == "vllm":
        kwargs["api"] = "chat"
    provider = cls(**kwargs)
    try:
        bodies = []
        for options in _TWO_REQUESTS:  # stop does not go with json_schema: each in a request of its own
            await provider.generate("Hi", model="m", **_sent_by(cls, options))
            bodies.append(json.loads(chat.calls.last.request.content))
    finally:
        await provider.aclose()
    by_requests = isinstance(cls.options["n"], ByRequests)
    for option, how in cls.options.items():
        if isinstance(how, (Refused, ByRequests)) or how in BEFORE_THE_BACKEND:
            continue  # n by requests: the base class sends n requests (the seeds below)
        body = bodies[1] if option == "json_schema" else bodies[0]
        if option == "extra_body":  # merged into the body
            assert body["priority"] == EVERY_OPTION["extra_body"]["priority"], provider_type
            continue
        if option == "return_token_ids":  # a flag: the answer's token_ids come back (vLLM's request field)
            assert _at(body, how.field) is True, provider_type
            continue
        if option == "raw_prompt":  # False: the chat route, with messages (True: /v1/completions, tested live)
            assert "messages" in body, provider_type
            continue
        sent = _at(body, how.field)
        if option == "n":  # the server's own n: one request for both choices
            assert sent == EVERY_OPTION["n"] and len(chat.calls) == 2, (provider_type, sent)
            continue
        if option == "seed" and by_requests:  # n=2 as two requests: seeds 11 and 12, in either order
            assert sent in (EVERY_OPTION["seed"], EVERY_OPTION["seed"] + 1), (provider_type, sent)
        elif option == "logit_bias":
            assert sent == {"7": -100}, (provider_type, sent)  # ids as decimal strings, OpenAI's form
        elif option in ("max_tokens", "temperature", "top_p", "repetition_penalty", "seed", "top_k", "min_p",
                        "presence_penalty", "frequency_penalty", "chat_template", "chat_template_kwargs", "thinking"):
            assert sent == EVERY_OPTION[option], (provider_type, option, sent)
    assert bodies[0]["messages"][0] == {"role": "system", "content": "Be brief."}


@respx.mock
async def test_the_ollama_body_carries_every_option_under_its_declared_field() -> None:
    base = "http://127.0.0.1:9"
    chat = respx.post(f"{base}/api/chat").mock(
        return_value=httpx.Response(
            200,
            json={
                "model": "m",
                "message": {"role": "assistant", "content": "{}"},
                "done": True,
                "done_reason": "stop",
                "prompt_eval_count": 3,
                "eval_count": 1,
                "logprobs": [{"token": "{}", "logprob": -0.1, "top_logprobs": []}],
            },
        )
    )
    cls = load_provider_class("ollama")
    provider = cls(base_url=f"{base}/v1")
    try:
        bodies = []
        for options in _TWO_REQUESTS:
            await provider.generate("Hi", model="m", **_sent_by(cls, options))
            bodies.append(json.loads(chat.calls.last.request.content))
    finally:
        await provider.aclose()
    for option, how in cls.options.items():
        if not isinstance(how, Sent) or isinstance(how, ByRequests) or how in BEFORE_THE_BACKEND:
            continue
        body = bodies[1] if option == "json_schema" else bodies[0]
        if option == "extra_body":  # merged into the body
            assert body["priority"] == EVERY_OPTION["extra_body"]["priority"]
        elif option == "raw_prompt":  # False: /api/chat with messages (True: /api/generate, test_ollama_options.py)
            assert "messages" in body and "raw" not in body
        else:
            _at(body, how.field)
    assert bodies[0]["options"]["repeat_penalty"] == 1.1 and bodies[0]["options"]["num_predict"] == 7
