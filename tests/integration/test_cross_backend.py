"""The same request gives the same greedy tokens on Transformers+PEFT and on llama.cpp.

Both providers load the same tiny model (HF directory and its GGUF twin) and the same PEFT adapter
directories (llama.cpp converts them to GGUF LoRA on load). Equal outputs prove the conversion, the llama q/k
permutation, the hot-swap and the shared prompt rule together.

Near-ties: the tiny models' smallest top-2 logit margin on these prompts is about 0.03, while the two backends
agree within about 1e-5 when llama.cpp keeps its KV cache in f32 (``kv_cache_type="f32"``), so exact equality
of greedy text is a sound check here; with llama.cpp's default f16 cache it would not be.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from inference.llamacpp_provider import LlamaCppProvider
from inference.transformers_provider import TransformersProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

PROMPTS = ["the quick brown fox", "Once upon a time there was", "numbers 1 2 3 and"]
ADAPTERS = [None, "a0", "a1", "a2"]


@pytest_asyncio.fixture(params=["qwen2", "llama"], scope="module", loop_scope="module")
async def both_backends(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any]
) -> AsyncIterator[tuple[TransformersProvider, LlamaCppProvider]]:
    model = tiny_models[request.param]
    transformers_provider = TransformersProvider(model_name=str(model.hf_dir), torch_dtype="float32")
    llamacpp_provider = LlamaCppProvider(model_path=model.gguf_path, n_ctx=512, kv_cache_type="f32")
    for adapter_id, adapter_dir in model.adapter_dirs.items():
        await transformers_provider.load_adapter(adapter_id, adapter_dir)
        await llamacpp_provider.load_adapter(adapter_id, adapter_dir)
    yield transformers_provider, llamacpp_provider
    await transformers_provider.aclose()
    await llamacpp_provider.aclose()


@pytest.mark.parametrize("adapter_id", ADAPTERS)
async def test_greedy_tokens_match_across_backends(
    both_backends: tuple[TransformersProvider, LlamaCppProvider], adapter_id: str | None
) -> None:
    transformers_provider, llamacpp_provider = both_backends
    for prompt in PROMPTS:
        expected = await transformers_provider.generate(
            prompt, model="tiny", adapter_id=adapter_id, max_tokens=12, temperature=0.0
        )
        actual = await llamacpp_provider.generate(
            prompt, model="tiny", adapter_id=adapter_id, max_tokens=12, temperature=0.0
        )
        assert actual.text == expected.text, (prompt, adapter_id)
        assert (actual.prompt_tokens, actual.completion_tokens) == (expected.prompt_tokens, expected.completion_tokens)
        assert actual.model == expected.model


async def test_system_prompt_renders_the_same_on_both(
    both_backends: tuple[TransformersProvider, LlamaCppProvider],
) -> None:
    transformers_provider, llamacpp_provider = both_backends
    arguments: dict[str, Any] = {"model": "tiny", "max_tokens": 10, "temperature": 0.0, "system_prompt": "Be brief."}
    expected = await transformers_provider.generate("the quick brown fox", adapter_id="a1", **arguments)
    actual = await llamacpp_provider.generate("the quick brown fox", adapter_id="a1", **arguments)
    assert actual.text == expected.text
    assert actual.prompt_tokens == expected.prompt_tokens


SCORE_PAIRS = [
    ("the quick brown fox", " jumps over the lazy dog"),
    ("Once upon a time there was ", "a king"),  # the trailing space moves to the continuation
    ("", "numbers 1 2 3 and"),  # an empty context starts from the BOS token
]


@pytest.mark.parametrize("adapter_id", ADAPTERS)
async def test_scores_match_across_backends(
    both_backends: tuple[TransformersProvider, LlamaCppProvider], adapter_id: str | None
) -> None:
    # Same adapter, same numbers: within 1e-3 nats per token (they agree to about 1e-5 with an f32 KV cache).
    transformers_provider, llamacpp_provider = both_backends
    for context, continuation in SCORE_PAIRS:
        expected = await transformers_provider.score(context, continuation, model="tiny", adapter_id=adapter_id)
        actual = await llamacpp_provider.score(context, continuation, model="tiny", adapter_id=adapter_id)
        assert actual.num_tokens == expected.num_tokens > 0
        assert abs(actual.logprob - expected.logprob) / expected.num_tokens < 1e-3, (context, adapter_id)
        assert actual.is_greedy == expected.is_greedy
    text = " ".join(f"{first} {second}" for first, _ in SCORE_PAIRS for second in ("and", "then")) * 3
    expected = await transformers_provider.score_rolling(text, model="tiny", adapter_id=adapter_id)
    actual = await llamacpp_provider.score_rolling(text, model="tiny", adapter_id=adapter_id)
    assert actual.num_tokens == expected.num_tokens
    assert abs(actual.logprob - expected.logprob) / expected.num_tokens < 1e-3


@pytest.mark.parametrize("adapter_id", [None, "a1"])
async def test_greedy_token_logprobs_match_across_backends(
    both_backends: tuple[TransformersProvider, LlamaCppProvider], adapter_id: str | None
) -> None:
    transformers_provider, llamacpp_provider = both_backends
    arguments: dict[str, Any] = {"model": "tiny", "adapter_id": adapter_id, "max_tokens": 8, "temperature": 0.0}
    expected = await transformers_provider.generate(PROMPTS[0], logprobs=3, **arguments)
    actual = await llamacpp_provider.generate(PROMPTS[0], logprobs=3, **arguments)
    assert expected.logprobs is not None and actual.logprobs is not None
    assert [entry.token_id for entry in actual.logprobs] == [entry.token_id for entry in expected.logprobs]
    for ours, theirs in zip(actual.logprobs, expected.logprobs, strict=True):
        assert abs(ours.logprob - theirs.logprob) < 1e-3
        assert [token for token, _ in ours.top_logprobs] == [token for token, _ in theirs.top_logprobs]
        for (_, mine), (_, other) in zip(ours.top_logprobs, theirs.top_logprobs, strict=True):
            assert abs(mine - other) < 1e-3


async def test_a_conversation_renders_the_same_on_both(
    both_backends: tuple[TransformersProvider, LlamaCppProvider],
) -> None:
    transformers_provider, llamacpp_provider = both_backends
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "the quick brown fox"},
        {"role": "assistant", "content": "jumps"},
        {"role": "user", "content": "and then?"},
    ]
    arguments: dict[str, Any] = {"model": "tiny", "max_tokens": 10, "temperature": 0.0, "adapter_id": "a2"}
    expected = await transformers_provider.generate(conversation, **arguments)
    actual = await llamacpp_provider.generate(conversation, **arguments)
    assert actual.text == expected.text
    assert actual.prompt_tokens == expected.prompt_tokens
