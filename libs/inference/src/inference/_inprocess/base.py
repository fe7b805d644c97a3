"""What every in-process provider shares: the model's worker thread, the closed state, the prompt rule.

:class:`InProcessProvider` runs all model work (load, adapters, generation) on one
:class:`~inference._inprocess.worker.ModelWorker`, closes in one order (queued work first, then the
backend's :meth:`~InProcessProvider._close_blocking`, then the adapter registry), and refuses every call
once closed with one :class:`~inference.ProviderError`. A subclass keeps only what its backend does
differently: how it loads a model and an adapter, and how it generates.

The prompt rule, the same for every in-process backend so they produce the same tokens for a request:
a model with a chat template gets the messages of :func:`chat_messages` rendered with the generation
prompt and no further special tokens; a model without one gets :func:`plain_prompt` with the special
tokens its tokenizer adds (BOS where the vocabulary says so).
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from inference._core.tool_formats import tool_messages
from inference._core.validation import AdapterScales, GenerationRequest, adapters_label, listed
from inference._inprocess.worker import ModelWorker
from inference.exceptions import AdapterNotFoundError, ConfigurationError, InvalidRequestError, ProviderError
from inference.provider import InferenceProvider

__all__ = [
    "InProcessProvider",
    "adapter_not_loaded",
    "chat_messages",
    "non_finite_logits",
    "plain_prompt",
    "refuse_template_variables",
    "require_prompt",
    "template_refusal",
]

ResidentT = TypeVar("ResidentT")
"""What a provider keeps per adapter resident in its backend (a llama.cpp handle, a PEFT adapter name)."""


def chat_messages(request: GenerationRequest) -> list[dict[str, Any]]:
    """The chat messages of a request as chat templates read them: its message list, or its system prompt (if any)
    then its prompt; tool calls and results as :func:`~inference._core.tool_formats.tool_messages` gives them."""
    return tool_messages(request.messages)


def template_refusal(request: GenerationRequest, error: Exception, *, model: str, provider: str) -> InvalidRequestError:
    """The error of a chat template that refused a request (its ``raise_exception``, or a Jinja error), in the words
    of every in-process backend: whose template, what it said, and the fix that applies (a system message dropped
    only where one was sent, the ``chat_template`` given fixed only where one was)."""
    whose = "the chat_template given" if request.chat_template else f"the chat template of {model}"
    fixes = []
    if any(message.get("role") == "system" for message in request.messages):
        fixes.append("drop the system message (system_prompt) or put it into the prompt")
    if request.chat_template:
        fixes.append("fix the chat_template given")
    return InvalidRequestError(
        f"{whose} cannot render this request ({type(error).__name__}: {error})"
        + (f": {', or '.join(fixes)}" if fixes else ""),
        provider=provider,
    )


def refuse_template_variables(request: GenerationRequest, *, model: str, provider: str) -> None:
    """Refuse ``chat_template_kwargs`` or ``thinking=True`` for a model that renders its prompt without a chat
    template (it has none, and the request gives none): nothing would read them, and they would be ignored without a
    word (as llama-server refuses them where it has no Jinja renderer). ``thinking=False`` (or ``enable_thinking``
    false among the variables) asks for what such a model does anyway (an agent loop may send it to every model).

    Raises:
        InvalidRequestError: ``chat_template_kwargs`` or ``thinking=True`` is set.
    """
    variables = dict(request.chat_template_kwargs or {})
    if variables.get("enable_thinking") is False:  # the same request as thinking=False
        del variables["enable_thinking"]
    given = [name for name, value in (("chat_template_kwargs", variables or None),
                                      ("thinking", request.thinking or None)) if value is not None]
    if given:
        raise InvalidRequestError(
            f"{given[0]} acts through a chat template, and {model} has none: nothing would read it; give the "
            "template with chat_template=..., or leave it out",
            provider=provider,
        )


def plain_prompt(request: GenerationRequest) -> str:
    """The text of a request for a model without a chat template: the messages' contents, blank-line separated
    (for a string prompt: system prompt, blank line, prompt)."""
    return request.plain_prompt


def non_finite_logits(provider: str, adapters: AdapterScales) -> ProviderError:
    """The error of a request whose logits hold a NaN or an infinity, or are all equal (what a float32 overflow
    inside the model leaves): no token or score can be read from them.

    An adapter (its weights, ``lora_alpha`` or scale) too large for the model's numbers does this; every backend
    fails such a request with this error instead of answering an empty text or a NaN score.
    """
    if not adapters:
        used = "the base model"
    elif len(adapters) == 1 and adapters[0][1] == 1.0:
        used = f"adapter {adapters[0][0]!r}"
    else:
        used = f"adapters {adapters_label(adapters)}"
    return ProviderError(
        f"the model's logits are not finite (NaN, infinity, or all equal after an overflow) for this request with "
        f"{used}: an adapter's weights, lora_alpha or scale are too large for the model's numbers; lower the scale "
        "or check the adapter (the provider is still usable)",
        provider=provider,
    )


def require_prompt(ids: Sequence[int], *, provider: str) -> None:
    """Refuse a prompt that is no tokens at all (the model would have nothing to continue)."""
    if not ids:
        raise InvalidRequestError("the prompt is empty after tokenisation: give a non-empty prompt", provider=provider)


def adapter_not_loaded(
    adapter_id: str, resident: Iterable[str], *, provider: str, where: str = "the model"
) -> AdapterNotFoundError:
    """The error of a request for an adapter that is not resident in the backend (``where``), listing those that are."""
    return AdapterNotFoundError(
        f"adapter {adapter_id!r} is not loaded in {where}: call load_adapter first "
        f"(resident: {listed(sorted(resident)) or 'none'})",
        provider=provider,
    )


class InProcessProvider(InferenceProvider, Generic[ResidentT]):
    """Base of the providers that run the model in this process, on one worker thread.

    Subclasses implement the generation hooks, ``_load_adapter``/``_unload_adapter`` (on the worker) and
    :meth:`_close_blocking`; they record the adapters resident in the backend in ``_resident`` (changed
    only on the worker thread).

    Args:
        arguments: The subclass constructor's arguments (see :class:`~inference.InferenceProvider`): its
            settings, ``max_adapters`` among them (most adapters kept in the backend at once; ``None``: unlimited).
        worker_initializer: Called once on the worker thread before its first call.

    Raises:
        ConfigurationError: ``max_adapters`` is not a positive integer or ``None``.
    """

    supports_adapters = True
    hot_swaps_adapters = True
    runs_in_process = True
    _backend_label = "the model"
    """Where adapters are resident, as error messages name it."""

    def __init__(
        self, arguments: Mapping[str, Any], *, worker_initializer: Callable[[], object] | None = None
    ) -> None:
        super().__init__(arguments)
        max_adapters = self._settings.get("max_adapters")
        if max_adapters is not None and (
            isinstance(max_adapters, bool) or not isinstance(max_adapters, int) or max_adapters < 1
        ):
            raise ConfigurationError(
                "max_adapters must be a positive integer or None for no limit (argument max_adapters or "
                f"{self.name.upper()}_MAX_ADAPTERS), got {max_adapters!r}",
                provider=self.name,
            )
        self.max_adapters: int | None = max_adapters
        self._worker = ModelWorker(self.name, initializer=worker_initializer)
        # Adapters resident in the backend now, by id (the registry decides when; the worker changes it).
        self._resident: dict[str, ResidentT] = {}

    @property
    def resident_adapters(self) -> list[str]:
        """Ids of the adapters in the backend's memory now, sorted (``list_adapters`` also lists evicted ones)."""
        return sorted(self._resident)

    async def aclose(self) -> None:
        """Let the requests already queued finish, then free the adapters, the model and the worker thread.

        Every request that reached the model's queue before this call (``generate``, ``stream``, with or
        without an adapter) runs to its end and returns its result, in order; then the adapters and the
        model are freed. A call that had not reached the queue yet (one still waiting for its adapter to
        load, for example) and every call made afterwards raise :class:`~inference.ProviderError` saying
        the provider is closed. To stop queued work sooner, cancel those calls first: each stops within
        one token. Cancelling ``aclose`` itself does not stop the freeing, which goes on in the worker.
        Safe to call twice.
        """
        if self._closed:
            return
        self._closed = True  # from here on, the adapter registry evicts nothing more
        try:
            close = self._worker.submit(self._close_blocking)  # after every request queued so far
        finally:
            self._worker.shutdown()  # refuses new work; what is queued still runs
        try:
            await asyncio.shield(close)
        finally:
            await self._adapter_registry.finish_evicting()  # its unload, queued before the close, has run
            self._adapter_registry.clear()
            self._remove_unused_adapter_weights()
            await super().aclose()

    @abstractmethod
    def _close_blocking(self) -> None:
        """Free every resident adapter and the model (worker thread; the last call the worker runs)."""

    def _closed_path(self) -> str | None:
        """The model path the closed error names, where the provider has one."""
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise ProviderError(
                f"this {type(self).__name__} is closed: create a new one (or call get_provider again)",
                provider=self.name,
                path=self._closed_path(),
            )

    def _check_request(self, request: GenerationRequest) -> None:
        """Refuse a request to a closed provider before it is queued (subclasses add their own checks)."""
        self._check_open()

    def _adapter_in_use(self, adapter_id: str | None) -> contextlib.AbstractAsyncContextManager[str | None]:
        """As the base class, but a closed provider says so first, whether or not the request uses an adapter."""
        self._check_open()
        return super()._adapter_in_use(adapter_id)

    async def _discover_adapter(self, adapter_id: str) -> str | None:
        """Nothing is discovered; a closed provider (whose registry is cleared) says it is closed."""
        self._check_open()
        return None

    def _not_loaded(self, adapter_id: str) -> AdapterNotFoundError:
        return adapter_not_loaded(adapter_id, self._resident, provider=self.name, where=self._backend_label)

    def _require_prompt(self, ids: Sequence[int]) -> None:
        require_prompt(ids, provider=self.name)
