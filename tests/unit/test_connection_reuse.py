"""Connection reuse: requests one after another share a kept-alive connection, and a request the server closed its
idle connection on is sent again, where a POST whose connection dropped otherwise is not. A real loopback server."""

from __future__ import annotations

import asyncio
import re

import pytest

from inference._servers.http import RetryPolicy, ServerClient
from inference.exceptions import ProviderUnavailableError

FAST = RetryPolicy(backoff_base=0.001, backoff_max=0.002, retry_after_max=0.01)


def make_client(max_retries: int, base_url: str) -> ServerClient:
    return ServerClient(
        provider="demo",
        server="Demo",
        base_url=base_url,
        timeout=5.0,
        max_retries=max_retries,
        env_prefix="DEMO",
        retry_policy=FAST,
    )


class KeepAliveServer:
    """A loopback HTTP/1.1 server that keeps connections alive and, on cue, closes one as a request arrives on it
    without answering: the race of a keep-alive, where the server closes an idle connection the client reuses.

    Attributes:
        requests: Each request received, as ``(connection number, request number on that connection)``.
        drop: ``"reused"`` closes a connection when its second request arrives; ``"new"`` closes every connection
            at its first request; ``None`` answers everything.
    """

    def __init__(self, drop: str | None) -> None:
        self.drop = drop
        self.requests: list[tuple[int, int]] = []
        self._connections = 0

    async def __aenter__(self) -> KeepAliveServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        connection = self._connections
        try:
            for number in range(1, 100):
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                self.requests.append((connection, number))
                if (self.drop, number) in (("reused", 2), ("new", 1)):
                    return  # closed in finally, no answer
                body = b'{"ok": true}'
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             + f"content-length: {len(body)}\r\n\r\n".encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_requests_one_after_another_go_out_on_one_kept_alive_connection() -> None:
    """They used to go to 32 connection pools in turn: a new connection (a TLS handshake on a hosted API) for
    almost every request."""
    async with KeepAliveServer(drop=None) as server:
        client = make_client(max_retries=0, base_url=server.url)
        for _ in range(5):
            response = await client.request("POST", f"{server.url}/thing", operation="do the thing", json_body={})
            assert response.json() == {"ok": True}
        await client.aclose()
    assert server.requests == [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]


async def test_a_post_the_server_closed_its_kept_alive_connection_on_is_sent_again_on_a_new_one() -> None:
    """With retries off too: the server never answered on the connection it was closing (uvicorn closes one idle
    for 5 s, so on a loaded machine a request now and then goes out just as it does)."""
    async with KeepAliveServer(drop="reused") as server:
        client = make_client(max_retries=0, base_url=server.url)
        answers = []
        for pause in (0.0, 1.1):  # idle over STALE_AFTER_SECONDS (1 s): long enough for a keep-alive to end
            await asyncio.sleep(pause)
            answers.append(
                (await client.request("POST", f"{server.url}/thing", operation="do the thing", json_body={})).json()
            )
        await client.aclose()
    assert answers == [{"ok": True}, {"ok": True}]
    assert server.requests == [(1, 1), (1, 2), (2, 1)]  # the second request: closed unanswered, then resent


@pytest.mark.parametrize("drop", ["new", "reused"])
async def test_a_post_whose_connection_is_closed_unanswered_is_not_sent_again(drop: str) -> None:
    """On a new connection, or on one just used (a server that fails while at work on the request): the server may
    have acted on it."""
    async with KeepAliveServer(drop=drop) as server:
        client = make_client(max_retries=2, base_url=server.url)
        if drop == "reused":
            await client.request("POST", f"{server.url}/thing", operation="do the thing", json_body={})
        with pytest.raises(ProviderUnavailableError, match="dropped the connection during do the thing"):
            await client.request("POST", f"{server.url}/thing", operation="do the thing", json_body={})
        await client.aclose()
    assert server.requests == [(1, 1)] if drop == "new" else [(1, 1), (1, 2)]
