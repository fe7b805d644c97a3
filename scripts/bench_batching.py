"""Benchmark: TransformersProvider's mixed-adapter batching against the seed's one-at-a-time design.

For each model it runs the same 32 greedy requests (spread over 4 adapters, 32 new tokens each) three ways:

* **one at a time**: the seed's way, ``set_adapter(id)`` then ``generate`` per request, on a plain PeftModel;
* **provider**: ``TransformersProvider.generate`` called 32 times concurrently (they batch themselves);
* **raw batch**: one hand-made, left-padded ``model.generate(..., adapter_names=[...])`` over all 32 rows,
  the upper limit of what batching can give.

Targets: provider >= 3x one-at-a-time, provider >= 90% of the raw batch. It also prints the largest
event-loop lag seen while the provider generated (a 1 ms ticker; target < 10 ms), and RSS memory and
load time over 200 load/unload cycles of one adapter (target: flat).

Models: ``tiny`` is the test suite's tiny Qwen2 (hidden size 64: almost all time is Python overhead per
step, which is what batching removes); ``medium`` is a random Qwen2 built here (hidden size 512, 4 layers,
same tokenizer) where the matrix work per step is no longer negligible. Four adapter ids: the tiny
model's a0, a1, a2, and a0's weights loaded a second time as a3 (PEFT serves them as distinct adapters).

Run: ``.venv/bin/python scripts/bench_batching.py [--model tiny|medium|both] [--cycles 200]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing")

import peft  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from inference.testing.tiny_models import build_tiny_models  # noqa: E402
from inference.transformers_provider import TransformersProvider  # noqa: E402

transformers.utils.logging.disable_progress_bar()

REQUESTS = 32
NEW_TOKENS = 32
ADAPTER_IDS = ("a0", "a1", "a2", "a3")
PROMPTS = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a small village by the sea",
    "Where does the river begin?",
    "bread 2.50, fish 7.25, apples 0.99 per kilo",
    "The village had 3 bakeries, 12 boats and 1,024 seagulls",
    "Knowledge is power, and time is money",
    "In the evening the lights of the houses came on one by one",
)
REPEATS = 5


def build_medium_model(tiny: Any, directory: Path) -> tuple[Path, dict[str, Path]]:
    """A random Qwen2 with hidden size 512 and rank-8 LoRAs on every projection, saved under ``directory``."""
    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny.hf_dir))
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():  # like the tiny models: special tokens never win, so every row runs to NEW_TOKENS
        model.lm_head.weight[[tokenizer.convert_tokens_to_ids(t) for t in tokenizer.all_special_tokens]] = 0.0
    model_dir = directory / "medium-qwen2"
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    adapters = {}
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for index, name in enumerate(ADAPTER_IDS[:3]):
        torch.manual_seed(100 + index)
        base = transformers.Qwen2ForCausalLM.from_pretrained(str(model_dir))
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False)
        peft.get_peft_model(base, lora).save_pretrained(str(directory / name))
        adapters[name] = directory / name
    return model_dir, adapters


def requests() -> list[tuple[str, str]]:
    return [(PROMPTS[i % len(PROMPTS)], ADAPTER_IDS[i % len(ADAPTER_IDS)]) for i in range(REQUESTS)]


def adapter_paths(adapters: dict[str, Path]) -> dict[str, Path]:
    return {**adapters, "a3": adapters["a0"]}


def chat_ids(tokenizer: Any, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def best_of(function: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    timings, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        timings.append(time.perf_counter() - start)
    return min(timings), result


def seed_way_and_raw_batch(model_dir: Path, adapters: dict[str, Path]) -> dict[str, Any]:
    """The one-at-a-time and raw-batch measurements, on a PeftModel built directly."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    paths = adapter_paths(adapters)
    model = peft.PeftModel.from_pretrained(base, str(paths["a0"]), adapter_name="a0")
    for name in ADAPTER_IDS[1:]:
        model.load_adapter(str(paths[name]), adapter_name=name)
    model.eval()
    work = [(chat_ids(tokenizer, prompt), adapter) for prompt, adapter in requests()]
    stop = {"pad_token_id": tokenizer.pad_token_id}

    def one_at_a_time() -> list[str]:
        texts = []
        for ids, adapter in work:
            model.set_adapter(adapter)
            with torch.inference_mode():
                out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, **stop)
            texts.append(tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True))
        return texts

    width = max(len(ids) for ids, _ in work)
    input_ids = torch.full((len(work), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(work), width), dtype=torch.long)
    for row, (ids, _) in enumerate(work):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        mask[row, width - len(ids) :] = 1

    def raw_batch() -> list[str]:
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                adapter_names=[adapter for _, adapter in work],
                **stop,
            )
        return [tokenizer.decode(row[width:], skip_special_tokens=True) for row in out]

    raw_batch()  # warm-up
    sequential_s, sequential_texts = best_of(one_at_a_time, 2)
    return {"sequential": (sequential_s, sequential_texts), "raw_batch": raw_batch}


async def measure_lag(work: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
    """Run ``work`` with a 1 ms ticker beside it; return its result and the largest lateness seen."""
    worst, done = 0.0, asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - before - 0.001)

    task = asyncio.create_task(ticker())
    try:
        result = await work()
    finally:
        done.set()
        await task
    return result, worst


async def provider_runs(
    model_dir: Path, adapters: dict[str, Path], raw_batch: Callable[[], list[str]], cycles: int
) -> dict[str, Any]:
    """Provider rounds alternate with raw-batch rounds, so both see the same load from other processes."""
    paths = adapter_paths(adapters)
    async with TransformersProvider(model_name=str(model_dir), device="cpu", torch_dtype="float32") as provider:
        for name in ADAPTER_IDS:
            await provider.load_adapter(name, paths[name])

        async def batch() -> list[Any]:
            return await asyncio.gather(
                *(
                    provider.generate(prompt, model="", adapter_id=adapter, max_tokens=NEW_TOKENS, temperature=0)
                    for prompt, adapter in requests()
                )
            )

        await batch()  # warm-up
        timings, raw_timings, results, raw_texts = [], [], [], []
        before = len(provider.recent_batch_sizes)
        for _ in range(REPEATS):
            start = time.perf_counter()
            results = await batch()
            timings.append(time.perf_counter() - start)
            start = time.perf_counter()
            raw_texts = raw_batch()
            raw_timings.append(time.perf_counter() - start)
        _, lag = await measure_lag(batch)  # separately: a 1 ms ticker takes the GIL often, slowing the run
        batches = provider.recent_batch_sizes[before:]
        threads = await provider._worker.run(torch.get_num_threads)  # what the provider's thread uses

        process = psutil.Process()
        load_times, rss = [], []
        for _ in range(cycles):
            start = time.perf_counter()
            await provider.load_adapter("cycled", paths["a1"])
            load_times.append(time.perf_counter() - start)
            await provider.unload_adapter("cycled")
            rss.append(process.memory_info().rss)
    return {
        "provider": (min(timings), [r.text for r in results]),
        "raw": (min(raw_timings), raw_texts),
        "completion_tokens": sum(r.completion_tokens for r in results),
        "lag": lag,
        "batches": batches,
        "threads": threads,
        "load_times": load_times,
        "rss": rss,
    }


def report(label: str, seed: dict[str, Any], ours: dict[str, Any], cycles: int) -> None:
    tokens = REQUESTS * NEW_TOKENS
    sequential_s, sequential_texts = seed["sequential"]
    raw_s, raw_texts = ours["raw"]
    provider_s, provider_texts = ours["provider"]
    print(f"\n== {label}: {REQUESTS} requests x {NEW_TOKENS} new tokens over adapters {', '.join(ADAPTER_IDS)}")
    print(f"  one at a time (set_adapter): {sequential_s:7.3f} s  {tokens / sequential_s:9.1f} tokens/s")
    print(f"  provider (batched):          {provider_s:7.3f} s  {tokens / provider_s:9.1f} tokens/s")
    print(f"  raw mixed-adapter generate:  {raw_s:7.3f} s  {tokens / raw_s:9.1f} tokens/s")
    speedup, efficiency = sequential_s / provider_s, raw_s / provider_s
    print(f"  provider vs one at a time:   {speedup:6.1f}x   (target >= 3x)   {'OK' if speedup >= 3 else 'MISSED'}")
    print(
        f"  provider vs raw batch:       {efficiency:6.1%}   (target >= 90%)  {'OK' if efficiency >= 0.9 else 'MISSED'}"
    )
    print(f"  torch threads on the provider's worker thread: {ours['threads']}")
    print(f"  batches the provider ran (last {REPEATS + 1} rounds): {list(ours['batches'])}")
    same = provider_texts == raw_texts == sequential_texts
    print(f"  greedy outputs identical in all three ways: {same}; provider tokens {ours['completion_tokens']}")
    print(f"  largest event-loop lag while generating: {ours['lag'] * 1000:.2f} ms (target < 10 ms)")
    loads, rss = ours["load_times"], ours["rss"]
    if cycles >= 40:
        first, last = statistics.median(loads[:20]), statistics.median(loads[-20:])
        print(
            f"  {cycles} load/unload cycles: median load {first * 1000:.1f} ms (first 20) -> "
            f"{last * 1000:.1f} ms (last 20); "
            f"RSS {rss[19] / 2**20:.1f} MiB (after 20) -> {rss[-1] / 2**20:.1f} MiB (after {cycles})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", choices=("tiny", "medium", "both"), default="both")
    parser.add_argument("--cycles", type=int, default=200, help="load/unload cycles for the memory check")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a small shared CPU, OpenMP threads that spin while other "
        "processes run make timings vary a hundredfold)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tiny = build_tiny_models()["qwen2"]
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
        f"{torch.get_num_threads()} threads, CPU, float32"
    )
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as scratch:
        models = []
        if args.model in ("tiny", "both"):
            models.append(("tiny Qwen2 (hidden 64, 2 layers)", tiny.hf_dir, dict(tiny.adapter_dirs)))
        if args.model in ("medium", "both"):
            model_dir, adapters = build_medium_model(tiny, Path(scratch))
            models.append(("random Qwen2 (hidden 512, 4 layers)", model_dir, adapters))
        for label, model_dir, adapters in models:
            seed = seed_way_and_raw_batch(model_dir, adapters)
            ours = asyncio.run(provider_runs(model_dir, adapters, seed["raw_batch"], args.cycles))
            report(label, seed, ours, args.cycles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
