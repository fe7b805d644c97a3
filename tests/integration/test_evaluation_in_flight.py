"""The evaluation runner with several adapters in flight (``adapters_in_flight``): the same rows as one at a time,
really concurrent, bounded, and still resumable, failure-tolerant and cancellable."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from inference.adapters.source import AdapterSource
from inference.evaluation import EvalPrompt, evaluate_adapters, read_rows
from inference.exceptions import InvalidAdapterError, InvalidRequestError
from inference.fake_provider import FakeProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

PROMPTS = [EvalPrompt(f"p{index}", f"Tell me about number {index}") for index in range(6)]


def outputs(path: Path) -> dict[tuple[str, str], Any]:
    return {(row["adapter_id"], row["prompt_id"]): (row["output"], row.get("error")) for row in read_rows(path)}


class CountingFake(FakeProvider):
    """The fake provider, recording how many adapters were loaded at once at most (and failing one on load)."""

    def __init__(self, failing: str | None = None) -> None:
        super().__init__()
        self.loaded_now = 0
        self.most_at_once = 0
        self.failing = failing

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        if adapter_id == self.failing:
            raise InvalidAdapterError(f"adapter at {adapter_path} is broken", path=adapter_path)
        await asyncio.sleep(0.01)  # a load takes a moment: the others start meanwhile
        await super()._load_adapter(adapter_id, source)
        self.loaded_now += 1
        self.most_at_once = max(self.most_at_once, self.loaded_now)

    async def _unload_adapter(self, adapter_id: str) -> None:
        await super()._unload_adapter(adapter_id)
        self.loaded_now -= 1


def adapter_dirs(root: Path, count: int) -> list[Path]:
    paths = []
    for index in range(count):
        path = root / f"adapter-{index:02d}"
        path.mkdir(parents=True)
        paths.append(path)
    return paths


async def test_n_adapters_are_evaluated_at_once_and_the_rows_are_those_of_one_at_a_time(tmp_path: Path) -> None:
    adapters = adapter_dirs(tmp_path / "adapters", 7)
    one = CountingFake()
    settings = {"max_tokens": 5}
    await evaluate_adapters(adapters, PROMPTS, settings, tmp_path / "one.jsonl", provider=one, base=False)
    three = CountingFake(failing="adapter-03")
    summary = await evaluate_adapters(  # no base model: the three places start three adapters together
        adapters, PROMPTS, settings, tmp_path / "three.jsonl", provider=three, adapters_in_flight=3, base=False
    )
    assert one.most_at_once == 1 and three.most_at_once == 3
    got, want = outputs(tmp_path / "three.jsonl"), outputs(tmp_path / "one.jsonl")
    assert set(got) == set(want)
    for key, (text, error) in got.items():
        if key[0] == "adapter-03":  # its load failed: its rows say so, and the others went on
            assert text is None and error["stage"] == "load"
        else:
            assert (text, error) == want[key]
    assert summary.rows_written == 7 * len(PROMPTS) and summary.errors == len(PROMPTS)
    assert await three.list_adapters() == []  # every adapter was unloaded


async def test_resuming_with_adapters_in_flight_runs_only_what_is_missing(tmp_path: Path) -> None:
    adapters = adapter_dirs(tmp_path / "adapters", 5)
    output = tmp_path / "results.jsonl"
    await evaluate_adapters(adapters[:2], PROMPTS, {"max_tokens": 5}, output, provider=CountingFake())
    provider = CountingFake()
    summary = await evaluate_adapters(
        adapters, PROMPTS, {"max_tokens": 5}, output, provider=provider, adapters_in_flight=4
    )
    assert summary.rows_resumed == 3 * len(PROMPTS) and summary.rows_written == 3 * len(PROMPTS)  # base resumed
    assert provider.most_at_once == 3


async def test_cancelling_a_run_with_adapters_in_flight_unloads_them(tmp_path: Path) -> None:
    adapters = adapter_dirs(tmp_path / "adapters", 6)

    class Slow(CountingFake):
        generating = 0

        async def _generate(self, request: Any) -> Any:
            self.generating += 1
            await asyncio.sleep(10)
            return await super()._generate(request)

    provider = Slow()
    run = asyncio.create_task(
        evaluate_adapters(
            adapters,
            PROMPTS,
            {"max_tokens": 5},
            tmp_path / "r.jsonl",
            provider=provider,
            adapters_in_flight=3,
            max_concurrency=2,
            warmup=False,
            base=False,  # three places, three adapters
        )
    )
    while provider.generating < 3 * 2:  # three adapters loaded, two prompts of each in flight
        await asyncio.sleep(0.01)
    assert provider.loaded_now == 3
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert provider.loaded_now == 0 and await provider.list_adapters() == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
async def test_adapters_in_flight_must_be_a_positive_integer(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(InvalidRequestError, match="adapters_in_flight must be a positive integer"):
        await evaluate_adapters(
            adapter_dirs(tmp_path, 1),
            PROMPTS,
            {"max_tokens": 5},
            tmp_path / "r.jsonl",
            provider=FakeProvider(),
            adapters_in_flight=bad,
        )


async def test_the_provider_s_max_adapters_caps_the_adapters_in_flight(tiny_models: Any, tmp_path: Path) -> None:
    """Loading more adapters than an in-process provider holds would evict ones still in use: the runner caps it."""
    from inference.testing.random_lora import write_random_peft_lora
    from inference.transformers_provider import TransformersProvider

    model = tiny_models["qwen2"]
    adapters = [
        write_random_peft_lora(
            model.gguf_path, tmp_path / f"r{index}", rank=4, seed=index, targets=("q_proj", "v_proj")
        )
        for index in range(6)
    ]
    settings = {"max_tokens": 6, "temperature": 0}
    async with TransformersProvider(model_name=str(model.hf_dir), device="cpu") as provider:
        await evaluate_adapters(adapters, PROMPTS, settings, tmp_path / "one.jsonl", provider=provider)
    async with TransformersProvider(model_name=str(model.hf_dir), device="cpu", max_adapters=2) as provider:
        summary = await evaluate_adapters(
            adapters, PROMPTS, settings, tmp_path / "four.jsonl", provider=provider, adapters_in_flight=4
        )
    assert summary.errors == 0
    assert outputs(tmp_path / "four.jsonl") == outputs(tmp_path / "one.jsonl")  # same rows, batched across adapters
    assert len({text for text, _ in outputs(tmp_path / "one.jsonl").values()}) > len(PROMPTS)  # adapters differ
    rows = [json.loads(line) for line in (tmp_path / "four.jsonl").read_text().splitlines()]
    assert len(rows) == 7 * len(PROMPTS)  # 6 adapters and the base model


async def test_cancelling_a_run_while_adapters_load_leaves_none_loaded(tmp_path: Path) -> None:
    """A load the backend has begun finishes before the cancellation reaches the run: the run unloads it too (it
    stayed loaded, and a rerun in the same process found its weights' id taken: every row a load error)."""
    adapters = adapter_dirs(tmp_path / "adapters", 6)

    class SlowLoads(CountingFake):
        loading = 0

        async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
            self.loading += 1
            await asyncio.sleep(0.3)
            await super()._load_adapter(adapter_id, source)

    provider = SlowLoads()
    run = asyncio.create_task(
        evaluate_adapters(
            adapters, PROMPTS, {"max_tokens": 5}, tmp_path / "r.jsonl", provider=provider, adapters_in_flight=3,
            warmup=False, base=False,
        )
    )
    while provider.loading < 3:  # three loads begun, none finished
        await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert provider.loaded_now == 0 and await provider.list_adapters() == []
    summary = await evaluate_adapters(  # the rerun evaluates every adapter
        adapters, PROMPTS, {"max_tokens": 5}, tmp_path / "r.jsonl", provider=provider, warmup=False, base=False
    )
    assert summary.errors == 0 and summary.rows_written == 6 * len(PROMPTS)
