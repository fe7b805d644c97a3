"""A tiny Qwen2 that vLLM's CPU build can serve, with PEFT adapters, for the real-server tests.

vLLM's CPU attention refuses the tiny test models' head size of 16 (``Unsupported CPU attention
configuration: head_dim=16``), so this model has head size 64: hidden size 128, 2 query heads, 1 key/value head,
2 layers. It uses the tiny Qwen2's tokenizer and ChatML template (:mod:`inference.testing.tiny_models`), its
special tokens' output rows are zero (greedy decoding never ends a generation early), and it is built once,
deterministically, into the same cache.

Example:
    >>> from inference.testing.vllm_model import build_vllm_model
    >>> model = build_vllm_model()  # doctest: +SKIP
    >>> sorted(model.adapter_dirs)  # doctest: +SKIP
    ['a0', 'a1', 'a2']
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from inference.testing.tiny_models import (
    ADAPTER_NAMES,
    TinyModel,
    _build_lock,
    _write_adapter,
    build_tiny_models,
    default_cache_dir,
)

__all__ = [
    "SERVER_ENVIRONMENT", "VLLM_BUILD_VERSION", "build_vllm_model", "server_command", "vllm_environment",
    "without_chat_template",
]

SERVER_ENVIRONMENT = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
"""What a vLLM server for these models needs in its environment: runtime LoRA routes, 1 GiB of CPU KV cache."""

_ENGINE_MODE_VARIABLES = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V2_MODEL_RUNNER")


def vllm_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a vLLM child process, without the engine-mode variables a library set here.

    Importing genlm-backend writes ``VLLM_USE_V2_MODEL_RUNNER=1`` (and two more) into ``os.environ`` for its own
    in-process engine; inherited, they make vLLM's CPU build refuse to start ("Model Runner V2 requires Triton").
    """
    environment = {name: value for name, value in os.environ.items() if name not in _ENGINE_MODE_VARIABLES}
    return {**environment, **(extra or {})}


def server_command(python: str | Path, model_dir: str | Path, port: int, *, served_name: str = "tiny") -> list[str]:
    """The command line of a real vLLM server (the CPU build) for these models, with runtime LoRA, on 127.0.0.1.

    ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script looks up a distribution named
    ``vllm`` and fails with the CPU build), float32, a 512-token context, up to 4 adapters of rank 16 in a batch,
    the tokenizer-info route scoring uses, chat templates sent with a request (the option ``chat_template``),
    tool calls (a tool parser that needs no special tokens: the tiny tokenizer has none), and every token's logprob
    (``--max-logprobs -1``: full next-token distributions).
    """
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "512", "--enable-lora", "--max-lora-rank", "16", "--max-loras", "4",
        "--enable-tokenizer-info-endpoint", "--trust-request-chat-template",
        "--enable-auto-tool-choice", "--tool-call-parser", "pythonic", "--max-logprobs", "-1",
    ]

VLLM_BUILD_VERSION = "vllm-1"
"""Bump when anything below changes what is built: old caches are then ignored, never reused."""


def build_vllm_model(cache_dir: Path | None = None) -> TinyModel:
    """Build (or reuse from the cache) the head-64 Qwen2 and its adapters ``a0``, ``a1``, ``a2``.

    Returns:
        A :class:`~inference.testing.tiny_models.TinyModel` whose ``gguf_path`` is not built (vLLM reads the
        Transformers directory).
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / VLLM_BUILD_VERSION
    model = TinyModel(
        arch="qwen2",
        hf_dir=final / "tiny-qwen2-h64",
        gguf_path=final / "not-built.gguf",
        adapter_dirs={name: final / "adapters" / name for name in ADAPTER_NAMES},
    )
    if (final / "build-complete").is_file():
        return model
    tokenizer_dir = build_tiny_models(cache_dir)["qwen2"].hf_dir
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root):
        if not (final / "build-complete").is_file():
            staging = Path(tempfile.mkdtemp(prefix=f".building-{VLLM_BUILD_VERSION}-", dir=root))
            try:
                _build(tokenizer_dir, staging)
                shutil.rmtree(final, ignore_errors=True)
                os.replace(staging, final)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return model


def without_chat_template(model: TinyModel, directory: Path) -> Path:
    """The model's Transformers directory again in ``directory``, without its chat template: a base model.

    Many base models that adapters are trained on have no chat template; vLLM then refuses chat. The weights are
    linked, not copied.

    Returns:
        The new model directory.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for source in model.hf_dir.iterdir():
        target = directory / source.name
        if source.name == "chat_template.jinja" or target.exists():
            continue
        if source.suffix == ".safetensors":
            target.symlink_to(source)
        else:
            shutil.copy2(source, target)
    return directory


def _build(tokenizer_dir: Path, out: Path) -> None:
    import torch

    transformers: Any = importlib.import_module("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(4321)
    model = transformers.Qwen2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for token in tokenizer.all_special_tokens:
            model.lm_head.weight[tokenizer.convert_tokens_to_ids(token)].zero_()
    hf_dir = out / "tiny-qwen2-h64"
    model.save_pretrained(str(hf_dir))
    tokenizer.save_pretrained(str(hf_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index, name in enumerate(ADAPTER_NAMES):
            _write_adapter(model, out / "adapters" / name, seed=900 + index, base_path=hf_dir)
    (out / "build-complete").write_text(VLLM_BUILD_VERSION, encoding="utf-8")
