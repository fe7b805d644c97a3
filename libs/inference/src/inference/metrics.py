"""The SDK's metrics for Prometheus, and where OpenTelemetry's come from.

Every provider records, for each ``generate``, ``stream``, ``score`` and ``score_rolling`` call and each backend
adapter load and unload (see :mod:`inference._core.telemetry`):

============================================== ========= ===========================================
Prometheus                                     kind      labels
============================================== ========= ===========================================
``inference_requests_total``                   counter   provider, operation, outcome
``inference_request_errors_total``             counter   provider, operation, error (class name)
``inference_request_duration_seconds``         histogram provider, operation, outcome
``inference_tokens_total``                     counter   provider, operation, direction
``inference_adapter_operations_total``         counter   provider, operation (load/unload), outcome
``inference_adapter_operation_duration_seconds`` histogram provider, operation, outcome
============================================== ========= ===========================================

OpenTelemetry metrics of the same names (dots: ``inference.requests``, ``inference.request.duration``...) are
recorded whenever ``opentelemetry-api`` is installed, into the ``MeterProvider`` the application sets (none set:
nothing is kept). For Prometheus, one line in the service (``pip install 'inference-adapters[prometheus]'``)::

    inference.metrics.serve_prometheus(9464)       # GET http://HOST:9464/metrics

or, in a service that already serves its own Prometheus registry, ``inference.metrics.enable_prometheus()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inference._core import telemetry
from inference.exceptions import MissingDependencyError

if TYPE_CHECKING:
    from inference._core.telemetry import Observation

__all__ = ["enable_prometheus", "serve_prometheus"]

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: from a cached fake answer to a long generation on a busy server."""

_enabled: dict[int, _PrometheusMetrics] = {}


class _PrometheusMetrics:
    """The SDK's metrics in one Prometheus registry."""

    def __init__(self, registry: Any) -> None:
        prometheus = _prometheus_client()
        kinds = ("provider", "operation")
        self.requests = prometheus.Counter("inference_requests", "Requests, by outcome", (*kinds, "outcome"),
                                           registry=registry)
        self.errors = prometheus.Counter("inference_request_errors", "Failed requests, by error class",
                                         (*kinds, "error"), registry=registry)
        self.duration = prometheus.Histogram("inference_request_duration_seconds", "Request latency",
                                             (*kinds, "outcome"), registry=registry, buckets=DURATION_BUCKETS)
        self.tokens = prometheus.Counter("inference_tokens", "Prompt and completion tokens", (*kinds, "direction"),
                                         registry=registry)
        self.adapter_operations = prometheus.Counter(
            "inference_adapter_operations", "Backend adapter loads and unloads, by outcome", (*kinds, "outcome"),
            registry=registry,
        )
        self.adapter_duration = prometheus.Histogram(
            "inference_adapter_operation_duration_seconds", "Backend adapter load and unload latency",
            (*kinds, "outcome"), registry=registry, buckets=DURATION_BUCKETS,
        )

    def request(self, observation: Observation, outcome: str, error: str | None, seconds: float) -> None:
        provider, operation = observation.provider, observation.operation
        self.requests.labels(provider, operation, outcome).inc()
        self.duration.labels(provider, operation, outcome).observe(seconds)
        if error is not None:
            self.errors.labels(provider, operation, error).inc()
        if observation.prompt_tokens:
            self.tokens.labels(provider, operation, "prompt").inc(observation.prompt_tokens)
        if observation.completion_tokens:
            self.tokens.labels(provider, operation, "completion").inc(observation.completion_tokens)
        if observation.scored_tokens:
            self.tokens.labels(provider, operation, "scored").inc(observation.scored_tokens)

    def adapter(self, provider: str, operation: str, outcome: str, seconds: float) -> None:
        self.adapter_operations.labels(provider, operation, outcome).inc()
        self.adapter_duration.labels(provider, operation, outcome).observe(seconds)


def enable_prometheus(registry: Any = None) -> None:
    """Record the SDK's metrics in a Prometheus registry from now on (``prometheus_client.REGISTRY`` by default).

    Calling it again with the same registry does nothing; with another, that one is recorded into instead.

    Raises:
        MissingDependencyError: ``prometheus-client`` is not installed (the ``prometheus`` extra).
    """
    if registry is None:
        registry = _prometheus_client().REGISTRY
    metrics = _enabled.get(id(registry))
    if metrics is None:
        metrics = _enabled[id(registry)] = _PrometheusMetrics(registry)
    telemetry.set_prometheus(metrics)


def serve_prometheus(port: int = 9464, addr: str = "0.0.0.0", registry: Any = None) -> None:
    """Enable the metrics (:func:`enable_prometheus`) and serve them at ``http://ADDR:PORT/metrics`` from a daemon
    thread (``prometheus_client.start_http_server``).

    Args:
        port: The port to listen on (9464: OpenTelemetry's Prometheus exporter's).
        addr: The address to listen on (all interfaces by default, as a container needs; ``"127.0.0.1"`` for
            this machine only).
        registry: The Prometheus registry to record into and serve (``prometheus_client.REGISTRY`` by default).

    Raises:
        MissingDependencyError: ``prometheus-client`` is not installed (the ``prometheus`` extra).
        OSError: The port cannot be listened on.
    """
    prometheus = _prometheus_client()
    registry = prometheus.REGISTRY if registry is None else registry
    enable_prometheus(registry)
    prometheus.start_http_server(port, addr=addr, registry=registry)


def _prometheus_client() -> Any:
    try:
        import prometheus_client
    except ImportError as error:
        raise MissingDependencyError(
            f"Prometheus metrics need the Python package 'prometheus_client', which cannot be imported ({error}): "
            "run pip install 'inference-adapters[prometheus]'"
        ) from error
    return prometheus_client
