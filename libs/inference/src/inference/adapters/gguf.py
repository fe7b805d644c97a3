"""Convert a PEFT LoRA adapter directory into a GGUF LoRA file that llama.cpp can load on a given base model.

The base model's GGUF file decides everything: its ``general.architecture`` picks the Hugging Face to
GGUF tensor names (gguf's tensor name map), its tensors are where the adapter's matrices must fit, and its
head counts drive the one transformation llama.cpp needs: for the ``llama`` architecture, llama.cpp's own
converter reorders the rows of ``q_proj``/``k_proj`` (rotary layout), so the rows of ``lora_B`` for
``attn_q``/``attn_k`` are reordered the same way here. Without it a Llama adapter loads fine and is silently
wrong.

The output holds ``<base tensor>.lora_a`` / ``.lora_b`` pairs in float32 with ``general.type = adapter``,
``adapter.type = lora`` and ``adapter.lora.alpha``; llama.cpp then applies ``scale * alpha / rank``, which is
PEFT's ``alpha / r``. PEFT scales llama.cpp cannot express (rsLoRA, per-module ranks) are folded into
``lora_B``.

Example:
    >>> from inference.adapters.gguf import convert_peft_to_gguf
    >>> convert_peft_to_gguf("adapters/support", "models/base.gguf", "adapters/support.gguf")  # doctest: +SKIP
    PosixPath('adapters/support.gguf')

When the base model's file is not on this machine (an Ollama server holds it), describe its layout with
:func:`layout_from_metadata` (architecture keys and tensor shapes, as Ollama's ``/api/show`` reports them)
and convert with :func:`convert_peft_to_gguf_for_layout` or :func:`convert_peft_to_gguf_for_layout_cached`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import mmap
import os
import re
import struct
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference._core.paths import directory_problem, expand_path
from inference.adapters.peft import PeftAdapter, check_base_model, check_ranks, pattern_key, read_peft_adapter
from inference.exceptions import AdapterConversionError, ConfigurationError, InvalidAdapterError

__all__ = [
    "CONVERTER_VERSION",
    "BaseModelLayout",
    "convert_peft_to_gguf",
    "convert_peft_to_gguf_cached",
    "convert_peft_to_gguf_for_layout",
    "convert_peft_to_gguf_for_layout_cached",
    "layout_from_metadata",
    "permute_llama_rows",
    "read_base_layout",
    "read_lora_gguf_architecture",
]

#: Part of every cache key: bump when the output of a conversion changes.
CONVERTER_VERSION = "1"

# Architectures whose llama.cpp converter reorders q/k rows, and how this converter handles them.
_PERMUTED_ARCHITECTURES = frozenset({"llama"})
# Architectures converted by llama.cpp through its Llama code path (so probably permuted) that this converter
# has not been checked against: adapters touching q/k are refused rather than converted silently wrong.
_UNVERIFIED_ARCHITECTURES = frozenset(
    {"deci", "granite", "granitemoe", "baichuan", "minicpm", "deepseek", "llama4", "arcee", "smollm3"}
)
_ROTARY_TENSORS = {"attn_q": "q", "attn_k": "k"}
_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}


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


def permute_llama_rows(rows: Any, n_head: int) -> Any:
    """Reorder the rows of a Llama q/k projection from Hugging Face's rotary layout to llama.cpp's.

    Hugging Face rotates the two halves of each head (``rotate_half``); llama.cpp rotates adjacent pairs.
    Within each of ``n_head`` heads, row ``j`` of the first half and row ``j`` of the second half become
    rows ``2j`` and ``2j + 1``. Pass the attention head count for ``q`` and the key/value head count for
    ``k``. Works on any array whose first axis is the projection's output (a weight, or a LoRA ``B``).

    Args:
        rows: numpy array of shape ``(n_head * head_dim, ...)``.
        n_head: Number of heads the rows are split into.

    Returns:
        The array with its rows reordered, same shape.
    """
    half_head = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, 2, half_head, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


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
        stat = path.stat()
        fields, shapes = _read_gguf_header_cached(path.resolve(), stat.st_mtime_ns, stat.st_size)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as error:
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
        stat = path.stat()
        fields, _ = _read_gguf_header_cached(path.resolve(), stat.st_mtime_ns, stat.st_size)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as error:
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
    return str(architecture)


def _read_gguf_architecture(path: Path) -> str | None:
    """``general.architecture`` of any GGUF file (model or adapter), or ``None`` when it cannot be read."""
    try:
        stat = path.stat()
        fields, _ = _read_gguf_header_cached(path.resolve(), stat.st_mtime_ns, stat.st_size)
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None
    architecture = fields.get("general.architecture")
    return architecture if isinstance(architecture, str) and architecture else None


# GGUF value types: struct format of the fixed-size ones; 8 is a string, 9 an array.
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_SMALL_ARRAY = 4096
_MAX_ARRAY_NESTING = 16  # arrays of arrays: a header nested deeper is not a model's (and would exhaust the stack)


@functools.lru_cache(maxsize=8)
def _read_gguf_header_cached(
    path: Path, mtime_ns: int, size: int
) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """The header of a base model, read once per file version: every adapter load for a model needs it."""
    return _read_gguf_header(path)


def _read_gguf_header(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """Parse a GGUF header: metadata (scalars, strings, small numeric arrays) and tensor shapes.

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
        for _ in range(tensor_count):
            name = take_string()
            dims = [take("<Q") for _ in range(take("<I"))]
            take("<I")  # tensor type
            take("<Q")  # data offset
            shapes[name] = tuple(reversed(dims))
    return fields, shapes


def convert_peft_to_gguf(
    peft_dir: str | os.PathLike[str],
    base_gguf: str | os.PathLike[str],
    output: str | os.PathLike[str],
) -> Path:
    """Convert a PEFT LoRA adapter directory into a GGUF LoRA file for ``base_gguf``.

    The file is written atomically (a temporary file renamed into place), so ``output`` is either the
    complete adapter or absent.

    Args:
        peft_dir: Directory written by ``PeftModel.save_pretrained`` (``adapter_config.json`` and
            ``adapter_model.safetensors`` or ``.bin``).
        base_gguf: The base model's GGUF file, the one llama.cpp will load the adapter on.
        output: Where to write the GGUF LoRA file; parent directories are created.

    Every path may start with ``~``, which is expanded.

    Returns:
        ``output`` as a :class:`~pathlib.Path` (``~`` expanded).

    Raises:
        InvalidAdapterError: The directory is missing, not a plain LoRA (DoRA, trained biases,
            ``modules_to_save``), its weights are unreadable, or its ``adapter_config.json`` names a base
            model of another architecture (see :func:`~inference.adapters.peft.check_base_model`).
        AdapterConversionError: The adapter does not fit the base model (unknown architecture, modules
            the base lacks, shapes of another model), or the file could not be written (disk full...).
        ConfigurationError: The output's directory is not a directory, or cannot be created or written
            into; the message names it.
    """
    return convert_peft_to_gguf_for_layout(peft_dir, read_base_layout(base_gguf), output)


def convert_peft_to_gguf_for_layout(
    peft_dir: str | os.PathLike[str],
    layout: BaseModelLayout,
    output: str | os.PathLike[str],
    *,
    provider: str = "llamacpp",
) -> Path:
    """Like :func:`convert_peft_to_gguf`, for a base model described by ``layout`` instead of a file.

    Use it when the base model's GGUF file is not on this machine: build the layout with
    :func:`layout_from_metadata` (e.g. from Ollama's ``/api/show``).

    Args:
        peft_dir: The PEFT LoRA adapter directory.
        layout: The base model's architecture, head counts and tensor shapes.
        output: Where to write the GGUF LoRA file; parent directories are created.
        provider: The provider name carried by errors.

    Returns:
        ``output`` as a :class:`~pathlib.Path` (``~`` expanded).

    Raises:
        InvalidAdapterError: As :func:`convert_peft_to_gguf`.
        AdapterConversionError: As :func:`convert_peft_to_gguf`.
        ConfigurationError: As :func:`convert_peft_to_gguf`.
    """
    adapter = read_peft_adapter(peft_dir, provider=provider)
    _check_trained_base(adapter, layout, provider=provider)
    tensors = _gguf_lora_tensors(adapter, layout, provider=provider)
    destination = expand_path(output)
    _write_lora_gguf(destination, layout.architecture, adapter, tensors, provider=provider)
    return destination


def convert_peft_to_gguf_cached(
    peft_dir: str | os.PathLike[str],
    base_gguf: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
) -> Path:
    """Like :func:`convert_peft_to_gguf`, into a content-addressed cache: each adapter converts once.

    The file name is a digest of the adapter's ``adapter_config.json`` and weight bytes, the base model's
    architecture and tensor layout, and the converter version. A second call with the same inputs returns
    the cached file without converting; a changed adapter or another base gets a new file.

    Args:
        peft_dir: The PEFT LoRA adapter directory.
        base_gguf: The base model's GGUF file.
        cache_dir: Directory of converted adapters (created if needed; ``~`` is expanded).

    Returns:
        The path of the GGUF LoRA file in ``cache_dir``.

    Raises:
        InvalidAdapterError: As :func:`convert_peft_to_gguf`.
        AdapterConversionError: As :func:`convert_peft_to_gguf`.
        ConfigurationError: ``cache_dir`` is not a directory, or cannot be created or written into.
    """
    return convert_peft_to_gguf_for_layout_cached(peft_dir, read_base_layout(base_gguf), cache_dir)


def convert_peft_to_gguf_for_layout_cached(
    peft_dir: str | os.PathLike[str],
    layout: BaseModelLayout,
    cache_dir: str | os.PathLike[str],
    *,
    provider: str = "llamacpp",
) -> Path:
    """Like :func:`convert_peft_to_gguf_cached`, for a base model described by ``layout``.

    The cache key is the same as :func:`convert_peft_to_gguf_cached`'s (adapter bytes, the layout's
    :meth:`~BaseModelLayout.fingerprint`, converter version), so a layout read from a GGUF file and the same
    layout reported by a server share one cached file.

    Args:
        peft_dir: The PEFT LoRA adapter directory.
        layout: The base model's architecture, head counts and tensor shapes.
        cache_dir: Directory of converted adapters (created if needed; ``~`` is expanded).
        provider: The provider name carried by errors.

    Returns:
        The path of the GGUF LoRA file in ``cache_dir``.

    Raises:
        InvalidAdapterError: As :func:`convert_peft_to_gguf`.
        AdapterConversionError: As :func:`convert_peft_to_gguf`.
        ConfigurationError: ``cache_dir`` is not a directory, or cannot be created or written into.
    """
    adapter = read_peft_adapter(peft_dir, provider=provider)
    _check_trained_base(adapter, layout, provider=provider)
    directory = expand_path(cache_dir)
    _require_writable_directory(directory, "adapter cache directory", provider=provider)
    digest = hashlib.sha256()
    digest.update(f"inference-gguf-lora-{CONVERTER_VERSION}\0{layout.fingerprint()}\0".encode())
    for part in (adapter.path / "adapter_config.json", adapter.weights_path):
        for chunk in _read_chunks(part, adapter, provider):
            digest.update(chunk)
        digest.update(b"\0")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", adapter.path.resolve().name) or "adapter"
    target = directory / f"{stem}-{digest.hexdigest()[:24]}.gguf"
    if target.is_file():
        return target
    tensors = _gguf_lora_tensors(adapter, layout, provider=provider)
    _write_lora_gguf(target, layout.architecture, adapter, tensors, provider=provider)
    return target


def _check_trained_base(adapter: PeftAdapter, layout: BaseModelLayout, *, provider: str) -> None:
    """Refuse an adapter trained on another architecture than the base's (see ``check_base_model``).

    Shapes alone cannot tell: two architectures of the same sizes share every tensor name and shape, and
    the converted file would carry the base's architecture, so llama.cpp would load it without complaint.
    An architecture the gguf package cannot map is left to the conversion, which names that problem.
    """
    if layout.architecture in _import_gguf(provider).MODEL_ARCH_NAMES.values():
        check_base_model(adapter, model_name=None, model_type=layout.architecture, provider=provider)


def _gguf_lora_tensors(adapter: PeftAdapter, layout: BaseModelLayout, *, provider: str) -> dict[str, Any]:
    """Map the adapter's PEFT tensors onto the base's GGUF tensors; return ``{gguf name: array}``."""
    import numpy as np

    gguf = _import_gguf(provider)

    def refuse(reason: str) -> AdapterConversionError:
        return AdapterConversionError(
            f"cannot convert the adapter at {adapter.path} for base model {layout.display_name} "
            f"({layout.architecture}): {reason}",
            provider=provider,
            path=str(adapter.path),
        )

    config = adapter.config
    if config.get("fan_in_fan_out"):
        raise refuse("it was trained with fan_in_fan_out=true (GPT-2 style Conv1D), which is not supported")
    if config.get("lora_bias"):
        raise refuse("it trains LoRA biases (lora_bias=true), which llama.cpp cannot apply")
    # alpha_pattern and the range of lora_alpha were checked by read_peft_adapter. The file holds alpha as float32:
    # one that rounds to 0 there would make llama.cpp apply no alpha / rank at all.
    if _file_alpha(adapter) <= 0:
        raise refuse(f"its lora_alpha is {adapter.alpha:g}, so it would change nothing")

    arch_enum = next((key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == layout.architecture), None)
    if arch_enum is None:
        raise refuse(f"the installed gguf package has no tensor name map for the architecture {layout.architecture!r}")
    weights = _load_weights(adapter, provider)

    def refuse_invalid(reason: str) -> InvalidAdapterError:
        return InvalidAdapterError(f"adapter at {adapter.path} {reason}", provider=provider, path=str(adapter.path))

    check_ranks(adapter.config, {key: tuple(array.shape) for key, array in weights.items()}, refuse_invalid)
    # Map layer numbers past the base's last block too, so that they are reported as missing by name.
    layer_numbers = [int(number) for key in weights for number in re.findall(r"\.layers\.(\d+)\.", key)]
    name_map = gguf.get_tensor_name_map(arch_enum, max([layout.block_count, *(n + 1 for n in layer_numbers)]))

    pairs: dict[str, dict[str, Any]] = {}
    for key, array in weights.items():
        match = _PEFT_KEY.match(key)
        if match is None:
            if "lora_embedding" in key:
                raise refuse(f"it adapts an embedding ({key}); only linear layers are supported")
            raise refuse(f"its weights hold {key!r}, which is not a LoRA A/B matrix of a linear layer")
        pairs.setdefault(match["module"], {})[match["which"]] = array

    out: dict[str, Any] = {}
    missing: list[str] = []
    for module in sorted(pairs):
        pair = pairs[module]
        if set(pair) != {"A", "B"}:
            raise refuse(f"module {module} has lora_{next(iter(pair))} without its partner matrix")
        lora_a, lora_b = (np.asarray(pair[which], dtype=np.float32) for which in ("A", "B"))
        if not (np.isfinite(lora_a).all() and np.isfinite(lora_b).all()):
            raise refuse_invalid(
                f"holds NaN or infinite values (or values beyond float32's range) in the LoRA matrices of {module}: "
                "the adapter cannot compute anything; train or save it again"
            )
        if lora_a.ndim != 2 or lora_b.ndim != 2 or lora_a.shape[0] != lora_b.shape[1]:
            raise refuse(
                f"module {module} has lora_A {lora_a.shape} and lora_B {lora_b.shape}, which are not the "
                "(rank, in) and (out, rank) matrices of one LoRA"
            )
        base_name = name_map.get_name(f"{module}.weight", try_suffixes=(".weight", ".bias"))
        if base_name is None:
            raise refuse(f"module {module} has no GGUF counterpart for the {layout.architecture} architecture")
        base_shape = layout.tensor_shapes.get(base_name)
        if base_shape is None:
            missing.append(f"{module} ({base_name})")
            continue
        expected = (lora_b.shape[0], lora_a.shape[1])
        if tuple(base_shape) != expected:
            raise refuse(
                f"module {module} is {expected[0]}x{expected[1]} in the adapter but {base_name} is "
                f"{'x'.join(str(dim) for dim in base_shape)} in the base model: the adapter was trained for "
                "another model"
            )
        with np.errstate(over="ignore"):  # a scale that overflows float32 is refused just below
            lora_b = lora_b * _b_factor(adapter, rank=lora_a.shape[0], alpha=_module_alpha(adapter, module))
        if not np.isfinite(lora_b).all():
            raise refuse(
                f"module {module}'s scale (its alpha / r, folded into lora_B) makes its lora_B overflow float32: "
                "lower its alpha_pattern entry or raise lora_alpha"
            )
        lora_b = _permute_for_llama_cpp(lora_b, base_name, layout, refuse)
        out[f"{base_name}.lora_a"] = np.ascontiguousarray(lora_a)
        out[f"{base_name}.lora_b"] = np.ascontiguousarray(lora_b, dtype=np.float32)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise refuse(f"the base model has no tensor for {shown}: the adapter was trained for another model")
    if not out:
        raise refuse("it holds no LoRA matrices")
    return out


def _b_factor(adapter: PeftAdapter, *, rank: int, alpha: float | None = None) -> float:
    """What ``lora_B`` must be multiplied by so that llama.cpp's ``alpha / rank`` (one alpha for the whole file, as
    float32) equals PEFT's scale for this module: its own alpha (``alpha_pattern``), over ``rank`` or rsLoRA's
    ``sqrt(rank)``."""
    module_alpha = adapter.alpha if alpha is None else alpha
    peft_scale = module_alpha / (math.sqrt(rank) if adapter.config.get("use_rslora") else rank)
    return peft_scale * rank / _file_alpha(adapter)


def _file_alpha(adapter: PeftAdapter) -> float:
    """``lora_alpha`` as the GGUF file holds it (float32): what llama.cpp divides by the rank."""
    return float(struct.unpack("<f", struct.pack("<f", adapter.alpha))[0])


def _module_alpha(adapter: PeftAdapter, module: str) -> float:
    """The alpha PEFT uses for ``module`` (a state-dict module name): the first ``alpha_pattern`` key that
    matches its end on a ``.`` boundary, as PEFT's ``get_pattern_key`` matches, else ``lora_alpha``."""
    pattern: dict[str, float] = adapter.config.get("alpha_pattern") or {}
    key = pattern_key(pattern, module)
    return adapter.alpha if key is None else float(pattern[key])


def _permute_for_llama_cpp(lora_b: Any, base_name: str, layout: BaseModelLayout, refuse: Any) -> Any:
    kind = _ROTARY_TENSORS.get(base_name.split(".")[-2]) if base_name.count(".") >= 2 else None
    if kind is None:
        return lora_b
    if layout.architecture in _UNVERIFIED_ARCHITECTURES:
        raise refuse(
            f"adapters on attention q/k projections are not supported for {layout.architecture} yet (llama.cpp "
            "reorders those rows for this architecture); train the adapter without q_proj/k_proj"
        )
    if layout.architecture not in _PERMUTED_ARCHITECTURES:
        return lora_b
    heads = layout.head_count if kind == "q" else layout.head_count_kv
    if not heads or lora_b.shape[0] % (2 * heads):
        raise refuse(f"the base model's head counts do not fit {base_name} ({lora_b.shape[0]} rows)")
    return permute_llama_rows(lora_b, heads)


def _write_lora_gguf(
    destination: Path, architecture: str, adapter: PeftAdapter, tensors: dict[str, Any], *, provider: str
) -> None:
    gguf = _import_gguf(provider)
    if destination.is_dir():
        raise AdapterConversionError(
            f"output {destination} is a directory: give the path of the .gguf file to write",
            provider=provider,
            path=str(destination),
        )
    if destination.exists() and not destination.is_file():  # the rename below would replace /dev/null itself
        raise AdapterConversionError(
            f"output {destination} is not a regular file (a pipe or a device such as /dev/stdout): the converted "
            "adapter is renamed into place, which would replace it; give the path of the .gguf file to write",
            provider=provider,
            path=str(destination),
        )
    _require_writable_directory(destination.parent, "output directory", provider=provider)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary_name = tempfile.mkstemp(
            prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent
        )
        os.close(handle)
    except OSError as error:
        raise AdapterConversionError(
            f"could not create the converted adapter {destination} ({error.strerror or error}): check that "
            f"{destination.parent} is a writable directory with free space",
            provider=provider,
            path=str(destination),
        ) from error
    temporary = Path(temporary_name)
    try:
        writer = gguf.GGUFWriter(temporary, architecture)
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, _file_alpha(adapter))
        # A directory name with undecodable bytes (kept by surrogateescape) cannot be written as UTF-8 text.
        writer.add_name(adapter.path.resolve().name.encode("utf-8", "replace").decode("utf-8"))
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        for name in sorted(tensors):
            writer.add_tensor(name, tensors[name])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(temporary, destination)
    except OSError as error:
        raise AdapterConversionError(
            f"could not write the converted adapter to {destination} ({error})",
            provider=provider,
            path=str(destination),
        ) from error
    finally:
        temporary.unlink(missing_ok=True)


def _require_writable_directory(directory: Path, what: str, *, provider: str) -> None:
    """Refuse, before any work, a directory that files cannot be written into (checked, not created)."""
    problem = directory_problem(directory)
    if problem is not None:
        raise ConfigurationError(
            f"{what} {directory} {problem}: choose a directory this process can create and write into",
            provider=provider,
            path=str(directory),
        )


def _load_weights(adapter: PeftAdapter, provider: str) -> dict[str, Any]:
    if adapter.weights_path.suffix == ".safetensors":
        return _read_safetensors(adapter, provider)
    return _read_torch_bin(adapter, provider)


def _corrupt(adapter: PeftAdapter, reason: str, provider: str) -> InvalidAdapterError:
    return InvalidAdapterError(
        f"adapter weights {adapter.weights_path} are corrupt or truncated ({reason}): save the adapter again "
        "with PeftModel.save_pretrained",
        provider=provider,
        path=str(adapter.path),
    )


def _read_safetensors(adapter: PeftAdapter, provider: str) -> dict[str, Any]:
    """Read a safetensors file into float32-compatible numpy arrays (also bf16, which numpy lacks)."""
    import numpy as np

    try:
        data = adapter.weights_path.read_bytes()
    except OSError as error:
        raise _corrupt(adapter, f"unreadable: {error}", provider) from error
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
            raise AdapterConversionError(
                f"adapter weights {adapter.weights_path} store {name} as {dtype_name}; only F32, F16, BF16 and "
                "F64 LoRA weights can be converted",
                provider=provider,
                path=str(adapter.path),
            )
        count = math.prod(shape)
        item_size = np.dtype(numpy_dtype).itemsize
        if not (0 <= start <= end <= len(body)) or end - start != count * item_size:
            raise _corrupt(adapter, f"tensor {name} points outside the file or has the wrong size", provider)
        array = np.frombuffer(body[start:end], dtype=numpy_dtype).reshape(shape)
        if dtype_name == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        with np.errstate(over="ignore"):  # F64 values beyond float32 become infinity, refused with the NaNs later
            arrays[name] = array.astype(np.float32)
    return arrays


def _read_torch_bin(adapter: PeftAdapter, provider: str) -> dict[str, Any]:
    try:
        import torch
    except ImportError as error:
        raise AdapterConversionError(
            f"adapter weights {adapter.weights_path} are a PyTorch pickle, which needs torch to read: save the "
            "adapter with safe_serialization=True (adapter_model.safetensors) or install torch",
            provider=provider,
            path=str(adapter.path),
        ) from error
    try:
        state = torch.load(adapter.weights_path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises pickle, zip and runtime errors on a bad file
        raise _corrupt(adapter, str(error), provider) from error
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise _corrupt(adapter, "the pickle does not hold a dict of tensors", provider)
    return {str(key): value.detach().float().numpy() for key, value in state.items()}


def _read_chunks(path: Path, adapter: PeftAdapter, provider: str) -> Iterator[bytes]:
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                yield chunk
    except OSError as error:
        raise _corrupt(adapter, f"unreadable: {error}", provider) from error


def _single_int(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) and v == value[0] for v in value):
        return int(value[0])
    return None


def _import_gguf(provider: str) -> Any:
    """The gguf package; a missing one names the extra of the provider that converts (llamacpp, ollama...)."""
    from inference._core.dependencies import import_optional

    return import_optional("gguf", provider=provider)
