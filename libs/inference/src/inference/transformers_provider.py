"""Transformers + PEFT in process, with concurrent requests for different adapters batched together.

``set_adapter`` is global model state, so serving each request with its own ``set_adapter`` races as soon
as two requests for different adapters overlap. This provider never switches the active adapter for a
request: concurrent ``generate`` calls are collected into batches (see :mod:`inference._inprocess.batching`)
and each batch runs as ONE ``model.generate`` with PEFT's per-row ``adapter_names`` (``"__base__"`` for the
base model), left-padded. Everything that touches the model (load, adapters, batches) runs on the worker
thread of :class:`~inference._inprocess.base.InProcessProvider`, in order, so the event loop never blocks
and adapters never change under a running batch.

A streamed request is not batched: it runs as its own one-row ``generate`` whose stopping criterion hands
each new token's text to the event loop. Every request carries a cancel flag that is set when its caller
gives up (a cancelled ``generate``, a stream closed early); a stopping criterion checks it per row after
every token, so a cancelled row stops within one token while the other rows of its batch go on unchanged.

The provider is assembled from parts, each with one job (all in :mod:`inference._inprocess`):

- ``hf_model``: loading the model (device, dtype, tokenizer, what generation and scoring read from it);
- ``peft_slots``: the adapters in the PEFT model (slots, spare slots, weighted combinations, what a row applies);
  which adapters the user loaded (ids, paths, pins, LRU order) is the base class's registry;
- ``hf_generation``: batch rows, sampling, logprobs, JSON-schema masks, the stream watch;
- ``hf_scoring``: ``score`` and ``score_rolling`` in batched forward passes;
- ``batching``: the queue that both generation requests and score calls wait in.

torch, transformers and peft are imported on first use only.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from inference._core.validation import AdapterScales, GenerationRequest, ScoreRequest, TokenRequest
from inference._inprocess import hf_tokens
from inference._inprocess.base import InProcessProvider
from inference._inprocess.batching import BatchQueue, PendingRequest
from inference._inprocess.hf_generation import HFGeneration, Outputs, Row, check_seed
from inference._inprocess.hf_model import (
    LoadedModel,
    free_weights,
    load_model,
    loaded_model,
    model_name_problem,
)
from inference._inprocess.hf_prefix_cache import PrefixCache
from inference._inprocess.hf_prompt import model_chat_template
from inference._inprocess.hf_scoring import PASSES_PER_BATCH, HFScoring, ScoreCall
from inference._inprocess.options import IN_PROCESS_OPTIONS
from inference._inprocess.peft_slots import PeftSlots
from inference._inprocess.streaming import PieceSink, stream_from_worker
from inference.adapters.source import AdapterSource
from inference.exceptions import ConfigurationError
from inference.options import OptionMap, Sent
from inference.provider import GenerationResult, StreamEvent
from inference.results import ScoreResult
from inference.tokens import TokenCacheStats, TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["TransformersProvider"]

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


class TransformersProvider(InProcessProvider[str]):
    """A local Hugging Face model (directory or GGUF file) with PEFT LoRA adapters and mixed-adapter batching.

    Args:
        model_name: A local model directory, a local ``.gguf`` file (dequantised by transformers), or a Hugging
            Face Hub id (``ORG/NAME``, from the local cache; fetched there unless ``HF_HUB_OFFLINE`` is set); else
            ``TRANSFORMERS_MODEL_NAME``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``; else ``TRANSFORMERS_DEVICE``; else cpu.
        torch_dtype: ``"auto"`` (float32 on CPU; bfloat16 on CUDA where supported, else float16),
            ``"float32"``, ``"float16"`` or ``"bfloat16"``; else ``TRANSFORMERS_TORCH_DTYPE``.
        max_batch_size: The most requests in one batch; else ``TRANSFORMERS_MAX_BATCH_SIZE``; else 32.
        batch_window_ms: How long a waiting request waits for others to join its batch; else
            ``TRANSFORMERS_BATCH_WINDOW_MS``; else 5.
        max_adapters: Most adapters kept in the PEFT model at once; else ``TRANSFORMERS_MAX_ADAPTERS``; else
            unlimited. Beyond it the least recently used adapter (not pinned, not in use) is deleted from
            the model, and loaded again from its path when a request needs it.
        model_kwargs: More keywords for ``AutoModelForCausalLM.from_pretrained`` (``device_map="auto"``,
            ``attn_implementation``, ``quantization_config``, ``trust_remote_code``, ``revision``...), winning over
            the provider's own (``dtype``); ``trust_remote_code``, ``revision``, ``token``, ``cache_dir`` and
            ``subfolder`` go to the tokenizer too. With a ``device_map`` the model stays where accelerate puts it.
        model: A model already loaded (a ``transformers`` causal LM), used as it is, on its own device, instead of
            loading ``model_name``; give its ``tokenizer`` with it. The provider puts PEFT adapters into it.
        tokenizer: The tokenizer of ``model``.
        prefix_cache_tokens: How many tokens of keys and values ``next_token_logprobs`` keeps, so that a sequence
            extending one computed before (same adapter weights) runs only its new tokens; else
            ``TRANSFORMERS_PREFIX_CACHE_TOKENS``; else 0, off: sequences then run whole, in batches. With the
            cache the sequences of one call run together too, in forward passes over only their new tokens after
            their cached prefixes (mixed adapters, as without it): an SMC step of 32 particles is one pass over 32
            tokens. Memory: at most this many tokens' keys and values (the cached rows count against it).
        spare_adapter_slots: How many adapter slots an unload keeps in the model, emptied, for the next adapter
            of the same LoRA shape (same config: rank, alpha, target modules...), which is then loaded by copying
            its weights in instead of PEFT building and removing LoRA layers (on the tiny test model 4 ms instead
            of 16 ms to load, 0.3 ms instead of 3.6 ms to unload); else ``TRANSFORMERS_SPARE_ADAPTER_SLOTS``;
            else 8. They hold memory (each one adapter's weights) until reused or the provider closes; 0 makes
            every unload free its adapter at once, and the last one restore the plain model.

    The model loads on first use, on the worker thread. Greedy output of a request is the same whether it
    runs alone or in a batch. Sampled requests with a ``seed`` run in a batch of their own, so the seed
    reproduces their output.

    Example:
        >>> async def main():  # doctest: +SKIP
        ...     async with TransformersProvider(model_name="/models/qwen2-0.5b") as provider:
        ...         await provider.load_adapter("style", "/adapters/style")
        ...         return await asyncio.gather(
        ...             provider.generate("Hi", model="", adapter_id="style", temperature=0),
        ...             provider.generate("Hi", model="", temperature=0),  # same batch, base model
        ...         )

    Raises:
        ConfigurationError: A setting is malformed (device, dtype, batch size, window).
    """

    name = "transformers"
    options: ClassVar[OptionMap] = {
        **IN_PROCESS_OPTIONS,  # system_prompt (chat template), json_schema (llguidance), tools refused
        "max_tokens": Sent("GenerationConfig.max_new_tokens", "and a per-row limit in the batch"),
        "temperature": Sent("GenerationConfig.temperature"),
        "top_p": Sent("GenerationConfig.top_p"),
        "repetition_penalty": Sent("GenerationConfig.repetition_penalty"),
        "stop": Sent("stop", "stop strings, matched on the decoded text"),
        "seed": Sent("torch.manual_seed", "a seeded request runs in a batch of its own"),
        "top_k": Sent("GenerationConfig.top_k"),
        "logprobs": Sent("logits processor", "log-softmax of the raw logits"),
        "n": Sent(
            "n rows of one prompt",
            "the prompt computed once (its keys and values repeated per row), the n rows in one generate; seeded, "
            "row k samples with its own generator seeded seed + k (the choices of n requests with those seeds)",
        ),
        "presence_penalty": Sent("logits processor", "OpenAI's meaning over the generated tokens, as llama.cpp's"),
        "frequency_penalty": Sent("logits processor", "OpenAI's meaning over the generated tokens, as llama.cpp's"),
        "min_p": Sent("GenerationConfig.min_p", "when sampling"),
        "logit_bias": Sent("logits processor", "added to the raw logits"),
        "raw_prompt": Sent("prompt text", "tokenized as it is, with the special tokens the tokenizer adds"),
        "chat_template": Sent("apply_chat_template(chat_template=...)", "instead of the model's template"),
        "chat_template_kwargs": Sent("apply_chat_template(**kwargs)", "the chat template's variables"),
        "return_token_ids": Sent("token_ids", "the ids that make the text: no end token, no cut stop string"),
    }
    batches_mixed_adapters = True
    supports_scoring = True
    supports_adapter_scales = True
    loads_adapter_weights_in_memory = True
    supports_tokenize = True
    supports_next_token_logprobs = True
    supports_token_prompts = True
    loads_hub_ids = True
    _model_path_problem = staticmethod(model_name_problem)  # a model directory, a .gguf file, a Hub id

    def __init__(
        self,
        model_name: str | None = None,
        device: str | None = None,
        torch_dtype: str | None = None,
        max_batch_size: int | None = None,
        batch_window_ms: float | None = None,
        max_adapters: int | None = None,
        spare_adapter_slots: int | None = None,
        prefix_cache_tokens: int | None = None,
        *,
        model_kwargs: Mapping[str, Any] | None = None,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        super().__init__(locals())  # settings resolved and checked, max_adapters among them
        if (model is None) != (tokenizer is None):
            raise ConfigurationError(
                "give model= and tokenizer= together (a loaded model and its tokenizer), or neither", provider=self.name
            )
        self._given = None if model is None else (model, tokenizer)
        self.model_kwargs: dict[str, Any] = dict(model_kwargs or {})
        settings = self._settings
        self.model_name: str = str(settings["model_name"])
        self.device: str = str(settings["device"]).strip().lower()
        self.torch_dtype: str = str(settings["torch_dtype"]).strip().lower()
        size, window = settings["max_batch_size"], settings["batch_window_ms"]  # checked by their settings' rules
        self.max_batch_size: int = size
        self.batch_window_ms: float = float(window)
        self.spare_adapter_slots: int = int(settings["spare_adapter_slots"])
        self._queue: BatchQueue[GenerationRequest, GenerationResult] = BatchQueue(size, self.batch_window_ms / 1000.0)
        self._score_queue: BatchQueue[ScoreCall, ScoreResult] = BatchQueue(size, self.batch_window_ms / 1000.0)
        self._loaded: LoadedModel | None = None  # loaded on first use, on the worker
        self._batch_sizes: deque[int] = deque(maxlen=1000)
        # The parts (worker side): the adapters in the model (self._resident, id -> PEFT name), generation, scoring.
        self._slots = PeftSlots(self._resident, spare_limit=self.spare_adapter_slots, provider=self.name)
        self._generation = HFGeneration(self._slots, self._batch_sizes, provider=self.name)
        self._scoring = HFScoring(self._slots, size, self._batch_sizes, provider=self.name)
        self._prefix_cache = PrefixCache(int(settings["prefix_cache_tokens"]), bound_memory=True)

    def __repr__(self) -> str:
        return (
            f"TransformersProvider(model_name={self.model_name!r}, device={self.device!r}, "
            f"torch_dtype={self.torch_dtype!r}, max_batch_size={self.max_batch_size}, "
            f"batch_window_ms={self.batch_window_ms:g}, max_adapters={self.max_adapters}, "
            f"adapters={sorted(self._adapter_registry.ids())})"
        )

    @property
    def model(self) -> Any:
        """The loaded torch model (a ``peft.PeftModel`` while adapters are loaded), or ``None`` before first use."""
        return None if self._loaded is None else self._loaded.model

    def _model_loaded(self) -> bool:
        return self._loaded is not None or self._given is not None

    def _given_model_name(self) -> str | None:
        if self._given is None:
            return None
        model = self._given[0]
        return Path(self.model_name or str(getattr(model, "name_or_path", "") or type(model).__name__)).name

    @property
    def recent_batch_sizes(self) -> tuple[int, ...]:
        """Rows in each of the last (up to 1000) batches run, oldest first: one ``generate`` call per entry."""
        return tuple(self._batch_sizes)

    @property
    def peft_adapter_names(self) -> dict[str, str]:
        """The PEFT adapter name of each resident adapter id (the keys of ``model.peft_config`` are these names).

        PEFT refuses some adapter ids as names (``lr0.001``, ``train``), so the provider names each adapter
        itself, ``inference_N_adapter``. An unloaded adapter's slot may be kept, and refilled by a later adapter of
        the same LoRA shape (the name then serves that adapter).
        """
        return dict(self._resident)

    @property
    def _combined(self) -> Mapping[AdapterScales, str]:
        """The weighted adapter combinations in the model now, by adapter scales (the slots keep them)."""
        return self._slots.combinations

    # Hooks (event loop side) ----------------------------------------------------------------------------------

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self._check_request(request)
        return await self._through_queue(self._queue, request, self._serve)

    def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        self._check_request(request)
        return stream_from_worker(self._worker, self._stream_now, request)

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        self._check_open()
        return await self._through_queue(self._score_queue, ScoreCall(request, rolling=False), self._serve_scores)

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        self._check_open()
        return await self._through_queue(self._score_queue, ScoreCall(request, rolling=True), self._serve_scores)

    async def _model_chat_template(self) -> tuple[str, str | None]:
        self._check_open()
        loaded = await self._worker.run(self._ensure_loaded)
        return loaded.name, model_chat_template(loaded.tokenizer)

    async def _tokenize_text(self, text: str, model: str) -> list[int]:
        self._check_open()
        return await self._worker.run(self._tokenize_now, text)

    async def _detokenize_ids(self, request: TokenRequest) -> str:
        self._check_open()
        return await self._worker.run(self._detokenize_now, request.token_ids)

    async def _token_vocabulary(self, model: str) -> TokenVocabulary:
        self._check_open()
        return await self._worker.run(lambda: hf_tokens.vocabulary(self._ensure_loaded()))

    async def _next_token_logprobs(self, requests: list[TokenRequest]) -> NDArray[np.float32]:
        self._check_open()
        return await self._worker.run(self._next_token_rows_now, requests)

    def _cache_stats(self) -> TokenCacheStats:
        return self._prefix_cache.stats()  # off, it still counts the sequences and tokens computed

    def _clear_cache(self) -> None:
        self._prefix_cache.clear()

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Load into the PEFT model (first load, or again after an eviction)."""
        self._check_open()
        await self._worker.run(self._load_adapter_now, adapter_id, source)

    async def _unload_adapter(self, adapter_id: str) -> None:
        """Delete the adapter's weights from the PEFT model (on unload, and on eviction)."""
        self._check_open()
        await self._worker.run(self._unload_adapter_now, adapter_id)

    def _check_request(self, request: GenerationRequest) -> None:
        """Refuse what torch would fail on, before the request is queued: a seed outside its range."""
        super()._check_request(request)
        check_seed(request, provider=self.name)

    async def _through_queue(
        self,
        queue: BatchQueue[RequestT, ResultT],
        request: RequestT,
        serve: Callable[[PendingRequest[RequestT, ResultT]], None],
    ) -> ResultT:
        """Queue ``request`` with the others waiting; the worker runs ``serve`` until it has its answer (in a batch)."""
        entry = queue.put(request)
        try:
            await self._worker.run(serve, entry)
        except BaseException:
            queue.discard(entry)  # sets its cancel flag: a running batch drops the row at its next token
            raise
        return entry.future.result()

    # Worker thread -----------------------------------------------------------------------------------------------

    def _ensure_loaded(self) -> LoadedModel:
        if self._loaded is None and self._given is not None:
            model, tokenizer = self._given
            self._loaded = loaded_model(str(self._given_model_name()), model.eval(), tokenizer, model.device,
                                        provider=self.name)
        if self._loaded is None:
            with self._model_loads.attempt():  # a failure is what health reports until a load succeeds
                self._loaded = load_model(self.model_name, self.device, self.torch_dtype, provider=self.name,
                                          model_kwargs=self.model_kwargs)
        return self._loaded

    def _serve(self, entry: PendingRequest[GenerationRequest, GenerationResult]) -> None:
        """Run batches, oldest first, until ``entry`` has its answer (each request queues one such call)."""
        loaded = self._ensure_loaded()
        while not entry.future.done():
            batch = self._queue.next_batch(lambda request: self._generation.sampling(loaded, request))
            if batch:
                self._generation.run_batch(loaded, batch, self._generate_rows)

    def _stream_now(
        self, request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event
    ) -> GenerationResult:
        """Run one request alone (no batch), handing its text to ``sink`` token by token."""
        return self._generation.stream(self._ensure_loaded(), request, sink, cancel, self._generate_rows)

    def _generate_rows(self, loaded: LoadedModel, rows: list[Row], watch: Callable[..., Any] | None = None) -> Outputs:
        """One ``generate`` over ``rows`` (every batch and stream runs through here)."""
        return self._generation.generate_rows(loaded, rows, watch)

    def _serve_scores(self, entry: PendingRequest[ScoreCall, ScoreResult]) -> None:
        """Score batches of waiting score calls, oldest first, until ``entry`` has its answer."""
        loaded = self._ensure_loaded()
        while not entry.future.done():
            most = PASSES_PER_BATCH * self.max_batch_size
            batch = self._score_queue.next_batch(first=lambda call: call.adapter_id, most=most)
            if batch:
                self._scoring.run_batch(loaded, batch)

    def _tokenize_now(self, text: str) -> list[int]:
        return list(self._ensure_loaded().vocabulary.encode(text))

    def _detokenize_now(self, token_ids: tuple[int, ...]) -> str:
        return str(self._ensure_loaded().tokenizer.decode(list(token_ids), skip_special_tokens=False))

    def _next_token_rows_now(self, requests: list[TokenRequest]) -> NDArray[np.float32]:
        return hf_tokens.next_token_rows(
            self._ensure_loaded(), self._slots, requests, self._prefix_cache, max_batch_size=self.max_batch_size,
            batch_sizes=self._batch_sizes, provider=self.name,
        )

    def _load_adapter_now(self, adapter_id: str, source: AdapterSource) -> None:
        loaded = self._ensure_loaded()
        adapter_path = source.path
        if source.weights is not None:
            self._slots.load_weights(loaded, adapter_id, adapter_path, source.weights)
        else:
            self._slots.load(loaded, adapter_id, adapter_path)

    def _unload_adapter_now(self, adapter_id: str) -> None:
        self._prefix_cache.drop_adapter(adapter_id)  # its backend name: a later load is other weights
        if self._loaded is not None:  # else nothing of it is in the model (never loaded, or freed)
            self._slots.unload(self._loaded, adapter_id)

    def _close_blocking(self) -> None:
        self._slots.clear()
        self._prefix_cache.clear()
        loaded, self._loaded = self._loaded, None
        if loaded is not None and self._given is None:  # no gc.collect(): see free_weights
            free_weights(loaded.model, provider=self.name)
