"""``n`` on the OpenAI-compatible servers (issue 25), on the wire: the bodies sent and every choice read back.

The answers are the servers' own, captured from the real ones where they run here: vLLM 0.32's CPU build (``n=3``
with ``return_token_ids``: three choices in index order, ``usage`` with the prompt once and the completions summed,
its refusal of ``n`` with greedy sampling), llama_cpp.server 0.3.36 (it ignores ``n``: one choice), and OpenAI's
documented answer (no count per choice). What a real server cannot be made to do here (OpenAI itself, choices out of
order, tool calls in several choices) is checked with those shapes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from inference.exceptions import InvalidRequestError
from inference.llamacpp_server_provider import LlamaCppServerProvider
from inference.openai_provider import OpenAIProvider
from inference.vllm_provider import VLLMProvider

BASE = "http://server.test:8100/v1"
CHAT = f"{BASE}/chat/completions"
PROMPT = "numbers 1 2 3 and"


def vllm_choice(index: int, content: str | None, token_ids: list[int], **message: Any) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": content, "refusal": None, "annotations": None, "audio": None,
                    "function_call": None, "reasoning": None, **message},
        "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": token_ids,
        "routed_experts": None,
    }


VLLM_N3 = {  # vLLM 0.32.0 (CPU) to n=3, seed=7, max_tokens=5, return_token_ids=true
    "id": "chatcmpl-ae045e96d822e8ad", "object": "chat.completion", "created": 1796494106, "model": "tiny",
    "choices": [
        vllm_choice(0, 'ak oneavging"', [359, 346, 465, 488, 4]),
        vllm_choice(1, "-\ufffd b sm\u0013", [15, 119, 269, 341, 210]),
        vllm_choice(2, "Pl quickpt", [457, 436, 82, 86, 467]),
    ],
    "service_tier": None, "system_fingerprint": "vllm-0.32.0-3b1d8483",
    "usage": {"prompt_tokens": 28, "total_tokens": 43, "completion_tokens": 15, "prompt_tokens_details": None,
              "completion_tokens_details": None},
    "prompt_logprobs": None, "prompt_token_ids": [1, 87, 85, 268, 201], "prompt_text": None,
    "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
}
VLLM_GREEDY_N = {"error": {"message": "n must be 1 when using greedy sampling, got 3.", "type": "BadRequestError",
                           "param": None, "code": 400}}
LLAMA_CPP_SERVER_ONE = {  # llama_cpp.server 0.3.36 to n=3: it drops n
    "id": "chatcmpl-be88038d-2b7b-4223-9321-e1cddc540719", "object": "chat.completion", "created": 1796494901,
    "model": "m",
    "choices": [{"index": 0, "message": {"content": " beginhereVear", "role": "assistant"}, "logprobs": None,
                 "finish_reason": "length"}],
    "usage": {"prompt_tokens": 18, "completion_tokens": 6, "total_tokens": 24},
}


def openai_answer(texts: list[str], completion_tokens: int) -> dict[str, Any]:
    """OpenAI's chat completion to ``n``: one choice per text, no count per choice, ``usage`` for all."""
    return {
        "id": "chatcmpl-abc", "object": "chat.completion", "created": 1700000000, "model": "gpt-4o-mini-2024-07-18",
        "choices": [
            {"index": index, "message": {"role": "assistant", "content": text, "refusal": None, "annotations": []},
             "logprobs": None, "finish_reason": "stop"}
            for index, text in enumerate(texts)
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": completion_tokens, "total_tokens": 9 + completion_tokens},
        "service_tier": "default", "system_fingerprint": "fp_1",
    }


def bodies(route: respx.Route) -> list[dict[str, Any]]:
    return [json.loads(call.request.content) for call in route.calls]


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.fixture
async def vllm() -> AsyncIterator[VLLMProvider]:
    async with VLLMProvider(base_url=BASE, api="chat", max_retries=0) as provider:
        yield provider


async def test_vllm_gets_n_once_and_every_choice_comes_back_counted_by_its_token_ids(
    mock: respx.MockRouter, vllm: VLLMProvider
) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=VLLM_N3))
    result = await vllm.generate(PROMPT, model="tiny", n=3, max_tokens=5, seed=7, temperature=1.0)
    assert bodies(route) == [{
        "model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5, "temperature": 1.0,
        "seed": 7, "n": 3, "return_token_ids": True,
    }]
    assert result.choices is not None
    assert [choice.text for choice in result.choices] == ['ak oneavging"', "-\ufffd b sm\u0013", "Pl quickpt"]
    assert result.text == 'ak oneavging"' and result.finish_reason == "length"
    assert [choice.completion_tokens for choice in result.choices] == [5, 5, 5]
    assert [choice.token_count for choice in result.choices] == [33, 33, 33]
    assert [choice.token_ids for choice in result.choices] == [None] * 3  # counted, not returned: not asked for
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (28, 15, 43)  # vLLM's usage


async def test_vllm_greedy_choices_go_one_request_each_as_vllm_refuses_n_with_greedy_sampling(
    mock: respx.MockRouter, vllm: VLLMProvider
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("n", 1) > 1:
            return httpx.Response(400, json=VLLM_GREEDY_N)
        one = {**VLLM_N3, "choices": VLLM_N3["choices"][:1],
               "usage": {"prompt_tokens": 28, "total_tokens": 33, "completion_tokens": 5}}
        return httpx.Response(200, json=one)

    route = mock.post(CHAT).mock(side_effect=answer)
    result = await vllm.generate(PROMPT, model="tiny", n=3, max_tokens=5, temperature=0)
    assert [body.get("n") for body in bodies(route)] == [None] * 3
    assert result.choices is not None and [choice.text for choice in result.choices] == ['ak oneavging"'] * 3
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (28, 15, 43)


async def test_a_server_that_ignores_n_is_asked_for_the_other_choices_one_request_each(
    mock: respx.MockRouter,
) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=LLAMA_CPP_SERVER_ONE))
    async with OpenAIProvider(base_url=BASE, api_key="unused", max_retries=0) as provider:
        result = await provider.generate(PROMPT, model="m", n=3, max_tokens=3, seed=7, temperature=1.0)
    sent = bodies(route)
    assert sent[0]["n"] == 3 and sent[0]["seed"] == 7
    assert sorted(body["seed"] for body in sent[1:]) == [8, 9] and all("n" not in body for body in sent[1:])
    assert result.choices is not None and len(result.choices) == 3
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (18, 18, 36)
    assert [choice.completion_tokens for choice in result.choices] == [6, 6, 6]


async def test_openai_s_choices_have_no_count_of_their_own_and_the_result_has_its_usage(
    mock: respx.MockRouter,
) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=openai_answer(["Hi!", "Hello!"], 5)))
    async with OpenAIProvider(base_url=BASE, api_key="unused", max_retries=0) as provider:
        result = await provider.generate("Hello", model="gpt-4o-mini", n=2)
    assert bodies(route) == [
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4096, "n": 2}
    ]
    assert result.choices is not None and [choice.text for choice in result.choices] == ["Hi!", "Hello!"]
    assert [(choice.prompt_tokens, choice.completion_tokens, choice.token_count) for choice in result.choices] == [
        (9, 0, None), (9, 0, None)  # the server counts only the whole answer
    ]
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (9, 5, 14)


async def test_choices_are_read_in_index_order_each_with_its_tool_calls_and_finish_reason(
    mock: respx.MockRouter, vllm: VLLMProvider
) -> None:
    def called(index: int, zone: str) -> dict[str, Any]:
        call = {"id": f"chatcmpl-tool-{index}", "type": "function",
                "function": {"name": "time", "arguments": json.dumps({"zone": zone})}}
        return {**vllm_choice(index, None, [1, 2, 3], tool_calls=[call]), "finish_reason": "tool_calls"}

    answer = {**VLLM_N3, "choices": [called(1, "UTC"), called(0, "CET")],
              "usage": {"prompt_tokens": 28, "total_tokens": 34, "completion_tokens": 6}}
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer))
    time = {"type": "function", "function": {"name": "time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}}, "required": ["zone"]}}}
    result = await vllm.generate(PROMPT, model="tiny", n=2, temperature=1.0, tools=[time], tool_choice="required")
    assert result.choices is not None
    zones = [choice.tool_calls[0].arguments["zone"] for choice in result.choices if choice.tool_calls]
    assert zones == ["CET", "UTC"]  # index 0 first
    assert result.tool_calls == result.choices[0].tool_calls and result.finish_reason == "tool_calls"
    assert [choice.completion_tokens for choice in result.choices] == [3, 3] and result.completion_tokens == 6


async def test_llama_server_gets_n_requests_of_one_completion(mock: respx.MockRouter) -> None:
    root = "http://llama.test:8080"
    route = mock.post(f"{root}/v1/chat/completions").mock(return_value=httpx.Response(200, json=LLAMA_CPP_SERVER_ONE))
    mock.get(f"{root}/props").mock(return_value=httpx.Response(200, json={"chat_template": "{{ messages }}"}))
    mock.get(f"{root}/lora-adapters").mock(return_value=httpx.Response(200, json=[]))
    async with LlamaCppServerProvider(base_url=root, max_retries=0) as provider:
        result = await provider.generate(PROMPT, model="m", n=3, seed=7, temperature=1.0)
    assert sorted(body["seed"] for body in bodies(route)) == [7, 8, 9]
    assert all("n" not in body for body in bodies(route))
    assert result.choices is not None and result.completion_tokens == 18


async def test_n_with_a_stream_is_refused_before_anything_is_sent(mock: respx.MockRouter, vllm: VLLMProvider) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, json=VLLM_N3))
    with pytest.raises(InvalidRequestError, match="n is 2"):
        async for _ in vllm.stream(PROMPT, model="tiny", n=2):
            pass
    assert not route.called
