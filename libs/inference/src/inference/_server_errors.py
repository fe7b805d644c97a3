"""The errors built from an HTTP answer: :class:`ServerResponseError` and its subclasses.

They derive from ``httpx.HTTPStatusError`` too (when httpx is installed), so code that catches
``httpx.HTTPStatusError`` around a request keeps working. They live here, not in :mod:`inference.exceptions`,
so that ``import inference`` does not import httpx; :mod:`inference.exceptions` and :mod:`inference` hand them out
on first access, under their own names (``from inference.exceptions import ServerResponseError``), and their
``__module__`` is ``inference.exceptions``, where they belong in the error tree.
"""

from __future__ import annotations

from typing import Any

from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    InvalidAdapterError,
    ModelNotFoundError,
    ProviderError,
    TokenLimitError,
)

try:  # httpx comes with the HTTP extras; the tree works without it.
    from httpx import HTTPStatusError as _HTTPStatusBase
except ImportError:  # pragma: no cover - exercised only without the HTTP extras

    class _HTTPStatusBase(Exception):  # type: ignore[no-redef]
        """Stand-in for ``httpx.HTTPStatusError`` when httpx is not installed."""

        def __init__(self, message: str, *, request: Any = None, response: Any = None) -> None:
            super().__init__(message)
            self.request = request
            self.response = response


__all__ = [
    "RuntimeLoRADisabledError",
    "ServerAdapterAlreadyLoadedError",
    "ServerAdapterNotFoundError",
    "ServerInvalidAdapterError",
    "ServerModelNotFoundError",
    "ServerResponseError",
    "ServerTokenLimitError",
]


class ServerResponseError(ProviderError, _HTTPStatusBase):
    """The server answered with an error status.

    Also an ``httpx.HTTPStatusError``: ``err.response.status_code`` and ``err.request`` work as there.

    Args:
        message: A sentence that says what went wrong and what to do.
        request: The ``httpx.Request`` that was sent.
        response: The ``httpx.Response`` that came back.
        provider: Name of the provider.
        url: The server's base URL (kept with its credentials hidden).
    """

    def __init__(
        self,
        message: str,
        *,
        request: Any,
        response: Any,
        provider: str | None = None,
        url: str | None = None,
        path: str | None = None,
    ) -> None:
        # InferenceError.__init__ would hand the message on to httpx.HTTPStatusError.__init__, which needs
        # request and response too: initialise the httpx side directly and set the SDK's attributes here.
        _HTTPStatusBase.__init__(self, message, request=request, response=response)
        self._describe(message, provider=provider, url=url, path=path)

    @property
    def status_code(self) -> int | None:
        """The HTTP status of the answer."""
        return getattr(self.response, "status_code", None)


class RuntimeLoRADisabledError(ServerResponseError):
    """vLLM answered 404 on its runtime LoRA route: it runs without runtime adapter loading."""


class ServerModelNotFoundError(ServerResponseError, ModelNotFoundError):
    """The server answered that the model (or adapter used as a model) does not exist."""


class ServerAdapterNotFoundError(ServerResponseError, AdapterNotFoundError):
    """The server answered that no adapter with this name is loaded."""


class ServerAdapterAlreadyLoadedError(ServerResponseError, AdapterAlreadyLoadedError):
    """The server answered that an adapter with this name is already loaded."""


class ServerInvalidAdapterError(ServerResponseError, InvalidAdapterError):
    """The server refused the adapter (no adapter at the path, rank too large, DoRA, ...)."""


class ServerTokenLimitError(ServerResponseError, TokenLimitError):
    """The server refused a prompt too long for its context (a 400): a :class:`~inference.exceptions.TokenLimitError`
    of ``kind`` ``"context"``, which :class:`~inference.fallback.FallbackProvider` moves on to its next provider.

    Args:
        message: The sentence (it names the limit and the server's own words).
        limit: The server's context in tokens, as it stated it.
        value: The prompt's length in tokens, as the server counted it (at least the limit where it only said
            the prompt was over it).
        **answer: ``request``, ``response``, ``provider`` and ``url``, as :class:`ServerResponseError` takes them.
    """

    def __init__(self, message: str, *, limit: int, value: int, **answer: Any) -> None:
        super().__init__(message, **answer)
        self.limit = limit
        self.value = value
        self.kind = "context"


# Each error's module is inference.exceptions, where the error tree lists them (pickle finds them there too).
for _name in __all__:
    globals()[_name].__module__ = "inference.exceptions"
