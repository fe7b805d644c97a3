"""What a llama-server renders chat templates with, read from the server: ``GET /props`` (the model's template
and its capabilities), whether it has Jinja, and what that means for a request's tools and its route.

A server restarted on its port may render otherwise (``--no-jinja``, another model or template), and nothing in an
answer says so. What is read is kept for the server process it came from, recognised by connections: a request that
goes out on a connection no request to that replica went out on before may reach another process, so the replica's
``/props`` is read again over that connection and whether it has Jinja asked again when next needed
(:meth:`LlamaServerTemplates.reached_on`)."""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from inference._core.validation import GenerationRequest
from inference._servers.http import ServerClient
from inference._servers.openai_wire import CHAT, COMPLETIONS
from inference._servers.replicas import Replica
from inference._servers.routes import RouteChoice
from inference.exceptions import UnsupportedOperationError
from inference.messages import has_tool_turns

PROVIDER = "llamacpp-server"
"""The provider name errors carry."""

FALLBACK_TEMPLATE = (
    "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n'"
    " -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}"
)
"""The ChatML template llama-server reports (and uses) for a model whose GGUF has none."""


class LlamaServerTemplates:
    """Per replica of a llama-server provider: its ``GET /props`` and whether it renders with Jinja (each read once
    per server process: see the module docstring), and the checks of a request against them."""

    def __init__(self) -> None:
        self._props: dict[str, dict[str, Any]] = {}  # replica URL -> its GET /props
        self._jinja: dict[str, bool] = {}  # replica URL -> whether it renders templates with Jinja
        self._connections: dict[str, weakref.WeakSet[Any]] = {}  # replica URL -> connections requests went out on

    async def props(self, replica: Replica, http: ServerClient | None = None) -> dict[str, Any]:
        """``GET /props`` of the replica (the chat template, the model's path), read once per server process;
        ``http`` reads it (by default the replica's pooled client) when it is not known."""
        props = self._props.get(replica.base_url)
        if props is None:
            operation = "read the server's properties"
            http = http or replica.http
            response = await http.request("GET", f"{replica.root}/props", operation=operation)
            body = http.parse_json(response, operation=operation)
            props = self._props[replica.base_url] = body if isinstance(body, dict) else {}
        return props

    async def reached_on(self, replica: Replica, http: ServerClient) -> bool:
        """Note the connection a request to ``replica`` just went out on (``http``: a one-connection client); when
        no request to it went out on that connection before, it may reach a server restarted since (other flags,
        another model): its ``/props`` is read again over that connection, and whether it has Jinja is asked again
        when next needed. ``True`` then.

        A connection the HTTP stack does not name (or that cannot be told apart from others) changes nothing.
        """
        connection = http.connection
        seen = self._connections.setdefault(replica.base_url, weakref.WeakSet())
        try:
            if connection is None or connection in seen:
                return False
            seen.add(connection)
        except TypeError:  # not weakly referenceable: nothing to tell connections apart by
            return False
        self._props.pop(replica.base_url, None)
        self._jinja.pop(replica.base_url, None)
        await self.props(replica, http)
        return True

    async def checked(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> dict[str, Any]:
        """``arguments`` checked against what the replica renders with: template variables refused without Jinja,
        tools as :meth:`tool_arguments` takes them.

        Raises:
            UnsupportedOperationError: The replica would ignore or mangle what the request asks for without a word.
        """
        if "chat_template_kwargs" in arguments:  # a server without Jinja would ignore them without a word
            await self.require_jinja(replica, "it would ignore chat_template_kwargs and thinking without a word")
        if "tools" in arguments or (isinstance(request.prompt, tuple) and has_tool_turns(request.prompt)):
            return await self.tool_arguments(replica, request, arguments)
        return arguments

    async def tool_arguments(
        self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """``arguments`` as llama-server takes the request's tools, checked against what the replica can do.

        llama-server reads tools (and renders a conversation's tool calls) only with Jinja. Without a word, where
        the model's template renders no tool calls (``GET /props`` says so in ``chat_template_caps``) it leaves the
        tools out of the prompt and answers in text, and renders a conversation's calls as empty turns; it applies
        a ``json_schema`` instead of the tools. It refuses logprobs with tools in a stream (a 400). A named
        ``tool_choice`` it would take as ``"auto"`` (it reads only a string there, logging a warning), so that is
        sent as ``tools=[that tool]``, ``tool_choice="required"`` and ``parallel_tool_calls=false``: one call of
        that tool.

        Raises:
            UnsupportedOperationError: The replica renders without Jinja, its template renders no tool calls, or the
                request asks for tools with a ``json_schema`` or streams logprobs with them (another provider may:
                a fallback moves on).
        """
        await self.require_jinja(
            replica, "it refuses tools, and would render an assistant turn's tool calls as an empty turn"
        )
        tools = arguments.get("tools") or []
        choice = arguments.get("tool_choice")
        calls_tools = bool(tools) and choice != "none"
        if tools and arguments.get("stream") and arguments.get("logprobs"):
            raise UnsupportedOperationError(
                f"llama-server at {replica.root} does not stream logprobs with tools (it refuses the request): "
                "ask without logprobs, or generate instead of stream",
                provider=PROVIDER,
            )
        if calls_tools and request.json_schema is not None:
            raise UnsupportedOperationError(
                f"llama-server at {replica.root} applies a json_schema instead of the tools (its answer is JSON "
                "text, never a call, without a word): ask with tools or with json_schema, not both (or with "
                "tool_choice 'none')",
                provider=PROVIDER,
            )
        turns = isinstance(request.prompt, tuple) and has_tool_turns(request.prompt)
        caps = (await self.props(replica)).get("chat_template_caps")
        if (calls_tools or turns) and isinstance(caps, dict) and caps.get("supports_tool_calls") is False:
            what = "ignore the tools and answer in text" if calls_tools else "render the tool calls as empty turns"
            raise UnsupportedOperationError(
                f"llama-server at {replica.root} has a chat template that renders no tool calls (GET /props: "
                f"chat_template_caps.supports_tool_calls is false), so it would {what} without a word: start it "
                "with --chat-template-file FILE, a template that renders tools and tool calls (the model's "
                "tool-use template), or send this request to another provider",
                provider=PROVIDER,
            )
        if calls_tools and isinstance(choice, Mapping):
            name = choice["function"]["name"]
            named = [tool for tool in tools if tool["function"]["name"] == name]
            return {**arguments, "tools": named, "tool_choice": "required", "parallel_tool_calls": False}
        return arguments

    async def require_jinja(self, replica: Replica, why: str) -> None:
        """Refuse, saying ``why``, what needs Jinja on a replica that renders chat templates without it
        (``--no-jinja``).

        Asked once per server process: ``POST /apply-template`` with a tool only renders the prompt, and a server
        without Jinja refuses any tool (``"tools param requires --jinja flag"``); ``/props`` does not say.
        """
        jinja = self._jinja.get(replica.base_url)
        if jinja is None:
            probe = {"messages": [{"role": "user", "content": "x"}], "tools": [
                {"type": "function", "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}}}
            ]}
            response = await replica.http.request(
                "POST", f"{replica.root}/apply-template", operation="ask whether the server renders with Jinja",
                json_body=probe, ok_statuses=frozenset({400, 404, 500, 501}),
            )
            jinja = self._jinja[replica.base_url] = response.status_code == 200
        if not jinja:  # the server's start, not the request: another provider may take it
            raise UnsupportedOperationError(
                f"llama-server at {replica.root} renders chat templates without Jinja (started with --no-jinja, or "
                f"too old for /apply-template), so {why}: start it with --jinja (its default), or leave them out",
                provider=PROVIDER,
            )


class TemplateFromProps(RouteChoice):
    """Chat when the server's model has a chat template of its own (``GET /props``), else plain-text completions.

    For a model without one, llama-server reports (and chats with) its ChatML fallback: that template counts as
    none, so such a model reads the same text as in the in-process provider.
    """

    def __init__(self, props: Callable[[Replica], Awaitable[dict[str, Any]]]) -> None:
        self._props = props

    async def route(self, replica: Replica, request: GenerationRequest) -> str:
        template = (await self._props(replica)).get("chat_template")
        if not isinstance(template, str) or not template.strip() or template.strip() == FALLBACK_TEMPLATE:
            return COMPLETIONS
        return CHAT
