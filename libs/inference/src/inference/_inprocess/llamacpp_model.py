"""The llama.cpp base model of a provider and the LoRA adapters applied to it: loading, hot-swap, reload mode.

:class:`LlamaCppModel` owns the provider's ``Llama`` object (touched on the worker thread only). It loads the model
on first use with the provider's :class:`LlamaSettings` (with the provider's own context, see
:func:`~inference._inprocess.llamacpp_native.share_context`), reads once what the model says about itself
(:class:`ModelInfo`, and the renderer of its chat template), checks GGUF LoRA files against it, and applies the
adapters a request asks for, in one of two modes:

- **hot-swap** (llama.cpp's adapter API): each adapter is loaded once (``llama_adapter_lora_init``) and set on the
  context per request (``llama_set_adapters_lora``), at any scale, several at once; the KV cache is reset at a
  switch, because ``Llama.generate`` reuses a matching token prefix and knows nothing about adapters;
- **reload mode** (``hot_swap=False``, or a llama-cpp-python without the API): the model is rebuilt with
  ``Llama(model_path, lora_path=...)`` whenever the adapter changes; one adapter at scale 1, and a file rewritten
  since its load is refused.

Which adapters are resident (by id) is the provider's record; it keeps a :class:`ResidentAdapter` per id, and this
module keeps which of them are applied now.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from inference._core.dependencies import import_optional
from inference._core.hub import hub_file, hub_gguf
from inference._core.lifecycle import FilesState, files_state
from inference._core.model_loads import ModelLoads
from inference._core.validation import AdapterScales
from inference._inprocess.chat_templates import ChatTemplate
from inference._inprocess.llamacpp_native import (
    free_adapter,
    has_adapter_api,
    init_adapter,
    install_log_filter,
    set_context_adapters,
    share_context,
)
from inference.adapters.gguf_cache import CachePin, pin_entry
from inference.adapters.gguf_layout import lora_types_problem
from inference.exceptions import InferenceError, InvalidAdapterError, ModelLoadError, UnsupportedOperationError

__all__ = [
    "KV_CACHE_TYPES",
    "QUANTIZED_KV_CACHE_TYPES",
    "LlamaCppModel",
    "LlamaSettings",
    "ModelInfo",
    "ResidentAdapter",
    "convert_peft",
    "gguf_file",
    "gguf_name",
    "read_lora_architecture",
]

KV_CACHE_TYPES: dict[str, int] = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "bf16": 30}
QUANTIZED_KV_CACHE_TYPES = frozenset({"q4_0", "q8_0"})
"""The KV cache types llama.cpp takes only with flash attention on (for the V cache)."""
"""``kv_cache_type`` names and the GGML type ids llama.cpp takes as ``type_k``/``type_v``."""


@dataclass(frozen=True)
class LlamaSettings:
    """What the provider's ``Llama`` is built with: its constructor's settings of the same names, resolved."""

    model_path: Path
    n_ctx: int
    n_gpu_layers: int
    n_batch: int
    n_threads: int | None
    kv_cache_type: str | None
    flash_attn: bool
    n_parallel: int
    verbose: bool
    hot_swap: bool
    """Asked for; used where llama.cpp has the adapter API."""

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> LlamaSettings:
        """The fields' values in the provider's resolved settings (checked there)."""
        values = {field.name: settings[field.name] for field in fields(cls)}
        return cls(**{**values, "model_path": Path(values["model_path"])})


@dataclass
class ResidentAdapter:
    """One adapter resident in llama.cpp: the GGUF LoRA file used, and llama.cpp's handle."""

    gguf_path: Path
    handle: Any = None  # llama_adapter_lora_p; None in reload mode
    files: FilesState = None  # reload mode: the file as it was at load, for the rebuilds that read it again


@dataclass(frozen=True)
class ModelInfo:
    """What the loaded base model says about itself, read once at first load."""

    architecture: str
    chat_template: str | None
    bos_token: str
    eos_token: str

    @classmethod
    def read(cls, llama: Any) -> ModelInfo:
        """The info of a loaded ``Llama`` (its GGUF metadata and special tokens)."""
        metadata: dict[str, str] = dict(llama.metadata or {})

        def token_text(token: int) -> str:
            if token < 0:
                return ""
            return bytes(llama.detokenize([token], special=True)).decode("utf-8", errors="replace")

        return cls(
            architecture=metadata.get("general.architecture", ""),
            chat_template=metadata.get("tokenizer.chat_template") or None,
            bos_token=token_text(llama.token_bos()),
            eos_token=token_text(llama.token_eos()),
        )


class LlamaCppModel:
    """The provider's ``Llama`` and the adapters applied to it (worker thread only; calls never overlap).

    Args:
        settings: What the ``Llama`` is built with.
        provider: The provider's name, for errors.
        load_record: Where a failure to load the base model (not one built with an adapter, in reload mode) is
            remembered until a load succeeds: the provider's, which its health reports.

    Attributes:
        llama: The loaded ``Llama``; ``None`` before the first load (and in reload mode, between a rebuild's close
            and its load).
        info: What the model says about itself; ``None`` until the first load.
        formatter: The renderer of the model's chat template (rendered as Transformers renders it:
            :class:`~inference._inprocess.chat_templates.ChatTemplate`); ``None`` for a model without one.
        hot_swap: True with llama.cpp's adapter API, False in reload mode; ``None`` until llama.cpp is imported.
        active: The adapters (backend names and scales) set on the context (hot-swap) or baked in (reload).
        loads: How many times the base model was loaded.
    """

    def __init__(self, settings: LlamaSettings, provider: str, load_record: ModelLoads | None = None) -> None:
        self.settings = settings
        self.provider = provider
        self.load_record = load_record if load_record is not None else ModelLoads()
        self.llama: Any = None
        self.info: ModelInfo | None = None
        self.formatter: ChatTemplate | None = None
        self.hot_swap: bool | None = None  # decided when llama_cpp is first imported
        self.active: AdapterScales = ()
        self.loads = 0
        self._lora_path: Path | None = None  # reload mode: the adapter the model was built with
        self._file: Path | None = None  # the GGUF file, once resolved (a Hub id's cached file)
        # Pins on converted adapters' cache entries (gguf_cache), by file: taken at conversion, kept while loaded
        self._pins_lock = threading.Lock()  # conversions run in helper threads, loads on the worker
        self._converted: dict[str, list[CachePin]] = {}
        self._loaded: dict[str, list[CachePin]] = {}
        self._pins_closed = False  # closed: a conversion finishing after it pins nothing

    @property
    def name(self) -> str:
        """The model's name: the GGUF file's stem."""
        return gguf_name(self.settings.model_path)

    def file(self) -> Path:
        """The GGUF file: ``model_path``, or the cached file of a Hub id (resolved once, see :func:`gguf_file`)."""
        if self._file is None:
            self._file = gguf_file(self.settings.model_path, self.provider)
        return self._file

    def llama_cpp(self) -> Any:
        """The ``llama_cpp`` module (imported on first use, with the log filter; decides hot-swap or reload mode)."""
        llama_cpp = import_optional("llama_cpp", extra="llamacpp", provider=self.provider)
        install_log_filter(llama_cpp)
        if self.hot_swap is None:
            self.hot_swap = self.settings.hot_swap and has_adapter_api(llama_cpp)
        return llama_cpp

    def load(self, lora_path: Path | None = None) -> Any:
        """Return the loaded ``Llama``, loading it on first use (calls never overlap, so it loads once).

        In reload mode, ``lora_path`` is the adapter the model must be built with; a different one than
        the current model's rebuilds it.
        """
        llama_cpp = self.llama_cpp()
        if self.llama is not None and (self.hot_swap or lora_path == self._lora_path):
            return self.llama
        if self.llama is not None:  # reload mode, another adapter: rebuild the model with it
            self.llama.close()
            self.llama = None
            self.active = ()
        # A failure with an adapter baked in (reload mode) may be the adapter's: the model may still load without it
        with self.load_record.attempt() if lora_path is None else contextlib.nullcontext():
            llama = self._build(llama_cpp, lora_path)
        self.loads += 1
        self.llama = llama
        self._lora_path = lora_path
        if self.info is None:
            self.info = ModelInfo.read(llama)
            self.formatter = chat_formatter(self.info)
        return llama

    def _build(self, llama_cpp: Any, lora_path: Path | None) -> Any:
        """A new ``Llama`` of the GGUF file (with ``lora_path`` baked in, in reload mode)."""
        settings = self.settings
        model_path = self.file()
        if not model_path.is_file():
            raise missing_model(model_path, self.provider)
        require_utf8(model_path, ModelLoadError, "GGUF model path", "", self.provider)
        kwargs: dict[str, Any] = {
            "n_ctx": settings.n_ctx,
            "n_gpu_layers": settings.n_gpu_layers,
            "n_batch": min(settings.n_batch, settings.n_ctx),
            "verbose": settings.verbose,
        }
        if settings.n_threads is not None:  # prompts too (llama-cpp-python would give them every CPU)
            kwargs["n_threads"] = kwargs["n_threads_batch"] = settings.n_threads
        if settings.kv_cache_type is not None:
            kwargs["type_k"] = kwargs["type_v"] = KV_CACHE_TYPES[settings.kv_cache_type]
        if settings.flash_attn:  # from the first context on: llama.cpp builds a quantized V cache only with it
            kwargs["flash_attn"] = True
        if lora_path is not None:
            kwargs["lora_path"] = str(lora_path)
        try:
            llama = llama_cpp.Llama(model_path=str(model_path), **kwargs)
            if settings.n_parallel > 1 or settings.flash_attn:
                share_context(llama, settings.n_parallel, settings.flash_attn)
        except Exception as error:  # llama-cpp-python raises ValueError/RuntimeError with no detail
            raise ModelLoadError(
                f"llama.cpp could not load {model_path} ({error}): check that it is a complete "
                "GGUF model file of an architecture this llama.cpp build supports",
                provider=self.provider,
                path=str(model_path),
            ) from error
        return llama

    def model_info(self) -> ModelInfo:
        """What the model says about itself (loading it first if needed)."""
        if self.info is None:
            self.load(None)
        assert self.info is not None
        return self.info

    def close(self) -> None:
        """Free the model (the adapters first: see :meth:`free_adapter`) and let the cache prune what it converted."""
        with self._pins_lock:
            pins = [pin for held in (self._converted, self._loaded) for pins in held.values() for pin in pins]
            self._pins_closed = True
            self._converted.clear()
            self._loaded.clear()
        for pin in pins:
            pin.release()
        if self.llama is not None:
            self.llama.close()
            self.llama = None

    # Adapters ---------------------------------------------------------------------------------------------------

    def convert_peft(self, directory: Path, model_path: Path, cache: Path) -> Path:
        """:func:`convert_peft`, its cache entry pinned until the adapter loaded from it is freed (helper thread).

        A prune elsewhere may remove the entry between conversion and pin: it is converted again.
        """
        for _ in range(3):
            path = convert_peft(directory, model_path, cache, self.provider)
            try:
                pin = pin_entry(path)
            except FileNotFoundError:
                continue
            with self._pins_lock:
                if not self._pins_closed:
                    self._converted.setdefault(str(path), []).append(pin)
                    return path
            pin.release()  # the provider closed during the conversion: its pins were all released
            return path
        raise InvalidAdapterError(
            f"the conversion of {directory} kept being removed from the cache {cache} before it could be loaded: "
            "raise INFERENCE_ADAPTER_CACHE_MAX_BYTES, or give the provider its own adapter_cache_dir",
            provider=self.provider,
            path=str(directory),
        )

    def init_adapter(self, gguf_path: Path) -> Any:
        """:meth:`_init_adapter`, the file pinned in the conversion cache while the adapter is loaded (reload mode
        reads it again at each switch; a reload after eviction finds it converted)."""
        key = str(gguf_path)
        with self._pins_lock:
            pin = self._converted[key].pop() if self._converted.get(key) else None
        if pin is None:
            with contextlib.suppress(FileNotFoundError):
                pin = pin_entry(gguf_path)
        try:
            handle = self._init_adapter(gguf_path)
        except BaseException:
            if pin is not None:
                pin.release()
            raise
        if pin is not None:
            with self._pins_lock:
                self._loaded.setdefault(key, []).append(pin)
        return handle

    def _init_adapter(self, gguf_path: Path) -> Any:
        """Check a GGUF LoRA against the base model and, with hot-swap, load it into llama.cpp (its handle; ``None``
        in reload mode).

        In reload mode the adapter is loaded once and freed again, where llama.cpp has the adapter API:
        a LoRA llama.cpp refuses then fails here, as with hot-swap, instead of when a request rebuilds the
        model with it (llama-cpp-python does not check for that refusal and crashes).
        """
        info = self.model_info()
        model_file = self.file().name
        lora_architecture = read_lora_architecture(gguf_path, self.provider)
        if lora_architecture != info.architecture:
            raise InvalidAdapterError(
                f"adapter {gguf_path} is a LoRA for architecture {lora_architecture!r}, but the base model "
                f"{model_file} is {info.architecture!r}: "
                "use an adapter trained for this base model",
                provider=self.provider,
                path=str(gguf_path),
            )
        llama_cpp = self.llama_cpp()
        if not self.hot_swap:
            need = " to rebuild the model with it (hot_swap=False)"
            require_utf8(gguf_path, InvalidAdapterError, "adapter path", need, self.provider)
            if not hasattr(llama_cpp, "llama_adapter_lora_init"):
                return None
        llama = self.llama if self.llama is not None else self.load()
        handle = init_adapter(llama_cpp, llama, gguf_path)
        if not handle:  # a NULL pointer: llama.cpp refused it (tensor names or shapes the model lacks)
            raise InvalidAdapterError(
                f"llama.cpp refused the LoRA adapter {gguf_path}: its tensors do not fit the base model "
                f"{model_file} (names or shapes differ); convert it against this base model",
                provider=self.provider,
                path=str(gguf_path),
            )
        if not self.hot_swap:  # checked; the model is rebuilt with lora_path when a request needs it
            free_adapter(llama_cpp, handle)
            return None
        return handle

    def free_adapter(self, adapter_id: str, adapter: ResidentAdapter) -> None:
        """Take ``adapter`` (resident under backend name ``adapter_id``) off the model, and free its handle."""
        with self._pins_lock:
            held = self._loaded.get(str(adapter.gguf_path))
            pin = held.pop() if held else None
        if pin is not None:
            pin.release()
        if any(active_id == adapter_id for active_id, _ in self.active):
            if self.hot_swap and self.llama is not None:
                set_context_adapters(self.llama_cpp(), self.llama, [])
            elif self.llama is not None:  # reload mode: the model has it baked in; rebuild on next use
                self.llama.close()
                self.llama = None
            self.active = ()
        if adapter.handle is not None:
            free_adapter(self.llama_cpp(), adapter.handle)
            adapter.handle = None

    def activate(self, adapters: AdapterScales, resident: Sequence[ResidentAdapter]) -> Any:
        """Return the model with ``adapters`` (backend names and scales; ``()``: none) applied, switched
        (hot-swap) or rebuilt (reload) if needed; ``resident`` holds each one's record, in the same order."""
        self.llama_cpp()
        if not self.hot_swap:  # reload mode: rebuild the model with lora_path when the adapter changes
            if len(adapters) > 1 or any(scale != 1.0 for _, scale in adapters):
                raise UnsupportedOperationError(
                    "scaled or combined adapters need llama.cpp's adapter API, which reload mode (hot_swap=False, "
                    "or a llama-cpp-python without the API) does not use: apply one adapter at scale 1",
                    provider=self.provider,
                )
            if resident:
                self._refuse_rewritten(adapters[0][0], resident[0])
            llama = self.load(resident[0].gguf_path if resident else None)
            self.active = adapters
            return llama
        llama = self.load()
        if adapters != self.active:
            applied = [(adapter.handle, scale) for adapter, (_, scale) in zip(resident, adapters, strict=True)]
            set_context_adapters(self.llama_cpp(), llama, applied)
            self.active = adapters
        return llama

    def _refuse_rewritten(self, name: str, adapter: ResidentAdapter) -> None:
        """Reload mode rebuilds the model from the adapter's file: refuse one rewritten since its load."""
        if adapter.files is not None and files_state(str(adapter.gguf_path)) != adapter.files:
            raise InvalidAdapterError(
                f"adapter {name.partition('@')[0]!r} must be read again from {adapter.gguf_path} (reload mode rebuilds "
                "the model at each adapter switch) and the file changed since it was loaded, which would serve "
                "other weights under the same id: call load_adapter(..., replace=True) to serve the new file",
                provider=self.provider,
                path=str(adapter.gguf_path),
            )


def chat_formatter(info: ModelInfo) -> ChatTemplate | None:
    """The renderer of the model's chat template, or ``None`` without a template."""
    if not info.chat_template:
        return None
    return ChatTemplate(info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token)


def convert_peft(directory: Path, model_path: Path, cache: Path, provider: str) -> Path:
    """Convert a PEFT directory to a GGUF LoRA for the base model at ``model_path`` (cached in ``cache``; runs in a
    helper thread, not the worker)."""
    from inference.adapters.gguf import convert_peft_to_gguf_cached

    model_path = gguf_file(model_path, provider)
    if not model_path.is_file():
        raise missing_model(model_path, provider, ", so no PEFT adapter can be converted for it")
    try:
        return Path(convert_peft_to_gguf_cached(directory, model_path, cache))
    except UnicodeError as error:  # e.g. a directory name with undecodable bytes, written into the GGUF
        raise InvalidAdapterError(
            f"adapter at {os.fspath(directory)!r} could not be converted to GGUF ({error}): rename or move it to a "
            "path that is valid UTF-8, or convert it yourself and load the GGUF file",
            provider=provider,
            path=repr(os.fspath(directory)),
        ) from error


def gguf_file(model_path: Path, provider: str) -> Path:
    """The GGUF file a ``model_path`` setting names: the path itself, or, for ``ORG/NAME:FILE.gguf`` where no such
    path exists, the file of that Hub repository in the Hugging Face cache (fetched there unless
    ``HF_HUB_OFFLINE`` is set), as ``Llama.from_pretrained(repo_id, filename)`` resolves it. Blocking."""
    hub = hub_gguf(os.fspath(model_path))
    return hub_file(*hub, provider) if hub is not None else model_path


def gguf_name(model_path: Path) -> str:
    """The model's name for a ``model_path`` setting: the GGUF file's stem (a Hub id's file too)."""
    hub = hub_gguf(os.fspath(model_path))
    return Path(hub[1]).stem if hub is not None else model_path.stem


def gguf_model_problem(model: str) -> str | None:
    """Why ``model`` (the ``model_path`` setting) names no GGUF file llama.cpp could load, checked without loading
    it (for health); ``None`` when it may load: a file, or ``ORG/NAME:FILE.gguf`` of the Hub (resolved at load)."""
    path = Path(model)
    if path.is_file() or hub_gguf(model) is not None:
        return None
    if path.is_dir():
        return (
            f"the model path {model} is a directory, not a GGUF file: set model_path (LLAMACPP_MODEL_PATH) to "
            "the .gguf file"
        )
    return f"the model file {model} does not exist"


def missing_model(model_path: Path, provider: str, consequence: str = "") -> ModelLoadError:
    """The error for a GGUF model file that does not exist (``consequence`` says what it prevents)."""
    return ModelLoadError(
        f"GGUF model file {model_path} does not exist{consequence}: set model_path or LLAMACPP_MODEL_PATH "
        "to a .gguf file, or to a GGUF file of a Hugging Face Hub repository (ORG/NAME:FILE.gguf)",
        provider=provider,
        path=str(model_path),
    )


def require_utf8(path: Path, error: type[InferenceError], what: str, need: str, provider: str) -> None:
    """Refuse a path llama-cpp-python cannot take: one that does not encode to UTF-8 (a name with undecodable bytes
    carries surrogates after fsdecode). ``what`` names the path, ``need`` says what for."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        message = f"{what} {os.fspath(path)!r} is not valid UTF-8, which llama-cpp-python needs{need}"
        raise error(f"{message}: rename or move the file", provider=provider, path=repr(os.fspath(path))) from None


def read_lora_architecture(path: Path, provider: str) -> str:
    """Return ``general.architecture`` of a GGUF LoRA file, refusing files that are not GGUF LoRA adapters."""
    gguf = import_optional("gguf", extra="llamacpp", provider=provider)

    def refuse(reason: str) -> InvalidAdapterError:
        return InvalidAdapterError(f"adapter {path} {reason}", provider=provider, path=str(path))

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
    problem = lora_types_problem(tensor.tensor_type for tensor in reader.tensors)
    if problem is not None:
        raise refuse(problem)
    return architecture
