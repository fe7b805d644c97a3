"""Ollama's request options of issue 25 on the wire: the penalties and min_p in ``options`` (Ollama passes them to
llama.cpp's sampler, OpenAI's additive meaning, never remapped to ``repeat_penalty``), ``n`` as n seeded requests,
``raw_prompt`` on ``/api/generate`` with ``raw: true``, ``extra_body`` merged into the body, ``thinking`` as ``think``.

Answers are Ollama's (its ``api/types.go``: ``GenerateResponse`` has ``response``, ``thinking``, ``done``,
``done_reason``, ``context`` and the counts; a stream is NDJSON lines, the last with ``done: true``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from inference.ollama_provider import OllamaProvider
from inference.results import GenerationResult

ROOT = "http://ollama.test:11434"
CHAT, GENERATE = f"{ROOT}/api/chat", f"{ROOT}/api/generate"


def chat_reply(text: str = "Hi!", **extra: Any) -> httpx.Response:
    return httpx.Response(200, json={
        "model": "llama3.2", "created_at": "2026-01-01T00:00:00.000000Z",
        "message": {"role": "assistant", "content": text, **extra}, "done": True, "done_reason": "stop",
        "total_duration": 5191566416, "load_duration": 2154458, "prompt_eval_count": 26,
        "prompt_eval_duration": 383809000, "eval_count": 8, "eval_duration": 4799921000,
    })


def generate_reply(text: str, **extra: Any) -> httpx.Response:
    return httpx.Response(200, json={
        "model": "llama3.2", "created_at": "2026-01-01T00:00:00.000000Z", "response": text, **extra, "done": True,
        "done_reason": "stop", "context": [128006, 882, 128007, 271, 9906], "total_duration": 5043500667,
        "load_duration": 5025959, "prompt_eval_count": 5, "prompt_eval_duration": 325953000, "eval_count": 3,
        "eval_duration": 4709213000,
    })


def sent(route: respx.Route, call: int = -1) -> Any:
    return json.loads(route.calls[call].request.content)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.fixture
async def provider() -> AsyncIterator[OllamaProvider]:
    async with OllamaProvider(base_url=f"{ROOT}/v1", max_retries=1) as ollama:
        yield ollama


async def test_the_penalties_and_min_p_go_to_options_under_their_own_names(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    await provider.generate("Hi", model="llama3.2", max_tokens=16, presence_penalty=0.5, frequency_penalty=-0.25,
                            min_p=0.05)
    assert sent(route) == {
        "model": "llama3.2", "messages": [{"role": "user", "content": "Hi"}], "stream": False,
        "options": {"num_predict": 16, "presence_penalty": 0.5, "frequency_penalty": -0.25, "min_p": 0.05},
    }


async def test_n_is_n_seeded_requests_joined_in_choices(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=[chat_reply("one"), chat_reply("two"), chat_reply("three")])
    result = await provider.generate("Hi", model="llama3.2", max_tokens=4, n=3, seed=7, temperature=0.9)
    assert sorted(sent(route, index)["options"]["seed"] for index in range(3)) == [7, 8, 9]
    assert result.choices is not None and sorted(choice.text for choice in result.choices) == ["one", "three", "two"]
    assert result.completion_tokens == 24 and result.prompt_tokens == 26


async def test_a_raw_prompt_goes_to_api_generate_as_it_is(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(GENERATE).mock(return_value=generate_reply(" Paris.", thinking="The capital."))
    result = await provider.generate("Q: capital of France?\nA:", model="llama3.2", max_tokens=8, raw_prompt=True,
                                     temperature=0)
    assert sent(route) == {"model": "llama3.2", "prompt": "Q: capital of France?\nA:", "raw": True, "stream": False,
                           "options": {"num_predict": 8, "temperature": 0}}
    assert (result.text, result.reasoning, result.prompt_tokens, result.completion_tokens) == (
        " Paris.", "The capital.", 5, 3
    )
    assert result.finish_reason == "stop"


async def test_a_raw_prompt_streams_from_api_generate(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    lines = [
        {"model": "llama3.2", "created_at": "2026-01-01T00:00:00Z", "response": piece, "done": False}
        for piece in (" Par", "is", ".")
    ]
    lines.append({"model": "llama3.2", "created_at": "2026-01-01T00:00:01Z", "response": "", "done": True,
                  "done_reason": "length", "context": [1, 2, 3], "total_duration": 1000, "prompt_eval_count": 5,
                  "eval_count": 3})
    content = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    route = mock.post(GENERATE).mock(
        return_value=httpx.Response(200, content=content, headers={"content-type": "application/x-ndjson"})
    )
    events = [event async for event in provider.stream("A:", model="llama3.2", max_tokens=3, raw_prompt=True)]
    assert sent(route)["raw"] is True and sent(route)["stream"] is True and "messages" not in sent(route)
    final = events[-1]
    assert events[:-1] == [" Par", "is", "."]
    assert isinstance(final, GenerationResult) and final.text == " Paris." and final.finish_reason == "length"


async def test_extra_body_is_merged_into_the_body_and_its_options(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    await provider.generate("Hi", model="llama3.2", max_tokens=16, temperature=0.2, thinking=False,
                            extra_body={"keep_alive": "10m", "options": {"num_ctx": 8192, "temperature": 0.3}})
    assert sent(route) == {
        "model": "llama3.2", "messages": [{"role": "user", "content": "Hi"}], "stream": False, "think": False,
        "keep_alive": "10m", "options": {"num_predict": 16, "temperature": 0.3, "num_ctx": 8192},
    }
