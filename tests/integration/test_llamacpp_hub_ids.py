"""llama.cpp models by Hugging Face Hub id (``ORG/NAME:FILE.gguf``), resolved offline from a Hugging Face cache laid
out as a download leaves it (``models--ORG--NAME/snapshots/REV/FILE.gguf`` and ``refs/main``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from inference.exceptions import ModelLoadError
from inference.llamacpp_provider import LlamaCppProvider

pytestmark = pytest.mark.integration
pytest.importorskip("llama_cpp")
constants = pytest.importorskip("huggingface_hub.constants")

REVISION = "0123456789abcdef0123456789abcdef01234567"
GREEDY: dict[str, Any] = {"model": "", "max_tokens": 8, "temperature": 0}


@pytest.fixture
def hub_cache(tiny_models: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny Qwen2 GGUF as ``tiny-org/tiny-qwen2-gguf``'s ``model-f32.gguf`` in an offline Hugging Face cache."""
    repo = tmp_path / "hub" / "models--tiny-org--tiny-qwen2-gguf"
    (repo / "snapshots" / REVISION).mkdir(parents=True)
    shutil.copyfile(tiny_models["qwen2"].gguf_path, repo / "snapshots" / REVISION / "model-f32.gguf")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # no relative path of the id's name exists
    return repo


async def test_a_hub_gguf_loads_offline_from_the_cache_and_answers_as_the_file(
    tiny_models: dict[str, Any], hub_cache: Path
) -> None:
    """``ORG/NAME:FILE.gguf`` reads the cached file (as Llama.from_pretrained does) and gives the text the file
    gives, with a PEFT adapter converted against it too."""
    model = tiny_models["qwen2"]
    options: dict[str, Any] = {"n_ctx": 256, "kv_cache_type": "f32", "adapter_cache_dir": hub_cache.parent / "cache"}
    async with LlamaCppProvider(model.gguf_path, **options) as local:
        await local.load_adapter("a0", model.adapter_dirs["a0"])
        expected = [(await local.generate("Hello", adapter_id=a, **GREEDY)).text for a in (None, "a0")]
    async with LlamaCppProvider("tiny-org/tiny-qwen2-gguf:model-f32.gguf", **options) as hub:
        assert hub.model_name == "model-f32"
        assert (await hub.health()).status == "up"
        await hub.load_adapter("a0", model.adapter_dirs["a0"])
        answers = [await hub.generate("Hello", adapter_id=a, **GREEDY) for a in (None, "a0")]
    assert [answer.text for answer in answers] == expected
    assert answers[0].completion_tokens > 0


async def test_a_hub_gguf_not_in_the_cache_is_a_model_load_error_saying_so(hub_cache: Path) -> None:
    for missing in ("tiny-org/tiny-qwen2-gguf:model-q4.gguf", "other-org/other:model.gguf"):
        async with LlamaCppProvider(missing, n_ctx=256) as provider:
            with pytest.raises(ModelLoadError, match=r"not in the local Hugging Face cache.*HF_HUB_OFFLINE"):
                await provider.generate("Hello", **GREEDY)
    async with LlamaCppProvider("tiny-org/tiny-qwen2-gguf", n_ctx=256) as provider:  # no file named
        with pytest.raises(ModelLoadError, match=r"ORG/NAME:FILE\.gguf"):
            await provider.generate("Hello", **GREEDY)
