"""Replicas that fail without refusing connections: one that takes requests and never answers (a stopped or
deadlocked server), one that answers 503 (vLLM too busy). Each replica is a loopback HTTP server started here that
answers with vLLM's bodies; the provider is the real VLLMProvider over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inference.exceptions import ProviderTimeoutError
from inference.provider import GenerationResult
from inference.vllm_provider import VLLMProvider

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen2"
BUSY = {
    "error": {
        "message": "The engine is currently busy and cannot accept new requests. Please try again later or on a "
        "different instance.",
        "type": "Service Unavailable",
        "param": None,
        "code": 503,
    }
}  # vLLM's QueueOverflowError (a GracefulHTTPError): its 503 to a request it will not take
TOKENS = [9707, 11, 1879]


class LoopbackVLLM:
    """An HTTP server on loopback answering as a vLLM server does (chat completions, streamed or not, ``/tokenize``,
    ``/v1/models``, ``/v1/load_lora_adapter``), except on the paths in ``faults``: ``"hang"`` takes the request and
    never answers; ``"busy"`` answers vLLM's 503. ``"*"`` is every path.

    Attributes:
        name: Put in the text of its chat completions (``"from NAME"``).
        requests: The paths asked, in order.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.faults: dict[str, str] = {}
        self.requests: list[str] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def start(self) -> LoopbackVLLM:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        """Close the listening socket (later connections are refused) and every open connection."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode().split("\r\n")
            method, path = request_line.split(" ")[:2]
            headers = dict(line.lower().split(": ", 1) for line in header_lines if ": " in line)
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(path)
            fault = self.faults.get(path, self.faults.get("*"))
            if fault == "hang":
                await reader.read()  # until the client gives up and closes the connection
                return
            if fault == "busy":
                self._answer(writer, 503, json.dumps(BUSY).encode(), "application/json")
            else:
                self._serve(writer, method, path, json.loads(body) if body else None)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def _serve(self, writer: asyncio.StreamWriter, method: str, path: str, body: Any) -> None:
        if path == "/tokenize":
            tokenized = {"count": len(TOKENS), "max_model_len": 4096, "tokens": TOKENS, "token_strs": None}
            self._answer(writer, 200, json.dumps(tokenized).encode(), "application/json")
        elif path == "/v1/models" and method == "GET":
            card = {"id": MODEL, "object": "model", "created": 1700000000, "owned_by": "vllm",
                    "root": "/models/tiny-qwen2", "parent": None, "max_model_len": 4096, "permission": []}
            self._answer(writer, 200, json.dumps({"object": "list", "data": [card]}).encode(), "application/json")
        elif path == "/v1/load_lora_adapter":
            added = f"Success: LoRA adapter '{body['lora_name']}' added successfully."
            self._answer(writer, 200, added.encode(), "text/plain; charset=utf-8")
        elif path == "/v1/chat/completions" and body.get("stream"):
            self._answer(writer, 200, self._events(body["model"]), "text/event-stream; charset=utf-8")
        elif path == "/v1/chat/completions":
            completion = {
                "id": "chatcmpl-loopback", "object": "chat.completion", "created": 1700000000, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"from {self.name}"},
                             "logprobs": None, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
            self._answer(writer, 200, json.dumps(completion).encode(), "application/json")
        else:
            self._answer(writer, 404, b'{"detail":"Not Found"}', "application/json")

    def _events(self, model: str) -> bytes:
        def chunk(delta: dict[str, Any], finish_reason: str | None) -> str:
            event = {"id": "chatcmpl-loopback", "object": "chat.completion.chunk", "created": 1700000000,
                     "model": model,
                     "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
            return f"data: {json.dumps(event)}\n\n"

        events = chunk({"role": "assistant", "content": f"from {self.name}"}, None) + chunk({}, "stop")
        return (events + "data: [DONE]\n\n").encode()

    @staticmethod
    def _answer(writer: asyncio.StreamWriter, status: int, content: bytes, content_type: str) -> None:
        reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\nconnection: close\r\n"
            f"content-length: {len(content)}\r\n\r\n".encode()
            + content
        )


@pytest.fixture
async def servers() -> AsyncIterator[tuple[LoopbackVLLM, LoopbackVLLM]]:
    first, second = await LoopbackVLLM("a").start(), await LoopbackVLLM("b").start()
    try:
        yield first, second
    finally:
        await first.stop()
        await second.stop()


def replica_events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if getattr(record, "replica_event", None) == event]


async def generate_text(provider: VLLMProvider, how: str) -> str:
    if how == "generate":
        return (await provider.generate("Hi", model=MODEL, max_tokens=4)).text
    events = [event async for event in provider.stream("Hi", model=MODEL, max_tokens=4)]
    assert isinstance(events[-1], GenerationResult)
    return events[-1].text


# A replica that never answers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["auto", "chat"])  # auto: the hung replica's first request is the route probe
@pytest.mark.parametrize("how", ["generate", "stream"])
async def test_a_replica_that_never_answers_is_marked_down_and_later_requests_go_to_the_other(
    servers: tuple[LoopbackVLLM, LoopbackVLLM], how: str, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the hung replica got every other request (round-robin) and each one waited its full timeout."""
    hung, healthy = servers
    hung.faults["*"] = "hang"
    caplog.set_level(logging.INFO, logger="inference.replicas")
    # replica_down_s: the hung replica is left alone for the whole test, whatever the machine's speed
    async with VLLMProvider(base_url=[hung.base_url, healthy.base_url], timeout=0.5, max_retries=0, api=api,
                            replica_down_s=600) as provider:
        outcomes: list[str] = []
        for _ in range(6):
            try:
                outcomes.append(await generate_text(provider, how))
            except ProviderTimeoutError as error:
                assert hung.base_url in str(error) and "did not answer within 0.5 s" in str(error)
                outcomes.append("timed out")
        # the one request sent to the hung replica failed (it is not sent again: the server may have run it)
        assert sorted(outcomes) == ["from b"] * 5 + ["timed out"]
        assert hung.requests == ["/tokenize" if api == "auto" else "/v1/chat/completions"]
        (down,) = replica_events(caplog, "down")
        assert (down.levelname, down.url, down.error) == ("WARNING", hung.base_url, "ReadTimeout")

        # it answers again, and the other one stops: it is tried (last) and brought back
        hung.faults.clear()
        await healthy.stop()
        assert await generate_text(provider, how) == "from a"
        (back,) = replica_events(caplog, "back")
        assert back.url == hung.base_url and back.downtime_s > 0


async def test_a_replica_that_never_answers_its_model_list_is_left_alone_by_later_listings(
    servers: tuple[LoopbackVLLM, LoopbackVLLM], caplog: pytest.LogCaptureFixture
) -> None:
    hung, healthy = servers
    hung.faults["/v1/models"] = "hang"
    caplog.set_level(logging.INFO, logger="inference.replicas")
    async with VLLMProvider(base_url=[hung.base_url, healthy.base_url], timeout=0.5, max_retries=0,
                            replica_down_s=600) as provider:
        for _ in range(3):
            assert await provider.list_adapters() == []
    assert hung.requests == ["/v1/models"]  # before: asked (and waited for) at every listing
    (down,) = replica_events(caplog, "down")
    assert (down.url, down.error) == (hung.base_url, "ReadTimeout")


# Requests safe to repeat go to another replica --------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["busy", "hang"])
async def test_tokenize_and_scoring_go_to_another_replica_when_one_answers_503_or_never_answers(
    servers: tuple[LoopbackVLLM, LoopbackVLLM], fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Tokenizing is read-only: asking another replica is safe. Before, the call that asked the failing replica
    first failed (vLLM's 503, or a timeout) although the other one was up."""
    failing, healthy = servers
    failing.faults["/tokenize"] = fault
    caplog.set_level(logging.INFO, logger="inference.replicas")
    async with VLLMProvider(base_url=[failing.base_url, healthy.base_url], timeout=0.5, max_retries=0,
                            replica_down_s=600) as provider:
        for _ in range(4):  # round-robin: at least one call asks the failing replica first
            assert await provider.tokenize("Hello, world", model=MODEL) == TOKENS
    assert failing.requests == ["/tokenize"]  # asked once, then left alone while it is down
    (down,) = replica_events(caplog, "down")
    assert (down.url, down.error) == (failing.base_url, "HTTP 503" if fault == "busy" else "ReadTimeout")


async def test_an_on_demand_load_goes_to_another_replica_when_the_first_answers_503(
    servers: tuple[LoopbackVLLM, LoopbackVLLM],
) -> None:
    """A load that got 503 was not done: it is made on the next replica. Before, load_adapter failed with the 503."""
    busy, healthy = servers
    busy.faults["/v1/load_lora_adapter"] = "busy"
    async with VLLMProvider(base_url=[busy.base_url, healthy.base_url], max_retries=0,
                            adapter_placement="on-demand", replica_down_s=600) as provider:
        await provider.load_adapter("a1", "/adapters/a1")  # placement picks the first replica (base-URL order)
        assert provider.placement is not None
        assert [replica.base_url for replica in provider.placement.holders("a1")] == [healthy.base_url]
        assert await generate_text_with(provider, "a1") == "from b"
    assert busy.requests.count("/v1/load_lora_adapter") == 1
    assert "/v1/chat/completions" not in busy.requests


async def test_an_on_demand_load_that_timed_out_is_not_made_elsewhere_but_the_next_load_is(
    servers: tuple[LoopbackVLLM, LoopbackVLLM],
) -> None:
    """A load that timed out may have been made: it fails (not loaded twice); the replica is down, so the next
    load goes to the other one at once instead of waiting for the hung replica again. (The replica hangs on loads
    only: one that hangs on everything is found down by the listing a first load asks for, before the load.)"""
    hung, healthy = servers
    hung.faults["/v1/load_lora_adapter"] = "hang"
    async with VLLMProvider(base_url=[hung.base_url, healthy.base_url], timeout=0.5, max_retries=0,
                            adapter_placement="on-demand", replica_down_s=600) as provider:
        with pytest.raises(ProviderTimeoutError, match=hung.base_url):
            await provider.load_adapter("a1", "/adapters/a1")
        assert "/v1/load_lora_adapter" not in healthy.requests
        await provider.load_adapter("a2", "/adapters/a2")
        assert provider.placement is not None
        assert [replica.base_url for replica in provider.placement.holders("a2")] == [healthy.base_url]
    assert hung.requests.count("/v1/load_lora_adapter") == 1


async def generate_text_with(provider: VLLMProvider, adapter_id: str) -> str:
    return (await provider.generate("Hi", model=MODEL, adapter_id=adapter_id, max_tokens=4)).text
