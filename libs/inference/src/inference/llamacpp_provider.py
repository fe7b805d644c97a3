"""llama.cpp in process, with LoRA adapters hot-swapped per request instead of reloading the model.

Each adapter is loaded once with llama.cpp's adapter API (``llama_adapter_lora_init``) and made active per
request with ``llama_set_adapters_lora``; the base model is never reloaded. When the active adapter changes,
the KV cache is reset, because ``Llama.generate`` reuses a matching token prefix and knows nothing about
adapters. Where the adapter API is missing (or ``hot_swap=False``), the provider runs in reload mode: it
rebuilds ``Llama(model_path, lora_path=...)`` whenever the adapter changes.

All model work (load, adapter init, generation) runs on the worker thread of
:class:`~inference._inprocess.base.InProcessProvider`, so one context never runs two requests at once,
requests run first come first served, and the event loop only awaits. Streaming hands each piece from
that thread to the event loop as it is decoded. A caller that gives up (a cancelled ``generate``, a stream
closed early) sets its request's cancel flag, which the generation loop checks after every token, so the
next request never waits behind abandoned work.

Which adapters the user loaded (ids, paths, pins, LRU order) is the base class's registry; the provider keeps
llama.cpp's handles for the adapters resident in the backend now, and only the worker thread changes that record.

The provider is assembled from parts in :mod:`inference._inprocess`, one job each:

- ``llamacpp_model``: the ``Llama`` object, its loading, hot-swap or reload mode, adapter checks and activation;
- ``llamacpp_prompt``: a request's prompt as token ids (chat template or plain text);
- ``llamacpp_generation``: a request's preparation, sampling, the one-at-a-time path and the decode loop's backend;
- ``llamacpp_batch``: the decode loop over many sequences (``n_parallel > 1``) and its event-loop side;
- ``llamacpp_completion``, ``llamacpp_logits``, ``llamacpp_text``: tokens to text, logits, text to tokens;
- ``llamacpp_scoring``: scoring (alone, or as sequences of the decode loop);
- ``llamacpp_native``: llama.cpp's C API and log lines through ctypes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import itertools
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from inference._core.dependencies import import_optional, missing_dependency
from inference._core.lifecycle import files_state
from inference._core.validation import AdapterScales, GenerationRequest, ScoreRequest, TokenRequest
from inference._inprocess import llamacpp_tokens
from inference._inprocess.base import InProcessProvider, non_finite_logits
from inference._inprocess.hf_prefix_cache import PrefixCache
from inference._inprocess.llamacpp_batch import ContinuousBatcher, LoopStarter
from inference._inprocess.llamacpp_generation import (
    DEFAULT_SAMPLING,
    ChoicesApart,
    Generation,
    LoopBackend,
    choice_seeds,
    seed_fits,
    seed_rule,
)
from inference._inprocess.llamacpp_model import (
    KV_CACHE_TYPES,
    QUANTIZED_KV_CACHE_TYPES,
    LlamaCppModel,
    LlamaSettings,
    ResidentAdapter,
    gguf_model_problem,
)
from inference._inprocess.llamacpp_native import set_thread_log_mode
from inference._inprocess.llamacpp_prefix_cache import cached_rows
from inference._inprocess.llamacpp_prompt import LlamaPrompts
from inference._inprocess.llamacpp_scoring import ScoreJob, score
from inference._inprocess.options import IN_PROCESS_OPTIONS
from inference._inprocess.streaming import JobStarter, PieceSink, on_worker, run_job, stream_job
from inference.adapters.source import AdapterSource
from inference.exceptions import (
    ConfigurationError,
    InferenceError,
    InvalidAdapterError,
    InvalidRequestError,
    ProviderError,
)
from inference.options import OptionMap, Sent
from inference.provider import GenerationResult, StreamEvent
from inference.results import ScoreResult
from inference.tokens import TokenCacheStats, TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["DEFAULT_ADAPTER_CACHE_DIR", "DEFAULT_SAMPLING", "KV_CACHE_TYPES", "LlamaCppProvider"]

_PROVIDER = "llamacpp"

DEFAULT_ADAPTER_CACHE_DIR = Path.home() / ".cache" / "inference-adapters"
"""Where PEFT adapters converted to GGUF LoRA files are kept when no ``adapter_cache_dir`` is given."""


class LlamaCppProvider(InProcessProvider[ResidentAdapter]):
    """Runs a GGUF model in process with llama.cpp, switching LoRA adapters per request.

    The model loads lazily on the first call, on the provider's worker thread, exactly once even when
    several calls arrive together. ``load_adapter`` takes a GGUF LoRA file or a PEFT adapter directory
    (converted once to GGUF for this base model and cached in ``adapter_cache_dir``).

    Sampling: a request's ``None`` settings take llama.cpp's defaults (:data:`DEFAULT_SAMPLING`:
    temperature 0.8, top_p 0.95, top_k 40, min_p 0.05, no repetition penalty); ``temperature=0`` is greedy.
    A request without ``seed`` uses the provider's ``seed`` (``None``: a fresh random seed per request).

    Example:
        >>> async def main():  # doctest: +SKIP
        ...     async with LlamaCppProvider("models/base.gguf", n_ctx=2048) as provider:
        ...         await provider.load_adapter("style", "adapters/style")  # a PEFT directory
        ...         return await provider.generate("Hello", model="base", adapter_id="style", temperature=0)

    Args:
        model_path: The GGUF base model; else ``LLAMACPP_MODEL_PATH``. Required. A GGUF file of a Hugging Face Hub
            repository is written ``ORG/NAME:FILE.gguf`` (``FILE`` as named in the repository, no wildcards): it is
            resolved as ``Llama.from_pretrained(ORG/NAME, FILE.gguf)`` does (the Hugging Face cache, fetched there
            first unless ``HF_HUB_OFFLINE`` is set) when no such local path exists.
        n_ctx: Context size in tokens; else ``LLAMACPP_N_CTX``; else 4096.
        n_gpu_layers: Layers offloaded to the GPU (-1 = all); else ``LLAMACPP_N_GPU_LAYERS``; else -1.
            Ignored by CPU-only builds of llama.cpp.
        adapter_cache_dir: Where converted PEFT adapters are cached; else ``LLAMACPP_ADAPTER_CACHE_DIR``;
            else ``~/.cache/inference-adapters``.
        max_adapters: Most adapters kept in llama.cpp's memory at once; else ``LLAMACPP_MAX_ADAPTERS``; else
            unlimited. Beyond it the least recently used adapter (not pinned, not in use) is freed, and
            loaded again from its path (the converted file is cached) when a request needs it.
        n_parallel: Requests generated together (continuous batching), else ``LLAMACPP_N_PARALLEL``, else 4.
            Concurrent requests for the same adapter share each ``llama_decode`` step; they share the context's
            ``n_ctx`` cells too (a request joins when its prompt plus ``max_tokens`` fits what the others left).
            ``1`` runs requests one at a time. See :mod:`inference._inprocess.llamacpp_batch`. The sequences of a
            ``next_token_logprobs`` batch are decoded up to ``n_parallel`` at a time too.
        kv_cache_type: KV cache precision, one of :data:`KV_CACHE_TYPES` (``"f32"`` makes results match
            other backends to 1e-5 on unquantized weights); else ``LLAMACPP_KV_CACHE_TYPE``; else llama.cpp's
            default (f16).
        seed: Sampling seed for requests that give none, in ``[0, MAX_SEED]`` (:data:`MAX_SEED` is
            ``2**32 - 2``); ``None`` draws a fresh one per request. Not a setting: a step config's ``seed`` is
            the requests' own.
        n_threads: CPU threads llama.cpp uses, for generation and for prompts alike; else ``LLAMACPP_N_THREADS``;
            else llama-cpp-python's choice (half the CPUs for one-token steps, all of them for prompts and batched
            steps). On a machine busy with other work, give fewer threads than the CPUs left free: llama.cpp's
            threads wait for each other by spinning, and a step whose threads do not all get a CPU can take 100
            times longer.
        flash_attn: Flash attention; else ``LLAMACPP_FLASH_ATTN``; else off (``llama-server`` turns it on where
            the backend supports it; llama-cpp-python leaves it off). On a CPU it makes batched decoding about
            5-10% faster, but then a request's tokens in a batch may differ from its tokens alone (its attention
            is summed in another order); off, they are equal with an f32 KV cache.
        n_batch: Prompt tokens evaluated per batch; else ``LLAMACPP_N_BATCH``; else 512.
        prefix_cache_tokens: How many tokens of computed sequences ``next_token_logprobs`` keeps (llama.cpp's saved
            KV state per sequence, least recently used out), so that a sequence extending a cached one (for the same
            adapter weights) costs only its new tokens; else ``LLAMACPP_PREFIX_CACHE_TOKENS``; else 0 (off: every
            sequence is computed whole). As on Transformers: dropped for an adapter on unload or replace,
            ``clear_cache()`` forgets all, ``cache_stats()`` counts hits and misses.
        hot_swap: ``False`` forces the reload-with-``lora_path`` fallback (rebuilds the model whenever the
            adapter changes); else ``LLAMACPP_HOT_SWAP``; else ``True``. The fallback is used anyway when
            llama.cpp lacks the adapter API.
        verbose: Let llama.cpp print its logs; else ``LLAMACPP_VERBOSE``; else ``False``.

    Raises:
        ConfigurationError: No model path is given by argument or environment, or a setting is invalid.
        MissingDependencyError: llama-cpp-python is not installed.
    """

    name = _PROVIDER
    options: ClassVar[OptionMap] = {
        **IN_PROCESS_OPTIONS,  # system_prompt (chat template), json_schema (llguidance), tools refused
        "max_tokens": Sent("max_tokens", "the generation loop's limit (Completion)"),
        "temperature": Sent("temp", "llama.cpp's sampler chain"),
        "top_p": Sent("top_p", "llama.cpp's sampler chain"),
        "repetition_penalty": Sent("repeat_penalty", "llama.cpp's sampler chain"),
        "stop": Sent("stop", "stop strings, matched on the decoded text (Completion)"),
        "seed": Sent("seed", "the request's sampler seed"),
        "top_k": Sent("top_k", "llama.cpp's sampler chain"),
        "logprobs": Sent("logits", "log-softmax of the step's logits"),
        "n": Sent(
            "Branches",
            "the decode loop's n sequences: the prompt decoded once and its cells shared (llama_memory_seq_cp), each "
            "choice with its own sampler chain, seeds seed, seed + 1, ... (the choices of n requests with those "
            "seeds); groups of up to n_parallel. With n_parallel=1 (or where n completions do not fit n_ctx beside "
            "the prompt): one request per choice, same seeds",
        ),
        "presence_penalty": Sent("penalty_present", "llama.cpp's penalties sampler, over the generated tokens"),
        "frequency_penalty": Sent("penalty_freq", "llama.cpp's penalties sampler, over the generated tokens"),
        "min_p": Sent("min_p", "llama.cpp's sampler chain (its default 0.05 when not given)"),
        "logit_bias": Sent("logits processor", "added to the raw logits, first in the sampler chain"),
        "raw_prompt": Sent("prompt text", "tokenized as it is, with the BOS the vocabulary adds, no chat template"),
        "chat_template": Sent("Jinja2ChatFormatter", "the request's template instead of the GGUF's"),
        "chat_template_kwargs": Sent("template variables", "passed to the chat template's rendering"),
        "return_token_ids": Sent("token_ids", "the ids that make the text: no end token, no cut stop string"),
    }
    batches_mixed_adapters = False
    supports_scoring = True
    supports_tokenize = True
    supports_next_token_logprobs = True
    supports_token_prompts = True
    supports_adapter_scales = True
    loads_hub_ids = True
    _backend_label = "llama.cpp"
    _model_path_problem = staticmethod(gguf_model_problem)  # a GGUF file (a directory is none)

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        n_ctx: int | None = None,
        n_gpu_layers: int | None = None,
        adapter_cache_dir: str | os.PathLike[str] | None = None,
        max_adapters: int | None = None,
        *,
        n_parallel: int | None = None,
        kv_cache_type: str | None = None,
        seed: int | None = None,
        n_threads: int | None = None,
        flash_attn: bool | None = None,
        n_batch: int | None = None,
        prefix_cache_tokens: int | None = None,
        hot_swap: bool | None = None,
        verbose: bool | None = None,
    ) -> None:
        super().__init__(  # checks max_adapters; the worker thread starts on first use
            locals(), worker_initializer=lambda: set_thread_log_mode(self._verbose)
        )
        settings = self._settings
        if not settings["model_path"]:
            raise ConfigurationError(
                "the llamacpp provider needs a GGUF model: pass model_path=... or set LLAMACPP_MODEL_PATH",
                provider=_PROVIDER,
            )
        if not isinstance(settings["n_ctx"], int) or settings["n_ctx"] < 1:
            raise ConfigurationError(
                "n_ctx must be a positive integer (argument n_ctx or LLAMACPP_N_CTX), "
                f"got {settings['n_ctx']!r}",
                provider=_PROVIDER,
            )
        if seed is not None and not seed_fits(seed):
            raise ConfigurationError(f"seed {seed_rule(seed)}", provider=_PROVIDER)
        if settings["kv_cache_type"] in QUANTIZED_KV_CACHE_TYPES and not settings["flash_attn"]:
            raise ConfigurationError(
                f"kv_cache_type={settings['kv_cache_type']!r} (a quantized KV cache) needs flash_attn=True "
                "(LLAMACPP_FLASH_ATTN): llama.cpp refuses a quantized V cache without flash attention",
                provider=_PROVIDER,
            )
        if min(settings["n_batch"], settings["n_ctx"]) < settings["n_parallel"]:  # llama.cpp would abort the process
            raise ConfigurationError(
                f"n_batch={settings['n_batch']} with n_ctx={settings['n_ctx']} gives llama.cpp batches of "
                f"{min(settings['n_batch'], settings['n_ctx'])} tokens, fewer than n_parallel={settings['n_parallel']} "
                "(each step decodes one token of every parallel request in one batch; llama.cpp aborts the process "
                "otherwise): raise n_batch (LLAMACPP_N_BATCH) and n_ctx, or lower n_parallel (LLAMACPP_N_PARALLEL)",
                provider=_PROVIDER,
            )
        if importlib.util.find_spec("llama_cpp") is None:  # found, not imported: the first call imports it
            raise missing_dependency("llama_cpp", provider=_PROVIDER, extra="llamacpp")
        self.model_path = Path(settings["model_path"])
        self.n_ctx: int = settings["n_ctx"]
        self.n_gpu_layers: int = settings["n_gpu_layers"]
        self.adapter_cache_dir = Path(settings["adapter_cache_dir"] or DEFAULT_ADAPTER_CACHE_DIR)
        self.kv_cache_type: str | None = settings["kv_cache_type"]
        self.seed = seed
        self.n_parallel: int = settings["n_parallel"]
        self._n_threads: int | None = settings["n_threads"]
        self._flash_attn: bool = settings["flash_attn"]
        self._n_batch: int = settings["n_batch"]
        self._verbose: bool = settings["verbose"]
        self._hot_swap_requested: bool = settings["hot_swap"]
        if self._hot_swap_requested is False:  # reload mode: a switch rebuilds the model, one adapter at scale 1
            for capability in ("hot_swaps_adapters", "supports_adapter_scales"):
                setattr(self, capability, False)
        # The parts; their state is touched only from inside self._worker.run calls.
        self._model = LlamaCppModel(LlamaSettings.of(settings), _PROVIDER, self._model_loads)
        self._prompts = LlamaPrompts(self._model)
        self._prefix_cache = PrefixCache(int(settings["prefix_cache_tokens"]))  # capacity 0: off, still counting
        self._generation = Generation(self._model, self._prompts, seed=seed, require_prompt=self._require_prompt)
        self._batcher = (
            ContinuousBatcher(self.n_parallel, self.n_ctx, min(self._n_batch, self.n_ctx))
            if self.n_parallel > 1
            else None
        )

    def __repr__(self) -> str:
        return (
            f"LlamaCppProvider(model_path={str(self.model_path)!r}, n_ctx={self.n_ctx}, "
            f"n_gpu_layers={self.n_gpu_layers}, max_adapters={self.max_adapters}, "
            f"adapters={sorted(self._adapter_registry.ids())})"
        )

    @property
    def model_name(self) -> str:
        """The loaded model's name: the GGUF file's stem."""
        return self._model.name

    @property
    def uses_hot_swap(self) -> bool | None:
        """True when adapters are swapped with llama.cpp's adapter API, False in reload mode.

        ``None`` until the first call has imported llama.cpp.
        """
        return self._model.hot_swap

    @property
    def model_loads(self) -> int:
        """How many times the base model was loaded (1 with hot-swap; grows per switch in reload mode)."""
        return self._model.loads

    def _model_loaded(self) -> bool:
        return self._model.llama is not None

    @property
    def _llama(self) -> Any:
        """The loaded ``Llama`` (``None`` before the first load).

        Read on the worker thread, or by the tests and benchmarks that look at llama.cpp's context.
        """
        return self._model.llama

    # Public hooks ---------------------------------------------------------------------------------------

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self._check_request(request)
        if request.n == 1:
            return await run_job(self._starter(), request)
        return await self._choices(request)

    async def _choices(self, request: GenerationRequest) -> GenerationResult:
        """A request for ``n`` completions: in the decode loop, groups of up to ``n_parallel`` choices, each group's
        prompt decoded once (:class:`~inference._inprocess.llamacpp_batch.Branches`); with ``n_parallel=1``, or where
        ``n`` completions beside one prompt do not fit the context, one request per choice. Choice ``k`` is seeded
        ``seed + k`` either way (:func:`~inference._inprocess.llamacpp_generation.choice_seeds`), so the choices
        are the same."""
        from inference._core.batches import all_or_none

        seeds = choice_seeds(request, self.seed)

        def parts(size: int) -> list[GenerationRequest]:
            return [
                dataclasses.replace(request, n=min(size, request.n - first), seed=seeds[first])
                for first in range(0, request.n, size)
            ]

        starter = self._starter()
        try:
            results = await all_or_none([run_job(starter, part) for part in parts(self.n_parallel)])
        except ChoicesApart:
            results = await all_or_none([run_job(starter, part) for part in parts(1)])
        return GenerationResult.from_choices([one for result in results for one in result.choices or (result,)])

    def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        self._check_request(request)
        return stream_job(self._starter(), request)

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        self._check_open()
        if self._batcher is not None:  # a sequence of the decode loop, beside other scores and generations
            return await LoopStarter(self._batcher, self._worker, self._serve_batch).score(ScoreJob(request, False))
        return await self._worker.run(self._score_blocking, request, False)

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        self._check_open()
        if self._batcher is not None:
            return await LoopStarter(self._batcher, self._worker, self._serve_batch).score(ScoreJob(request, True))
        return await self._worker.run(self._score_blocking, request, True)

    async def _model_chat_template(self) -> tuple[str, str | None]:
        self._check_open()
        info = await self._worker.run(self._model.model_info)
        return self._model.name, info.chat_template

    async def _tokenize_text(self, text: str, model: str) -> list[int]:
        self._check_open()
        return await self._worker.run(lambda: self._prompts.encode(self._loaded_llama(), text, add_bos=False))

    async def _detokenize_ids(self, request: TokenRequest) -> str:
        self._check_open()
        return await self._worker.run(self._detokenize_blocking, request.token_ids)

    async def _token_vocabulary(self, model: str) -> TokenVocabulary:
        self._check_open()
        return await self._worker.run(
            lambda: llamacpp_tokens.vocabulary(self._prompts, self._loaded_llama(), self.n_ctx)
        )

    async def _next_token_logprobs(self, requests: list[TokenRequest]) -> NDArray[np.float32]:
        self._check_open()
        return await self._worker.run(self._next_token_rows_blocking, requests)

    def _cache_stats(self) -> TokenCacheStats:
        return self._prefix_cache.stats()

    def _clear_cache(self) -> None:
        self._prefix_cache.clear()

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Load into llama.cpp (first load, or again after an eviction: the conversion is cached)."""
        adapter_path = source.path
        self._check_open()
        path = Path(adapter_path)
        if path.is_dir():
            cache = self._conversion_dir(adapter_path, self.adapter_cache_dir)
            gguf_path = await asyncio.to_thread(self._model.convert_peft, path, self.model_path, cache)
        elif path.is_file():
            gguf_path = path
        else:
            raise InvalidAdapterError(
                f"adapter at {path} does not exist: give a GGUF LoRA file or a PEFT adapter directory",
                provider=self.name,
                path=str(path),
            )
        self._check_open()
        await self._worker.run(self._add_adapter_blocking, adapter_id, gguf_path)

    async def _unload_adapter(self, adapter_id: str) -> None:
        """Free the adapter's memory in llama.cpp (on unload, and on eviction)."""
        self._check_open()
        await self._worker.run(self._remove_adapter_blocking, adapter_id)

    # Event-loop helpers ---------------------------------------------------------------------------------

    def _closed_path(self) -> str | None:
        return str(self.model_path)

    def _starter(self) -> JobStarter:
        """How a generation starts: alone on the worker (``n_parallel=1``), or joining the decode loop."""
        if self._batcher is not None:
            return LoopStarter(self._batcher, self._worker, self._serve_batch)
        return on_worker(self._worker, self._generate_blocking)

    def _check_request(self, request: GenerationRequest) -> None:
        """Refuse what llama.cpp would misread, before the request is queued: a seed outside its range."""
        super()._check_request(request)
        if request.seed is not None and not seed_fits(request.seed):
            raise InvalidRequestError(f"seed {seed_rule(request.seed)}", provider=self.name)
        last = choice_seeds(request, self.seed)[-1]
        if last is not None and not seed_fits(last):
            raise InvalidRequestError(
                f"n={request.n} seeds its last choice with {last} (seed + n - 1), which {seed_rule(last)}",
                provider=self.name,
            )

    # Worker thread: adapters (the record of resident ones; the model applies them) ------------------------

    def _add_adapter_blocking(self, adapter_id: str, gguf_path: Path) -> None:
        """Load ``gguf_path`` into llama.cpp and record it as resident under ``adapter_id``."""
        stale = self._resident.pop(adapter_id, None)  # never expected: the registry unloads before loading
        if stale is not None:
            self._free_adapter_blocking(adapter_id, stale)
        files = None if self._model.hot_swap else files_state(str(gguf_path))  # before llama.cpp reads it
        handle = self._init_adapter_blocking(gguf_path)
        self._resident[adapter_id] = ResidentAdapter(gguf_path=gguf_path, handle=handle, files=files)

    def _remove_adapter_blocking(self, adapter_id: str) -> None:
        self._prefix_cache.drop_adapter(adapter_id)  # its backend name: a later load may be other weights
        adapter = self._resident.pop(adapter_id, None)
        if adapter is not None:
            self._free_adapter_blocking(adapter_id, adapter)

    def _init_adapter_blocking(self, gguf_path: Path) -> Any:
        return self._model.init_adapter(gguf_path)

    def _free_adapter_blocking(self, adapter_id: str, adapter: ResidentAdapter) -> None:
        self._model.free_adapter(adapter_id, adapter)

    def _activate(self, adapters: AdapterScales) -> Any:
        """Return the model with ``adapters`` (backend names and scales; ``()``: none) applied."""
        resident = []
        for adapter_id, _ in adapters:
            adapter = self._resident.get(adapter_id)
            if adapter is None:
                raise self._not_loaded(adapter_id)
            resident.append(adapter)
        return self._model.activate(adapters, resident)

    def _close_blocking(self) -> None:
        """Free every resident adapter and the model (the last call the worker runs)."""
        while self._resident:
            self._remove_adapter_blocking(next(iter(self._resident)))
        self._model.close()

    # Worker thread: requests ------------------------------------------------------------------------------

    def _generate_blocking(
        self, request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event
    ) -> GenerationResult:
        """Generate one request alone (``n_parallel=1``, see :meth:`Generation.alone`); a request cancelled before
        it starts returns at once without touching the model. A failure of llama.cpp itself (a ``llama_decode``
        error, out of memory) is a :class:`ProviderError` naming it."""
        try:
            if cancel.is_set():
                return self._generation.cancelled(request)
            return self._generation.alone(self._activate(request.adapters), request, sink, cancel)
        except InferenceError:
            raise
        except Exception as error:
            raise ProviderError(
                f"llama.cpp failed to generate ({type(error).__name__}: {error}); the provider is still usable, "
                "try a shorter prompt or a smaller max_tokens if the context ran out",
                provider=self.name,
            ) from error

    def _serve_batch(self) -> None:
        """Run the decode loop (``n_parallel > 1``; see :mod:`inference._inprocess.llamacpp_batch`)."""
        assert self._batcher is not None
        self._batcher.serve(LoopBackend(self._generation, self._activate, self._others_waiting))

    def _others_waiting(self) -> bool:
        """Other work (a load, a next-token call, closing) is queued behind the decode loop: it gives way."""
        if self._closed:  # aclose() queued: the requests that came before it are served first
            return False
        return self._worker.waiting() > self._worker.waiting(self._serve_batch)

    def _loaded_llama(self) -> Any:
        """The ``Llama`` as it is (loaded with no adapter if it was not loaded yet): its tokenizer is the same."""
        return self._model.llama if self._model.llama is not None else self._activate(())

    def _detokenize_blocking(self, token_ids: tuple[int, ...]) -> str:
        llama_cpp, llama = self._model.llama_cpp(), self._loaded_llama()
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        text = b"".join(llamacpp_tokens.token_piece(llama_cpp, vocab, token) for token in token_ids)
        return text.decode("utf-8", errors="replace")

    def _next_token_rows_blocking(self, requests: list[TokenRequest]) -> NDArray[np.float32]:
        """Each request's distribution with its adapters active, the requests of one adapter choice together (up to
        ``n_parallel`` per decode), each from its longest cached prefix
        (:mod:`~inference._inprocess.llamacpp_prefix_cache`)."""
        numpy = import_optional("numpy", provider=self.name, extra="llamacpp")
        rows = numpy.empty((len(requests), self._loaded_llama().n_vocab()), dtype=numpy.float32)
        order = sorted(range(len(requests)), key=lambda index: requests[index].adapters)
        for adapters, group in itertools.groupby(order, key=lambda index: requests[index].adapters):
            indices = list(group)
            llama = self._activate(adapters)
            found = cached_rows(
                self._model.llama_cpp(),
                numpy,
                llama,
                [requests[index] for index in indices],
                self._prefix_cache,
                sequences=self.n_parallel,
            )
            for index, row in zip(indices, found, strict=True):
                if row is None:
                    raise non_finite_logits(self.name, adapters)
                rows[index] = row
        result: NDArray[np.float32] = rows
        return result

    def _score_blocking(self, request: ScoreRequest, rolling: bool) -> ScoreResult:
        """Score with the request's adapter active: each sequence evaluated once."""
        adapters: AdapterScales = ((request.adapter_id, 1.0),) if request.adapter_id is not None else ()
        return score(self._prompts, self._activate(adapters), request, adapters, rolling=rolling)
