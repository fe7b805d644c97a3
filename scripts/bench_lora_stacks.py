"""Benchmark: a batch that mixes adapters, PEFT's per-adapter loop against stacked LoRA matrices (LoraStacks).

For each model it generates greedily for one left-padded batch (``--rows`` rows, ``--tokens`` new tokens) four ways,
a fifth for reference and a sixth after an unload:

* **PEFT, one adapter**: every row uses adapter 0 (``adapter_names``), the cost users compare against;
* **PEFT, mixed**: the rows spread over ``--adapters`` adapters (PEFT runs each LoRA layer once per adapter);
* **stacks, one adapter** and **stacks, mixed**: the same batches through
  :class:`inference._inprocess.lora_stacks.LoraStacks` (one pass per layer whatever the number of adapters);
* **base**: the model without adapters;
* **stacks, mixed, after rank N**: the mixed batch again, on stacks that also held one adapter of rank
  ``--churn-rank`` (on the same projections) and freed it before the runs: an unloaded adapter must cost nothing
  (before the stacks shrank back, every later batch paid its rank; ``--churn-rank 0`` leaves this case out).

The issue's target: a mixed batch of 8 adapters at least 0.8x the throughput of the same batch on one adapter.
Every adapter is rank 8 on all seven projections of every block. Models are random Qwen2s built in memory:
``tiny`` (hidden 64, 2 layers: almost all time is Python overhead per step), ``medium`` (hidden 512, 4 layers) and,
with ``--large``, hidden 2048 and 16 layers (the issue's real-size model; slow on a CPU, meant for a GPU).

Run: ``.venv/bin/python scripts/bench_lora_stacks.py [--model tiny medium] [--rows 32] [--adapters 8]
[--device cpu|cuda] [--repeats 3] [--churn-rank 512]``
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing")

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from inference._inprocess.lora_stacks import LoraStacks, lora_module_weights  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
    "medium": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 4},
    "large": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16, "num_attention_heads": 16,
              "num_key_value_heads": 8},
}


def build(size: str, adapters: int, device: str) -> tuple[Any, Any, Any, list[int], Any]:
    """A random model, PEFT over a copy of it with ``adapters`` adapters, LoraStacks over another copy, and a
    function that builds more such stacks."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=512, max_position_embeddings=1024, **SIZES[size])
    base = transformers.Qwen2ForCausalLM(config).eval()
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False, inference_mode=True)
    reference: Any = None
    states = []
    for number in range(adapters):
        torch.manual_seed(100 + number)
        name = f"a{number}"
        if reference is None:
            reference = peft.PeftModel(copy.deepcopy(base), lora, adapter_name=name)
        else:
            reference.add_adapter(name, lora)
        states.append(peft.get_peft_model_state_dict(reference, adapter_name=name))

    def stacked_copy() -> tuple[Any, Any, list[int]]:
        stacked = copy.deepcopy(base).to(device)
        stacks = LoraStacks(torch, stacked, dtype=torch.float32, device=torch.device(device))
        modules = dict(stacked.named_modules())
        slots = [stacks.add(lora_module_weights(lora.to_dict(), state, modules=modules)) for state in states]
        return stacked, stacks, slots

    stacked, stacks, slots = stacked_copy()
    return reference.to(device).eval(), stacked, stacks, slots, stacked_copy


def churn(stacked: Any, stacks: Any, rank: int) -> None:
    """Load one random adapter of ``rank`` on every projection into ``stacks``, and unload it."""
    generator = torch.Generator().manual_seed(rank)
    state = {}
    for name, module in stacked.named_modules():
        if isinstance(module, torch.nn.Linear) and name.endswith(tuple(TARGETS)):
            state[f"{name}.lora_A.weight"] = torch.randn(rank, module.in_features, generator=generator) / 8
            state[f"{name}.lora_B.weight"] = torch.randn(module.out_features, rank, generator=generator) / 8
    config = {"r": rank, "lora_alpha": 2 * rank, "target_modules": TARGETS}
    stacks.remove(stacks.add(lora_module_weights(config, state, modules=dict(stacked.named_modules()))))


def interleaved(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each run; the runs take turns in every repeat, so a machine whose load drifts slows
    them alike (ratios within one repeat are what count)."""
    for run in runs.values():
        run()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def measure(size: str, args: argparse.Namespace) -> None:
    """Print one model's figures."""
    reference, stacked, stacks, slots, stacked_copy = build(size, args.adapters, args.device)
    tokens = torch.randint(5, 500, (args.rows, args.prompt), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(args.device)
    settings = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": False, "pad_token_id": 0}
    one = ["a0"] * args.rows
    mixed = [f"a{row % args.adapters}" for row in range(args.rows)]

    def peft_run(names: list[str]) -> Callable[[], Any]:
        return lambda: reference.generate(input_ids=tokens, adapter_names=names, **settings)

    def stacks_run(names: list[str], model: Any = stacked, held: Any = stacks) -> Callable[[], Any]:
        def run() -> Any:
            with held.rows([slots[int(name[1:])] for name in names]):
                return model.generate(input_ids=tokens, **settings)

        return run

    runs = {
        "base": lambda: stacked.generate(input_ids=tokens, **settings),
        "PEFT, one adapter": peft_run(one),
        "PEFT, mixed": peft_run(mixed),
        "stacks, one adapter": stacks_run(one),
        "stacks, mixed": stacks_run(mixed),
    }
    churned = f"stacks, mixed, after rank {args.churn_rank}"
    if args.churn_rank:
        churned_model, churned_stacks, _ = stacked_copy()
        churn(churned_model, churned_stacks, args.churn_rank)
        runs[churned] = stacks_run(mixed, churned_model, churned_stacks)
    with torch.inference_mode():
        same = stacks_run(mixed)().tolist() == peft_run(mixed)().tolist()
        seconds = interleaved(runs, args.repeats)
    generated = args.rows * args.tokens
    print(f"\n{size} (hidden {SIZES[size]['hidden_size']}, {SIZES[size]['num_hidden_layers']} layers); "
          f"mixed tokens equal PEFT's: {same}")
    if args.churn_rank:
        print(f"  stacks' memory: {stacks.nbytes / 2**20:.2f} MiB; after a rank-{args.churn_rank} adapter came "
              f"and went: {churned_stacks.nbytes / 2**20:.2f} MiB")
    width = max(map(len, seconds))
    for case, value in seconds.items():
        print(f"  {case:{width}s} {generated / value:9.0f} tokens/s  ({value * 1000:.0f} ms)")
    print(f"  PEFT   mixed / one adapter: {seconds['PEFT, one adapter'] / seconds['PEFT, mixed']:.2f}")
    print(f"  stacks mixed / one adapter: {seconds['stacks, one adapter'] / seconds['stacks, mixed']:.2f}"
          "   (target >= 0.8)")
    print(f"  stacks mixed / PEFT mixed:  {seconds['PEFT, mixed'] / seconds['stacks, mixed']:.2f}x")
    if args.churn_rank:
        print(f"  stacks mixed after rank {args.churn_rank} / stacks mixed: "
              f"{seconds['stacks, mixed'] / seconds[churned]:.2f}   (1.0: an unloaded adapter costs nothing)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["tiny", "medium"], choices=sorted(SIZES))
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens per row")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--churn-rank", type=int, default=512, help="rank of the adapter loaded and unloaded (0: none)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}; "
          f"{args.rows} rows x {args.tokens} new tokens, {args.adapters} adapters of rank 8 on 7 projections")
    for size in args.model:
        measure(size, args)


if __name__ == "__main__":
    main()
