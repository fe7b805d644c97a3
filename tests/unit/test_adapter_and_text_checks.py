"""Inputs that used to escape as plain Python exceptions, or to load silently, get the SDK's typed errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from inference.adapters.peft import base_model_type, check_base_model, read_peft_adapter
from inference.exceptions import ConfigurationError, InvalidAdapterError, InvalidRequestError
from inference.fake_provider import FakeProvider

CONFIG: dict[str, Any] = {
    "peft_type": "LORA",
    "r": 4,
    "lora_alpha": 8,
    "target_modules": ["q_proj"],
    "bias": "none",
    "base_model_name_or_path": "Org/Some-Model-1B",
}


def adapter_dir(root: Path, **changes: Any) -> Path:
    directory = root / "adapter"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({**CONFIG, **changes}), encoding="utf-8")
    (directory / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return directory


def model_dir(root: Path, name: str, model_type: str) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    return directory


# Text that cannot be encoded as UTF-8 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        ({"prompt": "a\ud800b"}, "prompt holds '\\ud800' at position 1"),
        ({"prompt": "ok", "system_prompt": "be \udfff"}, "system_prompt holds '\\udfff' at position 3"),
        ({"prompt": "ok", "stop": ["end", "\ud800"]}, "stop[1] holds '\\ud800' at position 0"),
        ({"prompt": "ok", "stop": "x\ud800"}, "stop holds '\\ud800' at position 1"),
        ({"prompt": "ok", "model": "m\ud800"}, "model holds '\\ud800' at position 1"),
    ],
)
async def test_a_lone_surrogate_is_an_invalid_request_naming_the_argument_and_position(
    arguments: dict[str, Any], shown: str
) -> None:
    request = {"model": "m", **arguments}
    async with FakeProvider() as fake:
        with pytest.raises(InvalidRequestError) as caught:
            await fake.generate(**request)
        assert shown in str(caught.value) and "UTF-8" in str(caught.value)
        with pytest.raises(InvalidRequestError):
            async for _ in fake.stream(**request):
                pass
        [item] = await fake.generate_batch([request.pop("prompt")], **request)
        assert isinstance(item, InvalidRequestError)


# PEFT configs whose odd values used to raise TypeError -------------------------------------------------------


@pytest.mark.parametrize("targets", [5, {"q_proj": 1}, True])
def test_target_modules_of_another_type_are_an_invalid_adapter(tmp_path: Path, targets: Any) -> None:
    with pytest.raises(InvalidAdapterError, match="no usable target_modules"):
        read_peft_adapter(adapter_dir(tmp_path, target_modules=targets))


def test_a_non_finite_alpha_is_an_invalid_adapter(tmp_path: Path) -> None:
    directory = adapter_dir(tmp_path)
    (directory / "adapter_config.json").write_text(
        json.dumps(CONFIG).replace('"lora_alpha": 8', '"lora_alpha": NaN'), encoding="utf-8"
    )
    with pytest.raises(InvalidAdapterError, match="invalid lora_alpha=nan: expected a finite number"):
        read_peft_adapter(directory)


def test_a_tilde_in_the_adapter_path_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    directory = adapter_dir(tmp_path)
    assert read_peft_adapter("~/adapter").path == directory


# The base model an adapter names ---------------------------------------------------------------------------


def test_an_adapter_for_another_architecture_is_refused(tmp_path: Path) -> None:
    base = model_dir(tmp_path, "tiny-llama", "llama")
    adapter = read_peft_adapter(adapter_dir(tmp_path, base_model_name_or_path=str(base)))
    assert base_model_type(adapter) == "llama"
    with pytest.raises(InvalidAdapterError) as caught:
        check_base_model(adapter, model_name="/models/tiny-qwen2", model_type="qwen2", provider="transformers")
    message = str(caught.value)
    assert f"trained on {base}, a llama model" in message and "is a qwen2 model" in message
    assert "use an adapter trained for this base model" in message
    assert (caught.value.provider, caught.value.path) == ("transformers", str(adapter.path))


def test_architecture_names_of_transformers_and_gguf_are_compared_as_one(tmp_path: Path) -> None:
    base = model_dir(tmp_path, "gemma-3-270m", "gemma3_text")
    adapter = read_peft_adapter(adapter_dir(tmp_path, base_model_name_or_path=str(base)))
    check_base_model(adapter, model_name=None, model_type="gemma3")


def test_another_base_model_of_the_same_architecture_is_a_logged_warning_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = model_dir(tmp_path, "Model-A", "qwen2")
    adapter = read_peft_adapter(adapter_dir(tmp_path, base_model_name_or_path=str(base)))
    with caplog.at_level(logging.WARNING, logger="inference.adapters"):
        check_base_model(adapter, model_name=tmp_path / "Model-B", model_type="qwen2", provider="transformers")
        check_base_model(adapter, model_name=tmp_path / "Model-B", model_type="qwen2", provider="transformers")
    [record] = caplog.records
    assert f"was trained on {base}, but is being loaded on {tmp_path / 'Model-B'}" in record.getMessage()


@pytest.mark.parametrize("loaded", ["/models/some-model-1b", "/elsewhere/Some-Model-1B.gguf", "Org/Some-Model-1B/"])
def test_the_same_model_under_another_folder_is_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, loaded: str
) -> None:
    adapter = read_peft_adapter(adapter_dir(tmp_path))
    with caplog.at_level(logging.WARNING, logger="inference.adapters"):
        check_base_model(adapter, model_name=loaded, model_type="qwen2")
    assert caplog.records == []


def test_a_hub_id_is_looked_up_in_the_local_hugging_face_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    constants = pytest.importorskip("huggingface_hub.constants")
    snapshot = tmp_path / "hub" / "models--Org--Some-Model-1B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    (tmp_path / "hub" / "models--Org--Some-Model-1B" / "refs").mkdir()
    (tmp_path / "hub" / "models--Org--Some-Model-1B" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    adapter = read_peft_adapter(adapter_dir(tmp_path))
    assert base_model_type(adapter) == "llama"
    with pytest.raises(InvalidAdapterError, match="a llama model"):
        check_base_model(adapter, model_name=None, model_type="qwen2")


def test_an_unknown_base_is_not_refused(tmp_path: Path) -> None:
    adapter = read_peft_adapter(adapter_dir(tmp_path, base_model_name_or_path="Org/Not-Cached"))
    assert base_model_type(adapter) is None
    check_base_model(adapter, model_name=None, model_type="qwen2")
    blank = read_peft_adapter(adapter_dir(tmp_path / "blank", base_model_name_or_path=""))
    check_base_model(blank, model_name="/models/anything", model_type="qwen2")


# Where converted adapters are written ----------------------------------------------------------------------


def test_a_conversion_cache_dir_that_is_a_file_is_a_configuration_error(tmp_path: Path) -> None:
    from inference.adapters.gguf import BaseModelLayout, convert_peft_to_gguf_for_layout_cached

    layout = BaseModelLayout(Path("base"), "qwen2", 1, 2, 2, {}, name="base")
    a_file = tmp_path / "cache"
    a_file.write_text("x")
    adapter = adapter_dir(tmp_path, base_model_name_or_path="")
    for cache_dir in (a_file, a_file / "below"):
        with pytest.raises(ConfigurationError, match=rf"adapter cache directory {cache_dir} .*choose a directory"):
            convert_peft_to_gguf_for_layout_cached(adapter, layout, cache_dir)


async def test_an_unknown_adapter_among_thousands_names_a_few_of_them() -> None:
    from inference.exceptions import AdapterNotFoundError

    provider = FakeProvider()
    for number in range(2000):
        await provider.load_adapter(f"adapter-{number:04d}", f"/adapters/{number}")
    with pytest.raises(AdapterNotFoundError) as caught:
        await provider.generate("hi", model="m", adapter_id="missing")
    message = str(caught.value)
    assert "adapter-0000, adapter-0001" in message and "and 1995 more" in message and len(message) < 400
