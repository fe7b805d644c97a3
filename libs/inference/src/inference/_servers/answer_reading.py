"""Reading a server's answer safely: its lines as UTF-8, within a time and a size, and what an error keeps of the
request.

:class:`~inference._servers.http.ServerClient` reads every answer through these, each read bounded by
:func:`~inference._core.deadlines.within` (httpx's own timeout is per read, so a server dripping bytes would never
time out): :func:`read_whole` reads a whole answer of at most :data:`MAX_ANSWER_BYTES`, :func:`utf8_lines` splits a
streamed answer into lines decoded as UTF-8 whatever charset it names (each line at most that size too), and
:func:`shown_request` is the copy of a request an error carries (no key, no credentials in the URL: errors are shown,
logged and pickled).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx

from inference._core.redaction import HIDDEN, redact_url, sensitive_parameter

__all__ = [
    "MAX_ANSWER_BYTES",
    "AnswerTooLarge",
    "hide_request_secrets",
    "read_whole",
    "redirect_problem",
    "server_message",
    "shown_request",
    "utf8_lines",
]

_LINE_END = re.compile(r"\r\n|\r|\n")

MAX_ANSWER_BYTES = 256 * 2**20
"""The most bytes of a whole answer, or of a streamed one, counted after decompression (256 MiB: a full next-token
distribution over a large vocabulary is tens of MiB). A server cannot make this process hold more: an answer or a
stream without end, or a small gzip body that expands without end, is refused."""

_UNSENT_HEADERS = frozenset({b"content-encoding", b"content-length", b"transfer-encoding"})
"""Headers about the body as it was sent (compressed, chunked), not as it is read."""


class AnswerTooLarge(Exception):
    """An answer (or a streamed one) went over :data:`MAX_ANSWER_BYTES`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit / 2**20:g} MiB")


async def read_whole(response: httpx.Response) -> httpx.Response:
    """``response`` read whole, decompressed, and closed: a new response with the same status, headers (as the
    server sent their bytes), request, extensions (its reason phrase) and ``elapsed``.

    Raises:
        AnswerTooLarge: The answer went over :data:`MAX_ANSWER_BYTES` (reading stopped there).
    """
    limit, size, parts = MAX_ANSWER_BYTES, 0, []
    async for part in response.aiter_bytes():
        size += len(part)
        if size > limit:
            raise AnswerTooLarge(limit)
        parts.append(part)
    await response.aclose()
    headers = [(name, value) for name, value in response.headers.raw if name.lower() not in _UNSENT_HEADERS]
    answer = httpx.Response(
        response.status_code, headers=headers, content=b"".join(parts), request=response.request,
        extensions=response.extensions,
    )
    answer.elapsed = response.elapsed
    return answer


def redirect_problem(response: httpx.Response) -> str | None:
    """What is wrong with a redirect (3xx) taken for an answer: its body is not the one asked for, and the SDK does
    not follow it (a request is never sent on to another host with the key); ``None`` for any other status."""
    if not 300 <= response.status_code < 400:
        return None
    where = redact_url(response.headers.get("location", "nowhere"))
    return (
        f"a redirect ({response.status_code} to {where}) instead of an answer; the SDK does not follow redirects: "
        "set the URL it points to"
    )


async def utf8_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The lines of a streamed answer, decoded as UTF-8 whatever charset its headers name (JSON lines and
    server-sent events are UTF-8), strictly: bytes that are not UTF-8 raise ``UnicodeDecodeError`` rather than
    becoming U+FFFD in the text. A CR LF split between two reads ends one line (a blank line ends an event).

    Raises:
        AnswerTooLarge: The lines went over :data:`MAX_ANSWER_BYTES` (their bytes as received): a stream that does
            not end, or one line that does not.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    pending: list[str] = []  # the line so far, in pieces: joined only once it ends (never again per piece)
    pending_bytes, limit, total = 0, MAX_ANSWER_BYTES, 0
    after_cr = False  # the last read ended with CR: an LF that starts the next one ends no second line
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:  # the caller keeps what the lines say (the text so far): a stream that never ends
            raise AnswerTooLarge(limit)
        text = decoder.decode(chunk)
        if after_cr and text.startswith("\n"):
            text = text[1:]
        if text:
            after_cr = text.endswith("\r")
        if _LINE_END.search(text) is None:
            pending.append(text)
            pending_bytes += len(chunk)
            if pending_bytes > limit:
                raise AnswerTooLarge(limit)
            continue
        *lines, rest = _LINE_END.split("".join(pending) + text)
        pending, pending_bytes = [rest], len(rest.encode("utf-8", "surrogatepass"))
        if pending_bytes > limit:
            raise AnswerTooLarge(limit)
        for line in lines:
            yield line
    last = "".join(pending) + decoder.decode(b"", final=True)
    if last:
        yield last


_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key"})


def shown_request(request: httpx.Request) -> httpx.Request:
    """What an error keeps of the request it answers: the method, the URL with its credentials ``***`` and the
    headers with the key ``***`` (an error is shown, logged and pickled: ``err.request`` must not carry the key)."""
    headers = [(name, "***" if name.lower() in _SECRET_HEADERS else value) for name, value in request.headers.items()]
    return httpx.Request(request.method, redact_url(str(request.url)), headers=headers)


def hide_request_secrets(text: str, request: httpx.Request) -> str:
    """``text`` from a server (its error message) with every credential ``request`` carried hidden: a server or a
    proxy that quotes the request back (its path, its ``Authorization`` header) must not show the key in an error.

    Hidden: the values of the key headers (a ``Bearer`` token, a ``Basic`` pair in base64 and decoded), the URL's
    ``user:password`` and its credential parameters (``?api_key=``), in any URL of the text too.
    """
    secrets: set[str] = set()
    for name, value in request.headers.items():
        if name.lower() in _SECRET_HEADERS:
            secrets.update((value, *value.split()[1:]))
            scheme, _, encoded = value.partition(" ")
            if scheme.lower() == "basic":
                secrets.update(_decoded_pair(encoded.strip()))
    url = request.url
    secrets.update(part for part in (url.userinfo.decode(errors="replace"), url.password) if part)
    for name, value in url.params.multi_items():
        if value and sensitive_parameter(name):
            secrets.add(value)
    for secret in sorted((secret for secret in secrets if len(secret) >= 3), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return redact_url(text)


def _decoded_pair(encoded: str) -> tuple[str, ...]:
    """A ``Basic`` header's ``user:password`` and its password, or nothing if it is not base64."""
    try:
        pair = base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ()
    return (pair, pair.partition(":")[2])


def server_message(body: Any) -> str:
    """The message of a server's error body (``error``, ``message``, ``detail``...), else the body as JSON."""
    if isinstance(body, dict):
        for key in ("error", "message", "detail", "error_message"):  # error_message: SGLang's LoRA routes
            value = body.get(key)
            if isinstance(value, dict):
                return server_message(value)
            if isinstance(value, str) and value:
                return value
            if value:
                return json.dumps(value)[:500]
    return json.dumps(body)[:500]
