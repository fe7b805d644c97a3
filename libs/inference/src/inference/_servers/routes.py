"""Which route a generation takes on an OpenAI-compatible server: ``/v1/chat/completions`` or ``/v1/completions``.

A model without a chat template cannot chat (vLLM refuses; other servers answer with a fallback format the model
does not know), so such a model is sent plain text on ``/v1/completions``. A server provider is assembled with one
:class:`RouteChoice`:

- :class:`RouteChoice` itself: chat, always;
- :class:`ChatUntilRefused` (the OpenAI provider): the ``api`` setting; with ``"auto"``, chat until a replica
  refuses it for want of a chat template, then completions there (the refused request is sent again);
- :class:`ChatTemplateProbe` (vLLM): the ``api`` setting; with ``"auto"``, asks each replica once, before its first
  generation, whether its model has a chat template (``POST /tokenize`` of a chat message, which generates
  nothing).
"""

from __future__ import annotations

import asyncio

from inference._core.validation import GenerationRequest
from inference._servers.http import ServerAnswer
from inference._servers.openai_wire import CHAT, COMPLETIONS
from inference._servers.replicas import Replica
from inference.exceptions import ServerResponseError

__all__ = ["NO_CHAT_TEMPLATE", "ChatTemplateProbe", "ChatUntilRefused", "RouteChanged", "RouteChoice"]

NO_CHAT_TEMPLATE = "chat template"
"""In a server's 400 for chat on a model without one (vLLM: ``As of transformers v4.44, default chat template is no
longer allowed, so you must provide a chat template if the tokenizer does not define one.``)."""


class RouteChanged(Exception):
    """A request reached a replica whose route for it is not the one it was built for (the server restarted with
    another model since the route was chosen): it is built again for ``route`` and sent once more."""

    def __init__(self, route: str) -> None:
        super().__init__(route)
        self.route = route


class RouteChoice:
    """The route of each generation on each replica: :data:`CHAT` here, whatever the model."""

    async def route(self, replica: Replica, request: GenerationRequest) -> str:
        """The route of ``request`` on ``replica``.

        Raises:
            InferenceError: Finding out needed the replica, and asking it failed (a failure to connect counts as the
                replica being down: the request goes to another one).
        """
        return CHAT

    def after_refusal(self, replica: Replica, route: str, refused: ServerResponseError) -> str | None:
        """The route to send a request again on after ``replica`` refused it on ``route``; ``None``: none."""
        return None

    def refusal(self, answer: ServerAnswer) -> ServerResponseError | None:
        """The error for a 400 to a generation that is about the route (chat without a chat template), else
        ``None``."""
        return None


class ChatUntilRefused(RouteChoice):
    """The ``api`` setting; with ``"auto"``, chat until a replica refuses it for want of a chat template.

    Args:
        api: ``"auto"``, ``"chat"`` or ``"completions"``.
        env_prefix: The provider's variable prefix (``"OPENAI"``), for the hint in a refusal.
    """

    def __init__(self, api: str, *, env_prefix: str) -> None:
        self.api = api
        self._env_prefix = env_prefix
        self._chatless: set[str] = set()  # base URLs of the replicas that refused chat for want of a chat template

    async def route(self, replica: Replica, request: GenerationRequest) -> str:
        """The ``api`` setting; for ``"auto"``, chat until the replica refused it for want of a chat template."""
        if self.api != "auto":
            return self.api
        return COMPLETIONS if replica.base_url in self._chatless else CHAT

    def after_refusal(self, replica: Replica, route: str, refused: ServerResponseError) -> str | None:
        """With ``api="auto"``, completions for a replica that refused chat for want of a chat template."""
        if self.api != "auto" or route != CHAT or refused.status_code != 400 or NO_CHAT_TEMPLATE not in str(refused):
            return None
        self._chatless.add(replica.base_url)
        replica.http.logger.info(
            "%s has no chat template for its model; generating through /v1/completions", replica.http.where
        )
        return COMPLETIONS

    def refusal(self, answer: ServerAnswer) -> ServerResponseError | None:
        """A 400 refusing chat for a model without a chat template: say which setting sends plain text instead."""
        chatting = answer.response.request.url.path.endswith("/chat/completions")
        if not chatting or NO_CHAT_TEMPLATE not in answer.message:
            return None
        return answer.error(
            ServerResponseError,
            f"{answer.where} cannot chat with its model: it has no chat template ({answer.message}). Generate "
            f"through /v1/completions instead: {self._env_prefix}_API=completions (or api=...), or give the server "
            "a chat template",
        )


def _forget_failed(replica: Replica, probe: asyncio.Future[str]) -> None:
    """A probe that failed (server down, a timeout) found nothing out: the next request asks again, even when every
    request that waited for this one had stopped waiting (the caller's own timeout) before it failed."""
    failed = probe.cancelled() or probe.exception() is not None  # retrieved: asyncio logs no "never retrieved"
    if failed and replica.route is probe:
        replica.route = None


class ChatTemplateProbe(RouteChoice):
    """The ``api`` setting; with ``"auto"``, what each replica's model needs, asked once per replica.

    A replica renders a chat message (``POST /tokenize`` of one) or answers vLLM's 400 about a missing chat template;
    a server without ``/tokenize`` gets chat.

    Args:
        api: ``"auto"``, ``"chat"`` or ``"completions"``.
        server: The server's name (``"vLLM"``), for the hint in a refusal.
        env_prefix: The provider's variable prefix (``"VLLM"``), for the hint in a refusal.
    """

    def __init__(self, api: str, *, server: str, env_prefix: str) -> None:
        self.api = api
        self._server = server
        self._env_prefix = env_prefix

    async def route(self, replica: Replica, request: GenerationRequest) -> str:
        """The ``api`` setting; for ``"auto"``, what the replica's model needs, found out once per replica."""
        if self.api != "auto":
            return self.api
        probe = replica.route
        if probe is None:
            probe = replica.route = asyncio.ensure_future(self._find_route(replica))
            probe.add_done_callback(lambda done: _forget_failed(replica, done))
        return await asyncio.shield(probe)

    async def _find_route(self, replica: Replica) -> str:
        """:data:`CHAT` when the replica can render a chat message (``POST /tokenize`` of one), else
        :data:`COMPLETIONS` (vLLM's 400 about a missing chat template). A server without ``/tokenize`` (not vLLM)
        gets chat, as before."""
        operation = "find out whether the server's model has a chat template"
        try:
            await replica.http.request(
                "POST",
                f"{replica.root}/tokenize",
                operation=operation,
                json_body={"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True},
            )
        except ServerResponseError as error:
            if error.status_code == 400 and NO_CHAT_TEMPLATE in str(error):
                replica.http.logger.info(
                    "%s: the model has no chat template; generating through /v1/completions", replica.http.where
                )
                return COMPLETIONS
            if error.status_code == 404:
                return CHAT
            raise
        return CHAT

    def refusal(self, answer: ServerAnswer) -> ServerResponseError | None:
        """vLLM's 400 to chat on a model without a chat template: say how to generate through completions."""
        if NO_CHAT_TEMPLATE not in answer.message or "no longer allowed" not in answer.message:
            return None
        return answer.error(
            ServerResponseError,
            f"{answer.where} cannot chat with its model: it has no chat template ({answer.message}). Generate "
            f"through /v1/completions instead: {self._env_prefix}_API=auto (the default) or completions (or api=...), "
            f"or start {self._server} with --chat-template",
        )
