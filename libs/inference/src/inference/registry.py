"""Where each provider class lives, as import paths: nothing here imports a backend."""

from __future__ import annotations

import importlib

from inference.exceptions import MissingDependencyError, UnknownProviderError

__all__ = ["PROVIDER_EXTRAS", "PROVIDER_REGISTRY", "load_provider_class"]

PROVIDER_REGISTRY: dict[str, str] = {
    "vllm": "inference.vllm_provider:VLLMProvider",
    "ollama": "inference.ollama_provider:OllamaProvider",
    "llamacpp": "inference.llamacpp_provider:LlamaCppProvider",
    "transformers": "inference.transformers_provider:TransformersProvider",
    "fake": "inference.fake_provider:FakeProvider",
}
"""Provider type -> ``module:ClassName``."""

PROVIDER_EXTRAS: dict[str, str | None] = {
    "vllm": "vllm",
    "ollama": "ollama",
    "llamacpp": "llamacpp",
    "transformers": "transformers",
    "fake": None,
}
"""Provider type -> the pip extra of ``inference-adapters`` that installs its dependencies."""


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
    try:
        module = importlib.import_module(module_name)
    except MissingDependencyError:
        raise
    except ImportError as error:
        raise MissingDependencyError(
            f"the {provider_type} provider cannot be imported ({error}): "
            f"run pip install 'inference-adapters[{PROVIDER_EXTRAS[provider_type]}]'",
            provider=provider_type,
        ) from error
    cls: type = getattr(module, class_name)
    return cls
