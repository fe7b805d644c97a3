"""GGUF LoRA files made for tests, shared by the integration test modules (this folder is on sys.path)."""

from __future__ import annotations

from pathlib import Path


def write_misfit_lora(path: Path, arch: str) -> Path:
    """A GGUF LoRA of the right architecture whose tensor names no tiny model has (llama.cpp refuses it)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 8.0)
    writer.add_tensor("blk.99.attn_q.weight.lora_a", np.ones((2, 16), dtype=np.float32))
    writer.add_tensor("blk.99.attn_q.weight.lora_b", np.ones((16, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
