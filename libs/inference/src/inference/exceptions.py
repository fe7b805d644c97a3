"""The SDK's one error tree.

Every error the SDK raises on purpose derives from :class:`InferenceError`. Errors carry the provider's
name, the URL or path involved and, for server answers, the HTTP status; ``str(err)`` is a sentence that
says what to do. Errors built from an HTTP answer also derive from ``httpx.HTTPStatusError`` (when httpx is
installed), so code that catches ``httpx.HTTPStatusError`` around a request keeps working. Those classes (the
``Server*`` errors and :class:`RuntimeLoRADisabledError`) live in :mod:`inference._server_errors` and are created
on first use, so ``import inference`` does not import httpx::

    InferenceError
    ├── ConfigurationError (ValueError)          bad settings: unknown provider, URL without scheme, ...
    │   └── UnknownProviderError                 provider type not in the registry
    ├── MissingDependencyError (ImportError)     an optional extra is not installed; names the pip extra
    ├── InvalidRequestError (ValueError)         bad generate() arguments: prompt, max_tokens, temperature...
    │   └── TokenLimitError                      token ids beyond the model: outside the vocabulary, over the context
    │       └── ServerTokenLimitError (+ServerResponseError)   a server refused a prompt longer than its context
    ├── UnsupportedOperationError (NotImplementedError)   the provider cannot do this at all
    ├── ModelError
    │   ├── ModelLoadError                       an in-process model could not be loaded
    │   └── ModelNotFoundError                   the server does not know the model
    │       └── ServerModelNotFoundError (+ServerResponseError)
    ├── AdapterError
    │   ├── AdapterNotFoundError (LookupError, ValueError)   unknown adapter id
    │   │   └── ServerAdapterNotFoundError (+ServerResponseError)
    │   ├── AdapterAlreadyLoadedError            the id is taken
    │   │   └── ServerAdapterAlreadyLoadedError (+ServerResponseError)
    │   └── InvalidAdapterError (ValueError)     the adapter files are missing, corrupt or unsupported
    │       ├── AdapterConversionError           PEFT -> GGUF conversion refused
    │       └── ServerInvalidAdapterError (+ServerResponseError)
    └── ProviderError                            the backend failed
        ├── ProviderUnavailableError (ConnectionError)  nothing answers at the URL
        ├── ProviderTimeoutError (TimeoutError)  no answer within the timeout (the provider's, or the call's)
        ├── ProtocolError                        the answer is not what the protocol says (bad JSON, ...)
        └── ServerResponseError (httpx.HTTPStatusError)  the server answered with an error status
            └── RuntimeLoRADisabledError         vLLM runs without runtime LoRA updating
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from inference._core.redaction import redact_url

__all__ = [
    "AdapterAlreadyLoadedError",
    "AdapterConversionError",
    "AdapterError",
    "AdapterNotFoundError",
    "ConfigurationError",
    "InferenceError",
    "InvalidAdapterError",
    "InvalidRequestError",
    "MissingDependencyError",
    "ModelError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ProtocolError",
    "ProviderError",
    "ProviderTimeoutError",
    "ProviderUnavailableError",
    "RuntimeLoRADisabledError",
    "ServerAdapterAlreadyLoadedError",
    "ServerAdapterNotFoundError",
    "ServerInvalidAdapterError",
    "ServerModelNotFoundError",
    "ServerResponseError",
    "ServerTokenLimitError",
    "TokenLimitError",
    "UnknownProviderError",
    "UnsupportedOperationError",
]


class InferenceError(Exception):
    """Base of every error the SDK raises on purpose.

    Args:
        message: A sentence that says what went wrong and what to do.
        provider: Name of the provider involved (``"vllm"``, ``"llamacpp"``...), if any.
        url: The server URL involved, if any (kept with its credentials hidden: user information and key
            parameters read ``***``).
        path: The file or directory involved, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str | None = None,
        url: str | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(message)
        self._describe(message, provider=provider, url=url, path=path)

    def _describe(self, message: str, *, provider: str | None, url: str | None, path: str | None) -> None:
        """Set what every error carries: the message, the provider, the URL (credentials hidden), the path."""
        self.message = message
        self.provider = provider
        self.url = redact_url(url) if url is not None else None
        self.path = path

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments are lost by Exception's default pickling; keep every attribute instead,
        # so errors returned by generate_batch can cross process boundaries (multiprocessing, caches).
        return (_restore_error, (type(self), self.message, dict(self.__dict__)))


def _restore_error(cls: type[InferenceError], message: str, state: dict[str, Any]) -> InferenceError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class ConfigurationError(InferenceError, ValueError):
    """A setting is missing or malformed (argument, step config or environment variable)."""


class UnknownProviderError(ConfigurationError):
    """The provider type is not one the SDK knows; the message lists the valid names."""


class MissingDependencyError(InferenceError, ImportError):
    """An optional dependency is missing; the message names the ``pip install`` extra that brings it."""


class InvalidRequestError(InferenceError, ValueError):
    """An argument of a request is invalid (prompt type, ``max_tokens``, ``temperature``...)."""


class TokenLimitError(InvalidRequestError):
    """Token ids the model cannot read: an id outside its vocabulary, or a sequence longer than its context (a
    prompt that does not fit an in-process model's context, too: :class:`~inference.fallback.FallbackProvider`
    moves such a prompt on to the next provider).

    Args:
        message: The sentence (it names the limit).
        limit: The limit: the vocabulary's size, or the context's length in tokens.
        value: What broke it: the id, or the sequence's length.
        kind: ``"vocabulary"`` or ``"context"``.
        provider: The provider's name.
    """

    def __init__(self, message: str, *, limit: int, value: int, kind: str, provider: str | None = None) -> None:
        super().__init__(message, provider=provider)
        self.limit = limit
        self.value = value
        self.kind = kind


class UnsupportedOperationError(InferenceError, NotImplementedError):
    """The provider cannot do this operation; the message names the provider class."""


class ModelError(InferenceError):
    """Something is wrong with the base model."""


class ModelLoadError(ModelError):
    """An in-process model could not be loaded (missing file, bad format, out of memory)."""


class ModelNotFoundError(ModelError):
    """The server does not serve the requested model."""


class AdapterError(InferenceError):
    """Something is wrong with an adapter or the adapter lifecycle."""


class AdapterNotFoundError(AdapterError, LookupError, ValueError):
    """No adapter with this id is loaded.

    Also a ``ValueError``: the SDK's first version raised ``ValueError`` for an adapter that was not loaded, and
    ``except ValueError`` written for it keeps catching this.
    """


class AdapterAlreadyLoadedError(AdapterError):
    """An adapter with this id is already loaded."""


class InvalidAdapterError(AdapterError, ValueError):
    """The adapter files are missing, corrupt, or of a kind the backend cannot use."""


class AdapterConversionError(InvalidAdapterError):
    """A PEFT adapter cannot be converted to a GGUF LoRA for this base model."""


class ProviderError(InferenceError):
    """The backend (server or in-process engine) failed to serve a request."""


class ProviderUnavailableError(ProviderError, ConnectionError):
    """Nothing answers at the provider's URL (connection refused, DNS failure, reset)."""


if sys.version_info >= (3, 11):  # asyncio.TimeoutError is TimeoutError

    class ProviderTimeoutError(ProviderError, TimeoutError):
        """The provider did not answer within its ``timeout`` setting, or the call within its ``timeout=``.

        Also ``asyncio.TimeoutError`` (on Python 3.10 too), as ``asyncio.wait_for`` raises: code that wrapped
        calls in it keeps catching a timeout.
        """

else:  # pragma: no cover - Python 3.10, where asyncio.TimeoutError is a class of its own
    import asyncio  # only here: ``import inference`` imports no asyncio on 3.11+

    class ProviderTimeoutError(ProviderError, TimeoutError, asyncio.TimeoutError):
        """The provider did not answer within its ``timeout`` setting, or the call within its ``timeout=``."""


class ProtocolError(ProviderError):
    """The server's answer does not follow the protocol (malformed JSON, missing fields)."""


# The errors built from an HTTP answer are also ``httpx.HTTPStatusError``, so importing them imports httpx: they are
# the names of ``__all__`` this module does not define, handed out by ``__getattr__`` on first access.
if TYPE_CHECKING:
    from inference._server_errors import (
        RuntimeLoRADisabledError,
        ServerAdapterAlreadyLoadedError,
        ServerAdapterNotFoundError,
        ServerInvalidAdapterError,
        ServerModelNotFoundError,
        ServerResponseError,
        ServerTokenLimitError,
    )


if not TYPE_CHECKING:  # hidden from type checkers, for which a name not declared above is an error, not Any

    def __getattr__(name: str) -> Any:
        """The HTTP answer errors, imported (with httpx) on first access."""
        if name in __all__:  # listed but not defined above: one of inference._server_errors' errors
            from inference import _server_errors

            return getattr(_server_errors, name)
        raise AttributeError(f"module 'inference.exceptions' has no attribute {name!r}")
