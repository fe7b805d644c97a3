"""Connect timeouts: a connection made while the event loop was stalled is used, a host that never answers still
fails with the clear message, and retries stay within the call's timeout. Real loopback sockets throughout."""

from __future__ import annotations

import asyncio
import logging
import re
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import inference._servers.http as http_module
import inference._servers.transport as transport
from inference._servers.http import ServerClient
from inference.exceptions import ProviderTimeoutError

CONNECT_LIMIT = 0.2
"""The connect timeout of these tests' clients (10 s in use), so that a stall or a black hole outlasts it quickly."""


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "16")
        self.end_headers()
        self.wfile.write(b'{"data": ["up"]}')

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server_url() -> Iterator[str]:
    """A real HTTP server on loopback, in a thread of its own: a stalled client loop does not stall it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def black_hole_url() -> Iterator[str]:
    """A loopback port that never completes a connection: a listener with a backlog of 0 that one connection fills,
    so the kernel drops every later connection's SYN (as a firewall that drops packets does)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname())
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        filler.close()
        listener.close()


@pytest.fixture(autouse=True)
def short_connect_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_module, "CONNECT_TIMEOUT_MAX", CONNECT_LIMIT)


def make_client(url: str, *, timeout: float = 30.0, max_retries: int = 0) -> ServerClient:
    return ServerClient(
        provider="demo", server="Demo", base_url=url, timeout=timeout, max_retries=max_retries, env_prefix="DEMO"
    )


def attempts_named(error: BaseException, sentence: str) -> int:
    """The number of attempts ``error``'s message names after ``sentence`` ("... (3 attempts)")."""
    found = re.search(re.escape(sentence) + r" \((\d+) attempts\)", str(error))
    assert found is not None, str(error)
    return int(found.group(1))


class StallingSelector(selectors.DefaultSelector):
    """A selector that, once armed, stalls the event loop before its next wait after a socket starts connecting (is
    registered for writing): as a process starved of CPU is, the connection is made meanwhile and the connect
    deadline passes, and the loop then sees both at once."""

    def __init__(self, stall: float) -> None:
        super().__init__()
        self.stall = stall
        self.armed = False
        self.stalls = 0
        self._due = False

    def register(self, fileobj: selectors._FileObject, events: int, data: object = None) -> selectors.SelectorKey:
        key = super().register(fileobj, events, data)
        if self.armed and events & selectors.EVENT_WRITE:
            self.armed, self._due = False, True
        return key

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self._due:
            self._due = False
            self.stalls += 1
            time.sleep(self.stall)  # the whole loop stops, as when the process gets no CPU
        return super().select(timeout)


def test_a_connection_made_while_the_event_loop_was_stalled_is_used_not_reported_as_a_timeout(
    server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop stalled past the connect deadline while the server accepted the connection: the request was refused
    as ``did not accept a connection within 10 s``, with ``max_retries=0`` even before any retry could help (32 streams
    to a real vLLM server on a CPU-starved machine all failed so)."""
    selector = StallingSelector(stall=5 * CONNECT_LIMIT)
    loop = asyncio.SelectorEventLoop(selector)

    async def ask() -> object:
        client = make_client(server_url)
        try:
            selector.armed = True
            response = await client.request("GET", f"{server_url}/models", operation="list models")
            return response.json()
        finally:
            await client.aclose()

    try:
        with caplog.at_level(logging.WARNING, logger="inference.demo"):
            assert loop.run_until_complete(ask()) == {"data": ["up"]}
    finally:
        loop.close()
    assert selector.stalls == 1
    assert any("event loop was not running" in record.getMessage() for record in caplog.records)


async def test_a_host_that_never_accepts_fails_after_its_retries_naming_the_attempts(black_hole_url: str) -> None:
    client = make_client(black_hole_url, max_retries=2)
    try:
        with pytest.raises(ProviderTimeoutError) as caught:
            await client.request("GET", f"{black_hole_url}/models", operation="list models")
    finally:
        await client.aclose()
    assert "DEMO_TIMEOUT" in str(caught.value)
    # 3: the first and 2 retries; on a loaded machine, an attempt whose deadline struck late counts as stalled and is
    # made again besides, up to LOOP_STALL_RESENDS times
    attempts = attempts_named(caught.value, f"did not accept a connection within {CONNECT_LIMIT:g} s")
    assert 3 <= attempts <= 3 + transport.LOOP_STALL_RESENDS


async def test_connect_retries_end_with_the_calls_timeout(black_hole_url: str) -> None:
    """A call's ``timeout`` bounds its connection attempts: 100 retries allowed, a 0.5 s timeout, 0.2 s per attempt."""
    client = make_client(black_hole_url, timeout=0.5, max_retries=100)
    try:
        with pytest.raises(ProviderTimeoutError) as caught:
            await client.request("GET", f"{black_hole_url}/models", operation="list models")
    finally:
        await client.aclose()
    assert 2 <= attempts_named(caught.value, f"did not accept a connection within {CONNECT_LIMIT:g} s") <= 3


def test_a_stalled_loop_connecting_to_a_host_that_never_accepts_still_fails_with_the_clear_message(
    black_hole_url: str,
) -> None:
    """The attempt whose deadline the stall made late is made again once; the host's silence is then reported."""
    selector = StallingSelector(stall=5 * CONNECT_LIMIT)
    loop = asyncio.SelectorEventLoop(selector)

    async def ask() -> None:
        client = make_client(black_hole_url)
        try:
            selector.armed = True
            await client.request("GET", f"{black_hole_url}/models", operation="list models")
        finally:
            await client.aclose()

    try:
        with pytest.raises(ProviderTimeoutError) as caught:
            loop.run_until_complete(ask())
    finally:
        loop.close()
    assert selector.stalls == 1
    # 2: the stalled attempt and the one made again (a loaded machine may make a late deadline of that one too)
    attempts = attempts_named(caught.value, f"did not accept a connection within {CONNECT_LIMIT:g} s")
    assert 2 <= attempts <= 1 + transport.LOOP_STALL_RESENDS
