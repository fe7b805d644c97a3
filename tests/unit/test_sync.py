"""The sync facade: every provider method, synchronous, from a script, inside a running loop, after fork."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import inference
from inference._core.validation import GenerationRequest
from inference.exceptions import AdapterNotFoundError, InvalidRequestError
from inference.fake_provider import FakeProvider
from inference.provider import InferenceProvider
from inference.results import GenerationResult, StreamEvent
from inference.sync import (
    SyncProvider,
    close_all_sync_providers,
    get_sync_provider,
    get_sync_provider_for_step,
    run_sync,
    wrap,
)


@pytest.fixture(autouse=True)
def _no_sync_providers_left() -> Iterator[None]:
    yield
    close_all_sync_providers()


def _run_script(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )


def _exits(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run to its end in a new interpreter; a test fails (rather than hangs) if the interpreter never exits."""
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the interpreter did not exit: it waited at exit for the sync facade's event loop")


def test_a_plain_script_gets_every_answer_the_async_provider_gives() -> None:
    done = _run_script(
        """
        import asyncio
        from inference import get_provider, get_sync_provider

        provider = get_sync_provider("fake")
        provider.load_adapter("style", "/adapters/style")
        text = provider.generate("Hi", model="m", adapter_id="style", max_tokens=3).text
        events = list(provider.stream("Hi", model="m", max_tokens=3))
        scored = provider.score("The sky is", " blue", model="m")

        async def expected():
            async with get_provider("fake") as twin:
                await twin.load_adapter("style", "/adapters/style")
                return (
                    (await twin.generate("Hi", model="m", adapter_id="style", max_tokens=3)).text,
                    [event async for event in twin.stream("Hi", model="m", max_tokens=3)],
                    await twin.score("The sky is", " blue", model="m"),
                )

        assert (text, events, scored) == asyncio.run(expected()), (text, events, scored)
        assert provider.list_adapters() == ["style"]
        print("ok", text)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok [style]")
    assert done.stderr == ""


def test_it_works_inside_a_running_event_loop_as_in_a_notebook() -> None:
    provider = get_sync_provider("fake")

    async def notebook_cell() -> str:
        # asyncio.run() would be refused here; the facade's own loop thread is not.
        return provider.generate("Hello", model="m", max_tokens=2).text

    assert asyncio.run(notebook_cell()) == "[base] yankee romeo"


def test_same_settings_give_the_same_sync_provider_and_not_the_async_one() -> None:
    first = get_sync_provider("fake")
    assert get_sync_provider("fake") is first
    assert get_sync_provider_for_step({"provider": "fake"}) is first
    assert first.provider is not inference.get_provider("fake")
    first.close()
    assert get_sync_provider("fake") is not first  # a closed one is replaced, as get_provider does


def test_a_provider_closed_by_its_own_aclose_is_replaced(
    tiny_models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``aclose()`` through the facade closes an in-process provider: the next ``get_sync_provider`` makes a new one,
    as ``get_provider`` does, rather than hand back one whose every call fails."""
    monkeypatch.setenv("LLAMACPP_MODEL_PATH", str(tiny_models["qwen2"].gguf_path))
    closed = get_sync_provider("llamacpp")
    closed.aclose()
    assert closed.provider.closed
    fresh = get_sync_provider("llamacpp")
    assert fresh is not closed and fresh.generate("Hi", model="m", max_tokens=2).completion_tokens > 0


def test_a_close_that_failed_leaves_the_provider_open_for_a_later_close(
    tiny_models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close()`` from a callback on the facade's loop is refused: the provider is not closed then, and the next
    ``close()`` (or ``close_all_sync_providers``, or the one at exit) frees it."""
    monkeypatch.setenv("LLAMACPP_MODEL_PATH", str(tiny_models["qwen2"].gguf_path))
    provider = get_sync_provider("llamacpp")
    refused: list[BaseException] = []

    def on_result(index: int, item: GenerationResult | Exception) -> None:
        try:
            provider.close()
        except RuntimeError as error:
            refused.append(error)

    provider.generate_batch(["a"], model="m", max_tokens=1, on_result=on_result)
    assert len(refused) == 1 and not provider.provider.closed
    close_all_sync_providers()
    assert provider.provider.closed


def test_errors_are_the_provider_s_own_and_it_keeps_serving() -> None:
    provider = get_sync_provider("fake")
    with pytest.raises(InvalidRequestError, match="temperature"):
        provider.generate("Hi", model="m", temperature=-1)
    with pytest.raises(AdapterNotFoundError):
        provider.generate("Hi", model="m", adapter_id="missing")
    with pytest.raises(TypeError):
        provider.generate("Hi", model="m", no_such_option=1)
    assert provider.generate("Hi", model="m", max_tokens=1).finish_reason == "length"


def test_every_async_method_of_the_contract_is_there_synchronously() -> None:
    provider = get_sync_provider("fake")
    names = [
        name
        for name, member in inspect.getmembers(InferenceProvider)
        if not name.startswith("_") and (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member))
    ]
    assert {"generate", "stream", "generate_batch", "score", "load_adapter", "unload_adapter"} <= set(names)
    for name in names:
        method = getattr(provider, name)
        assert callable(method) and not inspect.iscoroutinefunction(method), name
        assert inspect.signature(method) == inspect.signature(getattr(provider.provider, name)), name
    assert provider.supports_adapters is True
    assert provider.adapter_stats().adapters == ()


class _RecordingProvider(FakeProvider):
    """Streams forever until closed, and records that its stream was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closed_streams = 0
        self.started = asyncio.Event()

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        try:
            while True:
                yield "word "
                await asyncio.sleep(0)
        finally:
            self.closed_streams += 1


def test_leaving_a_stream_early_stops_the_generation() -> None:
    provider = wrap(_RecordingProvider())
    with provider.stream("Hi", model="m") as events:
        for index, _ in enumerate(events):
            if index == 5:
                break
    recorder = provider.provider
    assert isinstance(recorder, _RecordingProvider)
    assert recorder.closed_streams == 1
    assert provider.generate("Hi", model="m", max_tokens=2).text  # still serving


def test_a_sync_call_from_a_callback_on_the_facade_loop_is_refused_not_deadlocked() -> None:
    provider = get_sync_provider("fake")
    seen: list[BaseException] = []

    def on_result(index: int, item: GenerationResult | Exception) -> None:
        try:
            provider.generate("again", model="m", max_tokens=1)
        except RuntimeError as error:
            seen.append(error)

    results = provider.generate_batch(["a", "b"], model="m", max_tokens=1, on_result=on_result)
    assert all(isinstance(result, GenerationResult) for result in results)
    assert len(seen) == 2 and "own event loop" in str(seen[0])


def test_run_sync_runs_any_coroutine_of_the_sdk() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run_sync(answer()) == 42


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_its_own_loop_and_provider() -> None:
    done = _run_script(
        """
        import os
        from inference import get_sync_provider

        provider = get_sync_provider("fake")
        provider.load_adapter("style", "/adapters/style")
        before = provider.generate("Hi", model="m", max_tokens=2).text
        pid = os.fork()
        if pid == 0:
            child = provider.generate("Hi", model="m", max_tokens=2).text  # a new loop thread, a new provider
            os._exit(0 if child == before and provider.list_adapters() == [] else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert provider.list_adapters() == ["style"]  # the parent's provider is untouched
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_has_one_provider_whichever_way_it_asks_for_it() -> None:
    done = _exits(
        """
        import os
        from inference import get_sync_provider

        provider = get_sync_provider("fake")
        provider.load_adapter("style", "/adapters/style")
        pid = os.fork()
        if pid == 0:
            again = get_sync_provider("fake")  # the parent's object, not a second provider (a second model)
            again.load_adapter("child", "/adapters/child")
            print("child", again is provider, provider.list_adapters(), flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("parent", os.waitstatus_to_exitcode(status), provider.list_adapters(), flush=True)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["child True ['child']", "parent 0 ['style']"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_threads_of_a_forked_child_asking_at_once_make_the_provider_again_once() -> None:
    """Each thread made its own provider (a model each for llama.cpp or Transformers), and all but one were lost."""
    done = _exits(
        """
        import os, threading, time
        from inference.fake_provider import FakeProvider
        from inference.sync import SyncProvider

        made = []
        def rebuild():
            time.sleep(0.2)  # a model takes a while to load: long enough for every thread to ask meanwhile
            made.append(FakeProvider())
            return made[-1]

        provider = SyncProvider(FakeProvider(), rebuild=rebuild)
        pid = os.fork()
        if pid == 0:
            seen = []
            threads = [threading.Thread(target=lambda: seen.append(provider.provider)) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            print("child", len(made), len({id(item) for item in seen}), seen[0] is made[0], flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("parent", os.waitstatus_to_exitcode(status), len(made), flush=True)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["child 1 1 True", "parent 0 0"]


def test_an_unclosed_sync_provider_is_closed_at_exit() -> None:
    done = _run_script(
        """
        import sys
        from inference.fake_provider import FakeProvider
        from inference.sync import wrap

        class Noisy(FakeProvider):
            async def aclose(self):
                print("closed", flush=True)

        provider = wrap(Noisy())
        print(provider.generate("Hi", model="m", max_tokens=1).finish_reason, flush=True)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["length", "closed"]


def test_a_stream_left_half_read_at_exit_is_closed_and_the_program_exits() -> None:
    done = _exits(
        """
        from inference import get_sync_provider
        from inference.fake_provider import FakeProvider
        from inference.sync import wrap

        class Recording(FakeProvider):
            async def _stream(self, request):
                try:
                    async for event in super()._stream(request):
                        yield event
                finally:
                    print("stream closed", flush=True)

        provider = get_sync_provider("fake")
        events = provider.stream("Tell me a long story", model="m", max_tokens=50)
        print(next(events).strip() != "", flush=True)
        recorded = wrap(Recording()).stream("Tell me a long story", model="m", max_tokens=50)
        print(next(recorded).strip() != "", flush=True)
        print("exiting", flush=True)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["True", "True", "exiting", "stream closed"]  # closed in the backend
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


def test_a_sync_call_while_the_interpreter_exits_is_refused_not_hung() -> None:
    done = _exits(
        """
        from inference import get_sync_provider

        class LateUser:  # an object of another library that calls the facade when it is collected at exit
            def __init__(self, provider):
                self.provider = provider

            def __del__(self):
                try:
                    self.provider.generate("Hi", model="m", max_tokens=1)
                except RuntimeError as error:
                    print("refused" if "exiting" in str(error) else error, flush=True)

        provider = get_sync_provider("fake")
        print(provider.generate("Hi", model="m", max_tokens=1).finish_reason, flush=True)
        late = LateUser(provider)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["length", "refused"]


def test_a_wrapped_provider_is_refused_after_fork_with_a_sentence() -> None:
    sync = wrap(FakeProvider())
    sync._pid = -1  # as if made in another process
    with pytest.raises(inference.ProviderError, match="before a fork"):
        sync.generate("Hi", model="m")


def test_the_facade_is_exported_lazily() -> None:
    assert inference.get_sync_provider is get_sync_provider
    assert inference.SyncProvider is SyncProvider
