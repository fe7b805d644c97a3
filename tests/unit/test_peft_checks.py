"""The checks an adapter passes before it goes into a model, as pure functions: no torch, no model.

``check_target_modules`` and ``check_layer_shapes`` (``inference.adapters.peft``) are what the Transformers
provider asks before PEFT builds anything; ``slot_shape`` decides which adapters may take turns in one PEFT slot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inference._inprocess.peft_slots import slot_shape
from inference.adapters.peft import PeftAdapter, check_layer_shapes, check_target_modules, targets_module
from inference.exceptions import InvalidAdapterError

MODULES = ["", "model", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj", "lm_head"]
LAYERS: dict[str, tuple[int, int] | None] = {
    "": None,
    "model": None,
    "model.layers.0.self_attn.q_proj": (16, 32),
    "model.layers.0.self_attn.v_proj": (16, 8),
    "model.layers.0.input_layernorm": None,
}
Q = "base_model.model.model.layers.0.self_attn.q_proj"


def adapter(targets: Any, base: str = "") -> PeftAdapter:
    return PeftAdapter(
        path=Path("/adapters/x"),
        weights_path=Path("/adapters/x/adapter_model.safetensors"),
        rank=2,
        alpha=4.0,
        target_modules=tuple(sorted(targets)) if isinstance(targets, list) else (targets,),
        base_model_name_or_path=base,
        config={"target_modules": targets, "r": 2},
    )


def refuse(reason: str) -> InvalidAdapterError:
    return InvalidAdapterError(f"adapter at /adapters/x {reason}", path="/adapters/x")


def test_targets_the_model_has_pass() -> None:
    check_target_modules(adapter(["v_proj", "q_proj"]), MODULES, "tiny", refuse)
    check_target_modules(adapter(["model.layers.0.self_attn.q_proj"]), MODULES, "tiny", refuse)  # a full name
    check_target_modules(adapter(r".*\.(q|v)_proj"), MODULES, "tiny", refuse)  # a regex some name matches whole
    check_target_modules(adapter("all-linear"), [], "tiny", refuse)  # every linear layer, whatever the model


def test_targets_the_model_lacks_are_refused_by_name() -> None:
    with pytest.raises(InvalidAdapterError) as caught:
        check_target_modules(adapter(["q_proj", "up_proj", "gate_proj"]), MODULES, "tiny", refuse)
    assert str(caught.value) == (
        "adapter at /adapters/x targets modules that tiny does not have (gate_proj, up_proj): "
        "it was trained for another model architecture"
    )


def test_a_suffix_counts_only_on_a_dot_boundary_and_a_regex_must_match_a_whole_name() -> None:
    with pytest.raises(InvalidAdapterError, match=r"does not have \(_proj\)"):
        check_target_modules(adapter(["_proj"]), MODULES, "tiny", refuse)
    with pytest.raises(InvalidAdapterError, match=r"does not have \(q_pro\)"):
        check_target_modules(adapter("q_pro"), MODULES, "tiny", refuse)


def test_matrices_that_fit_their_layers_pass() -> None:
    shapes = {
        f"{Q}.lora_A.weight": (2, 16),
        f"{Q}.lora_B.weight": (32, 2),
        "base_model.model.model.layers.0.self_attn.v_proj.lora_A.default.weight": (2, 16),
        "base_model.model.model.layers.0.input_layernorm.lora_A.weight": (2, 99),  # a layer without features
        "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight": (8,),  # not 2-D: left to PEFT
        "base_model.model.lm_head.weight": (7, 7),  # not a LoRA matrix
    }
    check_layer_shapes(adapter(["q_proj", "v_proj"]), shapes, LAYERS, "tiny", refuse)


@pytest.mark.parametrize(
    ("key", "shape", "message"),
    [
        (f"{Q}.lora_A.weight", (2, 12), "model.layers.0.self_attn.q_proj has 16 inputs but the adapter's lora_A has "
         "shape [2, 12]"),
        (f"{Q}.lora_B.weight", (64, 2), "model.layers.0.self_attn.q_proj has 32 outputs but the adapter's lora_B has "
         "shape [64, 2]"),
    ],
)
def test_a_matrix_of_another_model_is_refused_with_both_sizes(key: str, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(InvalidAdapterError) as caught:
        check_layer_shapes(adapter(["q_proj"], base="org/other-model"), {key: shape}, LAYERS, "tiny", refuse)
    assert str(caught.value) == (
        f"adapter at /adapters/x does not fit tiny: {message}; it was trained for another base model "
        "(org/other-model)"
    )


def test_weights_for_a_module_the_model_lacks_are_refused() -> None:
    key = "base_model.model.model.layers.7.mlp.up_proj.lora_A.weight"
    with pytest.raises(InvalidAdapterError) as caught:
        check_layer_shapes(adapter(["up_proj"]), {key: (2, 16)}, LAYERS, "tiny", refuse)
    assert str(caught.value) == (
        "adapter at /adapters/x has weights for model.layers.7.mlp.up_proj, which tiny does not have"
    )


def test_adapters_of_one_lora_shape_share_a_slot_and_others_do_not() -> None:
    config: dict[str, Any] = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    same = dict(config, target_modules=["v_proj", "q_proj"], base_model_name_or_path="elsewhere", lora_dropout=0.1)
    assert slot_shape(config) == slot_shape(same) is not None  # order and inference-indifferent keys do not count
    assert slot_shape(dict(config, r=8)) != slot_shape(config)
    assert slot_shape(dict(config, lora_alpha=16)) != slot_shape(config)
    assert slot_shape(dict(config, use_dora=True)) is None  # a slot with more than LoRA matrices is never reused
    assert slot_shape(dict(config, bias="all")) is None
    assert slot_shape(dict(config, modules_to_save=["lm_head"])) is None



L0_Q = "base_model.model.model.layers.0.self_attn.q_proj"
L1_Q = "base_model.model.model.layers.1.self_attn.q_proj"
L1_UP = "model.layers.1.mlp.up_proj"


@pytest.mark.parametrize(
    ("selection", "module", "adapted"),
    [
        # layers_to_transform: the first numbered segment of the name, or the one after layers_pattern
        ({"layers_to_transform": [1]}, L0_Q, False),
        ({"layers_to_transform": [1]}, L1_Q, True),
        ({"layers_to_transform": 0}, L1_Q, False),  # one layer number, 0 included
        ({"layers_to_transform": 0}, L0_Q, True),
        ({"layers_to_transform": []}, L0_Q, True),  # an empty list selects every layer, as in PEFT
        ({"layers_to_transform": [1], "layers_pattern": "layers"}, L0_Q, False),
        ({"layers_to_transform": [1], "layers_pattern": ["h", "layers"]}, L1_Q, True),
        ({"layers_to_transform": [0], "layers_pattern": "blocks"}, L0_Q, False),  # no blocks.<n>. in the name
        ({"layers_to_transform": [0], "target_modules": ["lm_head"]}, "model.lm_head", False),  # in no numbered layer
        ({"layers_to_transform": [0], "target_modules": ["lm_head"]}, "lm_head", True),  # a whole name: any layer
        ({"layers_to_transform": [0], "target_modules": ["model.layers.1.self_attn.q_proj"]}, L1_Q, True),
        # exclude_modules: names to equal or end with, or one regular expression the whole name matches
        ({"exclude_modules": ["model.layers.0.self_attn.q_proj"]}, L0_Q, False),
        ({"exclude_modules": ["layers.0.self_attn.q_proj"]}, L1_Q, True),
        ({"exclude_modules": r".*\.0\..*"}, L0_Q, False),
        ({"exclude_modules": r".*\.0\..*"}, L1_Q, True),
        ({"exclude_modules": ["up_proj"]}, L1_UP, False),
        ({}, L1_UP, True),
        ({"target_modules": ["q_proj"]}, L1_UP, False),
        ({"target_modules": r".*\.1\.mlp\..*", "exclude_modules": ["up_proj"]}, L1_UP, False),
    ],
)
def test_the_modules_peft_adapts_are_the_ones_its_config_selects(
    selection: dict[str, Any], module: str, adapted: bool
) -> None:
    """As PEFT's check_target_module_exists: the weights of a module it does not adapt, PEFT ignores on load."""
    config = {"target_modules": ["q_proj", "v_proj", "up_proj"], **selection}
    assert targets_module(config, module) is adapted
