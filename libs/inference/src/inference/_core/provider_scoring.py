"""Scoring every provider offers where its backend can: log-likelihoods of given text, one pair, rolling, a batch.

:class:`ScoringProvider` is the third part of :class:`~inference.provider.InferenceProvider`: the public ``score``,
``score_rolling`` and ``score_batch`` check their arguments once for every provider and hold the adapter while the
backend's hook (``_score``, ``_score_rolling``) runs; ``_run_all`` runs any batch (``generate_batch`` too) by the
batch policies of :mod:`inference._core.batches`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from inference._core.provider_base import _as_asked, _sent_as
from inference._core.provider_tokens import TokenLevelProvider
from inference._core.telemetry import observe
from inference._core.validation import ScoreRequest
from inference.exceptions import InvalidRequestError
from inference.results import ScoreItem, ScoreResult

if TYPE_CHECKING:
    from inference._core.batches import OnError

__all__ = ["ScoringProvider"]

_ItemT = TypeVar("_ItemT")
_ResultT = TypeVar("_ResultT")


class ScoringProvider(TokenLevelProvider):
    """Log-likelihoods of given text (documented on :class:`~inference.provider.InferenceProvider`)."""

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
        return await self._scored("score", self._score, context, continuation, model, adapter_id)

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
        return await self._scored("score_rolling", self._score_rolling, "", text, model, adapter_id)

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

    async def _scored(
        self,
        operation: str,
        hook: Callable[[ScoreRequest], Awaitable[ScoreResult]],
        context: str,
        continuation: str,
        model: str,
        adapter_id: str | None,
    ) -> ScoreResult:
        """The one path of ``score`` and ``score_rolling``: the request checked and observed as ``operation``, the
        adapter held while the backend's ``hook`` (``_score`` or ``_score_rolling``) runs, the result under the
        adapter id asked for."""
        with observe(self.name, operation) as observed:
            request = ScoreRequest.checked(
                provider=self.name, context=context, continuation=continuation, model=model, adapter_id=adapter_id
            )
            observed.request(request.model, request.adapter_id)
            self._require_scoring(operation)
            async with self._adapter_in_use(request.adapter_id) as backend:
                result = _as_asked(await hook(_sent_as(request, backend)), request.adapter_id)
            observed.scored(result.num_tokens)
            return result

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

    def _require_scoring(self, operation: str) -> None:
        if not self.supports_scoring:
            raise self._cannot(f"{operation} (log-likelihoods need the model's logits over the prompt)",
                               "supports_scoring")

    # Hooks for backends -------------------------------------------------------------------------------

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        """Score one validated request (providers with ``supports_scoring``)."""
        raise self._cannot("score", "supports_scoring")

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        """Score the whole ``request.continuation`` in windows (providers with ``supports_scoring``)."""
        raise self._cannot("score_rolling", "supports_scoring")
