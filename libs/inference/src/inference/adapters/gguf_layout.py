"""Reading GGUF headers: the base model's layout a conversion needs, and what a GGUF LoRA file was made for.

Only the header of a file is parsed, never its weights, with no dependency (quantised tensors are fine: their
logical shapes are read). When the base model's file is not on this machine (an Ollama server holds it),
:func:`layout_from_metadata` describes it from the metadata the server reports. The conversion itself is in
:mod:`inference.adapters.gguf`, which exports these names too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference._core.paths import expand_path
from inference.exceptions import AdapterConversionError, InvalidAdapterError

__all__ = [
    "BaseModelLayout",
    "layout_from_metadata",
    "lora_types_problem",
    "read_base_layout",
    "read_lora_gguf_architecture",
]

_UNREADABLE = (OSError, ValueError, struct.error, UnicodeDecodeError)
"""What reading a header raises for a file that is missing, unreadable or not GGUF."""


@dataclass(frozen=True)
class BaseModelLayout:
    """What a conversion needs to know about the base model, read from its GGUF header.

    Attributes:
        path: The base GGUF file.
        architecture: ``general.architecture`` (``"llama"``, ``"qwen2"``, ``"gemma3"``...).
        block_count: Number of transformer blocks.
        head_count: Attention heads (``None`` when the file does not say, or says per layer).
        head_count_kv: Key/value heads (``None`` when the file does not say, or says per layer).
        tensor_shapes: Tensor name -> shape in PyTorch order (``(out_features, in_features)`` for matrices).
        name: How messages name the base model; empty means the file name of ``path``.
    """

    path: Path
    architecture: str
    block_count: int
    head_count: int | None
    head_count_kv: int | None
    tensor_shapes: dict[str, tuple[int, ...]]
    name: str = ""

    @property
    def display_name(self) -> str:
        """``name``, else the file name of ``path``."""
        return self.name or self.path.name

    def fingerprint(self) -> str:
        """A digest of the architecture, head counts and tensor layout (not the weights)."""
        described = json.dumps(
            [
                self.architecture,
                self.block_count,
                self.head_count,
                self.head_count_kv,
                sorted(self.tensor_shapes.items()),
            ]
        )
        return hashlib.sha256(described.encode()).hexdigest()



def read_base_layout(base_gguf: str | os.PathLike[str]) -> BaseModelLayout:
    """Read the architecture, head counts and tensor shapes of a base model GGUF file (not its weights).

    Only the header is parsed (quantised tensors are fine: their logical shapes are read), which takes a
    fraction of a second even for models with large vocabularies.

    Args:
        base_gguf: The base model's ``.gguf`` file.

    Raises:
        AdapterConversionError: The file is missing or is not a readable GGUF model.
    """
    path = expand_path(base_gguf)
    try:
        found = path.is_file()
    except OSError:  # a parent this process may not search: reported by the read below
        found = True
    if not found:
        raise AdapterConversionError(
            f"base model {path} does not exist: give the path of the GGUF file the adapter should run on",
            path=str(path),
        )
    try:
        fields, shapes, _ = _read_header(path)
    except _UNREADABLE as error:
        raise AdapterConversionError(
            f"base model {path} is not a readable GGUF file ({error})", path=str(path)
        ) from error
    return _layout(path, str(path), fields, shapes, name="", provider=None)


def layout_from_metadata(
    name: str,
    fields: Mapping[str, Any],
    gguf_tensor_shapes: Mapping[str, Sequence[int]],
    *,
    provider: str | None = None,
) -> BaseModelLayout:
    """Describe a base model whose GGUF file is elsewhere (e.g. on an Ollama server) from its metadata.

    Args:
        name: How messages name the base model (``"qwen2.5:0.5b"``).
        fields: GGUF metadata: at least ``general.architecture`` and ``<arch>.block_count``; the
            ``<arch>.attention.head_count`` and ``head_count_kv`` keys are read when present (Ollama's
            ``/api/show`` ``model_info`` holds exactly these keys).
        gguf_tensor_shapes: Tensor name -> dimensions in GGUF order (innermost first, as GGUF headers and
            Ollama's ``/api/show`` ``tensors`` give them); stored reversed, in PyTorch order.
        provider: The provider name carried by errors.

    Returns:
        A layout whose ``path`` is ``name`` (no file is read).

    Raises:
        AdapterConversionError: The metadata lacks the architecture or block count, or a shape is not a
            list of non-negative integers.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for tensor, dims in gguf_tensor_shapes.items():
        sizes_ok = isinstance(dims, (list, tuple)) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims
        )
        if not sizes_ok:
            raise AdapterConversionError(
                f"base model {name} reports tensor {tensor} with shape {dims!r}, which is not a list of sizes",
                provider=provider,
            )
        shapes[str(tensor)] = tuple(reversed([int(d) for d in dims]))
    return _layout(Path(name), None, fields, shapes, name=name, provider=provider)


def _layout(
    path: Path,
    error_path: str | None,
    fields: Mapping[str, Any],
    shapes: dict[str, tuple[int, ...]],
    *,
    name: str,
    provider: str | None,
) -> BaseModelLayout:
    shown = name or str(path)
    architecture = fields.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise AdapterConversionError(
            f"base model {shown} has no general.architecture key", provider=provider, path=error_path
        )
    block_count = fields.get(f"{architecture}.block_count")
    if isinstance(block_count, bool) or not isinstance(block_count, int):
        raise AdapterConversionError(
            f"base model {shown} has no {architecture}.block_count key", provider=provider, path=error_path
        )
    return BaseModelLayout(
        path=path,
        architecture=architecture,
        block_count=block_count,
        head_count=_single_int(fields.get(f"{architecture}.attention.head_count")),
        head_count_kv=_single_int(fields.get(f"{architecture}.attention.head_count_kv")),
        tensor_shapes=shapes,
        name=name,
    )


def read_lora_gguf_architecture(lora_gguf: str | os.PathLike[str], *, provider: str | None = None) -> str:
    """Check that a file is a GGUF LoRA adapter and return the base architecture it was made for.

    Only the header is read.

    Args:
        lora_gguf: The ``.gguf`` adapter file.
        provider: The provider name carried by errors.

    Returns:
        The adapter's ``general.architecture`` (``"llama"``, ``"qwen2"``...).

    Raises:
        InvalidAdapterError: The file is missing, not GGUF, or a GGUF that is not a LoRA adapter (a model).
    """
    path = expand_path(lora_gguf)
    try:
        fields, _, types = _read_header(path)
    except _UNREADABLE as error:
        raise InvalidAdapterError(
            f"adapter {path} is not a readable GGUF file ({error}): give a GGUF LoRA file or a PEFT adapter directory",
            provider=provider,
            path=str(path),
        ) from error
    architecture = fields.get("general.architecture")
    if fields.get("general.type") != "adapter" or fields.get("adapter.type") != "lora" or not architecture:
        raise InvalidAdapterError(
            f"{path} is a GGUF file but not a LoRA adapter (general.type={fields.get('general.type')!r}, "
            f"adapter.type={fields.get('adapter.type')!r}): give a GGUF LoRA file or a PEFT adapter directory",
            provider=provider,
            path=str(path),
        )
    problem = lora_types_problem(types.values())
    if problem is not None:
        raise InvalidAdapterError(f"{path} {problem}", provider=provider, path=str(path))
    return str(architecture)


_UNUSABLE_TYPES = {24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}
"""The GGML tensor types that hold no LoRA matrix llama.cpp can apply (integers, and doubles it has no kernels for)."""


def lora_types_problem(types: Iterable[int]) -> str | None:
    """Why llama.cpp cannot apply a GGUF LoRA whose tensors have these GGML types, or ``None``: llama.cpp takes such
    a file, and the process dies (SIGSEGV) at the first generation with it."""
    unusable = sorted({_UNUSABLE_TYPES[int(kind)] for kind in types if int(kind) in _UNUSABLE_TYPES})
    if not unusable:
        return None
    return (
        f"holds LoRA tensors of type {', '.join(unusable)}, which llama.cpp cannot apply: a GGUF LoRA's tensors are "
        "floating point (F32, F16, BF16) or quantized; convert the adapter again"
    )


def _read_gguf_architecture(path: Path) -> str | None:
    """``general.architecture`` of any GGUF file (model or adapter), or ``None`` when it cannot be read."""
    try:
        fields, _, _ = _read_header(path)
    except _UNREADABLE:
        return None
    architecture = fields.get("general.architecture")
    return architecture if isinstance(architecture, str) and architecture else None


# GGUF value types: struct format of the fixed-size ones; 8 is a string, 9 an array.
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_SMALL_ARRAY = 4096
_MAX_ARRAY_NESTING = 16  # arrays of arrays: a header nested deeper is not a model's (and would exhaust the stack)


_Header = tuple[dict[str, Any], dict[str, tuple[int, ...]], dict[str, int]]
"""A GGUF header: its metadata, its tensors' shapes and their GGML types, by name."""


def _read_header(path: Path) -> _Header:
    """The header of the file at ``path`` as it is now: read again when the file changed, or another file took its
    place (a model replaced with one of the same size and time, by ``cp -p``, ``rsync -t`` or a rename, is another
    inode, and any write changes the ctime, which no tool sets back)."""
    info = path.stat()
    stamp = (info.st_mtime_ns, info.st_size, info.st_ctime_ns, info.st_dev, info.st_ino)
    return _read_gguf_header_cached(path.resolve(), stamp)


@functools.lru_cache(maxsize=8)
def _read_gguf_header_cached(path: Path, stamp: tuple[int, ...]) -> _Header:
    """The header of a base model, read once per file version: every adapter load for a model needs it."""
    return _read_gguf_header(path)


def _read_gguf_header(path: Path) -> _Header:
    """Parse a GGUF header: metadata (scalars, strings, small numeric arrays), tensor shapes and tensor types.

    Large arrays (the token list, merges) are skipped without decoding them.
    """
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        position = 0

        def take(fmt: str) -> Any:
            nonlocal position
            (value,) = struct.unpack_from(fmt, data, position)
            position += struct.calcsize(fmt)
            return value

        def take_string() -> str:
            nonlocal position
            length = take("<Q")
            if position + length > len(data):
                raise ValueError("a string runs past the end of the file")
            text = bytes(data[position : position + length]).decode("utf-8")
            position += length
            return text

        def take_value(value_type: int, depth: int = 0) -> Any:
            nonlocal position
            if value_type in _GGUF_SCALARS:
                return take(_GGUF_SCALARS[value_type])
            if value_type == _GGUF_STRING:
                return take_string()
            if value_type != _GGUF_ARRAY:
                raise ValueError(f"unknown metadata value type {value_type}")
            if depth >= _MAX_ARRAY_NESTING:
                raise ValueError(f"its metadata nests arrays more than {_MAX_ARRAY_NESTING} deep")
            item_type, count = take("<I"), take("<Q")
            if item_type in _GGUF_SCALARS and count > _SMALL_ARRAY:
                position += count * struct.calcsize(_GGUF_SCALARS[item_type])
                return None
            items = [take_value(item_type, depth + 1) for _ in range(count)]
            return items if count <= _SMALL_ARRAY else None

        if bytes(data[:4]) != b"GGUF":
            raise ValueError("it does not start with the GGUF magic bytes")
        position = 4
        version = take("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        tensor_count, field_count = take("<Q"), take("<Q")
        fields: dict[str, Any] = {}
        for _ in range(field_count):
            key = take_string()
            fields[key] = take_value(take("<I"))
        shapes: dict[str, tuple[int, ...]] = {}
        types: dict[str, int] = {}
        for _ in range(tensor_count):
            name = take_string()
            dims = [take("<Q") for _ in range(take("<I"))]
            types[name] = take("<I")
            take("<Q")  # data offset
            shapes[name] = tuple(reversed(dims))
    return fields, shapes, types


def _single_int(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) and v == value[0] for v in value):
        return int(value[0])
    return None
