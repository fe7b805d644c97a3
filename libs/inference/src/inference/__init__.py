"""Async, provider-agnostic inference with a LoRA adapter lifecycle.

``import inference`` is light: provider classes are imported on first use, so torch, transformers,
llama_cpp and openai load only when their backend is used.

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
    UnknownProviderError,
    UnsupportedOperationError,
)
from inference.factory import aclose_all_providers, clear_provider_cache, get_provider, get_provider_for_step
from inference.messages import Message
from inference.options import GenerationOptions
from inference.provider import InferenceProvider
from inference.registry import PROVIDERS
from inference.results import GenerationResult, ScoreResult, TokenLogprob

if TYPE_CHECKING:
    # For type checkers and editors only; at run time these come from __getattr__ below (the provider classes:
    # keep in step with inference.registry.PROVIDERS, tests/unit/test_registry.py checks).
    from inference._server_errors import RuntimeLoRADisabledError, ServerResponseError
    from inference.fake_provider import FakeProvider
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.llamacpp_server_provider import LlamaCppServerProvider
    from inference.ollama_provider import OllamaProvider
    from inference.openai_provider import OpenAIProvider
    from inference.transformers_provider import TransformersProvider
    from inference.vllm_offline_provider import VLLMOfflineProvider
    from inference.vllm_provider import VLLMProvider

__version__ = "0.1.0"

_LAZY_CLASSES = {spec.class_name: spec.module for spec in PROVIDERS.values()}
"""Provider class name -> its module, imported on first access (from :data:`inference.registry.PROVIDERS`)."""


_LAZY_CLASSES.update(RuntimeLoRADisabledError="inference.exceptions", ServerResponseError="inference.exceptions")
"""Also the errors built from HTTP answers, which import httpx (see :mod:`inference._server_errors`)."""


def __getattr__(name: str) -> Any:
    module = _LAZY_CLASSES.get(name)
    if module is None:
        raise AttributeError(f"module 'inference' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AdapterAlreadyLoadedError",
    "AdapterConversionError",
    "AdapterError",
    "AdapterNotFoundError",
    "ConfigurationError",
    "FakeProvider",
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
    "ProviderTimeoutError",
    "ProviderUnavailableError",
    "RuntimeLoRADisabledError",
    "ScoreResult",
    "ServerResponseError",
    "TokenLogprob",
    "TransformersProvider",
    "UnknownProviderError",
    "UnsupportedOperationError",
    "VLLMOfflineProvider",
    "VLLMProvider",
    "__version__",
    "aclose_all_providers",
    "clear_provider_cache",
    "get_provider",
    "get_provider_for_step",
]
