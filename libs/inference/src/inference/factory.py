"""Cached provider instances, chosen by argument, environment variable or per-step config.

The same resolved settings give the identical provider object; different settings give a different one.
Construction is cheap (in-process models load lazily on first use), and a lock makes concurrent first
calls build a single instance.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, cast

from inference.config import SETTINGS, resolve_provider_type, resolve_settings
from inference.exceptions import ConfigurationError
from inference.provider import InferenceProvider
from inference.registry import PROVIDERS, load_provider_class

__all__ = ["aclose_all_providers", "clear_provider_cache", "get_provider", "get_provider_for_step"]

_CacheKey = tuple[str, tuple[tuple[str, Any], ...]]
_cache: dict[_CacheKey, InferenceProvider] = {}
_cache_lock = threading.Lock()
_PLAIN = (str, int, float, bool, type(None))


def get_provider(provider_type: str | None = None, base_url: str | None = None) -> InferenceProvider:
    """Return the cached provider for these settings, creating it on first use.

    Args:
        provider_type: A type of :data:`inference.registry.PROVIDERS` (``vllm``, ``openai``, ``ollama``,
            ``llamacpp``, ``transformers``, ``fake``); else the ``INFERENCE_PROVIDER`` environment variable;
            else ``vllm``.
        base_url: Server URL for the server providers; else their variable (``VLLM_BASE_URL``,
            ``OPENAI_BASE_URL``, ``OLLAMA_BASE_URL``); else their default. In-process providers read their
            settings from their environment variables (see ``.env.example``).

    Returns:
        The same object for the same resolved settings.

    Raises:
        UnknownProviderError: The type is unknown (a ``ValueError`` listing the valid names).
        ConfigurationError: A setting is malformed, or ``base_url`` was given to an in-process provider (the
            ``fake`` stand-in ignores it, so that it replaces any provider with only the type changed).
        MissingDependencyError: The provider's extra is not installed.
    """
    return _get_or_create(resolve_provider_type(provider_type), {"base_url": base_url})


def get_provider_for_step(step_config: Mapping[str, Any]) -> InferenceProvider:
    """Return the cached provider a step config asks for; shares the cache with :func:`get_provider`.

    Args:
        step_config: ``{"provider": ..., "base_url": ..., <provider settings>}``. The provider settings are
            the keys of ``inference.config.SETTINGS[provider]`` (``model_path``, ``n_ctx``, ``device``...).
            Other keys are left to the step (``model``, ``prompt``, ``adapter_id``, the generation options...),
            except one that looks like a setting this provider lacks: a setting of another provider
            (``kv_cache_type`` for ``transformers``) or a misspelt one (``n_ctxx``) is refused, so that the
            provider is never built with other settings than the step says.

    Example:
        >>> get_provider_for_step({"provider": "fake"}) is get_provider("fake")
        True

    Raises:
        UnknownProviderError: ``provider`` is not a provider type.
        ConfigurationError: A setting breaks its rule, or a key is another provider's setting or a misspelt
            setting (the message names the key, the provider's settings and the closest one).
        MissingDependencyError: The provider's extra is not installed.
    """
    if not isinstance(step_config, Mapping):
        raise ConfigurationError(f"step_config must be a mapping, got {type(step_config).__name__}")
    return _get_or_create(resolve_provider_type(step_config.get("provider")), step_config)


def clear_provider_cache() -> None:
    """Forget every cached provider without closing it (see :func:`aclose_all_providers`)."""
    with _cache_lock:
        _cache.clear()


async def aclose_all_providers() -> None:
    """Close every cached provider (connections, model weights) and empty the cache."""
    with _cache_lock:
        providers = list(_cache.values())
        _cache.clear()
    for provider in providers:
        await provider.aclose()


def _get_or_create(provider_type: str, overrides: Mapping[str, Any]) -> InferenceProvider:
    key, settings = _resolved(provider_type, overrides)
    with _cache_lock:
        provider = _cache.get(key)
        if provider is None or provider.closed:  # closed by `async with` or aclose(): make a new one
            provider = _construct(provider_type, settings)
            _cache[key] = provider
        return provider


def _resolved(provider_type: str, overrides: Mapping[str, Any]) -> tuple[_CacheKey, dict[str, Any]]:
    """The checked settings of a provider and the cache key they make."""
    keys = {setting.key for setting in SETTINGS[provider_type]}
    stand_in = PROVIDERS[provider_type].stand_in  # fake: ignores base_url as it ignores other providers' settings
    if overrides.get("base_url") is not None and "base_url" not in keys and not stand_in:
        raise ConfigurationError(
            f"the {provider_type} provider runs in process and takes no base_url; "
            "give its settings instead (see .env.example)",
            provider=provider_type,
        )
    settings = resolve_settings(provider_type, overrides)
    key: _CacheKey = (provider_type, tuple(settings.items()))
    try:
        hash(key)
    except TypeError:
        unhashable = sorted(name for name, value in settings.items() if not isinstance(value, _PLAIN))
        raise ConfigurationError(  # names the settings, never their values (one may be an API key)
            f"the {provider_type} settings must be plain values (strings, numbers): {', '.join(unhashable)} is not",
            provider=provider_type,
        ) from None
    return key, settings


def _construct(provider_type: str, settings: Mapping[str, Any]) -> InferenceProvider:
    cls = cast("type[InferenceProvider]", load_provider_class(provider_type))
    return cls(**settings)


class ProviderRecipe:
    """How to make a provider outside the cache: its cache key (equal settings, equal key) and a builder.

    Used by :mod:`inference.sync`, whose providers live on their own event loop and so cannot be the
    instances cached here for async code.
    """

    def __init__(self, provider_type: str, overrides: Mapping[str, Any]) -> None:
        self.provider_type = provider_type
        self.key, self._settings = _resolved(provider_type, overrides)

    def build(self) -> InferenceProvider:
        """A new provider with these settings."""
        return _construct(self.provider_type, self._settings)


def provider_recipe(provider_type: str | None = None, base_url: str | None = None) -> ProviderRecipe:
    """The recipe of the provider :func:`get_provider` would give for these arguments (same checks, same errors)."""
    return ProviderRecipe(resolve_provider_type(provider_type), {"base_url": base_url})


def provider_recipe_for_step(step_config: Mapping[str, Any]) -> ProviderRecipe:
    """The recipe of the provider :func:`get_provider_for_step` would give for ``step_config``."""
    if not isinstance(step_config, Mapping):
        raise ConfigurationError(f"step_config must be a mapping, got {type(step_config).__name__}")
    return ProviderRecipe(resolve_provider_type(step_config.get("provider")), step_config)
