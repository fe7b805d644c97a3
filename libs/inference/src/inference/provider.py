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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import inspect
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from inference._core.lifecycle import AdapterRegistry, Discovered, default_versioned_name
from inference._core.paths import normalise_path, path_text_problem
from inference._core.telemetry import observe, observed_adapter_hook
from inference._core.validation import (
    AdapterChoice,
    GenerationRequest,
    ScoreRequest,
    TokenRequest,
    adapters_label,
    check_token_limits,
    checked_model,
    checked_text,
    split_adapter_choice,
    validate_adapter_id,
)
from inference._core.weights_store import AdapterWeightsStore
from inference.adapters.source import AdapterSource
from inference.adapters.stats import ProviderAdapterStats
from inference.exceptions import InvalidRequestError, ProviderError, ProviderTimeoutError, UnsupportedOperationError
from inference.messages import Prompt, has_tool_turns
from inference.options import (
    POSITIONAL_OPTIONS,
    ByRequests,
    GenerationOptions,
    OptionMap,
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
from inference.tokens import TokenCacheStats, TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
    from typing_extensions import Unpack

    from inference._core.batches import OnError
    from inference._core.token_batching import TokenBatcher
    from inference.adapters.weights import AdapterWeights
    from inference.health import BackendHealth, ProviderHealth

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

_ProviderT = TypeVar("_ProviderT", bound="InferenceProvider")
_HeldT = TypeVar("_HeldT", GenerationRequest, TokenRequest)
_ItemT = TypeVar("_ItemT")
_ResultT = TypeVar("_ResultT")


class InferenceProvider(ABC):
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
    """

    name: ClassVar[str] = "base"
    supports_adapters: ClassVar[bool] = False
    hot_swaps_adapters: ClassVar[bool] = False
    batches_mixed_adapters: ClassVar[bool] = False
    runs_in_process: ClassVar[bool] = False
    supports_scoring: ClassVar[bool] = False
    supports_logprobs: ClassVar[bool] = False
    supports_json_schema: ClassVar[bool] = False
    supports_tools: ClassVar[bool] = False
    supports_adapter_scales: ClassVar[bool] = False
    loads_adapter_weights_in_memory: ClassVar[bool] = False
    supports_tokenize: ClassVar[bool] = False
    supports_next_token_logprobs: ClassVar[bool] = False
    supports_token_prompts: ClassVar[bool] = False
    options: ClassVar[OptionMap] = {}
    max_adapters: int | None = None

    def __init__(self, arguments: Mapping[str, Any] | None = None) -> None:
        """Set up what every provider holds: its settings, its adapter registry and the adapter weights it keeps.

        Subclasses call it first, with their constructor's arguments: ``super().__init__(locals())``.

        Args:
            arguments: The constructor's arguments by name. Those that are settings of this provider type in
                :data:`inference.registry.PROVIDERS` are resolved (argument, else environment variable, else
                default; ``None`` counts as not given) into ``self._settings``; others are left to the subclass.

        Raises:
            ConfigurationError: A setting breaks its rule; the sentence names the argument or the variable.
        """
        from inference.config import SETTINGS, resolve_settings

        keys = {setting.key for setting in SETTINGS.get(self.name, ())}
        given = {
            key: os.fspath(value) if isinstance(value, os.PathLike) else value
            for key, value in (arguments or {}).items()
            if key in keys and value is not None
        }
        self._settings: dict[str, Any] = resolve_settings(self.name, given) if keys else {}
        self._closed = False
        self._token_vocabularies: dict[str, TokenVocabulary] = {}  # model name -> its vocabulary, asked once
        self._token_batcher_instance: TokenBatcher | None = None
        self._adapter_weights = AdapterWeightsStore(self.name, self, parent=self._adapter_weights_dir)
        self._adapter_registry = AdapterRegistry(
            self.name,
            load=observed_adapter_hook(self.name, "load", self._load_adapter),
            unload=observed_adapter_hook(self.name, "unload", self._unload_adapter),
            capacity=lambda: self.max_adapters,
            discover=self._discover_adapter,
            versioned=self._versioned_adapter_name,
        )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "options" in cls.__dict__:  # the capabilities that are options follow from the declaration
            cls.supports_logprobs = isinstance(cls.options.get("logprobs"), Sent)
            cls.supports_json_schema = isinstance(cls.options.get("json_schema"), Sent)
            cls.supports_tools = isinstance(cls.options.get("tools"), Sent)

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
            async with contextlib.AsyncExitStack() as stack:
                sent = await self._in_time(request, deadline, stack.enter_async_context(self._request_in_use(request)))
                events = self._stream(sent)
                try:
                    while True:
                        try:
                            event = await self._in_time(request, deadline, events.__anext__())
                        except StopAsyncIteration:
                            break
                        if isinstance(event, str):
                            observed.piece()
                            yield event
                        else:
                            final = self._checked_result(request, event)
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

    async def score(
        self, context: str, continuation: str, model: str, adapter_id: str | None = None
    ) -> ScoreResult:
        """The log-likelihood of ``continuation`` after ``context``, as lm-eval-harness's ``loglikelihood``.

        The continuation's tokens are found as lm-eval finds them (the rule is in
        :mod:`inference._core.scoring`: trailing whitespace of the context moves to the continuation, a BOS
        token starts the sequence when the model's tokenizer adds one), the same on every backend.

        Args:
            context: The text before (may be empty).
            continuation: The text to score; not empty.
            model: As in :meth:`generate`.
            adapter_id: A loaded adapter, or ``None`` for the base model.

        Returns:
            The summed log-probability of the continuation's tokens, their number, and whether each was the
            model's most likely token.

        Raises:
            UnsupportedOperationError: The provider cannot score (``supports_scoring`` is false).
            InvalidRequestError: The continuation is empty, or context and continuation do not fit the model's
                context window.
            AdapterNotFoundError: ``adapter_id`` is not loaded.
        """
        with observe(self.name, "score") as observed:
            request = ScoreRequest.checked(
                provider=self.name, context=context, continuation=continuation, model=model, adapter_id=adapter_id
            )
            observed.request(request.model, request.adapter_id)
            self._require_scoring("score")
            async with self._adapter_in_use(request.adapter_id) as backend:
                result = _as_asked(await self._score(_sent_as(request, backend)), request.adapter_id)
            observed.scored(result.num_tokens)
            return result

    async def score_rolling(self, text: str, model: str, adapter_id: str | None = None) -> ScoreResult:
        """The log-likelihood of all of ``text`` (lm-eval's ``loglikelihood_rolling``), for perplexity.

        A text longer than the model's context is scored in disjoint windows, each conditioned on the tokens
        before it in that window (:func:`inference._core.scoring.rolling_windows`). ``is_greedy`` is true when
        every token was the most likely one.

        Raises:
            UnsupportedOperationError: The provider cannot score.
            InvalidRequestError: ``text`` is empty.
            AdapterNotFoundError: ``adapter_id`` is not loaded.
        """
        with observe(self.name, "score_rolling") as observed:
            request = ScoreRequest.checked(
                provider=self.name, context="", continuation=text, model=model, adapter_id=adapter_id
            )
            observed.request(request.model, request.adapter_id)
            self._require_scoring("score_rolling")
            async with self._adapter_in_use(request.adapter_id) as backend:
                result = _as_asked(await self._score_rolling(_sent_as(request, backend)), request.adapter_id)
            observed.scored(result.num_tokens)
            return result

    async def score_batch(
        self,
        pairs: Sequence[tuple[str, str]],
        model: str,
        adapter_id: str | None = None,
        *,
        max_concurrency: int = 8,
        on_result: Callable[[int, ScoreItem], object] | None = None,
        on_error: OnError = "return",
        chunk_size: int | None = None,
    ) -> list[ScoreItem]:
        """Score every ``(context, continuation)`` pair, like :meth:`generate_batch` does generations (with the same
        ``max_concurrency``, ``on_result``, ``on_error`` and ``chunk_size``).

        Returns:
            One entry per pair, in input order: its :class:`ScoreResult`, or the exception it raised.

        Raises:
            InvalidRequestError: ``pairs`` is not a sequence, or ``max_concurrency`` is not a positive integer.
            UnsupportedOperationError: The provider cannot score.
        """
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
            raise InvalidRequestError(
                f"pairs must be a list of (context, continuation) pairs, got {type(pairs).__name__}",
                provider=self.name,
            )
        self._require_scoring("score_batch")

        def score_one(pair: tuple[str, str]) -> Awaitable[ScoreResult]:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidRequestError(
                    f"each item of pairs must be a (context, continuation) pair, got {pair!r}", provider=self.name
                )
            return self.score(pair[0], pair[1], model, adapter_id)

        return await self._run_all(
            "score_batch", pairs, score_one, max_concurrency, on_result, on_error=on_error, chunk_size=chunk_size
        )

    async def _run_all(
        self,
        operation: str,
        items: Sequence[_ItemT],
        call: Callable[[_ItemT], Awaitable[_ResultT]],
        max_concurrency: int,
        on_result: Callable[[int, _ResultT | Exception], object] | None,
        *,
        on_error: str = "return",
        chunk_size: int | None = None,
    ) -> list[_ResultT | Exception]:
        """Run ``call`` on every item, at most ``max_concurrency`` at once, by the batch policies of
        :func:`inference._core.batches.run_batch`."""
        from inference._core.batches import run_batch

        return await run_batch(
            items, call, operation=operation, provider=self.name, max_concurrency=max_concurrency,
            chunk_size=chunk_size, on_error=on_error, on_result=on_result,
        )

    # Token level ---------------------------------------------------------------------------------------

    async def tokenize(self, text: str, model: str) -> list[int]:
        """The model's token ids for ``text``, with no special token added (no BOS).

        Text that spells one of the model's special tokens (``"<|im_end|>"``, ``"<bos>"``) is that one token, and the
        tokenizer's normalizer applies: the rule of scoring (:mod:`inference._core.scoring`), so
        ``tokenize(context + continuation)`` are the ids ``score`` reads.

        Raises:
            UnsupportedOperationError: The provider has no tokenizer at hand (``supports_tokenize`` is false).
            InvalidRequestError: ``text`` or ``model`` is not a string, or ``text`` holds a lone surrogate.
        """
        self._require_token_level("tokenize text", "supports_tokenize")
        text = checked_text(text, "text", provider=self.name)
        model = checked_model(model, provider=self.name)
        self._check_open()
        return [int(token) for token in await self._tokenize_text(text, model)]

    async def detokenize(self, token_ids: Sequence[int], model: str) -> str:
        """The text of ``token_ids``: special tokens written out (``"<eos>"``), bytes that end inside a UTF-8
        character shown as ``"\ufffd"``. ``detokenize(tokenize(text))`` is ``text`` unless the tokenizer
        normalizes it.

        Raises:
            UnsupportedOperationError: The provider has no tokenizer at hand (``supports_tokenize`` is false).
            InvalidRequestError: ``token_ids`` is not a list of non-negative integers.
            TokenLimitError: An id is outside the vocabulary.
        """
        self._require_token_level("detokenize token ids", "supports_tokenize")
        if isinstance(token_ids, (list, tuple)) and not token_ids:
            return ""
        request = TokenRequest.checked(provider=self.name, token_ids=token_ids, model=model)
        self._check_open()
        vocabulary = await self._vocabulary_of(request.model)
        check_token_limits(request.token_ids, vocabulary, provider=self.name, max_length=len(request.token_ids))
        return await self._detokenize_ids(request)

    async def token_vocabulary(self, model: str) -> TokenVocabulary:
        """The model's vocabulary for token-level work: its size (the width of every distribution), each token's
        bytes, the special tokens, BOS and EOS, and the context length.

        Raises:
            UnsupportedOperationError: The provider has no tokenizer at hand (``supports_tokenize`` is false).
        """
        self._require_token_level("describe its vocabulary", "supports_tokenize")
        model = checked_model(model, provider=self.name)
        self._check_open()
        return await self._vocabulary_of(model)

    async def next_token_logprobs(
        self, token_ids: Sequence[int], model: str, adapter_id: AdapterChoice = None
    ) -> NDArray[np.float32]:
        """The model's distribution over its whole vocabulary for the token after ``token_ids``.

        Concurrent calls (and :meth:`batch_next_token_logprobs`) are gathered and reach the backend together, so it
        can run them in one forward pass; a provider with a prefix cache computes only the tokens it has not seen
        for the same adapter weights (``prefix + [t]`` after ``prefix`` costs one token; see :meth:`cache_stats`).

        Args:
            token_ids: The sequence, as the model reads it: nothing is added (start it with the model's BOS token
                where the model expects one: :attr:`~inference.tokens.TokenVocabulary.adds_bos`). Any iterable
                of integers (a list, a tuple, a ``numpy`` array). Not empty: to condition on nothing, pass
                ``[bos_id]`` (genlm-backend refuses an empty list too).
            model: As in :meth:`generate`.
            adapter_id: As in :meth:`generate`: an adapter id, ``None`` for the base model, or, where
                ``supports_adapter_scales``, an ``(id, scale)`` pair or a list of them. The adapter is held loaded
                for the call, and a replaced adapter answers with its new weights from the call after the
                replacement on.

        Returns:
            A 1-D ``numpy.ndarray`` of ``float32`` with one natural-log probability per vocabulary entry
            (:attr:`~inference.tokens.TokenVocabulary.size` entries; ``logsumexp`` is 0 within 1e-4).

        Raises:
            UnsupportedOperationError: The provider cannot (``supports_next_token_logprobs`` is false), or
                ``adapter_id`` has scales where ``supports_adapter_scales`` is false.
            InvalidRequestError: ``token_ids`` is empty or not a list of non-negative integers.
            TokenLimitError: An id is outside the vocabulary, or the sequence is longer than the context.
            AdapterNotFoundError: ``adapter_id`` is not loaded.
        """
        rows = await self._next_token_rows([token_ids], model, adapter_id, lambda index: "token_ids")
        row: NDArray[np.float32] = rows[0]
        return row

    async def batch_next_token_logprobs(
        self, token_ids_list: Sequence[Sequence[int]], model: str, adapter_id: AdapterChoice = None
    ) -> NDArray[np.float32]:
        """:meth:`next_token_logprobs` for each sequence, all with one adapter choice.

        Returns:
            A 2-D ``numpy.ndarray`` of ``float32``: one row per sequence, in order (``(0, size)`` for no sequence).

        Raises:
            InvalidRequestError: ``token_ids_list`` is not a list of sequences; a sequence is invalid (the message
                names its index).
            TokenLimitError: An id is outside the vocabulary, or a sequence is longer than the context.
        """
        if isinstance(token_ids_list, (str, bytes)) or not isinstance(token_ids_list, Sequence):
            raise InvalidRequestError(
                f"token_ids_list must be a list of token id lists, got {type(token_ids_list).__name__}",
                provider=self.name,
            )
        if not token_ids_list:
            self._require_token_level("compute next-token distributions", "supports_next_token_logprobs")
            import numpy as np

            vocabulary = await self._vocabulary_of(checked_model(model, provider=self.name))
            return np.empty((0, vocabulary.size), dtype=np.float32)
        return await self._next_token_rows(token_ids_list, model, adapter_id, lambda index: f"token_ids_list[{index}]")

    def cache_stats(self) -> TokenCacheStats:
        """The prefix cache's counters: hits and misses, tokens reused and computed, tokens held and evicted.

        A provider without a prefix cache reports ``enabled=False`` (and counts what it computed, where it can).
        """
        return self._cache_stats()

    def clear_cache(self) -> None:
        """Forget every cached prefix (every adapter's): calls made after it compute their sequences whole.

        It takes effect at once; a backend may free the memory a moment later, on its own thread. Replacing or
        unloading an adapter never needs it: a cached prefix belongs to one version of an adapter's weights.
        """
        self._clear_cache()

    async def _next_token_rows(
        self,
        sequences: Sequence[Sequence[int]],
        model: str,
        adapter_id: AdapterChoice,
        name: Callable[[int], str],
    ) -> NDArray[np.float32]:
        """Check every sequence, hold the adapters, and have the sequences run with the calls made at once."""
        self._require_token_level("compute next-token distributions over the whole vocabulary",
                                  "supports_next_token_logprobs")
        single, scales = split_adapter_choice(adapter_id, provider=self.name)
        if scales and not self.supports_adapter_scales:
            raise self._cannot("apply an adapter with a scale, or several adapters at once", "supports_adapter_scales")
        requests = [
            TokenRequest.checked(provider=self.name, token_ids=ids, model=model, adapter_id=single,
                                 adapter_scales=scales, name=name(index))
            for index, ids in enumerate(sequences)
        ]
        self._check_open()
        vocabulary = await self._vocabulary_of(requests[0].model)
        for index, request in enumerate(requests):
            check_token_limits(request.token_ids, vocabulary, provider=self.name, name=name(index))
        async with self._request_in_use(requests[0]) as sent:
            held = [dataclasses.replace(request, adapter_id=sent.adapter_id, adapter_scales=sent.adapter_scales)
                    for request in requests]
            return await self._token_batcher.submit(held)

    async def _vocabulary_of(self, model: str) -> TokenVocabulary:
        """The backend's vocabulary for ``model``, asked once per model name."""
        vocabulary = self._token_vocabularies.get(model)
        if vocabulary is None:
            vocabulary = self._token_vocabularies[model] = await self._token_vocabulary(model)
        return vocabulary

    async def _check_token_prompt(self, request: GenerationRequest) -> None:
        """Refuse a :class:`~inference.tokens.TokenIds` prompt the model cannot read (room for one new token)."""
        ids = request.prompt_token_ids
        if ids is None:
            return
        vocabulary = await self._vocabulary_of(request.model)
        check_token_limits(ids, vocabulary, provider=self.name, name="prompt.ids",
                           max_length=vocabulary.context_length - 1)

    @property
    def _token_batcher(self) -> TokenBatcher:
        """Gathers concurrent next-token calls into one backend call (made on first use)."""
        if self._token_batcher_instance is None:
            from inference._core.token_batching import TokenBatcher

            self._token_batcher_instance = TokenBatcher(self._next_token_logprobs, self.name)
        return self._token_batcher_instance

    def _require_token_level(self, what: str, capability: str) -> None:
        if not getattr(self, capability):
            raise self._cannot(what, capability)

    async def load_adapter(
        self,
        adapter_id: str,
        adapter_path: str | os.PathLike[str] | AdapterWeights,
        *,
        replace: bool = False,
        pin: bool = False,
    ) -> None:
        """Load a LoRA adapter under ``adapter_id`` so that ``generate(adapter_id=...)`` can use it.

        Loading an id again with the same path does nothing (concurrent calls load it once). "The same path"
        means the same place, however it is written: ``~`` is expanded, ``adapters/a/``, ``./adapters/a`` and
        ``adapters//a`` are one path, and a symlink to a directory on this machine is that directory.

        Args:
            adapter_id: The name to use it by (letters, digits, ``.``, ``_``, ``-``).
            adapter_path: Where the adapter is: a PEFT directory, or a GGUF LoRA file where the backend takes one;
                or the weights themselves, an :class:`~inference.AdapterWeights` (checked like a directory, then
                written to a private temporary PEFT directory that is removed when the adapter is unloaded).
                Each ``AdapterWeights`` is new weights: loading one under a loaded id needs ``replace=True``.
            replace: If the id is loaded from another path, unload it (after its requests in flight) and load
                this path in its place, instead of raising.
            pin: Never evict this adapter when the provider has a capacity (``max_adapters``). The pin belongs to
                the id: a later load or replacement with ``pin=True`` pins it, one with ``pin=False`` leaves it as
                it was (a training loop that replaces a pinned id each step keeps it pinned); ``unload_adapter``
                forgets it.

        Raises:
            UnsupportedOperationError: The provider has no adapter support.
            AdapterAlreadyLoadedError: The id is loaded from another path and ``replace`` is false.
            InvalidAdapterError: The adapter is missing, corrupt or unsupported.
            InvalidRequestError: ``adapter_path`` is not a non-empty path the operating system can take.
            ProviderError: The provider is :attr:`closed`.
        """
        adapter_id = validate_adapter_id(adapter_id, provider=self.name)
        await self._load_source(adapter_id, adapter_path, replace=replace, pin=pin)

    async def _load_source(
        self,
        adapter_id: str,
        adapter_path: str | os.PathLike[str] | AdapterWeights,
        *,
        replace: bool,
        pin: bool,
        base_model: str | None = None,
    ) -> None:
        """Make the :class:`~inference.adapters.source.AdapterSource` of ``adapter_path`` (weights are copied, and
        written to a private directory for a backend that reads files) and load it under ``adapter_id``."""
        from inference.adapters.weights import AdapterWeights  # light: no torch or numpy until weights are saved

        if not isinstance(adapter_path, AdapterWeights):
            source = AdapterSource(self._adapter_path_argument(adapter_path), base_model=base_model)
            self._require_adapter_support("load_adapter")
            self._check_open()
            await self._adapter_registry.load(adapter_id, source, replace=replace, pin=pin)
            return
        self._require_adapter_support("load_adapter")
        self._check_open()  # before anything is copied or written for a provider that cannot load it
        store = self._adapter_weights.kept if self.loads_adapter_weights_in_memory else self._adapter_weights.written
        source = await asyncio.to_thread(store, adapter_path)
        if base_model is not None:
            source = dataclasses.replace(source, base_model=base_model)
        try:
            await self._adapter_registry.load(adapter_id, source, replace=replace, pin=pin)
        finally:
            self._adapter_weights.recorded(source)
            self._remove_unused_adapter_weights()

    async def unload_adapter(self, adapter_id: str) -> None:
        """Unload the adapter ``adapter_id`` and free what it holds.

        Requests already using it finish first; new requests for it are refused from now on. Every provider
        raises for an unknown id.

        Raises:
            UnsupportedOperationError: The provider has no adapter support.
            AdapterNotFoundError: No adapter with this id is loaded.
            ProviderError: The provider is :attr:`closed`.
        """
        adapter_id = validate_adapter_id(adapter_id, provider=self.name)
        self._require_adapter_support("unload_adapter")
        self._check_open()
        try:
            await self._adapter_registry.unload(adapter_id)
        finally:
            self._remove_unused_adapter_weights()

    async def list_adapters(self) -> list[str]:
        """Return the ids of the loaded adapters (evicted ones included: they reload on use), sorted.

        Raises:
            ProviderError: The provider is :attr:`closed` (HTTP providers never are: they list what the server has).
        """
        self._check_open()
        return sorted(await self._list_adapters())

    def adapter_stats(self) -> ProviderAdapterStats:
        """What the provider's adapters are doing: state, requests in flight, loads, evictions and reloads.

        Every lifecycle event is also a log record on the ``inference.adapters`` logger and, when
        ``opentelemetry-api`` is installed, a span (see ``docs/adapters.md``).

        Example:
            >>> import asyncio
            >>> from inference.fake_provider import FakeProvider
            >>> async def main():
            ...     provider = FakeProvider()
            ...     await provider.load_adapter("style", "/adapters/style")
            ...     return provider.adapter_stats().get("style").loads
            >>> asyncio.run(main())
            1

        Returns:
            One :class:`~inference.adapters.stats.AdapterStats` per loaded adapter (evicted ones included),
            with the provider's totals.
        """
        return self._adapter_registry.stats()

    async def health(self, *, timeout: float = 5.0) -> ProviderHealth:
        """Whether the provider can serve now, backend by backend: up, latency, models and adapters.

        A server provider asks each server (each replica) ``GET /models``, at once and without retries; an
        in-process provider says whether its model is loaded (it loads on first use: not loaded yet is up, a model
        file that does not exist is down) and which adapters are resident. Nothing is generated and no model is
        loaded. ``inference health`` prints it as a container probe.

        Example:
            >>> import asyncio
            >>> from inference.fake_provider import FakeProvider
            >>> health = asyncio.run(FakeProvider().health())
            >>> health.status, health.backends[0].up
            ('up', True)

        Args:
            timeout: Seconds to wait for each server's answer.

        Returns:
            The status (``"up"``: every backend up, ``"degraded"``: some, ``"down"``: none, or the provider is
            closed) and one :class:`~inference.health.BackendHealth` per backend. A backend that is down is reported,
            never raised.

        Raises:
            InvalidRequestError: ``timeout`` is not a positive number.
        """
        from inference.health import ProviderHealth

        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise InvalidRequestError(f"timeout must be a positive number of seconds, got {timeout!r}",
                                      provider=self.name)
        if self.closed:
            return ProviderHealth.of(self.name, (), error=f"this {type(self).__name__} is closed")
        return ProviderHealth.of(self.name, await self._health(float(timeout)))

    async def aclose(self) -> None:  # noqa: B027 - a no-op by default, on purpose
        """Free what the provider holds (connections, model weights). Safe to call twice."""

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` made the provider unusable (in-process providers free their model).

        HTTP providers stay usable after ``aclose`` (they open new connections), so they never report closed.
        ``get_provider`` replaces a cached provider that is closed with a new one.
        """
        return self._closed

    def _check_open(self) -> None:
        """Refuse a call to a provider that :meth:`aclose` made unusable (:attr:`closed`)."""
        if self.closed:
            raise ProviderError(
                f"this {type(self).__name__} is closed: create a new one (or call get_provider again)",
                provider=self.name,
            )

    async def __aenter__(self: _ProviderT) -> _ProviderT:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

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
        """The checked result of a validated request: its ``n`` completions where the backend makes them
        (``options["n"]`` is :class:`~inference.options.ByRequests`: ``n`` requests of one completion, at once)."""
        await self._check_before_sending(request)
        if request.n > 1 and isinstance(type(self).options.get("n"), ByRequests):
            from inference._core.batches import all_or_none

            seeds = [None if request.seed is None else request.seed + index for index in range(request.n)]
            ones = [dataclasses.replace(request, n=1, seed=seed) for seed in seeds]
            return GenerationResult.from_choices(await all_or_none([self._generate_one(one) for one in ones]))
        return await self._generate_one(request)

    async def _generate_one(self, request: GenerationRequest) -> GenerationResult:
        async with self._request_in_use(request) as sent:
            return self._checked_result(request, await self._generate(sent))

    async def _check_before_sending(self, request: GenerationRequest) -> None:
        """What needs the backend's vocabulary: a :class:`~inference.tokens.TokenIds` prompt, ``logit_bias`` ids
        (where the provider has its tokenizer at hand, ``supports_tokenize``)."""
        await self._check_token_prompt(request)
        if request.logit_bias and self.supports_tokenize:
            vocabulary = await self._vocabulary_of(request.model)
            ids = tuple(request.logit_bias)
            check_token_limits(ids, vocabulary, provider=self.name, name="logit_bias", max_length=len(ids))

    def _checked_result(self, request: GenerationRequest, result: GenerationResult) -> GenerationResult:
        """``result`` as the caller receives it: each choice finished (an engine error or abort is a
        :class:`ProviderError`, never a text), kept to the ``json_schema``, and under the adapter id asked for."""
        asked = _asked_adapter(request)
        if result.choices is None:
            return _as_asked(self._kept_to_schema(request, self._finished(result)), asked)
        choices = tuple(_as_asked(self._kept_to_schema(request, self._finished(one)), asked) for one in result.choices)
        return dataclasses.replace(_as_asked(result, asked), choices=choices)

    def _finished(self, result: GenerationResult) -> GenerationResult:
        """Refuse a result whose ``finish_reason`` says the backend did not finish it (``"abort"``, ``"error"``,
        anything not in :data:`~inference.results.FINISH_REASONS`)."""
        if result.finish_reason not in FINISH_REASONS:
            raise ProviderError(
                f"{type(self).__name__}'s backend ended the generation with finish_reason {result.finish_reason!r} "
                "(an engine error or an abort), not a finished text, so no result is returned: retry, and look at "
                "the backend's log if it happens again",
                provider=self.name,
            )
        return result

    async def _in_time(self, request: GenerationRequest, deadline: float | None, work: Awaitable[_ResultT]) -> _ResultT:
        """Await ``work``, cancelled at ``deadline`` (the event loop's time; ``None``: no limit) with a
        :class:`ProviderTimeoutError` naming the request's ``timeout``."""
        if deadline is None:
            return await work
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(work, max(deadline - loop.time(), 0.0))
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
        :class:`ProviderError`."""
        if request.json_schema is not None:
            from inference._core.json_schemas import check_answer

            check_answer(result.text, request.json_schema, result.finish_reason, provider=self.name)
        return result

    def _require_scoring(self, operation: str) -> None:
        if not self.supports_scoring:
            raise self._cannot(f"{operation} (log-likelihoods need the model's logits over the prompt)",
                               "supports_scoring")

    def _cannot(self, what: str, capability: str) -> UnsupportedOperationError:
        from inference.registry import providers_with  # the registry imports provider classes lazily

        able = ", ".join(providers_with(capability)) or "none"
        return UnsupportedOperationError(
            f"{type(self).__name__} cannot {what}; providers that can: {able} "
            f"(check the provider's {capability} attribute before calling)",
            provider=self.name,
        )

    def _adapter_path_argument(self, adapter_path: object) -> str:
        """``adapter_path`` as the backend receives it: checked, ``~`` expanded, written canonically."""
        text = os.fspath(adapter_path) if isinstance(adapter_path, (str, os.PathLike)) else None
        if not isinstance(text, str) or not text:
            raise InvalidRequestError(
                f"adapter_path must be a non-empty path (a string or os.PathLike), got {adapter_path!r}",
                provider=self.name,
            )
        problem = path_text_problem(text)
        if problem is not None:
            raise InvalidRequestError(
                f"adapter_path {text!r} {problem}: give the path of the adapter as the file system names it",
                provider=self.name,
            )
        return normalise_path(text)

    # Hooks for backends -------------------------------------------------------------------------------

    async def _health(self, timeout: float) -> Sequence[BackendHealth]:
        """One :class:`~inference.health.BackendHealth` per backend (the hook of :meth:`health`, which makes the
        status from them).

        This default: a provider with a ``base_url`` setting asks each of its URLs ``GET /models``
        (:func:`inference.health.probe_servers`: up, latency, models and adapters listed); any other one reports
        its model (the setting that names it; loaded or not, from :meth:`_model_loaded`) with the adapters resident.
        Override it to report what the provider knows better, e.g. a server provider with replicas: each replica's
        own state (marked down since when, its adapters placed), and a probe of those not known to be down. Report
        a backend that is down with its ``error``; never raise for it.
        """
        from inference.health import BackendHealth, probe_servers

        base_url = self._settings.get("base_url")
        if isinstance(base_url, str) and base_url:
            key = self._settings.get("api_key") or getattr(self, "_api_key", None)  # servers keep it apart
            return await probe_servers(self.name, base_url.split(","), api_key=key, timeout=timeout)
        from inference.registry import PROVIDERS

        spec = PROVIDERS.get(self.name)
        key = spec.model_setting if spec is not None else None
        setting = next((setting for setting in spec.settings if setting.key == key), None) if spec else None
        model = self._settings.get(key) if key else None
        loaded = self._model_loaded()
        error = None
        if setting is not None and not model:
            error = f"no model configured: give {setting.key}, or set {setting.env_var}"
        elif setting is not None and setting.kind == "path" and not loaded and not Path(str(model)).exists():
            error = f"the model file {model} does not exist"
        resident = tuple(sorted(entry.adapter_id for entry in self.adapter_stats().adapters
                                if entry.state == "resident"))
        return [BackendHealth(str(model or self.name), error is None, models=(str(model),) if model else (),
                              adapters=resident, model_loaded=loaded, error=error)]

    def _model_loaded(self) -> bool | None:
        """Whether the model is in memory now, for :meth:`health` (``None``: not a model this process loads)."""
        return None

    @abstractmethod
    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one validated request."""

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """Yield text pieces, then one result. This default yields the whole text of ``_generate`` at once."""
        result = await self._generate(request)
        if result.text:
            yield result.text
        yield result

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        """Score one validated request (providers with ``supports_scoring``)."""
        raise self._cannot("score", "supports_scoring")

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        """Score the whole ``request.continuation`` in windows (providers with ``supports_scoring``)."""
        raise self._cannot("score_rolling", "supports_scoring")

    async def _tokenize_text(self, text: str, model: str) -> Sequence[int]:
        """``text`` -> token ids, no special token added, special-token text read as those tokens
        (providers with ``supports_tokenize``; the rule of :mod:`inference._core.scoring`)."""
        raise self._cannot("tokenize text", "supports_tokenize")

    async def _detokenize_ids(self, request: TokenRequest) -> str:
        """``request.token_ids`` (checked against the vocabulary) -> text, special tokens written out."""
        raise self._cannot("detokenize token ids", "supports_tokenize")

    async def _token_vocabulary(self, model: str) -> TokenVocabulary:
        """The vocabulary of ``model`` (asked once per model name; the base class checks every id against it).

        Every provider with ``supports_tokenize``, ``supports_next_token_logprobs`` or ``supports_token_prompts``
        implements it.
        """
        raise self._cannot("describe its vocabulary", "supports_tokenize")

    async def _next_token_logprobs(self, requests: list[TokenRequest]) -> NDArray[np.float32]:
        """The next-token distributions of a batch of sequences (providers with ``supports_next_token_logprobs``).

        The contract, for backend implementers:

        - ``requests`` holds every sequence of the calls made at the same time on one event loop (the base class
          gathers ``next_token_logprobs`` and ``batch_next_token_logprobs`` calls until a pass of the loop adds
          none): run them in as few forward passes as the backend allows, splitting by its own batch limit.
        - Each request is checked: at least one id, every id below the vocabulary's ``size``, at most
          ``context_length`` ids. Its adapters are held loaded until this returns, and are named as the backend
          knows them: ``request.adapter_id`` (a replaced adapter's new weights are ``id@n``, see
          ``_versioned_adapter_name``), or ``request.adapter_scales`` with a scale each. Requests of different
          adapters may share a batch.
        - Return a 2-D ``numpy`` array of ``float32``, one row per request in order, each row the log-softmax of
          the logits after the request's last token (``size`` entries, normalized: ``logsumexp`` 0 within 1e-4).
          Never a truncated distribution.
        - A prefix cache, where the backend has one, is keyed by the adapters' backend names and scales (a
          replacement's new name never meets the old weights' entries) and dropped for an adapter when it is
          unloaded; it counts its hits in :meth:`_cache_stats` and forgets everything in :meth:`_clear_cache`.
          With it on and off, the rows are the same (1e-5).
        - Run the model on the provider's worker thread, never on the event loop. An
          ``InvalidRequestError`` raised here for a batch of several calls makes the base class run each call on
          its own, so the error reaches only its caller.
        """
        raise self._cannot("compute next-token distributions", "supports_next_token_logprobs")

    def _cache_stats(self) -> TokenCacheStats:
        """The prefix cache's counters (the default: no cache)."""
        return TokenCacheStats()

    def _clear_cache(self) -> None:  # noqa: B027 - no cache by default
        """Forget every cached prefix; calls made after it must not use one (it must not block the loop: a backend
        may mark its cache stale here and free it on its worker thread)."""

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Load the adapter into the backend under ``adapter_id`` (its backend name), from ``source``: a path, or
        weights kept in memory where ``loads_adapter_weights_in_memory``. The registry never calls it twice at once
        for one name, and calls it again with the same source to reload an evicted adapter."""
        raise self._unsupported("load_adapter")

    async def _unload_adapter(self, adapter_id: str) -> None:
        """Remove the adapter from the backend (on unload, and on eviction when nothing uses it)."""
        raise self._unsupported("unload_adapter")

    async def _list_adapters(self) -> list[str]:
        return self._adapter_registry.ids()

    async def _discover_adapter(self, adapter_id: str) -> str | Discovered | None:
        """Path of an adapter the backend holds without this object having loaded it (a :class:`Discovered` when
        it holds it under another name), else ``None``."""
        return None

    def _versioned_adapter_name(self, adapter_id: str, version: int) -> str:
        """The backend name of an adapter's ``version``-th weights after ``load_adapter(..., replace=True)``."""
        return default_versioned_name(adapter_id, version)

    def _adapter_weights_dir(self) -> str | None:
        """Where to write the temporary PEFT directories of :class:`~inference.AdapterWeights` (``None``: the
        system's temporary directory). A server that reads adapters from its own filesystem needs a shared one."""
        return None

    def _conversion_dir(self, adapter_path: str, cache_dir: Path) -> Path:
        """Where to keep what the adapter at ``adapter_path`` is converted to (a GGUF LoRA): ``cache_dir``, except
        for the private directory of :class:`~inference.AdapterWeights`, whose conversions are removed with it."""
        return self._adapter_weights.conversion_dir(adapter_path, cache_dir)

    def _remove_unused_adapter_weights(self) -> None:
        """Remove the weights and private directories no adapter uses any more (unloaded, replaced, failed to load,
        or the provider closed)."""
        self._adapter_weights.remove_unused(self._adapter_registry.paths())

    def _adapter_path(self, adapter_id: str) -> str | None:
        """The path ``adapter_id`` was loaded from (for backends that must load it again)."""
        return self._adapter_registry.path_of(adapter_id)

    def _request_in_use(self, request: _HeldT) -> contextlib.AbstractAsyncContextManager[_HeldT]:
        """Hold every adapter of ``request`` loaded while it runs; gives the request as the backend receives it."""
        return _RequestInUse(self, request)

    def _adapter_in_use(self, adapter_id: str | None) -> contextlib.AbstractAsyncContextManager[str | None]:
        """Hold ``adapter_id`` loaded for the duration of one request (nothing for the base model); gives the
        backend name to send the request under (the id itself until the adapter is replaced)."""
        if adapter_id is None:
            return contextlib.nullcontext()
        self._require_adapter_support("generate with an adapter_id")
        return self._adapter_registry.use(adapter_id)

    def _require_adapter_support(self, operation: str) -> None:
        if not self.supports_adapters:
            raise self._unsupported(operation)

    def _unsupported(self, operation: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(
            f"{type(self).__name__} does not support {operation}; "
            "check the provider's supports_adapters attribute before calling it",
            provider=self.name,
        )


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


_Sent = TypeVar("_Sent", GenerationRequest, ScoreRequest, TokenRequest)
_Answered = TypeVar("_Answered", GenerationResult, ScoreResult)


def _check_option_names(method: str, options: Mapping[str, Any]) -> None:
    """Refuse keyword arguments that are no option, as Python refuses an unexpected keyword argument."""
    known = GenerationOptions.names()
    for name in options:
        if name not in known or name in POSITIONAL_OPTIONS:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close and close[0] != name else ""
            raise TypeError(f"{method}() got an unexpected keyword argument {name!r}{hint}")


def _sent_as(request: _Sent, backend: str | None) -> _Sent:
    """The request as the backend receives it: under the adapter's backend name (its id until it is replaced)."""
    if backend is None or backend == request.adapter_id:
        return request
    return dataclasses.replace(request, adapter_id=backend)


class _RequestInUse(Generic[_HeldT]):
    """The adapters of one request held for its duration (a class, not a generator: a stream closed by the event
    loop's shutdown must not find its context manager already finalized)."""

    def __init__(self, provider: InferenceProvider, request: _HeldT) -> None:
        self.provider = provider
        self.request: _HeldT = request
        self.stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> _HeldT:
        request: _HeldT = self.request
        sent: _HeldT
        async with self.stack as stack:
            if not request.adapter_scales:
                backend = await stack.enter_async_context(self.provider._adapter_in_use(request.adapter_id))
                sent = _sent_as(request, backend)
            else:
                names = []
                for adapter_id, scale in request.adapter_scales:
                    backend = await stack.enter_async_context(self.provider._adapter_in_use(adapter_id))
                    names.append((backend or adapter_id, scale))
                sent = dataclasses.replace(request, adapter_scales=tuple(names))
            self.stack = stack.pop_all()
        return sent

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool | None:
        return await self.stack.__aexit__(exc_type, exc, traceback)


def _deadline(request: GenerationRequest) -> float | None:
    """When the call must end, in the event loop's time (``None``: no ``timeout``)."""
    return None if request.timeout is None else asyncio.get_running_loop().time() + request.timeout


def _asked_adapter(request: GenerationRequest) -> str | None:
    """The ``adapter_id`` a result reports: the id asked for, or the label of the adapters and their scales."""
    return adapters_label(request.adapter_scales) if request.adapter_scales else request.adapter_id


def _as_asked(result: _Answered, adapter_id: str | None) -> _Answered:
    """The result under the adapter id the caller asked for, whatever backend name served it."""
    if result.adapter_id == adapter_id:
        return result
    return dataclasses.replace(result, adapter_id=adapter_id)
