"""An adapter or a scale too large for the model's numbers gives NaN logits: the request fails with ProviderError
(it used to answer ``text=''`` with ``finish_reason="stop"``, or a NaN score), alone and in a batch, on llama.cpp
(one request at a time and the batched decode loop) and on Transformers; the other requests of the batch and the
provider go on unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from inference.exceptions import ProviderError
from inference.provider import InferenceProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

pytest.importorskip("llama_cpp")
pytest.importorskip("peft")

PROMPT = "Once upon a time"
GREEDY: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "temperature": 0}
NOT_FINITE = "logits are not finite"
# Each one makes the tiny model's logits NaN: a huge scale, or a huge (float32-sized) lora_alpha.
OVERFLOWING: list[Any] = [("a0", 1e6), ("a0", -1e30), "huge"]  # 1e6: NaN on llama.cpp, all-zero logits on PyTorch


def huge_alpha_copy(source: Path, target: Path) -> Path:
    """The adapter with lora_alpha 1e30: within float32, so it loads; its delta overflows the activations."""
    shutil.copytree(source, target)
    config = json.loads((target / "adapter_config.json").read_text())
    config["lora_alpha"] = 1e30
    (target / "adapter_config.json").write_text(json.dumps(config))
    return target


@pytest_asyncio.fixture(
    params=["transformers", "llamacpp-alone", "llamacpp-batched"], scope="module", loop_scope="module"
)
async def provider(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[InferenceProvider]:
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.transformers_provider import TransformersProvider

    model = tiny_models["qwen2"]
    tmp = tmp_path_factory.mktemp("non-finite")
    backend: InferenceProvider
    if request.param == "transformers":
        backend = TransformersProvider(model_name=str(model.hf_dir), torch_dtype="float32")
    else:
        n_parallel = 1 if request.param == "llamacpp-alone" else 4
        backend = LlamaCppProvider(
            model.gguf_path, n_ctx=512, n_parallel=n_parallel, adapter_cache_dir=tmp / "cache", kv_cache_type="f32"
        )
    await backend.load_adapter("a0", model.adapter_dirs["a0"])
    await backend.load_adapter("huge", huge_alpha_copy(model.adapter_dirs["a0"], tmp / "huge"))
    yield backend
    await backend.aclose()


@pytest.mark.parametrize("adapter_id", OVERFLOWING, ids=["scale-1e6", "scale--1e30", "lora_alpha-1e30"])
async def test_generate_and_stream_fail_instead_of_answering_nothing(
    provider: InferenceProvider, adapter_id: Any
) -> None:
    reference = await provider.generate(PROMPT, adapter_id="a0", **GREEDY)
    assert reference.text
    for extra in ({}, {"logprobs": 2}, {"temperature": 0.8, "seed": 3}, {"json_schema": {"type": "object"}}):
        with pytest.raises(ProviderError, match=NOT_FINITE) as caught:
            await provider.generate(PROMPT, adapter_id=adapter_id, **{**GREEDY, **extra})
        assert "lower the scale or check the adapter" in str(caught.value)
    pieces: list[Any] = []
    with pytest.raises(ProviderError, match=NOT_FINITE):
        async for event in provider.stream(PROMPT, adapter_id=adapter_id, **GREEDY):
            pieces.append(event)
    assert pieces == []  # no text from logits that could not choose a token
    again = await provider.generate(PROMPT, adapter_id="a0", **GREEDY)
    assert (again.text, again.finish_reason) == (reference.text, reference.finish_reason)


async def test_score_fails_instead_of_returning_nan(provider: InferenceProvider) -> None:
    reference = await provider.score(PROMPT, " there was", model="tiny", adapter_id="a0")
    with pytest.raises(ProviderError, match=NOT_FINITE) as caught:
        await provider.score(PROMPT, " there was", model="tiny", adapter_id="huge")
    assert "adapter 'huge'" in str(caught.value)
    with pytest.raises(ProviderError, match=NOT_FINITE):
        await provider.score_rolling(PROMPT + " there was", model="tiny", adapter_id="huge")
    again = await provider.score(PROMPT, " there was", model="tiny", adapter_id="a0")
    assert again.logprob == pytest.approx(reference.logprob, abs=1e-9)


async def test_next_token_distributions_fail_instead_of_returning_nan_and_leave_none_behind(
    provider: InferenceProvider,
) -> None:
    ids = await provider.tokenize(PROMPT, "tiny")
    sequences = [ids, [*ids, ids[0]], [*ids, ids[-1]]]  # decoded together on llama.cpp's batched provider
    before = await provider.batch_next_token_logprobs(sequences, "tiny", "a0")
    with pytest.raises(ProviderError, match=NOT_FINITE):
        await provider.batch_next_token_logprobs([[*ids, token] for token in ids[:3]], "tiny", "huge")
    after = await provider.batch_next_token_logprobs(sequences, "tiny", "a0")
    for old, new in zip(before, after, strict=True):
        assert float(abs(old - new).max()) < 1e-6


async def test_a_failed_request_leaves_no_nan_behind_for_the_next_ones(provider: InferenceProvider) -> None:
    """llama.cpp frees a failed sequence's KV cells but keeps their values: NaN there poisoned every later score
    (0 x NaN in attention over masked cells) until the cache is wiped."""
    scores = {
        choice: await provider.score(PROMPT, " there was", model="tiny", adapter_id=choice) for choice in ("a0", None)
    }
    text = (await provider.generate(PROMPT, adapter_id=None, **GREEDY)).text
    for failing in (("a0", -1e30), "huge"):
        with contextlib.suppress(ProviderError):  # raised: the test above is about that
            await provider.generate(PROMPT + " in a land far away", adapter_id=failing, **GREEDY)
        for choice, before in scores.items():
            after = await provider.score(PROMPT, " there was", model="tiny", adapter_id=choice)
            assert after.logprob == pytest.approx(before.logprob, abs=1e-9)
        assert (await provider.generate(PROMPT, adapter_id=None, **GREEDY)).text == text


async def test_concurrent_requests_beside_a_failing_one_get_their_own_answers(provider: InferenceProvider) -> None:
    alone = {
        choice: (await provider.generate(PROMPT, adapter_id=choice, **GREEDY)).text for choice in ("a0", None)
    }
    score = await provider.score(PROMPT, " there was", model="tiny", adapter_id="a0")
    answers = await asyncio.gather(
        provider.generate(PROMPT, adapter_id="a0", **GREEDY),
        provider.generate(PROMPT, adapter_id=("a0", 1e6), **GREEDY),
        provider.generate(PROMPT, adapter_id=None, **GREEDY),
        provider.generate(PROMPT, adapter_id="huge", **GREEDY),
        # float32's largest scales: the stacks' masked product gave inf * 0 = NaN in the other rows (they failed)
        provider.generate(PROMPT, adapter_id=("a0", 3e38), **GREEDY),
        provider.generate(PROMPT, adapter_id=[("a0", 1.0), ("huge", 3e38)], **GREEDY),
        return_exceptions=True,
    )
    assert [type(answer) for answer in answers[1::2]] == [ProviderError] * 3
    assert [answer.text for answer in answers[0:3:2]] == [alone["a0"], alone[None]]  # type: ignore[union-attr]
    assert isinstance(answers[4], ProviderError), answers[4]
    after = await provider.score(PROMPT, " there was", model="tiny", adapter_id="a0")
    assert after.logprob == pytest.approx(score.logprob, abs=1e-9)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def batching(
    tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[InferenceProvider]:
    """Transformers that runs a batch only once three requests wait (the window is never what starts it)."""
    from inference.transformers_provider import TransformersProvider

    model = tiny_models["qwen2"]
    backend = TransformersProvider(
        model_name=str(model.hf_dir), torch_dtype="float32", max_batch_size=3, batch_window_ms=60_000
    )
    await backend.load_adapter("a0", model.adapter_dirs["a0"])
    huge = huge_alpha_copy(model.adapter_dirs["a0"], tmp_path_factory.mktemp("batching") / "huge")
    await backend.load_adapter("huge", huge)
    yield backend
    await backend.aclose()


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "top_k": 5}], ids=["greedy", "sampled"])
async def test_a_nan_row_fails_alone_in_its_transformers_batch(
    batching: InferenceProvider, sampling: dict[str, Any]
) -> None:
    """One ``generate`` over three rows with three adapters: the NaN row fails, the others are answered from the
    same batch (sampling from NaN used to fail the whole batch in torch.multinomial; greedy gave the row '')."""
    arguments: dict[str, Any] = {"model": "tiny", "max_tokens": 8, **sampling}

    async def three(adapters: list[Any]) -> list[Any]:
        before = len(batching.recent_batch_sizes)  # type: ignore[attr-defined]
        answers = await asyncio.gather(
            *(batching.generate(PROMPT, adapter_id=adapter_id, **arguments) for adapter_id in adapters),
            return_exceptions=True,
        )
        assert batching.recent_batch_sizes[before:] == (3,)  # type: ignore[attr-defined]
        return answers

    answers = await three(["a0", "huge", None])
    assert isinstance(answers[1], ProviderError) and NOT_FINITE in str(answers[1])
    assert all(isinstance(answer.text, str) for answer in (answers[0], answers[2]))
    if sampling["temperature"] == 0:  # greedy rows answer as in a batch without the failing row
        reference = await three(["a0", None, None])
        assert [answers[0].text, answers[2].text] == [reference[0].text, reference[1].text]

    async def scores(adapters: list[str | None]) -> list[Any]:
        return await asyncio.gather(
            *(batching.score(PROMPT, " there was", model="tiny", adapter_id=adapter_id) for adapter_id in adapters),
            return_exceptions=True,
        )

    scored = await scores(["a0", "huge", None])
    assert isinstance(scored[1], ProviderError) and NOT_FINITE in str(scored[1])
    reference_scores = await scores(["a0", None, None])
    assert scored[0].logprob == pytest.approx(reference_scores[0].logprob, abs=1e-4)
    assert scored[2].logprob == pytest.approx(reference_scores[1].logprob, abs=1e-4)


async def test_equal_logits_from_a_zero_hidden_state_are_an_answer_not_an_overflow(tiny_models: dict[str, Any]) -> None:
    """After a token whose embedding is zero (a padding token's, untouched by training), the hidden state is 0 and
    every logit equal: a uniform distribution the model really gives, which scores and generates (vLLM gives the
    same). Only a hidden state that overflowed before the final norm fails."""
    from inference.transformers_provider import TransformersProvider

    async with TransformersProvider(model_name=str(tiny_models["qwen2"].hf_dir), torch_dtype="float32") as provider:
        before = await provider.score("the", " fox", model="tiny")

        def zero_the_embeddings_of_the() -> None:
            import torch

            loaded = provider._loaded
            assert loaded is not None
            tokens = loaded.tokenizer("the", add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                loaded.base_model.get_input_embeddings().weight[tokens] = 0.0

        await provider._worker.run(zero_the_embeddings_of_the)
        after = await provider.score("the", " fox", model="tiny")  # the context's hidden states are all 0
        assert math.isfinite(after.logprob) and after.logprob != before.logprob
        assert (await provider.generate("the", model="tiny", max_tokens=2, temperature=0)).completion_tokens >= 1
        await provider.load_adapter("a0", tiny_models["qwen2"].adapter_dirs["a0"])
        with pytest.raises(ProviderError, match=NOT_FINITE):  # an overflow still fails, as before
            await provider.generate(PROMPT, adapter_id=("a0", 1e6), **GREEDY)
