"""httpx's work on a connection run so that a cancellation reaches it at most once, and a close not at all.

httpcore cleans up after a cancelled read (it closes the connection and takes the request off its pool) inside
``anyio.CancelScope(shield=True)``, which does not stop an asyncio ``Task.cancel()``: a second cancellation that
comes during that clean-up (a stream's consumer cancelled again, a timeout striking while the first cancellation
closes the answer) stops it half way. The connection then stays counted as in use, open, with the server still
generating for nobody; a one-connection client waited its whole timeout on it, and a pool ran out of connections.

So the transport (:mod:`inference._servers.transport`) sends a request and reads each piece of an answer in a task of
its own (:func:`apart`): the caller's cancellation cancels that task once, then waits until it has cleaned up, taking
any further cancellation as the same one, and is raised afterwards. An answer is closed by :func:`close_for_sure`,
which finishes the close whatever comes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import httpx

__all__ = ["CancelOnceStream", "apart", "close_for_sure"]

_T = TypeVar("_T")


async def apart(work: Coroutine[Any, Any, _T], discard: Callable[[_T], Awaitable[object]] | None = None) -> _T:
    """Await ``work`` run in a task of its own, which a cancellation of this task cancels once.

    On cancellation, the work is cancelled, waited for (its clean-up runs to its end; further cancellations of this
    task are taken as the same one), and the first cancellation is raised. A result the work had made by then is
    given to ``discard`` (a response to close).
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.cancel()
        await _wait_out(task)
        if discard is not None and not task.cancelled() and task.exception() is None:
            await close_for_sure(discard(task.result()))
        raise


async def close_for_sure(close: Awaitable[object]) -> None:
    """Await ``close`` to its end, in a task of its own that nothing cancels; a cancellation of this task that came
    meanwhile is raised after it."""
    task = asyncio.ensure_future(close)
    if await _wait_out(task):
        raise asyncio.CancelledError
    task.result()


async def _wait_out(task: asyncio.Future[Any]) -> bool:
    """Wait until ``task`` is done, whatever cancels this task; whether anything did."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait((task,))  # cancelling this wait leaves the task alone
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


class CancelOnceStream(httpx.AsyncByteStream):
    """An answer's body whose reads run :func:`apart` and whose close runs :func:`close_for_sure`."""

    def __init__(self, stream: httpx.AsyncByteStream) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._stream.__aiter__()
        while True:
            try:
                chunk = await apart(_next(chunks))
            except StopAsyncIteration:
                return
            yield chunk

    async def aclose(self) -> None:
        await close_for_sure(self._stream.aclose())


async def _next(chunks: AsyncIterator[bytes]) -> bytes:
    return await chunks.__anext__()
