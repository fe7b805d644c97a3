"""On-demand adapter placement across two real vLLM servers (CPU build): ``VLLM_ADAPTER_PLACEMENT=on-demand``.

The session's vLLM server and a second one serve the same tiny model. Each adapter is loaded on one of them, and on
the other only when its traffic or a failure asks for it; what each server holds is read from its own
``GET /v1/models``. Answers are compared across the two servers (same model, same adapter: the same greedy text).

This file runs after ``test_vllm_server.py`` (its name sorts after it) on purpose: after an adapter is unloaded,
vLLM 0.32 answers some batched requests wrongly from then on (see the vLLM provider page), and these tests unload
and evict many adapters on the session's server, which ``test_vllm_server.py`` checks batched answers on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from inference.vllm_provider import VLLMProvider

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "Once upon a time there was"


@pytest.fixture(scope="module")
def model() -> Any:
    from inference.testing.vllm_model import build_vllm_model

    return build_vllm_model()


@pytest.fixture(scope="module")
def servers(vllm_server: Any, start_vllm_server: Any, model: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(the second server, the session's server): the second first, so a tie in placement goes to it."""
    second = start_vllm_server(model.hf_dir, tmp_path_factory.mktemp("vllm-second") / "server.log")
    return second, vllm_server


def served(server: Any) -> set[str]:
    """The LoRA adapters a server lists (its own word, not the provider's record)."""
    entries = httpx.get(f"{server.base_url}/models", timeout=10).json()["data"]
    return {entry["id"] for entry in entries if entry.get("parent")}


def on_demand(servers: Any, **settings: Any) -> VLLMProvider:
    return VLLMProvider(base_url=[server.base_url for server in servers], adapter_placement="on-demand", **settings)


async def text(provider: VLLMProvider, adapter_id: str, prompt: str = PROMPT) -> str:
    result = await provider.generate(prompt, model="tiny", adapter_id=adapter_id, max_tokens=12, temperature=0)
    return result.text


async def test_each_adapter_is_loaded_on_one_replica_and_answers_there(servers: Any, model: Any) -> None:
    second, first = servers
    async with on_demand(servers) as provider:
        await provider.load_adapter("od-a0", model.adapter_dirs["a0"])
        await provider.load_adapter("od-a1", model.adapter_dirs["a1"])
        assert "od-a0" in served(second) and "od-a0" not in served(first)
        assert "od-a1" in served(first) and "od-a1" not in served(second)  # the one with fewer adapters
        answers = {adapter_id: await text(provider, adapter_id) for adapter_id in ("od-a0", "od-a1")}
        assert answers["od-a0"] != answers["od-a1"]
        assert {"od-a0", "od-a1"} <= set(await provider.list_adapters())
        report = await provider.reconcile_adapters()
        assert report.ok and report.reloaded == []  # each replica holds what it was given; nothing to load
        await provider.unload_adapter("od-a0")
        await provider.unload_adapter("od-a1")
    assert not {"od-a0", "od-a1"} & (served(first) | served(second))


async def test_a_busy_adapter_is_loaded_on_a_second_replica_with_the_same_answers(servers: Any, model: Any) -> None:
    second, first = servers
    async with on_demand(servers, spread_after=1) as provider:
        await provider.load_adapter("od-busy", model.adapter_dirs["a2"])
        alone = await text(provider, "od-busy")
        assert "od-busy" not in served(first)
        results = await asyncio.gather(*(text(provider, "od-busy") for _ in range(6)))
        assert "od-busy" in served(first) and "od-busy" in served(second)  # its traffic spread it
        assert results == [alone] * 6  # the same adapter on either server: the same greedy text
        await provider.unload_adapter("od-busy")
    assert "od-busy" not in served(first) | served(second)


async def test_a_full_replica_makes_room_and_no_adapter_is_lost(servers: Any, model: Any) -> None:
    second, first = servers
    names = ["od-x0", "od-x1", "od-x2"]
    async with on_demand(servers, max_loras=1) as provider:
        first_answers = {}
        for name, source in zip(names, ("a0", "a1", "a2"), strict=True):
            await provider.load_adapter(name, model.adapter_dirs[source])
            first_answers[name] = await text(provider, name)
            assert len(served(second) & set(names)) <= 1 and len(served(first) & set(names)) <= 1  # max_loras=1
        assert set(names) <= set(await provider.list_adapters())  # evicted ones are still loaded for the user
        for _ in range(2):  # each one is placed again on demand, evicting the least recently used
            for name in names:
                assert await text(provider, name) == first_answers[name], name
        held = (served(second) | served(first)) & set(names)
        assert len(held) == 2  # one per replica
        for name in names:
            await provider.unload_adapter(name)
    assert not set(names) & (served(first) | served(second))


async def test_a_score_goes_to_a_replica_that_holds_its_adapter_and_loads_a_lost_one_again(
    servers: Any, model: Any
) -> None:
    """Scores go the way generations go: to a replica that holds the adapter (it was held by one of the two, and
    half the scores failed), and an adapter the server lost (as after a restart) is loaded again and the score sent
    again once."""
    second, first = servers
    pair = ("the quick brown fox", " jumps over the dog")
    async with on_demand(servers) as provider:
        await provider.load_adapter("od-s0", model.adapter_dirs["a0"])
        holder = second if "od-s0" in served(second) else first
        assert "od-s0" not in served(first if holder is second else second)
        scores = [await provider.score(*pair, model="tiny", adapter_id="od-s0") for _ in range(4)]
        assert max(score.logprob for score in scores) - min(score.logprob for score in scores) < 1e-5
        lost = httpx.post(f"{holder.base_url}/unload_lora_adapter", json={"lora_name": "od-s0"}, timeout=60)
        assert lost.status_code == 200 and "od-s0" not in served(holder)
        again = await provider.score(*pair, model="tiny", adapter_id="od-s0")
        assert again.logprob == pytest.approx(scores[0].logprob, abs=1e-5) and "od-s0" in served(holder)
        rolled = await provider.score_rolling(pair[0] + pair[1], model="tiny", adapter_id="od-s0")
        assert rolled.num_tokens > 0
        await provider.unload_adapter("od-s0")


async def test_when_the_holder_dies_the_adapter_is_served_by_another_replica(servers: Any, model: Any) -> None:
    """The last test of the module: it kills the second server."""
    second, first = servers
    async with on_demand(servers) as provider:
        await provider.load_adapter("od-y0", model.adapter_dirs["a0"])
        assert "od-y0" in served(second) and "od-y0" not in served(first)
        before = await text(provider, "od-y0")
        second.kill()
        after = await asyncio.wait_for(text(provider, "od-y0"), timeout=60)
        assert after == before
        assert "od-y0" in served(first)  # loaded there on demand
        await provider.unload_adapter("od-y0")
    assert "od-y0" not in served(first)
