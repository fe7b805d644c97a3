"""Which modules a PEFT LoRA config adapts, decided as PEFT decides it: pure functions, no torch, no peft.

PEFT builds a LoRA layer only for a module its config selects (``check_target_module_exists`` in PEFT's
``tuners_utils``), and ignores weights for any other module when it loads an adapter. Four keys decide:

- ``target_modules``: a list of names the module's name equals or ends with (after a ``.``), or one regular
  expression the whole name must match (``"all-linear"``: every linear layer);
- ``exclude_modules``: the same shapes, for modules to leave out even when ``target_modules`` names them;
- ``layers_to_transform``: a layer number, or a list of them (an empty list selects every layer), for a list of
  ``target_modules`` only: a module is selected when the first numbered segment of its name is one of them (a
  module whose whole name is in ``target_modules`` is selected whatever its layer);
- ``layers_pattern``: the name (a regular expression, or a list of them) of the module list those numbers count
  in (``"layers"``, ``"h"``); without it, the first ``<name>.<number>.`` in the module's name.

Backends that apply the tensors of a file themselves (the GGUF conversion, the Transformers stacks) ask here, so
they apply what PEFT applies. The keys' types and regular expressions are checked by
:func:`~inference.adapters.peft.check_lora_config` before anything asks here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inference._core.validation import listed

__all__ = ["layer_pattern", "targets_module", "untargeted_reason"]

_FIRST_LAYER_NUMBER = re.compile(r".*?\.[^.]*\.(?P<index>\d+)\.")
"""Without ``layers_pattern``: the first ``<name>.<number>.`` after the first dot of a module's name."""


def targets_module(config: Mapping[str, Any], module: str) -> bool:
    """Whether PEFT builds a LoRA layer for ``module`` (a state-dict module name) under ``config``.

    Args:
        config: The adapter's ``adapter_config.json``.
        module: The module's name, with or without the ``base_model.model.`` prefix of a PEFT state dict.
    """
    return untargeted_reason(config, module) is None


def untargeted_reason(config: Mapping[str, Any], module: str) -> str | None:
    """Why PEFT builds no LoRA layer for ``module`` under ``config``, or ``None`` when it builds one.

    The reason reads after the module's name: ``f"{module} {reason}"`` (``"is not among target_modules=[q_proj]"``,
    ``"is excluded by exclude_modules=[...]"``, ``"is in layer 0, which layers_to_transform=[1] leaves out"``).
    """
    name = module.removeprefix("base_model.model.")
    excluded = config.get("exclude_modules")
    if excluded and _named(excluded, name):
        return f"is excluded by exclude_modules={_shown(excluded)}"
    targets = config.get("target_modules")
    if isinstance(targets, str):
        if targets == "all-linear" or re.fullmatch(targets, name) is not None:
            return None
        return f"is not among target_modules={_shown(targets)}"
    if not _named(targets or [], name):
        return f"is not among target_modules={_shown(targets or [])}"
    if name in (targets or []):  # named in full: PEFT adapts it whatever layers_to_transform says
        return None
    layers = config.get("layers_to_transform")
    if layers is None or layers == []:
        return None
    selected = f"layers_to_transform={layers!r}"
    index = _layer_index(name, config.get("layers_pattern"))
    if index is None:
        return f"is in no numbered layer, so {selected} leaves it out"
    if index == layers if isinstance(layers, int) else index in layers:
        return None
    return f"is in layer {index}, which {selected} leaves out"


def _named(names: str | list[str], name: str) -> bool:
    """Whether ``names`` (one regular expression, or names to equal or end with after a dot) covers ``name``."""
    if isinstance(names, str):
        return re.fullmatch(names, name) is not None
    return any(name == entry or name.endswith("." + entry) for entry in names)


def _layer_index(name: str, patterns: str | list[str] | None) -> int | None:
    """The layer number in ``name``: after the first of ``patterns`` that is followed by ``.<number>.``, or, without
    patterns, the first ``<name>.<number>.``."""
    if not patterns:
        match = _FIRST_LAYER_NUMBER.match(name)
    else:
        listed_patterns = [patterns] if isinstance(patterns, str) else patterns
        found = (re.match(layer_pattern(pattern), name) for pattern in listed_patterns)
        match = next((one for one in found if one is not None), None)
    return None if match is None else int(match["index"])


def layer_pattern(pattern: str) -> str:
    """The regular expression that finds the layer number after ``pattern`` (a ``layers_pattern`` entry) in a
    module's name: the first ``<pattern>.<number>.``, at the start or after a dot."""
    return rf"(?:^|.*?\.){pattern}\.(?P<index>\d+)\."


def _shown(value: str | list[str]) -> str:
    return repr(value[:100]) if isinstance(value, str) else f"[{listed(value)}]"
