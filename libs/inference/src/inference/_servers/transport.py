"""The transport under every server client: pooled connections, bounded retries of transient failures.

Like httpx's own ``_transports/``, this is the layer a request passes through on its way to the network:
:class:`PooledTransport` sends through several connection pools in turn and retries connect errors and the statuses
429, 502, 503 and 504 (:class:`RetryPolicy`: exponential backoff, ``Retry-After`` capped), in this one place, for
requests sent by the providers and by the ``openai`` client alike. A connect timeout is retried as a connect error is
(nothing reached the server), within the call's timeout; an attempt whose connect deadline passed while the event loop
was not running is made again without counting as a retry (:class:`ConnectClock`). Nothing here logs a header; every
URL logged is redacted first. A request is sent, and its answer read and closed, so that a cancellation reaches
httpcore at most once (:mod:`inference._servers.cancel_once`).
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from inference._core.redaction import redact_url
from inference._servers.cancel_once import CancelOnceStream, apart, close_for_sure

__all__ = [
    "CONNECT_TIMEOUT_MAX",
    "LOOP_STALL_RESENDS",
    "ONE_CONNECTION",
    "ONE_CONNECTION_CLIENTS_KEPT",
    "POOL_SHARDS",
    "RETRY_STATUSES",
    "ConnectClock",
    "ConnectTimeoutAfterAttempts",
    "PooledTransport",
    "RetryPolicy",
    "ssl_context",
]

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Statuses that mean "try again shortly"; every other error status is final."""

CONNECT_TIMEOUT_MAX = 10.0
"""Seconds to wait for a TCP connection (and its TLS handshake), at most, whatever the read timeout is."""

LOOP_STALL_RESENDS = 2
"""Connection attempts made again, at most, per request, because their connect deadline passed while the event loop
was not running (a process starved of CPU): the connection may well have been made meanwhile, unseen."""

LATE_DEADLINE = 0.1
"""Seconds after its connect deadline that a timeout must strike for the attempt to count as stalled: a running event
loop strikes a deadline within milliseconds."""

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


class ConnectTimeoutAfterAttempts(httpx.ConnectTimeout):
    """httpx's ``ConnectTimeout`` of a request's last connection attempt, after ``attempts`` attempts in all."""

    def __init__(self, error: httpx.ConnectTimeout, attempts: int) -> None:
        super().__init__(str(error))
        self.attempts = attempts


_PHASE_STARTED = frozenset({"connection.connect_tcp.started", "connection.start_tls.started"})
_PHASE_FAILED = frozenset({"connection.connect_tcp.failed", "connection.start_tls.failed"})


class ConnectClock:
    """Times the connect phases (TCP connect, TLS handshake) of a request's attempts, as httpcore's ``trace``
    extension (a trace the request already had is still called).

    httpcore bounds each phase with a deadline. When the event loop does not run past that deadline (the process
    starved of CPU, a callback blocking the loop), the socket's "connected" and the deadline are seen in the same
    step of the loop, and the deadline wins: a connection made in time ends as ``ConnectTimeout``. Such a timeout
    strikes late, by about as long as the loop was not running; one from a server that did not answer strikes on time.
    """

    def __init__(self, trace: Callable[[str, dict[str, Any]], Awaitable[None]] | None) -> None:
        self._trace = trace
        self._started = 0.0
        self.failed_after = 0.0
        """Seconds the last connect phase that failed lasted, from its start to its failure."""

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name in _PHASE_STARTED:
            self._started = asyncio.get_running_loop().time()
        elif name in _PHASE_FAILED:
            self.failed_after = asyncio.get_running_loop().time() - self._started
        if self._trace is not None:
            await self._trace(name, info)


class PooledTransport(httpx.AsyncBaseTransport):
    """Sends through several connection pools in turn; retries connect errors, connect timeouts and 429/502/503/504,
    and a GET whose connection dropped before the answer.

    A connect timeout is retried within the call's timeout (the request's read timeout: every attempt after the
    first waits for its connection no longer than what is left of it). One whose deadline struck late, because the
    event loop was not running (:class:`ConnectClock`), is not the server's doing: the attempt is made again, up to
    :data:`LOOP_STALL_RESENDS` times, without counting as a retry, also within the call's timeout.

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
        loop = asyncio.get_running_loop()
        began = loop.time()
        timeouts = dict(request.extensions.get("timeout") or {})
        clock = ConnectClock(request.extensions.get("trace"))
        request.extensions = {**request.extensions, "trace": clock}
        retry_number = resends = 0
        while True:
            clock.failed_after = 0.0
            try:
                response = await apart(self._next_pool().handle_async_request(request), _close)
            except httpx.ConnectTimeout as error:  # no connection, so nothing was sent: safe to send again
                limit = timeouts.get("connect")
                late = clock.failed_after - limit if limit is not None else 0.0
                stalled = late > LATE_DEADLINE and resends < LOOP_STALL_RESENDS
                delay = 0.0 if stalled else self._policy.delay(retry_number)
                budget = timeouts.get("read")  # the call's timeout
                left = None if budget is None else budget - (loop.time() - began) - delay
                if (not stalled and retry_number >= self._policy.max_retries) or (left is not None and left <= 0):
                    attempts = retry_number + resends + 1
                    if attempts == 1:
                        raise
                    raise ConnectTimeoutAfterAttempts(error, attempts) from error
                if left is not None and (limit is None or left < limit):  # the next attempt ends with the call
                    timeouts["connect"] = left
                    request.extensions = {**request.extensions, "timeout": dict(timeouts)}
                if stalled:  # not the server's doing: not a retry
                    self._logger.warning(
                        "connecting for %s %s: the deadline struck %.1f s late, as the event loop was not running "
                        "(the process starved of CPU, or a callback blocking the loop); connecting again",
                        request.method,
                        redact_url(str(request.url)),
                        late,
                    )
                    resends += 1
                    continue
                reason = f"connect timeout ({error})"
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

