"""Every provider type in one table: where its class lives, what it needs, how it is configured.

Adding a backend is adding one :class:`ProviderSpec` to :data:`PROVIDERS`; the factory, the settings table
(:data:`inference.config.SETTINGS`), ``.env.example``, the ``inference`` command and ``inference``'s lazy
class attributes all read it. Classes are named by import path and imported only when used, so nothing here
imports a backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from inference._core.dependencies import import_optional
from inference._core.settings import Setting
from inference.exceptions import MissingDependencyError, UnknownProviderError

__all__ = [
    "PROVIDERS",
    "PROVIDER_EXTRAS",
    "PROVIDER_REGISTRY",
    "ProviderSpec",
    "load_provider_class",
    "providers_sending",
    "providers_with",
]

_RETRIES = "Retries of transient failures (connect errors, 429, 502, 503, 504; a GET whose connection dropped)"


@dataclass(frozen=True)
class ProviderSpec:
    """One provider type.

    Attributes:
        name: The provider type: ``get_provider(name)``, ``INFERENCE_PROVIDER``, a step config's ``provider``.
        target: Where the class is, as ``"module:ClassName"``.
        summary: One line saying what the provider runs on.
        extra: The ``inference-adapters`` pip extra that installs its dependencies (``None``: it needs none).
        packages: The import names that extra provides (``inference providers`` looks for them without
            importing them).
        settings: Its settings (constructor arguments, environment variables, defaults), in constructor order.
        server: It talks to a server at ``base_url`` (adapters it loads live on the server).
        model_setting: The setting that names the model to load in process (what ``--model-path`` sets).
        stand_in: It stands in for any provider in tests, so a step config written for another provider works
            with only ``provider`` changed: other providers' settings are ignored instead of refused.
    """

    name: str
    target: str
    summary: str
    extra: str | None = None
    packages: tuple[str, ...] = ()
    settings: tuple[Setting, ...] = ()
    server: bool = False
    model_setting: str | None = None
    stand_in: bool = False

    @property
    def module(self) -> str:
        """The module that defines the class."""
        return self.target.partition(":")[0]

    @property
    def class_name(self) -> str:
        """The class's name, as ``inference`` exports it."""
        return self.target.partition(":")[2]


def _server_settings(
    prefix: str, base_url: str, what: str, *, api_key: str | None = None, replicas: bool = True
) -> tuple[Setting, ...]:
    """``base_url``, ``api_key``, ``timeout``, ``max_retries`` and (``replicas``: a provider that spreads requests
    over several base URLs) ``replica_down_s``, read from ``<prefix>_BASE_URL`` and so on.

    ``api_key`` is the server's option that sets its key (``"vLLM --api-key"``), ``""`` for a server that takes a
    key without one, ``None`` for a server that takes no key (no ``api_key`` setting).
    """
    key = () if api_key is None else (
        Setting("api_key", f"{prefix}_API_KEY", None, "secret",
                f"API key sent as a bearer token{f' ({api_key})' if api_key else ''}; never logged",
                none_means="no key"),
    )
    return (
        Setting("base_url", f"{prefix}_BASE_URL", base_url, "urls" if replicas else "url", what),
        *key,
        Setting("timeout", f"{prefix}_TIMEOUT", 120.0, "float", "Seconds to wait for one answer",
                minimum=0, exclusive_minimum=True),
        Setting("max_retries", f"{prefix}_MAX_RETRIES", 2, "int", _RETRIES, minimum=0, maximum=100),
        *((Setting("replica_down_s", f"{prefix}_REPLICA_DOWN_S", 5.0, "float",
                   "Seconds a replica that is down (refused a connection, answered 502/503/504, or did not answer "
                   "within the timeout) is tried after the others (then in turn again)",
                   minimum=0),) if replicas else ()),
    )


def _max_adapters(prefix: str) -> Setting:
    """``max_adapters``, read from ``<prefix>_MAX_ADAPTERS``: the in-process providers' adapter capacity."""
    return Setting("max_adapters", f"{prefix}_MAX_ADAPTERS", None, "int",
                   "Most adapters kept loaded; least recently used ones are evicted and reloaded on use",
                   minimum=1, none_means="no limit")


def _raw_prompt(prefix: str) -> Setting:
    """``raw_prompt``, read from ``<prefix>_RAW_PROMPT``: the provider-level default of the ``raw_prompt`` option
    (the base class applies it to every request that leaves the option at ``None``)."""
    return Setting("raw_prompt", f"{prefix}_RAW_PROMPT", False, "bool",
                   "Send prompts as they are, without the chat template, unless a request says raw_prompt=False")


def _adapter_cache_dir(prefix: str, what: str) -> Setting:
    """``adapter_cache_dir``, read from ``<prefix>_ADAPTER_CACHE_DIR``: where converted adapters are kept."""
    return Setting("adapter_cache_dir", f"{prefix}_ADAPTER_CACHE_DIR", None, "directory", what,
                   none_means="~/.cache/inference-adapters")


_SPECS = (
    ProviderSpec(
        name="vllm",
        target="inference.vllm_provider:VLLMProvider",
        summary="vLLM servers: OpenAI-compatible generation, LoRA adapters loaded at run time, replicas",
        extra="vllm",
        packages=("httpx", "transformers"),
        server=True,
        settings=(
            *_server_settings("VLLM", "http://localhost:8100/v1", "OpenAI-compatible base URL of the vLLM server",
                              api_key="vLLM --api-key"),
            Setting("max_lora_rank", "VLLM_MAX_LORA_RANK", 16, "int",
                    "Largest adapter rank accepted before sending (match the server's --max-lora-rank)", minimum=1),
            Setting("adapter_dir", "VLLM_ADAPTER_DIR", None, "shared-directory",
                    "A directory this process writes and the vLLM servers read at the same path, for adapters "
                    "loaded from memory (AdapterWeights)", none_means="adapters from memory are refused"),
            Setting("api", "VLLM_API", "auto", "str",
                    "Route of generations: auto (chat for a model with a chat template, else /v1/completions with "
                    "the plain text; asked of the server once), chat, or completions",
                    choices=("auto", "chat", "completions")),
            Setting("adapter_placement", "VLLM_ADAPTER_PLACEMENT", "all", "str",
                    "Where adapters are loaded with several replicas: all (every replica), or on-demand (one "
                    "replica, more when its requests need them)", choices=("all", "on-demand")),
            Setting("max_loras", "VLLM_MAX_LORAS", None, "int",
                    "Adapters one replica holds with on-demand placement (the servers' --max-cpu-loras); the "
                    "least recently used one makes room", minimum=1, none_means="no limit"),
            Setting("spread_after", "VLLM_SPREAD_AFTER", 8, "int",
                    "With on-demand placement, requests in flight on every holder of an adapter before it is "
                    "loaded on one more replica", minimum=1),
        ),
    ),
    ProviderSpec(
        name="openai",
        target="inference.openai_provider:OpenAIProvider",
        summary="any OpenAI-compatible endpoint (OpenAI, SGLang, LM Studio, a gateway); no adapters",
        extra="openai",
        packages=("httpx",),
        server=True,
        settings=(
            *_server_settings("OPENAI", "https://api.openai.com/v1", "Base URL of the OpenAI-compatible API",
                              api_key=""),
            Setting("api", "OPENAI_API", "auto", "str",
                    "Route of generations: auto (chat; /v1/completions with the plain text once a server refuses chat "
                    "for want of a chat template), chat, or completions (for a model without a chat template, which "
                    "some servers answer with empty text on chat)",
                    choices=("auto", "chat", "completions")),
        ),
    ),
    ProviderSpec(
        name="ollama",
        target="inference.ollama_provider:OllamaProvider",
        summary="an Ollama server: adapters baked into derived models (PEFT adapters converted to GGUF here)",
        extra="ollama",
        packages=("httpx", "gguf"),
        server=True,
        settings=(
            *_server_settings(
                "OLLAMA", "http://localhost:11434/v1", "Ollama base URL; the native API is used at the same host "
                "without /v1", replicas=False,
            ),
            Setting("base_model", "OLLAMA_BASE_MODEL", None, "str",
                    "Ollama model that adapters are applied to (load_adapter creates a model derived from it)",
                    none_means="no base model (give load_adapter a base_model)"),
            Setting("think", "OLLAMA_THINK", "auto", "str",
                    "thinking models: auto (the model's default), true, false (no thinking, the whole budget for "
                    "the answer), or low/medium/high (gpt-oss)",
                    choices=("auto", "true", "false", "low", "medium", "high")),
            _adapter_cache_dir("OLLAMA", "Where PEFT adapters converted to GGUF are cached before they are uploaded"),
        ),
    ),
    ProviderSpec(
        name="llamacpp",
        target="inference.llamacpp_provider:LlamaCppProvider",
        summary="llama.cpp in this process (llama-cpp-python): GGUF models, GGUF LoRA adapters hot-swapped",
        extra="llamacpp",
        packages=("llama_cpp", "gguf", "llguidance", "huggingface_hub", "jinja2"),
        model_setting="model_path",
        settings=(
            Setting("model_path", "LLAMACPP_MODEL_PATH", None, "path",
                    "Path of the GGUF base model, or ORG/NAME:FILE.gguf from the Hugging Face Hub (its cache)",
                    none_means="no model"),
            Setting("n_ctx", "LLAMACPP_N_CTX", 4096, "int", "Context size in tokens", minimum=1),
            Setting("n_gpu_layers", "LLAMACPP_N_GPU_LAYERS", -1, "int",
                    "Layers offloaded to the GPU (-1 = all; ignored on CPU-only builds)", minimum=-1),
            _adapter_cache_dir("LLAMACPP", "Where PEFT adapters converted to GGUF are cached"),
            _max_adapters("LLAMACPP"),
            Setting("n_parallel", "LLAMACPP_N_PARALLEL", 4, "int",
                    "Requests decoded together in one batch (continuous batching; 1 = one at a time)", minimum=1),
            Setting("kv_cache_type", "LLAMACPP_KV_CACHE_TYPE", None, "str",
                    "KV cache precision (f32 makes scores match Transformers on unquantized weights)",
                    choices=("f32", "f16", "q4_0", "q8_0", "bf16"), none_means="llama.cpp's default, f16"),
            Setting("n_threads", "LLAMACPP_N_THREADS", None, "int", "CPU threads for generation", minimum=1,
                    none_means="llama-cpp-python's choice"),
            Setting("n_batch", "LLAMACPP_N_BATCH", 512, "int",
                    "Prompt tokens evaluated per llama_decode call (at least n_parallel)",
                    minimum=1),
            Setting("prefix_cache_tokens", "LLAMACPP_PREFIX_CACHE_TOKENS", 0, "int",
                    "Tokens of computed sequences next_token_logprobs keeps to extend cached prefixes (0: no cache, "
                    "each sequence computed whole)", minimum=0),
            Setting("flash_attn", "LLAMACPP_FLASH_ATTN", False, "bool",
                    "Flash attention (faster batched decoding; a request's tokens in a batch may then differ from "
                    "its tokens alone)"),
            Setting("hot_swap", "LLAMACPP_HOT_SWAP", True, "bool",
                    "Swap adapters with llama.cpp's adapter API (false: rebuild the model whenever the adapter "
                    "changes, a fallback)"),
            Setting("verbose", "LLAMACPP_VERBOSE", False, "bool", "Let llama.cpp print its own logs"),
        ),
    ),
    ProviderSpec(
        name="llamacpp-server",
        target="inference.llamacpp_server_provider:LlamaCppServerProvider",
        summary="llama.cpp's own llama-server: GGUF LoRA adapters preloaded at start (--lora), chosen per request",
        extra="llamacpp-server",
        packages=("httpx", "gguf"),
        server=True,
        settings=(
            *_server_settings("LLAMACPP_SERVER", "http://localhost:8080", "Base URL of llama.cpp's llama-server",
                              api_key="llama-server --api-key"),
            _adapter_cache_dir("LLAMACPP_SERVER", "Where PEFT adapters are converted to GGUF to match them with the "
                               "server's --lora files"),
        ),
    ),
    ProviderSpec(
        name="transformers",
        target="inference.transformers_provider:TransformersProvider",
        summary="Transformers + PEFT in this process: batches that mix adapters",
        extra="transformers",
        packages=("torch", "transformers", "peft", "accelerate", "gguf", "safetensors", "llguidance"),
        model_setting="model_name",
        settings=(
            Setting("model_name", "TRANSFORMERS_MODEL_NAME", "", "path",
                    "Local model directory, .gguf file, or Hugging Face Hub id (ORG/NAME) to load with transformers"),
            Setting("device", "TRANSFORMERS_DEVICE", "cpu", "str", "Torch device: cpu, cuda, cuda:1, ...",
                    pattern=r"cpu|mps|cuda(:\d+)?", hint="'cpu', 'cuda', 'cuda:N' or 'mps'"),
            Setting("torch_dtype", "TRANSFORMERS_TORCH_DTYPE", "auto", "str",
                    "Weights dtype: auto, float32, float16, bfloat16",
                    choices=("auto", "float32", "float16", "bfloat16")),
            Setting("max_batch_size", "TRANSFORMERS_MAX_BATCH_SIZE", 32, "int",
                    "Most concurrent requests run together in one batch", minimum=1),
            Setting("batch_window_ms", "TRANSFORMERS_BATCH_WINDOW_MS", 5.0, "float",
                    "Milliseconds to wait for more requests before a batch starts", minimum=0, maximum=60_000),
            _max_adapters("TRANSFORMERS"),
            Setting("spare_adapter_slots", "TRANSFORMERS_SPARE_ADAPTER_SLOTS", 8, "int",
                    "Adapter slots an unload keeps for the next adapter of the same LoRA shape (0: unload frees all)",
                    minimum=0, maximum=1000),
            Setting("prefix_cache_tokens", "TRANSFORMERS_PREFIX_CACHE_TOKENS", 0, "int",
                    "Tokens of keys and values next_token_logprobs keeps to extend cached prefixes (0: no cache, "
                    "sequences run whole in batches)", minimum=0),
        ),
    ),
    ProviderSpec(
        name="vllm-offline",
        target="inference.vllm_offline_provider:VLLMOfflineProvider",
        summary="vLLM's engine in this process: batches that mix LoRA adapters, no server to manage",
        extra="vllm-offline",
        packages=("vllm", "huggingface_hub", "torch", "safetensors"),
        model_setting="model_name",
        settings=(
            Setting("model_name", "VLLM_OFFLINE_MODEL_NAME", "", "path",
                    "Local model directory, or Hugging Face Hub id (ORG/NAME), for vLLM to load"),
            Setting("max_loras", "VLLM_OFFLINE_MAX_LORAS", 4, "int",
                    "Adapters one engine step can mix (vLLM's max_loras)", minimum=1),
            Setting("max_lora_rank", "VLLM_OFFLINE_MAX_LORA_RANK", 16, "int",
                    "Largest adapter rank the engine accepts (vLLM's max_lora_rank)", minimum=1),
            Setting("max_model_len", "VLLM_OFFLINE_MAX_MODEL_LEN", None, "int",
                    "Longest prompt plus answer in tokens", minimum=1, none_means="the model's own limit"),
            Setting("gpu_memory_utilization", "VLLM_OFFLINE_GPU_MEMORY_UTILIZATION", 0.9, "float",
                    "Share of GPU memory vLLM may take (GPU builds)", minimum=0, exclusive_minimum=True, maximum=1),
            Setting("dtype", "VLLM_OFFLINE_DTYPE", "auto", "str", "Weights dtype: auto, float32, float16, bfloat16",
                    choices=("auto", "float32", "float16", "bfloat16")),
            _max_adapters("VLLM_OFFLINE"),
            Setting("engine_args", "VLLM_OFFLINE_ENGINE_ARGS", None, "json",
                    "More of vLLM's engine arguments (AsyncEngineArgs), passed unchecked",
                    none_means="none"),
        ),
    ),
    ProviderSpec(
        name="fake",
        target="inference.fake_provider:FakeProvider",
        summary="deterministic answers with no dependencies, for your own tests",
        settings=(
            _max_adapters("FAKE"),
            Setting("prefix_cache_tokens", "FAKE_PREFIX_CACHE_TOKENS", 65536, "int",
                    "Prefix tokens the token-level cache holds, least recently used out (0: no cache)", minimum=0),
            Setting("context_length", "FAKE_CONTEXT_LENGTH", 2048, "int",
                    "Longest token sequence next_token_logprobs and score take", minimum=1),
            _raw_prompt("FAKE"),
        ),
        stand_in=True,
    ),
)

PROVIDERS: Mapping[str, ProviderSpec] = {spec.name: spec for spec in _SPECS}
"""Provider type -> :class:`ProviderSpec`: the one place a provider is registered."""

PROVIDER_REGISTRY: dict[str, str] = {spec.name: spec.target for spec in _SPECS}
"""Provider type -> ``module:ClassName`` (from :data:`PROVIDERS`; what :func:`load_provider_class` imports)."""

PROVIDER_EXTRAS: dict[str, str | None] = {spec.name: spec.extra for spec in _SPECS}
"""Provider type -> the pip extra of ``inference-adapters`` that installs its dependencies (from :data:`PROVIDERS`)."""


def load_provider_class(provider_type: str) -> type:
    """Import and return the provider class registered for ``provider_type``.

    Raises:
        UnknownProviderError: The type is not registered.
        MissingDependencyError: The provider's optional dependencies are not installed.
    """
    try:
        target = PROVIDER_REGISTRY[provider_type]
    except KeyError:
        raise UnknownProviderError(
            f"unknown provider type {provider_type!r}: valid names are {', '.join(sorted(PROVIDER_REGISTRY))}"
        ) from None
    module_name, _, class_name = target.partition(":")
    module = import_optional(module_name, provider=provider_type)
    cls: type = getattr(module, class_name)
    return cls


def providers_with(capability: str) -> list[str]:
    """The provider types whose class has the capability attribute ``capability`` true (``supports_scoring``).

    It imports every provider module whose dependencies are installed (providers without them are left out), so
    it is for error messages and tools, not for hot paths.
    """
    return [name for name, cls in _installed_classes() if getattr(cls, capability, False)]


def providers_sending(option: str) -> list[str]:
    """The provider types whose class declares that its backend receives ``option`` (a generation option).

    Like :func:`providers_with`, it imports the provider modules whose dependencies are installed: for messages.
    """
    from inference.options import Sent

    return [name for name, cls in _installed_classes() if isinstance(getattr(cls, "options", {}).get(option), Sent)]


def _installed_classes() -> Iterator[tuple[str, type]]:
    """Each provider type whose dependencies are installed, with its class (imported here)."""
    for name in PROVIDER_REGISTRY:
        try:
            cls = load_provider_class(name)
        except MissingDependencyError:
            continue
        yield name, cls
