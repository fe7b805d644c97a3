"""Write a copy of a GGUF model with its weights in another tensor type: unquantized, or quantized.

llama.cpp multiplies by a quantized weight through an integer dot product, which first rounds the activations to
8 bits per block (``Q8_0``/``Q8_K``); Transformers dequantizes a GGUF model once and multiplies in float32. So
on a quantized base the two backends give slightly different numbers, and the difference grows with an adapter
that enlarges the activations (``docs/providers/llamacpp.md``, "Quantized base models"). An ``f32`` copy of a
quantized model holds exactly the weights Transformers reads from it, and llama.cpp then agrees with
Transformers to about 1e-4 nats per token, adapters included. A quantized copy of a tiny model lets a test
reproduce the quantized path in seconds.

Example:
    >>> from inference.testing.gguf_copies import write_gguf_copy
    >>> write_gguf_copy("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m-f32.gguf", "f32")  # doctest: +SKIP
    PosixPath('gemma-3-270m-f32.gguf')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

__all__ = ["TENSOR_TYPES", "TensorType", "write_gguf_copy"]

TensorType = Literal["f32", "f16", "q8_0", "q5_0", "q4_0"]
"""The tensor types a copy can hold its matrices in."""

TENSOR_TYPES: dict[str, tuple[str, str]] = {
    "f32": ("F32", "ALL_F32"),
    "f16": ("F16", "MOSTLY_F16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
    "q5_0": ("Q5_0", "MOSTLY_Q5_0"),
    "q4_0": ("Q4_0", "MOSTLY_Q4_0"),
}
"""Tensor type -> (gguf's ``GGMLQuantizationType`` name, its ``LlamaFileType`` name for ``general.file_type``)."""


def write_gguf_copy(
    source: str | os.PathLike[str], destination: str | os.PathLike[str], tensor_type: TensorType
) -> Path:
    """Write ``source`` again with every matrix in ``tensor_type``; metadata and the other tensors are kept.

    Matrices (2-D tensors) are dequantized to float32 and then stored as ``tensor_type``; a matrix whose rows
    do not split into that type's blocks stays float32. 1-D tensors (norms, biases) stay float32. The file is
    written next to ``destination`` and renamed into place, so a reader never sees half of it.

    Args:
        source: A GGUF model (any tensor types the gguf package can dequantize).
        destination: The ``.gguf`` file to write.
        tensor_type: ``"f32"`` (exactly the weights Transformers reads from ``source``), ``"f16"``, or a
            quantization of gguf's own quantizer (``"q8_0"``, ``"q5_0"``, ``"q4_0"``).

    Returns:
        ``destination`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: ``tensor_type`` is not one of :data:`TENSOR_TYPES`.
    """
    import gguf
    import numpy as np

    if tensor_type not in TENSOR_TYPES:
        raise ValueError(f"tensor_type {tensor_type!r} is not one of {', '.join(TENSOR_TYPES)}")
    type_name, file_type = TENSOR_TYPES[tensor_type]
    target_type = gguf.GGMLQuantizationType[type_name]
    block_size = gguf.GGML_QUANT_SIZES[target_type][0]
    reader = gguf.GGUFReader(source)
    architecture = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    destination = Path(destination)
    temporary = destination.with_name(f".{destination.name}.tmp")
    writer = gguf.GGUFWriter(temporary, architecture)
    try:
        for field in reader.fields.values():
            if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) or field.name.startswith(
                "GGUF."
            ):
                continue
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
        writer.add_file_type(gguf.LlamaFileType[file_type])
        for tensor in reader.tensors:
            weights: Any = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            stored = (
                target_type
                if weights.ndim == 2 and weights.shape[-1] % block_size == 0
                else gguf.GGMLQuantizationType.F32
            )
            if stored == gguf.GGMLQuantizationType.F32:
                writer.add_tensor(tensor.name, np.ascontiguousarray(weights))
            elif stored == gguf.GGMLQuantizationType.F16:
                writer.add_tensor(tensor.name, np.ascontiguousarray(weights.astype(np.float16)))
            else:
                writer.add_tensor(tensor.name, gguf.quants.quantize(weights, stored), raw_dtype=stored)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(temporary, destination)
    finally:
        temporary.unlink(missing_ok=True)
    return destination
