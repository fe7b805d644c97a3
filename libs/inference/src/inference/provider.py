"""The provider contract: :class:`InferenceProvider` and :class:`GenerationResult`.

Every backend implements the same four async operations. The public methods here check their arguments
once, for every provider, and hand a validated :class:`~inference._validation.GenerationRequest` to the
backend's hook (``_generate``, ``_load_adapter``...), so a bad input gets the same typed error everywhere
and never reaches a server or a model.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar, TypeVar

from inference._validation import GenerationRequest, validate_adapter_id
from inference.exceptions import InvalidRequestError, UnsupportedOperationError

__all__ = ["GenerationRequest", "GenerationResult", "InferenceProvider"]

_ProviderT = TypeVar("_ProviderT", bound="InferenceProvider")


@dataclass(frozen=True)
class GenerationResult:
    """What one generation produced.

    Attributes:
        text: The generated text (without the prompt).
        model: The model that answered (for servers, the name the server reports).
        adapter_id: The adapter used, or ``None`` for the base model.
        token_count: Prompt tokens plus completion tokens.
        finish_reason: ``"stop"`` (end of sequence or a stop string) or ``"length"`` (``max_tokens`` reached).
        prompt_tokens: Tokens in the prompt as the backend counted them.
        completion_tokens: Tokens generated.
    """

    text: str
    model: str
    adapter_id: str | None
    token_count: int
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class InferenceProvider(ABC):
    """An inference backend with a LoRA adapter lifecycle.

    Use it as an async context manager (or call :meth:`aclose`) so it frees what it holds::

        async with get_provider("fake") as provider:
            await provider.load_adapter("style", "/adapters/style")
            result = await provider.generate("Hello", model="tiny", adapter_id="style")

    Capabilities are class attributes, so callers can ask before they try:

    Attributes:
        name: The provider type, as the factory knows it.
        supports_adapters: ``load_adapter`` works.
        hot_swaps_adapters: Switching adapters between requests does not reload the base model.
        batches_mixed_adapters: Concurrent requests for different adapters run in one batch.
        runs_in_process: The model runs inside this process (no server).
    """

    name: ClassVar[str] = "base"
    supports_adapters: ClassVar[bool] = False
    hot_swaps_adapters: ClassVar[bool] = False
    batches_mixed_adapters: ClassVar[bool] = False
    runs_in_process: ClassVar[bool] = False

    async def generate(
        self,
        prompt: str,
        model: str,
        adapter_id: str | None = None,
        max_tokens: int = 4096,
        system_prompt: str | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        *,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        top_k: int | None = None,
    ) -> GenerationResult:
        """Generate a completion for ``prompt``.

        Args:
            prompt: The user's text.
            model: The base model name (servers) or a label (in-process providers use their loaded model).
            adapter_id: A loaded adapter to apply, or ``None`` for the base model.
            max_tokens: The most tokens to generate.
            system_prompt: A system message, sent through the model's chat template where there is one.
            temperature: Sampling temperature; ``0`` is greedy. ``None`` keeps the backend's default.
            top_p: Nucleus sampling mass in (0, 1].
            repetition_penalty: Penalty above 1 discourages repeats; ``None`` keeps the default.
            stop: A string or strings that end the generation (not included in the text).
            seed: Seed for sampling, for reproducible output.
            top_k: Sample only among the ``top_k`` most likely tokens; ``None`` keeps the default.

        Returns:
            The generated text with token counts and finish reason.

        Raises:
            InvalidRequestError: An argument is invalid.
            AdapterNotFoundError: ``adapter_id`` is not loaded.
            ProviderError: The backend failed (unavailable, timeout, error status).
        """
        request = GenerationRequest.from_arguments(
            provider=self.name,
            prompt=prompt,
            model=model,
            adapter_id=adapter_id,
            max_tokens=max_tokens,
            system_prompt=system_prompt,
            temperature=temperature,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            stop=stop,
            seed=seed,
            top_k=top_k,
        )
        return await self._generate(request)

    async def load_adapter(self, adapter_id: str, adapter_path: str | os.PathLike[str]) -> None:
        """Load a LoRA adapter under ``adapter_id`` so that ``generate(adapter_id=...)`` can use it.

        Args:
            adapter_id: The name to use it by (letters, digits, ``.``, ``_``, ``-``).
            adapter_path: Where the adapter is: a PEFT directory, or a GGUF LoRA file where the backend takes one.

        Raises:
            UnsupportedOperationError: The provider has no adapter support.
            AdapterAlreadyLoadedError: The id is already taken.
            InvalidAdapterError: The adapter is missing, corrupt or unsupported.
        """
        adapter_id = validate_adapter_id(adapter_id, provider=self.name)
        if not isinstance(adapter_path, (str, os.PathLike)) or not os.fspath(adapter_path):
            raise InvalidRequestError(
                f"adapter_path must be a non-empty path, got {adapter_path!r}", provider=self.name
            )
        self._require_adapter_support("load_adapter")
        await self._load_adapter(adapter_id, os.fspath(adapter_path))

    async def unload_adapter(self, adapter_id: str) -> None:
        """Unload the adapter ``adapter_id`` and free what it holds.

        Raises:
            UnsupportedOperationError: The provider has no adapter support.
            AdapterNotFoundError: No adapter with this id is loaded.
        """
        adapter_id = validate_adapter_id(adapter_id, provider=self.name)
        self._require_adapter_support("unload_adapter")
        await self._unload_adapter(adapter_id)

    async def list_adapters(self) -> list[str]:
        """Return the ids of the loaded adapters, sorted."""
        return sorted(await self._list_adapters())

    async def aclose(self) -> None:  # noqa: B027 - a no-op by default, on purpose
        """Free what the provider holds (connections, model weights). Safe to call twice."""

    async def __aenter__(self: _ProviderT) -> _ProviderT:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    # Hooks for backends -------------------------------------------------------------------------------

    @abstractmethod
    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one validated request."""

    async def _load_adapter(self, adapter_id: str, adapter_path: str) -> None:
        raise self._unsupported("load_adapter")

    async def _unload_adapter(self, adapter_id: str) -> None:
        raise self._unsupported("unload_adapter")

    async def _list_adapters(self) -> list[str]:
        return []

    def _require_adapter_support(self, operation: str) -> None:
        if not self.supports_adapters:
            raise self._unsupported(operation)

    def _unsupported(self, operation: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(
            f"{type(self).__name__} does not support {operation}; "
            "check the provider's supports_adapters attribute before calling it",
            provider=self.name,
        )
