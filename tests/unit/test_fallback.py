"""FallbackProvider: the next provider answers when one is down, slow or failing; a bad request never moves on.

Failures come from fake providers that raise each error the SDK raises, from an OpenAI-compatible provider whose
server answers 5xx/4xx (respx, with OpenAI's error bodies), and from a loopback port where nothing listens.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import httpx
import pytest
import respx

import inference
from inference import FallbackProvider, GenerationResult
from inference._core.validation import GenerationRequest, ScoreRequest
from inference.exceptions import (
    AdapterNotFoundError,
    InvalidAdapterError,
    InvalidRequestError,
    ModelLoadError,
    ProtocolError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    TokenLimitError,
    UnsupportedOperationError,
)
from inference.fake_provider import FakeProvider
from inference.fallback import falls_through
from inference.openai_provider import OpenAIProvider
from inference.options import OptionMap, Refused
from inference.results import ScoreResult, StreamEvent
from inference.tokens import TokenIds

BASE = "http://gateway.test:4000/v1"
CHAT = f"{BASE}/chat/completions"


class Failing(FakeProvider):
    """A fake whose backend raises ``error`` (on generate, stream before its first piece, score, load)."""

    def __init__(self, error: Exception, *, after_pieces: int | None = None) -> None:
        super().__init__()
        self.error = error
        self.after_pieces = after_pieces
        self.calls = 0

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        raise self.error

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        if self.after_pieces is None:
            raise self.error
        async for event in super()._stream(request):
            if self.after_pieces == 0:
                raise self.error
            self.after_pieces -= 1
            yield event

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        self.calls += 1
        raise self.error

    async def _load_adapter(self, adapter_id: str, adapter_path: str) -> None:
        self.calls += 1
        raise self.error


def openai_error(status: int, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message, "type": "server_error", "param": None,
                                                  "code": None}})


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


FALLING_THROUGH = [
    ProviderUnavailableError("nothing answers at http://127.0.0.1:9"),
    ProviderTimeoutError("no answer within 5 s"),
    ProtocolError("the answer is not JSON"),
    ModelLoadError("the GGUF file is truncated"),
    UnsupportedOperationError("cannot honour the option tools"),
    TimeoutError(),
    TokenLimitError("the prompt is 818 tokens, which does not fit the context of 256", limit=255, value=818,
                    kind="context"),
]


@pytest.mark.parametrize("error", FALLING_THROUGH, ids=lambda error: type(error).__name__)
async def test_the_next_provider_answers_when_one_fails_that_way(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    primary, secondary = Failing(error), FakeProvider()
    fallback = FallbackProvider([primary, secondary], labels=["primary", "secondary"])
    with caplog.at_level(logging.WARNING, logger="inference"):
        result = await fallback.generate("Hi", model="m", max_tokens=3)
    assert result.provider == "secondary" and primary.calls == 1
    assert result.text == (await secondary.generate("Hi", model="m", max_tokens=3)).text
    stats = fallback.stats()
    assert (stats["primary"].failed, stats["secondary"].answered) == (1, 1)
    assert stats["primary"].last_error is not None and type(error).__name__ in stats["primary"].last_error
    assert "fallback: primary failed generate" in caplog.text and "trying secondary" in caplog.text


@pytest.mark.parametrize(
    "error",
    [
        InvalidRequestError("the json_schema is not a schema"),
        TokenLimitError("token_ids[3] is 70000, outside the vocabulary", limit=65536, value=70000, kind="vocabulary"),
        InvalidAdapterError("bad adapter"),
        ValueError("a bug"),
    ],
    ids=lambda error: type(error).__name__,
)
async def test_errors_of_the_request_itself_never_move_on(error: Exception) -> None:
    primary, secondary = Failing(error), FakeProvider()
    fallback = FallbackProvider([primary, secondary])
    with pytest.raises(type(error)):
        await fallback.generate("Hi", model="m")
    assert fallback.stats()["fake#1"].answered == 0  # labels of repeated names carry their position


async def test_an_invalid_request_is_refused_before_any_provider_is_tried() -> None:
    primary = Failing(ProviderUnavailableError("down"))
    fallback = FallbackProvider([primary, FakeProvider()])
    with pytest.raises(InvalidRequestError, match="temperature"):
        await fallback.generate("Hi", model="m", temperature=-1)
    with pytest.raises(InvalidRequestError, match="tools\\[0\\] has no name"):
        await fallback.generate("Hi", model="m", tools=[{"type": "function", "function": {}}])
    assert primary.calls == 0


async def test_when_every_provider_fails_the_last_error_is_raised_with_each_in_a_note() -> None:
    fallback = FallbackProvider(
        [Failing(ProviderTimeoutError("slow")), Failing(ProviderUnavailableError("down"))], labels=["a", "b"]
    )
    with pytest.raises(ProviderUnavailableError, match="down") as caught:
        await fallback.generate("Hi", model="m")
    notes = getattr(caught.value, "__notes__", [])
    assert notes == [] or "a: ProviderTimeoutError: slow; b: ProviderUnavailableError: down" in notes[0]


async def test_a_stream_falls_back_only_before_its_first_piece() -> None:
    fallback = FallbackProvider([Failing(ProviderUnavailableError("down")), FakeProvider()], labels=["a", "b"])
    events = [event async for event in fallback.stream("Hi", model="m", max_tokens=4)]
    assert isinstance(events[-1], GenerationResult) and events[-1].provider == "b"
    assert "".join(event for event in events if isinstance(event, str)) == events[-1].text

    broken_midway = Failing(ProviderUnavailableError("connection reset"), after_pieces=1)
    fallback = FallbackProvider([broken_midway, FakeProvider()], labels=["a", "b"])
    pieces: list[StreamEvent] = []
    with pytest.raises(ProviderUnavailableError, match="connection reset"):
        async for event in fallback.stream("Hi", model="m", max_tokens=4):
            pieces.append(event)
    assert len(pieces) == 1 and isinstance(pieces[0], str)  # the caller saw a piece of "a": no switch to "b"


class NoToolsServer(OpenAIProvider):
    """An OpenAI-compatible provider whose options refuse tools (as one for a server without tool parsing would)."""

    options: ClassVar[OptionMap] = {
        **OpenAIProvider.options,
        "tools": Refused("this server parses no tool calls"),
        "tool_choice": Refused("this server parses no tool calls"),
    }


async def test_tools_go_to_the_provider_that_takes_them() -> None:
    """A provider whose options refuse tools passes the request on, before anything is sent to it."""
    openai = NoToolsServer(base_url=BASE, api_key="sk-x", max_retries=0)
    fallback = FallbackProvider([openai, FakeProvider()])
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    with respx.mock(assert_all_called=False) as router:
        route = router.post(CHAT)
        result = await fallback.generate("Time?", model="m", tools=[tool])
    assert route.call_count == 0 and result.provider == "fake" and result.tool_calls is not None
    assert fallback.supports_tools and not openai.supports_tools



async def test_token_ids_go_to_the_providers_that_take_them() -> None:
    openai = OpenAIProvider(base_url=BASE, api_key="sk-x", max_retries=0)  # takes no TokenIds prompt
    local = FakeProvider()
    fallback = FallbackProvider([openai, local])
    assert fallback.supports_token_prompts and not openai.supports_token_prompts
    ids = TokenIds(await local.tokenize("Hello there", model="m"))
    with respx.mock(assert_all_called=False) as router:
        route = router.post(CHAT)
        result = await fallback.generate(ids, model="m", max_tokens=3)
        events = [event async for event in fallback.stream(ids, model="m", max_tokens=3)]
    assert route.call_count == 0 and result.provider == "fake"
    assert result.text == (await local.generate(ids, model="m", max_tokens=3)).text
    assert isinstance(events[-1], GenerationResult) and events[-1].text == result.text
    with pytest.raises(UnsupportedOperationError, match="supports_token_prompts"):
        await FallbackProvider([openai]).generate(ids, model="m")

async def test_adapters_load_into_the_providers_that_take_them_and_requests_go_where_the_adapter_is() -> None:
    openai, local = OpenAIProvider(base_url=BASE, max_retries=0), FakeProvider()
    fallback = FallbackProvider([openai, local])
    assert fallback.supports_adapters and not openai.supports_adapters
    await fallback.load_adapter("style", "/adapters/style")
    assert await local.list_adapters() == ["style"] and await fallback.list_adapters() == ["style"]
    with respx.mock(assert_all_called=False) as router:
        route = router.post(CHAT)
        result = await fallback.generate("Hi", model="m", adapter_id="style", max_tokens=2)
    assert route.call_count == 0 and result.provider == "fake" and result.adapter_id == "style"
    await fallback.unload_adapter("style")
    with pytest.raises(AdapterNotFoundError):
        await fallback.generate("Hi", model="m", adapter_id="style")
    with pytest.raises(AdapterNotFoundError):
        await fallback.unload_adapter("style")


async def test_a_request_moves_on_from_a_provider_that_does_not_hold_its_adapter() -> None:
    first, second = FakeProvider(), FakeProvider()
    await second.load_adapter("math", "/adapters/math")
    fallback = FallbackProvider([first, second], labels=["first", "second"])
    result = await fallback.generate("Hi", model="m", adapter_id="math", max_tokens=2)
    assert result.provider == "second" and result.text.startswith("[math]")


async def test_a_load_that_one_provider_refuses_is_rolled_back_everywhere() -> None:
    good, bad = FakeProvider(), Failing(InvalidAdapterError("rank too large"))
    fallback = FallbackProvider([good, bad])
    with pytest.raises(InvalidAdapterError, match="rank too large"):
        await fallback.load_adapter("style", "/adapters/style")
    assert await good.list_adapters() == []
    down = Failing(ProviderUnavailableError("down"))
    fallback = FallbackProvider([down, good], labels=["down", "good"])
    await fallback.load_adapter("style", "/adapters/style")  # one that is down is skipped
    assert await good.list_adapters() == ["style"] and fallback.stats()["down"].failed == 1


async def test_scoring_falls_back_and_skips_providers_that_cannot_score() -> None:
    openai, fake = OpenAIProvider(base_url=BASE, max_retries=0), FakeProvider()
    fallback = FallbackProvider([openai, Failing(ProviderUnavailableError("down")), fake])
    assert fallback.supports_scoring
    score = await fallback.score("The sky is", " blue", model="m")
    assert score == await fake.score("The sky is", " blue", model="m")
    assert fallback.stats()["fake#2"].answered == 1
    batch = await fallback.score_batch([("a", " b"), ("c", " d")], model="m")
    assert all(isinstance(item, ScoreResult) for item in batch)
    only_openai = FallbackProvider([openai])
    with pytest.raises(UnsupportedOperationError, match="supports_scoring is false for each"):
        await only_openai.score("a", " b", model="m")


async def test_a_server_answering_5xx_moves_on_and_a_4xx_does_not(mock: respx.MockRouter) -> None:
    openai = OpenAIProvider(base_url=BASE, api_key="sk-x", max_retries=0)
    fallback = FallbackProvider([(openai, "gpt-4o-mini"), FakeProvider()])
    route = mock.post(CHAT).mock(return_value=openai_error(500, "The server had an error while processing"))
    result = await fallback.generate("Hi", model="local", max_tokens=2)
    assert result.provider == "fake" and result.model == "local"  # the fake got the request's own model
    assert route.calls.last.request.content.count(b'"model":"gpt-4o-mini"') == 1  # openai got its own model
    mock.post(CHAT).mock(return_value=openai_error(429, "Rate limit reached"))
    assert (await fallback.generate("Hi", model="local", max_tokens=2)).provider == "fake"
    mock.post(CHAT).mock(return_value=openai_error(400, "This model's maximum context length is 128000 tokens"))
    with pytest.raises(inference.ServerResponseError, match="maximum context length") as caught:
        await fallback.generate("Hi", model="local", max_tokens=2)
    assert caught.value.status_code == 400


async def test_a_loopback_port_where_nothing_listens_moves_on() -> None:
    dead = OpenAIProvider(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="sk-x", max_retries=0)
    fallback = FallbackProvider([dead, FakeProvider()], labels=["dead", "fake"])
    result = await fallback.generate("Hi", model="m", max_tokens=2)
    assert result.provider == "fake"
    assert "ProviderUnavailableError" in (fallback.stats()["dead"].last_error or "")
    await fallback.aclose()


def test_the_fall_through_rule() -> None:
    assert all(falls_through(error) for error in FALLING_THROUGH)
    assert not falls_through(InvalidRequestError("x")) and not falls_through(KeyError("x"))


def test_bad_construction_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="needs a list of providers"):
        FallbackProvider([])
    with pytest.raises(InvalidRequestError, match="labels must name each"):
        FallbackProvider([FakeProvider(), FakeProvider()], labels=["same", "same"])
    with pytest.raises(InvalidRequestError, match="needs a list of providers"):
        FallbackProvider(["fake"])  # type: ignore[list-item]


def test_fallback_provider_is_exported_lazily() -> None:
    assert inference.FallbackProvider is FallbackProvider and "FallbackProvider" in inference.__all__


def test_the_sync_facade_wraps_a_fallback_provider() -> None:
    from inference.sync import wrap

    with wrap(FallbackProvider([Failing(ProviderUnavailableError("down")), FakeProvider()])) as sync:
        result: Any = sync.generate("Hi", model="m", max_tokens=2)
    assert result.provider == "fake#1"


async def test_adapter_stats_is_refused_with_where_to_ask_instead_of_an_attribute_error() -> None:
    """It raised AttributeError ('_adapter_registry'), which made every row of an evaluation on a fallback provider
    a load error while evaluation still read it."""
    first, second = FakeProvider(), FakeProvider()
    fallback = FallbackProvider([first, second], labels=["local", "spare"])
    await fallback.load_adapter("a", "/adapters/a")
    with pytest.raises(UnsupportedOperationError, match=r"providers\[i\]\.adapter_stats\(\).*local, spare"):
        fallback.adapter_stats()
    assert first.adapter_stats().get("a") is not None and second.adapter_stats().get("a") is not None
    assert (await fallback.generate("hi", model="m", adapter_id="a", max_tokens=2)).adapter_id == "a"
