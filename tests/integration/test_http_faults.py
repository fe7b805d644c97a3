"""Faults against real servers on loopback: ``python -m llama_cpp.server`` processes, and a stub that never answers.

Each case asserts the typed error a user gets, and that the SAME provider object serves the next request
once the server is back. The tiny Qwen2 model never stops on its own under greedy decoding, so a request
for thousands of tokens keeps the server busy for seconds: long enough to kill it mid-request. Closing a
stream early is shown on the wire in the unit tests: llama_cpp.server, unlike vLLM, goes on generating after
its client has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from inference.exceptions import ProviderTimeoutError, ProviderUnavailableError
from inference.provider import GenerationResult
from inference.vllm_provider import VLLMProvider

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen2"
LONG = 4000  # tokens: 10 s or more of generation for the tiny model, never finished before the kill
LONG_CONTEXT = 4096


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def connection_open_to(port: int) -> bool:
    """True when a TCP connection to 127.0.0.1:``port`` is established (read from /proc/net/tcp)."""
    wanted = f"{port:04X}"
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == "01" and wanted in (local.rsplit(":", 1)[1], remote.rsplit(":", 1)[1]):
                return True
    return False


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used (user + system, from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


slow_server = pytest.mark.slow  # each starts llama_cpp.server processes: seconds each on a busy machine


async def wait_for(condition: Callable[[], bool], what: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what} after {seconds:g} s")
        await asyncio.sleep(0.02)


async def still_serves(provider: VLLMProvider) -> None:
    result = await provider.generate("Hello", model=MODEL, max_tokens=4, temperature=0.0)
    assert result.completion_tokens > 0 and result.text


@slow_server
async def test_server_down_at_start_then_started_on_that_port(
    start_llama_server: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inference.vllm")
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    async with VLLMProvider(base_url=url, max_retries=2, timeout=30) as provider:
        with pytest.raises(ProviderUnavailableError) as caught:
            await provider.generate("Hello", model=MODEL, max_tokens=4)
        message = str(caught.value)
        assert f"nothing answers at {url}" in message and "3 attempts" in message and "VLLM_BASE_URL" in message
        assert caught.value.url == url
        assert caplog.text.count("retrying POST") == 2  # the retry budget, then the typed error

        start_llama_server(port=port)
        await still_serves(provider)


@slow_server
async def test_server_killed_mid_request_then_restarted(start_llama_server: Callable[..., Any]) -> None:
    server = start_llama_server(n_ctx=LONG_CONTEXT)
    async with VLLMProvider(base_url=server.base_url, max_retries=2, timeout=60) as provider:
        idle = cpu_seconds(server.process.pid)
        request = asyncio.create_task(
            provider.generate("Tell me a story", model=MODEL, max_tokens=LONG, temperature=0.0)
        )
        await wait_for(lambda: connection_open_to(server.port), "the request's connection")
        # The server is at work on it: its process has spent CPU time generating (an open connection alone may
        # not have been accepted yet, and a kill then is a connect failure, retried).
        await wait_for(lambda: cpu_seconds(server.process.pid) > idle + 0.2, "the server to generate")
        assert not request.done()
        server.kill()
        with pytest.raises(ProviderUnavailableError) as caught:
            await request
        assert f"vLLM at {server.base_url} dropped the connection during generate" in str(caught.value)

        start_llama_server(port=server.port)  # a fresh server where the old one was
        await still_serves(provider)


@slow_server
async def test_server_killed_mid_stream_then_restarted(start_llama_server: Callable[..., Any]) -> None:
    server = start_llama_server(n_ctx=LONG_CONTEXT)
    async with VLLMProvider(base_url=server.base_url, max_retries=2, timeout=60) as provider:
        pieces: list[str] = []
        with pytest.raises(ProviderUnavailableError) as caught:
            async for event in provider.stream("Tell me a story", model=MODEL, max_tokens=LONG, temperature=0.0):
                assert isinstance(event, str), "the stream ended before the server was killed"
                pieces.append(event)
                if len(pieces) == 1:  # the server is generating: kill it
                    server.kill()
        assert pieces
        assert f"vLLM at {server.base_url} dropped the connection during stream" in str(caught.value)

        start_llama_server(port=server.port)
        events = [event async for event in provider.stream("Hello", model=MODEL, max_tokens=4, temperature=0.0)]
        assert isinstance(events[-1], GenerationResult) and events[-1].completion_tokens > 0


@slow_server
async def test_a_dead_replica_is_skipped_and_all_dead_is_typed(start_llama_server: Callable[..., Any]) -> None:
    first, second = start_llama_server(), start_llama_server()
    async with VLLMProvider(base_url=[first.base_url, second.base_url], max_retries=0, timeout=30) as provider:
        assert len(provider.replicas) == 2
        await still_serves(provider)
        second.kill()
        for _ in range(4):
            await still_serves(provider)
        first.kill()
        with pytest.raises(ProviderUnavailableError) as caught:
            await provider.generate("Hello", model=MODEL, max_tokens=4)
        assert first.base_url in str(caught.value) and second.base_url in str(caught.value)

        start_llama_server(port=second.port)
        await still_serves(provider)


class StubServer:
    """An HTTP server on loopback that either never answers (``hang``) or answers a chat completion at once."""

    def __init__(self) -> None:
        self.hang = True
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aenter__(self) -> StubServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            await reader.readexactly(length)
            if self.hang:
                await reader.read()  # until the client gives up and closes the connection
                return
            body = json.dumps(
                {
                    "id": "chatcmpl-stub",
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": MODEL,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "at last"}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                }
            ).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


@pytest.fixture
async def stub() -> AsyncIterator[StubServer]:
    async with StubServer() as server:
        yield server


async def test_a_server_that_never_answers_times_out_then_recovers(stub: StubServer) -> None:
    async with VLLMProvider(base_url=stub.base_url, timeout=0.5, max_retries=2) as provider:
        with pytest.raises(ProviderTimeoutError) as caught:
            await provider.generate("Hello", model=MODEL, max_tokens=4)
        assert "did not answer within 0.5 s" in str(caught.value) and "VLLM_TIMEOUT" in str(caught.value)
        assert stub.connections == 1  # a timeout is never retried: the server may still be working on it

        with pytest.raises(ProviderTimeoutError):
            async for _event in provider.stream("Hello", model=MODEL, max_tokens=4):
                pass

        stub.hang = False
        result = await provider.generate("Hello", model=MODEL, max_tokens=4)
        assert (result.text, result.token_count) == ("at last", 5)


async def test_a_call_that_timed_out_during_the_route_probe_leaves_no_failed_probe_behind(stub: StubServer) -> None:
    """The first call on a new provider (``api="auto"``) gives up (its own ``timeout``) while the shared question
    about the chat template (``POST /tokenize``) waits for a hung server; that question then fails too (the
    provider's timeout). Before, the failed question stayed cached, so the next call, with the server back, failed
    at once with its stale "did not answer within 3 s (find out whether the server's model has a chat template)"."""
    async with VLLMProvider(base_url=stub.base_url, timeout=3, max_retries=0) as provider:
        with pytest.raises(ProviderTimeoutError, match=r"within timeout=0\.1 s"):
            await provider.generate("Hello", model=MODEL, max_tokens=4, timeout=0.1)
        [replica] = provider._replicas
        await wait_for(lambda: replica.route is None or replica.route.done(), "the probe to give up")
        stub.hang = False
        result = await provider.generate("Hello", model=MODEL, max_tokens=4)
        assert result.text == "at last"


@slow_server
async def test_cancelling_generate_batch_or_stream_closes_the_connection(
    start_llama_server: Callable[..., Any],
) -> None:
    """Cancelling the awaiting task closes the HTTP request at once, whichever call it was waiting on.

    llama_cpp.server goes on generating for a client that left (vLLM aborts the request); what the SDK owes
    is to close the connection, which a real server sees here as the connection leaving ESTABLISHED.
    """
    server = start_llama_server(n_ctx=LONG_CONTEXT)
    prompt = "Tell me a story"

    async def consume_stream(provider: VLLMProvider) -> None:
        async for _event in provider.stream(prompt, model=MODEL, max_tokens=LONG, temperature=0.0):
            pass

    calls: dict[str, Callable[[VLLMProvider], Any]] = {
        "generate": lambda provider: provider.generate(prompt, model=MODEL, max_tokens=LONG, temperature=0.0),
        "generate_batch": lambda provider: provider.generate_batch(
            [prompt, prompt], model=MODEL, max_tokens=LONG, temperature=0.0
        ),
        "stream": consume_stream,
    }
    # api="chat": with "auto" the provider's one question about the chat template would leave an idle
    # keep-alive connection in the pool, and an open connection is what this test watches for.
    async with VLLMProvider(base_url=server.base_url, max_retries=0, timeout=120, api="chat") as provider:
        for name, call in calls.items():
            task = asyncio.create_task(call(provider))
            await wait_for(lambda: connection_open_to(server.port), f"the connection of {name}")
            assert not task.done(), f"{name} finished before it could be cancelled"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_for(lambda: not connection_open_to(server.port), f"{name}'s connection to close")


async def _closing_llama_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One exchange of a llama-server behind a proxy with keep-alive off: no adapters, and every answer closes its
    connection (``Connection: close``)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        asked = json.loads(await reader.readexactly(length) or b"{}")
        path = head.split(b" ", 2)[1].decode()
        kind, body = "application/json", b"[]"  # GET /lora-adapters: none
        if path.startswith("/props"):
            body = json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}).encode()
        elif path.endswith("/completions") and asked.get("stream"):
            kind = "text/event-stream"
            chunks = [{"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                      for piece in ("at ", "last")]
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
            body = b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks) + b"data: [DONE]\n\n"
        elif path.endswith("/completions"):
            body = json.dumps({
                "id": "chatcmpl-stub", "object": "chat.completion", "created": 1700000000, "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "at last"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }).encode()
        writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\nconnection: close\r\n"
                     f"content-length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def test_llama_server_behind_a_proxy_that_closes_every_connection_answers_when_it_has_no_adapters() -> None:
    """No adapter position to mistake: the adapter list read after the answer is the check (it failed every request,
    "restarted between reading its adapter list and answering, 3 times in a row")."""
    from inference.llamacpp_server_provider import LlamaCppServerProvider

    server = await asyncio.start_server(_closing_llama_server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with LlamaCppServerProvider(base_url=f"http://127.0.0.1:{port}", max_retries=0) as provider:
            assert (await provider.generate("Hello", model=MODEL, max_tokens=4)).text == "at last"
            events = [event async for event in provider.stream("Hello", model=MODEL, max_tokens=4)]
            assert events[:2] == ["at ", "last"] and isinstance(events[-1], GenerationResult)
    finally:
        server.close()
        await server.wait_closed()
