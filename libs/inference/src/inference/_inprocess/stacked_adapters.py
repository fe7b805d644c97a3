"""The adapters of a Transformers model that live in stacked matrices (:mod:`inference._inprocess.lora_stacks`).

:class:`~inference._inprocess.peft_slots.PeftSlots` puts every adapter it can here: one gathered LoRA pass per
layer serves a batch however many distinct adapters its rows use, where PEFT's mixed batch loops over them. An
adapter that cannot be stacked (DoRA, ``modules_to_save``, LoRA on embeddings or convolutions, ``fan_in_fan_out``...)
stays with PEFT, and the reason is logged once per reason. Each entry is known by its backend name (the name
:class:`PeftSlots` gives any adapter or combination), and holds one slot of the stacks.

The stacks hook the model's base linear layers, under PEFT's LoRA layers when PEFT holds other adapters, so one
forward pass applies both: a row's stacked adapter through the hooks, another row's PEFT adapter through PEFT's
``adapter_names`` (``"__base__"`` for the stacked rows, slot 0 for PEFT's).

Everything here runs on the provider's worker thread; torch is imported on first use.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from inference._core.dependencies import import_optional
from inference._inprocess.hf_model import LoadedModel
from inference._inprocess.lora_stacks import LoraStacks, lora_module_weights, not_stackable_reason
from inference.adapters.peft_targets import untargeted_reason

__all__ = ["StackedAdapters"]

logger = logging.getLogger("inference")


class StackedAdapters:
    """The stacked adapters and weighted combinations of one model, by backend name.

    Args:
        provider: The provider's name, for errors and log lines.
    """

    def __init__(self, *, provider: str) -> None:
        self.provider = provider
        self.slots: dict[str, int] = {}  # backend name -> its slot in the stacks
        self._stacks: LoraStacks | None = None
        self._logged: set[str] = set()  # the reasons already logged

    def add(self, loaded: LoadedModel, name: str, adapter_id: str, config: Mapping[str, Any], tensors: Any) -> bool:
        """Write an adapter into the stacks as ``name``: False (and the reason logged once) when it cannot be
        stacked, and PEFT must serve it."""
        reason = not_stackable_reason(config) or _layer_selection(config)
        if reason is None:
            stacks = self._stacks_of(loaded)
            try:
                weights = lora_module_weights(config, tensors, modules=stacks.modules)
                _check_targeted(config, weights)
                self.slots[name] = stacks.add(weights)
                return True
            except ValueError as error:  # a layer that is not linear, a tensor of no module: PEFT says what
                reason = str(error)
        if reason not in self._logged:
            self._logged.add(reason)
            logger.info(
                "%s serves adapter %r with PEFT's per-adapter pass (slower in mixed batches): %s",
                self.provider,
                adapter_id,
                reason,
            )
        return False

    def add_combination(self, name: str, parts: Sequence[tuple[str, float]]) -> None:
        """One more slot, ``name``, that applies stacked adapters at once, each times its weight."""
        assert self._stacks is not None
        self.slots[name] = self._stacks.add_combination([(self.slots[part], weight) for part, weight in parts])

    def remove(self, name: str) -> bool:
        """Free ``name``'s slot (zeroed: no row can use it again); False when ``name`` is not stacked."""
        slot = self.slots.pop(name, None)
        if slot is None or self._stacks is None:
            return False
        self._stacks.remove(slot)
        return True

    @contextlib.contextmanager
    def rows(self, names: Sequence[str]) -> Iterator[None]:
        """Row ``i`` of every forward pass in the block gets ``names[i]``'s stacked adapter (none for a name that
        is not stacked: the base model, or an adapter PEFT serves)."""
        slots = [self.slots.get(name, 0) for name in names]
        if self._stacks is None or not any(slots):
            yield
            return
        with self._stacks.rows(slots):
            yield

    def close(self) -> None:
        """Remove the hooks and free the matrices (the model is being freed)."""
        if self._stacks is not None:
            self._stacks.close()
        self._stacks = None
        self.slots.clear()

    def _stacks_of(self, loaded: LoadedModel) -> LoraStacks:
        if self._stacks is None:
            torch = import_optional("torch", extra="transformers", provider=self.provider)
            dtype = next(
                (p.dtype for p in loaded.base_model.parameters() if p.is_floating_point()), torch.float32
            )  # a quantized model's compute dtype, not its packed weights'
            self._stacks = LoraStacks(torch, loaded.base_model, dtype=dtype, device=loaded.device)
        return self._stacks


def _layer_selection(config: Mapping[str, Any]) -> str | None:
    """Config keys that make PEFT build LoRA layers for fewer modules than the weights name (then PEFT serves it)."""
    for key in ("layers_to_transform", "layers_pattern", "exclude_modules"):
        if config.get(key):
            return f"{key} selects the layers PEFT adapts"
    return None


def _check_targeted(config: Mapping[str, Any], weights: Mapping[str, Any]) -> None:
    """Refuse weights for a module the config does not select (PEFT builds no layer for it and ignores them): PEFT
    serves such an adapter, as it loads it."""
    for module in weights:
        reason = untargeted_reason(config, module)
        if reason is not None:
            raise ValueError(f"weights for {module}, which {reason}")
