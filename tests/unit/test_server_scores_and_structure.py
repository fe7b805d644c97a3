"""The HTTP providers' scores and structure on the wire: chat messages, token logprobs, JSON schemas, scoring.

Answers are shaped as the real servers send them:

- vLLM (``vllm/entrypoints/openai/chat_completion/protocol.py``, ``completion/protocol.py``): chat
  ``choices[0].logprobs.content[i] = {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}]}``, in whole answers and in each stream chunk; ``POST /tokenize`` answers ``{"count",
  "max_model_len", "tokens", "token_strs"}``; ``/v1/completions`` with ``prompt_logprobs`` answers
  ``choices[0].prompt_logprobs = [None, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]``.
- Ollama (``api/types.go``, 0.12.11 on): ``/api/chat`` answers and stream lines carry ``"logprobs": [{"token",
  "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]`` for their own tokens.
- llama_cpp.server 0.3: a ``response_format`` of type ``json_schema`` is refused with a 500 holding pydantic's
  ``literal_error``; ``{"type": "json_object", "schema": ...}`` is its form.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from inference.exceptions import InvalidRequestError, ProtocolError, ProviderError, UnsupportedOperationError
from inference.ollama_provider import OllamaProvider
from inference.openai_provider import OpenAIProvider
from inference.provider import GenerationResult
from inference.results import TokenLogprob
from inference.vllm_provider import VLLMProvider

ROOT = "http://vllm.test:8100"
BASE = f"{ROOT}/v1"
OLLAMA = "http://ollama.test:11434"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]


def entry(token: str, logprob: float, *alternatives: tuple[str, float]) -> dict[str, Any]:
    """One OpenAI/vLLM chat logprobs entry (vLLM sends ``bytes`` as a list of ints)."""
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in alternatives],
    }


def chat_completion(text: str, logprobs: list[dict[str, Any]] | None, tokens: int | None = None) -> httpx.Response:
    return httpx.Response(200, json=chat_body(text, logprobs, tokens))


def chat_body(text: str, logprobs: list[dict[str, Any]] | None, tokens: int | None = None) -> dict[str, Any]:
    completion_tokens = len(logprobs or []) if tokens is None else tokens
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "base-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "reasoning": None, "tool_calls": []},
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
        "usage": {
            "prompt_tokens": 9,
            "total_tokens": 9 + completion_tokens,
            "completion_tokens": completion_tokens,
        },
    }


def sse(*chunks: dict[str, Any]) -> httpx.Response:
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


def chunk(content: str | None, logprobs: list[dict[str, Any]] | None, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "base-model",
        "choices": [
            {
                "index": 0,
                "delta": {"content": content} if content is not None else {"role": "assistant", "content": ""},
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish,
            }
        ],
    }


def sent(route: respx.Route, call: int = -1) -> Any:
    return json.loads(route.calls[call].request.content)


def python_json(body: Any) -> httpx.Response:
    """A JSON answer as Python's ``json.dumps`` writes it: ``NaN`` and ``Infinity`` unquoted (httpx refuses them)."""
    return httpx.Response(200, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


NOT_LOGPROBS = pytest.mark.parametrize("value", [math.nan, math.inf, 0.5], ids=["NaN", "+inf", "above 0"])
"""Values a server may send where a log-probability belongs, none of which is one."""


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


# Chat messages, logprobs and JSON schemas on the OpenAI-compatible route -----------------------------------


async def test_vllm_sends_messages_logprobs_and_schema_and_reads_the_logprobs(mock: respx.MockRouter) -> None:
    route = mock.post(f"{BASE}/chat/completions").mock(
        return_value=chat_completion(
            '{"answer": 6}',
            [
                entry('{"', -0.25, ('{"', -0.25), ("{", -1.5)),
                entry('answer": 6}', -0.5, ("x", -3.0), ('answer": 6}', -0.5)),
            ],
        )
    )
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        result = await provider.generate(CONVERSATION, model="base-model", max_tokens=8, logprobs=2, json_schema=SCHEMA)
    body = sent(route)
    assert body["messages"] == CONVERSATION
    assert body["logprobs"] is True and body["top_logprobs"] == 2
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": SCHEMA, "strict": True},
    }
    assert json.loads(result.text) == {"answer": 6}
    assert result.logprobs == (
        TokenLogprob('{"', -0.25, (('{"', -0.25), ("{", -1.5))),
        TokenLogprob('answer": 6}', -0.5, (('answer": 6}', -0.5), ("x", -3.0))),  # sorted best first
    )


async def test_without_the_options_nothing_new_is_sent_and_logprobs_are_none(mock: respx.MockRouter) -> None:
    route = mock.post(f"{BASE}/chat/completions").mock(return_value=chat_completion("Hi", None))
    async with OpenAIProvider(base_url=BASE, max_retries=0) as provider:
        result = await provider.generate("Hello", model="m", max_tokens=4, system_prompt="")
    body = sent(route)
    assert body["messages"] == [{"role": "system", "content": ""}, {"role": "user", "content": "Hello"}]
    assert not {"logprobs", "top_logprobs", "response_format"} & set(body)
    assert result.logprobs is None


async def test_a_stream_gathers_the_logprobs_of_every_chunk_into_the_result(mock: respx.MockRouter) -> None:
    route = mock.post(f"{BASE}/chat/completions").mock(
        return_value=sse(
            chunk(None, None),
            chunk("Hel", [entry("Hel", -0.1, ("Hel", -0.1))]),
            chunk("lo", [entry("lo", -0.2, ("lo", -0.2))], finish="length"),
            {
                **chunk(None, None),
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            },
        )
    )
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        events = [event async for event in provider.stream("Hi", model="base-model", max_tokens=2, logprobs=1)]
    assert sent(route)["top_logprobs"] == 1 and sent(route)["stream"] is True
    *pieces, final = events
    assert pieces == ["Hel", "lo"]
    assert isinstance(final, GenerationResult)
    assert final.logprobs == (TokenLogprob("Hel", -0.1, (("Hel", -0.1),)), TokenLogprob("lo", -0.2, (("lo", -0.2),)))


async def test_no_stop_string_is_sent_with_a_schema_and_a_cut_answer_is_an_error(mock: respx.MockRouter) -> None:
    # vLLM applies stop strings to structured output too: sent '}', it answers the JSON cut there, as "stop".
    route = mock.post(f"{BASE}/chat/completions").mock(
        side_effect=[chat_completion('{"answer": 6}', None, tokens=5), chat_completion('{"answer"', None, tokens=3)]
    )
    ollama = mock.post(f"{OLLAMA}/api/chat").mock(
        return_value=httpx.Response(200, json=ollama_line('{"answer":6}', None, done=True))
    )
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        result = await provider.generate("Hi", model="base-model", max_tokens=8, json_schema=SCHEMA, stop=[":", "}"])
        assert "stop" not in sent(route) and result.text == '{"answer": 6}'
        with pytest.raises(ProviderError, match=r"not complete JSON .*'\{\"answer\"'"):
            await provider.generate("Hi", model="base-model", max_tokens=8, json_schema=SCHEMA)
    async with OllamaProvider(base_url=f"{OLLAMA}/v1", max_retries=0) as provider:
        await provider.generate("Hi", model="qwen", max_tokens=8, json_schema=SCHEMA, stop="}")
        await provider.generate("Hi", model="qwen", max_tokens=8, stop="}")
    assert "stop" not in sent(ollama, 0)["options"] and sent(ollama, 1)["options"]["stop"] == ["}"]


async def test_a_server_without_chat_logprobs_is_named(mock: respx.MockRouter) -> None:
    mock.post(f"{BASE}/chat/completions").mock(return_value=chat_completion("Hi", None, tokens=1))
    async with OpenAIProvider(base_url=BASE, max_retries=0) as provider:
        with pytest.raises(ProtocolError, match="without the token logprobs"):
            await provider.generate("Hello", model="m", max_tokens=4, logprobs=0)


@NOT_LOGPROBS
@pytest.mark.parametrize("alternative", [False, True], ids=["token", "alternative"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_a_chat_logprob_that_is_not_a_log_probability_is_a_protocol_error(
    mock: respx.MockRouter, value: float, alternative: bool, streamed: bool
) -> None:
    """A NaN, +inf or 0.5 (a probability above 1) as a token's logprob or an alternative's was returned in
    ``result.logprobs`` as it came (an alternative's NaN sorted anywhere); the provider serves the next request."""
    bad = entry("lo", -0.2, ("lo", value)) if alternative else entry("lo", value, ("lo", -0.2))
    good = entry("Hel", -0.1, ("Hel", -0.1))
    if streamed:
        answer = sse(chunk(None, None), chunk("Hel", [good]), chunk("lo", [bad], finish="length"))
        field = r"logprobs\.content\[0\]"
    else:
        answer = python_json(chat_body("Hello", [good, bad]))
        field = r"logprobs\.content\[1\]"
    field += r"\.top_logprobs\[0\]\.logprob" if alternative else r"\.logprob"
    mock.post(f"{BASE}/chat/completions").mock(side_effect=[answer, chat_completion("fine", [good])])
    problem = rf"{field} is {json.dumps(value)}, not a log-probability \(a number at most 0\)"
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        with pytest.raises(ProtocolError, match=problem):
            if streamed:
                [event async for event in provider.stream("Hi", model="base-model", max_tokens=2, logprobs=1)]
            else:
                await provider.generate("Hi", model="base-model", max_tokens=2, logprobs=1)
        assert (await provider.generate("Hi", model="base-model", max_tokens=2, logprobs=1)).text == "fine"


async def test_minus_infinity_is_a_log_probability_and_a_rounding_above_0_reads_as_0(mock: respx.MockRouter) -> None:
    """-inf is probability 0 (a token the model cannot produce: Python servers write ``-Infinity``, vLLM clamps it to
    -9999.0); 1e-7 above 0 is float32 rounding of a certain token's log-probability, read as 0.0."""
    logprobs = [entry("Hel", 1e-7, ("Hel", 1e-7), ("x", -math.inf)), entry("lo", -9999.0, ("lo", -9999.0))]
    mock.post(f"{BASE}/chat/completions").mock(return_value=python_json(chat_body("Hello", logprobs)))
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        result = await provider.generate("Hi", model="base-model", max_tokens=2, logprobs=2)
    assert result.logprobs == (
        TokenLogprob("Hel", 0.0, (("Hel", 0.0), ("x", -math.inf))),
        TokenLogprob("lo", -9999.0, (("lo", -9999.0),)),
    )


async def test_a_schema_vllm_cannot_compile_is_an_invalid_request(mock: respx.MockRouter) -> None:
    message = "The provided JSON schema contains features not supported by xgrammar."
    mock.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(
            400, json={"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
        )
    )
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        with pytest.raises(InvalidRequestError, match=r"could not use the json_schema.*xgrammar"):
            await provider.generate("Hi", model="base-model", max_tokens=4, json_schema=SCHEMA)


async def test_llama_cpp_servers_schema_form_is_used_after_it_refuses_openais(mock: respx.MockRouter) -> None:
    refusal = (
        "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': "
        "\"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected': "
        "\"'text' or 'json_object'\"}}"
    )
    route = mock.post(f"{BASE}/chat/completions").mock(
        side_effect=[
            httpx.Response(500, json={"message": refusal}),
            chat_completion('{"answer": 1}', None),
            chat_completion('{"answer": 2}', None),
        ]
    )
    async with OpenAIProvider(base_url=BASE, max_retries=0) as provider:
        first = await provider.generate("Hi", model="m", max_tokens=8, json_schema=SCHEMA)
        second = await provider.generate("Hi", model="m", max_tokens=8, json_schema=SCHEMA)
    assert (first.text, second.text) == ('{"answer": 1}', '{"answer": 2}')
    assert sent(route, 0)["response_format"]["type"] == "json_schema"
    assert sent(route, 1)["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert sent(route, 2)["response_format"] == {"type": "json_object", "schema": SCHEMA}  # remembered
    assert len(route.calls) == 3


# Scoring on vLLM ---------------------------------------------------------------------------------------------

VOCAB = {"Q: 2+2 =": [48, 25, 220, 17, 10, 17, 284], "Q: 2+2 = 4": [48, 25, 220, 17, 10, 17, 284, 220, 19], "x": [87]}
EOS = 151643


def tokenize_answer(max_model_len: int = 64, vocabulary: dict[str, list[int]] | None = None) -> Any:
    words = vocabulary or VOCAB

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        tokens = [EOS] if body["prompt"] == "<|endoftext|>" else list(words[body["prompt"]])
        return httpx.Response(
            200, json={"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": None}
        )

    return answer


def prompt_logprobs_answer(logprob_of: Any, rank_of: Any = lambda index: 1) -> Any:
    def answer(request: httpx.Request) -> httpx.Response:
        tokens = json.loads(request.content)["prompt"]
        positions: list[Any] = [None]
        for index in range(1, len(tokens)):
            positions.append(
                {str(tokens[index]): {"logprob": logprob_of(index), "rank": rank_of(index), "decoded_token": "t"}}
            )
        return python_json(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1700000000,
                "model": json.loads(request.content)["model"],
                "choices": [
                    {
                        "index": 0,
                        "text": "!",
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                        "prompt_logprobs": positions,
                    }
                ],
                "usage": {"prompt_tokens": len(tokens), "total_tokens": len(tokens) + 1, "completion_tokens": 1},
            }
        )

    return answer


async def test_vllm_scores_with_the_shared_tokenization_rule_and_prompt_logprobs(mock: respx.MockRouter) -> None:
    tokenize = mock.post(f"{ROOT}/tokenize").mock(side_effect=tokenize_answer())
    mock.get(f"{ROOT}/tokenizer_info").mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
    completions = mock.post(f"{BASE}/completions").mock(
        side_effect=prompt_logprobs_answer(lambda index: -0.5 * index, lambda index: 1 if index != 8 else 3)
    )
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        result = await provider.score("Q: 2+2 = ", "4", model="base-model")
    assert {json.loads(call.request.content)["add_special_tokens"] for call in tokenize.calls} == {False, True}
    body = sent(completions)
    # The context's trailing space moved to the continuation: " 4" is tokens 220, 19 (positions 7 and 8).
    assert body == {
        "model": "base-model",
        "prompt": VOCAB["Q: 2+2 = 4"],
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 1,
        "add_special_tokens": False,
    }
    assert result.num_tokens == 2
    assert result.logprob == pytest.approx(-0.5 * 7 - 0.5 * 8)
    assert result.is_greedy is False  # token 8 was ranked 3rd
    assert result.model == "base-model" and result.adapter_id is None


async def test_vllm_scores_an_empty_context_from_the_eos_token_of_tokenizer_info(mock: respx.MockRouter) -> None:
    mock.post(f"{ROOT}/tokenize").mock(side_effect=tokenize_answer(vocabulary={"x": [87], "abc": [1, 2, 3]}))
    mock.get(f"{ROOT}/tokenizer_info").mock(
        return_value=httpx.Response(
            200, json={"tokenizer_class": "Qwen2TokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None}
        )
    )
    completions = mock.post(f"{BASE}/completions").mock(side_effect=prompt_logprobs_answer(lambda index: -1.0))
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        result = await provider.score("", "abc", model="base-model")
    assert sent(completions)["prompt"] == [EOS, 1, 2, 3]
    assert result.num_tokens == 3 and result.logprob == pytest.approx(-3.0) and result.is_greedy


async def test_vllm_score_rolling_sums_windows_of_the_servers_context(mock: respx.MockRouter) -> None:
    text_tokens = list(range(1, 11))
    mock.post(f"{ROOT}/tokenize").mock(
        side_effect=tokenize_answer(max_model_len=6, vocabulary={"x": [87], "long text": text_tokens})
    )
    mock.get(f"{ROOT}/tokenizer_info").mock(return_value=httpx.Response(200, json={"eos_token": "<|endoftext|>"}))
    completions = mock.post(f"{BASE}/completions").mock(side_effect=prompt_logprobs_answer(lambda index: -0.1))
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        result = await provider.score_rolling("long text", model="base-model")
    prompts = [json.loads(call.request.content)["prompt"] for call in completions.calls]
    assert all(len(prompt) + 1 <= 6 for prompt in prompts)  # prompt plus the one generated token fit
    # max_model_len 6: one token before the scored ones, 4 scored, 1 generated; 10 tokens make 3 windows
    assert prompts == [[EOS, 1, 2, 3, 4], [4, 5, 6, 7, 8], [6, 7, 8, 9, 10]]  # the last: 9, 10 after a full context
    assert result.num_tokens == 10
    assert result.logprob == pytest.approx(-1.0)
    assert not math.isnan(result.nll_per_token)


async def test_vllm_refuses_to_score_past_its_context(mock: respx.MockRouter) -> None:
    mock.post(f"{ROOT}/tokenize").mock(side_effect=tokenize_answer(max_model_len=5))
    mock.get(f"{ROOT}/tokenizer_info").mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        with pytest.raises(InvalidRequestError, match="max-model-len"):
            await provider.score("Q: 2+2 =", " 4", model="base-model")


async def test_an_adapter_scores_under_its_served_name(mock: respx.MockRouter) -> None:
    mock.post(f"{ROOT}/tokenize").mock(side_effect=tokenize_answer())
    mock.get(f"{ROOT}/tokenizer_info").mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
    mock.post(f"{BASE}/load_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
    mock.get(f"{BASE}/models").mock(return_value=httpx.Response(200, json={"object": "list", "data": [
        {"id": "base-model", "object": "model", "created": 1700000000, "owned_by": "vllm", "root": "/models/base",
         "parent": None, "max_model_len": 2048, "permission": []},
    ]}))  # no LoRA adapter yet: a first load asks
    completions = mock.post(f"{BASE}/completions").mock(side_effect=prompt_logprobs_answer(lambda index: -1.0))
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        await provider.load_adapter("style", "/srv/adapters/style")
        result = await provider.score("Q: 2+2 =", " 4", model="base-model", adapter_id="style")
    assert sent(completions)["model"] == "style"
    assert result.adapter_id == "style" and result.model == "style"


@NOT_LOGPROBS
async def test_a_prompt_logprob_that_is_not_a_log_probability_is_a_protocol_error_not_a_score(
    mock: respx.MockRouter, value: float
) -> None:
    """A scored token's NaN made the score NaN (an evaluation's choice then depends on where the NaN stands), +inf
    or 0.5 made it a probability above 1; the provider scores the next request."""
    mock.post(f"{ROOT}/tokenize").mock(side_effect=tokenize_answer())
    mock.get(f"{ROOT}/tokenizer_info").mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
    mock.post(f"{BASE}/completions").mock(side_effect=[
        prompt_logprobs_answer(lambda index: value if index == 8 else -0.5),
        prompt_logprobs_answer(lambda index: -0.5),
    ])
    problem = rf"prompt_logprobs\[8\]\['19'\]\.logprob is {json.dumps(value)}, not a log-probability"
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        with pytest.raises(ProtocolError, match=problem):
            await provider.score("Q: 2+2 = ", "4", model="base-model")
        assert (await provider.score("Q: 2+2 = ", "4", model="base-model")).logprob == pytest.approx(-1.0)


async def test_a_prompt_logprob_of_minus_infinity_scores_minus_infinity(mock: respx.MockRouter) -> None:
    """A continuation the model gives probability 0 scores -inf: a choice that is never the most likely one."""
    mock.post(f"{ROOT}/tokenize").mock(side_effect=tokenize_answer())
    mock.get(f"{ROOT}/tokenizer_info").mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
    mock.post(f"{BASE}/completions").mock(
        side_effect=prompt_logprobs_answer(lambda index: -math.inf if index == 8 else -0.5)
    )
    async with VLLMProvider(base_url=BASE, max_retries=0) as provider:
        result = await provider.score("Q: 2+2 = ", "4", model="base-model")
    assert result.logprob == -math.inf and result.num_tokens == 2


async def test_only_vllm_scores_among_the_server_providers() -> None:
    assert VLLMProvider.supports_scoring and not OpenAIProvider.supports_scoring
    assert not OllamaProvider.supports_scoring
    async with OpenAIProvider(base_url=BASE) as provider:
        with pytest.raises(UnsupportedOperationError, match="vllm"):
            await provider.score("a", "b", model="m")
    async with OllamaProvider(base_url=f"{OLLAMA}/v1") as ollama:
        with pytest.raises(UnsupportedOperationError, match="vllm"):
            await ollama.score_rolling("text", model="m")


# Ollama ------------------------------------------------------------------------------------------------------


def ollama_line(content: str, logprobs: list[dict[str, Any]] | None, *, done: bool) -> dict[str, Any]:
    line: dict[str, Any] = {
        "model": "qwen",
        "created_at": "2025-01-01T00:00:00Z",
        "message": {"role": "assistant", "content": content},
        "done": done,
    }
    if logprobs is not None:
        line["logprobs"] = logprobs
    if done:
        line.update(done_reason="stop", prompt_eval_count=7, eval_count=2)
    return line


async def test_ollama_sends_messages_format_and_logprobs_and_reads_them(mock: respx.MockRouter) -> None:
    route = mock.post(f"{OLLAMA}/api/chat").mock(
        return_value=httpx.Response(
            200,
            json=ollama_line(
                '{"answer":6}', [entry('{"', -0.3, ("{", -2.0), ('{"', -0.3)), entry('answer":6}', -0.1)], done=True
            ),
        )
    )
    async with OllamaProvider(base_url=f"{OLLAMA}/v1", max_retries=0) as provider:
        result = await provider.generate(CONVERSATION, model="qwen", max_tokens=8, logprobs=1, json_schema=SCHEMA)
    body = sent(route)
    assert body["messages"] == CONVERSATION
    assert body["format"] == SCHEMA
    assert body["logprobs"] is True and body["top_logprobs"] == 1
    assert result.logprobs == (TokenLogprob('{"', -0.3, (('{"', -0.3),)), TokenLogprob('answer":6}', -0.1, ()))


async def test_ollama_streams_gather_logprobs_from_every_line(mock: respx.MockRouter) -> None:
    lines = [
        ollama_line("Hel", [entry("Hel", -0.1)], done=False),
        ollama_line("lo", [entry("lo", -0.2)], done=False),
        ollama_line("", None, done=True),
    ]
    mock.post(f"{OLLAMA}/api/chat").mock(
        return_value=httpx.Response(200, content=b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    )
    async with OllamaProvider(base_url=f"{OLLAMA}/v1", max_retries=0) as provider:
        events = [event async for event in provider.stream("Hi", model="qwen", max_tokens=2, logprobs=0)]
    final = events[-1]
    assert isinstance(final, GenerationResult)
    assert final.logprobs == (TokenLogprob("Hel", -0.1), TokenLogprob("lo", -0.2))


@NOT_LOGPROBS
@pytest.mark.parametrize("alternative", [False, True], ids=["token", "alternative"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_an_ollama_logprob_that_is_not_a_log_probability_is_a_protocol_error(
    mock: respx.MockRouter, value: float, alternative: bool, streamed: bool
) -> None:
    """Ollama's own JSON writer cannot write NaN or infinity, but a server in its place can: they, and 0.5, were
    returned in ``result.logprobs`` (an alternative's sorted anywhere); the provider serves the next request."""
    bad = entry("lo", -0.2, ("lo", value)) if alternative else entry("lo", value)
    field = r"logprobs\[0\]\.top_logprobs\[0\]\.logprob" if alternative else r"logprobs\[0\]\.logprob"
    if streamed:
        lines = [ollama_line("lo", [bad], done=False), ollama_line("", None, done=True)]
        answer = httpx.Response(200, content=b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    else:
        answer = python_json(ollama_line("lo", [bad], done=True))
    fine = httpx.Response(200, json=ollama_line("fine", [entry("fine", -0.1)], done=True))
    mock.post(f"{OLLAMA}/api/chat").mock(side_effect=[answer, fine])
    async with OllamaProvider(base_url=f"{OLLAMA}/v1", max_retries=0) as provider:
        with pytest.raises(ProtocolError, match=rf"{field} is {json.dumps(value)}, not a log-probability"):
            if streamed:
                [event async for event in provider.stream("Hi", model="qwen", max_tokens=2, logprobs=1)]
            else:
                await provider.generate("Hi", model="qwen", max_tokens=2, logprobs=1)
        assert (await provider.generate("Hi", model="qwen", max_tokens=2, logprobs=1)).text == "fine"


async def test_an_old_ollama_without_logprobs_is_named(mock: respx.MockRouter) -> None:
    mock.post(f"{OLLAMA}/api/chat").mock(return_value=httpx.Response(200, json=ollama_line("Hi", None, done=True)))
    async with OllamaProvider(base_url=f"{OLLAMA}/v1", max_retries=0) as provider:
        with pytest.raises(ProtocolError, match=r"0\.12\.11"):
            await provider.generate("Hi", model="qwen", max_tokens=2, logprobs=2)


async def test_a_format_ollama_refuses_is_an_invalid_request(mock: respx.MockRouter) -> None:
    mock.post(f"{OLLAMA}/api/chat").mock(
        return_value=httpx.Response(400, json={"error": "invalid JSON schema in format"})
    )
    async with OllamaProvider(base_url=f"{OLLAMA}/v1", max_retries=0) as provider:
        with pytest.raises(InvalidRequestError, match="json_schema"):
            await provider.generate("Hi", model="qwen", max_tokens=2, json_schema=SCHEMA)
