"""Spans and metrics of every request, with the real OpenTelemetry SDK (in-memory exporters) and prometheus-client."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from inference import FakeProvider, GenerationResult, InvalidRequestError
from inference._core import telemetry
from inference.metrics import enable_prometheus, serve_prometheus

otel_trace = pytest.importorskip("opentelemetry.trace")
otel_metrics = pytest.importorskip("opentelemetry.metrics")
prometheus_client = pytest.importorskip("prometheus_client")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

_SPANS = InMemorySpanExporter()
_METRICS = InMemoryMetricReader()
_installed: list[bool] = []


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The SDK's providers, set once for the process (OpenTelemetry allows one), and this test's finished spans."""
    if not _installed:
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(_SPANS))
        otel_trace.set_tracer_provider(tracer_provider)
        otel_metrics.set_meter_provider(MeterProvider(metric_readers=[_METRICS]))
        _installed.append(True)
    _SPANS.clear()
    yield _SPANS


def points() -> dict[tuple[str, frozenset[tuple[str, Any]]], float]:
    """Every metric point now: (name, attributes) -> a sum's value or a histogram's count (cumulative)."""
    found: dict[tuple[str, frozenset[tuple[str, Any]]], float] = {}
    data = _METRICS.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    found[(metric.name, frozenset(point.attributes.items()))] = (
                        point.count if value is None else value
                    )
    return found


def delta(before: dict[Any, float], name: str, **attributes: str) -> float:
    key = (name, frozenset(attributes.items()))
    return points().get(key, 0) - before.get(key, 0)


def by_name(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


async def test_a_generation_is_a_span_and_metric_points(spans: InMemorySpanExporter) -> None:
    provider = FakeProvider()
    await provider.load_adapter("style", "/adapters/style")
    before = points()
    result = await provider.generate("Hello there", model="m", adapter_id="style", max_tokens=4)
    (span,) = by_name(spans, "inference.generate")
    assert {key: span.attributes[key] for key in (
        "inference.provider", "inference.model", "inference.adapter_id", "inference.prompt_tokens",
        "inference.completion_tokens", "inference.finish_reason", "inference.outcome",
    )} == {
        "inference.provider": "fake", "inference.model": "m", "inference.adapter_id": "style",
        "inference.prompt_tokens": result.prompt_tokens, "inference.completion_tokens": result.completion_tokens,
        "inference.finish_reason": result.finish_reason, "inference.outcome": "ok",
    }
    assert span.attributes["gen_ai.usage.output_tokens"] == result.completion_tokens
    assert span.end_time > span.start_time and span.status.is_ok
    labels = {"provider": "fake", "operation": "generate"}
    assert delta(before, "inference.requests", **labels, outcome="ok") == 1
    assert delta(before, "inference.request.duration", **labels, outcome="ok") == 1
    assert delta(before, "inference.tokens", **labels, direction="completion") == result.completion_tokens
    assert delta(before, "inference.tokens", **labels, direction="prompt") == result.prompt_tokens


async def test_a_failure_is_an_error_span_and_counted_by_class(spans: InMemorySpanExporter) -> None:
    before = points()
    with pytest.raises(InvalidRequestError):
        await FakeProvider().generate("Hello", model="m", max_tokens=0)
    (span,) = by_name(spans, "inference.generate")
    assert span.attributes["inference.outcome"] == "error"
    assert span.attributes["inference.error_type"] == "InvalidRequestError"
    assert not span.status.is_ok and span.events[0].name == "exception"
    labels = {"provider": "fake", "operation": "generate"}
    assert delta(before, "inference.request.errors", **labels, error="InvalidRequestError") == 1
    assert delta(before, "inference.requests", **labels, outcome="error") == 1


async def test_streams_record_the_first_piece_and_a_stream_left_early_is_cancelled(
    spans: InMemorySpanExporter,
) -> None:
    provider = FakeProvider()
    async for _ in provider.stream("Hello", model="m", max_tokens=5):
        pass
    async with contextlib.aclosing(provider.stream("Hello", model="m", max_tokens=5)) as events:
        async for _ in events:
            break
    whole, left = by_name(spans, "inference.stream")
    assert whole.attributes["inference.outcome"] == "ok" and whole.attributes["inference.completion_tokens"] == 5
    assert 0 <= whole.attributes["inference.time_to_first_piece_s"] <= (whole.end_time - whole.start_time) / 1e9
    assert left.attributes["inference.outcome"] == "cancelled"


async def test_a_stream_left_on_its_final_result_is_ok_not_cancelled(spans: InMemorySpanExporter) -> None:
    """The stream docstring's own loop returns on the GenerationResult: the generator is closed at that yield, after
    the generation completed."""
    before = points()
    async with contextlib.aclosing(FakeProvider().stream("Hello", model="m", max_tokens=5)) as events:
        async for event in events:
            if isinstance(event, GenerationResult):
                break
    (span,) = by_name(spans, "inference.stream")
    assert (span.attributes["inference.outcome"], span.attributes["inference.completion_tokens"]) == ("ok", 5)
    assert span.status.is_ok
    labels = {"provider": "fake", "operation": "stream"}
    assert delta(before, "inference.requests", **labels, outcome="ok") == 1
    assert delta(before, "inference.requests", **labels, outcome="cancelled") == 0


async def test_scoring_and_adapter_loads_are_recorded_and_a_reload_is_a_child_of_its_request(
    spans: InMemorySpanExporter,
) -> None:
    provider = FakeProvider(max_adapters=1)
    before = points()
    await provider.load_adapter("a", "/adapters/a")
    await provider.load_adapter("b", "/adapters/b")  # evicts a
    await provider.generate("Hi", model="m", adapter_id="a", max_tokens=1)  # reloads a, evicts b
    score = await provider.score("The sky is", " blue", model="m")
    loads = {"provider": "fake", "operation": "load", "outcome": "ok"}
    assert delta(before, "inference.adapter.operations", **loads) == 3
    assert delta(before, "inference.adapter.operations", provider="fake", operation="unload", outcome="ok") == 2
    (generate,) = by_name(spans, "inference.generate")
    (reload,) = by_name(spans, "inference.adapter.reload")
    assert reload.parent is not None and reload.parent.span_id == generate.context.span_id
    (scored,) = by_name(spans, "inference.score")
    assert scored.attributes["inference.scored_tokens"] == score.num_tokens
    assert delta(before, "inference.tokens", provider="fake", operation="score", direction="scored") == score.num_tokens


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_prometheus_counts_and_serves_the_metrics() -> None:
    registry = prometheus_client.CollectorRegistry()
    port = _free_port()
    serve_prometheus(port, addr="127.0.0.1", registry=registry)
    try:
        provider = FakeProvider()
        await provider.generate("Hello", model="m", max_tokens=3)
        with pytest.raises(InvalidRequestError):
            await provider.generate("Hello", model="m", temperature=-1)
        labels = {"provider": "fake", "operation": "generate"}
        assert registry.get_sample_value("inference_requests_total", {**labels, "outcome": "ok"}) == 1
        errors = {**labels, "error": "InvalidRequestError"}
        assert registry.get_sample_value("inference_request_errors_total", errors) == 1
        assert registry.get_sample_value("inference_tokens_total", {**labels, "direction": "completion"}) == 3
        assert registry.get_sample_value("inference_request_duration_seconds_count", {**labels, "outcome": "ok"}) == 1
        async with httpx.AsyncClient(trust_env=False) as client:
            page = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        assert 'inference_requests_total{operation="generate",outcome="ok",provider="fake"} 1.0' in page
        enable_prometheus(registry)  # again: nothing registered twice
    finally:
        telemetry.set_prometheus(None)


async def test_a_failing_sink_never_fails_the_request(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def request(self, *args: object) -> None:
            raise RuntimeError("sink down")

    telemetry.set_prometheus(Broken())
    try:
        provider = FakeProvider()
        with caplog.at_level(logging.WARNING, logger="inference.telemetry"):
            for _ in range(2):
                assert (await provider.generate("Hello", model="m", max_tokens=2)).completion_tokens == 2
    finally:
        telemetry.set_prometheus(None)
    assert [record.getMessage() for record in caplog.records if record.name == "inference.telemetry"] == [
        "recording Prometheus metrics failed; requests go on without it"
    ]


def test_without_the_packages_requests_work_and_prometheus_names_its_extra() -> None:
    script = (
        "import asyncio, sys\n"
        "sys.modules['opentelemetry'] = None; sys.modules['prometheus_client'] = None\n"
        "from inference import FakeProvider, MissingDependencyError\n"
        "print(asyncio.run(FakeProvider().generate('Hi', model='m', max_tokens=2)).completion_tokens)\n"
        "import inference.metrics\n"
        "try:\n"
        "    inference.metrics.enable_prometheus()\n"
        "except MissingDependencyError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    count, message = done.stdout.splitlines()
    assert count == "2"
    assert "pip install 'inference-adapters[prometheus]'" in message
