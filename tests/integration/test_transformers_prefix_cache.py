"""Transformers: the prefix cache of ``next_token_logprobs`` runs the sequences of one backend call together.

A user of an SMC-like loop (particles that each extend their prefix by a token, resampled now and then) must see
the rows of the cache off and only the speed differ: one forward pass per step, over one new token per particle,
with the base model, stacked adapters, a PEFT-served adapter and weighted combinations in the same pass; rows that
never come from an adapter's old weights after a replacement or an unload; and right rows when a small budget
evicts all the time. On both tiny architectures, against the same provider with the cache off.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.transformers_provider import TransformersProvider

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

TEXT = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman who went out every morning "
    "before the sun rose. He knew every rock of the coast and every current of the bay."
)
CHOICES: list[Any] = [None, "a0", "a1", "emb", [("a0", 0.5), ("a1", -1.0)], [("a1", 1.0), ("emb", 0.5)]]
BASE_TOLERANCE = 1e-5  # the base model's rows: 4e-6 measured
TOLERANCE = 1e-4  # rows with the tiny models' strong adapters: up to 6e-5 measured, as far as either is from float64


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def arch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def embedding_adapter(arch: str, tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter the stacks cannot hold (LoRA on the token embeddings too): PEFT serves it."""
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_models[arch].hf_dir))
    torch.manual_seed(7)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "embed_tokens"], init_lora_weights=False)
    path = tmp_path_factory.mktemp(f"embedding-{arch}") / "embedding"
    peft.get_peft_model(base, config).save_pretrained(str(path), save_embedding_layers=False)
    return path


@contextlib.asynccontextmanager
async def _pair(
    model: Any, embedding_adapter: Path, capacity: int = 16384
) -> AsyncIterator[tuple[TransformersProvider, TransformersProvider]]:
    """The same model with the cache on (``prefix_cache_tokens=capacity``) and off, adapters a0, a1 (stacked) and
    emb (PEFT) loaded in both."""
    cached = TransformersProvider(model_name=str(model.hf_dir), prefix_cache_tokens=capacity)
    whole = TransformersProvider(model_name=str(model.hf_dir), prefix_cache_tokens=0)
    async with cached, whole:
        for provider in (cached, whole):
            await provider.load_adapter("a0", model.adapter_dirs["a0"])
            await provider.load_adapter("a1", model.adapter_dirs["a1"])
            await provider.load_adapter("emb", embedding_adapter)
        yield cached, whole


@pytest.fixture
async def pair(
    arch: str, tiny_models: dict[str, Any], embedding_adapter: Path
) -> AsyncIterator[tuple[TransformersProvider, TransformersProvider]]:
    async with _pair(tiny_models[arch], embedding_adapter) as providers:
        yield providers


async def _step(provider: TransformersProvider, prefixes: Sequence[Sequence[int]], choices: Sequence[Any]) -> Any:
    """One SMC step: every particle asks for its distribution at once (each call on its own, gathered)."""
    return await asyncio.gather(
        *(provider.next_token_logprobs(list(prefix), "m", choice) for prefix, choice in zip(prefixes, choices,
                                                                                             strict=True))
    )


def _largest_differences(ours: Sequence[Any], theirs: Sequence[Any], choices: Sequence[Any]) -> tuple[float, float]:
    """The largest entry difference of the base model's rows, and of the adapters' rows."""
    base = adapted = 0.0
    for row, other, choice in zip(ours, theirs, choices, strict=True):
        difference = float(np.abs(row - other).max())
        if choice is None:
            base = max(base, difference)
        else:
            adapted = max(adapted, difference)
    return base, adapted


async def test_smc_steps_give_the_rows_of_the_cache_off_one_pass_and_one_token_per_particle(
    pair: tuple[TransformersProvider, TransformersProvider],
) -> None:
    cached, whole = pair
    stream = await whole.tokenize(TEXT, "m")
    choices = CHOICES * 2  # 12 particles, two per adapter choice
    prefixes = [list(stream[:24]) for _ in choices]
    worst = (0.0, 0.0)
    for step in range(10):
        if step == 4:  # resampled: each particle takes its twin's prefix (same choice), so two ask the same ids
            prefixes = [list(prefixes[index % len(CHOICES)]) for index in range(len(choices))]
        if step == 7:  # particles move by several tokens, and a new one starts: rows of 1 to 30 new tokens
            prefixes[0].extend(stream[40:43])
            prefixes[5] = list(stream[10:40])
        before, passes = cached.cache_stats(), len(cached.recent_batch_sizes)
        ours = await _step(cached, prefixes, choices)
        after = cached.cache_stats()
        distinct = len({(str(choice), tuple(prefix)) for prefix, choice in zip(prefixes, choices, strict=True)})
        if step not in (0, 4, 7):  # every particle extends its cached prefix by one token
            assert after.computed_tokens - before.computed_tokens == distinct == len(choices)
            assert after.hits - before.hits == len(choices)
            assert list(cached.recent_batch_sizes)[passes:] == [len(choices)]  # one forward pass for the step
        if step == 4:  # twins ask the same sequence: each computed once, in one pass
            assert distinct == len(CHOICES)
            assert after.computed_tokens - before.computed_tokens == distinct
            assert list(cached.recent_batch_sizes)[passes:] == [distinct]
        theirs = await _step(whole, prefixes, choices)
        base, adapted = _largest_differences(ours, theirs, choices)
        worst = (max(worst[0], base), max(worst[1], adapted))
        for index, prefix in enumerate(prefixes):
            prefix.append(stream[(index * 7 + step * 5) % len(stream)])
    assert worst[0] < BASE_TOLERANCE
    assert worst[1] < TOLERANCE


async def test_a_replaced_or_unloaded_adapter_never_answers_with_its_old_weights(
    pair: tuple[TransformersProvider, TransformersProvider], tiny_models: dict[str, Any], arch: str
) -> None:
    cached, whole = pair
    model = tiny_models[arch]
    ids = await whole.tokenize(TEXT, "m")
    prefixes = [ids[:20], ids[:25], ids[:30]]
    choices: list[Any] = ["a0", [("a0", 0.5), ("a1", -1.0)], None]
    old = await _step(cached, prefixes, choices)
    extended = [[*prefix, ids[40]] for prefix in prefixes]

    async def agree() -> list[Any]:
        ours = await _step(cached, extended, choices)
        theirs = await _step(whole, extended, choices)
        assert max(_largest_differences(ours, theirs, choices)) < TOLERANCE
        return list(ours)

    for provider in (cached, whole):
        await provider.load_adapter("a0", model.adapter_dirs["a2"], replace=True)
    new = await agree()
    assert float(np.abs(new[0] - old[0]).max()) > 1e-3  # a0 answers with its new weights
    await agree()  # and again, from the prefixes cached with the new weights

    await _step(cached, prefixes, choices)  # cached with a2's weights under a0
    for provider in (cached, whole):
        await provider.unload_adapter("a0")
        await provider.load_adapter("a0", model.adapter_dirs["a1"])  # the same id, other weights, no replace
    await agree()


async def test_under_a_small_budget_evictions_still_give_the_right_rows(
    arch: str, tiny_models: dict[str, Any], embedding_adapter: Path
) -> None:
    async with _pair(tiny_models[arch], embedding_adapter, capacity=160) as (cached, whole):
        await _small_budget(cached, whole)


async def _small_budget(cached: TransformersProvider, whole: TransformersProvider) -> None:
    stream = await whole.tokenize(TEXT, "m")
    choices = CHOICES
    prefixes = [list(stream[index : index + 20]) for index in range(len(choices))]
    worst = 0.0
    for step in range(6):
        ours = await _step(cached, prefixes, choices)
        theirs = await _step(whole, prefixes, choices)
        worst = max(worst, *_largest_differences(ours, theirs, choices))
        for index, prefix in enumerate(prefixes):
            prefix.append(stream[(index + step * 3) % len(stream)])
        assert cached.cache_stats().cached_tokens <= 160
    stats = cached.cache_stats()
    assert stats.evictions > 0 and stats.hits > 0
    # The memory stays within the budget's keys and values, the rows (4 tokens' worth each here) included.
    entries = list(cached._prefix_cache._entries.items())
    per_token = 2 * 2 * 2 * 16 * 4  # keys and values, 2 layers, 2 heads of 16, float32: 512 bytes
    assert all(states.nbytes == per_token * len(ids) for (_, ids), (states, _, _) in entries)
    assert sum(states.nbytes + row.nbytes for _, (states, row, _) in entries) <= 160 * per_token
    assert worst < TOLERANCE
    cached.clear_cache()
    assert cached.cache_stats().cached_tokens == 0
    again = await _step(cached, prefixes, choices)  # computed whole again after clear_cache
    assert max(_largest_differences(again, await _step(whole, prefixes, choices), choices)) < TOLERANCE
