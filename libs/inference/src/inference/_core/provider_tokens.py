"""The token level every provider offers where its backend can: token ids in and out, full next-token
distributions (gathered into batches), the prefix cache's counters.

:class:`TokenLevelProvider` is the second part of :class:`~inference.provider.InferenceProvider`: the public
``tokenize``, ``detokenize``, ``token_vocabulary``, ``next_token_logprobs``, ``batch_next_token_logprobs``,
``cache_stats`` and ``clear_cache`` check their arguments once for every provider, and the hooks a backend overrides
(``_tokenize_text``, ``_token_vocabulary``, ``_next_token_logprobs``...) refuse by default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

from inference._core.provider_base import ProviderBase
from inference._core.validation import (
    AdapterChoice,
    GenerationRequest,
    TokenRequest,
    check_token_limits,
    checked_model,
    checked_text,
    split_adapter_choice,
)
from inference.exceptions import InvalidRequestError, UnsupportedOperationError
from inference.tokens import TokenCacheStats, TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from inference._core.token_batching import TokenBatcher

__all__ = ["TokenLevelProvider"]


class TokenLevelProvider(ProviderBase):
    """Token ids and next-token distributions (documented on :class:`~inference.provider.InferenceProvider`)."""

    _distribution_generates_a_token: ClassVar[bool] = False
    """The backend reads a next-token distribution by generating one token (a server's one-token completion), so a
    sequence needs room for it: at most ``context_length - 1`` ids."""

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
        request = TokenRequest.checked(provider=self.name, token_ids=token_ids, model=model, allow_empty=True)
        if not request.token_ids:
            return ""  # no ids, whatever iterable held them
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
        room = vocabulary.context_length - (1 if self._distribution_generates_a_token else 0)
        for index, request in enumerate(requests):
            check_token_limits(request.token_ids, vocabulary, provider=self.name, name=name(index), max_length=room)
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
        try:
            vocabulary = await self._vocabulary_of(request.model)
        except UnsupportedOperationError:
            return  # a server whose vocabulary cannot be read here (vLLM's model files elsewhere) checks the ids
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

    # Hooks for backends -------------------------------------------------------------------------------

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
          ``context_length`` ids (``context_length - 1`` where :attr:`_distribution_generates_a_token`). Its
          adapters are held loaded until this returns, and are named as the backend knows them:
          ``request.adapter_id`` (a replaced adapter's new weights are ``id@n``, see ``_versioned_adapter_name``),
          or ``request.adapter_scales`` with a scale each. Requests of different adapters may share a batch.
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

    def _clear_cache(self) -> None:
        """Forget every cached prefix; calls made after it must not use one (it must not block the loop: a backend
        may mark its cache stale here and free it on its worker thread)."""
