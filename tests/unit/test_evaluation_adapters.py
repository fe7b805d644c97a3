"""How an evaluation run treats the adapters on the provider: those its caller loaded stay the caller's, runs at once
on one provider share theirs, and rows carry the content hash of the files that were loaded; on the fake provider."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from inference._core.validation import GenerationRequest
from inference.adapters.source import AdapterSource
from inference.evaluation import (
    EvalPrompt,
    Progress,
    ResultsFileMismatchError,
    adapter_hash,
    evaluate_adapters,
    read_rows,
)
from inference.fake_provider import FakeProvider
from inference.fallback import FallbackProvider
from inference.results import GenerationResult

PROMPTS = [EvalPrompt("q1", "hello", expected="x"), EvalPrompt("q2", "world", expected="y")]


def adapter(folder: Path, content: str = "weights") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 2}))
    (folder / "adapter_model.safetensors").write_text(content)
    return folder


async def test_an_adapter_the_caller_loaded_is_evaluated_and_left_loaded_and_pinned(tmp_path: Path) -> None:
    a1, a2 = adapter(tmp_path / "a1"), adapter(tmp_path / "a2")
    provider = FakeProvider()
    await provider.load_adapter("a1", str(a1), pin=True)  # the caller's own adapter, from the same path
    summary = await evaluate_adapters([a1, a2], PROMPTS, {"provider": "fake"}, tmp_path / "r.jsonl", provider=provider)
    assert summary.errors == 0
    assert await provider.list_adapters() == ["a1"]  # the run's own a2 is unloaded; the caller's a1 is not
    stats = provider.adapter_stats().get("a1")
    assert stats is not None and stats.pinned and stats.loads == 1
    alone = await evaluate_adapters([a1, a2], PROMPTS, {"provider": "fake"}, tmp_path / "alone.jsonl")
    assert [row["output"] for row in read_rows(tmp_path / "r.jsonl")] == [
        row["output"] for row in read_rows(alone.output)
    ]  # the caller's a1 is the same adapter: the same answers


async def test_an_id_the_caller_loaded_from_other_files_is_a_load_error_and_stays_the_caller_s(
    tmp_path: Path,
) -> None:
    a1, other = adapter(tmp_path / "a1"), adapter(tmp_path / "other" / "a1", "other weights")
    provider = FakeProvider()
    await provider.load_adapter("a1", str(other), pin=True)
    before = (await provider.generate("hello", "", adapter_id="a1")).text
    summary = await evaluate_adapters([a1], PROMPTS, {"provider": "fake"}, tmp_path / "r.jsonl", provider=provider)
    rows = [row for row in read_rows(tmp_path / "r.jsonl") if row["adapter_id"] == "a1"]
    assert [row["error"]["stage"] for row in rows] == ["load", "load"] and all(row["output"] is None for row in rows)
    assert rows[0]["error"]["type"] == "AdapterAlreadyLoadedError"
    assert (
        "already loaded on the fake provider, by its caller or by another evaluation run on it, from other files "
        f"or weights than {a1}"
    ) in rows[0]["error"]["message"]
    assert summary.adapters[0].load_error is not None and "AdapterSpec" in summary.adapters[0].load_error
    assert await provider.list_adapters() == ["a1"]  # the caller's adapter, from its own files, as before
    assert (await provider.generate("hello", "", adapter_id="a1")).text == before


# Runs at once on one provider, and the user loading meanwhile: nobody unloads what another uses --------------------


def task(name: str, count: int) -> list[EvalPrompt]:
    return [EvalPrompt(f"q{index}", f"task {name} question {index}", expected="x") for index in range(count)]


def outputs(path: Path) -> dict[tuple[str, str], tuple[object, object]]:
    return {(row["adapter_id"], row["prompt_id"]): (row["output"], row["error"]) for row in read_rows(path)}


async def test_two_tasks_at_once_with_one_provider_config_get_the_rows_each_gets_alone(tmp_path: Path) -> None:
    """The same provider_config gives both runs the same cached provider: the short task's run used to unload each
    adapter at the end of its turn while the long task's run still answered with it (100 or 120 of 120 rows errors
    in 9 tries of 10: which run loads an adapter first depends on the threads that hash it)."""
    adapters = [adapter(tmp_path / f"a{index}") for index in range(6)]
    short, long = task("A", 2), task("B", 20)
    config = {"provider": "fake"}
    alone = [
        await evaluate_adapters(adapters, prompts, config, tmp_path / f"alone-{name}.jsonl", provider=FakeProvider())
        for name, prompts in (("a", short), ("b", long))
    ]
    both = await asyncio.gather(
        evaluate_adapters(adapters, short, config, tmp_path / "a.jsonl"),
        evaluate_adapters(adapters, long, config, tmp_path / "b.jsonl"),
    )
    assert [summary.errors for summary in both] == [0, 0]
    for summary, reference in zip(both, alone, strict=True):
        assert outputs(summary.output) == outputs(reference.output)
        assert [entry.score for entry in summary.adapters] == [entry.score for entry in reference.adapters]


async def test_two_runs_at_once_through_a_fallback_provider_hold_the_adapters_on_each_backend(tmp_path: Path) -> None:
    """A provider that loads through others passes a run's hold on: each backend unloads an adapter once both runs
    are done with it. (Before, every row of a run on a FallbackProvider was a load error: its adapter_stats raises.)"""
    adapters = [adapter(tmp_path / f"a{index}") for index in range(3)]
    provider = FallbackProvider([FakeProvider(), FakeProvider()])
    both = await asyncio.gather(
        evaluate_adapters(adapters, task("A", 2), {}, tmp_path / "a.jsonl", provider=provider),
        evaluate_adapters(adapters, task("B", 20), {}, tmp_path / "b.jsonl", provider=provider),
    )
    assert [summary.errors for summary in both] == [0, 0]
    assert [await backend.list_adapters() for backend in provider.providers] == [[], []]


class GatedByTask(FakeProvider):
    """Holds each task's adapter requests until its gate opens, and counts those waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.gates = {"A": asyncio.Event(), "B": asyncio.Event()}
        self.waiting = {"A": 0, "B": 0}

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        name = next((name for name in self.gates if str(request.prompt).startswith(f"task {name} ")), None)
        if request.adapter_id is not None and name is not None:
            self.waiting[name] += 1
            await self.gates[name].wait()
            self.waiting[name] -= 1
        return await super()._generate(request)


async def until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    """Wait until ``condition`` holds; a bounded wait, so a broken hold fails the test instead of hanging it."""
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.001)


async def test_a_run_that_ends_first_leaves_the_adapter_to_the_run_still_using_it(tmp_path: Path) -> None:
    """Run A loads a1, run B starts using it, A ends its turn first: a1 stays loaded until B is done with it."""
    a1 = adapter(tmp_path / "a1")
    provider = GatedByTask()
    options = {"provider": provider, "base": False, "warmup": False, "max_concurrency": 1}
    run_a = asyncio.create_task(
        evaluate_adapters([a1], task("A", 2), {"provider": "fake"}, tmp_path / "a.jsonl", **options)
    )
    await until(lambda: provider.waiting["A"] == 1)  # A loaded a1 and asks with it
    run_b = asyncio.create_task(
        evaluate_adapters([a1], task("B", 6), {"provider": "fake"}, tmp_path / "b.jsonl", **options)
    )
    await until(lambda: provider.waiting["B"] == 1)  # B found a1 loaded and asks with it too
    provider.gates["A"].set()
    await until(lambda: run_a.done() or provider.adapter_stats().get("a1") is None)  # A's turn ended
    provider.gates["B"].set()
    summary_a, summary_b = await asyncio.gather(run_a, run_b)
    assert (summary_a.errors, summary_b.errors) == (0, 0)
    assert outputs(summary_b.output) == outputs(
        (await evaluate_adapters([a1], task("B", 6), {"provider": "fake"}, tmp_path / "alone.jsonl", base=False)).output
    )
    assert await provider.list_adapters() == []  # the last run out unloaded it
    assert provider.adapter_stats().loads == 1  # loaded once for both


@pytest.mark.parametrize("pin", [True, False])
async def test_an_adapter_the_caller_loads_while_a_run_uses_it_stays_loaded(tmp_path: Path, pin: bool) -> None:
    """A serving loop on the provider loads the adapter the run is evaluating (the same files): it is the caller's
    from then on, and the run leaves it loaded, pinned as the caller asked (it was unloaded and the pin lost)."""
    a1 = adapter(tmp_path / "a1")
    provider = GatedByTask()
    run = asyncio.create_task(
        evaluate_adapters(
            [a1], task("A", 3), {"provider": "fake"}, tmp_path / "r.jsonl", provider=provider, base=False,
            max_concurrency=1,
        )
    )  # fmt: skip
    await until(lambda: provider.waiting["A"] == 1)
    await provider.load_adapter("a1", str(a1), pin=pin)  # the caller's own load: the run has it loaded already
    provider.gates["A"].set()
    assert (await run).errors == 0
    assert await provider.list_adapters() == ["a1"]
    stats = provider.adapter_stats().get("a1")
    assert stats is not None and stats.pinned is pin
    assert (await provider.generate("hello", "", adapter_id="a1")).text  # the caller's requests are served


async def test_a_run_cancelled_while_another_shares_its_adapter_leaves_it_to_that_run(tmp_path: Path) -> None:
    """A cancelled run gives its holds back: the other run goes on with the adapter, then unloads it."""
    a1 = adapter(tmp_path / "a1")
    provider = GatedByTask()
    options = {"provider": provider, "base": False, "warmup": False, "max_concurrency": 1}
    run_a = asyncio.create_task(
        evaluate_adapters([a1], task("A", 2), {"provider": "fake"}, tmp_path / "a.jsonl", **options)
    )
    await until(lambda: provider.waiting["A"] == 1)
    run_b = asyncio.create_task(
        evaluate_adapters([a1], task("B", 4), {"provider": "fake"}, tmp_path / "b.jsonl", **options)
    )
    await until(lambda: provider.waiting["B"] == 1)
    run_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run_b
    assert await provider.list_adapters() == ["a1"]  # A still holds it
    provider.gates["A"].set()
    assert (await run_a).errors == 0
    assert await provider.list_adapters() == []  # nobody holds it any more: unloaded


# The content hash rows carry: of the files that were loaded ----------------------------------------------------


def change_a2_after_a1(a2: Path) -> tuple[Callable[[Progress], None], list[str]]:
    """An ``on_progress`` that rewrites a2's weights once the base model and a1 are done, before a2's turn (a
    checkpoint still being written when the run started); and the list it puts a2's new hash in."""
    changed: list[str] = []

    def progress(report: Progress) -> None:
        if report.adapters_done == 2 and not changed:
            adapter(a2, "the weights a2 was saved with in the end")
            changed.append(adapter_hash(a2))

    return progress, changed


async def test_files_changed_before_their_turn_are_evaluated_and_recorded_as_they_are_then(tmp_path: Path) -> None:
    a1, a2 = adapter(tmp_path / "a1"), adapter(tmp_path / "a2", "half-written weights")
    at_start = adapter_hash(a2)
    progress, changed = change_a2_after_a1(a2)
    output = tmp_path / "r.jsonl"
    summary = await evaluate_adapters([a1, a2], PROMPTS, {"provider": "fake"}, output, on_progress=progress)
    assert changed and changed[0] != at_start
    assert {row["adapter_hash"] for row in read_rows(output) if row["adapter_id"] == "a2"} == {changed[0]}
    assert (summary.adapters[1].adapter_hash, summary.adapters[1].rows, summary.errors) == (changed[0], 2, 0)
    again = await evaluate_adapters([a1, a2], PROMPTS, {"provider": "fake"}, output)  # the unchanged command
    assert (again.rows_written, again.rows_resumed) == (0, 6)


async def test_files_changed_before_their_turn_in_a_file_with_rows_of_the_earlier_ones_are_not_evaluated(
    tmp_path: Path,
) -> None:
    a1, a2 = adapter(tmp_path / "a1"), adapter(tmp_path / "a2")
    output = tmp_path / "r.jsonl"
    await evaluate_adapters([a1, a2], PROMPTS[:1], {"provider": "fake"}, output)  # q1 of the first version
    earlier = adapter_hash(a2)
    progress, changed = change_a2_after_a1(a2)
    summary = await evaluate_adapters([a1, a2], PROMPTS, {"provider": "fake"}, output, on_progress=progress)
    rows = {row["prompt_id"]: row for row in read_rows(output) if row["adapter_id"] == "a2"}
    assert rows["q1"]["error"] is None and rows["q2"]["error"]["stage"] == "load"
    assert f"changed since this run started (content hash {earlier}, now {changed[0]})" in (
        rows["q2"]["error"]["message"]
    )
    assert {row["adapter_hash"] for row in rows.values()} == {earlier}  # one version of a2 in the file
    assert (summary.adapters[1].rows, summary.adapters[1].errors) == (2, 1)
    with pytest.raises(ResultsFileMismatchError, match=r"whose files have changed since"):
        await evaluate_adapters([a1, a2], PROMPTS, {"provider": "fake"}, output)


class RewritingWhileLoading(FakeProvider):
    """Rewrites an adapter's weights while loading it (a training loop saving into the directory meanwhile)."""

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        await super()._load_adapter(adapter_id, source)
        adapter(Path(source.path), f"the next step's weights of {adapter_id}")


async def test_files_changed_while_being_loaded_are_a_load_error_and_unloaded(tmp_path: Path) -> None:
    a1 = adapter(tmp_path / "a1")
    before = adapter_hash(a1)
    provider = RewritingWhileLoading()
    output = tmp_path / "r.jsonl"
    summary = await evaluate_adapters([a1], PROMPTS, {"provider": "fake"}, output, provider=provider)
    rows = [row for row in read_rows(output) if row["adapter_id"] == "a1"]
    assert [row["error"]["stage"] for row in rows] == ["load", "load"]
    assert f"changed while it was being loaded (content hash {before} before, {adapter_hash(a1)} after)" in (
        rows[0]["error"]["message"]
    )
    assert {row["adapter_hash"] for row in rows} == {before} and summary.adapters[0].load_error is not None
    assert await provider.list_adapters() == []


async def test_rows_after_the_caller_replaces_the_adapter_mid_turn_are_errors_not_answers_of_other_weights(
    tmp_path: Path,
) -> None:
    """The caller's load_adapter(..., replace=True) during a run's turn used to make the rest of the turn answer
    with the caller's new weights, in rows that carried the hash of the files the run had loaded."""
    a1, other = adapter(tmp_path / "a1"), adapter(tmp_path / "other" / "a1", "the caller's new weights")
    provider = GatedByTask()
    output = tmp_path / "r.jsonl"
    run = asyncio.create_task(
        evaluate_adapters(
            [a1], task("A", 4), {"provider": "fake"}, output, provider=provider, base=False, max_concurrency=1,
        )
    )  # fmt: skip
    await until(lambda: provider.waiting["A"] == 1)  # the first row's request is on a1's weights
    replacing = asyncio.create_task(provider.load_adapter("a1", str(other), replace=True))
    await until(lambda: provider.adapter_stats().replacements == 1)  # switched; the first request still runs
    provider.gates["A"].set()
    summary = await run
    await replacing
    alone = await evaluate_adapters([a1], task("A", 4), {"provider": "fake"}, tmp_path / "alone.jsonl", base=False)
    expected = {row["prompt_id"]: row["output"] for row in read_rows(alone.output)}
    rows = sorted(read_rows(output), key=lambda row: int(str(row["prompt_id"])[1:]))
    assert {row["adapter_hash"] for row in rows} == {adapter_hash(a1)}
    assert rows[0]["error"] is None and rows[0]["output"] == expected["q0"]  # started on a1's weights
    for row in rows[1:]:
        assert row["output"] is None and row["error"]["type"] == "AdapterNotFoundError"
        assert "no longer serves the weights this evaluation run loaded" in row["error"]["message"]
    assert summary.errors == 3
    assert await provider.list_adapters() == ["a1"]  # the caller's replacement stays, and serves its weights
    assert provider._adapter_path("a1") == str(other)
