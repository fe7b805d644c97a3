"""The provider contract: :class:`InferenceProvider` and :class:`GenerationResult`.

Every backend implements the same four async operations. The public methods here check their arguments
once, for every provider, and hand a validated :class:`~inference._core.validation.GenerationRequest` to the
backend's hook (``_generate``, ``_load_adapter``...), so a bad input gets the same typed error everywhere
and never reaches a server or a model. The generation options, their rules and their help are defined once,
in :class:`~inference.options.GenerationOptions`: the first ones are positional parameters here (as in the SDK's
first version), the others keyword-only, declared once as ``**options: Unpack[RequestOptions]``
(:class:`~inference.options.RequestOptions`), which type checkers check name by name and which the methods'
signatures list at run time. Each provider declares in :attr:`InferenceProvider.options` how its backend receives
each option, or that it refuses it; a request setting a refused option is an ``UnsupportedOperationError`` naming the
providers that can, before anything is sent.

The class is assembled from parts, each in its own module: :class:`~inference._core.provider_base.ProviderBase`
(state, capabilities, adapter lifecycle, health, closing), :class:`~inference._core.provider_tokens.
TokenLevelProvider` (token ids and next-token distributions), :class:`~inference._core.provider_scoring.
ScoringProvider` (log-likelihoods, and the batch runner), and this module's generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import inspect
import logging
from abc import abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from inference._core.deadlines import within
from inference._core.json_schemas import import_off_the_loop
from inference._core.provider_base import _as_asked
from inference._core.provider_scoring import ScoringProvider
from inference._core.telemetry import observe
from inference._core.thinking import ThinkingStream, split_thinking
from inference._core.tool_formats import ToolCallStream, ToolPlan
from inference._core.validation import (
    AdapterChoice,
    GenerationRequest,
    adapters_label,
    check_token_limits,
    split_adapter_choice,
)
from inference.exceptions import InvalidRequestError, ProviderError, ProviderTimeoutError, UnsupportedOperationError
from inference.messages import Prompt, has_tool_turns
from inference.options import (
    POSITIONAL_OPTIONS,
    ByRequests,
    GenerationOptions,
    Refused,
    RequestOptions,
    Sent,
    option_is_set,
)
from inference.results import (
    FINISH_REASONS,
    BatchItem,
    GenerationResult,
    ScoreItem,
    ScoreResult,
    StreamEvent,
    TokenLogprob,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from inference._core.batches import OnError

logger = logging.getLogger("inference")

__all__ = [
    "BatchItem",
    "GenerationRequest",
    "GenerationResult",
    "InferenceProvider",
    "ScoreItem",
    "ScoreResult",
    "StreamEvent",
    "TokenLogprob",
]

_ItemT = TypeVar("_ItemT")
_ResultT = TypeVar("_ResultT")


class InferenceProvider(ScoringProvider):
    """An inference backend with a LoRA adapter lifecycle.

    Use it as an async context manager (or call :meth:`aclose`) so it frees what it holds::

        async with get_provider("fake") as provider:
            await provider.load_adapter("style", "/adapters/style")
            result = await provider.generate("Hello", model="tiny", adapter_id="style")

    Capabilities are class attributes, so callers can ask before they try:

    Attributes:
        name: The provider type, as the factory knows it.
        supports_adapters: ``load_adapter`` works.
        hot_swaps_adapters: Switching adapters between requests does not reload the base model.
        batches_mixed_adapters: Concurrent requests for different adapters run in one batch.
        runs_in_process: The model runs inside this process (no server).
        max_adapters: Most adapters kept loaded in the backend (``None`` = unlimited). Beyond it, the least
            recently used adapter that is neither pinned nor in use is evicted; it stays listed and is loaded
            again, from its path, when a request needs it.
        supports_scoring: ``score``, ``score_rolling`` and ``score_batch`` work (log-likelihoods of given text).
        supports_logprobs: ``generate(..., logprobs=k)`` reports token log-probabilities.
        supports_json_schema: ``generate(..., json_schema=...)`` constrains the output.
        supports_tools: ``generate(..., tools=[...])`` lets the model call tools (and a conversation may hold tool
            calls and results).
        supports_adapter_scales: ``adapter_id`` may be an ``(id, scale)`` pair or a list of them (several
            adapters at once, each scaled).
        loads_adapter_weights_in_memory: ``load_adapter(id, AdapterWeights(...))`` puts the tensors straight
            into the model; other providers get a temporary PEFT directory written for them.
        options: How the backend receives each generation option: ``{"temperature": Sent("temperature"),
            "logprobs": Refused("...")}`` (:class:`~inference.options.Sent`, :class:`~inference.options.Refused`).
            Every provider declares every option; ``supports_logprobs``, ``supports_json_schema`` and ``supports_tools``
            follow from it.
        supports_tokenize: ``tokenize``, ``detokenize`` and ``token_vocabulary`` work (the model's tokenizer is
            at hand).
        supports_next_token_logprobs: ``next_token_logprobs`` and ``batch_next_token_logprobs`` return the full
            next-token distribution (never a truncated one).
        supports_token_prompts: ``generate``, ``stream`` and ``generate_batch`` take a
            :class:`~inference.tokens.TokenIds` prompt.
        loads_hub_ids: The model setting may be a Hugging Face Hub id (``ORG/NAME``; llama.cpp's
            ``ORG/NAME:FILE.gguf``), resolved from the local Hugging Face cache (fetched there first unless
            ``HF_HUB_OFFLINE`` is set).
    """

    async def generate(
        self,
        prompt: Prompt,
        model: str,
        adapter_id: AdapterChoice = None,
        max_tokens: int = 4096,
        system_prompt: str | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        **options: Unpack[RequestOptions],
    ) -> GenerationResult:
        """Generate a completion for ``prompt``.

        Args:
            prompt: The user's text, or a conversation: a list of ``{"role": "system"|"user"|"assistant"|"tool",
                "content": str}`` messages, tool calls and results included (see :mod:`inference.messages`), or the
                model's token ids as :class:`~inference.tokens.TokenIds` (the whole input as is: no chat template,
                no BOS added; where :attr:`supports_token_prompts`).
            model: The base model name (servers) or a label (in-process providers use their loaded model).
            adapter_id: A loaded adapter to apply, or ``None`` for the base model. Where
                ``supports_adapter_scales`` is true, also an ``(id, scale)`` pair or a list of pairs: each adapter's
                delta times its scale, added together (scale 0 is the base model; a result's ``adapter_id`` then
                reads ``"math*1+style*0.5"``).
            max_tokens: The most tokens to generate.
            system_prompt: A system message, sent through the model's chat template where there is one.
            temperature: Sampling temperature; ``0`` is greedy. ``None`` keeps the backend's default.
            top_p: Nucleus sampling mass in (0, 1].
            repetition_penalty: Penalty above 1 discourages repeats; ``None`` keeps the default.
            **options: The keyword-only options, each described on :class:`~inference.options.RequestOptions`:
                ``stop``, ``seed``, ``top_k``, ``logprobs``, ``json_schema``, ``tools``, ``tool_choice``,
                ``return_token_ids``, ``n``, ``presence_penalty``, ``frequency_penalty``, ``min_p``, ``logit_bias``,
                ``raw_prompt``, ``chat_template``, ``chat_template_kwargs``, ``thinking``, ``response_format``,
                ``extra_body`` and ``timeout``. A name that is no option is a ``TypeError``; an option this provider
                cannot honour (see :attr:`options`) is an ``UnsupportedOperationError``.

        Returns:
            The generated text with token counts and finish reason, and the tools the model called
            (``tool_calls``, with ``finish_reason`` ``"tool_calls"``) when ``tools`` were given; with ``n > 1``,
            the first completion with every one in ``choices``.

        Raises:
            InvalidRequestError: An argument is invalid (the message names it), a message list is combined with
                ``system_prompt``, or the backend cannot compile ``json_schema``.
            UnsupportedOperationError: The provider cannot honour an option that is set (its :attr:`options` says
                so), or apply adapters with scales.
            AdapterNotFoundError: ``adapter_id`` (or one of the adapters in it) is not loaded.
            ProviderError: The backend failed (unavailable, timeout, error status), ended the generation with an
                error or an abort (a ``finish_reason`` such as ``"abort"``), or its text for a ``json_schema`` does
                not parse or validate although it finished (``finish_reason`` ``"stop"``).
            ProviderTimeoutError: The call took longer than ``timeout`` seconds (it was cancelled), or a server
                did not answer within the provider's own ``timeout`` setting.
        """
        with observe(self.name, "generate") as observed:
            await import_off_the_loop(options)
            request = self._request("generate", locals())
            observed.request(request.model, _asked_adapter(request))
            result = await self._in_time(request, _deadline(request), self._generate_answer(request))
            observed.result(result.prompt_tokens, result.completion_tokens, result.finish_reason)
            return result

    async def stream(
        self,
        prompt: Prompt,
        model: str,
        adapter_id: AdapterChoice = None,
        max_tokens: int = 4096,
        system_prompt: str | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        **options: Unpack[RequestOptions],
    ) -> AsyncGenerator[StreamEvent, None]:
        """Generate like :meth:`generate`, yielding text pieces as they are produced.

        Yields:
            Text pieces (``str``) in order, then exactly one :class:`GenerationResult` whose ``text`` is
            their concatenation, with token counts and finish reason.

        Stopping early stops the generation in the backend: cancelling the consuming task does so at once;
        after a ``break``, asyncio closes the abandoned generator a moment later, or at once when you iterate
        inside ``async with contextlib.aclosing(provider.stream(...)) as events:``.

        Example:
            >>> import asyncio
            >>> from inference.fake_provider import FakeProvider
            >>> async def main():
            ...     pieces = []
            ...     async for event in FakeProvider().stream("hi", model="m", max_tokens=3):
            ...         if isinstance(event, str):
            ...             pieces.append(event)
            ...         else:
            ...             return "".join(pieces) == event.text
            >>> asyncio.run(main())
            True

        Raises:
            InvalidRequestError: An argument is invalid, or ``n`` is above 1 (raised when iteration starts, like
                every error here).
            AdapterNotFoundError: ``adapter_id`` is not loaded.
            ProviderError: The backend failed (unavailable, timeout, error status, an abort), before or during the
                stream.
            ProviderTimeoutError: The stream did not end within ``timeout`` seconds of the call (the limit strikes
                only while the stream waits for the backend, never in your loop's own code).
        """
        with observe(self.name, "stream", current=False) as observed:
            await import_off_the_loop(options)
            request = self._request("stream", locals())
            observed.request(request.model, _asked_adapter(request))
            if request.n > 1:
                raise InvalidRequestError(
                    f"stream yields the pieces of one completion, and n is {request.n}: use generate (or "
                    "generate_batch) for several completions, or stream each one",
                    provider=self.name,
                )
            deadline = _deadline(request)
            await self._in_time(request, deadline, self._check_before_sending(request))
            plan = await self._in_time(request, deadline, self._tool_plan(request))
            async with contextlib.AsyncExitStack() as stack:
                sent = await self._in_time(request, deadline, stack.enter_async_context(self._request_in_use(request)))
                events = self._stream(sent if plan is None else plan.backend_request(sent))
                thoughts = ThinkingStream() if self._splits_thinking(request) else None  # reasoning never streamed
                calls = None if plan is None else ToolCallStream(plan)  # tool calls come with the result
                try:
                    while True:
                        try:
                            event = await self._in_time(request, deadline, events.__anext__())
                        except StopAsyncIteration:
                            break
                        if isinstance(event, str):
                            event = event if thoughts is None else thoughts.feed(event)
                            event = event if calls is None else calls.feed(event)
                            if event:
                                observed.piece()
                                yield event
                        else:
                            held = "" if thoughts is None else thoughts.flush()
                            held = held if calls is None else calls.feed(held) + calls.flush()
                            if held:
                                yield held
                            final = self._checked_result(request, event, plan)
                            observed.result(final.prompt_tokens, final.completion_tokens, final.finish_reason)
                            yield final
                finally:
                    await events.aclose()  # type: ignore[attr-defined]

    async def generate_batch(
        self,
        prompts: Sequence[Prompt],
        model: str,
        adapter_id: AdapterChoice = None,
        max_tokens: int = 4096,
        system_prompt: str | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        *,
        max_concurrency: int = 8,
        on_result: Callable[[int, BatchItem], object] | None = None,
        on_error: OnError = "return",
        chunk_size: int | None = None,
        **options: Unpack[RequestOptions],
    ) -> list[BatchItem]:
        """Generate for every prompt with bounded concurrency; by default one failure never loses the other results.

        Args:
            prompts: The prompts; every other argument is as in :meth:`generate` and applies to all of them
                (``timeout`` bounds each prompt's call, not the batch).
            max_concurrency: Most requests in flight at once.
            on_result: Called as ``on_result(index, result_or_error)`` as each item finishes (for progress, or to
                write results as they come); an exception it raises is logged and ignored.
            on_error: What a failed item does: ``"return"`` (the default) puts its exception in its place in the
                list; ``"warn"`` does too, and logs a warning naming the item and its error (the ``inference``
                logger); ``"raise"`` cancels the items still running (an in-process generation stops within a
                token; items not started never start) and, once they have stopped, raises the first error.
            chunk_size: Run the prompts in sequential chunks of this many: a chunk starts when every request of
                the previous one has finished (``None``: all at once, ``max_concurrency`` at a time).

        Returns:
            One entry per prompt, in input order: its :class:`GenerationResult`, or the exception it raised.

        Raises:
            InvalidRequestError: ``prompts`` is not a sequence of prompts, ``max_concurrency`` or ``chunk_size``
                is not a positive integer, or ``on_error`` is not one of the three.
            Exception: With ``on_error="raise"``, the first error of an item.
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InvalidRequestError(
                f"prompts must be a list of prompts (strings or message lists), got {type(prompts).__name__}",
                provider=self.name,
            )
        if prompts and all(isinstance(prompt, dict) for prompt in prompts):
            raise InvalidRequestError(
                "prompts is one conversation (a list of messages): pass a list of prompts, [messages]",
                provider=self.name,
            )
        _check_option_names("generate_batch", options)
        positional = (max_tokens, system_prompt, temperature, top_p, repetition_penalty)

        def generate_one(prompt: Prompt) -> Awaitable[GenerationResult]:
            return self.generate(prompt, model, adapter_id, *positional, **options)

        return await self._run_all(
            "generate_batch", prompts, generate_one, max_concurrency, on_result,
            on_error=on_error, chunk_size=chunk_size,
        )

    def _request(self, method: str, arguments: dict[str, Any]) -> GenerationRequest:
        """The validated request for the arguments of :meth:`generate` or :meth:`stream` (their ``locals()``):
        every option checked by its rule, and refused here if this provider declares it cannot honour it."""
        keywords: dict[str, Any] = arguments["options"]
        _check_option_names(method, keywords)
        adapter_id, scales = split_adapter_choice(arguments["adapter_id"], provider=self.name)
        if scales and not self.supports_adapter_scales:
            raise self._cannot("apply an adapter with a scale, or several adapters at once", "supports_adapter_scales")
        values = {
            **{name: arguments[name] for name in ("prompt", "model", *POSITIONAL_OPTIONS)},
            **keywords,
            "adapter_id": adapter_id,
            "adapter_scales": scales,
        }
        if keywords.get("raw_prompt") is None and self._raw_prompt_by_default():
            values["raw_prompt"] = True  # the provider's setting: it has one, so its options map sends raw prompts
        request = GenerationRequest.from_arguments(provider=self.name, **values)
        if request.prompt_token_ids is not None and not self.supports_token_prompts:
            raise self._cannot("generate from token ids (a TokenIds prompt)", "supports_token_prompts")
        for name in GenerationOptions.names():
            if option_is_set(name, getattr(request, name)):
                self._require_option(name)
        if isinstance(request.prompt, tuple) and has_tool_turns(request.prompt):
            self._require_option("tools", "take a conversation with tool calls or tool results")
        return request

    def _raw_prompt_by_default(self) -> bool:
        """The provider's ``raw_prompt`` setting, where its type has one (see :mod:`inference.registry`)."""
        from inference.config import SETTINGS

        return any(setting.key == "raw_prompt" for setting in SETTINGS.get(self.name, ())) and bool(
            self._settings["raw_prompt"]
        )

    def _require_option(self, name: str, what: str | None = None) -> None:
        """Refuse option ``name`` if this provider's :attr:`options` says its backend cannot honour it (``what``:
        what the request asks that needs it, when it is not the option itself)."""
        how = type(self).options.get(name)
        if isinstance(how, Sent):
            return
        from inference.registry import providers_sending  # the registry imports provider classes lazily

        able = ", ".join(providers_sending(name)) or "none"
        reason = how.reason if isinstance(how, Refused) else f"{type(self).__name__}.options does not declare it"
        asked = f"honour the option {name}" if what is None else f"{what}, which needs the option {name}"
        raise UnsupportedOperationError(
            f"{type(self).__name__} cannot {asked} ({reason}); providers that can: {able}",
            provider=self.name,
        )

    async def _generate_answer(self, request: GenerationRequest) -> GenerationResult:
        """The checked result of a validated request: its ``n`` completions where the backend makes them (a native
        ``n``: the result reads as its first checked choice, its tool calls and finish reason too, with the
        backend's token counts), else (``options["n"]`` is :class:`~inference.options.ByRequests`) ``n`` requests of
        one completion, at once."""
        await self._check_before_sending(request)
        if request.n > 1 and isinstance(type(self).options.get("n"), ByRequests):
            from inference._core.batches import all_or_none

            seeds = [None if request.seed is None else request.seed + index for index in range(request.n)]
            ones = [dataclasses.replace(request, n=1, seed=seed) for seed in seeds]
            return GenerationResult.from_choices(await all_or_none([self._generate_one(one) for one in ones]))
        result = await self._generate_one(request)
        if result.choices is None:
            return result
        return GenerationResult.from_choices(result.choices, usage=(result.prompt_tokens, result.completion_tokens))

    async def _generate_one(self, request: GenerationRequest) -> GenerationResult:
        plan = await self._tool_plan(request)
        async with self._request_in_use(request) as sent:
            result = await self._generate(sent if plan is None else plan.backend_request(sent))
            return self._checked_result(request, result, plan)

    async def _check_before_sending(self, request: GenerationRequest) -> None:
        """What needs the backend's vocabulary: a :class:`~inference.tokens.TokenIds` prompt, ``logit_bias`` ids
        (where the provider has its tokenizer at hand, ``supports_tokenize``)."""
        await self._check_token_prompt(request)
        if request.logit_bias and self.supports_tokenize:
            try:
                vocabulary = await self._vocabulary_of(request.model)
            except UnsupportedOperationError:
                return  # a server whose vocabulary cannot be read here (vLLM's model files elsewhere) checks the ids
            ids = tuple(request.logit_bias)
            check_token_limits(ids, vocabulary, provider=self.name, name="logit_bias", max_length=len(ids))

    def _checked_result(
        self, request: GenerationRequest, result: GenerationResult, plan: ToolPlan | None = None
    ) -> GenerationResult:
        """``result`` as the caller receives it: each choice finished (an engine error or abort is a
        :class:`ProviderError`, never a text), its reasoning apart and its tool calls read from its text (in
        process, by the ``plan``), kept to the ``json_schema``, and under the adapter id asked for."""
        asked = _asked_adapter(request)

        def checked(one: GenerationResult) -> GenerationResult:
            one = self._reasoning_apart(request, _finished(one, self.name))
            one = _called_as_forced(request, one if plan is None else plan.read(one), self.name)
            return _as_asked(self._kept_to_schema(request, one), asked)

        if result.choices is None:
            return checked(result)
        choices = tuple(checked(one) for one in result.choices)
        first = choices[0]  # the result reads as its first choice (reasoning apart there too)
        answer = _as_asked(result, asked)
        return dataclasses.replace(answer, text=first.text, reasoning=first.reasoning, choices=choices)

    async def _tool_plan(self, request: GenerationRequest) -> ToolPlan | None:
        """How a request with tools (or a conversation holding tool calls) runs on a backend that renders the chat
        template itself (in process): what it renders and constrains, how calls are read from its text
        (:mod:`inference._core.tool_formats`). ``None`` for other requests, and on servers, which read their own."""
        if not self.runs_in_process or request.prompt_token_ids is not None:
            return None
        if not request.tools and not has_tool_turns(request.messages):
            return None
        model, template = await self._model_chat_template()
        if request.raw_prompt:
            template = None
        return ToolPlan.for_request(request, request.chat_template or template, model=model, provider=self.name)

    async def _model_chat_template(self) -> tuple[str, str | None]:
        """The model's name and its own chat template (``None``: it has none), for in-process providers that take
        tools (the model is loaded first)."""
        raise self._cannot("call tools", "supports_tools")

    def _splits_thinking(self, request: GenerationRequest) -> bool:
        """Whether the text's ``<think>...</think>`` goes to ``reasoning`` here: on in-process backends (a server
        parses its own), for a prompt the chat template rendered (a raw prompt or token ids is the caller's)."""
        return self.runs_in_process and not request.raw_prompt and request.prompt_token_ids is None

    def _reasoning_apart(self, request: GenerationRequest, result: GenerationResult) -> GenerationResult:
        """``result`` with a leading ``<think>...</think>`` moved from ``text`` to ``reasoning`` (see
        :mod:`inference._core.thinking`; the token counts, ids and logprobs still cover every generated token)."""
        if not self._splits_thinking(request) or result.reasoning is not None:
            return result
        text, reasoning = split_thinking(result.text)
        return result if reasoning is None else dataclasses.replace(result, text=text, reasoning=reasoning)

    async def _in_time(self, request: GenerationRequest, deadline: float | None, work: Awaitable[_ResultT]) -> _ResultT:
        """Await ``work``, cancelled at ``deadline`` (the event loop's time; ``None``: no limit) with a
        :class:`ProviderTimeoutError` naming the request's ``timeout``."""
        if deadline is None:
            return await work
        loop = asyncio.get_running_loop()
        try:
            return await within(max(deadline - loop.time(), 0.0), work)
        except asyncio.TimeoutError as error:
            if isinstance(error, ProviderTimeoutError) or loop.time() < deadline:
                raise  # the backend's own timeout, not the call's
            raise ProviderTimeoutError(
                f"{type(self).__name__} did not finish within timeout={request.timeout:g} s, so the call was "
                "cancelled (an in-process generation stops within a token): raise timeout, or ask for fewer tokens",
                provider=self.name,
            ) from None

    def _kept_to_schema(self, request: GenerationRequest, result: GenerationResult) -> GenerationResult:
        """``result``, once its text is checked against the request's ``json_schema`` (when it has one): a finished
        text that does not parse or validate, or a cut one that is not the beginning of JSON, is a
        :class:`ProviderError`. An answer that calls tools is not the schema's answer yet (a server that takes
        ``json_schema`` beside ``tools``): its calls are returned, its text left as it is."""
        if request.json_schema is not None and not result.tool_calls:
            from inference._core.json_schemas import check_answer

            check_answer(result.text, request.json_schema, result.finish_reason, provider=self.name)
        return result

    # Hooks for backends -------------------------------------------------------------------------------

    @abstractmethod
    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one validated request."""

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """Yield text pieces, then one result. This default yields the whole text of ``_generate`` at once."""
        result = await self._generate(request)
        if result.text:
            yield result.text
        yield result


def _list_options_in_signature(function: Callable[..., Any]) -> None:
    """Show the keyword-only options of ``**options`` as parameters in ``inspect.signature(function)`` (help(),
    IDEs that read signatures at run time), each with the default ``None``, before the method's own keyword-only
    parameters."""
    signature = inspect.signature(function)
    kinds = inspect.Parameter
    parameters = [p for p in signature.parameters.values() if p.kind is not kinds.VAR_KEYWORD]
    first_keyword = next((i for i, p in enumerate(parameters) if p.kind is kinds.KEYWORD_ONLY), len(parameters))
    listed = [
        kinds(name, kinds.KEYWORD_ONLY, default=None, annotation=getattr(annotation, "__forward_arg__", annotation))
        for name, annotation in RequestOptions.__annotations__.items()
    ]
    function.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*parameters[:first_keyword], *listed, *parameters[first_keyword:]]
    )


for _method in (InferenceProvider.generate, InferenceProvider.stream, InferenceProvider.generate_batch):
    _list_options_in_signature(_method)


def _check_option_names(method: str, options: Mapping[str, Any]) -> None:
    """Refuse keyword arguments that are no option, as Python refuses an unexpected keyword argument."""
    known = GenerationOptions.names()
    for name in options:
        if name not in known or name in POSITIONAL_OPTIONS:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close and close[0] != name else ""
            raise TypeError(f"{method}() got an unexpected keyword argument {name!r}{hint}")


def _deadline(request: GenerationRequest) -> float | None:
    """When the call must end, in the event loop's time (``None``: no ``timeout``)."""
    return None if request.timeout is None else asyncio.get_running_loop().time() + request.timeout


def _asked_adapter(request: GenerationRequest) -> str | None:
    """The ``adapter_id`` a result reports: the id asked for, or the label of the adapters and their scales."""
    return adapters_label(request.adapter_scales) if request.adapter_scales else request.adapter_id


def _finished(result: GenerationResult, provider: str) -> GenerationResult:
    """Refuse a result whose ``finish_reason`` says the backend did not finish it (``"abort"``, ``"error"``,
    anything not in :data:`~inference.results.FINISH_REASONS`)."""
    if result.finish_reason not in FINISH_REASONS:
        raise ProviderError(
            f"the {provider} provider's backend ended the generation with finish_reason {result.finish_reason!r} "
            "(an engine error or an abort), not a finished text, so no result is returned: retry, and look at "
            "the backend's log if it happens again",
            provider=provider,
        )
    return result


def _called_as_forced(request: GenerationRequest, result: GenerationResult, provider: str) -> GenerationResult:
    """Refuse a result without a tool call for a request whose ``tool_choice`` forces one (``"required"`` or a
    named tool): a backend that ignored the choice (llama_cpp.server ignores ``"required"``) never passes its
    text off as an answer to it."""
    forced = request.tool_choice == "required" or isinstance(request.tool_choice, Mapping)
    if not forced or not request.tools or result.tool_calls:
        return result
    raise ProviderError(
        f"the {provider} provider's backend answered without a tool call although tool_choice="
        f"{request.tool_choice!r} forces one (finish_reason {result.finish_reason!r}), so its text is not "
        "returned: the server ignores that tool_choice (llama_cpp.server ignores 'required': name the tool "
        "instead), or max_tokens ended the answer first",
        provider=provider,
    )
