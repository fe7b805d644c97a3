"""Transformers: an unloaded adapter's slot serves the next adapter of the same LoRA shape, with its own weights only.

An evaluation loads, scores and unloads hundreds of adapters of one shape. Instead of PEFT building LoRA layers for
each and removing them again, an unload keeps the emptied slot (``spare_adapter_slots``) and the next adapter of the
same config is copied into it. Every answer must be exactly that adapter's answer on a provider that never reuses a
slot: nothing of the previous adapter may be left in the slot.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import peft
import pytest
from safetensors.torch import load_file, save_file

from inference import AdapterWeights
from inference.exceptions import InvalidAdapterError
from inference.testing.random_lora import write_random_peft_lora
from inference.transformers_provider import TransformersProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

def peft_provider(**settings: Any) -> TransformersProvider:
    """A provider that serves every adapter with PEFT: spare slots are PEFT's (a stacked adapter needs none), and
    they still serve the adapters the stacks cannot hold."""
    provider = TransformersProvider(**settings)
    provider._slots.stacking = False
    return provider


PROMPTS = ["the quick brown fox", "Once upon a time there was", "Dear diary"]
GREEDY: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "temperature": 0, "logprobs": 1}


async def answers(provider: TransformersProvider, adapter_id: str | None) -> list[tuple[str, list[float]]]:
    """Greedy text and token logprobs of each prompt: equal answers mean equal weights."""
    found = []
    for prompt in PROMPTS:
        result = await provider.generate(prompt, adapter_id=adapter_id, **GREEDY)
        assert result.logprobs is not None
        found.append((result.text, [entry.logprob for entry in result.logprobs]))
    return found


async def reference(model: Any, path: Path | str) -> list[tuple[str, list[float]]]:
    """The adapter's answers on a provider that loads it into a new slot."""
    async with peft_provider(model_name=str(model.hf_dir), torch_dtype="float32", spare_adapter_slots=0) as p:
        await p.load_adapter("x", path)
        return await answers(p, "x")


def without_tensors(source: Path, target: Path, dropped: str) -> Path:
    """A copy of adapter ``source`` whose weights lack the tensors whose names contain ``dropped``."""
    shutil.copytree(source, target)
    tensors = load_file(str(source / "adapter_model.safetensors"))
    kept = {name: tensor for name, tensor in tensors.items() if dropped not in name}
    assert 0 < len(kept) < len(tensors)
    save_file(kept, str(target / "adapter_model.safetensors"))
    return target


async def leave_a_spare_slot(provider: TransformersProvider, model: Any) -> str:
    """Load adapter a0 and unload it: its emptied slot stays as a spare; returns its PEFT name."""
    await provider.load_adapter("first", model.adapter_dirs["a0"])
    spare = provider.peft_adapter_names["first"]
    await provider.unload_adapter("first")
    assert spare in provider.model.peft_config
    return spare


async def test_the_next_adapter_of_the_same_shape_reuses_the_slot_and_answers_as_alone(
    tiny_models: dict[str, Any],
) -> None:
    model = tiny_models["qwen2"]
    expected = {name: await reference(model, model.adapter_dirs[name]) for name in ("a0", "a1", "a2")}
    assert len({json.dumps(found) for found in expected.values()}) == 3
    async with peft_provider(model_name=str(model.hf_dir), torch_dtype="float32") as provider:
        base = await answers(provider, None)
        await provider.load_adapter("first", model.adapter_dirs["a0"])
        slot = provider.peft_adapter_names["first"]
        assert await answers(provider, "first") == expected["a0"]
        await provider.unload_adapter("first")
        assert list(provider.model.peft_config) == [slot]  # kept, empty of any adapter id
        assert await answers(provider, None) == base  # the spare slot changes nothing for the base model
        for round_, name in enumerate(["a1", "a2", "a0", "a1"]):
            await provider.load_adapter(f"next-{round_}", model.adapter_dirs[name])
            assert provider.peft_adapter_names[f"next-{round_}"] == slot  # copied into the same slot
            assert await answers(provider, f"next-{round_}") == expected[name], (round_, name)
            await provider.unload_adapter(f"next-{round_}")
        assert await provider.list_adapters() == []


async def test_several_slots_in_flight_and_weights_from_memory(tiny_models: dict[str, Any]) -> None:
    model = tiny_models["qwen2"]
    expected = {name: await reference(model, model.adapter_dirs[name]) for name in ("a0", "a1", "a2")}
    async with peft_provider(model_name=str(model.hf_dir), torch_dtype="float32") as provider:
        for name in ("a0", "a1", "a2"):
            await provider.load_adapter(name, model.adapter_dirs[name])
        slots = set(provider.peft_adapter_names.values())
        for name in ("a0", "a1", "a2"):
            await provider.unload_adapter(name)
        directory = model.adapter_dirs["a2"]
        tensors = load_file(str(directory / "adapter_model.safetensors"))
        config = json.loads((directory / "adapter_config.json").read_text())
        await provider.load_adapter("memory", AdapterWeights(tensors, config))  # from memory, into a spare slot
        await provider.load_adapter("disk", model.adapter_dirs["a0"])
        assert {provider.peft_adapter_names["memory"], provider.peft_adapter_names["disk"]} <= slots
        assert await answers(provider, "memory") == expected["a2"]
        assert await answers(provider, "disk") == expected["a0"]


async def test_an_adapter_of_another_shape_gets_its_own_slot(tiny_models: dict[str, Any], tmp_path: Path) -> None:
    model = tiny_models["qwen2"]
    rank_4 = write_random_peft_lora(model.gguf_path, tmp_path / "rank-4", rank=4, alpha=8, seed=3)
    expected = await reference(model, rank_4)
    async with peft_provider(model_name=str(model.hf_dir), torch_dtype="float32") as provider:
        spare = await leave_a_spare_slot(provider, model)
        await provider.load_adapter("other", rank_4)
        assert provider.peft_adapter_names["other"] != spare
        assert await answers(provider, "other") == expected


@pytest.mark.filterwarnings("ignore:Found missing adapter keys:UserWarning")  # PEFT's word on the partial adapter
async def test_an_adapter_that_would_leave_old_weights_in_the_slot_is_loaded_anew(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """Weights for fewer modules than the slot has: the slot is dropped, never served with the old rest."""
    model = tiny_models["qwen2"]
    partial = without_tensors(model.adapter_dirs["a1"], tmp_path / "partial", "v_proj")
    expected = await reference(model, partial)
    async with peft_provider(model_name=str(model.hf_dir), torch_dtype="float32") as provider:
        spare = await leave_a_spare_slot(provider, model)
        await provider.load_adapter("partial", partial)
        assert provider.peft_adapter_names["partial"] != spare
        assert spare not in provider.model.peft_config
        assert await answers(provider, "partial") == expected


async def test_a_bad_adapter_leaves_the_spare_slots_usable(tiny_models: dict[str, Any], tmp_path: Path) -> None:
    model = tiny_models["qwen2"]
    expected = await reference(model, model.adapter_dirs["a1"])
    broken = tmp_path / "broken"
    shutil.copytree(model.adapter_dirs["a1"], broken)
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    async with peft_provider(model_name=str(model.hf_dir), torch_dtype="float32") as provider:
        await leave_a_spare_slot(provider, model)
        with pytest.raises(InvalidAdapterError):
            await provider.load_adapter("broken", broken)
        await provider.load_adapter("good", model.adapter_dirs["a1"])
        assert await answers(provider, "good") == expected


async def test_the_slots_kept_are_bounded_and_close_frees_them(tiny_models: dict[str, Any], tmp_path: Path) -> None:
    model = tiny_models["qwen2"]
    async with peft_provider(
        model_name=str(model.hf_dir), torch_dtype="float32", spare_adapter_slots=2
    ) as provider:
        for index in range(4):
            await provider.load_adapter(f"a{index}", model.adapter_dirs[f"a{index % 3}"])
        for index in range(4):
            await provider.unload_adapter(f"a{index}")
        assert len(provider.model.peft_config) == 2
        assert isinstance(provider.model, peft.PeftModel)
    assert provider.model is None
