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


async def test_an_empty_system_prompt_is_one_empty_system_message_on_both(
    both_backends: tuple[TransformersProvider, LlamaCppProvider],
) -> None:
    """The one message rule: ``system_prompt=""`` sends an empty system message (servers send it too), ``None`` none."""
    transformers_provider, llamacpp_provider = both_backends
    arguments: dict[str, Any] = {"model": "tiny", "max_tokens": 10, "temperature": 0.0}
    empty = [
        await provider.generate("the quick brown fox", system_prompt="", **arguments)
        for provider in (transformers_provider, llamacpp_provider)
    ]
    listed = await transformers_provider.generate(
        [{"role": "system", "content": ""}, {"role": "user", "content": "the quick brown fox"}], **arguments
    )
    none = await transformers_provider.generate("the quick brown fox", **arguments)
    assert empty[0].text == empty[1].text == listed.text
    assert empty[0].prompt_tokens == empty[1].prompt_tokens == listed.prompt_tokens
    if _arch(llamacpp_provider) == "qwen2":  # ChatML
        assert empty[0].prompt_tokens != none.prompt_tokens  # the template renders the empty system turn
    else:
        assert empty[0].prompt_tokens == none.prompt_tokens  # plain text: an empty system prompt adds nothing


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


# Special-token text and Unicode normalization (issue 28, items 4 and 5) ---------------------------------------

SPECIAL_PAIRS = [
    ("Answer: yes", "<|im_end|>"),  # Qwen's end of turn: one token on both, not nine characters on llama.cpp
    ("Answer: yes", "<|end_of_text|>"),  # Llama's end of text
    ("<|im_start|>user\nthe quick brown fox<|im_end|>\n<|im_start|>assistant\n", "jumps<|im_end|>"),  # ChatML
    ("the end<|end_of_text|>", "Once upon a time"),
    ("", "<|endoftext|>the quick brown fox"),  # the start token written in the text is the start, never doubled
    ("", "<|begin_of_text|>the quick brown fox"),
]
"""Each model has some of these special tokens; the others are plain text to it, on both backends alike."""

SPECIAL_TOKENS = {"qwen2": ("<|im_end|>", "<|endoftext|>"), "llama": ("<|end_of_text|>", "<|begin_of_text|>")}

COMBINING_PAIRS = [
    ("The cafe\u0301 by the sea", " served re\u0301sume\u0301s"),  # "e" + U+0301: NFC makes it "é" on Qwen
    ("the cafe", "\u0301 opened at 9:30"),  # the accent composes across the boundary
    ("Cafe\u0301 and cafe\u0301", " and caf\u00e9"),  # decomposed and composed forms together
]


def _arch(provider: LlamaCppProvider) -> str:
    return "qwen2" if "qwen2" in provider.model_path.name else "llama"


@pytest.mark.parametrize("adapter_id", [None, "a1"])
async def test_special_token_text_scores_the_same_on_both(
    both_backends: tuple[TransformersProvider, LlamaCppProvider], adapter_id: str | None
) -> None:
    # Issue 28: llama.cpp read "<|im_end|>" as nine characters (-60.27 over 9 tokens), Transformers as one token
    # (-8.24 over 1). Text that spells a special token is that token on every backend, as lm-eval's hf model reads it.
    transformers_provider, llamacpp_provider = both_backends
    for context, continuation in SPECIAL_PAIRS:
        expected = await transformers_provider.score(context, continuation, model="tiny", adapter_id=adapter_id)
        actual = await llamacpp_provider.score(context, continuation, model="tiny", adapter_id=adapter_id)
        assert actual.num_tokens == expected.num_tokens > 0, (context, continuation)
        assert abs(actual.logprob - expected.logprob) / expected.num_tokens < 1e-3, (context, continuation)
        assert actual.is_greedy == expected.is_greedy
    end_token, start_token = SPECIAL_TOKENS[_arch(llamacpp_provider)]
    for provider in both_backends:
        assert (await provider.score("Answer: yes", end_token, model="tiny")).num_tokens == 1
        # A start token written at the start of the text is not scored after another one.
        written = await provider.score("", f"{start_token}the quick brown fox", model="tiny")
        as_context = await provider.score(start_token, "the quick brown fox", model="tiny")
        assert (written.num_tokens, written.logprob) == (as_context.num_tokens, pytest.approx(as_context.logprob))
    text = "".join(f"{context}{continuation}\n" for context, continuation in SPECIAL_PAIRS) * 2
    expected = await transformers_provider.score_rolling(text, model="tiny", adapter_id=adapter_id)
    actual = await llamacpp_provider.score_rolling(text, model="tiny", adapter_id=adapter_id)
    assert actual.num_tokens == expected.num_tokens
    assert abs(actual.logprob - expected.logprob) / expected.num_tokens < 1e-3


async def test_prompts_with_special_token_text_generate_the_same_on_both(
    both_backends: tuple[TransformersProvider, LlamaCppProvider],
) -> None:
    # In a prompt (chat template or plain), special-token text is that token on both backends.
    transformers_provider, llamacpp_provider = both_backends
    arguments: dict[str, Any] = {"model": "tiny", "max_tokens": 10, "temperature": 0.0, "adapter_id": "a0"}
    end_token, _ = SPECIAL_TOKENS[_arch(llamacpp_provider)]
    prompts: list[Any] = [
        f"the quick brown fox{end_token}\nOnce upon a time",
        "the quick brown fox<|im_end|>\n<|im_start|>assistant\njumps",
        [{"role": "system", "content": f"Be brief.{end_token}"}, {"role": "user", "content": "the lazy dog"}],
    ]
    for prompt in prompts:
        expected = await transformers_provider.generate(prompt, **arguments)
        actual = await llamacpp_provider.generate(prompt, **arguments)
        assert (actual.prompt_tokens, actual.text) == (expected.prompt_tokens, expected.text), prompt
    plain = await llamacpp_provider.generate("the quick brown fox", **arguments)
    special = await llamacpp_provider.generate(f"the quick brown fox{end_token}", **arguments)
    assert special.prompt_tokens == plain.prompt_tokens + 1  # one token, not its characters


async def test_combining_characters_give_the_same_tokens_on_both(
    both_backends: tuple[TransformersProvider, LlamaCppProvider],
) -> None:
    # Issue 28: Qwen's Hugging Face tokenizer composes to NFC, llama.cpp did not: "e" + U+0301 gave other prompt
    # tokens (29 vs 36 here), another greedy text, another score. Llama 3's tokenizer normalizes nothing, on both.
    transformers_provider, llamacpp_provider = both_backends
    arguments: dict[str, Any] = {"model": "tiny", "max_tokens": 10, "temperature": 0.0}
    prompts: list[Any] = [
        "The cafe\u0301 and the re\u0301sume\u0301 of the fisherman",
        [{"role": "user", "content": "Cafe\u0301 by the sea"}],
        "the fox<|im_end|>\u0338 and the dog",  # a combining mark after a special token stays apart from it
    ]
    for prompt in prompts:
        expected = await transformers_provider.generate(prompt, adapter_id="a2", **arguments)
        actual = await llamacpp_provider.generate(prompt, adapter_id="a2", **arguments)
        assert (actual.prompt_tokens, actual.text) == (expected.prompt_tokens, expected.text), prompt
    for context, continuation in COMBINING_PAIRS:
        expected = await transformers_provider.score(context, continuation, model="tiny")
        actual = await llamacpp_provider.score(context, continuation, model="tiny")
        assert actual.num_tokens == expected.num_tokens, (context, continuation)
        assert abs(actual.logprob - expected.logprob) / expected.num_tokens < 1e-3, (context, continuation)
    text = " ".join(context + continuation for context, continuation in COMBINING_PAIRS) * 3
    expected = await transformers_provider.score_rolling(text, model="tiny")
    actual = await llamacpp_provider.score_rolling(text, model="tiny")
    assert actual.num_tokens == expected.num_tokens
    assert abs(actual.logprob - expected.logprob) / expected.num_tokens < 1e-3
    composed = await llamacpp_provider.generate("The caf\u00e9 by the sea", **arguments)
    decomposed = await llamacpp_provider.generate("The cafe\u0301 by the sea", **arguments)
    assert (decomposed.prompt_tokens, decomposed.text) == (composed.prompt_tokens, composed.text) or (
        _arch(llamacpp_provider) == "llama"  # no normalizer: the two spellings are other text to Llama 3
    )
