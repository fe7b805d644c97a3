"""Helpers for testing code that uses the SDK: tiny local models and random LoRA adapters.

Nothing here is imported by ``import inference``. The modules import torch, transformers, peft, gguf or
numpy inside their functions, so importing this package stays light:

* :mod:`inference.testing.tiny_models`: tiny random Qwen2 and Llama models (Transformers directory, GGUF
  twin with the same weights and tokenisation, three PEFT LoRA adapters), built in seconds and cached.
* :mod:`inference.testing.random_lora`: a random PEFT LoRA directory that fits any base GGUF model.
* :mod:`inference.testing.gguf_copies`: a copy of a GGUF model with its matrices in another type (an ``f32``
  copy of a quantized model, on which llama.cpp's scores match Transformers'; a quantized copy of a tiny one).
* :mod:`inference.testing.style_adapter`: a short CPU LoRA fine-tune that teaches a GGUF model a visible
  style (the pirate adapter of ``make demo``), cached per machine.
"""

from __future__ import annotations

__all__: list[str] = []
