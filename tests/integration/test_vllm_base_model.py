"""A real vLLM server (CPU build) serving a base model without a chat template, and what a crash does to it.

The server serves the head-64 tiny Qwen2 of :mod:`inference.testing.vllm_model` without its chat template, as many
base models are: vLLM refuses chat for it, so the provider must generate through ``/v1/completions`` on its own
(``VLLM_API=auto``), and agree with Transformers + PEFT on the same directory (which then uses the same plain text).
The server is then killed in the middle of a stream and started again on the same port: the stream fails with a
typed error, adapters the provider loaded come back by themselves (self-healing) or through
``reconcile_adapters``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from inference.exceptions import InferenceError, ServerResponseError
from inference.transformers_provider import TransformersProvider
from inference.vllm_provider import VLLMProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

PROMPTS = ["the quick brown fox", "Once upon a time there was"]
MODEL = "base"


@pytest.fixture(scope="module")
def base_server(
    start_vllm_server: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Any, Path]:
    """A second real vLLM server, on the tiny model without its chat template (this module kills and restarts it)."""
    from inference.testing.vllm_model import build_vllm_model, without_chat_template

    model = build_vllm_model()
    directory = tmp_path_factory.mktemp("vllm-base")
    model_dir = without_chat_template(model, directory / "model")
    return start_vllm_server(model_dir, directory / "server.log", model=MODEL), model, model_dir


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def both(base_server: tuple[Any, Any, Path]) -> AsyncIterator[tuple[VLLMProvider, TransformersProvider]]:
    server, model, model_dir = base_server
    remote = VLLMProvider(base_url=server.base_url, max_retries=0)
    local = TransformersProvider(model_name=str(model_dir), torch_dtype="float32")
    for adapter_id in ("a0", "a1"):
        await remote.load_adapter(adapter_id, model.adapter_dirs[adapter_id])
        await local.load_adapter(adapter_id, model.adapter_dirs[adapter_id])
    yield remote, local
    await remote.aclose()
    await local.aclose()


@pytest.mark.parametrize("adapter_id", [None, "a0"])
async def test_a_base_model_generates_through_completions_as_transformers_does(
    both: tuple[VLLMProvider, TransformersProvider], adapter_id: str | None
) -> None:
    remote, local = both
    arguments: dict[str, Any] = {"adapter_id": adapter_id, "max_tokens": 8, "temperature": 0, "logprobs": 1}
    asked: list[tuple[Any, dict[str, Any]]] = [
        (PROMPTS[0], {}),
        (PROMPTS[1], {"system_prompt": "Answer in one word."}),
        ([{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": PROMPTS[1]}], {}),
    ]
    for prompt, extra in asked:
        theirs = await remote.generate(prompt, model=MODEL, **arguments, **extra)
        ours = await local.generate(prompt, model=MODEL, **arguments, **extra)
        assert theirs.logprobs is not None and ours.logprobs is not None
        assert len(theirs.logprobs) == len(ours.logprobs) == 8
        for there, here in zip(theirs.logprobs, ours.logprobs, strict=True):
            assert abs(there.logprob - here.logprob) < 1e-3  # the same tokens, the same distribution
        assert theirs.prompt_tokens == ours.prompt_tokens  # the same plain text was sent
    assert remote._replicas[0].route is not None and remote._replicas[0].route.result() == "completions"


async def test_a_base_model_streams_what_it_generates(both: tuple[VLLMProvider, TransformersProvider]) -> None:
    remote, _ = both
    whole = await remote.generate(PROMPTS[0], model=MODEL, adapter_id="a1", max_tokens=12, temperature=0)
    events = [e async for e in remote.stream(PROMPTS[0], model=MODEL, adapter_id="a1", max_tokens=12, temperature=0)]
    *pieces, result = events
    assert not isinstance(result, str)
    assert "".join(str(piece) for piece in pieces) == result.text == whole.text
    assert (result.prompt_tokens, result.completion_tokens) == (whole.prompt_tokens, whole.completion_tokens)


async def test_chat_forced_on_a_base_model_is_refused_with_the_setting_to_use(
    base_server: tuple[Any, Any, Path],
) -> None:
    server, _, _ = base_server
    async with VLLMProvider(base_url=server.base_url, api="chat", max_retries=0) as provider:
        with pytest.raises(ServerResponseError, match=r"no chat template.*VLLM_API=auto"):
            await provider.generate("Hi", model=MODEL, max_tokens=4)


async def test_a_crash_mid_stream_fails_the_stream_and_a_restart_heals_the_adapters(
    base_server: tuple[Any, Any, Path], both: tuple[VLLMProvider, TransformersProvider]
) -> None:
    server, _, _ = base_server
    remote, _ = both
    greedy: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "temperature": 0}
    before = {name: (await remote.generate(PROMPTS[0], adapter_id=name, **greedy)).text for name in ("a0", "a1")}

    # 32 long streams (about 15,000 tokens in all, several seconds of this engine's work), so that the engine is
    # surely still generating when it dies: with 8 streams (about 1.5 s of work), one run of the whole suite on a
    # loaded machine saw every stream delivered whole before the kill.
    streams = [
        remote.stream(PROMPTS[1], model=MODEL, adapter_id="a0", max_tokens=480, temperature=1.0, seed=seed)
        for seed in range(32)
    ]
    firsts = await asyncio.gather(*(anext(stream) for stream in streams))  # all begin at once, and answer
    assert all(isinstance(piece, str) for piece in firsts)
    server.kill()  # the server and its engine die at once, mid-answer

    async def outcome(stream: Any) -> BaseException | None:
        try:
            async for _ in stream:
                pass
        except BaseException as error:  # the test looks at what was raised
            return error
        return None

    outcomes = [await outcome(stream) for stream in streams]
    failures = [error for error in outcomes if error is not None]
    assert failures  # the streams cut short failed...
    for error in failures:  # ...each with a typed error that names the server, not a bare transport exception
        assert isinstance(error, InferenceError) and "vLLM" in str(error), repr(error)

    server.start()  # same port, empty: it lost every adapter
    # a0: the next request finds it lost, loads it again from its remembered path, and retries (self-healing)
    assert (await remote.generate(PROMPTS[0], adapter_id="a0", **greedy)).text == before["a0"]
    # a1: reconcile_adapters loads back whatever is still missing
    report = await remote.reconcile_adapters()
    assert report.ok and report.reloaded == ["a1"]
    assert (await remote.generate(PROMPTS[0], adapter_id="a1", **greedy)).text == before["a1"]
    assert set(await remote.list_adapters()) == {"a0", "a1"}
