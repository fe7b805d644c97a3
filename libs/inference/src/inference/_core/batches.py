"""Running many calls at once: ``generate_batch`` and ``score_batch``'s policies, and calls that stand or fall
together.

:func:`run_batch` runs one call per item with bounded concurrency, optionally in sequential chunks, and reports
each item as it finishes. What a failed item does is the batch's ``on_error`` policy:

- ``"return"`` (the default): the item's exception is its answer, in its place in the list;
- ``"warn"``: the same, and a warning on the ``inference`` logger names the item and its error;
- ``"raise"``: the first error (the first to happen) is raised once the items still running are cancelled and
  have stopped (an in-process generation within a token); items not yet started never start.

:func:`all_or_none` runs calls that make one answer (the ``n`` requests of a backend without a native ``n``): the
first error cancels the others and is raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar

from inference.exceptions import InvalidRequestError

__all__ = ["ON_ERROR", "OnError", "all_or_none", "run_batch"]

logger = logging.getLogger("inference")

_ItemT = TypeVar("_ItemT")
_ResultT = TypeVar("_ResultT")

OnError = Literal["return", "raise", "warn"]
"""What a failed item of a batch does (see the module docstring)."""
ON_ERROR: tuple[str, ...] = ("return", "raise", "warn")


def _positive(value: object, name: str, provider: str, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = " or None" if optional else ""
        raise InvalidRequestError(f"{name} must be a positive integer{extra}, got {value!r}", provider=provider)


async def run_batch(
    items: Sequence[_ItemT],
    call: Callable[[_ItemT], Awaitable[_ResultT]],
    *,
    operation: str,
    provider: str,
    max_concurrency: int,
    chunk_size: int | None = None,
    on_error: str = "return",
    on_result: Callable[[int, _ResultT | Exception], object] | None = None,
) -> list[_ResultT | Exception]:
    """Run ``call`` on every item, at most ``max_concurrency`` at once.

    Args:
        items: The items, in order.
        call: Makes one item's answer.
        operation: The batch method's name, for messages.
        provider: The provider's name, for errors.
        max_concurrency: Most calls in flight at once.
        chunk_size: Run the items in sequential chunks of this many (the next chunk starts when the last call of
            the previous one has finished); ``None``: one chunk.
        on_error: ``"return"``, ``"warn"`` or ``"raise"`` (see the module docstring).
        on_result: Called as ``on_result(index, result_or_error)`` as each item finishes; an exception it raises
            is logged and ignored.

    Returns:
        One answer per item, in input order: its result, or (``"return"``, ``"warn"``) the exception it raised.

    Raises:
        InvalidRequestError: ``max_concurrency`` or ``chunk_size`` is not a positive integer, or ``on_error`` is
            not one of the policies.
        Exception: With ``on_error="raise"``, the first item error.
    """
    _positive(max_concurrency, "max_concurrency", provider)
    _positive(chunk_size, "chunk_size", provider, optional=True)
    if on_error not in ON_ERROR:
        raise InvalidRequestError(
            f"on_error must be 'return', 'raise' or 'warn', got {on_error!r}", provider=provider
        )
    semaphore = asyncio.Semaphore(max_concurrency)
    results: list[_ResultT | Exception | None] = [None] * len(items)
    errors: list[Exception] = []

    async def run(index: int, item: _ItemT) -> None:
        answer: _ResultT | Exception
        async with semaphore:
            if errors and on_error == "raise":
                return  # the batch is failing: start nothing more
            try:
                answer = await call(item)
            except Exception as error:  # the error is the item's answer
                answer = error
                errors.append(error)
                if on_error == "warn":
                    logger.warning("%s: item %d failed: %s: %s", operation, index, type(error).__name__, error)
        results[index] = answer
        if on_result is not None:
            try:
                on_result(index, answer)
            except Exception:
                logger.exception("%s: on_result raised for item %d; ignored", operation, index)
        if isinstance(answer, Exception) and on_error == "raise":
            raise answer

    size = chunk_size or max(len(items), 1)
    for start in range(0, len(items), size):
        chunk = range(start, min(start + size, len(items)))
        await _all([run(index, items[index]) for index in chunk], stop_on_error=on_error == "raise")
    return [answer for answer in results if answer is not None]


async def all_or_none(calls: Sequence[Awaitable[_ResultT]]) -> list[_ResultT]:
    """Await every call at once and return their results in order; the first error cancels the others (and waits
    for them to stop) and is raised."""
    return await _all(calls, stop_on_error=True)


async def _all(calls: Sequence[Awaitable[_ResultT]], *, stop_on_error: bool) -> list[_ResultT]:
    """Run ``calls`` as tasks and wait for all of them; with ``stop_on_error`` the first error (the first to happen)
    cancels the rest and, once they have stopped, is raised. Cancelling this cancels every call, and waits for
    them to stop."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    first_error: list[BaseException] = []

    def note(task: asyncio.Future[_ResultT]) -> None:  # runs before asyncio.wait's own callback: registered first
        if not task.cancelled() and task.exception() is not None and not first_error:
            first_error.append(task.exception())  # type: ignore[arg-type]

    for task in tasks:
        task.add_done_callback(note)
    if not tasks:
        return []
    try:
        _, pending = await asyncio.wait(
            tasks, return_when=asyncio.FIRST_EXCEPTION if stop_on_error else asyncio.ALL_COMPLETED
        )
    except asyncio.CancelledError:
        await _cancel(tasks)
        raise
    if pending:
        await _cancel(pending)
    if first_error:
        raise first_error[0]
    return [task.result() for task in tasks]


async def _cancel(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has stopped (its ``finally`` blocks ran)."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:  # mark their errors as seen: the caller raises its own
        if not task.cancelled():
            task.exception()
