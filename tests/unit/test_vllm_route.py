"""The vLLM provider's route per server (``VLLM_API=auto|chat|completions``), on the wire.

Every answer here is vLLM 0.32's own (captured from the CPU build serving the head-64 tiny Qwen2 with and without its
chat template). The real-server side of the same behaviour is in ``tests/integration/test_vllm_base_model.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from inference.exceptions import ProtocolError, ProviderUnavailableError, ServerResponseError
from inference.vllm_provider import VLLMProvider

BASE = "http://vllm.test:8100/v1"
TOKENIZE = "http://vllm.test:8100/tokenize"
CHAT = f"{BASE}/chat/completions"
COMPLETIONS = f"{BASE}/completions"

NO_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if "
    "the tokenizer does not define one."
)


def no_template() -> httpx.Response:
    return httpx.Response(
        400, json={"error": {"message": NO_TEMPLATE, "type": "BadRequestError", "param": None, "code": 400}}
    )


def template_found() -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "count": 9, "max_model_len": 512, "tokens": [151644, 872, 198, 87, 151645, 198, 151644, 77091, 198],
            "token_strs": None,
        },
    )


def text_completion(text: str = "oreore bak f", *, logprobs: Any = None) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "cmpl-93279009b9d9d59e", "object": "text_completion", "created": 1795484663, "model": "base",
            "choices": [
                {
                    "index": 0, "text": text, "logprobs": logprobs, "finish_reason": "length", "stop_reason": None,
                    "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None,
                }
            ],
            "service_tier": None, "system_fingerprint": "vllm-0.32.0-ce2cc0da",
            "usage": {
                "prompt_tokens": 18, "total_tokens": 22, "completion_tokens": 4, "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
        },
    )


def chat_completion(text: str = "Hello there.") -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "base",
            "choices": [
                {
                    "index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None, "finish_reason": "stop", "stop_reason": None,
                }
            ],
            "usage": {"prompt_tokens": 12, "total_tokens": 15, "completion_tokens": 3},
        },
    )


COMPLETION_STREAM = (
    'data: {"id":"cmpl-9fbe5cb81e9f5b19","object":"text_completion","created":1795484657,"model":"base",'
    '"choices":[{"index":0,"text":" wor","logprobs":{"text_offset":[0],"token_logprobs":[-5.701981067657471],'
    '"tokens":[" wor"],"top_logprobs":[{" wor":-5.701981067657471}]},"finish_reason":null,"stop_reason":null,'
    '"prompt_token_ids":null,"token_ids":null}]}\n\n'
    'data: {"id":"cmpl-9fbe5cb81e9f5b19","object":"text_completion","created":1795484657,"model":"base",'
    '"choices":[{"index":0,"text":"","logprobs":{"text_offset":[4],"token_logprobs":[-5.435140132904053],'
    '"tokens":[""],"top_logprobs":[{"":-5.435140132904053}]},"finish_reason":"length","stop_reason":null,'
    '"prompt_token_ids":null,"token_ids":null}]}\n\n'
    'data: {"id":"cmpl-9fbe5cb81e9f5b19","object":"text_completion","created":1795484657,"model":"base",'
    '"choices":[],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2},'
    '"system_fingerprint":"vllm-0.32.0-ce2cc0da"}\n\n'
    "data: [DONE]\n\n"
)

COMPLETION_LOGPROBS = {
    "text_offset": [0, 4, 4],
    "token_logprobs": [-5.701981067657471, -5.435140132904053, -5.600925445556641],
    "tokens": [" wor", "", " wor"],
    "top_logprobs": [
        {" wor": -5.701981067657471, "": -5.707038879394531},
        {"": -5.683136463165283},
        {" wor": -5.600925445556641, " l": -5.61311674118042},
    ],
}


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.fixture
async def provider() -> AsyncIterator[VLLMProvider]:
    async with VLLMProvider(base_url=BASE, max_retries=0, api="auto") as vllm:
        yield vllm


def body(route: respx.Route, index: int = 0) -> Any:
    return json.loads(route.calls[index].request.content)


def test_the_route_is_auto_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API")
    assert VLLMProvider(base_url=BASE).api == "auto"
    monkeypatch.setenv("VLLM_API", "completions")
    assert VLLMProvider(base_url=BASE).api == "completions"


async def test_a_model_without_a_chat_template_generates_through_completions_asked_once(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    probe = mock.post(TOKENIZE).mock(return_value=no_template())
    completions = mock.post(COMPLETIONS).mock(return_value=text_completion())
    chat = mock.post(CHAT).mock(return_value=chat_completion())
    results = await asyncio.gather(
        *(provider.generate("the quick brown fox", model="base", max_tokens=4, temperature=0.0) for _ in range(5))
    )
    assert [result.text for result in results] == ["oreore bak f"] * 5
    assert results[0].prompt_tokens == 18 and results[0].completion_tokens == 4
    assert probe.call_count == 1  # five concurrent first requests share one question
    assert body(probe) == {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True}
    assert chat.call_count == 0 and completions.call_count == 5
    assert body(completions) == {"model": "base", "prompt": "the quick brown fox", "max_tokens": 4, "temperature": 0.0}
    await provider.generate("again", model="base", max_tokens=4)
    assert probe.call_count == 1


async def test_on_completions_a_system_prompt_and_messages_become_blank_line_separated_text(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.post(TOKENIZE).mock(return_value=no_template())
    completions = mock.post(COMPLETIONS).mock(return_value=text_completion())
    await provider.generate("the quick brown fox", model="base", system_prompt="Be brief.", max_tokens=4)
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "the quick brown fox"},
    ]
    await provider.generate(conversation, model="base", max_tokens=4)
    assert body(completions, 0)["prompt"] == body(completions, 1)["prompt"] == "Be brief.\n\nthe quick brown fox"


async def test_a_model_with_a_chat_template_chats(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    probe = mock.post(TOKENIZE).mock(return_value=template_found())
    chat = mock.post(CHAT).mock(return_value=chat_completion("chatted"))
    result = await provider.generate("Hi", model="base", max_tokens=4)
    assert result.text == "chatted" and probe.call_count == 1
    assert body(chat)["messages"] == [{"role": "user", "content": "Hi"}]


async def test_a_server_without_tokenize_chats_as_before(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    probe = mock.post(TOKENIZE).mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
    mock.post(CHAT).mock(return_value=chat_completion("chatted"))
    assert (await provider.generate("Hi", model="base", max_tokens=4)).text == "chatted"
    assert (await provider.generate("Hi", model="base", max_tokens=4)).text == "chatted"
    assert probe.call_count == 1


async def test_completions_logprobs_are_read_in_their_own_format(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.post(TOKENIZE).mock(return_value=no_template())
    answer = text_completion(" wor\ufffd wor", logprobs=COMPLETION_LOGPROBS)
    completions = mock.post(COMPLETIONS).mock(return_value=answer)
    result = await provider.generate("the quick brown fox", model="base", max_tokens=3, logprobs=1)
    assert body(completions)["logprobs"] == 1 and "top_logprobs" not in body(completions)
    assert result.logprobs is not None
    assert [entry.token for entry in result.logprobs] == [" wor", "", " wor"]
    assert result.logprobs[0].logprob == pytest.approx(-5.701981067657471)
    assert result.logprobs[2].top_logprobs == ((" wor", pytest.approx(-5.600925445556641)),)


async def test_a_completions_stream_yields_text_usage_and_logprobs(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.post(TOKENIZE).mock(return_value=no_template())
    mock.post(COMPLETIONS).mock(
        return_value=httpx.Response(200, text=COMPLETION_STREAM, headers={"content-type": "text/event-stream"})
    )
    events = [event async for event in provider.stream("the quick brown fox", model="base", max_tokens=2, logprobs=0)]
    *pieces, result = events
    assert pieces == [" wor"]
    assert not isinstance(result, str)
    assert result.text == " wor" and result.finish_reason == "length"
    assert (result.prompt_tokens, result.completion_tokens) == (9, 2)
    assert result.logprobs is not None and [entry.token for entry in result.logprobs] == [" wor", ""]


@pytest.mark.parametrize(
    ("field", "problem"),
    [
        (("token_logprobs", 1), r"logprobs\.token_logprobs\[1\] is NaN, not a log-probability"),
        (("top_logprobs", 2, " l"), r"logprobs\.top_logprobs\[2\]\[' l'\] is Infinity, not a log-probability"),
    ],
    ids=["token NaN", "alternative +inf"],
)
async def test_completions_logprobs_that_are_not_log_probabilities_are_protocol_errors(
    provider: VLLMProvider, mock: respx.MockRouter, field: tuple[Any, ...], problem: str
) -> None:
    """The whole answer's NaN and infinity (Python's JSON writes them) were returned in ``result.logprobs``."""
    mock.post(TOKENIZE).mock(return_value=no_template())
    answer = text_completion(" wor\ufffd wor", logprobs=COMPLETION_LOGPROBS).json()
    *path, last = field
    place = answer["choices"][0]["logprobs"]
    for key in path:
        place = place[key]
    place[last] = {"token_logprobs": math.nan, "top_logprobs": math.inf}[field[0]]
    mock.post(COMPLETIONS).mock(side_effect=[
        httpx.Response(200, content=json.dumps(answer).encode(), headers={"content-type": "application/json"}),
        text_completion(" wor\ufffd wor", logprobs=COMPLETION_LOGPROBS),
    ])
    with pytest.raises(ProtocolError, match=problem):
        await provider.generate("the quick brown fox", model="base", max_tokens=3, logprobs=1)
    assert (await provider.generate("the quick brown fox", model="base", max_tokens=3, logprobs=1)).logprobs


async def test_a_completions_stream_with_a_nan_logprob_is_a_protocol_error(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """vLLM's own stream with its second token's logprob NaN: the result carried the NaN."""
    mock.post(TOKENIZE).mock(return_value=no_template())
    broken = COMPLETION_STREAM.replace('"token_logprobs":[-5.435140132904053]', '"token_logprobs":[NaN]')
    assert broken != COMPLETION_STREAM
    mock.post(COMPLETIONS).mock(
        return_value=httpx.Response(200, text=broken, headers={"content-type": "text/event-stream"})
    )
    with pytest.raises(ProtocolError, match=r"logprobs\.token_logprobs\[0\] is NaN, not a log-probability"):
        [event async for event in provider.stream("the quick brown fox", model="base", max_tokens=2, logprobs=0)]


async def test_forced_routes_ask_nothing(mock: respx.MockRouter) -> None:
    probe = mock.post(TOKENIZE).mock(return_value=no_template())
    completions = mock.post(COMPLETIONS).mock(return_value=text_completion())
    async with VLLMProvider(base_url=BASE, api="completions") as provider:
        await provider.generate("Hi", model="base", max_tokens=4)
    assert probe.call_count == 0 and completions.call_count == 1


async def test_chat_forced_on_a_model_without_a_template_says_what_to_set(mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=no_template())
    mock.post(COMPLETIONS).mock(return_value=text_completion("fine"))
    async with VLLMProvider(base_url=BASE, api="chat", max_retries=0) as provider:
        with pytest.raises(ServerResponseError, match=r"no chat template.*VLLM_API=auto") as caught:
            await provider.generate("Hi", model="base", max_tokens=4)
        assert caught.value.status_code == 400
    async with VLLMProvider(base_url=BASE, api="completions") as provider:
        assert (await provider.generate("Hi", model="base", max_tokens=4)).text == "fine"


async def test_an_unreachable_server_is_asked_again_once_it_is_up(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    probe = mock.post(TOKENIZE)
    probe.side_effect = [httpx.ConnectError("connection refused"), no_template()]
    mock.post(COMPLETIONS).mock(return_value=text_completion("up"))
    with pytest.raises(ProviderUnavailableError):
        await provider.generate("Hi", model="base", max_tokens=4)
    assert (await provider.generate("Hi", model="base", max_tokens=4)).text == "up"
    assert probe.call_count == 2
