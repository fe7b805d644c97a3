"""A streamed answer read item by item: JSON lines (NDJSON, Ollama) or server-sent events (the OpenAI wire).

:meth:`~inference._servers.http.ServerClient.stream_json_lines` opens the answer and hands it to :func:`json_items`,
which parses each line (or each event's data) as it arrives, waits for the next one within the client's timeout (a
line dripped byte by byte, or comments sent for ever, would never end by httpx's per-read timeout), and raises an
``{"error": ...}`` item as the server failing mid-answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import httpx

from inference._core.deadlines import within
from inference._servers.answer_reading import (
    AnswerTooLarge,
    hide_request_secrets,
    server_message,
    shown_request,
    utf8_lines,
)
from inference.exceptions import InferenceError, ServerResponseError

if TYPE_CHECKING:
    from inference._servers.http import ServerClient

__all__ = ["ErrorLine", "json_items", "sse_data"]

ErrorLine = Callable[[str, httpx.Response], InferenceError]
"""Builds the error an ``{"error": ...}`` item means, from the server's message and the response."""


async def json_items(
    http: ServerClient,
    response: httpx.Response,
    operation: str,
    error_line: ErrorLine | None,
    sse: bool = False,
) -> AsyncGenerator[Any, None]:
    """The parsed items of ``response``: each JSON line, or with ``sse`` the JSON of each event's data
    (:func:`sse_data`) until ``data: [DONE]``; errors carry ``http``'s provider, server and URL (see
    :meth:`~inference._servers.http.ServerClient.stream_json_lines`)."""
    lines = sse_data(utf8_lines(response)) if sse else utf8_lines(response)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + http.timeout
    while True:
        try:  # the next item within the timeout: httpx's is per read, and a line dripped byte by byte, or
            # comments (": ping") sent for ever, would never end
            line = await within(max(deadline - loop.time(), 0.0), lines.__anext__())
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise http.timeout_error(operation, None) from None
        except UnicodeDecodeError as error:  # as a whole answer's body: never text with bytes replaced
            raise http.protocol_error(operation, f"text that is not UTF-8 ({error.reason})") from error
        except AnswerTooLarge as error:
            raise http.protocol_error(operation, f"a stream of {error} (it did not end)") from None
        if sse and line.strip() == "[DONE]":
            return
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError) as error:  # RecursionError: JSON nested thousands deep
            raise http.protocol_error(operation, f"a line that is not JSON ({error})") from error
        if isinstance(item, dict) and item.get("error"):  # "error": null is a serializer's empty field
            message = hide_request_secrets(server_message(item), response.request)
            if error_line is not None:
                raise error_line(message, response)
            response.request = shown_request(response.request)
            raise ServerResponseError(
                f"{http.where} failed during {operation}: {message}. The server failed; its log says why",
                request=response.request,
                response=response,
                provider=http.provider,
                url=http.shown_url,
            )
        yield item
        deadline = loop.time() + http.timeout  # the caller's time between items is not the server's


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The data of each server-sent event in ``lines``, as the SSE spec reads it: the values of an event's ``data:``
    lines (one space after the colon dropped) joined with newlines, the event ending at a blank line; other fields
    (``event:``, ``id:``) and comments (``: ping``) are skipped, and a byte order mark before the first line is
    dropped. Data left without its blank line when the answer ends is given too."""
    data: list[str] = []
    first = True
    async for line in lines:
        if first:
            line, first = line.removeprefix("\ufeff"), False
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)
