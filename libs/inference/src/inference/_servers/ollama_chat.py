"""Ollama's native chat route (``POST /api/chat``): the body, a whole answer, a streamed one, its refusals; and its
generate route (``POST /api/generate`` with ``raw: true``) for a ``raw_prompt``, whose answers are read as chat ones.

:class:`OllamaChat` is the generation part the Ollama provider is assembled from (its adapters, derived models, are
:mod:`~inference._servers.ollama_models`'). The native route honours every sampling option (Ollama's
OpenAI-compatible route drops ``repetition_penalty`` and ``top_k`` and forces ``temperature``/``top_p`` to 1.0 when
they are omitted); only the options the caller sets are sent, so the model's own defaults apply to the rest. A
streamed answer is NDJSON; closing it makes Ollama stop generating.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import httpx

from inference._core.redaction import redact_url
from inference._core.validation import GenerationRequest
from inference._servers.http import ErrorHandlers, ServerAnswer, ServerClient
from inference._servers.ollama_models import parse_derived_model_name
from inference._servers.ollama_tools import OllamaToolCalls, ollama_messages, tool_fields
from inference._servers.wire_numbers import logprob, token_count
from inference.exceptions import InvalidRequestError, ServerModelNotFoundError, ServerResponseError
from inference.provider import GenerationResult, StreamEvent
from inference.results import TokenLogprob, ToolCall

__all__ = ["OllamaChat", "chat_body"]


class OllamaChat:
    """Sends generations to Ollama's ``POST /api/chat`` and reads its answers.

    Args:
        http: The provider's client.
        native_url: Ollama's root URL (the base URL without ``/v1``).
        think: The ``think`` setting (``"auto"``: not sent).
        provider: The provider name, carried by errors.
    """

    def __init__(self, http: ServerClient, native_url: str, *, think: str, provider: str) -> None:
        self._http = http
        self._url = f"{native_url}/api/chat"
        self._raw_url = f"{native_url}/api/generate"
        self._shown_url = redact_url(native_url)  # as messages show it: credentials hidden
        self._think = think
        self._provider = provider

    def send(self, request: GenerationRequest, model: str) -> Awaitable[httpx.Response]:
        """Send ``request`` to ``model`` for a whole answer."""
        return self._http.request(
            "POST",
            self._raw_url if request.raw_prompt else self._url,
            operation=f"generate with model {model!r}",
            json_body=chat_body(request, model, stream=False, think=self._think),
            handlers=self._handlers(model),
        )

    async def open(
        self, stack: contextlib.AsyncExitStack, request: GenerationRequest, model: str
    ) -> AsyncIterator[Any]:
        """Send ``request`` to ``model`` for a streamed answer, held open by ``stack``: its lines, parsed."""
        lines = self._http.stream_json_lines(
            "POST",
            self._raw_url if request.raw_prompt else self._url,
            operation=f"stream from model {model!r}",
            json_body=chat_body(request, model, stream=True, think=self._think),
            handlers=self._handlers(model),
        )
        return await stack.enter_async_context(lines)

    def answer(self, response: httpx.Response, request: GenerationRequest, model: str) -> GenerationResult:
        """The result of a whole answer."""
        operation = f"generate with model {model!r}"
        body = _as_chat(self._http.parse_json(response, operation=operation), request)
        calls = OllamaToolCalls(request)
        try:
            text = body["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("message.content is not a string")
            logprobs = _token_logprobs(body, request.logprobs) if request.logprobs is not None else None
            calls.add(body["message"])
        except (KeyError, TypeError, AttributeError) as error:
            problem = f"an answer that is not an Ollama chat reply ({error})"
            raise self._http.protocol_error(operation, problem) from error
        if body.get("done") is not True:  # Ollama's whole answer is its last line: done
            problem = f"an answer whose done is {_shown(body, 'done')}, not true: the answer is not whole"
            raise self._http.protocol_error(operation, problem)
        text, tool_calls = calls.result(text, cut=body.get("done_reason") == "length")
        return self._result(body, request, model, text, operation, logprobs, _thinking(body) or None, tool_calls)

    async def events(
        self, lines: AsyncIterator[Any], request: GenerationRequest, model: str
    ) -> AsyncIterator[StreamEvent]:
        """The text pieces of a streamed answer, then its result (with every tool call of its lines).

        For a forced tool call (``tool_choice`` ``"required"`` or a named tool) the content is the call's JSON, not
        text: nothing is yielded before the result, which carries the call.
        """
        operation = f"stream from model {model!r}"
        pieces: list[str] = []
        thoughts: list[str] = []
        logprobs: list[TokenLogprob] = []
        calls = OllamaToolCalls(request)
        async for line in lines:
            event = self._chat_chunk(_as_chat(line, request), operation)
            thoughts.append(_thinking(event))
            try:
                if request.logprobs is not None:
                    logprobs.extend(_token_logprobs(event, request.logprobs))
                calls.add(event["message"])
            except (TypeError, AttributeError) as error:
                problem = f"a stream line with malformed logprobs or tool_calls ({error})"
                raise self._http.protocol_error(operation, problem) from error
            piece = event["message"]["content"]
            if piece:
                pieces.append(piece)
                if not calls.forced:
                    yield piece
            if event["done"]:
                text, tool_calls = calls.result("".join(pieces), cut=event.get("done_reason") == "length")
                yield self._result(
                    event,
                    request,
                    model,
                    text,
                    operation,
                    logprobs if request.logprobs is not None else None,
                    "".join(thoughts) or None,
                    tool_calls,
                )
                return
        raise self._http.protocol_error(operation, "a stream that ended before its done line")

    @contextlib.contextmanager
    def schema_refusals(self, request: GenerationRequest) -> Iterator[None]:
        """A 400 about ``format`` when the request sent one: the ``json_schema`` (or, for a forced tool call, the
        tools' parameters) is an invalid request."""
        try:
            yield
        except ServerResponseError as error:
            message = str(error).lower()
            about_schema = "format" in message or "schema" in message
            if error.status_code != 400 or not about_schema:
                raise
            if request.json_schema is not None:
                what = "the json_schema"
            elif "format" in tool_fields(request):
                what = "the tools' parameters as the format of the forced call ({'name', 'arguments'})"
            else:
                raise
            raise InvalidRequestError(
                f"Ollama at {self._shown_url} could not use {what} ({error}): simplify the schema to what "
                "Ollama's grammar supports",
                provider=self._provider,
            ) from error

    def _chat_chunk(self, event: Any, operation: str) -> dict[str, Any]:
        """A stream line with its ``message`` (its ``content`` text, ``""`` when absent) and its ``done`` (a boolean:
        Ollama writes it in every line, true in the last)."""
        message = event.get("message") if isinstance(event, dict) else None
        if not isinstance(message, dict) or not isinstance(message.get("content", ""), str):
            shown = json.dumps(event)[:200]
            raise self._http.protocol_error(operation, f"a stream line that is not an Ollama chat chunk: {shown}")
        assert isinstance(event, dict)
        if not isinstance(event.get("done"), bool):  # the text "false" is not false
            problem = f"a stream line whose done is {_shown(event, 'done')}, not true or false"
            raise self._http.protocol_error(operation, problem)
        message.setdefault("content", "")
        return event

    def _result(
        self,
        body: dict[str, Any],
        request: GenerationRequest,
        model: str,
        text: str,
        operation: str,
        logprobs: list[TokenLogprob] | None = None,
        reasoning: str | None = None,
        tool_calls: list[ToolCall] | None = None,
    ) -> GenerationResult:
        try:  # Go leaves out a count of 0
            prompt_tokens = token_count(body.get("prompt_eval_count", 0), "prompt_eval_count")
            completion_tokens = token_count(body.get("eval_count", 0), "eval_count")
        except TypeError as error:
            raise self._http.protocol_error(operation, f"token counts that cannot be counts ({error})") from error
        if request.logprobs is not None and not logprobs and completion_tokens > 0:
            raise self._http.protocol_error(
                operation,
                "an answer without the token logprobs asked for: Ollama reports them from version 0.12.11 on; "
                "upgrade the server, or ask without logprobs",
            )
        return GenerationResult(
            text=text,
            model=str(body.get("model") or model),
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + completion_tokens,
            finish_reason=_finish_reason(body, bool(tool_calls)),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            logprobs=tuple(logprobs or ()) if request.logprobs is not None else None,
            reasoning=reasoning,
            tool_calls=tuple(tool_calls) if tool_calls else None,
        )

    def _handlers(self, model: str) -> ErrorHandlers:
        return {404: lambda answer: self._not_found(answer, model)}

    def _not_found(self, answer: ServerAnswer, model: str) -> ServerResponseError:
        if answer.route_missing:
            return answer.error(
                ServerResponseError,
                f"the server at {self._shown_url} has no Ollama native API ({answer.response.request.url.path} "
                "answered 404 Not Found): it is another kind of server (an OpenAI-only server such as "
                "llama_cpp.server?); point OLLAMA_BASE_URL (or base_url) at Ollama, or use the vllm provider for "
                "OpenAI-compatible servers",
            )
        if parse_derived_model_name(model) is not None:
            hint = "the adapter's model was deleted from the server: load the adapter again"
        else:
            hint = f"run `ollama pull {model}` on the server"
        sentence = f"{answer.where} has no model {model!r} ({answer.message}): {hint}"
        return answer.error(ServerModelNotFoundError, sentence)


def chat_body(request: GenerationRequest, model: str, *, stream: bool, think: str = "auto") -> dict[str, Any]:
    """The native ``/api/chat`` body: only the options the caller set, so the model's defaults apply.

    ``think`` is sent as Ollama's ``think`` field (a boolean, or a level) unless it is ``"auto"``; the request's
    ``thinking`` (``True``/``False``) goes over it. A ``raw_prompt`` request gets the ``/api/generate`` body instead
    (``prompt``, ``raw: true``: no template). Tools, tool turns and ``tool_choice`` are written as
    :mod:`~inference._servers.ollama_tools` says. ``extra_body`` is merged in last (a mapping into a mapping: its
    ``options`` join the body's).
    """
    options: dict[str, Any] = {"num_predict": request.max_tokens}
    for key, value in (
        ("temperature", request.temperature),
        ("top_p", request.top_p),
        ("top_k", request.top_k),
        ("repeat_penalty", request.repetition_penalty),
        ("presence_penalty", request.presence_penalty),
        ("frequency_penalty", request.frequency_penalty),
        ("min_p", request.min_p),
        ("seed", request.seed),
    ):
        if value is not None:
            options[key] = value
    if request.stop:
        options["stop"] = list(request.stop)
    body: dict[str, Any] = {"model": model, "stream": stream, "options": options}
    if request.raw_prompt:
        body.update(prompt=request.plain_prompt, raw=True)
    else:
        body["messages"] = ollama_messages(request.messages)  # the one message rule (GenerationRequest.messages)
    if request.json_schema is not None:
        body["format"] = dict(request.json_schema)
    body.update(tool_fields(request))  # with json_schema only under tool_choice "none" (the provider refuses more)
    if request.logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = request.logprobs
    if think != "auto":
        body["think"] = {"true": True, "false": False}.get(think, think)
    if request.thinking is not None:
        body["think"] = request.thinking
    for key, value in (request.extra_body or {}).items():  # last: what the caller sends is sent
        body[key] = {**body[key], **value} if isinstance(body.get(key), dict) and isinstance(value, dict) else value
    return body


def _finish_reason(body: dict[str, Any], called: bool) -> str:
    """``"length"`` when Ollama stopped at ``num_predict``; else ``"tool_calls"`` when the model called tools (Ollama
    says ``"stop"``), else ``"stop"``."""
    if body.get("done_reason") == "length":
        return "length"
    return "tool_calls" if called else "stop"


def _as_chat(event: Any, request: GenerationRequest) -> Any:
    """An ``/api/generate`` answer or stream line (``response``, ``thinking``) as the chat one it stands for."""
    if not request.raw_prompt or not isinstance(event, dict) or "response" not in event:
        return event
    message = {"role": "assistant", "content": event["response"]}
    if "thinking" in event:
        message["thinking"] = event["thinking"]
    return {**event, "message": message}


def _shown(body: dict[str, Any], key: str) -> str:
    """``body[key]`` as JSON writes it, for a message (``missing`` where there is none)."""
    return json.dumps(body[key])[:100] if key in body else "missing"


def _thinking(body: dict[str, Any]) -> str:
    """``message.thinking`` of an answer or stream line (``""`` when absent)."""
    message = body.get("message")
    thinking = message.get("thinking") if isinstance(message, dict) else None
    return thinking if isinstance(thinking, str) else ""


def _token_logprobs(body: dict[str, Any], k: int) -> list[TokenLogprob]:
    """The ``logprobs`` of an ``/api/chat`` answer or stream line: ``[{token, logprob, bytes, top_logprobs}]``.

    Raises:
        TypeError: The field is not a list of entries with a text token and a log-probability, or an alternative
            has no log-probability (:func:`~inference._servers.wire_numbers.logprob`: a NaN, a value above 0).
    """
    entries = body.get("logprobs") or []
    if not isinstance(entries, list):
        raise TypeError(f"logprobs is {type(entries).__name__}, not a list")
    result = []
    for index, entry in enumerate(entries):
        token = entry.get("token", "") if isinstance(entry, dict) else None
        if not isinstance(token, str):
            raise TypeError(f"a logprobs entry without a text token: {entry!r:.200}")
        value = logprob(entry.get("logprob", 0.0), f"logprobs[{index}].logprob")  # Go omits zero values
        top = [
            (alternative.get("token", ""),
             logprob(alternative.get("logprob", 0.0), f"logprobs[{index}].top_logprobs[{place}].logprob"))
            for place, alternative in enumerate(entry.get("top_logprobs") or [])
            if isinstance(alternative, dict)
        ]
        top.sort(key=lambda pair: pair[1], reverse=True)
        result.append(TokenLogprob(token=token, logprob=value, top_logprobs=tuple(top[:k])))
    return result
