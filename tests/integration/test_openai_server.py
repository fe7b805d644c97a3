"""OpenAIProvider against a real OpenAI-compatible server: ``python -m llama_cpp.server`` on loopback."""

from __future__ import annotations

import pytest

from inference import get_provider, get_provider_for_step
from inference.exceptions import ServerResponseError, ServerTokenLimitError, UnsupportedOperationError
from inference.factory import aclose_all_providers
from inference.openai_provider import OpenAIProvider
from inference.provider import GenerationResult

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen2"  # llama_cpp.server serves one model whatever the name


async def test_generates_and_streams_real_text(llama_server: str) -> None:
    async with OpenAIProvider(base_url=llama_server, api_key="sk-local") as provider:
        result = await provider.generate("Hello", model=MODEL, max_tokens=6, temperature=0.0)
        events = [event async for event in provider.stream("Hello", model=MODEL, max_tokens=6, temperature=0.0)]
    assert result.text and result.finish_reason == "length"
    assert result.prompt_tokens > 0 and result.completion_tokens > 0
    assert result.token_count == result.prompt_tokens + result.completion_tokens
    *pieces, final = events
    assert isinstance(final, GenerationResult) and all(isinstance(piece, str) for piece in pieces)
    assert "".join(pieces) == final.text == result.text  # greedy: the stream says what generate said
    assert final.completion_tokens == result.completion_tokens


async def test_get_provider_and_step_configs_reach_the_server(llama_server: str) -> None:
    try:
        direct = get_provider("openai", base_url=llama_server)
        step = get_provider_for_step({"provider": "openai", "base_url": llama_server, "prompt": "ignored"})
        assert step is direct and isinstance(direct, OpenAIProvider)
        result = await step.generate("Say something", model=MODEL, max_tokens=4, temperature=0.0, seed=1)
        assert result.text and result.completion_tokens <= 4
        with pytest.raises(UnsupportedOperationError):
            await step.load_adapter("style", "/adapters/style")
    finally:
        await aclose_all_providers()


async def test_a_base_url_without_v1_is_reported_as_a_missing_route(llama_server: str) -> None:
    async with OpenAIProvider(base_url=llama_server.removesuffix("/v1"), max_retries=0) as provider:
        with pytest.raises(ServerResponseError, match="OPENAI_BASE_URL") as caught:
            await provider.generate("Hello", model=MODEL, max_tokens=2)
    assert caught.value.status_code == 404


async def test_a_prompt_longer_than_the_server_s_context_is_a_token_limit_error(llama_server: str) -> None:
    # llama_cpp.server (n_ctx 512) answers OpenAI's 400 context_length_exceeded, for chat and for completions.
    prompt = " ".join(["fox"] * 700)
    for api in ("chat", "completions"):
        async with OpenAIProvider(base_url=llama_server, api=api) as provider:
            with pytest.raises(ServerTokenLimitError) as caught:
                await provider.generate(prompt, model=MODEL, max_tokens=3)
            assert (await provider.generate("Hello", model=MODEL, max_tokens=2)).text  # still usable
        error = caught.value
        assert (error.kind, error.limit, error.status_code) == ("context", 512, 400), api
        assert error.value > 512 and "maximum context length is 512" in str(error)
