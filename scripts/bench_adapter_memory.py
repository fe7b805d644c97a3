"""Benchmark: loading LoRA weights from memory (AdapterWeights) versus saving them to disk, then loading the path.

What a training or hypernetwork loop does every step: it has new LoRA tensors in memory and wants the provider
to serve them. Two ways, each measured as ``load_adapter("step", ..., replace=True)`` on a warm provider:

- memory: ``load_adapter("step", AdapterWeights(tensors, config), replace=True)``;
- disk: write ``adapter_model.safetensors`` + ``adapter_config.json`` to a new directory (as
  ``PeftModel.save_pretrained`` would), then ``load_adapter("step", directory, replace=True)``.

Transformers takes in-memory weights straight into the model (no file); llama.cpp gets a private PEFT directory
written by the provider and converts it to GGUF as it converts any directory, so there the two ways should cost
about the same. The machine is shared: the load average is printed beside the figures.

It also prints what keeping weights costs: the provider copies every ``AdapterWeights`` at load (so that the
caller's live training tensors can change afterwards), measured on a LoRA shaped like one for Qwen2-0.5B (rank 16
on every linear module of 24 layers), beside the check every load already pays.

Usage::

    python scripts/bench_adapter_memory.py [--rounds 20] [--providers transformers,llamacpp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _weights(directory: Path) -> Any:
    from safetensors.torch import load_file

    from inference import AdapterWeights

    config = json.loads((directory / "adapter_config.json").read_text())
    return AdapterWeights(load_file(str(directory / "adapter_model.safetensors")), config)


async def _bench(kind: str, rounds: int) -> dict[str, float]:
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.provider import InferenceProvider
    from inference.testing.tiny_models import build_tiny_models
    from inference.transformers_provider import TransformersProvider

    model = build_tiny_models()["qwen2"]
    provider: InferenceProvider
    if kind == "transformers":
        provider = TransformersProvider(model_name=str(model.hf_dir), torch_dtype="float32")
    else:
        provider = LlamaCppProvider(model_path=model.gguf_path, n_ctx=256, kv_cache_type="f32")
    steps = [_weights(model.adapter_dirs[name]) for name in ("a0", "a1", "a2")]
    greedy: dict[str, Any] = {"model": "tiny", "max_tokens": 1, "temperature": 0}
    timings: dict[str, list[float]] = {"memory": [], "disk": []}
    async with provider:
        await provider.load_adapter("step", steps[0])
        await provider.generate("warm up", adapter_id="step", **greedy)
        with tempfile.TemporaryDirectory() as scratch:
            for index in range(rounds):
                weights = steps[(index + 1) % len(steps)]
                for way in ("memory", "disk") if index % 2 == 0 else ("disk", "memory"):
                    start = time.perf_counter()
                    if way == "memory":
                        await provider.load_adapter("step", weights, replace=True)
                    else:
                        directory = weights.save(Path(scratch) / f"{way}-{index}")
                        await provider.load_adapter("step", directory, replace=True)
                    await provider.generate("x", adapter_id="step", **greedy)  # the new weights really serve
                    timings[way].append((time.perf_counter() - start) * 1000)
    return {way: statistics.median(values) for way, values in timings.items()}


def _snapshot_cost(rounds: int) -> dict[str, float]:
    """Median ms of ``AdapterWeights.snapshot()`` and ``check()`` on a Qwen2-0.5B-shaped rank-16 LoRA, and its MiB."""
    import torch

    from inference import AdapterWeights

    shapes = {"q_proj": (896, 896), "k_proj": (128, 896), "v_proj": (128, 896), "o_proj": (896, 896),
              "gate_proj": (4864, 896), "up_proj": (4864, 896), "down_proj": (896, 4864)}
    rank, tensors = 16, {}
    for layer in range(24):
        for module, (out_features, in_features) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.nn.Parameter(torch.randn(rank, in_features))
            tensors[f"{prefix}.lora_B.weight"] = torch.nn.Parameter(torch.randn(out_features, rank))
    weights = AdapterWeights(tensors, {"peft_type": "LORA", "r": rank, "lora_alpha": 32, "target_modules": [*shapes]})
    timings: dict[str, list[float]] = {"snapshot": [], "check": []}
    for _ in range(rounds):
        for way, work in (("snapshot", weights.snapshot), ("check", weights.check)):
            start = time.perf_counter()
            work()
            timings[way].append((time.perf_counter() - start) * 1000)
    size = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values()) / 2**20
    return {"mib": size, **{way: statistics.median(values) for way, values in timings.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--providers", default="transformers,llamacpp")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for kind in args.providers.split(","):
        result = asyncio.run(_bench(kind, args.rounds))
        load = os.getloadavg()
        print(
            f"{kind:13s} replace + 1-token generate, median of {args.rounds}: memory {result['memory']:.1f} ms, "
            f"save-to-disk-then-load {result['disk']:.1f} ms ({result['disk'] / result['memory']:.2f}x)  "
            f"[load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}]"
        )
    cost = _snapshot_cost(args.rounds)
    load = os.getloadavg()
    print(
        f"copy kept at load, Qwen2-0.5B-shaped rank-16 LoRA ({cost['mib']:.1f} MiB float32), median of {args.rounds}: "
        f"snapshot {cost['snapshot']:.1f} ms, check {cost['check']:.1f} ms  "
        f"[load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}]"
    )


if __name__ == "__main__":
    main()
