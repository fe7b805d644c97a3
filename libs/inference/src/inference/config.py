"""Every setting the SDK reads, with its environment variable, default and meaning.

One precedence order everywhere: an explicit argument or step-config key, then the environment variable,
then the default. This table is the single source of truth: the factory resolves settings from it, and
``.env.example`` and the configuration docs list exactly these variables.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from inference._core.paths import directory_problem, expand_path, path_text_problem
from inference.exceptions import ConfigurationError, UnknownProviderError
from inference.registry import PROVIDER_REGISTRY

__all__ = [
    "DEFAULT_PROVIDER",
    "PROVIDER_ENV_VAR",
    "SETTINGS",
    "Setting",
    "SettingKind",
    "resolve_provider_type",
    "resolve_settings",
    "validate_base_url",
    "validate_setting",
]

PROVIDER_ENV_VAR = "INFERENCE_PROVIDER"
DEFAULT_PROVIDER = "vllm"


def validate_base_url(url: str, *, source: str) -> str:
    """Return ``url`` without surrounding blanks and trailing slash if it is an http(s) URL with a host, else raise.

    A comma-separated list of URLs (replicas) is checked item by item and returned joined by commas.

    Raises:
        ConfigurationError: A URL has no ``http://``/``https://`` scheme or no host, a port that is not a
            number, whitespace, or text that cannot be encoded as UTF-8.
    """
    if not isinstance(url, str):
        if isinstance(url, (list, tuple)) and url:
            return ",".join(validate_base_url(item, source=source) for item in url)
        raise ConfigurationError(f"{source} must be a URL string or a list of URLs, got {url!r}")
    if "," in url:
        return ",".join(validate_base_url(item.strip(), source=source) for item in url.split(",") if item.strip())
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError as error:  # e.g. "Invalid IPv6 URL" for 'http://[::1/v1'
        raise ConfigurationError(
            f"{source} {url!r} is not a valid base URL ({error}): write it like 'http://localhost:8100/v1'",
            url=url,
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"{source} {url!r} is not a valid base URL: write it with a scheme and host, "
            "for example 'http://localhost:8100/v1'",
            url=url,
        )
    problem = _url_problem(url)
    if problem is None:
        try:
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number in [0, 65535]
        except ValueError:
            problem = "its port is not a number from 0 to 65535"
    if problem is not None:
        raise ConfigurationError(
            f"{source} {url!r} is not a valid base URL: {problem}; write it like 'http://localhost:8100/v1'",
            url=url,
        )
    return url.rstrip("/")


def _url_problem(url: str) -> str | None:
    """Why no HTTP client can send to ``url`` (whitespace, text that is not UTF-8), or ``None``."""
    blank = next((index for index, char in enumerate(url) if char.isspace()), None)
    if blank is not None:
        return f"it holds whitespace at position {blank}"
    try:
        url.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"it holds {url[error.start]!r} at position {error.start}, which cannot be encoded as UTF-8"
    return None


SettingKind = Literal["str", "int", "float", "url", "path", "directory"]
"""What a setting's values are: text, an integer, a finite number, base URL(s), a file path, or a directory
that files are written into (checked to be creatable and writable, nothing created)."""


@dataclass(frozen=True)
class Setting:
    """One configurable value of a provider, and the rule its values follow.

    The rule is checked wherever the value comes from (constructor argument, step-config key, environment
    variable), when the provider is built, so a bad value fails at once with a sentence naming the argument
    or the variable instead of failing each request later.

    Attributes:
        key: The constructor argument and step-config key.
        env_var: The environment variable that sets it.
        default: The value when neither an argument nor the variable gives one.
        kind: What the values are (:data:`SettingKind`). Numbers are never booleans; ``float`` values are
            finite; ``path`` and ``directory`` values have ``~`` expanded.
        description: What it means, for ``.env.example`` and the docs.
        minimum: The smallest number allowed, if any.
        maximum: The largest number allowed, if any.
        exclusive_minimum: ``minimum`` itself is not allowed (a timeout must be above 0).
        none_means: When set, ``None`` (or an empty string) is a valid value meaning this ("no limit").
        choices: The allowed texts, compared stripped and lower-cased (the value is returned that way).
        pattern: A regular expression the whole text must match, stripped and lower-cased.
        hint: How the allowed texts read in messages, where ``pattern`` alone would not say it.
    """

    key: str
    env_var: str
    default: Any
    kind: SettingKind
    description: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    none_means: str | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    hint: str = ""

    @property
    def rule(self) -> str:
        """The values allowed, as words: ``"a finite number above 0"``, ``"an integer of at least 1"``..."""
        if self.kind in ("int", "float"):
            noun = "an integer" if self.kind == "int" else "a finite number"
            if self.kind == "int" and self.maximum is None and self.minimum in (0, 1) and not self.exclusive_minimum:
                noun = "a positive integer" if self.minimum == 1 else "a non-negative integer"
            elif self.minimum is not None and self.maximum is not None:
                bound = "(" if self.exclusive_minimum else "["
                noun += f" in {bound}{self.minimum:g}, {self.maximum:g}]"
            elif self.minimum is not None:
                noun += f" above {self.minimum:g}" if self.exclusive_minimum else f" of at least {self.minimum:g}"
            elif self.maximum is not None:
                noun += f" of at most {self.maximum:g}"
        elif self.kind == "url":
            noun = "an http(s) base URL, or several separated by commas"
        elif self.kind == "path":
            noun = "a file path"
        elif self.kind == "directory":
            noun = "a directory this process can create or write into"
        elif self.choices:
            noun = "one of " + ", ".join(repr(choice) for choice in self.choices)
        else:
            noun = self.hint or "a string"
        if self.none_means is not None:
            noun += f", or empty for {self.none_means}"
        return noun

    def parse(self, text: str) -> Any:
        """Turn an environment variable's text into a checked value of this setting.

        Raises:
            ConfigurationError: The text is not a valid value; the message names the variable.
        """
        return self.check(text, origin="environment")

    def check(self, value: Any, *, origin: str = "argument", provider: str | None = None) -> Any:
        """Return ``value`` in its canonical form if it follows the rule, else raise.

        A string given for a number is parsed as the environment variable's text would be, so step configs
        read from text files work. Numbers of ``float`` settings are returned as ``float``; texts with
        ``choices`` or a ``pattern`` stripped and lower-cased; paths with ``~`` expanded; ``""`` as ``None``
        where ``None`` is allowed.

        Args:
            value: The value to check.
            origin: Where it came from, for the message: ``"argument"`` (constructor argument or step-config
                key), ``"environment"`` (the variable's text) or ``"default"``.
            provider: The provider type, carried by the error.

        Raises:
            ConfigurationError: The value breaks the rule; the sentence names the argument or the variable,
                the rule, and what to do.
        """
        if self.none_means is not None and (value is None or (isinstance(value, str) and not value.strip())):
            return None
        if self.kind == "url":
            source = f"environment variable {self.env_var}" if origin == "environment" else f"argument {self.key}"
            return validate_base_url(value, source=source)
        if self.kind in ("int", "float"):
            return self._number(value, origin, provider)
        if self.kind in ("path", "directory"):
            return self._path(value, origin, provider)
        if not isinstance(value, str):
            raise self._invalid(value, origin, provider)
        if not self.choices and self.pattern is None:
            return value
        text = value.strip().lower()
        allowed = text in self.choices if self.choices else re.fullmatch(self.pattern or "", text) is not None
        if not allowed:
            raise self._invalid(value, origin, provider)
        return text

    def _number(self, value: Any, origin: str, provider: str | None) -> int | float:
        number: Any = value
        if isinstance(value, str):
            try:
                number = int(value.strip()) if self.kind == "int" else float(value.strip())
            except ValueError:
                raise self._invalid(value, origin, provider) from None
        wanted = (int,) if self.kind == "int" else (int, float)
        if isinstance(number, bool) or not isinstance(number, wanted):
            raise self._invalid(value, origin, provider)
        if self.kind == "float" and not math.isfinite(number):
            raise self._invalid(value, origin, provider)
        too_low = self.minimum is not None and (
            number <= self.minimum if self.exclusive_minimum else number < self.minimum
        )
        if too_low or (self.maximum is not None and number > self.maximum):
            raise self._invalid(value, origin, provider)
        return float(number) if self.kind == "float" else int(number)

    def _path(self, value: Any, origin: str, provider: str | None) -> str:
        text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
        if not isinstance(text, str):
            raise self._invalid(value, origin, provider)
        if not text:  # allowed only where the default is "" ("not set"); an optional path became None above
            if self.default != "":
                raise self._invalid(value, origin, provider)
            return text
        problem = path_text_problem(text)
        if problem is not None:
            raise self._invalid(value, origin, provider, reason=f"the path {problem}")
        expanded = expand_path(text)
        if self.kind == "directory":
            problem = directory_problem(expanded)
            if problem is not None:
                raise self._invalid(value, origin, provider, reason=f"directory {expanded} {problem}", path=expanded)
        return str(expanded)

    def _invalid(
        self,
        value: Any,
        origin: str,
        provider: str | None,
        *,
        reason: str | None = None,
        path: Path | None = None,
    ) -> ConfigurationError:
        why = reason or f"{self.key} must be {self.rule}"
        if not isinstance(value, (str, int, float, os.PathLike)):  # a list, a dict... from a step config
            why = f"settings take plain values (strings, numbers), not a {type(value).__name__}: {why}"
        default = repr(self.default) if self.default not in (None, "") else self.none_means or "none"
        owner = f"{provider} " if provider else ""
        if origin == "environment":
            message = (
                f"environment variable {self.env_var}={value!r} is not valid for the {owner}setting {self.key}: "
                f"{why}; set it to a valid value, or unset it to use the default ({default})"
            )
        else:
            message = (
                f"{owner}setting {self.key}={value!r} (argument or step-config key) is not valid: {why}; pass a "
                f"valid value, or leave it out to use {self.env_var} or the default ({default})"
            )
        return ConfigurationError(message, provider=provider, path=None if path is None else str(path))


SETTINGS: dict[str, tuple[Setting, ...]] = {
    "vllm": (
        Setting("base_url", "VLLM_BASE_URL", "http://localhost:8100/v1", "url",
                "OpenAI-compatible base URL of the vLLM server"),
        Setting("api_key", "VLLM_API_KEY", None, "str",
                "API key sent as a bearer token (vLLM --api-key); never logged", none_means="no key"),
        Setting("timeout", "VLLM_TIMEOUT", 120.0, "float", "Seconds to wait for one answer",
                minimum=0, exclusive_minimum=True),
        Setting("max_retries", "VLLM_MAX_RETRIES", 2, "int",
                "Retries of transient failures (connect errors, 429, 502, 503, 504)", minimum=0, maximum=100),
        Setting("max_lora_rank", "VLLM_MAX_LORA_RANK", 16, "int",
                "Largest adapter rank accepted before sending (match the server's --max-lora-rank)", minimum=1),
    ),
    "ollama": (
        Setting("base_url", "OLLAMA_BASE_URL", "http://localhost:11434/v1", "url",
                "Ollama base URL; the native API is used at the same host without /v1"),
        Setting("timeout", "OLLAMA_TIMEOUT", 120.0, "float", "Seconds to wait for one answer",
                minimum=0, exclusive_minimum=True),
        Setting("max_retries", "OLLAMA_MAX_RETRIES", 2, "int",
                "Retries of transient failures (connect errors, 429, 502, 503, 504)", minimum=0, maximum=100),
        Setting("base_model", "OLLAMA_BASE_MODEL", None, "str",
                "Ollama model that adapters are applied to (load_adapter creates a model derived from it)",
                none_means="no base model (give load_adapter a base_model)"),
    ),
    "llamacpp": (
        Setting("model_path", "LLAMACPP_MODEL_PATH", None, "path", "Path of the GGUF base model",
                none_means="no model"),
        Setting("n_ctx", "LLAMACPP_N_CTX", 4096, "int", "Context size in tokens", minimum=1),
        Setting("n_gpu_layers", "LLAMACPP_N_GPU_LAYERS", -1, "int",
                "Layers offloaded to the GPU (-1 = all; ignored on CPU-only builds)", minimum=-1),
        Setting("adapter_cache_dir", "LLAMACPP_ADAPTER_CACHE_DIR", None, "directory",
                "Where PEFT adapters converted to GGUF are cached",
                none_means="~/.cache/inference-adapters"),
        Setting("max_adapters", "LLAMACPP_MAX_ADAPTERS", None, "int",
                "Most adapters kept loaded; least recently used ones are evicted and reloaded on use",
                minimum=1, none_means="no limit"),
    ),
    "transformers": (
        Setting("model_name", "TRANSFORMERS_MODEL_NAME", "", "path",
                "Local model directory (or a .gguf file) to load with transformers"),
        Setting("device", "TRANSFORMERS_DEVICE", "cpu", "str", "Torch device: cpu, cuda, cuda:1, ...",
                pattern=r"cpu|mps|cuda(:\d+)?", hint="'cpu', 'cuda', 'cuda:N' or 'mps'"),
        Setting("torch_dtype", "TRANSFORMERS_TORCH_DTYPE", "auto", "str",
                "Weights dtype: auto, float32, float16, bfloat16",
                choices=("auto", "float32", "float16", "bfloat16")),
        Setting("max_batch_size", "TRANSFORMERS_MAX_BATCH_SIZE", 32, "int",
                "Most concurrent requests run together in one batch", minimum=1),
        Setting("batch_window_ms", "TRANSFORMERS_BATCH_WINDOW_MS", 5.0, "float",
                "Milliseconds to wait for more requests before a batch starts", minimum=0, maximum=60_000),
        Setting("max_adapters", "TRANSFORMERS_MAX_ADAPTERS", None, "int",
                "Most adapters kept loaded; least recently used ones are evicted and reloaded on use",
                minimum=1, none_means="no limit"),
    ),
    "fake": (),
}
"""Settings per provider type, in constructor-argument order."""


def validate_setting(provider_type: str, key: str, value: Any, *, origin: str = "argument") -> Any:
    """Check one value of one provider setting against its rule in :data:`SETTINGS`; return it canonical.

    Constructors call :func:`resolve_settings`, which does this for every setting; this function is for
    code that holds a single value (a CLI option, a setting changed later).

    Example:
        >>> validate_setting("vllm", "timeout", "30")
        30.0

    Raises:
        ConfigurationError: The value breaks the rule, or ``key`` is not a setting of ``provider_type``.
    """
    for setting in SETTINGS.get(provider_type, ()):
        if setting.key == key:
            return setting.check(value, origin=origin, provider=provider_type)
    raise ConfigurationError(
        f"{key!r} is not a setting of the {provider_type} provider: use one of "
        f"{', '.join(setting.key for setting in SETTINGS.get(provider_type, ())) or 'none'}",
        provider=provider_type,
    )


def resolve_provider_type(provider_type: str | None, environ: Mapping[str, str] | None = None) -> str:
    """Return the provider type from the argument, else ``INFERENCE_PROVIDER``, else ``"vllm"``.

    Raises:
        UnknownProviderError: The type is not a registered provider.
    """

    environ = os.environ if environ is None else environ
    chosen = provider_type if provider_type is not None else environ.get(PROVIDER_ENV_VAR) or DEFAULT_PROVIDER
    normalised = chosen.strip().lower() if isinstance(chosen, str) else None
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

    Every value is checked against its setting's rule (:meth:`Setting.check`), whichever source gave it.

    Raises:
        ConfigurationError: A value breaks its setting's rule (wrong type, out of range, not finite, a
            malformed base URL, a directory that cannot be written); the sentence names the argument or
            the environment variable.
    """
    environ = os.environ if environ is None else environ
    resolved: dict[str, Any] = {}
    for setting in SETTINGS[provider_type]:
        if overrides.get(setting.key) is not None:
            value = setting.check(overrides[setting.key], origin="argument", provider=provider_type)
        elif environ.get(setting.env_var, "") != "":
            value = setting.check(environ[setting.env_var], origin="environment", provider=provider_type)
        else:
            value = setting.check(setting.default, origin="default", provider=provider_type)
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
            lines += [f"# {setting.description} ({setting.rule})", f"# {setting.env_var}={default}"]
    return "\n".join(lines) + "\n"


def render_configuration_table() -> str:
    """Return the Markdown table of every setting, for ``docs/configuration.md``."""
    rows = [
        "| provider | key (argument / step config) | variable | default | meaning | allowed values |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| all | `provider` | `{PROVIDER_ENV_VAR}` | `{DEFAULT_PROVIDER}` | provider type | "
        f"{', '.join(sorted(PROVIDER_REGISTRY))} |",
    ]
    for provider_type, settings in SETTINGS.items():
        for setting in settings:
            default = "" if setting.default in (None, "") else f"`{setting.default}`"
            rows.append(
                f"| {provider_type} | `{setting.key}` | `{setting.env_var}` | {default} | {setting.description} "
                f"| {setting.rule} |"
            )
    return "\n".join(rows) + "\n"
