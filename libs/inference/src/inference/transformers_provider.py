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

Which adapters the user loaded (ids, paths, pins, LRU order) is the base class's registry; this module only
tracks the adapters resident in the PEFT model now, each under an internal PEFT adapter name
(``inference_0_adapter``, ``inference_1_adapter``...), because PEFT refuses names that adapter ids may be:
with a ``.`` (``lr0.001``), or equal to an attribute of torch's ``ModuleDict`` (``train``, ``eval``, ``keys``).

torch, transformers and peft are imported on first use only.
"""

from __future__ import annotations

import collections
import gc
import itertools
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from inference._core.dependencies import import_optional
from inference._core.scoring import ScoreTokens, Vocabulary, rolling_windows, score_tokens, too_long
from inference._core.validation import AdapterScales, GenerationRequest, ScoreRequest, listed
from inference._inprocess.base import InProcessProvider, chat_messages, non_finite_logits, plain_prompt
from inference._inprocess.batching import (
    BatchQueue,
    BatchRow,
    PendingRequest,
    RowLimits,
    RowsCancelled,
    cut_row,
    left_pad,
)
from inference._inprocess.constrained import GrammarRows, JsonGrammars, SchemaRefused
from inference._inprocess.streaming import PieceAssembler, PieceSink, stream_from_worker
from inference.adapters.peft import PeftAdapter, read_peft_adapter
from inference.adapters.source import AdapterSource
from inference.exceptions import (
    ConfigurationError,
    InferenceError,
    InvalidAdapterError,
    InvalidRequestError,
    ModelLoadError,
    ProviderError,
)
from inference.options import OptionMap, Refused, Sent
from inference.provider import GenerationResult, StreamEvent
from inference.results import ScoreResult, TokenLogprob

if TYPE_CHECKING:
    from inference.adapters.weights import AdapterWeights

__all__ = ["TransformersProvider"]

BASE_ADAPTER_NAME = "__base__"
"""PEFT's name for "no adapter" in ``adapter_names``."""

COMBINED_KEPT = 8
"""Weighted adapter combinations (requests with ``adapter_scales``) kept in the model, least recently used out."""

_SLOT_INDIFFERENT = frozenset(
    {
        "base_model_name_or_path",
        "revision",
        "inference_mode",
        "task_type",
        "lora_dropout",
        "init_lora_weights",
        "peft_version",
        "auto_mapping",
    }
)
"""adapter_config.json keys that do not change the LoRA layers PEFT builds for inference (or their scaling)."""

_SLOT_EXCLUDED = ("use_dora", "modules_to_save", "trainable_token_indices", "layer_replication", "target_parameters")
"""adapter_config.json keys that, when set, give a slot more than LoRA matrices: such adapters never share a slot."""

MIN_SEED = -(2**63)
MAX_SEED = 2**64 - 1
"""The seeds ``torch.manual_seed`` takes (negative ones are mapped onto the unsigned range)."""

_DEVICE_PATTERN = re.compile(r"^(cpu|mps|cuda(:\d+)?)$")
_DTYPES = ("auto", "float32", "float16", "bfloat16")

_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")
_NOT_CONFIG_ARGUMENTS = frozenset({"peft_type", "auto_mapping", "revision", "base_model_name_or_path"})
"""adapter_config.json keys that PEFT writes but LoraConfig(...) does not take as they are."""


@dataclass
class _LoadedModel:
    """The model as the worker thread holds it. ``model`` is a ``PeftModel`` while adapters are loaded."""

    name: str
    model: Any
    base_model: Any
    tokenizer: Any
    device: Any
    module_names: frozenset[str]
    has_chat_template: bool
    eos_ids: frozenset[int]
    pad_id: int
    context: int | None
    vocabulary: Vocabulary
    token_texts: dict[int, str] = field(default_factory=dict)
    grammars: JsonGrammars | None = None

    def token_text(self, token_id: int) -> str:
        """One token's text as the tokenizer decodes it alone (special tokens by their names)."""
        text = self.token_texts.get(token_id)
        if text is None:
            text = self.token_texts[token_id] = str(self.tokenizer.decode([token_id], skip_special_tokens=False))
        return text


@dataclass(frozen=True)
class _Row(BatchRow):
    """A batch row with its JSON-schema matcher (``None`` for a free row)."""

    matcher: Any = None


@dataclass
class _Outputs:
    """What one ``generate`` over a batch left: each row's new tokens, and the per-row bookkeeping."""

    tokens: list[list[int]]
    logprobs: _LogprobRecorder | None
    grammar: GrammarRows | None
    finite: _FiniteRows | None = None


@dataclass(eq=False)
class _ScoreJob:
    """One ``score`` or ``score_rolling`` call on its way to the worker thread."""

    request: ScoreRequest
    rolling: bool
    future: Future[ScoreResult] = field(default_factory=Future)
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Sampling:
    """Decoding settings resolved against the model's defaults; requests share a batch only when equal."""

    do_sample: bool
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None
    alone: object | None = None  # a fresh object for seeded sampling: it runs alone, so it reproduces


class TransformersProvider(InProcessProvider[str]):
    """A local Hugging Face model (directory or GGUF file) with PEFT LoRA adapters and mixed-adapter batching.

    Args:
        model_name: A local model directory, or a local ``.gguf`` file (dequantised by transformers);
            else ``TRANSFORMERS_MODEL_NAME``. Nothing is ever downloaded.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``; else ``TRANSFORMERS_DEVICE``; else cpu.
        torch_dtype: ``"auto"`` (float32 on CPU; bfloat16 on CUDA where supported, else float16),
            ``"float32"``, ``"float16"`` or ``"bfloat16"``; else ``TRANSFORMERS_TORCH_DTYPE``.
        max_batch_size: The most requests in one batch; else ``TRANSFORMERS_MAX_BATCH_SIZE``; else 32.
        batch_window_ms: How long a waiting request waits for others to join its batch; else
            ``TRANSFORMERS_BATCH_WINDOW_MS``; else 5.
        max_adapters: Most adapters kept in the PEFT model at once; else ``TRANSFORMERS_MAX_ADAPTERS``; else
            unlimited. Beyond it the least recently used adapter (not pinned, not in use) is deleted from
            the model, and loaded again from its path when a request needs it.
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
        "max_tokens": Sent("GenerationConfig.max_new_tokens", "and a per-row limit in the batch"),
        "system_prompt": Sent("chat template", "a system message rendered by the model's chat template"),
        "temperature": Sent("GenerationConfig.temperature"),
        "top_p": Sent("GenerationConfig.top_p"),
        "repetition_penalty": Sent("GenerationConfig.repetition_penalty"),
        "stop": Sent("stop", "stop strings, matched on the decoded text"),
        "seed": Sent("torch.manual_seed", "a seeded request runs in a batch of its own"),
        "top_k": Sent("GenerationConfig.top_k"),
        "logprobs": Sent("logits processor", "log-softmax of the raw logits"),
        "json_schema": Sent("llguidance", "a token mask per step"),
        "tools": Refused("tool calling is not built yet for this backend (the fake provider calls tools, for tests)"),
        "tool_choice": Refused("tool calling is not built yet for this backend"),
        "return_token_ids": Refused("generated token ids are not built yet for this backend"),
    }
    batches_mixed_adapters = True
    supports_scoring = True
    supports_adapter_scales = True
    loads_adapter_weights_in_memory = True

    def __init__(
        self,
        model_name: str | None = None,
        device: str | None = None,
        torch_dtype: str | None = None,
        max_batch_size: int | None = None,
        batch_window_ms: float | None = None,
        max_adapters: int | None = None,
        spare_adapter_slots: int | None = None,
    ) -> None:
        super().__init__(locals())  # settings resolved and checked, max_adapters among them
        settings = self._settings
        self.model_name: str = str(settings["model_name"])
        self.device: str = str(settings["device"]).strip().lower()
        self.torch_dtype: str = str(settings["torch_dtype"]).strip().lower()
        if not _DEVICE_PATTERN.match(self.device):
            raise ConfigurationError(
                f"device {settings['device']!r} is not valid: use 'cpu', 'cuda', 'cuda:N' or 'mps' "
                "(argument device or TRANSFORMERS_DEVICE)",
                provider=self.name,
            )
        if self.torch_dtype not in _DTYPES:
            raise ConfigurationError(
                f"torch_dtype {settings['torch_dtype']!r} is not valid: use one of {', '.join(_DTYPES)} "
                "(argument torch_dtype or TRANSFORMERS_TORCH_DTYPE)",
                provider=self.name,
            )
        size, window = settings["max_batch_size"], settings["batch_window_ms"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigurationError(
                f"max_batch_size must be a positive integer, got {size!r} "
                "(argument max_batch_size or TRANSFORMERS_MAX_BATCH_SIZE)",
                provider=self.name,
            )
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0 <= window <= 60_000:
            raise ConfigurationError(
                f"batch_window_ms must be a number of milliseconds in [0, 60000], got {window!r} "
                "(argument batch_window_ms or TRANSFORMERS_BATCH_WINDOW_MS)",
                provider=self.name,
            )
        self.max_batch_size: int = size
        self.batch_window_ms: float = float(window)
        self.spare_adapter_slots: int = int(settings["spare_adapter_slots"])
        self._queue = BatchQueue(size, self.batch_window_ms / 1000.0)
        self._score_queue = _ScoreQueue(size, self.batch_window_ms / 1000.0)
        self._loaded: _LoadedModel | None = None
        # self._resident maps each adapter id in the PEFT model to its internal PEFT adapter name.
        # Never reused, and none is part of another ("inference_1_adapter" is not in "inference_11_adapter").
        self._peft_names = (f"inference_{number}_adapter" for number in itertools.count())
        # PEFT name -> its slot's shape (see _slot_shape), for slots an unload may keep for the next adapter.
        self._slot_shapes: dict[str, str] = {}
        # Slots emptied by an unload, by shape, kept for the next adapter of that shape (spare_adapter_slots at most).
        self._spare_slots: dict[str, list[str]] = {}
        # Weighted combinations built for requests with adapter scales: (adapter names, scales) -> PEFT name, LRU.
        self._combined: collections.OrderedDict[AdapterScales, str] = collections.OrderedDict()
        self._combined_names = (f"inference_{number}_combined" for number in itertools.count())
        self._batch_sizes: deque[int] = deque(maxlen=1000)

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
        return self._loaded is not None

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

    # Public hooks (event loop side) -------------------------------------------------------------------

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        self._check_request(request)
        entry = self._queue.put(request)
        try:
            await self._worker.run(self._serve, entry)
        except BaseException:
            self._queue.discard(entry)  # sets its cancel flag: a running batch drops the row at its next token
            raise
        return entry.future.result()

    def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        self._check_request(request)
        return stream_from_worker(self._worker, self._stream_now, request)

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        return await self._score_job(_ScoreJob(request, rolling=False))

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        return await self._score_job(_ScoreJob(request, rolling=True))

    async def _score_job(self, job: _ScoreJob) -> ScoreResult:
        """Queue ``job`` with the other score calls waiting: the worker scores them in batched forward passes."""
        self._check_open()
        self._score_queue.put(job)
        try:
            await self._worker.run(self._serve_scores, job)
        except BaseException:
            self._score_queue.discard(job)
            raise
        return job.future.result()

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
        if request.seed is not None and not MIN_SEED <= request.seed <= MAX_SEED:
            raise InvalidRequestError(
                f"seed {request.seed} is out of range for transformers: use an integer in "
                f"[{MIN_SEED}, {MAX_SEED}] (what torch.manual_seed takes), or None",
                provider=self.name,
            )

    # Model (worker thread) ----------------------------------------------------------------------------

    def _ensure_loaded(self) -> _LoadedModel:
        if self._loaded is None:
            self._loaded = self._load_model()
        return self._loaded

    def _load_model(self) -> _LoadedModel:
        torch = import_optional("torch", extra="transformers", provider=self.name)
        transformers = import_optional("transformers", extra="transformers", provider=self.name)
        device = self._torch_device(torch)
        dtype = self._resolve_dtype(torch, device)
        if not self.model_name:
            raise ConfigurationError(
                "no model to load: pass model_name= (a local model directory or .gguf file) "
                "or set TRANSFORMERS_MODEL_NAME",
                provider=self.name,
            )
        path = Path(self.model_name).expanduser()
        if not path.exists():
            raise ModelLoadError(
                f"model_name {self.model_name!r} is not a local directory or .gguf file: the transformers "
                "provider never downloads; fetch the model first (e.g. huggingface-cli download REPO "
                "--local-dir DIR) and pass that directory",
                provider=self.name,
                path=str(path),
            )
        if path.is_file() and path.suffix.lower() != ".gguf":
            raise ConfigurationError(
                f"model_name {self.model_name!r} is a file but not a .gguf file: pass a model directory or a GGUF file",
                provider=self.name,
                path=str(path),
            )
        directory, extra = (path.parent, {"gguf_file": path.name}) if path.is_file() else (path, {})
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True, **extra)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(directory), dtype=dtype, local_files_only=True, **extra
            )
            model.to(device)
            model.eval()
        except InferenceError:
            raise
        except Exception as error:
            raise ModelLoadError(
                f"transformers could not load the model at {path} ({type(error).__name__}: {error}): "
                "check that it is a complete causal language model (config, weights, tokenizer) or GGUF file",
                provider=self.name,
                path=str(path),
            ) from error
        generation = model.generation_config
        eos = {*_as_ids(generation.eos_token_id), *_as_ids(tokenizer.eos_token_id)}
        pad_candidates = [tokenizer.pad_token_id, generation.pad_token_id, *sorted(eos), 0]
        bos_id = tokenizer.bos_token_id

        def encode(text: str) -> list[int]:
            return [int(token) for token in tokenizer(text, add_special_tokens=False)["input_ids"]]

        probe = tokenizer("probe")["input_ids"]
        vocabulary = Vocabulary(
            encode=encode,
            adds_bos=bos_id is not None and len(probe) > 0 and int(probe[0]) == int(bos_id),
            bos_id=None if bos_id is None else int(bos_id),
            eos_id=None if tokenizer.eos_token_id is None else int(tokenizer.eos_token_id),
        )
        return _LoadedModel(
            name=path.stem if path.is_file() else path.name,
            model=model,
            base_model=model,
            tokenizer=tokenizer,
            device=device,
            module_names=frozenset(name for name, _ in model.named_modules()),
            has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
            eos_ids=frozenset(eos),
            pad_id=next(int(token) for token in pad_candidates if token is not None),
            context=getattr(model.config, "max_position_embeddings", None),
            vocabulary=vocabulary,
        )

    def _torch_device(self, torch: Any) -> Any:
        device = torch.device(self.device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ConfigurationError(
                    f"device {self.device!r} was requested but torch sees no CUDA GPU "
                    f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}): "
                    "use device='cpu' or install a CUDA build of torch on a machine with a GPU",
                    provider=self.name,
                )
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise ConfigurationError(
                    f"device {self.device!r} does not exist: torch sees {torch.cuda.device_count()} CUDA "
                    "device(s), numbered from 0",
                    provider=self.name,
                )
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise ConfigurationError(
                "device 'mps' was requested but torch reports MPS as unavailable: use device='cpu'",
                provider=self.name,
            )
        return device

    def _resolve_dtype(self, torch: Any, device: Any) -> Any:
        if self.torch_dtype != "auto":
            return getattr(torch, self.torch_dtype)
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32

    def _close_blocking(self) -> None:
        loaded, self._loaded = self._loaded, None
        self._resident.clear()
        self._slot_shapes.clear()
        self._spare_slots.clear()
        if loaded is None:
            return
        on_cuda = loaded.device.type == "cuda"
        del loaded
        gc.collect()
        if on_cuda:
            import_optional("torch", extra="transformers", provider=self.name).cuda.empty_cache()

    # Adapters (worker thread) -------------------------------------------------------------------------

    def _load_adapter_now(self, adapter_id: str, source: AdapterSource) -> None:
        loaded = self._ensure_loaded()
        adapter_path = source.path
        if source.weights is not None:
            self._load_weights_now(adapter_id, adapter_path, source.weights)
            return
        try:
            adapter_path.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes in a file name, kept as surrogates by os.fsdecode
            raise InvalidAdapterError(
                f"adapter path {adapter_path!r} is not valid UTF-8, which safetensors and PEFT need: "
                "rename or move the adapter directory",
                provider=self.name,
                path=repr(adapter_path),
            ) from None
        if adapter_id in self._resident:  # never expected: the registry unloads before it loads again
            self._unload_adapter_now(adapter_id)
        adapter = read_peft_adapter(adapter_path, provider=self.name)
        self._check_target_modules(loaded, adapter)
        self._check_weight_shapes(loaded, adapter)
        peft = import_optional("peft", extra="transformers", provider=self.name)
        shape = _slot_shape(adapter.config)
        if shape in self._spare_slots:
            try:
                tensors = peft.utils.load_peft_weights(str(adapter.path), device=str(loaded.device))
            except Exception:  # a fresh load below reports the unreadable file
                tensors = None
            if tensors is not None and self._refill_spare_slot(loaded, adapter_id, shape, tensors):
                return
        peft_name = next(self._peft_names)  # PEFT refuses some valid adapter ids (e.g. with a '.')
        try:
            if loaded.model is loaded.base_model:
                loaded.model = peft.PeftModel.from_pretrained(
                    loaded.base_model,
                    str(adapter.path),
                    adapter_name=peft_name,
                    is_trainable=False,
                    torch_device=str(loaded.device),
                )
            else:
                loaded.model.load_adapter(
                    str(adapter.path), adapter_name=peft_name, is_trainable=False, torch_device=str(loaded.device)
                )
        except Exception as error:
            self._discard_partial_adapter(loaded, peft_name)
            raise self._invalid(
                adapter, f"could not be loaded into {loaded.name} ({type(error).__name__}: {error})"
            ) from error
        loaded.model.eval()
        self._resident[adapter_id] = peft_name
        if shape is not None:
            self._slot_shapes[peft_name] = shape

    def _load_weights_now(self, adapter_id: str, label: str, weights: AdapterWeights) -> None:
        """Put in-memory LoRA weights straight into the model (no file): the copy the base class kept and checked at
        load (a reload after an eviction does not check it again: nothing can have changed it)."""
        loaded = self._ensure_loaded()
        if adapter_id in self._resident:
            self._unload_adapter_now(adapter_id)
        config = weights.config_dict()
        targets = config["target_modules"]  # a list of names, or one regular expression
        adapter = PeftAdapter(
            path=Path(label),
            weights_path=Path(label),
            rank=config["r"],
            alpha=float(config.get("lora_alpha", 8)),
            target_modules=tuple(sorted(targets)) if isinstance(targets, list) else (targets,),
            base_model_name_or_path=str(config.get("base_model_name_or_path") or ""),
            config=config,
        )
        self._check_target_modules(loaded, adapter)
        self._check_shapes(loaded, adapter, {name: tuple(t.shape) for name, t in weights.tensors.items()})
        torch = import_optional("torch", extra="transformers", provider=self.name)
        peft = import_optional("peft", extra="transformers", provider=self.name)
        fields = peft.LoraConfig.__dataclass_fields__
        lora_config = peft.LoraConfig(
            **{key: value for key, value in config.items() if key in fields and key not in _NOT_CONFIG_ARGUMENTS}
        )
        lora_config.inference_mode = True
        dtype = next(loaded.base_model.parameters()).dtype
        tensors = {
            name: torch.as_tensor(tensor).detach().to(device=loaded.device, dtype=dtype)
            for name, tensor in weights.tensors.items()
        }
        shape = _slot_shape(config)
        if shape in self._spare_slots and self._refill_spare_slot(loaded, adapter_id, shape, tensors):
            return
        peft_name = next(self._peft_names)
        try:
            if loaded.model is loaded.base_model:
                loaded.model = peft.PeftModel(loaded.base_model, lora_config, adapter_name=peft_name)
            else:
                loaded.model.add_adapter(peft_name, lora_config)
            result = peft.set_peft_model_state_dict(loaded.model, tensors, adapter_name=peft_name)
            unexpected = [key for key in getattr(result, "unexpected_keys", []) if "lora_" in key]
            if unexpected:
                raise ValueError(f"tensors that match no module of the model: {', '.join(unexpected[:3])}")
        except Exception as error:
            self._discard_partial_adapter(loaded, peft_name)
            raise self._invalid(
                adapter, f"could not be loaded into {loaded.name} ({type(error).__name__}: {error})"
            ) from error
        loaded.model.eval()
        self._resident[adapter_id] = peft_name
        if shape is not None:
            self._slot_shapes[peft_name] = shape

    def _refill_spare_slot(self, loaded: _LoadedModel, adapter_id: str, shape: str, tensors: dict[str, Any]) -> bool:
        """Load ``tensors`` into a spare slot of ``shape``: True when every LoRA weight of the slot was replaced.

        A slot the tensors do not fill exactly (a module missing, a name of no module) is removed, never used
        with another adapter's weights left in it; the caller then loads the adapter the usual way, which reports
        what is wrong with it, if anything.
        """
        peft = import_optional("peft", extra="transformers", provider=self.name)
        slots = self._spare_slots[shape]
        peft_name = slots.pop()
        if not slots:
            del self._spare_slots[shape]
        try:
            result = peft.set_peft_model_state_dict(loaded.model, tensors, adapter_name=peft_name)
            left = [key for key in result.missing_keys if f".{peft_name}." in key]
            unexpected = [key for key in result.unexpected_keys if "lora_" in key]
        except Exception:  # the slot is dropped and the adapter loaded anew
            left, unexpected = ["(failed)"], []
        if left or unexpected:
            self._slot_shapes.pop(peft_name, None)
            self._drop_peft_adapter(loaded, peft_name)
            return False
        self._resident[adapter_id] = peft_name
        self._slot_shapes[peft_name] = shape
        return True

    def _unload_adapter_now(self, adapter_id: str) -> None:
        loaded = self._loaded
        if loaded is None or adapter_id not in self._resident:
            return  # nothing of it is in the model (the model was never loaded, or it was freed)
        for key in [key for key in self._combined if any(part == adapter_id for part, _ in key)]:
            loaded.model.delete_adapter(self._combined.pop(key))
        peft_name = self._resident.pop(adapter_id)
        shape = self._slot_shapes.get(peft_name)
        spare = sum(len(slots) for slots in self._spare_slots.values())
        if shape is not None and spare < self.spare_adapter_slots:
            self._spare_slots.setdefault(shape, []).append(peft_name)  # kept for the next adapter of its shape
        else:
            self._slot_shapes.pop(peft_name, None)
            self._drop_peft_adapter(loaded, peft_name)
        if loaded.device.type == "cuda":
            import_optional("torch", extra="transformers", provider=self.name).cuda.empty_cache()

    def _drop_peft_adapter(self, loaded: _LoadedModel, peft_name: str) -> None:
        """Remove PEFT adapter ``peft_name`` from the model; the last one takes the PEFT wrapper with it."""
        others = [other for other in loaded.model.peft_config if other != peft_name]
        if others:
            if peft_name in loaded.model.active_adapters:  # PEFT warns when the active one is deleted
                loaded.model.set_adapter(others[0], inference_mode=True)
            loaded.model.delete_adapter(peft_name)
        else:
            loaded.model = loaded.model.unload()  # the last one: back to the plain model, no LoRA layers
            loaded.base_model = loaded.model

    def _peft_name(self, loaded: _LoadedModel, request: GenerationRequest) -> str:
        """PEFT's name for what ``request`` applies: the base model, an adapter, or a weighted combination.

        A combination (``adapter_scales``) is built once with PEFT's ``add_weighted_adapter`` (``"cat"``: the
        adapters' ranks side by side, each A scaled by its weight and its own alpha/r, so the delta is exactly
        the weighted sum) and kept for later requests, the :data:`COMBINED_KEPT` most recently used ones.
        """
        if not request.adapter_scales:
            if request.adapter_id is None:
                return BASE_ADAPTER_NAME
            if request.adapter_id not in self._resident:
                raise self._not_loaded(request.adapter_id)  # never expected: the registry holds it
            return self._resident[request.adapter_id]
        key = request.adapter_scales
        if key in self._combined:
            self._combined.move_to_end(key)
            return self._combined[key]
        missing = [adapter_id for adapter_id, _ in key if adapter_id not in self._resident]
        if missing:
            raise self._not_loaded(missing[0])
        names = [self._resident[adapter_id] for adapter_id, _ in key]
        weights = [scale for _, scale in key]
        if len(names) == 1:  # PEFT combines one adapter "linearly", with sqrt(weight): no negative scales
            names, weights = names * 2, [weights[0], 0.0]
        combined = next(self._combined_names)
        loaded.model.add_weighted_adapter(names, weights, combined, combination_type="cat")
        self._combined[key] = combined
        while len(self._combined) > COMBINED_KEPT:
            loaded.model.delete_adapter(self._combined.popitem(last=False)[1])
        return combined

    def _discard_partial_adapter(self, loaded: _LoadedModel, peft_name: str) -> None:
        """Remove what a failed load of PEFT adapter ``peft_name`` left behind, so the provider keeps working."""
        if loaded.model is not loaded.base_model:
            if peft_name in loaded.model.peft_config:
                self._drop_peft_adapter(loaded, peft_name)
            return
        peft = import_optional("peft", extra="transformers", provider=self.name)
        tuner_layer = peft.tuners.tuners_utils.BaseTunerLayer
        for name, module in list(loaded.base_model.named_modules()):
            if isinstance(module, tuner_layer):
                parent_name, _, child = name.rpartition(".")
                setattr(loaded.base_model.get_submodule(parent_name), child, module.get_base_layer())
        if hasattr(loaded.base_model, "peft_config"):
            del loaded.base_model.peft_config

    def _check_target_modules(self, loaded: _LoadedModel, adapter: PeftAdapter) -> None:
        raw = adapter.config.get("target_modules")
        if raw == "all-linear":
            return
        names = [name for name in loaded.module_names if name]
        if isinstance(raw, str):
            missing = [] if any(re.fullmatch(raw, name) for name in names) else [raw]
        else:
            missing = [
                target
                for target in adapter.target_modules
                if not any(name == target or name.endswith("." + target) for name in names)
            ]
        if missing:
            raise self._invalid(
                adapter,
                f"targets modules that {loaded.name} does not have ({listed(missing)}): "
                "it was trained for another model architecture",
            )

    def _check_weight_shapes(self, loaded: _LoadedModel, adapter: PeftAdapter) -> None:
        """Read the safetensors header (no tensor data) and compare each LoRA matrix with its layer."""
        if adapter.weights_path.suffix != ".safetensors":
            return
        safetensors = import_optional("safetensors", extra="transformers", provider=self.name)
        try:
            with safetensors.safe_open(str(adapter.weights_path), framework="pt") as weights:
                shapes = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118
        except Exception as error:
            raise self._invalid(
                adapter, f"has a corrupt or unreadable {adapter.weights_path.name} ({error}): save it again"
            ) from error
        self._check_shapes(loaded, adapter, shapes)

    def _check_shapes(self, loaded: _LoadedModel, adapter: PeftAdapter, shapes: dict[str, tuple[int, ...]]) -> None:
        """Compare each LoRA matrix's shape with the layer it adapts."""
        modules = dict(loaded.base_model.named_modules())
        for key, shape in sorted(shapes.items()):
            match = _LORA_KEY.match(key)
            if match is None:
                continue
            module = modules.get(match["module"])
            if module is None:
                raise self._invalid(adapter, f"has weights for {match['module']}, which {loaded.name} does not have")
            in_features, out_features = getattr(module, "in_features", None), getattr(module, "out_features", None)
            if not isinstance(in_features, int) or not isinstance(out_features, int) or len(shape) != 2:
                continue
            expected, actual = (in_features, shape[1]) if match["which"] == "A" else (out_features, shape[0])
            if expected != actual:
                side = "inputs" if match["which"] == "A" else "outputs"
                raise self._invalid(
                    adapter,
                    f"does not fit {loaded.name}: {match['module']} has {expected} {side} but the adapter's "
                    f"lora_{match['which']} has shape {list(shape)}; it was trained for another base model"
                    + (f" ({adapter.base_model_name_or_path})" if adapter.base_model_name_or_path else ""),
                )

    def _invalid(self, adapter: PeftAdapter, reason: str) -> InvalidAdapterError:
        return InvalidAdapterError(f"adapter at {adapter.path} {reason}", provider=self.name, path=str(adapter.path))

    # Batches (worker thread) --------------------------------------------------------------------------

    def _serve(self, entry: PendingRequest) -> None:
        """Run batches, oldest first, until ``entry`` has its answer (each request queues one such call)."""
        loaded = self._ensure_loaded()
        while not entry.future.done():
            batch = self._queue.next_batch(lambda request: self._sampling(loaded, request))
            if batch:
                self._run_batch(loaded, batch)

    def _sampling(self, loaded: _LoadedModel, request: GenerationRequest) -> _Sampling:
        defaults = loaded.model.generation_config
        penalty = request.repetition_penalty or defaults.repetition_penalty or 1.0
        greedy = request.temperature == 0 or (request.temperature is None and not defaults.do_sample)
        if greedy:
            return _Sampling(False, 1.0, 1.0, 50, float(penalty), None)
        temperature = request.temperature if request.temperature is not None else defaults.temperature
        top_p = request.top_p if request.top_p is not None else defaults.top_p
        top_k = request.top_k if request.top_k is not None else defaults.top_k
        return _Sampling(
            do_sample=True,
            temperature=float(1.0 if temperature is None else temperature),
            top_p=float(1.0 if top_p is None else top_p),
            top_k=int(50 if top_k is None else top_k),
            repetition_penalty=float(penalty),
            seed=request.seed,
            alone=None if request.seed is None else object(),
        )

    def _run_batch(self, loaded: _LoadedModel, batch: list[PendingRequest]) -> None:
        rows: list[_Row] = []
        for entry in batch:
            if entry.cancel.is_set():  # its caller gave up after the batch was formed
                _drop(entry)
                continue
            try:
                self._peft_name(loaded, entry.request)  # a combination is built here, before the batch runs
                rows.append(self._row(loaded, entry))
            except BaseException as error:
                entry.future.set_exception(self._as_inference_error(error))
        if not rows:
            return
        try:
            outputs = self._generate_rows(loaded, rows)
        except BaseException as error:
            if len(rows) == 1:
                rows[0].entry.future.set_exception(self._as_inference_error(error))
                return
            for row in rows:  # find the request that fails on its own; the others still get answers
                self._run_batch(loaded, [row.entry])
            return
        for index, row in enumerate(rows):
            if row.entry.cancel.is_set():  # stopped early at its caller's request: nobody reads a result
                _drop(row.entry)
                continue
            try:
                row.entry.future.set_result(self._result(loaded, row, outputs, index))
            except BaseException as error:
                row.entry.future.set_exception(self._as_inference_error(error))

    def _row(self, loaded: _LoadedModel, entry: PendingRequest) -> _Row:
        """Token ids per the in-process prompt rule (:mod:`inference._inprocess.base`), and the row's matcher."""
        request, tokenizer = entry.request, loaded.tokenizer
        if loaded.has_chat_template:
            try:
                text = tokenizer.apply_chat_template(chat_messages(request), add_generation_prompt=True, tokenize=False)
            except Exception as error:  # jinja2's TemplateError, e.g. "System role not supported"
                raise InvalidRequestError(
                    f"the model's chat template refused these messages ({error}): "
                    "drop system_prompt or put it into the prompt",
                    provider=self.name,
                ) from error
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(plain_prompt(request))["input_ids"]
        self._require_prompt(ids)
        room = request.max_tokens if loaded.context is None else loaded.context - len(ids)
        if room < 1:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens, which fills the model's context of {loaded.context} "
                "tokens: shorten it",
                provider=self.name,
            )
        matcher = None if request.json_schema is None else self._matcher(loaded, request.json_schema)
        return _Row(entry, [int(token) for token in ids], min(request.max_tokens, room), matcher)

    def _matcher(self, loaded: _LoadedModel, schema: Any) -> Any:
        """A fresh llguidance matcher for ``schema`` (worker thread; the grammar is compiled once per schema)."""
        if loaded.grammars is None:
            llguidance = import_optional("llguidance", extra="transformers", provider=self.name)
            hf = import_optional("llguidance.hf", extra="transformers", provider=self.name)
            width = int(loaded.base_model.get_output_embeddings().weight.shape[0])
            try:
                tokenizer = hf.from_tokenizer(
                    loaded.tokenizer,
                    n_vocab=max(width, len(loaded.tokenizer)),
                    eos_token=sorted(loaded.eos_ids) or [loaded.pad_id],
                )
            except ValueError as error:
                raise InvalidRequestError(
                    f"json_schema needs a fast (Rust) tokenizer and {loaded.name} has none ({error}): "
                    "save the model with its tokenizer.json",
                    provider=self.name,
                ) from error
            loaded.grammars = JsonGrammars(llguidance, tokenizer)
        try:
            return loaded.grammars.matcher(schema)
        except SchemaRefused as error:
            raise InvalidRequestError(
                f"json_schema cannot be compiled into a grammar ({error}): simplify the schema "
                "(llguidance supports most of JSON schema, but not e.g. regex look-around)",
                provider=self.name,
            ) from error

    def _stream_now(
        self, request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event
    ) -> GenerationResult:
        """Run one request alone (no batch), handing its text to ``sink`` token by token (worker thread)."""
        loaded = self._ensure_loaded()
        self._peft_name(loaded, request)
        entry = PendingRequest(request, cancel=cancel)
        entry.key = self._sampling(loaded, request)
        row = self._row(loaded, entry)
        pieces = PieceAssembler(request.stop, sink)

        def decode(ids: list[int]) -> str:
            return str(loaded.tokenizer.decode(ids, skip_special_tokens=True))

        torch = import_optional("torch", extra="transformers", provider=self.name)
        watch = _StreamWatch(torch, len(row.prompt_ids), loaded.eos_ids, decode, pieces)
        try:
            outputs = self._generate_rows(loaded, [row], watch)
        except BaseException as error:
            raise self._as_inference_error(error) from None
        result = self._result(loaded, row, outputs, 0)
        if not cancel.is_set():
            pieces.finish(result.text)
        return result

    def _generate_rows(
        self, loaded: _LoadedModel, rows: list[_Row], watch: Callable[..., Any] | None = None
    ) -> _Outputs:
        """One left-padded ``generate`` over all rows, each with its own adapter; returns the new tokens.

        A row stops at its own limit, at its next token once its request's cancel flag is set, or once its
        JSON is complete. ``watch`` is one more stopping criterion (a streamed row's token watcher).

        Logits processors, in order: the logprob recorder (it sees the model's raw logits), the repetition
        penalty, the JSON-schema masks; then ``generate``'s temperature, top-k and top-p.
        """
        torch = import_optional("torch", extra="transformers", provider=self.name)
        transformers = import_optional("transformers", extra="transformers", provider=self.name)
        sampling = rows[0].entry.key
        assert isinstance(sampling, _Sampling)
        plain_rows: list[BatchRow] = list(rows)
        input_ids, attention_mask = left_pad(torch, plain_rows, loaded.pad_id)
        width = input_ids.shape[1]
        limits = [row.limit for row in rows]
        processors: list[Any] = []
        penalty = sampling.repetition_penalty
        wanted = [row.entry.request.logprobs for row in rows]
        recorder = None
        if any(k is not None for k in wanted):
            recorder = _LogprobRecorder(torch, max(k or 0 for k in wanted))
            processors.append(recorder)
            if penalty != 1.0:  # after the recorder: generate would apply its own before every custom processor
                padding = (attention_mask != 0).int().argmax(dim=1).to(loaded.device)
                processors.append(transformers.RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=padding))
                penalty = 1.0
        grammar = None
        if any(row.matcher is not None for row in rows):
            grammar = GrammarRows(torch, [row.matcher for row in rows], width, limits)
            processors.append(grammar)
        finite = _FiniteRows(torch, len(rows), min(loaded.eos_ids, default=loaded.pad_id))
        processors.insert(0, finite.check)  # the raw logits, before any penalty or mask
        processors.append(finite.force)  # last: sampling never sees the logits of a failed row
        config = transformers.GenerationConfig(
            max_new_tokens=max(limits),
            do_sample=sampling.do_sample,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            repetition_penalty=penalty,
            num_beams=1,
            pad_token_id=loaded.pad_id,
            eos_token_id=sorted(loaded.eos_ids) or None,
        )
        extra: dict[str, Any] = {}
        if loaded.model is not loaded.base_model:
            extra["adapter_names"] = [self._peft_name(loaded, row.entry.request) for row in rows]  # not the ids
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        self._batch_sizes.append(len(rows))
        criteria: list[Any] = [
            RowLimits(torch.tensor(limits, device=loaded.device), width),
            RowsCancelled(torch, [row.entry for row in rows]),
        ]
        if grammar is not None:
            criteria.append(grammar.stops)
        criteria.append(finite.stops)
        if watch is not None:
            criteria.append(watch)
        with torch.inference_mode():
            output = loaded.model.generate(
                input_ids=input_ids.to(loaded.device),
                attention_mask=attention_mask.to(loaded.device),
                generation_config=config,
                stopping_criteria=transformers.StoppingCriteriaList(criteria),
                logits_processor=transformers.LogitsProcessorList(processors),
                **extra,
            )
        new_tokens = output[:, width:]
        if recorder is not None:
            recorder.finish(new_tokens)
        tokens = [[int(token) for token in row] for row in new_tokens.tolist()]
        return _Outputs(tokens, recorder, grammar, finite)

    def _result(self, loaded: _LoadedModel, row: _Row, outputs: _Outputs, index: int) -> GenerationResult:
        request = row.entry.request
        tokens, grammar = outputs.tokens[index], outputs.grammar
        if outputs.finite is not None and outputs.finite.failed(index, self._steps(loaded, row, outputs, index)):
            raise non_finite_logits(self.name, request.adapters)
        ended = None
        if grammar is not None and row.matcher is not None:
            error = grammar.errors[index]
            if error is not None:
                raise ProviderError(f"the JSON-schema grammar stopped with an error: {error}", provider=self.name)
            ended = grammar.ended[index]
            if ended is not None:
                tokens = tokens[:ended]  # the JSON is complete (and, maybe, the end-of-sequence token after it)
        text, completion_tokens, finish_reason = cut_row(
            tokens,
            row.limit,
            loaded.eos_ids,
            request.stop,
            lambda ids: str(loaded.tokenizer.decode(ids, skip_special_tokens=True)),
        )
        if ended is not None and ended <= row.limit:
            finish_reason = "stop"
        logprobs = None
        if outputs.logprobs is not None and request.logprobs is not None:
            logprobs = outputs.logprobs.row(loaded, index, tokens[:completion_tokens], request.logprobs)
        prompt_tokens = len(row.prompt_ids)
        return GenerationResult(
            text=text,
            model=loaded.name,
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + completion_tokens,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            logprobs=logprobs,
        )

    @staticmethod
    def _steps(loaded: _LoadedModel, row: _Row, outputs: _Outputs, index: int) -> int:
        """How many of ``generate``'s steps made the row's tokens (up to its end token, JSON end or limit); the
        steps after those only padded it while other rows went on."""
        tokens = outputs.tokens[index][: row.limit]
        steps = next((position + 1 for position, token in enumerate(tokens) if token in loaded.eos_ids), len(tokens))
        ended = None if outputs.grammar is None else outputs.grammar.ended[index]
        return steps if ended is None else min(steps, ended)

    # Scores (worker thread) --------------------------------------------------------------------------

    def _serve_scores(self, job: _ScoreJob) -> None:
        """Score batches of waiting score calls, oldest first, until ``job`` has its answer."""
        loaded = self._ensure_loaded()
        while not job.future.done():
            batch = self._score_queue.next_batch()
            if batch:
                self._run_scores(loaded, batch)

    def _windows(self, loaded: _LoadedModel, job: _ScoreJob) -> list[ScoreTokens]:
        """The sequences that score ``job``: one for ``score``, the rolling windows for ``score_rolling``."""
        request = job.request
        if request.adapter_id is not None and request.adapter_id not in self._resident:
            raise self._not_loaded(request.adapter_id)
        if job.rolling:
            if loaded.context is None:
                return [score_tokens(loaded.vocabulary, "", request.continuation, provider=self.name)]
            return rolling_windows(loaded.vocabulary, request.continuation, loaded.context, provider=self.name)
        sequence = score_tokens(loaded.vocabulary, request.context, request.continuation, provider=self.name)
        if loaded.context is not None and len(sequence.tokens) - 1 > loaded.context:
            raise too_long(
                len(sequence.tokens) - 1,
                loaded.context,
                provider=self.name,
                setting=f"max_position_embeddings in {loaded.name}'s config.json (only if the model supports more)",
            )
        return [sequence]

    def _run_scores(self, loaded: _LoadedModel, batch: list[_ScoreJob]) -> None:
        """Score every sequence of ``batch`` in forward passes of up to ``max_batch_size`` rows, mixed adapters."""
        rows: list[tuple[int, ScoreTokens]] = []
        for index, job in enumerate(batch):
            if job.cancel.is_set():
                continue
            try:
                rows.extend((index, sequence) for sequence in self._windows(loaded, job))
            except BaseException as error:
                job.future.set_exception(self._as_inference_error(error))
        totals: dict[int, tuple[float, int, bool]] = {}
        failed: dict[int, BaseException] = {}
        rows.sort(key=lambda item: len(item[1].tokens), reverse=True)  # similar lengths pad less
        for begin in range(0, len(rows), self.max_batch_size):
            chunk = rows[begin : begin + self.max_batch_size]
            if any(batch[index].cancel.is_set() or index in failed for index, _ in chunk):
                chunk = [item for item in chunk if not batch[item[0]].cancel.is_set() and item[0] not in failed]
                if not chunk:
                    continue
            adapters = [batch[index].request.adapter_id for index, _ in chunk]
            try:
                scored = self._score_rows(loaded, [sequence for _, sequence in chunk], adapters)
            except BaseException as error:
                for index, _ in chunk:
                    failed.setdefault(index, error)
                continue
            for (index, _), (logprob, count, greedy) in zip(chunk, scored, strict=True):
                if not math.isfinite(logprob):  # NaN or infinite logits (finite ones give a finite log-softmax)
                    failed.setdefault(index, non_finite_logits(self.name, _adapters_of(batch[index].request)))
                    continue
                before = totals.get(index, (0.0, 0, True))
                totals[index] = (before[0] + logprob, before[1] + count, before[2] and greedy)
        for index, job in enumerate(batch):
            if job.future.done():
                continue
            if job.cancel.is_set():
                job.future.set_exception(ProviderError("the request was cancelled", provider=self.name))
            elif index in failed:
                job.future.set_exception(self._as_inference_error(failed[index]))
            else:
                logprob, count, greedy = totals[index]
                job.future.set_result(
                    ScoreResult(
                        logprob=float(logprob),
                        num_tokens=int(count),
                        is_greedy=bool(greedy),
                        model=loaded.name,
                        adapter_id=job.request.adapter_id,
                    )
                )

    def _score_rows(
        self, loaded: _LoadedModel, sequences: list[ScoreTokens], adapter_ids: list[str | None]
    ) -> list[tuple[float, int, bool]]:
        """One right-padded forward pass: per sequence, (summed logprob, scored tokens, all greedy).

        Right padding needs no attention mask (a causal model never looks at the padding after a sequence), so
        attention keeps its fastest kernel; logits are computed only at the positions some row scores
        (``logits_to_keep`` as the sorted union of those positions).
        """
        torch = import_optional("torch", extra="transformers", provider=self.name)
        reads = [sequence.tokens[:-1] for sequence in sequences]
        width = max(len(tokens) for tokens in reads)
        input_ids = torch.full((len(reads), width), loaded.pad_id, dtype=torch.long)
        for row, tokens in enumerate(reads):
            input_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        wanted = sorted({position for s in sequences for position in range(s.start - 1, len(s.tokens) - 1)})
        column = {position: index for index, position in enumerate(wanted)}
        extra: dict[str, Any] = {}
        if loaded.model is not loaded.base_model:
            extra["adapter_names"] = [
                BASE_ADAPTER_NAME if adapter_id is None else self._resident[adapter_id] for adapter_id in adapter_ids
            ]
        self._batch_sizes.append(len(reads))
        with torch.inference_mode():
            logits = loaded.model(
                input_ids=input_ids.to(loaded.device),
                logits_to_keep=torch.tensor(wanted, dtype=torch.long, device=loaded.device),
                use_cache=False,
                **extra,
            ).logits
            results = []
            for row, sequence in enumerate(sequences):
                targets = torch.tensor(sequence.scored, dtype=torch.long, device=logits.device)
                columns = [column[position] for position in range(sequence.start - 1, len(sequence.tokens) - 1)]
                row_logits = logits[row, columns, :].float()
                logprobs = torch.log_softmax(row_logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
                greedy = bool((row_logits.argmax(dim=-1) == targets).all())
                lowest, highest = torch.aminmax(row_logits, dim=-1)
                usable = bool((torch.isfinite(highest) & (highest > lowest)).all())  # else NaN: _run_scores refuses it
                results.append((math.fsum(logprobs.double().tolist()) if usable else math.nan, len(targets), greedy))
        return results

    def _as_inference_error(self, error: BaseException) -> BaseException:
        if isinstance(error, InferenceError) or not isinstance(error, Exception):
            return error
        wrapped = ProviderError(
            f"transformers failed to generate ({type(error).__name__}: {error})", provider=self.name
        )
        wrapped.__cause__ = error
        return wrapped


class _FiniteRows:
    """Two logits processors of a ``generate`` (the first and the last) and a stopping criterion: end the rows
    whose logits are not finite.

    A row whose raw logits have no finite maximum (a NaN, +infinity) or are all equal (an RMS norm of an
    overflowed sum of squares is 0, and so is every logit) has no next token to read from them: an adapter or a
    scale too large for the model's numbers. :meth:`check` records the first such step; :meth:`force` makes the
    row's logits a sure end token (so it ends there, streams nothing more, and sampling never sees a NaN:
    ``torch.multinomial`` would fail the whole batch); its request fails with :class:`~inference.ProviderError`,
    and the other rows go on.

    Args:
        torch: The torch module.
        rows: The batch's rows.
        end_token: The token a failed row is given (an end-of-sequence token where the model has one).
    """

    def __init__(self, torch: Any, rows: int, end_token: int) -> None:
        self.torch = torch
        self.end_token = end_token
        self.first_bad: list[int | None] = [None] * rows
        self._step = 0
        self._bad: Any = None  # this step's failed rows (a bool tensor), or None

    def check(self, input_ids: Any, scores: Any) -> Any:
        """The first processor: record the rows whose raw logits are unusable at this step."""
        lowest, highest = self.torch.aminmax(scores, dim=-1)
        bad = ~self.torch.isfinite(highest) | (highest <= lowest)
        self._bad = None
        if bool(bad.any()):
            self._bad = bad
            for row in bad.nonzero().flatten().tolist():
                if self.first_bad[row] is None:
                    self.first_bad[row] = self._step
        self._step += 1
        return scores

    def force(self, input_ids: Any, scores: Any) -> Any:
        """The last processor: the rows :meth:`check` found this step get a sure end token."""
        if self._bad is None:
            return scores
        forced = self.torch.full_like(scores[:1], float("-inf"))
        forced[0, self.end_token] = 0.0
        return self.torch.where(self._bad[:, None], forced, scores)

    def stops(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        """Stopping criterion: a row is done once its logits were not finite."""
        flags = [step is not None for step in self.first_bad]
        return self.torch.tensor(flags, dtype=self.torch.bool, device=input_ids.device)

    def failed(self, row: int, steps: int) -> bool:
        """Whether ``row``'s logits were not finite within its first ``steps`` steps (the ones that made its tokens)."""
        step = self.first_bad[row]
        return step is not None and step < steps


class _StreamWatch:
    """A ``generate`` stopping criterion for one streamed row: hands out its text, stops at a stop string.

    Called after every new token. Text is handed out only while it decodes cleanly: a trailing U+FFFD
    (a character whose bytes are split over tokens) waits for the next token. (Cancellation is
    :class:`~inference._inprocess.batching.RowsCancelled`'s job, as for every row.)
    """

    def __init__(
        self,
        torch: Any,
        prompt_width: int,
        eos_ids: frozenset[int],
        decode: Callable[[list[int]], str],
        pieces: PieceAssembler,
    ) -> None:
        self.torch = torch
        self.prompt_width = prompt_width
        self.eos_ids = eos_ids
        self.decode = decode
        self.pieces = pieces

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        done = False
        tokens = [int(token) for token in input_ids[0, self.prompt_width :].tolist()]
        end = next((index for index, token in enumerate(tokens) if token in self.eos_ids), None)
        if end is None:  # after an end-of-sequence token generate stops by itself; finish() hands out the rest
            text = self.decode(tokens).rstrip("\ufffd")
            done = self.pieces.update(text) is not None
        return self.torch.full((input_ids.shape[0],), done, dtype=self.torch.bool, device=input_ids.device)


class _LogprobRecorder:
    """The first logits processor of a ``generate``: keeps each step's top tokens and the chosen token's logprob.

    It sees the raw logits (after the adapter, before any penalty, mask or sampling setting). The chosen
    token of a step is read from ``input_ids`` at the next step, and from the output after the last one,
    so only one step's full distribution is kept at a time.

    Args:
        torch: The torch module.
        top: The most alternatives any row asked for (0 to 20).
    """

    def __init__(self, torch: Any, top: int) -> None:
        self.torch = torch
        self.top = top
        self.chosen: list[Any] = []
        self.best: list[tuple[Any, Any]] = []
        self._previous: Any = None
        self._values: list[list[float]] | None = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        logprobs = self.torch.log_softmax(scores.float(), dim=-1)
        if self._previous is not None:
            self.chosen.append(self._previous.gather(1, input_ids[:, -1:]).squeeze(1))
        if self.top > 0:
            values, ids = logprobs.topk(self.top, dim=-1)
            self.best.append((values, ids))
        self._previous = logprobs
        return scores

    def finish(self, new_tokens: Any) -> None:
        """Read the last step's chosen tokens from ``generate``'s output (``new_tokens``: rows x steps)."""
        steps = new_tokens.shape[1]
        if self._previous is not None and len(self.chosen) < steps:
            last = new_tokens[:, len(self.chosen) : len(self.chosen) + 1].to(self._previous.device)
            self.chosen.append(self._previous.gather(1, last).squeeze(1))
        self._previous = None
        self._chosen_rows = self.torch.stack(self.chosen, dim=1).tolist() if self.chosen else []
        if self.best:
            self._best_values = self.torch.stack([values for values, _ in self.best], dim=1).tolist()
            self._best_ids = self.torch.stack([ids for _, ids in self.best], dim=1).tolist()
        self.best = []
        self.chosen = []

    def row(self, loaded: _LoadedModel, index: int, tokens: list[int], top: int) -> tuple[TokenLogprob, ...]:
        """The logprobs of row ``index``'s first ``len(tokens)`` tokens, each with its ``top`` alternatives."""
        entries = []
        for step, token in enumerate(tokens):
            alternatives: tuple[tuple[str, float], ...] = ()
            if top > 0:
                ids, values = self._best_ids[index][step][:top], self._best_values[index][step][:top]
                alternatives = tuple(
                    (loaded.token_text(int(other)), float(value)) for other, value in zip(ids, values, strict=True)
                )
            entries.append(
                TokenLogprob(
                    token=loaded.token_text(token),
                    logprob=float(self._chosen_rows[index][step]),
                    top_logprobs=alternatives,
                    token_id=token,
                )
            )
        return tuple(entries)


class _ScoreQueue:
    """Score calls waiting for the worker: a batch starts when the oldest has waited the window, or is full.

    A batch takes the calls for the oldest call's adapter first, oldest first, then fills up with the others.

    Args:
        max_batch_size: The most calls in one batch.
        window_s: How long the oldest waiting call waits for others, in seconds.
    """

    def __init__(self, max_batch_size: int, window_s: float) -> None:
        self.max_batch_size = max_batch_size
        self.window_s = window_s
        self._pending: list[_ScoreJob] = []
        self._condition = threading.Condition()

    def put(self, job: _ScoreJob) -> None:
        with self._condition:
            self._pending.append(job)
            self._condition.notify_all()

    def discard(self, job: _ScoreJob) -> None:
        """The caller gave up: the job is dropped (or, if its batch runs, its result is not computed)."""
        job.cancel.set()
        with self._condition:
            if job in self._pending:
                self._pending.remove(job)
        job.future.cancel()

    def next_batch(self) -> list[_ScoreJob]:
        """Wait for the oldest call's window, then return up to ``max_batch_size`` calls, oldest first."""
        with self._condition:
            while True:
                self._pending = [job for job in self._pending if not (job.future.cancelled() or job.cancel.is_set())]
                if not self._pending:
                    return []
                remaining = self._pending[0].enqueued_at + self.window_s - time.monotonic()
                if len(self._pending) >= self.max_batch_size or remaining <= 0:
                    break
                self._condition.wait(remaining)
            # The oldest call's adapter first, then the others: a forward pass of one adapter skips PEFT's
            # mixed-adapter path (each LoRA layer run once per adapter in the batch).
            adapter = self._pending[0].request.adapter_id
            ordered = sorted(self._pending, key=lambda job: job.request.adapter_id != adapter)  # stable: oldest first
            batch = ordered[: self.max_batch_size]
            chosen = {id(job) for job in batch}
            self._pending = [job for job in self._pending if id(job) not in chosen]
            return [job for job in batch if job.future.set_running_or_notify_cancel()]


def _slot_shape(config: dict[str, Any]) -> str | None:
    """What a PEFT adapter slot built for ``config`` fits: adapters of equal shape can share a slot in turn.

    ``None`` for configs whose slot holds more than LoRA weights of target modules (DoRA magnitudes, bias,
    ``modules_to_save``, trainable tokens, layer replication, target parameters): those are never reused.
    """
    if any(config.get(key) for key in _SLOT_EXCLUDED) or config.get("bias", "none") != "none":
        return None
    kept = {key: value for key, value in config.items() if key not in _SLOT_INDIFFERENT}
    if isinstance(kept.get("target_modules"), list):
        kept["target_modules"] = sorted(kept["target_modules"])
    return json.dumps(kept, sort_keys=True, default=str)


def _adapters_of(request: ScoreRequest) -> AdapterScales:
    return () if request.adapter_id is None else ((request.adapter_id, 1.0),)


def _drop(entry: PendingRequest) -> None:
    """Settle the future of a request whose caller gave up (no result is computed for it)."""
    if not entry.future.done():
        entry.future.set_exception(ProviderError("the request was cancelled", provider="transformers"))


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(token) for token in value]
