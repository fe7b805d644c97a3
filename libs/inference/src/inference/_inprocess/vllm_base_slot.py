"""The base model's own adapter slot on vLLM's CPU build, so a request without an adapter never reads another's.

vLLM's CPU LoRA kernels (``vllm/lora/ops/torch_ops/lora_ops.py``) pick each token's slot weights with
``weights[index]``, and a request without an adapter has index ``-1``: in torch, the *last* slot. Once every slot
has held an adapter (and a slot keeps its weights after its adapter leaves), a request on the base model that runs in
the same engine step as adapter requests is computed with the last slot's adapter. (vLLM's GPU kernels skip ``-1``.)

So on CPU the engine gets one slot more than ``max_loras``, and requests on the base model carry an adapter of the
provider's own that changes nothing: rank 1, with one pair of zero matrices for a module no model has, so vLLM zeroes
every layer's slot when it activates it. (vLLM refuses an adapter with no matrices, and one for a module the model
does not support, but for names holding ``base_layer``, which it lets through for PEFT's expert layers; the name
keeps this adapter free of any model's sizes.) It is never registered with the provider's adapters
(``list_adapters`` and ``adapter_stats`` do not show it). It is not pinned (vLLM's scheduler would still let
``max_loras + 1`` other adapters into a step, and a pinned slot would make one of them evict another in use): its
directory lives as long as the engine, so when vLLM's caches have let it go, the next base request loads it again.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from inference._core.dependencies import import_optional

BASE_ADAPTER_NAME = "inference-base-model"
"""The name vLLM knows the base model's adapter by."""

BASE_ADAPTER_ID = 2**30
"""Its ``lora_int_id``: far above the provider's own ids (counted from 1), within vLLM's int32 id arrays."""

_MODULE = "base_model.model.inference_base_model.base_layer"
_HEADER = json.dumps({
    f"{_MODULE}.lora_A.weight": {"dtype": "F32", "shape": [1, 1], "data_offsets": [0, 4]},
    f"{_MODULE}.lora_B.weight": {"dtype": "F32", "shape": [1, 1], "data_offsets": [4, 8]},
}).encode()
_SAFETENSORS = len(_HEADER + b" " * (-len(_HEADER) % 8)).to_bytes(8, "little") + _HEADER + b" " * (
    -len(_HEADER) % 8) + bytes(8)
"""Two 1x1 zero matrices in safetensors' layout: the header's size, the header (padded to 8 bytes), the data."""


def needs_base_adapter(settings: dict[str, Any]) -> bool:
    """Whether requests on the base model need the provider's empty adapter: LoRA is on, on vLLM's CPU platform."""
    if not settings.get("enable_lora"):
        return False
    platforms = import_optional("vllm.platforms", provider="vllm-offline")
    return bool(platforms.current_platform.is_cpu())


def write_base_adapter() -> Path:
    """Write the zero rank-1 LoRA adapter into a new private directory, and return that directory."""
    directory = Path(tempfile.mkdtemp(prefix="inference-vllm-base-"))
    config = {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["inference_base_model"],
              "bias": "none", "use_dora": False}
    (directory / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
    (directory / "adapter_model.safetensors").write_bytes(_SAFETENSORS)
    return directory


def remove_base_adapter(directory: str | None) -> None:
    """Remove the base adapter's directory (nothing when there is none)."""
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
