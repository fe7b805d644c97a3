"""How an evaluation run treats the adapters on the provider: those its caller loaded stay the caller's, and rows
carry the content hash of the files that were loaded; on the fake provider."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

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
    assert f"already loaded on the fake provider by its caller, from other files or weights than {a1}" in (
        rows[0]["error"]["message"]
    )
    assert summary.adapters[0].load_error is not None and "AdapterSpec" in summary.adapters[0].load_error
    assert await provider.list_adapters() == ["a1"]  # the caller's adapter, from its own files, as before
    assert (await provider.generate("hello", "", adapter_id="a1")).text == before


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
