"""Batching for an in-process model: collect concurrent requests, pad them together, split the output.

Requests are put in a :class:`BatchQueue` on the event loop's thread; the model's worker thread takes
them out with :meth:`BatchQueue.next_batch`. A batch starts when the oldest waiting request has waited
``window_s`` or when ``max_batch_size`` compatible requests are waiting, whichever comes first. Requests
whose batch keys differ (e.g. other sampling settings) never share a batch; the oldest request's key
goes first, so no request waits behind later ones forever. The queue holds any kind of request (generation
requests, score calls): its entries are :class:`PendingRequest` objects typed by request and result.

The helpers below turn a batch into one left-padded input (:func:`left_pad`), stop each row at its own
``max_tokens`` (:class:`RowLimits`) or once its caller gave up (:class:`RowsCancelled`, the per-row form of
the cancel event described in :mod:`inference._inprocess.streaming`), and cut each row's output back into
a result (:func:`cut_row`).

Nothing here imports torch: functions that build tensors take the torch module as an argument.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from inference._core.validation import GenerationRequest
from inference._inprocess.streaming import tokens_of_text
from inference.provider import GenerationResult

__all__ = ["BatchQueue", "BatchRow", "PendingRequest", "RowLimits", "RowsCancelled", "cut_row", "left_pad"]

RequestT = TypeVar("RequestT")
"""What is queued: a :class:`~inference._core.validation.GenerationRequest`, a score call..."""
ResultT = TypeVar("ResultT")
"""What the worker answers it with."""


@dataclass(eq=False)
class PendingRequest(Generic[RequestT, ResultT]):
    """One request on its way to the model's worker thread, with what the worker needs to serve it.

    Attributes:
        request: The validated request.
        future: Resolved by the worker thread with the result or the error (batched requests); cancelled
            if the caller gives up before its batch starts.
        cancel: Set when the caller gives up; the worker checks it after every token and stops the request.
        enqueued_at: ``time.monotonic()`` when it was queued (its batch window starts here).
        key: Its batch key, computed once by the worker thread (requests share a batch only if keys are equal).
    """

    request: RequestT
    future: Future[ResultT] = field(default_factory=Future)
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)
    key: Hashable | None = None


class BatchQueue(Generic[RequestT, ResultT]):
    """A thread-safe queue that hands out batches of compatible requests.

    Args:
        max_batch_size: The most requests in one batch.
        window_s: How long the oldest waiting request waits for others to join its batch, in seconds.
    """

    def __init__(self, max_batch_size: int, window_s: float) -> None:
        self.max_batch_size = max_batch_size
        self.window_s = window_s
        self._pending: list[PendingRequest[RequestT, ResultT]] = []
        self._condition = threading.Condition()

    def __len__(self) -> int:
        with self._condition:
            return len(self._pending)

    def put(self, request: RequestT) -> PendingRequest[RequestT, ResultT]:
        """Queue ``request`` and wake a worker waiting for its batch to fill; returns its entry."""
        entry: PendingRequest[RequestT, ResultT] = PendingRequest(request)
        with self._condition:
            self._pending.append(entry)
            self._condition.notify_all()
        return entry

    def discard(self, entry: PendingRequest[RequestT, ResultT]) -> None:
        """The caller gave up: set ``entry``'s cancel event, take it out of the queue, cancel its future.

        A request whose batch is already running stops at its next token (the worker sees the event).
        """
        entry.cancel.set()
        with self._condition:
            if entry in self._pending:
                self._pending.remove(entry)
        entry.future.cancel()

    def next_batch(
        self,
        key_of: Callable[[RequestT], Hashable] | None = None,
        first: Callable[[RequestT], Hashable] | None = None,
        most: int | None = None,
    ) -> list[PendingRequest[RequestT, ResultT]]:
        """Wait for the oldest request's window, then return it and the compatible requests behind it.

        Args:
            key_of: Gives a request's batch key; called once per request, on the calling (worker) thread.
                ``None``: every request is compatible with every other.
            first: Orders a batch: the compatible requests whose ``first`` equals the oldest's go before the
                others (each part oldest first), so a batch is as uniform as the waiting requests allow (a
                forward pass of one adapter skips PEFT's mixed-adapter path). ``None``: oldest first.
            most: Take up to this many requests (at least ``max_batch_size``) once ``max_batch_size`` are waiting
                or the window has passed: a caller that cuts its own passes (scoring sorts rows by adapter and
                length) gets more to sort from. ``None``: ``max_batch_size``.

        Returns:
            Up to ``most`` (``max_batch_size``) compatible requests, each future marked running (so callers can no
            longer cancel it); an empty list when nothing is waiting.
        """
        with self._condition:
            while True:
                self._pending = [
                    entry for entry in self._pending if not (entry.future.cancelled() or entry.cancel.is_set())
                ]
                if not self._pending:
                    return []
                if key_of is not None:
                    for entry in self._pending:
                        if entry.key is None:
                            entry.key = key_of(entry.request)
                head = self._pending[0]
                group = [entry for entry in self._pending if entry.key == head.key]
                if first is not None:
                    wanted = first(head.request)
                    group.sort(key=lambda entry: first(entry.request) != wanted)  # stable: oldest first in each
                group = group[: max(most or 0, self.max_batch_size)]
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

    entry: PendingRequest[GenerationRequest, GenerationResult]
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

    def __init__(self, torch: Any, entries: list[PendingRequest[GenerationRequest, GenerationResult]]) -> None:
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
) -> tuple[str, int, int, str]:
    """Cut one row's new tokens at its limit, its first end-of-sequence token or its first stop string.

    Returns:
        ``(text, completion_tokens, kept, finish_reason)``: the stop string and end-of-sequence token are not
        part of the text; ``completion_tokens`` counts the tokens generated up to the one that completed the stop
        string, or up to the end-of-sequence token included (as llama.cpp and vLLM count), ``kept`` the first of them
        that make the text (:func:`~inference._inprocess.streaming.tokens_of_text`: the result's token ids and
        logprobs). ``finish_reason`` is ``"stop"`` or ``"length"``.
    """
    tokens, finish_reason = tokens[:limit], "length"
    generated = len(tokens)
    end = next((index for index, token in enumerate(tokens) if token in eos_ids), None)
    if end is not None:
        tokens, finish_reason, generated = tokens[:end], "stop", end + 1
    text = decode(tokens)
    cuts = [text.index(stop) for stop in stops if stop in text]
    if not cuts:
        return text, generated, len(tokens), finish_reason
    count = next(
        (n for n in range(1, len(tokens) + 1) if any(stop in decode(tokens[:n]) for stop in stops)), len(tokens)
    )
    text = text[: min(cuts)]
    return text, count, tokens_of_text(text, tokens[:count], decode), "stop"
