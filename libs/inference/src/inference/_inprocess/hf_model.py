"""A local Hugging Face causal language model as the Transformers provider holds it: loaded, placed, described.

:func:`load_model` reads a local model directory or GGUF file, or a Hub id from the Hugging Face cache, onto the
requested device and dtype, and returns a :class:`LoadedModel`: the model, its tokenizer and what generation and
scoring read from them (end-of-sequence and padding tokens, context length, the scoring
:class:`~inference._core.scoring.Vocabulary`).
Everything here runs on the provider's worker thread; torch and transformers are imported on first use only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference._core.dependencies import import_optional
from inference._core.paths import HUB_ID
from inference._core.scoring import Vocabulary
from inference._inprocess.constrained import JsonGrammars
from inference._inprocess.hf_prompt import scoring_vocabulary
from inference._inprocess.token_bytes import end_token_ids
from inference.exceptions import ConfigurationError, InferenceError, ModelLoadError, ProviderError

__all__ = [
    "LoadedModel",
    "OverflowWatch",
    "as_inference_error",
    "empty_cuda_cache",
    "free_weights",
    "load_model",
    "model_name_problem",
]

OVERFLOW = 1e18
"""A hidden-state value beyond which a float32 (or bfloat16) square is infinite, or nearly: the final norm's output
is then 0 or NaN, whatever the model."""


class OverflowWatch:
    """Which rows of the last forward pass overflowed on their way to the logits, seen at the final norm's input.

    An RMS norm takes the mean of squares; past about 1.8e19 a float32 square is infinite, and the norm's output
    becomes 0 (or NaN), so every logit is equal (or NaN). The logits alone cannot tell that from a model whose
    hidden state really is 0 (after a token with a zero embedding, such as a padding token): the norm's input can.
    A row is flagged when any of its values there is not finite or beyond :data:`OVERFLOW`.

    Args:
        torch: The torch module.
        norm: The model's final norm (the module whose output the language-model head reads).
    """

    def __init__(self, torch: Any, norm: Any) -> None:
        self.torch = torch
        self.rows: Any = None  # a bool tensor, one entry per row of the last forward pass
        self._hook = norm.register_forward_pre_hook(self._seen)

    def _seen(self, module: Any, args: tuple[Any, ...]) -> None:
        hidden = args[0]
        flat = hidden.reshape(hidden.shape[0], -1)
        self.rows = (~self.torch.isfinite(flat) | (flat.abs() > OVERFLOW)).any(dim=1)

    def take(self) -> Any:
        """The flags of the last forward pass (``None`` when none ran since the last call), and forget them."""
        rows, self.rows = self.rows, None
        return rows

    @classmethod
    def on(cls, torch: Any, model: Any) -> OverflowWatch | None:
        """A watch on ``model``'s final norm, or ``None`` where the model has none where decoders keep it."""
        decoder = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
        norm = getattr(decoder, "norm", None)
        return cls(torch, norm) if callable(getattr(norm, "register_forward_pre_hook", None)) else None



@dataclass
class LoadedModel:
    """The model as the worker thread holds it. ``model`` is a ``PeftModel`` while adapters are loaded.

    Attributes:
        name: The model's name in results (the directory's name, or the GGUF file's stem).
        model: What runs: the plain model, or the ``PeftModel`` around it while PEFT adapters are in it.
        base_model: The plain model (PEFT injects its LoRA layers into it in place).
        tokenizer: The model's tokenizer.
        device: The torch device it runs on.
        module_names: The plain model's module names, as loaded.
        eos_ids: Every end-of-sequence token id (the generation config's and the tokenizer's).
        pad_id: The token that pads a batch.
        context: ``max_position_embeddings``, or ``None`` when the config does not say.
        vocabulary: How scoring tokenizes text.
        token_texts: Token texts decoded so far (see :meth:`token_text`).
        grammars: The JSON-schema grammars compiled for this tokenizer, made on the first ``json_schema``.
        overflow: Which rows overflowed in the last forward pass (:class:`OverflowWatch`); ``None`` for a model
            without a final norm where decoders keep it (then all-equal logits count as an overflow).
    """

    name: str
    model: Any
    base_model: Any
    tokenizer: Any
    device: Any
    module_names: frozenset[str]
    eos_ids: frozenset[int]
    pad_id: int
    context: int | None
    vocabulary: Vocabulary
    token_texts: dict[int, str] = field(default_factory=dict)
    grammars: JsonGrammars | None = None
    overflow: OverflowWatch | None = None

    def token_text(self, token_id: int) -> str:
        """One token's text as the tokenizer decodes it alone (special tokens by their names)."""
        text = self.token_texts.get(token_id)
        if text is None:
            text = self.token_texts[token_id] = str(self.tokenizer.decode([token_id], skip_special_tokens=False))
        return text

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` as a result shows it (special tokens left out)."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def layer_features(self) -> dict[str, tuple[int, int] | None]:
        """Every module of the plain model now -> its ``(in_features, out_features)`` (``None`` where it has none)."""
        layers: dict[str, tuple[int, int] | None] = {}
        for name, module in self.base_model.named_modules():
            in_features, out_features = getattr(module, "in_features", None), getattr(module, "out_features", None)
            if isinstance(in_features, int) and isinstance(out_features, int):
                layers[name] = (in_features, out_features)
            else:
                layers[name] = None
        return layers


TOKENIZER_KEYWORDS = ("trust_remote_code", "revision", "token", "cache_dir", "subfolder")
"""The keywords of ``model_kwargs`` the tokenizer's ``from_pretrained`` gets too."""


def model_name_problem(model: str) -> str | None:
    """Why ``model`` (the ``model_name`` setting) names nothing :func:`load_model` could load, checked without
    loading it (for health); ``None`` when it may load: a model directory (with its ``config.json``), a ``.gguf``
    file, or a Hub id (``ORG/NAME``) where no such path exists."""
    path = Path(model).expanduser()
    if not path.exists():
        if HUB_ID.fullmatch(model):
            return None
        return f"the model {model} does not exist, and is no Hugging Face Hub id (ORG/NAME)"
    if path.is_dir() and not (path / "config.json").is_file():
        return (
            f"the model directory {model} holds no config.json: give the directory transformers saved the model "
            "in, a .gguf file, or a Hub id"
        )
    if not path.is_dir() and path.suffix.lower() != ".gguf":
        return f"the model {model} is a file but not a .gguf file: give a model directory, a GGUF file or a Hub id"
    return None


def load_model(
    model_name: str,
    device_name: str,
    dtype_name: str,
    *,
    provider: str,
    model_kwargs: Mapping[str, Any] | None = None,
) -> LoadedModel:
    """Load a local model directory or ``.gguf`` file onto ``device_name`` in ``dtype_name`` (worker thread).

    Args:
        model_name: A local model directory or GGUF file (``~`` is expanded), or a Hugging Face Hub id
            (``ORG/NAME``): resolved as ``from_pretrained`` resolves it, from the local cache (downloaded there
            first unless ``HF_HUB_OFFLINE`` is set).
        device_name: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` (already validated).
        dtype_name: ``"auto"`` (float32 on CPU; bfloat16 on CUDA where supported, else float16), ``"float32"``,
            ``"float16"`` or ``"bfloat16"`` (already validated).
        provider: The provider's name, for errors.
        model_kwargs: More keywords for ``AutoModelForCausalLM.from_pretrained`` (``device_map``,
            ``attn_implementation``, ``quantization_config``, ``trust_remote_code``...; they win over the provider's
            own, ``dtype`` included); those in :data:`TOKENIZER_KEYWORDS` go to the tokenizer too. With a
            ``device_map``, accelerate places the model and it is not moved to ``device_name``.

    Raises:
        ConfigurationError: No model was given, it is a file but not GGUF, or the device is not available.
        ModelLoadError: The path does not exist (and is no Hub id), a Hub model is neither cached nor downloadable,
            or transformers could not load what is there.
    """
    torch = import_optional("torch", extra="transformers", provider=provider)
    transformers = import_optional("transformers", extra="transformers", provider=provider)
    device = _torch_device(torch, device_name, provider)
    dtype = _resolve_dtype(torch, dtype_name, device)
    if not model_name:
        raise ConfigurationError(
            "no model to load: pass model_name= (a local model directory or .gguf file) "
            "or set TRANSFORMERS_MODEL_NAME",
            provider=provider,
        )
    path = Path(model_name).expanduser()
    hub_id = not path.exists() and HUB_ID.fullmatch(model_name) is not None
    if not path.exists() and not hub_id:
        raise ModelLoadError(
            f"model_name {model_name!r} is not a local directory or .gguf file, nor a Hugging Face Hub id "
            "(ORG/NAME): pass a model directory, a GGUF file, or a Hub id",
            provider=provider,
            path=str(path),
        )
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise ConfigurationError(
            f"model_name {model_name!r} is a file but not a .gguf file: pass a model directory or a GGUF file",
            provider=provider,
            path=str(path),
        )
    if hub_id:  # the Hub's own resolution: the local cache, downloaded there first unless HF_HUB_OFFLINE is set
        source, extra = model_name, {}
    else:
        directory, gguf = (path.parent, {"gguf_file": path.name}) if path.is_file() else (path, {})
        source, extra = str(directory), {"local_files_only": True, **gguf}
    passed = dict(model_kwargs or {})
    for_tokenizer = {key: value for key, value in passed.items() if key in TOKENIZER_KEYWORDS}
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, **{**extra, **for_tokenizer})
        model = transformers.AutoModelForCausalLM.from_pretrained(source, **{"dtype": dtype, **extra, **passed})
        if "device_map" not in passed:
            model.to(device)
        model.eval()
    except InferenceError:
        raise
    except Exception as error:
        if hub_id and isinstance(error, OSError):
            raise ModelLoadError(
                f"the Hub model {model_name!r} is not in the local Hugging Face cache and could not be downloaded "
                f"({type(error).__name__}: {str(error)[:300]}): download it first (huggingface-cli download "
                f"{model_name}) or, offline, unset HF_HUB_OFFLINE once you can reach the Hub",
                provider=provider,
                path=model_name,
            ) from error
        raise ModelLoadError(
            f"transformers could not load the model at {model_name if hub_id else path} ({type(error).__name__}: "
            f"{error}): check that it is a complete causal language model (config, weights, tokenizer) or GGUF file",
            provider=provider,
            path=model_name if hub_id else str(path),
        ) from error
    name = model_name if hub_id else path.stem if path.is_file() else path.name
    return loaded_model(name, model, tokenizer, model.device if "device_map" in passed else device, provider=provider)


def loaded_model(name: str, model: Any, tokenizer: Any, device: Any, *, provider: str) -> LoadedModel:
    """A :class:`LoadedModel` for a model and its tokenizer already in memory (loaded here, or by the caller: a
    model passed to the provider is used as it is, on its own device)."""
    generation = model.generation_config
    eos = end_token_ids(tokenizer, generation.eos_token_id)
    pad_candidates = [tokenizer.pad_token_id, generation.pad_token_id, *sorted(eos), 0]
    return LoadedModel(
        name=name,
        model=model,
        base_model=model,
        tokenizer=tokenizer,
        device=device,
        module_names=frozenset(name for name, _ in model.named_modules()),
        eos_ids=frozenset(eos),
        pad_id=next(int(token) for token in pad_candidates if token is not None),
        context=getattr(model.config, "max_position_embeddings", None),
        vocabulary=scoring_vocabulary(tokenizer),
        overflow=OverflowWatch.on(import_optional("torch", extra="transformers", provider=provider), model),
    )


def empty_cuda_cache(device: Any, *, provider: str) -> None:
    """On a CUDA ``device``, give the memory torch keeps cached back to the driver (after weights were freed)."""
    if device.type == "cuda":
        import_optional("torch", extra="transformers", provider=provider).cuda.empty_cache()


def free_weights(model: Any, *, provider: str) -> None:
    """Free ``model``'s parameters and buffers now, each replaced by an empty tensor, then give CUDA's cached memory
    back to the driver.

    A Transformers model (with PEFT's layers and hooks) sits in reference cycles, so dropping the last reference
    frees nothing until a full garbage collection finds it, and a collection holds the GIL for as long as it takes
    (about half a second in a process with torch loaded): from any thread, it stalls the event loop. Emptied here,
    the memory comes back at once; the small module objects left go at the next collection Python makes anyway.
    Only for a model this provider loaded: a model the user gave stays theirs, whole.
    """
    torch = import_optional("torch", extra="transformers", provider=provider)
    device = next(iter(model.parameters()), torch.empty(0)).device
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    empty_cuda_cache(device, provider=provider)


def as_inference_error(error: BaseException, *, provider: str) -> BaseException:
    """``error`` as a request's caller sees it: our errors as they are, anything else of the model's as a
    :class:`~inference.ProviderError` that names it (``KeyboardInterrupt`` and the like pass through)."""
    if isinstance(error, InferenceError) or not isinstance(error, Exception):
        return error
    wrapped = ProviderError(f"transformers failed to generate ({type(error).__name__}: {error})", provider=provider)
    wrapped.__cause__ = error
    return wrapped


def _torch_device(torch: Any, name: str, provider: str) -> Any:
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigurationError(
                f"device {name!r} was requested but torch sees no CUDA GPU "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}): "
                "use device='cpu' or install a CUDA build of torch on a machine with a GPU",
                provider=provider,
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigurationError(
                f"device {name!r} does not exist: torch sees {torch.cuda.device_count()} CUDA "
                "device(s), numbered from 0",
                provider=provider,
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigurationError(
            "device 'mps' was requested but torch reports MPS as unavailable: use device='cpu'",
            provider=provider,
        )
    return device


def _resolve_dtype(torch: Any, name: str, device: Any) -> Any:
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32
