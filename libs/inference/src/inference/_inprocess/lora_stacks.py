"""LoRA adapters applied to a batch in one pass per layer, however many distinct adapters its rows use.

PEFT's mixed-adapter batches (``adapter_names=[...]``) run each LoRA layer once per distinct adapter in the batch:
a Python loop with index copies per module per step, so a batch of 8 adapters costs 8 small LoRA passes per layer.
Here the adapters' matrices are kept stacked per module (vLLM's LoRA slots and Punica's SGMV/BGMV do the same):

- every adapter has a *slot*; slot 0 is "no adapter" (all zeros), for base-model rows;
- for each adapted module, ``A`` is ``[slots, R, in]``, ``B`` is ``[slots, out, R]`` and each slot has its scaling;
  ``R`` is at least the largest rank of the module's adapters, smaller ranks are padded with zeros (which add
  exactly nothing);
- a forward hook on each adapted ``nn.Linear`` adds ``(x @ A[slot]^T @ B[slot]^T) * scaling[slot]`` for each row, for
  all rows at once. The products run in PEFT's order, scaling last: folding the scaling into ``B`` rounds
  differently, and on a sensitive model that alone moves logprobs by 4e-4. A scaling that is a power of two (PEFT's
  usual ``alpha = 2r``, ``alpha = r``) is folded into ``A``: that is exact, and saves a pass over the output.

How a batch is applied (:class:`_RowPlan`, built once per ``generate`` or forward pass, reused at every step):

- one slot for every row: two plain matrix products with that slot's ``A`` and ``B``;
- a few distinct slots (up to :data:`MASKED_MAX_SLOTS`): the distinct slots' ``A`` side by side (``[U*R, in]``) and
  ``B`` one under the other, two dense products and a mask that keeps each row's own block (exact: the other blocks
  are multiplied by zero);
- many distinct slots: each row's ``A`` and ``B`` gathered, two batched products (``torch.bmm``).

Loads write an adapter's matrices into a free slot (zeroing what a previous adapter left there, in every module),
unloads free it: no LoRA layer is built or torn down. The stacks give memory back as adapters leave, so that one
large adapter loaded once does not keep its size (and slow every later batch) for good:

- a module's ``R`` grows to a new adapter's rank, and shrinks to the largest rank still in use once that is half of
  ``R`` or less (then the padding would be half the memory or more; shrinking at every unload would copy the whole
  stack back and forth as adapters of two ranks come and go). With no adapter left in a module its matrices hold
  nothing. The products of a batch use the largest rank of the batch's own adapters, never the padding beyond it;
- the slots double as adapters arrive and halve once those in use (up to the highest slot in use: slots are not
  renumbered, a loaded adapter keeps its slot) fit in a quarter of them; a load takes the lowest free slot, so the
  slots in use stay low;
- a module no adapter in use targets any more loses its stack and its hook: with no adapter left, the stacks hold
  nothing and the model runs as it was.

A weighted combination of adapters (``[("a", 1.0), ("b", 0.5)]``) is one more slot whose matrices are the parts'
side by side, each part's ``B`` times its weight (PEFT's ``"cat"`` combination: the delta is exactly the weighted
sum).

torch is passed in by the caller (this module imports nothing heavy).
"""

from __future__ import annotations

import contextlib
import heapq
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MASKED_MAX_SLOTS",
    "LoraModuleWeights",
    "LoraStacks",
    "lora_module_weights",
    "not_stackable_reason",
]

MASKED_MAX_SLOTS = 16
"""The most distinct adapters a batch applies with the masked dense products; beyond, rows gather their weights."""

_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")

_NOT_STACKABLE = {
    "use_dora": "DoRA adapters scale each output by a learned magnitude",
    "modules_to_save": "modules_to_save replaces whole modules",
    "trainable_token_indices": "trainable tokens change the embeddings",
    "layer_replication": "layer replication changes the model's layers",
    "target_parameters": "target_parameters adapts parameters, not linear layers",
    "fan_in_fan_out": "fan_in_fan_out weights are stored transposed (Conv1D models)",
    "use_qalora": "QALoRA pools the inputs",
    "lora_bias": "lora_bias adds a bias to B",
}
"""Config keys that, when set, give an adapter more than plain linear LoRA matrices, and why."""


@dataclass(frozen=True)
class LoraModuleWeights:
    """One module's LoRA matrices and scaling: the module's output gains ``scaling * B @ A @ x``.

    Attributes:
        a: ``lora_A``, shape ``(rank, in_features)``.
        b: ``lora_B``, shape ``(out_features, rank)``.
        scaling: PEFT's scaling for this module (``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA).
    """

    a: Any
    b: Any
    scaling: float


def not_stackable_reason(config: Mapping[str, Any]) -> str | None:
    """Why an adapter with ``config`` cannot go into the stacks (then PEFT serves it), or ``None`` if it can."""
    for key, reason in _NOT_STACKABLE.items():
        if config.get(key):
            return reason
    if config.get("bias", "none") != "none":
        return "bias other than 'none' trains the layers' biases"
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        return f"{config.get('peft_type')} is not LoRA"
    variant = config.get("init_lora_weights")
    if isinstance(variant, str) and variant.lower().startswith(("olora", "pissa", "corda", "eva", "loftq")):
        return f"init_lora_weights={variant!r} changes the base weights"
    return None


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """PEFT's ``rank_pattern``/``alpha_pattern`` lookup: the first key that matches the end of the module name."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def lora_module_weights(
    config: Mapping[str, Any], tensors: Mapping[str, Any], *, modules: Mapping[str, Any]
) -> dict[str, LoraModuleWeights]:
    """An adapter's matrices per module of the model, from its config and its PEFT state dict.

    The scaling of each module follows PEFT: ``lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``), with ``r``
    and ``lora_alpha`` taken from ``rank_pattern`` / ``alpha_pattern`` where a key matches the module's name.

    Args:
        config: The adapter's ``adapter_config.json``.
        tensors: Its state dict (``base_model.model.<module>.lora_A.weight`` names, or without the prefix).
        modules: The model's modules by name (``dict(model.named_modules())``).

    Raises:
        ValueError: A tensor names no module of the model, a module has ``lora_A`` without ``lora_B``, or a
            shape does not fit its module.
    """
    halves: dict[str, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        match = _LORA_KEY.fullmatch(key)
        if match is None:
            if ".lora_" in key:  # lora_embedding_A, a DoRA magnitude...: more than a linear layer's A and B
                raise ValueError(f"{key} is not a linear layer's lora_A or lora_B")
            continue
        halves.setdefault(match["module"], {})[match["which"]] = tensor
    rank_pattern = config.get("rank_pattern") or {}
    alpha_pattern = config.get("alpha_pattern") or {}
    weights: dict[str, LoraModuleWeights] = {}
    for module, pair in sorted(halves.items()):
        if module not in modules:
            raise ValueError(f"lora weights for {module}, which the model does not have")
        if set(pair) != {"A", "B"}:
            raise ValueError(f"{module} has lora_{''.join(pair)} without its other half")
        a, b = pair["A"], pair["B"]
        layer = modules[module]
        in_features, out_features = getattr(layer, "in_features", None), getattr(layer, "out_features", None)
        if (
            len(a.shape) != 2
            or len(b.shape) != 2
            or a.shape[0] != b.shape[1]
            or (in_features is not None and a.shape[1] != in_features)
            or (out_features is not None and b.shape[0] != out_features)
        ):
            raise ValueError(
                f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit a layer of "
                f"{in_features} inputs and {out_features} outputs"
            )
        rank = int(_pattern_value(rank_pattern, module, config.get("r", a.shape[0])))
        if a.shape[0] != rank:  # PEFT builds the layer of the config's rank, and fails to load these
            raise ValueError(f"{module} has weights of rank {a.shape[0]} where the config says {rank}")
        alpha = float(_pattern_value(alpha_pattern, module, config.get("lora_alpha", 8)))
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        weights[module] = LoraModuleWeights(a=a, b=b, scaling=scaling)
    return weights


def _power_of_two(value: float) -> bool:
    """Whether ``value`` is a positive power of two (multiplying by it only moves the exponent)."""
    return value > 0 and math.isfinite(value) and math.frexp(value)[0] == 0.5


class _ModuleStack:
    """One module's stacked matrices: ``a`` is ``[slots, R, in]``, ``b`` is ``[slots, out, R]``, ``scale`` is
    ``[slots]``."""

    def __init__(self, torch: Any, capacity: int, in_features: int, out_features: int, dtype: Any, device: Any):
        self.torch = torch
        self.rank = 0
        self.a = torch.zeros((capacity, 0, in_features), dtype=dtype, device=device)
        self.b = torch.zeros((capacity, out_features, 0), dtype=dtype, device=device)
        self.scale = torch.zeros((capacity,), dtype=dtype, device=device)
        self.ranks: dict[int, int] = {}  # slot -> its adapter's rank in this module

    def grow_slots(self, capacity: int) -> None:
        extra = capacity - self.a.shape[0]
        if extra > 0:
            self.a = self.torch.cat([self.a, self.a.new_zeros((extra, *self.a.shape[1:]))])
            self.b = self.torch.cat([self.b, self.b.new_zeros((extra, *self.b.shape[1:]))])
            self.scale = self.torch.cat([self.scale, self.scale.new_zeros((extra,))])

    def shrink_slots(self, capacity: int) -> None:
        contiguous = self.torch.contiguous_format
        self.a = self.a[:capacity].clone(memory_format=contiguous)  # a copy: a view would keep all the memory
        self.b = self.b[:capacity].clone(memory_format=contiguous)
        self.scale = self.scale[:capacity].clone(memory_format=contiguous)

    def grow_rank(self, rank: int) -> None:
        extra = rank - self.rank
        if extra > 0:
            slots, _, in_features = self.a.shape
            out_features = self.b.shape[1]
            self.a = self.torch.cat([self.a, self.a.new_zeros((slots, extra, in_features))], dim=1)
            self.b = self.torch.cat([self.b, self.b.new_zeros((slots, out_features, extra))], dim=2)
            self.rank = rank

    def fit_rank(self) -> None:
        """Shrink ``R`` to the largest rank in use once that is half of ``R`` or less (none in use: to 0)."""
        rank = max(self.ranks.values(), default=0)
        if 2 * rank <= self.rank:
            contiguous = self.torch.contiguous_format
            self.a = self.a[:, :rank].clone(memory_format=contiguous)
            self.b = self.b[:, :, :rank].clone(memory_format=contiguous)
            self.rank = rank

    @property
    def nbytes(self) -> int:
        return int(self.a.nbytes) + int(self.b.nbytes) + int(self.scale.nbytes)

    def write(self, slot: int, a: Any, b: Any, scaling: float) -> None:
        rank = int(a.shape[0])
        self.grow_rank(rank)
        self.a[slot].zero_()
        self.b[slot].zero_()
        self.a[slot, :rank] = a
        self.b[slot, :, :rank] = b
        self.scale[slot] = scaling
        self.ranks[slot] = rank

    def clear(self, slot: int) -> None:
        if self.ranks.pop(slot, None) is not None:
            self.a[slot].zero_()
            self.b[slot].zero_()
            self.scale[slot] = 0
            self.fit_rank()


class _RowPlan:
    """How one batch's rows get their adapters in one module, worked out once and reused at every step.

    ``rows`` is ``slots`` as a list; ``masks`` is shared by the modules of one batch (the same adapters and rank
    give the same mask).
    """

    def __init__(
        self, torch: Any, stack: _ModuleStack, slots: Any, distinct: list[int], rows: list[int], masks: dict[Any, Any]
    ) -> None:
        self.torch = torch
        used = [slot for slot in distinct if slot in stack.ranks]
        self.skip = not used
        self.single: tuple[Any, Any, float] | None = None
        self.masked: tuple[Any, Any, Any] | None = None
        self.gathered: tuple[Any, Any] | None = None
        self.scale: Any = None
        if self.skip:
            return
        if len(distinct) == 1 and 0 not in rows:
            slot = distinct[0]
            rank = stack.ranks[slot]  # its own rank: padding would only change how the sums are rounded
            a, scale = stack.a[slot, :rank].t(), float(stack.scale[slot])
            if _power_of_two(scale):  # exact in A: x @ (2^k A) is 2^k (x @ A) to the bit, one product less
                a, scale = a * scale, 1.0
            self.single = (a, stack.b[slot, :, :rank].t(), scale)
            return
        self.scale = stack.scale.index_select(0, slots)  # per row; 0 for rows without an adapter here
        rank = max(stack.ranks[slot] for slot in used)  # the batch's own: the stack's padding beyond adds nothing
        if len(used) <= MASKED_MAX_SLOTS:
            index = torch.tensor(used, dtype=torch.long, device=stack.a.device)
            a = stack.a[:, :rank].index_select(0, index).reshape(len(used) * rank, -1).t()  # [in, U*R]
            b = stack.b[:, :, :rank].index_select(0, index).permute(0, 2, 1).reshape(len(used) * rank, -1)  # [U*R, out]
            key = (tuple(used), rank, stack.a.dtype)
            mask = masks.get(key)
            if mask is None:
                position = {slot: number for number, slot in enumerate(used)}
                blocks = torch.tensor([position.get(slot, -1) for slot in rows], device=stack.a.device)  # -1: none
                columns = torch.arange(len(used) * rank, device=stack.a.device) // rank
                mask = masks[key] = columns[None, :] == blocks[:, None]  # each row's own block
            self.masked = (a, b, mask)
        else:
            self.gathered = (stack.a[:, :rank].index_select(0, slots), stack.b[:, :, :rank].index_select(0, slots))

    def delta(self, x: Any) -> Any:
        """What the rows' adapters add to the module's output for input ``x`` (``[rows, ..., in]``)."""
        torch = self.torch
        if self.single is not None:
            a, b, scale = self.single
            return (x @ a) @ b if scale == 1.0 else ((x @ a) @ b) * scale
        per_row = self.scale.view((x.shape[0],) + (1,) * (x.dim() - 1))
        if self.masked is not None:
            a, b, mask = self.masked
            hidden = x @ a  # [rows, ..., U*R]
            shape = (mask.shape[0],) + (1,) * (hidden.dim() - 2) + (mask.shape[1],)
            # selected, not multiplied by the mask: another row's overflow (inf) times 0 would be NaN in this row
            return (torch.where(mask.view(shape), hidden, 0.0) @ b) * per_row
        assert self.gathered is not None
        a, b = self.gathered  # [rows, R, in], [rows, out, R]
        flat = x.reshape(x.shape[0], -1, x.shape[-1])
        hidden = torch.bmm(flat, a.transpose(1, 2))
        return torch.bmm(hidden, b.transpose(1, 2)).reshape(*x.shape[:-1], b.shape[1]) * per_row


class LoraStacks:
    """The stacked LoRA matrices of the adapters in one model, and the hooks that apply them per row.

    Only the worker thread that drives the model uses it: :meth:`add`, :meth:`remove` and :meth:`rows` never
    overlap with a forward pass.

    Args:
        torch: The torch module.
        model: The model whose ``nn.Linear`` modules adapters target (names as in ``model.named_modules()``).
        dtype: The dtype the matrices are kept and applied in (the model's).
        device: Where they live (the model's device).
    """

    def __init__(self, torch: Any, model: Any, *, dtype: Any, device: Any) -> None:
        self.torch = torch
        # A module PEFT has wrapped is hooked at its base layer, which PEFT calls and gives back when it unloads.
        self.modules: dict[str, Any] = {
            name: module.get_base_layer() if hasattr(module, "get_base_layer") else module
            for name, module in model.named_modules()
        }
        self.dtype = dtype
        self.device = device
        self._capacity = 1  # the slots handed out so far, slot 0 (no adapter) included
        self._allocated = 2  # the slots every module's stack has room for
        self._free: list[int] = []  # a heap: the lowest free slot first
        self._used: set[int] = set()
        self._stacks: dict[str, _ModuleStack] = {}  # the modules some adapter in use targets
        self._hooks: dict[str, Any] = {}
        self._plans: dict[str, _RowPlan] | None = None
        self._slots: Any = None
        self._distinct: list[int] = []
        self._rows: list[int] = []
        self._masks: dict[Any, Any] = {}

    @property
    def adapters(self) -> int:
        """How many slots hold an adapter (or a combination)."""
        return len(self._used)

    @property
    def nbytes(self) -> int:
        """The bytes the stacked matrices and scalings take (given back as adapters are removed)."""
        return sum(stack.nbytes for stack in self._stacks.values())

    def add(self, weights: Mapping[str, LoraModuleWeights]) -> int:
        """Write an adapter's matrices into a free slot and return the slot (1 or more).

        Raises:
            ValueError: A module is not a linear layer of the model.
        """
        for module in weights:
            layer = self.modules.get(module)
            if layer is None or not hasattr(layer, "in_features") or not hasattr(layer, "out_features"):
                raise ValueError(f"{module} is not a linear layer of the model")
        # A write inside a forward pass's inference mode makes an inference tensor a later write refuses.
        with self.torch.inference_mode(False):
            slot = heapq.heappop(self._free) if self._free else self._new_slot()  # the lowest free slot
            self._used.add(slot)
            try:
                for module, stack in self._stacks.items():
                    if module not in weights:
                        stack.clear(slot)
                for module, entry in weights.items():
                    stack = self._stack(module)
                    a = self.torch.as_tensor(entry.a).to(device=self.device, dtype=self.dtype)
                    b = self.torch.as_tensor(entry.b).to(device=self.device, dtype=self.dtype)
                    stack.write(slot, a, b, entry.scaling)
            except BaseException:
                self.remove(slot)
                raise
        return slot

    def add_combination(self, parts: Sequence[tuple[int, float]]) -> int:
        """A slot that applies several slots at once, each times its weight (their ranks side by side).

        As PEFT's ``"cat"`` combination: each part's ``A`` times its weight and its scaling, the ``B`` as they are,
        scaling 1.
        """
        weights: dict[str, LoraModuleWeights] = {}
        for module, stack in self._stacks.items():
            pieces = [
                (stack.a[slot, :rank] * (weight * float(stack.scale[slot])), stack.b[slot, :, :rank])
                for slot, weight in parts
                if (rank := stack.ranks.get(slot))
            ]
            if pieces:
                a = self.torch.cat([a for a, _ in pieces], dim=0)
                b = self.torch.cat([b for _, b in pieces], dim=1)
                weights[module] = LoraModuleWeights(a=a, b=b, scaling=1.0)
        return self.add(weights)

    def remove(self, slot: int) -> None:
        """Free ``slot`` (its matrices are zeroed, so no row can ever use them again), and give back the memory the
        adapters still in use do not need (ranks and slots shrink, see the module's docstring)."""
        if slot not in self._used:
            return
        with self.torch.inference_mode(False):  # the shrunk copies must not be inference tensors (as in add)
            self._used.discard(slot)
            for module, stack in list(self._stacks.items()):
                stack.clear(slot)
                if not stack.ranks:  # no adapter in use targets it: no matrices, no hook
                    del self._stacks[module]
                    self._hooks.pop(module).remove()
            top = max(self._used, default=0) + 1  # slots 0 to the highest in use; those above are free
            self._free = [free for free in (*self._free, slot) if free < top]
            heapq.heapify(self._free)
            self._capacity = top
            allocated = self._allocated
            while allocated >= 4 and top <= allocated // 4:
                allocated //= 2
            if allocated < self._allocated:
                self._allocated = allocated
                for stack in self._stacks.values():
                    stack.shrink_slots(allocated)

    @contextlib.contextmanager
    def rows(self, slots: Sequence[int]) -> Iterator[None]:
        """Apply ``slots[i]``'s adapter to row ``i`` of every forward pass inside the block (0: none)."""
        unknown = [slot for slot in slots if slot != 0 and slot not in self._used]
        if unknown:
            raise ValueError(f"adapter slots {unknown} hold no adapter")
        self._slots = self.torch.tensor(list(slots), dtype=self.torch.long, device=self.device)
        self._distinct = sorted({slot for slot in slots if slot != 0})
        self._rows = list(slots)
        self._masks = {}
        self._plans = {}
        try:
            yield
        finally:
            self._plans = None
            self._masks = {}
            self._slots = None

    def close(self) -> None:
        """Remove the hooks and free the matrices."""
        for hook in self._hooks.values():
            hook.remove()
        self._hooks.clear()
        self._stacks.clear()
        self._used.clear()
        self._free.clear()
        self._capacity = 1
        self._allocated = 2

    def _new_slot(self) -> int:
        slot = self._capacity
        self._capacity += 1
        if self._capacity > self._allocated:
            self._allocated *= 2
            for stack in self._stacks.values():
                stack.grow_slots(self._allocated)
        return slot

    def _stack(self, module: str) -> _ModuleStack:
        stack = self._stacks.get(module)
        if stack is None:
            layer = self.modules[module]
            stack = _ModuleStack(
                self.torch, self._allocated, layer.in_features, layer.out_features, self.dtype, self.device
            )
            self._stacks[module] = stack
            self._hooks[module] = layer.register_forward_hook(self._hook(module))
        return stack

    def _hook(self, module: str) -> Any:
        def add_delta(layer: Any, inputs: tuple[Any, ...], output: Any) -> Any:
            plans = self._plans
            if plans is None or not self._distinct:
                return output
            plan = plans.get(module)
            if plan is None:
                plan = plans[module] = _RowPlan(
                    self.torch, self._stacks[module], self._slots, self._distinct, self._rows, self._masks
                )
            if plan.skip:
                return output
            x = inputs[0]
            if x.shape[0] != self._slots.shape[0]:
                raise RuntimeError(
                    f"a forward pass of {x.shape[0]} rows inside LoraStacks.rows() for {self._slots.shape[0]} rows"
                )
            delta = plan.delta(x.to(self.dtype)).to(output.dtype)
            if self.torch.is_grad_enabled():
                return output + delta
            return output.add_(delta)  # the same sum, in place: no third tensor of the output's size

        return add_delta
