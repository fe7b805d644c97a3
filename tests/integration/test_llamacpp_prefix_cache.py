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
