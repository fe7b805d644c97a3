"""Adapter lifecycle rules, streaming and batches, shared by every provider (exercised on the fake provider)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inference._core import adapter_holds
from inference.adapters.source import AdapterSource
from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    InvalidAdapterError,
    InvalidRequestError,
)
from inference.fake_provider import FakeProvider
from inference.provider import GenerationRequest, GenerationResult, StreamEvent
from replacing import after_rounds, replace_alternately


class GatedProvider(FakeProvider):
    """A fake whose generations wait for a gate, and whose loads can fail or be slow."""

    def __init__(self, max_adapters: int | None = None) -> None:
        super().__init__(max_adapters)
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = 0
        self.active = 0
        self.most_active = 0
        self.load_delay = 0.0
        self.load_gate = asyncio.Event()  # backend loads wait for it
        self.load_gate.set()
        self.loads_at_gate = 0  # backend loads that reached the load gate
        self.stream_closed = False

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self.started += 1
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            await self.gate.wait()
            return await super()._generate(request)
        finally:
            self.active -= 1

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        try:
            async for event in super()._stream(request):
                yield event
        finally:
            self.stream_closed = True

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        await asyncio.sleep(self.load_delay)
        self.loads_at_gate += 1
        await self.load_gate.wait()
        if "corrupt" in adapter_path:
            raise InvalidAdapterError(f"adapter at {adapter_path} is corrupt", provider=self.name)
        await super()._load_adapter(adapter_id, source)


async def test_concurrent_loads_of_one_adapter_load_it_once() -> None:
    provider = GatedProvider()
    provider.load_delay = 0.01
    await asyncio.gather(*(provider.load_adapter("a", "/adapters/a") for _ in range(10)))
    assert provider.backend_loads == 1
    await provider.load_adapter("a", "/adapters/a")  # loading again with the same path is a no-op
    assert provider.backend_loads == 1 and await provider.list_adapters() == ["a"]


async def test_a_failed_load_fails_every_waiting_caller_and_leaves_nothing_behind() -> None:
    provider = GatedProvider()
    provider.load_delay = 0.01
    outcomes = await asyncio.gather(
        *(provider.load_adapter("a", "/adapters/corrupt") for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(outcome, InvalidAdapterError) for outcome in outcomes)
    assert await provider.list_adapters() == []
    await provider.load_adapter("a", "/adapters/good")
    assert (await provider.generate("p", model="m", adapter_id="a")).adapter_id == "a"


async def test_another_path_needs_replace() -> None:
    provider = FakeProvider()
    await provider.load_adapter("a", "/v1/a")
    with pytest.raises(AdapterAlreadyLoadedError, match="replace=True"):
        await provider.load_adapter("a", "/v2/a")
    await provider.load_adapter("a", "/v2/a", replace=True)
    assert provider._adapter_path("a") == "/v2/a"
    assert (provider.backend_loads, provider.backend_unloads) == (2, 1)


async def test_unload_waits_for_requests_in_flight_and_refuses_new_ones() -> None:
    provider = GatedProvider()
    await provider.load_adapter("a", "/adapters/a")
    provider.gate.clear()
    in_flight = asyncio.create_task(provider.generate("p", model="m", adapter_id="a"))
    await asyncio.sleep(0.01)
    unloading = asyncio.create_task(provider.unload_adapter("a"))
    await asyncio.sleep(0.01)
    assert not unloading.done() and provider.backend_unloads == 0
    with pytest.raises(AdapterNotFoundError, match="being unloaded"):
        await provider.generate("p", model="m", adapter_id="a")
    provider.gate.set()
    result = await in_flight
    await unloading
    assert result.adapter_id == "a" and result.text.startswith("[a]")
    assert provider.backend_unloads == 1 and await provider.list_adapters() == []
    with pytest.raises(AdapterNotFoundError, match="not loaded"):
        await provider.unload_adapter("a")


async def test_a_load_during_an_unload_waits_for_it_then_loads_again() -> None:
    provider = GatedProvider()
    await provider.load_adapter("a", "/adapters/a")
    provider.gate.clear()
    in_flight = asyncio.create_task(provider.generate("p", model="m", adapter_id="a"))
    await asyncio.sleep(0.01)
    unloading = asyncio.create_task(provider.unload_adapter("a"))
    loading = asyncio.create_task(provider.load_adapter("a", "/adapters/a"))
    await asyncio.sleep(0.01)
    assert not loading.done()
    provider.gate.set()
    await asyncio.gather(in_flight, unloading, loading)
    assert await provider.list_adapters() == ["a"] and provider.backend_loads == 2


async def test_least_recently_used_adapter_is_evicted_and_reloaded_transparently() -> None:
    provider = FakeProvider(max_adapters=2)
    for adapter_id in ("a", "b"):
        await provider.load_adapter(adapter_id, f"/adapters/{adapter_id}")
    await provider.generate("p", model="m", adapter_id="a")  # b is now the least recently used
    await provider.load_adapter("c", "/adapters/c")
    assert sorted(provider._resident) == ["a", "c"]
    assert await provider.list_adapters() == ["a", "b", "c"]  # evicted adapters stay listed
    expected = (await FakeProvider().generate("q", model="m")).text.replace("[base]", "[b]")
    reloaded = await provider.generate("q", model="m", adapter_id="b")
    assert reloaded.adapter_id == "b" and reloaded.text.startswith("[b]")
    assert len(provider._resident) == 2 and "b" in provider._resident
    assert provider.backend_loads == 4 and provider.backend_unloads == 2
    assert expected.split()[0] == reloaded.text.split()[0]


async def test_pinned_and_busy_adapters_are_never_evicted() -> None:
    provider = GatedProvider(max_adapters=1)
    await provider.load_adapter("pinned", "/adapters/p", pin=True)
    await provider.load_adapter("b", "/adapters/b")
    assert "pinned" in provider._resident  # over capacity rather than evicting a pinned adapter
    provider.gate.clear()
    busy = asyncio.create_task(provider.generate("p", model="m", adapter_id="b"))
    await asyncio.sleep(0.01)
    await provider.load_adapter("c", "/adapters/c")
    assert {"pinned", "b", "c"} <= set(provider._resident)
    provider.gate.set()
    assert (await busy).adapter_id == "b"


async def test_discovered_adapters_are_usable_without_a_load() -> None:
    class RemoteProvider(FakeProvider):
        async def _discover_adapter(self, adapter_id: str) -> str | None:
            if adapter_id != "remote":
                return None
            self._resident[adapter_id] = "server:remote"
            return "server:remote"

    provider = RemoteProvider()
    assert (await provider.generate("p", model="m", adapter_id="remote")).adapter_id == "remote"
    assert await provider.list_adapters() == ["remote"]
    await provider.unload_adapter("remote")
    with pytest.raises(AdapterNotFoundError):
        await provider.generate("p", model="m", adapter_id="other")


# Streaming ------------------------------------------------------------------------------------------------


async def test_stream_pieces_concatenate_to_the_final_result() -> None:
    provider = FakeProvider()
    await provider.load_adapter("a", "/adapters/a")
    events = [event async for event in provider.stream("tell me", model="m", adapter_id="a", max_tokens=5)]
    pieces, final = events[:-1], events[-1]
    assert all(isinstance(piece, str) for piece in pieces) and len(pieces) > 1
    assert isinstance(final, GenerationResult)
    assert "".join(pieces) == final.text
    assert final == await provider.generate("tell me", model="m", adapter_id="a", max_tokens=5)


async def test_stopping_a_stream_early_closes_the_backend_generation_and_releases_the_adapter() -> None:
    provider = GatedProvider()
    await provider.load_adapter("a", "/adapters/a")
    async for _ in provider.stream("p", model="m", adapter_id="a"):
        break
    for _ in range(100):  # asyncio closes an abandoned async generator in a task of its own, soon after
        if provider.stream_closed:
            break
        await asyncio.sleep(0)
    assert provider.stream_closed
    assert provider._adapter_registry.in_flight("a") == 0
    await asyncio.wait_for(provider.unload_adapter("a"), timeout=5)


async def test_cancelling_the_consumer_closes_the_stream_at_once() -> None:
    provider = GatedProvider()
    provider.gate.clear()

    async def consume() -> None:
        async with contextlib.aclosing(provider.stream("p", model="m")) as events:
            async for _ in events:
                await asyncio.sleep(3600)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)
    provider.gate.set()
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert provider.stream_closed


async def test_stream_validates_its_arguments() -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        async for _ in FakeProvider().stream("p", model="m", max_tokens=0):
            pass
    with pytest.raises(AdapterNotFoundError):
        async for _ in FakeProvider().stream("p", model="m", adapter_id="missing"):
            pass


# Batches --------------------------------------------------------------------------------------------------


async def test_generate_batch_keeps_order_and_returns_each_error_in_its_place() -> None:
    provider = GatedProvider()
    prompts: list[object] = ["one", "two", 3, "four"]
    seen: list[int] = []
    results = await provider.generate_batch(
        prompts, model="m", max_tokens=4, on_result=lambda index, _: seen.append(index)  # type: ignore[arg-type]
    )
    assert len(results) == 4 and sorted(seen) == [0, 1, 2, 3]
    assert isinstance(results[2], InvalidRequestError)
    for index in (0, 1, 3):
        item = results[index]
        assert isinstance(item, GenerationResult)
        assert item == await provider.generate(str(prompts[index]), model="m", max_tokens=4)


async def test_generate_batch_bounds_concurrency_and_survives_a_failing_callback() -> None:
    provider = GatedProvider()

    def explode(index: int, item: object) -> None:
        raise RuntimeError("progress bar broke")

    results = await provider.generate_batch([f"p{i}" for i in range(20)], model="m", max_concurrency=3,
                                            on_result=explode)
    assert provider.most_active <= 3
    assert all(isinstance(item, GenerationResult) for item in results)


@pytest.mark.parametrize(("prompts", "concurrency"), [("one string", 2), (["a"], 0), (["a"], True)])
async def test_generate_batch_refuses_bad_arguments(prompts: object, concurrency: object) -> None:
    with pytest.raises(InvalidRequestError):
        await FakeProvider().generate_batch(prompts, model="m", max_concurrency=concurrency)  # type: ignore[arg-type]


# Cancellation ---------------------------------------------------------------------------------------------


class SlowBackend(FakeProvider):
    """Backend loads and unloads that take a while, as a real conversion or a busy worker does."""

    def __init__(self, max_adapters: int | None = None, delay: float = 0.05) -> None:
        super().__init__(max_adapters)
        self.delay = delay

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        await asyncio.sleep(self.delay)
        await super()._load_adapter(adapter_id, source)

    async def _unload_adapter(self, adapter_id: str) -> None:
        await asyncio.sleep(self.delay)
        await super()._unload_adapter(adapter_id)


async def test_a_cancelled_load_finishes_in_the_backend_and_other_callers_are_served() -> None:
    provider = SlowBackend()
    first = asyncio.create_task(provider.load_adapter("a", "/adapters/a"))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(provider.generate("p", model="m", adapter_id="a"))
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    result = await waiter  # not a RuntimeError: the load the backend finished is recorded and used
    assert result.adapter_id == "a"
    assert provider.backend_loads == 1 and await provider.list_adapters() == ["a"]


async def test_a_timed_out_unload_still_leaves_record_and_backend_in_step() -> None:
    provider = SlowBackend()
    await provider.load_adapter("a", "/adapters/a")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(provider.unload_adapter("a"), timeout=0.01)
    assert provider._resident == {} and await provider.list_adapters() == []
    await provider.load_adapter("a", "/adapters/a")  # and it can be loaded again, for real
    assert (await provider.generate("p", model="m", adapter_id="a")).adapter_id == "a"


@pytest.mark.parametrize("operation", ["load", "unload"])
async def test_an_operation_cancelled_twice_still_leaves_record_and_backend_in_step(operation: str) -> None:
    """Cancelling an evaluation cancels its adapters' unloads a second time (and Ctrl-C twice does the same): the
    second cancel used to leave the adapter listed and resident while the backend had dropped it, and loading it
    again did nothing."""
    provider = SlowBackend()
    if operation == "unload":
        await provider.load_adapter("a", "/adapters/a")
    work = provider.unload_adapter("a") if operation == "unload" else provider.load_adapter("a", "/adapters/a")
    task = asyncio.create_task(work)
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    held = sorted(provider._resident)
    assert await provider.list_adapters() == held == (["a"] if operation == "load" else [])
    await provider.load_adapter("a", "/adapters/a")
    assert (await provider.generate("p", model="m", adapter_id="a")).adapter_id == "a"
    assert sorted(provider._resident) == ["a"]


async def test_a_burst_over_max_adapters_warns_and_comes_back_down_when_its_requests_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request each for 8 adapters not resident at once, with ``max_adapters=2``: loads in progress hold a
    place (they were not counted, so every load saw room: 8 resident, no warning, for good). Those that cannot
    wait for room load over the limit with a warning, and are evicted again once their requests end."""
    provider = SlowBackend(max_adapters=2)
    ids = [f"r{n}" for n in range(8)]
    for adapter_id in ids:
        await provider.load_adapter(adapter_id, f"/adapters/{adapter_id}")
    assert sorted(provider._resident) == ["r6", "r7"]
    results = await asyncio.gather(*(provider.generate("p", model="m", adapter_id=a) for a in ids))
    assert [result.adapter_id for result in results] == ids
    assert "loading one more than max_adapters=2" in caplog.text
    trimming = provider._adapter_registry._trimming
    assert trimming is not None
    await trimming
    assert len(provider._resident) == 2 and sorted(await provider.list_adapters()) == ids
    assert (await provider.generate("p", model="m", adapter_id="r0")).adapter_id == "r0"
    assert len(provider._resident) == 2


class ClosesAsInProcess(GatedProvider):
    """Unloads that take a while and are refused once closed, as the in-process providers' are, and a close in
    their order: marked closed at once, the backend freed after the work already queued, then the records cleared."""

    async def _unload_adapter(self, adapter_id: str) -> None:
        self._check_open()
        await asyncio.sleep(0.01)
        await super()._unload_adapter(adapter_id)

    async def aclose(self) -> None:
        self._closed = True
        trimming = self._adapter_registry._trimming  # an eviction back down to max_adapters, still running
        if trimming is not None:
            await asyncio.wait([trimming])
        self._adapter_registry.clear()


async def test_closing_during_the_evictions_after_a_burst_stops_them_without_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider = ClosesAsInProcess(max_adapters=1)
    ids = [f"r{n}" for n in range(4)]
    for adapter_id in ids:
        await provider.load_adapter(adapter_id, f"/adapters/{adapter_id}")
    provider.gate.clear()
    burst = asyncio.gather(*(provider.generate("p", model="m", adapter_id=a) for a in ids))
    while provider.started < len(ids):  # every request holds its adapter: all four loaded, over the capacity
        await asyncio.sleep(0)
    provider.gate.set()
    await burst
    assert len(provider._resident) == 4  # three evictions, one after another, to come
    caplog.clear()
    unloads = provider.backend_unloads
    await provider.aclose()
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert provider.backend_unloads - unloads <= 1  # the one under way when it closed, at most: closing frees the rest


async def test_a_request_cancelled_while_evicting_leaves_capacity_consistent() -> None:
    provider = SlowBackend(max_adapters=1)
    await provider.load_adapter("a", "/adapters/a")
    await provider.load_adapter("b", "/adapters/b")  # evicts a
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(provider.generate("p", model="m", adapter_id="a"), timeout=0.01)
    await asyncio.sleep(0.2)
    result = await provider.generate("p", model="m", adapter_id="a")
    assert result.adapter_id == "a"
    assert sorted(provider._resident) == ["a"]
    assert (await provider.generate("p", model="m", adapter_id="b")).adapter_id == "b"


async def test_an_adapter_walks_through_the_documented_states() -> None:
    """loading -> resident -> evicting -> evicted -> loading -> resident -> unloading -> forgotten."""
    from inference._core.lifecycle import AdapterState

    provider = GatedProvider(max_adapters=1)
    registry = provider._adapter_registry
    provider.load_delay = 0.05
    loading = asyncio.create_task(provider.load_adapter("a", "/adapters/a"))
    await asyncio.sleep(0.01)
    assert registry.state_of("a") is AdapterState.LOADING
    await loading
    assert registry.state_of("a") is AdapterState.RESIDENT
    evicting = asyncio.create_task(provider.load_adapter("b", "/adapters/b"))  # capacity 1: "a" must go
    await asyncio.sleep(0)
    provider.load_delay = 0.0
    assert registry.state_of("a") in (AdapterState.EVICTING, AdapterState.EVICTED)
    await evicting
    assert registry.state_of("a") is AdapterState.EVICTED and registry.state_of("b") is AdapterState.RESIDENT
    await provider.generate("p", model="m", adapter_id="a")  # needed again: loaded, "b" evicted
    assert registry.state_of("a") is AdapterState.RESIDENT and registry.state_of("b") is AdapterState.EVICTED
    provider.gate.clear()
    in_flight = asyncio.create_task(provider.generate("p", model="m", adapter_id="a"))
    await asyncio.sleep(0.01)
    unloading = asyncio.create_task(provider.unload_adapter("a"))
    await asyncio.sleep(0.01)
    assert registry.state_of("a") is AdapterState.UNLOADING
    provider.gate.set()
    await asyncio.gather(in_flight, unloading)
    assert registry.state_of("a") is None and await provider.list_adapters() == ["b"]


# Atomic replace ---------------------------------------------------------------------------------------------


async def expected_text(adapter_id: str, path: str, prompt: str) -> str:
    """What ``adapter_id`` loaded from ``path`` answers to ``prompt`` on a fresh fake."""
    reference = FakeProvider()
    await reference.load_adapter(adapter_id, path)
    return (await reference.generate(prompt, model="m", adapter_id=adapter_id, max_tokens=6)).text


async def test_a_replace_serves_the_old_weights_until_the_new_ones_are_loaded() -> None:
    provider, old_request = await a_request_on_the_old_weights()
    provider.load_delay = 0.05
    replacing = asyncio.create_task(provider.load_adapter("a", "/v2/a", replace=True))
    await asyncio.sleep(0.01)
    assert provider._adapter_path("a") == "/v1/a"  # still the old weights while the new ones load
    provider.gate.set()
    during = await provider.generate("p", model="m", adapter_id="a", max_tokens=6)
    assert during.text == await expected_text("a", "/v1/a", "p")
    await replacing
    after = await provider.generate("p", model="m", adapter_id="a", max_tokens=6)
    assert (await old_request).text == during.text
    assert after.text == await expected_text("a", "/v2/a", "p") != during.text
    assert after.adapter_id == "a" and await provider.list_adapters() == ["a"]
    assert provider.resident_adapters == ["a@2"]  # the old weights are gone from the backend


async def test_a_replace_that_fails_leaves_the_old_adapter_serving() -> None:
    provider = GatedProvider()
    await provider.load_adapter("a", "/v1/a")
    before = await provider.generate("p", model="m", adapter_id="a", max_tokens=6)
    with pytest.raises(InvalidAdapterError, match="corrupt"):
        await provider.load_adapter("a", "/adapters/corrupt", replace=True)
    assert provider._adapter_path("a") == "/v1/a" and provider.resident_adapters == ["a"]
    assert (await provider.generate("p", model="m", adapter_id="a", max_tokens=6)).text == before.text


async def a_request_on_the_old_weights() -> tuple[GatedProvider, asyncio.Task[GenerationResult]]:
    """A provider with adapter ``a`` loaded from ``/v1/a``, and a request on it held at the gate."""
    provider = GatedProvider()
    await provider.load_adapter("a", "/v1/a")
    provider.gate.clear()
    old_request = asyncio.create_task(provider.generate("p", model="m", adapter_id="a", max_tokens=6))
    await asyncio.sleep(0)
    return provider, old_request


async def test_requests_that_started_before_the_switch_finish_on_the_old_weights_then_they_are_unloaded() -> None:
    provider, old_request = await a_request_on_the_old_weights()
    replacing = asyncio.create_task(provider.load_adapter("a", "/v2/a", replace=True))
    await asyncio.sleep(0.01)
    assert not replacing.done() and sorted(provider.resident_adapters) == ["a", "a@2"]  # the old one drains
    new_request = asyncio.create_task(provider.generate("p", model="m", adapter_id="a", max_tokens=6))
    await asyncio.sleep(0)
    provider.gate.set()
    assert (await old_request).text == await expected_text("a", "/v1/a", "p")
    assert (await new_request).text == await expected_text("a", "/v2/a", "p")
    await replacing
    assert provider.resident_adapters == ["a@2"]


async def listed(provider: FakeProvider, adapter_ids: list[str]) -> None:
    """Return once ``list_adapters()`` is ``adapter_ids``."""
    while await provider.list_adapters() != adapter_ids:
        await asyncio.sleep(0.001)


async def holding(provider: FakeProvider, backend_names: list[str]) -> None:
    """Return once the backend holds exactly ``backend_names``."""
    while provider.resident_adapters != backend_names:
        await asyncio.sleep(0.001)


async def loads_at_gate(provider: GatedProvider, count: int) -> None:
    """Return once ``count`` backend loads have reached the load gate."""
    while provider.loads_at_gate < count:
        await asyncio.sleep(0.001)


async def test_an_unload_during_a_replace_while_a_request_holds_the_old_weights_returns() -> None:
    """unload_adapter called while a replacement loads and a request still holds the old weights used to wait for
    ever once that request ended (the replacement, waiting for the same request, took its wake-up), and so did the
    loads of the id behind it."""
    provider, old_request = await a_request_on_the_old_weights()
    provider.load_gate.clear()
    replacing = asyncio.create_task(provider.load_adapter("a", "/v2/a", replace=True))
    await asyncio.wait_for(loads_at_gate(provider, 1), timeout=5)  # the new weights are loading
    unloading = asyncio.create_task(provider.unload_adapter("a"))
    await asyncio.wait_for(listed(provider, []), timeout=5)  # the unload waits for the old request
    provider.load_gate.set()
    with pytest.raises(AdapterNotFoundError, match=r"unloaded .* while this load_adapter"):
        await asyncio.wait_for(replacing, timeout=5)  # the unload, called later, wins
    provider.gate.set()
    await asyncio.wait_for(unloading, timeout=5)
    assert (await old_request).text == await expected_text("a", "/v1/a", "p")
    assert provider.resident_adapters == [] and provider.adapter_stats().adapters == ()
    await asyncio.wait_for(provider.load_adapter("a", "/v2/a"), timeout=5)
    after = await provider.generate("p", model="m", adapter_id="a", max_tokens=6)
    assert after.text == await expected_text("a", "/v2/a", "p")


async def test_an_unload_called_during_a_replace_wins_and_the_replace_says_so() -> None:
    """unload_adapter called while load_adapter(..., replace=True) loaded the new weights used to return, and then
    the replacement switched the id to its weights: the id the user had unloaded was listed and served again."""
    provider = GatedProvider()
    await provider.load_adapter("a", "/v1/a")
    provider.load_gate.clear()
    replacing = asyncio.create_task(provider.load_adapter("a", "/v2/a", replace=True))
    await asyncio.wait_for(loads_at_gate(provider, 1), timeout=5)
    unloading = asyncio.create_task(provider.unload_adapter("a"))
    await asyncio.wait_for(listed(provider, []), timeout=5)
    with pytest.raises(AdapterNotFoundError, match="being unloaded"):  # refused at once, as documented
        await provider.generate("p", model="m", adapter_id="a")
    provider.load_gate.set()
    with pytest.raises(AdapterNotFoundError, match=r"was unloaded .* the later call wins"):
        await asyncio.wait_for(replacing, timeout=5)
    await asyncio.wait_for(unloading, timeout=5)
    assert await provider.list_adapters() == [] and provider.resident_adapters == []
    with pytest.raises(AdapterNotFoundError, match="not loaded"):
        await provider.generate("p", model="m", adapter_id="a")
    await provider.load_adapter("a", "/v3/a")  # the id is free for a load called after the unload
    after = await provider.generate("p", model="m", adapter_id="a", max_tokens=6)
    assert after.text == await expected_text("a", "/v3/a", "p") and provider.adapter_stats().get("a").loads == 1


async def test_an_unload_called_during_a_first_load_or_one_waiting_behind_a_replace_wins_too() -> None:
    """The same rule for a first load, a load that joined it, and a replacement queued behind another one."""
    provider = GatedProvider()
    provider.load_gate.clear()
    first = asyncio.create_task(provider.load_adapter("b", "/v1/b"))
    joined = asyncio.create_task(provider.load_adapter("b", "/v1/b"))
    await asyncio.wait_for(loads_at_gate(provider, 1), timeout=5)
    unloading = asyncio.create_task(provider.unload_adapter("b"))
    provider.load_gate.set()
    for load in (first, joined):
        with pytest.raises(AdapterNotFoundError, match="the later call wins"):
            await asyncio.wait_for(load, timeout=5)
    await asyncio.wait_for(unloading, timeout=5)
    assert await provider.list_adapters() == [] and provider.resident_adapters == []

    await provider.load_adapter("c", "/v1/c")
    provider.load_gate.clear()
    replaces = [asyncio.create_task(provider.load_adapter("c", f"/v{n}/c", replace=True)) for n in (2, 3)]
    await asyncio.wait_for(loads_at_gate(provider, 3), timeout=5)  # b's, c's, and c's first replacement
    unloading = asyncio.create_task(provider.unload_adapter("c"))
    provider.load_gate.set()
    for replace in replaces:
        with pytest.raises(AdapterNotFoundError, match="the later call wins"):
            await asyncio.wait_for(replace, timeout=5)
    await asyncio.wait_for(unloading, timeout=5)
    assert await provider.list_adapters() == [] and provider.resident_adapters == []


async def test_an_unload_cancelled_before_it_unloaded_leaves_a_replace_running_beside_it_to_finish() -> None:
    """A cancelled unload (a timeout while the old weights drained) unloaded nothing, yet the replacement running
    beside it raised "the later call wins" and threw its new weights away."""
    provider, old_request = await a_request_on_the_old_weights()
    provider.load_gate.clear()
    replacing = asyncio.create_task(provider.load_adapter("a", "/v2/a", replace=True))
    await asyncio.wait_for(loads_at_gate(provider, 1), timeout=5)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(provider.unload_adapter("a"), timeout=0.05)  # the old request still holds it
    assert await provider.list_adapters() == ["a"]
    provider.load_gate.set()
    provider.gate.set()
    await asyncio.wait_for(replacing, timeout=5)
    assert (await old_request).text == await expected_text("a", "/v1/a", "p")
    after = await provider.generate("p", model="m", adapter_id="a", max_tokens=6)
    assert after.text == await expected_text("a", "/v2/a", "p") and await provider.list_adapters() == ["a"]


async def test_a_hold_given_back_during_the_users_own_load_of_the_id_leaves_it_loaded() -> None:
    """An evaluation turn giving its hold back while the user's own load_adapter of the id reloaded it (after an
    eviction) unloaded the id under that load, which then failed with "was unloaded (unload_adapter)", a call the
    user never made (before the later-call rule: it returned, and the id was gone)."""
    provider = GatedProvider(max_adapters=1)
    turn = object()
    with adapter_holds.holding(turn):
        await provider.load_adapter("a", "/v1/a")
    await provider.load_adapter("b", "/v1/b")  # the user's: a is evicted
    provider.load_gate.clear()
    users_load = asyncio.create_task(provider.load_adapter("a", "/v1/a"))
    await asyncio.wait_for(loads_at_gate(provider, 3), timeout=5)

    async def give_back() -> None:
        with adapter_holds.holding(turn):
            await provider.unload_adapter("a")

    giving_back = asyncio.create_task(give_back())
    await asyncio.sleep(0.01)
    provider.load_gate.set()
    await asyncio.wait_for(giving_back, timeout=5)
    await asyncio.wait_for(users_load, timeout=5)
    assert "a" in await provider.list_adapters()
    after = await provider.generate("p", model="m", adapter_id="a", max_tokens=6)
    assert after.text == await expected_text("a", "/v1/a", "p")


async def test_an_id_loaded_again_while_its_replaced_weights_drain_keeps_the_weights_it_loaded() -> None:
    """A replaced id unloaded while a request still held its old weights, then loaded again, used to load under the
    name those old weights held: their unload, once the request ended, removed the new weights, and the id, still
    listed, failed every request."""
    provider, old_request = await a_request_on_the_old_weights()
    replacing = asyncio.create_task(provider.load_adapter("a", "/v2/a", replace=True))
    await asyncio.wait_for(holding(provider, ["a", "a@2"]), timeout=5)  # switched; the old weights drain
    await provider.unload_adapter("a")
    await provider.load_adapter("a", "/v3/a")
    provider.gate.set()
    await asyncio.wait_for(asyncio.gather(old_request, replacing), timeout=5)
    after = await provider.generate("p", model="m", adapter_id="a", max_tokens=6)
    assert after.text == await expected_text("a", "/v3/a", "p") and await provider.list_adapters() == ["a"]
    held = [stats.backend_name for stats in provider.adapter_stats().adapters if stats.resident]
    assert provider.resident_adapters == held and len(held) == 1  # the old weights are gone, the new ones stay


async def test_200_generations_through_20_replacements_half_of_them_bad_never_fail_or_mix() -> None:
    """Every result is the output of the weights current when its request started; none fails."""
    provider = GatedProvider()
    provider.load_delay = 0.002
    await provider.load_adapter("a", "/v0/a")
    prompts = [f"prompt {index % 7}" for index in range(200)]
    started_on: list[str] = []

    async def one(prompt: str) -> GenerationResult:
        started_on.append(provider._adapter_path("a") or "")  # the weights current as the request starts
        return await provider.generate(prompt, model="m", adapter_id="a", max_tokens=6)

    async def generations() -> list[GenerationResult]:
        results = []
        for start in range(0, 200, 20):
            await after_rounds(rounds, start // 10)  # batch k starts after k good replacements
            results += await asyncio.gather(*(one(prompt) for prompt in prompts[start : start + 20]))
        return results

    good = [f"/v{round_ + 1}/a" for round_ in range(0, 20, 2)]
    bad = [f"/adapters/corrupt-{round_}" for round_ in range(1, 20, 2)]
    rounds: list[str] = []
    replacing = replace_alternately(provider, "a", good, bad, outcomes=rounds)
    results, outcomes = await asyncio.gather(generations(), replacing)
    assert outcomes == ["replaced", "refused"] * 10 and len(results) == 200
    for prompt, path, result in zip(prompts, started_on, results, strict=True):
        assert result.text == await expected_text("a", path, prompt), (prompt, path)
    assert len(set(started_on)) > 2  # the generations did run across several replacements
    assert len(provider.resident_adapters) == 1  # every replaced version was unloaded


async def test_a_replace_with_pin_pins_and_a_replace_without_pin_keeps_the_pin() -> None:
    provider = FakeProvider(max_adapters=1)
    await provider.load_adapter("a", "/v1/a")
    await provider.load_adapter("a", "/v2/a", replace=True, pin=True)
    assert provider.adapter_stats().get("a").pinned  # type: ignore[union-attr]
    await provider.load_adapter("b", "/adapters/b")  # max_adapters=1: a pinned adapter is never evicted
    assert "a@2" in provider.resident_adapters

    await provider.load_adapter("a", "/v3/a", replace=True)  # pin=False leaves the id's pin as it is
    assert provider.adapter_stats().get("a").pinned  # type: ignore[union-attr]
    await provider.load_adapter("c", "/adapters/c")
    assert "a@3" in provider.resident_adapters

    await provider.unload_adapter("a")  # an unload forgets the pin: loaded again, the id is not pinned
    await provider.load_adapter("a", "/v4/a")
    await provider.load_adapter("d", "/adapters/d")
    assert not provider.adapter_stats().get("a").pinned and "a" not in provider.resident_adapters  # type: ignore[union-attr]


async def test_a_replace_made_while_another_runs_keeps_its_pin() -> None:
    provider = GatedProvider(max_adapters=1)
    provider.load_delay = 0.01
    await provider.load_adapter("a", "/v1/a")
    await asyncio.gather(
        provider.load_adapter("a", "/v2/a", replace=True),
        provider.load_adapter("a", "/v3/a", replace=True, pin=True),  # starts over after the first one
    )
    entry = provider.adapter_stats().get("a")
    assert entry is not None and entry.pinned and provider._adapter_path("a") == "/v3/a"


async def test_replacements_keep_max_adapters_resident_through_churn() -> None:
    provider = FakeProvider(max_adapters=2)
    ids = ["a", "b", "c", "d"]
    for round_ in range(6):
        for index, adapter_id in enumerate(ids):
            path = f"/v{round_}/{adapter_id}"
            await provider.load_adapter(adapter_id, path, replace=round_ > 0)
            assert len(provider.resident_adapters) <= 2, (round_, adapter_id, provider.resident_adapters)
            if index % 2:  # a request for an adapter replaced earlier (evicted by now) loads it again
                used = ids[index - 1]
                result = await provider.generate("p", model="m", adapter_id=used, max_tokens=6)
                assert result.text == await expected_text(used, f"/v{round_}/{used}", "p")
                assert len(provider.resident_adapters) <= 2, (round_, used, provider.resident_adapters)
    stats = provider.adapter_stats()
    assert stats.resident == 2 and stats.evicted == 2 and await provider.list_adapters() == ids


class ClosingProvider(FakeProvider):
    """A fake that, like the in-process providers, is unusable once closed."""

    async def aclose(self) -> None:
        self._closed = True
        self._adapter_registry.clear()


@pytest.mark.parametrize("kind", ["closing fake", "vllm-offline"])
async def test_after_aclose_the_adapter_calls_say_the_provider_is_closed(kind: str) -> None:
    from inference.exceptions import ProviderError
    from inference.vllm_offline_provider import VLLMOfflineProvider  # no vLLM needed until its engine starts

    provider = ClosingProvider() if kind == "closing fake" else VLLMOfflineProvider(model_name="/models/none")
    if isinstance(provider, ClosingProvider):
        await provider.load_adapter("a", "/adapters/a")
    await provider.aclose()
    assert provider.closed
    with pytest.raises(ProviderError, match="is closed: create a new one"):
        await provider.list_adapters()  # it answered [] before, as if nothing had ever been loaded
    with pytest.raises(ProviderError, match="is closed"):
        await provider.unload_adapter("a")
    with pytest.raises(ProviderError, match="is closed"):
        await provider.load_adapter("b", "/adapters/b")


async def test_http_providers_stay_usable_after_aclose_and_so_does_list_adapters() -> None:
    provider = FakeProvider()  # like the HTTP providers, never closed: aclose frees connections only
    await provider.load_adapter("a", "/adapters/a")
    await provider.aclose()
    assert not provider.closed and await provider.list_adapters() == ["a"]


def write_adapter(directory: Path, weights: bytes) -> str:
    """A directory with the files of a PEFT adapter (the fake reads nothing; only the files' state matters)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 2}')
    (directory / "adapter_model.safetensors").write_bytes(weights)
    return str(directory)


async def test_files_changed_in_place_are_never_served_under_the_id_without_a_replace(tmp_path: Path) -> None:
    """A loop that saves each step into one directory: an eviction must not quietly bring back other weights."""
    provider = FakeProvider(max_adapters=1)
    path = write_adapter(tmp_path / "step", b"weights of step 1")
    await provider.load_adapter("step", path)
    write_adapter(tmp_path / "step", b"weights of step 2, longer")  # save_pretrained into the same directory
    (tmp_path / "step" / "adapter_model.gguf").write_bytes(b"a conversion beside them")  # not an adapter file

    await provider.load_adapter("other", "/adapters/other")  # max_adapters=1: "step" is evicted
    with pytest.raises(InvalidAdapterError, match=r"changed since it was loaded.*replace=True"):
        await provider.generate("p", model="m", adapter_id="step")  # it reloaded the new files before
    with pytest.raises(AdapterAlreadyLoadedError, match=r"changed since it was loaded.*replace=True"):
        await provider.load_adapter("step", path)  # it did nothing before: the old weights went on serving
    assert provider.backend_loads == 2

    await provider.load_adapter("step", path, replace=True)  # the new files, under the id, as any replace
    assert (await provider.generate("p", model="m", adapter_id="step")).adapter_id == "step"
    assert provider.adapter_stats().get("step").replacements == 1  # type: ignore[union-attr]
    await provider.load_adapter("step", path)  # unchanged since: nothing to do
    assert provider.backend_loads == 3


def keep_times(path: Path, like: Path) -> None:
    """Give ``path`` the access and modification times of ``like`` (what cp -p and rsync -t do)."""
    info = like.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def rewrite_keeping_times(saved: Path, content: bytes) -> None:
    """Write ``content`` into ``saved`` in place and set its times back: only its status change time tells."""
    before = saved.stat()
    for _ in range(5000):
        saved.write_bytes(content)
        os.utime(saved, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = saved.stat()
        assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
        if after.st_ctime_ns != before.st_ctime_ns:  # the kernel stamps it from a clock that ticks every few ms
            return
        time.sleep(0.001)
    pytest.skip("this filesystem keeps no status change time that a write moves")


@pytest.mark.parametrize("how", ["rewritten in place", "symbolic link moved"])
async def test_files_changed_with_their_sizes_and_times_kept_are_not_served_under_the_id(
    tmp_path: Path, how: str
) -> None:
    """A save that keeps each file's size and modification time (cp -p, rsync -t, a filesystem with 1 s times), or
    a link moved to a directory whose files look the same: after an eviction the id served the other weights."""
    provider = FakeProvider(max_adapters=1)
    first = write_adapter(tmp_path / "step1", b"weights of step 1")
    second = write_adapter(tmp_path / "step2", b"weights of step 2")  # the same sizes
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        keep_times(Path(second) / name, Path(first) / name)
    path = first
    if how == "symbolic link moved":
        path = str(tmp_path / "current")
        os.symlink(first, path)
    await provider.load_adapter("step", path)

    if how == "rewritten in place":
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            rewrite_keeping_times(Path(first) / name, (Path(second) / name).read_bytes())
    else:
        os.symlink(second, tmp_path / "next")
        os.replace(tmp_path / "next", path)

    await provider.load_adapter("other", "/adapters/other")  # max_adapters=1: "step" is evicted
    with pytest.raises(InvalidAdapterError, match=r"changed since it was loaded.*replace=True"):
        await provider.generate("p", model="m", adapter_id="step")
    with pytest.raises(AdapterAlreadyLoadedError, match=r"replace=True"):  # a link now names another directory
        await provider.load_adapter("step", path)
    await provider.load_adapter("step", path, replace=True)  # the new files, as any replace
    assert (await provider.generate("p", model="m", adapter_id="step")).adapter_id == "step"
