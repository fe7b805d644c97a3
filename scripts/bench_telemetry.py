"""What spans and metrics cost per request: the fake provider's ``generate``, timed in three setups.

- ``none``: neither opentelemetry nor prometheus-client importable (what a bare install has);
- ``api``: ``opentelemetry-api`` importable, no SDK configured (spans and instruments are no-ops);
- ``sdk``: the OpenTelemetry SDK with in-memory exporters (every span and metric recorded) and Prometheus enabled
  (``inference.metrics.enable_prometheus()``).

Each setup runs in a process of its own; the figures are the best of 5 rounds of 3000 sequential calls, in
microseconds per call: the whole ``generate``, and the observation alone (what the instrumentation adds to each
request, measured without the rest, which a loaded machine makes noisy). Usage:
``python scripts/bench_telemetry.py`` (figures in docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

CALLS = 3000
ROUNDS = 5


def _measure(mode: str) -> tuple[float, float | None]:
    if mode == "none":
        for blocked in ("opentelemetry", "prometheus_client"):
            sys.modules[blocked] = None  # type: ignore[assignment]  # import fails as if not installed
    elif mode == "sdk":
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
        try:
            from inference.metrics import enable_prometheus
        except ImportError:  # before this SDK had metrics
            pass
        else:
            enable_prometheus()

    from inference import FakeProvider

    async def rounds() -> float:
        provider = FakeProvider()
        best = float("inf")
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for _ in range(CALLS):
                await provider.generate("Hello there", model="m", max_tokens=4)
            best = min(best, (time.perf_counter() - start) / CALLS)
        return best * 1e6

    def observations() -> float | None:
        try:
            from inference._core.telemetry import observe
        except ImportError:  # before this SDK had telemetry
            return None
        best = float("inf")
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for _ in range(CALLS):
                with observe("fake", "generate") as observed:
                    observed.request("m", None)
                    observed.result(3, 4, "length")
            best = min(best, (time.perf_counter() - start) / CALLS)
        return best * 1e6

    return asyncio.run(rounds()), observations()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--mode":
        print(json.dumps(_measure(sys.argv[2])))
        return
    print(f"best of {ROUNDS} x {CALLS} calls, microseconds per call")
    print("setup  fake generate  observation alone")
    for mode in ("none", "api", "sdk"):
        done = subprocess.run([sys.executable, __file__, "--mode", mode], capture_output=True, text=True, check=True)
        whole, alone = json.loads(done.stdout)
        print(f"{mode:<5} {whole:14.1f} {'' if alone is None else f'{alone:18.2f}'}")


if __name__ == "__main__":
    main()
