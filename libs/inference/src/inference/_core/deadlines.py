"""One time limit on one await, the same on every Python the package supports.

:func:`within` is ``asyncio.timeout`` on Python 3.11 and later. On 3.10 it is a timer that cancels the waiting task
and turns that cancellation, and only that one, into ``asyncio.TimeoutError``: 3.10's ``asyncio.wait_for`` runs the
work in a task of its own and can report a caller's own cancellation as a timeout (a cancelled stream consumer got
a ``ProviderTimeoutError``), or swallow it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["within", "within_by_timer"]

_T = TypeVar("_T")

_EXPIRED = "inference: time limit reached"
"""The message of the cancellation :func:`within_by_timer` makes, which alone becomes a timeout."""


async def within(seconds: float, work: Awaitable[_T]) -> _T:
    """Await ``work`` in this task, or raise ``asyncio.TimeoutError`` after ``seconds`` (``work`` is cancelled then).

    A cancellation from outside stays a ``CancelledError``, whenever it comes.
    """
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await work
    return await within_by_timer(seconds, work)


async def within_by_timer(seconds: float, work: Awaitable[_T]) -> _T:
    """:func:`within` on Python 3.10: a timer cancels this task at the limit, and only that cancellation becomes
    ``asyncio.TimeoutError`` (run on every Python by the tests)."""
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - an await always runs in a task under asyncio
        raise RuntimeError("within() must be awaited in an asyncio task")
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel(_EXPIRED)  # marked: work that holds a cancellation back may raise the caller's own instead

    loop = asyncio.get_running_loop()
    # a deadline already past strikes before the work's next step, as asyncio.timeout's does (call_later(0) would
    # let a step that was already due run first, and finish the work)
    timer = loop.call_soon(expire) if seconds <= 0 else loop.call_later(seconds, expire)
    try:
        return await work
    except asyncio.CancelledError as error:
        if expired and _from_the_timer(error):
            raise asyncio.TimeoutError from None
        raise
    finally:
        timer.cancel()


def _from_the_timer(error: BaseException) -> bool:
    """Whether a cancellation is the timer's: its message, or (Python 3.10 drops the message where a task or
    ``gather`` passes the cancellation on, raising a new one) a cancellation it was raised from carries it."""
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 32:
        if isinstance(current, asyncio.CancelledError) and current.args[:1] == (_EXPIRED,):
            return True
        current, seen = current.__context__, seen + 1
    return False
