"""The transport under every server client: pooled connections, bounded retries of transient failures.

Like httpx's own ``_transports/``, this is the layer a request passes through on its way to the network:
:class:`PooledTransport` sends through several connection pools in turn and retries connect errors and the statuses
429, 502, 503 and 504 (:class:`RetryPolicy`: exponential backoff, ``Retry-After`` capped), in this one place, for
requests sent by the providers and by the ``openai`` client alike. Nothing here logs a header; every URL logged is
redacted first. A request is sent, and its answer read and closed, so that a cancellation reaches httpcore at most
once (:mod:`inference._servers.cancel_once`).
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import itertools
import logging
import math
import random
import ssl
import time
from dataclasses import dataclass

import httpx

from inference._core.redaction import redact_url
from inference._servers.cancel_once import CancelOnceStream, apart, close_for_sure

__all__ = [
    "CONNECT_TIMEOUT_MAX",
    "ONE_CONNECTION",
    "ONE_CONNECTION_CLIENTS_KEPT",
    "POOL_SHARDS",
    "RETRY_STATUSES",
    "PooledTransport",
    "RetryPolicy",
    "ssl_context",
]

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Statuses that mean "try again shortly"; every other error status is final."""

CONNECT_TIMEOUT_MAX = 10.0
"""Seconds to wait for a TCP connection, at most, whatever the read timeout is."""

POOL_SHARDS = 32
"""Connection pools per client, used in turn. httpcore's pool does work proportional to its connections
and queued requests on every request, so one pool of hundreds of connections costs O(n^2) CPU at high
concurrency (at 256 requests in flight, one pool gave about a quarter of the openai client's own
throughput); 32 small pools keep that cost low (see ``scripts/bench_http_overhead.py``)."""

KEEPALIVE_SECONDS = 4.0
"""How long an idle connection is kept for the next request: under the 5 s after which uvicorn (vLLM's server)
and llama-server close an idle connection, so that a request never goes out on one the server is closing at that
moment (a POST that meets it fails, once in a while, and cannot be sent again: the server may have acted on it)."""

_SHARD_LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=8, keepalive_expiry=KEEPALIVE_SECONDS)
"""Per pool: 32 x 32 = 1024 connections in all, 256 kept alive."""

ONE_CONNECTION = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=KEEPALIVE_SECONDS)
"""The pool of a :meth:`ServerClient.one_connection` client."""

ONE_CONNECTION_CLIENTS_KEPT = 16
"""One-connection clients kept (with their open connections) for the next :meth:`ServerClient.one_connection`."""


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """One default TLS context for every pool (making one loads the CA bundle: tens of milliseconds)."""
    return httpx.create_ssl_context()

@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures are retried.

    Attributes:
        max_retries: Retries after the first attempt (``0`` = no retry).
        backoff_base: Seconds before the first retry; doubled for each later one.
        backoff_max: The most seconds between two attempts from backoff alone.
        retry_after_max: The most seconds a server's ``Retry-After`` may make us wait.
    """

    max_retries: int = 2
    backoff_base: float = 0.1
    backoff_max: float = 2.0
    retry_after_max: float = 5.0

    def delay(self, retry_number: int, retry_after: str | None = None) -> float:
        """Seconds to wait before retry ``retry_number`` (0-based), honouring ``Retry-After`` if given."""
        seconds = _parse_retry_after(retry_after)
        if seconds is not None and math.isfinite(seconds):
            return min(max(seconds, 0.0), self.retry_after_max)
        backoff = min(self.backoff_base * 2.0**retry_number, self.backoff_max)
        return backoff * (0.75 + 0.25 * random.random())  # a little jitter, so clients spread out


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time()


_IDEMPOTENT = frozenset({"GET", "HEAD"})
"""Methods a dropped connection may be resent with: asking again changes nothing on the server."""


class PooledTransport(httpx.AsyncBaseTransport):
    """Sends through several connection pools in turn; retries connect errors and 429/502/503/504, and a GET whose
    connection dropped before the answer.

    Attributes:
        last_connection: The connection (httpcore's network stream) the last answer came on, ``None`` when the
            transport does not say; meaningful for a one-connection transport used by one task at a time.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        logger: logging.Logger,
        *,
        shards: int = POOL_SHARDS,
        limits: httpx.Limits = _SHARD_LIMITS,
    ) -> None:
        context = ssl_context()
        self._pools = [httpx.AsyncHTTPTransport(limits=limits, verify=context) for _ in range(shards)]
        self._next_pool = itertools.cycle(self._pools).__next__
        self._policy = policy
        self._logger = logger
        self.last_connection: object | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        retry_number = 0
        while True:
            try:
                response = await apart(self._next_pool().handle_async_request(request), _close)
            except httpx.ConnectError as error:  # the request never reached the server: safe to resend
                if retry_number >= self._policy.max_retries:
                    raise
                delay, reason = self._policy.delay(retry_number), f"connect error ({error})"
            except (httpx.RemoteProtocolError, httpx.ReadError) as error:  # e.g. a kept-alive connection the server
                # closed or reset as it was reused: resent only when asking again changes nothing (a GET), never a POST
                if request.method not in _IDEMPOTENT or retry_number >= self._policy.max_retries:
                    raise
                delay, reason = self._policy.delay(retry_number), f"a dropped connection ({error})"
            else:
                if isinstance(response.stream, httpx.AsyncByteStream):
                    response.stream = CancelOnceStream(response.stream)
                self.last_connection = response.extensions.get("network_stream")
                if response.status_code not in RETRY_STATUSES or retry_number >= self._policy.max_retries:
                    return response
                delay = self._policy.delay(retry_number, response.headers.get("retry-after"))
                reason = f"status {response.status_code}"
                await close_for_sure(response.aclose())
            retry_number += 1
            self._logger.info(
                "retrying %s %s in %.2f s after %s (retry %d of %d)",
                request.method,
                redact_url(str(request.url)),
                delay,
                reason,
                retry_number,
                self._policy.max_retries,
            )
            await asyncio.sleep(delay)

    def at_rest(self) -> bool:
        """Whether no connection is in use: every one is idle or closed (none left half closed by a failure)."""
        return all(
            connection.is_idle() or connection.is_closed()
            for pool in self._pools
            for connection in pool._pool.connections
        )

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


async def _close(response: httpx.Response) -> None:
    await response.aclose()
