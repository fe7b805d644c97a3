"""LoRA weights held in memory (a training or hypernetwork loop's output), loadable like an adapter directory.

``await provider.load_adapter("step-42", AdapterWeights(tensors, config))`` works wherever a path does. Backends
that take files get a private temporary PEFT directory (``adapter_model.safetensors`` + ``adapter_config.json``),
written by the provider base class and removed when the adapter is unloaded (or the provider is closed). Nothing
here imports torch or numpy until weights are checked or written.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference._core.validation import FLOAT32_MAX
from inference.adapters.peft import CONFIG_NAME, check_lora_config, check_ranks
from inference.adapters.peft_targets import untargeted_reason
from inference.exceptions import ConfigurationError, InvalidAdapterError, MissingDependencyError

__all__ = ["AdapterWeights"]

WEIGHTS_NAME = "adapter_model.safetensors"
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<side>[AB])\.weight$")


@dataclass(frozen=True)
class AdapterWeights:
    """A LoRA adapter in memory: PEFT's state dict and its config.

    Args:
        tensors: Tensor name -> tensor, named as ``peft.get_peft_model_state_dict(model)`` names them
            (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``...); torch tensors or numpy
            arrays. ``lora_A`` is ``(r, in_features)``, ``lora_B`` is ``(out_features, r)``.
        config: A ``peft.LoraConfig``, or its dict (as in ``adapter_config.json``).

    Example:
        >>> import numpy as np
        >>> weights = AdapterWeights(
        ...     {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((2, 8), "float32"),
        ...      "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((8, 2), "float32")},
        ...     {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]},
        ... )
        >>> weights.config_dict()["r"]
        2
    """

    tensors: Mapping[str, Any]
    config: Any

    def config_dict(self) -> dict[str, Any]:
        """The config as ``adapter_config.json`` holds it (sets as sorted lists, enums as their values)."""
        raw = self.config.to_dict() if hasattr(self.config, "to_dict") else self.config
        if not isinstance(raw, Mapping):
            raise InvalidAdapterError(
                f"AdapterWeights.config must be a peft.LoraConfig or a dict, got {type(self.config).__name__}"
            )
        try:
            plain = _plain(dict(raw))
        except RecursionError:
            raise InvalidAdapterError(
                "AdapterWeights.config is nested too deeply to be a LoRA config: give a peft.LoraConfig or its dict"
            ) from None
        plain.setdefault("peft_type", "LORA")
        try:  # what adapter_config.json will hold: JSON, or nothing can be written
            json.dumps(plain, allow_nan=True)
        except (TypeError, ValueError) as error:
            raise InvalidAdapterError(
                f"AdapterWeights.config holds a value that is not JSON ({error}): give a peft.LoraConfig or a dict "
                "of strings, numbers, lists and dicts"
            ) from None
        return plain  # type: ignore[no-any-return]

    def check(self, *, provider: str | None = None) -> dict[str, Any]:
        """Refuse weights no backend can serve, as :func:`~inference.adapters.peft.read_peft_adapter` refuses a
        directory; return the config dict.

        Checks the config (see :func:`~inference.adapters.peft.check_lora_config`), then every tensor: named
        ``<module>.lora_A.weight`` / ``<module>.lora_B.weight`` in pairs, a torch tensor or numpy array of
        floating point numbers (float16, bfloat16 for torch, float32 or float64) that holds its values (not on
        torch's meta device), 2-D, non-empty, the rank (``r`` or its ``rank_pattern`` entry) on the shared side,
        the module among ``target_modules`` (names, or one regular expression, as PEFT matches them), and every
        value finite and within float32's range.

        Raises:
            InvalidAdapterError: The message says which tensor or setting is wrong.
        """

        def refuse(reason: str) -> InvalidAdapterError:
            return InvalidAdapterError(f"adapter weights in memory {reason}", provider=provider)

        config = self.config_dict()
        check_lora_config(config, refuse)
        if not isinstance(self.tensors, Mapping) or not self.tensors:
            raise refuse("have no tensors: give get_peft_model_state_dict(model)'s dict")
        shapes: dict[str, tuple[int, ...]] = {}
        sides: dict[str, set[str]] = {}
        for name, tensor in self.tensors.items():
            match = _LORA_KEY.fullmatch(name) if isinstance(name, str) else None
            if match is None:
                raise refuse(
                    f"hold a tensor {repr(name)[:100]} that is not a LoRA matrix (<module>.lora_A.weight or "
                    ".lora_B.weight); pass the state dict of get_peft_model_state_dict(model)"
                )
            problem = _tensor_problem(tensor)
            if problem is not None:
                raise refuse(f"hold {name} {problem}")
            shape = tuple(int(size) for size in tensor.shape)
            if len(shape) != 2 or not all(size > 0 for size in shape):
                raise refuse(f"hold {name} with shape {shape}: LoRA matrices are 2-D and non-empty")
            shapes[name] = shape
            sides.setdefault(match["module"], set()).add(match["side"])
        for module, found in sorted(sides.items()):
            if found != {"A", "B"}:
                missing = "lora_B" if "A" in found else "lora_A"
                raise refuse(f"hold no {module}.{missing}.weight for its pair")
            reason = untargeted_reason(config, module)
            if reason is not None:  # PEFT would build no layer for it, and ignore these weights
                raise refuse(f"hold {module}, which {reason}")
        check_ranks(config, shapes, refuse)
        for name, tensor in self.tensors.items():
            problem = _value_problem(tensor)
            if problem is not None:
                raise refuse(f"hold {name} with {problem}")
        return config

    def snapshot(self) -> AdapterWeights:
        """A copy that later changes to the caller's tensors do not reach: what a provider keeps at load.

        ``get_peft_model_state_dict(model)`` gives views of the live training parameters, which the next
        optimizer step changes in place; an adapter must keep the weights it was loaded with until it is replaced.
        Each torch tensor is detached and copied to the CPU (an evicted adapter holds no device memory), each
        numpy array copied, in its own dtype; the config becomes its dict. A value that cannot be copied (not a
        tensor, or a meta tensor) is kept as it is, for :meth:`check` to refuse with its reason.

        Raises:
            InvalidAdapterError: The config is neither a ``peft.LoraConfig`` nor a dict.
        """
        tensors = self.tensors
        if isinstance(tensors, Mapping):
            tensors = {name: _copied(tensor) for name, tensor in tensors.items()}
        return AdapterWeights(tensors, self.config_dict())

    def save(self, directory: str | os.PathLike[str], *, provider: str | None = None) -> Path:
        """Check the weights, then write them as a PEFT adapter directory; returns it.

        Raises:
            InvalidAdapterError: See :meth:`check`.
            ConfigurationError: A file cannot be written (a full disk); the message names it.
        """
        config = self.check(provider=provider)
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        first = next(iter(self.tensors.values()))
        if type(first).__module__.startswith("torch"):
            try:  # torch tensors come with torch; safetensors writes them (it comes with transformers)
                import torch
                from safetensors.torch import save_file as save_torch
            except ImportError as error:
                raise _missing(error, provider) from error

            with _writing(target / WEIGHTS_NAME, provider):
                save_torch(
                    {name: torch.as_tensor(t).detach().to("cpu").contiguous() for name, t in self.tensors.items()},
                    str(target / WEIGHTS_NAME),
                    metadata={"format": "pt"},
                )
        else:
            try:
                import numpy as np
                from safetensors.numpy import save_file as save_numpy
            except ImportError as error:
                raise _missing(error, provider) from error

            with _writing(target / WEIGHTS_NAME, provider):
                save_numpy(
                    {name: np.ascontiguousarray(_as_numpy(t)) for name, t in self.tensors.items()},
                    str(target / WEIGHTS_NAME),
                    metadata={"format": "pt"},
                )
        with _writing(target / CONFIG_NAME, provider):
            (target / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
        return target


@contextlib.contextmanager
def _writing(path: Path, provider: str | None) -> Iterator[None]:
    """A write of ``path`` the system refuses (a full disk) as one error naming the file.

    safetensors reports it as its own ``SafetensorError`` ("I/O error: No space left on device"), naming no file.
    """
    try:
        yield
    except Exception as error:
        if not isinstance(error, OSError) and type(error).__name__ != "SafetensorError":
            raise
        reason = (error.strerror or str(error)) if isinstance(error, OSError) else str(error)
        raise ConfigurationError(
            f"cannot write the adapter weights file {path}: {reason}: check that {path.parent} is writable and "
            "has free space",
            provider=provider,
            path=str(path),
        ) from error


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(item) for item in value)
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if type(value).__module__.split(".")[0] in ("numpy", "torch") and getattr(value, "ndim", None) == 0:
        return _plain(value.item())  # np.float32(0.05), a 0-d tensor: the number (what PEFT's to_dict keeps)
    return value


def _copied(tensor: Any) -> Any:
    """``tensor`` copied to the CPU, detached from any autograd graph; as it is when it cannot be copied."""
    module = type(tensor).__module__
    try:
        if module.startswith("torch"):
            return tensor.detach().to("cpu", copy=True)
        if module.startswith("numpy"):
            return tensor.copy()
    except Exception:  # a meta tensor, a tensor subclass that refuses: check() says what is wrong with it
        return tensor
    return tensor


def _missing(error: ImportError, provider: str | None) -> MissingDependencyError:
    """What writing weights from memory needs and lacks: tensors need their own package, the file safetensors."""
    return MissingDependencyError(
        f"writing adapter weights from memory needs the Python package {error.name or 'safetensors'!r} "
        f"({error}): pip install safetensors numpy (torch tensors need torch too)",
        provider=provider,
    )


def _as_numpy(tensor: Any) -> Any:
    try:
        import numpy as np
    except ImportError as error:
        raise _missing(error, None) from error

    if type(tensor).__module__.startswith("torch"):
        return tensor.detach().to("cpu").numpy()
    return np.asarray(tensor)


_TORCH_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
_NUMPY_FLOATS = frozenset({"float16", "float32", "float64"})


def _tensor_problem(tensor: Any) -> str | None:
    """What makes ``tensor`` unusable as a LoRA matrix on every backend (its type, dtype or device), or ``None``."""
    if type(tensor).__module__.startswith("torch"):
        if getattr(tensor, "is_meta", False):
            return "on torch's meta device, which holds no values: pass tensors with their data"
        if str(getattr(tensor, "layout", "torch.strided")) != "torch.strided":  # sparse COO/CSR, mkldnn...
            layout = str(tensor.layout).removeprefix("torch.")
            return f"in torch's {layout} layout: pass dense tensors (tensor.to_dense())"
        dtype = str(getattr(tensor, "dtype", "")).removeprefix("torch.")
        allowed = _TORCH_FLOATS
    else:
        if not hasattr(tensor, "shape"):
            return f"as a {type(tensor).__name__}: give a torch tensor or a numpy array"
        try:
            dtype = str(_as_numpy(tensor).dtype)
        except (TypeError, ValueError) as error:
            return f"as a {type(tensor).__name__} numpy cannot read ({error}): give a torch tensor or a numpy array"
        allowed = _NUMPY_FLOATS
    if dtype not in allowed:
        return (
            f"of dtype {dtype}: LoRA matrices are floating point numbers ({', '.join(sorted(allowed))}); "
            "convert them, e.g. tensor.float()"
        )
    return None


def _value_problem(tensor: Any) -> str | None:
    """``"NaN or infinite values"``, values float32 cannot hold (float64 above its range), or ``None``."""
    if type(tensor).__module__.startswith("torch"):
        try:
            import torch
        except ImportError as error:
            raise _missing(error, None) from error
        if not bool(torch.isfinite(tensor).all()):
            return "NaN or infinite values"
        largest = float(tensor.detach().abs().max())
    else:
        try:
            import numpy as np
        except ImportError as error:
            raise _missing(error, None) from error
        array = np.asarray(tensor)
        if not bool(np.isfinite(array).all()):
            return "NaN or infinite values"
        largest = float(np.abs(array).max())
    if largest > FLOAT32_MAX:
        return f"values up to {largest:.4g}, beyond float32's range (which the backends compute in): scale them down"
    return None
