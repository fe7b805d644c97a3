"""Two evaluation runs at once on one real provider (two tasks, the same adapters), on Transformers and llama.cpp in
process with the tiny Qwen2 model: every row of each run is the one it gets alone, and no adapter is left loaded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from inference.evaluation import EvalPrompt, evaluate_adapters, read_rows
from inference.provider import InferenceProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

SETTINGS = {"max_tokens": 4, "temperature": 0}


def task(count: int, text: str, choices: tuple[str, str]) -> list[EvalPrompt]:
    return [EvalPrompt(f"q{i}", f"{text} {i}:", choices=choices, answer=0) for i in range(count)]


TASKS = {  # a short task and a long one: the short one's run ends each adapter's turn first
    "a": task(2, "Task A, the sky, question", (" blue", " green")),
    "b": task(8, "Task B, a cat, question", (" runs", " sleeps")),
}


def provider_of(kind: str, model: Any, tmp_path: Path) -> InferenceProvider:
    if kind == "transformers":
        from inference.transformers_provider import TransformersProvider

        return TransformersProvider(model_name=str(model.hf_dir), device="cpu", torch_dtype="float32")
    pytest.importorskip("llama_cpp")
    from inference.llamacpp_provider import LlamaCppProvider

    return LlamaCppProvider(model.gguf_path, n_ctx=512, kv_cache_type="f32", adapter_cache_dir=tmp_path / "cache")


def rows_of(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["adapter_id"], row["prompt_id"]): row for row in read_rows(path)}


@pytest.mark.parametrize("kind", ["transformers", "llamacpp"])
async def test_two_tasks_at_once_on_one_provider_get_the_rows_each_gets_alone(
    kind: str, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """Each run used to unload an adapter at the end of its own turn while the other still answered with it: the
    run of the longer task got 4 to 8 of its 32 rows here as AdapterNotFoundError ('is being unloaded')."""
    model = tiny_models["qwen2"]
    adapters = [model.adapter_dirs[name] for name in ("a0", "a1", "a2")]
    async with provider_of(kind, model, tmp_path) as provider:
        options: dict[str, Any] = {"provider": provider, "mode": "generate"}  # answers, and scores of the choices
        for name, prompts in TASKS.items():
            await evaluate_adapters(adapters, prompts, SETTINGS, tmp_path / f"alone-{name}.jsonl", **options)
        both = await asyncio.gather(
            *(
                evaluate_adapters(adapters, prompts, SETTINGS, tmp_path / f"{name}.jsonl", **options)
                for name, prompts in TASKS.items()
            )
        )
        assert await provider.list_adapters() == []  # the last run holding each adapter unloaded it
    assert [summary.errors for summary in both] == [0, 0]
    for name, summary in zip(TASKS, both, strict=True):
        got, alone = rows_of(summary.output), rows_of(tmp_path / f"alone-{name}.jsonl")
        assert set(got) == set(alone) and len(got) == 4 * len(TASKS[name])  # three adapters and the base model
        for key, row in got.items():
            assert row["output"] == alone[key]["output"], key
            assert row["choice_logprobs"] == pytest.approx(alone[key]["choice_logprobs"], abs=1e-3), key
    first = [rows_of(both[1].output)[(adapter, "q0")]["choice_logprobs"][0] for adapter in ("a0", "a1", "a2")]
    assert max(first) - min(first) > 1e-2  # the adapters score differently: each row was made with its own adapter
