"""Benchmark: log-likelihood scoring and constrained decoding on the in-process providers.

Three measurements, each side by side in one run:

1. **Transformers, 200 (context, continuation) pairs x 4 adapters**, scored three ways:

   * **provider**: ``TransformersProvider.score_batch`` for the 4 adapters at once (concurrent ``score`` calls
     batch themselves, rows of different adapters in one forward pass);
   * **one at a time**: one forward pass per pair on a plain ``PeftModel`` (``set_adapter`` per adapter);
   * **lm-eval hf**: lm-eval-harness's own ``HFLM`` with the same PEFT adapter, one model per adapter (lm-eval
     loads a model per adapter), ``loglikelihood`` over the same pairs, batch size 32; load time included.

   Targets: provider >= 5x one at a time, and at least as fast as lm-eval's ``hf``. The script also checks the
   three agree (max difference in nats).
2. **llama.cpp** (Gemma 3 270M Q4_K_M, the demo model, when installed; else the tiny Qwen2): scored tokens
   per second against generated tokens per second.
3. **Constrained decoding**: greedy tokens/s with a ``json_schema`` against without, per in-process backend.

Models: ``medium`` is the random Qwen2 of ``bench_batching.py`` (hidden size 512, 4 layers) with its three
adapters plus a0 loaded again as a3; the tiny model would measure only Python overhead.

Run: ``.venv/bin/python scripts/bench_scoring.py [--pairs 200] [--skip-lm-eval]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

from bench_batching import adapter_paths, build_medium_model  # noqa: E402
from inference._core.scoring import Vocabulary, score_tokens  # noqa: E402
from inference.testing.tiny_models import build_tiny_models  # noqa: E402

CONTEXTS = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The system works like this: you write a prompt, the model reads it, and then it",
    "In the evening the lights of the houses came on one by one, and the children",
    "Knowledge is power, and time is money; but what is the price of a quiet afternoon when",
    "The baker prepared dough for the morning and left it to rise near the warm oven, because",
)
CONTINUATIONS = (
    " went out to sea every morning.",
    " writes an answer back to you.",
    " ran home for supper.",
    " nobody asks you for anything?",
    " the kitchen was cold.",
    " slept.",
    " counted the boats in the harbour twice.",
)
SCHEMA = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 40},
    },
    "required": ["items"],
}


def pairs(count: int) -> list[tuple[str, str]]:
    """``count`` distinct pairs (lm-eval computes a repeated request once: repeats would flatter it)."""
    return [
        (f"Story {i}. {CONTEXTS[i % len(CONTEXTS)]}", CONTINUATIONS[(i * 3 + i // 5) % len(CONTINUATIONS)])
        for i in range(count)
    ]


def choice_pairs(items: int) -> list[tuple[str, str]]:
    """``items`` multiple-choice items of 4 choices each: one context, 4 continuations (distinct contexts)."""
    return [
        (f"Item {i}. {CONTEXTS[i % len(CONTEXTS)]}", CONTINUATIONS[(i + choice * 2) % len(CONTINUATIONS)])
        for i in range(items)
        for choice in range(4)
    ]


async def provider_scores(
    model_dir: Path, adapters: dict[str, Path], work: list[tuple[str, str]], *, stacking: bool = True
) -> dict[str, Any]:
    from inference.transformers_provider import TransformersProvider

    async with TransformersProvider(model_name=str(model_dir), max_batch_size=32) as provider:
        provider._slots.stacking = stacking  # False: every adapter served by PEFT (the path before LoraStacks)
        for adapter_id, path in adapters.items():
            await provider.load_adapter(adapter_id, path)
        await provider.score_batch(work[:8], model="m", adapter_id="a0")  # warm-up
        start = time.perf_counter()
        results = await asyncio.gather(
            *(provider.score_batch(work, model="m", adapter_id=a, max_concurrency=64) for a in adapters)
        )
        elapsed = time.perf_counter() - start
    scores = {a: [r.logprob for r in rows] for a, rows in zip(adapters, results, strict=True)}
    return {"seconds": elapsed, "scores": scores}


def one_at_a_time(model_dir: Path, adapters: dict[str, Path], work: list[tuple[str, str]]) -> dict[str, Any]:
    import peft
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    names = list(adapters)
    model = peft.PeftModel.from_pretrained(base, str(adapters[names[0]]), adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(str(adapters[name]), adapter_name=name)
    model.eval()
    vocabulary = Vocabulary(
        lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        adds_bos=False,
        bos_id=tokenizer.bos_token_id,
        eos_id=tokenizer.eos_token_id,
    )
    sequences = [score_tokens(vocabulary, c, x, provider="bench") for c, x in work]
    scores: dict[str, list[float]] = {}
    start = time.perf_counter()
    with torch.no_grad():
        for name in names:
            model.set_adapter(name)
            row = []
            for sequence in sequences:
                ids = torch.tensor([sequence.tokens[:-1]])
                logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
                targets = torch.tensor(sequence.tokens[sequence.start :])
                picked = logprobs[sequence.start - 1 :].gather(1, targets[:, None])
                row.append(float(picked.sum()))
            scores[name] = row
    return {"seconds": time.perf_counter() - start, "scores": scores}


def lm_eval_hf(model_dir: Path, adapters: dict[str, Path], work: list[tuple[str, str]]) -> dict[str, Any]:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    scores: dict[str, list[float]] = {}
    start = time.perf_counter()
    for name, path in adapters.items():
        lm = HFLM(pretrained=str(model_dir), peft=str(path), batch_size=32, device="cpu", dtype="float32")
        requests = [
            Instance("loglikelihood", {}, (context, continuation), index) for index, (context, continuation) in
            enumerate(work)
        ]
        scores[name] = [logprob for logprob, _ in lm.loglikelihood(requests, disable_tqdm=True)]
        del lm
    return {"seconds": time.perf_counter() - start, "scores": scores}


def largest_gap(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    return max(abs(x - y) for name in a for x, y in zip(a[name], b[name], strict=True))


def transformers_part(count: int, skip_lm_eval: bool, size: str) -> None:
    tiny = build_tiny_models()["qwen2"]
    with tempfile.TemporaryDirectory() as directory:
        if size == "tiny":
            model_dir, built = tiny.hf_dir, dict(tiny.adapter_dirs)
        else:
            model_dir, built = build_medium_model(tiny, Path(directory))
        adapters = adapter_paths(built)
        work = pairs(count)
        torch.set_num_threads(os.cpu_count() or 1)
        peft_only = asyncio.run(provider_scores(model_dir, adapters, work, stacking=False))
        ours = asyncio.run(provider_scores(model_dir, adapters, work))
        seed = one_at_a_time(model_dir, adapters, work)
        total = count * len(adapters)
        print(f"\n## Transformers: {count} pairs x {len(adapters)} adapters = {total} scores ({size} Qwen2)")
        print("| way | seconds | scores/s | provider's speed-up |")
        print("| --- | ---: | ---: | ---: |")
        rows = [
            ("provider (concurrent score_batch)", ours),
            ("provider, every adapter served by PEFT", peft_only),
            ("one forward pass per pair, one at a time", seed),
        ]
        if not skip_lm_eval:
            theirs = lm_eval_hf(model_dir, adapters, work)
            rows.append(("lm-eval `hf` (a model per adapter, batch 32)", theirs))
        for label, run in rows:
            print(f"| {label} | {run['seconds']:.2f} | {total / run['seconds']:.0f} | "
                  f"{run['seconds'] / ours['seconds']:.2f}x |")
        gap = largest_gap(ours["scores"], seed["scores"])
        print(f"\nlargest difference from one-at-a-time: {gap:.2e} nats", end="")
        if not skip_lm_eval:
            print(f"; from lm-eval hf: {largest_gap(ours['scores'], theirs['scores']):.2e} nats")
        print()
        choices = choice_pairs(count)
        total = len(choices) * len(adapters)
        peft_only = asyncio.run(provider_scores(model_dir, adapters, choices, stacking=False))
        ours = asyncio.run(provider_scores(model_dir, adapters, choices))
        print(f"\n## Transformers: {count} items x 4 choices x {len(adapters)} adapters = {total} scores ({size})")
        print("| way | seconds | scores/s | provider's speed-up |")
        print("| --- | ---: | ---: | ---: |")
        rows = [("provider (contexts shared, stacks)", ours), ("provider, every adapter served by PEFT", peft_only)]
        if not skip_lm_eval:
            theirs = lm_eval_hf(model_dir, adapters, choices)
            rows.append(("lm-eval `hf` (a model per adapter, batch 32)", theirs))
        for label, run in rows:
            print(f"| {label} | {run['seconds']:.2f} | {total / run['seconds']:.0f} | "
                  f"{run['seconds'] / ours['seconds']:.2f}x |")
        if not skip_lm_eval:
            print(f"\nlargest difference from lm-eval hf: {largest_gap(ours['scores'], theirs['scores']):.2e} nats")


async def tokens_per_second(provider: Any, prompts: list[str], **options: Any) -> tuple[float, int]:
    start = time.perf_counter()
    results = await asyncio.gather(*(provider.generate(p, model="m", temperature=0, **options) for p in prompts))
    tokens = sum(result.completion_tokens for result in results)
    return tokens / (time.perf_counter() - start), tokens


async def llamacpp_part(count: int) -> None:
    from inference.llamacpp_provider import LlamaCppProvider

    try:
        sys.path.insert(0, str(Path(__file__).parent))
        from demo import gemma_model_path

        model_path, label = gemma_model_path(), "Gemma 3 270M Q4_K_M"
    except SystemExit:
        model_path, label = build_tiny_models()["qwen2"].gguf_path, "tiny Qwen2"
    work = pairs(count)
    async with LlamaCppProvider(model_path=str(model_path), n_ctx=512) as provider:
        await provider.score(*work[0], model="m")
        start = time.perf_counter()
        scores = await provider.score_batch(work, model="m")
        seconds = time.perf_counter() - start
        scored = sum(s.num_tokens for s in scores if not isinstance(s, Exception))
        read = sum(len(c) + len(x) for c, x in work)  # characters, for the record
        generated_rate, generated = await tokens_per_second(provider, [c for c, _ in work[:8]], max_tokens=64)
        print(f"\n## llama.cpp scoring ({label}): {count} pairs")
        print(f"scored {scored} continuation tokens ({read} characters read) in {seconds:.2f} s: "
              f"{count / seconds:.1f} pairs/s, {scored / seconds:.0f} scored tokens/s; "
              f"generation of {generated} tokens: {generated_rate:.0f} tokens/s")
        print("\n## Constrained decoding, llama.cpp")
        await constrained(provider, label)


async def constrained(provider: Any, label: str) -> None:
    prompts = ["Give me a shopping list as JSON:"] * 4
    await tokens_per_second(provider, prompts[:1], max_tokens=8, json_schema=SCHEMA)  # compile the schema once
    plain, _ = await tokens_per_second(provider, prompts, max_tokens=96)
    shaped, _ = await tokens_per_second(provider, prompts, max_tokens=96, json_schema=SCHEMA)
    print(f"| {label} | {plain:.0f} tokens/s | {shaped:.0f} tokens/s with json_schema | "
          f"{100 * (shaped / plain - 1):+.0f}% |")


async def transformers_constrained() -> None:
    from inference.transformers_provider import TransformersProvider

    tiny = build_tiny_models()["qwen2"]
    with tempfile.TemporaryDirectory() as directory:
        model_dir, _ = build_medium_model(tiny, Path(directory))
        async with TransformersProvider(model_name=str(model_dir)) as provider:
            await provider.generate("warm up", model="m", max_tokens=4)
            print("\n## Constrained decoding, Transformers")
            await constrained(provider, "medium Qwen2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--skip-lm-eval", action="store_true")
    parser.add_argument("--model", choices=["tiny", "medium"], default="medium", help="the Transformers model")
    parser.add_argument("--part", choices=["all", "transformers", "llamacpp", "constrained"], default="all")
    args = parser.parse_args(argv)
    print(f"# bench_scoring: {os.cpu_count()} CPUs, torch {torch.__version__}, threads {torch.get_num_threads()}")
    if args.part in ("all", "transformers"):
        transformers_part(args.pairs, args.skip_lm_eval, args.model)
    if args.part in ("all", "llamacpp"):
        asyncio.run(llamacpp_part(args.pairs))
    if args.part in ("all", "constrained"):
        asyncio.run(transformers_constrained())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
