"""How much time VLLMProvider adds on top of a raw AsyncOpenAI call, against a local stub server.

The stub is a minimal OpenAI-compatible HTTP/1.1 server (keep-alive, asyncio, in a separate process) that
answers ``POST /v1/chat/completions`` at once with a fixed valid body, so what is measured is client-side
cost only. The script compares ``VLLMProvider.generate`` with ``AsyncOpenAI().chat.completions.create``:

- sequential latency, p50 and p95 per call, after a warm-up, the two clients interleaved call by call;
- throughput with 64 and 256 requests in flight, in short rounds alternated between the two clients; the
  ratio is the median of the per-round ratios, which keeps it meaningful on a shared, noisy machine.

Targets: the SDK adds under 0.3 ms at p50 and keeps at least 95% of the raw throughput.
Run: ``.venv/bin/python scripts/bench_http_overhead.py [--calls 2000] [--rounds 3]``. It stops by itself
(well under two minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

_BODY = json.dumps(
    {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "stub-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello from the stub server."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16},
    }
).encode()
_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(_BODY)).encode()
    + b"\r\n\r\n"
    + _BODY
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 22\r\n\r\n" + (
    b'{"detail":"Not Found"}'
)
DEADLINE_SECONDS = 90.0


class _StubProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive: reads each request (headers + content-length body) and answers at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            path = head.split(" ", 2)[1]
            self.transport.write(_RESPONSE if path.endswith("/chat/completions") else _NOT_FOUND)  # type: ignore[attr-defined]


def _serve(port: int) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_StubProtocol, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the stub server did not start on port {port}")


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _throughput(call: Callable[[], Awaitable[object]], in_flight: int, total: int) -> float:
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await call()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return total / (time.perf_counter() - start)


async def _bench(base_url: str, calls: int, rounds: int, started: float) -> int:
    from openai import AsyncOpenAI

    from inference.vllm_provider import VLLMProvider

    provider = VLLMProvider(base_url=base_url, timeout=30.0)
    raw = AsyncOpenAI(base_url=base_url, api_key="EMPTY", timeout=30.0)
    messages = [{"role": "user", "content": "Say hello."}]

    async def sdk_call() -> object:
        return await provider.generate("Say hello.", model="stub-model", max_tokens=16)

    async def raw_call() -> object:
        return await raw.chat.completions.create(model="stub-model", messages=messages, max_tokens=16)  # type: ignore[arg-type]

    result = await provider.generate("Say hello.", model="stub-model", max_tokens=16)
    assert result.text == "Hello from the stub server." and result.token_count == 16, result

    for _ in range(300):  # warm-up: connections, caches, lazy imports
        await sdk_call()
        await raw_call()

    sdk_times: list[float] = []
    raw_times: list[float] = []
    for index in range(calls):
        order = ((sdk_call, sdk_times), (raw_call, raw_times))
        for call, times in order if index % 2 == 0 else reversed(order):
            start = time.perf_counter()
            await call()
            times.append(time.perf_counter() - start)
        if time.monotonic() - started > DEADLINE_SECONDS / 2:
            break

    throughput: dict[int, tuple[float, float, float]] = {}
    for in_flight in (64, 256):
        total = in_flight * 6
        sdk_rates: list[float] = []
        raw_rates: list[float] = []
        for round_number in range(rounds):
            pairs = [(sdk_call, sdk_rates), (raw_call, raw_rates)]
            for call, rates in pairs if round_number % 2 == 0 else reversed(pairs):
                rates.append(await _throughput(call, in_flight, total))
            if time.monotonic() - started > DEADLINE_SECONDS * (0.75 if in_flight == 64 else 1.0):
                break
        # The machine may be shared: compare each round with its neighbour, then take the median.
        ratio = statistics.median(sdk / raw for sdk, raw in zip(sdk_rates, raw_rates, strict=True))
        throughput[in_flight] = (statistics.median(sdk_rates), statistics.median(raw_rates), ratio)

    await provider.aclose()
    await raw.close()

    sdk_p50, raw_p50 = statistics.median(sdk_times) * 1e3, statistics.median(raw_times) * 1e3
    sdk_p95, raw_p95 = _percentile(sdk_times, 0.95) * 1e3, _percentile(raw_times, 0.95) * 1e3
    print(f"stub server at {base_url}; {len(sdk_times)} sequential calls per client after warm-up")
    print(f"{'':28}{'VLLMProvider':>14}{'raw AsyncOpenAI':>17}{'SDK / raw':>11}")
    print(f"{'sequential p50 (ms)':28}{sdk_p50:14.3f}{raw_p50:17.3f}{sdk_p50 / raw_p50:11.3f}")
    print(f"{'sequential p95 (ms)':28}{sdk_p95:14.3f}{raw_p95:17.3f}{sdk_p95 / raw_p95:11.3f}")
    for in_flight, (sdk_rate, raw_rate, ratio) in throughput.items():
        label = f"throughput @{in_flight} (req/s)"
        print(f"{label:28}{sdk_rate:14.0f}{raw_rate:17.0f}{ratio:11.3f}")
    overhead = sdk_p50 - raw_p50
    worst_ratio = min(ratio for _, _, ratio in throughput.values())
    print(f"SDK overhead at p50: {overhead:+.3f} ms (target < 0.3 ms)")
    print(f"SDK throughput / raw throughput, worst case: {worst_ratio:.1%} (target >= 95%)")
    met = overhead < 0.3 and worst_ratio >= 0.95
    print("targets met" if met else "targets MISSED")
    return 0 if met else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="sequential calls per client")
    parser.add_argument("--rounds", type=int, default=10, help="throughput rounds per client and concurrency")
    args = parser.parse_args()
    started = time.monotonic()
    port = _free_port()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    server.start()
    try:
        _wait_for_port(port)
        return asyncio.run(_bench(f"http://127.0.0.1:{port}/v1", args.calls, args.rounds, started))
    finally:
        server.terminate()
        server.join(5)
        print(f"finished in {time.monotonic() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    os.environ.pop("VLLM_API_KEY", None)
    sys.exit(main())
