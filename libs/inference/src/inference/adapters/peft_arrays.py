"""A PEFT LoRA adapter's weights as float32 numpy arrays, for the GGUF conversion.

``adapter_model.safetensors`` is read with numpy alone (bf16 too, which numpy lacks); ``adapter_model.bin`` (a
PyTorch pickle) needs torch. A corrupt or truncated file is an :class:`~inference.exceptions.InvalidAdapterError`
that says to save the adapter again.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inference.adapters.peft import PeftAdapter
from inference.exceptions import AdapterConversionError, InvalidAdapterError

__all__ = ["read_chunks", "read_lora_arrays", "read_weights"]

_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def read_lora_arrays(adapter: PeftAdapter, provider: str, data: bytes | None = None) -> dict[str, Any]:
    """Every tensor of the adapter's weights file, by its state-dict key, as a float32 numpy array.

    Args:
        adapter: The adapter.
        provider: The provider asking, for errors.
        data: The weights file's bytes, already read (:func:`read_weights`); ``None`` reads the file.

    Raises:
        InvalidAdapterError: The file is unreadable, corrupt or truncated.
        AdapterConversionError: A tensor is stored in a type other than F32, F16, BF16 or F64, or the file is a
            PyTorch pickle and torch is not installed.
    """
    if data is None:
        data = read_weights(adapter, provider)
    if adapter.weights_path.suffix == ".safetensors":
        return _read_safetensors(adapter, provider, data)
    return _read_torch_bin(adapter, provider, data)


def read_weights(adapter: PeftAdapter, provider: str) -> bytes:
    """The bytes of the adapter's weights file, read once: what is hashed is then what is converted.

    Raises:
        InvalidAdapterError: The file is unreadable.
    """
    try:
        return adapter.weights_path.read_bytes()
    except OSError as error:
        raise _corrupt(adapter, f"unreadable: {error}", provider) from error


def read_chunks(path: Path, adapter: PeftAdapter, provider: str) -> Iterator[bytes]:
    """The bytes of one of the adapter's files, a MiB at a time (an unreadable file is the adapter's error)."""
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                yield chunk
    except OSError as error:
        raise _corrupt(adapter, f"unreadable: {error}", provider) from error


def _corrupt(adapter: PeftAdapter, reason: str, provider: str) -> InvalidAdapterError:
    return InvalidAdapterError(
        f"adapter weights {adapter.weights_path} are corrupt or truncated ({reason}): save the adapter again "
        "with PeftModel.save_pretrained",
        provider=provider,
        path=str(adapter.path),
    )


def _unconvertible(adapter: PeftAdapter, problem: str, provider: str) -> AdapterConversionError:
    message = f"adapter weights {adapter.weights_path} {problem}"
    return AdapterConversionError(message, provider=provider, path=str(adapter.path))


def _read_safetensors(adapter: PeftAdapter, provider: str, data: bytes) -> dict[str, Any]:
    """Read a safetensors file's bytes into float32-compatible numpy arrays (also bf16, which numpy lacks)."""
    import numpy as np

    if len(data) < 8:
        raise _corrupt(adapter, "shorter than a safetensors header", provider)
    header_size = int.from_bytes(data[:8], "little")
    if header_size > len(data) - 8:
        raise _corrupt(adapter, "the header runs past the end of the file", provider)
    try:
        header = json.loads(data[8 : 8 + header_size])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _corrupt(adapter, "the header is not valid JSON", provider) from error
    except RecursionError:
        raise _corrupt(adapter, "the header is JSON nested too deeply", provider) from None
    if not isinstance(header, dict):
        raise _corrupt(adapter, "the header is not a JSON object", provider)
    body = memoryview(data)[8 + header_size :]
    arrays: dict[str, Any] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_name, shape, (start, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError) as error:
            raise _corrupt(adapter, f"tensor {name} has a malformed header entry", provider) from error
        numbers = [*shape, start, end]
        if not isinstance(dtype_name, str) or not all(
            isinstance(number, int) and not isinstance(number, bool) and number >= 0 for number in numbers
        ):
            raise _corrupt(adapter, f"tensor {name} has a malformed header entry", provider)
        numpy_dtype = _SAFETENSORS_DTYPES.get(dtype_name)
        if numpy_dtype is None:
            only = "only F32, F16, BF16 and F64 LoRA weights can be converted"
            raise _unconvertible(adapter, f"store {name} as {dtype_name}; {only}", provider)
        count = math.prod(shape)
        item_size = np.dtype(numpy_dtype).itemsize
        if not (0 <= start <= end <= len(body)) or end - start != count * item_size:
            raise _corrupt(adapter, f"tensor {name} points outside the file or has the wrong size", provider)
        ranges.append((start, end, name))
        array = np.frombuffer(body[start:end], dtype=numpy_dtype).reshape(shape)
        if dtype_name == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        with np.errstate(over="ignore"):  # F64 values beyond float32 become infinity, refused with the NaNs later
            arrays[name] = array.astype(np.float32)
    _require_one_after_another(ranges, len(body), adapter, provider)
    return arrays


def _require_one_after_another(
    ranges: list[tuple[int, int, str]], size: int, adapter: PeftAdapter, provider: str
) -> None:
    """Refuse tensors whose bytes overlap or leave gaps, as the safetensors library does (its files hold each
    tensor's bytes after the one before, filling the body): overlapping tensors are the same bytes read twice."""
    position = 0
    for start, end, name in sorted(ranges):
        if start != position:
            where = "overlaps the tensor before it" if start < position else "leaves a gap before it"
            raise _corrupt(adapter, f"tensor {name} {where} (data_offsets [{start}, {end}])", provider)
        position = end
    if position != size:
        raise _corrupt(adapter, f"its tensors cover {position} of its {size} data bytes", provider)


def _read_torch_bin(adapter: PeftAdapter, provider: str, data: bytes) -> dict[str, Any]:
    try:
        import torch
    except ImportError as error:
        raise _unconvertible(
            adapter,
            "are a PyTorch pickle, which needs torch to read: save the adapter with safe_serialization=True "
            "(adapter_model.safetensors) or install torch",
            provider,
        ) from error
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises pickle, zip and runtime errors on a bad file
        raise _corrupt(adapter, str(error), provider) from error
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise _corrupt(adapter, "the pickle does not hold a dict of tensors", provider)
    return {str(key): value.detach().float().numpy() for key, value in state.items()}
