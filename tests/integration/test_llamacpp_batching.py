"""llama.cpp's continuous batching (``n_parallel > 1``), against the real llama.cpp on both tiny architectures.

The reference for every request is the same request on a provider with ``n_parallel=1``, which runs it alone
with ``Llama.generate``: with an f32 KV cache, a request's tokens must not depend on what else is in its batch.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from inference.exceptions import InvalidRequestError, ProviderError
from inference.llamacpp_provider import LlamaCppProvider
from inference.provider import GenerationResult

pytestmark = pytest.mark.integration

llama_cpp = pytest.importorskip("llama_cpp")

# Different lengths, limits and stop strings: sequences join, advance and leave at different steps.
REQUESTS: list[dict[str, Any]] = [
    {"prompt": "Once upon a time", "max_tokens": 24},
    {"prompt": "The quick brown fox jumps over the lazy dog, and then", "max_tokens": 9, "stop": ["e "]},
    {"prompt": "Hello", "max_tokens": 31},
    {"prompt": "a b c d e f g h i j k l m n o p q r s t u v w x y z", "max_tokens": 5},
    {"prompt": "In the beginning", "max_tokens": 17, "stop": ["a", "o"]},
    {"prompt": "x", "max_tokens": 1},
    {"prompt": "Tell me a story about a dragon and a knight who met at a bridge", "max_tokens": 28, "stop": [" th"]},
    {"prompt": "1 2 3", "max_tokens": 12},
]


@pytest.fixture(scope="module")
def adapter_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batching-adapter-cache")


def make_provider(model: Any, cache: Path, n_parallel: int, **kwargs: Any) -> LlamaCppProvider:
    options: dict[str, Any] = {"n_ctx": 1024, "kv_cache_type": "f32", "adapter_cache_dir": cache, **kwargs}
    return LlamaCppProvider(model.gguf_path, n_parallel=n_parallel, **options)


async def with_adapters(provider: LlamaCppProvider, model: Any, *adapter_ids: str) -> LlamaCppProvider:
    for adapter_id in adapter_ids:
        await provider.load_adapter(adapter_id, model.adapter_dirs[adapter_id])
    return provider


def summary(result: GenerationResult) -> tuple[str, str, int]:
    return result.text, result.finish_reason, result.completion_tokens


async def alone(
    model: Any, cache: Path, adapter_id: str | None, requests: list[dict[str, Any]], **options: Any
) -> list[GenerationResult]:
    """Each request on its own, one at a time (the n_parallel=1 path)."""
    async with make_provider(model, cache, 1) as provider:
        if adapter_id is not None:
            await with_adapters(provider, model, adapter_id)
        return [
            await provider.generate(model="m", adapter_id=adapter_id, **{"temperature": 0, **options, **request})
            for request in requests
        ]


async def with_stops_that_hit(model: Any, cache: Path, adapter_id: str | None) -> list[dict[str, Any]]:
    """:data:`REQUESTS`, with requests 1, 4 and 7 stopping at a piece of their own greedy text (these tiny
    models write noise, so a fixed stop string may never come)."""
    plain = [{key: value for key, value in request.items() if key != "stop"} for request in REQUESTS]
    texts = [result.text for result in await alone(model, cache, adapter_id, plain)]
    requests = list(plain)
    for index in (1, 4, 7):
        text = texts[index]
        assert len(text) >= 6, text
        requests[index] = {**plain[index], "stop": [text[3:5], "\u2603never"]}
    return requests


def cells_in_use(provider: LlamaCppProvider) -> list[int]:
    """The last position each sequence holds in the KV cache (-1: none): what a leak would leave behind."""
    memory = llama_cpp.llama_get_memory(provider._llama.ctx)
    return [llama_cpp.llama_memory_seq_pos_max(memory, seq_id) for seq_id in range(provider.n_parallel)]


# Same request, same tokens -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("adapter_id", [None, "a0", "a1"])
async def test_each_request_of_a_batch_of_8_gives_its_output_alone(
    tiny_models: Any, adapter_cache: Path, arch: str, adapter_id: str | None
) -> None:
    model = tiny_models[arch]
    requests = await with_stops_that_hit(model, adapter_cache, adapter_id)
    expected = await alone(model, adapter_cache, adapter_id, requests)
    async with make_provider(model, adapter_cache, 8) as provider:
        if adapter_id is not None:
            await with_adapters(provider, model, adapter_id)
        results = await asyncio.gather(
            *(provider.generate(model="m", adapter_id=adapter_id, temperature=0, **request) for request in requests)
        )
        assert provider._batcher is not None
        steps = provider._batcher.steps
    assert [summary(result) for result in results] == [summary(result) for result in expected]
    assert [result.finish_reason for result in results][1:8:3] == ["stop"] * 3  # the stop strings were met
    # Batched: about one decode step per token of the longest request, not one per token of all of them.
    assert steps <= max(result.completion_tokens for result in results) + 2
    assert sum(result.completion_tokens for result in results) > 2 * steps


async def test_seeded_sampling_gives_the_same_text_in_a_batch_as_alone(tiny_models: Any, adapter_cache: Path) -> None:
    model = tiny_models["qwen2"]
    requests = [
        {**request, "seed": 11 + index, "temperature": 0.9, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}
        for index, request in enumerate(REQUESTS)
    ]
    expected = await alone(model, adapter_cache, "a2", requests)
    async with make_provider(model, adapter_cache, 8) as provider:
        await with_adapters(provider, model, "a2")
        results = await asyncio.gather(
            *(provider.generate(model="m", adapter_id="a2", **request) for request in requests)
        )
    assert [summary(result) for result in results] == [summary(result) for result in expected]
    assert len({result.text for result in results}) > 4  # sampled, and each with its own seed


async def test_logprobs_and_json_schema_in_a_batch_match_alone(tiny_models: Any, adapter_cache: Path) -> None:
    model = tiny_models["llama"]
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    }
    requests: list[dict[str, Any]] = [
        {"prompt": "Once upon a time", "max_tokens": 10, "logprobs": 3},
        {"prompt": "Give JSON", "max_tokens": 24, "json_schema": schema},
        {"prompt": "Hello there", "max_tokens": 6, "logprobs": 0},
        {"prompt": "More JSON please", "max_tokens": 24, "json_schema": schema, "logprobs": 2},
    ]
    expected = await alone(model, adapter_cache, "a0", requests)
    async with make_provider(model, adapter_cache, 4) as provider:
        await with_adapters(provider, model, "a0")
        results = await asyncio.gather(
            *(provider.generate(model="m", adapter_id="a0", temperature=0, **request) for request in requests)
        )
    for result, reference in zip(results, expected, strict=True):
        assert summary(result) == summary(reference)
        if reference.logprobs is None:
            assert result.logprobs is None
            continue
        assert result.logprobs is not None and len(result.logprobs) == len(reference.logprobs)
        for got, want in zip(result.logprobs, reference.logprobs, strict=True):
            assert (got.token, got.token_id) == (want.token, want.token_id)
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
            assert [token for token, _ in got.top_logprobs] == [token for token, _ in want.top_logprobs]
    for index in (1, 3):
        assert isinstance(json.loads(results[index].text)["n"], int)


async def test_streams_in_a_batch_each_get_their_own_pieces(tiny_models: Any, adapter_cache: Path) -> None:
    model = tiny_models["qwen2"]
    expected = await alone(model, adapter_cache, "a1", REQUESTS)
    async with make_provider(model, adapter_cache, 8) as provider:
        await with_adapters(provider, model, "a1")

        async def streamed(request: dict[str, Any]) -> tuple[str, GenerationResult]:
            pieces: list[str] = []
            final: GenerationResult | None = None
            async for event in provider.stream(model="m", adapter_id="a1", temperature=0, **request):
                if isinstance(event, str):
                    pieces.append(event)
                else:
                    final = event
            assert final is not None
            return "".join(pieces), final

        outcomes = await asyncio.gather(*(streamed(request) for request in REQUESTS))
    for (joined, final), reference in zip(outcomes, expected, strict=True):
        assert joined == final.text == reference.text


async def test_requests_join_a_running_batch_and_leave_it_on_their_own(tiny_models: Any, adapter_cache: Path) -> None:
    """A short request started while a long one runs joins it and answers long before the long one ends."""
    model = tiny_models["llama"]
    async with make_provider(model, adapter_cache, 4, n_ctx=2048) as provider:
        await provider.generate("warm", model="m", max_tokens=2, temperature=0)
        long_request = asyncio.create_task(
            provider.generate("Once upon a time", model="m", max_tokens=600, temperature=0)
        )
        while provider._batcher is not None and provider._batcher.running == 0:
            await asyncio.sleep(0.005)
        short = await provider.generate("Hello", model="m", max_tokens=4, temperature=0)
        assert not long_request.done()  # answered while the long one still runs
        long_result = await long_request
    assert short.completion_tokens == 4
    assert long_result.completion_tokens == 600
    reference = await alone(model, adapter_cache, None, [{"prompt": "Hello", "max_tokens": 4}])
    assert short.text == reference[0].text


# Cancellation and cleanup ----------------------------------------------------------------------------------


async def test_a_request_cancelled_mid_batch_frees_its_cells_and_the_others_finish(
    tiny_models: Any, adapter_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["qwen2"]
    requests = [{"prompt": f"Story number {index}:", "max_tokens": 200} for index in range(6)]
    expected = await alone(model, adapter_cache, "a0", requests)
    async with make_provider(model, adapter_cache, 6, n_ctx=2048) as provider:
        await with_adapters(provider, model, "a0")
        assert provider._batcher is not None
        batcher, loop, real = provider._batcher, asyncio.get_running_loop(), llama_cpp.llama_decode
        gone = threading.Event()

        def decode(ctx: Any, batch: Any) -> int:  # at the 20th step the callers of 1 and 4 give up, and are gone
            if batcher.steps == 20 and not gone.is_set():
                loop.call_soon_threadsafe(lambda: [tasks[index].cancel() for index in (1, 4)])
                assert gone.wait(120)
            return int(real(ctx, batch))

        monkeypatch.setattr(llama_cpp, "llama_decode", decode)
        tasks = [
            asyncio.create_task(provider.generate(model="m", adapter_id="a0", temperature=0, **request))
            for request in requests
        ]
        cancelled = [tasks[1], tasks[4]]
        for task in cancelled:
            task.add_done_callback(lambda _: all(task.done() for task in cancelled) and gone.set())
        stream = provider.stream("Another story:", model="m", adapter_id="a0", temperature=0, max_tokens=300)
        async for _ in stream:  # joins, then its consumer walks away
            break
        await stream.aclose()  # type: ignore[attr-defined]
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert [isinstance(outcome, asyncio.CancelledError) for outcome in outcomes] == [
            False,
            True,
            False,
            False,
            True,
            False,
        ]
        for index in (0, 2, 3, 5):
            assert summary(outcomes[index]) == summary(expected[index])  # type: ignore[arg-type]
        assert provider._batcher.running == 0
        assert cells_in_use(provider) == [-1] * 6
        assert provider._adapter_registry.in_flight("a0") == 0


async def test_500_requests_with_cancellations_and_adapter_switches_leave_nothing_behind(
    tiny_models: Any, adapter_cache: Path
) -> None:
    model = tiny_models["llama"]
    prompts = ["Once upon a time", "Hello", "The quick brown fox", "1 2 3 4"]
    adapters: list[str | None] = [None, "a0", "a1", "a2"]
    keys = [(adapter, prompt, limit) for adapter in adapters for prompt in prompts for limit in (3, 7)]
    references: dict[tuple[str | None, str, int], str] = {}
    async with make_provider(model, adapter_cache, 1) as single:
        await with_adapters(single, model, "a0", "a1", "a2")
        for adapter, prompt, limit in keys:
            result = await single.generate(prompt, model="m", adapter_id=adapter, max_tokens=limit, temperature=0)
            references[(adapter, prompt, limit)] = result.text

    chooser = random.Random(14)
    async with make_provider(model, adapter_cache, 4) as provider:
        await with_adapters(provider, model, "a0", "a1", "a2")
        await provider.generate("warm", model="m", max_tokens=1, temperature=0)
        threads_before = threading.active_count()

        async def one(index: int) -> str:
            adapter, prompt, limit = chooser.choice(keys)
            if index % 5 == 0:  # given up on after a random moment: before, while or after it runs
                call = provider.generate(prompt, model="m", adapter_id=adapter, max_tokens=limit, temperature=0)
                try:
                    await asyncio.wait_for(call, timeout=chooser.random() * 0.02)
                except TimeoutError:
                    return "cancelled"
                return "finished in time"
            if index % 7 == 0:  # a stream whose consumer stops after its first piece
                async for _ in provider.stream(prompt, model="m", adapter_id=adapter, max_tokens=limit, temperature=0):
                    break
                return "stream closed"
            result = await provider.generate(prompt, model="m", adapter_id=adapter, max_tokens=limit, temperature=0)
            assert result.text == references[(adapter, prompt, limit)], (adapter, prompt, limit)
            return "checked"

        outcomes = await asyncio.gather(*(one(index) for index in range(500)))
        assert outcomes.count("checked") > 300
        assert provider._batcher is not None and provider._batcher.running == 0
        assert cells_in_use(provider) == [-1] * 4
        assert all(provider._adapter_registry.in_flight(adapter) == 0 for adapter in ("a0", "a1", "a2"))
        assert threading.active_count() == threads_before
        # Still serving, with the right answers.
        after = await provider.generate("Hello", model="m", adapter_id="a1", max_tokens=7, temperature=0)
        assert after.text == references[("a1", "Hello", 7)]


# Scheduling ------------------------------------------------------------------------------------------------


async def test_a_stream_of_requests_for_one_adapter_does_not_starve_another(
    tiny_models: Any, adapter_cache: Path
) -> None:
    model = tiny_models["qwen2"]
    async with make_provider(model, adapter_cache, 4) as provider:
        await with_adapters(provider, model, "a0", "a1")
        finished: list[str] = []

        async def request(label: str, adapter_id: str, max_tokens: int) -> None:
            await provider.generate(
                "Once upon a time", model="m", adapter_id=adapter_id, max_tokens=max_tokens, temperature=0
            )
            finished.append(label)

        first = [asyncio.create_task(request(f"a0-first-{index}", "a0", 40)) for index in range(4)]
        assert provider._batcher is not None
        while provider._batcher.running == 0:
            await asyncio.sleep(0.002)
        other = asyncio.create_task(request("a1", "a1", 5))
        later = []
        for index in range(12):  # a0 keeps coming while a1 waits
            later.append(asyncio.create_task(request(f"a0-later-{index}", "a0", 40)))
            await asyncio.sleep(0.005)
        await asyncio.gather(*first, other, *later)
    assert finished.index("a1") < min(finished.index(f"a0-later-{index}") for index in range(12))


async def test_requests_wait_for_room_in_a_small_context_and_all_come_out_right(
    tiny_models: Any, adapter_cache: Path
) -> None:
    """Four requests that each need most of the context run in turn; none fails for lack of KV cells."""
    model = tiny_models["qwen2"]
    requests = [{"prompt": f"Request {index} says", "max_tokens": 90} for index in range(4)]
    async with make_provider(model, adapter_cache, 1, n_ctx=128) as single:
        expected = [await single.generate(model="m", temperature=0, **request) for request in requests]
    async with make_provider(model, adapter_cache, 4, n_ctx=128) as provider:
        results = await asyncio.gather(
            *(provider.generate(model="m", temperature=0, **request) for request in requests)
        )
        whole = await provider.generate("Alone", model="m", temperature=0, max_tokens=500)
    assert [summary(result) for result in results] == [summary(result) for result in expected]
    assert whole.finish_reason == "length" and whole.prompt_tokens + whole.completion_tokens == 128  # the whole context


async def test_bad_requests_in_a_batch_fail_alone(tiny_models: Any, adapter_cache: Path) -> None:
    model = tiny_models["qwen2"]
    expected = await alone(model, adapter_cache, None, REQUESTS[:3])
    async with make_provider(model, adapter_cache, 4, n_ctx=256) as provider:
        outcomes = await asyncio.gather(
            provider.generate(model="m", temperature=0, **REQUESTS[0]),
            provider.generate("word " * 400, model="m", temperature=0, max_tokens=4),  # longer than the context
            provider.generate(model="m", temperature=0, **REQUESTS[1]),
            provider.generate(model="m", temperature=0, **REQUESTS[2]),
            return_exceptions=True,
        )
    assert isinstance(outcomes[1], InvalidRequestError) and "does not fit the context of 256" in str(outcomes[1])
    assert [summary(outcome) for outcome in (outcomes[0], outcomes[2], outcomes[3])] == [  # type: ignore[arg-type]
        summary(result) for result in expected
    ]


async def test_a_failing_decode_fails_its_requests_typed_and_the_provider_goes_on(
    tiny_models: Any, adapter_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama_decode returning an error code (e.g. 1, no KV slot) fails the step's requests with a ProviderError."""
    model = tiny_models["qwen2"]
    expected = await alone(model, adapter_cache, None, REQUESTS[:2])
    async with make_provider(model, adapter_cache, 4) as provider:
        await provider.generate("warm", model="m", max_tokens=1, temperature=0)
        real = llama_cpp.llama_decode
        failures = iter([1])
        monkeypatch.setattr(llama_cpp, "llama_decode", lambda ctx, batch: next(failures, None) or real(ctx, batch))
        outcomes = await asyncio.gather(
            *(provider.generate(model="m", temperature=0, **request) for request in REQUESTS[:2]),
            return_exceptions=True,
        )
        assert all(isinstance(outcome, ProviderError) for outcome in outcomes), outcomes
        assert "llama_decode returned 1" in str(outcomes[0])
        assert cells_in_use(provider) == [-1] * 4
        results = await asyncio.gather(
            *(provider.generate(model="m", temperature=0, **request) for request in REQUESTS[:2])
        )
    assert [summary(result) for result in results] == [summary(result) for result in expected]


async def test_loading_an_adapter_while_a_batch_runs_waits_only_for_the_running_sequences(
    tiny_models: Any, adapter_cache: Path
) -> None:
    model = tiny_models["llama"]
    async with make_provider(model, adapter_cache, 4, n_ctx=2048) as provider:
        await provider.generate("warm", model="m", max_tokens=1, temperature=0)
        running = [
            asyncio.create_task(provider.generate("Once upon a time", model="m", max_tokens=300, temperature=0))
            for _ in range(2)
        ]
        assert provider._batcher is not None
        while provider._batcher.running == 0:
            await asyncio.sleep(0.005)
        load = asyncio.create_task(provider.load_adapter("a2", model.adapter_dirs["a2"]))
        queued_after = [
            asyncio.create_task(provider.generate("Hello", model="m", max_tokens=300, temperature=0)) for _ in range(3)
        ]
        await load  # the running pair finish, the load runs, then the loop goes on
        assert all(task.done() for task in running)
        assert not all(task.done() for task in queued_after)  # they did not join before the load
        results = await asyncio.gather(*queued_after)
        assert len({result.text for result in results}) == 1
        with_adapter = await provider.generate("Hello", model="m", adapter_id="a2", max_tokens=8, temperature=0)
    reference = await alone(model, adapter_cache, "a2", [{"prompt": "Hello", "max_tokens": 8}])
    assert with_adapter.text == reference[0].text


async def test_the_event_loop_runs_while_a_batch_decodes(
    tiny_models: Any, adapter_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Model work never runs on the event loop's thread: inside each of the first 30 llama_decode calls of a batch
    of 8, the worker waits until the event loop has run a callback. A decode on the loop's thread would wait for
    ever (the wait gives up after a minute and the requests fail). No clock is read: a lag threshold failed on a
    busy machine, where any thread may wait tens of milliseconds for a CPU."""
    model = tiny_models["qwen2"]
    async with make_provider(model, adapter_cache, 8, n_ctx=2048) as provider:
        await provider.generate("warm", model="m", max_tokens=1, temperature=0)
        expected = [await provider.generate(f"Prompt {index}", model="m", max_tokens=40, temperature=0)
                    for index in range(8)]
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        turns: list[tuple[int, int]] = []  # (the thread that decoded, the thread that ran the callback meanwhile)
        real = llama_cpp.llama_decode

        def decode(ctx: Any, batch: Any) -> int:
            if len(turns) < 30:
                ran, decoder = threading.Event(), threading.get_ident()
                loop.call_soon_threadsafe(lambda: (turns.append((decoder, threading.get_ident())), ran.set()))
                assert ran.wait(60), "the event loop did not run while llama.cpp decoded"
            return int(real(ctx, batch))

        monkeypatch.setattr(llama_cpp, "llama_decode", decode)
        results = await asyncio.gather(
            *(provider.generate(f"Prompt {index}", model="m", max_tokens=40, temperature=0) for index in range(8))
        )
    assert len(turns) == 30
    assert all(decoder != loop_thread and ran_on == loop_thread for decoder, ran_on in turns)
    assert [summary(result) for result in results] == [summary(result) for result in expected]


async def test_reload_mode_batches_too(tiny_models: Any, adapter_cache: Path) -> None:
    """Without the hot-swap API (hot_swap=False) the model is rebuilt per adapter; batches still come out right."""
    model = tiny_models["qwen2"]
    expected = {adapter: await alone(model, adapter_cache, adapter, REQUESTS[:4]) for adapter in (None, "a0")}
    async with make_provider(model, adapter_cache, 4, hot_swap=False) as provider:
        await with_adapters(provider, model, "a0")
        for adapter in ("a0", None, "a0"):
            results = await asyncio.gather(
                *(
                    provider.generate(model="m", adapter_id=adapter, temperature=0, **request)
                    for request in REQUESTS[:4]
                )
            )
            assert [summary(result) for result in results] == [summary(result) for result in expected[adapter]]
