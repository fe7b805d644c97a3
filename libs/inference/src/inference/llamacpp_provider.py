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

Which adapters the user loaded (ids, paths, pins, LRU order) is the base class's registry; this module only
keeps llama.cpp's handles for the adapters resident in the backend now, and only the worker thread changes
that record.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import math
import os
import sys
import threading
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from inference._core.dependencies import import_optional, missing_dependency
from inference._core.lifecycle import FilesState, files_state
from inference._core.scoring import ScoreTokens, Vocabulary, rolling_windows, score_tokens, too_long
from inference._core.validation import AdapterScales, GenerationRequest, ScoreRequest
from inference._inprocess.base import InProcessProvider, chat_messages, non_finite_logits, plain_prompt
from inference._inprocess.constrained import JsonGrammars, SchemaRefused
from inference._inprocess.llamacpp_batch import BatchEntry, ContinuousBatcher, Started
from inference._inprocess.llamacpp_completion import Completion, TokenText
from inference._inprocess.llamacpp_logits import JsonMask, clear_memory, score_sequence
from inference._inprocess.llamacpp_text import TextEncoder
from inference._inprocess.streaming import JobStarter, PieceSink, on_worker, run_job, stream_job
from inference.adapters.source import AdapterSource
from inference.exceptions import (
    ConfigurationError,
    InferenceError,
    InvalidAdapterError,
    InvalidRequestError,
    ModelLoadError,
    ProviderError,
    UnsupportedOperationError,
)
from inference.options import OptionMap, Refused, Sent
from inference.provider import GenerationResult, StreamEvent
from inference.results import ScoreResult

__all__ = ["DEFAULT_ADAPTER_CACHE_DIR", "DEFAULT_SAMPLING", "KV_CACHE_TYPES", "LlamaCppProvider"]

_PROVIDER = "llamacpp"

DEFAULT_ADAPTER_CACHE_DIR = Path.home() / ".cache" / "inference-adapters"
"""Where PEFT adapters converted to GGUF LoRA files are kept when no ``adapter_cache_dir`` is given."""

DEFAULT_SAMPLING: dict[str, float] = {
    "temperature": 0.8,
    "top_p": 0.95,
    "top_k": 40,
    "min_p": 0.05,
    "repeat_penalty": 1.0,
}
"""llama.cpp's own defaults, used for every sampling setting a request leaves as ``None``."""

KV_CACHE_TYPES: dict[str, int] = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "bf16": 30}
"""``kv_cache_type`` names and the GGML type ids llama.cpp takes as ``type_k``/``type_v``."""

MAX_SEED = 2**32 - 2
"""The largest seed llama.cpp takes: its samplers take a ``uint32_t`` and read ``0xFFFFFFFF`` as "random"."""


@dataclass
class _Adapter:
    """One adapter resident in llama.cpp: the GGUF LoRA file used, and llama.cpp's handle."""

    gguf_path: Path
    handle: Any = None  # llama_adapter_lora_p; None in reload mode
    files: FilesState = None  # reload mode: the file as it was at load, for the rebuilds that read it again


@dataclass(frozen=True)
class _ModelInfo:
    """What the loaded base model says about itself, read once at first load."""

    architecture: str
    chat_template: str | None
    bos_token: str
    eos_token: str


class LlamaCppProvider(InProcessProvider[_Adapter]):
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
        model_path: The GGUF base model; else ``LLAMACPP_MODEL_PATH``. Required.
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
            ``1`` runs requests one at a time. See :mod:`inference._inprocess.llamacpp_batch`.
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
        "max_tokens": Sent("max_tokens", "the generation loop's limit (Completion)"),
        "system_prompt": Sent("chat template", "a system message rendered by the model's chat template"),
        "temperature": Sent("temp", "llama.cpp's sampler chain"),
        "top_p": Sent("top_p", "llama.cpp's sampler chain"),
        "repetition_penalty": Sent("repeat_penalty", "llama.cpp's sampler chain"),
        "stop": Sent("stop", "stop strings, matched on the decoded text (Completion)"),
        "seed": Sent("seed", "the request's sampler seed"),
        "top_k": Sent("top_k", "llama.cpp's sampler chain"),
        "logprobs": Sent("logits", "log-softmax of the step's logits"),
        "json_schema": Sent("llguidance", "a token mask per step"),
        "tools": Refused("tool calling is not built yet for this backend (the fake provider calls tools, for tests)"),
        "tool_choice": Refused("tool calling is not built yet for this backend"),
        "return_token_ids": Refused("generated token ids are not built yet for this backend"),
    }
    batches_mixed_adapters = False
    supports_scoring = True
    supports_adapter_scales = True
    _backend_label = "llama.cpp"

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
        hot_swap: bool | None = None,
        verbose: bool | None = None,
    ) -> None:
        super().__init__(  # checks max_adapters; the worker thread starts on first use
            locals(), worker_initializer=lambda: _set_thread_log_mode(self._verbose)
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
        if seed is not None and not _seed_fits(seed):
            raise ConfigurationError(f"seed {_seed_rule(seed)}", provider=_PROVIDER)
        if importlib.util.find_spec("llama_cpp") is None:  # found, not imported: the first call imports it
            raise missing_dependency("llama_cpp", provider=_PROVIDER, extra="llamacpp")
        self.model_path = Path(settings["model_path"])
        self.n_ctx: int = settings["n_ctx"]
        self.n_gpu_layers: int = settings["n_gpu_layers"]
        self.adapter_cache_dir = Path(settings["adapter_cache_dir"] or DEFAULT_ADAPTER_CACHE_DIR)
        self.kv_cache_type: str | None = settings["kv_cache_type"]
        self.seed = seed
        self._n_threads: int | None = settings["n_threads"]
        self._flash_attn: bool = settings["flash_attn"]
        self._n_batch: int = settings["n_batch"]
        self._verbose: bool = settings["verbose"]
        self._hot_swap_requested: bool = settings["hot_swap"]
        # Worker-thread state (touched only from inside self._worker.run calls).
        self._llama: Any = None
        self._info: _ModelInfo | None = None
        self._formatter: Any = None
        self._hot_swap: bool | None = None  # decided when llama_cpp is first imported
        self._active: AdapterScales = ()  # adapters set on the context (hot-swap) or baked in (reload)
        self._model_lora_path: Path | None = None  # reload mode: the adapter the model was built with
        self._loads = 0
        self._grammars: JsonGrammars | None = None  # built on the first json_schema request
        self._tokens: TokenText | None = None  # the loaded model's token helpers
        self._text: TextEncoder | None = None  # text to token ids as the model's HF tokenizer does it
        self.n_parallel: int = settings["n_parallel"]
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
        return self.model_path.stem

    @property
    def model_loads(self) -> int:
        """How many times the base model was loaded (1 with hot-swap; grows per switch in reload mode)."""
        return self._loads

    def _model_loaded(self) -> bool:
        return self._llama is not None

    @property
    def uses_hot_swap(self) -> bool | None:
        """True when adapters are swapped with llama.cpp's adapter API, False in reload mode.

        ``None`` until the first call has imported llama.cpp.
        """
        return self._hot_swap

    # Public hooks ---------------------------------------------------------------------------------------

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self._check_request(request)
        return await run_job(self._starter(), request)

    def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        self._check_request(request)
        return stream_job(self._starter(), request)

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        self._check_open()
        return await self._worker.run(self._score_blocking, request, False)

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        self._check_open()
        return await self._worker.run(self._score_blocking, request, True)

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Load into llama.cpp (first load, or again after an eviction: the conversion is cached)."""
        adapter_path = source.path
        self._check_open()
        path = Path(adapter_path)
        if path.is_dir():
            cache = self._conversion_dir(adapter_path, self.adapter_cache_dir)
            gguf_path = await asyncio.to_thread(self._convert_peft, path, cache)
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
            return self._start_batched
        return on_worker(self._worker, self._generate_blocking)

    def _check_request(self, request: GenerationRequest) -> None:
        """Refuse what llama.cpp would misread, before the request is queued: a seed outside its range."""
        super()._check_request(request)
        if request.seed is not None and not _seed_fits(request.seed):
            raise InvalidRequestError(f"seed {_seed_rule(request.seed)}", provider=self.name)

    def _convert_peft(self, directory: Path, cache: Path) -> Path:
        """Convert a PEFT directory to a GGUF LoRA for this base model (cached in ``cache``; runs in a helper
        thread)."""
        from inference.adapters.gguf import convert_peft_to_gguf_cached

        if not self.model_path.is_file():
            raise ModelLoadError(
                f"GGUF model file {self.model_path} does not exist, so no PEFT adapter can be converted "
                "for it: set model_path or LLAMACPP_MODEL_PATH to a .gguf file",
                provider=self.name,
                path=str(self.model_path),
            )
        try:
            return Path(convert_peft_to_gguf_cached(directory, self.model_path, cache))
        except UnicodeError as error:  # e.g. a directory name with undecodable bytes, written into the GGUF
            raise InvalidAdapterError(
                f"adapter at {os.fspath(directory)!r} could not be converted to GGUF ({error}): rename or move it to a "
                "path that is valid UTF-8, or convert it yourself and load the GGUF file",
                provider=self.name,
                path=repr(os.fspath(directory)),
            ) from error

    # Worker-thread code -----------------------------------------------------------------------------------

    def _llama_cpp(self) -> Any:
        llama_cpp = import_optional("llama_cpp", extra="llamacpp", provider=self.name)
        _install_log_filter(llama_cpp)
        if self._hot_swap is None:
            has_api = all(
                hasattr(llama_cpp, name)
                for name in ("llama_adapter_lora_init", "llama_adapter_lora_free", "llama_set_adapters_lora")
            )
            self._hot_swap = self._hot_swap_requested and has_api
        return llama_cpp

    def _ensure_model(self, lora_path: Path | None = None) -> Any:
        """Return the loaded ``Llama``, loading it on first use (calls never overlap, so it loads once).

        In reload mode, ``lora_path`` is the adapter the model must be built with; a different one than
        the current model's rebuilds it.
        """
        llama_cpp = self._llama_cpp()
        if self._llama is not None and (self._hot_swap or lora_path == self._model_lora_path):
            return self._llama
        if self._llama is not None:  # reload mode, another adapter: rebuild the model with it
            self._llama.close()
            self._llama = None
            self._active = ()
        if not self.model_path.is_file():
            raise ModelLoadError(
                f"GGUF model file {self.model_path} does not exist: set model_path or LLAMACPP_MODEL_PATH "
                "to a .gguf file",
                provider=self.name,
                path=str(self.model_path),
            )
        if not _is_utf8(self.model_path):
            raise ModelLoadError(
                f"GGUF model path {os.fspath(self.model_path)!r} is not valid UTF-8, which llama-cpp-python needs: "
                "rename or move the file",
                provider=self.name,
                path=repr(os.fspath(self.model_path)),
            )
        kwargs: dict[str, Any] = {
            "n_ctx": self.n_ctx,
            "n_gpu_layers": self.n_gpu_layers,
            "n_batch": min(self._n_batch, self.n_ctx),
            "verbose": self._verbose,
        }
        if self._n_threads is not None:  # prompts too (llama-cpp-python would give them every CPU)
            kwargs["n_threads"] = kwargs["n_threads_batch"] = self._n_threads
        if self.kv_cache_type is not None:
            kwargs["type_k"] = kwargs["type_v"] = KV_CACHE_TYPES[self.kv_cache_type]
        if lora_path is not None:
            kwargs["lora_path"] = str(lora_path)
        try:
            llama = llama_cpp.Llama(model_path=str(self.model_path), **kwargs)
            if self.n_parallel > 1 or self._flash_attn:
                _own_context(llama, self.n_parallel, self._flash_attn)
        except Exception as error:  # llama-cpp-python raises ValueError/RuntimeError with no detail
            raise ModelLoadError(
                f"llama.cpp could not load {self.model_path} ({error}): check that it is a complete "
                "GGUF model file of an architecture this llama.cpp build supports",
                provider=self.name,
                path=str(self.model_path),
            ) from error
        self._loads += 1
        self._llama = llama
        self._model_lora_path = lora_path
        if self._info is None:
            self._info = self._read_model_info(llama)
            if self._info.chat_template:
                from llama_cpp.llama_chat_format import Jinja2ChatFormatter

                self._formatter = Jinja2ChatFormatter(
                    template=self._info.chat_template,
                    eos_token=self._info.eos_token,
                    bos_token=self._info.bos_token,
                    add_generation_prompt=True,
                )
        return llama

    @staticmethod
    def _read_model_info(llama: Any) -> _ModelInfo:
        metadata: dict[str, str] = dict(llama.metadata or {})

        def token_text(token: int) -> str:
            if token < 0:
                return ""
            return bytes(llama.detokenize([token], special=True)).decode("utf-8", errors="replace")

        return _ModelInfo(
            architecture=metadata.get("general.architecture", ""),
            chat_template=metadata.get("tokenizer.chat_template") or None,
            bos_token=token_text(llama.token_bos()),
            eos_token=token_text(llama.token_eos()),
        )

    def _model_info(self) -> _ModelInfo:
        if self._info is None:
            self._ensure_model(None)
        assert self._info is not None
        return self._info

    def _init_adapter_blocking(self, gguf_path: Path) -> Any:
        """Check a GGUF LoRA against the base model and, with hot-swap, load it into llama.cpp.

        In reload mode the adapter is loaded once and freed again, where llama.cpp has the adapter API:
        a LoRA llama.cpp refuses then fails here, as with hot-swap, instead of when a request rebuilds the
        model with it (llama-cpp-python does not check for that refusal and crashes).
        """
        info = self._model_info()
        lora_architecture = _read_lora_architecture(gguf_path)
        if lora_architecture != info.architecture:
            raise InvalidAdapterError(
                f"adapter {gguf_path} is a LoRA for architecture {lora_architecture!r}, but the base model "
                f"{self.model_path.name} is {info.architecture!r}: "
                "use an adapter trained for this base model",
                provider=self.name,
                path=str(gguf_path),
            )
        llama_cpp = self._llama_cpp()
        if not self._hot_swap:
            if not _is_utf8(gguf_path):
                raise InvalidAdapterError(
                    f"adapter path {os.fspath(gguf_path)!r} is not valid UTF-8, which llama-cpp-python needs to "
                    "rebuild the model with it (hot_swap=False): rename or move the file",
                    provider=self.name,
                    path=repr(os.fspath(gguf_path)),
                )
            if not hasattr(llama_cpp, "llama_adapter_lora_init"):
                return None
        llama = self._llama if self._llama is not None else self._ensure_model()
        handle = llama_cpp.llama_adapter_lora_init(llama.model, os.fsencode(gguf_path))  # the path's own bytes
        if not handle:  # a NULL pointer: llama.cpp refused it (tensor names or shapes the model lacks)
            raise InvalidAdapterError(
                f"llama.cpp refused the LoRA adapter {gguf_path}: its tensors do not fit the base model "
                f"{self.model_path.name} (names or shapes differ); convert it against this base model",
                provider=self.name,
                path=str(gguf_path),
            )
        if not self._hot_swap:  # checked; the model is rebuilt with lora_path when a request needs it
            llama_cpp.llama_adapter_lora_free(handle)
            return None
        return handle

    def _add_adapter_blocking(self, adapter_id: str, gguf_path: Path) -> None:
        """Load ``gguf_path`` into llama.cpp and record it as resident under ``adapter_id``."""
        stale = self._resident.pop(adapter_id, None)  # never expected: the registry unloads before loading
        if stale is not None:
            self._free_adapter_blocking(adapter_id, stale)
        files = None if self._hot_swap else files_state(str(gguf_path))  # before llama.cpp reads it
        handle = self._init_adapter_blocking(gguf_path)
        self._resident[adapter_id] = _Adapter(gguf_path=gguf_path, handle=handle, files=files)

    def _remove_adapter_blocking(self, adapter_id: str) -> None:
        adapter = self._resident.pop(adapter_id, None)
        if adapter is not None:
            self._free_adapter_blocking(adapter_id, adapter)

    def _free_adapter_blocking(self, adapter_id: str, adapter: _Adapter) -> None:
        if any(active_id == adapter_id for active_id, _ in self._active):
            if self._hot_swap and self._llama is not None:
                self._set_context_adapters([])
            elif self._llama is not None:  # reload mode: the model has it baked in; rebuild on next use
                self._llama.close()
                self._llama = None
            self._active = ()
        if adapter.handle is not None:
            self._llama_cpp().llama_adapter_lora_free(adapter.handle)
            adapter.handle = None

    def _close_blocking(self) -> None:
        """Free every resident adapter and the model (the last call the worker runs)."""
        while self._resident:
            self._remove_adapter_blocking(next(iter(self._resident)))
        if self._llama is not None:
            self._llama.close()
            self._llama = None

    def _set_context_adapters(self, applied: list[tuple[Any, float]]) -> None:
        """Make ``applied`` (handle, scale pairs) the context's adapters (``[]`` clears them); reset the KV cache."""
        llama_cpp = self._llama_cpp()
        llama = self._llama
        if not applied:
            llama_cpp.llama_set_adapters_lora(llama.ctx, None, 0, None)
        else:
            adapters = (llama_cpp.llama_adapter_lora_p_ctypes * len(applied))(*(handle for handle, _ in applied))
            scales = (ctypes.c_float * len(applied))(*(scale for _, scale in applied))
            llama_cpp.llama_set_adapters_lora(llama.ctx, adapters, len(applied), scales)
        llama.reset()  # Llama.generate would otherwise reuse KV entries computed under the other adapter

    def _activate(self, adapters: AdapterScales) -> Any:
        """Return the model with ``adapters`` (backend names and scales; ``()``: none) applied, switched
        (hot-swap) or rebuilt (reload) if needed."""
        resident = []
        for adapter_id, _ in adapters:
            adapter = self._resident.get(adapter_id)
            if adapter is None:
                raise self._not_loaded(adapter_id)
            resident.append(adapter)
        self._llama_cpp()
        if not self._hot_swap:  # reload mode: rebuild the model with lora_path when the adapter changes
            if len(adapters) > 1 or any(scale != 1.0 for _, scale in adapters):
                raise UnsupportedOperationError(
                    "scaled or combined adapters need llama.cpp's adapter API, which reload mode (hot_swap=False, "
                    "or a llama-cpp-python without the API) does not use: apply one adapter at scale 1",
                    provider=self.name,
                )
            if resident:
                self._refuse_rewritten(adapters[0][0], resident[0])
            llama = self._ensure_model(resident[0].gguf_path if resident else None)
            self._active = adapters
            return llama
        llama = self._ensure_model()
        if adapters != self._active:
            applied = [(adapter.handle, scale) for adapter, (_, scale) in zip(resident, adapters, strict=True)]
            self._set_context_adapters(applied)
            self._active = adapters
        return llama

    def _refuse_rewritten(self, name: str, adapter: _Adapter) -> None:
        """Reload mode rebuilds the model from the adapter's file: refuse one rewritten since its load."""
        if adapter.files is not None and files_state(str(adapter.gguf_path)) != adapter.files:
            raise InvalidAdapterError(
                f"adapter {name.partition('@')[0]!r} must be read again from {adapter.gguf_path} (reload mode rebuilds "
                "the model at each adapter switch) and the file changed since it was loaded, which would serve "
                "other weights under the same id: call load_adapter(..., replace=True) to serve the new file",
                provider=self.name,
                path=str(adapter.gguf_path),
            )

    def _prompt_tokens(self, llama: Any, request: GenerationRequest) -> list[int]:
        """Token ids per the in-process prompt rule (:mod:`inference._inprocess.base`)."""
        if self._formatter is not None:
            try:
                rendered: str = self._formatter(messages=chat_messages(request)).prompt
            except Exception as error:  # jinja2 errors, raise_exception() in the template
                raise InvalidRequestError(
                    f"the chat template of {self.model_path.name} cannot render this request ({error})",
                    provider=self.name,
                ) from error
            return self._encode(llama, rendered, add_bos=False)
        # add_bos=True means "as the model's vocabulary says" (llama_vocab_get_add_bos).
        return self._encode(llama, plain_prompt(request), add_bos=True)

    def _encode(self, llama: Any, text: str, *, add_bos: bool) -> list[int]:
        """Token ids of ``text`` as the model's Hugging Face tokenizer makes them (see :class:`TextEncoder`)."""
        if self._text is None:
            self._text = TextEncoder.for_model(llama)
        return self._text.encode(self._llama_cpp(), llama, text, add_bos=add_bos)

    def _vocabulary(self, llama: Any) -> Vocabulary:
        """The scoring rule's view of the model's tokenizer (:mod:`inference._core.scoring`)."""
        llama_cpp = self._llama_cpp()
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        bos, eos = llama.token_bos(), llama.token_eos()
        return Vocabulary(
            encode=lambda text: self._encode(llama, text, add_bos=False),
            adds_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
            bos_id=bos if bos >= 0 else None,
            eos_id=eos if eos >= 0 else None,
        )

    def _score_blocking(self, request: ScoreRequest, rolling: bool) -> ScoreResult:
        """Score on the worker thread: each sequence evaluated once, with the request's adapter active."""
        adapters: AdapterScales = ((request.adapter_id, 1.0),) if request.adapter_id is not None else ()
        llama = self._activate(adapters)
        vocabulary = self._vocabulary(llama)
        sequences: list[ScoreTokens]
        if rolling:
            sequences = rolling_windows(vocabulary, request.continuation, self.n_ctx, provider=self.name)
        else:
            sequences = [score_tokens(vocabulary, request.context, request.continuation, provider=self.name)]
        for sequence in sequences:
            if len(sequence.tokens) - 1 > self.n_ctx:
                length = len(sequence.tokens) - 1
                raise too_long(length, self.n_ctx, provider=self.name, setting="n_ctx (LLAMACPP_N_CTX)")
        numpy = import_optional("numpy", provider=self.name, extra="llamacpp")
        logprob, greedy, count = 0.0, True, 0
        for sequence in sequences:
            value, is_greedy = score_sequence(self._llama_cpp(), numpy, llama, sequence)
            if not math.isfinite(value):  # NaN or infinite logits: finite ones give a finite log-softmax
                raise non_finite_logits(self.name, adapters)
            logprob, greedy, count = logprob + value, greedy and is_greedy, count + len(sequence.scored)
        return ScoreResult(logprob, count, greedy, model=self.model_name, adapter_id=request.adapter_id)

    def _json_mask(self, llama: Any, request: GenerationRequest) -> JsonMask | None:
        """The request's JSON-schema mask, compiled before anything is generated (``None`` without a schema)."""
        if request.json_schema is None:
            return None
        numpy = import_optional("numpy", provider=self.name, extra="llamacpp")
        if self._grammars is None:
            llguidance = import_optional("llguidance", provider=self.name, extra="llamacpp")
            from llguidance.llamacpp import lltokenizer_from_vocab

            vocab = self._llama_cpp().llama_model_get_vocab(llama.model)
            with warnings.catch_warnings():  # llguidance calls llama_token_get_attr, deprecated by llama-cpp-python
                warnings.simplefilter("ignore", DeprecationWarning)
                self._grammars = JsonGrammars(llguidance, lltokenizer_from_vocab(vocab))
        try:
            return JsonMask(numpy, self._grammars.matcher(request.json_schema))
        except SchemaRefused as error:
            raise InvalidRequestError(
                f"json_schema cannot be compiled into a grammar ({error}): simplify the schema",
                provider=self.name,
            ) from error

    def _generate_blocking(
        self, request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event
    ) -> GenerationResult:
        """Generate on the worker thread (see :meth:`_decode_blocking`); a failure of llama.cpp itself (a
        ``llama_decode`` error, out of memory) is a :class:`ProviderError` naming it."""
        try:
            return self._decode_blocking(request, sink, cancel)
        except InferenceError:
            raise
        except Exception as error:
            raise ProviderError(
                f"llama.cpp failed to generate ({type(error).__name__}: {error}); the provider is still usable, "
                "try a shorter prompt or a smaller max_tokens if the context ran out",
                provider=self.name,
            ) from error

    def _decode_blocking(
        self, request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event
    ) -> GenerationResult:
        """Generate one request alone on the worker thread (``n_parallel=1``), with ``Llama.generate``.

        Each token goes to the request's :class:`Completion`, which decides when it ends and hands its
        pieces to ``sink``. Setting ``cancel`` stops the loop after the current token (the result is then of
        no use to anyone), and stops the prompt's evaluation inside ``llama_decode`` (llama.cpp's abort
        callback, set until the first token: a long prompt is seconds of work on a busy CPU); a request
        cancelled before it starts returns at once without touching the model.
        """
        if cancel.is_set():
            return self._cancelled(request)
        llama = self._activate(request.adapters)
        prompt, completion = self._prepare(llama, request, sink)
        tokens = llama.generate(prompt, **self._sampling(llama, request, completion))
        llama_cpp = self._llama_cpp()
        abort = llama_cpp.ggml_abort_callback(lambda _data: cancel.is_set())
        llama_cpp.llama_set_abort_callback(llama.ctx, abort, None)
        aborting = True
        failed = True
        try:
            for token in tokens:
                if aborting:  # the prompt is in: one-token steps need no abort (and a Python call per graph node)
                    llama_cpp.llama_set_abort_callback(llama.ctx, llama_cpp.ggml_abort_callback(), None)
                    aborting = False
                if cancel.is_set() or completion.add(token, lambda: completion.tokens.logits(llama.ctx, -1)):
                    break
            failed = False
        except RuntimeError:
            if not cancel.is_set():
                raise
            failed = False  # llama_decode aborted the prompt: its cells are already removed, nothing is poisoned
            return self._cancelled(request)
        finally:
            if aborting:
                llama_cpp.llama_set_abort_callback(llama.ctx, llama_cpp.ggml_abort_callback(), None)
            tokens.close()  # released here, on the worker thread, not whenever it is collected
            if failed:  # NaN logits leave NaN in the KV cache, which would poison the next requests
                clear_memory(self._llama_cpp(), llama)
        return completion.result(model=self.model_name, prompt_tokens=len(prompt))

    def _prepare(self, llama: Any, request: GenerationRequest, sink: PieceSink | None) -> tuple[list[int], Completion]:
        """Tokenise a request, check that it fits the context and compile its JSON mask (worker thread)."""
        prompt = self._prompt_tokens(llama, request)
        self._require_prompt(prompt)
        room = self.n_ctx - len(prompt)
        if room < 1:
            raise InvalidRequestError(
                f"the prompt is {len(prompt)} tokens, which does not fit the context of {self.n_ctx} tokens: "
                "shorten it or raise n_ctx (LLAMACPP_N_CTX)",
                provider=self.name,
            )
        if self._tokens is None or self._tokens.llama is not llama:
            numpy = import_optional("numpy", provider=self.name, extra="llamacpp")
            self._tokens = TokenText(self._llama_cpp(), numpy, llama, self.name)
        mask = self._json_mask(llama, request)
        return prompt, Completion(request, self._tokens, sink, min(request.max_tokens, room), mask)

    def _sampling(self, llama: Any, request: GenerationRequest, completion: Completion) -> dict[str, Any]:
        """The sampler settings of a request, as ``Llama.generate`` takes them; sets the model's seed."""
        llama_cpp = self._llama_cpp()
        seed = request.seed if request.seed is not None else self.seed
        llama.set_seed(seed if seed is not None else llama_cpp.LLAMA_DEFAULT_SEED)
        return {
            "temp": DEFAULT_SAMPLING["temperature"] if request.temperature is None else request.temperature,
            "top_p": DEFAULT_SAMPLING["top_p"] if request.top_p is None else request.top_p,
            "top_k": int(DEFAULT_SAMPLING["top_k"]) if request.top_k is None else request.top_k,
            "min_p": DEFAULT_SAMPLING["min_p"],
            "repeat_penalty": (
                DEFAULT_SAMPLING["repeat_penalty"]
                if request.repetition_penalty is None
                else request.repetition_penalty
            ),
            "logits_processor": None if completion.mask is None else llama_cpp.LogitsProcessorList([completion.mask]),
        }

    # Continuous batching (n_parallel > 1) -----------------------------------------------------------------

    def _start_batched(
        self, request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event
    ) -> asyncio.Future[GenerationResult]:
        """Queue a request for the decode loop; the returned future drives the loop until it is answered."""
        assert self._batcher is not None
        entry = self._batcher.put(request, sink, cancel)
        loop_call = self._worker.submit(self._serve_batch)  # queued now: a later aclose() runs after it
        return asyncio.ensure_future(self._await_batched(entry, loop_call))

    async def _await_batched(self, entry: BatchEntry, loop_call: asyncio.Future[None]) -> GenerationResult:
        """Wait for ``entry``'s answer while a decode loop runs on the worker thread.

        The answer comes the moment its sequence ends (the loop goes on for the others). When the loop
        returns without it (it gave way to a load or a score queued behind it), the loop is queued again.
        """
        assert self._batcher is not None
        answer = asyncio.wrap_future(entry.future)
        answer.add_done_callback(_retrieve)  # read through entry.future below
        try:
            while True:
                waiting: set[asyncio.Future[Any]] = {answer, loop_call}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if loop_call.done():
                    loop_call.result()  # a failure of the loop itself (the model could not load)
                if entry.future.done():
                    return entry.future.result()
                if loop_call.done():
                    loop_call = self._worker.submit(self._serve_batch)
        finally:
            if not entry.future.done():
                self._batcher.discard(entry)
            if not loop_call.done():
                loop_call.cancel()  # dropped if it has not started; a running loop serves the others on
                loop_call.add_done_callback(_retrieve)

    def _serve_batch(self) -> None:
        """Run the decode loop on the worker thread (see :mod:`inference._inprocess.llamacpp_batch`)."""
        assert self._batcher is not None
        self._batcher.serve(_BatchBackend(self))

    def _cancelled(self, request: GenerationRequest) -> GenerationResult:
        """The (unread) result of a request whose caller gave up before it started."""
        return GenerationResult(
            text="", model=self.model_name, adapter_id=request.adapter_id, token_count=0, finish_reason="stop"
        )


class _BatchBackend:
    """The provider as the decode loop sees it (:class:`~inference._inprocess.llamacpp_batch.BatchBackend`)."""

    def __init__(self, provider: LlamaCppProvider) -> None:
        self.provider = provider
        self.llama_cpp = provider._llama_cpp()

    def activate(self, adapters: AdapterScales) -> Any:
        return self.provider._activate(adapters)

    def start(self, llama: Any, entry: BatchEntry) -> Started:
        provider = self.provider
        prompt, completion = provider._prepare(llama, entry.request, entry.sink)
        sampling = provider._sampling(llama, entry.request, completion)
        sampler = llama._init_sampler(  # the chain Llama.generate builds, seeded with the request's seed
            top_k=sampling["top_k"],
            top_p=sampling["top_p"],
            min_p=sampling["min_p"],
            temp=sampling["temp"],
            repeat_penalty=sampling["repeat_penalty"],
            logits_processor=sampling["logits_processor"],
        )
        return Started(prompt, sampler, completion)

    def finish(self, entry: BatchEntry, completion: Completion, prompt_tokens: int) -> GenerationResult:
        return completion.result(model=self.provider.model_name, prompt_tokens=prompt_tokens)

    def failed(self, error: BaseException) -> BaseException:
        if isinstance(error, InferenceError):
            return error
        return ProviderError(
            f"llama.cpp failed to generate ({type(error).__name__}: {error}); the provider is still usable",
            provider=self.provider.name,
        )

    def others_waiting(self) -> bool:
        if self.provider._closed:  # aclose() queued: the requests that came before it are served first
            return False
        worker = self.provider._worker
        return worker.waiting() > worker.waiting(self.provider._serve_batch)


def _own_context(llama: Any, n_parallel: int, flash_attn: bool) -> None:
    """Give ``llama`` the provider's context: ``n_parallel`` sequences sharing one KV cache of ``n_ctx`` cells, and
    flash attention as asked.

    llama-cpp-python's ``Llama`` makes a one-sequence context; this replaces it with the same settings plus
    ``n_seq_max``, the flash attention setting and a unified KV cache (each sequence may use any cell, so one
    request alone still has the whole context). The new context is freed with the model, before it.
    """
    from llama_cpp import _internals

    llama_cpp = sys.modules["llama_cpp"]
    params = llama.context_params
    params.n_seq_max = n_parallel
    if hasattr(params, "kv_unified"):
        params.kv_unified = n_parallel > 1
    if hasattr(params, "flash_attn_type"):
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
    shared = _internals.LlamaContext(model=llama._model, params=params, verbose=llama.verbose)
    single, llama._ctx = llama._ctx, shared
    single.close()
    adapter = getattr(llama, "_lora_adapter", None)  # reload mode: the adapter Llama set on the old context
    if adapter is not None:
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter)
        scales = (ctypes.c_float * 1)(1.0)
        if llama_cpp.llama_set_adapters_lora(shared.ctx, adapters, 1, scales):
            raise RuntimeError("llama.cpp could not set the LoRA adapter on the shared context")


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an abandoned future's error as seen (nobody waits for it any more)."""
    if not future.cancelled():
        future.exception()


_log_mode = threading.local()  # ``verbose`` of the provider whose worker this thread is; unset elsewhere
_log_filter_lock = threading.Lock()
_log_filter: Any = None  # the installed ctypes callback (kept referenced: llama.cpp calls it for ever)


def _set_thread_log_mode(verbose: bool) -> None:
    """Worker-thread initializer: llama.cpp's log lines from this thread print only if ``verbose``."""
    _log_mode.verbose = verbose


def _install_log_filter(llama_cpp: Any) -> None:
    """Route llama.cpp's log lines by thread, once per process (``llama_log_set`` is process-wide).

    On a provider's worker thread, a line goes to stderr only when that provider has ``verbose=True``;
    with ``verbose=False`` nothing is printed. llama-cpp-python's own filter cannot be relied on: it
    reads ggml's log levels with an older numbering, so with ``verbose=False`` it prints llama.cpp's
    warnings (e.g. "n_ctx_seq (4096) > n_ctx_train (512)" when a context is created) and hides its
    errors, and only the model load itself runs with stderr redirected. Lines logged on any other
    thread (a ``Llama`` the application uses itself) still go to llama-cpp-python's callback.
    """
    global _log_filter
    with _log_filter_lock:
        if _log_filter is not None or not hasattr(llama_cpp, "llama_log_set"):
            return
        try:
            from llama_cpp import _logger

            fallback = getattr(_logger, "llama_log_callback", None)
        except ImportError:  # another llama-cpp-python layout: lines off our threads are dropped
            fallback = None

        def route(level: int, text: bytes | None, user_data: Any) -> None:
            verbose = getattr(_log_mode, "verbose", None)
            if verbose is None:
                if fallback is not None:
                    fallback(level, text, user_data)
            elif verbose and text:
                sys.stderr.write(text.decode("utf-8", errors="replace"))
                sys.stderr.flush()

        _log_filter = llama_cpp.llama_log_callback(route)
        llama_cpp.llama_log_set(_log_filter, ctypes.c_void_p(0))


def _is_utf8(path: Path) -> bool:
    """True when ``path`` encodes to UTF-8 (a name with undecodable bytes carries surrogates after fsdecode)."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _seed_fits(seed: int) -> bool:
    return 0 <= seed <= MAX_SEED


def _seed_rule(seed: int) -> str:
    return (
        f"{seed} is out of range for llama.cpp: use an integer in [0, {MAX_SEED}] "
        "(llama.cpp seeds are 32-bit and 4294967295 means a random seed), or None for a fresh random seed"
    )


def _read_lora_architecture(path: Path) -> str:
    """Return ``general.architecture`` of a GGUF LoRA file, refusing files that are not GGUF LoRA adapters."""
    gguf = import_optional("gguf", extra="llamacpp", provider=_PROVIDER)

    def refuse(reason: str) -> InvalidAdapterError:
        return InvalidAdapterError(f"adapter {path} {reason}", provider=_PROVIDER, path=str(path))

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # bad magic, truncated file, unreadable
        raise refuse(
            f"is not a readable GGUF file ({error}): give a GGUF LoRA file or a PEFT adapter directory"
        ) from error

    def field(key: str) -> str | None:
        value = reader.get_field(key)
        return str(value.contents()) if value is not None else None

    general_type, adapter_type = field("general.type"), field("adapter.type")
    if general_type != "adapter" or (adapter_type or "lora") != "lora":
        raise refuse(
            f"is a GGUF file of type {general_type or 'model'!r}, not a LoRA adapter "
            "(general.type 'adapter', adapter.type 'lora'): "
            "convert the adapter with `inference convert-adapter`"
        )
    architecture = field("general.architecture")
    if not architecture:
        raise refuse("has no general.architecture: it was not written by a GGUF LoRA converter")
    return architecture
