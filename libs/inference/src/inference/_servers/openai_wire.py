"""The OpenAI API's wire format: request bodies, answer readers and server-sent events.

What differs per API lives here, apart from how requests reach the servers (pydantic-ai splits ``models/`` from
``providers/`` the same way): :func:`request_arguments` writes the JSON body of ``/v1/chat/completions`` (:data:`CHAT`)
or ``/v1/completions`` (:data:`COMPLETIONS`) from a :class:`~inference._core.validation.GenerationRequest`, each
sampling option under the field a provider's ``options`` map names; the readers turn answers and stream chunks into
token logprobs, token counts and :class:`~inference.provider.GenerationResult`; :class:`ServerEvents` reads a
streamed answer. Nothing here sends a request.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from inference._core.validation import GenerationRequest
from inference._servers.http import ErrorHandlers, ServerAnswer, ServerClient
from inference._servers.wire_numbers import logprob, token_count
from inference.exceptions import InferenceError, ProviderError, UnsupportedOperationError
from inference.messages import Message, arguments_object
from inference.options import (
    NOT_BUILT_YET,
    RESPONSE_FORMAT_AS_JSON_SCHEMA,
    TIMEOUT_IN_BASE_CLASS,
    ByRequests,
    OptionMap,
    Refused,
    Sent,
)
from inference.provider import GenerationResult
from inference.results import TokenLogprob, ToolCall
from inference.tools import parse_tool_call

if TYPE_CHECKING:
    import httpx
    import numpy as np
    from numpy.typing import NDArray

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "LOGPROB_READERS",
    "OPENAI_OPTIONS",
    "SCHEMA_NAME",
    "ServerEvents",
    "ToolCallDeltas",
    "about_schema",
    "completion_logprobs",
    "full_distribution",
    "generation_result",
    "model_name",
    "operation_of",
    "quoted_model",
    "reasoning_of",
    "refuses_schema_type",
    "request_arguments",
    "response_format",
    "returned_token_ids",
    "token_counts",
    "token_logprobs",
    "tool_calls_of",
]

CHAT = "chat"
"""The route ``/v1/chat/completions``: the prompt as chat messages, rendered by the server's chat template."""

COMPLETIONS = "completions"
"""The route ``/v1/completions``: the prompt as plain text (:attr:`GenerationRequest.plain_prompt`)."""

_QUOTED_MODEL = re.compile(r"`([^`]*)`")

OPENAI_OPTIONS: OptionMap = {
    "max_tokens": Sent("max_tokens"),
    "system_prompt": Sent("messages", "a first message of role system; on /v1/completions, text before the prompt"),
    "temperature": Sent("temperature"),
    "top_p": Sent("top_p"),
    "repetition_penalty": Sent("repetition_penalty", "an extension field (vLLM, SGLang); OpenAI refuses it"),
    "stop": Sent("stop"),
    "seed": Sent("seed"),
    "top_k": Sent("top_k", "an extension field (vLLM, SGLang, llama.cpp); OpenAI refuses it"),
    "logprobs": Sent("logprobs", "with top_logprobs on the chat route, a number on /v1/completions"),
    "json_schema": Sent("response_format", "OpenAI's json_schema form (llama_cpp.server: json_object)"),
    **NOT_BUILT_YET,
    "tools": Sent("tools", "OpenAI's function tools, on the chat route; a server parses the model's calls with its "
                  "tool parser (vLLM: --enable-auto-tool-choice --tool-call-parser NAME for tool_choice auto)"),
    "tool_choice": Sent("tool_choice", "a named tool or required: the server constrains the arguments to the schema"),
    "n": Sent(
        "n",
        "the server makes the n choices of one prompt; the result's counts are its usage (the prompt once), a "
        "choice's are unknown where it reports none (OpenAI); a server that answers fewer choices "
        "(llama_cpp.server ignores n) is asked for the rest one request each, seeds seed + k",
    ),
    "presence_penalty": Sent("presence_penalty"),
    "frequency_penalty": Sent("frequency_penalty"),
    "min_p": Sent("min_p", "an extension field (vLLM, SGLang, llama.cpp); OpenAI refuses it"),
    "logit_bias": Sent("logit_bias", "token ids as decimal strings, OpenAI's form"),
    "raw_prompt": Sent("/v1/completions", "the prompt text as it is, on the completions route"),
    "extra_body": Sent("extra_body", "merged into the request body last, as the openai client does"),
    "thinking": Refused(
        "the OpenAI API has no thinking switch (its reasoning models take reasoning_effort: send it in extra_body)"
    ),
    "response_format": RESPONSE_FORMAT_AS_JSON_SCHEMA,
    "timeout": TIMEOUT_IN_BASE_CLASS,
}
"""How the OpenAI API receives each option; a provider's ``options`` map starts from it."""


def refuses_schema_type(message: str) -> bool:
    """A validation error refusing ``response_format.type`` ``json_schema`` (llama_cpp.server's 422)."""
    return "json_schema" in message and "json_object" in message


def about_schema(message: str) -> bool:
    """A 400/422 that names the schema, the grammar or the response format (not, say, ``max_tokens``)."""
    lowered = message.lower()
    return any(word in lowered for word in ("schema", "grammar", "response_format", "structured", "guided"))


def quoted_model(answer: ServerAnswer) -> str | None:
    """The model name an error message quotes in backticks (vLLM, OpenAI: "The model `x` does not exist")."""
    quoted = _QUOTED_MODEL.search(answer.message)
    return quoted.group(1) if quoted else None


def operation_of(request: GenerationRequest, *, streamed: bool = False) -> str:
    """What the request does, for messages: ``generate with model 'x'``, ``stream with adapter 'a'``..."""
    verb = "stream" if streamed else "generate"
    if request.adapter_id:
        return f"{verb} with adapter {request.adapter_id!r}"
    return f"{verb} with model {request.model!r}"


def token_counts(usage: Any) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` of an OpenAI ``usage`` object.

    Raises:
        TypeError: A count is missing or not a token count (:func:`~inference._servers.wire_numbers.token_count`: a
            whole number from 0 to 2**31 - 1).
    """
    return (
        token_count(_field(usage, "prompt_tokens"), "usage.prompt_tokens"),
        token_count(_field(usage, "completion_tokens"), "usage.completion_tokens"),
    )


def model_name(answered: Any, request: GenerationRequest, default: str | None = None) -> str:
    """The model the server says answered, else ``default`` (else the adapter or model asked for).

    Raises:
        TypeError: The server's ``model`` is not a string.
    """
    if answered is not None and not isinstance(answered, str):
        raise TypeError(f"model is {type(answered).__name__}, not a name")
    return answered or default or request.adapter_id or request.model


SCHEMA_NAME = "output"
"""The name sent with a JSON schema (OpenAI's ``response_format.json_schema.name`` is required)."""


def response_format(schema: Mapping[str, Any], style: str) -> dict[str, Any]:
    """The ``response_format`` that constrains the output to ``schema``.

    ``"json_schema"`` is OpenAI's form, which vLLM and OpenAI accept; ``"json_object"`` is the form
    llama_cpp.server accepts (``{"type": "json_object", "schema": ...}``, which it compiles to a grammar).
    """
    if style == "json_object":
        return {"type": "json_object", "schema": dict(schema)}
    return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": dict(schema), "strict": True}}


def request_arguments(
    request: GenerationRequest,
    route: str = CHAT,
    *,
    stream: bool,
    schema_style: str = "json_schema",
    options: OptionMap | None = None,
    provider: str = "openai",
) -> dict[str, Any]:
    """The JSON body for ``route``: only what the caller set, each sampling option under the field its provider's
    ``options`` names (``top_k`` and ``repetition_penalty``, which the OpenAI API lacks, as vLLM's extra fields;
    llama-server's ``repeat_penalty``); ``json_schema`` as ``response_format`` (see :func:`response_format`).

    :data:`CHAT` sends the chat ``messages`` and ``logprobs`` as ``logprobs: true, top_logprobs: k``;
    :data:`COMPLETIONS` sends the plain-text ``prompt`` (the contents separated by blank lines, as for a model
    without a chat template in process) and ``logprobs`` as the number ``k``.
    """
    fields = OPENAI_OPTIONS if options is None else options
    model = request.adapter_id or request.model
    arguments: dict[str, Any] = {"model": model}
    if route == CHAT:
        arguments["messages"] = chat_messages(request.messages)  # the one message rule (GenerationRequest.messages)
    elif request.prompt_token_ids is not None:
        arguments["prompt"] = list(request.prompt_token_ids)  # a TokenIds prompt: the model's whole input
    else:
        arguments["prompt"] = request.plain_prompt
    for name in _SAMPLING:
        value = getattr(request, name)
        sent = fields[name]
        if value is not None and isinstance(sent, Sent):
            arguments[sent.field] = value
    if request.stop:
        arguments["stop"] = list(request.stop)
    if request.logprobs is not None and route == CHAT:
        arguments["logprobs"] = True
        arguments["top_logprobs"] = request.logprobs
    elif request.logprobs is not None:
        arguments["logprobs"] = request.logprobs
    if request.json_schema is not None:
        arguments["response_format"] = response_format(request.json_schema, schema_style)
    if request.tools and isinstance(fields["tools"], Sent) and not (route != CHAT and request.tool_choice == "none"):
        if route != CHAT:  # raw_prompt with tools was refused before (InvalidRequestError): this is the server's
            raise UnsupportedOperationError(
                "tools need the chat route (/v1/chat/completions), and this request goes to /v1/completions (the "
                "api setting, or a server model without a chat template): give the server's model a chat template "
                "(llama-server: --chat-template-file), or send the request to another provider",
                provider=provider,
            )
        arguments["tools"] = [dict(tool) for tool in request.tools]
        if request.tool_choice == "required" and len(request.tools) == 1:  # the same choice, one every server takes
            arguments["tool_choice"] = {"type": "function", "function": {"name": request.tools[0]["function"]["name"]}}
        elif request.tool_choice is not None:
            arguments["tool_choice"] = request.tool_choice
    several = False  # n choices in one answer: the server's own n
    if request.n > 1 and isinstance(choices := fields["n"], Sent) and not isinstance(choices, ByRequests):
        arguments[choices.field] = request.n
        several = True
    if (request.return_token_ids or several) and isinstance(returned := fields["return_token_ids"], Sent):
        arguments[returned.field] = True  # with n: each choice's ids count its tokens (usage sums them all)
    if request.logit_bias and isinstance(fields["logit_bias"], Sent):
        arguments["logit_bias"] = {str(token): bias for token, bias in request.logit_bias.items()}
    for name in _TEMPLATE_FIELDS:
        value, sent = getattr(request, name), fields[name]
        if value and route == CHAT and isinstance(sent, Sent):
            arguments[sent.field] = dict(value) if isinstance(value, Mapping) else value
    thinking, sent = request.thinking, fields["thinking"]
    if thinking is not None and route == CHAT and isinstance(sent, Sent):  # "chat_template_kwargs.enable_thinking"
        parent, _, key = sent.field.rpartition(".")
        (arguments.setdefault(parent, {}) if parent else arguments)[key] = thinking
    if request.extra_body and isinstance(fields["extra_body"], Sent):
        arguments.update(request.extra_body)  # last: a key that is also an option's field is extra_body's
    if stream:
        arguments["stream"] = True
        arguments["stream_options"] = {"include_usage": True}
    return arguments


def chat_messages(messages: Sequence[Message]) -> list[Message]:
    """The checked conversation as the chat route's ``messages``: a call whose ``arguments`` are not a JSON object
    (one the model wrote badly, sent back with its error as docs/tools.md's loop does) goes with ``"{}"``:
    llama-server parses a history's arguments and answers 500 "Failed to parse tool call arguments as JSON" to
    anything else. The tool message that follows says what went wrong (Ollama's route does the same)."""
    sent: list[Message] = []
    for message in messages:
        if message.get("tool_calls"):
            message = {**message, "tool_calls": [
                call if arguments_object(call["function"]["arguments"]) is not None
                else {**call, "function": {**call["function"], "arguments": "{}"}}
                for call in message["tool_calls"]
            ]}
        sent.append(message)
    return sent


_SAMPLING = (
    "max_tokens", "temperature", "top_p", "seed", "repetition_penalty", "top_k", "presence_penalty",
    "frequency_penalty", "min_p",
)
"""The options sent as one number each, under the field the provider's ``options`` names."""

_TEMPLATE_FIELDS = ("chat_template", "chat_template_kwargs")
"""The chat route's template options, sent where the provider's ``options`` says its server reads them (vLLM)."""


def _field(value: Any, name: str) -> Any:
    """``value[name]`` of a JSON object, else ``value.name``; ``None`` when absent."""
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


def token_logprobs(logprobs: Any, k: int) -> list[TokenLogprob]:
    """The entries of an OpenAI ``choices[i].logprobs`` object: ``content[j].{token, logprob, top_logprobs}``.

    The alternatives are sorted best first and cut to ``k`` (llama_cpp.server adds the chosen token to them).

    Raises:
        TypeError: An entry has no text token, or it or an alternative has no log-probability (a NaN, a value
            above 0: :func:`~inference._servers.wire_numbers.logprob`).
    """
    content = _field(logprobs, "content") if logprobs is not None else None
    entries: list[TokenLogprob] = []
    for index, entry in enumerate(content or ()):
        token = _field(entry, "token")
        if not isinstance(token, str):
            raise TypeError(f"a logprobs entry without a text token: {entry!r:.200}")
        where = f"logprobs.content[{index}]"
        value = logprob(_field(entry, "logprob"), f"{where}.logprob")
        top: list[tuple[str, float]] = []
        for place, alternative in enumerate(_field(entry, "top_logprobs") or ()):
            text = _field(alternative, "token")
            if isinstance(text, str):
                top.append((text, logprob(_field(alternative, "logprob"), f"{where}.top_logprobs[{place}].logprob")))
        top.sort(key=lambda pair: pair[1], reverse=True)
        entries.append(TokenLogprob(token=token, logprob=value, top_logprobs=tuple(top[:k])))
    return entries


def completion_logprobs(logprobs: Any, k: int) -> list[TokenLogprob]:
    """The entries of a ``/v1/completions`` ``choices[i].logprobs`` object: parallel lists ``tokens``,
    ``token_logprobs`` and ``top_logprobs`` (one ``{token: logprob}`` map per token), the alternatives sorted best
    first and cut to ``k``.

    Raises:
        TypeError: The lists are not parallel, a token has no text, or it or an alternative has no log-probability
            (:func:`~inference._servers.wire_numbers.logprob`).
    """
    if logprobs is None:
        return []
    if _field(logprobs, "content") is not None:  # llama-server answers /v1/completions in the chat form
        return token_logprobs(logprobs, k)
    tokens = _field(logprobs, "tokens") or []
    values = _field(logprobs, "token_logprobs") or []
    tops = _field(logprobs, "top_logprobs") or [None] * len(tokens)
    if not len(tokens) == len(values) == len(tops):
        raise TypeError(f"logprobs lists of different lengths: {logprobs!r:.200}")
    entries: list[TokenLogprob] = []
    for index, (token, value, top) in enumerate(zip(tokens, values, tops, strict=True)):
        if not isinstance(token, str):
            raise TypeError(f"logprobs.tokens[{index}] is {token!r:.100}, not a text token")
        read = logprob(value, f"logprobs.token_logprobs[{index}]")
        alternatives = [
            (str(text), logprob(number, f"logprobs.top_logprobs[{index}][{text!r:.50}]"))
            for text, number in (top or {}).items()
        ]
        alternatives.sort(key=lambda pair: pair[1], reverse=True)
        entries.append(TokenLogprob(token=token, logprob=read, top_logprobs=tuple(alternatives[:k])))
    return entries


LOGPROB_READERS = {CHAT: token_logprobs, COMPLETIONS: completion_logprobs}
"""Route -> the reader of its answers' ``logprobs``."""


def full_distribution(values: NDArray[np.floating[Any]], http: ServerClient, *, what: str, hint: str = "") -> None:
    """Refuse a next-token distribution read from ``http``'s answer that lacks an id of the vocabulary (``values``
    is NaN where the answer gave nothing): never a partial row. ``what`` names what the answer gives of the ids,
    ``hint`` how to start the server so that it gives them all.

    Raises:
        ProviderError: An id of the vocabulary has no value.
    """
    import numpy

    missing = int(numpy.isnan(values).sum())
    if missing:
        size = len(values)
        raise ProviderError(
            f"{http.where} gave {size - missing} of the {size} {what}: a full distribution needs every one{hint}",
            provider=http.provider,
            url=http.shown_url,
        )


def generation_result(
    request: GenerationRequest,
    text: str,
    model: str,
    finish_reason: str | None,
    prompt_tokens: int | None,
    completion_tokens: int,
    logprobs: list[TokenLogprob] | None = None,
    reasoning: str | None = None,
    tool_calls: Sequence[ToolCall] = (),
    token_ids: Sequence[int] | None = None,
) -> GenerationResult:
    """The result of a whole or streamed chat completion; ``None`` prompt tokens make the total unknown too.

    The server's ``finish_reason`` is kept as it came (``None``: ``"stop"``), so that one that did not finish the
    text (vLLM's ``"abort"``) fails the call in the base class instead of passing for a finished answer.

    A named ``tool_choice`` is one call of that tool: where the server wrote more (llama-server ignores
    ``parallel_tool_calls=false`` and may write calls until ``max_tokens``), the first is kept, and the answer
    finished with it (``"tool_calls"``)."""
    if isinstance(request.tool_choice, Mapping) and len(tool_calls) > 1:
        tool_calls, finish_reason = tool_calls[:1], "tool_calls"
    return GenerationResult(
        text=text,
        model=model,
        adapter_id=request.adapter_id,
        token_count=None if prompt_tokens is None else prompt_tokens + completion_tokens,
        finish_reason=_finish_reason(finish_reason, bool(tool_calls)),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        logprobs=tuple(logprobs or ()) if request.logprobs is not None else None,
        reasoning=reasoning or None,
        tool_calls=tuple(tool_calls) or None,
        token_ids=tuple(token_ids) if request.return_token_ids and token_ids is not None else None,
    )


def returned_token_ids(value: Any) -> list[int]:
    """The generated ids a server returns for ``return_token_ids`` (vLLM's ``choices[i].token_ids``; a stream chunk's
    are the new ones).

    Raises:
        TypeError: The value is not a list of non-negative integers.
    """
    if not isinstance(value, list) or not all(
        isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in value
    ):
        raise TypeError(f"token_ids {value!r:.200} is not a list of token ids")
    return value


def _finish_reason(reason: object, called: bool) -> str:
    """The server's reason as it came (``None``: ``"stop"``); ``"tool_calls"`` for an answer that called tools but
    says ``"stop"`` (vLLM and OpenAI with a named ``tool_choice``), as every other backend reports it.

    Raises:
        TypeError: The reason is neither text nor ``None`` (a list, a number: it cannot be read as a finish).
    """
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"finish_reason {reason!r:.100} is not text")
    kept = reason or "stop"
    return "tool_calls" if called and kept == "stop" else kept


def tool_calls_of(message: Any, request: GenerationRequest) -> list[ToolCall]:
    """The tool calls of a whole chat answer's ``message.tool_calls``, parsed and checked against the request's tools
    (a call whose arguments do not parse or validate is kept, with its ``error``)."""
    calls = []
    for call in _field(message, "tool_calls") or ():
        function = _field(call, "function") or {}
        name = _field(function, "name")
        if not isinstance(name, str):
            raise TypeError(f"a tool call without a function name: {call!r:.200}")
        call_id = _field(call, "id") or _new_call_id()
        calls.append(parse_tool_call(str(call_id), name, _field(function, "arguments"), request.tools or None))
    return calls


def _new_call_id() -> str:
    """A call id for a call the server gave none: unique, as a conversation's call ids must be (``call_`` and 24
    random hex digits, OpenAI's style)."""
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallDeltas:
    """A stream's tool calls, assembled from its chunks' ``delta.tool_calls`` (each piece names its call's
    ``index``; the id and name come first, the arguments' JSON text in pieces; a piece that repeats the name
    whole, as llama_cpp.server's do, adds nothing to it)."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, delta: Any) -> None:
        """Take one chunk's ``delta`` (nothing happens for one without tool calls)."""
        for piece in _field(delta, "tool_calls") or ():
            index = _field(piece, "index")
            call = self._calls.setdefault(index if isinstance(index, int) else len(self._calls),
                                          {"id": None, "name": "", "arguments": []})
            if _field(piece, "id"):
                call["id"] = _field(piece, "id")
            function = _field(piece, "function") or {}
            name = _field(function, "name")
            if name and name != call["name"]:  # llama_cpp.server repeats the whole name in every piece
                call["name"] += name
            if isinstance(_field(function, "arguments"), str):
                call["arguments"].append(_field(function, "arguments"))

    def calls(self, request: GenerationRequest) -> list[ToolCall]:
        """The assembled calls, in index order, parsed and checked as a whole answer's are."""
        return [
            parse_tool_call(str(call["id"] or _new_call_id()), call["name"], "".join(call["arguments"]),
                            request.tools or None)
            for _, call in sorted(self._calls.items())
        ]


class ChunkTally:
    """What the chunks of a chat or completions stream add up to: the text, the finish reason, the usage (or one
    count per token chunk, from a server that sends no usage), logprobs, reasoning, tool calls and token ids."""

    def __init__(self, request: GenerationRequest, route: str) -> None:
        self.request, self.route = request, route
        self.pieces: list[str] = []
        self.finish_reason: str | None = None
        self.counts: tuple[int, int] | None = None
        self.answered_model = request.adapter_id or request.model
        self.token_chunks = 0
        self.logprobs: list[TokenLogprob] = []
        self.thoughts: list[str] = []
        self.calls = ToolCallDeltas()
        self.token_ids: list[int] = []

    def add(self, chunk: Any) -> str:
        """Read one chunk; returns its text piece (``""`` for none).

        Raises:
            AttributeError: The chunk is not one of this route (so are IndexError, KeyError and TypeError).
        """
        request, route = self.request, self.route
        self.answered_model = model_name(chunk.get("model"), request, self.answered_model)
        if chunk.get("usage") is not None:
            self.counts = token_counts(chunk["usage"])
        choices = chunk.get("choices") or []
        if choices and choices[0].get("index", 0) != 0:  # one choice is streamed: a server mixing in another's
            raise IndexError(f"a chunk of choice {choices[0].get('index')!r}, though one choice was asked for")
        delta = choices[0].get("delta") if choices and route == CHAT else None
        if delta is not None and not isinstance(delta, Mapping):  # null: nothing new (Azure OpenAI's last chunks)
            raise TypeError(f"choices[0].delta is {json.dumps(delta)[:100]}, not an object")
        content = delta.get("content") if delta is not None else choices[0].get("text") if choices else None
        if content is not None and not isinstance(content, str):
            raise TypeError(f"the chunk's text is {type(content).__name__}, not text")
        finished = choices[0].get("finish_reason") if choices else None
        if request.logprobs is not None and choices:
            self.logprobs.extend(LOGPROB_READERS[route](choices[0].get("logprobs"), request.logprobs))
        if request.return_token_ids and choices and choices[0].get("token_ids") is not None:
            self.token_ids.extend(returned_token_ids(choices[0]["token_ids"]))
        announces_role = delta is not None and bool(delta.get("role"))
        if delta is not None:
            self.thoughts.append(reasoning_of(delta))
            self.calls.add(delta)
        if finished:
            self.finish_reason = str(finished)
        # One chunk per token, even an empty piece (part of a multi-byte character); not the chunk that only
        # announces the role, nor an empty closing chunk.
        if content is not None and not ((announces_role or finished) and content == ""):
            self.token_chunks += 1
        if content:
            self.pieces.append(content)
        return content or ""

    def tokens(self) -> tuple[int | None, int]:
        """``(prompt_tokens, completion_tokens)``: the usage, else ``None`` and the token chunks."""
        return self.counts if self.counts is not None else (None, self.token_chunks)

    def result(self) -> GenerationResult:
        """The stream's result."""
        request = self.request
        prompt_tokens, completion_tokens = self.tokens()
        return generation_result(
            request,
            "".join(self.pieces),
            self.answered_model,
            self.finish_reason,
            prompt_tokens,
            completion_tokens,
            self.logprobs if request.logprobs is not None else None,
            "".join(self.thoughts),
            self.calls.calls(request),
            self.token_ids,
        )


def reasoning_of(message: Any) -> str:
    """A reasoning model's thinking in a chat message or stream delta: vLLM's ``reasoning`` field (older servers
    and some gateways say ``reasoning_content``); ``""`` when there is none."""
    for name in ("reasoning", "reasoning_content"):
        value = _field(message, name)
        if isinstance(value, str) and value:
            return value
    return ""


class ServerEvents:
    """An open server-sent-events answer (``data: {...}`` lines until ``data: [DONE]``), each event parsed.

    Iterate it for the events; :meth:`aclose` closes the response, which tells the server to stop generating.
    An event with an ``"error"`` key (the server failing mid-answer) is raised as a :class:`ProviderError`.
    """

    def __init__(self, context: contextlib.AbstractAsyncContextManager[AsyncIterator[Any]]) -> None:
        self._context = context
        self._events: AsyncIterator[Any] | None = None

    @classmethod
    async def open(
        cls, http: ServerClient, url: str, body: Any, *, operation: str, handlers: ErrorHandlers
    ) -> ServerEvents:
        """Send the request and return once the answer's status is in (an error status is raised, mapped)."""

        def error_event(message: str, response: httpx.Response) -> InferenceError:
            return ProviderError(
                f"{http.where} reported an error during {operation}: {message}. The server failed; its log says why",
                provider=http.provider,
                url=http.shown_url,
            )

        events = cls(
            http.stream_json_lines(
                "POST", url, operation=operation, json_body=body, handlers=handlers, error_line=error_event, sse=True
            )
        )
        events._events = await events._context.__aenter__()
        return events

    def __aiter__(self) -> AsyncIterator[Any]:
        assert self._events is not None
        return self._events

    async def aclose(self) -> None:
        """Close the answer (the server stops generating). Safe to call twice."""
        if self._events is not None:
            self._events = None
            await self._context.__aexit__(None, None, None)
