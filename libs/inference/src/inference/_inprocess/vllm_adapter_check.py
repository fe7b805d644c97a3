"""What the ``vllm-offline`` provider checks of a PEFT adapter before vLLM's engine registers it.

vLLM checks an adapter's config and rank, not that its matrices fit the model: an adapter trained for another base
model (other hidden or intermediate sizes) registers, and then serves garbage. The model itself lives in the
engine's process, so the layers' sizes are read from its config (``hf_config``): the usual decoder projections
(``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``) and ``lm_head``, for
the models that name them so. Matrices of other modules (and of vision towers and experts, whose sizes differ) are
left to vLLM. Every weight must be finite: vLLM registers NaN weights, and once such an adapter has held a slot,
other adapters that worked answer garbage (read from the weights file; the other backends check this too).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from inference.adapters.peft import PeftAdapter, check_layer_shapes, read_safetensors_shapes
from inference.exceptions import InvalidAdapterError

__all__ = ["check_adapter_fits", "check_finite_weights", "layer_features"]

_MATRIX = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_[AB](?:\.[^.]+)?\.weight$")
_OTHER_TOWERS = ("vision", "visual", "audio", "encoder", "tower", "expert", "projector")
"""Parts of a module's name that put it outside the language model's decoder layers (other sizes)."""


def layer_features(config: Any) -> dict[str, tuple[int, int]]:
    """The decoder's linear layers by their last name -> ``(in_features, out_features)``, from a model's text
    config (``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
    ``intermediate_size``, ``vocab_size``); what a config does not say is left out."""

    def size(name: str) -> int | None:
        value = getattr(config, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    hidden, heads, intermediate, vocab = (size(name) for name in (
        "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"))
    features: dict[str, tuple[int, int]] = {}
    if hidden is not None and heads is not None:
        head_dim = size("head_dim") or hidden // heads
        kv_heads = size("num_key_value_heads") or heads
        features.update(q_proj=(hidden, heads * head_dim), k_proj=(hidden, kv_heads * head_dim),
                        v_proj=(hidden, kv_heads * head_dim), o_proj=(heads * head_dim, hidden))
    if hidden is not None and intermediate is not None:
        features.update(gate_proj=(hidden, intermediate), up_proj=(hidden, intermediate),
                        down_proj=(intermediate, hidden))
    if hidden is not None and vocab is not None:
        features["lm_head"] = (hidden, vocab)
    return features


def check_adapter_fits(
    adapter: PeftAdapter,
    features: Mapping[str, tuple[int, int]],
    model: str,
    refuse: Callable[[str], InvalidAdapterError],
) -> None:
    """Refuse an adapter whose matrices do not fit the model's layers (:func:`layer_features`), by
    :func:`~inference.adapters.peft.check_layer_shapes`, read from the safetensors header (``.bin`` weights are
    left to vLLM).

    Args:
        adapter: The adapter, as :func:`~inference.adapters.peft.read_peft_adapter` read it.
        features: The model's layers by last name -> ``(in_features, out_features)``.
        model: The model's name, for the message.
        refuse: Builds the error from a reason.

    Raises:
        InvalidAdapterError: A matrix's size is not its layer's (the message names the layer and both sizes).
    """
    shapes = read_safetensors_shapes(adapter.weights_path) if adapter.weights_path.suffix == ".safetensors" else None
    checked: dict[str, tuple[int, ...]] = {}
    layers: dict[str, tuple[int, int] | None] = {}
    for key, shape in (shapes or {}).items():
        match = _MATRIX.fullmatch(key)
        if match is None:
            continue
        module = match["module"]
        leaf = module.rsplit(".", 1)[-1]
        if leaf in features and not any(part in module for part in _OTHER_TOWERS):
            checked[key], layers[module] = shape, features[leaf]
    check_layer_shapes(adapter, checked, layers, model, refuse)


def check_finite_weights(adapter: PeftAdapter, refuse: Callable[[str], InvalidAdapterError]) -> None:
    """Refuse an adapter with a NaN or infinite weight, naming the first such tensor.

    Args:
        adapter: The adapter, as :func:`~inference.adapters.peft.read_peft_adapter` read it.
        refuse: Builds the error from a reason.

    Raises:
        InvalidAdapterError: A tensor holds a NaN or an infinity (or the weights file cannot be read).
    """
    import torch

    path = adapter.weights_path
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as weights:
                tensors = {name: weights.get_tensor(name) for name in weights.keys()}  # noqa: SIM118
        else:
            tensors = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:
        raise refuse(f"has weights that cannot be read ({type(error).__name__}: {error})") from error
    for name, tensor in sorted(tensors.items()):
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise refuse(f"has NaN or infinite values in {name}: they would spoil the engine's adapter slots")
