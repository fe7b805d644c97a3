"""Every setting the SDK reads, with its environment variable, default and meaning.

One precedence order everywhere: an explicit argument or step-config key, then the environment variable,
then the default. This table is the single source of truth: the factory resolves settings from it, and
``.env.example`` and the configuration docs list exactly these variables.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from inference.exceptions import ConfigurationError, UnknownProviderError
from inference.registry import PROVIDER_REGISTRY

__all__ = [
    "DEFAULT_PROVIDER",
    "PROVIDER_ENV_VAR",
    "SETTINGS",
    "Setting",
    "resolve_provider_type",
    "resolve_settings",
    "validate_base_url",
]

PROVIDER_ENV_VAR = "INFERENCE_PROVIDER"
DEFAULT_PROVIDER = "vllm"


def validate_base_url(url: str, *, source: str) -> str:
    """Return ``url`` without a trailing slash if it is an http(s) URL with a host, else raise.

    A comma-separated list of URLs (replicas) is checked item by item and returned joined by commas.

    Raises:
        ConfigurationError: A URL has no ``http://``/``https://`` scheme or no host.
    """
    if not isinstance(url, str):
        if isinstance(url, (list, tuple)) and url:
            return ",".join(validate_base_url(item, source=source) for item in url)
        raise ConfigurationError(f"{source} must be a URL string or a list of URLs, got {url!r}")
    if "," in url:
        return ",".join(validate_base_url(item.strip(), source=source) for item in url.split(",") if item.strip())
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(
            f"{source} {url!r} is not a valid base URL: write it with a scheme and host, "
            "for example 'http://localhost:8100/v1'",
            url=url,
        )
    return url.rstrip("/")


def _optional_str(value: str) -> str | None:
    return value or None


def _optional_int(value: str) -> int | None:
    return int(value) if value else None


@dataclass(frozen=True)
class Setting:
    """One configurable value of a provider.

    Attributes:
        key: The constructor argument and step-config key.
        env_var: The environment variable that sets it.
        default: The value when neither an argument nor the variable gives one.
        parse: Turns the variable's text into the value.
        description: What it means, for ``.env.example`` and the docs.
    """

    key: str
    env_var: str
    default: Any
    parse: Callable[[str], Any]
    description: str


SETTINGS: dict[str, tuple[Setting, ...]] = {
    "vllm": (
        Setting("base_url", "VLLM_BASE_URL", "http://localhost:8100/v1", str,
                "OpenAI-compatible base URL of the vLLM server"),
        Setting("api_key", "VLLM_API_KEY", None, _optional_str,
                "API key sent as a bearer token (vLLM --api-key); never logged"),
        Setting("timeout", "VLLM_TIMEOUT", 120.0, float, "Seconds to wait for one answer"),
        Setting("max_retries", "VLLM_MAX_RETRIES", 2, int,
                "Retries of transient failures (connect errors, 429, 502, 503, 504)"),
        Setting("max_lora_rank", "VLLM_MAX_LORA_RANK", 16, int,
                "Largest adapter rank accepted before sending (match the server's --max-lora-rank)"),
    ),
    "ollama": (
        Setting("base_url", "OLLAMA_BASE_URL", "http://localhost:11434/v1", str,
                "Ollama base URL; the native API is used at the same host without /v1"),
        Setting("timeout", "OLLAMA_TIMEOUT", 120.0, float, "Seconds to wait for one answer"),
        Setting("max_retries", "OLLAMA_MAX_RETRIES", 2, int,
                "Retries of transient failures (connect errors, 429, 502, 503, 504)"),
        Setting("base_model", "OLLAMA_BASE_MODEL", None, _optional_str,
                "Ollama model that adapters are applied to (load_adapter creates a model derived from it)"),
    ),
    "llamacpp": (
        Setting("model_path", "LLAMACPP_MODEL_PATH", None, _optional_str, "Path of the GGUF base model"),
        Setting("n_ctx", "LLAMACPP_N_CTX", 4096, int, "Context size in tokens"),
        Setting("n_gpu_layers", "LLAMACPP_N_GPU_LAYERS", -1, int,
                "Layers offloaded to the GPU (-1 = all; ignored on CPU-only builds)"),
        Setting("adapter_cache_dir", "LLAMACPP_ADAPTER_CACHE_DIR", None, _optional_str,
                "Where PEFT adapters converted to GGUF are cached (default ~/.cache/inference-adapters)"),
        Setting("max_adapters", "LLAMACPP_MAX_ADAPTERS", None, _optional_int,
                "Most adapters kept loaded; least recently used ones are evicted and reloaded on use"),
    ),
    "transformers": (
        Setting("model_name", "TRANSFORMERS_MODEL_NAME", "", str,
                "Local model directory (or a .gguf file) to load with transformers"),
        Setting("device", "TRANSFORMERS_DEVICE", "cpu", str, "Torch device: cpu, cuda, cuda:1, ..."),
        Setting("torch_dtype", "TRANSFORMERS_TORCH_DTYPE", "auto", str,
                "Weights dtype: auto, float32, float16, bfloat16"),
        Setting("max_batch_size", "TRANSFORMERS_MAX_BATCH_SIZE", 32, int,
                "Most concurrent requests run together in one batch"),
        Setting("batch_window_ms", "TRANSFORMERS_BATCH_WINDOW_MS", 5.0, float,
                "Milliseconds to wait for more requests before a batch starts"),
        Setting("max_adapters", "TRANSFORMERS_MAX_ADAPTERS", None, _optional_int,
                "Most adapters kept loaded; least recently used ones are evicted and reloaded on use"),
    ),
    "fake": (),
}
"""Settings per provider type, in constructor-argument order."""


def resolve_provider_type(provider_type: str | None, environ: Mapping[str, str] | None = None) -> str:
    """Return the provider type from the argument, else ``INFERENCE_PROVIDER``, else ``"vllm"``.

    Raises:
        UnknownProviderError: The type is not a registered provider.
    """

    environ = os.environ if environ is None else environ
    chosen = provider_type if provider_type is not None else environ.get(PROVIDER_ENV_VAR) or DEFAULT_PROVIDER
    normalised = chosen.strip().lower() if isinstance(chosen, str) else chosen
    if normalised not in PROVIDER_REGISTRY:
        source = "provider type" if provider_type is not None else f"{PROVIDER_ENV_VAR} value"
        raise UnknownProviderError(
            f"unknown {source} {chosen!r}: valid names are {', '.join(sorted(PROVIDER_REGISTRY))}"
        )
    return str(normalised)


def resolve_settings(
    provider_type: str,
    overrides: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Resolve a provider's constructor arguments: override, else environment variable, else default.

    Args:
        provider_type: A registered provider type.
        overrides: Explicit values (arguments or step-config keys); ``None`` values count as absent.
            Keys that are not settings of this provider are ignored, so a step config may carry other keys.
        environ: The environment to read (``os.environ`` when omitted).

    Raises:
        ConfigurationError: A variable cannot be parsed, or a base URL is malformed.
    """
    environ = os.environ if environ is None else environ
    resolved: dict[str, Any] = {}
    for setting in SETTINGS[provider_type]:
        if overrides.get(setting.key) is not None:
            value, source = overrides[setting.key], f"argument {setting.key}"
        elif environ.get(setting.env_var, "") != "":
            raw, source = environ[setting.env_var], f"environment variable {setting.env_var}"
            try:
                value = setting.parse(raw)
            except ValueError:
                raise ConfigurationError(
                    f"{source}={raw!r} is not valid: expected {setting.parse.__name__} ({setting.description})"
                ) from None
        else:
            value, source = setting.default, f"default {setting.key}"
        if setting.key == "base_url":
            value = validate_base_url(value, source=source)
        resolved[setting.key] = value
    return resolved


def render_env_example() -> str:
    """Return the text of ``.env.example``: every variable the SDK reads, with its default and meaning.

    ``python scripts/write_env_example.py`` rewrites the file; a test keeps the two equal.
    """
    lines = [
        "# Every environment variable the inference SDK reads, with its default.",
        "# Generated from inference/config.py by: python scripts/write_env_example.py",
        "",
        f"# Provider type used when get_provider() gets none: {', '.join(sorted(PROVIDER_REGISTRY))}",
        f"# {PROVIDER_ENV_VAR}={DEFAULT_PROVIDER}",
    ]
    for provider_type, settings in SETTINGS.items():
        if not settings:
            continue
        lines += ["", f"# --- {provider_type} ---"]
        for setting in settings:
            default = "" if setting.default is None else setting.default
            lines += [f"# {setting.description}", f"# {setting.env_var}={default}"]
    return "\n".join(lines) + "\n"


def render_configuration_table() -> str:
    """Return the Markdown table of every setting, for ``docs/configuration.md``."""
    rows = [
        "| provider | key (argument / step config) | variable | default | meaning |",
        "| --- | --- | --- | --- | --- |",
        f"| all | `provider` | `{PROVIDER_ENV_VAR}` | `{DEFAULT_PROVIDER}` | provider type |",
    ]
    for provider_type, settings in SETTINGS.items():
        for setting in settings:
            default = "" if setting.default in (None, "") else f"`{setting.default}`"
            rows.append(
                f"| {provider_type} | `{setting.key}` | `{setting.env_var}` | {default} | {setting.description} |"
            )
    return "\n".join(rows) + "\n"
