"""Token level: tokenize/detokenize, full next-token distributions batched across concurrent calls, the prefix
cache's contract, generation from token ids and generated ids out, all on the fake provider (and the base class)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import inference
from inference._core.validation import GenerationRequest, TokenRequest
from inference.exceptions import (
    AdapterNotFoundError,
    InvalidRequestError,
    TokenLimitError,
    UnsupportedOperationError,
)
from inference.fake_provider import FakeProvider
from inference.provider import InferenceProvider
from inference.results import GenerationResult
from inference.sync import close_all_sync_providers, get_sync_provider
from inference.tokens import TokenCacheStats, TokenIds, TokenVocabulary

BOS = 1


def _logsumexp(row: np.ndarray) -> float:
    finite = row[np.isfinite(row)].astype(np.float64)
    peak = finite.max()
    return float(peak + np.log(np.exp(finite - peak).sum()))


class Recording(FakeProvider):
    """A fake provider that records each batch its backend hook receives."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches: list[list[TokenRequest]] = []

    async def _next_token_logprobs(self, requests: list[TokenRequest]) -> Any:
        self.batches.append(list(requests))
        return await super()._next_token_logprobs(requests)


# tokenize / detokenize ------------------------------------------------------------------------------------


async def test_tokenize_adds_no_special_token_reads_special_text_as_the_token_and_round_trips() -> None:
    fake = FakeProvider()
    vocabulary = await fake.token_vocabulary("m")
    assert isinstance(vocabulary, TokenVocabulary) and vocabulary.size == 259 == len(vocabulary.token_bytes)
    assert (vocabulary.bos_id, vocabulary.eos_id, vocabulary.adds_bos) == (1, 2, False)
    ids = await fake.tokenize("Hé<eos>!", "m")
    assert ids == [3 + ord("H"), 3 + 0xC3, 3 + 0xA9, vocabulary.eos_id, 3 + ord("!")]  # no BOS; <eos> is one token
    assert all(type(token) is int for token in ids)
    assert await fake.detokenize(ids, "m") == "Hé<eos>!"
    assert await fake.detokenize(ids[:2], "m") == "H\ufffd"  # half a character
    assert await fake.detokenize([], "m") == ""
    assert b"".join(vocabulary.token_bytes[token] for token in ids) == "Hé<eos>!".encode()


async def test_tokenize_and_detokenize_refuse_bad_input_with_sentences() -> None:
    fake = FakeProvider()
    with pytest.raises(InvalidRequestError, match="text must be a string"):
        await fake.tokenize(b"bytes", "m")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="lone surrogate"):
        await fake.tokenize("\ud800", "m")
    with pytest.raises(TokenLimitError, match=r"token_ids\[1\] is 300, outside the model's vocabulary of 259"):
        await fake.detokenize([5, 300], "m")
    with pytest.raises(InvalidRequestError, match="token_ids must be a list of token ids"):
        await fake.detokenize(np.array(5), "m")  # type: ignore[arg-type]  # one id, not a list (was a raw TypeError)
    assert await fake.tokenize("ok", "m") == [3 + ord("o"), 3 + ord("k")]  # still serving
    for empty in ([], (), np.array([], dtype=np.int64), iter([])):  # no ids are no text, however they come
        assert await fake.detokenize(empty, "m") == ""  # type: ignore[arg-type]


# next_token_logprobs ------------------------------------------------------------------------------------


async def test_a_distribution_is_float32_over_the_whole_vocabulary_normalized_and_reproducible() -> None:
    row = await FakeProvider().next_token_logprobs([BOS, 10, 11], "m")
    assert isinstance(row, np.ndarray) and row.dtype == np.float32 and row.shape == (259,)
    assert abs(_logsumexp(row)) < 1e-4
    again = await FakeProvider().next_token_logprobs(np.array([BOS, 10, 11]), "m")  # another provider, numpy ids
    np.testing.assert_array_equal(row, again)
    other = await FakeProvider().next_token_logprobs([BOS, 10, 12], "m")
    assert not np.array_equal(row, other)


async def test_batch_rows_are_the_single_calls_rows_in_order() -> None:
    fake = FakeProvider()
    sequences = [[BOS], [BOS, 7], [BOS, 7, 8], [BOS, 9]]
    rows = await fake.batch_next_token_logprobs(sequences, "m")
    assert rows.shape == (4, 259) and rows.dtype == np.float32
    for row, sequence in zip(rows, sequences, strict=True):
        np.testing.assert_array_equal(row, await FakeProvider().next_token_logprobs(sequence, "m"))
    empty = await fake.batch_next_token_logprobs([], "m")
    assert empty.shape == (0, 259) and empty.dtype == np.float32


async def test_concurrent_calls_reach_the_backend_as_one_batch_with_mixed_adapters() -> None:
    fake = Recording()
    await fake.load_adapter("a", "/adapters/a")
    calls = [fake.next_token_logprobs([BOS, 10 + particle], "m") for particle in range(32)]
    calls.append(fake.next_token_logprobs([BOS, 99], "m", adapter_id="a"))
    calls.append(fake.batch_next_token_logprobs([[BOS, 1], [BOS, 2]], "m", adapter_id="a"))
    answers = await asyncio.gather(*calls)
    assert len(fake.batches) == 1 and len(fake.batches[0]) == 35
    assert {request.adapter_id for request in fake.batches[0]} == {None, "a"}
    alone = FakeProvider()
    await alone.load_adapter("a", "/adapters/a")
    np.testing.assert_array_equal(answers[32], await alone.next_token_logprobs([BOS, 99], "m", adapter_id="a"))
    np.testing.assert_array_equal(answers[5], await alone.next_token_logprobs([BOS, 15], "m"))
    assert answers[33].shape == (2, 259)


async def test_an_adapter_changes_the_distribution_and_an_unknown_one_is_refused() -> None:
    fake = FakeProvider()
    await fake.load_adapter("a", "/adapters/a")
    base = await fake.next_token_logprobs([BOS, 5], "m")
    adapted = await fake.next_token_logprobs([BOS, 5], "m", adapter_id="a")
    assert not np.array_equal(base, adapted) and abs(_logsumexp(adapted)) < 1e-4
    with pytest.raises(AdapterNotFoundError, match="load_adapter first"):
        await fake.next_token_logprobs([BOS, 5], "m", adapter_id="b")
    with pytest.raises(UnsupportedOperationError, match="supports_adapter_scales"):
        await fake.next_token_logprobs([BOS, 5], "m", adapter_id=[("a", 0.5)])


async def test_scales_go_through_the_lifecycle_where_the_provider_takes_them() -> None:
    class Scaled(FakeProvider):
        supports_adapter_scales = True

    fake = Scaled()
    await fake.load_adapter("a", "/adapters/a")
    await fake.load_adapter("b", "/adapters/b")
    base = await fake.next_token_logprobs([BOS, 5], "m")
    plain = await fake.next_token_logprobs([BOS, 5], "m", adapter_id="a")
    np.testing.assert_allclose(await fake.next_token_logprobs([BOS, 5], "m", adapter_id=("a", 0.0)), base, atol=1e-6)
    np.testing.assert_allclose(await fake.next_token_logprobs([BOS, 5], "m", adapter_id=("a", 1.0)), plain, atol=1e-6)
    both = await fake.next_token_logprobs([BOS, 5], "m", adapter_id=[("a", 1.0), ("b", 0.5)])
    assert not np.allclose(both, plain)
    assert fake.adapter_stats().get("b").last_used is not None  # held through the lifecycle


async def test_a_replaced_adapter_answers_with_its_new_weights_never_a_cached_prefix_of_the_old() -> None:
    fake = FakeProvider()
    await fake.load_adapter("a", "/adapters/old")
    prefix = [BOS, 20, 21, 22]
    old = await fake.next_token_logprobs(prefix, "m", adapter_id="a")
    await fake.next_token_logprobs([*prefix, 23], "m", adapter_id="a")  # the old weights' prefixes are cached
    await fake.load_adapter("a", "/adapters/new", replace=True)
    new = await fake.next_token_logprobs(prefix, "m", adapter_id="a")
    fresh = FakeProvider()
    await fresh.load_adapter("a", "/adapters/new")
    np.testing.assert_array_equal(new, await fresh.next_token_logprobs(prefix, "m", adapter_id="a"))
    assert not np.array_equal(new, old)
    await fake.unload_adapter("a")
    await fake.load_adapter("a", "/adapters/old")  # the old path again: the old numbers, computed anew
    hits = fake.cache_stats().hits
    np.testing.assert_array_equal(await fake.next_token_logprobs(prefix, "m", adapter_id="a"), old)
    assert fake.cache_stats().hits == hits  # unloading dropped that adapter's cached prefixes


async def test_the_cache_costs_one_token_per_extension_and_gives_the_same_arrays_as_no_cache() -> None:
    cached, uncached = FakeProvider(), FakeProvider(prefix_cache_tokens=0)
    prefix = [BOS, *range(10, 74)]
    rows = [await cached.next_token_logprobs(prefix, "m")]
    before = cached.cache_stats()
    assert (before.misses, before.computed_tokens, before.cached_tokens) == (1, 65, 65)
    rows.append(await cached.next_token_logprobs([*prefix, 5], "m"))
    after = cached.cache_stats()
    assert (after.hits, after.reused_tokens, after.computed_tokens - before.computed_tokens) == (1, 65, 1)
    assert after.enabled and after.hit_rate == 0.5
    for row, sequence in zip(rows, [prefix, [*prefix, 5]], strict=True):
        np.testing.assert_allclose(row, await uncached.next_token_logprobs(sequence, "m"), atol=1e-5)
    off = uncached.cache_stats()
    assert not off.enabled and off.hits == 0 and off.computed_tokens == 65 + 66 and off.cached_tokens == 0


async def test_clear_cache_forgets_every_prefix_and_the_capacity_evicts_the_least_recently_used() -> None:
    fake = FakeProvider(prefix_cache_tokens=8)
    first = await fake.next_token_logprobs([BOS, 3, 4, 5], "m")
    await fake.next_token_logprobs([BOS, 6, 7, 8, 9, 10], "m")  # 4 + 5 new tokens: the oldest leaf evicted
    stats = fake.cache_stats()
    assert stats.cached_tokens == 8 and stats.evictions == 1 and stats.capacity_tokens == 8
    await fake.next_token_logprobs([BOS, 3, 4, 5], "m")
    assert fake.cache_stats().reused_tokens - stats.reused_tokens == 3  # [BOS, 3, 4] was left of it
    fake.clear_cache()
    assert fake.cache_stats().cached_tokens == 0
    np.testing.assert_array_equal(await fake.next_token_logprobs([BOS, 3, 4, 5], "m"), first)
    assert fake.cache_stats().misses == 2  # the first call, and this one
    assert InferenceProvider.cache_stats(FakeProvider(prefix_cache_tokens=0)) == TokenCacheStats(capacity_tokens=0)


@pytest.mark.parametrize(
    ("token_ids", "error", "message"),
    [
        ([], InvalidRequestError, r"token_ids is empty: give at least one token.*BOS token"),
        ("hello", InvalidRequestError, r"token_ids must be a list of token ids \(integers\), got str"),
        (np.array(5), InvalidRequestError, r"token_ids must be a list of token ids \(integers\), got ndarray"),
        ([BOS, True], InvalidRequestError, r"token_ids\[1\] is True: token ids are integers"),
        ([BOS, 2.0], InvalidRequestError, r"token_ids\[1\] is float 2.0, not an integer token id"),
        ([BOS, -1], InvalidRequestError, r"token_ids\[1\] is -1: token ids are 0 or more"),
        ([BOS, 259], TokenLimitError, r"token_ids\[1\] is 259, outside the model's vocabulary of 259 ids \(0 to 258\)"),
        ([BOS] * 17, TokenLimitError, r"token_ids is 17 tokens, more than the model's context of 16 tokens"),
    ],
)
async def test_bad_token_ids_are_typed_errors_naming_the_limit_and_the_provider_keeps_serving(
    token_ids: Any, error: type[Exception], message: str
) -> None:
    fake = Recording(context_length=16)
    with pytest.raises(error, match=message) as caught:
        await fake.next_token_logprobs(token_ids, "m")
    assert fake.batches == []  # refused before the backend
    if isinstance(caught.value, TokenLimitError):
        assert caught.value.limit in (16, 259) and caught.value.kind in ("context", "vocabulary")
    assert (await fake.next_token_logprobs([BOS] * 16, "m")).shape == (259,)


async def test_a_bad_sequence_in_a_batch_names_its_index() -> None:
    with pytest.raises(TokenLimitError, match=r"token_ids_list\[2\]\[0\] is 999"):
        await FakeProvider().batch_next_token_logprobs([[BOS], [BOS, 4], [999]], "m")
    with pytest.raises(InvalidRequestError, match="token_ids_list must be a list of token id lists"):
        await FakeProvider().batch_next_token_logprobs("abc", "m")  # type: ignore[arg-type]


async def test_a_backend_refusal_in_a_shared_batch_reaches_only_the_caller_whose_input_it_was() -> None:
    class Picky(Recording):
        async def _next_token_logprobs(self, requests: list[TokenRequest]) -> Any:
            if any(42 in request.token_ids for request in requests):
                self.batches.append(list(requests))
                raise InvalidRequestError("the backend refuses token 42", provider=self.name)
            return await super()._next_token_logprobs(requests)

    fake = Picky()
    answers = await asyncio.gather(
        fake.next_token_logprobs([BOS, 5], "m"),
        fake.next_token_logprobs([BOS, 42], "m"),
        fake.next_token_logprobs([BOS, 6], "m"),
        return_exceptions=True,
    )
    assert isinstance(answers[1], InvalidRequestError) and "token 42" in str(answers[1])
    assert isinstance(answers[0], np.ndarray) and isinstance(answers[2], np.ndarray)
    assert [len(batch) for batch in fake.batches] == [3, 1, 1, 1]  # together, then each caller on its own


async def test_a_cancelled_caller_keeps_its_adapter_loaded_until_the_backend_is_done_with_it() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    class Slow(FakeProvider):
        async def _next_token_logprobs(self, requests: list[TokenRequest]) -> Any:
            started.set()
            await release.wait()
            return await super()._next_token_logprobs(requests)

    fake = Slow()
    await fake.load_adapter("a", "/adapters/a")
    call = asyncio.ensure_future(fake.next_token_logprobs([BOS, 5], "m", adapter_id="a"))
    await started.wait()
    call.cancel()
    unload = asyncio.ensure_future(fake.unload_adapter("a"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not unload.done() and fake.resident_adapters == ["a"]  # the backend still computes with it
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    await unload
    assert fake.resident_adapters == []



async def test_a_caller_cancelled_in_a_batch_the_backend_refuses_is_cancelled_and_frees_its_adapter() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    class Picky(FakeProvider):  # refuses a batch holding token 42, once the batch has run a while
        async def _next_token_logprobs(self, requests: list[TokenRequest]) -> Any:
            started.set()
            await release.wait()
            if any(42 in request.token_ids for request in requests):
                raise InvalidRequestError("the backend refuses token 42", provider=self.name)
            return await super()._next_token_logprobs(requests)

    fake = Picky()
    await fake.load_adapter("a", "/adapters/a")
    cancelled = asyncio.ensure_future(fake.next_token_logprobs([BOS, 5], "m", adapter_id="a"))
    refused = asyncio.ensure_future(fake.next_token_logprobs([BOS, 42], "m"))
    kept = asyncio.ensure_future(fake.next_token_logprobs([BOS, 6], "m"))
    await started.wait()
    cancelled.cancel()
    release.set()
    await asyncio.wait([cancelled], timeout=60)  # a guard: it used to wait for ever (the retries skipped it)
    assert cancelled.cancelled()
    with pytest.raises(InvalidRequestError, match="token 42"):
        await refused
    assert (await kept).shape == (259,)
    await fake.unload_adapter("a")  # nothing holds the adapter any more
    assert fake.resident_adapters == []

async def test_a_caller_cancelled_before_its_batch_starts_is_left_out() -> None:
    fake = Recording()
    kept = asyncio.ensure_future(fake.next_token_logprobs([BOS, 5], "m"))
    dropped = asyncio.ensure_future(fake.next_token_logprobs([BOS, 6], "m"))
    await asyncio.sleep(0)  # both have joined the open batch
    dropped.cancel()
    assert (await kept).shape == (259,)
    with pytest.raises(asyncio.CancelledError):
        await dropped
    assert [[request.token_ids for request in batch] for batch in fake.batches] == [[(BOS, 5)]]


async def test_providers_without_token_level_support_refuse_naming_who_can() -> None:
    class Plain(InferenceProvider):
        name = "plain"

        async def _generate(self, request: GenerationRequest) -> GenerationResult:
            raise AssertionError("never reached")

    plain = Plain()
    for call in (
        plain.next_token_logprobs([BOS], "m"),
        plain.batch_next_token_logprobs([[BOS]], "m"),
        plain.tokenize("x", "m"),
        plain.detokenize([1], "m"),
        plain.token_vocabulary("m"),
        plain.generate(TokenIds([BOS]), "m"),
    ):
        with pytest.raises(UnsupportedOperationError, match=r"providers that can: .*fake"):
            await call
    assert plain.cache_stats() == TokenCacheStats()
    plain.clear_cache()  # nothing cached: nothing to do


# generation from token ids, token ids out -----------------------------------------------------------------


async def test_generate_and_stream_take_token_ids_and_give_the_generated_ids() -> None:
    fake = FakeProvider()
    prompt = TokenIds([BOS, *await fake.tokenize("Hello", "m")])
    result = await fake.generate(prompt, "m", max_tokens=5, return_token_ids=True)
    assert result.prompt_tokens == 6 and result.token_ids is not None
    assert await fake.detokenize(result.token_ids, "m") == result.text
    assert result == await FakeProvider().generate(prompt, "m", max_tokens=5, return_token_ids=True)
    assert (await fake.generate(prompt, "m", max_tokens=5)).token_ids is None
    assert (await fake.generate("Hello", "m", max_tokens=5)).text != result.text  # ids are not the text
    events = [event async for event in fake.stream(prompt, "m", max_tokens=5, return_token_ids=True)]
    assert events[-1] == result and "".join(event for event in events if isinstance(event, str)) == result.text
    batch = await fake.generate_batch([prompt, "Hello"], "m", max_tokens=5, return_token_ids=True)
    assert batch[0] == result and isinstance(batch[1], GenerationResult) and batch[1].token_ids is not None


async def test_token_prompts_are_checked_and_refused_where_the_provider_cannot_take_them() -> None:
    fake = FakeProvider(context_length=8)
    with pytest.raises(InvalidRequestError, match="system_prompt cannot be combined with a TokenIds prompt"):
        await fake.generate(TokenIds([BOS]), "m", system_prompt="Be brief.")
    with pytest.raises(InvalidRequestError, match=r"prompt.ids is empty"):
        await fake.generate(TokenIds([]), "m")
    with pytest.raises(TokenLimitError, match=r"prompt.ids\[0\] is 1000"):
        await fake.generate(TokenIds([1000]), "m")
    with pytest.raises(InvalidRequestError, match=r"prompt.ids\[1\] is True: token ids are integers"):
        await fake.generate(TokenIds([BOS, True]), "m")  # was read as id 1, as next_token_logprobs refuses it
    with pytest.raises(TokenLimitError, match="more than the 7 tokens the model's context of 8 takes with a token to"):
        await fake.generate(TokenIds([BOS] * 8), "m")
    with pytest.raises(InvalidRequestError, match="prompts must be a list of prompts"):
        await fake.generate_batch(TokenIds([BOS]), "m")  # type: ignore[arg-type]

    class NoTokenPrompts(FakeProvider):
        supports_token_prompts = False
        reached = 0

        async def _generate(self, request: GenerationRequest) -> GenerationResult:
            NoTokenPrompts.reached += 1
            return await super()._generate(request)

    with pytest.raises(UnsupportedOperationError, match=r"TokenIds prompt.*providers that can: .*fake"):
        await NoTokenPrompts().generate(TokenIds([BOS]), "m")
    assert NoTokenPrompts.reached == 0
    assert TokenIds(np.array([1, 2])).ids == (1, 2) and len(TokenIds([1])) == 1


def test_the_token_level_names_are_public() -> None:
    assert inference.TokenIds is TokenIds and inference.TokenVocabulary is TokenVocabulary
    assert inference.TokenCacheStats is TokenCacheStats and inference.TokenLimitError is TokenLimitError
    assert issubclass(TokenLimitError, InvalidRequestError)
    for flag in ("supports_tokenize", "supports_next_token_logprobs", "supports_token_prompts"):
        assert getattr(InferenceProvider, flag) is False and getattr(FakeProvider, flag) is True


def test_the_sync_facade_has_the_token_level_calls() -> None:
    try:
        with get_sync_provider("fake") as fake:
            ids = fake.tokenize("Hi", "m")
            row = fake.next_token_logprobs([BOS, *ids], "m")
            assert row.shape == (259,) and fake.cache_stats().misses == 1
    finally:
        close_all_sync_providers()


def test_the_command_line_prints_the_generated_ids_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from inference.cli import main

    assert main(["generate", "Hi", "--provider", "fake", "--max-tokens", "3", "--return-token-ids", "true",
                 "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert bytes(token - 3 for token in answer["token_ids"]).decode() == answer["text"]
    assert main(["generate", "Hi", "--provider", "fake", "--max-tokens", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] is None
