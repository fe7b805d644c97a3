"""LangChain on any provider: :class:`ChatInference`, a LangChain ``BaseChatModel``.

It has ``bind_tools`` (tools as LangChain takes them: OpenAI dicts, Python functions, pydantic classes,
``BaseTool`` objects) and ``with_structured_output`` (ChatOpenAI's three methods: ``"function_calling"``, the
default, a forced call built on ``bind_tools``; ``"json_schema"``, the provider's ``json_schema``; ``"json_mode"``,
any JSON object), sync and async, with streaming::

    from inference import get_provider
    from inference.integrations.langchain import ChatInference

    chat = ChatInference(provider=get_provider("fake"), model="m")
    answer = await chat.bind_tools([get_weather]).ainvoke("Weather in Paris?")
    answer.tool_calls  # [{"name": "get_weather", "args": {...}, "id": "call_1", "type": "tool_call"}]

Needs ``pip install 'inference-adapters[langchain]'`` (langchain-core); ``import inference`` never imports it.

Messages map onto the SDK's (:mod:`inference.messages`): system, human, AI (with its ``tool_calls``) and tool
messages; content given as a list of blocks is sent as its text blocks. An AI message's call blocks (``tool_call``
as ``output_version="v1"`` writes them, other providers' such as ``tool_use``) are left out, its calls going from
its ``tool_calls``, and so are its reasoning blocks (reasoning is not sent back); any other block (an image...) is
refused with ``UnsupportedOperationError``, as is a message of another kind. A call whose arguments did not parse or
validate comes back in ``AIMessage.invalid_tool_calls`` with its error, not dropped. In a stream, LangChain rebuilds
the calls from their argument text (arguments that do not parse go to ``invalid_tool_calls``, without the error):
every call's error is in the last chunk's ``response_metadata["tool_call_errors"]`` (call id -> error). What a
thinking model thought (with ``thinking=True``, the result's ``reasoning``) is in
``additional_kwargs["reasoning_content"]``, as several LangChain chat models put it (in a stream, in the last
chunk), so ``message.content_blocks`` starts with a ``reasoning`` block. ``tool_choice`` takes LangChain's values
too: ``"any"`` and ``True`` are ``"required"``, a tool's name forces that tool.

Each of ``n`` completions (``chat.generate([messages], n=3)``) is a generation of its own (``invoke`` returns the
first; a stream is one completion, so a stream with ``n`` above 1 is refused with ``InvalidRequestError``), and
every generation's ``usage_metadata`` is the whole request's, as ChatOpenAI reports it. Logprobs (the SDK's
``logprobs=k``, or ChatOpenAI's ``logprobs=True`` with ``top_logprobs=k``) are in ``response_metadata["logprobs"]``
in ChatOpenAI's shape, ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`` (``bytes`` is
``None`` for a token that ends inside a character), and ``return_token_ids=True``'s ids in
``response_metadata["token_ids"]``; in a stream both are on the last chunk. The synchronous methods (``invoke``,
``stream``) run the provider on the sync facade's background event loop (:func:`inference.sync.run_sync`): drive one
provider either synchronously or from your own event loop, not both (an HTTP provider's connections belong to one
loop).

The provider must take tools (``provider.supports_tools``) for ``bind_tools`` and ``with_structured_output``'s
function calling, and ``json_schema`` (``provider.supports_json_schema``) for its ``"json_schema"`` and
``"json_mode"``; one that cannot refuses with ``UnsupportedOperationError`` naming those that can (docs/tools.md lists
them), and nothing falls back to another method. In process, ``with_structured_output`` and a named tool are forced
calls, constrained to the schema on any model (``"json_schema"`` constrains the text the same way); a model that
chooses its calls needs a chat template that renders tools.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal, cast

from inference._core.dependencies import import_optional
from inference.exceptions import InvalidRequestError, UnsupportedOperationError
from inference.messages import Message
from inference.provider import InferenceProvider
from inference.results import GenerationResult, TokenLogprob

import_optional("langchain_core", provider="langchain", extra="langchain")

from langchain_core.callbacks import (  # noqa: E402 - after the check that names the extra
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult  # noqa: E402
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough  # noqa: E402
from langchain_core.tools import BaseTool  # noqa: E402
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool  # noqa: E402
from langchain_core.utils.pydantic import is_basemodel_subclass  # noqa: E402
from pydantic import BaseModel, ConfigDict  # noqa: E402

__all__ = ["ChatInference"]

_LEFT_OUT_OF_AI_TEXT = frozenset({
    "tool_call", "tool_call_chunk", "invalid_tool_call", "tool_use", "function_call",
    "reasoning", "thinking", "redacted_thinking",
})
"""An AI message's blocks that are not sent as its text: calls (LangChain's own, Anthropic's ``tool_use``, OpenAI's
Responses ``function_call``), whose message carries them in ``tool_calls`` and ``invalid_tool_calls``, and
reasoning (LangChain's ``reasoning``, Anthropic's ``thinking``), which is not sent back."""

_OPTIONS = (
    "max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty", "stop", "presence_penalty",
    "frequency_penalty", "timeout",
)


class ChatInference(BaseChatModel):
    """A LangChain chat model that generates with an :class:`~inference.InferenceProvider`.

    Attributes:
        provider: The provider (its lifecycle is yours: close it when done).
        model: The model name passed to every call (servers; in-process providers use their loaded model).
        adapter_id: The adapter every call uses (``None``: the base model); anything ``generate`` takes.
        max_tokens: Most tokens per answer (``None``: the SDK's default).
        temperature: Sampling temperature (``None``: the backend's default).
        top_p: Nucleus sampling mass.
        top_k: Sample among the ``top_k`` likeliest tokens.
        seed: Sampling seed.
        repetition_penalty: Above 1 discourages repeats.
        stop: Stop strings of every call (a call's own ``stop`` replaces them).
        presence_penalty: OpenAI's presence penalty.
        frequency_penalty: OpenAI's frequency penalty.
        timeout: Seconds each call may take.

    Any other keyword is a ``ValidationError`` naming it (it would do nothing).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    provider: InferenceProvider
    model: str = ""
    adapter_id: Any = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    stop: list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    timeout: float | None = None

    @property
    def _llm_type(self) -> str:
        return f"inference-{self.provider.name}"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"provider": self.provider.name, "model": self.model, "adapter_id": self.adapter_id}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | bool | dict[str, Any] | None = None,
        strict: bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The model with ``tools`` bound (converted with LangChain's ``convert_to_openai_tool``).

        Args:
            tools: The tools.
            tool_choice: ``"auto"``, ``"none"``, ``"required"`` (also ``"any"`` or ``True``), a tool's name, or
                OpenAI's ``{"type": "function", "function": {"name": ...}}``.
            strict: Taken as ``ChatOpenAI`` takes it; the SDK checks every call's arguments against its tool's
                parameters whatever it is (a call that does not validate is in ``invalid_tool_calls``), and does not
                send it.
            **kwargs: Bound too (LangChain's own keys, such as ``ls_structured_output_format``, are not sent).

        Raises:
            UnsupportedOperationError: ``parallel_tool_calls`` is given: no provider takes it.
        """
        if parallel_tool_calls is not None:
            raise UnsupportedOperationError(
                "bind_tools(parallel_tool_calls=...) is not an option of the SDK: no provider can limit an answer's "
                "calls; leave it out (a forced tool_choice asks for one call)",
                provider=self.provider.name,
            )
        converted = [convert_to_openai_tool(tool) for tool in tools]
        bound: dict[str, Any] = {"tools": converted, **kwargs}
        if tool_choice is not None:
            bound["tool_choice"] = _tool_choice(tool_choice, converted)
        return self.bind(**bound)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["function_calling", "json_schema", "json_mode"] = "function_calling",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """The model answering with output that follows ``schema``, in ChatOpenAI's three ways.

        Args:
            schema: A pydantic model class (the answer is an instance of it), or a JSON schema, an OpenAI tool or
                a ``TypedDict`` class (the answer is a dict); optional with ``"json_mode"`` only.
            method: ``"function_calling"``: a forced call of a tool whose parameters are the schema (needs
                ``provider.supports_tools``). ``"json_schema"``: the provider's ``json_schema`` option, the
                text constrained to the schema and parsed (a provider that cannot refuses with
                ``UnsupportedOperationError``; nothing falls back to a tool call). ``"json_mode"``: OpenAI's JSON
                mode, ``response_format={"type": "json_object"}``: any JSON object, which the model is not held to
                the schema for (describe it in the prompt); the text is parsed into ``schema`` where given.
            include_raw: Answer ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}``; an answer that does
                not parse is then ``parsed=None`` with its error, instead of raising it.
            strict: Taken as ``ChatOpenAI`` takes it and not sent: the SDK checks a forced call's arguments, and
                constrains ``json_schema``'s text, whatever it is.

        Raises:
            InvalidRequestError: ``method`` is not one of the three, ``schema`` is missing, ``strict`` is given with
                ``"json_mode"``, or another keyword is given (a ``ValueError``, as ChatOpenAI raises).
        """
        if method not in ("function_calling", "json_schema", "json_mode"):
            raise self._refusal(
                f"with_structured_output(method={method!r}) is not a method: give 'function_calling' (the default: "
                "a forced tool call), 'json_schema' (the provider's json_schema) or 'json_mode' (any JSON object)"
            )
        if kwargs:
            raise self._refusal(
                f"with_structured_output() takes no {', '.join(map(repr, kwargs))}: set the options of every call on "
                "ChatInference itself"
            )
        if schema is None and method != "json_mode":
            raise self._refusal(f"with_structured_output(method={method!r}) needs a schema (only 'json_mode' does not)")
        if method == "function_calling":
            return super().with_structured_output(cast("dict[str, Any] | type", schema), include_raw=include_raw)
        if strict is not None and method == "json_mode":
            raise self._refusal("with_structured_output(strict=...) is not taken with method='json_mode'")
        pydantic_schema = isinstance(schema, type) and is_basemodel_subclass(schema)
        bound: dict[str, Any] = (
            {"json_schema": schema if pydantic_schema else convert_to_json_schema(cast("Any", schema))}
            if method == "json_schema" else {"response_format": {"type": "json_object"}}
        )
        if schema is not None:
            bound["ls_structured_output_format"] = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
        parser: Runnable[Any, Any] = (
            PydanticOutputParser(pydantic_object=cast("type[BaseModel]", schema)) if pydantic_schema
            else JsonOutputParser()
        )
        return _parsed(self.bind(**bound), parser, include_raw=include_raw)

    def _refusal(self, message: str) -> InvalidRequestError:
        return InvalidRequestError(message, provider=self.provider.name)

    # LangChain's hooks ---------------------------------------------------------------------------------------

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        from inference.sync import run_sync

        return run_sync(self._agenerate(messages, stop, None, **kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt, options = self._arguments(messages, stop, kwargs)
        result = await self.provider.generate(prompt, self.model, self.adapter_id, **options)
        return ChatResult(generations=[_generation(choice, result) for choice in result.choices or (result,)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        from inference.sync import run_sync

        events = self._astream(messages, stop, None, **kwargs)
        try:
            while True:
                try:
                    chunk = run_sync(events.__anext__())
                except StopAsyncIteration:
                    return
                if run_manager is not None and isinstance(chunk.message.content, str) and chunk.message.content:
                    run_manager.on_llm_new_token(chunk.message.content, chunk=chunk)
                yield chunk
        finally:
            run_sync(events.aclose())  # type: ignore[attr-defined]

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        prompt, options = self._arguments(messages, stop, kwargs)
        events = self.provider.stream(prompt, self.model, self.adapter_id, **options)
        try:
            async for event in events:
                if isinstance(event, str):
                    chunk = ChatGenerationChunk(message=AIMessageChunk(content=event))
                    if run_manager is not None:
                        await run_manager.on_llm_new_token(event, chunk=chunk)
                    yield chunk
                    continue
                yield ChatGenerationChunk(
                    message=AIMessageChunk(
                        content="",
                        additional_kwargs=_reasoning(event),
                        tool_call_chunks=[
                            {"name": call.name, "args": call.raw_arguments, "id": call.id, "index": index,
                             "type": "tool_call_chunk"}
                            for index, call in enumerate(event.tool_calls or ())
                        ],
                        usage_metadata=_usage(event),
                        response_metadata=_metadata(event, event, with_call_errors=True),
                        chunk_position="last",
                    )
                )
        finally:
            await events.aclose()

    def _arguments(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[list[Message], dict[str, Any]]:
        """The provider's prompt (chat messages) and options for LangChain's messages and bound arguments."""
        options: dict[str, Any] = {name: getattr(self, name) for name in _OPTIONS if getattr(self, name) is not None}
        for key, value in kwargs.items():
            if key.startswith("ls_"):
                continue  # LangChain's tracing metadata
            options[key] = value
        _logprobs_as_the_sdks(options, self.provider.name)
        if stop:
            options["stop"] = stop
        if "tool_choice" in options and options.get("tools"):
            options["tool_choice"] = _tool_choice(options["tool_choice"], options["tools"])
        return cast("list[Message]", _messages(messages, self.provider.name)), options


def _parsed(model: Runnable[Any, Any], parser: Runnable[Any, Any], *, include_raw: bool) -> Runnable[Any, Any]:
    """``model``'s answer through ``parser``; with ``include_raw``, LangChain's ``{"raw", "parsed", "parsing_error"}``
    (an answer that does not parse gives ``parsed=None`` and the parser's error)."""
    if not include_raw:
        return model | parser
    parse = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=model) | parse.with_fallbacks([unparsed], exception_key="parsing_error")


def _tool_choice(choice: Any, tools: Sequence[dict[str, Any]]) -> Any:
    """LangChain's ``tool_choice`` values as the SDK's."""
    if choice is True or choice == "any":
        return "required"
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        return {"type": "function", "function": {"name": choice}}
    return choice


def _messages(messages: Sequence[BaseMessage], provider: str) -> list[dict[str, Any]]:
    """The conversation as chat messages (``provider`` names the provider in a refusal). An invalid call without a
    tool's name (written in process when several tools are offered) cannot go back as a call: it goes back as the text
    the model wrote, and the answer to it as a user message (as the pydantic-ai integration sends it)."""
    nameless: set[str] = set()  # ids of the calls sent back as text
    converted = []
    for message in messages:
        if isinstance(message, AIMessage):
            nameless.update(call["id"] or "" for call in message.invalid_tool_calls if not call["name"])
        answers_nameless = isinstance(message, ToolMessage) and message.tool_call_id in nameless
        converted.append(
            {"role": "user", "content": _text(message, provider)} if answers_nameless else _message(message, provider)
        )
    return converted


def _message(message: BaseMessage, provider: str) -> dict[str, Any]:
    content = _text(message, provider)
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": content}
    if isinstance(message, HumanMessage):
        return {"role": "user", "content": content}
    if isinstance(message, AIMessage):
        calls: list[dict[str, Any]] = [
            {"id": call["id"] or "", "type": "function",
             "function": {"name": call["name"], "arguments": json.dumps(call["args"], ensure_ascii=False)}}
            for call in message.tool_calls
        ]
        calls += [
            {"id": call["id"] or "", "type": "function",
             "function": {"name": call["name"], "arguments": call["args"] or ""}}
            for call in message.invalid_tool_calls
            if call["name"]
        ]
        written = [call["args"] or "" for call in message.invalid_tool_calls if not call["name"]]  # as written
        content = "\n\n".join(text for text in (content, *written) if text)
        return {"role": "assistant", "content": content, "tool_calls": calls} if calls else {
            "role": "assistant", "content": content}
    if isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": content}
    if isinstance(message, ChatMessage) and message.role in ("system", "user", "assistant"):
        return {"role": message.role, "content": content}
    raise UnsupportedOperationError(
        f"ChatInference cannot send a {type(message).__name__} (role {message.type!r})", provider=provider
    )


def _text(message: BaseMessage, provider: str) -> str:
    """The message's text: its text blocks, without an AI message's call and reasoning blocks."""
    if isinstance(message.content, str):
        return message.content
    texts: list[str] = []
    for block in message.content:
        if isinstance(block, str):
            texts.append(block)
            continue
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif not (isinstance(message, AIMessage) and kind in _LEFT_OUT_OF_AI_TEXT):
            raise UnsupportedOperationError(
                f"ChatInference sends text only (the SDK's messages hold text): this {type(message).__name__} holds "
                f"a block of type {kind!r}; leave it out, or give what it holds as text",
                provider=provider,
            )
    return "\n".join(texts)


def _tool_call(call: Any) -> Any:
    return {"name": call.name, "args": call.arguments, "id": call.id, "type": "tool_call"}


def _invalid_tool_call(call: Any) -> Any:
    return {"name": call.name, "args": call.raw_arguments, "id": call.id, "error": call.error,
            "type": "invalid_tool_call"}


def _logprobs_as_the_sdks(options: dict[str, Any], provider: str) -> None:
    """ChatOpenAI's ``logprobs=True`` (with ``top_logprobs=k`` alternatives, else none) as the SDK's ``logprobs=k``;
    ``logprobs=False`` asks nothing. The SDK's own ``logprobs=k`` is left as it is."""
    top = options.pop("top_logprobs", None)
    asked = options.get("logprobs")
    if isinstance(asked, bool):
        options["logprobs"] = (top or 0) if asked else None
    elif top is not None:
        raise InvalidRequestError(
            f"top_logprobs={top!r} needs logprobs=True (as ChatOpenAI takes them), got logprobs={asked!r}; or give "
            "the SDK's logprobs=k alone",
            provider=provider,
        )


def _generation(choice: GenerationResult, result: GenerationResult) -> ChatGeneration:
    """One completion (``choice``, one of ``result.choices`` or ``result`` itself) as LangChain's generation. Its
    usage is the whole request's, as ChatOpenAI gives every generation (LangChain's usage callbacks read the first);
    its ``generation_info`` holds ChatOpenAI's keys there (``finish_reason``, ``logprobs``)."""
    metadata = _metadata(choice, result)
    message = AIMessage(
        content=choice.text,
        additional_kwargs=_reasoning(choice),
        tool_calls=[_tool_call(call) for call in choice.tool_calls or () if call.error is None],
        invalid_tool_calls=[_invalid_tool_call(call) for call in choice.tool_calls or () if call.error is not None],
        usage_metadata=_usage(result),
        response_metadata=metadata,
    )
    info: dict[str, Any] = {key: metadata[key] for key in ("finish_reason", "logprobs") if key in metadata}
    return ChatGeneration(message=message, generation_info=info)


def _reasoning(result: GenerationResult) -> dict[str, Any]:
    """The result's reasoning where LangChain reads it (its ``content_blocks`` make it a ``reasoning`` block)."""
    return {"reasoning_content": result.reasoning} if result.reasoning else {}


def _usage(result: GenerationResult) -> Any:
    prompt = result.prompt_tokens or 0
    return {"input_tokens": prompt, "output_tokens": result.completion_tokens,
            "total_tokens": prompt + result.completion_tokens}


def _metadata(
    choice: GenerationResult, result: GenerationResult, *, with_call_errors: bool = False
) -> dict[str, Any]:
    """A completion's facts for ``response_metadata`` (the model, adapter and provider are the ``result``'s): its
    ``logprobs`` (in ChatOpenAI's shape) and ``token_ids`` where they were asked for; for a stream's last chunk,
    also ``tool_call_errors`` (call id -> error) where a call has one: LangChain rebuilds a chunk's calls from their
    argument text, so a call whose arguments parse but do not validate would otherwise pass as valid."""
    metadata: dict[str, Any] = {
        "finish_reason": choice.finish_reason, "model_name": result.model, "adapter_id": result.adapter_id,
        "provider": result.provider,
    }
    if choice.logprobs is not None:
        metadata["logprobs"] = {"content": [_openai_logprob(entry) for entry in choice.logprobs]}
    if choice.token_ids is not None:
        metadata["token_ids"] = list(choice.token_ids)
    errors = {call.id: call.error for call in choice.tool_calls or () if call.error is not None}
    if with_call_errors and errors:
        metadata["tool_call_errors"] = errors
    return metadata


def _openai_logprob(entry: TokenLogprob) -> dict[str, Any]:
    """A token's logprob as OpenAI's chat API writes it (``token``, ``logprob``, ``bytes``, ``top_logprobs``)."""
    return {
        "token": entry.token, "logprob": entry.logprob, "bytes": _utf8(entry.token),
        "top_logprobs": [
            {"token": token, "logprob": value, "bytes": _utf8(token)} for token, value in entry.top_logprobs
        ],
    }


def _utf8(token: str) -> list[int] | None:
    """The token's bytes; ``None`` where its text holds U+FFFD (a token that ends inside a character shows its bytes
    decoded with replacement, so they are not known here), as OpenAI writes ``bytes`` it cannot give."""
    return None if "\ufffd" in token else list(token.encode("utf-8"))
