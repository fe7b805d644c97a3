"""What the ``vllm-offline`` provider decides without vLLM's engine: health after a failed start, and the adapter
checks made before the engine registers an adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference._inprocess import vllm_engine
from inference.exceptions import ModelLoadError
from inference.vllm_offline_provider import VLLMOfflineProvider

pytestmark = pytest.mark.asyncio


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
