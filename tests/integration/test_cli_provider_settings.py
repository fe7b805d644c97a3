"""``--set`` reaches every provider setting, constructor options of llama.cpp included (issue 28, item 11).

``inference generate --provider llamacpp --set kv_cache_type=f32`` was a usage error: ``kv_cache_type`` was a
constructor-only option, so the command line could not ask for the f32 KV cache that makes llama.cpp's scores
match Transformers'.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference.cli import main

pytestmark = pytest.mark.integration
pytest.importorskip("llama_cpp")


def test_set_kv_cache_type_builds_the_provider_with_it(
    tiny_models: dict[str, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from inference.llamacpp_provider import LlamaCppProvider

    built: list[LlamaCppProvider] = []
    construct = LlamaCppProvider.__init__

    def recording(self: LlamaCppProvider, *args: Any, **kwargs: Any) -> None:
        construct(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(LlamaCppProvider, "__init__", recording)
    model = tiny_models["qwen2"]
    argv = [
        "generate", "Once upon a time", "--provider", "llamacpp", "--model-path", str(model.gguf_path),
        "--set", "kv_cache_type=f32", "--set", "n_threads=1", "--set", "flash_attn=false", "--set", "n_ctx=256",
        "--set", f"adapter_cache_dir={tmp_path}", "--max-tokens", "4", "--temperature", "0", "--json",
    ]
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 0, err
    assert json.loads(out)["completion_tokens"] == 4
    assert [(provider.kv_cache_type, provider._n_threads, provider._flash_attn) for provider in built] == [
        ("f32", 1, False)
    ]


def test_set_kv_cache_type_with_a_bad_value_is_a_usage_error_naming_the_choices(
    tiny_models: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_models["qwen2"]
    status = main(["generate", "Hi", "--provider", "llamacpp", "--model-path", str(model.gguf_path),
                   "--set", "kv_cache_type=f8"])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert "--set kv_cache_type='f8'" in err and "'f32', 'f16', 'q4_0', 'q8_0', 'bf16'" in err
