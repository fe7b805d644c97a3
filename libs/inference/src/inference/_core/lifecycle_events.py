"""What the adapter registry reports of its backend work: counters, one log record and one span per event.

Every backend load, reload, unload and eviction the registry runs (:class:`~inference._core.lifecycle.AdapterRegistry`)
is counted per adapter id and for the provider (what :meth:`~inference.InferenceProvider.adapter_stats` returns),
logged as one structured record on the ``inference.adapters`` logger (``extra``: ``adapter_event``, ``provider``,
``adapter_id``, ``backend_name``, ``adapter_path``, ``duration_ms``, ``outcome``) and, when ``opentelemetry-api``
is importable, traced as a span ``inference.adapter.<event>`` with the same attributes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from inference._core.paths import shown_path

__all__ = ["LifecycleEvents"]

logger = logging.getLogger("inference.adapters")

_tracer: Any = None  # opentelemetry's tracer once looked up; False when opentelemetry-api is not installed


def _span(event: str, attributes: dict[str, str]) -> AbstractContextManager[object]:
    """A span ``inference.adapter.<event>`` when ``opentelemetry-api`` is importable, else nothing."""
    global _tracer
    if _tracer is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _tracer = False
        else:
            _tracer = trace.get_tracer("inference")
    if _tracer is False:
        return nullcontext()
    span: AbstractContextManager[object] = _tracer.start_as_current_span(
        f"inference.adapter.{event}", attributes=attributes
    )
    return span


@dataclass
class _Counts:
    """Backend events that succeeded: for one adapter id or for the whole provider."""

    loads: int = 0
    evictions: int = 0
    reloads: int = 0
    replacements: int = 0

    def count(self, event: str) -> None:
        if event in ("load", "reload"):
            self.loads += 1
        if event == "reload":
            self.reloads += 1
        elif event == "evict":
            self.evictions += 1


@dataclass
class _AdapterCounts(_Counts):
    """One adapter id's, since it was first loaded (kept across replacements and losses, dropped by an unload).

    The fields are the counters of :class:`~inference.adapters.stats.AdapterStats`, by name.
    """

    last_load_ms: float | None = None
    last_used: float | None = None


@dataclass
class _ProviderCounts(_Counts):
    """The provider's, over its life (adapters unloaded since included).

    The fields are the counters of :class:`~inference.adapters.stats.ProviderAdapterStats`, by name.
    """

    unloads: int = 0
    failed_loads: int = 0


class LifecycleEvents:
    """The counters, log records and spans of one provider's adapter registry.

    Args:
        provider: The provider's name, in every record and span.
    """

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._adapters: dict[str, _AdapterCounts] = {}
        self._totals = _ProviderCounts()

    def loaded_before(self, adapter_id: str) -> bool:
        """True when the backend has loaded ``adapter_id`` since it was first loaded (a load now is a reload)."""
        counts = self._adapters.get(adapter_id)
        return counts is not None and counts.loads > 0

    def forget_unloaded(self, adapter_id: str) -> None:
        """Drop the counters of an id the backend never loaded (its first load failed)."""
        counts = self._adapters.get(adapter_id)
        if counts is not None and not counts.loads:
            del self._adapters[adapter_id]

    def used(self, adapter_id: str) -> None:
        """A request starts with ``adapter_id`` now."""
        self._adapters.setdefault(adapter_id, _AdapterCounts()).last_used = time.time()

    def replaced(self, adapter_id: str) -> None:
        """``adapter_id`` switched to new weights."""
        for counts in (self._adapters.setdefault(adapter_id, _AdapterCounts()), self._totals):
            counts.replacements += 1

    def unloaded(self, adapter_id: str) -> None:
        """``unload_adapter`` completed: the id's counters go with it."""
        self._adapters.pop(adapter_id, None)
        self._totals.unloads += 1

    @contextmanager
    def observed(self, event: str, adapter_id: str, backend: str, path: str, **detail: object) -> Iterator[None]:
        """Count, log and trace one backend ``event`` (``load``, ``reload``, ``unload``, ``evict``) of the weights
        of ``adapter_id`` held under ``backend`` and loaded from ``path``; ``detail`` adds to the record."""
        start = time.perf_counter()
        outcome = "error"
        try:
            with _span(event, self._attributes(adapter_id, backend, path, detail)):
                yield
            outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._record(event, adapter_id, backend, path, (time.perf_counter() - start) * 1000, outcome, detail)

    def note(
        self, event: str, adapter_id: str, backend: str, path: str, duration_ms: float, *, ok: bool,
        detail: dict[str, object],
    ) -> None:
        """Count, log and trace a backend ``event`` the provider ran outside the registry, which took
        ``duration_ms``; ``detail`` adds to the record."""
        with _span(event, self._attributes(adapter_id, backend, path, detail)):
            pass
        self._record(event, adapter_id, backend, path, duration_ms, "ok" if ok else "error", detail)

    def adapter_counts(self, adapter_id: str) -> dict[str, Any]:
        """``adapter_id``'s counters, by their :class:`~inference.adapters.stats.AdapterStats` field names."""
        return dataclasses.asdict(self._adapters.get(adapter_id, _AdapterCounts()))

    def provider_counts(self) -> dict[str, Any]:
        """The provider's counters, by their :class:`~inference.adapters.stats.ProviderAdapterStats` field names."""
        return dataclasses.asdict(self._totals)

    def _attributes(self, adapter_id: str, backend: str, path: str, detail: dict[str, object]) -> dict[str, str]:
        path = shown_path(path)
        return {
            "inference.provider": self._provider,
            "inference.adapter_id": adapter_id,
            "inference.backend_name": backend,
            "inference.adapter_path": path,
            **{f"inference.{key}": str(value) for key, value in detail.items()},
        }

    def _record(
        self, event: str, adapter_id: str, backend: str, path: str, ms: float, outcome: str, detail: dict[str, object]
    ) -> None:
        counts = self._adapters.setdefault(adapter_id, _AdapterCounts())
        if outcome == "ok":
            for counted in (counts, self._totals):
                counted.count(event)
            if event in ("load", "reload"):
                counts.last_load_ms = ms
        elif event in ("load", "reload") and outcome == "error":
            self._totals.failed_loads += 1
        path = shown_path(path)  # a file name that is not UTF-8 would break a UTF-8 log stream
        extra = {
            "adapter_event": event,
            "provider": self._provider,
            "adapter_id": adapter_id,
            "backend_name": backend,
            "adapter_path": path,
            "duration_ms": round(ms, 3),
            "outcome": outcome,
            **detail,
        }
        logger.log(
            logging.INFO if outcome == "ok" else logging.WARNING,
            "%s: adapter %r %s (backend name %r, %s): %s in %.1f ms",
            self._provider,
            adapter_id,
            event,
            backend,
            path,
            outcome,
            ms,
            extra=extra,
        )
