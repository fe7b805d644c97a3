"""pydantic-ai on any provider: :class:`InferenceModel`, a pydantic-ai ``Model``.

An ``Agent`` with tools and a structured ``output_type`` runs on it, streaming included::

    from pydantic_ai import Agent
    from inference import get_provider
    from inference.integrations.pydantic_ai import InferenceModel

    agent = Agent(InferenceModel(get_provider("llamacpp"), "qwen", adapter_id="support"), output_type=Answer)

Needs ``pip install 'inference-adapters[pydantic-ai]'`` (pydantic-ai-slim); ``import inference`` never imports it.

How the agent's request reaches the provider:

- messages: system prompts and instructions become system messages, user prompts user messages (text only: an
  image or a file is refused with ``UserError``; a ``CachePoint`` is left out, as pydantic-ai asks of a model without
  prompt caching), tool returns ``tool`` messages, earlier responses assistant messages with their ``tool_calls``
  (thinking is not sent back);
- tools: the agent's function tools, then its output tools (structured output in pydantic-ai's default ``tool``
  mode), as the ``tools`` option; ``tool_choice`` is ``"required"`` when the agent allows no text answer, else
  ``"auto"``; the ``tool_choice`` setting (``"none"``, ``"required"``, a list of names) narrows that;
- ``native`` output mode (``NativeOutput``) and ``prompted`` mode send the output schema as ``json_schema``;
- settings: ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop_sequences`` (as ``stop``),
  ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``timeout`` and ``extra_body`` are sent (a provider
  that cannot honour one refuses the request with ``UnsupportedOperationError``); ``thinking`` is sent as the
  ``thinking`` option: ``True`` or an effort level (``"low"``, ``"high"``...; the SDK has no levels, so the model
  thinks as it does by default) switches the model's thinking on, ``False`` off; the others are declared
  unsupported (pydantic-ai warns for those that change what a request guarantees).

The provider must take tools (``provider.supports_tools``) for an agent with tools or a tool output; one that
cannot refuses with ``UnsupportedOperationError`` naming those that can (docs/tools.md lists them). In process, an
agent that allows no text answer forces a call (constrained to the tools' schemas on any model); one whose model may
answer in text ("auto") needs a chat template that renders tools.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, ClassVar, cast

from inference._core.dependencies import import_optional
from inference._core.validation import AdapterChoice
from inference.messages import Message
from inference.provider import InferenceProvider
from inference.results import GenerationResult, StreamEvent

import_optional("pydantic_ai", provider="pydantic-ai", extra="pydantic-ai")

from pydantic_ai.exceptions import UserError  # noqa: E402 - after the check that names the extra
from pydantic_ai.messages import (  # noqa: E402
    CachePoint,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    ModelResponseStreamEvent,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse  # noqa: E402
from pydantic_ai.profiles import ModelProfile  # noqa: E402
from pydantic_ai.settings import ModelSettings, ToolOrOutput  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402
from pydantic_ai.usage import RequestUsage  # noqa: E402

__all__ = ["InferenceModel", "InferenceStreamedResponse"]

_SENT_SETTINGS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "stop_sequences": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "logit_bias": "logit_bias",
    "timeout": "timeout",
    "extra_body": "extra_body",
}
"""pydantic-ai's setting -> the provider's option (a provider that cannot honour one refuses the request with an
``UnsupportedOperationError``: none is dropped)."""

_FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "tool_call"}
"""The provider's ``finish_reason`` -> pydantic-ai's."""


class InferenceModel(Model):
    """A pydantic-ai ``Model`` that generates with an :class:`~inference.InferenceProvider`.

    Args:
        provider: The provider (its lifecycle is yours: close it when done).
        model: The model name passed to every call (servers; in-process providers use their loaded model).
        adapter_id: The adapter every call uses (``None``: the base model); anything ``generate`` takes.
        settings: Default pydantic-ai settings for this model.
        profile: A pydantic-ai model profile; default: tools supported, ``tool`` mode for structured output,
            JSON-schema output where the provider constrains it (``supports_json_schema``), the ``thinking``
            setting supported (a profile without ``supports_thinking`` makes pydantic-ai drop that setting).
    """

    unsupported_settings: ClassVar[frozenset[Any]] = frozenset(
        {"parallel_tool_calls", "max_retries", "extra_headers", "service_tier"}
    )

    def __init__(
        self,
        provider: InferenceProvider,
        model: str,
        adapter_id: AdapterChoice = None,
        *,
        settings: ModelSettings | None = None,
        profile: ModelProfile | None = None,
    ) -> None:
        self.inference_provider = provider
        self._model = model
        self.adapter_id = adapter_id
        if profile is None:
            profile = ModelProfile(
                supports_tools=True,
                supports_json_schema_output=provider.supports_json_schema,
                supports_json_object_output=False,
                default_structured_output_mode="tool",
                supports_thinking=True,
            )
        super().__init__(settings=settings, profile=profile)

    @property
    def model_name(self) -> str:
        """The model name given."""
        return self._model

    @property
    def system(self) -> str:
        """``"inference"`` (the provider's name is in :attr:`provider_label`)."""
        return "inference"

    @property
    def provider_label(self) -> str:
        """The provider's name (``"llamacpp"``, ``"fake"``...)."""
        return self.inference_provider.name

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Generate one response (see the module docstring for how the request is mapped)."""
        model_settings, model_request_parameters = self.prepare_request(model_settings, model_request_parameters)
        prompt, options = self._arguments(messages, model_settings, model_request_parameters)
        result = await self.inference_provider.generate(prompt, self._model, self.adapter_id, **options)
        return ModelResponse(
            parts=_response_parts(result),
            usage=_usage(result),
            model_name=result.model,
            provider_name=self.provider_label,
            finish_reason=_FINISH_REASONS.get(result.finish_reason),  # type: ignore[arg-type]
        )

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: Any = None,
    ) -> AsyncGenerator[StreamedResponse]:
        """Stream one response: text pieces as they come, tool calls when the provider's result arrives."""
        model_settings, model_request_parameters = self.prepare_request(model_settings, model_request_parameters)
        prompt, options = self._arguments(messages, model_settings, model_request_parameters)
        events = self.inference_provider.stream(prompt, self._model, self.adapter_id, **options)
        try:
            yield InferenceStreamedResponse(
                model_request_parameters=model_request_parameters,
                _model_name=self._model,
                _provider_name=self.provider_label,
                _events=events,
            )
        finally:
            await events.aclose()

    def _arguments(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        parameters: ModelRequestParameters,
    ) -> tuple[list[Message], dict[str, Any]]:
        """The provider's prompt (chat messages) and options for a pydantic-ai request."""
        chat = _chat_messages(messages)
        instructions = self._get_instruction_parts(messages, parameters) or []
        leading = next((index for index, message in enumerate(chat) if message["role"] != "system"), len(chat))
        chat[leading:leading] = [{"role": "system", "content": part.content} for part in instructions]
        settings: dict[str, Any] = dict(model_settings or {})
        options: dict[str, Any] = {
            option: settings[setting] for setting, option in _SENT_SETTINGS.items() if setting in settings
        }
        if parameters.thinking is not None:  # pydantic-ai moves the setting here (an effort level is thinking on)
            options["thinking"] = bool(parameters.thinking)
        tools, tool_choice = _tools_and_choice(parameters, settings.get("tool_choice"))
        if tools:
            options["tools"] = [_tool(definition) for definition in tools]
            options["tool_choice"] = tool_choice
        if parameters.output_mode in ("native", "prompted") and parameters.output_object is not None:
            options["json_schema"] = parameters.output_object.json_schema
        return cast("list[Message]", chat), options


@dataclass
class InferenceStreamedResponse(StreamedResponse):
    """The streamed response of :class:`InferenceModel`: the provider's stream as pydantic-ai events."""

    _model_name: str
    _provider_name: str
    _events: AsyncIterator[StreamEvent]
    _timestamp: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    async def _get_event_iterator(self) -> AsyncIterator[ModelResponseStreamEvent]:
        async for event in self._events:
            if isinstance(event, str):
                for text_event in self._parts_manager.handle_text_delta(vendor_part_id="content", content=event):
                    yield text_event
                continue
            self._usage = _usage(event)
            self.finish_reason = _FINISH_REASONS.get(event.finish_reason)  # type: ignore[assignment]
            if event.reasoning:  # the provider gives the reasoning with its result, as generate does
                for thinking_event in self._parts_manager.handle_thinking_delta(
                    vendor_part_id="reasoning", content=event.reasoning
                ):
                    yield thinking_event
            for call in event.tool_calls or ():
                yield self._parts_manager.handle_tool_call_part(
                    vendor_part_id=call.id, tool_name=call.name, args=call.raw_arguments, tool_call_id=call.id
                )

    async def close_stream(self) -> None:
        """Stop the provider's generation."""
        await self._events.aclose()  # type: ignore[attr-defined]

    @property
    def model_name(self) -> str:
        """The model name."""
        return self._model_name

    @property
    def provider_name(self) -> str:
        """The provider's name."""
        return self._provider_name

    @property
    def provider_url(self) -> None:
        """No URL: the provider may run in process."""
        return None

    @property
    def timestamp(self) -> datetime:
        """When the response started."""
        return self._timestamp


def _chat_messages(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    """The conversation as chat messages. A call the model wrote without a tool's name (its ``ToolCall.error`` says
    so) cannot go back as a call: it goes back as the text the model wrote, and the answer to it as a user message."""
    chat: list[dict[str, Any]] = []
    nameless: set[str] = set()  # ids of the calls sent back as text
    for message in messages:
        if isinstance(message, ModelRequest):
            for asked in message.parts:
                answers = isinstance(asked, (ToolReturnPart, RetryPromptPart)) and asked.tool_call_id in nameless
                chat.extend(_request_part(asked, as_user=answers))
        elif isinstance(message, ModelResponse):
            texts = [part.content for part in message.parts if isinstance(part, TextPart)]
            for part in message.parts:
                if isinstance(part, ToolCallPart) and not part.tool_name:
                    nameless.add(part.tool_call_id)
                    texts.append(part.args if isinstance(part.args, str) else part.args_as_json_str())  # as written
            text = "\n\n".join(texts)
            calls = [
                {"id": part.tool_call_id, "type": "function",
                 "function": {"name": part.tool_name, "arguments": part.args_as_json_str()}}
                for part in message.parts
                if isinstance(part, ToolCallPart) and part.tool_name
            ]
            if calls:
                chat.append({"role": "assistant", "content": text, "tool_calls": calls})
            elif text:
                chat.append({"role": "assistant", "content": text})
    return chat


def _request_part(part: Any, *, as_user: bool = False) -> list[dict[str, Any]]:
    if isinstance(part, SystemPromptPart):
        return [{"role": "system", "content": part.content}]
    if isinstance(part, UserPromptPart):
        if isinstance(part.content, str):
            return [{"role": "user", "content": part.content}]
        content = [item for item in part.content if not isinstance(item, CachePoint)]  # no prompt caching here
        texts = [item if isinstance(item, str) else getattr(item, "content", None) for item in content]
        if not all(isinstance(text, str) for text in texts):
            kinds = sorted({type(item).__name__ for item in content if not isinstance(item, str)})
            raise UserError(f"InferenceModel sends text only; this user prompt holds {', '.join(kinds)}")
        return [{"role": "user", "content": "\n".join(str(text) for text in texts)}]
    if isinstance(part, ToolReturnPart):
        if as_user:
            return [{"role": "user", "content": part.model_response_str()}]
        return [{"role": "tool", "tool_call_id": part.tool_call_id, "content": part.model_response_str()}]
    if isinstance(part, RetryPromptPart):  # legacy history; prepare_messages translates new ones
        if part.tool_name is not None and not as_user:
            return [{"role": "tool", "tool_call_id": part.tool_call_id, "content": part.model_response()}]
        return [{"role": "user", "content": part.model_response()}]
    if type(part).__name__.endswith("DeltaPart") and "Instruction" not in type(part).__name__:
        return []  # tool availability, capability load, settings changes: the request itself carries them
    raise UserError(f"InferenceModel cannot send a {type(part).__name__} (prepare the messages with the Agent)")


def _tools_and_choice(parameters: ModelRequestParameters, chosen: Any) -> tuple[list[ToolDefinition], Any]:
    """The tools to send and the ``tool_choice``, from the agent's tools and the ``tool_choice`` setting."""
    function_tools, output_tools = list(parameters.function_tools), list(parameters.output_tools)
    text_allowed = parameters.allow_text_output
    default = "auto" if text_allowed else "required"
    if chosen in (None, "auto"):
        return function_tools + output_tools, default
    if chosen in ("none", []):
        return (output_tools, default) if output_tools else (function_tools, "none")
    if chosen == "required":
        return function_tools, "required"
    if isinstance(chosen, list) and all(isinstance(name, str) for name in chosen):
        named = [tool for tool in function_tools + output_tools if tool.name in chosen]
        if len(named) == 1:
            return named, {"type": "function", "function": {"name": named[0].name}}
        return named, "required"
    if isinstance(chosen, ToolOrOutput):  # the named function tools and every output tool, the default choice
        unknown = sorted(set(chosen.function_tools) - {tool.name for tool in function_tools})
        if unknown:
            raise UserError(f"tool_choice ToolOrOutput names function tools the agent does not have: {unknown}")
        return [tool for tool in function_tools if tool.name in chosen.function_tools] + output_tools, default
    raise UserError(f"InferenceModel does not know the tool_choice {chosen!r}")


def _tool(definition: ToolDefinition) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": definition.name,
            "description": definition.description or "",
            "parameters": definition.parameters_json_schema,
        },
    }


def _response_parts(result: GenerationResult) -> list[ModelResponsePart]:
    parts: list[ModelResponsePart] = []
    if result.reasoning:
        parts.append(ThinkingPart(content=result.reasoning))
    if result.text:
        parts.append(TextPart(content=result.text))
    for call in result.tool_calls or ():
        parts.append(ToolCallPart(tool_name=call.name, args=call.raw_arguments, tool_call_id=call.id))
    return parts


def _usage(result: GenerationResult) -> RequestUsage:
    return RequestUsage(input_tokens=result.prompt_tokens or 0, output_tokens=result.completion_tokens)
