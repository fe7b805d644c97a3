"""``n`` completions in process (issue 25), on llama.cpp and Transformers + PEFT with the same tiny model and adapter.

Both compute the prompt once for the ``n`` choices: llama.cpp decodes it in one sequence of its decode loop and shares
its cells with the others (``llama_memory_seq_cp``), Transformers runs the prompt but its last token through the model
once and repeats its keys and values per row. Checked: greedy choices are equal, and equal across the backends; sampled
with a seed, the choices are reproducible, differ, and are the choices of single requests seeded ``seed + k``; token
counts add up (the prompt counted once); the prompt goes through the model once (llama.cpp's decode loop counts the
prompt tokens it decodes; Transformers' forward passes are recorded at the input embedding); the result reads as its
first choice (tool calls, finish reason); llama.cpp's groups above ``n_parallel``, its one-at-a-time path and a context
too small for ``n`` completions give the same choices; a cancelled request frees its sequences; Transformers out of
memory runs the choices in halves, each keeping its seed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from inference.provider import GenerationResult, InferenceProvider
from inference.testing.tiny_models import TOOLS_CHATML_TEMPLATE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from inference.llamacpp_provider import LlamaCppProvider  # noqa: E402
from inference.transformers_provider import TransformersProvider  # noqa: E402

PROMPT = "numbers 1 2 3 and"
SAMPLED: dict[str, Any] = {"model": "m", "temperature": 1.0, "max_tokens": 8}


@pytest.fixture
async def pair(tiny_models: dict[str, Any], tmp_path: Path) -> AsyncIterator[tuple[LlamaCppProvider,
                                                                                     TransformersProvider]]:
    model = tiny_models["qwen2"]
    llamacpp = LlamaCppProvider(model.gguf_path, n_ctx=512, adapter_cache_dir=tmp_path, kv_cache_type="f32")
    transformers = TransformersProvider(model_name=str(model.hf_dir), device="cpu")
    for provider in (llamacpp, transformers):
        await provider.load_adapter("a0", model.adapter_dirs["a0"])
    yield llamacpp, transformers
    await llamacpp.aclose()
    await transformers.aclose()


def texts(result: GenerationResult) -> list[str]:
    assert result.choices is not None
    return [choice.text for choice in result.choices]


def assert_counts_add_up(result: GenerationResult, prompt_tokens: int) -> None:
    assert result.choices is not None
    assert result.prompt_tokens == prompt_tokens  # the prompt counted once
    assert result.completion_tokens == sum(choice.completion_tokens for choice in result.choices)
    assert result.token_count == prompt_tokens + result.completion_tokens
    for choice in result.choices:
        assert choice.prompt_tokens == prompt_tokens
        assert choice.token_count == prompt_tokens + choice.completion_tokens
        assert choice.choices is None


async def singles(provider: InferenceProvider, seeds: range, **options: Any) -> list[str]:
    return [(await provider.generate(PROMPT, seed=seed, **SAMPLED, **options)).text for seed in seeds]


async def test_greedy_choices_are_equal_and_equal_across_backends_and_their_counts_add_up(
    pair: tuple[LlamaCppProvider, TransformersProvider],
) -> None:
    answers = []
    for provider in pair:
        one = await provider.generate(PROMPT, model="m", adapter_id="a0", temperature=0, max_tokens=12,
                                      return_token_ids=True)
        four = await provider.generate(PROMPT, model="m", adapter_id="a0", temperature=0, max_tokens=12, n=4,
                                       return_token_ids=True)
        assert four.choices is not None and len(four.choices) == 4
        assert texts(four) == [one.text] * 4
        assert [choice.token_ids for choice in four.choices] == [one.token_ids] * 4
        assert four.text == one.text and four.adapter_id == "a0"
        assert_counts_add_up(four, one.prompt_tokens or 0)
        assert four.completion_tokens == 4 * one.completion_tokens
        answers.append([choice.token_ids for choice in four.choices])
    assert answers[0] == answers[1]  # llama.cpp and Transformers: the same tokens


@pytest.mark.parametrize("backend", [0, 1], ids=["llamacpp", "transformers"])
async def test_sampled_choices_with_a_seed_are_reproducible_and_are_the_choices_of_single_requests(
    pair: tuple[LlamaCppProvider, TransformersProvider], backend: int
) -> None:
    provider = pair[backend]
    first = await provider.generate(PROMPT, seed=11, n=4, adapter_id="a0", **SAMPLED)
    again = await provider.generate(PROMPT, seed=11, n=4, adapter_id="a0", **SAMPLED)
    assert texts(first) == texts(again)
    assert len(set(texts(first))) == 4  # seeds 11, 12, 13, 14: different samples
    assert texts(first) == await singles(provider, range(11, 15), adapter_id="a0")
    assert_counts_add_up(first, first.choices[0].prompt_tokens or 0)  # type: ignore[index]
    unseeded = await provider.generate(PROMPT, n=4, **SAMPLED)
    assert len(set(texts(unseeded))) > 1  # each choice samples on its own


async def test_llamacpp_decodes_the_prompt_once_for_n_choices(
    pair: tuple[LlamaCppProvider, TransformersProvider],
) -> None:
    llamacpp = pair[0]
    batcher = llamacpp._batcher
    assert batcher is not None
    before = batcher.prompt_tokens
    four = await llamacpp.generate(PROMPT, seed=3, n=4, **SAMPLED)
    prompt = four.prompt_tokens or 0
    assert prompt > 10 and batcher.prompt_tokens - before == prompt
    before = batcher.prompt_tokens
    apart = await asyncio.gather(*(llamacpp.generate(PROMPT, seed=seed, **SAMPLED) for seed in range(3, 7)))
    assert batcher.prompt_tokens - before == 4 * prompt  # four requests: the prompt four times
    assert [result.text for result in apart] == texts(four)


async def test_transformers_runs_the_prompt_once_for_n_choices(
    pair: tuple[LlamaCppProvider, TransformersProvider],
) -> None:
    transformers = pair[1]
    await transformers.generate(PROMPT, model="m", max_tokens=1)  # loaded
    shapes: list[tuple[int, int]] = []
    assert transformers.model is not None
    embedding = transformers.model.get_input_embeddings()
    hook = embedding.register_forward_pre_hook(lambda module, inputs: shapes.append(tuple(inputs[0].shape)))
    try:
        four = await transformers.generate(PROMPT, seed=3, n=4, **SAMPLED)
    finally:
        hook.remove()
    prompt = four.prompt_tokens or 0
    assert prompt > 10
    # the prompt but its last token once, then one token per row and step (the first step: the prompt's last token)
    assert shapes[0] == (1, prompt - 1)
    assert set(shapes[1:]) == {(4, 1)} and len(shapes) - 1 <= SAMPLED["max_tokens"]


async def test_the_result_reads_as_its_first_choice_tool_calls_included(
    pair: tuple[LlamaCppProvider, TransformersProvider],
) -> None:
    time = {"type": "function", "function": {"name": "time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}}, "required": ["zone"],
        "additionalProperties": False}}}
    schema = {"type": "object", "properties": {"word": {"enum": ["yes", "no", "maybe"]}}, "required": ["word"],
              "additionalProperties": False}
    for provider in pair:
        called = await provider.generate([{"role": "user", "content": "Time?"}], seed=5, n=3, tools=[time],
                                         tool_choice="required", chat_template=TOOLS_CHATML_TEMPLATE,
                                         **{**SAMPLED, "max_tokens": 40})
        assert called.choices is not None and len(called.choices) == 3
        for choice in called.choices:
            assert choice.finish_reason == "tool_calls" and choice.tool_calls is not None
            assert choice.tool_calls[0].name == "time" and choice.tool_calls[0].error is None
        assert called.tool_calls == called.choices[0].tool_calls and called.finish_reason == "tool_calls"
        shaped = await provider.generate(PROMPT, seed=5, n=3, json_schema=schema, **{**SAMPLED, "max_tokens": 40})
        assert shaped.choices is not None
        assert all(json.loads(choice.text)["word"] in ("yes", "no", "maybe") for choice in shaped.choices)


async def test_llamacpp_gives_the_same_choices_in_groups_one_at_a_time_and_in_a_small_context(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    model = tiny_models["qwen2"]
    options: dict[str, Any] = {"adapter_cache_dir": tmp_path, "kv_cache_type": "f32"}
    async with LlamaCppProvider(model.gguf_path, n_ctx=512, n_parallel=4, **options) as provider:
        assert provider._batcher is not None
        before = provider._batcher.prompt_tokens
        six = await provider.generate(PROMPT, seed=20, n=6, **SAMPLED)
        prompt = six.prompt_tokens or 0
        assert provider._batcher.prompt_tokens - before == 2 * prompt  # groups of 4 and 2, each its prompt once
        assert texts(six) == await singles(provider, range(20, 26))
        assert_counts_add_up(six, prompt)
    async with LlamaCppProvider(model.gguf_path, n_ctx=512, n_parallel=1, **options) as provider:
        assert texts(await provider.generate(PROMPT, seed=20, n=6, **SAMPLED)) == texts(six)
    # 4 completions of 8 tokens do not fit beside the prompt in 40 cells, one does: one request per choice
    async with LlamaCppProvider(model.gguf_path, n_ctx=prompt + 12, n_parallel=4, **options) as provider:
        small = await provider.generate(PROMPT, seed=20, n=4, **SAMPLED)
        assert texts(small) == texts(six)[:4]
    async with LlamaCppProvider(model.gguf_path, n_ctx=512, n_parallel=4, seed=20, **options) as provider:
        assert texts(await provider.generate(PROMPT, n=4, **SAMPLED)) == texts(six)[:4]  # the provider's seed + k


async def test_a_cancelled_request_for_n_choices_frees_its_sequences(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    model = tiny_models["qwen2"]
    async with LlamaCppProvider(model.gguf_path, n_ctx=2048, adapter_cache_dir=tmp_path) as provider:
        batcher = provider._batcher
        assert batcher is not None
        task = asyncio.create_task(provider.generate(PROMPT, model="m", n=4, max_tokens=400, temperature=1.0))
        while batcher.running < 4:  # wait for the state: its four sequences decoding
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await provider.generate(PROMPT, model="m", n=2, max_tokens=4, temperature=0)
        assert len(texts(after)) == 2 and batcher.running == 0
        memory = llama_cpp.llama_get_memory(provider._llama.ctx)
        assert [llama_cpp.llama_memory_seq_pos_max(memory, seq_id) for seq_id in range(4)] == [-1] * 4


async def test_transformers_out_of_memory_runs_the_choices_in_halves_with_their_seeds(
    tiny_models: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    async with TransformersProvider(model_name=str(tiny_models["qwen2"].hf_dir), device="cpu") as provider:
        whole = await provider.generate(PROMPT, seed=9, n=4, **SAMPLED)

        def out_of_memory_above_two_rows(module: Any, inputs: tuple[Any, ...]) -> None:
            if inputs[0].shape[0] > 2:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried a batch of {inputs[0].shape[0]} rows")

        assert provider.model is not None
        hook = provider.model.get_input_embeddings().register_forward_pre_hook(out_of_memory_above_two_rows)
        try:
            with caplog.at_level(logging.WARNING, logger="inference.transformers"):
                halved = await provider.generate(PROMPT, seed=9, n=4, **SAMPLED)
        finally:
            hook.remove()
    assert texts(halved) == texts(whole)
    assert [record.getMessage() for record in caplog.records if "out of memory" in record.getMessage()] == [
        "transformers: out of memory generating 4 choices of one request: trying again as 2 and 2"
    ]
