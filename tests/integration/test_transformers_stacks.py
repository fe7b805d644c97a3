"""Transformers: adapters served from stacked LoRA matrices answer as PEFT's mixed batches do.

The provider puts every adapter it can into stacked matrices (one gathered LoRA pass per layer, however many
distinct adapters a batch uses) and leaves the others to PEFT. A user must see no difference but speed: each row of
a mixed batch gets the greedy tokens and the token logprobs (within 1e-4) that a provider serving every adapter
with PEFT gives, on both tiny architectures, for 1 to 32 distinct adapters of ranks 4, 8 and 16, with scales, and
after a replacement, an unload or an eviction (no row ever uses a stale slot).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from inference.results import GenerationResult
from inference.testing.random_lora import write_random_peft_lora
from inference.transformers_provider import TransformersProvider

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

PROMPTS = ["the quick brown fox", "Once upon a time there was", "Dear diary", "1, 2, 3,", "hello world"]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOLERANCE = 1e-4


def _write(model: Any, directory: Path, number: int) -> Path:
    """Adapter ``number``: ranks 4/8/16 in turn, its own alpha and target set."""
    rank = (4, 8, 16)[number % 3]
    targets = TARGETS[: 2 + number % 6]
    return write_random_peft_lora(
        model.gguf_path,
        directory / f"a{number}",
        rank=rank,
        alpha=rank + number,
        targets=targets,
        seed=number,
        std=0.08,
    )


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def arch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def adapter_dirs(arch: str, tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    directory = tmp_path_factory.mktemp(f"stacks-{arch}")
    return [_write(tiny_models[arch], directory, number) for number in range(33)]


@pytest.fixture(scope="module")
def embedding_adapter(arch: str, tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter the stacks cannot hold: LoRA on the token embeddings too (PEFT serves it)."""
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_models[arch].hf_dir))
    torch.manual_seed(7)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "embed_tokens"], init_lora_weights=False)
    model = peft.get_peft_model(base, config)
    path = tmp_path_factory.mktemp(f"embedding-{arch}") / "embedding"
    model.save_pretrained(str(path), save_embedding_layers=False)
    return path


def _provider(model: Any, *, stacking: bool, **settings: Any) -> TransformersProvider:
    provider = TransformersProvider(model_name=str(model.hf_dir), torch_dtype="float32", max_batch_size=64, **settings)
    provider._slots.stacking = stacking  # the reference serves every adapter with PEFT
    return provider


async def _batch(provider: TransformersProvider, choices: Sequence[Any]) -> list[GenerationResult]:
    """One greedy generation per row, all sent at once (one batch)."""
    return list(
        await asyncio.gather(
            *(
                provider.generate(
                    PROMPTS[row % len(PROMPTS)],
                    model="tiny",
                    adapter_id=choice,
                    max_tokens=6,
                    temperature=0,
                    logprobs=1,
                    return_token_ids=True,
                )
                for row, choice in enumerate(choices)
            )
        )
    )


async def _scores(provider: TransformersProvider, choices: Sequence[str | None]) -> list[float]:
    results = await asyncio.gather(
        *(
            provider.score(PROMPTS[row % len(PROMPTS)], " and the rest of it", "tiny", choice)
            for row, choice in enumerate(choices)
        )
    )
    return [result.logprob for result in results]


async def _agree(stacked: TransformersProvider, reference: TransformersProvider, choices: Sequence[Any]) -> None:
    """The stacked provider's rows equal the PEFT provider's: greedy tokens, token logprobs, scores."""
    got, want = await _batch(stacked, choices), await _batch(reference, choices)
    for row, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        assert mine.token_ids == theirs.token_ids, (row, choices[row])
        assert mine.logprobs is not None and theirs.logprobs is not None
        ours = [entry.logprob for entry in mine.logprobs]
        peft_s = [entry.logprob for entry in theirs.logprobs]
        assert ours == pytest.approx(peft_s, abs=TOLERANCE), (row, choices[row])
    plain = [choice if choice is None or isinstance(choice, str) else None for choice in choices]
    assert await _scores(stacked, plain) == pytest.approx(await _scores(reference, plain), abs=TOLERANCE)


async def test_mixed_batches_of_1_to_32_distinct_adapters_equal_peft_s(
    arch: str, tiny_models: dict[str, Any], adapter_dirs: list[Path]
) -> None:
    model = tiny_models[arch]
    # a window long enough that the 33 rows sent at once meet in one batch on a busy machine too (5 ms split them;
    # 100 ms held at stop 38, and a CI machine may be slower still)
    stacked_provider = _provider(model, stacking=True, batch_window_ms=500)
    async with stacked_provider as stacked, _provider(model, stacking=False) as reference:
        for provider in (stacked, reference):
            for number, path in enumerate(adapter_dirs[:32]):
                await provider.load_adapter(f"a{number}", path)
        assert len(stacked._slots.stacked.slots) == 32
        assert not isinstance(stacked.model, peft.PeftModel)  # no PEFT layer at all: the stacks serve them
        for distinct in (1, 2, 8, 32):
            choices: list[str | None] = [f"a{row % distinct}" for row in range(max(distinct, 3))]
            await _agree(stacked, reference, choices)
            await _agree(stacked, reference, [*choices, None])  # with a base-model row
        assert max(stacked.recent_batch_sizes) >= 33  # the rows really ran together


async def test_scales_and_combinations_equal_peft_s(
    arch: str, tiny_models: dict[str, Any], adapter_dirs: list[Path]
) -> None:
    model = tiny_models[arch]
    async with _provider(model, stacking=True) as stacked, _provider(model, stacking=False) as reference:
        for provider in (stacked, reference):
            for number, path in enumerate(adapter_dirs[:4]):
                await provider.load_adapter(f"a{number}", path)
        choices = [
            [("a0", 1.0), ("a1", -0.5)],
            [("a2", 0.5)],
            "a3",
            None,
            [("a1", 2.0), ("a2", 1.0), ("a3", 0.25)],
            [("a2", 0.5)],
        ]
        await _agree(stacked, reference, choices)


async def test_a_batch_with_more_distinct_combinations_than_are_kept_gives_each_row_its_own(
    arch: str, tiny_models: dict[str, Any], adapter_dirs: list[Path]
) -> None:
    """Beyond the 8 combinations kept, building one row's combination evicted another row's of the same batch:
    that row ran on the base model, silently. Each of 12 rows equals its request alone, and none is the base's."""
    model = tiny_models[arch]
    async with _provider(model, stacking=True, batch_window_ms=300) as provider:
        await provider.load_adapter("a0", adapter_dirs[0])
        choices: list[Any] = [[("a0", 1.25 + 0.25 * number)] for number in range(12)]

        async def tokens(choice: Any) -> tuple[int, ...] | None:
            result = await provider.generate(PROMPTS[0], model="tiny", adapter_id=choice, max_tokens=6, temperature=0,
                                             return_token_ids=True)
            return result.token_ids

        alone = [await tokens(choice) for choice in choices]
        base = await tokens(None)
        together = await asyncio.gather(*(tokens(choice) for choice in choices))
        assert max(provider.recent_batch_sizes) >= 12  # the rows really ran together
        assert together == alone and base not in together


async def test_an_adapter_the_stacks_cannot_hold_runs_with_peft_in_the_same_batch(
    arch: str,
    tiny_models: dict[str, Any],
    adapter_dirs: list[Path],
    embedding_adapter: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = tiny_models[arch]
    async with (
        _provider(model, stacking=True, spare_adapter_slots=0) as stacked,
        _provider(model, stacking=False) as reference,
    ):
        with caplog.at_level(logging.INFO, logger="inference"):
            for provider in (stacked, reference):
                await provider.load_adapter("emb", embedding_adapter)
                await provider.load_adapter("emb2", embedding_adapter)
                await provider.load_adapter("a0", adapter_dirs[0])
                await provider.load_adapter("a1", adapter_dirs[1])
        reasons = [record.getMessage() for record in caplog.records if "per-adapter pass" in record.getMessage()]
        assert len(reasons) == 1 and "lora_embedding" in reasons[0]  # the reason, logged once
        assert set(stacked._slots.stacked.slots) == {stacked.peft_adapter_names["a0"], stacked.peft_adapter_names["a1"]}
        await _agree(stacked, reference, ["emb", "a0", None, "a1", "emb2", "a0"])
        await _agree(stacked, reference, [[("a0", 1.0), ("emb", 0.5)], "emb", [("a1", -1.0)], "a0"])
        await stacked.unload_adapter("emb")
        await stacked.unload_adapter("emb2")  # the last PEFT adapter: the plain model again, the stacks still on it
        await reference.unload_adapter("emb")
        await reference.unload_adapter("emb2")
        assert not isinstance(stacked.model, peft.PeftModel)
        await _agree(stacked, reference, ["a0", "a1", None])


async def test_after_replace_unload_and_evict_no_row_uses_a_stale_slot(
    arch: str, tiny_models: dict[str, Any], adapter_dirs: list[Path]
) -> None:
    model = tiny_models[arch]
    async with (
        _provider(model, stacking=True, max_adapters=4) as stacked,
        _provider(model, stacking=False, max_adapters=4) as reference,
    ):
        for provider in (stacked, reference):
            for number in range(4):
                await provider.load_adapter(f"a{number}", adapter_dirs[number])
        await _agree(stacked, reference, ["a0", "a1", "a2", "a3", [("a0", 1.0), ("a1", 0.5)]])
        for provider in (stacked, reference):
            await provider.load_adapter("a0", adapter_dirs[32], replace=True)  # rank 16 where rank 4 was
            await provider.unload_adapter("a1")
            await provider.load_adapter("b", adapter_dirs[9])  # takes a1's freed slot
        await _agree(stacked, reference, ["a0", "b", "a2", [("a0", 1.0), ("b", 0.5)], None])
        for provider in (stacked, reference):
            await provider.load_adapter("c", adapter_dirs[10])
            await provider.load_adapter("d", adapter_dirs[11])  # max_adapters=4: two are evicted
        await _agree(stacked, reference, ["a0", "c", "d", "b"])  # evicted ones come back, fresh


async def test_weights_of_a_layer_the_config_leaves_out_are_ignored_as_peft_ignores_them(
    arch: str, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """``layers_to_transform=0`` (one layer number, which PEFT takes) over a file that also holds layer 1's weights:
    the stacks applied layer 1 too, where PEFT builds no layer for it and ignores them."""
    model = tiny_models[arch]
    adapter = tmp_path / "layer0"
    shutil.copytree(model.adapter_dirs["a0"], adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "layers_to_transform": 0}))
    async with _provider(model, stacking=True) as stacked, _provider(model, stacking=False) as reference:
        for provider in (stacked, reference):
            await provider.load_adapter("layer0", adapter)
            await provider.load_adapter("a0", model.adapter_dirs["a0"])
        await _agree(stacked, reference, ["layer0", "a0", None, "layer0"])


async def test_a_high_rank_adapter_loaded_and_unloaded_leaves_the_stacks_as_the_others_need(
    arch: str, tiny_models: dict[str, Any], adapter_dirs: list[Path], tmp_path: Path
) -> None:
    """The stacks kept the rank of the largest adapter ever loaded: after one rank-256 adapter came and went, an
    evaluation's adapters of rank 4 to 16 kept its memory and paid its products in every batch."""
    model = tiny_models[arch]
    big = write_random_peft_lora(model.gguf_path, tmp_path / "big", rank=256, alpha=256, targets=TARGETS, seed=99)
    async with _provider(model, stacking=True) as provider:
        for number in range(3):
            await provider.load_adapter(f"a{number}", adapter_dirs[number])
        choices = ["a0", "a1", "a2", None]
        before = await _batch(provider, choices)
        stacks = provider._slots.stacked._stacks
        assert stacks is not None
        held = stacks.nbytes
        await provider.load_adapter("big", big)
        assert stacks.nbytes > 10 * held
        await provider.unload_adapter("big")
        assert stacks.nbytes <= 2 * held  # the others' ranks; the slot it added may stay (slots halve at a quarter)
        after = await _batch(provider, choices)
        assert [(row.token_ids, row.logprobs) for row in after] == [(row.token_ids, row.logprobs) for row in before]
        for number in range(3):
            await provider.unload_adapter(f"a{number}")
        assert stacks.nbytes == 0  # no adapter left: the stacks hold nothing


def test_an_adapter_served_by_the_stacks_loads_without_importing_peft(tiny_models: Any) -> None:
    """Importing peft costs seconds (with bitsandbytes installed, about 4 s here): an evaluation's first adapter load
    would take that much longer than the others, and its summary would say so. A stackable adapter never needs it."""
    import subprocess
    import sys

    model = tiny_models["qwen2"]
    script = f"""
import asyncio, sys
from inference.transformers_provider import TransformersProvider

async def main():
    async with TransformersProvider(model_name={str(model.hf_dir)!r}) as provider:
        await provider.load_adapter("a0", {str(model.adapter_dirs["a0"])!r})
        result = await provider.generate("hello", model="m", adapter_id="a0", max_tokens=3, temperature=0)
        assert result.completion_tokens > 0, result
    print("peft" in sys.modules)

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
