"""Token streaming and cancellation for an in-process model.

:class:`PieceAssembler` turns the text decoded so far into pieces that are safe to hand out (never a
partial stop string), and :func:`stream_from_worker` runs a generation on the model's worker thread while
its pieces reach the event loop as they come.

Cancellation, one mechanism for every call: each request travels to the worker thread with a cancel
event (the one handed to a :data:`WorkerJob`, or a batched request's
:attr:`~inference._inprocess.batching.PendingRequest.cancel`), set the moment its caller gives up: a
cancelled or timed out ``generate``, a ``generate_batch`` cancelled with its requests, a stream closed
early. Generation loops check it after every token, so the model is free for the next request within one
token. :func:`run_on_worker` (a whole result) and :func:`stream_from_worker` (pieces, then the result) are
the two ways to await a job, and both set the event in the same way.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

from inference._core.validation import GenerationRequest
from inference._inprocess.worker import ModelWorker
from inference.provider import GenerationResult

__all__ = [
    "JobStarter",
    "PieceAssembler",
    "PieceSink",
    "WorkerJob",
    "on_worker",
    "run_job",
    "run_on_worker",
    "stream_from_worker",
    "stream_job",
    "tokens_of_text",
]

PieceSink = Callable[[str], None]
"""Receives each text piece of a streamed generation, on the worker thread."""

WorkerJob = Callable[[GenerationRequest, PieceSink | None, threading.Event], GenerationResult]
"""A blocking generation: hands pieces to the sink (if one is given) and stops within a token of the event."""

JobStarter = Callable[[GenerationRequest, PieceSink | None, threading.Event], "asyncio.Future[GenerationResult]"]
"""Starts a generation now and returns its future: a :data:`WorkerJob` queued on the worker, or a request
joining a decode loop. The same contract: pieces to the sink, stop within a token of the event."""


def tokens_of_text(text: str, tokens: list[int], decode: Callable[[list[int]], str]) -> int:
    """How many of the generated ``tokens`` make ``text`` (a stop string cut from its end): the fewest whose
    decoded text starts with it. A token wholly in the cut stop string is not counted; one partly in ``text`` is.
    ``GenerationResult.token_ids`` and ``logprobs`` hold these tokens (so ``detokenize(token_ids)`` starts with
    ``text``). ``decode`` is the backend's text of a token list; the search starts from the end (a stop string is a
    few tokens).
    """
    count = len(tokens)
    while count > 0 and decode(tokens[: count - 1]).startswith(text):
        count -= 1
    return count


class PieceAssembler:
    """Turns the growing text of one generation into pieces, holding back what may become a stop string.

    The worker feeds it the text decoded so far after each token (:meth:`update`); a piece goes to the sink
    only once no stop string can start inside it, so pieces never show a stop string or a part of one, and
    their concatenation is exactly the final text.

    Args:
        stops: The request's stop strings.
        sink: Receives each piece; ``None`` when nobody streams (then it only finds stop strings).
    """

    def __init__(self, stops: tuple[str, ...], sink: PieceSink | None) -> None:
        self.stops = stops
        self.sink = sink
        self.emitted = 0  # characters of the text handed to the sink
        self._searched = 0  # characters already searched for stop strings
        self._longest = max((len(stop) for stop in stops), default=0)

    def update(self, text: str) -> int | None:
        """Take the text so far (it only ever grows); return where a stop string starts, or ``None``.

        When a stop string is found, the text before it is handed out and nothing more should be fed.
        """
        cut: int | None = None
        if self.stops:
            start = max(0, self._searched - self._longest + 1)
            found = [index for index in (text.find(stop, start) for stop in self.stops) if index >= 0]
            cut = min(found) if found else None
        self._searched = len(text)
        if cut is not None:
            self._hand_out(text, cut)
            return cut
        self._hand_out(text, len(text) - self._held_back(text))
        return None

    def finish(self, text: str) -> None:
        """Hand out the rest of the final text."""
        self._hand_out(text, len(text))

    def _held_back(self, text: str) -> int:
        """Length of the longest end of ``text`` that is the beginning of a stop string."""
        for size in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-size:]
            if any(stop.startswith(tail) for stop in self.stops):
                return size
        return 0

    def _hand_out(self, text: str, end: int) -> None:
        if end > self.emitted:
            if self.sink is not None:
                self.sink(text[self.emitted : end])
            self.emitted = end


_DONE = object()


def on_worker(worker: ModelWorker, job: WorkerJob) -> JobStarter:
    """The starter that queues ``job`` on ``worker`` (first come, first served, one at a time)."""

    def start(
        request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event
    ) -> asyncio.Future[GenerationResult]:
        return worker.submit(job, request, sink, cancel)

    return start


async def run_on_worker(worker: ModelWorker, job: WorkerJob, request: GenerationRequest) -> GenerationResult:
    """Run ``job`` on ``worker`` for ``request`` and return its result (see :func:`run_job`)."""
    return await run_job(on_worker(worker, job), request)


def stream_from_worker(
    worker: ModelWorker, job: WorkerJob, request: GenerationRequest
) -> AsyncIterator[str | GenerationResult]:
    """Run ``job`` on ``worker`` and yield its pieces as it produces them, then its result (see :func:`stream_job`)."""
    return stream_job(on_worker(worker, job), request)


async def run_job(start: JobStarter, request: GenerationRequest) -> GenerationResult:
    """Start a generation for ``request`` and return its result.

    The job starts in this call (so a later ``aclose()`` runs after it). If the caller is cancelled
    (``asyncio.wait_for``, a task group, ``generate_batch`` cancelled), a job that has not started is
    dropped, and a running job sees its cancel event and stops within one token.
    """
    cancel = threading.Event()
    task = start(request, None, cancel)
    try:
        return await task
    finally:
        _let_go(task, cancel)


async def stream_job(start: JobStarter, request: GenerationRequest) -> AsyncIterator[str | GenerationResult]:
    """Start a generation and yield its pieces as the worker produces them, then its result.

    Pieces cross from the worker thread with ``loop.call_soon_threadsafe`` into an ``asyncio.Queue``, so
    the loop never blocks. Closing the generator (the consumer stopped or was cancelled) sets the job's
    cancel event, as :func:`run_job` does: the worker is free again within one token, and a job still
    waiting in the worker's queue is dropped without running.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()
    cancel = threading.Event()

    def sink(piece: str) -> None:  # worker thread
        if cancel.is_set():
            return
        try:
            loop.call_soon_threadsafe(queue.put_nowait, piece)
        except RuntimeError:  # the loop is closed: nobody listens any more
            cancel.set()

    task = start(request, sink, cancel)  # started now: a later aclose() runs after it, not before
    # Runs after the result is set, which the worker schedules after its last piece: the sentinel comes last.
    task.add_done_callback(lambda _: queue.put_nowait(_DONE))
    try:
        while (item := await queue.get()) is not _DONE:
            assert isinstance(item, str)
            yield item
        yield task.result()
    finally:
        _let_go(task, cancel)


def _let_go(task: asyncio.Future[GenerationResult], cancel: threading.Event) -> None:
    """The caller is done with ``task``: stop its job (within a token) if it still runs."""
    cancel.set()
    if task.done():
        _retrieve(task)
    else:
        task.cancel()  # drops the job if it has not started; a running one sees the cancel event
        task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Future[GenerationResult]) -> None:
    """Mark a finished, abandoned job's error as seen (nobody waits for it any more)."""
    if not task.cancelled():
        task.exception()
