"""llama.cpp scores in the decode loop (``n_parallel > 1``): concurrent scores are sequences of one ``llama_decode``.

The reference for every score is the same score on a provider with ``n_parallel=1``, which evaluates each sequence
alone (tests/integration/test_llamacpp_scores.py checks those against plain transformers + PEFT).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from inference.exceptions import InvalidRequestError
from inference.llamacpp_provider import LlamaCppProvider
from inference.results import ScoreResult

pytestmark = pytest.mark.integration

llama_cpp = pytest.importorskip("llama_cpp")

PAIRS = [
    ("the quick brown fox", " jumps over the dog"),
    ("", "Hello, world!"),
    ("Once upon a time ", "there was a dragon"),
    ("Q: 2+2 =", " 4"),
    ("a b c d e f g h i j k l m n o p", " q r s"),
    ("In the beginning", " was the word, and the word was long"),
    ("x", "y"),
    ("Tell me a story about a knight who met a dragon at a bridge. ", "The knight drew his sword."),
]
LONG_TEXT = "the quick brown fox jumps over the lazy dog, and then the fox sleeps. " * 10


@pytest.fixture(scope="module")
def adapter_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batched-scores-adapter-cache")


async def make_provider(model: Any, cache: Path, n_parallel: int, **options: Any) -> LlamaCppProvider:
    settings: dict[str, Any] = {"n_ctx": 512, "kv_cache_type": "f32", "adapter_cache_dir": cache, **options}
    provider = LlamaCppProvider(model.gguf_path, n_parallel=n_parallel, **settings)
    for adapter_id in ("a0", "a1"):
        await provider.load_adapter(adapter_id, model.adapter_dirs[adapter_id])
    return provider


def same(result: ScoreResult, reference: ScoreResult) -> None:
    assert result.logprob == pytest.approx(reference.logprob, abs=1e-4)
    assert (result.num_tokens, result.is_greedy, result.adapter_id) == (
        reference.num_tokens,
        reference.is_greedy,
        reference.adapter_id,
    )


def cells_in_use(provider: LlamaCppProvider) -> list[int]:
    """The last position each sequence holds in the KV cache (-1: none): what a leak would leave behind."""
    memory = llama_cpp.llama_get_memory(provider._llama.ctx)
    return [llama_cpp.llama_memory_seq_pos_max(memory, seq_id) for seq_id in range(provider.n_parallel)]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
async def test_concurrent_scores_equal_the_same_scores_one_at_a_time(
    tiny_models: Any, adapter_cache: Path, arch: str
) -> None:
    model = tiny_models[arch]
    calls = [(pair, adapter_id) for adapter_id in (None, "a0", "a1") for pair in PAIRS]
    async with await make_provider(model, adapter_cache, 1, n_ctx=128) as alone:
        expected = [await alone.score(*pair, model="m", adapter_id=adapter_id) for pair, adapter_id in calls]
        expected_rolling = await alone.score_rolling(LONG_TEXT, model="m", adapter_id="a1")
    async with await make_provider(model, adapter_cache, 8, n_ctx=128) as provider:
        assert provider._batcher is not None
        results = await asyncio.gather(
            *(provider.score(*pair, model="m", adapter_id=adapter_id) for pair, adapter_id in calls),
            provider.score_rolling(LONG_TEXT, model="m", adapter_id="a1"),  # windows of 128: one after another
        )
        for result, reference in zip(results, [*expected, expected_rolling], strict=True):
            same(result, reference)
        assert 0 < provider._batcher.steps < len(calls)  # the scores ran in the loop, several per llama_decode
        batched = await provider.score_batch(PAIRS, model="m", adapter_id="a0")
        for result, reference in zip(batched, expected[len(PAIRS) : 2 * len(PAIRS)], strict=True):
            assert isinstance(result, ScoreResult)
            same(result, reference)
        assert provider._batcher.running == 0
        assert cells_in_use(provider) == [-1] * 8


async def test_a_bad_score_in_a_batch_fails_alone_and_the_provider_keeps_serving(
    tiny_models: Any, adapter_cache: Path
) -> None:
    model = tiny_models["qwen2"]
    pairs = [PAIRS[0], ("", LONG_TEXT * 3), PAIRS[2], ("context", ""), PAIRS[3]]  # too long; empty continuation
    async with await make_provider(model, adapter_cache, 1) as alone:
        expected = [await alone.score(*pairs[index], model="m", adapter_id="a0") for index in (0, 2, 4)]
    async with await make_provider(model, adapter_cache, 4) as provider:
        results = await provider.score_batch(pairs, model="m", adapter_id="a0")
        assert isinstance(results[1], InvalidRequestError)
        assert "n_ctx" in str(results[1])
        assert isinstance(results[3], InvalidRequestError)
        for index, reference in zip((0, 2, 4), expected, strict=True):
            result = results[index]
            assert isinstance(result, ScoreResult)
            same(result, reference)
        same(await provider.score(*pairs[0], model="m", adapter_id="a0"), expected[0])


async def test_a_cancelled_score_frees_its_sequence_and_the_others_finish(
    tiny_models: Any, adapter_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["llama"]
    long_pair = ("", LONG_TEXT[:300])
    async with await make_provider(model, adapter_cache, 1) as alone:
        expected = await alone.score(*long_pair, model="m", adapter_id="a0")
    async with await make_provider(model, adapter_cache, 4, n_batch=16) as provider:
        assert provider._batcher is not None
        batcher, loop, real = provider._batcher, asyncio.get_running_loop(), llama_cpp.llama_decode
        gone = threading.Event()

        def decode(ctx: Any, batch: Any) -> int:  # at the 3rd step the first caller gives up, and is gone
            if batcher.steps == 3 and not gone.is_set():
                loop.call_soon_threadsafe(cancelled.cancel)
                assert gone.wait(120)
            return int(real(ctx, batch))

        monkeypatch.setattr(llama_cpp, "llama_decode", decode)
        cancelled = asyncio.create_task(provider.score(*long_pair, model="m", adapter_id="a0"))
        cancelled.add_done_callback(lambda _: gone.set())
        other = asyncio.create_task(provider.score(*long_pair, model="m", adapter_id="a0"))
        outcomes = await asyncio.gather(cancelled, other, return_exceptions=True)
        assert isinstance(outcomes[0], asyncio.CancelledError)
        assert isinstance(outcomes[1], ScoreResult)
        same(outcomes[1], expected)
        await provider._worker.run(lambda: None)  # the decode loop has returned
        assert batcher.running == 0
        assert cells_in_use(provider) == [-1] * 4
        assert provider._adapter_registry.in_flight("a0") == 0
        same(await provider.score(*long_pair, model="m", adapter_id="a0"), expected)


ITEMS = [  # multiple-choice items: one context, four continuations
    ("Question: which animal says moo? Answer:", [" a cow", " a dog", " the cat in the hat", " x"]),
    ("The weather today is", [" sunny", " cold and wet, with rain all day", " nice", " unknown"]),
]


async def queued_together(provider: LlamaCppProvider, calls: list[Any]) -> list[Any]:
    """Run score calls that all join the decode loop at its first admission (the worker is held until every one
    waits), so which scores follow which is the same in every run."""
    assert provider._batcher is not None
    batcher, gate = provider._batcher, threading.Event()
    held = asyncio.ensure_future(provider._worker.run(gate.wait))
    tasks = [asyncio.ensure_future(call) for call in calls]
    for _ in range(1000):
        if len(batcher._waiting) == len(calls):
            break
        await asyncio.sleep(0.005)
    gate.set()
    await held
    return list(await asyncio.gather(*tasks, return_exceptions=True))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
async def test_choices_of_one_context_read_it_once_and_score_as_alone(
    tiny_models: Any, adapter_cache: Path, arch: str
) -> None:
    model = tiny_models[arch]
    pairs = [(context, continuation) for context, continuations in ITEMS for continuation in continuations]
    async with await make_provider(model, adapter_cache, 1) as alone:
        expected = [await alone.score(*pair, model="m", adapter_id="a0") for pair in pairs]
    async with await make_provider(model, adapter_cache, 8) as provider:
        assert provider._batcher is not None
        batcher = provider._batcher
        fed: list[int] = []  # each score's prompt alone: what it costs without sharing
        for pair, reference in zip(pairs, expected, strict=True):
            before = batcher.prompt_tokens
            same(await provider.score(*pair, model="m", adapter_id="a0"), reference)
            fed.append(batcher.prompt_tokens - before)
        before = batcher.prompt_tokens
        results = await queued_together(provider, [provider.score(*pair, model="m", adapter_id="a0") for pair in pairs])
        for result, reference in zip(results, expected, strict=True):
            same(result, reference)
        # each item's context (but its last token, which every choice feeds for its own first logits) is fed once
        shared = [fed[index] + 1 - reference.num_tokens - 1 for index, reference in enumerate(expected)]
        saved = sum(shared[index] for index in range(len(pairs)) if index % 4 != 0)
        assert min(shared) >= 1
        assert batcher.prompt_tokens - before == sum(fed) - saved
        assert batcher.running == 0
        assert cells_in_use(provider) == [-1] * 8


async def test_a_follower_whose_leader_is_cancelled_reads_the_context_itself(
    tiny_models: Any, adapter_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["llama"]
    context = LONG_TEXT[:300]
    pairs = [(context, " the end"), (context, " and so on")]
    async with await make_provider(model, adapter_cache, 1) as alone:
        expected = await alone.score(*pairs[1], model="m", adapter_id="a0")
    async with await make_provider(model, adapter_cache, 4, n_batch=16) as provider:
        assert provider._batcher is not None
        batcher, loop, real = provider._batcher, asyncio.get_running_loop(), llama_cpp.llama_decode
        gone = threading.Event()

        def decode(ctx: Any, batch: Any) -> int:  # at the 3rd step, mid-context, the leader's caller gives up
            if batcher.steps == 3 and not gone.is_set():
                loop.call_soon_threadsafe(leader.cancel)
                assert gone.wait(120)
            return int(real(ctx, batch))

        copies: list[Any] = []
        real_copy = llama_cpp.llama_memory_seq_cp
        monkeypatch.setattr(llama_cpp, "llama_decode", decode)
        monkeypatch.setattr(llama_cpp, "llama_memory_seq_cp", lambda *args: copies.append(args) or real_copy(*args))
        leader = asyncio.ensure_future(provider.score(*pairs[0], model="m", adapter_id="a0"))
        leader.add_done_callback(lambda _: gone.set())
        outcomes = await queued_together(provider, [leader, provider.score(*pairs[1], model="m", adapter_id="a0")])
        assert isinstance(outcomes[0], asyncio.CancelledError)
        same(outcomes[1], expected)
        assert copies == []  # the leader left mid-context: the follower read all of it itself
        await provider._worker.run(lambda: None)
        assert batcher.running == 0
        assert cells_in_use(provider) == [-1] * 4
