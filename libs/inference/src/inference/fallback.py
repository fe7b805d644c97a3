"""A provider that answers with the first of several providers that can: :class:`FallbackProvider`.

Each request goes to the providers in order and moves on to the next one when a provider fails in a way another
could get past; the result says which one answered (:attr:`~inference.GenerationResult.provider`), and
:meth:`FallbackProvider.stats` counts answers and fall-throughs per provider.

What falls through (the default of ``fallback_on``, :func:`falls_through`):

- the provider is down or slow: :class:`~inference.exceptions.ProviderUnavailableError`,
  :class:`~inference.exceptions.ProviderTimeoutError` (and any ``TimeoutError``), a
  :class:`~inference.exceptions.ProtocolError`, any other :class:`~inference.exceptions.ProviderError` that is
  not a 4xx answer (a closed provider, an engine failure), a
  :class:`~inference.exceptions.ModelLoadError`;
- a server's 5xx answer, and its 408 (request timeout) and 429 (too many requests);
- the provider cannot serve this request, where another may: an
  :class:`~inference.exceptions.UnsupportedOperationError` (an option or a tool conversation it refuses, scoring,
  adapter scales), an :class:`~inference.exceptions.AdapterNotFoundError` (it does not hold the adapter), a
  :class:`~inference.exceptions.ModelNotFoundError` (it does not serve the model), a
  :class:`~inference.exceptions.TokenLimitError` of ``kind`` ``"context"`` (the prompt does not fit its context, in
  process or as a server's 400, a :class:`~inference.exceptions.ServerTokenLimitError`: a hosted model beside a local
  one often has a longer one).

What never falls through: any other :class:`~inference.exceptions.InvalidRequestError` (the request is wrong for
every provider), any other 4xx answer, the other adapter errors, and anything that is not an SDK error (a bug is not
retried elsewhere). When every provider failed, the last error is raised (on Python 3.11+ with a note listing
each provider's error).

A stream falls back only before its first piece: once text has reached the caller, an error is raised as it is.
The ``timeout`` option bounds each provider's attempt, so that a provider too slow for it falls through to the next;
bound the whole call with ``asyncio.timeout``. A :class:`~inference.tokens.TokenIds` prompt goes only to the
providers that take token ids: give such a prompt only to providers of one model (ids are a model's own).

Example:
    >>> import asyncio
    >>> from inference.fake_provider import FakeProvider
    >>> async def main():
    ...     fallback = FallbackProvider([FakeProvider(), FakeProvider()], labels=["primary", "secondary"])
    ...     result = await fallback.generate("Hello", model="m", max_tokens=2)
    ...     return result.provider, fallback.stats()["primary"].answered
    >>> asyncio.run(main())
    ('primary', 1)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from inference._core.validation import AdapterChoice, GenerationRequest
from inference.exceptions import (
    AdapterNotFoundError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    ProviderError,
    TokenLimitError,
    UnsupportedOperationError,
)
from inference.messages import Prompt
from inference.options import GenerationOptions, OptionMap, Sent
from inference.provider import InferenceProvider
from inference.results import GenerationResult, ScoreResult, StreamEvent
from inference.tokens import TokenIds

if TYPE_CHECKING:
    import os

    from typing_extensions import Unpack

    from inference.adapters.stats import ProviderAdapterStats
    from inference.adapters.weights import AdapterWeights
    from inference.health import ProviderHealth
    from inference.options import RequestOptions

__all__ = ["FallbackProvider", "FallbackStats", "falls_through"]

logger = logging.getLogger("inference")
_T = TypeVar("_T")

_RETRIED_STATUSES = frozenset({408, 429})
"""4xx answers that say "not now" rather than "not this": another provider may answer."""


def falls_through(error: BaseException) -> bool:
    """True when ``error`` from one provider should move the request to the next (the rule in the module docstring).

    Example:
        >>> from inference.exceptions import InvalidRequestError, ProviderUnavailableError
        >>> falls_through(ProviderUnavailableError("down")), falls_through(InvalidRequestError("bad"))
        (True, False)
    """
    if isinstance(error, TokenLimitError) and error.kind == "context":
        return True  # a prompt too long for this provider's context: another may have a longer one
    if isinstance(error, InvalidRequestError):
        return False
    if isinstance(error, (UnsupportedOperationError, AdapterNotFoundError, ModelNotFoundError, ModelLoadError)):
        return True
    if isinstance(error, ProviderError):
        status = getattr(error, "status_code", None)
        return not (isinstance(status, int) and 400 <= status < 500 and status not in _RETRIED_STATUSES)
    return isinstance(error, TimeoutError)


@dataclass(frozen=True)
class FallbackStats:
    """What one provider of a :class:`FallbackProvider` did.

    Attributes:
        answered: Requests it answered.
        failed: Requests it failed in a way that moved them on (or that every provider failed).
        last_error: The last such error, as ``"TypeName: message"``; ``None`` if none.
    """

    answered: int = 0
    failed: int = 0
    last_error: str | None = None


class FallbackProvider(InferenceProvider):
    """Tries its providers in order; each request is answered by the first that can (see the module docstring).

    Generation (``generate``, ``stream``, ``generate_batch``) and scoring fall back. Adapter calls go to the
    providers that support adapters: ``load_adapter`` loads into each of them (it succeeds when one did; a
    provider that is down is skipped with a warning, any other error is raised after unloading what this call
    loaded), ``unload_adapter`` unloads from each that holds the id, and ``list_adapters`` lists what any holds.
    A request with an ``adapter_id`` goes only to providers that support adapters, and moves on from one that
    does not hold it. ``aclose`` closes every provider.

    Args:
        providers: The providers, first choice first. An entry may be a ``(provider, model)`` pair: that provider
            is then called with its own model name, whatever ``model`` the request gives (a hosted model and a
            local one rarely share a name).
        labels: How results and :meth:`stats` name each provider; default each provider's ``name``, with ``#N``
            (its position) added where names repeat.
        fallback_on: Decides whether an error moves a request on (default :func:`falls_through`).

    Raises:
        InvalidRequestError: No providers, a label given twice, or as many labels as providers not given.

    Capabilities (``supports_adapters``, ``supports_scoring``, ``supports_logprobs``, ``supports_json_schema``,
    ``supports_tools``, ``supports_adapter_scales``) are true when any of its providers' is. Every option is
    declared sent: each provider receives it and refuses what it cannot, which moves the request on.
    """

    name = "fallback"
    options: ClassVar[OptionMap] = {
        option: Sent("each provider in turn", "a provider that refuses it is passed over for the next")
        for option in GenerationOptions.names()
    }

    def __init__(
        self,
        providers: Sequence[InferenceProvider | tuple[InferenceProvider, str]],
        *,
        labels: Sequence[str] | None = None,
        fallback_on: Callable[[BaseException], bool] = falls_through,
    ) -> None:
        entries = [entry if isinstance(entry, tuple) else (entry, None) for entry in providers]
        if not entries or not all(isinstance(provider, InferenceProvider) for provider, _ in entries):
            raise InvalidRequestError(
                "FallbackProvider needs a list of providers (or (provider, model) pairs), first choice first",
                provider=self.name,
            )
        self.providers: tuple[InferenceProvider, ...] = tuple(provider for provider, _ in entries)
        self._models: tuple[str | None, ...] = tuple(model for _, model in entries)
        self.labels: tuple[str, ...] = tuple(labels) if labels is not None else _default_labels(self.providers)
        if len(self.labels) != len(self.providers) or len(set(self.labels)) != len(self.labels):
            raise InvalidRequestError(
                f"labels must name each of the {len(self.providers)} providers once, got {list(self.labels)}",
                provider=self.name,
            )
        self._fallback_on = fallback_on
        self._stats = {label: FallbackStats() for label in self.labels}
        for capability in (
            "supports_adapters",
            "supports_scoring",
            "supports_logprobs",
            "supports_json_schema",
            "supports_tools",
            "supports_adapter_scales",
            "supports_token_prompts",
        ):  # per instance: what this list of providers can do
            setattr(self, capability, any(getattr(provider, capability) for provider in self.providers))

    def __repr__(self) -> str:
        return f"FallbackProvider({list(self.labels)})"

    def stats(self) -> dict[str, FallbackStats]:
        """Per provider label, how many requests it answered and failed (and its last error)."""
        return dict(self._stats)

    # Generation -------------------------------------------------------------------------------------------------

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
        """Generate with the first provider that answers (see :meth:`InferenceProvider.generate`).

        Returns:
            The answering provider's result, with :attr:`~inference.GenerationResult.provider` set to its label.
        """
        self._check(locals())
        positional = (max_tokens, system_prompt, temperature, top_p, repetition_penalty)

        async def attempt(index: int) -> GenerationResult:
            provider = self.providers[index]
            model_name = self._models[index] or model
            return await provider.generate(prompt, model_name, adapter_id, *positional, **options)

        index, result = await self._first(self._candidates(adapter_id, prompt=prompt), attempt, "generate")
        return dataclasses.replace(result, provider=self.labels[index])

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
        """Stream from the first provider that starts answering; it falls back only before the first piece."""
        self._check(locals())
        positional = (max_tokens, system_prompt, temperature, top_p, repetition_penalty)
        errors: list[tuple[int, BaseException]] = []
        for index in self._candidates(adapter_id, prompt=prompt):
            provider, label = self.providers[index], self.labels[index]
            events = provider.stream(prompt, self._models[index] or model, adapter_id, *positional, **options)
            try:
                try:
                    first = await events.__anext__()
                except StopAsyncIteration:
                    return
                except Exception as error:
                    if not self._fallback_on(error):
                        raise
                    self._failed(index, error, "stream")
                    errors.append((index, error))
                    continue
                self._answered(label)
                yield _labelled(first, label)
                async for event in events:
                    yield _labelled(event, label)
                return
            finally:
                await events.aclose()
        raise self._all_failed(errors, "stream")

    # generate_batch is InferenceProvider's: it calls self.generate for each prompt.

    # Scoring ----------------------------------------------------------------------------------------------------

    async def score(
        self, context: str, continuation: str, model: str, adapter_id: str | None = None
    ) -> ScoreResult:
        """Score with the first provider that can (see :meth:`InferenceProvider.score`)."""
        _, result = await self._first(
            self._candidates(adapter_id, "supports_scoring"),
            lambda index: self.providers[index].score(context, continuation, self._models[index] or model, adapter_id),
            "score",
        )
        return result

    async def score_rolling(self, text: str, model: str, adapter_id: str | None = None) -> ScoreResult:
        """Score all of ``text`` with the first provider that can (see :meth:`InferenceProvider.score_rolling`)."""
        _, result = await self._first(
            self._candidates(adapter_id, "supports_scoring"),
            lambda index: self.providers[index].score_rolling(text, self._models[index] or model, adapter_id),
            "score_rolling",
        )
        return result

    async def _score(self, request: Any) -> ScoreResult:  # score_batch calls self.score, never this
        raise AssertionError("FallbackProvider scores through its providers' score()")

    async def _generate(self, request: GenerationRequest) -> GenerationResult:  # generate is overridden
        raise AssertionError("FallbackProvider generates through its providers' generate()")

    # Adapters ---------------------------------------------------------------------------------------------------

    async def load_adapter(
        self,
        adapter_id: str,
        adapter_path: str | os.PathLike[str] | AdapterWeights,
        *,
        replace: bool = False,
        pin: bool = False,
    ) -> None:
        """Load the adapter into every provider that supports adapters (see the class docstring)."""
        holders = self._with("supports_adapters", operation="load adapters")
        loaded: list[int] = []
        errors: list[tuple[int, BaseException]] = []
        for index in holders:
            try:
                await self.providers[index].load_adapter(adapter_id, adapter_path, replace=replace, pin=pin)
            except Exception as error:
                if isinstance(error, (InvalidRequestError, UnsupportedOperationError)) or not self._fallback_on(error):
                    for done in loaded:  # leave no provider half-loaded by this call
                        await _quietly(self.providers[done].unload_adapter(adapter_id))
                    raise
                self._failed(index, error, f"load_adapter({adapter_id!r})")
                errors.append((index, error))
                continue
            loaded.append(index)
        if not loaded:
            raise self._all_failed(errors, f"load_adapter({adapter_id!r})")

    async def unload_adapter(self, adapter_id: str) -> None:
        """Unload the adapter from every provider that holds it.

        Raises:
            AdapterNotFoundError: No provider holds it.
        """
        unloaded = False
        first_error: Exception | None = None
        for index in self._with("supports_adapters", operation="unload adapters"):
            try:
                await self.providers[index].unload_adapter(adapter_id)
                unloaded = True
            except AdapterNotFoundError as error:
                first_error = first_error or error
        if not unloaded:
            assert first_error is not None
            raise first_error

    async def list_adapters(self) -> list[str]:
        """The ids any adapter-capable provider holds, sorted (a provider that is down is skipped, logged)."""
        ids: set[str] = set()
        for index in self._with("supports_adapters", operation="list adapters"):
            try:
                ids.update(await self.providers[index].list_adapters())
            except Exception as error:
                if not self._fallback_on(error):
                    raise
                logger.warning("fallback: %s could not list its adapters: %s", self.labels[index], error)
        return sorted(ids)

    def adapter_stats(self) -> ProviderAdapterStats:
        """Refused: each provider keeps its own adapters' state, which one view cannot merge (an id may be resident on
        one and evicted on another).

        Raises:
            UnsupportedOperationError: Always; the message names ``providers[i].adapter_stats()``.
        """
        holders = [self.labels[index] for index in self._with("supports_adapters", operation="adapter stats")]
        raise UnsupportedOperationError(
            "FallbackProvider keeps no adapters of its own: ask each provider, fallback.providers[i].adapter_stats() "
            f"(those that load adapters: {', '.join(holders)})",
            provider=self.name,
        )

    async def health(self, *, timeout: float = 5.0) -> ProviderHealth:
        """Every provider's backends, each named after its label (``"primary: http://..."``): up when all are,
        degraded when some are (requests fall through to them), down when none is."""
        from inference.health import BackendHealth, ProviderHealth

        reports = await asyncio.gather(*(provider.health(timeout=timeout) for provider in self.providers))
        backends = [
            dataclasses.replace(backend, name=f"{label}: {backend.name}")
            for label, report in zip(self.labels, reports, strict=True)
            for backend in report.backends or (BackendHealth(label, False, error=report.error),)
        ]
        return ProviderHealth.of(self.name, backends)

    async def aclose(self) -> None:
        """Close every provider (each is closed even when another's ``aclose`` fails; the first error is raised)."""
        outcomes = await asyncio.gather(*(provider.aclose() for provider in self.providers), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    # The rule ---------------------------------------------------------------------------------------------------

    def _check(self, arguments: dict[str, Any]) -> None:
        """Check the arguments once, for every provider (an invalid request is never tried anywhere)."""
        self._request("generate", arguments)

    def _candidates(self, adapter_id: object, capability: str | None = None, *, prompt: object = None) -> list[int]:
        """The providers a request may go to: those with ``capability``, with adapters when it names one, and
        taking token ids when ``prompt`` is a :class:`~inference.tokens.TokenIds`."""
        needed = [capability] if capability else []
        if adapter_id is not None:
            needed.append("supports_adapters")
        if isinstance(prompt, TokenIds):
            needed.append("supports_token_prompts")
        return self._with(*needed)

    def _with(self, *wanted: str, operation: str | None = None) -> list[int]:
        """The positions of the providers whose capabilities ``wanted`` are all true."""
        found = [
            index
            for index, provider in enumerate(self.providers)
            if all(getattr(provider, capability) for capability in wanted)
        ]
        if not found:
            what = operation or " and ".join(wanted)
            raise UnsupportedOperationError(
                f"none of this FallbackProvider's providers ({', '.join(self.labels)}) can {what} "
                f"({' and '.join(wanted)} is false for each)",
                provider=self.name,
            )
        return found

    async def _first(
        self, candidates: list[int], attempt: Callable[[int], Awaitable[_T]], operation: str
    ) -> tuple[int, _T]:
        errors: list[tuple[int, BaseException]] = []
        for index in candidates:
            try:
                result = await attempt(index)
            except Exception as error:
                if not self._fallback_on(error):
                    raise
                self._failed(index, error, operation)
                errors.append((index, error))
                continue
            self._answered(self.labels[index])
            return index, result
        raise self._all_failed(errors, operation)

    def _answered(self, label: str) -> None:
        self._stats[label] = dataclasses.replace(self._stats[label], answered=self._stats[label].answered + 1)

    def _failed(self, index: int, error: BaseException, operation: str) -> None:
        label = self.labels[index]
        stats = self._stats[label]
        self._stats[label] = FallbackStats(stats.answered, stats.failed + 1, f"{type(error).__name__}: {error}")
        following = self.labels[index + 1 :]
        logger.warning(
            "fallback: %s failed %s (%s: %s)%s",
            label,
            operation,
            type(error).__name__,
            error,
            f"; trying {following[0]}" if following else "",
        )

    def _all_failed(self, errors: list[tuple[int, BaseException]], operation: str) -> BaseException:
        last = errors[-1][1]
        if len(errors) > 1 and hasattr(last, "add_note"):
            tried = "; ".join(f"{self.labels[index]}: {type(error).__name__}: {error}" for index, error in errors)
            last.add_note(f"every provider of the FallbackProvider failed {operation}: {tried}")
        return last


def _default_labels(providers: Sequence[InferenceProvider]) -> tuple[str, ...]:
    names = [provider.name for provider in providers]
    return tuple(name if names.count(name) == 1 else f"{name}#{index}" for index, name in enumerate(names))


def _labelled(event: StreamEvent, label: str) -> StreamEvent:
    return event if isinstance(event, str) else dataclasses.replace(event, provider=label)


async def _quietly(awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except Exception as error:  # a roll-back's failure must not hide the error that caused it
        logger.warning("fallback: rolling back a load failed: %s", error)
