"""An adapter loaded from memory (AdapterWeights) answers exactly as the same adapter loaded from its directory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from inference import AdapterWeights
from inference.exceptions import InvalidAdapterError
from inference.llamacpp_provider import LlamaCppProvider
from inference.provider import InferenceProvider
from inference.transformers_provider import TransformersProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

PROMPTS = ["the quick brown fox", "Once upon a time there was", "Dear diary"]
GREEDY: dict[str, Any] = {"model": "tiny", "max_tokens": 6, "temperature": 0}


@pytest_asyncio.fixture(params=["transformers", "llamacpp"], scope="module", loop_scope="module")
async def provider(request: pytest.FixtureRequest, tiny_models: dict[str, Any]) -> AsyncIterator[InferenceProvider]:
    model = tiny_models["qwen2"]
    backend: InferenceProvider
    if request.param == "transformers":
        backend = TransformersProvider(model_name=str(model.hf_dir), torch_dtype="float32")
    else:
        backend = LlamaCppProvider(model_path=model.gguf_path, n_ctx=512, kv_cache_type="f32")
    yield backend
    await backend.aclose()


def weights_of(directory: Path, *, as_lora_config: bool = False) -> AdapterWeights:
    """The adapter of ``directory`` as a training loop holds it: its state dict and its config."""
    from safetensors.torch import load_file

    config: Any = json.loads((directory / "adapter_config.json").read_text())
    if as_lora_config:
        import peft

        config = peft.LoraConfig(
            **{
                k: v
                for k, v in config.items()
                if k in peft.LoraConfig.__dataclass_fields__ and k not in ("peft_type", "auto_mapping", "revision")
            }
        )
    return AdapterWeights(load_file(str(directory / "adapter_model.safetensors")), config)


@pytest.mark.parametrize("as_lora_config", [False, True], ids=["config-dict", "LoraConfig"])
async def test_memory_and_directory_give_identical_greedy_output(
    provider: InferenceProvider, tiny_models: dict[str, Any], as_lora_config: bool
) -> None:
    directory = tiny_models["qwen2"].adapter_dirs["a1"]
    await provider.load_adapter("from-dir", directory)
    await provider.load_adapter("from-memory", weights_of(directory, as_lora_config=as_lora_config))
    # Transformers takes the tensors straight into the model; llama.cpp gets a private PEFT directory to convert
    assert bool(provider._adapter_weights.directories()) is not provider.loads_adapter_weights_in_memory
    try:
        for prompt in PROMPTS:
            from_dir = (await provider.generate(prompt, adapter_id="from-dir", **GREEDY)).text
            from_memory = await provider.generate(prompt, adapter_id="from-memory", **GREEDY)
            base = (await provider.generate(prompt, **GREEDY)).text
            assert from_memory.text == from_dir and from_memory.adapter_id == "from-memory"
            assert from_dir != base or prompt != PROMPTS[0]  # the adapter changes the answer
    finally:
        await provider.unload_adapter("from-dir")
        await provider.unload_adapter("from-memory")


async def test_replacing_with_weights_in_a_loop_serves_each_step_and_refuses_a_wrong_shape(
    provider: InferenceProvider, tiny_models: dict[str, Any]
) -> None:
    dirs = tiny_models["qwen2"].adapter_dirs
    expected = {}
    for name in ("a0", "a2"):
        await provider.load_adapter(f"ref-{name}", dirs[name])
        expected[name] = (await provider.generate(PROMPTS[0], adapter_id=f"ref-{name}", **GREEDY)).text
        await provider.unload_adapter(f"ref-{name}")
    assert expected["a0"] != expected["a2"]

    await provider.load_adapter("step", weights_of(dirs["a0"]))
    for name in ("a2", "a0", "a2"):
        await provider.load_adapter("step", weights_of(dirs[name]), replace=True)
        assert (await provider.generate(PROMPTS[0], adapter_id="step", **GREEDY)).text == expected[name]

    wrong = weights_of(dirs["a0"])
    first = next(name for name in wrong.tensors if name.endswith("lora_B.weight"))
    bad = AdapterWeights({**wrong.tensors, first: wrong.tensors[first][:-1]}, wrong.config)  # one row short
    with pytest.raises(InvalidAdapterError):
        await provider.load_adapter("step", bad, replace=True)
    assert (await provider.generate(PROMPTS[0], adapter_id="step", **GREEDY)).text == expected["a2"]
    assert provider.adapter_stats().get("step").replacements == 3  # type: ignore[union-attr]
    await provider.unload_adapter("step")


async def test_target_modules_as_a_regex_and_numpy_scales_are_taken_as_peft_and_floats_are(
    provider: InferenceProvider, tiny_models: dict[str, Any]
) -> None:
    """PEFT accepts target_modules as one regular expression (matched against the whole module name); a training
    loop's scales are often numpy scalars. Both used to be refused."""
    import numpy as np

    directory = tiny_models["qwen2"].adapter_dirs["a1"]
    listed = weights_of(directory)
    pattern = rf".*\.({'|'.join(listed.config['target_modules'])})"
    await provider.load_adapter("listed", listed)
    await provider.load_adapter("pattern", AdapterWeights(listed.tensors, {**listed.config, "target_modules": pattern}))
    try:
        for prompt in PROMPTS:
            expected = (await provider.generate(prompt, adapter_id="listed", **GREEDY)).text
            assert (await provider.generate(prompt, adapter_id="pattern", **GREEDY)).text == expected
            half = (await provider.generate(prompt, adapter_id=("listed", 0.5), **GREEDY)).text
            assert (await provider.generate(prompt, adapter_id=("listed", np.float32(0.5)), **GREEDY)).text == half
        narrow = AdapterWeights(listed.tensors, {**listed.config, "target_modules": r".*\.q_proj"})
        with pytest.raises(InvalidAdapterError, match="not among target_modules"):  # v_proj... are not q_proj
            await provider.load_adapter("narrow", narrow)
    finally:
        await provider.unload_adapter("listed")
        await provider.unload_adapter("pattern")
