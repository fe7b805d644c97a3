"""Adapter scales and several adapters per request, on llama.cpp and Transformers + PEFT (real tiny models).

``adapter_id=[("a0", 1.0), ("a1", 0.5)]`` applies each adapter's delta times its scale. llama.cpp does it natively
(several adapters with scales on the context); Transformers builds PEFT's weighted combination once. The two must
give the same greedy token ids, as the single-adapter agreement tests require.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from inference.exceptions import AdapterNotFoundError, InvalidRequestError, UnsupportedOperationError
from inference.provider import InferenceProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

pytest.importorskip("llama_cpp")
pytest.importorskip("peft")

PROMPT = "Once upon a time"
CHOICES: list[Any] = [
    [("a0", 0.5)],
    [("a0", -0.7)],
    [("a0", 1.0), ("a1", 0.5)],
    [("a1", 2.0), ("a2", -1.0), ("a0", 0.3)],
]


async def token_ids(provider: InferenceProvider, adapter_id: Any, prompt: str = PROMPT) -> list[int | None]:
    result = await provider.generate(prompt, model="m", adapter_id=adapter_id, temperature=0, max_tokens=16, logprobs=0)
    assert result.logprobs is not None
    return [entry.token_id for entry in result.logprobs]


@pytest.fixture(params=["qwen2", "llama"])
def arch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def pair(
    arch: str, tiny_models: dict[str, Any], tmp_path: Path
) -> AsyncIterator[tuple[InferenceProvider, InferenceProvider]]:
    """llama.cpp and Transformers on the same tiny model, with adapters a0, a1 and a2 loaded in both."""
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.transformers_provider import TransformersProvider

    model = tiny_models[arch]
    llamacpp = LlamaCppProvider(model.gguf_path, n_ctx=512, adapter_cache_dir=tmp_path, kv_cache_type="f32")
    transformers = TransformersProvider(model_name=str(model.hf_dir), device="cpu")
    for provider in (llamacpp, transformers):
        for adapter_id in ("a0", "a1", "a2"):
            await provider.load_adapter(adapter_id, model.adapter_dirs[adapter_id])
    yield llamacpp, transformers
    await llamacpp.aclose()
    await transformers.aclose()


async def test_scale_0_is_the_base_model_and_scale_1_the_adapter_alone(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    for provider in pair:
        base = await token_ids(provider, None)
        alone = await token_ids(provider, "a0")
        assert base != alone
        assert await token_ids(provider, [("a0", 0.0)]) == base
        assert await token_ids(provider, ("a0", 0.0)) == base
        assert await token_ids(provider, [("a0", 0.0), ("a1", 0.0)]) == base
        assert await token_ids(provider, ("a0", 1.0)) == alone
        assert await token_ids(provider, [("a0", 1.0), ("a1", 0.0)]) == alone


async def test_combined_adapters_give_the_same_tokens_on_llamacpp_and_transformers(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    llamacpp, transformers = pair
    seen = set()
    for choice in CHOICES:
        ours = await token_ids(llamacpp, choice)
        assert ours == await token_ids(transformers, choice), choice
        seen.add(tuple(ours))
    assert len(seen) == len(CHOICES)  # each scale and combination changes the output


async def test_a_result_names_the_adapters_and_scales_it_was_made_with(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    for provider in pair:
        result = await provider.generate(PROMPT, model="m", adapter_id=[("a0", 1.0), ("a1", 0.5)], max_tokens=2)
        assert result.adapter_id == "a0*1+a1*0.5"
        assert (await provider.generate(PROMPT, model="m", adapter_id=("a2", 1.0), max_tokens=2)).adapter_id == "a2"


async def test_concurrent_requests_with_different_combinations_each_get_their_own(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    """llama.cpp batches requests with equal adapters and scales; Transformers puts combinations in one batch."""
    choices: list[Any] = [None, "a0", *CHOICES]
    prompts = [PROMPT, "Hello there", "1 2 3"]
    for provider in pair:
        alone = {
            (index, prompt): await token_ids(provider, choice, prompt)
            for index, choice in enumerate(choices)
            for prompt in prompts
        }
        work = [(index, prompt) for prompt in prompts for index in range(len(choices))] * 2
        together = await asyncio.gather(*(token_ids(provider, choices[index], prompt) for index, prompt in work))
        assert together == [alone[item] for item in work]


async def test_a_streamed_combination_equals_its_generation(pair: tuple[InferenceProvider, InferenceProvider]) -> None:
    for provider in pair:
        whole = await provider.generate(PROMPT, model="m", adapter_id=CHOICES[2], temperature=0, max_tokens=12)
        pieces = [
            event
            async for event in provider.stream(PROMPT, model="m", adapter_id=CHOICES[2], temperature=0, max_tokens=12)
            if isinstance(event, str)
        ]
        assert "".join(pieces) == whole.text


async def test_bad_combinations_are_refused_and_the_provider_goes_on(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    for provider in pair:
        with pytest.raises(AdapterNotFoundError, match="'nope'"):
            await provider.generate(PROMPT, model="m", adapter_id=[("a0", 1.0), ("nope", 0.5)], max_tokens=2)
        with pytest.raises(InvalidRequestError, match="finite number"):
            await provider.generate(PROMPT, model="m", adapter_id=[("a0", float("nan"))], max_tokens=2)
        with pytest.raises(InvalidRequestError, match="appears twice"):
            await provider.generate(PROMPT, model="m", adapter_id=[("a0", 1.0), ("a0", 0.5)], max_tokens=2)
        assert provider._adapter_registry.in_flight("a0") == 0  # type: ignore[attr-defined]
        assert await token_ids(provider, CHOICES[2]) == await token_ids(provider, CHOICES[2])


async def test_unloading_a_part_of_a_combination_and_loading_it_again(
    pair: tuple[InferenceProvider, InferenceProvider], tiny_models: dict[str, Any], arch: str
) -> None:
    _, transformers = pair
    before = {provider.name: await token_ids(provider, CHOICES[2]) for provider in pair}
    for provider in pair:
        await provider.unload_adapter("a1")
        with pytest.raises(AdapterNotFoundError, match="'a1'"):
            await provider.generate(PROMPT, model="m", adapter_id=CHOICES[2], max_tokens=2)
    kept = transformers._combined  # type: ignore[attr-defined]
    assert all(adapter_id != "a1" for key in kept for adapter_id, _ in key)  # its combinations left the model
    for provider in pair:
        await provider.load_adapter("a1", tiny_models[arch].adapter_dirs["a1"])
        assert await token_ids(provider, CHOICES[2]) == before[provider.name]


async def test_replacing_a_part_of_a_combination_uses_the_new_weights(
    pair: tuple[InferenceProvider, InferenceProvider], tiny_models: dict[str, Any], arch: str
) -> None:
    a2 = tiny_models[arch].adapter_dirs["a2"]
    expected = {provider.name: await token_ids(provider, [("a0", 1.0), ("a2", 0.5)]) for provider in pair}
    for provider in pair:
        await token_ids(provider, [("a0", 1.0), ("a1", 0.5)])  # the old a1 in a cached combination
        await provider.load_adapter("a1", a2, replace=True)  # a1 now holds a2's weights
        assert await token_ids(provider, [("a0", 1.0), ("a1", 0.5)]) == expected[provider.name]


async def test_providers_without_scales_say_which_can(tmp_path: Path) -> None:
    from inference.fake_provider import FakeProvider

    async with FakeProvider() as fake:
        await fake.load_adapter("a0", tmp_path)
        able = r"providers that can: llamacpp, llamacpp-server, transformers"
        with pytest.raises(UnsupportedOperationError, match=able):
            await fake.generate(PROMPT, model="m", adapter_id=[("a0", 0.5)], max_tokens=2)
        assert (await fake.generate(PROMPT, model="m", adapter_id=("a0", 1.0), max_tokens=2)).adapter_id == "a0"


def _random_peft_lora(model: Any, directory: Path, seed: int, **config: Any) -> Path:
    """A PEFT LoRA of ``model`` with ``config`` and random (nonzero) matrices, saved as PEFT saves it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model.hf_dir), torch_dtype=torch.float32)
    settings: dict[str, Any] = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "up_proj"], **config}
    lora = get_peft_model(base, LoraConfig(**settings))
    with torch.no_grad():
        for name, parameter in lora.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.3)
    lora.save_pretrained(str(directory))
    return directory


@pytest.mark.filterwarnings("ignore::peft.utils.warning.PeftWarning")  # about lora_bias on layers without bias
async def test_combinations_of_adapters_peft_serves_are_their_weighted_sum_as_on_llamacpp(
    pair: tuple[InferenceProvider, InferenceProvider], arch: str, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """Adapters the stacks do not take (``layers_to_transform``, ``exclude_modules``) are combined by PEFT, which
    gave the combination the first adapter's config: its rsLoRA scale (4 times too strong here) and its layers (the
    second adapter's left out). Each combination's distribution equals llama.cpp's, which applies every adapter
    with its scale."""
    import numpy as np

    llamacpp, transformers = pair
    model = tiny_models[arch]
    made = {
        "rs_l0": {"seed": 3, "r": 8, "use_rslora": True, "layers_to_transform": [0]},
        "l0": {"seed": 4, "layers_to_transform": [0]},
        "l1": {"seed": 5, "layers_to_transform": [1]},
        "ex": {"seed": 7, "exclude_modules": ["layers.1.mlp.up_proj"]},
    }
    for name, config in made.items():
        path = _random_peft_lora(model, tmp_path / name, **config)
        for provider in pair:
            await provider.load_adapter(name, path)
    ids = await transformers.tokenize(PROMPT, "m")
    for choice in ([("rs_l0", 0.5)], [("l0", 1.0), ("l1", 1.0)], [("l1", 1.0), ("a0", -0.5)], [("ex", 0.5)],
                   [("ex", 1.0), ("l0", 0.5)]):
        ours = await transformers.next_token_logprobs(ids, "m", adapter_id=choice)
        theirs = await llamacpp.next_token_logprobs(ids, "m", adapter_id=choice)
        assert float(np.abs(ours - theirs).max()) < 1e-4, choice
    biased = _random_peft_lora(model, tmp_path / "biased", seed=6, lora_bias=True)
    await transformers.load_adapter("biased", biased)
    with pytest.raises(UnsupportedOperationError, match="lora_bias cannot take a scale"):
        await transformers.next_token_logprobs(ids, "m", adapter_id=[("biased", 0.5)])
    assert (await transformers.generate(PROMPT, model="m", adapter_id="biased", max_tokens=2)).completion_tokens > 0
