"""The GGUF LoRA tensors of a PEFT adapter for one base model: names, the llama q/k permutation, alpha folding.

The base model's layout decides everything: its ``general.architecture`` picks the Hugging Face to GGUF tensor
names (gguf's tensor name map), its tensors are where the adapter's matrices must fit, and its head counts drive the
one transformation llama.cpp needs: for the ``llama`` architecture, llama.cpp's own converter reorders the rows of
``q_proj``/``k_proj`` (rotary layout), so the rows of ``lora_B`` for ``attn_q``/``attn_k`` are reordered the same
way here (:func:`permute_llama_rows`). PEFT scales llama.cpp cannot express (rsLoRA, per-module alphas) are folded
into ``lora_B``. :mod:`inference.adapters.gguf` writes the tensors into a file.
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

from inference.adapters.gguf_layout import BaseModelLayout
from inference.adapters.peft import PeftAdapter, check_ranks, pattern_key, targets_module
from inference.adapters.peft_arrays import read_lora_arrays
from inference.exceptions import AdapterConversionError, InvalidAdapterError

__all__ = ["file_alpha", "gguf_lora_tensors", "import_gguf", "permute_llama_rows"]

# Architectures whose llama.cpp converter reorders q/k rows, and how this converter handles them.
_PERMUTED_ARCHITECTURES = frozenset({"llama"})
# Architectures converted by llama.cpp through its Llama code path (so probably permuted) that this converter
# has not been checked against: adapters touching q/k are refused rather than converted silently wrong.
_UNVERIFIED_ARCHITECTURES = frozenset(
    {"deci", "granite", "granitemoe", "baichuan", "minicpm", "deepseek", "llama4", "arcee", "smollm3"}
)
_ROTARY_TENSORS = {"attn_q": "q", "attn_k": "k"}
_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


def permute_llama_rows(rows: Any, n_head: int) -> Any:
    """Reorder the rows of a Llama q/k projection from Hugging Face's rotary layout to llama.cpp's.

    Hugging Face rotates the two halves of each head (``rotate_half``); llama.cpp rotates adjacent pairs.
    Within each of ``n_head`` heads, row ``j`` of the first half and row ``j`` of the second half become
    rows ``2j`` and ``2j + 1``. Pass the attention head count for ``q`` and the key/value head count for
    ``k``. Works on any array whose first axis is the projection's output (a weight, or a LoRA ``B``).

    Args:
        rows: numpy array of shape ``(n_head * head_dim, ...)``.
        n_head: Number of heads the rows are split into.

    Returns:
        The array with its rows reordered, same shape.
    """
    half_head = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, 2, half_head, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def gguf_lora_tensors(
    adapter: PeftAdapter, layout: BaseModelLayout, *, provider: str, weights: bytes | None = None
) -> dict[str, Any]:
    """Map the adapter's PEFT tensors onto the base's GGUF tensors: ``{"<base tensor>.lora_a" | ".lora_b": array}``.

    ``weights`` are the weights file's bytes when the caller has read them already (the cache names the output by
    their digest); ``None`` reads the file.

    Raises:
        InvalidAdapterError: The weights are unreadable, hold non-finite values, or do not match its ranks.
        AdapterConversionError: The adapter does not fit the base model (architecture, modules, shapes, head
            counts) or uses what llama.cpp cannot apply (fan_in_fan_out, LoRA biases, embeddings).
    """
    import numpy as np

    gguf = import_gguf(provider)

    def refuse(reason: str) -> AdapterConversionError:
        return AdapterConversionError(
            f"cannot convert the adapter at {adapter.path} for base model {layout.display_name} "
            f"({layout.architecture}): {reason}",
            provider=provider,
            path=str(adapter.path),
        )

    config = adapter.config
    if config.get("fan_in_fan_out"):
        raise refuse("it was trained with fan_in_fan_out=true (GPT-2 style Conv1D), which is not supported")
    if config.get("lora_bias"):
        raise refuse("it trains LoRA biases (lora_bias=true), which llama.cpp cannot apply")
    # alpha_pattern and the range of lora_alpha were checked by read_peft_adapter. The file holds alpha as float32:
    # llama.cpp reads 0 there as "no alpha" (scale 1), where PEFT's scale is 0. A negative alpha is applied as PEFT
    # applies it (the sign is in llama.cpp's alpha / rank, and lora_B's factor stays positive).
    if file_alpha(adapter) == 0:
        raise refuse(
            f"its lora_alpha is {adapter.alpha:g} (0 as float32), so PEFT would apply nothing, where llama.cpp reads "
            "an alpha of 0 as none (scale 1)"
        )

    arch_enum = next((key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == layout.architecture), None)
    if arch_enum is None:
        raise refuse(f"the installed gguf package has no tensor name map for the architecture {layout.architecture!r}")
    arrays = read_lora_arrays(adapter, provider, weights)

    def refuse_invalid(reason: str) -> InvalidAdapterError:
        return InvalidAdapterError(f"adapter at {adapter.path} {reason}", provider=provider, path=str(adapter.path))

    check_ranks(adapter.config, {key: tuple(array.shape) for key, array in arrays.items()}, refuse_invalid)
    # Map layer numbers past the base's last block too, so that they are reported as missing by name.
    layer_numbers = [int(number) for key in arrays for number in re.findall(r"\.layers\.(\d+)\.", key)]
    name_map = gguf.get_tensor_name_map(arch_enum, max([layout.block_count, *(n + 1 for n in layer_numbers)]))

    pairs: dict[str, dict[str, Any]] = {}
    for key, array in arrays.items():
        match = _PEFT_KEY.fullmatch(key)
        if match is None:
            if "lora_embedding" in key:
                raise refuse(f"it adapts an embedding ({key}); only linear layers are supported")
            if ".base_layer." in key:  # what PEFT saves beside a LoRA on an embedding or output layer
                raise refuse(
                    f"its weights hold {key!r}, a copy of a base layer (PEFT saves one with a LoRA on an embedding "
                    "or output layer, save_embedding_layers='auto'), which a GGUF LoRA cannot carry: if that layer "
                    "is the base model's own, save the adapter with save_embedding_layers=False"
                )
            raise refuse(f"its weights hold {key!r}, which is not a LoRA A/B matrix of a linear layer")
        pairs.setdefault(match["module"], {})[match["which"]] = array

    out: dict[str, Any] = {}
    missing: list[str] = []
    for module in sorted(pairs):
        if not targets_module(config, module):
            # PEFT builds no LoRA layer for a module its config does not select (target_modules, exclude_modules,
            # layers_to_transform, layers_pattern), and ignores its weights on load: so does the conversion.
            continue
        pair = pairs[module]
        if set(pair) != {"A", "B"}:
            raise refuse(f"module {module} has lora_{next(iter(pair))} without its partner matrix")
        lora_a, lora_b = (np.asarray(pair[which], dtype=np.float32) for which in ("A", "B"))
        if not (np.isfinite(lora_a).all() and np.isfinite(lora_b).all()):
            raise refuse_invalid(
                f"holds NaN or infinite values (or values beyond float32's range) in the LoRA matrices of {module}: "
                "the adapter cannot compute anything; train or save it again"
            )
        if lora_a.ndim != 2 or lora_b.ndim != 2 or lora_a.shape[0] != lora_b.shape[1]:
            raise refuse(
                f"module {module} has lora_A {lora_a.shape} and lora_B {lora_b.shape}, which are not the "
                "(rank, in) and (out, rank) matrices of one LoRA"
            )
        base_name = name_map.get_name(f"{module}.weight", try_suffixes=(".weight", ".bias"))
        if base_name is None:
            raise refuse(f"module {module} has no GGUF counterpart for the {layout.architecture} architecture")
        base_shape = layout.tensor_shapes.get(base_name)
        if base_shape is None:
            missing.append(f"{module} ({base_name})")
            continue
        expected = (lora_b.shape[0], lora_a.shape[1])
        if tuple(base_shape) != expected:
            raise refuse(
                f"module {module} is {expected[0]}x{expected[1]} in the adapter but {base_name} is "
                f"{'x'.join(str(dim) for dim in base_shape)} in the base model: the adapter was trained for "
                "another model"
            )
        with np.errstate(over="ignore"):  # a scale that overflows float32 is refused just below
            lora_b = lora_b * _b_factor(adapter, rank=lora_a.shape[0], alpha=_module_alpha(adapter, module))
        if not np.isfinite(lora_b).all():
            raise refuse(
                f"module {module}'s scale (its alpha / r, folded into lora_B) makes its lora_B overflow float32: "
                "lower its alpha_pattern entry or raise lora_alpha"
            )
        lora_b = _permute_for_llama_cpp(lora_b, base_name, layout, refuse)
        out[f"{base_name}.lora_a"] = np.ascontiguousarray(lora_a)
        out[f"{base_name}.lora_b"] = np.ascontiguousarray(lora_b, dtype=np.float32)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise refuse(f"the base model has no tensor for {shown}: the adapter was trained for another model")
    if not out:
        raise refuse("it holds no LoRA matrices")
    return out


def _b_factor(adapter: PeftAdapter, *, rank: int, alpha: float | None = None) -> float:
    """What ``lora_B`` must be multiplied by so that llama.cpp's ``alpha / rank`` (one alpha for the whole file, as
    float32) equals PEFT's scale for this module: its own alpha (``alpha_pattern``), over ``rank`` or rsLoRA's
    ``sqrt(rank)``."""
    module_alpha = adapter.alpha if alpha is None else alpha
    peft_scale = module_alpha / (math.sqrt(rank) if adapter.config.get("use_rslora") else rank)
    return peft_scale * rank / file_alpha(adapter)


def file_alpha(adapter: PeftAdapter) -> float:
    """``lora_alpha`` as the GGUF file holds it (float32): what llama.cpp divides by the rank."""
    return float(struct.unpack("<f", struct.pack("<f", adapter.alpha))[0])


def _module_alpha(adapter: PeftAdapter, module: str) -> float:
    """The alpha PEFT uses for ``module`` (a state-dict module name): the first ``alpha_pattern`` key that
    matches its end on a ``.`` boundary, as PEFT's ``get_pattern_key`` matches, else ``lora_alpha``."""
    pattern: dict[str, float] = adapter.config.get("alpha_pattern") or {}
    key = pattern_key(pattern, module)
    return adapter.alpha if key is None else float(pattern[key])


def _permute_for_llama_cpp(lora_b: Any, base_name: str, layout: BaseModelLayout, refuse: Any) -> Any:
    kind = _ROTARY_TENSORS.get(base_name.split(".")[-2]) if base_name.count(".") >= 2 else None
    if kind is None:
        return lora_b
    if layout.architecture in _UNVERIFIED_ARCHITECTURES:
        raise refuse(
            f"adapters on attention q/k projections are not supported for {layout.architecture} yet (llama.cpp "
            "reorders those rows for this architecture); train the adapter without q_proj/k_proj"
        )
    if layout.architecture not in _PERMUTED_ARCHITECTURES:
        return lora_b
    heads = layout.head_count if kind == "q" else layout.head_count_kv
    if not heads or lora_b.shape[0] % (2 * heads):
        raise refuse(f"the base model's head counts do not fit {base_name} ({lora_b.shape[0]} rows)")
    return permute_llama_rows(lora_b, heads)


def import_gguf(provider: str) -> Any:
    """The gguf package; a missing one names the extra of the provider that converts (llamacpp, ollama...)."""
    from inference._core.dependencies import import_optional

    return import_optional("gguf", provider=provider)
