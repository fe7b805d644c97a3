"""An adapter loaded from memory keeps the weights it was loaded with until it is replaced, on every backend.

A training loop hands ``AdapterWeights(get_peft_model_state_dict(model), ...)`` to the provider: those tensors are
the live parameters, which the next optimizer step changes in place. After a ``max_adapters`` eviction the adapter
is loaded again, and it must come back as it was loaded, not as the training loop has made it since.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from inference import AdapterWeights
from inference.llamacpp_provider import LlamaCppProvider
from inference.provider import InferenceProvider
from inference.transformers_provider import TransformersProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

PROMPT = "Once upon a time there was"
GREEDY: dict[str, Any] = {"model": "tiny", "max_tokens": 6, "temperature": 0, "logprobs": 1}


@pytest_asyncio.fixture(params=["transformers", "llamacpp"], scope="module", loop_scope="module")
async def provider(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[InferenceProvider]:
    model = tiny_models["qwen2"]
    backend: InferenceProvider
    if request.param == "transformers":
        backend = TransformersProvider(model_name=str(model.hf_dir), torch_dtype="float32", max_adapters=1)
    else:
        cache = tmp_path_factory.mktemp("gguf-cache")
        backend = LlamaCppProvider(
            model_path=model.gguf_path, n_ctx=512, kv_cache_type="f32", max_adapters=1, adapter_cache_dir=cache
        )
    yield backend
    await backend.aclose()


def training_model(hf_dir: Path, adapter_dir: Path) -> Any:
    """A PEFT model being trained: its LoRA parameters are live tensors that an optimizer changes in place."""
    import peft
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype="float32")
    return peft.PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)


def live_weights(model: Any) -> AdapterWeights:
    """The documented pattern: the model's state dict (views of its parameters) and its config."""
    import peft

    return AdapterWeights(peft.get_peft_model_state_dict(model), model.peft_config["default"])


def logprobs_of(result: Any) -> list[float]:
    return [token.logprob for token in result.logprobs]


@pytest.mark.parametrize("training_writes", ["a step", "NaN"])
async def test_an_evicted_adapter_comes_back_with_the_weights_it_was_loaded_with(
    provider: InferenceProvider, tiny_models: dict[str, Any], training_writes: str
) -> None:
    import torch

    model = tiny_models["qwen2"]
    trained = training_model(model.hf_dir, model.adapter_dirs["a1"])
    await provider.load_adapter("step", live_weights(trained))
    before = await provider.generate(PROMPT, adapter_id="step", **GREEDY)

    with torch.no_grad():  # the next optimizer step, in place, on the very tensors the provider was given
        for parameter in trained.parameters():
            if parameter.requires_grad:
                parameter.add_(0.5) if training_writes == "a step" else parameter.fill_(float("nan"))

    await provider.load_adapter("other", model.adapter_dirs["a0"])  # max_adapters=1: "step" is evicted
    assert provider.adapter_stats().get("step").state == "evicted"  # type: ignore[union-attr]
    after = await provider.generate(PROMPT, adapter_id="step", **GREEDY)  # loaded again
    stats = provider.adapter_stats().get("step")
    assert stats is not None and stats.reloads == 1

    assert after.text == before.text and [t.token for t in after.logprobs] == [t.token for t in before.logprobs]
    assert logprobs_of(after) == pytest.approx(logprobs_of(before), abs=1e-5)
    await provider.unload_adapter("step")
    await provider.unload_adapter("other")


@pytest.mark.parametrize("evicted", [True, False], ids=["evicted", "switched"])
@pytest.mark.parametrize("hot_swap", [True, False], ids=["hot-swap", "reload-mode"])
async def test_a_gguf_file_rewritten_in_place_is_never_served_under_the_id_without_a_replace(
    tiny_models: dict[str, Any], tmp_path: Path, hot_swap: bool, evicted: bool
) -> None:
    """An eviction's reload reads the adapter's file again, and so does reload mode at every switch of adapter
    (it rebuilds the model with ``lora_path``): a file rewritten since must not answer under the id."""
    import os
    import shutil

    from inference.adapters.gguf import convert_peft_to_gguf
    from inference.exceptions import InvalidAdapterError

    model = tiny_models["qwen2"]
    files = {name: convert_peft_to_gguf(model.adapter_dirs[name], model.gguf_path, tmp_path / f"{name}.gguf")
             for name in ("a0", "a1")}
    step = tmp_path / "step.gguf"
    shutil.copyfile(files["a0"], step)
    options: dict[str, Any] = {"model": "tiny", "max_tokens": 6, "temperature": 0}
    async with LlamaCppProvider(
        model.gguf_path, n_ctx=256, kv_cache_type="f32", hot_swap=hot_swap, max_adapters=1 if evicted else None
    ) as provider:
        await provider.load_adapter("step", step)
        before = (await provider.generate(PROMPT, adapter_id="step", **options)).text
        await provider.load_adapter("other", files["a1"])
        other = (await provider.generate(PROMPT, adapter_id="other", **options)).text  # switched (or evicted)
        assert other != before
        shutil.copyfile(files["a1"], step)  # the next step's adapter written over the file
        stat = os.stat(step)
        os.utime(step, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a later write, whatever the clock
        if hot_swap and not evicted:  # llama.cpp read the file once, at load: the weights it was loaded with
            assert (await provider.generate(PROMPT, adapter_id="step", **options)).text == before
        else:
            with pytest.raises(InvalidAdapterError, match=r"changed since it was loaded.*replace=True"):
                await provider.generate(PROMPT, adapter_id="step", **options)  # it answered as a1 before
        await provider.load_adapter("step", step, replace=True)
        assert (await provider.generate(PROMPT, adapter_id="step", **options)).text == other
