"""OpenAI's sampling options in process (issue 25), on llama.cpp and Transformers + PEFT with the same tiny model and
adapter: ``logit_bias``, ``presence_penalty`` and ``frequency_penalty`` give the same greedy tokens on both backends
(one meaning: a bias added to its logit; a token generated ``c`` times loses ``presence * (c > 0) + frequency * c``),
``min_p=1`` keeps only the likeliest token, and ``n`` returns that many choices (the prompt computed once: equal texts
when greedy, the same choices again for the same seed; more in ``test_native_n.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from inference.exceptions import InvalidRequestError
from inference.provider import InferenceProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

pytest.importorskip("llama_cpp")
pytest.importorskip("peft")

PROMPT = "numbers 1 2 3 and"


async def token_ids(provider: InferenceProvider, adapter_id: str | None = "a0", **options: Any) -> list[int | None]:
    result = await provider.generate(PROMPT, model="m", adapter_id=adapter_id, temperature=0, max_tokens=16,
                                     logprobs=0, **options)
    assert result.logprobs is not None
    return [entry.token_id for entry in result.logprobs]


@pytest.fixture(params=["qwen2", "llama"])
async def pair(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any], tmp_path: Path
) -> AsyncIterator[tuple[InferenceProvider, InferenceProvider]]:
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.transformers_provider import TransformersProvider

    model = tiny_models[str(request.param)]
    llamacpp = LlamaCppProvider(model.gguf_path, n_ctx=512, adapter_cache_dir=tmp_path, kv_cache_type="f32")
    transformers = TransformersProvider(model_name=str(model.hf_dir), device="cpu")
    for provider in (llamacpp, transformers):
        await provider.load_adapter("a0", model.adapter_dirs["a0"])
    yield llamacpp, transformers
    await llamacpp.aclose()
    await transformers.aclose()


async def test_logit_bias_and_the_penalties_give_the_same_tokens_on_both_backends(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    llamacpp, transformers = pair
    plain = await token_ids(transformers)
    assert await token_ids(llamacpp) == plain
    assert len(set(plain)) < len(plain), f"the check needs a greedy text that repeats a token: {plain}"
    target = next(token for token in plain if token is not None)
    variants: list[dict[str, Any]] = [
        {"logit_bias": {target: -100}},  # banned: never generated
        {"presence_penalty": 2.0},
        {"frequency_penalty": 2.0},
        {"presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {target: 3.0}},
    ]
    for options in variants:
        theirs, ours = await token_ids(llamacpp, **options), await token_ids(transformers, **options)
        assert theirs == ours, options
        assert ours != plain, options
    assert target not in await token_ids(transformers, logit_bias={target: -100})
    forced = await token_ids(transformers, logit_bias={target: 100})
    assert forced == [target] * 16 == await token_ids(llamacpp, logit_bias={target: 100})


async def test_min_p_1_keeps_only_the_likeliest_token(pair: tuple[InferenceProvider, InferenceProvider]) -> None:
    for provider in pair:
        greedy = await token_ids(provider)
        sampled = await provider.generate(PROMPT, model="m", adapter_id="a0", temperature=1.0, seed=5, min_p=1.0,
                                          max_tokens=16, logprobs=0)
        assert sampled.logprobs is not None
        assert [entry.token_id for entry in sampled.logprobs] == greedy


async def test_n_gives_n_choices_equal_when_greedy_and_reproducible_with_a_seed(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    for provider in pair:
        greedy = await provider.generate(PROMPT, model="m", adapter_id="a0", temperature=0, max_tokens=8, n=4)
        assert greedy.choices is not None and len(greedy.choices) == 4
        assert len({choice.text for choice in greedy.choices}) == 1
        assert greedy.completion_tokens == sum(choice.completion_tokens for choice in greedy.choices)
        first = await provider.generate(PROMPT, model="m", temperature=1.0, seed=11, max_tokens=8, n=4)
        again = await provider.generate(PROMPT, model="m", temperature=1.0, seed=11, max_tokens=8, n=4)
        assert first.choices is not None and again.choices is not None
        assert [choice.text for choice in first.choices] == [choice.text for choice in again.choices]
        assert len({choice.text for choice in first.choices}) > 1  # seeds 11, 12, 13, 14: different samples


TEMPLATE = "{{ lead }}{% for message in messages %}{{ message['content'] }}{% endfor %}"


async def test_raw_prompts_and_template_overrides_read_the_same_tokens_on_both_backends(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    """A raw prompt is the text as it is; a template given with the request (and its variables) renders what the
    same raw text reads; both backends read the same tokens (llama.cpp's template renderer and Transformers')."""
    llamacpp, transformers = pair
    for provider in pair:
        raw = await provider.generate(f"Note: {PROMPT}", model="m", temperature=0, max_tokens=8, logprobs=0,
                                      raw_prompt=True)
        templated = await provider.generate(PROMPT, model="m", temperature=0, max_tokens=8, logprobs=0,
                                            chat_template=TEMPLATE, chat_template_kwargs={"lead": "Note: "})
        assert raw.logprobs is not None and templated.logprobs is not None
        assert [entry.token_id for entry in raw.logprobs] == [entry.token_id for entry in templated.logprobs]
        assert templated.prompt_tokens == raw.prompt_tokens  # the tiny tokenizers add no BOS to a raw prompt
    results = [
        await provider.generate(PROMPT, model="m", temperature=0, max_tokens=8, raw_prompt=True) for provider in pair
    ]
    assert results[0].text == results[1].text
    with pytest.raises(InvalidRequestError, match="chat_template given cannot render"):
        await llamacpp.generate(PROMPT, model="m", max_tokens=2, chat_template="{% for %}")
    with pytest.raises(InvalidRequestError, match="chat_template given cannot render"):
        await transformers.generate(PROMPT, model="m", max_tokens=2, chat_template="{% for %}")
    assert (await llamacpp.generate(PROMPT, model="m", max_tokens=2)).completion_tokens > 0  # still usable


ALTERNATING_TEMPLATE = (  # Gemma 2's rules: no system role, user and assistant in turn
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ message['content'] }}{% endfor %}"
)


async def test_a_template_refusal_says_the_same_on_both_backends_and_names_only_the_fix_that_applies(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    """Roles out of turn: the template's words, and no advice to drop a system prompt nobody sent (it was always
    given on Transformers); with a system prompt: that advice."""
    llamacpp, transformers = pair
    turns = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    refusals = []
    for provider in pair:
        with pytest.raises(InvalidRequestError) as out_of_turn:
            await provider.generate(turns, model="m", max_tokens=2, chat_template=ALTERNATING_TEMPLATE)
        with pytest.raises(InvalidRequestError) as with_system:
            await provider.generate("hi", model="m", max_tokens=2, system_prompt="Be brief.",
                                    chat_template=ALTERNATING_TEMPLATE)
        refusals.append((str(out_of_turn.value), str(with_system.value)))
        assert "roles must alternate" in str(out_of_turn.value) and "system" not in str(out_of_turn.value)
        assert "System role not supported" in str(with_system.value)
        assert "drop the system message (system_prompt)" in str(with_system.value)
    assert refusals[0] == refusals[1]
    assert (await transformers.generate(PROMPT, model="m", max_tokens=2)).completion_tokens == 2  # still usable
    assert (await llamacpp.generate(PROMPT, model="m", max_tokens=2)).completion_tokens == 2


async def test_template_variables_for_a_model_without_a_template_are_refused_on_both_backends(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """The tiny llama has no chat template: chat_template_kwargs and thinking=True were ignored without a word (as
    llama-server refuses them without its Jinja renderer); with a template given, they are read."""
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.transformers_provider import TransformersProvider

    model = tiny_models["llama"]
    async with LlamaCppProvider(model.gguf_path, n_ctx=512, adapter_cache_dir=tmp_path) as llamacpp, \
            TransformersProvider(model_name=str(model.hf_dir), device="cpu") as transformers:
        await _template_variables_refused((llamacpp, transformers))


async def _template_variables_refused(pair: tuple[InferenceProvider, InferenceProvider]) -> None:
    for provider in pair:
        for option in ({"chat_template_kwargs": {"lead": "x"}}, {"thinking": True}):
            with pytest.raises(InvalidRequestError, match=r"acts through a chat template, and .* has none"):
                await provider.generate(PROMPT, model="m", max_tokens=2, **option)
        # thinking=False asks for what the model does anyway (an agent loop may send it to every model)
        plain = await provider.generate(PROMPT, model="m", max_tokens=2, temperature=0)
        unthinking = await provider.generate(PROMPT, model="m", max_tokens=2, temperature=0, thinking=False)
        assert unthinking.text == plain.text
        as_variable = await provider.generate(PROMPT, model="m", max_tokens=2, temperature=0,
                                              chat_template_kwargs={"enable_thinking": False})
        assert as_variable.text == plain.text
        templated = await provider.generate(PROMPT, model="m", max_tokens=2, chat_template=TEMPLATE,
                                            chat_template_kwargs={"lead": "Note: "})
        assert templated.completion_tokens == 2


THINKING_TEMPLATE = (
    "{% if enable_thinking is defined and not enable_thinking %}No thinking. {% endif %}"
    "{% for message in messages %}{{ message['content'] }}{% endfor %}"
)
"""A template that honours ``enable_thinking`` as Qwen3's does (``False`` writes into the prompt)."""


async def test_thinking_is_the_template_s_enable_thinking_on_both_backends(
    pair: tuple[InferenceProvider, InferenceProvider],
) -> None:
    """``thinking=False`` renders what ``chat_template_kwargs={"enable_thinking": False}`` renders (the raw text
    with the template's no-thinking words); ``thinking=True`` renders the prompt alone; the same on both backends."""
    texts = []
    for provider in pair:
        def ids(result: Any) -> list[int | None]:
            assert result.logprobs is not None
            return [entry.token_id for entry in result.logprobs]

        greedy: dict[str, Any] = {"model": "m", "temperature": 0, "max_tokens": 8, "logprobs": 0}
        off = await provider.generate(PROMPT, chat_template=THINKING_TEMPLATE, thinking=False, **greedy)
        off_by_variable = await provider.generate(PROMPT, chat_template=THINKING_TEMPLATE,
                                                  chat_template_kwargs={"enable_thinking": False}, **greedy)
        on = await provider.generate(PROMPT, chat_template=THINKING_TEMPLATE, thinking=True, **greedy)
        raw_off = await provider.generate(f"No thinking. {PROMPT}", raw_prompt=True, **greedy)
        raw_on = await provider.generate(PROMPT, raw_prompt=True, **greedy)
        assert ids(off) == ids(off_by_variable) == ids(raw_off)
        assert off.prompt_tokens == raw_off.prompt_tokens
        assert ids(on) == ids(raw_on) and on.prompt_tokens == raw_on.prompt_tokens
        assert off.prompt_tokens != on.prompt_tokens
        texts.append((off.text, on.text))
        with pytest.raises(InvalidRequestError, match="disagree"):
            await provider.generate(PROMPT, thinking=True, chat_template_kwargs={"enable_thinking": False}, **greedy)
    assert texts[0] == texts[1]
