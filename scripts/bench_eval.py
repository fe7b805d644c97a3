"""Benchmark: the adapter evaluation runner, N adapters x M prompts on a small model, per in-process provider.

For each provider (llama.cpp and Transformers, in process) it evaluates N new random LoRA adapters (written with
``inference.testing.random_lora``, distinct seeds, so every load is a real load; llama.cpp converts each PEFT
directory to GGUF on load, into a fresh cache) on M prompts, greedy, and reports:

- adapters per minute (N over the summed per-adapter times, and N over the run's wall time; the model is loaded
  before the timing starts);
- the share of adapter time spent in load + unload versus generation (target on llama.cpp: load+unload under
  10%, thanks to hot-swap: the base model is never reloaded);
- rows per second and the mean request latency;
- with ``--adapters-in-flight 1 8``: each count in turn, adapters per minute over the wall time, and whether the
  rows are equal row for row (target on Transformers, which batches different adapters together: at least 3x
  at 8 in flight against 1).
- with ``--score-only``: a multiple-choice prompt set (M prompts x 4 choices, plus a reference answer each), three
  ways per provider: the runner generating (``max_tokens``) and scoring, the runner scoring only (``mode="score"``:
  every row's choices in one ``score_batch`` per adapter), and the scoring loop the runner had before (each choice
  of each row scored one after another, no generation); the wall time of each, the ratios, the phases' times, and
  whether the score-only likelihoods equal the generating run's. Each way runs ``--rounds`` times in turn and its
  fastest run counts (torch pinned to one thread on Transformers).

Usage::

    python scripts/bench_eval.py                       # 50 adapters x 20 prompts, max_tokens 16, both providers
    python scripts/bench_eval.py --adapters 10 --prompts 5 --providers llamacpp
    python scripts/bench_eval.py --providers transformers --adapters-in-flight 1 8
    python scripts/bench_eval.py --providers transformers --score-only --adapters 20
    python scripts/bench_eval.py --providers transformers-peft transformers --adapters-in-flight 1 8  # PEFT vs stacks
    python scripts/bench_eval.py --model medium --providers transformers-peft transformers --adapters-in-flight 1 8

``--model tiny`` (the default) is the tiny Qwen2 (llama.cpp and Transformers); ``--model medium`` is the random
Qwen2 of ``bench_batching.py`` (hidden size 512, 4 layers; Transformers only, it has no GGUF), with N random
rank-8 adapters on q_proj and v_proj written with PEFT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "The system works like this: you write a prompt,",
    "In the evening the lights of the houses came on,",
    "Children played near the water while the teachers",
    "Write a short note about the weather tomorrow:",
    "The baker prepared dough for the morning and",
    "Please summarise the story in two sentences.",
    "A fisherman walked along the harbour and saw",
    "Knowledge is power, and time is money; but",
    "Hello, world! Hello again... and goodbye",
]


def make_adapters(base_gguf: Path, root: Path, count: int) -> list[Path]:
    from inference.testing.random_lora import write_random_peft_lora

    return [
        write_random_peft_lora(
            base_gguf, root / f"random-{index:03d}", rank=8, seed=index, targets=("q_proj", "v_proj")
        )
        for index in range(count)
    ]


def make_hf_adapters(model_dir: Path, root: Path, count: int) -> list[Path]:
    """``count`` random rank-8 LoRA adapters on q_proj and v_proj of the Transformers model, written with PEFT."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir))
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    wrapped = peft.get_peft_model(model, config)
    paths = []
    for index in range(count):
        torch.manual_seed(index)
        with torch.no_grad():
            for name, parameter in wrapped.named_parameters():
                if "lora_" in name:
                    parameter.normal_(0.0, 0.05)
        wrapped.save_pretrained(str(root / f"random-{index:03d}"))
        paths.append(root / f"random-{index:03d}")
    return paths


MAX_BATCH_SIZE = 32
"""Transformers' max_batch_size (its default); ``--max-batch-size`` changes it for every run."""

SPARE_ADAPTER_SLOTS: int | None = None
"""Transformers' spare_adapter_slots for the next run (``None``: its default)."""


def make_provider(name: str, tiny: Any, workdir: Path) -> Any:
    """``llamacpp``, ``transformers`` or ``transformers-peft`` (every adapter served by PEFT, no stacked LoRA)."""
    if name == "llamacpp":
        from inference.llamacpp_provider import LlamaCppProvider

        if tiny.gguf_path is None:
            raise SystemExit("--model medium has no GGUF: run it with --providers transformers-peft transformers")
        return LlamaCppProvider(
            model_path=tiny.gguf_path, n_ctx=512, adapter_cache_dir=workdir / f"cache-{time.time_ns()}"
        )
    from inference.transformers_provider import TransformersProvider

    provider = TransformersProvider(
        model_name=str(tiny.hf_dir),
        device="cpu",
        torch_dtype="float32",
        max_batch_size=MAX_BATCH_SIZE,
        spare_adapter_slots=SPARE_ADAPTER_SLOTS,
    )
    provider._slots.stacking = name != "transformers-peft"
    return provider


async def bench(
    name: str,
    tiny: Any,
    adapters: list[Path],
    prompt_count: int,
    max_tokens: int,
    workdir: Path,
    concurrency: int,
    in_flight: int = 1,
) -> tuple[dict[str, float], dict[tuple[str, str], Any]]:
    from inference.evaluation import EvalPrompt, evaluate_adapters

    prompts = [EvalPrompt(f"p{index}", PROMPTS[index % len(PROMPTS)] + f" ({index})") for index in range(prompt_count)]
    provider = make_provider(name, tiny, workdir)
    output = workdir / f"{name}-{time.time_ns()}.jsonl"
    try:
        await provider.generate("Hello", model="", max_tokens=1)  # the model loads here, outside the timing
        start = time.perf_counter()
        summary = await evaluate_adapters(
            adapters,
            prompts,
            {"max_tokens": max_tokens, "temperature": 0.0},
            output,
            provider=provider,
            max_concurrency=concurrency,
            adapters_in_flight=in_flight,
        )
        wall = time.perf_counter() - start
    finally:
        await provider.aclose()
    if summary.errors:
        raise SystemExit(
            f"{name}: {summary.errors} rows failed, e.g. {next(a.load_error for a in summary.adapters if a.errors)}"
        )
    load = sum(adapter.load_s or 0.0 for adapter in summary.adapters)
    unload = sum(adapter.unload_s or 0.0 for adapter in summary.adapters)
    generate = sum(adapter.generate_s or 0.0 for adapter in summary.adapters)
    adapter_time = load + unload + generate
    rows = len(adapters) * prompt_count
    with output.open() as lines:
        outputs = {(row["adapter_id"], row["prompt_id"]): row["output"] for row in map(json.loads, lines)}
    return {
        "wall_s": wall,
        "adapters_per_min": len(adapters) / (adapter_time / 60),
        "adapters_per_min_wall": len(adapters) / (wall / 60),
        "load_s": load,
        "unload_s": unload,
        "generate_s": generate,
        "load_unload_share": (load + unload) / adapter_time,
        "rows_per_s": rows / adapter_time,
        "mean_latency_ms": 1000 * sum(a.mean_latency_s or 0.0 for a in summary.adapters) / len(summary.adapters),
        "completion_tokens": sum(adapter.completion_tokens for adapter in summary.adapters),
    }, outputs


CHOICES = (" the sea", " a small house", " and then", " nothing at all")


def choice_prompts(count: int) -> list[Any]:
    from inference.evaluation import EvalPrompt

    return [
        EvalPrompt(f"p{index}", PROMPTS[index % len(PROMPTS)] + f" ({index})", expected=" they went home",
                   choices=CHOICES, answer=index % len(CHOICES))
        for index in range(count)
    ]  # fmt: skip


async def bench_scoring(
    name: str,
    tiny: Any,
    adapters: list[Path],
    prompt_count: int,
    max_tokens: int,
    workdir: Path,
    concurrency: int,
    rounds: int = 3,
) -> None:
    """The three ways of a likelihood evaluation, on one provider, in one process (so the ratios compare); each way
    ``rounds`` times, in turn, keeping each way's fastest (the machine is shared: the least disturbed run)."""
    from inference.evaluation import evaluate_adapters

    prompts = choice_prompts(prompt_count)
    if name.startswith("transformers"):
        import torch

        torch.set_num_threads(1)  # as bench_batching.py: rounds stay comparable on a shared 2-core machine
    provider = make_provider(name, tiny, workdir)
    walls: dict[str, float] = {}
    likelihoods: dict[str, dict[tuple[str, str], Any]] = {}
    summaries: dict[str, Any] = {}

    async def runner(mode: str) -> float:
        output = workdir / f"{name}-{mode}-{time.time_ns()}.jsonl"
        start = time.perf_counter()
        summary = await evaluate_adapters(
            adapters, prompts, {"max_tokens": max_tokens, "temperature": 0.0}, output, provider=provider,
            max_concurrency=concurrency, mode=mode, base=False,
        )  # fmt: skip
        wall = time.perf_counter() - start
        if summary.errors:
            raise SystemExit(f"{name} {mode}: {summary.errors} rows failed")
        if wall < walls.get(mode, float("inf")):
            summaries[mode] = summary
        with output.open() as lines:
            likelihoods[mode] = {
                (row["adapter_id"], row["prompt_id"]): (row["nll_per_token"], row["choice_logprobs"])
                for row in map(json.loads, lines)
            }
        return wall

    async def loop() -> float:  # before: each choice of each row scored one after another, no generation
        start = time.perf_counter()
        for index, path in enumerate(adapters):
            adapter_id = f"loop-{index}"
            await provider.load_adapter(adapter_id, str(path))
            for prompt in prompts:
                await provider.score(prompt.prompt, prompt.expected, "", adapter_id)
                for choice in prompt.choices:
                    await provider.score(prompt.prompt, choice, "", adapter_id)
            await provider.unload_adapter(adapter_id)
        return time.perf_counter() - start

    try:
        await provider.score("Hello", " world", "")  # the model loads here, outside the timing
        await provider.load_adapter("warm-up", str(adapters[0]))  # and the adapter machinery (PEFT's wrapping)
        await provider.score("Hello", " world", "", "warm-up")
        await provider.unload_adapter("warm-up")
        for _ in range(rounds):
            for way in ("generate", "score", "loop"):
                wall = await (loop() if way == "loop" else runner(way))
                walls[way] = min(wall, walls.get(way, float("inf")))
    finally:
        await provider.aclose()
    worst = max(
        max(abs(a - b) for a, b in zip([nll, *choices], [nll2, *choices2], strict=True))
        for key, (nll, choices) in likelihoods["score"].items()
        for nll2, choices2 in [likelihoods["generate"][key]]
    )
    pairs = len(adapters) * prompt_count * (len(CHOICES) + 1)
    for mode, label in (("generate", f"generate ({max_tokens} tokens) + score"), ("score", "score only")):
        times = summaries[mode].timings()
        print(
            f"{name:<13} {label:<29} wall {walls[mode]:7.2f} s  {len(adapters) / (walls[mode] / 60):7.1f} adapters/min"
            f"  (scoring {times['score_s']:6.2f} s, generating {times['generate_s']:6.2f} s, "
            f"load+unload {times['load_s'] + times['unload_s']:5.2f} s)"
        )
    print(
        f"{name:<13} {'one choice at a time (before)':<29} wall {walls['loop']:7.2f} s  "
        f"{len(adapters) / (walls['loop'] / 60):7.1f} adapters/min  ({pairs} pairs; fastest of {rounds} rounds each)"
    )
    print(
        f"{'':13} score only: {walls['generate'] / walls['score']:.1f}x the speed of generate + score, "
        f"{walls['loop'] / walls['score']:.1f}x that of one choice at a time; largest difference of the "
        f"likelihoods against the generating run {worst:.1e}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "medium"], default="tiny", help="see above")
    parser.add_argument("--adapters", type=int, default=50)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--providers", nargs="+", default=["llamacpp", "transformers"])
    parser.add_argument("--concurrency", type=int, default=20, help="requests in flight (Transformers batches them)")
    parser.add_argument("--adapters-in-flight", type=int, nargs="+", default=[1], help="adapters at once, each in turn")
    parser.add_argument("--max-batch-size", type=int, default=32, help="Transformers' max_batch_size (default 32)")
    parser.add_argument(
        "--score-only",
        action="store_true",
        help="the likelihood evaluation instead: a multiple-choice set scored only, against generating and scoring "
        "and against one choice at a time",
    )
    parser.add_argument("--rounds", type=int, default=3, help="--score-only: runs of each way (the fastest kept)")
    parser.add_argument(
        "--baseline-without-spare-slots",
        action="store_true",
        help="Transformers: first run one adapter at a time with spare_adapter_slots=0 (every load builds its "
        "LoRA layers, as before spare slots), the baseline of the ratios",
    )
    args = parser.parse_args()
    global MAX_BATCH_SIZE, SPARE_ADAPTER_SLOTS
    MAX_BATCH_SIZE = args.max_batch_size

    from inference.testing.tiny_models import build_tiny_models

    tiny = build_tiny_models()["qwen2"]
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as folder:
        workdir = Path(folder)
        start = time.perf_counter()
        if args.model == "medium":
            sys.path.insert(0, str(Path(__file__).parent))
            from types import SimpleNamespace

            from bench_batching import build_medium_model

            model_dir, _ = build_medium_model(tiny, workdir)
            tiny = SimpleNamespace(hf_dir=model_dir, gguf_path=None)
            adapters = make_hf_adapters(model_dir, workdir / "adapters", args.adapters)
        else:
            adapters = make_adapters(tiny.gguf_path, workdir / "adapters", args.adapters)
        print(f"wrote {len(adapters)} random LoRA adapters (rank 8, q/v) in {time.perf_counter() - start:.1f} s")
        print(
            f"{args.model} qwen2, {args.adapters} adapters x {args.prompts} prompts, max_tokens={args.max_tokens}, "
            f"greedy, concurrency {args.concurrency}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
        )
        for name in args.providers:
            if args.score_only:
                asyncio.run(
                    bench_scoring(
                        name, tiny, adapters, args.prompts, args.max_tokens, workdir, args.concurrency, args.rounds
                    )
                )
                continue
            baseline: tuple[float, dict[tuple[str, str], Any]] | None = None
            runs: list[tuple[int, int | None]] = [(in_flight, None) for in_flight in args.adapters_in_flight]
            if args.baseline_without_spare_slots and name.startswith("transformers"):
                runs.insert(0, (1, 0))
            for in_flight, spare in runs:
                SPARE_ADAPTER_SLOTS = spare
                figures, outputs = asyncio.run(
                    bench(name, tiny, adapters, args.prompts, args.max_tokens, workdir, args.concurrency, in_flight)
                )
                label = f"{in_flight} adapters in flight"
                label += f", spare_adapter_slots={spare}" if spare is not None else ""
                report(name, figures, in_flight)
                if baseline is None:
                    baseline = figures["adapters_per_min_wall"], outputs
                    print(f"{'':13} ({label}: the baseline)")
                    continue
                same = sum(outputs[key] == baseline[1].get(key) for key in outputs)
                print(
                    f"{'':13} {label}: {figures['adapters_per_min_wall'] / baseline[0]:.2f}x "
                    f"the adapters per minute (wall) of the baseline; rows equal: {same} of {len(outputs)}"
                )
    return 0


def report(name: str, figures: dict[str, float], in_flight: int) -> None:
    label = name if in_flight == 1 else f"{name} x{in_flight}"
    print(
        f"{label:<13} {figures['adapters_per_min']:7.1f} adapters/min  "
        f"({figures['adapters_per_min_wall']:7.1f} over the wall time)  "
        f"load {figures['load_s']:6.2f} s  unload {figures['unload_s']:5.2f} s  "
        f"generate {figures['generate_s']:7.2f} s  load+unload {100 * figures['load_unload_share']:4.1f}%  "
        f"{figures['rows_per_s']:6.1f} rows/s  latency {figures['mean_latency_ms']:6.1f} ms  "
        f"(wall {figures['wall_s']:.1f} s, {figures['completion_tokens']} tokens)"
    )


if __name__ == "__main__":
    sys.exit(main())
