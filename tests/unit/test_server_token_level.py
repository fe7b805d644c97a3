"""What the servers' token level refuses, with the servers' own bodies (respx: a real server cannot be made to answer
a short distribution or, in the suite, run without ``--max-logprobs -1``).

The bodies are the shapes vLLM 0.32 and llama-server answer (``tests/integration/test_vllm_server_tokens.py`` and
``test_llama_server_tokens.py`` check the full ones live); the error text is vLLM's ``SamplingParams`` check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import respx

from inference.exceptions import ProtocolError, ProviderError, UnsupportedOperationError
from inference.llamacpp_server_provider import LlamaCppServerProvider
from inference.tokens import TokenIds
from inference.vllm_provider import VLLMProvider

VLLM = "http://127.0.0.1:9"
LLAMA = "http://127.0.0.1:8"
SIZE = 512  # the tiny Qwen2's vocabulary (its config.json: vocab_size)


def vllm_distribution(entries: int) -> dict[str, Any]:
    """vLLM's answer to a one-token completion with ``logprobs`` and ``return_tokens_as_token_ids``."""
    top = {f"token_id:{token}": -float(np.log(SIZE)) for token in range(entries)}
    return {
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "tiny",
        "choices": [{
            "index": 0, "text": "!", "finish_reason": "length", "stop_reason": None, "token_ids": None,
            "prompt_logprobs": None, "prompt_token_ids": None,
            "logprobs": {"text_offset": [0], "token_logprobs": [-6.238], "tokens": ["token_id:0"],
                         "top_logprobs": [top]},
        }],
        "usage": {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": None},
    }


@pytest.fixture
def vllm(tiny_models: dict[str, Any]) -> Iterator[respx.MockRouter]:
    root = str(tiny_models["qwen2"].hf_dir)  # a model directory on this machine, as the server reports it
    with respx.mock(assert_all_called=False) as router:
        router.get(f"{VLLM}/v1/models").mock(return_value=httpx.Response(200, json={"object": "list", "data": [
            {"id": "tiny", "object": "model", "root": root, "parent": None, "max_model_len": 512}]}))
        router.post(f"{VLLM}/tokenize").mock(return_value=httpx.Response(
            200, json={"count": 1, "max_model_len": 512, "tokens": [90], "token_strs": None}))
        router.get(f"{VLLM}/tokenizer_info").mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
        yield router


async def test_a_vllm_distribution_that_lacks_ids_is_an_error_never_a_row(vllm: respx.MockRouter) -> None:
    completions = vllm.post(f"{VLLM}/v1/completions")
    completions.mock(return_value=httpx.Response(200, json=vllm_distribution(SIZE - 2)))
    async with VLLMProvider(base_url=f"{VLLM}/v1", max_retries=0) as provider:
        with pytest.raises(ProviderError, match=f"gave {SIZE - 2} of the {SIZE} logprobs"):
            await provider.next_token_logprobs([5, 6], "tiny")
        completions.mock(return_value=httpx.Response(200, json=vllm_distribution(SIZE)))
        row = await provider.next_token_logprobs([5, 6], "tiny")  # the provider keeps serving
    assert row.shape == (SIZE,) and abs(float(np.logaddexp.reduce(row.astype(np.float64)))) < 1e-4


def python_json(body: Any) -> httpx.Response:
    """A JSON answer as Python's ``json.dumps`` writes it: ``NaN`` and ``Infinity`` unquoted (httpx refuses them)."""
    return httpx.Response(200, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


NOT_LOGPROBS = pytest.mark.parametrize("value", [math.nan, math.inf, 0.5], ids=["NaN", "+inf", "above 0"])


@NOT_LOGPROBS
async def test_a_vllm_distribution_value_that_is_not_a_log_probability_is_a_protocol_error(
    vllm: respx.MockRouter, value: float
) -> None:
    """A NaN was taken for a missing id (the error said to restart vLLM with --max-logprobs -1); +inf or 0.5 was
    returned in the row."""
    bad = vllm_distribution(SIZE)
    bad["choices"][0]["logprobs"]["top_logprobs"][0]["token_id:7"] = value
    vllm.post(f"{VLLM}/v1/completions").mock(
        side_effect=[python_json(bad), httpx.Response(200, json=vllm_distribution(SIZE))]
    )
    problem = rf"top_logprobs\[0\]\['token_id:7'\] is {json.dumps(value)}, not a log-probability"
    async with VLLMProvider(base_url=f"{VLLM}/v1", max_retries=0) as provider:
        with pytest.raises(ProtocolError, match=problem):
            await provider.next_token_logprobs([5, 6], "tiny")
        assert (await provider.next_token_logprobs([5, 6], "tiny")).shape == (SIZE,)  # the provider keeps serving


async def test_a_vllm_server_without_max_logprobs_says_how_to_start_it(vllm: respx.MockRouter) -> None:
    vllm.post(f"{VLLM}/v1/completions").mock(return_value=httpx.Response(400, json={"error": {
        "message": f"Requested sample logprobs of {SIZE}, which is greater than max allowed: 20",
        "type": "BadRequestError", "param": "logprobs", "code": 400}}))
    async with VLLMProvider(base_url=f"{VLLM}/v1", max_retries=0) as provider:
        with pytest.raises(UnsupportedOperationError, match="--max-logprobs -1"):
            await provider.next_token_logprobs([5], "tiny")


async def test_a_vllm_model_directory_elsewhere_refuses_the_vocabulary_but_tokenizes_and_takes_ids() -> None:
    with respx.mock(assert_all_called=False) as router:
        router.get(f"{VLLM}/v1/models").mock(return_value=httpx.Response(200, json={"object": "list", "data": [
            {"id": "tiny", "object": "model", "root": "/models/on-the-server", "parent": None}]}))
        router.post(f"{VLLM}/tokenize").mock(return_value=httpx.Response(
            200, json={"count": 2, "max_model_len": 512, "tokens": [86, 260], "token_strs": None}))
        async with VLLMProvider(base_url=f"{VLLM}/v1", max_retries=0) as provider:
            with pytest.raises(UnsupportedOperationError, match=r"'/models/on-the-server'.*readable at the same path"):
                await provider.token_vocabulary("tiny")
            assert await provider.tokenize("the", "tiny") == [86, 260]
            completions = router.post(f"{VLLM}/v1/completions").mock(return_value=httpx.Response(200, json={
                "id": "cmpl-2", "object": "text_completion", "created": 1, "model": "tiny",
                "choices": [{"index": 0, "text": " wor", "logprobs": None, "finish_reason": "length",
                             "stop_reason": None, "token_ids": [146, 316], "prompt_logprobs": None,
                             "prompt_token_ids": [86, 260]}],
                "usage": {"prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2}}))
            result = await provider.generate(TokenIds([86, 260]), "tiny", max_tokens=2, return_token_ids=True)
            assert result.token_ids == (146, 316)  # a TokenIds prompt is sent unchecked: the server checks it
            assert json.loads(completions.calls.last.request.content)["prompt"] == [86, 260]


def llama_distribution(entries: int) -> dict[str, Any]:
    """llama-server's answer to ``/v1/completions`` with ``logprobs`` (its ``n_probs``): the chat form."""
    top = [{"id": token, "token": "a", "bytes": [97], "logprob": -float(np.log(SIZE))} for token in range(entries)]
    return {
        "choices": [{"text": "a", "index": 0, "finish_reason": "length", "logprobs": {"content": [
            {"id": 0, "token": "a", "bytes": [97], "logprob": -6.238, "top_logprobs": top}]}}],
        "created": 1, "model": "m.gguf", "object": "text_completion", "id": "chatcmpl-1",
        "usage": {"completion_tokens": 1, "prompt_tokens": 1, "total_tokens": 2},
    }


def llama_server_routes(router: respx.MockRouter) -> None:
    """The routes a llama-server provider reads before a distribution: its model, /tokenize, /props, adapters."""
    router.get(f"{LLAMA}/v1/models").mock(return_value=httpx.Response(200, json={"object": "list", "data": [
        {"id": "m.gguf", "object": "model", "meta": {"n_vocab": SIZE, "n_ctx": 512}}]}))
    router.post(f"{LLAMA}/tokenize").mock(return_value=httpx.Response(200, json={"tokens": [90]}))
    router.get(f"{LLAMA}/props").mock(return_value=httpx.Response(200, json={
        "chat_template": "", "model_path": "/models/m.gguf", "bos_token": "", "eos_token": ""}))
    router.get(f"{LLAMA}/lora-adapters").mock(return_value=httpx.Response(200, json=[]))


async def test_a_llama_server_distribution_that_lacks_ids_is_an_error_never_a_row() -> None:
    with respx.mock(assert_all_called=False) as router:
        llama_server_routes(router)
        completions = router.post(f"{LLAMA}/v1/completions")
        completions.side_effect = [httpx.Response(200, json=llama_distribution(SIZE)),  # the vocabulary's bytes
                                   httpx.Response(200, json=llama_distribution(40)),  # n_probs answered in part
                                   httpx.Response(200, json=llama_distribution(SIZE))]
        async with LlamaCppServerProvider(base_url=LLAMA, max_retries=0) as provider:
            with pytest.raises(ProviderError, match=f"gave 40 of the {SIZE} probabilities"):
                await provider.next_token_logprobs([5], "m")
            assert (await provider.next_token_logprobs([5], "m")).shape == (SIZE,)


@NOT_LOGPROBS
async def test_a_llama_server_distribution_value_that_is_not_a_log_probability_is_a_protocol_error(
    value: float,
) -> None:
    """A NaN was taken for a missing id; +inf or 0.5 was returned in the row."""
    bad = llama_distribution(SIZE)
    bad["choices"][0]["logprobs"]["content"][0]["top_logprobs"][7]["logprob"] = value
    with respx.mock(assert_all_called=False) as router:
        llama_server_routes(router)
        router.post(f"{LLAMA}/v1/completions").side_effect = [
            httpx.Response(200, json=llama_distribution(SIZE)),  # the vocabulary's bytes
            python_json(bad),
            httpx.Response(200, json=llama_distribution(SIZE)),
        ]
        async with LlamaCppServerProvider(base_url=LLAMA, max_retries=0) as provider:
            with pytest.raises(ProtocolError, match=rf"top_logprobs\[7\]\.logprob is {json.dumps(value)}, not a log-"):
                await provider.next_token_logprobs([5], "m")
            assert (await provider.next_token_logprobs([5], "m")).shape == (SIZE,)
