"""The batch queue of in-process providers: which requests share a ``generate``, in what order, and when.

Plain Python, no torch: the queue is driven from the test thread (the event loop's side) and a helper
thread (the model worker's side).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from inference._inprocess.batching import BatchQueue, PendingRequest, cut_row
from inference.provider import GenerationRequest


def request(prompt: str, temperature: float | None = None) -> GenerationRequest:
    return GenerationRequest.from_arguments(provider="test", prompt=prompt, model="m", temperature=temperature)


def by_temperature(item: GenerationRequest) -> Hashable:
    return item.temperature


def prompts(batch: list[PendingRequest]) -> list[str]:
    return [entry.request.prompt for entry in batch]


def test_requests_come_out_oldest_first_and_are_marked_running() -> None:
    queue = BatchQueue(max_batch_size=8, window_s=0)
    for prompt in ("a", "b", "c"):
        queue.put(request(prompt))

    batch = queue.next_batch(by_temperature)

    assert prompts(batch) == ["a", "b", "c"]
    assert all(entry.future.running() for entry in batch)  # the caller can no longer cancel them away
    assert len(queue) == 0
    assert queue.next_batch(by_temperature) == []  # nothing waiting: no wait, no batch


def test_only_requests_with_equal_keys_share_a_batch_and_the_oldest_key_goes_first() -> None:
    queue = BatchQueue(max_batch_size=8, window_s=0)
    for prompt, temperature in (("greedy-1", 0.0), ("sampled-1", 0.7), ("greedy-2", 0.0), ("sampled-2", 0.7)):
        queue.put(request(prompt, temperature))

    assert prompts(queue.next_batch(by_temperature)) == ["greedy-1", "greedy-2"]
    assert prompts(queue.next_batch(by_temperature)) == ["sampled-1", "sampled-2"]
    assert queue.next_batch(by_temperature) == []


def test_the_key_of_a_request_is_computed_once() -> None:
    queue = BatchQueue(max_batch_size=1, window_s=0)
    calls: list[str] = []

    def counting_key(item: GenerationRequest) -> Hashable:
        calls.append(item.prompt)
        return "one key"

    for prompt in ("a", "b", "c"):
        queue.put(request(prompt))
    while queue.next_batch(counting_key):
        pass

    assert sorted(calls) == ["a", "b", "c"]


def test_a_batch_holds_at_most_max_batch_size_requests() -> None:
    queue = BatchQueue(max_batch_size=2, window_s=60)  # a full batch does not wait for its window
    for prompt in "abcde":
        queue.put(request(prompt))

    sizes = [len(queue.next_batch(by_temperature)) for _ in range(2)]  # waiting for the window would take 2 min

    assert sizes == [2, 2]
    assert len(queue) == 1


def test_a_lone_request_waits_for_its_window_and_a_request_arriving_meanwhile_joins_it() -> None:
    # No clock: the window is an hour, and the oldest request's hour is then moved into the past.
    queue = BatchQueue(max_batch_size=8, window_s=3600)
    first = queue.put(request("first"))
    batches: list[list[PendingRequest]] = []
    worker = threading.Thread(target=lambda: batches.append(queue.next_batch(by_temperature)))
    worker.start()
    queue.put(request("second"))  # arrives while the first waits for its window
    worker.join(0.05)
    assert worker.is_alive()  # a lone request waits (a worker that did not would have returned at once)

    with queue._condition:  # the first request's window is over; the second one's has just begun
        first.enqueued_at -= 3600
        queue._condition.notify_all()
    worker.join(60)

    assert not worker.is_alive()  # the window counts from the oldest request, not the newest
    assert [prompts(batch) for batch in batches] == [["first", "second"]]


def test_a_request_filling_the_batch_wakes_the_waiting_worker_before_the_window_ends() -> None:
    queue = BatchQueue(max_batch_size=2, window_s=3600)
    queue.put(request("first"))
    batches: list[list[PendingRequest]] = []
    worker = threading.Thread(target=lambda: batches.append(queue.next_batch(by_temperature)))

    worker.start()
    worker.join(0.05)
    assert worker.is_alive()  # waiting for the first request's window (an hour)
    queue.put(request("second"))
    worker.join(60)

    assert not worker.is_alive()
    assert [prompts(batch) for batch in batches] == [["first", "second"]]


def test_a_discarded_request_never_reaches_a_batch() -> None:
    queue = BatchQueue(max_batch_size=8, window_s=0)
    gone = queue.put(request("gone"))
    kept = queue.put(request("kept"))

    queue.discard(gone)

    assert gone.cancel.is_set() and gone.future.cancelled()
    assert prompts(queue.next_batch(by_temperature)) == ["kept"]
    assert not kept.cancel.is_set()


def test_discarding_a_request_whose_batch_runs_sets_its_cancel_flag_for_the_worker() -> None:
    queue = BatchQueue(max_batch_size=8, window_s=0)
    entry = queue.put(request("running"))
    [taken] = queue.next_batch(by_temperature)

    queue.discard(entry)

    assert taken is entry
    assert entry.cancel.is_set()  # the generation loop stops this row at its next token
    assert not entry.future.done()  # the worker settles it


def test_a_request_whose_cancel_flag_is_set_while_queued_is_skipped() -> None:
    queue = BatchQueue(max_batch_size=8, window_s=0)
    skipped = queue.put(request("skipped"))
    queue.put(request("served"))

    skipped.cancel.set()

    assert prompts(queue.next_batch(by_temperature)) == ["served"]


def test_cut_row_stops_at_the_limit_the_end_token_or_the_first_stop_string() -> None:
    def decode(ids: list[int]) -> str:
        return "".join(chr(ord("a") + token) for token in ids)

    def decode_pairs(ids: list[int]) -> str:  # each token two letters: "ab", "cd", ...
        return "".join(chr(ord("a") + 2 * token) + chr(ord("b") + 2 * token) for token in ids)

    # (text, tokens generated, tokens that make the text, finish reason)
    assert cut_row([0, 1, 2, 3], 3, frozenset(), (), decode) == ("abc", 3, 3, "length")
    assert cut_row([0, 1, 9, 3], 4, frozenset({9}), (), decode) == ("ab", 3, 2, "stop")  # the end token counts
    assert cut_row([0, 1, 2, 3], 4, frozenset(), ("cd", "bc"), decode) == ("a", 3, 1, "stop")
    # a token partly in the text is kept, one wholly in the stop string is not
    assert cut_row([0, 1, 2, 3], 4, frozenset(), ("de",), decode_pairs) == ("abc", 3, 2, "stop")
    assert cut_row([0, 1, 2, 3], 4, frozenset(), ("cd",), decode_pairs) == ("ab", 2, 1, "stop")
    assert cut_row([0, 1, 2, 3], 4, frozenset(), ("ab",), decode_pairs) == ("", 1, 0, "stop")
