"""One thread per in-process model: blocking work runs off the event loop, one call at a time, in order."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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
        self._lock = threading.Lock()
        self._waiting: Counter[Callable[..., object]] = Counter()  # queued calls not started, by function

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
        call = functools.partial(function, *args, **kwargs)
        started = False

        def run() -> T:  # worker thread
            nonlocal started
            with self._lock:
                started = True
                self._waiting[function] -= 1
            return call()

        def dropped(future: Future[T]) -> None:  # a call cancelled before it started never runs
            with self._lock:
                if not started:
                    self._waiting[function] -= 1

        with self._lock:
            try:
                future = self._executor.submit(run)
            except RuntimeError as error:  # "cannot schedule new futures after shutdown"
                raise ProviderError(
                    f"the {self._name} provider is closed: create a new one (or call get_provider again)",
                    provider=self._name,
                ) from error
            self._waiting[function] += 1
        future.add_done_callback(dropped)
        return asyncio.wrap_future(future, loop=loop)

    def waiting(self, function: Callable[..., object] | None = None) -> int:
        """How many calls are queued and not started yet: all of them, or those of ``function`` only.

        Read from any thread. A long-running call (a decode loop) uses it to give way to the calls behind it.
        """
        with self._lock:
            return sum(self._waiting.values()) if function is None else self._waiting[function]

    def shutdown(self) -> None:
        """Stop accepting work. Calls already queued still run, in order; then the thread ends."""
        self._executor.shutdown(wait=False)
