"""The thinking switch and the reasoning apart: the splitting rule, over whole texts and over every way a stream may
cut them, and the base class applying it to in-process providers (results and streams alike)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest

from inference._core.thinking import ThinkingStream, split_thinking, template_variables
from inference._core.validation import GenerationRequest
from inference.fake_provider import FakeProvider
from inference.options import ByRequests, OptionMap, Sent
from inference.provider import InferenceProvider
from inference.results import GenerationResult, StreamEvent

TEXTS = {
    "<think>\nLet me see.\n</think>\n\nParis.": ("Paris.", "Let me see."),
    "  <think>a < b</think>b": ("b", "a < b"),
    "<think>cut inside the reasoning": ("", "cut inside the reasoning"),
    "<think></think>\n\nNo thoughts.": ("No thoughts.", ""),
    "Plain answer </think> later": ("Plain answer </think> later", None),
    "<thin": ("<thin", None),
    "  <": ("  <", None),
    "": ("", None),
    " \n ": (" \n ", None),
    "<think>only</think>": ("", "only"),
}


@pytest.mark.parametrize("text", list(TEXTS))
def test_a_leading_think_block_is_the_reasoning_and_the_rest_the_answer(text: str) -> None:
    assert split_thinking(text) == TEXTS[text]


@pytest.mark.parametrize("text", list(TEXTS))
def test_streamed_pieces_join_to_the_answer_however_the_stream_cuts_the_text(text: str) -> None:
    """Every cut of the text into up to three pieces (and one character at a time): the pieces given out join to the
    answer split_thinking gives, so no reasoning leaks into a stream."""
    cuts = [list(cut) for size in range(3) for cut in itertools.combinations(range(1, len(text)), size)]
    for points in [*cuts, list(range(1, len(text)))]:
        bounds = [0, *points, len(text)]
        stream = ThinkingStream()
        given = "".join(stream.feed(text[start:end]) for start, end in itertools.pairwise(bounds)) + stream.flush()
        assert given == TEXTS[text][0], (text, points)


def test_thinking_is_the_template_s_enable_thinking() -> None:
    request = GenerationRequest.from_arguments(
        provider="t", prompt="Hi", model="m", chat_template_kwargs={"lang": "fr"}, thinking=False
    )
    assert template_variables(request) == {"lang": "fr", "enable_thinking": False}
    assert template_variables(GenerationRequest.from_arguments(provider="t", prompt="Hi", model="m")) == {}


class ThinkingModel(InferenceProvider):
    """An in-process provider whose model thinks first, its text given in small pieces."""

    name = "thinking-model"
    options: ClassVar[OptionMap] = {**FakeProvider.options, "n": ByRequests()}
    runs_in_process = True
    TEXT = "<think>\nThe user greets.\n</think>\n\nHello there."

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        return GenerationResult(text=self.TEXT, model="m", adapter_id=None, token_count=20, finish_reason="stop",
                                prompt_tokens=5, completion_tokens=15)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        for start in range(0, len(self.TEXT), 3):
            yield self.TEXT[start:start + 3]
        yield await self._generate(request)


async def test_in_process_results_and_streams_carry_the_reasoning_apart() -> None:
    async with ThinkingModel() as provider:
        result = await provider.generate("Hi", model="m", thinking=True)
        assert (result.text, result.reasoning) == ("Hello there.", "The user greets.")
        assert result.completion_tokens == 15  # the reasoning's tokens are generated tokens
        events = [event async for event in provider.stream("Hi", model="m")]
        pieces, final = events[:-1], events[-1]
        assert isinstance(final, GenerationResult)
        assert "".join(str(piece) for piece in pieces) == final.text == "Hello there."
        assert final.reasoning == "The user greets."
        both = await provider.generate("Hi", model="m", n=2)
        assert [(one.text, one.reasoning) for one in both.choices or ()] == [("Hello there.", "The user greets.")] * 2
        raw = await provider.generate("Hi", model="m", raw_prompt=True)  # the caller's own prompt: left as it is
        assert (raw.text, raw.reasoning) == (ThinkingModel.TEXT, None)


class NativeChoices(ThinkingModel):
    """The same model with a native ``n``: its backend answers with every choice at once."""

    options: ClassVar[OptionMap] = {**FakeProvider.options, "n": Sent("n")}

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        one = await super()._generate(request)
        return GenerationResult.from_choices([one] * request.n)


async def test_a_native_n_reads_as_its_first_choice_with_the_reasoning_apart() -> None:
    async with NativeChoices() as provider:
        result = await provider.generate("Hi", model="m", n=2)
    assert (result.text, result.reasoning) == ("Hello there.", "The user greets.")
    assert [(one.text, one.reasoning) for one in result.choices or ()] == [("Hello there.", "The user greets.")] * 2
