"""The tiny test models are faithful twins: same token ids, same logits in llama.cpp and transformers.

Every cross-backend test relies on this, so it is checked here with the real components.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from inference.testing.tiny_models import (
    ADAPTER_NAMES,
    BUILD_VERSION,
    CHATML_TEMPLATE,
    TinyModel,
    build_tiny_models,
)

pytestmark = [
    pytest.mark.integration,
    # PEFT 0.21 calls a transformers 5 property that is deprecated.
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

ARCHS = ("qwen2", "llama")
TEXTS = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'd say 12345 apples cost 7.25   each\n\nok?",
    "Résumé, café and naïve 🙂",
    "  leading spaces\tand tabs\r\nCRLF line",
    "They'll ask: WHO'S THERE?!",
)
PROMPT = "Once upon a time, the fisherman said"


def _llama(model: TinyModel, **kwargs: Any) -> Any:
    from llama_cpp import Llama

    return Llama(model_path=str(model.gguf_path), n_ctx=128, verbose=False, **kwargs)


@pytest.fixture(scope="module")
def llamas(tiny_models: dict[str, TinyModel]) -> Iterator[dict[str, Any]]:
    """One f32-cache llama.cpp context per architecture, with all logits kept."""
    contexts = {arch: _llama(tiny_models[arch], logits_all=True, type_k=0, type_v=0) for arch in ARCHS}
    yield contexts
    for context in contexts.values():
        context.close()


def _hf_logits(model: TinyModel, ids: list[int], adapter: str | None = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(model.hf_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        hf_model = PeftModel.from_pretrained(hf_model, model.adapter_dirs[adapter])
    hf_model.eval()
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].numpy()


def test_build_returns_both_architectures_with_existing_files(tiny_models: dict[str, TinyModel]) -> None:
    assert set(tiny_models) == set(ARCHS)
    for arch, model in tiny_models.items():
        assert model.arch == arch
        assert (model.hf_dir / "config.json").is_file()
        assert (model.hf_dir / "tokenizer.json").is_file()
        assert model.gguf_path.is_file()
        assert model.gguf_path.stem == model.hf_dir.name == f"tiny-{arch}"
        assert sorted(model.adapter_dirs) == list(ADAPTER_NAMES)
        for adapter_dir in model.adapter_dirs.values():
            assert (adapter_dir / "adapter_config.json").is_file()
            assert (adapter_dir / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_tokenises_like_the_hf_tokenizer(
    arch: str, tiny_models: dict[str, TinyModel], llamas: dict[str, Any]
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models[arch].hf_dir)
    llm = llamas[arch]
    for text in TEXTS:
        hf_ids = tokenizer(text)["input_ids"]
        # No BOS on either side, with llama.cpp's default add_bos behaviour.
        assert llm.tokenize(text.encode()) == hf_ids, text
        assert tokenizer.decode(hf_ids) == text
        assert llm.detokenize(hf_ids).decode() == text


def test_qwen2_has_the_same_chatml_template_in_both_forms(
    tiny_models: dict[str, TinyModel], llamas: dict[str, Any]
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["qwen2"].hf_dir)
    assert tokenizer.chat_template == CHATML_TEMPLATE
    assert llamas["qwen2"].metadata["tokenizer.chat_template"] == CHATML_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    # The special tokens of the rendered prompt are single ids in both tokenizers.
    hf_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert hf_ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert llamas["qwen2"].tokenize(rendered.encode(), add_bos=False, special=True) == hf_ids


def test_llama_has_no_chat_template(tiny_models: dict[str, TinyModel], llamas: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tiny_models["llama"].hf_dir).chat_template is None
    assert "tokenizer.chat_template" not in llamas["llama"].metadata


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_logits_equal_transformers_logits(
    arch: str, tiny_models: dict[str, TinyModel], llamas: dict[str, Any]
) -> None:
    import numpy as np

    llm = llamas[arch]
    ids = llm.tokenize(TEXTS[1].encode())
    expected = _hf_logits(tiny_models[arch], ids)
    llm.reset()
    llm.eval(ids)
    got = np.asarray(llm.scores[: len(ids)])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-3, rtol=0)
    # The logits have clear structure (not a flat random soup), so greedy picks are stable.
    assert float(np.abs(expected).max()) > 2.0


@pytest.mark.parametrize("arch", ARCHS)
def test_each_adapter_changes_the_greedy_next_token(arch: str, tiny_models: dict[str, TinyModel]) -> None:
    from transformers import AutoTokenizer

    model = tiny_models[arch]
    ids = AutoTokenizer.from_pretrained(model.hf_dir)(PROMPT)["input_ids"]
    first_tokens = {name: int(_hf_logits(model, ids, adapter=name)[-1].argmax()) for name in (None, *ADAPTER_NAMES)}
    assert len(set(first_tokens.values())) == len(first_tokens), first_tokens


def test_a_second_build_reuses_the_cache(tiny_models: dict[str, TinyModel]) -> None:
    first = tiny_models["qwen2"]
    stamp = first.gguf_path.stat().st_mtime_ns
    again = build_tiny_models(first.hf_dir.parents[2])
    assert again["qwen2"] == first
    assert first.gguf_path.stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_two_processes_building_at_once_leave_one_complete_cache(tmp_path: Path, repo_root: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from inference.testing.tiny_models import build_tiny_models;"
        "models = build_tiny_models(Path(sys.argv[1])); print(models['llama'].gguf_path)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=repo_root,
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert outputs[0][0] == outputs[1][0]
    assert Path(outputs[0][0].strip()).is_file()
    # Only the finished build remains: no staging directory is left behind.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".build.lock")) == [BUILD_VERSION]
