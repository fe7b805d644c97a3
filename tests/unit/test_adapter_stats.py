"""provider.adapter_stats(), the structured log records and the spans of the adapter lifecycle (fake provider)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from inference.adapters.source import AdapterSource
from inference.adapters.stats import AdapterStats, ProviderAdapterStats
from inference.exceptions import AdapterNotFoundError, InvalidAdapterError
from inference.fake_provider import FakeProvider


class FlakyProvider(FakeProvider):
    """A fake whose loads of a path containing "corrupt" fail, and whose backend can lose adapters."""

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        if "corrupt" in adapter_path:
            raise InvalidAdapterError(f"adapter at {adapter_path} is corrupt", provider=self.name)
        await super()._load_adapter(adapter_id, source)


async def test_stats_count_loads_evictions_and_reloads_per_adapter_and_in_total() -> None:
    provider = FlakyProvider(max_adapters=1)
    before = time.time()
    await provider.load_adapter("a", "/adapters/a", pin=False)
    await provider.load_adapter("b", "/adapters/b")  # evicts a
    await provider.generate("hi", model="m", adapter_id="a")  # evicts b, reloads a

    stats = provider.adapter_stats()
    assert isinstance(stats, ProviderAdapterStats)
    assert [entry.adapter_id for entry in stats.adapters] == ["a", "b"]
    a, b = stats.get("a"), stats.get("b")
    assert isinstance(a, AdapterStats) and isinstance(b, AdapterStats)
    assert (a.state, a.resident, a.loads, a.evictions, a.reloads) == ("resident", True, 2, 1, 1)
    assert (b.state, b.resident, b.loads, b.evictions, b.reloads) == ("evicted", False, 1, 1, 0)
    assert a.last_used is not None and a.last_used >= before and b.last_used is None
    assert a.last_load_ms is not None and a.last_load_ms >= 0
    assert (stats.resident, stats.evicted, stats.loads, stats.evictions, stats.reloads) == (1, 1, 3, 2, 1)
    assert stats.get("missing") is None


async def test_pins_requests_in_flight_replacements_failures_and_unloads_show() -> None:
    provider = FlakyProvider()
    await provider.load_adapter("a", "/adapters/a", pin=True)
    with pytest.raises(InvalidAdapterError):
        await provider.load_adapter("a", "/adapters/corrupt", replace=True)
    with pytest.raises(InvalidAdapterError):
        await provider.load_adapter("c", "/adapters/corrupt")
    async with provider._adapter_in_use("a"):
        during = provider.adapter_stats()
    await provider.load_adapter("a", "/adapters/a2", replace=True)
    after = provider.adapter_stats()

    assert during.get("a") is not None and during.get("a").in_flight == 1 and during.in_flight == 1  # type: ignore[union-attr]
    entry = after.get("a")
    assert entry is not None
    assert (entry.pinned, entry.backend_name, entry.loads, entry.replacements) == (True, "a@3", 2, 1)  # a@2 failed
    assert (after.failed_loads, after.replacements, after.in_flight) == (2, 1, 0)
    assert [e.adapter_id for e in after.adapters] == ["a"]  # the failed first load of c left nothing

    await provider.unload_adapter("a")
    final = provider.adapter_stats()
    assert final.adapters == () and final.unloads == 1 and final.loads == 2
    with pytest.raises(AdapterNotFoundError):
        await provider.generate("hi", model="m", adapter_id="a")


async def test_each_lifecycle_event_is_a_structured_log_record(caplog: pytest.LogCaptureFixture) -> None:
    provider = FlakyProvider(max_adapters=1)
    with caplog.at_level(logging.INFO, logger="inference.adapters"):
        await provider.load_adapter("a", "/adapters/a")
        await provider.load_adapter("b", "/adapters/b")
        await provider.generate("hi", model="m", adapter_id="a")
        with pytest.raises(InvalidAdapterError):
            await provider.load_adapter("a", "/adapters/corrupt", replace=True)
        await provider.unload_adapter("a")

    events = [
        (r.adapter_event, r.adapter_id, r.outcome)  # type: ignore[attr-defined]
        for r in caplog.records
        if hasattr(r, "adapter_event")
    ]
    assert events == [
        ("load", "a", "ok"),
        ("evict", "a", "ok"),
        ("load", "b", "ok"),
        ("evict", "b", "ok"),
        ("reload", "a", "ok"),
        ("load", "a", "error"),
        ("unload", "a", "ok"),
    ]
    failed = next(r for r in caplog.records if getattr(r, "outcome", None) == "error")
    assert failed.levelno == logging.WARNING
    assert failed.backend_name == "a@2" and failed.adapter_path.endswith("corrupt")  # type: ignore[attr-defined]
    assert all(isinstance(getattr(r, "duration_ms", 0.0), float) for r in caplog.records)


async def test_the_replaced_weights_unload_is_logged_as_such(caplog: pytest.LogCaptureFixture) -> None:
    provider = FlakyProvider()
    await provider.load_adapter("a", "/adapters/a")
    with caplog.at_level(logging.INFO, logger="inference.adapters"):
        await provider.load_adapter("a", "/adapters/a2", replace=True)
        await asyncio.sleep(0)
    records = [r for r in caplog.records if hasattr(r, "adapter_event")]
    assert [(r.adapter_event, r.backend_name) for r in records] == [("load", "a@2"), ("unload", "a")]  # type: ignore[attr-defined]
    assert records[0].replaces == "a" and records[1].replaced is True  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["/adapters/slow", "/adapters/slow-corrupt"])
async def test_a_backend_event_that_ran_to_its_end_under_a_cancelled_caller_is_recorded_as_it_ended(
    caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """The backend's load runs to its end whatever the caller does: its record says how it ended (it said
    "cancelled" for a load that was done and served), and the caller still gets its cancellation."""

    class Slow(FlakyProvider):
        async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
            await asyncio.sleep(0.05)
            await super()._load_adapter(adapter_id, source)

    provider = Slow()
    with caplog.at_level(logging.INFO, logger="inference.adapters"):
        load = asyncio.create_task(provider.load_adapter("a", path))
        await asyncio.sleep(0.01)
        load.cancel()
        with pytest.raises(asyncio.CancelledError):
            await load
    outcome = "error" if "corrupt" in path else "ok"
    events = [(r.adapter_event, r.outcome) for r in caplog.records if hasattr(r, "adapter_event")]  # type: ignore[attr-defined]
    assert events == [("load", outcome)]
    stats = provider.adapter_stats()
    assert (stats.loads, stats.failed_loads) == ((1, 0) if outcome == "ok" else (0, 1))
    assert await provider.list_adapters() == (["a"] if outcome == "ok" else [])


async def test_lifecycle_events_are_spans_when_opentelemetry_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry")
    from collections.abc import Iterator
    from contextlib import contextmanager

    from inference._core import lifecycle_events

    spans: list[tuple[str, dict[str, str]]] = []

    class RecordingTracer:
        @contextmanager
        def start_as_current_span(self, name: str, attributes: dict[str, str]) -> Iterator[None]:
            spans.append((name, attributes))
            yield

    monkeypatch.setattr(lifecycle_events, "_tracer", RecordingTracer())
    provider = FlakyProvider(max_adapters=1)
    await provider.load_adapter("a", "/adapters/a")
    await provider.load_adapter("b", "/adapters/b")
    await provider.generate("hi", model="m", adapter_id="a")
    await provider.unload_adapter("b")  # evicted already: nothing to unload in the backend, no span

    assert [name for name, _ in spans] == [
        "inference.adapter.load",
        "inference.adapter.evict",
        "inference.adapter.load",
        "inference.adapter.evict",
        "inference.adapter.reload",
    ]
    assert spans[0][1]["inference.adapter_id"] == "a" and spans[0][1]["inference.backend_name"] == "a"
    assert spans[0][1]["inference.provider"] == "fake"


def test_the_real_opentelemetry_api_accepts_the_span_attributes() -> None:
    pytest.importorskip("opentelemetry")
    from inference._core.lifecycle_events import _span

    with _span("load", {"inference.adapter_id": "a", "inference.backend_name": "a"}):
        pass


async def test_a_reload_done_by_the_backend_itself_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    provider = FlakyProvider()
    await provider.load_adapter("a", "/adapters/a")
    with caplog.at_level(logging.INFO, logger="inference.adapters"):
        provider._adapter_registry.note("reload", "a", 12.5, healed=True)  # what a server provider calls after healing
    stats = provider.adapter_stats()
    entry = stats.get("a")
    assert entry is not None and (entry.loads, entry.reloads, entry.last_load_ms) == (2, 1, 12.5)
    assert stats.reloads == 1
    assert [getattr(r, "healed", None) for r in caplog.records] == [True]
