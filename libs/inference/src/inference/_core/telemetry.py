"""Spans and metrics of every request, recorded in one place: the public methods of ``InferenceProvider``.

Each ``generate``, ``stream``, ``score`` and ``score_rolling`` call is one :class:`Observation`: a span
``inference.<operation>`` (attributes: provider, model, adapter, tokens, finish reason, outcome, error type, time to
first piece for a stream; the span's own duration is the latency), and one set of metric points for every sink
that is on:

- OpenTelemetry, when ``opentelemetry-api`` is importable and the application has set a ``TracerProvider`` (spans)
  or a ``MeterProvider`` (metrics: ``inference.requests``, ``inference.request.errors``,
  ``inference.request.duration`` in s, ``inference.tokens``, ``inference.adapter.operations``,
  ``inference.adapter.operation.duration`` in s). Before it sets one, nothing is made: the API would drop it;
- Prometheus, once :func:`inference.metrics.enable_prometheus` was called: the same, named the Prometheus way
  (``inference_requests_total``...).

Labels: ``provider``, ``operation``, ``outcome`` (``ok``, ``error``, ``cancelled``), ``error`` (the error's class
name) on errors, ``direction`` (``prompt``, ``completion``, ``scored``) on tokens. Models and adapter ids are span
attributes, not metric labels (an adapter id per training step would make a series per step).

With no sink on (neither package, or no provider set), an observation costs two clock reads and a few branches.
A sink that fails never fails the request: its error is logged once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["Observation", "observe", "observed_adapter_hook", "set_prometheus"]

logger = logging.getLogger("inference.telemetry")

_T = TypeVar("_T")

_otel: Any = None  # _OpenTelemetry once looked up; False when opentelemetry-api is not installed
_prometheus: Any = None  # inference.metrics' Prometheus metrics, once enabled
_failed_sinks: set[str] = set()


def set_prometheus(metrics: Any) -> None:
    """Record into these Prometheus metrics from now on (``None``: stop); see :mod:`inference.metrics`."""
    global _prometheus
    _prometheus = metrics


def _opentelemetry() -> Any:
    global _otel
    if _otel is None:
        try:
            from opentelemetry import context, metrics, trace
        except ImportError:
            _otel = False
        else:
            _otel = _OpenTelemetry(context, metrics, trace)
    return _otel


class _OpenTelemetry:
    """The tracer and the instruments, and whether the application has set providers for them yet.

    Before it does, the API's proxies drop everything, so nothing is made: that keeps an observation as cheap
    with ``opentelemetry-api`` installed and unused as without it.
    """

    def __init__(self, context: Any, metrics: Any, trace: Any) -> None:
        self.context = context
        self.trace = trace
        self.metrics = metrics
        self.tracer = trace.get_tracer("inference")
        self.instruments = _OtelInstruments(metrics.get_meter("inference"))
        tracer_provider = trace.get_tracer_provider()
        self.unset_tracer_provider = tracer_provider if isinstance(tracer_provider, trace.ProxyTracerProvider) else None
        meter_provider = metrics.get_meter_provider()
        self.unset_meter_provider = meter_provider if type(meter_provider).__name__.startswith("_Proxy") else None

    def tracer_if_set(self) -> Any:
        unset = self.unset_tracer_provider
        return None if unset is not None and self.trace.get_tracer_provider() is unset else self.tracer

    def instruments_if_set(self) -> _OtelInstruments | None:
        unset = self.unset_meter_provider
        return None if unset is not None and self.metrics.get_meter_provider() is unset else self.instruments


class _OtelInstruments:
    """The OpenTelemetry instruments."""

    def __init__(self, meter: Any) -> None:
        self.requests = meter.create_counter("inference.requests", "{request}", "Requests, by outcome")
        self.errors = meter.create_counter("inference.request.errors", "{request}", "Failed requests, by error")
        self.duration = meter.create_histogram("inference.request.duration", "s", "Request latency")
        self.tokens = meter.create_counter("inference.tokens", "{token}", "Prompt, completion and scored tokens")
        self.adapter_operations = meter.create_counter(
            "inference.adapter.operations", "{operation}", "Backend adapter loads and unloads, by outcome"
        )
        self.adapter_duration = meter.create_histogram(
            "inference.adapter.operation.duration", "s", "Backend adapter load and unload latency"
        )


def _sink_failed(sink: str) -> None:
    if sink not in _failed_sinks:
        _failed_sinks.add(sink)
        logger.warning("recording %s failed; requests go on without it", sink, exc_info=True)


class Observation:
    """One request's span and metric points (a context manager around the public method's body)."""

    __slots__ = ("_current", "_start", "_token", "completed", "completion_tokens", "finish_reason", "first_piece_s",
                 "operation", "prompt_tokens", "provider", "scored_tokens", "span")

    def __init__(self, provider: str, operation: str, *, current: bool = True) -> None:
        self.provider = provider
        self.operation = operation
        self._current = current
        self.span: Any = None
        self._token: Any = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.scored_tokens: int | None = None
        self.finish_reason: str | None = None
        self.first_piece_s: float | None = None
        self.completed = False

    def __enter__(self) -> Observation:
        otel = _otel if _otel is not None else _opentelemetry()
        tracer = otel.tracer_if_set() if otel else None
        if tracer is not None:
            try:
                self.span = tracer.start_span(
                    f"inference.{self.operation}",
                    attributes={"inference.provider": self.provider, "inference.operation": self.operation,
                                "gen_ai.system": self.provider},
                )
                if self._current:  # not for a stream: its context would leak into the consumer between pieces
                    self._token = otel.context.attach(otel.trace.set_span_in_context(self.span))
            except Exception:
                self.span = None
                _sink_failed("spans")
        self._start = time.perf_counter()
        return self

    def request(self, model: str, adapter_id: str | None) -> None:
        """What the request asks for (once it is checked)."""
        if self.span is not None:
            self.span.set_attribute("inference.model", model)
            self.span.set_attribute("gen_ai.request.model", model)
            if adapter_id is not None:
                self.span.set_attribute("inference.adapter_id", adapter_id)

    def piece(self) -> None:
        """A stream's piece reached the caller (the first one sets the time to first piece)."""
        if self.first_piece_s is None:
            self.first_piece_s = time.perf_counter() - self._start

    def result(
        self, prompt_tokens: int | None, completion_tokens: int | None, finish_reason: str | None = None
    ) -> None:
        """What a generation produced: it completed. A stream the caller leaves after this (it returns on the final
        result, and the generator is closed at that ``yield``) counts as ``ok``, not ``cancelled``."""
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.finish_reason = finish_reason
        self.completed = True

    def scored(self, tokens: int) -> None:
        """How many tokens a scoring call scored."""
        self.scored_tokens = tokens

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        seconds = time.perf_counter() - self._start
        if exc_type is None:
            outcome, error = "ok", None
        elif issubclass(exc_type, (asyncio.CancelledError, GeneratorExit)):
            # the caller stopped waiting (or left the stream); after the result, it had all there was
            outcome, error = ("ok" if self.completed else "cancelled"), None
        else:
            outcome, error = "error", exc_type.__name__
        if self.span is not None:
            self._end_span(outcome, error, exc)
        _record_metrics(
            lambda instruments: self._record_otel(instruments, outcome, error, seconds),
            lambda prometheus: prometheus.request(self, outcome, error, seconds),
        )

    def _end_span(self, outcome: str, error: str | None, exc: BaseException | None) -> None:
        span = self.span
        try:
            span.set_attribute("inference.outcome", outcome)
            if self.prompt_tokens is not None:
                span.set_attribute("inference.prompt_tokens", self.prompt_tokens)
                span.set_attribute("gen_ai.usage.input_tokens", self.prompt_tokens)
            if self.completion_tokens is not None:
                span.set_attribute("inference.completion_tokens", self.completion_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", self.completion_tokens)
            if self.scored_tokens is not None:
                span.set_attribute("inference.scored_tokens", self.scored_tokens)
            if self.finish_reason is not None:
                span.set_attribute("inference.finish_reason", self.finish_reason)
            if self.first_piece_s is not None:
                span.set_attribute("inference.time_to_first_piece_s", self.first_piece_s)
            if error is not None and exc is not None:
                span.set_attribute("inference.error_type", error)
                span.record_exception(exc)
                span.set_status(_otel.trace.Status(_otel.trace.StatusCode.ERROR, str(exc)))
            span.end()
            if self._token is not None:
                _otel.context.detach(self._token)
        except Exception:
            _sink_failed("spans")

    def _record_otel(self, instruments: _OtelInstruments, outcome: str, error: str | None, seconds: float) -> None:
        labels = {"provider": self.provider, "operation": self.operation}
        instruments.requests.add(1, {**labels, "outcome": outcome})
        instruments.duration.record(seconds, {**labels, "outcome": outcome})
        if error is not None:
            instruments.errors.add(1, {**labels, "error": error})
        if self.prompt_tokens:
            instruments.tokens.add(self.prompt_tokens, {**labels, "direction": "prompt"})
        if self.completion_tokens:
            instruments.tokens.add(self.completion_tokens, {**labels, "direction": "completion"})
        if self.scored_tokens:
            instruments.tokens.add(self.scored_tokens, {**labels, "direction": "scored"})


def observe(provider: str, operation: str, *, current: bool = True) -> Observation:
    """The observation of one ``operation`` call (``current``: its span is the parent of spans started inside)."""
    return Observation(provider, operation, current=current)


def observed_adapter_hook(
    provider: str, operation: str, hook: Callable[..., Awaitable[_T]]
) -> Callable[..., Awaitable[_T]]:
    """``hook`` (a backend's adapter load or unload), counted and timed as ``inference.adapter.operations``."""

    async def run(*args: Any) -> _T:
        start = time.perf_counter()
        outcome = "error"
        try:
            result = await hook(*args)
            outcome = "ok"
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            _record_adapter(provider, operation, outcome, time.perf_counter() - start)

    return run


def _record_adapter(provider: str, operation: str, outcome: str, seconds: float) -> None:
    labels = {"provider": provider, "operation": operation, "outcome": outcome}

    def to_otel(instruments: _OtelInstruments) -> None:
        instruments.adapter_operations.add(1, labels)
        instruments.adapter_duration.record(seconds, labels)

    _record_metrics(to_otel, lambda prometheus: prometheus.adapter(provider, operation, outcome, seconds))


def _record_metrics(to_otel: Callable[[_OtelInstruments], object], to_prometheus: Callable[[Any], object]) -> None:
    """Record one set of metric points in each metrics sink that is on (OpenTelemetry's instruments, inference.metrics'
    Prometheus metrics); a sink that fails is logged once and never fails the request."""
    otel = _otel if _otel is not None else _opentelemetry()
    instruments = otel.instruments_if_set() if otel else None
    if instruments is not None:
        try:
            to_otel(instruments)
        except Exception:
            _sink_failed("OpenTelemetry metrics")
    if _prometheus is not None:
        try:
            to_prometheus(_prometheus)
        except Exception:
            _sink_failed("Prometheus metrics")
