"""Every setting the SDK reads, with its environment variable, default and meaning.

One precedence order everywhere: an explicit argument or step-config key, then the process environment, then the
``.env`` file (``./.env``, or the file ``INFERENCE_ENV_FILE`` names: :mod:`inference._core.env_file`), then the
default. :data:`SETTINGS` is read from the providers' entries in :data:`inference.registry.PROVIDERS`
(each lists its :class:`Setting` rows): the factory resolves settings from it, and ``.env.example`` and the
configuration docs list exactly these variables.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from inference._core.env_file import ENV_FILE_VAR, SettingsEnvironment, is_set, settings_environment
from inference._core.settings import Setting, SettingKind, validate_base_url
from inference.adapters.gguf_cache import ADAPTER_CACHE_MAX_BYTES
from inference.exceptions import ConfigurationError, UnknownProviderError
from inference.options import OPTIONS
from inference.registry import PROVIDER_REGISTRY, PROVIDERS

__all__ = [
    "DEFAULT_PROVIDER",
    "PROVIDER_ENV_VAR",
    "SDK_SETTINGS",
    "SETTINGS",
    "STEP_KEYS",
    "Setting",
    "SettingKind",
    "resolve_provider_type",
    "resolve_sdk_setting",
    "resolve_settings",
    "validate_base_url",
    "validate_setting",
]

PROVIDER_ENV_VAR = "INFERENCE_PROVIDER"
DEFAULT_PROVIDER = "vllm"

logger = logging.getLogger("inference")


SETTINGS: dict[str, tuple[Setting, ...]] = {name: spec.settings for name, spec in PROVIDERS.items()}
"""Settings per provider type, in constructor-argument order (from :data:`inference.registry.PROVIDERS`)."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

SDK_SETTINGS: tuple[Setting, ...] = (
    Setting("env_file", ENV_FILE_VAR, "", "path",
            "The .env file settings are read from instead of ./.env (read from the process environment only; "
            "/dev/null: none)"),
    Setting("log_level", "INFERENCE_LOG_LEVEL", "warning", "str",
            "Least severe log record shown by the command line and inference.configure_logging()", choices=LOG_LEVELS),
    Setting("log_format", "INFERENCE_LOG_FORMAT", "text", "str",
            "Log lines: text (time, level, logger, message) or json (one object per line, with the records' fields)",
            choices=("text", "json")),
    ADAPTER_CACHE_MAX_BYTES,
)
"""Settings of the SDK itself, for every provider (``provider``'s ``INFERENCE_PROVIDER`` aside)."""


def resolve_sdk_setting(key: str, value: Any = None, environ: SettingsEnvironment | None = None) -> Any:
    """One of :data:`SDK_SETTINGS`: ``value`` when given, else its variable (in ``environ``; by default the process
    environment, then ``.env``), else its default; checked by its rule.

    Raises:
        ConfigurationError: The value breaks the rule (the sentence names the argument or the variable), or the
            ``.env`` file cannot be read.
    """
    setting = next(setting for setting in SDK_SETTINGS if setting.key == key)
    if value is not None:
        return setting.check(value)
    environ = _environment() if environ is None else environ
    if is_set(environ.get(setting.env_var)):
        return setting.check(environ[setting.env_var], origin=environ.origin(setting.env_var))
    return setting.check(setting.default, origin="default")

STEP_KEYS: frozenset[str] = frozenset(
    {"provider", "base_url", "model", "name", "prompt", "messages", "adapter", "adapter_id", "adapter_path", "tool",
     "input", *OPTIONS}
)
"""Keys a step config may carry for the step itself besides its provider's settings: never refused, never read
as settings (the generation options, ``model``, ``prompt``, ``adapter_id``...)."""

_CLOSE_MATCH = 0.8
"""How alike (difflib's ratio) a key must be to a setting to be taken for a misspelling of it (``n_ctxx``)."""


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
    """Return the provider type from the argument, else ``INFERENCE_PROVIDER`` (process environment, then the
    ``.env`` file), else ``"vllm"``.

    Raises:
        UnknownProviderError: The type is not a registered provider.
        ConfigurationError: The ``.env`` file cannot be read (see :func:`settings_environment`).
    """
    if provider_type is None:
        environ = _environment() if environ is None else environ
        named = environ.get(PROVIDER_ENV_VAR)
        chosen = named if is_set(named) else DEFAULT_PROVIDER
    else:
        chosen = provider_type
    normalised = chosen.strip().lower() if isinstance(chosen, str) else None
    if normalised not in PROVIDER_REGISTRY:
        source = "provider type" if provider_type is not None else f"{PROVIDER_ENV_VAR} value"
        if provider_type is None and isinstance(environ, SettingsEnvironment):
            origin = environ.origin(PROVIDER_ENV_VAR)
            if origin != "environment":
                source = f"{PROVIDER_ENV_VAR} value in the .env file {origin.partition(':')[2]}"
        raise UnknownProviderError(
            f"unknown {source} {chosen!r}: valid names are {', '.join(sorted(PROVIDER_REGISTRY))}"
        )
    return str(normalised)


def resolve_settings(
    provider_type: str,
    overrides: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Resolve a provider's constructor arguments: override, else environment variable, else ``.env``, else default.

    Args:
        provider_type: A registered provider type.
        overrides: Explicit values (arguments or step-config keys); ``None`` values count as absent.
            Other keys are left to the step (``model``, ``prompt``...; see :func:`check_step_keys`), except a
            key that looks like a setting the provider does not have, which is refused.
        environ: The environment to read (when omitted: ``os.environ`` over the ``.env`` file's variables,
            :func:`settings_environment`).

    Every value is checked against its setting's rule (:meth:`Setting.check`), whichever source gave it.

    Raises:
        ConfigurationError: A value breaks its setting's rule (wrong type, out of range, not finite, a
            malformed base URL, a directory that cannot be written); the sentence names the argument or
            the environment variable (or the ``.env`` file and its variable). Or a key is a setting of another
            provider, or a misspelt setting (:func:`check_step_keys`). Or the ``.env`` file cannot be read.
    """
    check_step_keys(provider_type, overrides)
    settings = SETTINGS[provider_type]
    if environ is None and any(overrides.get(setting.key) is None for setting in settings):
        environ = _environment()
    resolved: dict[str, Any] = {}
    for setting in settings:
        if overrides.get(setting.key) is not None:
            value = setting.check(overrides[setting.key], origin="argument", provider=provider_type)
        elif environ is not None and is_set(environ.get(setting.env_var)):
            origin = environ.origin(setting.env_var) if isinstance(environ, SettingsEnvironment) else "environment"
            value = setting.check(environ[setting.env_var], origin=origin, provider=provider_type)
        else:
            value = setting.check(setting.default, origin="default", provider=provider_type)
        resolved[setting.key] = value
    return resolved


def check_step_keys(provider_type: str, step_config: Mapping[str, Any]) -> None:
    """Refuse a step-config key that would be dropped although the user meant it as a provider setting.

    A step config holds the provider's settings beside the step's own keys (:data:`STEP_KEYS`, or any other
    name), so an unknown key cannot simply be refused. What is refused is a key, with a value other than
    ``None``, that is

    * a setting of another provider but not of this one (``kv_cache_type`` for ``transformers``; except for a
      stand-in such as ``fake``, which replaces any provider in tests with only ``provider`` changed), or
    * so close to one of this provider's settings that it must be a misspelling (``n_ctxx``).

    Either would leave the provider built with other settings than the user wrote.

    Raises:
        ConfigurationError: Naming the key, the provider's settings and the setting it probably meant.
    """
    own = [setting.key for setting in SETTINGS[provider_type]]
    stand_in = PROVIDERS[provider_type].stand_in
    for key, value in step_config.items():
        if value is None or not isinstance(key, str) or key in own or key in STEP_KEYS:
            continue
        owners = [] if stand_in else [name for name, settings in SETTINGS.items() if key in _keys(settings)]
        close = _closest(key, own)
        if not owners and close is None:
            continue
        valid = f"the {provider_type} provider's settings are {', '.join(own) or 'none'}"
        if owners:
            plural = "s" if len(owners) > 1 else ""
            reason = (
                f"{key!r} is a setting of the {', '.join(owners)} provider{plural}, not of {provider_type}, so it "
                f"would be ignored: remove it, or use provider {owners[0]!r}"
            )
        else:
            reason = f"{key!r} is not a setting of the {provider_type} provider; did you mean {close!r}?"
        raise ConfigurationError(f"step config: {reason} ({valid})", provider=provider_type)


def _closest(word: str, known: Iterable[str]) -> str | None:
    """The name in ``known`` that ``word`` must be a misspelling of (difflib's ratio of at least ``_CLOSE_MATCH``)."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=_CLOSE_MATCH)
    return close[0] if close else None


def _variable_groups() -> list[tuple[str, list[str]]]:
    """Each prefix of the SDK's variables (``INFERENCE_``, ``VLLM_``, ``VLLM_OFFLINE_``...) with the variables under
    it, longest prefix first."""
    groups = [("INFERENCE_", [PROVIDER_ENV_VAR, *(setting.env_var for setting in SDK_SETTINGS)])]
    for provider_type, settings in SETTINGS.items():
        prefix = provider_type.upper().replace("-", "_") + "_"
        groups.append((prefix, [setting.env_var for setting in settings if setting.env_var.startswith(prefix)]))
    return sorted(groups, key=lambda group: -len(group[0]))


_OTHER_PROGRAMS = ("LLAMA_ARG_", "LLAMA_API_KEY", "LLAMA_CACHE", "LLAMA_CPP_LIB", "LLAMA_LOG_")
"""Prefixes of variables that llama.cpp's own programs read (llama-server's ``LLAMA_ARG_MODEL``, llama-cpp-python's
``LLAMA_CPP_LIB_PATH``): a ``.env`` beside such a server holds them, and whole they read like misspellings of
``LLAMACPP_...``."""

_VARIABLE_GROUPS = _variable_groups()
_VARIABLES = frozenset(name for _, names in _VARIABLE_GROUPS for name in names)
_looked_at: set[tuple[str, bool]] = set()
"""The variables (name, from the ``.env`` file) already compared with the SDK's: each is looked at once."""
_warned: set[str] = set()
"""The misspelt variables already warned about: one warning per name and process."""


def _meant_variable(name: str, *, in_env_file: bool) -> str | None:
    """The SDK's variable that ``name`` is a misspelling of, if it is one.

    A name under a prefix of the SDK (``INFERENCE_``, ``LLAMACPP_``...) is compared by the part after the prefix,
    the setting's key, with that prefix's variables, by the rule that catches a misspelt step-config key: so
    ``FAKE_MAX_ADAPTER`` is caught, and the backends' own variables under the same prefix (vLLM's
    ``VLLM_RPC_TIMEOUT``, Ollama's ``OLLAMA_MODELS``) are not taken for the SDK's. A line of the ``.env`` file,
    which configures this SDK alone, is also compared whole, for a misspelt prefix (``LLAMCPP_MODEL_PATH``), but
    for the variables of llama.cpp's own programs (:data:`_OTHER_PROGRAMS`).
    """
    upper = name.upper()
    if upper in _VARIABLES:
        return None if upper == name else upper  # the case differs: variable names are case-sensitive
    groups = [(prefix, names) for prefix, names in _VARIABLE_GROUPS if upper.startswith(prefix)]
    for prefix, names in groups:
        key = _closest(upper[len(prefix):], [variable[len(prefix):] for variable in names])
        if key is not None:
            return prefix + key
    if not in_env_file or groups or upper.startswith(_OTHER_PROGRAMS):
        return None
    return _closest(upper, sorted(_VARIABLES))


def _environment() -> SettingsEnvironment:
    """:func:`settings_environment`, after a warning (once per name and process) for each variable in it that is a
    misspelling of one the SDK reads: it would otherwise be dropped silently."""
    environ = settings_environment()
    try:
        names = list(environ)
    except RuntimeError:  # the process environment changed meanwhile in another thread: look next time
        return environ
    for name in names:
        in_env_file = environ.origin(name) != "environment"
        if (name, in_env_file) in _looked_at:
            continue
        _looked_at.add((name, in_env_file))
        meant = _meant_variable(name, in_env_file=in_env_file)
        if meant is None or name in _warned:
            continue
        _warned.add(name)
        where = f"{name} in the .env file {environ.path}" if in_env_file else f"environment variable {name}"
        logger.warning(
            "%s is not a variable the inference SDK reads, so it changes nothing: did you mean %s?", where, meant,
            extra={"variable": name, "meant": meant},
        )
    return environ


def render_env_example() -> str:
    """Return the text of ``.env.example``: every variable the SDK reads, with its default and meaning.

    ``python scripts/write_env_example.py`` rewrites the file; a test keeps the two equal.
    """
    lines = [
        "# Every environment variable the inference SDK reads, with its default.",
        "# Generated from the settings in inference/registry.py by: python scripts/write_env_example.py",
        "",
        f"# Provider type used when get_provider() gets none: {', '.join(sorted(PROVIDER_REGISTRY))}",
        f"# {PROVIDER_ENV_VAR}={DEFAULT_PROVIDER}",
    ]
    for setting in SDK_SETTINGS:
        lines += [f"# {setting.description} ({setting.rule})", f"# {setting.env_var}={_shown(setting.default)}"]
    for provider_type, settings in SETTINGS.items():
        if not settings:
            continue
        lines += ["", f"# --- {provider_type} ---"]
        for setting in settings:
            lines += [f"# {setting.description} ({setting.rule})", f"# {setting.env_var}={_shown(setting.default)}"]
    return "\n".join(lines) + "\n"


def render_configuration_table() -> str:
    """Return the Markdown table of every setting, for ``docs/configuration.md``."""
    rows = [
        "| provider | key (argument / step config) | variable | default | meaning | allowed values |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| all | `provider` | `{PROVIDER_ENV_VAR}` | `{DEFAULT_PROVIDER}` | provider type | "
        f"{', '.join(sorted(PROVIDER_REGISTRY))} |",
    ]
    for setting in SDK_SETTINGS:
        default = "" if setting.default in (None, "") else f"`{_shown(setting.default)}`"
        rows.append(f"| all | | `{setting.env_var}` | {default} | {setting.description} | {setting.rule} |")
    for provider_type, settings in SETTINGS.items():
        for setting in settings:
            default = "" if setting.default in (None, "") else f"`{_shown(setting.default)}`"
            rows.append(
                f"| {provider_type} | `{setting.key}` | `{setting.env_var}` | {default} | {setting.description} "
                f"| {setting.rule} |"
            )
    return "\n".join(rows) + "\n"


def _keys(settings: tuple[Setting, ...]) -> set[str]:
    return {setting.key for setting in settings}


def _shown(default: Any) -> str:
    """A default as the environment variable would spell it (``false``, not ``False``; ``None``: empty)."""
    if isinstance(default, bool):
        return str(default).lower()
    return "" if default is None else str(default)
