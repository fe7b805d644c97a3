"""``load_adapter(id, path, replace=True)`` is atomic on the real in-process backends.

200 greedy generations run while the adapter is replaced 20 times, half of the times with a bad path (missing, or a
directory that is no adapter). Every generation must give exactly the answer of the weights that were current when
it started (looked up on the same provider under other ids), and none may fail.

An ``unload_adapter`` called while a replacement loads wins on them too: the id ends unloaded, the backend holds
neither weights, and the replacement raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from inference.adapters.source import AdapterSource
from inference.exceptions import AdapterNotFoundError
from inference.llamacpp_provider import LlamaCppProvider
from inference.provider import InferenceProvider
from inference.transformers_provider import TransformersProvider
from replacing import after_rounds, bad_adapter_paths, replace_alternately

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

PROMPTS = ["the quick brown fox", "Once upon a time there was", "numbers 1 2 3 and", "Dear diary"]


@pytest_asyncio.fixture(params=["transformers", "llamacpp"], scope="module", loop_scope="module")
async def provider(request: pytest.FixtureRequest, tiny_models: dict[str, Any]) -> AsyncIterator[InferenceProvider]:
    model = tiny_models["qwen2"]
    backend: InferenceProvider
    if request.param == "transformers":
        backend = TransformersProvider(model_name=str(model.hf_dir), torch_dtype="float32")
    else:
        backend = LlamaCppProvider(model_path=model.gguf_path, n_ctx=512, kv_cache_type="f32")
    yield backend
    await backend.aclose()


async def test_200_generations_through_20_replacements_never_fail_or_mix(
    provider: InferenceProvider, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    model = tiny_models["qwen2"]
    good = [str(model.adapter_dirs[name]) for name in ("a1", "a2")]
    bad = bad_adapter_paths(tmp_path)
    greedy: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "temperature": 0}

    expected: dict[tuple[str, str], str] = {}
    for index, path in enumerate([str(model.adapter_dirs["a0"]), *good]):
        await provider.load_adapter(f"reference-{index}", path)
        for prompt in PROMPTS:
            expected[path, prompt] = (await provider.generate(prompt, adapter_id=f"reference-{index}", **greedy)).text
        await provider.unload_adapter(f"reference-{index}")
    assert len({expected[path, PROMPTS[0]] for path, _ in expected}) == 3  # three different adapters

    await provider.load_adapter("live", model.adapter_dirs["a0"])
    started_on: list[str] = []

    async def one(prompt: str) -> str:
        started_on.append(provider._adapter_path("live") or "")  # the weights current as the request starts
        return (await provider.generate(prompt, adapter_id="live", **greedy)).text

    async def generations() -> list[str]:
        texts: list[str] = []
        for start in range(0, 200, 10):
            await after_rounds(rounds, start // 10)  # batch k starts after round k
            texts += await asyncio.gather(*(one(PROMPTS[i % 4]) for i in range(start, start + 10)))
        return texts

    rounds: list[str] = []
    replacing = replace_alternately(provider, "live", good, bad, pause_s=0.005, outcomes=rounds)
    texts, outcomes = await asyncio.gather(generations(), replacing)
    assert outcomes == ["replaced", "refused"] * 10
    prompts = [PROMPTS[i % 4] for i in range(200)]
    for prompt, path, text in zip(prompts, started_on, texts, strict=True):
        assert text == expected[path, prompt], (prompt, path)
    assert len(set(started_on)) > 2  # the generations did run across several replacements
    assert await provider.list_adapters() == ["live"]
    assert len(getattr(provider, "resident_adapters", [None])) == 1  # each replaced version was unloaded
    await provider.unload_adapter("live")


class LoadsOnCue:
    """Backend loads that wait for ``release`` once they have started (``started`` is set then)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()


class HeldTransformersProvider(TransformersProvider):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.cue = LoadsOnCue()

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        self.cue.started.set()
        await self.cue.release.wait()
        await super()._load_adapter(adapter_id, source)


class HeldLlamaCppProvider(LlamaCppProvider):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.cue = LoadsOnCue()

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        self.cue.started.set()
        await self.cue.release.wait()
        await super()._load_adapter(adapter_id, source)


@pytest.mark.parametrize("backend", ["transformers", "llamacpp"])
async def test_an_unload_called_during_a_replace_leaves_the_id_unloaded(
    backend: str, tiny_models: dict[str, Any]
) -> None:
    """The unload used to return, and the replacement then switched the id to its weights: listed and served
    again after the user had unloaded it."""
    model = tiny_models["qwen2"]
    held: HeldTransformersProvider | HeldLlamaCppProvider
    if backend == "transformers":
        held = HeldTransformersProvider(model_name=str(model.hf_dir), torch_dtype="float32")
    else:
        held = HeldLlamaCppProvider(model_path=model.gguf_path, n_ctx=512, kv_cache_type="f32")
    greedy: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "temperature": 0}
    async with held as provider:
        await provider.load_adapter("reference", model.adapter_dirs["a1"])
        expected = (await provider.generate(PROMPTS[0], adapter_id="reference", **greedy)).text
        await provider.unload_adapter("reference")
        await provider.load_adapter("live", model.adapter_dirs["a0"])
        provider.cue.started.clear()
        provider.cue.release.clear()
        replacing = asyncio.create_task(provider.load_adapter("live", model.adapter_dirs["a1"], replace=True))
        await asyncio.wait_for(provider.cue.started.wait(), timeout=30)
        unloading = asyncio.create_task(provider.unload_adapter("live"))
        while await provider.list_adapters() != []:  # refused at once, while the replacement still loads
            await asyncio.sleep(0.001)
        assert not replacing.done()
        with pytest.raises(AdapterNotFoundError):  # refused at once
            await provider.generate(PROMPTS[0], adapter_id="live", **greedy)
        provider.cue.release.set()
        with pytest.raises(AdapterNotFoundError, match="the later call wins"):
            await asyncio.wait_for(replacing, timeout=60)
        await asyncio.wait_for(unloading, timeout=60)
        assert await provider.list_adapters() == [] and provider.resident_adapters == []
        with pytest.raises(AdapterNotFoundError, match="not loaded"):
            await provider.generate(PROMPTS[0], adapter_id="live", **greedy)
        await provider.load_adapter("live", model.adapter_dirs["a1"])
        assert (await provider.generate(PROMPTS[0], adapter_id="live", **greedy)).text == expected
