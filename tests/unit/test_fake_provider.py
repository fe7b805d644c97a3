"""The fake provider, and the argument checks every provider shares (run through it)."""

from __future__ import annotations

import pytest

from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    InvalidRequestError,
    UnsupportedOperationError,
)
from inference.fake_provider import FakeProvider
from inference.provider import GenerationResult, InferenceProvider


async def test_fake_output_depends_on_prompt_and_adapter() -> None:
    async with FakeProvider() as fake:
        await fake.load_adapter("style", "/adapters/style")
        base = await fake.generate("Hello there", model="m")
        again = await fake.generate("Hello there", model="m")
        other_prompt = await fake.generate("Goodbye", model="m")
        adapted = await fake.generate("Hello there", model="m", adapter_id="style")
    assert base == again
    assert base.text != other_prompt.text
    assert adapted.text != base.text and adapted.adapter_id == "style"
    assert base.token_count == base.prompt_tokens + base.completion_tokens


async def test_fake_honours_max_tokens_and_stop() -> None:
    fake = FakeProvider()
    full = await fake.generate("p", model="m")
    short = await fake.generate("p", model="m", max_tokens=2)
    assert short.finish_reason == "length" and short.completion_tokens == 2
    assert full.text.startswith(short.text)
    stop_word = full.text.split()[2]
    stopped = await fake.generate("p", model="m", stop=[stop_word])
    assert stopped.finish_reason == "stop" and stop_word not in stopped.text


async def test_fake_adapter_lifecycle_and_errors() -> None:
    fake = FakeProvider()
    await fake.load_adapter("b", "/x/b")
    await fake.load_adapter("a", "/x/a")
    assert await fake.list_adapters() == ["a", "b"]
    with pytest.raises(AdapterAlreadyLoadedError, match="already loaded"):
        await fake.load_adapter("a", "/x/other")
    await fake.unload_adapter("a")
    with pytest.raises(AdapterNotFoundError, match="not loaded"):
        await fake.unload_adapter("a")
    with pytest.raises(AdapterNotFoundError, match="load_adapter first"):
        await fake.generate("p", model="m", adapter_id="a")
    assert (await fake.generate("p", model="m", adapter_id="b")).adapter_id == "b"


BAD_GENERATE_ARGUMENTS = [
    ({"prompt": 42}, "prompt must be a string"),
    ({"prompt": None}, "prompt must be a string"),
    ({"model": 3}, "model must be a string"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"max_tokens": -5}, "max_tokens must be a positive integer"),
    ({"max_tokens": 2.5}, "max_tokens must be a positive integer"),
    ({"max_tokens": True}, "max_tokens must be a positive integer"),
    ({"temperature": -0.1}, "temperature must be a number"),
    ({"temperature": float("nan")}, "temperature must be a number"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"top_p": 0}, "top_p must be a number"),
    ({"top_p": 1.5}, "top_p must be a number"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a number"),
    ({"top_k": -1}, "top_k must be a non-negative integer"),
    ({"seed": "abc"}, "seed must be an integer"),
    ({"stop": [""]}, "stop must be"),
    ({"stop": 5}, "stop must be"),
    ({"system_prompt": 7}, "system_prompt must be a string"),
    ({"adapter_id": "../etc/passwd"}, "adapter id"),
    ({"adapter_id": "a;rm -rf /"}, "adapter id"),
    ({"adapter_id": "with space"}, "adapter id"),
    ({"adapter_id": ""}, "adapter id"),
]


@pytest.mark.parametrize(("override", "message"), BAD_GENERATE_ARGUMENTS)
async def test_bad_generate_arguments_are_refused_and_provider_stays_usable(
    override: dict[str, object], message: str
) -> None:
    fake = FakeProvider()
    arguments: dict[str, object] = {"prompt": "hi", "model": "m", **override}
    with pytest.raises(InvalidRequestError, match=message):
        await fake.generate(**arguments)  # type: ignore[arg-type]
    assert (await fake.generate("hi", model="m")).text


@pytest.mark.parametrize("adapter_id", ["a/b", "a\\b", "$(x)", "`x`", "a|b", "-leading-dash", 5])
async def test_unsafe_adapter_ids_are_refused_at_load(adapter_id: object) -> None:
    fake = FakeProvider()
    with pytest.raises(InvalidRequestError, match="adapter id"):
        await fake.load_adapter(adapter_id, "/x")  # type: ignore[arg-type]
    assert await fake.list_adapters() == []


async def test_empty_adapter_path_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="adapter_path"):
        await FakeProvider().load_adapter("a", "")


async def test_unsupported_operation_names_the_provider_class() -> None:
    class NoAdapters(InferenceProvider):
        name = "none"

        async def _generate(self, request):  # type: ignore[no-untyped-def]
            return GenerationResult(request.prompt, "m", None, 1, "stop")

    provider = NoAdapters()
    with pytest.raises(UnsupportedOperationError, match="NoAdapters does not support load_adapter"):
        await provider.load_adapter("a", "/x")
    assert await provider.list_adapters() == []
    assert (await provider.generate("echo", model="m")).text == "echo"


async def test_a_score_longer_than_the_context_is_refused_as_a_real_models_is() -> None:
    """scores.md: context and continuation longer than the window are an InvalidRequestError (a TokenLimitError
    of kind "context", which a FallbackProvider moves on); the fake scored any length."""
    from inference.exceptions import InvalidRequestError, TokenLimitError

    fake = FakeProvider(context_length=32)
    assert (await fake.score("the cat sat on", " the mat", model="m")).num_tokens == 2
    with pytest.raises(TokenLimitError, match="more than the model's context of 32 tokens") as caught:
        await fake.score("word " * 20, " end", model="m")
    assert isinstance(caught.value, InvalidRequestError) and caught.value.kind == "context"
    assert (await fake.score_rolling("word " * 20, model="m")).num_tokens == 20  # rolling windows: any length


async def test_a_stop_string_cut_streams_the_text_whole_and_counts_the_words_until_it() -> None:
    """The pieces make the text (the blank before a cut was lost in a stream), and completion_tokens counts the
    words generated until the stop string was complete (it counted every word of the uncut answer)."""
    fake = FakeProvider()
    whole = await fake.generate("Tell me", model="m", max_tokens=12)
    words = whole.text.split()[1:]  # after the [label]
    stop = words[2][:2]  # inside the third word: the third word completes it
    cut = await fake.generate("Tell me", model="m", max_tokens=12, stop=[stop])
    assert cut.text.endswith(" ") and cut.finish_reason == "stop"
    assert cut.completion_tokens == 3 and cut.token_count == cut.prompt_tokens + 3
    events = [event async for event in fake.stream("Tell me", model="m", max_tokens=12, stop=[stop])]
    assert "".join(str(event) for event in events[:-1]) == events[-1].text == cut.text  # type: ignore[union-attr]
