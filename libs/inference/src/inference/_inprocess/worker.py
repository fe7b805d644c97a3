"""One thread per in-process model: blocking work runs off the event loop, one call at a time, in order."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from inference.exceptions import ProviderError

P = ParamSpec("P")
T = TypeVar("T")


class ModelWorker:
    """Runs blocking calls on a single dedicated thread.

    A model is never driven by two threads at once, calls run first come first served (the executor's
    queue is FIFO), and the event loop only awaits. Work that must happen once, such as loading the
    model, can simply check and set state inside a call: calls never overlap.

    Args:
        name: The provider's name (thread name, error messages).
        initializer: Called once on the worker thread before its first call (e.g. to set thread-local state).
    """

    def __init__(self, name: str, initializer: Callable[[], object] | None = None) -> None:
        self._name = name
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"inference-{name}", initializer=initializer
        )

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``function(*args, **kwargs)`` on the worker thread and return its result."""
        return await self.submit(function, *args, **kwargs)

    def submit(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        """Queue ``function(*args, **kwargs)`` now (in this very call, so queue order is call order).

        Cancelling the returned future drops the call if it has not started; a call already running goes
        on (blocking code cannot be interrupted: long calls check a cancel event of their own).

        Raises:
            ProviderError: The worker was shut down (its provider is closed).
        """
        loop = asyncio.get_running_loop()
        try:
            return loop.run_in_executor(self._executor, functools.partial(function, *args, **kwargs))
        except RuntimeError as error:  # "cannot schedule new futures after shutdown"
            raise ProviderError(
                f"the {self._name} provider is closed: create a new one (or call get_provider again)",
                provider=self._name,
            ) from error

    def shutdown(self) -> None:
        """Stop accepting work. Calls already queued still run, in order; then the thread ends."""
        self._executor.shutdown(wait=False)
