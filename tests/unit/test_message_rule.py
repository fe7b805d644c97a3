"""One chat-message rule (``GenerationRequest.messages``) for every backend, ``system_prompt=""`` included."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from inference._core.validation import GenerationRequest
from inference.messages import plain_text
from inference.ollama_provider import OllamaProvider
from inference.vllm_provider import VLLMProvider

ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


@pytest.mark.parametrize(
    ("system_prompt", "expected"),
    [
        (None, [{"role": "user", "content": "Hi"}]),
        ("", [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}]),
        ("Be brief.", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]),
    ],
)
def test_the_rule(system_prompt: str | None, expected: list[dict[str, str]]) -> None:
    request = GenerationRequest.from_arguments(provider="t", prompt="Hi", model="m", system_prompt=system_prompt)
    assert request.messages == expected
    assert request.plain_prompt == ("Be brief.\n\nHi" if system_prompt else "Hi")  # an empty turn adds no text
    assert plain_text([{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}]) == "Hi"


@respx.mock
async def test_vllm_and_ollama_send_the_empty_system_message_the_rule_gives() -> None:
    chat = respx.post("http://127.0.0.1:9/v1/chat/completions").mock(return_value=httpx.Response(200, json=ANSWER))
    ollama = respx.post("http://127.0.0.1:8/api/chat").mock(
        return_value=httpx.Response(
            200,
            json={"model": "m", "message": {"role": "assistant", "content": "ok"}, "done": True,
                  "done_reason": "stop", "prompt_eval_count": 3, "eval_count": 1},
        )
    )
    rule = GenerationRequest.from_arguments(provider="t", prompt="Hi", model="m", system_prompt="").messages
    async with VLLMProvider(base_url="http://127.0.0.1:9/v1", api="chat") as vllm:
        await vllm.generate("Hi", model="m", system_prompt="")
    async with OllamaProvider(base_url="http://127.0.0.1:8/v1") as provider:
        await provider.generate("Hi", model="m", system_prompt="")
    assert json.loads(chat.calls.last.request.content)["messages"] == rule
    assert json.loads(ollama.calls.last.request.content)["messages"] == rule
