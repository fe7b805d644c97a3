"""``generate_batch`` and ``score_batch``'s policies: ``on_error`` (return, warn, raise), ``chunk_size`` and
``on_result``, on the fake provider (one mechanism in the base class for every provider)."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from inference import FakeProvider
from inference._core.validation import GenerationRequest, ScoreRequest
from inference.exceptions import InvalidRequestError, ProviderError
from inference.results import GenerationResult, ScoreResult


class Scripted(FakeProvider):
    """A fake whose backend fails for prompts starting with ``fail``, never answers for ``hang`` (until cancelled),
    and records what it started, finished and saw cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.hanging = asyncio.Event()  # set once a hanging request is in flight
        self.proceed = asyncio.Event()  # a failing request fails once this and hanging are set

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        prompt = str(request.prompt)
        self.started.append(prompt)
        try:
            if prompt.startswith("hang"):
                self.hanging.set()
                await asyncio.Event().wait()
            if prompt.startswith("fail"):
                await self.hanging.wait()  # fail while the hanging one runs
                await self.proceed.wait()
                raise ProviderError(f"the backend failed on {prompt}", provider=self.name)
            result = await super()._generate(request)
        except asyncio.CancelledError:
            self.cancelled.append(prompt)
            raise
        self.finished.append(prompt)
        return result


async def test_return_is_the_default_and_keeps_every_result() -> None:
    provider = Scripted()
    provider.hanging.set()
    provider.proceed.set()
    seen: list[int] = []
    results = await provider.generate_batch(["a", "fail 1", "b"], "m", on_result=lambda index, _: seen.append(index))
    assert isinstance(results[0], GenerationResult) and isinstance(results[2], GenerationResult)
    assert isinstance(results[1], ProviderError)
    assert sorted(seen) == [0, 1, 2]


async def test_warn_returns_like_return_and_logs_each_failed_item(caplog: pytest.LogCaptureFixture) -> None:
    provider = Scripted()
    provider.hanging.set()
    provider.proceed.set()
    with caplog.at_level(logging.WARNING, logger="inference"):
        results = await provider.generate_batch(["a", "fail 1", "fail 2"], "m", on_error="warn")
    assert isinstance(results[0], GenerationResult)
    warnings = sorted(record.getMessage() for record in caplog.records if record.levelno == logging.WARNING)
    assert warnings == [
        "generate_batch: item 1 failed: ProviderError: the backend failed on fail 1",
        "generate_batch: item 2 failed: ProviderError: the backend failed on fail 2",
    ]


async def test_raise_cancels_what_runs_never_starts_the_rest_and_raises_the_first_error() -> None:
    provider = Scripted()
    provider.proceed.set()
    reported: list[int] = []
    prompts = ["hang", "fail 1", "later 1", "later 2"]
    with pytest.raises(ProviderError, match="the backend failed on fail 1"):
        await provider.generate_batch(
            prompts, "m", max_concurrency=2, on_error="raise", on_result=lambda index, _: reported.append(index)
        )
    assert provider.cancelled == ["hang"]  # stopped, and stopped before the error was raised
    assert provider.started == ["hang", "fail 1"]  # the items waiting for a place never started
    assert reported == [1]
    assert (await provider.generate("ok", "m")).text  # the provider goes on


async def test_chunks_run_one_after_the_other() -> None:
    events: list[str] = []

    class Ordered(Scripted):
        async def _generate(self, request: GenerationRequest) -> GenerationResult:
            events.append(f"start {request.prompt}")
            await asyncio.sleep(0)
            result = await super()._generate(request)
            events.append(f"end {request.prompt}")
            return result

    provider = Ordered()
    results = await provider.generate_batch(["a", "b", "c", "d", "e"], "m", chunk_size=2)
    assert [result.text for result in results if isinstance(result, GenerationResult)] == [
        (await FakeProvider().generate(prompt, "m")).text for prompt in "abcde"
    ]
    chunks = [{"a", "b"}, {"c", "d"}, {"e"}]
    position = {event: index for index, event in enumerate(events)}
    for earlier, later in itertools.pairwise(chunks):
        assert max(position[f"end {p}"] for p in earlier) < min(position[f"start {p}"] for p in later)


async def test_a_failing_chunk_with_raise_stops_the_chunks_after_it() -> None:
    provider = Scripted()
    provider.hanging.set()
    provider.proceed.set()
    with pytest.raises(ProviderError, match="fail 1"):
        await provider.generate_batch(["a", "fail 1", "b", "c"], "m", chunk_size=2, on_error="raise")
    assert provider.started == ["a", "fail 1"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"on_error": "ignore"}, "on_error must be 'return', 'raise' or 'warn', got 'ignore'"),
        ({"chunk_size": 0}, "chunk_size must be a positive integer or None, got 0"),
        ({"chunk_size": True}, "chunk_size must be a positive integer or None"),
        ({"max_concurrency": 0}, "max_concurrency must be a positive integer, got 0"),
    ],
)
async def test_bad_policies_are_refused_before_anything_runs(arguments: dict[str, object], message: str) -> None:
    provider = Scripted()
    with pytest.raises(InvalidRequestError, match=message):
        await provider.generate_batch(["a"], "m", **arguments)  # type: ignore[arg-type]
    assert provider.started == []


async def test_score_batch_takes_the_same_policies() -> None:
    class FailingScore(FakeProvider):
        async def _score(self, request: ScoreRequest) -> ScoreResult:
            if request.continuation == " bad":
                raise ProviderError("scoring failed", provider=self.name)
            return await super()._score(request)

    provider = FailingScore()
    pairs = [("a", " b"), ("a", " bad"), ("c", " d")]
    results = await provider.score_batch(pairs, "m", chunk_size=1)
    assert isinstance(results[1], ProviderError) and isinstance(results[2], ScoreResult)
    with pytest.raises(ProviderError, match="scoring failed"):
        await provider.score_batch(pairs, "m", on_error="raise", chunk_size=1)


async def test_cancelling_a_batch_stops_its_requests_before_the_cancellation_returns() -> None:
    provider = Scripted()
    task = asyncio.create_task(provider.generate_batch(["hang 1", "hang 2"], "m"))
    await provider.hanging.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(provider.cancelled) == ["hang 1", "hang 2"]
