"""OpenAIProvider at the wire: the exact request bodies, the key in the Authorization header, errors mapped.

Answers are shaped as OpenAI's API sends them (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from inference import OpenAIProvider, ToolCall, get_provider, get_provider_for_step
from inference.config import SETTINGS
from inference.exceptions import (
    InferenceError,
    ProtocolError,
    ProviderError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    ServerModelNotFoundError,
    ServerResponseError,
    UnsupportedOperationError,
)
from inference.factory import clear_provider_cache
from inference.provider import GenerationResult

BASE = "http://gateway.test:4000/v1"
CHAT = f"{BASE}/chat/completions"
SECRET = "sk-openai-secret-1234"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for settings in SETTINGS.values():
        for setting in settings:
            monkeypatch.delenv(setting.env_var, raising=False)
    monkeypatch.delenv("INFERENCE_PROVIDER", raising=False)
    clear_provider_cache()
    yield monkeypatch
    clear_provider_cache()


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.fixture
async def provider() -> AsyncIterator[OpenAIProvider]:
    async with OpenAIProvider(base_url=BASE, api_key=SECRET, max_retries=1) as openai:
        yield openai


def openai_error(status: int, message: str, error_type: str, code: str | None = None) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message, "type": error_type, "param": None, "code": code}})


MODEL = "gpt-4o-mini-2024-07-18"


def completion(text: str = "Hi!", *, model: str = MODEL, finish_reason: str = "stop") -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-abc",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
        },
    )


def stream_body(pieces: list[str], *, model: str = "gpt-4o-mini-2024-07-18") -> str:
    def chunk(delta: dict[str, object], finish: str | None = None, usage: object = None) -> str:
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if delta or finish else []
        body = {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1, "model": model,
                "choices": choices, "usage": usage}
        return f"data: {json.dumps(body)}\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in pieces]
    events.append(chunk({}, finish="stop"))
    count = len(pieces)
    events.append(chunk({}, usage={"prompt_tokens": 9, "completion_tokens": count, "total_tokens": 9 + count}))
    return "".join(events) + "data: [DONE]\n\n"


def sent(route: respx.Route, index: int = -1) -> dict[str, object]:
    body: dict[str, object] = json.loads(route.calls[index].request.content)
    return body


async def test_generate_sends_the_exact_body_and_the_key(mock: respx.MockRouter, provider: OpenAIProvider) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    result = await provider.generate(
        "Hello", model="gpt-4o-mini", max_tokens=16, system_prompt="Be brief.", temperature=0.2, top_p=0.9,
        stop=["\n"], seed=7,
    )
    assert sent(route) == {
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        "max_tokens": 16,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["\n"],
        "seed": 7,
    }
    assert route.calls[-1].request.headers["authorization"] == f"Bearer {SECRET}"
    assert result == GenerationResult(
        text="Hi!", model="gpt-4o-mini-2024-07-18", adapter_id=None, token_count=11, finish_reason="stop",
        prompt_tokens=9, completion_tokens=2,
    )


async def test_only_what_the_caller_set_is_sent_and_extras_go_in_the_body(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    route = mock.post(CHAT).mock(return_value=completion())
    await provider.generate("Hello", model="m", max_tokens=4)
    assert sent(route) == {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    await provider.generate("Hello", model="m", max_tokens=4, top_k=40, repetition_penalty=1.1)
    assert sent(route) == {
        "model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
        "top_k": 40, "repetition_penalty": 1.1,
    }


async def test_stream_yields_pieces_then_the_result(mock: respx.MockRouter, provider: OpenAIProvider) -> None:
    route = mock.post(CHAT).mock(
        return_value=httpx.Response(200, text=stream_body(["Hel", "lo"]), headers={"content-type": "text/event-stream"})
    )
    events = [event async for event in provider.stream("Hi", model="gpt-4o-mini", max_tokens=8)]
    assert events[:2] == ["Hel", "lo"]
    assert events[2] == GenerationResult(
        text="Hello", model="gpt-4o-mini-2024-07-18", adapter_id=None, token_count=11, finish_reason="stop",
        prompt_tokens=9, completion_tokens=2,
    )
    assert sent(route) == {
        "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
        "stream": True, "stream_options": {"include_usage": True},
    }



async def test_a_stream_whose_chunks_carry_an_empty_error_field_is_no_failure(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    """Some serializers write every optional field: ``"error": null`` is no error (as the openai client reads it)."""
    body = stream_body(["Hel", "lo"]).replace('"usage": ', '"error": null, "usage": ')
    assert body.count('"error": null') == 5
    mock.post(CHAT).mock(return_value=httpx.Response(200, text=body, headers={"content-type": "text/event-stream"}))
    events = [event async for event in provider.stream("Hi", model="gpt-4o-mini", max_tokens=8)]
    assert events[:2] == ["Hel", "lo"] and isinstance(events[2], GenerationResult) and events[2].text == "Hello"



async def test_an_error_in_a_200_answer_is_the_servers_error_in_its_words(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    """Some gateways answer 200 with ``{"error": {...}}``: the server's message, not a guess about the base URL."""
    mock.post(CHAT).mock(return_value=httpx.Response(200, json={"error": {
        "message": "upstream model is overloaded", "type": "server_error", "param": None, "code": None}}))
    with pytest.raises(ProviderError, match="answered generate with model 'm' with an error: upstream model is "
                                            "overloaded") as caught:
        await provider.generate("Hi", model="m", max_tokens=4)
    assert not isinstance(caught.value, ProtocolError)

class Dripping(httpx.AsyncByteStream):
    """A body that never ends: ``piece`` again and again, ``pause`` seconds apart (a server dripping bytes, or
    pinging; with no pause, a server sending an answer without end as fast as it is read)."""

    def __init__(self, first: bytes, piece: bytes, pause: float = 0.01) -> None:
        self.first, self.piece, self.pause = first, piece, pause

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        while True:
            await asyncio.sleep(self.pause)
            yield self.piece


async def test_an_answer_with_a_header_that_is_not_ascii_is_read(mock: respx.MockRouter) -> None:
    """A proxy's ``x-served-by: nœud-1`` (UTF-8 bytes): the answer read whole keeps the headers as sent (rebuilt from
    their text, it raised a bare UnicodeEncodeError on every call)."""
    answer = httpx.Response(200, headers=[(b"x-served-by", "nœud-1".encode())], json=completion("fine").json())
    mock.post(CHAT).mock(return_value=answer)
    async with OpenAIProvider(base_url=BASE, api_key=SECRET, max_retries=0) as provider:
        assert (await provider.generate("Hi", model="m", max_tokens=4)).text == "fine"


async def _ask(provider: OpenAIProvider, *, streamed: bool) -> None:
    """One generation, streamed to its end or whole."""
    if streamed:
        async for _ in provider.stream("Hi", model="m", max_tokens=4):
            pass
    else:
        await provider.generate("Hi", model="m", max_tokens=4)


@pytest.mark.parametrize(
    ("first", "piece", "streamed"),
    [
        (b'{"id": "x", "choices": [', b" ", False),  # a whole answer dripped byte by byte
        (b'data: {"id": "x", "choices": [', b" ", True),  # a streamed line that never ends
        (b": ping\n\n", b": ping\n\n", True),  # comments for ever, never an event
    ],
)
async def test_a_server_that_keeps_sending_without_answering_times_out(
    mock: respx.MockRouter, first: bytes, piece: bytes, streamed: bool
) -> None:
    """httpx's timeout is per read; the provider's ``timeout`` bounds the wait for an answer (or the next event)."""
    mock.post(CHAT).mock(return_value=httpx.Response(200, headers={"content-type": "text/event-stream"},
                                                     stream=Dripping(first, piece)))
    async with OpenAIProvider(base_url=BASE, api_key=SECRET, max_retries=0, timeout=0.3) as provider:
        with pytest.raises(ProviderTimeoutError, match=r"did not answer within 0\.3 s"):
            await _ask(provider, streamed=streamed)


def _chunk_event(piece: str, **choice: Any) -> bytes:
    """One server-sent event of a chat completion stream: a chunk of ``piece`` (``choice`` adds to its choice)."""
    body = {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": None, **choice}]}
    return f"data: {json.dumps(body)}\n\n".encode()


def _gzip_bomb(size: int) -> httpx.Response:
    """A few KiB of gzip that expand to ``size`` bytes of JSON white space."""
    import gzip

    body = gzip.compress(b"{" + b" " * size + b"}", compresslevel=9)
    assert len(body) < size // 100
    return httpx.Response(200, headers={"content-type": "application/json", "content-encoding": "gzip"},
                          content=body)


@pytest.mark.parametrize(
    ("answer", "streamed", "what"),
    [
        (lambda: httpx.Response(200, headers={"content-type": "application/json"},
                                stream=Dripping(b'{"id": "x", "choices": [', b" " * 65536, 0)), False, "an answer"),
        (lambda: httpx.Response(500, stream=Dripping(b'{"error": "', b"x" * 65536, 0)), False, "an answer"),
        (lambda: httpx.Response(500, stream=Dripping(b'{"error": "', b"x" * 65536, 0)), True, "an answer"),
        (lambda: httpx.Response(200, headers={"content-type": "text/event-stream"},
                                stream=Dripping(b'data: {"id": "x", "choices": [', b" " * 65536, 0)), True, "a stream"),
        (lambda: httpx.Response(200, headers={"content-type": "text/event-stream"},
                                stream=Dripping(b"", _chunk_event("x" * 65536), 0)), True, "a stream"),
        (lambda: _gzip_bomb(3 * 2**20), False, "an answer"),
    ],
    ids=["endless answer", "endless error", "endless error to a stream", "endless line", "endless chunks",
         "gzip bomb"],
)
async def test_an_answer_over_the_size_limit_is_refused_and_the_provider_serves_the_next(
    mock: respx.MockRouter, monkeypatch: pytest.MonkeyPatch, answer: Any, streamed: bool, what: str
) -> None:
    """A server cannot make the client hold an answer without end (or a small gzip body that expands without end, or a
    stream of chunks without end, whose text the stream's result would hold): past ``MAX_ANSWER_BYTES`` (256 MiB, here
    1 MiB) it is a ``ProtocolError``, long before the timeout."""
    from inference._servers import answer_reading

    monkeypatch.setattr(answer_reading, "MAX_ANSWER_BYTES", 2**20)
    route = mock.post(CHAT)
    route.side_effect = [answer(), completion("fine")]
    async with OpenAIProvider(base_url=BASE, api_key=SECRET, max_retries=0, timeout=20) as provider:
        started = asyncio.get_running_loop().time()
        verb = "stream" if streamed else "generate"
        with pytest.raises(ProtocolError, match=f"answered {verb} with model 'm' with {what} of more than 1 MiB"):
            await _ask(provider, streamed=streamed)
        assert asyncio.get_running_loop().time() - started < 10  # refused at the limit, not at the timeout
        assert (await provider.generate("Hi", model="m", max_tokens=4)).text == "fine"


def _answer_with(**choice: Any) -> httpx.Response:
    """A whole chat completion whose choice is changed by ``choice``."""
    body = completion("partial").json()
    body["choices"][0].update(choice)
    return httpx.Response(200, json=body)


@pytest.mark.parametrize(
    ("answer", "streamed", "problem"),
    [
        (lambda: _answer_with(finish_reason=["abort"]), False, r"finish_reason \['abort'\] is not text"),
        (lambda: _answer_with(finish_reason=7), False, "finish_reason 7 is not text"),
        (lambda: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(
            [_chunk_event("A "), _chunk_event("B", index=1), _chunk_event("", finish_reason="stop")])), True,
         "a chunk of choice 1, though one choice was asked for"),
        (lambda: httpx.Response(301, headers={"location": "https://elsewhere.test/v1/chat/completions"},
                                json=completion("body of a 301").json()), False,
         "a redirect \\(301 to https://elsewhere.test/v1/chat/completions\\) instead of an answer"),
        (lambda: httpx.Response(307, headers={"location": "https://u:pw@elsewhere.test/v1"}), True,
         r"a redirect \(307 to https://\*\*\*@elsewhere.test/v1\)"),
        (lambda: _answer_with(message=None), False, r"choices\[0\]\.message is null, not an object"),
        (lambda: _answer_with(message="partial"), False, r'choices\[0\]\.message is "partial", not an object'),
        (lambda: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(
            [_chunk_event("A "), _chunk_event("", delta="B"), _chunk_event("", finish_reason="stop")])), True,
         r'choices\[0\]\.delta is "B", not an object'),
    ],
    ids=["finish_reason list", "finish_reason number", "another choice's chunk", "redirect", "redirect to a stream",
         "message null", "message text", "delta text"],
)
async def test_an_answer_that_cannot_be_read_as_asked_is_a_protocol_error_never_a_result(
    mock: respx.MockRouter, provider: OpenAIProvider, answer: Any, streamed: bool, problem: str
) -> None:
    """Each was returned as a finished answer (an abort in a list passed for "stop", two choices' pieces merged, a
    redirect's body taken for the completion, a null message for an empty answer), or refused without naming the
    field (a message or delta that is text: Python's AttributeError); the provider serves the next request."""
    mock.post(CHAT).side_effect = [answer(), completion("fine")]
    with pytest.raises(ProtocolError, match=problem):
        await _ask(provider, streamed=streamed)
    assert (await provider.generate("Hi", model="m", max_tokens=4)).text == "fine"


@pytest.mark.parametrize("count", [-1, True, 2.0, "2", 2**31, 10**30],
                         ids=["negative", "boolean", "fraction", "text", "2**31", "10**30"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_a_usage_count_that_is_not_a_token_count_is_a_protocol_error(
    mock: respx.MockRouter, provider: OpenAIProvider, count: Any, streamed: bool
) -> None:
    """A count above 2**31 - 1 (more tokens than any context holds: 10**30 went into completion_tokens,
    token_count and every metric that adds them up) was returned as the answer's usage; a negative, boolean,
    fractional or text count was refused already (the message now names the field)."""
    if streamed:
        text, usage = stream_body(["A", "B"]), '"completion_tokens": 2,'
        assert usage in text
        answer = httpx.Response(200, headers={"content-type": "text/event-stream"},
                                text=text.replace(usage, f'"completion_tokens": {json.dumps(count)},'))
    else:
        body = completion("AB").json()
        body["usage"]["completion_tokens"] = count
        answer = httpx.Response(200, json=body)
    mock.post(CHAT).side_effect = [answer, completion("fine")]
    with pytest.raises(ProtocolError, match=r"usage\.completion_tokens is .*, not a token count \(a whole number"):
        await _ask(provider, streamed=streamed)
    assert (await provider.generate("Hi", model="m", max_tokens=4)).text == "fine"


async def test_a_null_delta_is_a_chunk_with_nothing_new(mock: respx.MockRouter, provider: OpenAIProvider) -> None:
    """Azure OpenAI sends ``"delta": null`` on chunks that only finish or annotate, where OpenAI sends ``{}``: the
    stream goes on (only a whole answer's ``message`` must be an object)."""
    chunks = [_chunk_event("A "), _chunk_event("", delta=None), _chunk_event("B"),
              _chunk_event("", delta=None, finish_reason="stop")]
    mock.post(CHAT).mock(
        return_value=httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(chunks))
    )
    events = [event async for event in provider.stream("Hi", model="m", max_tokens=4)]
    assert events[:-1] == ["A ", "B"]
    result = events[-1]
    assert isinstance(result, GenerationResult) and result.text == "A B" and result.finish_reason == "stop"


async def test_tool_arguments_nested_too_deep_for_json_are_a_call_error_not_a_recursion_error(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    """Arguments of 100,000 nested lists raised a bare RecursionError out of generate."""
    body = completion("").json()
    body["choices"][0]["message"]["tool_calls"] = [{"id": "call_1", "type": "function", "function": {
        "name": "lookup", "arguments": "[" * 100_000 + "]" * 100_000}}]
    body["choices"][0]["finish_reason"] = "tool_calls"
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=body))
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    result = await provider.generate("Hi", model="m", max_tokens=4, tools=tools)
    assert result.tool_calls is not None and result.finish_reason == "tool_calls"
    assert (result.tool_calls[0].error or "").startswith("the arguments of lookup are not JSON (maximum recursion")


async def test_tool_arguments_with_nan_are_a_call_error_not_arguments(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    """Arguments ``{"n": NaN}`` came back as ``{"n": nan}`` without an error, although NaN is not JSON."""
    body = completion("").json()
    body["choices"][0]["message"]["tool_calls"] = [{"id": "call_1", "type": "function", "function": {
        "name": "lookup", "arguments": '{"n": NaN}'}}]
    body["choices"][0]["finish_reason"] = "tool_calls"
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=body))
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    result = await provider.generate("Hi", model="m", max_tokens=4, tools=tools)
    assert result.tool_calls is not None and result.tool_calls[0].arguments == {}
    assert (result.tool_calls[0].error or "").startswith("the arguments of lookup are not JSON (NaN is not JSON)")


async def test_calls_a_server_gave_no_id_get_ids_a_next_turn_can_answer(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    """A call without an id was named ``call_<its index>``, so every turn's first call was ``call_0``: a loop's
    second turn then held one id twice, which a conversation may not (each result must answer one call)."""
    body = completion("").json()
    body["choices"][0]["message"]["tool_calls"] = [
        {"type": "function", "function": {"name": "lookup", "arguments": '{"q": "a"}'}},
        {"id": "", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "b"}'}},
    ]
    body["choices"][0]["finish_reason"] = "tool_calls"
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=body))
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    messages: list[Any] = [{"role": "user", "content": "Look up a and b, twice."}]
    for _ in range(2):
        result = await provider.generate(messages, model="m", max_tokens=4, tools=tools)
        assert result.tool_calls is not None and len(result.tool_calls) == 2
        messages += [result.as_message(), *(call.answer("found") for call in result.tool_calls)]
    ids = [call["id"] for message in messages for call in message.get("tool_calls", ())]
    assert len(set(ids)) == 4 and all(re.fullmatch(r"call_[0-9a-f]{24}", call_id) for call_id in ids)
    assert (await provider.generate(messages, model="m", max_tokens=4, tools=tools)).tool_calls


LLAMA_SERVER_BAD_ARGUMENTS = {"error": {"code": 500, "type": "server_error", "message": (
    "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error at line 1, column 14: "
    "syntax error while parsing value - invalid string: missing closing quote; last read: '\"Par'")}}
"""llama-server's answer (b11434, captured) to a history whose call arguments are not JSON."""


async def test_a_call_whose_arguments_are_not_json_goes_back_with_empty_arguments(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    """Reviewed defect: docs/tools.md's loop (as_message() then answer(error)) sent the bad arguments as written,
    and llama-server answered 500, so the retry turn failed (a FallbackProvider moved on)."""
    def answer(request: httpx.Request) -> httpx.Response:  # what llama-server does with a history's calls
        for message in json.loads(request.content)["messages"]:
            for call in message.get("tool_calls", ()):
                try:
                    arguments = json.loads(call["function"]["arguments"])
                except ValueError:
                    arguments = None
                if not isinstance(arguments, dict):
                    return httpx.Response(500, json=LLAMA_SERVER_BAD_ARGUMENTS)
        return completion("Which city?")

    route = mock.post(CHAT).mock(side_effect=answer)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    bad = ToolCall("call_1", "get_weather", {}, '{"city": "Par', "the arguments of get_weather are not JSON")
    listed = ToolCall("call_2", "get_weather", {}, "[1]", "the arguments of get_weather are JSON but not an object")
    good = ToolCall("call_3", "get_weather", {"city": "Rome"}, '{"city": "Rome"}')
    turn = GenerationResult(text="", model="m", adapter_id=None, token_count=None, finish_reason="tool_calls",
                            tool_calls=(bad, listed, good))
    conversation = [{"role": "user", "content": "Weather?"}, turn.as_message(), bad.answer(f"error: {bad.error}"),
                    listed.answer(f"error: {listed.error}"), good.answer("sunny")]
    result = await provider.generate(conversation, model="m", tools=tools, max_tokens=4)
    assert result.text == "Which city?"
    calls = sent(route)["messages"][1]["tool_calls"]  # type: ignore[index]
    assert [call["function"]["arguments"] for call in calls] == ["{}", "{}", '{"city": "Rome"}']


class Pieces(httpx.AsyncByteStream):
    """A body sent in the given pieces (cut anywhere: inside a character, between a CR and its LF)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


async def test_a_stream_is_utf8_cut_anywhere_whatever_charset_it_names_and_never_bytes_replaced(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    text = "h\u00e9llo w\u00f6rld \U0001f600"
    chunks = [{"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]} for piece in text.split()]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    events_text = "".join(f"data: {json.dumps(chunk, ensure_ascii=False)}\r\n\r\n" for chunk in chunks)
    data = (events_text + "data: [DONE]\r\n\r\n").encode()  # raw UTF-8, lines ended by \r\n
    cuts = [data[index : index + 3] for index in range(0, len(data), 3)]  # inside characters, between \r and \n
    for pieces, charset in ((cuts, "iso-8859-1"), ([data], "utf-8")):
        mock.post(CHAT).mock(return_value=httpx.Response(
            200, headers={"content-type": f"text/event-stream; charset={charset}"}, stream=Pieces(pieces)
        ))
        events = [event async for event in provider.stream("Hi", model="m", max_tokens=8)]
        assert isinstance(events[-1], GenerationResult) and events[-1].text == "".join(text.split())
    broken = data.replace("\u00e9".encode(), b"\xff")
    mock.post(CHAT).mock(return_value=httpx.Response(
        200, headers={"content-type": "text/event-stream"}, stream=Pieces([broken])
    ))
    with pytest.raises(ProtocolError, match="not UTF-8"):
        async for _ in provider.stream("Hi", model="m", max_tokens=8):
            pass

async def test_the_key_comes_from_openai_api_key_and_base_url_from_openai_base_url(
    clean_env: pytest.MonkeyPatch, mock: respx.MockRouter
) -> None:
    clean_env.setenv("OPENAI_API_KEY", SECRET)
    clean_env.setenv("OPENAI_BASE_URL", BASE)
    route = mock.post(CHAT).mock(return_value=completion())
    provider = get_provider("openai")
    assert provider.base_url == BASE  # type: ignore[attr-defined]
    await provider.generate("Hello", model="m", max_tokens=2)
    assert route.calls[-1].request.headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in repr(provider) and "api_key=***" in repr(provider)


def test_the_default_base_url_is_openais() -> None:
    assert OpenAIProvider().base_url == "https://api.openai.com/v1"
    assert repr(OpenAIProvider()) == "OpenAIProvider(base_url='https://api.openai.com/v1', api_key=None)"


def test_step_config_and_settings(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("OPENAI_TIMEOUT", "30")
    provider = get_provider_for_step({"provider": "openai", "base_url": BASE, "max_retries": 0, "model": "m"})
    assert isinstance(provider, OpenAIProvider)
    assert (provider.base_url, provider.timeout, provider.max_retries) == (BASE, 30.0, 0)
    assert get_provider("openai", BASE) is not provider  # other settings (max_retries), another object


async def test_the_vllm_provider_never_reads_openai_api_key(clean_env: pytest.MonkeyPatch) -> None:
    from inference.vllm_provider import VLLMProvider

    clean_env.setenv("OPENAI_API_KEY", SECRET)
    with respx.mock(assert_all_called=False) as router:
        route = router.post(f"{BASE}/chat/completions").mock(return_value=completion())
        async with VLLMProvider(base_url=BASE, api="chat") as vllm:
            assert "api_key=None" in repr(vllm)
            await vllm.generate("Hi", model="m", max_tokens=2)
    assert "authorization" not in route.calls.last.request.headers


async def test_adapters_are_unsupported(provider: OpenAIProvider) -> None:
    assert OpenAIProvider.supports_adapters is False
    with pytest.raises(UnsupportedOperationError, match="OpenAIProvider does not support load_adapter"):
        await provider.load_adapter("style", "/adapters/style")
    with pytest.raises(UnsupportedOperationError, match="OpenAIProvider"):
        await provider.generate("Hello", model="m", adapter_id="style")
    assert await provider.list_adapters() == []


async def test_a_refused_key_is_a_server_response_error_without_the_key(
    mock: respx.MockRouter, provider: OpenAIProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mock.post(CHAT).mock(
        return_value=openai_error(401, "Incorrect API key provided: sk-op***1234.", "invalid_request_error",
                                  "invalid_api_key")
    )
    with pytest.raises(ServerResponseError) as caught:
        await provider.generate("Hello", model="m", max_tokens=2)
    assert caught.value.status_code == 401 and isinstance(caught.value, httpx.HTTPStatusError)
    assert "refused the credentials" in str(caught.value)
    texts = [str(caught.value), repr(caught.value), *(record.getMessage() for record in caplog.records)]
    assert not [text for text in texts if SECRET in text]


async def test_an_unknown_model_is_model_not_found(mock: respx.MockRouter, provider: OpenAIProvider) -> None:
    mock.post(CHAT).mock(
        return_value=openai_error(404, "The model `gpt-9` does not exist or you do not have access to it.",
                                  "invalid_request_error", "model_not_found")
    )
    with pytest.raises(ServerModelNotFoundError, match=r"does not serve model 'gpt-9'.*GET /v1/models"):
        await provider.generate("Hello", model="gpt-9", max_tokens=2)


async def test_a_missing_route_names_openai_base_url(mock: respx.MockRouter, provider: OpenAIProvider) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(404, text="404 page not found"))
    with pytest.raises(ServerResponseError, match="OPENAI_BASE_URL") as caught:
        await provider.generate("Hello", model="m", max_tokens=2)
    assert not isinstance(caught.value, ServerModelNotFoundError)


async def test_an_unknown_field_is_a_400_with_the_servers_message(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    mock.post(CHAT).mock(
        return_value=openai_error(400, "Unrecognized request argument supplied: top_k", "invalid_request_error")
    )
    with pytest.raises(ServerResponseError, match="Unrecognized request argument supplied: top_k") as caught:
        await provider.generate("Hello", model="m", max_tokens=2, top_k=5)
    assert caught.value.status_code == 400


async def test_rate_limits_are_retried_then_reported(mock: respx.MockRouter, provider: OpenAIProvider) -> None:
    route = mock.post(CHAT).mock(
        side_effect=[
            openai_error(429, "Rate limit reached", "requests", "rate_limit_exceeded"),
            completion("after retry"),
        ]
    )
    result = await provider.generate("Hello", model="m", max_tokens=2)
    assert result.text == "after retry" and route.call_count == 2


async def test_a_server_that_refuses_connections_is_unavailable() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with OpenAIProvider(base_url=f"http://127.0.0.1:{port}/v1", api_key=SECRET, max_retries=0) as provider:
        with pytest.raises(ProviderUnavailableError, match="OPENAI_BASE_URL") as caught:
            await provider.generate("Hello", model="m", max_tokens=2)
    assert SECRET not in str(caught.value) and isinstance(caught.value, InferenceError)


async def test_an_answer_without_usage_reports_unknown_prompt_tokens(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    """A server that sends no usage: the prompt's tokens are None (as in a stream without usage), not 0."""
    answer = json.loads(completion("Hi!").content)
    del answer["usage"]
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=answer))
    result = await provider.generate("Hello", model=MODEL, max_tokens=8)
    assert result.text == "Hi!"
    assert (result.prompt_tokens, result.token_count) == (None, None)


@pytest.mark.parametrize("base_url", [",", " , ", ",,"])
def test_a_base_url_that_holds_no_url_is_a_configuration_error(base_url: str) -> None:
    from inference.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="holds no URL"):
        OpenAIProvider(base_url=base_url)


@pytest.mark.parametrize(
    "base_url",
    ["http://a:1/v1,http://a:1/v1", "http://a:1/v1, http://b:2/v1 ,http://a:1/v1/", ["http://a:1/v1", "http://a:1/v1"]],
)
def test_a_replica_named_twice_is_a_configuration_error(base_url: str | list[str]) -> None:
    """A slip that would give one server twice its share of the requests; the same URL in other forms too."""
    from inference.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"names the replica 'http://a:1/v1' twice"):
        OpenAIProvider(base_url=base_url)
    assert len(OpenAIProvider(base_url="http://a:1/v1,http://b:2/v1")._replicas) == 2


@pytest.mark.parametrize(
    "base_url", ["http://a:1/v1,HTTP://A:1/v1", "http://a/v1,http://a:80/v1/", "https://a:443/v1,https://A/v1"]
)
def test_a_replica_named_twice_in_another_case_or_with_its_default_port_is_refused(base_url: str) -> None:
    """Host names and schemes are the same in any case, and a default port written out is the same port."""
    from inference.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"names the replica .* twice"):
        OpenAIProvider(base_url=base_url)
    different = ["http://a:1/v1,http://a:2/v1", "http://a/v1,https://a/v1", "http://a/v1,http://a/v2"]
    assert [len(OpenAIProvider(base_url=urls)._replicas) for urls in different] == [2, 2, 2]


# The route: chat, or plain-text completions for a model without a chat template --------------------------------

COMPLETIONS = f"{BASE}/completions"
NO_TEMPLATE = (  # vLLM's 400 to chat on a model without a chat template
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if "
    "the tokenizer does not define one."
)


def no_template() -> httpx.Response:
    return httpx.Response(
        400, json={"error": {"message": NO_TEMPLATE, "type": "BadRequestError", "param": None, "code": 400}}
    )


def text_completion(text: str) -> httpx.Response:
    return httpx.Response(200, json={
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 22, "completion_tokens": 4, "total_tokens": 26},
    })


async def test_api_completions_sends_the_plain_text_to_v1_completions(
    mock: respx.MockRouter, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("OPENAI_API", "completions")
    chat = mock.post(CHAT).mock(return_value=completion())
    events = [{"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
               "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}]}
              for piece, finish in ((" 1.", None), (" Pack", "length"))]
    stream = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
    sse = httpx.Response(200, text=stream, headers={"Content-Type": "text/event-stream"})
    route = mock.post(COMPLETIONS).mock(side_effect=[text_completion(" 1. Pack water"), sse])
    async with OpenAIProvider(base_url=BASE) as provider:
        assert provider.api == "completions"
        result = await provider.generate("Plan a hike.", model=MODEL, system_prompt="Be brief.", max_tokens=4)
        streamed = [event async for event in provider.stream("Plan a hike.", model=MODEL, max_tokens=4)]
    assert result.text == " 1. Pack water" and result.finish_reason == "length"
    assert sent(route, 0) == {"model": MODEL, "max_tokens": 4, "prompt": "Be brief.\n\nPlan a hike."}
    assert sent(route, 1)["prompt"] == "Plan a hike." and sent(route, 1)["stream"] is True
    assert streamed[:-1] == [" 1.", " Pack"]
    assert isinstance(streamed[-1], GenerationResult) and streamed[-1].text == " 1. Pack"
    assert chat.call_count == 0


async def test_api_auto_chats_and_moves_to_completions_once_chat_is_refused_for_want_of_a_template(
    mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    chat = mock.post(CHAT).mock(return_value=no_template())
    route = mock.post(COMPLETIONS).mock(return_value=text_completion("text"))
    caplog.set_level(logging.INFO, logger="inference.openai")
    async with OpenAIProvider(base_url=BASE) as provider:
        assert provider.api == "auto"
        first = await provider.generate("Hello", model=MODEL, max_tokens=4)
        second = await provider.generate("Hello", model=MODEL, max_tokens=4)
    assert first.text == second.text == "text"
    assert chat.call_count == 1 and route.call_count == 2  # refused once, then straight to completions
    assert any("no chat template" in record.getMessage() for record in caplog.records)


async def test_api_chat_names_the_setting_when_the_server_has_no_chat_template(mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=no_template())
    async with OpenAIProvider(base_url=BASE, api="chat") as provider:
        with pytest.raises(ServerResponseError, match="OPENAI_API=completions") as caught:
            await provider.generate("Hello", model=MODEL, max_tokens=4)
    assert caught.value.status_code == 400


async def test_api_auto_keeps_other_400s_as_they_are(mock: respx.MockRouter, provider: OpenAIProvider) -> None:
    mock.post(CHAT).mock(return_value=openai_error(400, "Unrecognized request argument: top_k", "invalid_request"))
    route = mock.post(COMPLETIONS).mock(return_value=text_completion("never"))
    with pytest.raises(ServerResponseError, match="Unrecognized request argument"):
        await provider.generate("Hello", model=MODEL, max_tokens=4, top_k=5)
    assert route.call_count == 0


def test_api_is_one_of_auto_chat_completions() -> None:
    from inference.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"setting api='legacy'.*one of 'auto', 'chat', 'completions'"):
        OpenAIProvider(base_url=BASE, api="legacy")


async def test_an_empty_stream_says_so_and_that_generate_may_say_why(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    """llama_cpp.server answers a streamed prompt longer than its context with a 200 and no event (checked with
    curl on its 0.3.x; generate gets its 400): the message said "answered generate ... cut short"."""
    mock.post(CHAT).mock(return_value=httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b""))
    with pytest.raises(ProtocolError, match="answered stream with model 'm' with an empty stream") as caught:
        await _ask(provider, streamed=True)
    assert "generate" in str(caught.value) and "llama_cpp.server" in str(caught.value)


async def test_a_stream_without_the_logprobs_asked_for_names_the_stream(
    mock: respx.MockRouter, provider: OpenAIProvider
) -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]}
    body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    mock.post(CHAT).mock(return_value=httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body))
    with pytest.raises(ProtocolError, match="answered stream with model 'm' with an answer without the token logprobs"):
        async for _ in provider.stream("Hi", model="m", max_tokens=4, logprobs=0):
            pass
