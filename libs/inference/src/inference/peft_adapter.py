"""Reading and checking a PEFT LoRA adapter directory before any backend touches it.

Every provider that takes PEFT adapters (llama.cpp through conversion, Transformers+PEFT, vLLM when the
path is local) checks the directory here first, so a bad adapter gets the same clear
:class:`~inference.exceptions.InvalidAdapterError` everywhere instead of a backend's stack trace.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.exceptions import InvalidAdapterError

__all__ = ["PeftAdapter", "read_peft_adapter"]

CONFIG_NAME = "adapter_config.json"
WEIGHT_NAMES = ("adapter_model.safetensors", "adapter_model.bin")


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
    (or ``.bin``); ``peft_type`` is ``LORA``; no DoRA; ``bias`` is ``"none"``; no ``modules_to_save``;
    ``r`` is a positive integer; ``target_modules`` is given.

    Args:
        path: The adapter directory.
        provider: The provider asking, for the error message.

    Raises:
        InvalidAdapterError: The directory is missing or is not a plain LoRA adapter; the message says why.
    """
    directory = Path(path)

    def refuse(reason: str) -> InvalidAdapterError:
        return InvalidAdapterError(f"adapter at {directory} {reason}", provider=provider, path=str(directory))

    if not directory.exists():
        raise refuse("does not exist: give the path of a PEFT adapter directory")
    if not directory.is_dir():
        raise refuse("is not a directory: give a PEFT adapter directory (with adapter_config.json)")
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise refuse(f"has no {CONFIG_NAME}: save it with PeftModel.save_pretrained")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise refuse(f"has an unreadable {CONFIG_NAME} ({error})") from error
    if not isinstance(config, dict):
        raise refuse(f"has a {CONFIG_NAME} that is not a JSON object")
    weights = next((directory / name for name in WEIGHT_NAMES if (directory / name).is_file()), None)
    if weights is None:
        raise refuse(f"has no weights file ({' or '.join(WEIGHT_NAMES)})")

    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type != "LORA":
        raise refuse(f"is a {peft_type or 'untyped'} adapter: only LoRA adapters (peft_type LORA) are supported")
    if config.get("use_dora"):
        raise refuse("uses DoRA (use_dora=true), which these backends cannot serve: train a plain LoRA")
    if config.get("bias", "none") != "none":
        raise refuse(f"trains biases (bias={config.get('bias')!r}): only bias='none' is supported")
    if config.get("modules_to_save"):
        raise refuse(
            f"saves whole modules (modules_to_save={config['modules_to_save']!r}): only LoRA weights are supported"
        )
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise refuse(f"has an invalid rank r={rank!r}: expected a positive integer")
    alpha = config.get("lora_alpha", 8)  # PEFT's LoraConfig default
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise refuse(f"has an invalid lora_alpha={alpha!r}: expected a number")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise refuse(f"has no usable target_modules ({targets!r})")
    return PeftAdapter(
        path=directory,
        weights_path=weights,
        rank=rank,
        alpha=float(alpha),
        target_modules=tuple(sorted(targets)),
        base_model_name_or_path=str(config.get("base_model_name_or_path") or ""),
        config=config,
    )
