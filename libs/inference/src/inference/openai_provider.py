"""The OpenAI provider: generation through any OpenAI-compatible chat completions endpoint, without adapters."""

from __future__ import annotations

from collections.abc import Sequence

from inference._servers.openai_compatible import OpenAICompatibleProvider
from inference._servers.routes import ChatUntilRefused

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
        replica_down_s: Seconds a replica that is down (refused a connection, answered 502/503/504, or did not
            answer within ``timeout``) is tried after the others (then in turn again); else
            ``OPENAI_REPLICA_DOWN_S``; else 5.

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
        *,
        replica_down_s: float | None = None,
    ) -> None:
        super().__init__(locals())
        self.api: str = self._settings["api"]
        self._route_choice = ChatUntilRefused(self.api, env_prefix=self.env_prefix)
