"""The OpenAI provider: generation through any OpenAI-compatible chat completions endpoint, without adapters."""

from __future__ import annotations

from collections.abc import Sequence

from inference._core.validation import GenerationRequest
from inference._servers.http import ErrorHandlers, ServerAnswer
from inference._servers.openai_compatible import CHAT, COMPLETIONS, OpenAICompatibleProvider, Replica
from inference.exceptions import ServerResponseError

_NO_CHAT_TEMPLATE = "chat template"
"""In a server's 400 for chat on a model without one (vLLM: ``... default chat template is no longer allowed, so
you must provide a chat template if the tokenizer does not define one``)."""

__all__ = ["OpenAIProvider"]


class OpenAIProvider(OpenAICompatibleProvider):
    """Generates through an OpenAI-compatible API: OpenAI itself, SGLang, LM Studio, a gateway.

    Requests go to ``/v1/chat/completions`` as JSON over a pooled ``httpx`` client, whole or streamed. Settings
    are read from the variables the ``openai`` client reads (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``).

    A model without a chat template cannot chat: some servers refuse (vLLM: a 400 naming the chat template),
    others answer with a fallback format the model does not know, often with empty text (``llama_cpp.server`` with
    Gemma's GGUF: ``""`` and ``finish_reason="stop"``). ``api="completions"`` sends every generation to
    ``/v1/completions`` as plain text instead (the prompt, or the system prompt, a blank line and the prompt, or a
    message list's contents separated by blank lines: what the in-process providers do for such a model).
    ``api="auto"`` (the default) chats, and moves a server to ``/v1/completions`` once it refuses chat for want of a
    chat template (the refused request is sent again there); a server that answers with empty text says nothing,
    so for one, set ``api="completions"``. ``api="chat"`` always chats.
    Adapters are not supported (:attr:`supports_adapters` is false): ``load_adapter`` raises
    :class:`~inference.exceptions.UnsupportedOperationError`. Several base URLs (a list, or comma-separated)
    spread requests over several servers serving the same model.

    ``top_k`` and ``repetition_penalty``, which the OpenAI API lacks, are sent as extra body fields when set:
    servers that know them use them; OpenAI's own API refuses them (a 400 naming the field).

    ``logprobs`` are OpenAI's chat ``logprobs``/``top_logprobs``; ``json_schema`` is sent as a strict
    ``response_format`` of type ``json_schema`` (OpenAI's strict mode needs ``additionalProperties: false`` and
    every property required), or, for a server that refuses that type (llama_cpp.server), as
    ``{"type": "json_object", "schema": ...}``. This provider does not score: OpenAI's API has no prompt logprobs.

    Args:
        base_url: The API's base URL (ending with ``/v1`` for most servers), or several; else
            ``OPENAI_BASE_URL``; else ``https://api.openai.com/v1``.
        api_key: Sent as a bearer token; else ``OPENAI_API_KEY``; else none. Never shown.
        timeout: Seconds to wait for one answer; else ``OPENAI_TIMEOUT``; else 120.
        max_retries: Retries of connect errors and 429/502/503/504; else ``OPENAI_MAX_RETRIES``; else 2.
        api: The route of generations: ``"auto"``, ``"chat"`` or ``"completions"`` (see above); else ``OPENAI_API``;
            else ``"auto"``.

    Example:
        >>> OpenAIProvider(base_url="http://127.0.0.1:30000/v1", api_key="sk-secret")
        OpenAIProvider(base_url='http://127.0.0.1:30000/v1', api_key=***)
    """

    name = "openai"
    server_label = "OpenAI-compatible server"
    env_prefix = "OPENAI"
    supports_adapters = False

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        api: str | None = None,
    ) -> None:
        super().__init__(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries, api=api)
        self.api: str = self._settings["api"]
        self._chatless: set[str] = set()  # base URLs of the replicas that refused chat for want of a chat template

    async def _route(self, replica: Replica, request: GenerationRequest) -> str:
        """The ``api`` setting; for ``"auto"``, chat until the replica refused it for want of a chat template."""
        if self.api != "auto":
            return self.api
        return COMPLETIONS if replica.base_url in self._chatless else CHAT

    def _other_route(self, replica: Replica, route: str, refused: ServerResponseError) -> str | None:
        """With ``api="auto"``, completions for a replica that refused chat for want of a chat template."""
        if self.api != "auto" or route != CHAT or refused.status_code != 400 or _NO_CHAT_TEMPLATE not in str(refused):
            return None
        self._chatless.add(replica.base_url)
        self._logger.info(
            "%s has no chat template for its model; generating through /v1/completions", replica.http.where
        )
        return COMPLETIONS

    def _generation_handlers(self, request: GenerationRequest, reloaded_from: str | None) -> ErrorHandlers:
        return {**super()._generation_handlers(request, reloaded_from), 400: self._no_chat_template}

    def _no_chat_template(self, answer: ServerAnswer) -> ServerResponseError | None:
        """A 400 refusing chat for a model without a chat template: say which setting sends plain text instead."""
        chatting = answer.response.request.url.path.endswith("/chat/completions")
        if not chatting or _NO_CHAT_TEMPLATE not in answer.message:
            return None
        return answer.error(
            ServerResponseError,
            f"{answer.where} cannot chat with its model: it has no chat template ({answer.message}). Generate "
            "through /v1/completions instead: OPENAI_API=completions (or api=...), or give the server a chat "
            "template",
        )
