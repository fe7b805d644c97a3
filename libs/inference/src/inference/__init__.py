"""Async, provider-agnostic inference with a LoRA adapter lifecycle.

``import inference`` is light (about 15 ms): it imports the error tree, and everything else on first use, so
asyncio, httpx, torch, transformers, llama_cpp and vllm load only when what needs them is used.

Example:
    >>> import asyncio, inference
    >>> async def main():
    ...     provider = inference.get_provider("fake")
    ...     return (await provider.generate("Hello", model="demo", max_tokens=2)).text
    >>> asyncio.run(main())
    '[base] yankee romeo'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterConversionError,
    AdapterError,
    AdapterNotFoundError,
    ConfigurationError,
    InferenceError,
    InvalidAdapterError,
    InvalidRequestError,
    MissingDependencyError,
    ModelError,
    ModelLoadError,
    ModelNotFoundError,
    ProtocolError,
    ProviderError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    TokenLimitError,
    UnknownProviderError,
    UnsupportedOperationError,
)

if TYPE_CHECKING:
    # For type checkers and editors only; at run time these come from __getattr__ below, which type checkers do not
    # see: a name of __all__ missing here would be an error to them (the provider classes: keep in step with
    # inference.registry.PROVIDERS; tests/unit/test_registry.py checks both).
    from inference._server_errors import RuntimeLoRADisabledError, ServerResponseError
    from inference.adapters.weights import AdapterWeights
    from inference.factory import aclose_all_providers, clear_provider_cache, get_provider, get_provider_for_step
    from inference.fake_provider import FakeProvider
    from inference.fallback import FallbackProvider
    from inference.health import BackendHealth, ProviderHealth
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.llamacpp_server_provider import LlamaCppServerProvider
    from inference.logs import configure_logging
    from inference.messages import Message
    from inference.ollama_provider import OllamaProvider
    from inference.openai_provider import OpenAIProvider
    from inference.options import GenerationOptions
    from inference.provider import InferenceProvider
    from inference.registry import PROVIDERS
    from inference.results import GenerationResult, ScoreResult, TokenLogprob, ToolCall
    from inference.sync import SyncProvider, get_sync_provider, get_sync_provider_for_step
    from inference.tokens import TokenCacheStats, TokenIds, TokenVocabulary
    from inference.transformers_provider import TransformersProvider
    from inference.vllm_offline_provider import VLLMOfflineProvider
    from inference.vllm_provider import VLLMProvider

__version__ = "0.1.0"

_LAZY = {
    **dict.fromkeys(
        ("aclose_all_providers", "clear_provider_cache", "get_provider", "get_provider_for_step"), "inference.factory"
    ),
    "AdapterWeights": "inference.adapters.weights",
    "Message": "inference.messages",
    "GenerationOptions": "inference.options",
    "InferenceProvider": "inference.provider",
    "PROVIDERS": "inference.registry",
    **dict.fromkeys(("GenerationResult", "ScoreResult", "TokenLogprob", "ToolCall"), "inference.results"),
    "FallbackProvider": "inference.fallback",
    "configure_logging": "inference.logs",
    **dict.fromkeys(("BackendHealth", "ProviderHealth"), "inference.health"),
    **dict.fromkeys(("SyncProvider", "get_sync_provider", "get_sync_provider_for_step"), "inference.sync"),
    **dict.fromkeys(("TokenCacheStats", "TokenIds", "TokenVocabulary"), "inference.tokens"),
    # The errors built from HTTP answers import httpx (see inference._server_errors).
    **dict.fromkeys(("RuntimeLoRADisabledError", "ServerResponseError"), "inference.exceptions"),
}
"""Name -> its module, imported on first access: ``import inference`` imports only the error tree (no asyncio,
no httpx), so a command line or a worker that only configures pays nothing for what it does not use."""

__all__ = [
    "PROVIDERS",
    "AdapterAlreadyLoadedError",
    "AdapterConversionError",
    "AdapterError",
    "AdapterNotFoundError",
    "AdapterWeights",
    "BackendHealth",
    "ConfigurationError",
    "FakeProvider",
    "FallbackProvider",
    "GenerationOptions",
    "GenerationResult",
    "InferenceError",
    "InferenceProvider",
    "InvalidAdapterError",
    "InvalidRequestError",
    "LlamaCppProvider",
    "LlamaCppServerProvider",
    "Message",
    "MissingDependencyError",
    "ModelError",
    "ModelLoadError",
    "ModelNotFoundError",
    "OllamaProvider",
    "OpenAIProvider",
    "ProtocolError",
    "ProviderError",
    "ProviderHealth",
    "ProviderTimeoutError",
    "ProviderUnavailableError",
    "RuntimeLoRADisabledError",
    "ScoreResult",
    "ServerResponseError",
    "SyncProvider",
    "TokenCacheStats",
    "TokenIds",
    "TokenLimitError",
    "TokenLogprob",
    "TokenVocabulary",
    "ToolCall",
    "TransformersProvider",
    "UnknownProviderError",
    "UnsupportedOperationError",
    "VLLMOfflineProvider",
    "VLLMProvider",
    "__version__",
    "aclose_all_providers",
    "clear_provider_cache",
    "configure_logging",
    "get_provider",
    "get_provider_for_step",
    "get_sync_provider",
    "get_sync_provider_for_step",
]
"""Every public name, as type checkers and the documentation read it. At run time ``__all__`` is the names this install
can import: see ``__getattr__``."""

if not TYPE_CHECKING:  # hidden from type checkers, for which a name not declared above is an error, not Any
    _PUBLIC = tuple(__all__)
    del __all__  # made by __getattr__ when first asked for (``from inference import *`` asks)

    def __getattr__(name: str) -> Any:
        """The names of ``__all__`` not imported above, imported on first access; then ``__all__`` itself.

        A provider class is imported as :func:`get_provider` imports it: without its extra, ``from inference
        import OpenAIProvider`` raises the :class:`MissingDependencyError` that names the ``pip install`` to run.
        ``__all__`` (what ``from inference import *`` imports) leaves such a class out, so that a star import works
        in any install and binds every name that an explicit import would.
        """
        if name == "__all__":
            value: Any = [public for public in _PUBLIC if _importable(public)]
        elif name in _LAZY:
            value = getattr(importlib.import_module(_LAZY[name]), name)
        else:
            from inference.registry import PROVIDERS, load_provider_class  # provider classes, by their paths

            provider = next((spec.name for spec in PROVIDERS.values() if spec.class_name == name), None)
            if provider is None:
                raise AttributeError(f"module 'inference' has no attribute {name!r}")
            value = load_provider_class(provider)
        globals()[name] = value  # the next access is a plain attribute
        return value

    def _importable(name: str) -> bool:
        """Whether ``from inference import <name>`` works here (not for a provider class without its extra)."""
        try:
            if name not in globals():
                __getattr__(name)
        except MissingDependencyError:
            return False
        return True
