"""A server's 400 for a prompt longer than its context is a ``ServerTokenLimitError``, which a fallback moves on.

The bodies are the servers' own (their wording in vLLM 0.32's ``renderers/params.py`` and
``v1/engine/input_processor.py``, llama.cpp's ``exceed_context_size_error``, llama-cpp-python's
``server/errors.py`` and OpenAI's API); the real vLLM, llama-server and ``llama_cpp.server`` answers are checked in
the integration tests. Here: the sentences those tests cannot bring on cue (vLLM's character count and its engine's
check, OpenAI's hosted API), and what must stay another error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from inference import OpenAIProvider
from inference.exceptions import InvalidRequestError, ServerResponseError, ServerTokenLimitError, TokenLimitError
from inference.fake_provider import FakeProvider
from inference.fallback import FallbackProvider

BASE = "http://gateway.test:4000/v1"
CHAT = f"{BASE}/chat/completions"


def _openai_error(message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def _vllm_error(message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}}


OVERFLOWS = {
    "vllm tokens": (_vllm_error(
        "This model's maximum context length is 512 tokens. However, your prompt contains 700 input tokens, which "
        "exceeds this limit even without any output tokens. Please reduce the length of the input prompt.",
        "input_tokens"), 512, 700),
    "vllm characters": (_vllm_error(
        "This model's maximum context length is 512 tokens. However, your prompt contains 90000 characters (more "
        "than 12264 characters, which is the upper bound for 511 input tokens). Please reduce the length of the "
        "input prompt.", "input_text"), 512, 512),
    "vllm engine": (_vllm_error(
        "The decoder prompt (length 600) is longer than the maximum model length of 512. Make sure that "
        "`max_model_len` is no smaller than the number of text tokens."), 512, 600),
    "llama-server": ({"error": {
        "code": 400, "message": "request (1502 tokens) exceeds the available context size (512 tokens), try "
        "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 1502, "n_ctx": 512}}, 512, 1502),
    "llama_cpp.server chat": (_openai_error(
        "This model's maximum context length is 512 tokens. However, you requested 1403 tokens (1400 in the "
        "messages, 3 in the completion). Please reduce the length of the messages or completion.",
        "context_length_exceeded", "messages"), 512, 1400),
    "openai messages": (_openai_error(
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. "
        "Please reduce the length of the messages.", "context_length_exceeded", "messages"), 8192, 9000),
    "openai with completion": (_openai_error(
        "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (8000 in the "
        "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
        "context_length_exceeded", "messages"), 8192, 9000),
}


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.mark.parametrize("server", list(OVERFLOWS))
async def test_a_context_overflow_is_a_token_limit_error_a_fallback_moves_on(
    mock: respx.MockRouter, server: str
) -> None:
    body, limit, value = OVERFLOWS[server]
    mock.post(CHAT).mock(return_value=httpx.Response(400, json=body))
    async with OpenAIProvider(base_url=BASE, api_key="sk-test", max_retries=0) as provider:
        with pytest.raises(ServerTokenLimitError) as caught:
            await provider.generate("a long prompt", model="m", max_tokens=3)
        error = caught.value
        assert isinstance(error, TokenLimitError) and isinstance(error, httpx.HTTPStatusError)
        assert (error.kind, error.limit, error.value, error.status_code) == ("context", limit, value, 400)
        assert f"context of {limit} tokens" in str(error) and body["error"]["message"] in str(error)
        fallback = FallbackProvider([provider, FakeProvider()], labels=["server", "fake"])
        result = await fallback.generate("a long prompt", "m", max_tokens=3)
    assert result.provider == "fake" and fallback.stats()["server"].failed == 1


@pytest.mark.parametrize(
    "body",
    [
        _vllm_error("max_tokens=4096 cannot be greater than max_model_len=512. Please request fewer output tokens.",
                    "max_tokens"),
        _openai_error("Invalid value for 'temperature': must be at most 2.", "invalid_value", "temperature"),
        {"error": {"code": 400, "message": "the prompt is empty", "type": "invalid_request_error"}},
    ],
)
async def test_other_refusals_stay_plain_errors_the_fallback_does_not_move_on(
    mock: respx.MockRouter, body: dict[str, Any]
) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(400, json=body))
    async with OpenAIProvider(base_url=BASE, api_key="sk-test", max_retries=0) as provider:
        fallback = FallbackProvider([provider, FakeProvider()], labels=["server", "fake"])
        with pytest.raises(ServerResponseError) as caught:
            await fallback.generate("hi", "m", max_tokens=3, temperature=0.5)
    assert not isinstance(caught.value, (TokenLimitError, InvalidRequestError))
    assert fallback.stats()["fake"].answered == 0
