"""Tiny random Qwen2 and Llama models for tests: a Transformers directory, its GGUF twin, PEFT adapters.

Each model is built locally in a few seconds (no download) and cached, so tests of every backend can run
the same weights:

* ``hf_dir``: a Transformers model directory (float32 safetensors, config, generation config, tokenizer)
  that loads with ``AutoModelForCausalLM`` / ``AutoTokenizer``;
* ``gguf_path``: an f32 GGUF file with the same weights and the same tokenisation, for llama.cpp (for the
  Llama architecture the q/k rows are permuted as llama.cpp's own converter does);
* ``adapter_dirs``: three PEFT LoRA adapters ``"a0"``, ``"a1"``, ``"a2"`` (rank 8, alpha 16, on
  ``q,k,v,o,gate,up,down`` projections) that each change the greedy output.

The tokenizer is a byte-level BPE (about 512 tokens) trained on a built-in English text, with the
pre-tokeniser of the real family (Qwen2's regular expression for ``qwen2``, Llama 3's for ``llama``), so
llama.cpp pre-tokenises exactly like the Hugging Face tokenizer. The Qwen2 model has a ChatML chat template;
the Llama model has none. Neither adds a BOS token. The output rows of the special tokens are zero, so greedy
decoding never emits an end-of-sequence token: generations run to ``max_tokens`` (``finish_reason
"length"``) unless a stop string ends them.

Example:
    >>> from inference.testing.tiny_models import build_tiny_models
    >>> models = build_tiny_models()  # doctest: +SKIP
    >>> models["qwen2"].gguf_path.name  # doctest: +SKIP
    'tiny-qwen2.gguf'
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ADAPTER_NAMES",
    "ARCHITECTURES",
    "BUILD_VERSION",
    "CACHE_ENV_VAR",
    "CHATML_TEMPLATE",
    "TOOLS_CHATML_TEMPLATE",
    "TinyModel",
    "build_tiny_models",
    "default_cache_dir",
]

#: Bump when anything below changes what is built: old caches are then ignored, never reused.
BUILD_VERSION = "2"
CACHE_ENV_VAR = "INFERENCE_TEST_MODELS_DIR"
ARCHITECTURES = ("qwen2", "llama")
ADAPTER_NAMES = ("a0", "a1", "a2")

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOOLS_CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool['function'] | tojson) }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{{- '\\n<tool_call>\\n{\\\"name\\\": \\\"' + call['function']['name'] + '\\\", \\\"arguments\\\": ' "
    "+ (call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML with tools in the Hermes/Qwen form, kept short for the tiny models' 512 tokens (the tools' functions listed
in a system turn, calls written as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, results as ``<tool_response>`` in a user turn): what a
tool-calling model's template does, for tests that pass it as ``chat_template``. Without tools it renders as
:data:`CHATML_TEMPLATE`."""

# Pre-tokeniser regular expressions of the real families; llama.cpp knows them as "qwen2" and "llama-bpe".
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_HIDDEN = 64
_LAYERS = 2
_HEADS = 4
_KV_HEADS = 2
_INTERMEDIATE = 128
_CONTEXT = 512
_VOCAB = 512
_RMS_EPS = 1e-6
_ROPE_THETA = 10000.0
_LORA_RANK = 8
_LORA_ALPHA = 16
_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_LORA_STD = 0.25
_COMPLETE_MARKER = "build-complete.json"


@dataclass(frozen=True)
class _ArchSpec:
    arch: str
    seed: int
    split_regex: str
    gguf_pre: str
    special_tokens: tuple[str, ...]
    bos_token: str
    eos_token: str
    pad_token: str
    stop_tokens: tuple[str, ...]
    chat_template: str | None


_SPECS = {
    "qwen2": _ArchSpec(
        arch="qwen2",
        seed=1234,
        split_regex=_QWEN2_SPLIT,
        gguf_pre="qwen2",
        special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        chat_template=CHATML_TEMPLATE,
    ),
    "llama": _ArchSpec(
        arch="llama",
        seed=5678,
        split_regex=_LLAMA3_SPLIT,
        gguf_pre="llama-bpe",
        special_tokens=("<|begin_of_text|>", "<|end_of_text|>"),
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|end_of_text|>",
        stop_tokens=("<|end_of_text|>",),
        chat_template=None,
    ),
}

_TRAINING_TEXT = """\
Once upon a time, in a small village by the sea, there lived an old fisherman and his daughter.
Every morning they walked down to the harbour, checked the nets, and talked about the weather.
"The wind is changing," she said. "We'll need the heavy sails today, won't we?"
He smiled: "You're right, as always. I'd forgotten how quickly the clouds move in spring."

The village had 3 bakeries, 12 boats and 1,024 seagulls (at least, that's what the children counted).
On Sundays the market opened at 9:30 and closed at 14:00; prices were written on small slates:
bread 2.50, fish 7.25, apples 0.99 per kilo. Nobody ever paid more than 100 coins for anything.

Questions people often asked the fisherman:
- How deep is the water beyond the rocks?
- Why do the birds fly north before a storm?
- Where does the river begin, and where does it end?
He answered each one patiently, although he didn't always know the answer.

The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Knowledge is power, and time is money; but kindness, they say, is worth more than both.
Hello, world! Hello again... and goodbye for now.   Spaces    and\ttabs\tappear too.

In the evening the lights of the houses came on one by one, and the sea turned from blue to silver.
Children played near the water, teachers corrected homework, and the baker prepared dough for tomorrow.
The system works like this: you write a prompt, the model reads it, and then it writes an answer.
Assistant: I can help you with that. User: Please summarise the story in two sentences.
Résumé, café and naïve are borrowed words; emoji like 🙂 are rare in old stories.
"""


@dataclass(frozen=True)
class TinyModel:
    """One tiny test model in its three forms.

    Attributes:
        arch: ``"qwen2"`` or ``"llama"``.
        hf_dir: Transformers model directory (loads with ``AutoModelForCausalLM``/``AutoTokenizer``, float32).
        gguf_path: f32 GGUF twin: same weights, same token ids, for llama.cpp.
        adapter_dirs: PEFT LoRA adapter directories keyed ``"a0"``, ``"a1"``, ``"a2"``.
    """

    arch: str
    hf_dir: Path
    gguf_path: Path
    adapter_dirs: dict[str, Path]


def default_cache_dir() -> Path:
    """Where :func:`build_tiny_models` caches by default.

    ``$INFERENCE_TEST_MODELS_DIR`` if set, else ``~/.cache/inference-adapters/test-models``; the build
    itself lives in a subdirectory named after :data:`BUILD_VERSION`.
    """
    configured = os.environ.get(CACHE_ENV_VAR)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "inference-adapters" / "test-models"


def build_tiny_models(cache_dir: Path | None = None) -> dict[str, TinyModel]:
    """Build (or reuse from the cache) the tiny Qwen2 and Llama test models.

    The build is deterministic (fixed seeds). It goes into a temporary directory that is renamed into
    place only when complete, so a killed build never leaves half a cache, and two processes building at
    once both end with the same complete directory.

    Args:
        cache_dir: Cache root; defaults to :func:`default_cache_dir`. Models go to
            ``<cache_dir>/<BUILD_VERSION>/``.

    Returns:
        ``{"qwen2": TinyModel, "llama": TinyModel}``.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / BUILD_VERSION
    if not (final / _COMPLETE_MARKER).is_file():
        root.mkdir(parents=True, exist_ok=True)
        with _build_lock(root):
            if not (final / _COMPLETE_MARKER).is_file():
                # Under the lock nobody else is building: staging directories left here were killed builds.
                for leftover in root.glob(".building-*"):
                    shutil.rmtree(leftover, ignore_errors=True)
                _build_into(final)
    return {arch: _describe(final, arch) for arch in ARCHITECTURES}


def _untyped(module: str) -> Any:
    """Import a third-party module whose partial type hints would only get in the way here."""
    return importlib.import_module(module)


def _describe(final: Path, arch: str) -> TinyModel:
    base = final / arch
    return TinyModel(
        arch=arch,
        hf_dir=base / f"tiny-{arch}",
        gguf_path=base / f"tiny-{arch}.gguf",
        adapter_dirs={name: base / "adapters" / name for name in ADAPTER_NAMES},
    )


@contextlib.contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    """Serialise builds between processes where ``fcntl`` exists; the atomic rename is the real guard."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(root / ".build.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _build_into(final: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    staging = Path(tempfile.mkdtemp(prefix=f".building-{BUILD_VERSION}-", dir=final.parent))
    try:
        with warnings.catch_warnings():
            # Third-party deprecation notices (e.g. PEFT calling transformers' is_gradient_checkpointing)
            # must not break a test run that turns warnings into errors.
            warnings.simplefilter("ignore")
            for arch in ARCHITECTURES:
                _build_arch(_SPECS[arch], staging / arch, final / arch)
        (staging / _COMPLETE_MARKER).write_text(
            json.dumps({"build_version": BUILD_VERSION, "architectures": list(ARCHITECTURES)}), encoding="utf-8"
        )
        if final.exists():  # an incomplete directory left by hand or by an older layout
            shutil.rmtree(final)
        try:
            staging.rename(final)
        except OSError:
            if not (final / _COMPLETE_MARKER).is_file():
                raise
            # Another process finished first; its build is identical.
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _build_arch(spec: _ArchSpec, staging: Path, final: Path) -> None:
    _untyped("transformers.utils.logging").disable_progress_bar()
    staging.mkdir(parents=True)
    hf_dir = staging / f"tiny-{spec.arch}"
    tokenizer = _train_tokenizer(spec)
    model = _random_model(spec, tokenizer)
    _save_hf(spec, tokenizer, model, hf_dir)
    _write_gguf(spec, tokenizer, model, staging / f"tiny-{spec.arch}.gguf")
    for index, name in enumerate(ADAPTER_NAMES):
        _write_adapter(
            model, staging / "adapters" / name, seed=spec.seed + 100 + index, base_path=final / f"tiny-{spec.arch}"
        )


def _train_tokenizer(spec: _ArchSpec) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(spec.split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB,
        special_tokens=list(spec.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TRAINING_TEXT.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def _random_model(spec: _ArchSpec, tokenizer: Any) -> Any:
    import torch

    transformers = _untyped("transformers")

    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    ids = {token: tokenizer.token_to_id(token) for token in spec.special_tokens}
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": _HIDDEN,
        "intermediate_size": _INTERMEDIATE,
        "num_hidden_layers": _LAYERS,
        "num_attention_heads": _HEADS,
        "num_key_value_heads": _KV_HEADS,
        "max_position_embeddings": _CONTEXT,
        "rms_norm_eps": _RMS_EPS,
        "rope_theta": _ROPE_THETA,
        "tie_word_embeddings": False,
        "bos_token_id": ids[spec.bos_token],
        "eos_token_id": [ids[token] for token in spec.stop_tokens],
        "pad_token_id": ids[spec.pad_token],
    }
    torch.manual_seed(spec.seed)
    if spec.arch == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        config = transformers.LlamaConfig(**common, attention_bias=False, mlp_bias=False)
        model = transformers.LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                values = 1.0 + 0.1 * torch.randn(parameter.shape, generator=generator)
            elif name.endswith(".bias"):
                values = 0.1 * torch.randn(parameter.shape, generator=generator)
            elif "embed_tokens" in name:
                values = torch.randn(parameter.shape, generator=generator)
            else:  # Linear (out, in): unit-gain init, a larger one on the output head for clear logit margins
                gain = 2.0 if name.startswith("lm_head") else 1.0
                values = gain / parameter.shape[1] ** 0.5 * torch.randn(parameter.shape, generator=generator)
            parameter.copy_(values)
        # Special tokens never win greedy decoding: their output rows are zero.
        for token_id in ids.values():
            model.lm_head.weight[token_id].zero_()
    return model.float().eval()


def _save_hf(spec: _ArchSpec, tokenizer: Any, model: Any, hf_dir: Path) -> None:
    transformers = _untyped("transformers")
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
    )
    model.save_pretrained(hf_dir)
    hf_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=spec.bos_token,
        eos_token=spec.eos_token,
        pad_token=spec.pad_token,
    )
    if spec.chat_template is not None:
        hf_tokenizer.chat_template = spec.chat_template
    hf_tokenizer.save_pretrained(hf_dir)


def _write_gguf(spec: _ArchSpec, tokenizer: Any, model: Any, path: Path) -> None:
    import gguf
    import numpy as np

    from inference.adapters.gguf import permute_llama_rows

    config = model.config
    writer = gguf.GGUFWriter(path, spec.arch)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(f"tiny-{spec.arch}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(_CONTEXT)
    writer.add_embedding_length(_HIDDEN)
    writer.add_block_count(_LAYERS)
    writer.add_feed_forward_length(_INTERMEDIATE)
    writer.add_head_count(_HEADS)
    writer.add_head_count_kv(_KV_HEADS)
    writer.add_layer_norm_rms_eps(_RMS_EPS)
    writer.add_rope_freq_base(_ROPE_THETA)
    writer.add_rope_dimension_count(_HIDDEN // _HEADS)
    writer.add_vocab_size(config.vocab_size)

    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[token] for token in tokens] != list(range(len(tokens))):
        raise RuntimeError("the tiny tokenizer's ids are not contiguous")
    specials = set(spec.special_tokens)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(spec.gguf_pre)
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if token in specials else gguf.TokenType.NORMAL for token in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(vocab[spec.bos_token])
    writer.add_eos_token_id(vocab[spec.eos_token])
    writer.add_pad_token_id(vocab[spec.pad_token])
    writer.add_add_bos_token(False)
    if spec.chat_template is not None:
        writer.add_chat_template(spec.chat_template)

    arch_enum = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == spec.arch)
    name_map = gguf.get_tensor_name_map(arch_enum, _LAYERS)
    for hf_name, parameter in model.state_dict().items():
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise RuntimeError(f"no GGUF name for tensor {hf_name}")
        data = parameter.detach().to("cpu").float().numpy().astype(np.float32)
        if spec.arch == "llama" and hf_name.endswith("q_proj.weight"):
            data = permute_llama_rows(data, _HEADS)
        elif spec.arch == "llama" and hf_name.endswith("k_proj.weight"):
            data = permute_llama_rows(data, _KV_HEADS)
        writer.add_tensor(gguf_name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_adapter(model: Any, out_dir: Path, *, seed: int, base_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=_LORA_RANK,
        lora_alpha=_LORA_ALPHA,
        target_modules=list(_LORA_TARGETS),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(copy.deepcopy(model), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(peft_model.named_parameters()):
            if ".lora_A." in name or ".lora_B." in name:
                parameter.copy_(_LORA_STD * torch.randn(parameter.shape, generator=generator))
    peft_model.save_pretrained(str(out_dir))
    config_path = out_dir / "adapter_config.json"
    saved = json.loads(config_path.read_text(encoding="utf-8"))
    saved["base_model_name_or_path"] = str(base_path)
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True), encoding="utf-8")
    readme = out_dir / "README.md"
    if readme.exists():
        readme.unlink()
