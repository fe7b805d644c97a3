"""The servers one provider spreads its work over (replicas): their clients, their order, and asking them all.

A server provider holds a :class:`ReplicaSet`: one :class:`Replica` per base URL, each with its pooled
:class:`~inference._servers.http.ServerClient` and what is known about it (requests in flight, whether it refused a
connection lately, its context size). The set decides the order requests try them in (least busy first,
round-robin among equals, a replica that refused a connection, answered that it cannot serve, or did not answer
within the timeout, last), finds the first that answers (:meth:`ReplicaSet.first_reachable`), asks every replica at
once (:meth:`ReplicaSet.gather`), and says when none can serve (:meth:`ReplicaSet.all_down`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

import httpx

from inference._servers.http import ServerClient, api_base, is_connect_failure, server_root
from inference._servers.openai_wire import CHAT, COMPLETIONS
from inference.exceptions import (
    InferenceError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    ServerResponseError,
)

if TYPE_CHECKING:
    from inference._servers.openai_compatible import OpenAICompatibleProvider

__all__ = [
    "DOWN_SECONDS",
    "UNAVAILABLE_STATUSES",
    "Replica",
    "ReplicaDown",
    "ReplicaLacks",
    "ReplicaSet",
    "is_unavailable",
    "timed_out",
    "unavailable_is_down",
]

DOWN_SECONDS = 5.0
"""A replica that is down is tried last for this long (it is still tried if all are down)."""

UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
"""Answers that say the server cannot serve now, whatever was asked (vLLM's 503 while its queue is full, llama-server's
503 while it loads its model, a proxy's 502/504 with no server behind it): the replica is down for a request that
got one (after the transport's retries) before it started generating, and another replica may take the request."""

_T = TypeVar("_T")

logger = logging.getLogger("inference.replicas")


class Replica:
    """One server: its pooled HTTP client, and how busy and reachable it is."""

    def __init__(self, provider: OpenAICompatibleProvider, base_url: str, settings: Mapping[str, Any]) -> None:
        self.base_url = base_url
        self.root = server_root(base_url)
        self.http = ServerClient(
            provider=provider.name,
            server=provider.server_label,
            base_url=base_url,
            timeout=settings["timeout"],
            max_retries=settings["max_retries"],
            env_prefix=provider.env_prefix,
            headers={"Authorization": f"Bearer {provider._api_key}"} if provider._api_key else None,
        )
        self.provider = provider.name
        self.server = provider.server_label
        self.in_flight = 0
        self.down_until = 0.0
        self.down_since: float | None = None  # when it last went down (time.monotonic()), until it answers again
        self.announces = False  # logs going down and back (with several replicas; one replica's error says it all)
        self.down_seconds = float(settings.get("replica_down_s", DOWN_SECONDS))
        self.max_model_len: int | None = None  # vLLM's context size (from /tokenize, or a refused max_tokens)
        self.tokenizers: dict[str, Any] = {}  # model -> what scoring found out about its tokenizer
        self.schema_style = "json_schema"  # "json_object" once the server refused OpenAI's form (llama_cpp.server)
        self.route: asyncio.Future[str] | None = None  # CHAT or COMPLETIONS, once a route choice found out (vLLM)
        root = api_base(base_url)
        self.urls = {CHAT: f"{root}/chat/completions", COMPLETIONS: f"{root}/completions"}

    def mark_down(self, error: InferenceError | None = None) -> None:
        """The replica refused a connection, answered 502/503/504 (:data:`UNAVAILABLE_STATUSES`), or took a request
        and did not answer within the timeout (:func:`timed_out`: a hung server): try it last for ``down_seconds``
        (the provider's ``replica_down_s``, default :data:`DOWN_SECONDS`). Its going down is logged once (a warning
        with the fields ``replica_event="down"``, ``url``, ``error``), not at every failed try."""
        now = time.monotonic()
        self.down_until = now + self.down_seconds
        if self.down_since is None:
            self.down_since = now
            if not self.announces:
                return
            reason = failure_name(error) if error is not None else "unreachable"
            logger.warning(
                "%s replica %s is down (%s): requests go to the other replicas", self.server, self.http.shown_url,
                reason,
                extra={"replica_event": "down", "provider": self.provider, "url": self.http.shown_url,
                       "error": reason},
            )

    def mark_up(self) -> None:
        """The replica answered: it is tried in turn again, and if it was down, its coming back is logged (info,
        ``replica_event="back"``, ``url``, ``downtime_s``)."""
        self.down_until = 0.0
        if self.down_since is not None:
            downtime = time.monotonic() - self.down_since
            self.down_since = None
            if not self.announces:
                return
            logger.info(
                "%s replica %s is back after %.1f s", self.server, self.http.shown_url, downtime,
                extra={"replica_event": "back", "provider": self.provider, "url": self.http.shown_url,
                       "downtime_s": round(downtime, 3)},
            )

    @contextlib.contextmanager
    def down_if_hung(self) -> Iterator[None]:
        """A timeout waiting for this replica's answer inside the block (:func:`timed_out`) marks it down; the error
        is raised as it is: the request reached the server, which may have run it, so it is not sent elsewhere."""
        try:
            yield
        except ProviderTimeoutError as error:
            if timed_out(error) and error.url == self.http.shown_url:
                self.mark_down(error)
            raise

    async def aclose(self) -> None:
        await self.http.aclose()


def failure_name(error: InferenceError) -> str:
    """What failed, for an operator: the status of an error answer (``HTTP 503``), else the type of what caused
    ``error`` (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``; an answer not read whole within the timeout is
    a ``ReadTimeout`` too), else its own type."""
    if isinstance(error, ServerResponseError) and error.status_code is not None:
        return f"HTTP {error.status_code}"
    if isinstance(error, ProviderTimeoutError) and error.__cause__ is None:
        return "ReadTimeout"
    return type(error.__cause__ or error).__name__


def timed_out(error: InferenceError) -> bool:
    """True when ``error`` is a replica's silence: it accepted the connection and did not answer (or send the next
    part of its answer) within the provider's timeout; a stopped (SIGSTOP) or deadlocked server does that to every
    request. Not a failure to connect (:func:`is_unavailable`), nor a wait for a free connection of this process's
    own pool."""
    return (
        isinstance(error, ProviderTimeoutError)
        and not is_connect_failure(error)
        and not isinstance(error.__cause__, httpx.PoolTimeout)
    )


def is_unavailable(error: InferenceError) -> bool:
    """True when ``error`` says its replica cannot serve, whatever was asked: a failure to connect (the request
    never reached it), or a 502/503/504 answer (:data:`UNAVAILABLE_STATUSES`)."""
    return is_connect_failure(error) or (
        isinstance(error, ServerResponseError) and error.status_code in UNAVAILABLE_STATUSES
    )


class ReplicaDown(Exception):
    """A replica cannot serve a request it has not started on (a connect failure, a 502/503/504 answer): another
    replica may take it."""

    def __init__(self, error: InferenceError) -> None:
        super().__init__(str(error))
        self.error = error


class ReplicaLacks(Exception):
    """A replica cannot serve a request that another may (a llama-server restarted without one of its adapters):
    the request goes to the next replica, and ``error`` is raised if none can."""

    def __init__(self, error: InferenceError) -> None:
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def unavailable_is_down() -> Iterator[None]:
    """A failure to connect, or a 502/503/504 answer, inside the block becomes :class:`ReplicaDown`: the replica
    cannot serve, so another one may take the request (any other error passes as it is; so does a timeout, as the
    caller's time is spent on it, and the server may have acted on the request: see :meth:`Replica.down_if_hung`).

    Only around a request that has not started generating: a whole answer, or a stream's status line (an error
    status comes before any event).
    """
    try:
        yield
    except InferenceError as error:
        if is_unavailable(error):
            raise ReplicaDown(error) from error
        raise


class ReplicaSet(Sequence[Replica]):
    """The replicas of one provider, in configuration order (it is a sequence of them).

    Args:
        provider: The provider (its name, server label, environment prefix and key name the replicas' clients).
        settings: The provider's settings; ``base_url`` holds one URL or several, comma-separated.
    """

    def __init__(self, provider: OpenAICompatibleProvider, settings: Mapping[str, Any]) -> None:
        self.base_url: str = settings["base_url"]
        self._replicas = tuple(Replica(provider, url, settings) for url in self.base_url.split(",") if url)
        for replica in self._replicas:
            replica.announces = len(self._replicas) > 1
        self.provider = provider.name
        """The provider name, carried by errors."""
        self.server = provider.server_label
        """What the server is called in messages (``"vLLM"``)."""
        self.env_prefix = provider.env_prefix
        """Prefix of the provider's environment variables (``"VLLM"``), for hints."""
        # Each process starts at a random replica: CLI runs and fresh workers do not all pile onto the first one.
        self._cursor = itertools.count(random.randrange(len(self._replicas)) if self._replicas else 0)

    @overload
    def __getitem__(self, index: int) -> Replica: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Replica]: ...

    def __getitem__(self, index: int | slice) -> Replica | Sequence[Replica]:
        return self._replicas[index]

    def __len__(self) -> int:
        return len(self._replicas)

    def __iter__(self) -> Iterator[Replica]:
        return iter(self._replicas)

    def in_order(self) -> list[Replica]:
        """The replicas to try, in order: those up, least busy first (round-robin among equals), then those marked
        down lately."""
        count = len(self._replicas)
        start = next(self._cursor) % count
        rotated = self._replicas[start:] + self._replicas[:start]
        now = time.monotonic()
        up = sorted((replica for replica in rotated if replica.down_until <= now), key=lambda r: r.in_flight)
        return up + [replica for replica in rotated if replica.down_until > now]

    async def first_reachable(self, work: Callable[[Replica], Awaitable[_T]]) -> _T:
        """Run ``work`` on the first replica, in :meth:`in_order`, that can serve it: one that refuses connections,
        answers 502/503/504 (:func:`is_unavailable`) or does not answer within the timeout (:func:`timed_out`) is
        marked down and the next one tried. Only for work any replica can do and that is safe to ask again, since
        a replica that timed out may have done it: reading (tokenizing, the vocabulary).

        Raises:
            ProviderUnavailableError: No replica accepts connections (:meth:`all_down`).
            InferenceError: No replica could serve: the one failure, else the first error answer (a 503), else the
                first other failure (a timeout); or a replica failed otherwise (its error, raised at once).
        """
        failures: list[tuple[Replica, InferenceError]] = []
        for replica in self.in_order():
            replica.in_flight += 1
            try:
                result = await work(replica)
            except InferenceError as error:
                if not (is_unavailable(error) or timed_out(error)):
                    raise
                replica.mark_down(error)
                failures.append((replica, error))
                continue
            finally:
                replica.in_flight -= 1
            replica.mark_up()
            return result
        raise self.all_down(failures)

    async def gather(
        self, work: Callable[[Replica], Awaitable[_T]], replicas: Iterable[Replica] | None = None
    ) -> list[_T | BaseException]:
        """Run ``work`` on every replica (or on ``replicas``) at once; each outcome, or what it raised, in order."""
        chosen = self._replicas if replicas is None else replicas
        return await asyncio.gather(*(work(replica) for replica in chosen), return_exceptions=True)

    async def answers(self, work: Callable[[Replica], Awaitable[_T]], what: str) -> list[_T]:
        """Run ``work`` on every replica at once; the outcomes of those that answered, in configuration order.

        A replica marked down is left alone while it is (as generations try it last), unless no other answers. A
        replica that failed is left out, as long as another one answered: replicas started alike say the same. One
        that refused connections, answered 502/503/504 or did not answer within the timeout is marked down (logged
        once, when it goes down: see :meth:`Replica.mark_down`; each later miss only at debug level); one that
        failed otherwise is logged as a warning saying it did not do ``what``.

        Raises:
            ProviderUnavailableError: No replica accepts connections.
            InferenceError: No replica answered, and one failed otherwise (its error, e.g. a refused key).
        """
        now = time.monotonic()
        first = [replica for replica in self._replicas if replica.down_until <= now] or list(self._replicas)
        outcomes = dict(zip(first, await self.gather(work, first), strict=True))
        if not any(not isinstance(outcome, BaseException) for outcome in outcomes.values()):
            rest = [replica for replica in self._replicas if replica not in outcomes]
            outcomes.update(zip(rest, await self.gather(work, rest), strict=True))
        answered: list[_T] = []
        failures: list[tuple[Replica, InferenceError]] = []
        for replica in self._replicas:
            if replica not in outcomes:
                continue
            outcome = outcomes[replica]
            if isinstance(outcome, InferenceError):
                if is_unavailable(outcome) or timed_out(outcome):
                    replica.mark_down(outcome)
                failures.append((replica, outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                replica.mark_up()
                answered.append(outcome)
        if not answered:
            other = [error for _, error in failures if not isinstance(error, ProviderUnavailableError)]
            raise other[0] if other else self.all_down(failures)
        for replica, error in failures:
            logger.log(logging.DEBUG if is_unavailable(error) or timed_out(error) else logging.WARNING,
                       "%s replica %s did not %s (%s); using the others' answers", self.server,
                       replica.http.shown_url, what, error)
        return answered

    def all_down(self, failures: list[tuple[Replica, InferenceError]]) -> InferenceError:
        """The error when no replica could serve: the one failure; else the first error answer (a 503: the server
        there says why), else the first timeout; else one naming every URL that refused connections."""
        if len(failures) == 1:
            return failures[0][1]
        answered: list[InferenceError] = [error for _, error in failures if isinstance(error, ServerResponseError)]
        answered += [error for _, error in failures if timed_out(error)]
        if answered:
            return answered[0]
        said = ", ".join(f"{replica.http.shown_url} ({failure_name(error)})" for replica, error in failures)
        return ProviderUnavailableError(
            f"none of the {len(failures)} {self.server} replicas accepts connections ({said}): start them, "
            f"or remove the URLs of stopped servers from {self.env_prefix}_BASE_URL (or base_url)",
            provider=self.provider,
            url=self.base_url,
        )

    async def aclose(self) -> None:
        """Close every replica's pooled connections."""
        for replica in self._replicas:
            await replica.aclose()
