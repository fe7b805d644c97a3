"""The batch queue holds any kind of request: score calls wait in it as generation requests do.

Score calls have no batch key (any two may share a forward pass), and a batch takes the calls for the oldest
call's adapter first (a forward pass of one adapter skips PEFT's mixed-adapter path), then fills up with the
others, oldest first. Plain Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference._inprocess.batching import BatchQueue, PendingRequest


@dataclass(frozen=True)
class Call:
    name: str
    adapter_id: str | None


def names(batch: list[PendingRequest[Call, float]]) -> list[str]:
    return [entry.request.name for entry in batch]


def adapter_of(call: Call) -> str | None:
    return call.adapter_id


def test_without_a_key_every_request_shares_a_batch_oldest_first() -> None:
    queue: BatchQueue[Call, float] = BatchQueue(max_batch_size=8, window_s=0)
    for name, adapter in (("1", "a"), ("2", None), ("3", "b")):
        queue.put(Call(name, adapter))

    batch = queue.next_batch()

    assert names(batch) == ["1", "2", "3"]
    assert all(entry.future.running() for entry in batch)
    assert queue.next_batch() == []


def test_the_oldest_requests_adapter_goes_first_then_the_others_fill_the_batch() -> None:
    queue: BatchQueue[Call, float] = BatchQueue(max_batch_size=3, window_s=0)
    for name, adapter in (("1", "a"), ("2", "b"), ("3", None), ("4", "a"), ("5", "a"), ("6", "b")):
        queue.put(Call(name, adapter))

    assert names(queue.next_batch(first=adapter_of)) == ["1", "4", "5"]  # all of a, though b and None came earlier
    assert names(queue.next_batch(first=adapter_of)) == ["2", "6", "3"]  # b first (the oldest now), then the rest
    assert len(queue) == 0


def test_a_full_batch_of_mixed_adapters_does_not_wait_for_its_window() -> None:
    queue: BatchQueue[Call, float] = BatchQueue(max_batch_size=2, window_s=3600)
    for name, adapter in (("1", "a"), ("2", "b"), ("3", "c")):
        queue.put(Call(name, adapter))

    assert names(queue.next_batch(first=adapter_of)) == ["1", "2"]  # no key: two calls of any adapters fill it
