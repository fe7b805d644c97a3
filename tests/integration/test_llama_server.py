"""The HTTP providers against a real OpenAI-compatible server: ``python -m llama_cpp.server`` on loopback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_options import check_sampling_options

from inference import get_provider
from inference.exceptions import (
    InvalidAdapterError,
    ProviderUnavailableError,
    RuntimeLoRADisabledError,
    ServerResponseError,
)
from inference.ollama_provider import OllamaProvider
from inference.provider import GenerationResult
from inference.vllm_provider import VLLMProvider

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen2"  # llama_cpp.server serves one model whatever the name


async def test_generates_real_text_with_token_counts(llama_server: str) -> None:
    async with VLLMProvider(base_url=llama_server) as provider:
        result = await provider.generate("Hello", model=MODEL, max_tokens=6, temperature=0.0)
    assert isinstance(result.text, str) and result.text
    assert result.prompt_tokens > 0 and result.completion_tokens > 0
    assert result.token_count == result.prompt_tokens + result.completion_tokens
    assert result.completion_tokens <= 6
    assert result.finish_reason == "length"  # a random tiny model does not stop in six tokens
    assert result.adapter_id is None and result.model == MODEL


async def test_sampling_options_change_llama_cpp_server_s_answers_as_they_say(
    llama_server: str, tiny_qwen2_gguf: Path
) -> None:
    """The openai provider (every OpenAI-compatible server) on llama-cpp-python's server."""
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.openai_provider import OpenAIProvider

    async with OpenAIProvider(base_url=llama_server, api_key="unused") as remote, LlamaCppProvider(
        tiny_qwen2_gguf, n_ctx=512
    ) as local:
        await check_sampling_options(remote, local, MODEL)


async def test_system_prompt_reaches_the_chat_template(llama_server: str) -> None:
    async with VLLMProvider(base_url=llama_server) as provider:
        plain = await provider.generate("Hello", model=MODEL, max_tokens=4, temperature=0.0)
        with_system = await provider.generate(
            "Hello", model=MODEL, max_tokens=4, temperature=0.0, system_prompt="You are terse."
        )
    assert with_system.prompt_tokens > plain.prompt_tokens


async def test_greedy_is_reproducible_and_stop_is_honoured(llama_server: str) -> None:
    async with VLLMProvider(base_url=llama_server) as provider:
        first = await provider.generate("Tell me a story", model=MODEL, max_tokens=16, temperature=0.0)
        again = await provider.generate("Tell me a story", model=MODEL, max_tokens=16, temperature=0.0)
        assert first.text == again.text

        visible = first.text.strip()
        assert len(visible) >= 4, f"greedy output too short to pick a stop string from: {first.text!r}"
        stop = visible[2:4]
        cut = first.text.index(stop)
        stopped = await provider.generate("Tell me a story", model=MODEL, max_tokens=16, temperature=0.0, stop=[stop])
    assert stopped.text == first.text[:cut]
    assert stop not in stopped.text
    assert stopped.finish_reason == "stop"


async def test_seeded_sampling_is_reproducible(llama_server: str) -> None:
    async with VLLMProvider(base_url=llama_server) as provider:
        runs = [
            await provider.generate(
                "Once upon a time",
                model=MODEL,
                max_tokens=12,
                temperature=1.0,
                top_k=50,
                top_p=0.95,
                repetition_penalty=1.1,
                seed=1234,
            )
            for _ in range(2)
        ]
    assert runs[0].text == runs[1].text
    assert runs[0].completion_tokens > 0


async def test_runtime_lora_routes_answer_404_and_the_provider_keeps_working(llama_server: str) -> None:
    provider = get_provider("vllm", base_url=llama_server)
    with pytest.raises(RuntimeLoRADisabledError) as caught:
        await provider.load_adapter("a0", "/adapters/a0")
    assert "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in str(caught.value)
    assert caught.value.response.status_code == 404
    assert await provider.list_adapters() == []
    result = await provider.generate("Hello", model=MODEL, max_tokens=3, temperature=0.0)
    assert result.completion_tokens > 0


async def test_ollama_provider_says_the_server_is_not_ollama(llama_server: str) -> None:
    async with OllamaProvider(base_url=llama_server) as provider:
        with pytest.raises(ServerResponseError, match="has no Ollama native API"):
            await provider.generate("Hello", model=MODEL, max_tokens=3)


@pytest.mark.slow
async def test_a_killed_server_is_unavailable(start_llama_server: Callable[[], Any]) -> None:
    server = start_llama_server()
    base_url: str = server.base_url
    async with VLLMProvider(base_url=base_url) as provider:
        assert (await provider.generate("Hello", model=MODEL, max_tokens=2, temperature=0.0)).completion_tokens > 0
        server.stop()
        with pytest.raises(ProviderUnavailableError) as caught:
            await provider.generate("Hello", model=MODEL, max_tokens=2, temperature=0.0)
    assert base_url in str(caught.value)
    assert caught.value.url == base_url


async def test_stream_pieces_add_up_to_the_generated_text(llama_server: str) -> None:
    async with VLLMProvider(base_url=llama_server) as provider:
        whole = await provider.generate("Hello", model=MODEL, max_tokens=12, temperature=0.0)
        events = [event async for event in provider.stream("Hello", model=MODEL, max_tokens=12, temperature=0.0)]
    pieces = [event for event in events[:-1] if isinstance(event, str) and event]
    result = events[-1]
    assert len(pieces) == len(events) - 1
    assert isinstance(result, GenerationResult)
    assert "".join(pieces) == result.text == whole.text
    assert result.finish_reason == whole.finish_reason == "length"
    # llama_cpp.server sends no usage chunk: the count of token chunks stands in for completion tokens
    assert result.completion_tokens == whole.completion_tokens == 12


async def test_llama_cpp_server_sends_no_usage_in_a_stream_even_when_asked(llama_server: str) -> None:
    """Why the stream below reports no prompt tokens: ``stream_options.include_usage`` is ignored (vLLM honours it)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{llama_server}/chat/completions", json=body)
    chunks = [
        json.loads(line.removeprefix("data: ")) for line in response.text.splitlines() if line.startswith("data: {")
    ]
    assert chunks and not any(chunk.get("usage") for chunk in chunks)


async def test_stream_reports_the_token_counts_of_generate_or_none(llama_server: str) -> None:
    async with VLLMProvider(base_url=llama_server) as provider:
        whole = await provider.generate("Tell me a story", model=MODEL, max_tokens=10, temperature=0.0)
        events = [e async for e in provider.stream("Tell me a story", model=MODEL, max_tokens=10, temperature=0.0)]
    streamed = events[-1]
    assert isinstance(streamed, GenerationResult)
    assert streamed.text == whole.text and streamed.completion_tokens == whole.completion_tokens
    assert whole.prompt_tokens is not None and whole.prompt_tokens > 0
    assert streamed.prompt_tokens is None and streamed.token_count is None  # the server did not say


async def test_a_server_without_lora_lists_no_adapters_from_a_new_provider(llama_server: str) -> None:
    """``GET /v1/models`` is asked; llama_cpp.server's model card (no ``parent``) is not an adapter."""
    async with VLLMProvider(base_url=llama_server) as fresh:
        assert await fresh.list_adapters() == []


async def test_a_local_adapter_is_checked_before_anything_is_sent(llama_server: str, tiny_models: Any) -> None:
    """A real PEFT adapter of rank 8 against max_lora_rank 1: refused here, and the server is not asked."""
    adapter = tiny_models["qwen2"].adapter_dirs["a0"]
    async with VLLMProvider(base_url=llama_server, max_lora_rank=1) as provider:
        with pytest.raises(InvalidAdapterError, match="above max_lora_rank 1: start vLLM with --max-lora-rank"):
            await provider.load_adapter("a0", adapter)
        assert await provider.list_adapters() == []
        result = await provider.generate("Hello", model=MODEL, max_tokens=2, temperature=0.0)
    assert result.completion_tokens > 0
