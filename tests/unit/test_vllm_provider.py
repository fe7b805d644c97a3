"""VLLMProvider on the wire: exact request bodies, and every vLLM answer from backends.md mapped to its error.

The server's answers are the ones vLLM 0.33 gives: errors are ``{"error": {"message", "type", "param",
"code"}}`` with the HTTP status equal to ``code``; a route that does not exist (runtime LoRA updating off)
is FastAPI's ``404 {"detail": "Not Found"}``; adapter loading succeeds with ``200`` and a plain-text body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from inference import get_provider
from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    InvalidAdapterError,
    InvalidRequestError,
    ModelNotFoundError,
    ProtocolError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RuntimeLoRADisabledError,
    ServerAdapterAlreadyLoadedError,
    ServerAdapterNotFoundError,
    ServerInvalidAdapterError,
    ServerModelNotFoundError,
    ServerResponseError,
)
from inference.vllm_provider import VLLMProvider

BASE = "http://vllm.test:8100/v1"
CHAT = f"{BASE}/chat/completions"
LOAD = "http://vllm.test:8100/v1/load_lora_adapter"
UNLOAD = "http://vllm.test:8100/v1/unload_lora_adapter"
SECRET = "sk-vllm-secret-4242"
ROUTE_MISSING = {"detail": "Not Found"}


def vllm_error(status: int, message: str, error_type: str = "BadRequestError", param: str | None = None) -> Any:
    return httpx.Response(
        status, json={"error": {"message": message, "type": error_type, "param": param, "code": status}}
    )


def completion(
    text: str = "Hello there.",
    *,
    model: str = "base-model",
    finish_reason: str = "stop",
    prompt_tokens: int = 12,
    completion_tokens: int = 3,
) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
        },
    )


def sent(route: respx.Route) -> Any:
    return json.loads(route.calls.last.request.content)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.fixture
async def provider() -> AsyncIterator[VLLMProvider]:
    async with VLLMProvider(base_url=BASE, api_key=SECRET, max_retries=1) as vllm:
        yield vllm


async def generates(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    """The provider still works: a plain generation goes through."""
    mock.post(CHAT).mock(return_value=completion("still fine"))
    result = await provider.generate("Hi", model="base-model", max_tokens=8)
    assert result.text == "still fine"


# Generation -------------------------------------------------------------------------------------------


async def test_generate_sends_only_what_the_caller_set(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    await provider.generate("Hi", model="base-model")
    assert sent(route) == {
        "model": "base-model",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4096,
    }


async def test_generate_sends_every_parameter_the_caller_set(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    await provider.generate(
        "Hi",
        model="base-model",
        max_tokens=32,
        system_prompt="Be brief.",
        temperature=0.0,
        top_p=0.9,
        repetition_penalty=1.15,
        stop=["\n\n", "END"],
        seed=7,
        top_k=40,
    )
    assert sent(route) == {
        "model": "base-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 32,
        "temperature": 0.0,
        "top_p": 0.9,
        "stop": ["\n\n", "END"],
        "seed": 7,
        "repetition_penalty": 1.15,
        "top_k": 40,
    }
    assert route.calls.last.request.headers["authorization"] == f"Bearer {SECRET}"


async def test_single_stop_string_is_sent_as_a_list(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    await provider.generate("Hi", model="base-model", stop="END", top_k=0)
    assert sent(route)["stop"] == ["END"]
    assert sent(route)["top_k"] == 0  # 0 is a value the caller set, not "unset"


async def test_generate_parses_text_tokens_and_finish_reason(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(
        return_value=completion("one two", finish_reason="length", prompt_tokens=10, completion_tokens=2)
    )
    result = await provider.generate("Hi", model="base-model", max_tokens=2)
    assert (result.text, result.model, result.adapter_id) == ("one two", "base-model", None)
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (10, 2, 12)
    assert result.finish_reason == "length"


async def test_adapter_id_is_sent_as_the_model(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=completion("styled", model="style-a"))
    result = await provider.generate("Hi", model="base-model", adapter_id="style-a")
    assert sent(route)["model"] == "style-a"
    assert (result.text, result.model, result.adapter_id, result.finish_reason) == (
        "styled",
        "style-a",
        "style-a",
        "stop",
    )


async def test_no_api_key_sends_no_secret_and_shows_none(mock: respx.MockRouter) -> None:
    async with VLLMProvider(base_url=BASE) as vllm:
        route = mock.post(CHAT).mock(return_value=completion())
        load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
        await vllm.generate("Hi", model="base-model")
        await vllm.load_adapter("a1", "/adapters/a1")
        assert route.calls.last.request.headers["authorization"] == "Bearer EMPTY"
        assert "authorization" not in load.calls.last.request.headers
        assert "api_key=None" in repr(vllm)


async def test_invalid_arguments_never_reach_the_server(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    with pytest.raises(InvalidRequestError):
        await provider.generate("Hi", model="base-model", temperature=-1)
    with pytest.raises(InvalidRequestError):
        await provider.generate("Hi", model="base-model", adapter_id="../etc")
    assert route.call_count == 0
    await generates(provider, mock)


# Runtime LoRA -----------------------------------------------------------------------------------------


async def test_load_and_unload_post_the_exact_bodies(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    load = mock.post(LOAD).mock(
        return_value=httpx.Response(200, text="Success: LoRA adapter 'b-style' added successfully.")
    )
    unload = mock.post(UNLOAD).mock(
        return_value=httpx.Response(200, text="Success: LoRA adapter 'b-style' removed successfully.")
    )
    await provider.load_adapter("b-style", "/adapters/b")
    await provider.load_adapter("a-style", "/adapters/a")
    assert sent(load) == {"lora_name": "a-style", "lora_path": "/adapters/a"}
    assert load.calls.last.request.headers["content-type"] == "application/json"
    assert load.calls.last.request.headers["authorization"] == f"Bearer {SECRET}"
    assert await provider.list_adapters() == ["a-style", "b-style"]

    await provider.unload_adapter("b-style")
    assert sent(unload) == {"lora_name": "b-style"}
    assert await provider.list_adapters() == ["a-style"]


async def test_lora_routes_are_derived_from_a_base_url_without_v1(mock: respx.MockRouter) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    async with VLLMProvider(base_url="http://vllm.test:8100") as vllm:
        await vllm.load_adapter("a1", "/adapters/a1")
    assert load.call_count == 1


async def test_load_route_missing_means_runtime_lora_is_off(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=httpx.Response(404, json=ROUTE_MISSING))
    with pytest.raises(RuntimeLoRADisabledError) as caught:
        await provider.load_adapter("a1", "/adapters/a1")
    error = caught.value
    assert "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in str(error)
    assert BASE in str(error) and error.url == BASE and error.provider == "vllm"
    assert isinstance(error, httpx.HTTPStatusError) and isinstance(error, ServerResponseError)
    assert error.response.status_code == 404 and error.request.url == LOAD
    assert await provider.list_adapters() == []
    await generates(provider, mock)


async def test_unload_route_missing_means_runtime_lora_is_off(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(UNLOAD).mock(return_value=httpx.Response(404, json=ROUTE_MISSING))
    with pytest.raises(RuntimeLoRADisabledError, match="--enable-lora"):
        await provider.unload_adapter("a1")


async def test_load_already_loaded(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(
        side_effect=[
            httpx.Response(200, text="Success: LoRA adapter 'a1' added successfully."),
            vllm_error(
                400,
                "The lora adapter 'a1' has already been loaded. If you want to load the adapter in place, "
                "set 'load_inplace' to True.",
                "InvalidUserInput",
            ),
        ]
    )
    await provider.load_adapter("a1", "/adapters/a1")
    with pytest.raises(ServerAdapterAlreadyLoadedError) as caught:
        await provider.load_adapter("a1", "/adapters/other")
    error = caught.value
    assert isinstance(error, AdapterAlreadyLoadedError) and isinstance(error, httpx.HTTPStatusError)
    assert "already has an adapter named 'a1'" in str(error) and "unload it first" in str(error)
    assert error.status_code == 400
    assert await provider.list_adapters() == ["a1"]
    await generates(provider, mock)


async def test_load_path_without_adapter(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=vllm_error(404, "No adapter found for /adapters/missing", "NotFoundError"))
    with pytest.raises(ServerInvalidAdapterError) as caught:
        await provider.load_adapter("a1", "/adapters/missing")
    error = caught.value
    assert isinstance(error, InvalidAdapterError) and error.path == "/adapters/missing"
    assert "found no adapter at '/adapters/missing'" in str(error)
    assert "adapter_config.json" in str(error) and "vLLM server's machine" in str(error)
    assert await provider.list_adapters() == []
    await generates(provider, mock)


@pytest.mark.parametrize(
    ("message", "advice"),
    [
        ("LoRA rank 64 is greater than max_lora_rank 16.", "restart vLLM with a --max-lora-rank"),
        ("vLLM does not yet support DoRA.", "--max-lora-rank"),
        ("Adapter bias cannot be used without bias_enabled.", "bias other than 'none'"),
    ],
)
async def test_load_refused_adapter_500(
    provider: VLLMProvider, mock: respx.MockRouter, message: str, advice: str
) -> None:
    mock.post(LOAD).mock(return_value=vllm_error(500, message, "InternalServerError"))
    with pytest.raises(ServerInvalidAdapterError) as caught:
        await provider.load_adapter("big", "/adapters/big")
    assert advice in str(caught.value) and message in str(caught.value)
    assert caught.value.status_code == 500 and caught.value.path == "/adapters/big"
    await generates(provider, mock)


async def test_load_other_400_stays_a_plain_server_error(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=vllm_error(400, "The lora adapter 'base-model' is the same as the base model."))
    with pytest.raises(ServerResponseError) as caught:
        await provider.load_adapter("base-model", "/adapters/x")
    assert type(caught.value) is ServerResponseError
    assert "same as the base model" in str(caught.value)


async def test_unload_unknown_adapter(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(UNLOAD).mock(return_value=vllm_error(404, "The lora adapter 'ghost' cannot be found.", "NotFoundError"))
    with pytest.raises(ServerAdapterNotFoundError) as caught:
        await provider.unload_adapter("ghost")
    assert isinstance(caught.value, AdapterNotFoundError) and isinstance(caught.value, LookupError)
    assert "has no adapter named 'ghost'" in str(caught.value)
    await generates(provider, mock)


async def test_generate_with_unknown_adapter(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=vllm_error(404, "The model `ghost` does not exist.", "NotFoundError", "model"))
    with pytest.raises(ServerAdapterNotFoundError) as caught:
        await provider.generate("Hi", model="base-model", adapter_id="ghost")
    assert isinstance(caught.value, AdapterNotFoundError)
    assert "load_adapter('ghost', path)" in str(caught.value)
    await generates(provider, mock)


async def test_generate_with_unknown_model(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=vllm_error(404, "The model `nope` does not exist.", "NotFoundError", "model"))
    with pytest.raises(ServerModelNotFoundError) as caught:
        await provider.generate("Hi", model="nope")
    assert isinstance(caught.value, ModelNotFoundError) and isinstance(caught.value, httpx.HTTPStatusError)
    assert "does not serve model 'nope'" in str(caught.value) and "/v1/models" in str(caught.value)
    await generates(provider, mock)


async def test_generate_against_a_url_without_the_api(mock: respx.MockRouter) -> None:
    mock.post("http://vllm.test:8100/chat/completions").mock(return_value=httpx.Response(404, json=ROUTE_MISSING))
    async with VLLMProvider(base_url="http://vllm.test:8100") as vllm:
        with pytest.raises(ServerResponseError, match="ends with /v1") as caught:
            await vllm.generate("Hi", model="base-model")
    assert not isinstance(caught.value, ModelNotFoundError)


async def test_generate_400_quotes_vllm(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    message = "This model's maximum context length is 2048 tokens. However, you requested 4106 tokens."
    route = mock.post(CHAT).mock(return_value=vllm_error(400, message))
    with pytest.raises(ServerResponseError) as caught:
        await provider.generate("Hi", model="base-model")
    assert message in str(caught.value) and caught.value.status_code == 400
    assert route.call_count == 1
    await generates(provider, mock)


async def test_wrong_api_key(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(401, json={"error": "Unauthorized"}))
    with pytest.raises(ServerResponseError) as caught:
        await provider.generate("Hi", model="base-model")
    text = str(caught.value) + repr(caught.value)
    assert "401" in text and "API key" in text and SECRET not in text


# Resilience -------------------------------------------------------------------------------------------


async def test_503_then_success_is_retried_once(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=[httpx.Response(503), completion("after retry")])
    result = await provider.generate("Hi", model="base-model")
    assert result.text == "after retry" and route.call_count == 2


async def test_503_forever_gives_up_after_max_retries_plus_one(mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(503, json={"error": "engine dead"}))
    async with VLLMProvider(base_url=BASE, max_retries=2) as vllm:
        with pytest.raises(ServerResponseError) as caught:
            await vllm.generate("Hi", model="base-model")
    assert route.call_count == 3  # our retries only: the openai client's own retries are off
    assert caught.value.status_code == 503 and "tried 3 times" in str(caught.value)


async def test_400_is_not_retried(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(LOAD).mock(return_value=vllm_error(400, "bad"))
    with pytest.raises(ServerResponseError):
        await provider.load_adapter("a1", "/x")
    assert route.call_count == 1


async def test_timeout(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=httpx.ReadTimeout("timed out"))
    with pytest.raises(ProviderTimeoutError) as caught:
        await provider.generate("Hi", model="base-model")
    assert route.call_count == 1
    assert "within 120 s" in str(caught.value) and "VLLM_TIMEOUT" in str(caught.value)
    await generates(provider, mock)


async def test_timeout_on_the_lora_route(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(side_effect=httpx.ReadTimeout("timed out"))
    with pytest.raises(ProviderTimeoutError, match="load adapter 'a1'"):
        await provider.load_adapter("a1", "/x")


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, content=b'{"choices": [', headers={"content-type": "application/json"}),
        httpx.Response(200, text="<html>proxy login</html>"),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json={"unexpected": True}),
    ],
    ids=["truncated-json", "html", "no-choices", "other-json"],
)
async def test_malformed_answers_are_protocol_errors(
    provider: VLLMProvider, mock: respx.MockRouter, answer: httpx.Response
) -> None:
    mock.post(CHAT).mock(return_value=answer)
    with pytest.raises(ProtocolError) as caught:
        await provider.generate("Hi", model="base-model")
    assert BASE in str(caught.value)
    await generates(provider, mock)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_server_down_is_unavailable_naming_the_url() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    async with VLLMProvider(base_url=url) as vllm:
        with pytest.raises(ProviderUnavailableError) as caught:
            await vllm.generate("Hi", model="base-model")
        assert url in str(caught.value) and "VLLM_BASE_URL" in str(caught.value)
        assert caught.value.url == url
        with pytest.raises(ProviderUnavailableError, match=url):
            await vllm.load_adapter("a1", "/adapters/a1")


async def test_the_api_key_never_appears_in_repr_messages_or_logs(
    provider: VLLMProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mock.post(CHAT).mock(side_effect=[httpx.Response(503), httpx.Response(500, text="boom")])
    mock.post(LOAD).mock(return_value=httpx.Response(404, json=ROUTE_MISSING))
    errors: list[BaseException] = []
    for call in (
        provider.generate("Hi", model="base-model"),
        provider.load_adapter("a1", "/x"),
    ):
        with pytest.raises(ServerResponseError) as caught:
            await call
        errors.append(caught.value)
    shown = repr(provider) + "".join(str(e) + repr(e) for e in errors) + caplog.text
    assert SECRET not in shown
    assert "api_key=***" in repr(provider)
    assert "retrying POST" in caplog.text  # the retry was logged, without headers


def test_a_cached_provider_works_across_event_loops() -> None:
    """The factory caches providers; a script may call asyncio.run more than once."""
    vllm = VLLMProvider(base_url=BASE)
    with respx.mock:
        respx.post(CHAT).mock(return_value=completion("again"))
        first = asyncio.run(vllm.generate("Hi", model="base-model"))
        second = asyncio.run(vllm.generate("Hi", model="base-model"))
    assert first.text == second.text == "again"


async def test_aclose_then_reuse(mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=completion())
    vllm = VLLMProvider(base_url=BASE)
    await vllm.generate("Hi", model="base-model")
    await vllm.aclose()
    await vllm.aclose()  # twice is fine
    assert (await vllm.generate("Hi", model="base-model")).text == "Hello there."
    await vllm.aclose()


# Construction -----------------------------------------------------------------------------------------


def test_capabilities() -> None:
    assert VLLMProvider.supports_adapters and VLLMProvider.hot_swaps_adapters
    assert not VLLMProvider.runs_in_process


async def test_factory_builds_it_with_a_base_url() -> None:
    vllm = get_provider("vllm", base_url="http://127.0.0.1:9999/v1/")
    assert isinstance(vllm, VLLMProvider)
    assert vllm.base_url == "http://127.0.0.1:9999/v1"
    assert get_provider("vllm", base_url="http://127.0.0.1:9999/v1/") is vllm


async def test_factory_and_constructor_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_BASE_URL", "http://gpu-box:8000/v1")
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    monkeypatch.setenv("VLLM_TIMEOUT", "7.5")
    monkeypatch.setenv("VLLM_MAX_RETRIES", "0")
    monkeypatch.delenv("INFERENCE_PROVIDER", raising=False)
    vllm = get_provider()
    assert isinstance(vllm, VLLMProvider)
    assert (vllm.base_url, vllm.timeout, vllm.max_retries) == ("http://gpu-box:8000/v1", 7.5, 0)
    assert SECRET not in repr(vllm)
    direct = VLLMProvider(timeout=3)
    assert (direct.base_url, direct.timeout) == ("http://gpu-box:8000/v1", 3.0)


async def test_default_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    assert VLLMProvider().base_url == "http://localhost:8100/v1"
