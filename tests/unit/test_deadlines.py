"""The one time limit every await of the package goes through (``inference._core.deadlines``).

Both implementations run here: ``asyncio.timeout`` (Python 3.11+) and the timer the package uses on Python 3.10,
where ``asyncio.wait_for`` reported a cancelled stream consumer as a ``ProviderTimeoutError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from inference._core.deadlines import within, within_by_timer

LIMITS: list[Callable[[float, Awaitable[Any]], Awaitable[Any]]] = [within, within_by_timer]


@pytest.fixture(params=LIMITS, ids=["within", "within_by_timer"])
def limit(request: pytest.FixtureRequest) -> Callable[[float, Awaitable[Any]], Awaitable[Any]]:
    return request.param  # type: ignore[no-any-return]


async def test_work_done_in_time_gives_its_result_and_runs_in_the_callers_task(
    limit: Callable[[float, Awaitable[Any]], Awaitable[Any]],
) -> None:
    async def work() -> asyncio.Task[Any] | None:
        await asyncio.sleep(0)
        return asyncio.current_task()

    assert await limit(5.0, work()) is asyncio.current_task()  # contextvars and cancel scopes stay the caller's


async def test_work_past_the_limit_is_cancelled_with_a_timeout_error(
    limit: Callable[[float, Awaitable[Any]], Awaitable[Any]],
) -> None:
    stopped = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    with pytest.raises(asyncio.TimeoutError):
        await limit(0.05, work())
    assert stopped.is_set()
    await asyncio.sleep(0.01)  # no cancellation is left pending on this task


async def test_a_callers_cancellation_stays_a_cancellation(
    limit: Callable[[float, Awaitable[Any]], Awaitable[Any]],
) -> None:
    """Cancelled while the limit is far: ``CancelledError``, never a timeout (the 3.10 defect)."""
    started = asyncio.Event()
    stopped = asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    async def caller() -> None:
        await limit(120.0, work())

    for steps in range(6):  # cancelled before the work starts, as it starts, and after
        started.clear()
        stopped.clear()
        task = asyncio.create_task(caller())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert stopped.is_set() == started.is_set()  # work that started was cancelled, not left running


async def test_a_deadline_already_past_strikes_before_work_that_was_about_to_finish(
    limit: Callable[[float, Awaitable[Any]], Awaitable[Any]],
) -> None:
    """As asyncio.timeout does: on Python 3.10 the timer let the work's next step run first (a stream's piece came
    after its timeout had passed)."""

    async def work() -> str:
        await asyncio.sleep(0)
        return "finished"

    with pytest.raises(asyncio.TimeoutError):
        await limit(0.0, work())


async def test_a_caller_cancelled_before_the_limit_stays_cancelled_when_the_work_holds_the_cancellation_back(
    limit: Callable[[float, Awaitable[Any]], Awaitable[Any]],
) -> None:
    """Work that finishes what it started before raising the caller's cancellation (an adapter load does): the
    limit passes meanwhile, and the 3.10 timer turned the caller's cancellation into a timeout."""

    waiting = asyncio.Event()

    async def held_back() -> None:
        step = asyncio.ensure_future(asyncio.sleep(1.0))
        caught: list[asyncio.CancelledError] = []
        waiting.set()
        while not step.done():
            try:
                await asyncio.wait([step])
            except asyncio.CancelledError as error:
                caught.append(error)
        if caught:
            raise caught[0]

    task = asyncio.create_task(limit(0.5, held_back()))
    await waiting.wait()
    task.cancel()  # well before the limit (however slow this machine), which passes while the work holds on
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_limit_strikes_through_a_task_and_a_gather_the_work_awaits(
    limit: Callable[[float, Awaitable[Any]], Awaitable[Any]],
) -> None:
    """Python 3.10 drops a cancellation's message where a task passes it on (llama.cpp's batching awaits its job as
    a task): the timer's cancellation came back as a bare CancelledError in a task nobody cancelled."""

    async def through_a_task() -> None:
        await asyncio.ensure_future(asyncio.sleep(30))

    async def through_gather() -> None:
        await asyncio.gather(asyncio.sleep(30))

    for work in (through_a_task, through_gather):
        with pytest.raises(asyncio.TimeoutError):
            await limit(0.05, work())
