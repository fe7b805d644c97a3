"""VLLMProvider on the wire: exact request bodies, and every vLLM answer from backends.md mapped to its error.

The server's answers are the ones vLLM 0.33 gives: errors are ``{"error": {"message", "type", "param",
"code"}}`` with the HTTP status equal to ``code``; a route that does not exist (runtime LoRA updating off)
is FastAPI's ``404 {"detail": "Not Found"}``; adapter loading succeeds with ``200`` and a plain-text body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import respx

from inference import get_provider
from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    ConfigurationError,
    InvalidAdapterError,
    InvalidRequestError,
    ModelNotFoundError,
    ProtocolError,
    ProviderError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RuntimeLoRADisabledError,
    ServerAdapterAlreadyLoadedError,
    ServerAdapterNotFoundError,
    ServerInvalidAdapterError,
    ServerModelNotFoundError,
    ServerResponseError,
)
from inference.provider import GenerationResult
from inference.vllm_provider import VLLMProvider
from replacing import after_rounds, replace_alternately

BASE = "http://vllm.test:8100/v1"
CHAT = f"{BASE}/chat/completions"
LOAD = "http://vllm.test:8100/v1/load_lora_adapter"
UNLOAD = "http://vllm.test:8100/v1/unload_lora_adapter"
SECRET = "sk-vllm-secret-4242"
ROUTE_MISSING = {"detail": "Not Found"}


def vllm_error(
    status: int, message: str, error_type: str = "BadRequestError", param: str | None = None
) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"message": message, "type": error_type, "param": param, "code": status}}
    )


def model_missing(name: str) -> httpx.Response:
    """vLLM 0.32's 404 for a model (or adapter) it does not serve."""
    return vllm_error(404, f"The model `{name}` does not exist. Valid aliases: base-model.", "NotFoundError", "model")


def no_adapter_found(name: str, path: str) -> httpx.Response:
    """vLLM 0.32's 404 when the path it is asked to load holds no adapter."""
    return vllm_error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")


def add_lora_failed(reason: str) -> str:
    """vLLM 0.32's message when its worker refuses an adapter (a 500), around the worker's own reason."""
    return (
        f"Call to add_lora method failed: Worker failed with error '{reason}', please check the stack trace above "
        "for the root cause"
    )


def completion(
    text: str = "Hello there.",
    *,
    model: str = "base-model",
    finish_reason: str = "stop",
    prompt_tokens: int = 12,
    completion_tokens: int = 3,
) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                        "function_call": None, "tool_calls": [], "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
        },
    )


def completion_with(**changes: Any) -> httpx.Response:
    """A chat completion with some fields replaced: ``content`` (the message's), ``usage``, ``model``."""
    body = json.loads(completion().content)
    if "content" in changes:
        body["choices"][0]["message"]["content"] = changes.pop("content")
    body.update(changes)
    return httpx.Response(200, json=body)


def sent(route: respx.Route) -> Any:
    return json.loads(route.calls.last.request.content)


def sent_body(call: Any) -> Any:
    return json.loads(call.request.content)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    """respx for the test's routes; ``GET /v1/models`` answers as a vLLM with no LoRA adapter unless a test mocks it."""
    with respx.mock(assert_all_called=False) as router:
        router.get(f"{BASE}/models").mock(return_value=served_models())
        yield router


@pytest.fixture
async def provider() -> AsyncIterator[VLLMProvider]:
    async with VLLMProvider(base_url=BASE, api_key=SECRET, max_retries=1) as vllm:
        yield vllm


async def generates(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    """The provider still works: a plain generation goes through."""
    mock.post(CHAT).mock(return_value=completion("still fine"))
    result = await provider.generate("Hi", model="base-model", max_tokens=8)
    assert result.text == "still fine"


# Generation -------------------------------------------------------------------------------------------


async def test_generate_sends_only_what_the_caller_set(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    await provider.generate("Hi", model="base-model")
    assert sent(route) == {
        "model": "base-model",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4096,
    }


async def test_generate_sends_every_parameter_the_caller_set(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    await provider.generate(
        "Hi",
        model="base-model",
        max_tokens=32,
        system_prompt="Be brief.",
        temperature=0.0,
        top_p=0.9,
        repetition_penalty=1.15,
        stop=["\n\n", "END"],
        seed=7,
        top_k=40,
    )
    assert sent(route) == {
        "model": "base-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 32,
        "temperature": 0.0,
        "top_p": 0.9,
        "stop": ["\n\n", "END"],
        "seed": 7,
        "repetition_penalty": 1.15,
        "top_k": 40,
    }
    assert route.calls.last.request.headers["authorization"] == f"Bearer {SECRET}"


async def test_single_stop_string_is_sent_as_a_list(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    await provider.generate("Hi", model="base-model", stop="END", top_k=0)
    assert sent(route)["stop"] == ["END"]
    assert sent(route)["top_k"] == 0  # 0 is a value the caller set, not "unset"


async def test_generate_parses_text_tokens_and_finish_reason(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(
        return_value=completion("one two", finish_reason="length", prompt_tokens=10, completion_tokens=2)
    )
    result = await provider.generate("Hi", model="base-model", max_tokens=2)
    assert (result.text, result.model, result.adapter_id) == ("one two", "base-model", None)
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (10, 2, 12)
    assert result.finish_reason == "length"


async def test_an_aborted_answer_is_a_provider_error_never_a_finished_text(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """vLLM answers a request its engine aborted (preempted, out of KV cache) with finish_reason "abort" and the
    text so far: the server's body as it is, which used to pass for a finished text ("stop")."""
    mock.post(CHAT).mock(return_value=completion("one tw", finish_reason="abort"))
    with pytest.raises(ProviderError, match="finish_reason 'abort'"):
        await provider.generate("Hi", model="base-model")
    mock.post(CHAT).mock(return_value=completion("done", finish_reason="stop"))
    assert (await provider.generate("Hi", model="base-model")).finish_reason == "stop"


async def test_adapter_id_is_sent_as_the_model(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success: LoRA adapter 'style-a' added successfully."))
    route = mock.post(CHAT).mock(return_value=completion("styled", model="style-a"))
    await provider.load_adapter("style-a", "/adapters/style-a")
    result = await provider.generate("Hi", model="base-model", adapter_id="style-a")
    assert sent(route)["model"] == "style-a"
    assert (result.text, result.model, result.adapter_id, result.finish_reason) == (
        "styled",
        "style-a",
        "style-a",
        "stop",
    )


async def test_no_api_key_sends_no_secret_and_shows_none(mock: respx.MockRouter) -> None:
    async with VLLMProvider(base_url=BASE) as vllm:
        route = mock.post(CHAT).mock(return_value=completion())
        load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
        await vllm.generate("Hi", model="base-model")
        await vllm.load_adapter("a1", "/adapters/a1")
        assert "authorization" not in route.calls.last.request.headers
        assert "authorization" not in load.calls.last.request.headers
        assert "api_key=None" in repr(vllm)


async def test_invalid_arguments_never_reach_the_server(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    with pytest.raises(InvalidRequestError):
        await provider.generate("Hi", model="base-model", temperature=-1)
    with pytest.raises(InvalidRequestError):
        await provider.generate("Hi", model="base-model", adapter_id="../etc")
    assert route.call_count == 0
    await generates(provider, mock)


# Runtime LoRA -----------------------------------------------------------------------------------------


async def test_load_and_unload_post_the_exact_bodies(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    load = mock.post(LOAD).mock(
        return_value=httpx.Response(200, text="Success: LoRA adapter 'b-style' added successfully.")
    )
    unload = mock.post(UNLOAD).mock(
        return_value=httpx.Response(200, text="Success: LoRA adapter 'b-style' removed successfully.")
    )
    await provider.load_adapter("b-style", "/adapters/b")
    await provider.load_adapter("a-style", "/adapters/a")
    assert sent(load) == {"lora_name": "a-style", "lora_path": "/adapters/a"}
    assert load.calls.last.request.headers["content-type"] == "application/json"
    assert load.calls.last.request.headers["authorization"] == f"Bearer {SECRET}"
    assert await provider.list_adapters() == ["a-style", "b-style"]

    await provider.unload_adapter("b-style")
    assert sent(unload) == {"lora_name": "b-style"}
    assert await provider.list_adapters() == ["a-style"]


async def test_lora_routes_are_derived_from_a_base_url_without_v1(mock: respx.MockRouter) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    async with VLLMProvider(base_url="http://vllm.test:8100") as vllm:
        await vllm.load_adapter("a1", "/adapters/a1")
    assert load.call_count == 1


async def test_load_route_missing_means_runtime_lora_is_off(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=httpx.Response(404, json=ROUTE_MISSING))
    with pytest.raises(RuntimeLoRADisabledError) as caught:
        await provider.load_adapter("a1", "/adapters/a1")
    error = caught.value
    assert "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in str(error)
    assert BASE in str(error) and error.url == BASE and error.provider == "vllm"
    assert isinstance(error, httpx.HTTPStatusError) and isinstance(error, ServerResponseError)
    assert error.response.status_code == 404 and error.request.url == LOAD
    assert await provider.list_adapters() == []
    await generates(provider, mock)


async def test_unload_route_missing_means_runtime_lora_is_off(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    mock.post(UNLOAD).mock(return_value=httpx.Response(404, json=ROUTE_MISSING))
    await provider.load_adapter("a1", "/adapters/a1")
    with pytest.raises(RuntimeLoRADisabledError, match="--enable-lora"):
        await provider.unload_adapter("a1")
    assert await provider.list_adapters() == ["a1"]  # still recorded: unloading again retries


async def test_loading_the_same_id_and_path_again_sends_nothing(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success: LoRA adapter 'a1' added successfully."))
    await asyncio.gather(*(provider.load_adapter("a1", "/adapters/a1") for _ in range(3)))
    await provider.load_adapter("a1", "/adapters/a1")
    assert load.call_count == 1
    with pytest.raises(AdapterAlreadyLoadedError, match="replace=True"):
        await provider.load_adapter("a1", "/adapters/other")
    assert load.call_count == 1
    assert await provider.list_adapters() == ["a1"]
    await generates(provider, mock)


async def test_replace_loads_the_new_weights_beside_the_old_then_switches(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    unload = mock.post(UNLOAD).mock(return_value=httpx.Response(200, text="Success"))
    chat = mock.post(CHAT).mock(return_value=completion())
    await provider.load_adapter("a1", "/adapters/v1")
    await provider.load_adapter("a1", "/adapters/v2", replace=True)
    # A new served name for the new weights (vLLM's load_inplace re-reads from disk and keeps stale prefix-cache
    # entries), then the old name is unloaded once nothing uses it.
    assert [sent_body(call) for call in load.calls] == [
        {"lora_name": "a1", "lora_path": "/adapters/v1"},
        {"lora_name": "a1@2", "lora_path": "/adapters/v2"},
    ]
    assert sent(unload) == {"lora_name": "a1"}
    mock.get(f"{BASE}/models").mock(return_value=served_models("a1@2"))
    result = await provider.generate("Hi", model="base-model", adapter_id="a1")
    assert sent(chat)["model"] == "a1@2" and result.adapter_id == "a1"
    assert await provider.list_adapters() == ["a1"]


async def test_a_replace_that_fails_keeps_the_old_adapter(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    load = mock.post(LOAD)
    load.side_effect = [httpx.Response(200, text="Success"), no_adapter_found("a1@2", "/adapters/missing")]
    unload = mock.post(UNLOAD).mock(return_value=httpx.Response(200, text="Success"))
    chat = mock.post(CHAT).mock(return_value=completion())
    await provider.load_adapter("a1", "/adapters/v1")
    with pytest.raises(ServerInvalidAdapterError):
        await provider.load_adapter("a1", "/adapters/missing", replace=True)
    assert unload.call_count == 0
    await provider.generate("Hi", model="base-model", adapter_id="a1")
    assert sent(chat)["model"] == "a1"


async def test_200_generations_through_20_replacements_half_of_them_bad_never_fail_or_mix(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """Every generation is answered by the served name of the weights current when it started; none fails.

    The server here keeps its adapters like vLLM does (a name serves the path it was loaded from, an unknown name
    is vLLM's 404, a path without an adapter its "No adapter found") and answers slowly enough that generations
    overlap the replacements.
    """
    served: dict[str, str] = {}

    def load(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if "corrupt" in body["lora_path"]:
            return no_adapter_found(body["lora_name"], body["lora_path"])
        served[body["lora_name"]] = body["lora_path"]
        return httpx.Response(200, text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    def unload(request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["lora_name"]
        del served[name]  # a KeyError fails the test: nothing is unloaded twice
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def chat(request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["model"]
        await asyncio.sleep(0.002)
        if name not in served:
            return model_missing(name)
        return completion(f"from {served[name]}", model=name)

    mock.post(LOAD).mock(side_effect=load)
    mock.post(UNLOAD).mock(side_effect=unload)
    mock.post(CHAT).mock(side_effect=chat)
    await provider.load_adapter("a1", "/adapters/v0")
    started_on: list[str] = []

    async def one(index: int) -> GenerationResult:
        started_on.append(provider._adapter_path("a1") or "")  # the weights current as the request starts
        return await provider.generate(f"prompt {index}", model="base-model", adapter_id="a1", max_tokens=4)

    async def generations() -> list[GenerationResult]:
        results: list[GenerationResult] = []
        for start in range(0, 200, 20):
            await after_rounds(rounds, start // 10)  # batch k starts after k good replacements
            results += await asyncio.gather(*(one(index) for index in range(start, start + 20)))
        return results

    good = [f"/adapters/v{round_ + 1}" for round_ in range(0, 20, 2)]  # v1, v3 ... v19
    bad = [f"/adapters/corrupt-{round_}" for round_ in range(1, 20, 2)]
    rounds: list[str] = []
    replacing = replace_alternately(provider, "a1", good, bad, outcomes=rounds)
    results, outcomes = await asyncio.gather(generations(), replacing)
    assert outcomes == ["replaced", "refused"] * 10 and len(results) == 200
    for path, result in zip(started_on, results, strict=True):
        assert (result.text, result.adapter_id) == (f"from {path}", "a1")
    assert len(set(started_on)) > 2  # the generations did run across several replacements
    assert list(served.values()) == ["/adapters/v19"]  # every replaced version was unloaded from the server
    assert await provider.list_adapters() == ["a1"]


async def test_server_already_has_the_name(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    """The server holds an adapter of that name this provider did not load (another client, a restart)."""
    mock.get(f"{BASE}/models").mock(return_value=served_models("a1"))  # from /adapters/a1, not /adapters/other
    mock.post(LOAD).mock(
        return_value=vllm_error(
            400,
            "The lora adapter 'a1' has already been loaded. If you want to load the adapter in place, "
            "set 'load_inplace' to True.",
            "InvalidUserInput",
        ),
    )
    with pytest.raises(ServerAdapterAlreadyLoadedError) as caught:
        await provider.load_adapter("a1", "/adapters/other")
    error = caught.value
    assert isinstance(error, AdapterAlreadyLoadedError) and isinstance(error, httpx.HTTPStatusError)
    assert "already has an adapter named 'a1'" in str(error) and "unload it first" in str(error)
    assert error.status_code == 400
    assert await provider.list_adapters() == ["a1"]  # the server's, listed though this object did not load it
    await generates(provider, mock)


async def test_an_adapter_named_like_the_base_model_is_refused_saying_so(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.post(LOAD).mock(
        return_value=vllm_error(
            400, "The lora adapter 'base-model' conflicts with a served base model.", "InvalidUserInput"
        )
    )
    with pytest.raises(ServerResponseError, match="load the adapter under another id") as caught:
        await provider.load_adapter("base-model", "/adapters/a1")
    assert not isinstance(caught.value, AdapterAlreadyLoadedError) and caught.value.status_code == 400
    assert await provider.list_adapters() == []
    await generates(provider, mock)


async def test_load_path_without_adapter(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=no_adapter_found("a1", "/adapters/missing"))
    with pytest.raises(ServerInvalidAdapterError) as caught:
        await provider.load_adapter("a1", "/adapters/missing")
    error = caught.value
    assert isinstance(error, InvalidAdapterError) and error.path == "/adapters/missing"
    assert "found no adapter at '/adapters/missing'" in str(error)
    assert "adapter_config.json" in str(error) and "vLLM server's machine" in str(error)
    assert await provider.list_adapters() == []
    await generates(provider, mock)


@pytest.mark.parametrize(
    ("message", "advice"),
    [
        ("LoRA rank 64 is greater than max_lora_rank 16.", "restart vLLM with a --max-lora-rank"),
        ("vLLM does not yet support DoRA.", "--max-lora-rank"),
        ("Adapter bias cannot be used without bias_enabled.", "bias other than 'none'"),
    ],
)
async def test_load_refused_adapter_500(
    provider: VLLMProvider, mock: respx.MockRouter, message: str, advice: str
) -> None:
    mock.post(LOAD).mock(return_value=vllm_error(500, add_lora_failed(message), "InternalServerError"))
    with pytest.raises(ServerInvalidAdapterError) as caught:
        await provider.load_adapter("big", "/adapters/big")
    assert advice in str(caught.value) and message in str(caught.value)
    assert caught.value.status_code == 500 and caught.value.path == "/adapters/big"
    await generates(provider, mock)


async def test_load_other_400_stays_a_plain_server_error(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=vllm_error(400, "The lora adapter 'base-model' is the same as the base model."))
    with pytest.raises(ServerResponseError) as caught:
        await provider.load_adapter("base-model", "/adapters/x")
    assert type(caught.value) is ServerResponseError
    assert "same as the base model" in str(caught.value)


def served_models(*adapters: str, roots: dict[str, str] | None = None) -> httpx.Response:
    """``GET /v1/models`` as vLLM answers it: the base (parent null), then one entry per LoRA adapter, whose ``root``
    is the path it was loaded from (``roots``: by name; else ``/adapters/<name>``)."""
    roots = roots or {}
    data = [{"id": "base-model", "object": "model", "root": "/models/base", "parent": None}]
    data += [
        {"id": name, "object": "model", "root": roots.get(name, f"/adapters/{name}"), "parent": "base-model"}
        for name in adapters
    ]
    return httpx.Response(200, json={"object": "list", "data": data})


async def test_adapters_the_server_holds_are_found_from_a_new_process(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.get(f"{BASE}/models").mock(return_value=served_models("loaded-elsewhere"))
    chat = mock.post(CHAT).mock(return_value=completion())
    unload = mock.post(UNLOAD).mock(return_value=httpx.Response(200, text="Success"))
    await provider.generate("Hi", model="base-model", adapter_id="loaded-elsewhere")
    assert json.loads(chat.calls[0].request.content)["model"] == "loaded-elsewhere"
    await provider.unload_adapter("loaded-elsewhere")
    assert json.loads(unload.calls[0].request.content) == {"lora_name": "loaded-elsewhere"}
    mock.get(f"{BASE}/models").mock(return_value=served_models())  # the server no longer lists it
    assert await provider.list_adapters() == []


async def test_an_id_another_process_replaced_is_found_under_its_newest_served_name(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """Another process loaded ``a1`` and replaced it twice: the server serves ``a1@3`` (``a1@2`` still draining)."""
    mock.get(f"{BASE}/models").mock(return_value=served_models("a1@2", "a1@3", "other"))
    chat = mock.post(CHAT).mock(return_value=completion())
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    unload = mock.post(UNLOAD).mock(return_value=httpx.Response(200, text="Success"))
    assert await provider.list_adapters() == ["a1", "other"]  # ids, not served names
    result = await provider.generate("Hi", model="base-model", adapter_id="a1")
    assert sent(chat)["model"] == "a1@3" and result.adapter_id == "a1"
    await provider.load_adapter("a1", "/adapters/v4", replace=True)  # numbered after what the server has
    assert sent(load) == {"lora_name": "a1@4", "lora_path": "/adapters/v4"}
    assert sent(unload) == {"lora_name": "a1@3"}
    await provider.unload_adapter("a1")
    assert sent(unload) == {"lora_name": "a1@4"}


class SharedServer:
    """A vLLM whose runtime adapters outlive the processes that load them, answering as vLLM 0.33 does: loads,
    unloads, ``GET /v1/models``, and chats that say which weights ran (``from <the adapter's path>``)."""

    def __init__(self, router: respx.MockRouter, adapters: dict[str, str]) -> None:
        self.adapters = dict(adapters)  # served name -> path
        self.load = router.post(LOAD).mock(side_effect=self._load)
        router.post(UNLOAD).mock(side_effect=self._unload)
        router.get(f"{BASE}/models").mock(side_effect=lambda _: served_models(*self.adapters, roots=self.adapters))
        router.post(CHAT).mock(side_effect=self._chat)

    def _load(self, request: httpx.Request) -> httpx.Response:
        name, path = json.loads(request.content)["lora_name"], json.loads(request.content)["lora_path"]
        if name in self.adapters:
            return vllm_error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
        self.adapters[name] = path
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")

    def _unload(self, request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["lora_name"]
        if self.adapters.pop(name, None) is None:
            return vllm_error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' removed successfully.")

    def _chat(self, request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        if model not in self.adapters:
            return model_missing(model)
        return completion(f"from {self.adapters[model]}", model=model)


async def test_a_first_load_that_replaces_an_id_another_process_replaced_leaves_no_old_weights(
    mock: respx.MockRouter,
) -> None:
    """An earlier process replaced ``a1`` and left it served as ``a1@3``. A new process's first
    ``load_adapter("a1", ..., replace=True)`` used to load plain ``a1`` beside it and never unload ``a1@3``; once it
    replaced ``a1`` again (``a1@2``), every other process took ``a1@3``, the newest name, and answered with the
    old weights; and ``unload_adapter("a1")`` left ``a1@3`` on the server."""
    server = SharedServer(mock, {"a1@3": "/adapters/v3"})
    async with VLLMProvider(base_url=BASE) as first:
        await first.load_adapter("a1", "/adapters/v4", replace=True)
        await first.load_adapter("a1", "/adapters/v5", replace=True)
        assert (await first.generate("Hi", model="base-model", adapter_id="a1")).text == "from /adapters/v5"
    async with VLLMProvider(base_url=BASE) as other:  # another process
        assert (await other.generate("Hi", model="base-model", adapter_id="a1")).text == "from /adapters/v5"
        assert server.adapters == {"a1@5": "/adapters/v5"}  # numbered after a1@3; a1@3 and a1@4 unloaded
        await other.unload_adapter("a1")
    assert server.adapters == {}


async def test_a_first_load_of_another_path_under_an_id_another_process_replaced_is_refused(
    mock: respx.MockRouter,
) -> None:
    """Without ``replace=True`` the server's ``a1@3`` is a loaded ``a1``: it used to load plain ``a1`` beside it."""
    server = SharedServer(mock, {"a1@3": "/adapters/v3"})
    async with VLLMProvider(base_url=BASE) as vllm:
        with pytest.raises(
            AdapterAlreadyLoadedError,
            match=r"'a1' is already loaded from /adapters/v3: .* pass replace=True to load /adapters/v4 in its place",
        ):
            await vllm.load_adapter("a1", "/adapters/v4")
        assert server.adapters == {"a1@3": "/adapters/v3"} and server.load.call_count == 0
        assert (await vllm.generate("Hi", model="base-model", adapter_id="a1")).text == "from /adapters/v3"


async def test_a_first_load_of_the_path_an_id_another_process_replaced_serves_adopts_it(
    mock: respx.MockRouter,
) -> None:
    """Loading the path ``a1@3`` serves used to load it again as plain ``a1``, and unloading ``a1`` left ``a1@3``."""
    server = SharedServer(mock, {"a1@3": "/adapters/v3"})
    async with VLLMProvider(base_url=BASE) as vllm:
        await vllm.load_adapter("a1", "/adapters/v3")
        assert server.load.call_count == 0
        assert (await vllm.generate("Hi", model="base-model", adapter_id="a1")).text == "from /adapters/v3"
        await vllm.unload_adapter("a1")
    assert server.adapters == {}


def test_only_an_at_sign_and_digits_make_a_versioned_served_name() -> None:
    from inference._core.lifecycle import parse_versioned_name

    assert parse_versioned_name("a1@3") == ("a1", 3)
    assert parse_versioned_name("team@lab@12") == ("team@lab", 12)
    for plain in ("a1", "a1@", "@3", "a1@v3", "a1@\u0663", "a1@3x"):
        assert parse_versioned_name(plain) is None, plain


async def test_unload_unknown_adapter_sends_no_unload_request(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.get(f"{BASE}/models").mock(return_value=served_models())
    unload = mock.post(UNLOAD).mock(return_value=httpx.Response(200, text="Success"))
    with pytest.raises(AdapterNotFoundError, match="'ghost' is not loaded") as caught:
        await provider.unload_adapter("ghost")
    assert isinstance(caught.value, LookupError)
    assert unload.call_count == 0
    await generates(provider, mock)


async def test_unload_of_an_adapter_the_server_already_lost_succeeds(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    unload = mock.post(UNLOAD).mock(
        return_value=vllm_error(404, "The lora adapter 'a1' cannot be found.", "NotFoundError")
    )
    await provider.load_adapter("a1", "/adapters/a1")
    await provider.unload_adapter("a1")
    assert unload.call_count == 1
    assert await provider.list_adapters() == []


async def test_generate_with_an_adapter_nobody_loaded_sends_no_generation(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.get(f"{BASE}/models").mock(return_value=served_models("another"))
    route = mock.post(CHAT).mock(return_value=completion())
    with pytest.raises(AdapterNotFoundError, match="call load_adapter first"):
        await provider.generate("Hi", model="base-model", adapter_id="ghost")
    assert route.call_count == 0
    await generates(provider, mock)


async def test_a_404_for_a_name_the_provider_never_loaded_is_not_healed(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """A server-side adapter used by name as the model: a 404 is reported as it is, nothing is reloaded."""
    chat = mock.post(CHAT).mock(
        return_value=model_missing("server-lora")
    )
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    with pytest.raises(ServerModelNotFoundError, match="does not serve model 'server-lora'"):
        await provider.generate("Hi", model="server-lora")
    assert (chat.call_count, load.call_count) == (1, 0)
    await generates(provider, mock)


async def test_generate_with_unknown_model(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=model_missing("nope"))
    with pytest.raises(ServerModelNotFoundError) as caught:
        await provider.generate("Hi", model="nope")
    assert isinstance(caught.value, ModelNotFoundError) and isinstance(caught.value, httpx.HTTPStatusError)
    assert "does not serve model 'nope'" in str(caught.value) and "/v1/models" in str(caught.value)
    await generates(provider, mock)


async def test_generate_against_a_url_without_the_api(mock: respx.MockRouter) -> None:
    mock.post("http://vllm.test:8100/chat/completions").mock(return_value=httpx.Response(404, json=ROUTE_MISSING))
    async with VLLMProvider(base_url="http://vllm.test:8100") as vllm:
        with pytest.raises(ServerResponseError, match="ends with /v1") as caught:
            await vllm.generate("Hi", model="base-model")
    assert not isinstance(caught.value, ModelNotFoundError)


async def test_generate_400_quotes_vllm(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    message = "This model's maximum context length is 2048 tokens. However, you requested 4106 tokens."
    route = mock.post(CHAT).mock(return_value=vllm_error(400, message))
    with pytest.raises(ServerResponseError) as caught:
        await provider.generate("Hi", model="base-model")
    assert message in str(caught.value) and caught.value.status_code == 400
    assert route.call_count == 1
    await generates(provider, mock)


async def test_wrong_api_key(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(401, json={"error": "Unauthorized"}))
    with pytest.raises(ServerResponseError) as caught:
        await provider.generate("Hi", model="base-model")
    text = str(caught.value) + repr(caught.value)
    assert "401" in text and "API key" in text and SECRET not in text


# Resilience -------------------------------------------------------------------------------------------


async def test_503_then_success_is_retried_once(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=[httpx.Response(503), completion("after retry")])
    result = await provider.generate("Hi", model="base-model")
    assert result.text == "after retry" and route.call_count == 2


async def test_503_forever_gives_up_after_max_retries_plus_one(mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(503, json={"error": "engine dead"}))
    async with VLLMProvider(base_url=BASE, max_retries=2) as vllm:
        with pytest.raises(ServerResponseError) as caught:
            await vllm.generate("Hi", model="base-model")
    assert route.call_count == 3  # our retries only: the openai client's own retries are off
    assert caught.value.status_code == 503 and "tried 3 times" in str(caught.value)


async def test_400_is_not_retried(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(LOAD).mock(return_value=vllm_error(400, "bad"))
    with pytest.raises(ServerResponseError):
        await provider.load_adapter("a1", "/x")
    assert route.call_count == 1


async def test_timeout(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=httpx.ReadTimeout("timed out"))
    with pytest.raises(ProviderTimeoutError) as caught:
        await provider.generate("Hi", model="base-model")
    assert route.call_count == 1
    assert "within 120 s" in str(caught.value) and "VLLM_TIMEOUT" in str(caught.value)
    await generates(provider, mock)


async def test_timeout_on_the_lora_route(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(side_effect=httpx.ReadTimeout("timed out"))
    with pytest.raises(ProviderTimeoutError, match="load adapter 'a1'"):
        await provider.load_adapter("a1", "/x")


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, content=b'{"choices": [', headers={"content-type": "application/json"}),
        httpx.Response(200, text="<html>proxy login</html>"),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json={"unexpected": True}),
        completion_with(content=5),
        completion_with(usage={"prompt_tokens": None, "completion_tokens": None, "total_tokens": None}),
        completion_with(usage={"prompt_tokens": "twelve", "completion_tokens": 3, "total_tokens": 15}),
        completion_with(model=7),
    ],
    ids=[
        "truncated-json", "html", "no-choices", "other-json", "content-not-text", "usage-nulls", "usage-text",
        "model-not-text",
    ],
)
async def test_malformed_answers_are_protocol_errors(
    provider: VLLMProvider, mock: respx.MockRouter, answer: httpx.Response
) -> None:
    mock.post(CHAT).mock(return_value=answer)
    with pytest.raises(ProtocolError) as caught:
        await provider.generate("Hi", model="base-model")
    assert BASE in str(caught.value)
    await generates(provider, mock)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_server_down_is_unavailable_naming_the_url() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    async with VLLMProvider(base_url=url) as vllm:
        with pytest.raises(ProviderUnavailableError) as caught:
            await vllm.generate("Hi", model="base-model")
        assert url in str(caught.value) and "VLLM_BASE_URL" in str(caught.value)
        assert caught.value.url == url
        with pytest.raises(ProviderUnavailableError, match=url):
            await vllm.load_adapter("a1", "/adapters/a1")


async def test_the_api_key_never_appears_in_repr_messages_or_logs(
    provider: VLLMProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mock.post(CHAT).mock(side_effect=[httpx.Response(503), httpx.Response(500, text="boom")])
    mock.post(LOAD).mock(return_value=httpx.Response(404, json=ROUTE_MISSING))
    errors: list[BaseException] = []
    for call in (
        provider.generate("Hi", model="base-model"),
        provider.load_adapter("a1", "/x"),
    ):
        with pytest.raises(ServerResponseError) as caught:
            await call
        errors.append(caught.value)
    shown = repr(provider) + "".join(str(e) + repr(e) for e in errors) + caplog.text
    assert SECRET not in shown
    assert "api_key=***" in repr(provider)
    assert "retrying POST" in caplog.text  # the retry was logged, without headers


def test_a_cached_provider_works_across_event_loops() -> None:
    """The factory caches providers; a script may call asyncio.run more than once."""
    vllm = VLLMProvider(base_url=BASE)
    with respx.mock:
        respx.post(CHAT).mock(return_value=completion("again"))
        first = asyncio.run(vllm.generate("Hi", model="base-model"))
        second = asyncio.run(vllm.generate("Hi", model="base-model"))
    assert first.text == second.text == "again"


async def test_aclose_then_reuse(mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=completion())
    vllm = VLLMProvider(base_url=BASE)
    await vllm.generate("Hi", model="base-model")
    await vllm.aclose()
    await vllm.aclose()  # twice is fine
    assert (await vllm.generate("Hi", model="base-model")).text == "Hello there."
    await vllm.aclose()


# Construction -----------------------------------------------------------------------------------------


def test_capabilities() -> None:
    assert VLLMProvider.supports_adapters and VLLMProvider.hot_swaps_adapters
    assert not VLLMProvider.runs_in_process


async def test_factory_builds_it_with_a_base_url() -> None:
    vllm = get_provider("vllm", base_url="http://127.0.0.1:9999/v1/")
    assert isinstance(vllm, VLLMProvider)
    assert vllm.base_url == "http://127.0.0.1:9999/v1"
    assert get_provider("vllm", base_url="http://127.0.0.1:9999/v1/") is vllm


async def test_factory_and_constructor_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_BASE_URL", "http://gpu-box:8000/v1")
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    monkeypatch.setenv("VLLM_TIMEOUT", "7.5")
    monkeypatch.setenv("VLLM_MAX_RETRIES", "0")
    monkeypatch.delenv("INFERENCE_PROVIDER", raising=False)
    vllm = get_provider()
    assert isinstance(vllm, VLLMProvider)
    assert (vllm.base_url, vllm.timeout, vllm.max_retries) == ("http://gpu-box:8000/v1", 7.5, 0)
    assert SECRET not in repr(vllm)
    direct = VLLMProvider(timeout=3)
    assert (direct.base_url, direct.timeout) == ("http://gpu-box:8000/v1", 3.0)


async def test_default_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    assert VLLMProvider().base_url == "http://localhost:8100/v1"


def test_max_lora_rank_from_argument_environment_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_MAX_LORA_RANK", raising=False)
    assert VLLMProvider(base_url=BASE).max_lora_rank == 16
    monkeypatch.setenv("VLLM_MAX_LORA_RANK", "64")
    assert VLLMProvider(base_url=BASE).max_lora_rank == 64
    assert VLLMProvider(base_url=BASE, max_lora_rank=8).max_lora_rank == 8
    with pytest.raises(ConfigurationError, match="max_lora_rank must be a positive integer"):
        VLLMProvider(base_url=BASE, max_lora_rank=0)


# Local validation before a load ------------------------------------------------------------------------


def write_adapter(directory: Path, **config: Any) -> Path:
    """A PEFT LoRA directory as PeftModel.save_pretrained writes it (the weights file is a stand-in)."""
    directory.mkdir(parents=True, exist_ok=True)
    settings = {
        "peft_type": "LORA",
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "use_dora": False,
        "base_model_name_or_path": "base-model",
    }
    settings.update(config)
    (directory / "adapter_config.json").write_text(json.dumps(settings))
    (directory / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return directory


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"use_dora": True}, "uses DoRA"),
        ({"bias": "all"}, "bias='all'"),
        ({"bias": "lora_only"}, "only bias='none' is supported"),
        ({"peft_type": "IA3"}, "only LoRA adapters"),
        ({"r": 32}, "has rank 32, above max_lora_rank 16: start vLLM with --max-lora-rank 32"),
        ({"r": 100}, "--max-lora-rank 128"),
        ({"r": 300}, "--max-lora-rank 320"),
        ({"r": 600}, "vLLM serves ranks up to 512: train the adapter with a smaller rank"),
    ],
    ids=["dora", "bias-all", "bias-lora-only", "not-lora", "rank-32", "rank-100", "rank-300", "rank-600"],
)
async def test_local_adapters_vllm_would_refuse_never_reach_the_server(
    provider: VLLMProvider, mock: respx.MockRouter, tmp_path: Path, config: dict[str, Any], expected: str
) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    path = write_adapter(tmp_path / "adapter", **config)
    with pytest.raises(InvalidAdapterError) as caught:
        await provider.load_adapter("a1", str(path))
    assert expected in str(caught.value)
    assert caught.value.path == str(path) and caught.value.provider == "vllm"
    assert load.call_count == 0
    assert await provider.list_adapters() == []
    await generates(provider, mock)


async def test_a_local_directory_without_adapter_config_never_reaches_the_server(
    provider: VLLMProvider, mock: respx.MockRouter, tmp_path: Path
) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    (tmp_path / "weights-only").mkdir()
    (tmp_path / "weights-only" / "adapter_model.safetensors").write_bytes(b"\0")
    with pytest.raises(InvalidAdapterError, match=r"has no adapter_config\.json"):
        await provider.load_adapter("a1", str(tmp_path / "weights-only"))
    with pytest.raises(InvalidAdapterError, match="is not a directory"):
        await provider.load_adapter("a1", str(tmp_path / "weights-only" / "adapter_model.safetensors"))
    assert load.call_count == 0
    await generates(provider, mock)


async def test_a_valid_local_adapter_within_the_rank_is_sent(mock: respx.MockRouter, tmp_path: Path) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    path = write_adapter(tmp_path / "rank64", r=64)
    async with VLLMProvider(base_url=BASE, max_lora_rank=64) as vllm:
        await vllm.load_adapter("big", path)
        assert sent(load) == {"lora_name": "big", "lora_path": str(path)}
        assert await vllm.list_adapters() == ["big"]


async def test_a_path_that_is_not_local_is_sent_as_it_is(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    await provider.load_adapter("hub", "org/some-lora-on-the-hub")
    await provider.load_adapter("remote", "/mnt/models/only-on-the-gpu-box")
    assert [sent_body(call)["lora_path"] for call in load.calls] == [
        "org/some-lora-on-the-hub",
        "/mnt/models/only-on-the-gpu-box",
    ]


# Self-healing -----------------------------------------------------------------------------------------

LOST_A1 = "The model `a1` does not exist. Valid aliases: base-model."


async def test_a_lost_adapter_is_loaded_again_and_the_request_retried_once(
    provider: VLLMProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    chat = mock.post(CHAT).mock(
        side_effect=[vllm_error(404, LOST_A1, "NotFoundError", "model"), completion("healed", model="a1")]
    )
    await provider.load_adapter("a1", "/adapters/a1")
    result = await provider.generate("Hi", model="base-model", adapter_id="a1")
    assert (result.text, result.adapter_id) == ("healed", "a1")
    assert [sent_body(call) for call in load.calls] == [{"lora_name": "a1", "lora_path": "/adapters/a1"}] * 2
    assert [sent_body(call)["model"] for call in chat.calls] == ["a1", "a1"]
    assert "lost adapter 'a1'" in caplog.text
    await generates(provider, mock)


async def test_a_second_404_after_the_reload_is_reported(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    chat = mock.post(CHAT).mock(return_value=vllm_error(404, LOST_A1, "NotFoundError", "model"))
    await provider.load_adapter("a1", "/adapters/a1")
    with pytest.raises(ServerAdapterNotFoundError) as caught:
        await provider.generate("Hi", model="base-model", adapter_id="a1")
    assert "still has no adapter 'a1' after it was loaded again from '/adapters/a1'" in str(caught.value)
    assert (chat.call_count, load.call_count) == (2, 2)  # one retry, no loop
    await generates(provider, mock)


async def test_a_reload_that_fails_is_reported_with_its_cause(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(
        side_effect=[
            httpx.Response(200, text="Success"),
            no_adapter_found("a1", "/adapters/a1"),
        ]
    )
    chat = mock.post(CHAT).mock(return_value=vllm_error(404, LOST_A1, "NotFoundError", "model"))
    await provider.load_adapter("a1", "/adapters/a1")
    with pytest.raises(ServerInvalidAdapterError, match="found no adapter at '/adapters/a1'"):
        await provider.generate("Hi", model="base-model", adapter_id="a1")
    assert chat.call_count == 1
    await generates(provider, mock)


async def test_a_lost_adapter_whose_files_changed_since_is_not_loaded_again(
    provider: VLLMProvider, mock: respx.MockRouter, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """The server restarted, and the directory now holds the next training step: healing would serve it as a1."""
    directory = tmp_path / "a1"
    shutil.copytree(tiny_models["qwen2"].adapter_dirs["a1"], directory)
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    chat = mock.post(CHAT).mock(return_value=vllm_error(404, LOST_A1, "NotFoundError", "model"))
    await provider.load_adapter("a1", directory)
    with (directory / "adapter_model.safetensors").open("ab") as weights:
        weights.write(b" ")  # rewritten in place (here: one byte longer)
    with pytest.raises(InvalidAdapterError, match=r"files at .* changed since it was loaded.*replace=True"):
        await provider.generate("Hi", model="base-model", adapter_id="a1")
    assert (chat.call_count, load.call_count) == (1, 1)  # no reload of other weights under the id
    await generates(provider, mock)


class RestartingServer:
    """A vLLM that keeps its runtime adapters in memory and forgets them on restart, answering as vLLM does."""

    def __init__(self) -> None:
        self.adapters: dict[str, str] = {}
        self.loads = 0

    def load(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.loads += 1
        if body["lora_name"] in self.adapters:
            return vllm_error(
                400, f"The lora adapter '{body['lora_name']}' has already been loaded.", "InvalidUserInput"
            )
        self.adapters[body["lora_name"]] = body["lora_path"]
        return httpx.Response(200, text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    async def chat(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.001)  # requests overlap
        model = json.loads(request.content)["model"]
        if model != "base-model" and model not in self.adapters:
            return model_missing(model)
        return completion(f"from {model}", model=model)


async def test_concurrent_requests_heal_a_lost_adapter_once_and_count_what_was_loaded(
    provider: VLLMProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    """Eight requests find a1 and a2 lost: each adapter is loaded again once (before, one load per request, most of
    them refused as already loaded and all counted and logged as reloads)."""
    server = RestartingServer()
    mock.post(LOAD).mock(side_effect=server.load)
    mock.post(CHAT).mock(side_effect=server.chat)
    await provider.load_adapter("a1", "/adapters/a1")
    await provider.load_adapter("a2", "/adapters/a2")
    server.adapters.clear()  # the server restarts
    caplog.set_level(logging.INFO, logger="inference")
    results = await asyncio.gather(
        *(provider.generate("Hi", model="base-model", adapter_id=f"a{1 + n % 2}") for n in range(8))
    )
    assert [result.text for result in results] == [f"from a{1 + n % 2}" for n in range(8)]
    assert server.adapters == {"a1": "/adapters/a1", "a2": "/adapters/a2"}
    assert server.loads == 2 + 2  # the two loads, then one reload each
    stats = provider.adapter_stats()
    assert (stats.loads, stats.reloads) == (4, 2)
    reloads = [record for record in caplog.records if getattr(record, "adapter_event", None) == "reload"]
    assert sorted((record.adapter_id, record.outcome, record.healed, record.replica) for record in reloads) == [
        ("a1", "ok", True, BASE), ("a2", "ok", True, BASE)
    ]
    assert sum("had lost adapter" in message for message in caplog.messages) == 2


async def test_a_heal_that_finds_the_adapter_loaded_again_by_another_client_counts_no_reload(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """The server lost a1, and another client loaded it again before this provider's reload: the request goes
    through, and this provider loaded nothing."""
    already = vllm_error(400, "The lora adapter 'a1' has already been loaded.", "InvalidUserInput")
    mock.post(LOAD).mock(side_effect=[httpx.Response(200, text="Success"), already])
    mock.post(CHAT).mock(side_effect=[vllm_error(404, LOST_A1, "NotFoundError", "model"), completion("ok", model="a1")])
    await provider.load_adapter("a1", "/adapters/a1")
    mock.get(f"{BASE}/models").mock(return_value=served_models("a1"))  # the other client's, from the same path
    assert (await provider.generate("Hi", model="base-model", adapter_id="a1")).text == "ok"
    assert (provider.adapter_stats().loads, provider.adapter_stats().reloads) == (1, 0)


async def test_a_heal_that_finds_the_name_loaded_from_another_path_serves_none_of_those_weights(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """The server lost a1 (it restarted), and another client loaded other weights under the name 'a1' before this
    provider's reload (the race a real server cannot be made to run on cue). Before, the heal took "already loaded"
    as healed and the retried request answered with the other weights, labelled a1. Now the request fails naming
    both paths, and later ones are not sent while the server's model list says so; once it serves a1 from its path
    again, they are."""
    already = vllm_error(400, "The lora adapter 'a1' has already been loaded.", "InvalidUserInput")
    mock.post(LOAD).mock(side_effect=[httpx.Response(200, text="Success"), already])
    chat = mock.post(CHAT).mock(
        side_effect=[vllm_error(404, LOST_A1, "NotFoundError", "model"), completion("answered", model="a1")]
    )
    await provider.load_adapter("a1", "/adapters/a1")
    listing = mock.get(f"{BASE}/models").mock(return_value=served_models("a1", roots={"a1": "/adapters/other"}))
    with pytest.raises(ServerAdapterAlreadyLoadedError) as healing:
        await provider.generate("Hi", model="base-model", adapter_id="a1")
    assert "serves adapter 'a1' from '/adapters/other', not from '/adapters/a1'" in str(healing.value)
    with pytest.raises(AdapterAlreadyLoadedError, match=r"from '/adapters/other', not from '/adapters/a1'"):
        await provider.generate("Hi", model="base-model", adapter_id="a1")
    assert chat.call_count == 1  # only the first request's, answered 404: no answer from the other weights
    listing.mock(return_value=served_models("a1"))  # the server serves a1 from its path again
    assert (await provider.generate("Hi", model="base-model", adapter_id="a1")).text == "answered"
    assert chat.call_count == 2


async def test_a_lost_adapter_is_healed_for_a_stream_too(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    mock.post(CHAT).mock(
        side_effect=[vllm_error(404, LOST_A1, "NotFoundError", "model"), sse_response(["Hel", "lo"], model="a1")]
    )
    await provider.load_adapter("a1", "/adapters/a1")
    events = [event async for event in provider.stream("Hi", model="base-model", adapter_id="a1")]
    assert events[:-1] == ["Hel", "lo"] and isinstance(events[-1], GenerationResult)
    assert load.call_count == 2


# Reconcile --------------------------------------------------------------------------------------------

REPLICA_A = "http://vllm-a.test:8100/v1"
REPLICA_B = "http://vllm-b.test:8100/v1"


def model_list(*loras: str, base: str = "base-model", roots: dict[str, str] | None = None) -> httpx.Response:
    """``GET /v1/models`` as vLLM answers it: the base model (parent null) and one entry per LoRA, whose ``root`` is
    the path it was loaded from (``roots``: by name; else ``/adapters/<name>``)."""
    entry = {"object": "model", "created": 1700000000, "owned_by": "vllm", "max_model_len": 2048}
    data = [{"id": base, "root": f"/models/{base}", "parent": None, **entry}]
    roots = roots or {}
    data += [{"id": name, "root": roots.get(name, f"/adapters/{name}"), "parent": base, **entry} for name in loras]
    return httpx.Response(200, json={"object": "list", "data": data})


async def test_reconcile_reloads_what_each_replica_lost_and_lists_strangers(mock: respx.MockRouter) -> None:
    loads = {
        url: mock.post(f"{url}/load_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
        for url in (REPLICA_A, REPLICA_B)
    }
    mock.get(f"{REPLICA_A}/models").mock(return_value=model_list("a1", "a2", "from-cli"))
    mock.get(f"{REPLICA_B}/models").mock(return_value=model_list())  # restarted: lost everything
    async with VLLMProvider(base_url=[REPLICA_A, REPLICA_B]) as vllm:
        await vllm.load_adapter("a1", "/adapters/a1")
        await vllm.load_adapter("a2", "/adapters/a2")
        report = await vllm.reconcile_adapters()
    first, second = report.replicas
    assert (first.base_url, first.reloaded, first.unexpected, first.error) == (REPLICA_A, (), ("from-cli",), None)
    assert (second.base_url, second.reloaded, second.unexpected) == (REPLICA_B, ("a1", "a2"), ())
    assert report.reloaded == ["a1", "a2"] and report.unexpected == ["from-cli"] and report.ok
    assert loads[REPLICA_A].call_count == 2  # only the first loads
    assert [sent_body(call) for call in loads[REPLICA_B].calls][2:] == [
        {"lora_name": "a1", "lora_path": "/adapters/a1"},
        {"lora_name": "a2", "lora_path": "/adapters/a2"},
    ]


async def test_reconcile_reports_a_replaced_adapter_by_its_id(mock: respx.MockRouter) -> None:
    """A replaced adapter is served as ``id@n``; the report says the id the user knows (``"a1" in reloaded``)."""
    loads = {
        url: mock.post(f"{url}/load_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
        for url in (REPLICA_A, REPLICA_B)
    }
    for url in (REPLICA_A, REPLICA_B):
        mock.post(f"{url}/unload_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
    for url in (REPLICA_A, REPLICA_B):
        mock.get(f"{url}/models").mock(return_value=model_list())  # nothing loaded yet
    async with VLLMProvider(base_url=[REPLICA_A, REPLICA_B]) as vllm:
        await vllm.load_adapter("a1", "/adapters/a1")
        await vllm.load_adapter("a1", "/adapters/a1-v2", replace=True)
        mock.get(f"{REPLICA_A}/models").mock(return_value=model_list("a1@2", roots={"a1@2": "/adapters/a1-v2"}))
        # REPLICA_B restarted: it lost everything
        report = await vllm.reconcile_adapters()
    assert report.reloaded == ["a1"] and report.replicas[1].reloaded == ("a1",) and report.ok
    assert sent_body(loads[REPLICA_B].calls[-1]) == {"lora_name": "a1@2", "lora_path": "/adapters/a1-v2"}


async def test_reconcile_reports_a_replica_that_is_down(mock: respx.MockRouter) -> None:
    mock.post(f"{REPLICA_A}/load_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
    mock.get(f"{REPLICA_A}/models").mock(return_value=model_list("a1"))
    mock.get(f"{REPLICA_B}/models").mock(side_effect=httpx.ConnectError("Connection refused"))
    async with VLLMProvider(base_url=REPLICA_A, max_retries=0) as vllm:
        await vllm.load_adapter("a1", "/adapters/a1")
    async with VLLMProvider(base_url=f"{REPLICA_A},{REPLICA_B}", max_retries=0) as vllm:
        report = await vllm.reconcile_adapters()
    assert report.replicas[0].error is None
    assert report.replicas[1].error is not None and REPLICA_B in report.replicas[1].error
    assert not report.ok


async def test_reconcile_with_an_old_vllm_that_does_not_list_runtime_adapters(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    load = mock.post(LOAD).mock(
        side_effect=[
            httpx.Response(200, text="Success"),
            vllm_error(400, "The lora adapter 'a1' has already been loaded.", "InvalidUserInput"),
        ]
    )
    mock.get(f"{BASE}/models").mock(return_value=model_list())
    await provider.load_adapter("a1", "/adapters/a1")
    report = await provider.reconcile_adapters()
    assert report.replicas[0].reloaded == () and report.ok
    assert load.call_count == 2


# Replicas ---------------------------------------------------------------------------------------------


def test_replicas_from_a_list_or_a_comma_separated_string(monkeypatch: pytest.MonkeyPatch) -> None:
    assert VLLMProvider(base_url=[REPLICA_A, REPLICA_B + "/"]).replicas == (REPLICA_A, REPLICA_B)
    monkeypatch.setenv("VLLM_BASE_URL", f"{REPLICA_A}, {REPLICA_B}")
    vllm = VLLMProvider()
    assert vllm.replicas == (REPLICA_A, REPLICA_B) and len(vllm.replicas) == 2
    assert vllm.base_url == f"{REPLICA_A},{REPLICA_B}"
    with pytest.raises(ConfigurationError, match="not a valid base URL"):
        VLLMProvider(base_url=[REPLICA_A, "vllm-b:8100"])


@pytest.fixture
async def replicated(mock: respx.MockRouter) -> AsyncIterator[VLLMProvider]:
    """Two replicas; their ``GET /v1/models`` list no LoRA adapter unless a test mocks them."""
    for url in (REPLICA_A, REPLICA_B):
        mock.get(f"{url}/models").mock(return_value=model_list())
    async with VLLMProvider(base_url=[REPLICA_A, REPLICA_B], max_retries=0) as vllm:
        yield vllm


async def test_loads_and_unloads_go_to_every_replica(replicated: VLLMProvider, mock: respx.MockRouter) -> None:
    loads = [
        mock.post(f"{url}/load_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
        for url in (REPLICA_A, REPLICA_B)
    ]
    unloads = [
        mock.post(f"{url}/unload_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
        for url in (REPLICA_A, REPLICA_B)
    ]
    await replicated.load_adapter("a1", "/adapters/a1")
    assert [sent(route) for route in loads] == [{"lora_name": "a1", "lora_path": "/adapters/a1"}] * 2
    await replicated.unload_adapter("a1")
    assert [sent(route) for route in unloads] == [{"lora_name": "a1"}] * 2
    assert await replicated.list_adapters() == []


async def test_a_load_failing_on_one_replica_is_rolled_back_on_the_others(
    replicated: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.post(f"{REPLICA_A}/load_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
    mock.post(f"{REPLICA_B}/load_lora_adapter").mock(
        return_value=vllm_error(
            500, add_lora_failed("LoRA rank 64 is greater than max_lora_rank 16."), "InternalServerError"
        )
    )
    unload_a = mock.post(f"{REPLICA_A}/unload_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
    unload_b = mock.post(f"{REPLICA_B}/unload_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
    with pytest.raises(ServerInvalidAdapterError) as caught:
        await replicated.load_adapter("a1", "/adapters/a1")
    assert f"vLLM at {REPLICA_B}" in str(caught.value) and "--max-lora-rank" in str(caught.value)
    assert sent(unload_a) == {"lora_name": "a1"} and unload_b.call_count == 0
    assert await replicated.list_adapters() == []


async def test_a_load_on_a_down_replica_fails_and_is_rolled_back(
    replicated: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.post(f"{REPLICA_A}/load_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
    mock.post(f"{REPLICA_B}/load_lora_adapter").mock(side_effect=httpx.ConnectError("Connection refused"))
    unload_a = mock.post(f"{REPLICA_A}/unload_lora_adapter").mock(return_value=httpx.Response(200, text="Success"))
    with pytest.raises(ProviderUnavailableError, match=REPLICA_B):
        await replicated.load_adapter("a1", "/adapters/a1")
    assert unload_a.call_count == 1
    assert await replicated.list_adapters() == []


async def test_generations_alternate_between_replicas(replicated: VLLMProvider, mock: respx.MockRouter) -> None:
    chat_a = mock.post(f"{REPLICA_A}/chat/completions").mock(return_value=completion("from a"))
    chat_b = mock.post(f"{REPLICA_B}/chat/completions").mock(return_value=completion("from b"))
    texts = [(await replicated.generate("Hi", model="base-model")).text for _ in range(4)]
    assert sorted(texts) == ["from a", "from a", "from b", "from b"]
    assert texts[0] != texts[1] and texts[1] != texts[2]
    assert (chat_a.call_count, chat_b.call_count) == (2, 2)


async def test_concurrent_generations_are_spread(replicated: VLLMProvider, mock: respx.MockRouter) -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.01)
        return completion(str(request.url.host))

    mock.post(f"{REPLICA_A}/chat/completions").mock(side_effect=slow)
    mock.post(f"{REPLICA_B}/chat/completions").mock(side_effect=slow)
    results = await asyncio.gather(*(replicated.generate("Hi", model="base-model") for _ in range(10)))
    hosts = [result.text for result in results]
    assert hosts.count("vllm-a.test") == hosts.count("vllm-b.test") == 5


async def test_a_down_replica_is_skipped(replicated: VLLMProvider, mock: respx.MockRouter) -> None:
    def answer_a(request: httpx.Request) -> httpx.Response:
        return sse_response(["from a"]) if json.loads(request.content).get("stream") else completion("from a")

    chat_a = mock.post(f"{REPLICA_A}/chat/completions").mock(side_effect=answer_a)
    chat_b = mock.post(f"{REPLICA_B}/chat/completions").mock(side_effect=httpx.ConnectError("Connection refused"))
    texts = [(await replicated.generate("Hi", model="base-model")).text for _ in range(4)]
    assert texts == ["from a"] * 4
    assert chat_a.call_count == 4 and chat_b.call_count == 1  # tried once, then left alone for a while
    streamed = [event async for event in replicated.stream("Hi", model="base-model")]
    assert isinstance(streamed[-1], GenerationResult) and streamed[-1].text == "from a"


async def test_all_replicas_down_is_unavailable_naming_every_url(
    replicated: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.post(f"{REPLICA_A}/chat/completions").mock(side_effect=httpx.ConnectError("Connection refused"))
    mock.post(f"{REPLICA_B}/chat/completions").mock(side_effect=httpx.ConnectError("Connection refused"))
    with pytest.raises(ProviderUnavailableError) as caught:
        await replicated.generate("Hi", model="base-model")
    message = str(caught.value)
    assert "none of the 2 vLLM replicas accepts connections" in message
    assert REPLICA_A in message and REPLICA_B in message and "VLLM_BASE_URL" in message
    assert caught.value.url == f"{REPLICA_A},{REPLICA_B}"
    # both come back: the same provider serves again
    mock.post(f"{REPLICA_A}/chat/completions").mock(return_value=completion("back"))
    mock.post(f"{REPLICA_B}/chat/completions").mock(return_value=completion("back"))
    assert (await replicated.generate("Hi", model="base-model")).text == "back"


BUSY = vllm_error(
    503,
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.",
    "Service Unavailable",
)  # vLLM's QueueOverflowError (a GracefulHTTPError): its 503 to a request it will not take
NGINX_502 = httpx.Response(
    502,
    text="<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
    "</center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
    headers={"content-type": "text/html"},
)  # a proxy in front of a vLLM server that stopped


@pytest.mark.parametrize("refusal", [BUSY, NGINX_502], ids=["vllm-503", "proxy-502"])
async def test_a_replica_answering_503_or_502_is_down_and_every_request_goes_to_the_other(
    refusal: httpx.Response, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    def answer_a(request: httpx.Request) -> httpx.Response:
        return sse_response(["from a"]) if json.loads(request.content).get("stream") else completion("from a")

    caplog.set_level(logging.INFO, logger="inference.replicas")
    mock.post(f"{REPLICA_A}/chat/completions").mock(side_effect=answer_a)
    chat_b = mock.post(f"{REPLICA_B}/chat/completions").mock(return_value=refusal)
    # replica_down_s=0: the failing replica is tried in its turn at every call, not left alone for 5 s
    async with VLLMProvider(base_url=[REPLICA_A, REPLICA_B], max_retries=0, replica_down_s=0) as vllm:
        texts = [(await vllm.generate("Hi", model="base-model")).text for _ in range(4)]
        streamed = []
        for _ in range(4):
            streamed.append([event async for event in vllm.stream("Hi", model="base-model")][-1])
    assert texts == ["from a"] * 4
    assert [result.text for result in streamed if isinstance(result, GenerationResult)] == ["from a"] * 4
    assert chat_b.call_count == 4  # tried first at every other call (round-robin), answered by a each time
    (down,) = [record for record in caplog.records if getattr(record, "replica_event", None) == "down"]
    assert (down.levelname, down.url, down.error) == ("WARNING", REPLICA_B, f"HTTP {refusal.status_code}")


async def test_a_replica_answering_503_is_left_alone_while_it_is_down(
    replicated: VLLMProvider, mock: respx.MockRouter
) -> None:
    chat_a = mock.post(f"{REPLICA_A}/chat/completions").mock(return_value=completion("from a"))
    chat_b = mock.post(f"{REPLICA_B}/chat/completions").mock(return_value=BUSY)
    texts = [(await replicated.generate("Hi", model="base-model")).text for _ in range(4)]
    assert texts == ["from a"] * 4
    assert chat_a.call_count == 4 and chat_b.call_count <= 1  # tried at most once, then last for 5 s


async def test_every_replica_answering_503_is_the_servers_error(
    replicated: VLLMProvider, mock: respx.MockRouter
) -> None:
    chat_a = mock.post(f"{REPLICA_A}/chat/completions").mock(return_value=BUSY)
    chat_b = mock.post(f"{REPLICA_B}/chat/completions").mock(return_value=BUSY)
    with pytest.raises(ServerResponseError) as caught:
        await replicated.generate("Hi", model="base-model")
    assert caught.value.status_code == 503 and "cannot accept new requests" in str(caught.value)
    assert not isinstance(caught.value, ProviderUnavailableError)
    assert (chat_a.call_count, chat_b.call_count) == (1, 1)


async def test_a_500_is_not_sent_to_another_replica(replicated: VLLMProvider, mock: respx.MockRouter) -> None:
    """A 500 may be about the request (vLLM answers 500 for what its worker refuses): it is the answer."""
    failed = vllm_error(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                        "InternalServerError")
    chat_a = mock.post(f"{REPLICA_A}/chat/completions").mock(return_value=failed)
    chat_b = mock.post(f"{REPLICA_B}/chat/completions").mock(return_value=failed)
    with pytest.raises(ServerResponseError) as caught:
        await replicated.generate("Hi", model="base-model")
    assert caught.value.status_code == 500 and chat_a.call_count + chat_b.call_count == 1


async def test_a_timeout_is_not_retried_on_another_replica(replicated: VLLMProvider, mock: respx.MockRouter) -> None:
    """The request reached a server, which may still be generating: sending it again would run it twice."""
    chat_a = mock.post(f"{REPLICA_A}/chat/completions").mock(side_effect=httpx.ReadTimeout("slow"))
    chat_b = mock.post(f"{REPLICA_B}/chat/completions").mock(side_effect=httpx.ReadTimeout("slow"))
    with pytest.raises(ProviderTimeoutError):
        await replicated.generate("Hi", model="base-model")
    assert chat_a.call_count + chat_b.call_count == 1


# Streaming --------------------------------------------------------------------------------------------


def sse_chunk(model: str, delta: dict[str, Any] | None, finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}],
    }


def sse_events(
    pieces: list[str], *, model: str = "base-model", finish_reason: str = "stop", usage: bool = True
) -> list[bytes]:
    """The SSE events vLLM sends for a chat stream with include_usage: role, pieces, finish, usage, DONE."""
    chunks = [sse_chunk(model, {"role": "assistant", "content": ""})]
    chunks += [sse_chunk(model, {"content": piece}) for piece in pieces]
    chunks.append(sse_chunk(model, {"content": ""}, finish_reason))
    if usage:
        chunks.append(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": model,
                "choices": [],
                "usage": {"prompt_tokens": 9, "total_tokens": 9 + len(pieces), "completion_tokens": len(pieces)},
            }
        )
    return [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks] + [b"data: [DONE]\n\n"]


def sse_chunks_response(*chunks: dict[str, Any]) -> httpx.Response:
    """An event stream of these chunks (each completed with id, object, created and model), then [DONE]."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "base-model"}
    events = [f"data: {json.dumps({**head, **chunk})}\n\n".encode() for chunk in chunks]
    return httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=b"".join([*events, b"data: [DONE]\n\n"])
    )


def sse_response(pieces: list[str], **kwargs: Any) -> httpx.Response:
    return httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=b"".join(sse_events(pieces, **kwargs))
    )


class HeldStream(httpx.AsyncByteStream):
    """A response body that sends some events, then holds the connection open (a server still generating)."""

    def __init__(self, events: list[bytes], *, then_fail: Exception | None = None) -> None:
        self.events = events
        self.then_fail = then_fail
        self.closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in self.events:
            yield event
        if self.then_fail is not None:
            raise self.then_fail
        await asyncio.sleep(3600)  # only closing the response ends this
        yield b""

    async def aclose(self) -> None:
        self.closed.set()


async def test_stream_yields_pieces_then_the_result(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=sse_response(["Hel", "lo", " there"], finish_reason="length"))
    events = [event async for event in provider.stream("Hi", model="base-model", max_tokens=3, temperature=0.0)]
    assert events[:-1] == ["Hel", "lo", " there"]
    result = events[-1]
    assert isinstance(result, GenerationResult)
    assert (result.text, result.model, result.finish_reason) == ("Hello there", "base-model", "length")
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (9, 3, 12)
    assert sent(route) == {
        "model": "base-model",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    await generates(provider, mock)


async def test_stream_without_a_usage_chunk_counts_token_chunks(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    """Without a usage chunk, each chunk with a piece is one token; the role chunk and empty closing chunk are not."""
    mock.post(CHAT).mock(return_value=sse_response(["a", "b"], usage=False))
    events = [event async for event in provider.stream("Hi", model="base-model")]
    result = events[-1]
    assert isinstance(result, GenerationResult)
    counts = (result.prompt_tokens, result.completion_tokens, result.token_count)
    assert (result.text, counts, result.finish_reason) == ("ab", (None, 2, None), "stop")


async def test_breaking_out_of_a_stream_closes_the_response(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    body = HeldStream(sse_events(["one", "two"], usage=False)[:3])
    mock.post(CHAT).mock(return_value=httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body))
    pieces = []
    stream = cast(AsyncGenerator[object, None], provider.stream("Hi", model="base-model"))
    async with contextlib.aclosing(stream) as events:
        async for event in events:
            pieces.append(event)
            if len(pieces) == 2:
                break
    assert pieces == ["one", "two"]
    assert body.closed.is_set()  # vLLM sees the connection close and aborts the request
    await generates(provider, mock)


async def test_cancelling_the_consumer_closes_the_response(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    body = HeldStream(sse_events(["one"], usage=False)[:2])
    mock.post(CHAT).mock(return_value=httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body))
    first_piece = asyncio.Event()

    async def consume() -> None:
        async for _event in provider.stream("Hi", model="base-model"):
            first_piece.set()

    task = asyncio.create_task(consume())
    await first_piece.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert body.closed.is_set()
    await generates(provider, mock)


async def test_stream_errors_are_mapped_like_generate(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=model_missing("nope"))
    with pytest.raises(ServerModelNotFoundError, match="does not serve model 'nope'"):
        async for _event in provider.stream("Hi", model="nope"):
            pass
    mock.post(CHAT).mock(side_effect=[httpx.Response(503), sse_response(["ok"])])
    events = [event async for event in provider.stream("Hi", model="base-model")]
    assert events[0] == "ok"
    await generates(provider, mock)


async def test_a_connection_dropped_mid_stream_is_unavailable(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    body = HeldStream(sse_events(["one"], usage=False)[:2], then_fail=httpx.RemoteProtocolError("peer closed"))
    mock.post(CHAT).mock(return_value=httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body))
    pieces: list[object] = []
    with pytest.raises(ProviderUnavailableError, match="dropped the connection during stream") as caught:
        async for event in provider.stream("Hi", model="base-model"):
            pieces.append(event)
    assert pieces == ["one"] and caught.value.url == BASE
    await generates(provider, mock)


async def test_a_stream_that_times_out_between_chunks(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    body = HeldStream(sse_events(["one"], usage=False)[:2], then_fail=httpx.ReadTimeout("no next chunk"))
    mock.post(CHAT).mock(return_value=httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body))
    with pytest.raises(ProviderTimeoutError, match="VLLM_TIMEOUT"):
        async for _event in provider.stream("Hi", model="base-model"):
            pass
    await generates(provider, mock)


async def test_a_malformed_stream_event_is_a_protocol_error(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(
        return_value=httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"data: {oops\n\n")
    )
    with pytest.raises(ProtocolError):
        async for _event in provider.stream("Hi", model="base-model"):
            pass
    await generates(provider, mock)


ALREADY_LOADED = (
    "The lora adapter 'a1' has already been loaded. If you want to load the adapter in place, "
    "set 'load_inplace' to True."
)


async def test_a_retried_load_that_finds_its_own_earlier_load_succeeds(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """A proxy answered 504 to a load vLLM finished; the retry hears "already loaded" for the same path."""
    load = mock.post(LOAD).mock(
        side_effect=[httpx.Response(504), vllm_error(400, ALREADY_LOADED, "InvalidUserInput")]
    )
    mock.get(f"{BASE}/models").mock(return_value=served_models("a1"))  # root /adapters/a1
    await provider.load_adapter("a1", "/adapters/a1")
    assert load.call_count == 2 and await provider.list_adapters() == ["a1"]


async def test_already_loaded_from_another_path_stays_an_error(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=vllm_error(400, ALREADY_LOADED, "InvalidUserInput"))
    mock.get(f"{BASE}/models").mock(return_value=served_models("a1"))  # root /adapters/a1
    with pytest.raises(ServerAdapterAlreadyLoadedError):
        await provider.load_adapter("a1", "/adapters/elsewhere")
    assert await provider.list_adapters() == ["a1"]  # the server's own, from /adapters/a1
    assert provider._adapter_path("a1") is None  # not recorded as loaded from the refused path


async def test_an_adapter_on_any_replica_is_found_and_unloaded_everywhere(mock: respx.MockRouter) -> None:
    mock.get(f"{REPLICA_A}/models").mock(return_value=model_list())
    mock.get(f"{REPLICA_B}/models").mock(return_value=model_list("stale"))
    unloads = [
        mock.post(f"{url.removesuffix('/v1')}/v1/unload_lora_adapter").mock(
            return_value=httpx.Response(200, text="Success")
        )
        for url in (REPLICA_A, REPLICA_B)
    ]
    async with VLLMProvider(base_url=[REPLICA_A, REPLICA_B]) as vllm:
        await vllm.unload_adapter("stale")
        mock.get(f"{REPLICA_B}/models").mock(return_value=model_list())  # unloaded there
        assert await vllm.list_adapters() == []
    assert [route.call_count for route in unloads] == [1, 1]


async def test_a_relative_local_path_is_sent_as_an_absolute_path(
    mock: respx.MockRouter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = tmp_path / "adapters" / "rel"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "none"})
    )
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    async with VLLMProvider(base_url=BASE) as vllm:
        await vllm.load_adapter("rel", "adapters/rel")
    assert json.loads(load.calls[0].request.content)["lora_path"] == str(adapter)


# Listing what the servers hold ----------------------------------------------------------------------------


def vllm_models(*loras: tuple[str, str], base: str = "base-model") -> httpx.Response:
    """``GET /v1/models`` exactly as vLLM 0.33 answers it: the base model, then one card per LoRA adapter."""

    def card(model_id: str, root: str, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": 1700000000,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{model_id}",
                    "object": "model_permission",
                    "created": 1700000000,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    data = [card(base, f"/models/{base}", None, 2048)]
    data += [card(name, root, base, None) for name, root in loras]
    return httpx.Response(200, json={"object": "list", "data": data})


async def test_a_new_provider_lists_the_adapters_the_server_holds(mock: respx.MockRouter) -> None:
    """``inference adapters list`` in a new process: the LoRA cards of /v1/models, merged with this object's."""
    mock.get(f"{BASE}/models").mock(
        return_value=vllm_models(("support", "/srv/adapters/support"), ("from-cli", "/srv/lora-modules/x"))
    )
    mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success: LoRA adapter 'mine' added successfully."))
    async with VLLMProvider(base_url=BASE) as fresh:
        assert await fresh.list_adapters() == ["from-cli", "support"]  # the base model is not an adapter
        await fresh.load_adapter("mine", "/srv/adapters/mine")  # a vLLM that does not list runtime loads
        assert await fresh.list_adapters() == ["from-cli", "mine", "support"]


async def test_an_adapter_being_unloaded_is_not_listed(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    mock.get(f"{BASE}/models").mock(return_value=vllm_models(("a1", "/adapters/a1")))
    unloading = asyncio.Event()
    release = asyncio.Event()

    async def slow_unload(request: httpx.Request) -> httpx.Response:
        unloading.set()
        await release.wait()
        return httpx.Response(200, text="Success: LoRA adapter 'a1' removed successfully.")

    mock.post(UNLOAD).mock(side_effect=slow_unload)
    await provider.load_adapter("a1", "/adapters/a1")
    unload = asyncio.create_task(provider.unload_adapter("a1"))
    await unloading.wait()
    assert await provider.list_adapters() == []  # the server still lists it until the unload answers
    release.set()
    await unload


async def test_listing_with_replicas_is_the_union_of_what_answers(
    replicated: VLLMProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    models_b = mock.get(f"{REPLICA_B}/models")
    mock.get(f"{REPLICA_A}/models").mock(return_value=vllm_models(("a1", "/adapters/a1")))
    models_b.mock(return_value=vllm_models(("a1", "/adapters/a1"), ("b-only", "/adapters/b")))
    assert await replicated.list_adapters() == ["a1", "b-only"]

    models_b.mock(side_effect=httpx.ConnectError("Connection refused"))
    assert await replicated.list_adapters() == ["a1"]
    assert f"vLLM replica {REPLICA_B} is down (ConnectError)" in caplog.text

    mock.get(f"{REPLICA_A}/models").mock(side_effect=httpx.ConnectError("Connection refused"))
    with pytest.raises(ProviderUnavailableError) as caught:  # b, marked down, is asked too: a did not answer
        await replicated.list_adapters()
    assert REPLICA_A in str(caught.value) and REPLICA_B in str(caught.value)


async def test_listing_leaves_a_replica_known_down_alone_and_warns_once(
    replicated: VLLMProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="inference")
    mock.get(f"{REPLICA_A}/models").mock(return_value=vllm_models(("a1", "/adapters/a1")))
    models_b = mock.get(f"{REPLICA_B}/models").mock(side_effect=httpx.ConnectError("Connection refused"))
    for _ in range(5):
        assert await replicated.list_adapters() == ["a1"]
    assert models_b.call_count == 1  # asked once, then left alone while it is marked down (5 s)
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [(record.name, getattr(record, "replica_event", None), getattr(record, "url", None))
            for record in warnings] == [("inference.replicas", "down", REPLICA_B)]


async def test_listing_when_the_server_refuses_the_key_is_its_error(mock: respx.MockRouter) -> None:
    mock.get(f"{BASE}/models").mock(return_value=vllm_error(401, "Unauthorized", "AuthenticationError"))
    async with VLLMProvider(base_url=BASE, api_key="wrong") as vllm:
        with pytest.raises(ServerResponseError, match="refused the credentials") as caught:
            await vllm.list_adapters()
    assert caught.value.status_code == 401


async def test_listing_or_finding_adapters_where_nothing_answers_is_unavailable() -> None:
    """A real closed port on loopback: the CLI must exit 1, not print an empty list."""
    url = f"http://127.0.0.1:{closed_port()}/v1"
    async with VLLMProvider(base_url=url, max_retries=0) as vllm:
        with pytest.raises(ProviderUnavailableError, match=f"nothing answers at {url}"):
            await vllm.list_adapters()
        with pytest.raises(ProviderUnavailableError):  # not "adapter 'x' is not loaded"
            await vllm.unload_adapter("x")
        with pytest.raises(ProviderUnavailableError):
            await vllm.generate("Hi", model="base-model", adapter_id="x")


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, json=[{"id": "a1", "parent": "base"}]),
        httpx.Response(200, json={"object": "list", "data": {"a1": {}}}),
        httpx.Response(200, json={"object": "list", "data": ["a1"]}),
        httpx.Response(200, json={"object": "list", "data": [{"id": None, "parent": "base"}]}),
        httpx.Response(200, text="<html>proxy login</html>"),
    ],
    ids=["list", "data-object", "data-of-names", "id-null", "html"],
)
async def test_a_malformed_model_list_is_a_protocol_error(
    provider: VLLMProvider, mock: respx.MockRouter, answer: httpx.Response
) -> None:
    mock.get(f"{BASE}/models").mock(return_value=answer)
    with pytest.raises(ProtocolError, match="answered list models with"):
        await provider.list_adapters()


# Resolver plugins, routes, URLs, malformed streams ---------------------------------------------------------


async def test_an_adapter_the_lora_resolver_cannot_load_is_an_invalid_adapter(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """vLLM with a LoRA resolver plugin found the adapter the request names, but loading it failed: 400."""
    reason = "LoRA rank 64 is greater than max_lora_rank 16."
    mock.post(CHAT).mock(
        return_value=vllm_error(400, f"LoRA adapter 'pirate' was found but could not be loaded: {reason}")
    )
    with pytest.raises(ServerInvalidAdapterError) as caught:
        await provider.generate("Hi", model="pirate")
    message = str(caught.value)
    assert "found adapter 'pirate' through its LoRA resolver plugin but could not load it" in message
    assert reason in message and caught.value.status_code == 400
    with pytest.raises(ServerInvalidAdapterError, match="LoRA resolver"):
        async for _event in provider.stream("Hi", model="pirate"):
            pass
    mock.post(CHAT).mock(return_value=vllm_error(400, "max_tokens must be at least 1, got 0."))
    with pytest.raises(ServerResponseError) as other:  # another 400 stays a plain server error
        await provider.generate("Hi", model="base-model")
    assert not isinstance(other.value, InvalidAdapterError)


async def test_a_plain_text_404_is_a_missing_route_not_a_missing_model(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    """A proxy (or a Go server) in front: ``404 page not found`` says the route is missing, not the model."""
    mock.post(CHAT).mock(
        return_value=httpx.Response(404, text="404 page not found", headers={"content-type": "text/plain"})
    )
    with pytest.raises(ServerResponseError, match="has no route /v1/chat/completions") as caught:
        await provider.generate("Hi", model="base-model")
    assert not isinstance(caught.value, ModelNotFoundError)
    mock.post(LOAD).mock(return_value=httpx.Response(404, text="404 page not found"))
    with pytest.raises(RuntimeLoRADisabledError):
        await provider.load_adapter("a1", "/adapters/a1")


@pytest.mark.parametrize(
    "url", ["http://vllm.test:port/v1", "http://:8100/v1", "http://vllm.test:99999/v1", "http://vllm\x07.test/v1"]
)
def test_a_base_url_no_request_can_use_is_a_configuration_error(url: str) -> None:
    """Refused when the provider is made (the settings check or the HTTP client's), never at the first request."""
    with pytest.raises(ConfigurationError, match="base_url") as caught:
        VLLMProvider(base_url=url)
    assert caught.value.url == url


def llama_cpp_server_sse(pieces: list[str]) -> httpx.Response:
    """A chat stream exactly as llama_cpp.server 0.3 sends it: no usage chunk, whatever stream_options says.

    A role chunk without content, one chunk per token (a token that ends inside a multi-byte character has
    an empty piece), then an empty delta with the finish reason.
    """

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        body = {
            "id": "chatcmpl-52a1df83",
            "model": "base-model",
            "created": 1795466280,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        return f"data: {json.dumps(body)}\r\n\r\n".encode()

    events = [chunk({"role": "assistant"})] + [chunk({"content": piece}) for piece in pieces]
    events += [chunk({}, "length"), b"data: [DONE]\r\n\r\n"]
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(events))


async def test_a_llama_cpp_server_stream_counts_one_token_per_chunk(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    mock.post(CHAT).mock(return_value=llama_cpp_server_sse([" sm", "", "ion", "ear"]))
    events = [event async for event in provider.stream("Hello", model="base-model", max_tokens=4)]
    result = events[-1]
    assert isinstance(result, GenerationResult)
    assert events[:-1] == [" sm", "ion", "ear"]
    assert (result.text, result.completion_tokens, result.finish_reason) == (" smionear", 4, "length")


@pytest.mark.parametrize(
    "answer",
    [
        sse_chunks_response({"choices": [{"index": 0, "delta": {"content": 5}, "finish_reason": None}]}),
        sse_chunks_response(
            {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None}},
        ),
        sse_chunks_response({"choices": [{"index": 0, "delta": {"content": "cut"}, "finish_reason": None}]}),
        completion("a JSON answer to a stream request"),
        httpx.Response(200, text="<html>proxy login</html>"),
    ],
    ids=["content-not-text", "usage-nulls", "cut-short", "json-answer", "html"],
)
async def test_a_malformed_stream_is_a_protocol_error(
    provider: VLLMProvider, mock: respx.MockRouter, answer: httpx.Response
) -> None:
    mock.post(CHAT).mock(return_value=answer)
    with pytest.raises(ProtocolError, match=BASE):
        async for _event in provider.stream("Hi", model="base-model"):
            pass
    await generates(provider, mock)


async def test_an_error_event_inside_a_stream_is_a_provider_error_that_says_why(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    error_event = {"error": {"message": "The engine died.", "type": "InternalServerError", "code": 500}}
    mock.post(CHAT).mock(return_value=sse_chunks_response(error_event))
    with pytest.raises(ProviderError, match="reported an error during stream with model 'base-model': The engine"):
        async for _event in provider.stream("Hi", model="base-model"):
            pass


# Cancellation closes the request ---------------------------------------------------------------------------


def held_response(body: HeldStream) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "application/json"}, stream=body)


async def test_cancelling_generate_closes_the_response(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    """The server is still answering when the caller gives up: the response is closed, so vLLM aborts."""
    body = HeldStream([b'{"id": "chatcmpl-1", '])
    route = mock.post(CHAT).mock(return_value=held_response(body))
    task = asyncio.create_task(provider.generate("Hi", model="base-model"))
    while not route.called:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert body.closed.is_set()
    await generates(provider, mock)


async def test_cancelling_generate_batch_closes_every_response(provider: VLLMProvider, mock: respx.MockRouter) -> None:
    bodies = [HeldStream([b'{"id": "chatcmpl-1", ']) for _ in range(3)]
    route = mock.post(CHAT).mock(side_effect=[held_response(body) for body in bodies])
    task = asyncio.create_task(provider.generate_batch(["a", "b", "c"], model="base-model"))
    while route.call_count < 3:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(body.closed.is_set() for body in bodies)


async def test_a_reasoning_model_s_thinking_is_kept_apart_from_the_text(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    # vLLM 0.32 with a reasoning parser puts the thinking in message.reasoning (and delta.reasoning in a stream).
    body = json.loads(completion("4").content)
    body["choices"][0]["message"]["reasoning"] = "2 + 2 is 4."
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=body))
    result = await provider.generate("2 + 2?", model="base-model")
    assert (result.text, result.reasoning) == ("4", "2 + 2 is 4.")
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"reasoning": "2 + 2"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"reasoning": " is 4."}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "4"}, "finish_reason": "stop"}]},
    ]
    lines = "".join(
        "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "base-model", **c})
        + "\n\n"
        for c in chunks
    ) + "data: [DONE]\n\n"
    mock.post(CHAT).mock(return_value=httpx.Response(200, text=lines, headers={"content-type": "text/event-stream"}))
    events = [event async for event in provider.stream("2 + 2?", model="base-model")]
    assert events[:-1] == ["4"]
    final = events[-1]
    assert isinstance(final, GenerationResult) and (final.text, final.reasoning) == ("4", "2 + 2 is 4.")


def _weights() -> Any:
    import numpy as np

    from inference.adapters.weights import AdapterWeights

    name = "base_model.model.model.layers.0.self_attn.q_proj"
    return AdapterWeights(
        {f"{name}.lora_A.weight": np.full((2, 8), 0.5, "float32"), f"{name}.lora_B.weight": np.ones((8, 2), "float32")},
        {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]},
    )


async def test_weights_from_memory_are_written_where_the_server_reads_them(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    unload = mock.post(UNLOAD).mock(return_value=httpx.Response(200, text="Success"))
    async with VLLMProvider(base_url=BASE, adapter_dir=str(tmp_path)) as provider:
        await provider.load_adapter("step-1", _weights())
        written = Path(sent(load)["lora_path"])
        assert written.parent == tmp_path
        assert sorted(path.name for path in written.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        await provider.unload_adapter("step-1")
        assert sent(unload) == {"lora_name": "step-1"} and not written.exists()  # removed once unloaded


async def test_weights_from_memory_stay_written_after_aclose_while_the_adapter_is_loaded(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    """vLLM reads an adapter's files at load and again whenever it left the server's CPU LoRA cache
    (``--max-cpu-loras``, least recently used): the folder is what the server serves the adapter from. ``aclose()``
    only closes the connections of an HTTP provider, which stays usable with its adapters, so the folder stays until
    the adapter is unloaded or replaced (or the provider is collected, or the process exits)."""
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    unload = mock.post(UNLOAD).mock(return_value=httpx.Response(200, text="Success"))
    chat = mock.post(CHAT).mock(return_value=completion("styled", model="step-1"))
    provider = VLLMProvider(base_url=BASE, adapter_dir=str(tmp_path), api="chat")
    await provider.load_adapter("step-1", _weights())
    written = Path(sent(load)["lora_path"])
    await provider.aclose()
    assert (written / "adapter_model.safetensors").is_file()  # the server may read it again
    assert (await provider.generate("Hi", model="base-model", adapter_id="step-1")).text == "styled"
    assert sent(chat)["model"] == "step-1"
    await provider.unload_adapter("step-1")
    assert sent(unload) == {"lora_name": "step-1"} and not written.exists()
    await provider.aclose()


async def test_the_shared_adapter_dir_is_checked_when_the_provider_is_built_and_sent_absolute(
    mock: respx.MockRouter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``~`` was not expanded and a relative path was sent as it was (vLLM resolves ``lora_path`` against its own
    working directory, or takes it for a Hub id); a missing directory or a file failed at the first
    ``load_adapter`` with a bare FileNotFoundError or NotADirectoryError."""
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for directory in (tmp_path / "home" / "shared", tmp_path / "relative"):
        directory.mkdir(parents=True)
    for written, expected in (("~/shared", tmp_path / "home" / "shared"), ("relative", tmp_path / "relative")):
        async with VLLMProvider(base_url=BASE, adapter_dir=written) as provider:
            assert provider.adapter_dir == str(expected)
            await provider.load_adapter("step-1", _weights())
            assert Path(sent(load)["lora_path"]).parent == expected  # absolute: the server reads this path
    (tmp_path / "a-file").write_text("x")
    for written, problem in (("missing", "does not exist"), ("a-file", "exists but is not a directory")):
        with pytest.raises(ConfigurationError, match=f"adapter_dir=.*{tmp_path / written} {problem}") as caught:
            VLLMProvider(base_url=BASE, adapter_dir=written)
        assert caught.value.path == str(tmp_path / written)
        monkeypatch.setenv("VLLM_ADAPTER_DIR", written)
        with pytest.raises(ConfigurationError, match=f"VLLM_ADAPTER_DIR=.*{problem}"):
            VLLMProvider(base_url=BASE)
        monkeypatch.delenv("VLLM_ADAPTER_DIR")
    assert not (tmp_path / "missing").exists()  # checked, not created: a shared volume is mounted, not made here
    (tmp_path / "unmounted").mkdir()
    async with VLLMProvider(base_url=BASE, adapter_dir="unmounted") as provider:
        (tmp_path / "unmounted").rmdir()  # gone after the provider was built
        with pytest.raises(ConfigurationError, match=f"cannot write adapter weights into the directory {tmp_path}"):
            await provider.load_adapter("step-2", _weights())


async def test_weights_from_memory_without_a_shared_directory_say_what_to_set(
    provider: VLLMProvider, mock: respx.MockRouter
) -> None:
    load = mock.post(LOAD).mock(return_value=httpx.Response(200, text="Success"))
    with pytest.raises(ConfigurationError, match="VLLM_ADAPTER_DIR"):
        await provider.load_adapter("step-1", _weights())
    assert load.call_count == 0 and await provider.list_adapters() == []
    await generates(provider, mock)


# On-demand placement: what it loads and unloads is recorded, and max_loras holds again -------------------------


class PlacingServers:
    """Two vLLMs whose runtime adapters are kept per replica; a chat request can be held until released."""

    def __init__(self) -> None:
        self.held: dict[str, list[str]] = {REPLICA_A: [], REPLICA_B: []}
        self.holding: dict[tuple[str, str], tuple[asyncio.Event, asyncio.Event]] = {}  # -> (arrived, release)

    def route(self, mock: respx.MockRouter) -> None:
        for url in (REPLICA_A, REPLICA_B):
            mock.get(f"{url}/models").mock(side_effect=lambda request, url=url: model_list(*self.held[url]))
            mock.post(f"{url}/load_lora_adapter").mock(side_effect=lambda request, url=url: self._load(url, request))
            mock.post(f"{url}/unload_lora_adapter").mock(
                side_effect=lambda request, url=url: self._unload(url, request)
            )
            mock.post(f"{url}/chat/completions").mock(side_effect=lambda request, url=url: self._chat(url, request))

    def hold(self, url: str, model: str) -> tuple[asyncio.Event, asyncio.Event]:
        """The next chat request for ``model`` on ``url`` waits: (it arrived, release it)."""
        events = self.holding[url, model] = (asyncio.Event(), asyncio.Event())
        return events

    def _load(self, url: str, request: httpx.Request) -> httpx.Response:
        self.held[url].append(json.loads(request.content)["lora_name"])
        return httpx.Response(200, text="Success")

    def _unload(self, url: str, request: httpx.Request) -> httpx.Response:
        self.held[url].remove(json.loads(request.content)["lora_name"])
        return httpx.Response(200, text="Success")

    async def _chat(self, url: str, request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        assert model in self.held[url], (url, model, self.held)
        held = self.holding.pop((url, model), None)
        if held is not None:
            held[0].set()
            await held[1].wait()
        return completion(f"{model} on {url}", model=model)


async def test_on_demand_placement_records_its_loads_and_evictions_and_comes_back_to_max_loras(
    mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    """max_loras=1 and spread_after=1 on two replicas. B goes over max_loras once (every adapter on it busy), and the
    next placement on B unloads until it holds max_loras again. Every placed load and every eviction is an adapter
    event (before, none was: only load_adapter's own loads were counted and logged)."""
    servers = PlacingServers()
    servers.route(mock)
    caplog.set_level(logging.INFO, logger="inference")
    async with VLLMProvider(base_url=[REPLICA_A, REPLICA_B], adapter_placement="on-demand", max_loras=1,
                            spread_after=1, max_retries=0) as provider:

        async def held_on(url: str, adapter_id: str) -> asyncio.Task[GenerationResult]:
            arrived, release = servers.hold(url, adapter_id)
            task = asyncio.create_task(provider.generate("Hi", model="base-model", adapter_id=adapter_id))
            await arrived.wait()
            releases.append(release)
            return task

        releases: list[asyncio.Event] = []
        await provider.load_adapter("a0", "/adapters/a0")
        await provider.load_adapter("a1", "/adapters/a1")
        assert servers.held == {REPLICA_A: ["a0"], REPLICA_B: ["a1"]}
        busy = [await held_on(REPLICA_B, "a1"), await held_on(REPLICA_A, "a0")]
        spread = await provider.generate("Hi", model="base-model", adapter_id="a0")  # A busy: a0 goes to B too
        assert spread.text == f"a0 on {REPLICA_B}"
        assert servers.held[REPLICA_B] == ["a1", "a0"]  # over max_loras: a1 was busy there
        for release in releases:
            release.set()
        await asyncio.gather(*busy)

        releases.clear()
        await provider.load_adapter("a2", "/adapters/a2")  # goes to A (fewest adapters), a0 evicted there
        assert servers.held[REPLICA_A] == ["a2"]
        busy = [await held_on(REPLICA_A, "a2")]
        assert (await provider.generate("Hi", model="base-model", adapter_id="a2")).text == f"a2 on {REPLICA_B}"
        releases[0].set()
        await asyncio.gather(*busy)
        assert servers.held[REPLICA_B] == ["a2"]  # a1 and a0 unloaded: max_loras holds again

        events = [(record.adapter_event, record.adapter_id, getattr(record, "replica", None), record.outcome)
                  for record in caplog.records if hasattr(record, "adapter_event")]
        assert events == [
            ("load", "a0", None, "ok"),
            ("load", "a1", None, "ok"),
            ("load", "a0", REPLICA_B, "ok"),  # spread
            ("evict", "a0", REPLICA_A, "ok"),  # room for a2 on A
            ("load", "a2", None, "ok"),
            ("evict", "a1", REPLICA_B, "ok"),  # room for a2 on B: down to max_loras
            ("evict", "a0", REPLICA_B, "ok"),
            ("load", "a2", REPLICA_B, "ok"),  # spread
        ]
        stats = provider.adapter_stats()
        assert (stats.loads, stats.evictions) == (5, 3)
