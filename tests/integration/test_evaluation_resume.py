"""Resuming an evaluation never reuses rows made for another adapter, another version of it, another prompt text
or other settings: checkpoints appended one at a time, retrained adapters, changed settings, rows of older versions.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from inference.evaluation import (
    AdapterSpec,
    EvalPrompt,
    ResultsFileMismatchError,
    adapter_hash,
    evaluate_adapters,
    read_rows,
)
from inference.evaluation.identity import candidate_ids
from inference.exceptions import InvalidRequestError
from inference.fake_provider import FakeProvider

pytestmark = pytest.mark.integration

FAKE = {"provider": "fake", "max_tokens": 6}
PROMPTS = [EvalPrompt(f"p{i}", f"question number {i}", None, "x") for i in range(4)]


def checkpoint(root: Path, step: int, weights: bytes | None = None) -> Path:
    """``root/ckpt-<step>/adapter`` holding a config and weights that differ per step."""
    path = root / f"ckpt-{step}" / "adapter"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (path / "adapter_model.safetensors").write_bytes(weights if weights is not None else f"step {step}".encode())
    return path


def by_pair(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["adapter_id"], row["prompt_id"]): row for row in rows}


async def test_checkpoints_appended_one_at_a_time_each_get_their_own_rows(tmp_path: Path) -> None:
    first, second = checkpoint(tmp_path, 100), checkpoint(tmp_path, 200)
    output = tmp_path / "results.jsonl"

    one = await evaluate_adapters([first], PROMPTS, FAKE, output)
    assert [adapter.adapter_id for adapter in one.adapters] == ["adapter"]

    two = await evaluate_adapters([second], PROMPTS, FAKE, output)
    # before: 0 written, ckpt-100's rows "resumed"; the base model's rows, written by the first run, are reused
    assert two.rows_written == 4 and two.rows_resumed == 4
    [summary] = two.adapters
    assert summary.adapter_id == "ckpt-200-adapter" and summary.adapter_path == str(second)
    assert summary.adapter_hash == adapter_hash(second) != adapter_hash(first)
    rows = by_pair(read_rows(output))
    assert len(rows) == 12
    assert {rows[("ckpt-200-adapter", p.id)]["adapter_path"] for p in PROMPTS} == {str(second)}
    assert rows[("ckpt-200-adapter", "p0")]["output"].startswith("[ckpt-200-adapter] ")
    assert rows[("adapter", "p0")]["output"].startswith("[adapter] ")

    # Both at once, in any order, later: each finds its own rows under the id the file gave it.
    for order in ([first, second], [second, first]):
        both = await evaluate_adapters(order, PROMPTS, FAKE, output)
        assert (both.rows_written, both.rows_resumed) == (0, 12)
        ids = {adapter.adapter_path: adapter.adapter_id for adapter in both.adapters}
        assert ids == {str(first): "adapter", str(second): "ckpt-200-adapter"}
        assert all(adapter.rows == 4 for adapter in both.adapters)


async def test_a_third_checkpoint_with_the_same_name_gets_a_third_id(tmp_path: Path) -> None:
    output = tmp_path / "results.jsonl"
    paths = [checkpoint(tmp_path / "a", 100), checkpoint(tmp_path / "b", 100), checkpoint(tmp_path, 300)]
    ids = []
    for path in paths:
        summary = await evaluate_adapters([path], PROMPTS[:1], FAKE, output)
        assert summary.rows_written == (2 if not ids else 1)  # the base model's row once, with the first
        ids.append(summary.adapters[0].adapter_id)
    assert ids == ["adapter", "ckpt-100-adapter", "ckpt-300-adapter"]  # b/ckpt-100 gets the first free name
    assert len({row["adapter_path"] for row in read_rows(output) if row["adapter_id"] != "(base)"}) == 3


async def test_two_adapters_with_one_name_in_one_run_get_distinct_valid_ids(tmp_path: Path) -> None:
    paths = [checkpoint(tmp_path / "x", 1), checkpoint(tmp_path / "y", 1)]
    summary = await evaluate_adapters(paths, PROMPTS[:1], FAKE, tmp_path / "r.jsonl")
    ids = [adapter.adapter_id for adapter in summary.adapters]
    assert len(set(ids)) == 2
    assert all(len(adapter_id) <= 128 and adapter_id[0].isalnum() for adapter_id in ids)
    assert candidate_ids("/runs/ckpt-200/adapter") == ["adapter", "ckpt-200-adapter", "runs-ckpt-200-adapter"]
    deep = "/" + "/".join(["d" * 60] * 5) + "/adapter"
    assert all(len(candidate) <= 128 for candidate in candidate_ids(deep))


async def test_an_adapter_retrained_at_the_same_path_is_refused_before_anything_runs(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, 100)
    output = tmp_path / "results.jsonl"
    await evaluate_adapters([path], PROMPTS, FAKE, output)
    before = output.read_bytes()
    (path / "adapter_model.safetensors").write_bytes(b"retrained")
    with pytest.raises(ResultsFileMismatchError, match=r"files have changed since.*new output file") as caught:
        await evaluate_adapters([path], PROMPTS, FAKE, output)
    assert isinstance(caught.value, InvalidRequestError)
    assert output.read_bytes() == before


@pytest.mark.parametrize(
    ("config", "prompts", "scorer", "needle"),
    [
        ({"provider": "fake", "max_tokens": 12}, PROMPTS, "exact", "max_tokens was 6, now 12"),
        ({**FAKE, "temperature": 0.7}, PROMPTS, "exact", "temperature was null, now 0.7"),
        ({**FAKE, "model": "another-base"}, PROMPTS, "exact", 'model was "", now "another-base"'),
        (FAKE, PROMPTS, "regex", 'scorer was "exact", now "regex"'),
        (FAKE, [EvalPrompt("p1", "another question", None, "x")], "exact", "prompt 'p1' has another text"),
    ],
)
async def test_resuming_with_other_settings_or_prompts_is_refused(
    tmp_path: Path, config: dict[str, Any], prompts: list[EvalPrompt], scorer: str, needle: str
) -> None:
    path = checkpoint(tmp_path, 100)
    output = tmp_path / "results.jsonl"
    await evaluate_adapters([path], PROMPTS, FAKE, output, scorer="exact")
    before = output.read_bytes()
    with pytest.raises(ResultsFileMismatchError) as caught:
        await evaluate_adapters([path], prompts, config, output, scorer=scorer)
    assert needle in str(caught.value) and "new output file" in str(caught.value)
    assert output.read_bytes() == before
    # The same settings still resume, and another file takes the new ones.
    assert (await evaluate_adapters([path], PROMPTS, FAKE, output, scorer="exact")).rows_written == 0
    assert (await evaluate_adapters([path], prompts, config, tmp_path / "new.jsonl", scorer=scorer)).errors == 0


async def test_another_base_model_is_refused(tmp_path: Path) -> None:
    class Llama(FakeProvider):
        def __init__(self, model_path: str) -> None:
            super().__init__()
            self.model_path = model_path

    path = checkpoint(tmp_path, 100)
    output = tmp_path / "results.jsonl"
    await evaluate_adapters([path], PROMPTS, FAKE, output, provider=Llama("base-a.gguf"))
    with pytest.raises(ResultsFileMismatchError, match=r"base_model was .*base-a\.gguf.*base-b\.gguf"):
        await evaluate_adapters([path], PROMPTS, FAKE, output, provider=Llama("base-b.gguf"))


async def test_a_chosen_id_that_names_another_adapter_in_the_file_is_refused(tmp_path: Path) -> None:
    first, second = checkpoint(tmp_path, 100), checkpoint(tmp_path, 200)
    output = tmp_path / "results.jsonl"
    await evaluate_adapters([AdapterSpec("best", first)], PROMPTS, FAKE, output)
    with pytest.raises(ResultsFileMismatchError, match=r"adapter id 'best' names .*ckpt-100.* choose another id"):
        await evaluate_adapters([AdapterSpec("best", second)], PROMPTS, FAKE, output)
    resumed = await evaluate_adapters([AdapterSpec("best", first)], PROMPTS, FAKE, output)
    assert resumed.rows_written == 0
    with pytest.raises(InvalidRequestError, match="adapter id 'bad id' is not valid"):
        await evaluate_adapters([AdapterSpec("bad id", first)], PROMPTS, FAKE, tmp_path / "other.jsonl")


OLD_FIELDS = ("adapter_id", "adapter_path", "prompt_id", "output", "prompt_tokens", "completion_tokens")


async def test_rows_of_older_versions_are_reused_only_for_the_same_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = checkpoint(tmp_path, 100), checkpoint(tmp_path, 200)
    output = tmp_path / "results.jsonl"
    await evaluate_adapters([first], PROMPTS, FAKE, output)
    old_rows = [{key: row[key] for key in OLD_FIELDS} | {"error": None, "score": None} for row in read_rows(output)]
    output.write_text("".join(json.dumps(row) + "\n" for row in old_rows))

    with caplog.at_level(logging.WARNING, logger="inference.evaluation"):
        other = await evaluate_adapters([second], PROMPTS, FAKE, output)
    assert "written by an older version" in caplog.text
    assert other.rows_written == 4 and other.adapters[0].adapter_id == "ckpt-200-adapter"
    same = await evaluate_adapters([first], PROMPTS, FAKE, output)
    assert same.rows_written == 0 and same.adapters[0].adapter_id == "adapter" and same.adapters[0].rows == 4


async def test_adapter_hashes_cover_the_weights_and_config_only(tmp_path: Path) -> None:
    first, second = checkpoint(tmp_path, 1, b"same"), checkpoint(tmp_path, 2, b"same")
    assert adapter_hash(first) == adapter_hash(second)  # same content; the path tells them apart
    (first / "optimizer.pt").write_bytes(b"training state")
    (first / "README.md").write_text("notes")
    assert adapter_hash(first) == adapter_hash(second)
    (first / "adapter_config.json").write_text(json.dumps({"r": 16}))
    assert adapter_hash(first) != adapter_hash(second)
    gguf = tmp_path / "style.gguf"
    gguf.write_bytes(b"GGUF...")
    assert len(adapter_hash(gguf)) == 16


def test_hashing_hundreds_of_adapters_reads_their_weights_once_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What hashing costs, counted in files read rather than seconds (a time limit failed on a busy machine).
    from inference.evaluation import identity

    weights = os.urandom(64 << 10)
    paths = [checkpoint(tmp_path / f"run{i}", i, weights) for i in range(100)]
    for path in paths:
        (path / "optimizer.pt").write_bytes(weights)  # a training leftover
    read: list[Path] = []
    real = identity._digest_file
    monkeypatch.setattr(identity, "_digest_file", lambda digest, path: (read.append(path), real(digest, path)))
    hashes = {adapter_hash(path) for path in paths}
    assert len(hashes) == 1
    wanted = [path / name for path in paths for name in ("adapter_config.json", "adapter_model.safetensors")]
    assert sorted(read) == sorted(wanted)  # each weights file once, no optimizer state
