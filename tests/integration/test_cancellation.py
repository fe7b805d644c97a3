"""Cancelling a call stops its work in the in-process backends, within a token (issue 9, item 2).

A cancelled ``generate`` (``asyncio.wait_for`` timing out) or ``generate_batch`` must free the model's worker
thread at once: the next request must not queue behind generation nobody waits for. No test here reads a clock:
the caller gives up at a state, not after some seconds. At the long request's 5th token the worker thread asks
the event loop to cancel the caller and waits until the caller is gone (its cancel flag is set); the cancelled
work must then stop at that token (before the fix it ran on to its ``max_tokens``), and the next request must
give its usual answer, on any machine, idle or busy.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.provider import GenerationResult

pytestmark = [
    pytest.mark.integration,
    # PEFT 0.21 calls a property that transformers 5 deprecated; not ours to fix.
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = "Once upon a time"
SHORT = 8
GIVE_UP_AT = 5  # the long request's token at which its caller gives up


class GiveUp:
    """The caller of a watched call gives up at its :data:`GIVE_UP_AT`-th token, as seen by the worker thread.

    The worker thread calls :meth:`reached` after each token of the long request; at the chosen one it has the
    event loop cancel the caller's task and waits until that task is done, so the request's cancel flag is set
    before the worker goes on: where the work stops depends on the code, never on how fast the machine is.
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.watched: tuple[asyncio.Task[Any], threading.Event] | None = None  # replaced whole, never cleared

    def watch(self, call: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run ``call`` as the task to cancel (the one watched from now on)."""
        async def run() -> Any:
            return await call

        task, gone = asyncio.create_task(run()), threading.Event()
        task.add_done_callback(lambda _: gone.set())
        self.watched = (task, gone)
        return task

    def reached(self, tokens: int) -> None:  # the worker thread
        watched = self.watched
        if tokens == GIVE_UP_AT and watched is not None and not watched[1].is_set():
            task, gone = watched
            self.loop.call_soon_threadsafe(task.cancel)
            assert gone.wait(120), "the caller's task was not cancelled"

    async def gave_up(self) -> None:
        """Await the watched task, which must end cancelled."""
        assert self.watched is not None
        with pytest.raises(asyncio.CancelledError):
            await self.watched[0]


# llama.cpp ----------------------------------------------------------------------------------------------

LLAMA_LONG = 3000  # the tiny model never ends by itself: without the cancel, a request runs to this


@pytest.fixture
async def llamacpp(tiny_models: dict[str, Any], tmp_path: Path) -> AsyncIterator[Any]:
    pytest.importorskip("llama_cpp")
    from inference.llamacpp_provider import LlamaCppProvider

    model = tiny_models["qwen2"]
    async with LlamaCppProvider(
        model.gguf_path, n_ctx=4096, adapter_cache_dir=tmp_path, kv_cache_type="f32", n_threads=1, n_parallel=1
    ) as provider:  # the one-at-a-time path (recorded below); test_llamacpp_batching covers the decode loop
        await provider.load_adapter("a0", model.adapter_dirs["a0"])
        await provider.generate(PROMPT, model="m", adapter_id="a0", max_tokens=SHORT, temperature=0)
        yield provider


def record_llamacpp_jobs(provider: Any, monkeypatch: pytest.MonkeyPatch, give_up: GiveUp) -> list[GenerationResult]:
    """Record every generation the worker thread finishes, cancelled ones included; the long requests' tokens
    go to ``give_up``."""
    from inference._inprocess.llamacpp_completion import Completion

    jobs: list[GenerationResult] = []
    real = provider._generate_blocking
    real_add = Completion.add

    def recording(*args: Any) -> GenerationResult:
        result: GenerationResult = real(*args)
        jobs.append(result)
        return result

    def add(self: Completion, token: int, logits: Any = None) -> bool:
        done = real_add(self, token, logits)
        if self.request.max_tokens == LLAMA_LONG:
            give_up.reached(len(self.generated))
        return done

    monkeypatch.setattr(provider, "_generate_blocking", recording)
    monkeypatch.setattr(Completion, "add", add)
    return jobs


def long_llamacpp(provider: Any) -> Any:
    return provider.generate(PROMPT, model="m", adapter_id="a0", max_tokens=LLAMA_LONG, temperature=0)


async def test_llamacpp_a_cancelled_generate_frees_the_worker_within_a_token(
    llamacpp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = await llamacpp.generate(PROMPT, model="m", adapter_id="a0", max_tokens=SHORT, temperature=0)
    give_up = GiveUp()
    jobs = record_llamacpp_jobs(llamacpp, monkeypatch, give_up)

    give_up.watch(long_llamacpp(llamacpp))
    await give_up.gave_up()
    assert llamacpp._adapter_registry.in_flight("a0") == 0  # the cancelled request no longer holds its adapter
    after = await llamacpp.generate(PROMPT, model="m", adapter_id="a0", max_tokens=SHORT, temperature=0)

    assert after.text == expected.text
    cancelled, short = jobs
    # Stopped at the token its caller gave up at; before the fix it ran on to its 3000 tokens.
    assert cancelled.completion_tokens == GIVE_UP_AT
    assert short.completion_tokens == SHORT
    await llamacpp.unload_adapter("a0")  # nothing holds it: unloading does not wait
    assert await llamacpp.list_adapters() == []


async def test_llamacpp_a_cancelled_generate_batch_stops_every_request_in_flight(
    llamacpp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    give_up = GiveUp()
    jobs = record_llamacpp_jobs(llamacpp, monkeypatch, give_up)

    give_up.watch(
        llamacpp.generate_batch(
            [PROMPT, "The quick brown fox", "Hello"], model="m", adapter_id="a0", max_tokens=LLAMA_LONG, temperature=0
        )
    )
    await give_up.gave_up()
    assert llamacpp._adapter_registry.in_flight("a0") == 0
    await llamacpp.generate(PROMPT, model="m", adapter_id="a0", max_tokens=SHORT, temperature=0)

    # Before the fix the request running at the cancel went on to its max_tokens (the queued two were dropped).
    *cancelled, short = jobs  # the cancelled requests that reached the worker, then the short one
    assert short.completion_tokens <= SHORT
    assert 1 <= len(cancelled) <= 3
    assert cancelled[0].completion_tokens == GIVE_UP_AT  # the running request stopped
    # A queued request is dropped, or, when the worker takes it up before the cancel reaches the executor, it
    # returns before its first token.
    assert all(job.completion_tokens <= 1 for job in cancelled[1:])


async def test_llamacpp_a_stream_and_a_generate_cancel_the_same_way(
    llamacpp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One mechanism: a stream whose consumer is cancelled and a generate cancelled both leave the worker free."""
    give_up = GiveUp()
    jobs = record_llamacpp_jobs(llamacpp, monkeypatch, give_up)

    async def consume() -> None:
        async for _ in llamacpp.stream(PROMPT, model="m", adapter_id="a0", max_tokens=LLAMA_LONG, temperature=0):
            pass

    give_up.watch(consume())
    await give_up.gave_up()
    give_up.watch(long_llamacpp(llamacpp))
    await give_up.gave_up()
    await llamacpp.generate(PROMPT, model="m", adapter_id="a0", max_tokens=SHORT, temperature=0)
    assert [job.completion_tokens for job in jobs] == [GIVE_UP_AT, GIVE_UP_AT, SHORT]
    assert llamacpp._adapter_registry.in_flight("a0") == 0


# Transformers -------------------------------------------------------------------------------------------

TF_LONG = 440  # the tiny model's context is 512 tokens


@pytest.fixture
async def transformers_provider(tiny_models: dict[str, Any]) -> AsyncIterator[Any]:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from inference.transformers_provider import TransformersProvider

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = tiny_models["qwen2"]
    try:
        async with TransformersProvider(model_name=str(model.hf_dir), device="cpu", batch_window_ms=100) as provider:
            await provider.load_adapter("a0", model.adapter_dirs["a0"])
            await provider.generate(PROMPT, model="", adapter_id="a0", max_tokens=SHORT, temperature=0)  # warm up
            yield provider
    finally:
        torch.set_num_threads(threads)


def record_batch_steps(provider: Any, monkeypatch: pytest.MonkeyPatch, give_up: GiveUp) -> list[int]:
    """Record how many tokens each ``generate`` ran for (the width of its new tokens, all rows); the tokens of a
    batch with a long row go to ``give_up``."""
    from inference._inprocess.batching import RowsCancelled

    steps: list[int] = []
    real = provider._generate_rows
    real_check = RowsCancelled.__call__
    # Keyed by the criterion itself, not its id(): a finished batch's criterion can be freed and a later one
    # given the same id, whose count would then start past GIVE_UP_AT and never give up.
    calls: dict[RowsCancelled, int] = {}

    def recording(*args: Any, **kwargs: Any) -> Any:
        outputs = real(*args, **kwargs)
        steps.append(len(outputs.tokens[0]))
        return outputs

    def check(self: RowsCancelled, input_ids: Any, scores: Any, **kwargs: Any) -> Any:  # after every token
        if any(entry.request.max_tokens == TF_LONG for entry in self.entries):
            calls[self] = calls.get(self, 0) + 1
            give_up.reached(calls[self])
        return real_check(self, input_ids, scores, **kwargs)

    monkeypatch.setattr(provider, "_generate_rows", recording)
    monkeypatch.setattr(RowsCancelled, "__call__", check)
    return steps


async def test_transformers_a_cancelled_generate_frees_the_worker_within_a_token(
    transformers_provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = transformers_provider
    expected = await provider.generate(PROMPT, model="", adapter_id="a0", max_tokens=SHORT, temperature=0)
    give_up = GiveUp()
    steps = record_batch_steps(provider, monkeypatch, give_up)

    give_up.watch(provider.generate(PROMPT, model="", adapter_id="a0", max_tokens=TF_LONG, temperature=0))
    await give_up.gave_up()
    assert provider._adapter_registry.in_flight("a0") == 0
    after = await provider.generate(PROMPT, model="", adapter_id="a0", max_tokens=SHORT, temperature=0)

    assert after.text == expected.text
    # The cancelled generate stopped at the token its caller gave up at; before the fix it ran to TF_LONG.
    assert steps == [GIVE_UP_AT, SHORT]


async def test_transformers_a_cancelled_row_stops_and_the_rest_of_its_batch_is_unchanged(
    tiny_models: dict[str, Any], transformers_provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inference.transformers_provider import TransformersProvider

    others = [("The quick brown fox", "a0"), ("Where does the river begin?", None)]
    expected = [
        (await transformers_provider.generate(prompt, model="", adapter_id=adapter, max_tokens=24, temperature=0)).text
        for prompt, adapter in others
    ]
    model = tiny_models["qwen2"]
    # Three requests, one batch: the third fills it (the longest window, a minute, does not end it first).
    async with TransformersProvider(
        model_name=str(model.hf_dir), device="cpu", max_batch_size=3, batch_window_ms=60_000
    ) as provider:
        await provider.load_adapter("a0", model.adapter_dirs["a0"])
        give_up = GiveUp()
        steps = record_batch_steps(provider, monkeypatch, give_up)
        give_up.watch(provider.generate(PROMPT, model="", max_tokens=TF_LONG, temperature=0))
        tasks = [
            asyncio.create_task(provider.generate(prompt, model="", adapter_id=adapter, max_tokens=24, temperature=0))
            for prompt, adapter in others
        ]
        results = await asyncio.gather(*tasks)
        await give_up.gave_up()

        assert list(provider.recent_batch_sizes) == [3]  # the three requests did share one batch
        assert [result.text for result in results] == expected  # the other rows are unaffected
        assert steps == [24]  # the batch ended with the other rows, not at the long row's max_tokens


async def test_transformers_a_cancelled_generate_batch_stops_its_requests(
    transformers_provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = transformers_provider
    give_up = GiveUp()
    steps = record_batch_steps(provider, monkeypatch, give_up)

    give_up.watch(
        provider.generate_batch(
            [PROMPT, "Hello, world!", "Knowledge is power"], model="", adapter_id="a0", max_tokens=TF_LONG,
            temperature=0,
        )
    )
    await give_up.gave_up()
    assert provider._adapter_registry.in_flight("a0") == 0
    await provider.generate(PROMPT, model="", adapter_id="a0", max_tokens=SHORT, temperature=0)
    # Before the fix the next request waited for the rest of the cancelled batch: its rows ran to TF_LONG.
    *cancelled, short = steps
    assert cancelled and all(width <= GIVE_UP_AT for width in cancelled)
    assert short == SHORT


async def test_transformers_a_stream_and_a_generate_cancel_the_same_way(
    transformers_provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = transformers_provider
    give_up = GiveUp()
    steps = record_batch_steps(provider, monkeypatch, give_up)

    async def consume() -> None:
        async for _ in provider.stream(PROMPT, model="", adapter_id="a0", max_tokens=TF_LONG, temperature=0):
            pass

    give_up.watch(consume())
    await give_up.gave_up()
    give_up.watch(provider.generate(PROMPT, model="", adapter_id="a0", max_tokens=TF_LONG, temperature=0))
    await give_up.gave_up()
    await provider.generate(PROMPT, model="", adapter_id="a0", max_tokens=SHORT, temperature=0)
    assert steps == [GIVE_UP_AT, GIVE_UP_AT, SHORT]
    assert provider._adapter_registry.in_flight("a0") == 0


# llama.cpp: a cancel during a prompt's decode step ----------------------------------------------------------


@pytest.mark.parametrize("n_parallel", [4, 1])
async def test_llamacpp_a_request_cancelled_during_its_prompt_stops_inside_llama_decode(
    tiny_models: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n_parallel: int
) -> None:
    """The caller gives up while a long prompt's chunk (up to n_batch tokens: seconds on a busy CPU) is being
    decoded: llama.cpp aborts that decode, so the next request does not wait for the rest of the chunk.

    The decode is held until the caller's cancellation has reached the worker (no timing): before the fix
    llama_decode computed the whole chunk (it returned 0); now it returns 2, aborted, and the cells are free.
    """
    llama_cpp = pytest.importorskip("llama_cpp")
    from inference.llamacpp_provider import LlamaCppProvider

    model = tiny_models["qwen2"]
    async with LlamaCppProvider(
        model.gguf_path, n_ctx=4096, adapter_cache_dir=tmp_path, kv_cache_type="f32", n_parallel=n_parallel
    ) as provider:
        expected = await provider.generate("Hello", model="m", max_tokens=SHORT, temperature=0)
        loop = asyncio.get_running_loop()
        gave_up = threading.Event()
        decoded: list[tuple[int, int]] = []  # (tokens in the step, what llama_decode returned)
        real = llama_cpp.llama_decode
        long_call: asyncio.Task[Any] | None = None

        def decode(ctx: Any, batch: Any) -> int:  # the worker thread
            if batch.n_tokens > 100 and long_call is not None and not gave_up.is_set():  # the long prompt's step
                loop.call_soon_threadsafe(long_call.cancel)
                assert gave_up.wait(120)  # its caller has given up before llama.cpp computes the chunk
            code = int(real(ctx, batch))
            decoded.append((int(batch.n_tokens), code))
            return code

        monkeypatch.setattr(llama_cpp, "llama_decode", decode)  # the decode loop's module
        monkeypatch.setattr(llama_cpp.llama_cpp, "llama_decode", decode)  # Llama.generate's (n_parallel=1)
        long_call = asyncio.create_task(
            provider.generate("word " * 1500, model="m", max_tokens=400, temperature=0)
        )
        long_call.add_done_callback(lambda _: gave_up.set())
        with pytest.raises(asyncio.CancelledError):
            await long_call
        after = await provider.generate("Hello", model="m", max_tokens=SHORT, temperature=0)

    prompt_steps = [code for tokens, code in decoded if tokens > 100]
    assert prompt_steps == [2]  # aborted inside llama_decode; the prompt's later chunks were never decoded
    assert after.text == expected.text  # what the aborted step left in the KV cache was removed
    if n_parallel > 1:
        assert provider._batcher is not None and provider._batcher.aborted_steps == 1


async def test_llamacpp_n_threads_bounds_the_prompt_decodes_too(tiny_models: dict[str, Any], tmp_path: Path) -> None:
    """``n_threads`` is every llama.cpp thread: llama-cpp-python gave prompts (and batched steps) all the CPUs
    whatever it said, and on a busy machine such a step's threads spin-wait for each other (seconds)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from inference.llamacpp_provider import LlamaCppProvider

    for n_parallel in (1, 4):
        async with LlamaCppProvider(
            tiny_models["qwen2"].gguf_path, n_ctx=512, adapter_cache_dir=tmp_path, n_threads=1, n_parallel=n_parallel
        ) as provider:
            await provider.generate("Hello", model="m", max_tokens=1)
            context = provider._llama.ctx
            assert (llama_cpp.llama_n_threads(context), llama_cpp.llama_n_threads_batch(context)) == (1, 1)


# Server streams (llama.cpp's own llama-server) --------------------------------------------------------------


@pytest.fixture
def llama_server_process(tiny_models: dict[str, Any], tmp_path: Path) -> Iterator[Any]:
    """A real ``llama-server`` on the tiny Qwen2 (skipped without ``make llama-server``)."""
    from test_llamacpp_server_provider import LlamaCppServer, require_llama_server

    server = LlamaCppServer(require_llama_server(), tiny_models["qwen2"].gguf_path, [], tmp_path / "server.log")
    yield server
    server.stop()


async def cancel_twice(stream: AsyncIterator[Any], steps: int) -> None:
    """Consume ``stream`` in a task; at its first piece cancel the task, and cancel it again ``steps`` event-loop
    steps later, while the first cancellation is still closing the stream (a consumer cancelled again, a timeout
    striking during the clean-up)."""
    first_piece = asyncio.Event()

    async def consume() -> None:
        async for _ in stream:
            first_piece.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_piece.wait(), 120)
    task.cancel()
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 120)


SECOND_CANCEL_STEPS = range(6)  # before the fix, the second cancellation after 1 step left the connection half closed


async def test_llamacpp_server_a_stream_cancelled_twice_leaves_its_connection_usable(
    llama_server_process: Any,
) -> None:
    """The llamacpp-server provider sends a request and its adapter list over one kept connection. A second
    cancellation during the first one's close used to leave that connection counted as in use: the next call waited
    the whole timeout for it (``ProviderTimeoutError: ... did not answer within 5 s (list the server's LoRA
    adapters)``). The next call must now be answered."""
    from inference.llamacpp_server_provider import LlamaCppServerProvider

    async with LlamaCppServerProvider(base_url=llama_server_process.url, max_retries=0, timeout=5) as provider:
        for steps in SECOND_CANCEL_STEPS:
            await cancel_twice(provider.stream(PROMPT, model="tiny", max_tokens=400, temperature=0), steps)
            result = await provider.generate(PROMPT, model="tiny", max_tokens=SHORT, temperature=0)
            assert result.completion_tokens == SHORT, steps


async def test_openai_a_stream_cancelled_twice_closes_its_connection(llama_server_process: Any) -> None:
    """Through the pooled client, a second cancellation during the first one's close used to leave the connection
    open and counted as in use: the server went on generating for nobody, and enough such streams exhausted the pool
    (``ProviderTimeoutError`` from httpx's pool timeout). The connection must now be closed."""
    from test_http_faults import connection_open_to, wait_for

    from inference.openai_provider import OpenAIProvider

    for steps in SECOND_CANCEL_STEPS:
        async with OpenAIProvider(base_url=f"{llama_server_process.url}/v1", max_retries=0, timeout=5) as provider:
            await cancel_twice(provider.stream(PROMPT, model="tiny", max_tokens=400, temperature=0), steps)
            await wait_for(lambda: not connection_open_to(llama_server_process.port), f"closed ({steps} steps)", 20)
