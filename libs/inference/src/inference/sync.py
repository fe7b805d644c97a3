"""Synchronous access to any provider, for scripts and notebooks: one background event loop runs every call.

:func:`get_sync_provider` takes what :func:`~inference.get_provider` takes and returns a :class:`SyncProvider`,
which has every public method of the provider, synchronous: a coroutine method returns its result, an async
generator method (``stream``) returns an iterator, and anything else (``adapter_stats()``, ``name``,
``supports_scoring``...) is the provider's own attribute. It is one mechanism, not a copy of each method: a
method added to the providers is there at once, with the same arguments and errors.

Every call runs on one event loop in a daemon thread of this process (``inference-sync-loop``), so it works
the same from a plain script, from inside a running event loop (a Jupyter notebook, where ``asyncio.run`` is
refused), and in a child process after ``fork`` (the child starts its own loop thread, and a provider made by
:func:`get_sync_provider` is made again there). Errors are the provider's own, raised in the caller's thread;
``Ctrl-C`` cancels the call in flight.

Example:
    >>> from inference.sync import get_sync_provider
    >>> with get_sync_provider("fake") as provider:
    ...     provider.load_adapter("style", "/adapters/style")
    ...     print(provider.generate("Hi", model="m", adapter_id="style", max_tokens=2).text)
    ...     print("".join(piece for piece in provider.stream("Hi", model="m", max_tokens=2) if isinstance(piece, str)))
    [style] yankee tango
    [base] sierra charlie

A sync provider is its own provider object, not the one ``get_provider`` caches for async code: the async
objects inside a provider (locks, connection pools) belong to one event loop. Use :func:`wrap` to drive a
provider you built yourself, and then only through the wrapper. In a child process after ``fork``, a provider
from :func:`get_sync_provider` is made again from its settings on first use (threads do not survive a fork), and
:func:`get_sync_provider` there gives that same object, so the child holds one provider (one model) per settings:
adapters the parent loaded in process must be loaded again there (a server keeps its own).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import inspect
import os
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from inference.exceptions import ProviderError

if TYPE_CHECKING:
    from inference.factory import ProviderRecipe
    from inference.provider import InferenceProvider

__all__ = [
    "SyncProvider",
    "close_all_sync_providers",
    "get_sync_provider",
    "get_sync_provider_for_step",
    "run_sync",
    "wrap",
]

T = TypeVar("T")

CLOSE_AT_EXIT_SECONDS = 10.0
"""How long the interpreter's exit waits for each sync provider still open to close."""


class _LoopThread:
    """An event loop running for ever in a daemon thread; coroutines from other threads run on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), name="inference-sync-loop", daemon=True)
        self.thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` on the loop and return its result in this thread (cancelled on ``Ctrl-C``)."""
        if threading.current_thread() is self.thread:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never awaited: no "was never awaited" warning
            raise RuntimeError(
                "a synchronous inference call was made from the sync facade's own event loop (from a callback such "
                "as on_result): it would wait for itself; call the async provider there, or move the call out of "
                "the callback"
            )
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), self.loop)
        try:
            return future.result()
        except BaseException:
            if not future.done():  # interrupted here (Ctrl-C): stop the call on the loop too
                future.cancel()
                with contextlib.suppress(BaseException):
                    future.result(timeout=CLOSE_AT_EXIT_SECONDS)
            raise


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


_loop_lock = threading.Lock()
_loop_thread: _LoopThread | None = None


def _background() -> _LoopThread:
    """The process's loop thread, started on first use (and again in a child process after ``fork``)."""
    global _loop_thread
    with _loop_lock:
        thread = _running_loop()
        if thread is None:
            thread = _loop_thread = _LoopThread()
        return thread


def _running_loop() -> _LoopThread | None:
    """The process's loop thread if it is running, without starting one."""
    thread = _loop_thread
    if thread is None or thread.pid != os.getpid() or not thread.thread.is_alive():
        return None
    return thread


def _forget_after_fork() -> None:
    """In a forked child: the parent's loop thread does not exist here; the next call starts one. (The locks are
    new: one held by another thread of the parent at the fork would never be released here.)"""
    global _loop_lock, _loop_thread, _sync_cache_lock, _rebuild_lock
    _loop_lock = threading.Lock()
    _loop_thread = None
    _sync_cache_lock = threading.Lock()
    _rebuild_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run an awaitable (a coroutine of the SDK) to its end from synchronous code, and return its result.

    It runs on the sync facade's background event loop, so it also works where an event loop is already
    running in this thread (Jupyter).

    Raises:
        RuntimeError: It was called from the background loop itself (from a callback of a sync call), or while
            the interpreter is exiting (the loop has stopped: a call would wait for it for ever).
    """
    if sys.is_finalizing():
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        raise RuntimeError(
            "a synchronous inference call was made while the interpreter is exiting, after the sync facade's event "
            "loop stopped: close streams and providers before the program ends (a with block does it)"
        )
    return _background().run(awaitable)


class SyncProvider:
    """A provider's methods, synchronous. Build it with :func:`get_sync_provider` or :func:`wrap`.

    Attribute access is forwarded to the provider: ``generate``, ``generate_batch``, ``score``,
    ``load_adapter``... return their results, ``stream`` returns an iterator of the same events (close it, or
    leave the ``for`` loop, to stop the generation), and plain attributes are the provider's own.

    Use it in a ``with`` block, or call :meth:`close`, to free what the provider holds; a sync provider still
    open when the interpreter exits is closed then.
    """

    def __init__(
        self, provider: InferenceProvider, *, rebuild: Callable[[], InferenceProvider] | None = None
    ) -> None:
        self._provider = provider
        self._rebuild = rebuild
        self._pid = os.getpid()
        self._closed = False
        self._closing = threading.Lock()  # a second close() waits for the first to finish freeing
        _open.add(self)

    @property
    def provider(self) -> InferenceProvider:
        """The async provider this object drives (use it only through this object, or on its loop)."""
        if self._pid != os.getpid():
            if self._rebuild is None:
                raise ProviderError(
                    f"this sync {self._provider.name} provider was made in process {self._pid}, before a fork: "
                    "wrap a provider made in this process (or use get_sync_provider, which makes it again)",
                    provider=self._provider.name,
                )
            with _rebuild_lock:  # the child's threads asking at once: one of them makes it again, once
                if self._pid != os.getpid():
                    self._provider, self._closed = self._rebuild(), False
                    self._closing = threading.Lock()  # the parent's could be held by a thread that is not here
                    self._pid = os.getpid()
                    _open.add(self)
        return self._provider

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        attribute = getattr(self.provider, name)
        if inspect.isasyncgenfunction(attribute):
            return _iterating(attribute)
        if inspect.iscoroutinefunction(attribute):
            return _blocking(attribute)
        return attribute

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(name for name in dir(self._provider) if not name.startswith("_"))})

    def __repr__(self) -> str:
        return f"SyncProvider({self._provider!r})"

    def close(self) -> None:
        """Free what the provider holds (its ``aclose``). Safe to call twice; a close that failed (refused from a
        callback on the facade's loop, interrupted) leaves the provider open, for a later close to free."""
        if self._pid != os.getpid():
            return
        with self._closing:
            if self._closed:
                return
            run_sync(self._provider.aclose())
            self._closed = True
        _open.discard(self)

    def __enter__(self) -> SyncProvider:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _blocking(method: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> T:
        return run_sync(method(*args, **kwargs))

    call.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]  # the bound method's: no self
    return call


def _iterating(method: Callable[..., AsyncIterator[T]]) -> Callable[..., _SyncIterator[T]]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> _SyncIterator[T]:
        return _SyncIterator(method(*args, **kwargs))

    call.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return call


class _SyncIterator(Iterator[T]):
    """An async generator read from synchronous code: each ``next`` runs one step on the background loop.

    Closing it (``close()``, leaving a ``with`` block, or the iterator being collected after a ``break``) closes
    the async generator, which stops the generation in the backend.
    """

    def __init__(self, events: AsyncIterator[T]) -> None:
        self._events = events
        self._done = False
        self._pid = os.getpid()
        _open_streams.add(self)

    def __iter__(self) -> _SyncIterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            return run_sync(self._events.__anext__())
        except StopAsyncIteration:
            self._done = True
            raise StopIteration from None
        except BaseException:
            self._done = True
            raise

    def close(self) -> None:
        """Stop the stream (the backend stops generating). Safe to call twice."""
        if self._done:
            return
        self._done = True
        _open_streams.discard(self)
        closing = getattr(self._events, "aclose", None)
        if closing is not None:
            run_sync(closing())

    def __enter__(self) -> _SyncIterator[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        """Close a stream dropped unfinished (a ``break``), on the running loop only: never start a loop thread
        here, nor wait while the interpreter exits (the exit hook closed the streams still open before that)."""
        if self._done:
            return
        self._done = True
        try:
            thread = _running_loop()
            closing = getattr(self._events, "aclose", None)
            if closing is None or thread is None or self._pid != thread.pid or sys.is_finalizing():
                return
            if threading.current_thread() is thread.thread:  # collected on the loop itself: it cannot wait there
                thread.loop.create_task(_as_coroutine(closing()))
            else:
                thread.run(closing())
        except Exception:  # the stream's own error, or collected late in the exit (this module's names gone)
            return


def wrap(provider: InferenceProvider) -> SyncProvider:
    """A sync facade over a provider you built; from now on, use it only through the returned object."""
    return SyncProvider(provider)


def get_sync_provider(provider_type: str | None = None, base_url: str | None = None) -> SyncProvider:
    """The sync twin of :func:`~inference.get_provider`: the same arguments, settings and errors.

    The same resolved settings give the same :class:`SyncProvider` (its own provider object, apart from the one
    ``get_provider`` gives async code).

    Raises:
        UnknownProviderError: The type is unknown.
        ConfigurationError: A setting is malformed.
        MissingDependencyError: The provider's extra is not installed.
    """
    from inference.factory import provider_recipe

    return _cached(provider_recipe(provider_type, base_url))


def get_sync_provider_for_step(step_config: Mapping[str, Any]) -> SyncProvider:
    """The sync twin of :func:`~inference.get_provider_for_step`."""
    from inference.factory import provider_recipe_for_step

    return _cached(provider_recipe_for_step(step_config))


_open: weakref.WeakSet[SyncProvider] = weakref.WeakSet()
_open_streams: weakref.WeakSet[_SyncIterator[Any]] = weakref.WeakSet()
_sync_cache: dict[Any, SyncProvider] = {}
_sync_cache_lock = threading.Lock()
_rebuild_lock = threading.Lock()
"""Held while a sync provider made before a fork makes its provider again in the child."""


def _cached(recipe: ProviderRecipe) -> SyncProvider:
    with _sync_cache_lock:
        cached = _sync_cache.get(recipe.key)
        if cached is not None and (cached._pid != os.getpid() or not (cached._closed or cached._provider.closed)):
            return cached  # one made before a fork makes its provider again on first use: one per process
        _sync_cache[recipe.key] = made = SyncProvider(recipe.build(), rebuild=recipe.build)
        return made


def close_all_sync_providers() -> None:
    """Close every sync provider of this process that is still open, and forget the cached ones."""
    with _sync_cache_lock:
        _sync_cache.clear()
    for provider in list(_open):
        provider.close()


def _close_at_exit() -> None:
    """Close the streams left unfinished (their connections, their generations), then the sync providers still
    open (their connections, models), while the loop still runs: before the interpreter goes."""
    thread = _running_loop()
    if thread is None:
        return
    closings: list[Awaitable[Any]] = []
    for stream in list(_open_streams):
        closing = getattr(stream._events, "aclose", None)
        if not stream._done and closing is not None and stream._pid == thread.pid:
            stream._done = True
            closings.append(closing())
    for provider in list(_open):
        if not provider._closed and provider._pid == os.getpid():
            provider._closed = True
            closings.append(provider._provider.aclose())
    for closing in closings:  # streams first: a stream's connection belongs to its provider's pool
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(closing), thread.loop)
        with contextlib.suppress(Exception, concurrent.futures.TimeoutError):
            future.result(timeout=CLOSE_AT_EXIT_SECONDS)


atexit.register(_close_at_exit)
