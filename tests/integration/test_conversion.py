"""PEFT -> GGUF LoRA conversion, checked against the real thing: llama.cpp's logits equal PEFT's.

The Llama case is the proof of the q/k row permutation: without it the adapter loads and is silently wrong
(a negative control below shows the comparison would catch that).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from inference.adapters import gguf as gguf_conversion
from inference.adapters import gguf_tensors
from inference.adapters.gguf import convert_peft_to_gguf, convert_peft_to_gguf_cached, read_base_layout
from inference.exceptions import AdapterConversionError, InvalidAdapterError
from inference.testing.random_lora import write_random_peft_lora
from inference.testing.tiny_models import ADAPTER_NAMES, TinyModel

pytestmark = [
    pytest.mark.integration,
    # PEFT 0.21 calls a transformers 5 property that is deprecated.
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

ARCHS = ("qwen2", "llama")
TEXT = "The quick brown fox jumps over the lazy dog."


def _llama(model: TinyModel, lora_path: Path | None = None) -> Any:
    from llama_cpp import Llama

    return Llama(
        model_path=str(model.gguf_path),
        lora_path=None if lora_path is None else str(lora_path),
        logits_all=True,
        type_k=0,
        type_v=0,
        n_ctx=64,
        verbose=False,
    )


def _llama_logits(model: TinyModel, ids: list[int], lora_path: Path | None = None) -> Any:
    import numpy as np

    llm = _llama(model, lora_path)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)])
    finally:
        llm.close()


def _peft_logits(model: TinyModel, ids: list[int], adapter_dir: Path) -> Any:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model.hf_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        return peft_model(torch.tensor([ids])).logits[0].numpy()


def _ids(model: TinyModel) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(model.hf_dir)(TEXT)["input_ids"])


@pytest.fixture
def adapter_copy(tiny_models: dict[str, TinyModel], tmp_path: Path) -> Iterator[Path]:
    """A writable copy of the qwen2 adapter a0, to be broken by a test."""
    copy = tmp_path / "adapter"
    shutil.copytree(tiny_models["qwen2"].adapter_dirs["a0"], copy)
    yield copy


def _edit_config(adapter_dir: Path, **changes: Any) -> None:
    path = adapter_dir / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _write_weights(adapter_dir: Path, tensors: dict[str, Any]) -> None:
    from safetensors.numpy import save_file

    save_file(tensors, str(adapter_dir / "adapter_model.safetensors"))


@pytest.mark.parametrize("adapter", ADAPTER_NAMES)
@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_with_the_converted_lora_matches_peft(
    arch: str, adapter: str, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    import numpy as np

    model = tiny_models[arch]
    converted = convert_peft_to_gguf(model.adapter_dirs[adapter], model.gguf_path, tmp_path / "lora.gguf")
    assert converted == tmp_path / "lora.gguf"
    ids = _ids(model)
    expected = _peft_logits(model, ids, model.adapter_dirs[adapter])
    got = _llama_logits(model, ids, converted)
    np.testing.assert_allclose(got, expected, atol=1e-3, rtol=0)
    # The adapter really acts: base and adapted logits are far apart.
    assert np.abs(_llama_logits(model, ids) - got).max() > 0.5


@pytest.mark.parametrize("arch", ARCHS)
def test_per_module_alphas_are_folded_into_lora_b_and_match_peft(
    arch: str, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """alpha_pattern (one alpha per module, which a GGUF LoRA cannot hold) is folded into each module's lora_B."""
    import numpy as np

    model = tiny_models[arch]
    adapter = tmp_path / "alpha-pattern"
    shutil.copytree(model.adapter_dirs["a0"], adapter)
    targets = json.loads((adapter / "adapter_config.json").read_text())["target_modules"]
    _edit_config(adapter, alpha_pattern={sorted(targets)[0]: 64, "layers.0.self_attn." + sorted(targets)[-1]: 2})
    converted = convert_peft_to_gguf(adapter, model.gguf_path, tmp_path / "alpha-pattern.gguf")
    ids = _ids(model)
    expected = _peft_logits(model, ids, adapter)
    np.testing.assert_allclose(_llama_logits(model, ids, converted), expected, atol=1e-3, rtol=0)
    # The pattern matters: PEFT's logits without it are far from these.
    assert np.abs(_peft_logits(model, ids, model.adapter_dirs["a0"]) - expected).max() > 1e-2


def test_without_the_llama_permutation_the_adapter_is_wrong(
    tiny_models: dict[str, TinyModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the comparison above would catch a missing q/k permutation."""
    import numpy as np

    model = tiny_models["llama"]
    monkeypatch.setattr(gguf_tensors, "_PERMUTED_ARCHITECTURES", frozenset())
    converted = convert_peft_to_gguf(model.adapter_dirs["a0"], model.gguf_path, tmp_path / "unpermuted.gguf")
    ids = _ids(model)
    expected = _peft_logits(model, ids, model.adapter_dirs["a0"])
    assert np.abs(_llama_logits(model, ids, converted) - expected).max() > 1e-2


def test_the_output_is_a_gguf_lora_for_the_base_architecture(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    import gguf

    model = tiny_models["llama"]
    converted = convert_peft_to_gguf(model.adapter_dirs["a1"], model.gguf_path, tmp_path / "sub" / "a1.gguf")
    reader = gguf.GGUFReader(converted)
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["adapter.lora.alpha"].contents() == 16.0
    shapes = {tensor.name: tuple(int(d) for d in reversed(tensor.shape)) for tensor in reader.tensors}
    assert shapes["blk.0.attn_q.weight.lora_a"] == (8, 64)
    assert shapes["blk.0.attn_q.weight.lora_b"] == (64, 8)
    assert shapes["blk.1.ffn_down.weight.lora_a"] == (8, 128)
    assert len(shapes) == 2 * 7 * 2  # A and B, 7 modules, 2 blocks
    assert {tensor.tensor_type for tensor in reader.tensors} == {gguf.GGMLQuantizationType.F32}
    assert [p.name for p in converted.parent.iterdir()] == ["a1.gguf"]  # no temporary file left


def test_the_content_digest_is_the_adapters_whatever_its_directory_is_named(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """The file names the directory it came from (``general.name``), so the same adapter's files differ; what
    llama-server's provider compares is the adapter: its tensors and meaningful metadata."""
    import hashlib

    model = tiny_models["qwen2"]
    renamed = tmp_path / "run-0042"
    shutil.copytree(model.adapter_dirs["a0"], renamed)
    first = convert_peft_to_gguf(model.adapter_dirs["a0"], model.gguf_path, tmp_path / "first.gguf")
    second = convert_peft_to_gguf(renamed, model.gguf_path, tmp_path / "second.gguf")
    other = convert_peft_to_gguf(model.adapter_dirs["a1"], model.gguf_path, tmp_path / "other.gguf")
    assert hashlib.sha256(first.read_bytes()).digest() != hashlib.sha256(second.read_bytes()).digest()
    digest = gguf_conversion.lora_content_digest
    assert digest(first, provider="llamacpp") == digest(second, provider="llamacpp")
    assert digest(first, provider="llamacpp") != digest(other, provider="llamacpp")


def test_read_base_layout_reads_the_header(tiny_models: dict[str, TinyModel]) -> None:
    layout = read_base_layout(tiny_models["llama"].gguf_path)
    assert (layout.architecture, layout.block_count, layout.head_count, layout.head_count_kv) == ("llama", 2, 4, 2)
    assert layout.tensor_shapes["token_embd.weight"] == (512, 64)
    assert layout.tensor_shapes["blk.1.attn_k.weight"] == (32, 64)


def test_the_cache_converts_once_per_adapter_and_base(
    tiny_models: dict[str, TinyModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adapter_copy: Path
) -> None:
    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    _edit_config(adapter_copy, base_model_name_or_path="")  # names no base, so another base is not refused
    first = convert_peft_to_gguf_cached(adapter_copy, model.gguf_path, cache)
    assert first.is_file()
    assert first.parent == cache

    def no_conversion(*args: object) -> None:
        raise AssertionError("converted again")

    with monkeypatch.context() as patch:
        patch.setattr(gguf_conversion, "gguf_lora_tensors", no_conversion)
        assert convert_peft_to_gguf_cached(adapter_copy, model.gguf_path, cache) == first
    # Another base (same shapes, other architecture) and changed weights each get their own file.
    other_base = convert_peft_to_gguf_cached(adapter_copy, tiny_models["llama"].gguf_path, cache)
    assert other_base != first
    shutil.copy(model.adapter_dirs["a1"] / "adapter_model.safetensors", adapter_copy)
    changed = convert_peft_to_gguf_cached(adapter_copy, model.gguf_path, cache)
    assert changed not in (first, other_base)
    assert len(list(cache.glob("*.gguf"))) == 3


def test_an_adapter_directory_with_a_long_name_converts_into_the_cache(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """A directory name of 250 characters (file systems allow 255) made a cached file name of 280 and a temporary
    one of 294: loading the adapter on llama.cpp, llama-server or Ollama failed with "File name too long" and a
    hint to check the cache directory's free space. The name is cut to its first 200 characters; the digest keeps
    two adapters apart, and a short name is kept whole."""
    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    converted = []
    for adapter, last in (("a0", "x"), ("a1", "y")):
        directory = tmp_path / ("a" * 249 + last)
        shutil.copytree(model.adapter_dirs[adapter], directory)
        converted.append(convert_peft_to_gguf_cached(directory, model.gguf_path, cache))
    assert converted[0] != converted[1] and all(path.is_file() for path in converted)
    assert all(re.fullmatch(r"a{200}-[0-9a-f]{24}\.gguf", path.name) for path in converted)
    short = convert_peft_to_gguf_cached(model.adapter_dirs["a0"], model.gguf_path, cache)
    assert re.fullmatch(r"a0-[0-9a-f]{24}\.gguf", short.name)


def test_dora_is_refused(adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    _edit_config(adapter_copy, use_dora=True)
    with pytest.raises(InvalidAdapterError, match="DoRA"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_a_save_during_a_conversion_never_leaves_a_cached_file_named_for_other_weights(
    tiny_models: dict[str, TinyModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adapter_copy: Path
) -> None:
    """A training loop saving into the adapter directory between the cache's digest and the conversion's read left a
    file named for a0's weights holding a1's; the cache is never pruned, so every later load of a0 got a1."""
    from inference.adapters.gguf import lora_content_digest

    model = tiny_models["qwen2"]
    weights = adapter_copy / "adapter_model.safetensors"
    a0_bytes, a1_bytes = weights.read_bytes(), (model.adapter_dirs["a1"] / "adapter_model.safetensors").read_bytes()
    expected = {
        name: lora_content_digest(convert_peft_to_gguf(path, model.gguf_path, tmp_path / f"{name}.gguf"), provider="t")
        for name, path in (("a0", adapter_copy), ("a1", model.adapter_dirs["a1"]))
    }
    original = gguf_conversion.gguf_lora_tensors

    def saved_meanwhile(*args: Any, **kwargs: Any) -> Any:
        weights.write_bytes(a1_bytes)  # the next step's save lands while the conversion starts
        return original(*args, **kwargs)

    cache = tmp_path / "cache"
    with monkeypatch.context() as patch:
        patch.setattr(gguf_conversion, "gguf_lora_tensors", saved_meanwhile)
        raced = convert_peft_to_gguf_cached(adapter_copy, model.gguf_path, cache)
    assert lora_content_digest(raced, provider="t") == expected["a0"]  # the weights it read are the ones it names
    for name, content in (("a0", a0_bytes), ("a1", a1_bytes)):  # later loads of each content get that content
        weights.write_bytes(content)
        cached = convert_peft_to_gguf_cached(adapter_copy, model.gguf_path, cache)
        assert lora_content_digest(cached, provider="t") == expected[name], name


def test_layer_replication_is_refused_naming_the_key(
    adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """The converted adapter applied to the original layers: 12.5 nats from PEFT, and convert-adapter exited 0."""
    _edit_config(adapter_copy, layer_replication=[[1, 2], [0, 1]])
    with pytest.raises(InvalidAdapterError, match=r"uses layer_replication \(PEFT builds a deeper model"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_trained_biases_are_refused(adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    _edit_config(adapter_copy, bias="all")
    with pytest.raises(InvalidAdapterError, match="bias"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")


def test_an_adapter_of_another_model_is_refused(
    adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    import numpy as np

    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    _write_weights(
        adapter_copy,
        {
            f"{prefix}.lora_A.weight": np.ones((8, 96), dtype=np.float32),
            f"{prefix}.lora_B.weight": np.ones((96, 8), dtype=np.float32),
        },
    )
    with pytest.raises(AdapterConversionError, match="trained for another model") as caught:
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")
    assert "model.layers.0.self_attn.q_proj" in str(caught.value)
    assert caught.value.path == str(adapter_copy)


def test_modules_the_base_lacks_are_named(
    adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    import numpy as np

    prefix = "base_model.model.model.layers.7.mlp.up_proj"  # the tiny model has 2 blocks
    _write_weights(
        adapter_copy,
        {
            f"{prefix}.lora_A.weight": np.ones((8, 64), dtype=np.float32),
            f"{prefix}.lora_B.weight": np.ones((128, 8), dtype=np.float32),
        },
    )
    with pytest.raises(AdapterConversionError, match=r"model\.layers\.7\.mlp\.up_proj \(blk\.7\.ffn_up\.weight\)"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")


def test_corrupt_weights_are_refused(adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    weights = adapter_copy / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(InvalidAdapterError, match="corrupt or truncated"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")
    weights.write_bytes(b"not a safetensors file at all")
    with pytest.raises(InvalidAdapterError, match="corrupt or truncated"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_a_missing_adapter_directory_is_refused(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    with pytest.raises(InvalidAdapterError, match="does not exist"):
        convert_peft_to_gguf(tmp_path / "nowhere", tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")


def test_a_missing_or_broken_base_model_is_refused(adapter_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(AdapterConversionError, match="does not exist"):
        convert_peft_to_gguf(adapter_copy, tmp_path / "missing.gguf", tmp_path / "out.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(AdapterConversionError, match="not a readable GGUF file"):
        convert_peft_to_gguf(adapter_copy, broken, tmp_path / "out.gguf")


def test_an_architecture_without_a_tensor_map_is_refused(adapter_copy: Path, tmp_path: Path) -> None:
    import gguf
    import numpy as np

    base = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(base, "nonesuch")
    writer.add_block_count(2)
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(AdapterConversionError, match="no tensor name map for the architecture 'nonesuch'"):
        convert_peft_to_gguf(adapter_copy, base, tmp_path / "out.gguf")


def _write_base(path: Path, shape: tuple[int, int]) -> None:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_tensor("blk.0.attn_q.weight", np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_base_model_replaced_by_a_file_of_the_same_size_and_time_is_read_again(tmp_path: Path) -> None:
    """Its header was cached by size and mtime only: a model swapped in with ``cp -p`` or ``rsync -t`` (same size,
    same time, other shapes) kept the old layout, and adapters were converted for the shapes it no longer has."""
    base, other = tmp_path / "base.gguf", tmp_path / "other.gguf"
    _write_base(base, (64, 32))
    _write_base(other, (32, 64))  # the same bytes, other shapes
    assert base.stat().st_size == other.stat().st_size
    assert read_base_layout(base).tensor_shapes["blk.0.attn_q.weight"] == (64, 32)
    times = base.stat()
    os.utime(other, ns=(times.st_atime_ns, times.st_mtime_ns))
    os.replace(other, base)
    assert (base.stat().st_size, base.stat().st_mtime_ns) == (times.st_size, times.st_mtime_ns)
    assert read_base_layout(base).tensor_shapes["blk.0.attn_q.weight"] == (32, 64)


def test_a_random_lora_for_any_gguf_round_trips_through_llama_cpp(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    import numpy as np

    model = tiny_models["llama"]
    adapter_dir = write_random_peft_lora(
        model.gguf_path, tmp_path / "random", targets=("q_proj", "k_proj", "down_proj"), seed=3, std=0.3
    )
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (8, 16, ["down_proj", "k_proj", "q_proj"])
    # Same seed, same adapter.
    again = write_random_peft_lora(
        model.gguf_path, tmp_path / "again", targets=("q_proj", "k_proj", "down_proj"), seed=3, std=0.3
    )
    same = (adapter_dir / "adapter_model.safetensors").read_bytes()
    assert (again / "adapter_model.safetensors").read_bytes() == same
    converted = convert_peft_to_gguf(adapter_dir, model.gguf_path, tmp_path / "random.gguf")
    ids = _ids(model)
    adapted = _llama_logits(model, ids, converted)
    assert np.abs(adapted - _llama_logits(model, ids)).max() > 0.5
    # PEFT reads the same directory and agrees with llama.cpp.
    np.testing.assert_allclose(adapted, _peft_logits(model, ids, adapter_dir), atol=1e-3, rtol=0)


def test_a_random_lora_refuses_unknown_targets(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    with pytest.raises(InvalidAdapterError, match="unknown LoRA targets"):
        write_random_peft_lora(tiny_models["llama"].gguf_path, tmp_path / "x", targets=("wq",))


# Converting against a layout given directly (the base's GGUF file is elsewhere, e.g. on an Ollama server) ---


def _header_metadata(gguf_path: Path) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """Metadata and tensor shapes (GGUF order) as Ollama's /api/show reports them for this file."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(gguf_path)
    fields = {
        key: ([] if field.types[0] == GGUFValueType.ARRAY else field.contents())
        for key, field in reader.fields.items()
        if not key.startswith("GGUF.")
    }
    return fields, {tensor.name: [int(d) for d in tensor.shape] for tensor in reader.tensors}


@pytest.mark.parametrize("arch", ARCHS)
def test_a_layout_from_metadata_converts_exactly_like_the_file(
    tiny_models: dict[str, TinyModel], tmp_path: Path, arch: str
) -> None:
    model = tiny_models[arch]
    fields, shapes = _header_metadata(model.gguf_path)
    layout = gguf_conversion.layout_from_metadata("tiny:latest", fields, shapes, provider="ollama")
    from_file = read_base_layout(model.gguf_path)
    assert layout.tensor_shapes == from_file.tensor_shapes and layout.fingerprint() == from_file.fingerprint()
    assert (layout.head_count, layout.head_count_kv, layout.display_name) == (4, 2, "tiny:latest")
    direct = convert_peft_to_gguf(model.adapter_dirs["a1"], model.gguf_path, tmp_path / "direct.gguf")
    given = gguf_conversion.convert_peft_to_gguf_for_layout(model.adapter_dirs["a1"], layout, tmp_path / "given.gguf")
    assert given.read_bytes() == direct.read_bytes()  # llama's q/k permutation included
    # The cache is shared: the same adapter and layout, from a file or from metadata, is one cached file.
    cache = tmp_path / "cache"
    cached = convert_peft_to_gguf_cached(model.adapter_dirs["a1"], model.gguf_path, cache)
    assert gguf_conversion.convert_peft_to_gguf_for_layout_cached(model.adapter_dirs["a1"], layout, cache) == cached
    assert len(list(cache.glob("*.gguf"))) == 1


def test_a_layout_from_metadata_refuses_what_it_cannot_use(tiny_models: dict[str, TinyModel]) -> None:
    fields, shapes = _header_metadata(tiny_models["qwen2"].gguf_path)
    with pytest.raises(AdapterConversionError, match=r"base model m:1 has no general\.architecture") as caught:
        gguf_conversion.layout_from_metadata("m:1", {}, shapes, provider="ollama")
    assert caught.value.provider == "ollama"
    with pytest.raises(AdapterConversionError, match=r"qwen2\.block_count"):
        gguf_conversion.layout_from_metadata("m:1", {"general.architecture": "qwen2"}, shapes)
    with pytest.raises(AdapterConversionError, match="not a list of sizes"):
        gguf_conversion.layout_from_metadata("m:1", fields, {"blk.0.attn_q.weight": None})  # type: ignore[dict-item]


def test_a_layout_of_another_model_names_the_base_and_the_provider(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    fields, shapes = _header_metadata(tiny_models["qwen2"].gguf_path)
    shapes["blk.0.attn_q.weight"] = [128, 128]
    layout = gguf_conversion.layout_from_metadata("qwen9:7b", fields, shapes, provider="ollama")
    with pytest.raises(AdapterConversionError, match=r"for base model qwen9:7b .*trained for another model") as caught:
        gguf_conversion.convert_peft_to_gguf_for_layout(
            tiny_models["qwen2"].adapter_dirs["a0"], layout, tmp_path / "x.gguf", provider="ollama"
        )
    assert caught.value.provider == "ollama"
    assert not (tmp_path / "x.gguf").exists()


def test_read_lora_gguf_architecture(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    model = tiny_models["llama"]
    lora = convert_peft_to_gguf(model.adapter_dirs["a0"], model.gguf_path, tmp_path / "a0.gguf")
    assert gguf_conversion.read_lora_gguf_architecture(lora) == "llama"
    with pytest.raises(InvalidAdapterError, match="not a LoRA adapter"):
        gguf_conversion.read_lora_gguf_architecture(model.gguf_path)
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(InvalidAdapterError, match="not a readable GGUF file") as caught:
        gguf_conversion.read_lora_gguf_architecture(tmp_path / "text.gguf", provider="ollama")
    assert caught.value.provider == "ollama"


def test_a_deeply_nested_safetensors_header_is_refused_as_corrupt(
    adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    header = b"[" * 100_000 + b"]" * 100_000
    (adapter_copy / "adapter_model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(InvalidAdapterError, match="nested too deeply"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")


@pytest.mark.parametrize(("value", "dtype"), [(float("nan"), "float32"), (float("inf"), "float16"), (1e39, "float64")])
def test_weights_that_are_not_finite_in_float32_are_refused(
    adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path, value: float, dtype: str
) -> None:
    """They would convert, load and answer with NaN logits (an empty text) on llama.cpp."""
    from safetensors.numpy import load_file

    tensors = {key: array.astype(dtype) for key, array in load_file(adapter_copy / "adapter_model.safetensors").items()}
    first = sorted(tensors)[0]
    tensors[first][0, 0] = value
    _write_weights(adapter_copy, tensors)
    with pytest.raises(InvalidAdapterError, match="NaN or infinite values") as caught:
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")
    assert first.removeprefix("base_model.model.").removesuffix(".lora_A.weight") in str(caught.value)
    assert not (tmp_path / "out.gguf").exists()


def test_an_alpha_that_float32_rounds_to_zero_is_refused(
    adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """llama.cpp reads alpha 0 as "no alpha / rank at all": the adapter would apply at full strength, not ~0."""
    _edit_config(adapter_copy, lora_alpha=1e-50)
    with pytest.raises(AdapterConversionError, match="PEFT would apply nothing"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")


@pytest.mark.parametrize(
    "config",
    [
        {"lora_alpha": -16},
        {"target_modules": ["q_proj"]},
        {"layers_to_transform": [1], "layers_pattern": "layers"},
        {"layers_to_transform": 0},
        {"exclude_modules": ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]},
        {"exclude_modules": r".*\.0\.mlp\..*"},
    ],
    ids=[
        "negative alpha",
        "weights of modules target_modules does not name",
        "weights of a layer layers_to_transform leaves out",
        "weights of layers other than the one layer number",
        "weights of modules exclude_modules names",
        "weights of modules an exclude_modules expression matches",
    ],
)
def test_what_peft_applies_of_an_unusual_config_llama_cpp_applies_too(
    config: dict[str, Any], tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """A negative alpha PEFT applies (it was refused as "would change nothing"); weights for modules the config does
    not select (target_modules, layers_to_transform, exclude_modules) PEFT ignores on load, where llama.cpp applied
    them (7.4 nats off for target_modules, 6 to 12 for the others)."""
    import numpy as np

    model = tiny_models["qwen2"]
    adapter = tmp_path / "unusual"
    shutil.copytree(model.adapter_dirs["a0"], adapter)
    _edit_config(adapter, **config)
    converted = convert_peft_to_gguf(adapter, model.gguf_path, tmp_path / "unusual.gguf")
    ids = _ids(model)
    expected = _peft_logits(model, ids, adapter)
    np.testing.assert_allclose(_llama_logits(model, ids, converted), expected, atol=1e-3, rtol=0)
    assert np.abs(_peft_logits(model, ids, model.adapter_dirs["a0"]) - expected).max() > 1e-2  # the config matters


def test_a_folded_scale_beyond_float32_is_refused(
    adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    _edit_config(adapter_copy, lora_alpha=1e-30, alpha_pattern={"q_proj": 3e38})
    with pytest.raises(AdapterConversionError, match="overflow float32"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_a_rank_that_pytorch_weights_do_not_have_is_refused(
    adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """A .bin file has no header to read first: its rank is checked once the converter has read it."""
    import torch
    from safetensors.torch import load_file

    weights = adapter_copy / "adapter_model.safetensors"
    torch.save(load_file(weights), adapter_copy / "adapter_model.bin")
    weights.unlink()
    _edit_config(adapter_copy, r=4)
    with pytest.raises(InvalidAdapterError, match=r"with rank 4 \(its r\)"):
        convert_peft_to_gguf(adapter_copy, tiny_models["qwen2"].gguf_path, tmp_path / "out.gguf")


def test_a_regex_target_string_converts_like_the_list_it_names(
    adapter_copy: Path, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    import gguf
    import numpy as np

    model = tiny_models["qwen2"]
    listed = convert_peft_to_gguf(adapter_copy, model.gguf_path, tmp_path / "listed.gguf")
    targets = json.loads((adapter_copy / "adapter_config.json").read_text())["target_modules"]
    _edit_config(adapter_copy, target_modules=rf".*\.({'|'.join(targets)})")
    pattern = convert_peft_to_gguf(adapter_copy, model.gguf_path, tmp_path / "pattern.gguf")
    first, second = gguf.GGUFReader(listed), gguf.GGUFReader(pattern)
    assert [t.name for t in first.tensors] == [t.name for t in second.tensors]
    for one, other in zip(first.tensors, second.tensors, strict=True):
        np.testing.assert_array_equal(one.data, other.data)


def test_a_gguf_header_with_arrays_nested_too_deep_is_not_readable(tmp_path: Path) -> None:
    import struct

    depth = 100_000
    nested = struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)  # array of array of ... of no uint32
    key = b"general.architecture"
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 9) + nested
    (tmp_path / "deep.gguf").write_bytes(body)
    with pytest.raises(InvalidAdapterError, match="nests arrays more than 16 deep"):
        gguf_conversion.read_lora_gguf_architecture(tmp_path / "deep.gguf")
