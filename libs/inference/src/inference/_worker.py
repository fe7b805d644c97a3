"""One thread per in-process model: blocking work runs off the event loop, one call at a time, in order."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class ModelWorker:
    """Runs blocking calls on a single dedicated thread.

    A model is never driven by two threads at once, calls run first come first served (the executor's
    queue is FIFO), and the event loop only awaits. Work that must happen once, such as loading the
    model, can simply check and set state inside a call: calls never overlap.
    """

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"inference-{name}")

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``function(*args, **kwargs)`` on the worker thread and return its result."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args, **kwargs))

    def shutdown(self) -> None:
        """Stop accepting work; the call in progress finishes."""
        self._executor.shutdown(wait=False, cancel_futures=True)
