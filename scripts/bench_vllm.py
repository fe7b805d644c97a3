"""vLLM for real (CPU build): the SDK's overhead on a real server, and the engine in process against the server.

Run with vLLM's venv, where the SDK is installed too: ``.venv-vllm/bin/python scripts/bench_vllm.py [--quick]``
(``make bench-vllm``). On the head-64 tiny Qwen2 of :mod:`inference.testing.vllm_model` with adapters a0, a1, a2:

1. **HTTP overhead on a real vLLM server**: ``VLLMProvider.generate`` against a raw ``AsyncOpenAI`` chat call, the
   same one-token greedy request, interleaved call by call: p50 of each and the difference; then throughput with 64
   requests in flight, rounds alternated between the two clients, the median of the per-round ratios.
2. **Offline against server**: 64 concurrent greedy requests of 32 tokens over the base model and three adapters,
   through ``VLLMProvider`` on the server, then (the server stopped, so the two never share the CPU) through
   ``VLLMOfflineProvider`` in this process: generated tokens per second, the median of the rounds.

Absolute times are this machine's; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from inference.testing.vllm_model import SERVER_ENVIRONMENT, build_vllm_model, server_command, vllm_environment
from inference.vllm_offline_provider import VLLMOfflineProvider
from inference.vllm_provider import VLLMProvider

ADAPTERS: list[str | None] = [None, "a0", "a1", "a2"]
PROMPTS = ["the quick brown fox", "Once upon a time there was", "numbers 1 2 3 and", "Dear diary, today"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _start_server(model_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        process = subprocess.Popen(
            server_command(sys.executable, model_dir, port), stdout=sink, stderr=subprocess.STDOUT,
            env=vllm_environment(SERVER_ENVIRONMENT), start_new_session=True,
        )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"vLLM exited ({process.returncode}); see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.kill()
    raise SystemExit(f"vLLM did not start within 600 s; see {log}")


async def _rate(call: Callable[[], Awaitable[Any]], in_flight: int, total: int) -> float:
    """Calls per second with ``in_flight`` calls at once, ``total`` calls in all."""
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await call()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return total / (time.perf_counter() - started)


async def overhead(base_url: str, calls: int, rounds: int) -> dict[str, float]:
    """Part 1: the SDK against a raw AsyncOpenAI call on the same real server."""
    from openai import AsyncOpenAI

    raw = AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    messages = [{"role": "user", "content": "the quick brown fox"}]
    async with VLLMProvider(base_url=base_url) as provider:

        async def sdk_call() -> Any:
            return await provider.generate("the quick brown fox", model="tiny", max_tokens=1, temperature=0)

        async def raw_call() -> Any:
            return await raw.chat.completions.create(model="tiny", messages=messages, max_tokens=1, temperature=0)

        for _ in range(20):  # warm-up: connections, the route question, vLLM's caches
            await sdk_call()
            await raw_call()
        sdk_times, raw_times = [], []
        for _ in range(calls):
            for call, times in ((sdk_call, sdk_times), (raw_call, raw_times)):
                started = time.perf_counter()
                await call()
                times.append(time.perf_counter() - started)
        ratios = []
        for _ in range(rounds):
            sdk_rate = await _rate(sdk_call, 64, 256)
            raw_rate = await _rate(raw_call, 64, 256)
            ratios.append(sdk_rate / raw_rate)
    await raw.close()
    return {
        "raw_p50_ms": statistics.median(raw_times) * 1000,
        "sdk_p50_ms": statistics.median(sdk_times) * 1000,
        "overhead_p50_ms": (statistics.median(sdk_times) - statistics.median(raw_times)) * 1000,
        "throughput_ratio_64": statistics.median(ratios),
    }


async def mixed_rate(provider: Any, rounds: int) -> float:
    """Part 2: generated tokens per second of 64 concurrent greedy requests over the base model and 3 adapters."""
    work = [(PROMPTS[index % 4], ADAPTERS[(index // 4) % 4]) for index in range(64)]
    rates = []
    for _ in range(rounds + 1):  # the first round warms up
        started = time.perf_counter()
        results = await asyncio.gather(
            *(provider.generate(p, model="tiny", adapter_id=a, max_tokens=32, temperature=0) for p, a in work)
        )
        rates.append(sum(result.completion_tokens for result in results) / (time.perf_counter() - started))
    return statistics.median(rates[1:])


async def server_part(base_url: str, model: Any, calls: int, rounds: int) -> dict[str, float]:
    async with VLLMProvider(base_url=base_url) as provider:
        for name in ("a0", "a1", "a2"):
            await provider.load_adapter(name, model.adapter_dirs[name])
        figures = {"server_tokens_per_s": await mixed_rate(provider, rounds)}
    return {**figures, **await overhead(base_url, calls, rounds)}


async def offline_part(model: Any, rounds: int) -> dict[str, float]:
    async with VLLMOfflineProvider(model_name=str(model.hf_dir), dtype="float32", max_model_len=512) as provider:
        started = time.perf_counter()
        await provider.start()
        start_seconds = time.perf_counter() - started
        for name in ("a0", "a1", "a2"):
            await provider.load_adapter(name, model.adapter_dirs[name])
        return {"offline_tokens_per_s": await mixed_rate(provider, rounds), "offline_start_s": start_seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds (a smoke run)")
    args = parser.parse_args()
    calls, rounds = (50, 2) if args.quick else (300, 5)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model = build_vllm_model()
    port = _free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-vllm-{port}.log"
    print(f"load average before: {os.getloadavg()}")
    started = time.perf_counter()
    process = _start_server(model.hf_dir, port, log)
    print(f"vLLM server ready in {time.perf_counter() - started:.0f} s")
    try:
        figures = asyncio.run(server_part(f"http://127.0.0.1:{port}/v1", model, calls, rounds))
    finally:
        process.terminate()
        process.wait(timeout=60)
    figures.update(asyncio.run(offline_part(model, rounds)))
    print(f"load average after: {os.getloadavg()}")
    print(f"real vLLM server, one-token greedy chat call: raw AsyncOpenAI p50 {figures['raw_p50_ms']:.2f} ms, "
          f"VLLMProvider p50 {figures['sdk_p50_ms']:.2f} ms, overhead {figures['overhead_p50_ms']:+.2f} ms")
    print(f"64 in flight: VLLMProvider / raw throughput = {figures['throughput_ratio_64']:.2f}")
    print(f"64 concurrent mixed-adapter requests x 32 tokens: server {figures['server_tokens_per_s']:.0f} tok/s, "
          f"offline {figures['offline_tokens_per_s']:.0f} tok/s "
          f"(offline/server {figures['offline_tokens_per_s'] / figures['server_tokens_per_s']:.2f}); "
          f"offline engine start {figures['offline_start_s']:.0f} s")
    return 0


if __name__ == "__main__":  # vLLM spawns its engine process: the main module must be guarded
    sys.exit(main())
