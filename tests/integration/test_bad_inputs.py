"""A catalogue of bad inputs: each gets a typed error whose message says what to do, and the provider
keeps serving correctly afterwards. Runs on a real in-process provider (llama.cpp on the tiny Qwen2 model)
and on the factory; the server-side cases of vLLM and Ollama are pinned in their respx unit tests.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    ConfigurationError,
    InferenceError,
    InvalidAdapterError,
    InvalidRequestError,
    UnknownProviderError,
)
from inference.factory import get_provider
from inference.llamacpp_provider import LlamaCppProvider

pytestmark = pytest.mark.integration

Case = Callable[[LlamaCppProvider, dict[str, Any]], Awaitable[object]]


def _adapter_copy(source: Path, target: Path, **config_changes: Any) -> Path:
    shutil.copytree(source, target)
    config_path = target / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config.update(config_changes)
    config_path.write_text(json.dumps(config))
    return target


def _retargeted(source: Path, target: Path, old: str, new: str) -> Path:
    """A copy whose ``old`` modules are renamed ``new`` in the weights and the config (a module the model lacks)."""
    from safetensors.numpy import load_file, save_file

    _adapter_copy(source, target)
    config_path = target / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["target_modules"] = [new if name == old else name for name in config["target_modules"]]
    config_path.write_text(json.dumps(config))
    weights_path = str(target / "adapter_model.safetensors")
    save_file({key.replace(old, new): value for key, value in load_file(weights_path).items()}, weights_path)
    return target


def _nested_config(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    (target / "adapter_config.json").write_text("[" * 50_000 + "]" * 50_000)
    return target


def _corrupt_weights(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    (target / "adapter_model.safetensors").write_bytes(b"\x00\x01 not safetensors")
    return target


def _integer_gguf(source: Path, target: Path) -> Path:
    """A GGUF LoRA whose tensors are stored as I32 (llama.cpp took it, and its first generation killed the process)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, "qwen2")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 16.0)
    for tensor in reader.tensors:
        data = np.array(tensor.data).reshape(tuple(reversed(tensor.shape.tolist())))
        writer.add_tensor(tensor.name, data.view(np.int32), raw_dtype=gguf.GGMLQuantizationType.I32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def _overlapping_offsets(source: Path, target: Path) -> Path:
    """A copy whose safetensors tensors all point at the same bytes (garbage weights llama.cpp's converter took)."""
    _adapter_copy(source, target)
    weights = target / "adapter_model.safetensors"
    data = weights.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    for name, info in header.items():
        if name != "__metadata__":
            start, end = info["data_offsets"]
            info["data_offsets"] = [0, end - start]
    encoded = json.dumps(header).encode()
    weights.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + size :])
    return target


def _generate(**arguments: Any) -> Case:
    async def case(provider: LlamaCppProvider, _: dict[str, Any]) -> object:
        return await provider.generate(**{"prompt": "hello", "model": "tiny", "max_tokens": 4, **arguments})

    return case


def _load(path: Callable[[dict[str, Any]], Any], adapter_id: str = "bad") -> Case:
    async def case(provider: LlamaCppProvider, paths: dict[str, Any]) -> object:
        await provider.load_adapter(adapter_id, path(paths))
        return None

    return case


async def _unload_unknown(provider: LlamaCppProvider, _: dict[str, Any]) -> object:
    await provider.unload_adapter("never-loaded")
    return None


async def _same_id_other_path(provider: LlamaCppProvider, paths: dict[str, Any]) -> object:
    await provider.load_adapter("a0", paths["a0"])
    await provider.load_adapter("a0", paths["a1"])
    return None


CATALOGUE: list[tuple[str, Case, type[InferenceError], str]] = [
    ("prompt is a list of strings", _generate(prompt=["hi"]), InvalidRequestError, "must be a dict with 'role'"),
    ("prompt is None", _generate(prompt=None), InvalidRequestError, "prompt must be a string"),
    ("negative max_tokens", _generate(max_tokens=-1), InvalidRequestError, "positive integer"),
    ("zero max_tokens", _generate(max_tokens=0), InvalidRequestError, "positive integer"),
    ("temperature below 0", _generate(temperature=-0.5), InvalidRequestError, "temperature must be"),
    ("top_p above 1", _generate(top_p=1.5), InvalidRequestError, "top_p must be"),
    ("negative top_k", _generate(top_k=-3), InvalidRequestError, "top_k must be"),
    ("seed is text", _generate(seed="42"), InvalidRequestError, "seed must be an integer"),
    ("empty stop string", _generate(stop=[""]), InvalidRequestError, "stop must be"),
    ("prompt longer than the context", _generate(prompt="word " * 3000), InvalidRequestError, "context"),
    ("unknown adapter id at generation", _generate(adapter_id="nope"), AdapterNotFoundError, "load_adapter"),
    ("adapter id with a path separator", _generate(adapter_id="../a0"), InvalidRequestError, "no path separators"),
    ("adapter id with shell characters", _load(lambda p: p["a0"], "a0;rm -rf ~"), InvalidRequestError,
     "shell characters"),
    ("adapter path missing", _load(lambda p: p["tmp"] / "no-such-adapter"), InvalidAdapterError, "does not exist"),
    ("adapter path is an empty directory", _load(lambda p: p["empty_dir"]), InvalidAdapterError,
     "adapter_config.json"),
    ("adapter path is a text file", _load(lambda p: p["text_file"]), InvalidAdapterError, "GGUF"),
    ("corrupt adapter weights", _load(lambda p: p["corrupt"]), InvalidAdapterError, "corrupt"),
    ("DoRA adapter", _load(lambda p: p["dora"]), InvalidAdapterError, "DoRA"),
    ("adapter trained with biases", _load(lambda p: p["bias"]), InvalidAdapterError, "bias"),
    ("adapter targets a module the model lacks", _load(lambda p: p["missing_module"]), InvalidAdapterError,
     "mlp_fc9"),
    ("GGUF LoRA of another architecture", _load(lambda p: p["llama_gguf_lora"]), InvalidAdapterError, "llama"),
    ("lora_alpha beyond float32", _load(lambda p: p["alpha_1e39"]), InvalidAdapterError, "float32 can hold"),
    ("r that is not the weights' rank", _load(lambda p: p["huge_rank"]), InvalidAdapterError,
     "with rank 1099511627776"),
    ("rank_pattern with a bad regex", _load(lambda p: p["bad_pattern"]), InvalidAdapterError,
     "not a valid regular expression"),
    ("adapter_config.json nested too deeply", _load(lambda p: p["nested"]), InvalidAdapterError, "nested too deeply"),
    ("GGUF LoRA with integer tensors", _load(lambda p: p["integer_gguf"]), InvalidAdapterError, "of type I32"),
    ("safetensors tensors over the same bytes", _load(lambda p: p["overlapping"]), InvalidAdapterError,
     "overlaps the tensor before it"),
    ("target_modules that backtracks exponentially", _load(lambda p: p["regex_bomb"]), InvalidAdapterError,
     "repeats a repetition"),
    ("adapter scale beyond float32", _generate(adapter_id=("a0", 1e39)), InvalidRequestError, "float32 can hold"),
    ("same id, another path", _same_id_other_path, AdapterAlreadyLoadedError, "replace=True"),
    ("unload of an unknown id", _unload_unknown, AdapterNotFoundError, "not loaded"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(
    tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[LlamaCppProvider, dict[str, Any], str]]:
    from inference.adapters.gguf import convert_peft_to_gguf

    model, llama = tiny_models["qwen2"], tiny_models["llama"]
    tmp = tmp_path_factory.mktemp("bad-inputs")
    a0 = model.adapter_dirs["a0"]
    (tmp / "empty_dir").mkdir()
    (tmp / "notes.txt").write_text("this is not an adapter")
    paths: dict[str, Any] = {
        "tmp": tmp,
        "a0": a0,
        "a1": model.adapter_dirs["a1"],
        "empty_dir": tmp / "empty_dir",
        "text_file": tmp / "notes.txt",
        "corrupt": _corrupt_weights(a0, tmp / "corrupt"),
        "dora": _adapter_copy(a0, tmp / "dora", use_dora=True),
        "bias": _adapter_copy(a0, tmp / "bias", bias="all"),
        "alpha_1e39": _adapter_copy(a0, tmp / "alpha_1e39", lora_alpha=1e39),
        "huge_rank": _adapter_copy(a0, tmp / "huge_rank", r=2**40),
        "bad_pattern": _adapter_copy(a0, tmp / "bad_pattern", rank_pattern={"q_proj(": 4}),
        "nested": _nested_config(a0, tmp / "nested"),
        "missing_module": _retargeted(a0, tmp / "missing_module", "q_proj", "mlp_fc9"),
        "llama_gguf_lora": convert_peft_to_gguf(llama.adapter_dirs["a0"], llama.gguf_path, tmp / "llama-a0.gguf"),
        "overlapping": _overlapping_offsets(a0, tmp / "overlapping"),
        "regex_bomb": _adapter_copy(a0, tmp / "regex_bomb", target_modules="(.*.*)*X"),
    }
    paths["integer_gguf"] = _integer_gguf(
        convert_peft_to_gguf(a0, model.gguf_path, tmp / "a0.gguf"), tmp / "integer.gguf"
    )
    provider = LlamaCppProvider(model.gguf_path, n_ctx=512, adapter_cache_dir=tmp / "cache", kv_cache_type="f32")
    reference = (await provider.generate("hello", model="tiny", max_tokens=6, temperature=0.0)).text
    yield provider, paths, reference
    await provider.aclose()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("case", "error_type", "hint"), [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
async def test_bad_input_gets_a_typed_error_and_the_provider_keeps_working(
    setup: tuple[LlamaCppProvider, dict[str, Any], str], case: Case, error_type: type[InferenceError], hint: str
) -> None:
    provider, paths, reference = setup
    with pytest.raises(error_type) as caught:
        await case(provider, paths)
    assert hint in str(caught.value)
    assert str(caught.value)[0].islower() or str(caught.value)[0].isalpha()  # a sentence, not a repr
    after = await provider.generate("hello", model="tiny", max_tokens=6, temperature=0.0)
    assert after.text == reference
    for adapter_id in await provider.list_adapters():
        await provider.unload_adapter(adapter_id)


@pytest.mark.parametrize(
    ("call", "error_type", "hint"),
    [
        (lambda: get_provider("vllm", "localhost:8100/v1"), ConfigurationError, "scheme"),
        (lambda: get_provider("ollama", "127.0.0.1:11434"), ConfigurationError, "scheme"),
        (lambda: get_provider("tgi"), UnknownProviderError, "valid names are"),
        (lambda: get_provider("llamacpp"), ConfigurationError, "LLAMACPP_MODEL_PATH"),
    ],
    ids=["base URL without scheme", "Ollama URL without scheme", "unknown provider type", "no model path"],
)
def test_bad_configuration_gets_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, call: Callable[[], object], error_type: type[InferenceError], hint: str
) -> None:
    monkeypatch.delenv("LLAMACPP_MODEL_PATH", raising=False)
    with pytest.raises(error_type, match=hint):
        call()
