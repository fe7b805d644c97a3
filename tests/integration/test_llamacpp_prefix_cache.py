"""The llama.cpp prefix cache of ``next_token_logprobs`` (``prefix_cache_tokens``), on the real tiny models: rows with
the cache equal rows computed whole, an extension by one token costs one token, and a replaced or unloaded adapter
never answers from its old weights' entries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.llamacpp_provider import LlamaCppProvider

pytestmark = pytest.mark.integration

pytest.importorskip("llama_cpp")

TEXT = "Hello, world! The quick brown fox jumps over the lazy dog. café 42"
TOLERANCE = 1e-4  # nats per entry


def gap(a: Any, b: Any) -> float:
    return float(np.abs(a - b).max())


@pytest.mark.parametrize(("arch", "n_parallel"), [("qwen2", 4), ("llama", 4), ("qwen2", 1)])
async def test_the_llamacpp_prefix_cache_gives_the_rows_computed_whole_and_never_stale_weights(
    tiny_models: dict[str, Any], tmp_path: Path, arch: str, n_parallel: int
) -> None:
    model = tiny_models[arch]
    options: dict[str, Any] = {
        "n_ctx": 256, "kv_cache_type": "f32", "adapter_cache_dir": tmp_path, "n_parallel": n_parallel,
    }
    cached = LlamaCppProvider(model.gguf_path, prefix_cache_tokens=96, **options)
    whole = LlamaCppProvider(model.gguf_path, **options)
    async with cached, whole:
        for provider in (cached, whole):
            await provider.load_adapter("a", model.adapter_dirs["a0"])
        ids = await whole.tokenize(TEXT, "m")
        sequences = [ids[:end] for end in range(4, len(ids) + 1)]  # each extends the one before by a token
        for adapter in (None, "a", [("a", 0.5)]):
            for sequence in sequences:
                ours = await cached.next_token_logprobs(sequence, "m", adapter)
                assert gap(ours, await whole.next_token_logprobs(sequence, "m", adapter)) < TOLERANCE
        stats = cached.cache_stats()
        assert stats.enabled and stats.hits >= 3 * (len(sequences) - 1)
        assert stats.cached_tokens <= 96 and stats.evictions > 0  # the capacity holds
        assert not whole.cache_stats().enabled and whole.cache_stats().hits == 0

        # One more token costs one token, also after a generation and a score used the context.
        await cached.next_token_logprobs(ids, "m", "a")
        await cached.generate("Once upon a time", model="m", adapter_id="a", temperature=0, max_tokens=8)
        await cached.score("Once upon", " a time", model="m", adapter_id="a")
        before = cached.cache_stats()
        extended = [*ids, ids[0]]
        row = await cached.next_token_logprobs(extended, "m", "a")
        after = cached.cache_stats()
        assert (after.hits - before.hits, after.computed_tokens - before.computed_tokens) == (1, 1)
        assert gap(row, await whole.next_token_logprobs(extended, "m", "a")) < TOLERANCE
        batch = await cached.batch_next_token_logprobs([ids, extended, ids[:-1]], "m", "a")
        for got, sequence in zip(batch, [ids, extended, ids[:-1]], strict=True):
            assert gap(got, await whole.next_token_logprobs(sequence, "m", "a")) < TOLERANCE

        old = await cached.next_token_logprobs(ids, "m", "a")
        for provider in (cached, whole):
            await provider.load_adapter("a", model.adapter_dirs["a1"], replace=True)
        new = await cached.next_token_logprobs(ids, "m", "a")
        assert gap(new, old) > 1e-3  # the new weights, not a cached row of the old ones
        assert gap(new, await whole.next_token_logprobs(ids, "m", "a")) < TOLERANCE
        await cached.unload_adapter("a")
        names = {name for adapters, _ in cached._prefix_cache._entries for name, _ in adapters}
        assert names == set()  # only the base model's entries are left: the adapter's went with it
        cached.clear_cache()
        assert cached.cache_stats().cached_tokens == 0
        misses = cached.cache_stats().misses
        assert gap(await cached.next_token_logprobs(ids, "m"), await whole.next_token_logprobs(ids, "m")) < TOLERANCE
        assert cached.cache_stats().misses == misses + 1


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
async def test_a_batch_of_particles_is_decoded_together_and_gives_the_rows_computed_alone(
    tiny_models: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str
) -> None:
    import llama_cpp

    model = tiny_models[arch]
    options: dict[str, Any] = {"n_ctx": 256, "kv_cache_type": "f32", "adapter_cache_dir": tmp_path}
    together = LlamaCppProvider(model.gguf_path, n_parallel=4, prefix_cache_tokens=512, **options)
    alone = LlamaCppProvider(model.gguf_path, n_parallel=1, **options)
    async with together, alone:
        for provider in (together, alone):
            await provider.load_adapter("a", model.adapter_dirs["a0"])
        ids = await alone.tokenize(TEXT, "m")
        prompt = ids[:8]
        particles = [[*prompt, token] for token in ids[8:14]]  # six particles, each the prompt and one token
        calls = [
            [prompt, prompt, prompt[:-1]],  # the first step: a repeat and a prefix
            [*particles, particles[0]],  # the next: each one new token (and a repeat)
            [[*particle, ids[0]] for particle in particles],  # and again
        ]
        decodes: list[int] = []
        real = llama_cpp.llama_decode
        monkeypatch.setattr(
            llama_cpp, "llama_decode", lambda ctx, batch: decodes.append(batch.n_tokens) or real(ctx, batch)
        )
        for adapter in (None, "a"):
            for sequences in calls:
                decodes.clear()
                rows = await together.batch_next_token_logprobs(sequences, "m", adapter)
                for row, sequence in zip(rows, sequences, strict=True):
                    assert gap(row, await alone.next_token_logprobs(sequence, "m", adapter)) < TOLERANCE
                if sequences is calls[1] or sequences is calls[2]:  # six distinct sequences, four per decode
                    assert decodes == [4, 2], decodes
        stats = together.cache_stats()
        # per adapter: the prompt once and its prefix (decoded beside it: neither was cached yet), then a token each
        assert stats.computed_tokens == 2 * (len(prompt) + len(prompt) - 1 + 6 + 6)
