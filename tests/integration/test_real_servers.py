"""Against a real vLLM or Ollama server, when one is named; skipped otherwise (this machine runs neither).

- vLLM: ``VLLM_TEST_URL`` (e.g. ``http://gpu-box:8100/v1``), ``VLLM_TEST_MODEL`` (the served model name),
  optional ``VLLM_TEST_API_KEY``, and ``VLLM_TEST_ADAPTER`` (a PEFT LoRA directory on the vLLM machine) for
  the adapter tests, which also need the server started with ``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``.
- Ollama: ``OLLAMA_TEST_URL`` (e.g. ``http://localhost:11434/v1``) and ``OLLAMA_TEST_MODEL`` (a pulled model),
  and ``OLLAMA_TEST_ADAPTER`` (a GGUF LoRA file or PEFT LoRA directory on this machine, trained for that model)
  for the adapter tests, which create and delete models in the ``inference-lora`` namespace. The tool tests use
  ``OLLAMA_TEST_TOOL_MODEL`` (a pulled model whose template takes tools, e.g. ``llama3.2`` or ``qwen3``), else
  ``OLLAMA_TEST_MODEL``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    InvalidAdapterError,
    ModelNotFoundError,
)
from inference.ollama_provider import OllamaProvider
from inference.provider import GenerationResult
from inference.vllm_provider import VLLMProvider

pytestmark = pytest.mark.integration

VLLM_URL = os.environ.get("VLLM_TEST_URL", "")
VLLM_MODEL = os.environ.get("VLLM_TEST_MODEL", "")
VLLM_ADAPTER = os.environ.get("VLLM_TEST_ADAPTER", "")
OLLAMA_URL = os.environ.get("OLLAMA_TEST_URL", "")
OLLAMA_MODEL = os.environ.get("OLLAMA_TEST_MODEL", "")
OLLAMA_ADAPTER = os.environ.get("OLLAMA_TEST_ADAPTER", "")
OLLAMA_TOOL_MODEL = os.environ.get("OLLAMA_TEST_TOOL_MODEL", "") or OLLAMA_MODEL

needs_vllm = pytest.mark.skipif(
    not (VLLM_URL and VLLM_MODEL), reason="set VLLM_TEST_URL and VLLM_TEST_MODEL to test against a real vLLM"
)
needs_vllm_adapter = pytest.mark.skipif(
    not (VLLM_URL and VLLM_MODEL and VLLM_ADAPTER),
    reason="set VLLM_TEST_URL, VLLM_TEST_MODEL and VLLM_TEST_ADAPTER to test runtime LoRA on a real vLLM",
)
needs_ollama = pytest.mark.skipif(
    not (OLLAMA_URL and OLLAMA_MODEL),
    reason="set OLLAMA_TEST_URL and OLLAMA_TEST_MODEL to test against a real Ollama",
)
needs_ollama_adapter = pytest.mark.skipif(
    not (OLLAMA_URL and OLLAMA_MODEL and OLLAMA_ADAPTER),
    reason="set OLLAMA_TEST_URL, OLLAMA_TEST_MODEL and OLLAMA_TEST_ADAPTER to test adapters on a real Ollama",
)


@pytest.fixture
async def vllm() -> AsyncIterator[VLLMProvider]:
    async with VLLMProvider(base_url=VLLM_URL, api_key=os.environ.get("VLLM_TEST_API_KEY") or None) as provider:
        yield provider


@pytest.fixture
async def ollama() -> AsyncIterator[OllamaProvider]:
    async with OllamaProvider(base_url=OLLAMA_URL, base_model=OLLAMA_MODEL) as provider:
        yield provider


@needs_vllm
async def test_vllm_generates(vllm: VLLMProvider) -> None:
    result = await vllm.generate("Say hello.", model=VLLM_MODEL, max_tokens=4, temperature=0.0, top_k=1)
    assert result.completion_tokens > 0 and result.prompt_tokens > 0
    assert result.finish_reason in ("stop", "length")
    seeded = [
        await vllm.generate("Say hello.", model=VLLM_MODEL, max_tokens=8, temperature=1.0, seed=5) for _ in range(2)
    ]
    assert seeded[0].text == seeded[1].text


@needs_vllm
async def test_vllm_stream_reports_usage(vllm: VLLMProvider) -> None:
    events = [event async for event in vllm.stream("Say hello.", model=VLLM_MODEL, max_tokens=6, temperature=0.0)]
    final = events[-1]
    assert isinstance(final, GenerationResult)
    assert "".join(e for e in events[:-1] if isinstance(e, str)) == final.text
    assert final.prompt_tokens > 0 and 0 < final.completion_tokens <= 6  # the usage chunk arrived


@needs_vllm
async def test_vllm_unknown_model(vllm: VLLMProvider) -> None:
    with pytest.raises(ModelNotFoundError):
        await vllm.generate("Hi", model=f"no-such-model-{uuid.uuid4().hex[:8]}", max_tokens=2)


@needs_vllm_adapter
async def test_vllm_runtime_lora_lifecycle(vllm: VLLMProvider) -> None:
    adapter_id = f"sdk-test-{uuid.uuid4().hex[:8]}"
    await vllm.load_adapter(adapter_id, VLLM_ADAPTER)
    try:
        assert adapter_id in await vllm.list_adapters()
        result = await vllm.generate("Say hello.", model=VLLM_MODEL, adapter_id=adapter_id, max_tokens=4)
        assert result.adapter_id == adapter_id and result.completion_tokens > 0
        await vllm.load_adapter(adapter_id, VLLM_ADAPTER)  # same id and path: nothing to do
        with pytest.raises(AdapterAlreadyLoadedError):
            await vllm.load_adapter(adapter_id, VLLM_ADAPTER + "-elsewhere")
        report = await vllm.reconcile_adapters()
        assert report.ok and report.reloaded == []  # the server lists it (parent = the base model)
        events = [
            event async for event in vllm.stream("Say hello.", model=VLLM_MODEL, adapter_id=adapter_id, max_tokens=4)
        ]
        final = events[-1]
        assert isinstance(final, GenerationResult) and final.completion_tokens > 0 and final.prompt_tokens > 0
    finally:
        await vllm.unload_adapter(adapter_id)
    assert adapter_id not in await vllm.list_adapters()
    with pytest.raises(AdapterNotFoundError):
        await vllm.unload_adapter(adapter_id)
    with pytest.raises(AdapterNotFoundError):
        await vllm.generate("Hi", model=VLLM_MODEL, adapter_id=adapter_id, max_tokens=2)


@needs_vllm_adapter
async def test_vllm_adapter_path_without_adapter(vllm: VLLMProvider) -> None:
    with pytest.raises(InvalidAdapterError):
        await vllm.load_adapter(f"sdk-missing-{uuid.uuid4().hex[:8]}", "/nonexistent/sdk-test-adapter")
    assert await vllm.list_adapters() == []


@needs_ollama
async def test_ollama_generates_with_every_option(ollama: OllamaProvider) -> None:
    first, second = [
        await ollama.generate(
            "Say hello.",
            model=OLLAMA_MODEL,
            max_tokens=8,
            temperature=0.8,
            top_p=0.9,
            top_k=20,
            repetition_penalty=1.2,
            seed=42,
        )
        for _ in range(2)
    ]
    assert first.text == second.text  # the seed reached the sampler
    assert 0 < first.completion_tokens <= 8 and first.prompt_tokens > 0


@needs_ollama
async def test_ollama_max_tokens_gives_length(ollama: OllamaProvider) -> None:
    result = await ollama.generate("Write a long story about a ship.", model=OLLAMA_MODEL, max_tokens=3)
    assert result.finish_reason == "length" and result.completion_tokens == 3


@needs_ollama
async def test_ollama_missing_model_says_pull(ollama: OllamaProvider) -> None:
    name = f"no-such-model-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ModelNotFoundError, match=f"ollama pull {name}"):
        await ollama.generate("Hi", model=name, max_tokens=2)


@needs_ollama
async def test_ollama_streams_pieces_then_the_result(ollama: OllamaProvider) -> None:
    pieces: list[str] = []
    async for event in ollama.stream("Count to ten.", model=OLLAMA_MODEL, max_tokens=6, temperature=0.0):
        if isinstance(event, str):
            pieces.append(event)
        else:
            assert event.text == "".join(pieces) and event.completion_tokens > 0
            assert event.finish_reason in ("stop", "length")
    assert pieces


@needs_ollama
async def test_ollama_stream_stopped_early_leaves_the_provider_usable(ollama: OllamaProvider) -> None:
    async for event in ollama.stream("Write a long story about a ship.", model=OLLAMA_MODEL, max_tokens=200):
        assert isinstance(event, str)
        break
    result = await ollama.generate("Say hello.", model=OLLAMA_MODEL, max_tokens=4)
    assert result.completion_tokens > 0


@needs_ollama_adapter
async def test_ollama_adapter_lifecycle_survives_a_new_provider(ollama: OllamaProvider) -> None:
    adapter_id = f"sdk-test-{uuid.uuid4().hex[:8]}"
    await ollama.load_adapter(adapter_id, OLLAMA_ADAPTER)
    try:
        assert adapter_id in await ollama.list_adapters()
        result = await ollama.generate("Say hello.", model=OLLAMA_MODEL, adapter_id=adapter_id, max_tokens=4)
        assert result.adapter_id == adapter_id and result.completion_tokens > 0
        async with OllamaProvider(base_url=OLLAMA_URL, base_model=OLLAMA_MODEL) as fresh:
            assert adapter_id in await fresh.list_adapters()
            again = await fresh.generate("Say hello.", model=OLLAMA_MODEL, adapter_id=adapter_id, max_tokens=4)
            assert again.completion_tokens > 0
    finally:
        await ollama.unload_adapter(adapter_id)
    assert adapter_id not in await ollama.list_adapters()
    with pytest.raises(AdapterNotFoundError):
        await ollama.generate("Hi", model=OLLAMA_MODEL, adapter_id=adapter_id, max_tokens=2)


@needs_ollama
async def test_ollama_adapter_on_a_missing_base_says_pull(ollama: OllamaProvider, tmp_path: Path) -> None:
    name = f"no-such-model-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ModelNotFoundError, match=f"ollama pull {name}"):
        await ollama.load_adapter("sdk-test", tmp_path, base_model=name)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]},
}}


@needs_ollama
async def test_ollama_calls_a_named_tool_whole_and_streamed_and_reads_its_result(ollama: OllamaProvider) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    asked = "What is the weather in Paris?"
    result = await ollama.generate(asked, model=OLLAMA_TOOL_MODEL, tools=[WEATHER], tool_choice=choice,
                                   max_tokens=128, temperature=0.0)
    assert result.finish_reason == "tool_calls" and result.tool_calls is not None and len(result.tool_calls) == 1
    call = result.tool_calls[0]
    assert call.name == "get_weather" and call.error is None and isinstance(call.arguments["city"], str)
    pieces: list[str] = []
    async for event in ollama.stream(asked, model=OLLAMA_TOOL_MODEL, tools=[WEATHER], tool_choice="required",
                                     max_tokens=128, temperature=0.0):
        if isinstance(event, str):
            pieces.append(event)
        else:
            assert event.tool_calls is not None and event.tool_calls[0].error is None
            assert event.tool_calls[0].name == "get_weather" and event.finish_reason == "tool_calls"
    assert pieces == []  # a forced call's content is the call, not text
    messages = [{"role": "user", "content": asked}, result.as_message(), call.answer("sunny, 24 degrees")]
    answer = await ollama.generate(messages, model=OLLAMA_TOOL_MODEL, tools=[WEATHER], tool_choice="none",
                                   max_tokens=48, temperature=0.0)
    assert answer.tool_calls is None and answer.text.strip()

