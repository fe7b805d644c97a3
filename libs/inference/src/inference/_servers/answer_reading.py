"""Reading a server's answer safely: its lines as UTF-8, within a time, and what an error keeps of the request.

:class:`~inference._servers.http.ServerClient` reads every answer through these: :func:`within` bounds a read
(httpx's own timeout is per read, so a server dripping bytes would never time out), :func:`utf8_lines` splits a
streamed answer into lines decoded as UTF-8 whatever charset it names, and :func:`shown_request` is the copy of a
request an error carries (no key, no credentials in the URL: errors are shown, logged and pickled).
"""

from __future__ import annotations

import asyncio
import codecs
import re
import sys
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import httpx

from inference._core.redaction import redact_url

__all__ = ["shown_request", "utf8_lines", "within"]

_T = TypeVar("_T")

_LINE_END = re.compile(r"\r\n|\r|\n")


async def utf8_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The lines of a streamed answer, decoded as UTF-8 whatever charset its headers name (JSON lines and
    server-sent events are UTF-8), strictly: bytes that are not UTF-8 raise ``UnicodeDecodeError`` rather than
    becoming U+FFFD in the text. A CR LF split between two reads gives an extra blank line (blank lines are
    skipped)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    pending = ""
    async for chunk in response.aiter_bytes():
        *lines, pending = _LINE_END.split(pending + decoder.decode(chunk))
        for line in lines:
            yield line
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending


async def within(seconds: float, work: Awaitable[_T]) -> _T:
    """Await ``work``, or raise ``asyncio.TimeoutError`` after ``seconds``; a cancelled caller is cancelled (Python
    3.11's ``asyncio.timeout``; before it, ``wait_for``)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await work
    return await asyncio.wait_for(work, seconds)


_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key"})


def shown_request(request: httpx.Request) -> httpx.Request:
    """What an error keeps of the request it answers: the method, the URL with its credentials ``***`` and the
    headers with the key ``***`` (an error is shown, logged and pickled: ``err.request`` must not carry the key)."""
    headers = [(name, "***" if name.lower() in _SECRET_HEADERS else value) for name, value in request.headers.items()]
    return httpx.Request(request.method, redact_url(str(request.url)), headers=headers)
