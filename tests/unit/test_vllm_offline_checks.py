"""What the ``vllm-offline`` provider decides without vLLM's engine: health after a failed start, and the adapter
checks made before the engine registers an adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference._inprocess import vllm_engine
from inference.exceptions import ModelLoadError
from inference.vllm_offline_provider import VLLMOfflineProvider


@pytest.mark.asyncio
async def test_health_is_down_after_a_failed_engine_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start vLLM refuses (a directory that is no model, a max_model_len above the model's, a max_lora_rank it
    does not accept) left health up ("not loaded yet") while every call raised ModelLoadError."""
    import inference.vllm_offline_provider as module

    (tmp_path / "config.json").write_text("{}")

    def refused(model_name: str, settings: object) -> object:
        raise ModelLoadError("vLLM could not start: max_lora_rank (12) is not one of 1, 8", provider="vllm-offline")

    monkeypatch.setattr(vllm_engine, "start_engine", refused)
    monkeypatch.setattr(module, "start_engine", refused, raising=False)  # where the provider called it before
    provider = VLLMOfflineProvider(model_name=str(tmp_path), max_lora_rank=12)
    with pytest.raises(ModelLoadError):
        await provider.start()
    health = await provider.health()
    assert health.status == "down"
    assert health.backends[0].error is not None and "max_lora_rank (12)" in health.backends[0].error
    await provider.aclose()


def _engine(defaults: dict[str, object], *, samples: bool) -> vllm_engine.Engine:
    from types import SimpleNamespace

    sampling = SimpleNamespace(RequestOutputKind=SimpleNamespace(DELTA="delta", FINAL_ONLY="final"),
                               SamplingParams=lambda **arguments: arguments)
    return vllm_engine.Engine(llm=None, sampling=sampling, lora_request=None, tokenizer=None, vocabulary=None,  # type: ignore[arg-type]
                              max_model_len=512, vocab_size=16, sampling_defaults=defaults, samples_by_default=samples)


def test_unset_sampling_settings_are_the_model_s_and_greedy_without_do_sample() -> None:
    """vLLM's engine sampled at temperature 1 over every token where a request left the settings unset; the model's
    generation config decides, by Transformers' rule (no ``do_sample``: greedy)."""
    from inference._core.validation import GenerationRequest

    unset, hot = GenerationRequest("Hi", "m"), GenerationRequest("Hi", "m", temperature=0.9, top_k=5)
    plain = vllm_engine.sampling_params(_engine({}, samples=False), unset, 3, stream=False)
    assert plain["temperature"] == 0.0
    model = _engine({"temperature": 0.7, "top_k": 1, "top_p": 0.8, "repetition_penalty": 1.1}, samples=True)
    sampled = vllm_engine.sampling_params(model, unset, 3, stream=False)
    assert (sampled["temperature"], sampled["top_k"], sampled["top_p"], sampled["repetition_penalty"]) == (
        0.7, 1, 0.8, 1.1)
    chosen = vllm_engine.sampling_params(model, hot, 3, stream=False)
    assert (chosen["temperature"], chosen["top_k"], chosen["top_p"]) == (0.9, 5, 0.8)
    greedy = vllm_engine.sampling_params(_engine({"repetition_penalty": 1.1}, samples=False), unset, 3, stream=False)
    assert greedy["temperature"] == 0.0 and greedy["repetition_penalty"] == 1.1  # as Transformers' greedy rows


@pytest.mark.asyncio
async def test_an_adapter_with_nan_weights_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    """vLLM registered NaN weights, and once such an adapter had held a slot, other adapters answered garbage."""
    import json

    import numpy
    from safetensors.numpy import save_file

    from inference.exceptions import InvalidAdapterError

    adapter = tmp_path / "nan"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "bias": "none"}))
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": numpy.zeros((2, 8), numpy.float32),
               name: numpy.full((8, 2), numpy.nan, numpy.float32)}, str(adapter / "adapter_model.safetensors"))
    provider = VLLMOfflineProvider(model_name=str(tmp_path / "no-model"))
    with pytest.raises(InvalidAdapterError, match=f"NaN or infinite values in {name}"):
        await provider.load_adapter("nan", adapter)
    assert await provider.list_adapters() == []
    await provider.aclose()
