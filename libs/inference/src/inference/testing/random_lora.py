"""Write a random PEFT LoRA adapter that fits any base GGUF model, for demos and benchmarks on real models.

Only numpy and safetensors are needed (no torch): the shapes come from the base GGUF header (quantised
tensors included), the names are the Hugging Face ones PEFT writes, so the directory converts with
:func:`inference.adapters.gguf.convert_peft_to_gguf` and loads with PEFT on the matching Transformers model.

Example:
    >>> from inference.testing.random_lora import write_random_peft_lora
    >>> write_random_peft_lora("gemma-3-270m-q4_k_m.gguf", "adapters/random")  # doctest: +SKIP
    PosixPath('adapters/random')
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from inference.adapters.gguf import read_base_layout
from inference.exceptions import InvalidAdapterError

__all__ = ["MODULE_PATHS", "write_random_peft_lora"]

#: Where each usual LoRA target lives inside a decoder block of a Hugging Face causal LM.
MODULE_PATHS = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}


def write_random_peft_lora(
    base_gguf: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    rank: int = 8,
    alpha: float = 16,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    seed: int = 0,
    std: float = 0.05,
) -> Path:
    """Write a PEFT LoRA directory with random, non-zero ``lora_A`` and ``lora_B`` for every block of a model.

    Args:
        base_gguf: The base model's GGUF file; only its header (architecture, tensor shapes) is read.
        out_dir: Directory to write ``adapter_config.json`` and ``adapter_model.safetensors`` into (created).
        rank: LoRA rank ``r``.
        alpha: ``lora_alpha`` (PEFT's scale is ``alpha / rank``).
        targets: Module names among :data:`MODULE_PATHS`.
        seed: Seed of the random values: the same seed writes the same adapter.
        std: Standard deviation of the entries of both matrices.

    Returns:
        ``out_dir`` as a :class:`~pathlib.Path`.

    Raises:
        InvalidAdapterError: A target is unknown or the base model has no such tensor.
        AdapterConversionError: The base GGUF is missing or unreadable.
    """
    import gguf
    import numpy as np
    from safetensors.numpy import save_file

    if rank < 1:
        raise InvalidAdapterError(f"rank must be a positive integer, got {rank}")
    unknown = sorted(set(targets) - set(MODULE_PATHS))
    if unknown or not targets:
        raise InvalidAdapterError(
            f"unknown LoRA targets {unknown or list(targets)}: choose among {', '.join(MODULE_PATHS)}"
        )
    layout = read_base_layout(base_gguf)
    arch = next((key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == layout.architecture), None)
    if arch is None:
        raise InvalidAdapterError(f"the gguf package has no tensor name map for {layout.architecture!r}")
    name_map = gguf.get_tensor_name_map(arch, layout.block_count)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for block in range(layout.block_count):
        for target in sorted(set(targets)):
            module = f"model.layers.{block}.{MODULE_PATHS[target]}"
            gguf_name = name_map.get_name(f"{module}.weight", try_suffixes=(".weight",))
            shape = layout.tensor_shapes.get(gguf_name or "")
            if shape is None or len(shape) != 2:
                raise InvalidAdapterError(
                    f"base model {layout.path} has no 2-D tensor for {module} ({gguf_name}): "
                    f"choose other targets than {target}",
                    path=str(layout.path),
                )
            out_features, in_features = shape
            prefix = f"base_model.model.{module}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0.0, std, (rank, in_features)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0.0, std, (out_features, rank)).astype(np.float32)
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "alpha_pattern": {},
        "base_model_name_or_path": str(base_gguf),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "rank_pattern": {},
        "target_modules": sorted(set(targets)),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
    return directory
