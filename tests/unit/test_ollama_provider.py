"""OllamaProvider on the wire: the native /api/chat body, Ollama's answers, and what a non-Ollama server says.

Answers are Ollama's (v0.33): ``/api/chat`` with ``"stream": false`` returns one JSON object with
``message.content``, ``done_reason``, ``prompt_eval_count`` and ``eval_count``; a missing model is
``404 {"error": "model 'x' not found"}``; other errors are ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from inference import get_provider, get_provider_for_step
from inference.exceptions import (
    InvalidRequestError,
    ModelNotFoundError,
    ProtocolError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    ServerModelNotFoundError,
    ServerResponseError,
    UnsupportedOperationError,
)
from inference.ollama_provider import OllamaProvider

BASE = "http://ollama.test:11434/v1"
CHAT = "http://ollama.test:11434/api/chat"


def chat_reply(
    text: str = "Hi! How can I help?",
    *,
    model: str = "llama3.2",
    done_reason: str = "stop",
    prompt_eval_count: int = 26,
    eval_count: int = 8,
) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "model": model,
            "created_at": "2026-01-01T00:00:00.000000Z",
            "message": {"role": "assistant", "content": text},
            "done": True,
            "done_reason": done_reason,
            "total_duration": 5191566416,
            "load_duration": 2154458,
            "prompt_eval_count": prompt_eval_count,
            "prompt_eval_duration": 383809000,
            "eval_count": eval_count,
            "eval_duration": 4799921000,
        },
    )


def sent(route: respx.Route) -> Any:
    return json.loads(route.calls.last.request.content)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.fixture
async def provider() -> AsyncIterator[OllamaProvider]:
    async with OllamaProvider(base_url=BASE, max_retries=1) as ollama:
        yield ollama


async def generates(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=chat_reply("still fine"))
    assert (await provider.generate("Hi", model="llama3.2", max_tokens=8)).text == "still fine"


async def test_native_chat_body_carries_only_what_the_caller_set(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    await provider.generate("Hi", model="llama3.2")
    assert sent(route) == {
        "model": "llama3.2",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": False,
        "options": {"num_predict": 4096},
    }


async def test_every_parameter_reaches_the_options(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    await provider.generate(
        "Hi",
        model="llama3.2",
        max_tokens=64,
        system_prompt="Be brief.",
        temperature=0.2,
        top_p=0.8,
        repetition_penalty=1.3,
        stop=["\n", "END"],
        seed=11,
        top_k=20,
    )
    assert sent(route) == {
        "model": "llama3.2",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "stream": False,
        "options": {
            "num_predict": 64,
            "temperature": 0.2,
            "top_p": 0.8,
            "top_k": 20,
            "repeat_penalty": 1.3,
            "seed": 11,
            "stop": ["\n", "END"],
        },
    }


async def test_greedy_and_zero_values_are_sent(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    await provider.generate("Hi", model="llama3.2", temperature=0.0, seed=0, top_k=0, stop="END")
    options = sent(route)["options"]
    assert options == {"num_predict": 4096, "temperature": 0.0, "seed": 0, "top_k": 0, "stop": ["END"]}


async def test_reply_is_parsed(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=chat_reply("one two three", done_reason="length", eval_count=3))
    result = await provider.generate("Hi", model="llama3.2", max_tokens=3)
    assert (result.text, result.model, result.adapter_id, result.finish_reason) == (
        "one two three",
        "llama3.2",
        None,
        "length",
    )
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (26, 3, 29)


async def test_reply_without_counts_gives_zero_counts(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(
        return_value=httpx.Response(200, json={"model": "llama3.2", "message": {"content": "x"}, "done": True})
    )
    result = await provider.generate("Hi", model="llama3.2")
    assert (result.text, result.token_count, result.finish_reason) == ("x", 0, "stop")


async def test_missing_model_says_how_to_pull_it(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(404, json={"error": "model 'qwen9' not found"}))
    with pytest.raises(ServerModelNotFoundError) as caught:
        await provider.generate("Hi", model="qwen9")
    error = caught.value
    assert "ollama pull qwen9" in str(error) and BASE in str(error)
    assert isinstance(error, ModelNotFoundError) and isinstance(error, httpx.HTTPStatusError)
    assert error.response.status_code == 404 and error.request.url == CHAT
    await generates(provider, mock)


async def test_a_server_that_is_not_ollama_is_named_as_such(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
    with pytest.raises(ServerResponseError) as caught:
        await provider.generate("Hi", model="llama3.2")
    assert not isinstance(caught.value, ModelNotFoundError)
    assert "has no Ollama native API" in str(caught.value)
    assert "http://ollama.test:11434" in str(caught.value)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "invalid options: num_ctx must be positive"),
        (500, "llama runner process has terminated: signal: killed"),
    ],
)
async def test_other_errors_quote_ollama(
    provider: OllamaProvider, mock: respx.MockRouter, status: int, message: str
) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(status, json={"error": message}))
    with pytest.raises(ServerResponseError) as caught:
        await provider.generate("Hi", model="llama3.2")
    assert message in str(caught.value) and caught.value.status_code == status
    assert route.call_count == 1
    await generates(provider, mock)


async def test_adapters_are_unsupported(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    with pytest.raises(UnsupportedOperationError, match="OllamaProvider does not support load_adapter"):
        await provider.load_adapter("a1", "/adapters/a1")
    with pytest.raises(UnsupportedOperationError, match="unload_adapter"):
        await provider.unload_adapter("a1")
    assert await provider.list_adapters() == []
    assert not OllamaProvider.supports_adapters and not OllamaProvider.hot_swaps_adapters
    await generates(provider, mock)


async def test_adapter_id_warns_and_uses_the_base_model(
    provider: OllamaProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply("base answer"))
    with caplog.at_level(logging.WARNING, logger="inference.ollama"):
        result = await provider.generate("Hi", model="llama3.2", adapter_id="style-a")
    assert sent(route)["model"] == "llama3.2"
    assert result.adapter_id is None and result.text == "base answer"
    [record] = [r for r in caplog.records if r.name == "inference.ollama"]
    assert record.levelno == logging.WARNING and "style-a" in record.getMessage()


async def test_a_model_name_is_required(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    with pytest.raises(InvalidRequestError, match="Ollama needs a model name"):
        await provider.generate("Hi", model="")
    assert route.call_count == 0


async def test_503_then_success(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=[httpx.Response(503), chat_reply("ok")])
    assert (await provider.generate("Hi", model="llama3.2")).text == "ok"
    assert route.call_count == 2


async def test_503_forever_gives_up(mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(503))
    async with OllamaProvider(base_url=BASE, max_retries=2) as ollama:
        with pytest.raises(ServerResponseError):
            await ollama.generate("Hi", model="llama3.2")
    assert route.call_count == 3


async def test_timeout(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=httpx.ReadTimeout("timed out"))
    with pytest.raises(ProviderTimeoutError, match="OLLAMA_TIMEOUT"):
        await provider.generate("Hi", model="llama3.2")
    assert route.call_count == 1
    await generates(provider, mock)


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, content=b'{"message": {"content": "x"', headers={"content-type": "application/json"}),
        httpx.Response(200, json={"done": True}),
        httpx.Response(200, json={"message": {"content": None}}),
        httpx.Response(200, json=["not", "an", "object"]),
    ],
    ids=["truncated", "no-message", "null-content", "list"],
)
async def test_malformed_replies_are_protocol_errors(
    provider: OllamaProvider, mock: respx.MockRouter, answer: httpx.Response
) -> None:
    mock.post(CHAT).mock(return_value=answer)
    with pytest.raises(ProtocolError, match="OLLAMA_BASE_URL"):
        await provider.generate("Hi", model="llama3.2")
    await generates(provider, mock)


async def test_server_down_is_unavailable_naming_the_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    async with OllamaProvider(base_url=url) as ollama:
        with pytest.raises(ProviderUnavailableError) as caught:
            await ollama.generate("Hi", model="llama3.2")
    assert url in str(caught.value) and "OLLAMA_BASE_URL" in str(caught.value)


async def test_factory_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_BASE_URL", "http://ollama-box:11434/v1")
    monkeypatch.setenv("OLLAMA_TIMEOUT", "30")
    ollama = get_provider("ollama")
    assert isinstance(ollama, OllamaProvider)
    assert (ollama.base_url, ollama.native_url, ollama.timeout) == (
        "http://ollama-box:11434/v1",
        "http://ollama-box:11434",
        30.0,
    )
    assert get_provider_for_step({"provider": "ollama"}) is ollama
    other = get_provider("ollama", base_url="http://127.0.0.1:11434/v1")
    assert isinstance(other, OllamaProvider) and other is not ollama


async def test_default_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLLAMA_BASE_URL", raising=False)
    ollama = OllamaProvider()
    assert (ollama.base_url, ollama.native_url) == ("http://localhost:11434/v1", "http://localhost:11434")
    assert repr(ollama) == "OllamaProvider(base_url='http://localhost:11434/v1')"
