"""Batching and streaming for an in-process model.

Batching: collect concurrent requests, pad them together, split the output.

Requests are put in a :class:`BatchQueue` on the event loop's thread; the model's worker thread takes
them out with :meth:`BatchQueue.next_batch`. A batch starts when the oldest waiting request has waited
``window_s`` or when ``max_batch_size`` compatible requests are waiting, whichever comes first. Requests
whose batch keys differ (e.g. other sampling settings) never share a batch; the oldest request's key
goes first, so no request waits behind later ones forever.

The helpers below turn a batch into one left-padded input (:func:`left_pad`), stop each row at its own
``max_tokens`` (:class:`RowLimits`) and cut each row's output back into a result (:func:`cut_row`).
Streaming: :class:`PieceAssembler` turns the text decoded so far into pieces that are safe to hand out
(never a partial stop string), and :func:`stream_from_worker` runs a generation on the model's worker
thread while its pieces reach the event loop as they come.

Cancellation, one mechanism for every call: each request travels to the worker thread with a cancel
event (a :class:`PendingRequest`'s ``cancel``, or the one handed to a :data:`WorkerJob`), set the moment
its caller gives up: a cancelled or timed out ``generate``, a ``generate_batch`` cancelled with its
requests, a stream closed early. Generation loops check it after every token (:class:`RowsCancelled` is
the check for a ``transformers`` batch, one row at a time), so the model is free for the next request
within one token. :func:`run_on_worker` (a whole result) and :func:`stream_from_worker` (pieces, then the
result) are the two ways to await a job, and both set the event in the same way.

Nothing here imports torch: functions that build tensors take the torch module as an argument.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from inference._core.validation import GenerationRequest
from inference._inprocess.worker import ModelWorker
from inference.provider import GenerationResult

__all__ = [
    "BatchQueue",
    "BatchRow",
    "PendingRequest",
    "PieceAssembler",
    "PieceSink",
    "RowLimits",
    "RowsCancelled",
    "WorkerJob",
    "cut_row",
    "left_pad",
    "run_on_worker",
    "stream_from_worker",
]

PieceSink = Callable[[str], None]
"""Receives each text piece of a streamed generation, on the worker thread."""

WorkerJob = Callable[[GenerationRequest, PieceSink | None, threading.Event], GenerationResult]
"""A blocking generation: hands pieces to the sink (if one is given) and stops within a token of the event."""


@dataclass(eq=False)
class PendingRequest:
    """One request on its way to the model's worker thread, with what the worker needs to serve it.

    Attributes:
        request: The validated request.
        future: Resolved by the worker thread with the result or the error (batched requests); cancelled
            if the caller gives up before its batch starts.
        cancel: Set when the caller gives up; the worker checks it after every token and stops the request.
        enqueued_at: ``time.monotonic()`` when it was queued (its batch window starts here).
        key: Its batch key, computed once by the worker thread (requests share a batch only if keys are equal).
    """

    request: GenerationRequest
    future: Future[GenerationResult] = field(default_factory=Future)
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)
    key: Hashable | None = None


class BatchQueue:
    """A thread-safe queue that hands out batches of compatible requests.

    Args:
        max_batch_size: The most requests in one batch.
        window_s: How long the oldest waiting request waits for others to join its batch, in seconds.
    """

    def __init__(self, max_batch_size: int, window_s: float) -> None:
        self.max_batch_size = max_batch_size
        self.window_s = window_s
        self._pending: list[PendingRequest] = []
        self._condition = threading.Condition()

    def __len__(self) -> int:
        with self._condition:
            return len(self._pending)

    def put(self, request: GenerationRequest) -> PendingRequest:
        """Queue ``request`` and wake a worker waiting for its batch to fill; returns its entry."""
        entry = PendingRequest(request)
        with self._condition:
            self._pending.append(entry)
            self._condition.notify_all()
        return entry

    def discard(self, entry: PendingRequest) -> None:
        """The caller gave up: set ``entry``'s cancel event, take it out of the queue, cancel its future.

        A request whose batch is already running stops at its next token (the worker sees the event).
        """
        entry.cancel.set()
        with self._condition:
            if entry in self._pending:
                self._pending.remove(entry)
        entry.future.cancel()

    def next_batch(self, key_of: Callable[[GenerationRequest], Hashable]) -> list[PendingRequest]:
        """Wait for the oldest request's window, then return it and the compatible requests behind it.

        Args:
            key_of: Gives a request's batch key; called once per request, on the calling (worker) thread.

        Returns:
            Up to ``max_batch_size`` requests with equal keys, oldest first, each future marked running
            (so callers can no longer cancel it); an empty list when nothing is waiting.
        """
        with self._condition:
            while True:
                self._pending = [
                    entry for entry in self._pending if not (entry.future.cancelled() or entry.cancel.is_set())
                ]
                if not self._pending:
                    return []
                for entry in self._pending:
                    if entry.key is None:
                        entry.key = key_of(entry.request)
                head = self._pending[0]
                group = [entry for entry in self._pending if entry.key == head.key][: self.max_batch_size]
                remaining = head.enqueued_at + self.window_s - time.monotonic()
                if len(group) >= self.max_batch_size or remaining <= 0:
                    break
                self._condition.wait(remaining)
            for entry in group:
                self._pending.remove(entry)
            return [entry for entry in group if entry.future.set_running_or_notify_cancel()]


@dataclass(frozen=True)
class BatchRow:
    """One request of a batch, tokenised.

    Attributes:
        entry: The queued request.
        prompt_ids: Its prompt's token ids.
        limit: The most new tokens for this row (``max_tokens``, or less where the context ends first).
    """

    entry: PendingRequest
    prompt_ids: list[int]
    limit: int


def left_pad(torch: Any, rows: list[BatchRow], pad_id: int) -> tuple[Any, Any]:
    """Return ``(input_ids, attention_mask)`` with every prompt right-aligned (decoder-only batching)."""
    width = max(len(row.prompt_ids) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        start = width - len(row.prompt_ids)
        input_ids[index, start:] = torch.tensor(row.prompt_ids, dtype=torch.long)
        attention_mask[index, start:] = 1
    return input_ids, attention_mask


class RowLimits:
    """A ``generate`` stopping criterion: each row is done once it has its own number of new tokens.

    Args:
        limits: A 1-D integer tensor, one limit per row, on the model's device.
        prompt_width: The padded prompt length (new tokens start there).
    """

    def __init__(self, limits: Any, prompt_width: int) -> None:
        self.limits = limits
        self.prompt_width = prompt_width

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        return (input_ids.shape[1] - self.prompt_width) >= self.limits


class RowsCancelled:
    """A ``generate`` stopping criterion: a row is done once its request's cancel event is set.

    ``generate`` pads the rows that are done and goes on with the others, so cancelling one request of a
    batch changes nothing for the rest; when every row is done, ``generate`` returns.

    Args:
        torch: The torch module.
        entries: The batch's requests, one per row, in row order.
    """

    def __init__(self, torch: Any, entries: list[PendingRequest]) -> None:
        self.torch = torch
        self.entries = entries

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        flags = [entry.cancel.is_set() for entry in self.entries]
        return self.torch.tensor(flags, dtype=self.torch.bool, device=input_ids.device)


def cut_row(
    tokens: list[int],
    limit: int,
    eos_ids: frozenset[int],
    stops: tuple[str, ...],
    decode: Callable[[list[int]], str],
) -> tuple[str, int, str]:
    """Cut one row's new tokens at its limit, its first end-of-sequence token or its first stop string.

    Returns:
        ``(text, completion_tokens, finish_reason)``; the stop string and end-of-sequence token are not
        part of the text. ``finish_reason`` is ``"stop"`` or ``"length"``.
    """
    tokens, finish_reason = tokens[:limit], "length"
    end = next((index for index, token in enumerate(tokens) if token in eos_ids), None)
    if end is not None:
        tokens, finish_reason = tokens[:end], "stop"
    text = decode(tokens)
    cuts = [text.index(stop) for stop in stops if stop in text]
    if not cuts:
        return text, len(tokens), finish_reason
    count = next(
        (n for n in range(1, len(tokens) + 1) if any(stop in decode(tokens[:n]) for stop in stops)), len(tokens)
    )
    return text[: min(cuts)], count, "stop"


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


async def run_on_worker(worker: ModelWorker, job: WorkerJob, request: GenerationRequest) -> GenerationResult:
    """Run ``job`` on ``worker`` for ``request`` and return its result.

    The job is queued in this call (so a later ``aclose()`` runs after it). If the caller is cancelled
    (``asyncio.wait_for``, a task group, ``generate_batch`` cancelled), the job is dropped when it has not
    started, and a running job sees its cancel event and stops within one token.
    """
    cancel = threading.Event()
    task = worker.submit(job, request, None, cancel)
    try:
        return await task
    finally:
        _let_go(task, cancel)


async def stream_from_worker(
    worker: ModelWorker, job: WorkerJob, request: GenerationRequest
) -> AsyncIterator[str | GenerationResult]:
    """Run ``job`` on ``worker`` and yield its pieces as the worker produces them, then its result.

    Pieces cross from the worker thread with ``loop.call_soon_threadsafe`` into an ``asyncio.Queue``, so
    the loop never blocks. Closing the generator (the consumer stopped or was cancelled) sets the job's
    cancel event, as :func:`run_on_worker` does: the worker is free again within one token, and a job
    still waiting in the worker's queue is dropped without running.
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

    task = worker.submit(job, request, sink, cancel)  # queued now: a later aclose() runs after it, not before
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
