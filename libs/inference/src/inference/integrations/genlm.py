"""genlm-control on any provider that can: :class:`AsyncInferenceLM`, a genlm-backend ``AsyncLM`` over a provider.

genlm-control does constrained generation by sequential Monte Carlo; genlm-backend's ``AsyncLM`` is the language
model under it (``AsyncTransformer``, ``AsyncVirtualLM``). :class:`AsyncInferenceLM` is one more ``AsyncLM``, whose
calls go to an :class:`~inference.InferenceProvider`, so ``PromptedLLM``, its samplers and potentials run on every
backend with ``supports_next_token_logprobs``, with the SDK's adapter lifecycle::

    from genlm.control import AWRS, BoolFSA, PromptedLLM
    from inference import get_provider
    from inference.integrations.genlm import AsyncInferenceLM

    provider = get_provider("transformers")
    await provider.load_adapter("math", "adapters/math")
    llm = PromptedLLM(await AsyncInferenceLM.create(provider, "tiny"), lora_name="math")
    llm.set_prompt_from_str("The answer is")
    fsa = BoolFSA.from_regex(r" [0-9]+").coerce(llm, f=b"".join)
    sequences = await AWRS(llm, fsa).smc(n_particles=8, ess_threshold=0.5, max_tokens=8)

What maps onto what:

- ``next_token_logprobs`` / ``batch_next_token_logprobs`` -> the provider's, as ``torch`` tensors (float32, on the
  CPU); concurrent calls are batched by the provider, and its prefix cache plays the part of genlm-backend's KV
  trie. ``lora_name`` is the provider's ``adapter_id`` (an id; or ``(id, scale)`` pairs where
  ``supports_adapter_scales``).
- ``*_sync`` -> the same calls through :func:`inference.sync.run_sync` (they work from a plain script and from
  inside a running event loop, as in Jupyter).
- ``add_new_lora(path, name)`` -> ``load_adapter(name, path, replace=True)`` (loading under a name again replaces its
  weights, as genlm-backend does), ``remove_lora(name)`` -> ``unload_adapter(name)``, ``clear_cache()`` ->
  ``clear_cache()``. Both adapter calls are synchronous, as in genlm-backend; from async code, await the provider's
  own ``load_adapter``/``unload_adapter`` instead (a synchronous call made on the loop that runs requests holding the
  adapter would wait for them while they wait for the loop).
- ``sample`` / ``batch_sample`` are genlm-backend's own (token by token over ``next_token_logprobs``: with a prefix
  cache, each step costs one token).
- ``byte_vocab`` is the provider's :attr:`~inference.tokens.TokenVocabulary.token_bytes`; ``tokenizer`` is the
  Hugging Face tokenizer you pass, or a small stand-in (:class:`VocabularyTokenizer`) over the provider's
  ``tokenize``/``detokenize``, which has what ``PromptedLLM`` and ``ByteLLM`` read (``encode`` with the BOS
  token where the model's tokenizer adds one, ``decode``, ``eos_token_id``, ``bos_token_id``). Potentials that
  read a Hugging Face tokenizer's internals (``CanonicalTokenization``: its BPE merges) need the real one: pass
  ``tokenizer=AutoTokenizer.from_pretrained(...)``.

Needs the extra ``genlm`` (``pip install 'inference-adapters[genlm]'``): genlm-backend and genlm-control, and torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from inference._core.dependencies import import_optional
from inference.exceptions import UnsupportedOperationError
from inference.provider import InferenceProvider
from inference.sync import run_sync
from inference.tokens import TokenVocabulary

_GENLM_IMPORT_VARIABLES = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V2_MODEL_RUNNER")
"""What importing genlm-backend writes into ``os.environ`` for its own in-process vLLM, even where vLLM is absent.

Left there, they reach every vLLM this process starts later (a server started with ``VLLM_USE_V2_MODEL_RUNNER=1``
on a CPU without Triton refuses to start): the import below puts them back as they were."""


def _import_genlm_backend() -> Any:
    before = {name: os.environ.get(name) for name in _GENLM_IMPORT_VARIABLES}
    try:
        return import_optional("genlm.backend.llm", provider="genlm", extra="genlm")
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_torch: Any = import_optional("torch", provider="genlm", extra="genlm")
_AsyncLM: Any = _import_genlm_backend().AsyncLM
_Token: Any = import_optional("genlm.backend.tokenization", provider="genlm", extra="genlm").Token

__all__ = ["AsyncInferenceLM", "VocabularyTokenizer"]


class AsyncInferenceLM(_AsyncLM):  # type: ignore[misc]
    """A genlm-backend ``AsyncLM`` whose calls go to an inference provider (see the module's documentation).

    Build it with :meth:`create` from async code (it asks the provider for its vocabulary on your event loop), or
    with the constructor from anywhere (it asks through :func:`~inference.sync.run_sync`).

    Args:
        provider: A provider with ``supports_next_token_logprobs`` and ``supports_tokenize``.
        model: The model name passed to every call (servers); in-process providers use their loaded model.
        tokenizer: A Hugging Face tokenizer of the same model, exposed as :attr:`tokenizer` (for potentials that
            read its internals); default a :class:`VocabularyTokenizer` over the provider.
        vocabulary: The provider's vocabulary, when you have it (else it is asked for).

    Attributes:
        provider: The provider.
        model: The model name.
        vocabulary: The provider's :class:`~inference.tokens.TokenVocabulary`.
        tokenizer: The tokenizer genlm reads (``encode``, ``eos_token_id``...).
        byte_vocab: One genlm ``Token`` (an id and its bytes) per vocabulary entry.
        str_vocab: Each entry's text (UTF-8, broken bytes replaced).

    Raises:
        UnsupportedOperationError: The provider cannot give next-token distributions or tokenize.
    """

    def __init__(
        self,
        provider: InferenceProvider,
        model: str = "",
        *,
        tokenizer: Any = None,
        vocabulary: TokenVocabulary | None = None,
    ) -> None:
        for capability in ("supports_next_token_logprobs", "supports_tokenize"):
            if not getattr(provider, capability):
                raise _unsupported(provider, capability)
        self.provider = provider
        self.model = model
        self.vocabulary = vocabulary if vocabulary is not None else run_sync(provider.token_vocabulary(model))
        self.tokenizer = tokenizer if tokenizer is not None else VocabularyTokenizer(provider, model, self.vocabulary)
        self.byte_vocab = [_Token(token_id, bytes(text)) for token_id, text in enumerate(self.vocabulary.token_bytes)]
        self.str_vocab = [text.decode("utf-8", errors="replace") for text in self.vocabulary.token_bytes]
        self._batch_queue: list[Any] = []  # genlm-backend's own batching state, unused here (the provider batches)
        self._batch_armed = False

    @classmethod
    async def create(cls, provider: InferenceProvider, model: str = "", *, tokenizer: Any = None) -> AsyncInferenceLM:
        """Build it from async code: the vocabulary is asked for on the running loop."""
        if not provider.supports_tokenize:
            raise _unsupported(provider, "supports_tokenize")
        vocabulary = await provider.token_vocabulary(model)
        return cls(provider, model, tokenizer=tokenizer, vocabulary=vocabulary)

    async def next_token_logprobs(self, token_ids: Sequence[int], lora_name: Any = None) -> Any:
        """The next-token log-probabilities after ``token_ids``: a 1-D float32 ``torch.Tensor`` over the vocabulary.

        Args:
            token_ids: The sequence (not empty, as in genlm-backend).
            lora_name: A loaded adapter's id (the provider's ``adapter_id``), or ``None`` for the base model.
        """
        row = await self.provider.next_token_logprobs(token_ids, self.model, adapter_id=lora_name)
        return _torch.from_numpy(row)

    def next_token_logprobs_sync(self, token_ids: Sequence[int], lora_name: Any = None) -> Any:
        """:meth:`next_token_logprobs` from synchronous code."""
        row = run_sync(self.provider.next_token_logprobs(token_ids, self.model, adapter_id=lora_name))
        return _torch.from_numpy(row)

    async def batch_next_token_logprobs(self, token_ids_list: Sequence[Sequence[int]], lora_name: Any = None) -> Any:
        """One row per sequence: a 2-D float32 ``torch.Tensor`` (the sequences run as one batch)."""
        rows = await self.provider.batch_next_token_logprobs(token_ids_list, self.model, adapter_id=lora_name)
        return _torch.from_numpy(rows)

    def batch_next_token_logprobs_sync(self, token_ids_list: Sequence[Sequence[int]], lora_name: Any = None) -> Any:
        """:meth:`batch_next_token_logprobs` from synchronous code."""
        rows = run_sync(self.provider.batch_next_token_logprobs(token_ids_list, self.model, adapter_id=lora_name))
        return _torch.from_numpy(rows)

    def clear_cache(self) -> None:
        """Forget the provider's cached prefixes (:meth:`~inference.InferenceProvider.clear_cache`)."""
        self.provider.clear_cache()

    def add_new_lora(self, lora_path: str, lora_name: str = "lora_1") -> None:
        """Load the adapter at ``lora_path`` under ``lora_name`` (again: replace its weights); select it per call
        with ``lora_name=``. Synchronous, as in genlm-backend."""
        run_sync(self.provider.load_adapter(lora_name, lora_path, replace=True))

    def remove_lora(self, lora_name: str) -> None:
        """Unload ``lora_name`` (after the calls that use it)."""
        run_sync(self.provider.unload_adapter(lora_name))

    def __repr__(self) -> str:
        return f"AsyncInferenceLM({self.provider!r}, model={self.model!r})"


class VocabularyTokenizer:
    """The tokenizer :class:`AsyncInferenceLM` exposes when no Hugging Face tokenizer is given: what genlm-control
    reads of one, over the provider's ``tokenize``/``detokenize`` (through :func:`~inference.sync.run_sync`).

    Args:
        provider: The provider.
        model: The model name.
        vocabulary: The provider's vocabulary.
    """

    is_fast = False

    def __init__(self, provider: InferenceProvider, model: str, vocabulary: TokenVocabulary) -> None:
        self.provider = provider
        self.model = model
        self.vocabulary = vocabulary
        self.name_or_path = f"{provider.name}:{model}"
        self.bos_token_id = vocabulary.bos_id
        self.eos_token_id = vocabulary.eos_id
        self.pad_token_id: int | None = None
        self.all_special_ids = sorted(vocabulary.special_ids)
        self.vocab_size = vocabulary.size

    def _text(self, token_id: int | None) -> str | None:
        if token_id is None:
            return None
        return self.vocabulary.token_bytes[token_id].decode("utf-8", errors="replace")

    @property
    def bos_token(self) -> str | None:
        """The BOS token's text."""
        return self._text(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        """The EOS token's text."""
        return self._text(self.eos_token_id)

    def __len__(self) -> int:
        return self.vocabulary.size

    def encode(self, text: str, add_special_tokens: bool = True, **_: Any) -> list[int]:
        """Token ids of ``text``, with the BOS token first where the model's tokenizer adds one (and
        ``add_special_tokens``), as a Hugging Face tokenizer's ``encode``."""
        ids = run_sync(self.provider.tokenize(text, self.model))
        if add_special_tokens and self.vocabulary.adds_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def __call__(self, text: str, add_special_tokens: bool = True, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        """The text of ``token_ids`` (without the special tokens when ``skip_special_tokens``)."""
        ids = [int(token) for token in token_ids]
        if skip_special_tokens:
            ids = [token for token in ids if token not in self.vocabulary.special_ids]
        return run_sync(self.provider.detokenize(ids, self.model))

    def convert_ids_to_tokens(self, token_ids: int | Sequence[int]) -> str | list[str]:
        """Each id's text."""
        if isinstance(token_ids, int):
            return self._text(token_ids) or ""
        return [self._text(token) or "" for token in token_ids]


def _unsupported(provider: InferenceProvider, capability: str) -> UnsupportedOperationError:
    return provider._cannot(f"serve genlm-control ({capability} is false)", capability)
