"""Concurrent next-token requests gathered into one backend call.

``next_token_logprobs`` and ``batch_next_token_logprobs`` calls made at the same time (32 particles of a sequential
Monte Carlo step, each awaiting its own call) reach the backend's hook together, as one list, so the backend can
run them in one forward pass. A batch closes when a pass of the event loop adds nothing to it: calls started
together land together, without a timer (nothing here waits a fixed time, and nothing depends on the machine's
speed). Each event loop has its own batch, so calls from the sync facade's loop and from the caller's never mix.

A backend that refuses a batch with an :class:`~inference.exceptions.InvalidRequestError` (an id it found out of
range) or fails it with a :class:`~inference.exceptions.ProviderError` (one adapter's logits overflowed) gets each
caller's sequences again on their own, so the error reaches only the caller whose input it was.
A caller cancelled before its batch starts is left out of it; one cancelled while its batch runs waits for the
backend to finish (the backend is using the adapters the caller holds) and is then cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inference._core.validation import TokenRequest
from inference.exceptions import InvalidRequestError, ProviderError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    Rows = NDArray[np.float32]
else:
    Rows = Any

__all__ = ["TokenBatcher"]


@dataclass(eq=False)
class _Call:
    """One caller's sequences and the future its rows go to."""

    requests: list[TokenRequest]
    future: asyncio.Future[Rows]
    started: bool = False
    abandoned: bool = False


@dataclass(eq=False)
class _Batch:
    calls: list[_Call] = field(default_factory=list)


class TokenBatcher:
    """Gathers the calls made at once on one event loop and runs them as one call of ``run``.

    Args:
        run: The backend's hook: takes every sequence of the batch (a list of
            :class:`~inference._core.validation.TokenRequest`) and returns a 2-D array, one row per sequence, in
            order.
        provider: The provider's name, for errors.

    Attributes:
        batches: How many times ``run`` was called.
        largest: The most sequences ``run`` was given at once.
    """

    def __init__(self, run: Callable[[list[TokenRequest]], Awaitable[Rows]], provider: str) -> None:
        self._run = run
        self._provider = provider
        self._open: dict[asyncio.AbstractEventLoop, _Batch] = {}
        self._running: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.largest = 0

    async def submit(self, requests: Sequence[TokenRequest]) -> Rows:
        """Run ``requests`` with whatever else is asked at the same time; their rows, in order."""
        loop = asyncio.get_running_loop()
        call = _Call(list(requests), loop.create_future())
        batch = self._open.get(loop)
        if batch is None:
            batch = self._open[loop] = _Batch()
            loop.call_soon(self._close_when_quiet, loop, batch, 0)
        batch.calls.append(call)
        try:
            return await asyncio.shield(call.future)
        except asyncio.CancelledError:
            call.abandoned = True
            while call.started and not call.future.done():  # the backend uses this caller's adapters: wait for it
                try:
                    await asyncio.wait([call.future])
                except asyncio.CancelledError:
                    continue
            raise

    def _close_when_quiet(self, loop: asyncio.AbstractEventLoop, batch: _Batch, seen: int) -> None:
        """Close the batch once a pass of the loop added no call to it, and start it."""
        if len(batch.calls) > seen:
            loop.call_soon(self._close_when_quiet, loop, batch, len(batch.calls))
            return
        if self._open.get(loop) is batch:
            del self._open[loop]
        calls = [call for call in batch.calls if not call.abandoned]
        if calls:
            task = loop.create_task(self._run_batch(calls))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run_batch(self, calls: list[_Call]) -> None:
        for call in calls:
            call.started = True
        requests = [request for call in calls for request in call.requests]
        self.batches += 1
        self.largest = max(self.largest, len(requests))
        try:
            rows = await self._run(requests)
            _check_rows(rows, len(requests), self._provider)
        except asyncio.CancelledError:
            for call in calls:
                call.future.cancel()
            raise
        except (InvalidRequestError, ProviderError) as error:
            if len(calls) == 1:
                _fail(calls, error)
                return
            try:
                for call in calls:  # one caller's bad input must not fail the others: each on its own
                    if call.abandoned:
                        call.future.cancel()  # its caller was cancelled while the batch ran: it stops waiting
                    else:
                        await self._run_batch([call])
            finally:
                for call in calls:  # a retry that was itself cancelled leaves no caller waiting for ever
                    if not call.future.done():
                        call.future.cancel()
            return
        except Exception as error:
            _fail(calls, error)
            return
        except BaseException as error:  # KeyboardInterrupt, SystemExit: no caller is left waiting for ever
            _fail(calls, error)
            raise
        offset = 0
        for call in calls:
            count = len(call.requests)
            mine = rows[offset : offset + count]
            offset += count
            if not call.future.done():
                call.future.set_result(mine.copy() if len(calls) > 1 else mine)  # never holds a neighbour's rows


def _check_rows(rows: Any, count: int, provider: str) -> None:
    shape = getattr(rows, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != count:
        raise ProviderError(
            f"the {provider} backend returned {shape!r} for {count} sequences instead of one row per sequence "
            "(a bug in the backend: please report it)",
            provider=provider,
        )


def _fail(calls: list[_Call], error: BaseException) -> None:
    for call in calls:
        if call.future.done():
            continue
        if call.abandoned:
            call.future.cancel()  # nobody will read it: no "exception was never retrieved"
        else:
            call.future.set_exception(error)
