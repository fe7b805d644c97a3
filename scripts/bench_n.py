"""Benchmark: ``n`` completions of one prompt (issue 25), the native ``n`` against ``n`` single requests.

**Workload**: one long prompt (``--prompt-tokens`` of plain text, ``raw_prompt=True``), ``n`` seeded sampled
completions of ``--max-tokens`` tokens. Two ways, on each in-process backend:

* ``native``: ``generate(prompt, n=N, seed=S)``: llama.cpp decodes the prompt once and shares its KV cells with the
  ``N`` sequences; Transformers runs the prompt once and repeats its keys and values for ``N`` rows;
* ``apart``: ``N`` single requests seeded ``S``, ``S + 1``... at once (what ``n`` was before: the prompt ``N`` times).

It prints the best of ``--repeats`` wall times of each, the prompt tokens llama.cpp's decode loop decoded for each
(its counter ``ContinuousBatcher.prompt_tokens``), and whether the choices equal the single requests' texts (they
should: choice ``k`` is seeded ``S + k`` on both ways). The tiny test models are built on first use.

Run: ``.venv/bin/python scripts/bench_n.py [--n 8] [--prompt-tokens 400] [--max-tokens 8] [--repeats 3]
[--backend llamacpp|transformers|both]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from inference.provider import InferenceProvider


async def measure(provider: InferenceProvider, prompt: str, args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"model": "m", "max_tokens": args.max_tokens, "temperature": 1.0, "raw_prompt": True}
    await provider.generate(prompt, n=2, seed=0, **options)  # loaded and warm
    batcher = getattr(provider, "_batcher", None)
    best = {"native": float("inf"), "apart": float("inf")}
    decoded = {"native": 0, "apart": 0}
    same = True
    for _ in range(args.repeats):
        before = batcher.prompt_tokens if batcher is not None else 0
        start = time.perf_counter()
        native = await provider.generate(prompt, n=args.n, seed=1, **options)
        best["native"] = min(best["native"], time.perf_counter() - start)
        decoded["native"] = (batcher.prompt_tokens - before) if batcher is not None else 0
        before = batcher.prompt_tokens if batcher is not None else 0
        start = time.perf_counter()
        apart = await asyncio.gather(*(provider.generate(prompt, seed=1 + k, **options) for k in range(args.n)))
        best["apart"] = min(best["apart"], time.perf_counter() - start)
        decoded["apart"] = (batcher.prompt_tokens - before) if batcher is not None else 0
        same = same and [choice.text for choice in native.choices or ()] == [result.text for result in apart]
    seconds = {way: round(value, 3) for way, value in best.items()}
    return {"prompt_tokens": native.prompt_tokens, "best_s": seconds, "decoded": decoded, "same_choices": same}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", choices=["llamacpp", "transformers", "both"], default="both")
    args = parser.parse_args()
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.testing.tiny_models import build_tiny_models
    from inference.transformers_provider import TransformersProvider

    model = build_tiny_models()["qwen2"]
    prompt = "the quick brown fox jumps over the lazy dog " * max(1, args.prompt_tokens // 20)
    if args.backend in ("llamacpp", "both"):
        async with LlamaCppProvider(model.gguf_path, n_ctx=8192, n_parallel=args.n, kv_cache_type="f32") as llama:
            print("llamacpp", await measure(llama, prompt, args))
    if args.backend in ("transformers", "both"):
        async with TransformersProvider(model_name=str(model.hf_dir), device="cpu") as transformers:
            print("transformers", await measure(transformers, prompt, args))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    asyncio.run(main())
