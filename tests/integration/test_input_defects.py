"""Defects of issue 9 on the real pieces: conversion paths, the CLI, adapters for another base, path spellings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from inference.adapters.gguf import convert_peft_to_gguf, convert_peft_to_gguf_cached
from inference.adapters.peft import base_model_type, check_base_model, read_peft_adapter
from inference.cli import main
from inference.exceptions import AdapterConversionError, ConfigurationError, InvalidAdapterError
from inference.testing.tiny_models import TinyModel

pytestmark = pytest.mark.integration


def _relabelled(adapter: Path, destination: Path, base: str) -> Path:
    """A copy of ``adapter`` whose adapter_config.json names ``base`` as the model it was trained on."""
    shutil.copytree(adapter, destination)
    config_path = destination / "adapter_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config_path.write_text(json.dumps({**config, "base_model_name_or_path": base}), encoding="utf-8")
    return destination


# Where converted adapters go -------------------------------------------------------------------------------


def test_convert_adapter_into_a_directory_that_cannot_exist_exits_1_naming_it(
    tiny_models: dict[str, TinyModel], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_models["qwen2"]
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    output = blocker / "out" / "a0.gguf"
    code = main(["convert-adapter", str(model.adapter_dirs["a0"]), "--base", str(model.gguf_path), "-o", str(output)])
    captured = capsys.readouterr()
    assert code == 1
    assert f"output directory {output.parent} cannot be created: {blocker} is not a directory" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_conversion_into_a_file_that_is_in_the_way_is_a_typed_error(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    model = tiny_models["qwen2"]
    blocker = tmp_path / "cache"
    blocker.write_text("x")
    with pytest.raises(ConfigurationError) as caught:
        convert_peft_to_gguf_cached(model.adapter_dirs["a0"], model.gguf_path, blocker)
    assert caught.value.path == str(blocker) and "exists but is not a directory" in str(caught.value)
    with pytest.raises(ConfigurationError, match=f"output directory {blocker} exists but is not a directory"):
        convert_peft_to_gguf(model.adapter_dirs["a0"], model.gguf_path, blocker / "a0.gguf")


def test_a_tilde_in_conversion_paths_is_expanded(
    tiny_models: dict[str, TinyModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["qwen2"]
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    shutil.copytree(model.adapter_dirs["a0"], home / "a0")
    shutil.copy(model.gguf_path, home / "base.gguf")
    cached = convert_peft_to_gguf_cached("~/a0", "~/base.gguf", "~/.cache/adapters")
    assert cached.parent == home / ".cache" / "adapters" and cached.is_file()
    single = convert_peft_to_gguf("~/a0", "~/base.gguf", "~/out/a0.gguf")
    assert single == home / "out" / "a0.gguf" and single.is_file()
    assert not (work / "~").exists()



def test_a_conversion_never_writes_over_its_inputs(
    tiny_models: dict[str, TinyModel], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_models["qwen2"]
    base, adapter = tmp_path / "base.gguf", tmp_path / "a0"
    shutil.copy(model.gguf_path, base)
    shutil.copytree(model.adapter_dirs["a0"], adapter)
    before = {path: path.read_bytes() for path in (base, *adapter.iterdir())}
    with pytest.raises(AdapterConversionError, match="is the base model"):
        convert_peft_to_gguf(adapter, base, tmp_path / "." / "base.gguf")
    with pytest.raises(AdapterConversionError, match="is a file of the adapter directory"):
        convert_peft_to_gguf(adapter, base, adapter / "adapter_model.safetensors")
    assert main(["convert-adapter", str(adapter), "--base", str(base), "-o", str(base)]) != 0
    assert "is the base model" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in before} == before  # nothing was replaced
    assert convert_peft_to_gguf(adapter, base, adapter / "a0.gguf").is_file()  # a new file beside them is fine

# An adapter trained for another base -----------------------------------------------------------------------


def test_the_tiny_adapters_name_their_base_and_its_architecture_is_read(tiny_models: dict[str, TinyModel]) -> None:
    for arch, model in tiny_models.items():
        adapter = read_peft_adapter(model.adapter_dirs["a0"])
        assert base_model_type(adapter) == arch
        check_base_model(adapter, model_name=model.hf_dir, model_type=arch)


def test_a_llama_adapter_is_not_converted_for_a_qwen2_base_even_when_shapes_match(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    qwen2, llama = tiny_models["qwen2"], tiny_models["llama"]
    with pytest.raises(InvalidAdapterError) as caught:
        convert_peft_to_gguf(llama.adapter_dirs["a0"], qwen2.gguf_path, tmp_path / "out.gguf")
    assert "a llama model" in str(caught.value) and "is a qwen2 model" in str(caught.value)
    assert not (tmp_path / "out.gguf").exists()
    # A base given as a GGUF file is read the same way.
    relabelled = _relabelled(llama.adapter_dirs["a0"], tmp_path / "by-gguf", str(llama.gguf_path))
    with pytest.raises(InvalidAdapterError, match="a llama model"):
        convert_peft_to_gguf_cached(relabelled, qwen2.gguf_path, tmp_path / "cache")


async def test_llamacpp_refuses_a_peft_adapter_for_another_architecture(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    pytest.importorskip("llama_cpp")
    from inference.llamacpp_provider import LlamaCppProvider

    qwen2, llama = tiny_models["qwen2"], tiny_models["llama"]
    async with LlamaCppProvider(qwen2.gguf_path, n_ctx=256, adapter_cache_dir=tmp_path / "cache") as provider:
        with pytest.raises(InvalidAdapterError, match="is a qwen2 model"):
            await provider.load_adapter("other", llama.adapter_dirs["a0"])
        assert await provider.list_adapters() == []



async def test_transformers_refuses_a_peft_adapter_for_another_architecture_from_a_directory_or_memory(
    tiny_models: dict[str, TinyModel],
) -> None:
    """The same refusal as llama.cpp's: the tiny llama's adapter has the tiny qwen2's shapes and would load."""
    pytest.importorskip("peft")
    from safetensors.numpy import load_file

    from inference.adapters.weights import AdapterWeights
    from inference.transformers_provider import TransformersProvider

    qwen2, llama = tiny_models["qwen2"], tiny_models["llama"]
    other = llama.adapter_dirs["a0"]
    weights = AdapterWeights(
        load_file(str(other / "adapter_model.safetensors")), json.loads((other / "adapter_config.json").read_text())
    )
    async with TransformersProvider(model_name=str(qwen2.hf_dir), device="cpu") as provider:
        for source in (other, weights):
            with pytest.raises(InvalidAdapterError, match="a llama model, but the loaded model tiny-qwen2 is a qwen2"):
                await provider.load_adapter("other", source)
        assert await provider.list_adapters() == []
        await provider.load_adapter("mine", qwen2.adapter_dirs["a0"])  # its own still loads
        assert await provider.list_adapters() == ["mine"]

def test_the_transformers_model_type_is_what_check_base_model_compares(tiny_models: dict[str, TinyModel]) -> None:
    transformers = pytest.importorskip("transformers")
    qwen2, llama = tiny_models["qwen2"], tiny_models["llama"]
    loaded_type = transformers.AutoConfig.from_pretrained(str(qwen2.hf_dir)).model_type
    with pytest.raises(InvalidAdapterError, match="is a qwen2 model"):
        check_base_model(read_peft_adapter(llama.adapter_dirs["a0"]), model_name=qwen2.hf_dir, model_type=loaded_type)


# One adapter path, however it is written --------------------------------------------------------------------


async def test_llamacpp_loads_the_same_path_with_a_trailing_slash_once(
    tiny_models: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("llama_cpp")
    from inference.llamacpp_provider import LlamaCppProvider

    model = tiny_models["qwen2"]
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(model.adapter_dirs["a0"], tmp_path / "a0")
    async with LlamaCppProvider(model.gguf_path, n_ctx=256, adapter_cache_dir="~/cache") as provider:
        assert provider.adapter_cache_dir == tmp_path / "cache"
        await provider.load_adapter("a0", "~/a0")
        await provider.load_adapter("a0", f"{tmp_path}/a0/")
        await provider.load_adapter("a0", tmp_path / "a0")
        assert await provider.list_adapters() == ["a0"]
        assert len(list((tmp_path / "cache").glob("*.gguf"))) == 1
