"""The evaluation runner's scoring on a real provider (Transformers in process, the tiny Qwen2 model): a score-only
run gives a generating run's log-likelihoods, every row's choices reach the provider in shared forward passes, weights
in memory are evaluated and resumed like their directory, and the summary's plot is a PNG."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from inference import AdapterWeights
from inference.evaluation import AdapterSpec, EvalPrompt, evaluate_adapters, read_rows

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

CHOICES = (" the", " a cat", " and then", " once")
PROMPTS = [
    *(EvalPrompt(f"mc{i}", f"Once upon a time {i}", choices=CHOICES, answer=i % 4) for i in range(8)),
    *(EvalPrompt(f"ref{i}", f"The quick brown fox {i}", expected=" jumps over the lazy dog") for i in range(4)),
]
PAIRS = 8 * len(CHOICES) + 4  # every choice of every row, and every reference answer


def likelihoods(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    fields = ("nll_per_token", "choice_logprobs", "predicted", "predicted_norm")
    return {
        (row["adapter_id"], row["prompt_id"]): {name: row.get(name) for name in fields} for row in read_rows(path)
    }


def assert_same_scores(got: dict[str, Any], want: dict[str, Any], where: Any) -> None:
    if want["nll_per_token"] is not None:
        assert got["nll_per_token"] == pytest.approx(want["nll_per_token"], abs=1e-4), where
    if want["choice_logprobs"] is not None:
        assert got["choice_logprobs"] == pytest.approx(want["choice_logprobs"], abs=1e-4), where
        ordered = sorted(want["choice_logprobs"], reverse=True)
        if ordered[0] - ordered[1] > 1e-3:  # not a near tie
            assert got["predicted"] == want["predicted"], where


def weights_of(directory: Path) -> AdapterWeights:
    """The adapter of ``directory`` as a hypernetwork would hand it over: its tensors and its config, in memory."""
    from safetensors.torch import load_file

    config = json.loads((directory / "adapter_config.json").read_text())
    return AdapterWeights(load_file(str(directory / "adapter_model.safetensors")), config)


async def test_score_only_on_transformers_equals_generate_and_score_and_batches_every_row(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    from inference.transformers_provider import TransformersProvider

    model = tiny_models["qwen2"]
    adapters = [model.adapter_dirs[name] for name in ("a0", "a1", "a2")]
    async with TransformersProvider(model_name=str(model.hf_dir), device="cpu", torch_dtype="float32") as provider:
        generated = await evaluate_adapters(
            adapters, PROMPTS, {"max_tokens": 2, "temperature": 0}, tmp_path / "gen.jsonl", provider=provider
        )
        await provider.load_adapter("alone", str(adapters[1]))
        alone = {
            (prompt.id, choice): (await provider.score(prompt.prompt, choice, "", "alone")).logprob
            for prompt in PROMPTS[:2]
            for choice in prompt.choices or ()
        }  # one pair per forward pass
        await provider.unload_adapter("alone")
    assert generated.mode == "generate" and generated.errors == 0

    # A batch fills up only when every pair of an adapter is waiting (a window of a minute, as many rows as pairs):
    # the batch sizes say what the runner sent together, whatever the machine's load.
    async with TransformersProvider(
        model_name=str(model.hf_dir), device="cpu", torch_dtype="float32", max_batch_size=PAIRS,
        batch_window_ms=60_000,
    ) as provider:  # fmt: skip
        scored = await evaluate_adapters(
            adapters, PROMPTS, {}, tmp_path / "score.jsonl", provider=provider, mode="score", warmup=False
        )
        sizes = provider.recent_batch_sizes
    # The base model and each adapter: all their rows' pairs in one batch, which scores the 8 items in one pass (a
    # row per item: its context once, its 4 choices packed after it) and the 4 reference answers in another.
    assert sizes == (8, 4) * 4
    assert scored.mode == "score" and scored.errors == 0
    assert all(row["output"] is None for row in read_rows(tmp_path / "score.jsonl"))

    want, got = likelihoods(tmp_path / "gen.jsonl"), likelihoods(tmp_path / "score.jsonl")
    assert set(got) == set(want) and len(got) == 4 * len(PROMPTS)
    for key in want:
        assert_same_scores(got[key], want[key], key)
    for (prompt_id, choice), logprob in alone.items():
        index = CHOICES.index(choice)
        assert got[("a1", prompt_id)]["choice_logprobs"][index] == pytest.approx(logprob, abs=1e-4)
    for adapter, reference in zip(scored.adapters, generated.adapters, strict=True):
        assert adapter.acc == reference.acc and adapter.nll_per_token == pytest.approx(reference.nll_per_token)
        assert adapter.score_s is not None and adapter.score_s > 0 and adapter.generate_s == 0.0
    assert scored.base is not None and scored.base.nll_per_token is not None
    assert len({adapter.nll_per_token for adapter in scored.adapters} | {scored.base.nll_per_token}) == 4

    pytest.importorskip("matplotlib")
    plot = scored.write_plot()
    data = plot.read_bytes()
    assert plot == tmp_path / "score.summary.png" and data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height >= 200


async def test_weights_in_memory_score_like_their_directory_and_resume(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    from inference.transformers_provider import TransformersProvider

    model = tiny_models["qwen2"]
    directory = model.adapter_dirs["a1"]
    output = tmp_path / "memory.jsonl"
    async with TransformersProvider(model_name=str(model.hf_dir), device="cpu", torch_dtype="float32") as provider:
        from_files = await evaluate_adapters(
            [directory], PROMPTS, {}, tmp_path / "files.jsonl", provider=provider, mode="score", base=False
        )
        first = await evaluate_adapters(
            [AdapterSpec("step-1", weights=weights_of(directory))], PROMPTS, {}, output, provider=provider,
            mode="score", base=False,
        )  # fmt: skip
        rows = read_rows(output)
        assert first.errors == 0 and len(rows) == len(PROMPTS)
        content = first.adapters[0].adapter_hash
        assert all(row["adapter_path"] is None and row["adapter_hash"] == content for row in rows)
        files, memory = likelihoods(tmp_path / "files.jsonl"), likelihoods(output)
        for prompt in PROMPTS:
            assert_same_scores(memory[("step-1", prompt.id)], files[("a1", prompt.id)], prompt.id)
        assert first.adapters[0].acc == from_files.adapters[0].acc

        # The loop runs again (a new process, new tensors with the same values): nothing is scored twice.
        again = await evaluate_adapters(
            [AdapterSpec("step-1", weights=weights_of(directory))], PROMPTS, {}, output, provider=provider,
            mode="score", base=False,
        )  # fmt: skip
    assert (again.rows_written, again.rows_resumed) == (0, len(PROMPTS))
    assert again.adapters[0].nll_per_token == first.adapters[0].nll_per_token
