"""Reading and checking a PEFT LoRA adapter directory before any backend touches it.

Every provider that takes PEFT adapters (llama.cpp through conversion, Transformers+PEFT, vLLM when the
path is local) checks the directory here first, so a bad adapter gets the same clear
:class:`~inference.exceptions.InvalidAdapterError` everywhere instead of a backend's stack trace.
:func:`check_base_model` then compares the base model the adapter names with the model it is loaded on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference._core.paths import expand_path, path_identity
from inference._core.validation import FLOAT32_MAX, is_real_number, listed
from inference.adapters.peft_targets import layer_pattern, targets_module
from inference.adapters.regex_safety import repeats_a_repetition
from inference.exceptions import InvalidAdapterError

__all__ = [
    "PeftAdapter",
    "base_model_type",
    "check_base_model",
    "check_layer_shapes",
    "check_lora_config",
    "check_ranks",
    "check_target_modules",
    "pattern_key",
    "read_peft_adapter",
    "read_safetensors_shapes",
    "targets_module",
]

logger = logging.getLogger("inference.adapters")

CONFIG_NAME = "adapter_config.json"
WEIGHT_NAMES = ("adapter_model.safetensors", "adapter_model.bin")

# A LoRA matrix in a PEFT state dict: base_model.model.<module>.lora_A.weight (.lora_A.<adapter name>.weight
# in some saves).
_LORA_MATRIX = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<side>[AB])(?:\.[^.]+)?\.weight$")
_MAX_SAFETENSORS_HEADER = 100_000_000  # safetensors' own limit on the header's size


@dataclass(frozen=True)
class PeftAdapter:
    """What a PEFT LoRA adapter directory declares.

    Attributes:
        path: The adapter directory.
        weights_path: ``adapter_model.safetensors`` (or ``.bin``) inside it.
        rank: LoRA rank ``r``.
        alpha: ``lora_alpha``.
        target_modules: Module names the adapter targets (e.g. ``("q_proj", "v_proj")``), sorted.
        base_model_name_or_path: What the adapter was trained on, as written by PEFT (may be empty).
        config: The whole ``adapter_config.json``.
    """

    path: Path
    weights_path: Path
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    base_model_name_or_path: str
    config: dict[str, Any]

    @property
    def scale(self) -> float:
        """The factor PEFT applies to ``B @ A``: ``alpha / rank``."""
        return self.alpha / self.rank


def read_peft_adapter(path: str | os.PathLike[str], *, provider: str | None = None) -> PeftAdapter:
    """Read ``adapter_config.json`` of a PEFT LoRA directory and refuse what no backend here can serve.

    Checks: the directory exists and holds ``adapter_config.json`` and ``adapter_model.safetensors``
    (or ``.bin``); the config as :func:`check_lora_config` checks it; and, from the safetensors header (no
    tensor data is read), that each LoRA pair has the rank ``r`` (or its ``rank_pattern`` entry) says
    (:func:`check_ranks`), so a wrong ``r`` is refused before a backend builds anything of that rank.

    Args:
        path: The adapter directory (a leading ``~`` is expanded).
        provider: The provider asking, for the error message.

    Raises:
        InvalidAdapterError: The directory is missing or is not a plain LoRA adapter; the message says why.
    """
    directory = expand_path(path)

    def refuse(reason: str) -> InvalidAdapterError:
        return InvalidAdapterError(f"adapter at {directory} {reason}", provider=provider, path=str(directory))

    config_path = directory / CONFIG_NAME
    try:
        if not directory.exists():
            raise refuse("does not exist: give the path of a PEFT adapter directory")
        if not directory.is_dir():
            raise refuse("is not a directory: give a PEFT adapter directory (with adapter_config.json)")
        if not config_path.is_file():
            raise refuse(f"has no {CONFIG_NAME}: save it with PeftModel.save_pretrained")
    except OSError as error:  # e.g. a parent directory this process may not search
        raise refuse(f"cannot be read ({error.strerror or error}): check its permissions") from error
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise refuse(f"has an unreadable {CONFIG_NAME} ({error})") from error
    except RecursionError:  # arrays or objects nested thousands deep: no adapter config looks like that
        raise refuse(f"has a {CONFIG_NAME} nested too deeply to be an adapter config") from None
    if not isinstance(config, dict):
        raise refuse(f"has a {CONFIG_NAME} that is not a JSON object")
    try:
        weights = next((directory / name for name in WEIGHT_NAMES if (directory / name).is_file()), None)
    except OSError as error:
        raise refuse(f"cannot be read ({error.strerror or error}): check its permissions") from error
    if weights is None:
        raise refuse(f"has no weights file ({' or '.join(WEIGHT_NAMES)})")

    rank, alpha, targets = check_lora_config(config, refuse)
    shapes = read_safetensors_shapes(weights) if weights.suffix == ".safetensors" else None
    if shapes is not None:  # an unreadable file is left to the backends, which report what is wrong with it
        check_ranks(config, shapes, refuse)
    return PeftAdapter(
        path=directory,
        weights_path=weights,
        rank=rank,
        alpha=float(alpha),
        target_modules=tuple(sorted(targets)),
        base_model_name_or_path=str(config.get("base_model_name_or_path") or ""),
        config=config,
    )


def check_lora_config(
    config: dict[str, Any], refuse: Callable[[str], InvalidAdapterError]
) -> tuple[int, float, list[str]]:
    """Refuse a LoRA config no backend here can serve; return its rank, alpha and target modules.

    Checks: ``peft_type`` is ``LORA``; no DoRA, no variant whose forward pass is not plain LoRA (aLoRA...), no
    ``layer_replication`` (a deeper model made of copies of the base's layers), no ``target_parameters``; no
    ``init_lora_weights`` that rewrites the base weights (PiSSA, CorDA, OLoRA, LoftQ); ``bias`` is ``"none"``; no
    ``modules_to_save``; ``r`` is a positive integer; ``lora_alpha`` is a finite number float32 can hold;
    ``target_modules`` is a list of names or one regular expression (as PEFT takes it), and ``exclude_modules``,
    ``layers_to_transform`` and ``layers_pattern`` are what PEFT takes; ``rank_pattern`` maps
    regular expressions to positive integers and ``alpha_pattern`` to numbers float32 can hold.
    ``refuse(reason)`` builds the error (its message starts with what the adapter is).
    """
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type != "LORA":
        raise refuse(f"is a {peft_type[:40] or 'untyped'} adapter: only LoRA adapters (peft_type LORA) are supported")
    if config.get("use_dora"):
        raise refuse("uses DoRA (use_dora=true), which these backends cannot serve: train a plain LoRA")
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_BASE_CHANGING_INITS):
        raise refuse(
            f"was started with init_lora_weights={init!r}, which rewrites the base model's weights when the adapter "
            "is loaded (PEFT keeps the base minus the adapter's start): save it as a plain LoRA (PEFT's "
            "save_pretrained(..., path_initial_model_for_weight_conversion=...)) and load that"
        )
    for key, what in _FORWARD_CHANGING.items():
        if config.get(key):
            raise refuse(f"uses {key} ({what}), which these backends cannot serve: train a plain LoRA")
    if config.get("bias", "none") != "none":
        raise refuse(f"trains biases (bias={config.get('bias')!r}): only bias='none' is supported")
    if config.get("modules_to_save"):
        saved = config["modules_to_save"]
        shown = listed(saved) if isinstance(saved, list) else repr(saved)[:100]
        raise refuse(f"saves whole modules (modules_to_save={shown}): only LoRA weights are supported")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise refuse(f"has an invalid rank r={rank!r}: expected a positive integer")
    alpha = config.get("lora_alpha", 8)  # PEFT's LoraConfig default
    if not _fits_float32(alpha):
        raise refuse(f"has an invalid lora_alpha={alpha!r}: expected a finite number {_FLOAT32_RULE}")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        if targets:
            _require_pattern(targets, "target_modules", targets, refuse)
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        shown = listed(targets) if isinstance(targets, list) else repr(targets)[:100]
        raise refuse(f"has no usable target_modules ({shown}): give module names or one regular expression")
    _check_module_selection(config, refuse)
    for name, rule, valid in (
        ("rank_pattern", "a positive integer", lambda value: isinstance(value, int) and not isinstance(value, bool)
         and value >= 1),
        ("alpha_pattern", f"a finite number {_FLOAT32_RULE}", _fits_float32),
    ):
        patterns = config.get(name) or {}
        if not isinstance(patterns, dict):
            raise refuse(f"has a {name} that is a {type(patterns).__name__}, not a map of module patterns to values")
        for key, value in patterns.items():
            _require_pattern(key, name, rf"(.*\.)?({key})$", refuse)
            if not valid(value):
                raise refuse(f"has {name}[{key[:100]!r}] = {repr(value)[:100]}: expected {rule}")
    return rank, float(alpha), targets


def _check_module_selection(config: dict[str, Any], refuse: Callable[[str], InvalidAdapterError]) -> None:
    """Refuse ``exclude_modules``, ``layers_to_transform`` and ``layers_pattern`` values PEFT could not use, and the
    combinations its ``LoraConfig`` refuses (see :mod:`inference.adapters.peft_targets` for what they select)."""
    excluded = config.get("exclude_modules")
    if isinstance(excluded, str) and excluded:
        _require_pattern(excluded, "exclude_modules", excluded, refuse)
    elif excluded and (not isinstance(excluded, list) or not all(isinstance(name, str) and name for name in excluded)):
        raise refuse(
            f"has exclude_modules={repr(excluded)[:100]}: expected module names or one regular expression"
        )
    layers = config.get("layers_to_transform")
    if layers is not None and not (
        _is_layer_number(layers) or (isinstance(layers, list) and all(_is_layer_number(number) for number in layers))
    ):
        raise refuse(f"has layers_to_transform={repr(layers)[:100]}: expected a layer number or a list of them")
    patterns = config.get("layers_pattern")
    if patterns is not None:
        entries = [patterns] if isinstance(patterns, str) else patterns
        if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
            raise refuse(
                f"has layers_pattern={repr(patterns)[:100]}: expected the name of the module list its layers are "
                "numbered in (such as 'layers'), or a list of them"
            )
        for entry in entries:
            if entry:
                _require_pattern(entry, "layers_pattern", layer_pattern(entry), refuse)
    targets = config.get("target_modules")
    for key in ("layers_to_transform", "layers_pattern"):
        if isinstance(targets, str) and config.get(key) is not None:
            raise refuse(
                f"sets {key} with target_modules as one regular expression ({targets[:100]!r}), which PEFT's "
                "LoraConfig refuses: list the target module names instead"
            )
    if patterns and layers is None:
        raise refuse("sets layers_pattern without layers_to_transform, which PEFT's LoraConfig refuses: give both")


def _is_layer_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_FLOAT32_RULE = f"that float32 can hold (at most {FLOAT32_MAX:.4g} in size)"

_BASE_CHANGING_INITS = ("pissa", "corda", "olora", "loftq")
"""``init_lora_weights`` values with which PEFT rewrites the base layer's weights when it loads the adapter."""

_FORWARD_CHANGING = {
    "alora_invocation_tokens": "aLoRA: the adapter applies only from its invocation tokens on",
    "arrow_config": "Arrow routes each token among several adapters",
    "use_bdlora": "BD-LoRA shares block-diagonal factors",
    "velora_config": "VeLoRA compresses the activations",
    "monteclora_config": "MonteCLoRA samples the adapter's weights",
    "kasa_config": "KaSA adapts with singular values",
    "layer_replication": (
        "PEFT builds a deeper model from copies of the base model's layers, and makes them in the shared base model "
        "itself, so requests without the adapter would change too"
    ),
    "target_parameters": "LoRA on parameters such as MoE experts' weights, not on linear layers",
}
"""LoRA variants and options whose adapted model is not its linear layers plus ``scaling * B @ A @ x``, and what
they do instead."""


def _fits_float32(value: object) -> bool:
    return is_real_number(value) and math.isfinite(value) and abs(value) <= FLOAT32_MAX  # type: ignore[arg-type]


def _require_pattern(key: object, name: str, pattern: str, refuse: Callable[[str], InvalidAdapterError]) -> None:
    """Refuse a key of ``rank_pattern``/``alpha_pattern`` (or a ``target_modules`` string) that PEFT could not use
    as the regular expression it builds from it."""
    if not isinstance(key, str) or not key:
        raise refuse(f"has a {name} key {repr(key)[:100]}: expected a module name or regular expression")
    try:
        re.compile(pattern)
        nested = repeats_a_repetition(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as error:
        raise refuse(f"has a {name} entry {key[:100]!r} that is not a valid regular expression ({error})") from None
    if nested:  # re cannot be stopped, and holds the GIL: one match could stall the whole process
        raise refuse(
            f"has a {name} entry {key[:100]!r} that repeats a repetition (as in (a+)+ or (.*.*)*): matching a "
            "module name against it can take exponential time; write it without a repeated group that repeats"
        )


def pattern_key(patterns: Mapping[str, Any], module: str) -> str | None:
    r"""The ``rank_pattern``/``alpha_pattern`` key PEFT applies to ``module``, or ``None`` (then ``r``/``lora_alpha``).

    As PEFT's ``get_pattern_key``: the first key that matches the end of the module's name on a ``.`` boundary
    (``re.match(rf"(.*\.)?({key})$", name)``), where ``name`` is the module's name in the model (a state-dict
    name without its ``base_model.model.`` prefix).
    """
    name = module.removeprefix("base_model.model.")
    return next((key for key in patterns if re.match(rf"(.*\.)?({key})$", name)), None)


def check_ranks(
    config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], refuse: Callable[[str], InvalidAdapterError]
) -> None:
    """Refuse LoRA matrices whose rank is not the one the config gives their module (``r`` or ``rank_pattern``).

    ``shapes`` maps state-dict names (``...q_proj.lora_A.weight``) to shapes; other names, and matrices that are
    not 2-D or lack their partner, are left to the checks that look at them. ``lora_A`` is ``(rank, in)`` and
    ``lora_B`` ``(out, rank)``. A config whose ``r`` is not the tensors' rank would make one backend scale the
    adapter by the wrong ``alpha / r`` and another allocate the stated rank first (``r=2**40``: 281 TB).
    """
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        match = _LORA_MATRIX.fullmatch(name)
        if match is not None and len(shape) == 2:
            pairs.setdefault(match["module"], {})[match["side"]] = tuple(shape)
    rank_pattern = config.get("rank_pattern") or {}
    for module, sides in sorted(pairs.items()):
        if set(sides) != {"A", "B"}:
            continue
        key = pattern_key(rank_pattern, module)
        expected, source = (config["r"], "r") if key is None else (rank_pattern[key], f"rank_pattern[{key!r}]")
        if sides["A"][0] != expected or sides["B"][1] != expected:
            raise refuse(
                f"has {module} with lora_A {sides['A']} and lora_B {sides['B']}: with rank {expected} (its {source}), "
                f"lora_A is ({expected}, in_features) and lora_B (out_features, {expected}); the config does not "
                "describe these weights: save the adapter again with PeftModel.save_pretrained, or correct its "
                "r / rank_pattern"
            )


def check_target_modules(
    adapter: PeftAdapter, module_names: Iterable[str], model: str, refuse: Callable[[str], InvalidAdapterError]
) -> None:
    """Refuse an adapter whose ``target_modules`` name modules the model does not have (another architecture).

    As PEFT matches them: a string is a regular expression some module's whole name must match
    (``"all-linear"`` always passes), a list holds names some module's name equals or ends with (after a ``.``).

    Args:
        adapter: The adapter.
        module_names: The names of the model's modules (``named_modules()``).
        model: The model's name, for the message.
        refuse: Builds the error from a reason (its message starts with what the adapter is).
    """
    raw = adapter.config.get("target_modules")
    if raw == "all-linear":
        return
    names = [name for name in module_names if name]
    if isinstance(raw, str):
        missing = [] if any(re.fullmatch(raw, name) for name in names) else [raw]
    else:
        missing = [
            target
            for target in adapter.target_modules
            if not any(name == target or name.endswith("." + target) for name in names)
        ]
    if missing:
        raise refuse(
            f"targets modules that {model} does not have ({listed(missing)}): "
            "it was trained for another model architecture"
        )


def check_layer_shapes(
    adapter: PeftAdapter,
    shapes: Mapping[str, tuple[int, ...]],
    layers: Mapping[str, tuple[int, int] | None],
    model: str,
    refuse: Callable[[str], InvalidAdapterError],
) -> None:
    """Refuse LoRA matrices that do not fit the layers they adapt (an adapter trained for another base model).

    ``lora_A`` is ``(rank, in_features)`` and ``lora_B`` ``(out_features, rank)``. Names that are not LoRA
    matrices, matrices that are not 2-D, and layers without linear features are left alone.

    Args:
        adapter: The adapter (its ``base_model_name_or_path`` is named in the message).
        shapes: State-dict name -> shape of the adapter's tensors (``...q_proj.lora_A.weight``).
        layers: Every module name of the model -> its ``(in_features, out_features)``, or ``None`` for a module
            that has none.
        model: The model's name, for the message.
        refuse: Builds the error from a reason (its message starts with what the adapter is).
    """
    for key, shape in sorted(shapes.items()):
        match = _LORA_MATRIX.fullmatch(key)
        if match is None:
            continue
        module, side = match["module"], match["side"]
        if module not in layers:
            raise refuse(f"has weights for {module}, which {model} does not have")
        features = layers[module]
        if features is None or len(shape) != 2:
            continue
        expected, actual = (features[0], shape[1]) if side == "A" else (features[1], shape[0])
        if expected != actual:
            raise refuse(
                f"does not fit {model}: {module} has {expected} {'inputs' if side == 'A' else 'outputs'} but the "
                f"adapter's lora_{side} has shape {list(shape)}; it was trained for another base model"
                + (f" ({adapter.base_model_name_or_path})" if adapter.base_model_name_or_path else "")
            )


def read_safetensors_shapes(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape from a safetensors file's header, without reading any tensor data.

    Returns ``None`` when the file has no readable safetensors header (too short, a header that is not a JSON
    object, or one nested too deeply); entries without a list of sizes as their shape are skipped.
    """
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            size = int.from_bytes(prefix, "little")
            if len(prefix) < 8 or size > _MAX_SAFETENSORS_HEADER:
                return None
            header = json.loads(handle.read(size))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for name, entry in header.items():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if isinstance(shape, list) and all(isinstance(size, int) and not isinstance(size, bool) for size in shape):
            shapes[name] = tuple(shape)
    return shapes


# Architecture names that differ between transformers' model_type and GGUF's general.architecture, or that
# llama.cpp serves with another architecture's code: compared through this table.
_SAME_ARCHITECTURE = {"gemma3_text": "gemma3", "mistral": "llama"}

_warned: set[tuple[str, str]] = set()


def base_model_type(adapter: PeftAdapter) -> str | None:
    """The architecture of the model the adapter was trained on, when this machine can tell; else ``None``.

    Read from ``base_model_name_or_path``: a local model directory's ``config.json`` (``model_type``), a local
    GGUF file's header (``general.architecture``), or, for a Hugging Face Hub id, the ``config.json`` in the
    local Hugging Face cache when ``huggingface_hub`` is installed (nothing is downloaded).
    """
    declared = adapter.base_model_name_or_path
    if not declared:
        return None
    local = expand_path(declared)
    config_file: Path | None = None
    try:
        if local.is_dir():
            config_file = local / "config.json"
        elif local.is_file() and local.suffix.lower() == ".gguf":
            from inference.adapters.gguf_layout import _read_gguf_architecture

            return _read_gguf_architecture(local)
        else:
            config_file = _hub_cached_config(declared)
        if config_file is None or not config_file.is_file():
            return None
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError, RecursionError):  # unreadable or not a JSON object: nothing to compare
        return None
    return model_type if isinstance(model_type, str) and model_type else None


def check_base_model(
    adapter: PeftAdapter,
    *,
    model_name: str | os.PathLike[str] | None,
    model_type: str | None,
    provider: str | None = None,
) -> None:
    """Refuse an adapter trained on another architecture; log a warning when it names another base model.

    An adapter whose matrices happen to have the loaded model's shapes loads without any backend error,
    and then produces wrong text. Its ``adapter_config.json`` says what it was trained on
    (``base_model_name_or_path``); this compares that with the model it is about to be loaded on.

    - Architectures: when :func:`base_model_type` can tell the base's architecture and ``model_type`` is
      given, they must be the same (``qwen2`` and ``llama`` are not), else the adapter is refused.
    - Names: when ``model_name`` is given and names another model (compared by real path when both are on
      this machine, else by final path component, ignoring case and a ``.gguf`` suffix), a warning is logged
      on the ``inference.adapters`` logger, once per adapter and model. A warning, not an error: the same
      model is often saved under another name.

    Providers call it after :func:`read_peft_adapter`, before giving the adapter to the backend.

    Args:
        adapter: The adapter, as :func:`read_peft_adapter` returned it.
        model_name: The loaded model's name or path, or ``None`` to skip the name comparison.
        model_type: The loaded model's architecture (transformers' ``config.model_type`` or GGUF's
            ``general.architecture``), or ``None`` when unknown.
        provider: The provider asking, for the error.

    Raises:
        InvalidAdapterError: The adapter was trained on another architecture.
    """
    declared = adapter.base_model_name_or_path
    if not declared:
        return
    trained_type = base_model_type(adapter) if model_type else None
    if trained_type and model_type and _architecture(trained_type) != _architecture(model_type):
        shown = f" {os.fspath(model_name)}" if model_name is not None else ""
        raise InvalidAdapterError(
            f"adapter at {adapter.path} was trained on {declared}, a {trained_type} model, but the loaded model"
            f"{shown} is a {model_type} model: its weights would load and produce wrong text; use an adapter "
            "trained for this base model",
            provider=provider,
            path=str(adapter.path),
        )
    if model_name is None or _same_model(declared, os.fspath(model_name)):
        return
    key = (path_identity(adapter.path), os.fspath(model_name))
    if key in _warned:
        return
    _warned.add(key)
    logger.warning(
        "%sadapter at %s was trained on %s, but is being loaded on %s: if that is another model, its output "
        "will be wrong; use an adapter trained for this model (or set base_model_name_or_path in its "
        "adapter_config.json if it is the same model under another name)",
        f"{provider}: " if provider else "",
        adapter.path,
        declared,
        os.fspath(model_name),
    )


def _architecture(name: str) -> str:
    lowered = name.strip().lower()
    return _SAME_ARCHITECTURE.get(lowered, lowered)


def _same_model(declared: str, loaded: str) -> bool:
    if path_identity(declared) == path_identity(loaded):
        return True

    def stem(name: str) -> str:
        last = os.path.basename(os.path.normpath(os.path.expanduser(name))).lower()
        return last[: -len(".gguf")] if last.endswith(".gguf") else last

    return stem(declared) == stem(loaded)


def _hub_cached_config(repo_id: str) -> Path | None:
    """``config.json`` of a Hub repo id in the local Hugging Face cache, or ``None`` (never downloads)."""
    if repo_id.count("/") > 1 or repo_id.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # an id the hub library refuses (HFValidationError): nothing cached under it
        return None
    return Path(found) if isinstance(found, str) else None
