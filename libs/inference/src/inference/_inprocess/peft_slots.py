"""The adapters in a PEFT model: slots, spare slots, weighted combinations, and what each batch row applies.

Which adapters the user loaded (ids, paths, pins, LRU order) is the provider's registry; :class:`PeftSlots` owns
what is in the model now, as vLLM's ``LoRAModelManager`` owns its slots apart from the worker that decides what
to load. Each adapter lives in a *slot*: a PEFT adapter under an internal name (``inference_0_adapter``,
``inference_1_adapter``...), because PEFT refuses names that adapter ids may be: with a ``.`` (``lr0.001``), or
equal to an attribute of torch's ``ModuleDict`` (``train``, ``eval``, ``keys``). Names are never reused, and none
is part of another (``inference_1_adapter`` is not in ``inference_11_adapter``).

- **Load and unload.** :meth:`PeftSlots.load` reads a PEFT directory (checked first: target modules and matrix
  shapes against the model), :meth:`PeftSlots.load_weights` takes in-memory
  :class:`~inference.adapters.weights.AdapterWeights`; :meth:`PeftSlots.unload` empties the slot. The first
  adapter wraps the model in a ``PeftModel``; removing the last one restores the plain model.
- **Spare slots.** An unload keeps up to ``spare_limit`` emptied slots; the next adapter of the same LoRA shape
  (see :func:`slot_shape`) is copied into one instead of PEFT building and removing LoRA layers.
- **Weighted combinations.** A request with ``adapter_scales`` runs on a combination built once with PEFT's
  ``add_weighted_adapter`` and kept (the :data:`COMBINED_KEPT` most recently used ones).
- **What a row applies.** :meth:`PeftSlots.applied` names the slot a request runs on (the base model, an adapter,
  a combination), and :meth:`PeftSlots.rows` makes each row of one model call apply its own.
- **Stacked adapters.** Every adapter that can be stacked (plain LoRA on linear layers, see
  :mod:`inference._inprocess.lora_stacks`) goes into the stacked matrices of
  :class:`~inference._inprocess.stacked_adapters.StackedAdapters` instead of a PEFT adapter: one gathered pass per
  layer serves a batch, however many distinct adapters its rows use. The others stay with PEFT (the reason logged
  once). A batch mixing both runs as one pass: each row gets its adapter from the stacks or from PEFT's
  ``adapter_names``; a combination of both kinds applies its stacked parts from the stacks and the others from a
  PEFT combination, on the same row (the deltas add up). Spare slots are PEFT's only: a stack slot costs nothing.

Everything here runs on the provider's worker thread; peft, torch and safetensors are imported on first use.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference._core.dependencies import import_optional
from inference._core.validation import AdapterScales
from inference._inprocess.base import adapter_not_loaded
from inference._inprocess.hf_model import LoadedModel, empty_cuda_cache
from inference._inprocess.stacked_adapters import StackedAdapters
from inference.adapters.peft import (
    PeftAdapter,
    check_base_model,
    check_layer_shapes,
    check_target_modules,
    read_peft_adapter,
)
from inference.exceptions import InvalidAdapterError, UnsupportedOperationError

if TYPE_CHECKING:
    from inference.adapters.weights import AdapterWeights

__all__ = ["BASE_ADAPTER_NAME", "COMBINED_KEPT", "PeftSlots", "slot_shape"]

BASE_ADAPTER_NAME = "__base__"
"""PEFT's name for "no adapter" in ``adapter_names``."""

COMBINED_KEPT = 8
"""Weighted adapter combinations (requests with ``adapter_scales``) kept in the model, least recently used out."""

_SLOT_INDIFFERENT = frozenset(
    {
        "base_model_name_or_path",
        "revision",
        "inference_mode",
        "task_type",
        "lora_dropout",
        "init_lora_weights",
        "peft_version",
        "auto_mapping",
    }
)
"""adapter_config.json keys that do not change the LoRA layers PEFT builds for inference (or their scaling)."""

_SLOT_EXCLUDED = ("use_dora", "modules_to_save", "trainable_token_indices", "layer_replication", "target_parameters")
"""adapter_config.json keys that, when set, give a slot more than LoRA matrices: such adapters never share a slot."""

_BASE_LAYER_COPY = re.compile(r"\.base_layer\.(?P<parameter>weight|bias)$")
"""A tensor of a PEFT adapter that is a copy of a base layer's, not a LoRA matrix (see ``_without_base_copies``)."""

_NOT_CONFIG_ARGUMENTS = frozenset({"peft_type", "auto_mapping", "revision", "base_model_name_or_path"})
"""adapter_config.json keys that PEFT writes but LoraConfig(...) does not take as they are."""


def slot_shape(config: dict[str, Any]) -> str | None:
    """What a PEFT adapter slot built for ``config`` fits: adapters of equal shape can share a slot in turn.

    ``None`` for configs whose slot holds more than LoRA weights of target modules (DoRA magnitudes, bias,
    ``modules_to_save``, trainable tokens, layer replication, target parameters): those are never reused.
    """
    if any(config.get(key) for key in _SLOT_EXCLUDED) or config.get("bias", "none") != "none":
        return None
    kept = {key: value for key, value in config.items() if key not in _SLOT_INDIFFERENT}
    if isinstance(kept.get("target_modules"), list):
        kept["target_modules"] = sorted(kept["target_modules"])
    return json.dumps(kept, sort_keys=True, default=str)


class PeftSlots:
    """The adapter slots of one PEFT model, and the adapter ids that fill them.

    Every method takes the :class:`~inference._inprocess.hf_model.LoadedModel` it works on (the model is loaded on
    first use, after these slots exist) and may replace its ``model`` (the ``PeftModel`` wrapper comes and goes).
    Generation and scoring ask only :meth:`applied` and :meth:`rows`, and the provider only loads and unloads, so
    another way of applying some adapters (stacked matrices, :mod:`inference._inprocess.lora_stacks`) can live
    behind the same methods.

    Args:
        resident: The provider's map of resident adapters, id -> slot (PEFT adapter name); kept up to date here.
        spare_limit: How many emptied slots an unload keeps for the next adapter of the same shape.
        provider: The provider's name, for errors.
        stacking: Whether adapters that can be stacked go into the stacks (else every adapter is PEFT's).
    """

    def __init__(self, resident: dict[str, str], *, spare_limit: int, provider: str, stacking: bool = True) -> None:
        self.resident = resident
        self.stacking = stacking
        self.stacked = StackedAdapters(provider=provider)
        self.spare_limit = spare_limit
        self.provider = provider
        self._names = (f"inference_{number}_adapter" for number in itertools.count())
        self._shapes: dict[str, str] = {}  # slot -> its shape (see slot_shape), for slots an unload may keep
        self._spare: dict[str, list[str]] = {}  # emptied slots by shape, spare_limit at most in all
        # Weighted combinations built for requests with adapter scales: (adapter ids, scales) -> PEFT name, LRU.
        self._combined: collections.OrderedDict[AdapterScales, str] = collections.OrderedDict()
        self._in_use: frozenset[AdapterScales] = frozenset()  # the combinations of the model call under way
        self._combined_names = (f"inference_{number}_combined" for number in itertools.count())

    @property
    def combinations(self) -> Mapping[AdapterScales, str]:
        """The weighted combinations in the model now: adapter scales -> PEFT name, least recently used first."""
        return self._combined

    # What rows apply ---------------------------------------------------------------------------------------------

    def applied(self, loaded: LoadedModel, adapter_id: str | None, scales: AdapterScales = ()) -> str:
        """PEFT's name for what a request applies: the base model, an adapter, or a weighted combination.

        A combination (``scales``) is built once with PEFT's ``add_weighted_adapter`` (``"cat"``: the adapters'
        ranks side by side, each A scaled by its weight and its own alpha/r, so the delta is exactly the weighted
        sum) and kept for later requests, the :data:`COMBINED_KEPT` most recently used ones.

        Raises:
            AdapterNotFoundError: An adapter it names is not in the model.
        """
        if not scales:
            if adapter_id is None:
                return BASE_ADAPTER_NAME
            if adapter_id not in self.resident:
                raise self._not_loaded(adapter_id)  # never expected: the registry holds it
            return self.resident[adapter_id]
        if scales in self._combined:
            self._combined.move_to_end(scales)
            return self._combined[scales]
        missing = [part for part, _ in scales if part not in self.resident]
        if missing:
            raise self._not_loaded(missing[0])
        parts = [(self.resident[part], scale) for part, scale in scales]
        stacked = [(name, scale) for name, scale in parts if name in self.stacked.slots]
        names = [name for name, _ in parts if name not in self.stacked.slots]
        weights = [scale for name, scale in parts if name not in self.stacked.slots]
        if len(names) == 1:  # PEFT combines one adapter "linearly", with sqrt(weight): no negative scales
            names, weights = names * 2, [weights[0], 0.0]
        combined = next(self._combined_names)
        if names:
            try:
                with _combinable(loaded.model, names, provider=self.provider):
                    loaded.model.add_weighted_adapter(names, weights, combined, combination_type="cat")
            except ValueError as error:  # PEFT's "No matching LoRAs found": a module of no adapter, after all
                self._drop_combination(loaded, combined)
                raise UnsupportedOperationError(
                    f"PEFT could not combine adapters {', '.join(part for part, _ in scales)} ({error})",
                    provider=self.provider,
                ) from error
        if stacked:
            try:
                self.stacked.add_combination(combined, stacked)
            except BaseException:
                self._drop_combination(loaded, combined)
                raise
        self._combined[scales] = combined
        while len(self._combined) > COMBINED_KEPT:  # never one the model call under way applies (:meth:`rows`)
            victim = next((kept for kept in self._combined if kept not in self._in_use and kept != scales), None)
            if victim is None:
                break
            self._drop_combination(loaded, self._combined.pop(victim))
        return combined

    @contextlib.contextmanager
    def rows(
        self, loaded: LoadedModel, applied: Sequence[tuple[str | None, AdapterScales]]
    ) -> Iterator[dict[str, Any]]:
        """Make each row of one model call (a ``generate`` or a forward pass) apply its own adapter.

        Args:
            loaded: The model.
            applied: Per row, what it applies: ``(adapter_id, adapter_scales)``.

        Yields:
            The keyword arguments the model call takes: PEFT's ``adapter_names`` (the slots' names, never the ids,
            ``"__base__"`` for rows the stacks serve) while PEFT holds adapters some row applies; else nothing.
        """
        with self.holding(scales for _, scales in applied):
            names = [self.applied(loaded, adapter_id, scales) for adapter_id, scales in applied]
            with self._applying(loaded, names) as extra:
                yield extra

    @contextlib.contextmanager
    def holding(self, combinations: Iterable[AdapterScales]) -> Iterator[None]:
        """Keep the weighted ``combinations`` built while the block runs (one batch's rows), however many there are:
        beyond :data:`COMBINED_KEPT`, building one evicted another the same batch applies, whose rows then ran on
        the base model."""
        previous = self._in_use
        self._in_use = previous | frozenset(combination for combination in combinations if combination)
        try:
            yield
        finally:
            self._in_use = previous

    @contextlib.contextmanager
    def _applying(self, loaded: LoadedModel, names: Sequence[str]) -> Iterator[dict[str, Any]]:
        """PEFT's ``adapter_names`` (or its adapters disabled) and the stacks' rows for one model call."""
        with contextlib.ExitStack() as context:
            extra: dict[str, Any] = {}
            if loaded.model is not loaded.base_model:
                peft_names = [name if name in loaded.model.peft_config else BASE_ADAPTER_NAME for name in names]
                if all(name == BASE_ADAPTER_NAME for name in peft_names):  # PEFT's layers pass the base output on
                    context.enter_context(loaded.model.disable_adapter())
                else:
                    extra = {"adapter_names": peft_names}
            context.enter_context(self.stacked.rows(names))
            yield extra

    # Load and unload ---------------------------------------------------------------------------------------------

    def load(self, loaded: LoadedModel, adapter_id: str, path: str) -> None:
        """Load the PEFT adapter directory at ``path`` as ``adapter_id``: into a spare slot of its shape if one
        takes it, else into a new slot.

        Raises:
            InvalidAdapterError: The adapter is not valid, or does not fit the model; the model is as before.
        """
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes in a file name, kept as surrogates by os.fsdecode
            raise InvalidAdapterError(
                f"adapter path {path!r} is not valid UTF-8, which safetensors and PEFT need: "
                "rename or move the adapter directory",
                provider=self.provider,
                path=repr(path),
            ) from None
        if adapter_id in self.resident:  # never expected: the registry unloads before it loads again
            self.unload(loaded, adapter_id)
        adapter = read_peft_adapter(path, provider=self.provider)
        self._check_base_model(loaded, adapter)
        check_target_modules(adapter, loaded.module_names, loaded.name, self._refusal(adapter))
        keys = self._check_file_shapes(loaded, adapter)
        if keys is None or any(_BASE_LAYER_COPY.search(key) for key in keys):  # .bin: known once read
            try:
                tensors = self._read_weights(loaded, adapter)
            except Exception:  # PEFT's load below reports the unreadable file
                tensors = None
            if tensors is not None:
                kept = self._without_base_copies(loaded, adapter, tensors)
                if len(kept) < len(tensors):  # PEFT would load the copies from the file: load the rest from memory
                    self._load_tensors(loaded, adapter_id, adapter, kept)
                    return
        if self.stacking:
            try:
                tensors = self._read_weights(loaded, adapter)
            except Exception:  # PEFT's load below reports the unreadable file
                tensors = None
            if tensors is not None and self._stack(loaded, adapter_id, adapter.config, tensors):
                return
        peft = import_optional("peft", extra="transformers", provider=self.provider)
        shape = slot_shape(adapter.config)
        if shape in self._spare:
            try:
                tensors = self._read_weights(loaded, adapter)
            except Exception:  # a fresh load below reports the unreadable file
                tensors = None
            if tensors is not None and self._refill_spare(loaded, adapter_id, shape, tensors):
                return

        def build(peft_name: str) -> None:
            if loaded.model is loaded.base_model:
                loaded.model = peft.PeftModel.from_pretrained(
                    loaded.base_model,
                    str(adapter.path),
                    adapter_name=peft_name,
                    is_trainable=False,
                    torch_device=str(loaded.device),
                )
            else:
                loaded.model.load_adapter(
                    str(adapter.path), adapter_name=peft_name, is_trainable=False, torch_device=str(loaded.device)
                )

        self._new_slot(loaded, adapter_id, adapter, shape, build)

    def _read_weights(self, loaded: LoadedModel, adapter: PeftAdapter) -> dict[str, Any]:
        """The adapter file's tensors on the model's device, as PEFT's ``load_peft_weights`` reads them: a
        ``.safetensors`` file straight through safetensors, so an adapter served by the stacks never imports peft
        (2-4 s at the first load); anything else through PEFT."""
        if adapter.weights_path.suffix == ".safetensors" and not str(loaded.device).startswith("mps"):
            safetensors_torch = import_optional("safetensors.torch", extra="transformers", provider=self.provider)
            tensors: dict[str, Any] = safetensors_torch.load_file(str(adapter.weights_path), device=str(loaded.device))
            return tensors
        peft = import_optional("peft", extra="transformers", provider=self.provider)
        read: dict[str, Any] = peft.utils.load_peft_weights(str(adapter.path), device=str(loaded.device))
        return read

    def load_weights(self, loaded: LoadedModel, adapter_id: str, label: str, weights: AdapterWeights) -> None:
        """Put in-memory LoRA weights straight into the model (no file), as ``adapter_id``.

        ``weights`` is the copy the provider kept and checked at load (a reload after an eviction does not check
        it again: nothing can have changed it); ``label`` names it in errors.

        Raises:
            InvalidAdapterError: The weights do not fit the model; the model is as before.
        """
        if adapter_id in self.resident:
            self.unload(loaded, adapter_id)
        config = weights.config_dict()
        targets = config["target_modules"]  # a list of names, or one regular expression
        adapter = PeftAdapter(
            path=Path(label),
            weights_path=Path(label),
            rank=config["r"],
            alpha=float(config.get("lora_alpha", 8)),
            target_modules=tuple(sorted(targets)) if isinstance(targets, list) else (targets,),
            base_model_name_or_path=str(config.get("base_model_name_or_path") or ""),
            config=config,
        )
        self._check_base_model(loaded, adapter)
        check_target_modules(adapter, loaded.module_names, loaded.name, self._refusal(adapter))
        shapes = {name: tuple(tensor.shape) for name, tensor in weights.tensors.items()}
        check_layer_shapes(adapter, shapes, loaded.layer_features(), loaded.name, self._refusal(adapter))
        self._load_tensors(loaded, adapter_id, adapter, self._without_base_copies(loaded, adapter, weights.tensors))

    def _load_tensors(
        self, loaded: LoadedModel, adapter_id: str, adapter: PeftAdapter, weights: Mapping[str, Any]
    ) -> None:
        """Load checked LoRA tensors (a state dict, ``weights``) as ``adapter_id``: into the stacks, a spare slot of
        its shape, or a new slot."""
        config = adapter.config
        torch = import_optional("torch", extra="transformers", provider=self.provider)
        peft = import_optional("peft", extra="transformers", provider=self.provider)
        fields = peft.LoraConfig.__dataclass_fields__
        lora_config = peft.LoraConfig(
            **{key: value for key, value in config.items() if key in fields and key not in _NOT_CONFIG_ARGUMENTS}
        )
        lora_config.inference_mode = True
        dtype = next(loaded.base_model.parameters()).dtype
        tensors = {
            name: torch.as_tensor(tensor).detach().to(device=loaded.device, dtype=dtype)
            for name, tensor in weights.items()
        }
        if self.stacking and self._stack(loaded, adapter_id, config, tensors):
            return
        shape = slot_shape(config)
        if shape in self._spare and self._refill_spare(loaded, adapter_id, shape, tensors):
            return

        def build(peft_name: str) -> None:
            if loaded.model is loaded.base_model:
                loaded.model = peft.PeftModel(loaded.base_model, lora_config, adapter_name=peft_name)
            else:
                loaded.model.add_adapter(peft_name, lora_config)
            result = peft.set_peft_model_state_dict(loaded.model, tensors, adapter_name=peft_name)
            unexpected = [key for key in getattr(result, "unexpected_keys", []) if "lora_" in key]
            if unexpected:
                raise ValueError(f"tensors that match no module of the model: {', '.join(unexpected[:3])}")

        self._new_slot(loaded, adapter_id, adapter, shape, build)

    def unload(self, loaded: LoadedModel, adapter_id: str) -> None:
        """Take ``adapter_id`` out of the model (and every combination that uses it); its slot is kept as a spare
        while fewer than ``spare_limit`` are kept, else removed (the last one restores the plain model)."""
        if adapter_id not in self.resident:
            return  # nothing of it is in the model
        for key in [key for key in self._combined if any(part == adapter_id for part, _ in key)]:
            self._drop_combination(loaded, self._combined.pop(key))
        peft_name = self.resident.pop(adapter_id)
        if self.stacked.remove(peft_name):
            return
        shape = self._shapes.get(peft_name)
        spare = sum(len(slots) for slots in self._spare.values())
        if shape is not None and spare < self.spare_limit:
            self._spare.setdefault(shape, []).append(peft_name)  # kept for the next adapter of its shape
        else:
            self._shapes.pop(peft_name, None)
            self._drop(loaded, peft_name)
        empty_cuda_cache(loaded.device, provider=self.provider)

    def clear(self) -> None:
        """Forget every slot (the model they were in is being freed)."""
        self.resident.clear()
        self.stacked.close()
        self._shapes.clear()
        self._spare.clear()
        self._combined.clear()

    # Slots (private) ---------------------------------------------------------------------------------------------

    def _stack(self, loaded: LoadedModel, adapter_id: str, config: Mapping[str, Any], tensors: Any) -> bool:
        """Put ``adapter_id`` into the stacks under a new name: False when it cannot be stacked."""
        name = next(self._names)
        if not self.stacked.add(loaded, name, adapter_id, config, tensors):
            return False
        self.resident[adapter_id] = name
        return True

    def _drop_combination(self, loaded: LoadedModel, name: str) -> None:
        """Remove combination ``name``: its stacked part and its PEFT part, whichever it has."""
        self.stacked.remove(name)
        if loaded.model is not loaded.base_model and name in loaded.model.peft_config:
            loaded.model.delete_adapter(name)

    def _new_slot(
        self,
        loaded: LoadedModel,
        adapter_id: str,
        adapter: PeftAdapter,
        shape: str | None,
        build: Callable[[str], None],
    ) -> None:
        """Make a new slot with ``build(peft_name)`` for ``adapter_id``; a failed build leaves nothing behind."""
        peft_name = next(self._names)  # PEFT refuses some valid adapter ids (e.g. with a '.')
        try:
            build(peft_name)
        except Exception as error:
            self._discard_partial(loaded, peft_name)
            raise self._refusal(adapter)(
                f"could not be loaded into {loaded.name} ({type(error).__name__}: {error})"
            ) from error
        loaded.model.eval()
        self.resident[adapter_id] = peft_name
        if shape is not None:
            self._shapes[peft_name] = shape

    def _refill_spare(self, loaded: LoadedModel, adapter_id: str, shape: str, tensors: dict[str, Any]) -> bool:
        """Load ``tensors`` into a spare slot of ``shape``: True when every LoRA weight of the slot was replaced.

        A slot the tensors do not fill exactly (a module missing, a name of no module) is removed, never used
        with another adapter's weights left in it; the caller then loads the adapter the usual way, which reports
        what is wrong with it, if anything.
        """
        peft = import_optional("peft", extra="transformers", provider=self.provider)
        slots = self._spare[shape]
        peft_name = slots.pop()
        if not slots:
            del self._spare[shape]
        try:
            result = peft.set_peft_model_state_dict(loaded.model, tensors, adapter_name=peft_name)
            left = [key for key in result.missing_keys if f".{peft_name}." in key]
            unexpected = [key for key in result.unexpected_keys if "lora_" in key]
        except Exception:  # the slot is dropped and the adapter loaded anew
            left, unexpected = ["(failed)"], []
        if left or unexpected:
            self._shapes.pop(peft_name, None)
            self._drop(loaded, peft_name)
            return False
        self.resident[adapter_id] = peft_name
        self._shapes[peft_name] = shape
        return True

    def _drop(self, loaded: LoadedModel, peft_name: str) -> None:
        """Remove PEFT adapter ``peft_name`` from the model; the last one takes the PEFT wrapper with it."""
        others = [other for other in loaded.model.peft_config if other != peft_name]
        if others:
            if peft_name in loaded.model.active_adapters:  # PEFT warns when the active one is deleted
                loaded.model.set_adapter(others[0], inference_mode=True)
            loaded.model.delete_adapter(peft_name)
        else:
            loaded.model = loaded.model.unload()  # the last one: back to the plain model, no LoRA layers
            loaded.base_model = loaded.model

    def _discard_partial(self, loaded: LoadedModel, peft_name: str) -> None:
        """Remove what a failed load of PEFT adapter ``peft_name`` left behind, so the provider keeps working."""
        if loaded.model is not loaded.base_model:
            if peft_name in loaded.model.peft_config:
                self._drop(loaded, peft_name)
            return
        peft = import_optional("peft", extra="transformers", provider=self.provider)
        tuner_layer = peft.tuners.tuners_utils.BaseTunerLayer
        for name, module in list(loaded.base_model.named_modules()):
            if isinstance(module, tuner_layer):
                parent_name, _, child = name.rpartition(".")
                setattr(loaded.base_model.get_submodule(parent_name), child, module.get_base_layer())
        if hasattr(loaded.base_model, "peft_config"):
            del loaded.base_model.peft_config

    # Checks and errors -------------------------------------------------------------------------------------------

    def _check_file_shapes(self, loaded: LoadedModel, adapter: PeftAdapter) -> list[str] | None:
        """Read the safetensors header (no tensor data) and compare each LoRA matrix with its layer; the tensors'
        names (``None``: not a safetensors file, whose names are known once it is read)."""
        if adapter.weights_path.suffix != ".safetensors":
            return None
        safetensors = import_optional("safetensors", extra="transformers", provider=self.provider)
        try:
            with safetensors.safe_open(str(adapter.weights_path), framework="pt") as weights:
                shapes = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118
        except Exception as error:
            raise self._refusal(adapter)(
                f"has a corrupt or unreadable {adapter.weights_path.name} ({error}): save it again"
            ) from error
        check_layer_shapes(adapter, shapes, loaded.layer_features(), loaded.name, self._refusal(adapter))
        return list(shapes)

    def _without_base_copies(
        self, loaded: LoadedModel, adapter: PeftAdapter, tensors: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``tensors`` without the copies of base layers PEFT saves beside a LoRA on an embedding or the output layer
        (``save_embedding_layers="auto"``: ``...embed_tokens.base_layer.weight``), each checked against the model.

        PEFT would load such a copy into the shared model, changing every request's answer (a copy saved in
        bfloat16 rounds a float32 model's layer), and unloading the adapter would not undo it; the stacks would
        ignore it. A copy equal to the model's layer (in the narrower of their dtypes: a float32 copy of a model
        served in bfloat16, a bfloat16 copy of a float32 model) adds nothing and is left out; one that differs (the
        adapter was trained on another checkpoint, or with resized embeddings) is refused.

        Raises:
            InvalidAdapterError: A copy is not of a layer of the model, or differs from it.
        """
        torch = import_optional("torch", extra="transformers", provider=self.provider)
        modules = dict(loaded.base_model.named_modules())
        kept: dict[str, Any] = {}
        for key, tensor in tensors.items():
            copy = _BASE_LAYER_COPY.search(key)
            if copy is None:
                kept[key] = tensor
                continue
            name = key[: copy.start()].removeprefix("base_model.model.")
            module = modules.get(name)
            layer = getattr(getattr(module, "base_layer", module), copy["parameter"], None)
            saved = torch.as_tensor(tensor)
            if layer is None or tuple(layer.shape) != tuple(saved.shape):
                raise self._refusal(adapter)(
                    f"holds {key!r}, a copy of a base layer {loaded.name} does not have in that shape: it was "
                    "trained on another model"
                )
            layer = layer.detach().to(device=saved.device)
            if not (torch.equal(layer.to(saved.dtype), saved) or torch.equal(saved.to(layer.dtype), layer)):
                raise self._refusal(adapter)(
                    f"holds {key!r}, a copy of the base model's {name} that differs from {loaded.name}'s (PEFT "
                    "saves it with a LoRA on an embedding or output layer, save_embedding_layers='auto'; it differs "
                    "when the adapter was trained on another checkpoint or with resized embeddings). Loading it "
                    "would change that layer for every request: serve the adapter on the model it was trained on, "
                    "or, if that layer is this model's, save it with save_embedding_layers=False"
                )
        return kept

    def _check_base_model(self, loaded: LoadedModel, adapter: PeftAdapter) -> None:
        """Refuse an adapter trained on another architecture (its matrices may have this model's shapes and load,
        then answer with wrong text), as llama.cpp does: :func:`~inference.adapters.peft.check_base_model`."""
        model_type = getattr(getattr(loaded.base_model, "config", None), "model_type", None)
        check_base_model(adapter, model_name=loaded.name, model_type=model_type, provider=self.provider)

    def _refusal(self, adapter: PeftAdapter) -> Callable[[str], InvalidAdapterError]:
        """Builds the error that refuses ``adapter`` for a reason (``"adapter at PATH <reason>"``)."""

        def refuse(reason: str) -> InvalidAdapterError:
            return InvalidAdapterError(
                f"adapter at {adapter.path} {reason}", provider=self.provider, path=str(adapter.path)
            )

        return refuse

    def _not_loaded(self, adapter_id: str) -> Exception:
        return adapter_not_loaded(adapter_id, self.resident, provider=self.provider)


@contextlib.contextmanager
def _combinable(model: Any, names: list[str], *, provider: str) -> Iterator[None]:
    """Let PEFT's ``add_weighted_adapter`` build a combination of ``names`` that is their weighted sum.

    PEFT gives the combination the first adapter's config but for its rank, alpha and targets. The ``"cat"``
    weights already carry each adapter's own scale, so the combination's must be 1: the first adapter's rsLoRA
    would make it ``sqrt(rank)``, its ``layers_to_transform`` would leave out the other adapters' layers, and its
    ``init_lora_weights`` would run again. A neutral copy of that config stands in while PEFT builds, which
    covers exactly the modules where one of the adapters has LoRA weights (every other module excluded by name:
    whatever layers, patterns and exclusions the adapters had). PEFT's combination drops ``lora_bias``: refused.

    Raises:
        UnsupportedOperationError: An adapter has ``lora_bias``.
    """
    configs = [model.peft_config[name] for name in names]
    if any(getattr(config, "lora_bias", False) for config in configs):
        raise UnsupportedOperationError(
            "an adapter trained with lora_bias cannot take a scale, or be combined, on Transformers (PEFT's "
            "weighted combination leaves its bias out): use it alone, without a scale",
            provider=provider,
        )
    modules = list(model.base_model.model.named_modules())  # as PEFT names them when it injects the combination
    held = {
        key for key, module in modules
        if any(name in getattr(module, "lora_A", {}) or name in getattr(module, "lora_embedding_A", {})
               for name in names)
    }
    first = configs[0]
    model.peft_config[names[0]] = dataclasses.replace(
        first, use_rslora=False, init_lora_weights=True, layers_to_transform=None, layers_pattern=None,
        exclude_modules=[key for key, _ in modules if key and key not in held],
    )
    try:
        yield
    finally:
        model.peft_config[names[0]] = first
