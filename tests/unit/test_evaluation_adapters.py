"""How an evaluation run treats the adapters on the provider: those its caller loaded stay the caller's; on the fake
provider."""

from __future__ import annotations

import json
from pathlib import Path

from inference.evaluation import EvalPrompt, evaluate_adapters, read_rows
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
