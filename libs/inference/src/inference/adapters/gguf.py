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

This module writes the file and keeps the cache; reading GGUF headers is :mod:`inference.adapters.gguf_layout`,
the tensors (names, permutation, alpha folding) :mod:`inference.adapters.gguf_tensors`, reading the adapter's
weights :mod:`inference.adapters.peft_arrays`. Every public name of the first two is exported here too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from inference._core.paths import directory_problem, expand_path
from inference.adapters.gguf_cache import (
    ADAPTER_CACHE_MAX_BYTES,
    ClearedCache,
    clear_adapter_cache,
    prune,
    touch,
)
from inference.adapters.gguf_layout import (
    BaseModelLayout,
    layout_from_metadata,
    read_base_layout,
    read_lora_gguf_architecture,
)
from inference.adapters.gguf_tensors import file_alpha, gguf_lora_tensors, import_gguf, permute_llama_rows
from inference.adapters.peft import PeftAdapter, check_base_model, read_peft_adapter
from inference.adapters.peft_arrays import read_chunks, read_weights
from inference.exceptions import AdapterConversionError, ConfigurationError

__all__ = [
    "ADAPTER_CACHE_MAX_BYTES",
    "CONVERTER_VERSION",
    "BaseModelLayout",
    "ClearedCache",
    "clear_adapter_cache",
    "convert_peft_to_gguf",
    "convert_peft_to_gguf_cached",
    "convert_peft_to_gguf_for_layout",
    "convert_peft_to_gguf_for_layout_cached",
    "layout_from_metadata",
    "lora_content_digest",
    "permute_llama_rows",
    "read_base_layout",
    "read_lora_gguf_architecture",
]

#: Part of every cache key: bump when the output of a conversion changes.
CONVERTER_VERSION = "2"

#: The ``general.*`` metadata that says what weights do; the rest of ``general.*`` only describes the file (its
#: ``name`` is the directory it was converted from).
_MEANINGFUL_GENERAL = frozenset({"general.architecture", "general.type", "general.alignment", "general.file_type"})


def lora_content_digest(path: str | os.PathLike[str], *, provider: str) -> str:
    """A SHA-256 of what makes a GGUF LoRA file the adapter it is, whatever its file is named or converted from:
    its metadata (but the descriptive ``general.*`` fields) and its tensors (names, types, shapes and bytes).

    Two conversions of the same PEFT adapter from directories of other names are the same adapter; their files
    differ in ``general.name``.
    """
    gguf = import_gguf(provider)
    reader = gguf.GGUFReader(str(path))
    digest = hashlib.sha256()
    for field in sorted(reader.fields.values(), key=lambda field: field.name):
        if field.name.startswith("GGUF.") or (
            field.name.startswith("general.") and field.name not in _MEANINGFUL_GENERAL
        ):
            continue
        digest.update(field.name.encode("utf-8") + bytes(str(list(field.types)), "ascii"))
        for index in field.data:
            digest.update(field.parts[index].tobytes())
    for tensor in sorted(reader.tensors, key=lambda tensor: tensor.name):
        shape = [int(size) for size in tensor.shape]
        digest.update(f"{tensor.name}:{int(tensor.tensor_type)}:{shape}".encode())
        digest.update(tensor.data.tobytes())
    return digest.hexdigest()


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
    destination, base = expand_path(output), expand_path(base_gguf)
    if _same_file(destination, base):
        raise AdapterConversionError(
            f"output {destination} is the base model {base}: writing the adapter there would replace the model; "
            "give another output path",
            provider="llamacpp",
            path=str(destination),
        )
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
    adapter = _read_adapter(peft_dir, layout, provider=provider)
    destination = expand_path(output)
    _convert(adapter, layout, destination, provider=provider)
    return destination


def convert_peft_to_gguf_cached(
    peft_dir: str | os.PathLike[str],
    base_gguf: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
) -> Path:
    """Like :func:`convert_peft_to_gguf`, into a content-addressed cache: each adapter converts once.

    The file name is a digest of the adapter's config and weight bytes, the base model's architecture and tensor
    layout, and the converter version. A second call with the same inputs returns the cached file without
    converting; a changed adapter or another base gets a new file. A conversion reads the weights once, and names
    its file by the digest of exactly the bytes it converted: an adapter saved again while it converts (a training
    loop writing into the same directory) gets the file of whichever content was read, never one named for the
    other.

    The cache is bounded: after a conversion, the least recently used entries are removed until it holds at most
    ``max_bytes`` (see :mod:`inference.adapters.gguf_cache`); the new entry, and entries pinned by loaded adapters
    in any process, stay. So the returned file may be removed by a later conversion (in this process or another):
    use it at once, pin it (:func:`~inference.adapters.gguf_cache.pin_entry`), or copy it.

    Args:
        peft_dir: The PEFT LoRA adapter directory.
        base_gguf: The base model's GGUF file.
        cache_dir: Directory of converted adapters (created if needed; ``~`` is expanded).
        max_bytes: The cache's bound in bytes; else ``INFERENCE_ADAPTER_CACHE_MAX_BYTES``; else 5 GiB.

    Returns:
        The path of the GGUF LoRA file in ``cache_dir``.

    Raises:
        InvalidAdapterError: As :func:`convert_peft_to_gguf`.
        AdapterConversionError: As :func:`convert_peft_to_gguf`.
        ConfigurationError: ``cache_dir`` is not a directory, or cannot be created or written into; or the bound
            is not a non-negative integer.
    """
    return convert_peft_to_gguf_for_layout_cached(
        peft_dir, read_base_layout(base_gguf), cache_dir, max_bytes=max_bytes
    )


def convert_peft_to_gguf_for_layout_cached(
    peft_dir: str | os.PathLike[str],
    layout: BaseModelLayout,
    cache_dir: str | os.PathLike[str],
    *,
    provider: str = "llamacpp",
    max_bytes: int | None = None,
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
        max_bytes: As :func:`convert_peft_to_gguf_cached`.

    Returns:
        The path of the GGUF LoRA file in ``cache_dir``.

    Raises:
        InvalidAdapterError: As :func:`convert_peft_to_gguf`.
        AdapterConversionError: As :func:`convert_peft_to_gguf`.
        ConfigurationError: As :func:`convert_peft_to_gguf_cached`.
    """
    bound = _cache_bound(max_bytes, provider)
    adapter = _read_adapter(peft_dir, layout, provider=provider)
    directory = expand_path(cache_dir)
    _require_writable_directory(directory, "adapter cache directory", provider=provider)
    # A hit is found by streaming the weights through the digest (memory stays flat however large they are).
    target = directory / _cached_name(adapter, layout, read_chunks(adapter.weights_path, adapter, provider))
    if target.is_file() and touch(target):  # else a miss: absent, or removed by a prune since
        return target
    # A miss converts the bytes it names the file by: read once, so that a save into the adapter directory meanwhile
    # (a training loop) cannot leave a file named for one content holding another, which every later load of that
    # content would get. The conversion holds the whole file in memory anyway.
    weights = read_weights(adapter, provider)
    target = directory / _cached_name(adapter, layout, [weights])
    if not (target.is_file() and touch(target)):
        _convert(adapter, layout, target, provider=provider, weights=weights)
        touch(target)
        prune(directory, bound, keep=target)
    return target


def _cache_bound(max_bytes: int | None, provider: str) -> int:
    """``max_bytes`` checked, else ``INFERENCE_ADAPTER_CACHE_MAX_BYTES`` (environment, then ``.env``), else 5 GiB."""
    from inference.config import resolve_sdk_setting  # the settings table imports the providers' registry

    if max_bytes is not None:
        return int(ADAPTER_CACHE_MAX_BYTES.check(max_bytes, provider=provider))
    return int(resolve_sdk_setting(ADAPTER_CACHE_MAX_BYTES.key))


_STEM_MAX = 200
"""The longest directory name a cached file name starts with, in characters (ASCII: as many bytes). The name adds
``-<24 hex>.gguf`` (30) and its temporary file ``.<name>.<8 random>.tmp`` (14 more), which stays under the 255
bytes most file systems allow a name; a longer directory name is cut, and the digest keeps the names apart."""


def _cached_name(adapter: PeftAdapter, layout: BaseModelLayout, weights: Iterable[bytes]) -> str:
    """``<directory name>-<digest>.gguf``: a digest of the converter version, the layout's fingerprint, the
    adapter's config (as read and converted) and its weights' bytes; the name cut to its first 200 characters."""
    digest = hashlib.sha256()
    digest.update(f"inference-gguf-lora-{CONVERTER_VERSION}\0{layout.fingerprint()}\0".encode())
    digest.update(json.dumps(adapter.config, sort_keys=True).encode() + b"\0")
    for chunk in weights:
        digest.update(chunk)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", adapter.path.resolve().name)[:_STEM_MAX] or "adapter"
    return f"{stem}-{digest.hexdigest()[:24]}.gguf"


def _read_adapter(peft_dir: str | os.PathLike[str], layout: BaseModelLayout, *, provider: str) -> PeftAdapter:
    """The PEFT adapter at ``peft_dir``, refused when it was trained on another architecture than the base's (see
    ``check_base_model``).

    Shapes alone cannot tell: two architectures of the same sizes share every tensor name and shape, and
    the converted file would carry the base's architecture, so llama.cpp would load it without complaint.
    An architecture the gguf package cannot map is left to the conversion, which names that problem.
    """
    adapter = read_peft_adapter(peft_dir, provider=provider)
    if layout.architecture in import_gguf(provider).MODEL_ARCH_NAMES.values():
        check_base_model(adapter, model_name=None, model_type=layout.architecture, provider=provider)
    return adapter


def _same_file(path: Path, other: Path) -> bool:
    """Whether ``path`` exists and is ``other`` (however either is written: links, ``..``)."""
    try:
        return path.exists() and other.exists() and os.path.samefile(path, other)
    except OSError:
        return False


def _convert(
    adapter: PeftAdapter, layout: BaseModelLayout, destination: Path, *, provider: str, weights: bytes | None = None
) -> None:
    """Write the adapter's GGUF LoRA tensors for ``layout`` into ``destination``, atomically (from ``weights``, the
    weights file's bytes, when given)."""
    tensors = gguf_lora_tensors(adapter, layout, provider=provider, weights=weights)
    gguf = import_gguf(provider)

    def refuse(message: str) -> AdapterConversionError:
        return AdapterConversionError(message, provider=provider, path=str(destination))

    if destination.is_dir():
        raise refuse(f"output {destination} is a directory: give the path of the .gguf file to write")
    inputs = [adapter.weights_path, *(path for path in adapter.path.iterdir() if path.is_file())]
    if any(_same_file(destination, path) for path in inputs):
        raise refuse(
            f"output {destination} is a file of the adapter directory {adapter.path}: writing the GGUF there would "
            "replace the adapter; give another output path"
        )
    if destination.exists() and not destination.is_file():  # the rename below would replace /dev/null itself
        raise refuse(
            f"output {destination} is not a regular file (a pipe or a device such as /dev/stdout): the converted "
            "adapter is renamed into place, which would replace it; give the path of the .gguf file to write"
        )
    _require_writable_directory(destination.parent, "output directory", provider=provider)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary_name = tempfile.mkstemp(
            prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent
        )
        os.close(handle)
    except OSError as error:
        raise refuse(
            f"could not create the converted adapter {destination} ({error.strerror or error}): check that "
            f"{destination.parent} is a writable directory with free space"
        ) from error
    temporary = Path(temporary_name)
    try:
        writer = gguf.GGUFWriter(temporary, layout.architecture)
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, file_alpha(adapter))
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
        raise refuse(f"could not write the converted adapter to {destination} ({error})") from error
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
