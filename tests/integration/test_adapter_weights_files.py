"""What AdapterWeights leave on disk: a training loop that loads new weights every step must not fill it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from inference import AdapterWeights
from inference.llamacpp_provider import LlamaCppProvider

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def weights_of(directory: Path) -> AdapterWeights:
    import json

    from safetensors.torch import load_file

    config = json.loads((directory / "adapter_config.json").read_text())
    return AdapterWeights(load_file(str(directory / "adapter_model.safetensors")), config)


async def test_50_loads_and_replacements_of_weights_leave_a_bounded_number_of_files(
    tiny_models: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["qwen2"]
    scratch, cache = tmp_path / "tmp", tmp_path / "cache"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the private PEFT directories are written
    steps = [weights_of(model.adapter_dirs[name]) for name in ("a0", "a1", "a2")]
    async with LlamaCppProvider(model.gguf_path, n_ctx=256, kv_cache_type="f32", adapter_cache_dir=cache) as provider:
        for step in range(50):  # identical weights again and again (a0, a1, a2, a0...), as a loop may give
            await provider.load_adapter("step", steps[step % 3], replace=step > 0)
            if step % 10 == 0:
                await provider.load_adapter("once", steps[1])  # another id, loaded and unloaded
                await provider.generate("hi", model="tiny", adapter_id="once", max_tokens=2, temperature=0)
                await provider.unload_adapter("once")
            answer = await provider.generate("hi", model="tiny", adapter_id="step", max_tokens=2, temperature=0)
            assert answer.adapter_id == "step"
            files = sorted(path.relative_to(tmp_path).parts[0] for path in tmp_path.rglob("*") if path.is_file())
            assert files.count("cache") == 0  # nothing of weights from memory in the cache of converted files
            # the one live adapter's private directory: its PEFT files, its converted GGUF and the GGUF's use stamp
            assert files.count("tmp") == 4, sorted(tmp_path.rglob("*"))
    assert list(scratch.iterdir()) == []  # closing removed the last one
    assert not cache.exists() or list(cache.iterdir()) == []
