"""Token streaming and cancellation of in-process providers, on a real model worker thread with plain jobs.

No model and no torch: each job is a Python function with a generation job's signature (request, piece
sink, cancel event), so these tests show what a caller of ``generate`` and ``stream`` sees.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from inference._inprocess.streaming import PieceAssembler, PieceSink, run_on_worker, stream_from_worker
from inference._inprocess.worker import ModelWorker
from inference.exceptions import ProviderError
from inference.provider import GenerationRequest, GenerationResult

REQUEST = GenerationRequest.from_arguments(provider="test", prompt="Hi", model="m")


def result(text: str) -> GenerationResult:
    return GenerationResult(text=text, model="m", adapter_id=None, token_count=0, finish_reason="stop")


def assembled(stops: tuple[str, ...], texts: list[str]) -> tuple[list[str], int | None]:
    """Feed the growing ``texts`` to an assembler; return the pieces handed out and the cut, if any."""
    pieces: list[str] = []
    assembler = PieceAssembler(stops, pieces.append)
    for text in texts:
        cut = assembler.update(text)
        if cut is not None:
            return pieces, cut
    assembler.finish(texts[-1])
    return pieces, None


@pytest.fixture
async def worker() -> AsyncIterator[ModelWorker]:
    worker = ModelWorker("test")
    yield worker
    worker.shutdown()


# PieceAssembler -------------------------------------------------------------------------------------------


def test_a_stop_string_split_over_tokens_is_never_shown() -> None:
    pieces, cut = assembled(("END",), ["Hello", "Hello E", "Hello EN", "Hello END", "Hello END more"])

    assert cut == 6
    assert "".join(pieces) == "Hello "  # no "E" or "EN" was handed out before the stop string completed
    assert all("E" not in piece for piece in pieces)


def test_held_back_text_is_handed_out_once_it_cannot_start_a_stop_string() -> None:
    pieces, cut = assembled(("END",), ["a E", "a Ex", "a Ex!"])

    assert cut is None
    assert pieces == ["a ", "Ex", "!"]


def test_finish_hands_out_the_held_back_end_of_the_text() -> None:
    pieces, cut = assembled(("END",), ["done E", "done EN"])

    assert cut is None
    assert pieces == ["done ", "EN"]


def test_the_earliest_of_several_stop_strings_cuts_the_text() -> None:
    pieces, cut = assembled(("world", "lo"), ["hello world"])

    assert cut == 3
    assert pieces == ["hel"]


def test_without_a_sink_the_assembler_only_finds_the_stop() -> None:
    assembler = PieceAssembler(("\n\n",), None)

    assert assembler.update("one\n") is None
    assert assembler.update("one\n\ntwo") == 3


# stream_from_worker ---------------------------------------------------------------------------------------


async def test_a_stream_yields_the_pieces_in_order_then_the_result(worker: ModelWorker) -> None:
    def job(request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event) -> GenerationResult:
        assert sink is not None
        for piece in ("a", "b", "c"):
            sink(piece)
        return result("abc")

    items = [item async for item in stream_from_worker(worker, job, REQUEST)]

    assert items == ["a", "b", "c", result("abc")]


async def test_an_error_of_the_job_reaches_the_consumer_after_the_pieces_before_it(worker: ModelWorker) -> None:
    def job(request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event) -> GenerationResult:
        assert sink is not None
        sink("partial")
        raise ProviderError("the model failed", provider="test")

    seen: list[object] = []
    with pytest.raises(ProviderError, match="the model failed"):
        async for item in stream_from_worker(worker, job, REQUEST):
            seen.append(item)

    assert seen == ["partial"]


async def test_closing_a_stream_early_stops_the_job_and_frees_the_worker(worker: ModelWorker) -> None:
    stopped = threading.Event()

    def endless(request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event) -> GenerationResult:
        assert sink is not None
        while not cancel.wait(0.001):  # one "token" per millisecond until the caller gives up
            sink("x")
        stopped.set()
        return result("")

    stream = stream_from_worker(worker, endless, REQUEST)
    assert await anext(stream) == "x"
    await stream.aclose()

    assert await asyncio.to_thread(stopped.wait, 5)
    assert await worker.run(lambda: "next") == "next"  # the worker serves the next call


# run_on_worker --------------------------------------------------------------------------------------------


async def test_run_on_worker_returns_the_result_and_raises_the_error(worker: ModelWorker) -> None:
    def ok(request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event) -> GenerationResult:
        assert sink is None  # nobody streams
        return result(request.prompt)

    def failing(request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event) -> GenerationResult:
        raise ProviderError("no", provider="test")

    assert await run_on_worker(worker, ok, REQUEST) == result("Hi")
    with pytest.raises(ProviderError, match="no"):
        await run_on_worker(worker, failing, REQUEST)


async def test_cancelling_the_caller_sets_the_running_jobs_cancel_event(worker: ModelWorker) -> None:
    started, stopped = threading.Event(), threading.Event()

    def endless(request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event) -> GenerationResult:
        started.set()
        cancel.wait(120)
        if cancel.is_set():
            stopped.set()
        return result("")

    task = asyncio.create_task(run_on_worker(worker, endless, REQUEST))
    assert await asyncio.to_thread(started.wait, 120)
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(stopped.wait, 120)


async def test_a_cancelled_job_still_waiting_in_the_queue_never_runs(worker: ModelWorker) -> None:
    gate, ran = threading.Event(), []

    def blocking(request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event) -> GenerationResult:
        gate.wait(10)
        ran.append("first")
        return result("first")

    def queued(request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event) -> GenerationResult:
        ran.append("second")
        return result("second")

    first = asyncio.create_task(run_on_worker(worker, blocking, REQUEST))
    second = asyncio.create_task(run_on_worker(worker, queued, REQUEST))
    await asyncio.sleep(0.05)  # both are queued; the first is running
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    await asyncio.sleep(0.01)  # the event loop passes the cancellation on to the worker's queue
    gate.set()

    assert await first == result("first")
    assert await worker.run(lambda: list(ran)) == ["first"]
