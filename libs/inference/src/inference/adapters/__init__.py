"""Adapter files: reading PEFT LoRA directories (:mod:`inference.adapters.peft`) and converting them to GGUF
LoRA files for llama.cpp and Ollama (:mod:`inference.adapters.gguf`).

Nothing is imported here, so ``import inference.adapters.peft`` stays as light as the module itself.
"""
