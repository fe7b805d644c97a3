"""This SDK against the clients users would pick instead, on one stub server, in one run: ``make bench-peers``.

Clients, each sending the same chat request (``max_tokens=8``) to the same OpenAI-compatible stub server of
``bench_http_overhead.py`` (a separate process, keep-alive, answering at once), so only client-side cost counts:

- raw ``openai.AsyncOpenAI`` (the baseline);
- this SDK, ``VLLMProvider.generate``;
- LiteLLM ``acompletion("hosted_vllm/...")`` and ``acompletion("openai/...")``;
- any-llm, one ``AnyLLM`` instance reused, and ``any_llm.acompletion`` (a client per call).

Sequential: ``--calls`` calls per client after a warm-up, the clients interleaved call by call; the table gives each
client's p50 minus the raw client's. Concurrent: 64 and 256 requests in flight, ``--rounds`` rounds with the clients
in turn; each client's throughput over the raw client's in the same round, the median over rounds. It also counts
the connections each client opens at 256 in flight, and reports import time (median of 5 fresh interpreters,
bytecode cached) and RSS after import.

The peers are benchmark-only dependencies, installed in ``.venv-peers`` by ``make bench-peers``; a peer that is not
installed is left out with a note. Run: ``.venv-peers/bin/python scripts/bench_peers.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_http_overhead import _free_port, _StubProtocol, _throughput, _wait_for_port

MESSAGES = [{"role": "user", "content": "Hello"}]
Call = Callable[[], Awaitable[Any]]


def _serve_counting(port: int, connections: Any) -> None:
    """The stub server, counting the connections it accepts."""

    class Counting(_StubProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            with connections.get_lock():
                connections.value += 1
            super().connection_made(transport)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Counting, "127.0.0.1", port, backlog=4096)
        await server.serve_forever()

    asyncio.run(main())


def _clients(base_url: str) -> tuple[dict[str, Call], list[str]]:
    """Each available client's one call, raw first; and notes on the peers left out."""
    from openai import AsyncOpenAI

    from inference.vllm_provider import VLLMProvider

    raw = AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    sdk = VLLMProvider(base_url=base_url, max_retries=0)
    clients: dict[str, Call] = {
        "raw AsyncOpenAI": lambda: raw.chat.completions.create(model="stub-model", messages=MESSAGES, max_tokens=8),
        "this SDK, VLLMProvider.generate": lambda: sdk.generate("Hello", model="stub-model", max_tokens=8),
    }
    notes = []
    if importlib.util.find_spec("litellm") is not None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: its bundled price table
        import litellm

        litellm.suppress_debug_info = True
        clients["LiteLLM acompletion(hosted_vllm/...)"] = lambda: litellm.acompletion(
            model="hosted_vllm/stub-model", messages=MESSAGES, api_base=base_url, max_tokens=8
        )
        clients["LiteLLM acompletion(openai/...)"] = lambda: litellm.acompletion(
            model="openai/stub-model", messages=MESSAGES, api_base=base_url, api_key="EMPTY", max_tokens=8
        )
    else:
        notes.append("LiteLLM is not installed: left out (make bench-peers installs it in .venv-peers)")
    if importlib.util.find_spec("any_llm") is not None:
        import any_llm

        instance = any_llm.AnyLLM.create("openai", api_key="EMPTY", api_base=base_url)
        clients["any-llm, one AnyLLM reused"] = lambda: instance.acompletion(
            model="stub-model", messages=MESSAGES, max_tokens=8
        )
        clients["any-llm acompletion (a client per call)"] = lambda: any_llm.acompletion(
            model="openai:stub-model", messages=MESSAGES, api_key="EMPTY", api_base=base_url, max_tokens=8
        )
    else:
        notes.append("any-llm is not installed: left out (make bench-peers installs any-llm-sdk in .venv-peers)")
    return clients, notes


async def _sequential(clients: dict[str, Call], calls: int) -> dict[str, float]:
    """p50 in ms of each client, the clients interleaved call by call."""
    times: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(calls):
        for name, call in clients.items():
            started = time.perf_counter()
            await call()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


async def _concurrent(clients: dict[str, Call], in_flight: int, rounds: int, total: int) -> dict[str, float]:
    """Each client's throughput over the raw client's, median over rounds (the clients in turn in each round)."""
    ratios: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(rounds):
        rates = {name: await _throughput(call, in_flight, total) for name, call in clients.items()}
        raw = rates["raw AsyncOpenAI"]
        for name, rate in rates.items():
            ratios[name].append(rate / raw)
    return {name: statistics.median(values) for name, values in ratios.items()}


async def _connections(clients: dict[str, Call], counter: Any, total: int) -> dict[str, int]:
    """Connections each client opens for ``total`` calls at 256 in flight (after the others' were made)."""
    opened = {}
    for name, call in clients.items():
        before = counter.value
        await _throughput(call, 256, total)
        opened[name] = counter.value - before
    return opened


def _import_figures(module: str) -> tuple[float, float] | None:
    """Median import time (ms) of 5 fresh interpreters and the RSS (MiB) after the import, or ``None``."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return None
    code = (  # VmRSS, not ru_maxrss: the latter keeps the peak of the forked parent across exec
        "import time, re; started = time.perf_counter(); "
        f"import {module}; elapsed = time.perf_counter() - started; "
        "rss = int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1)); "
        "print(elapsed * 1000, rss / 1024)"
    )
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)  # writes the bytecode cache
    runs = [
        [float(value) for value in subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()]
        for _ in range(5)
    ]
    return statistics.median(run[0] for run in runs), statistics.median(run[1] for run in runs)


async def _bench(base_url: str, counter: Any, calls: int, rounds: int) -> None:
    clients, notes = _clients(base_url)
    for note in notes:
        print(f"note: {note}")
    for _ in range(20):  # warm-up: connections, lazy imports, the SDK's one question about the route
        for call in clients.values():
            await call()
    p50 = await _sequential(clients, calls)
    at64 = await _concurrent(clients, 64, rounds, 640)
    at256 = await _concurrent(clients, 256, rounds, 1024)
    connections = await _connections(clients, counter, 1024)
    raw = p50["raw AsyncOpenAI"]
    print(f"\n{'client':42} {'p50 over raw (ms)':>18} {'@64 vs raw':>11} {'@256 vs raw':>12} {'conns @256':>11}")
    for name in clients:
        over = "" if name == "raw AsyncOpenAI" else f"{p50[name] - raw:+.3f}"
        print(f"{name:42} {over:>18} {at64[name]:>11.2f} {at256[name]:>12.2f} {connections[name]:>11}")
    print(f"(raw AsyncOpenAI p50: {raw:.3f} ms)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="sequential calls per client (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the concurrent part (default 5)")
    parser.add_argument("--quick", action="store_true", help="200 calls and 2 rounds: a smoke run")
    args = parser.parse_args()
    calls, rounds = (200, 2) if args.quick else (args.calls, args.rounds)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # also for the import timings' interpreters
    print(f"load average at the start: {os.getloadavg()}")
    counter = multiprocessing.Value("i", 0)
    port = _free_port()
    server = multiprocessing.Process(target=_serve_counting, args=(port, counter), daemon=True)
    server.start()
    try:
        _wait_for_port(port)
        asyncio.run(_bench(f"http://127.0.0.1:{port}/v1", counter, calls, rounds))
    finally:
        server.terminate()
    print(f"\n{'import':28} {'time (ms, median of 5)':>24} {'RSS after (MiB)':>16}")
    for module in ("inference", "inference.vllm_provider", "openai", "litellm", "any_llm"):
        figures = _import_figures(module)
        if figures is None:
            print(f"{module:28} {'not installed':>24}")
        else:
            print(f"{module:28} {figures[0]:>24.0f} {figures[1]:>16.0f}")
    print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
