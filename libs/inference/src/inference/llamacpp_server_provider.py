"""llama.cpp's own server (``llama-server``): the ``llamacpp-server`` provider.

llama-server loads its LoRA adapters at start (``--lora FILE``, repeatable) and cannot take more while it runs; a
request chooses among them with its ``lora`` field. So ``load_adapter`` here does not send weights anywhere: it finds
the adapter among those the server has (by path, or by content), records the id, and tells you the ``--lora`` flag
to add when the server lacks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from inference._core.paths import expand_path, path_identity
from inference._core.validation import GenerationRequest, TokenRequest
from inference._servers.http import ServerClient
from inference._servers.llama_server_templates import LlamaServerTemplates, TemplateFromProps
from inference._servers.llama_server_tokens import LlamaServerTokens, distribution_fields
from inference._servers.openai_compatible import OpenAICompatibleProvider
from inference._servers.openai_wire import CHAT, COMPLETIONS
from inference._servers.replicas import Replica, ReplicaLacks
from inference._servers.routes import RouteChanged
from inference.adapters.gguf import convert_peft_to_gguf_cached, lora_content_digest
from inference.adapters.peft import read_peft_adapter
from inference.adapters.source import AdapterSource
from inference.exceptions import (
    AdapterNotFoundError,
    InvalidAdapterError,
    ProviderError,
    ProviderUnavailableError,
)
from inference.options import ByRequests, OptionMap, Refused, Sent
from inference.results import TokenLogprob
from inference.tokens import TokenIds, TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["LlamaCppServerProvider", "ServedAdapter"]

_LORA_HINT = "--lora-init-without-apply"

RESTART_ATTEMPTS = 3
"""Times a request is sent, each time with the adapter list read again, while its answers come from another server
process than the list it used (the server restarted in between); then it fails."""


@dataclass(frozen=True)
class ServedAdapter:
    """One adapter a llama-server loaded at start (``GET /lora-adapters``).

    Attributes:
        index: Its id on the server (the order of the ``--lora`` flags).
        path: The file as the server names it (relative to the server's working directory when given so).
        name: The file name without ``.gguf``: the id it is listed under until you load it under another.
    """

    index: int
    path: str
    name: str


class LlamaCppServerProvider(OpenAICompatibleProvider):
    """Generates through llama.cpp's ``llama-server``, choosing a preloaded LoRA adapter per request.

    Start the server with every adapter you will use, not applied by default::

        llama-server -m base.gguf --lora adapters/math.gguf --lora adapters/style.gguf --lora-init-without-apply

    Then ``load_adapter("math", "adapters/math.gguf")`` finds the file among the server's adapters (the same path,
    or a file with the same bytes) and records the id; a PEFT directory is converted here
    (:func:`~inference.adapters.gguf.convert_peft_to_gguf_cached`, on the server's base model when its file is
    readable from this machine) and matched by content, which is what ``inference convert-adapter`` wrote for the
    server. An adapter the server does not have is an :class:`~inference.exceptions.InvalidAdapterError` that
    prints the ``--lora`` flag to add. ``unload_adapter`` forgets the id (the server keeps the file).

    Every generation sends the server's whole adapter list in its ``lora`` field: scale 1 for the adapter asked for
    (or each adapter's own scale, for ``adapter_id=[("math", 1.0), ("style", 0.5)]``), 0 for the others (all 0 for
    the base model), so a server started without ``--lora-init-without-apply`` still
    answers each request with exactly its adapter. llama-server names adapters by position only, and a server
    restarted with its ``--lora`` flags in another order numbers them otherwise, so the list is read again for every
    request, over the TCP connection the request then goes on (a restart closes it): an answer is used only when it
    comes from the server process whose list gave its ids, else the request is sent again with the new list (see
    :meth:`_call`); a restarted server without the adapter is an
    :class:`~inference.exceptions.AdapterNotFoundError`. On a server with adapters, ``cache_prompt`` is turned off:
    llama-server reuses a slot's cached prompt across requests for different adapters (llama.cpp#26207), which
    silently mixes the previous request's adapter into the answer. Requests for different adapters may run at once
    (in different slots). ``list_adapters`` lists the ids you loaded and, under their file names, the other
    adapters the server has; such a file name can be used as an ``adapter_id`` without ``load_adapter``.

    Generation goes to ``/v1/chat/completions`` (the server renders its model's chat template), or, for a model
    without a chat template, to ``/v1/completions`` with the plain text (the system prompt, a blank line, the
    prompt), as the in-process llama.cpp provider does; the server's ``GET /props`` tells which (read once per server
    process: again on a request's new connection, which may reach a server restarted with another model).
    ``logprobs`` and ``json_schema`` work as on the other OpenAI-compatible servers, except that llama-server
    reports a generated token that ends inside a UTF-8 character together with the next one (one logprobs entry for
    both, so fewer entries than tokens), and none for such a token that ends the answer: an answer with no entry
    at all is then a :class:`~inference.exceptions.ProviderError` that says so. llama-server has no prompt
    log-probabilities, so this provider does not score (``supports_scoring`` is false).

    ``tools`` and ``tool_choice`` go to the chat route, where llama-server renders them with the model's template
    and parses the calls back (whole and streamed); a named ``tool_choice`` is sent as ``tools=[that tool]`` with
    ``"required"``. What llama-server would get wrong without a word is refused before anything is generated: a
    server started with ``--no-jinja`` (:class:`~inference.exceptions.InvalidRequestError`), a template that renders
    no tool calls (``GET /props``) and tools with a ``json_schema``
    (:class:`~inference.exceptions.UnsupportedOperationError`; see ``LlamaServerTemplates.tool_arguments``).

    Args:
        base_url: The server's URL (``http://HOST:PORT``, with or without ``/v1``), or several (replicas started
            with the same adapters); else ``LLAMACPP_SERVER_BASE_URL``; else ``http://localhost:8080``.
        api_key: The server's ``--api-key``; else ``LLAMACPP_SERVER_API_KEY``. Never shown.
        timeout: Seconds to wait for one answer; else ``LLAMACPP_SERVER_TIMEOUT``; else 120.
        max_retries: Retries of connect errors and 429/502/503/504; else ``LLAMACPP_SERVER_MAX_RETRIES``; else 2.
        adapter_cache_dir: Where PEFT directories are converted to GGUF for matching; else
            ``LLAMACPP_SERVER_ADAPTER_CACHE_DIR``; else ``~/.cache/inference-adapters``.
        replica_down_s: Seconds a replica that is down (refused a connection, answered 502/503/504, or did not
            answer within ``timeout``) is tried after the others (then in turn again); else
            ``LLAMACPP_SERVER_REPLICA_DOWN_S``; else 5.

    Example:
        >>> LlamaCppServerProvider(base_url="http://127.0.0.1:8080")
        LlamaCppServerProvider(base_url='http://127.0.0.1:8080', api_key=None, adapters=[])
    """

    name = "llamacpp-server"
    options: ClassVar[OptionMap] = {
        **OpenAICompatibleProvider.options,
        "repetition_penalty": Sent("repeat_penalty", "llama-server's name; it ignores repetition_penalty"),
        "top_k": Sent("top_k"),
        "tools": Sent("tools", "on the chat route, read by llama-server's Jinja renderer (--jinja, its default); "
                      "refused for a server started with --no-jinja, for a model whose chat template renders no "
                      "tool calls (llama-server would leave the tools out and answer in text) and with json_schema "
                      "(which it would apply instead); its calls come back parsed from the template's format"),
        "tool_choice": Sent("tool_choice", "auto, none and required as they are (required: a grammar of the tools' "
                            "calls, which lets the model write text before its call); a named tool, which "
                            "llama-server would take as auto without a word, is sent as tools=[that tool] with "
                            "tool_choice required and parallel_tool_calls false: the same meaning"),
        "chat_template_kwargs": Sent(
            "chat_template_kwargs",
            "read by llama-server's Jinja renderer (--jinja, its default): refused for a server started with "
            "--no-jinja, which would ignore them without a word",
        ),
        "thinking": Sent("chat_template_kwargs.enable_thinking", "as chat_template_kwargs; the reasoning comes back "
                         "apart (reasoning_content) as llama-server's --reasoning-format says"),
        "return_token_ids": Refused("llama-server's OpenAI routes return no token ids (its native /completion's "
                                    "return_tokens is not used by this provider)"),
        "n": ByRequests(note=(
            "n requests of one completion (seeds seed, seed + 1, ...): llama-server's own n (its children share the "
            "prompt, seeds seed + k) counts only the first choice's tokens in usage, reports no count per choice, and "
            "refuses an n above its --parallel slots"
        )),
    }
    server_label = "llama-server"
    env_prefix = "LLAMACPP_SERVER"
    model_hint = "llama-server serves the one model it was started with (-m)"
    supports_adapters = True
    hot_swaps_adapters = True
    supports_adapter_scales = True
    supports_tokenize = True
    supports_next_token_logprobs = True
    supports_token_prompts = True

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        adapter_cache_dir: str | os.PathLike[str] | None = None,
        *,
        replica_down_s: float | None = None,
    ) -> None:
        super().__init__(locals())
        for replica in self._replicas:  # the OpenAI-compatible routes, whether base_url ends with /v1 or not
            replica.urls = {CHAT: f"{replica.root}/v1/chat/completions", COMPLETIONS: f"{replica.root}/v1/completions"}
        self.adapter_cache_dir = expand_path(self._settings["adapter_cache_dir"] or "~/.cache/inference-adapters")
        self._templates = LlamaServerTemplates()
        self._matched: dict[str, str] = {}  # adapter id -> the server's file path it matched
        self._lacking: set[tuple[str, str]] = set()  # (replica URL, adapter id): restarted without it, logged
        self._route_choice = TemplateFromProps(self._templates.props)
        self._tokens = LlamaServerTokens(self._replicas, self._templates.props)

    async def served_adapters(self) -> list[ServedAdapter]:
        """The adapters the server loaded at start, read again from ``GET /lora-adapters`` (of the first replica, in
        the order of the base URLs, that answers)."""
        return (await self._served_lists())[0]

    # Generation ---------------------------------------------------------------------------------------------

    async def _call(
        self,
        replica: Replica,
        request: GenerationRequest,
        arguments: dict[str, Any],
        *,
        reloaded_from: str | None = None,
        http: ServerClient | None = None,
    ) -> Any:
        """Send the request with the ``lora`` field that applies exactly its adapters (or none), over the connection
        the server's adapter list was just read on, and check the list again after the answer.

        The ``lora`` field names adapters by position, and nothing in the request lets llama-server check that a
        position is the file meant: a server restarted with its ``--lora`` files in another order would apply
        another adapter. So the list is read and the request sent over one TCP connection
        (:meth:`~inference._servers.http.ServerClient.one_connection`); a restart closes it, so an answer that came
        on that connection came from the process whose list gave the ids. The list is read again after the answer
        (after a stream's last event), for what the connection cannot tell (a proxy between this process and the
        server keeps its own connections to it). An answer is used when the list is the same both times and the
        answer came on the first list's connection (or the second list came on the answer's, or the server lists no
        adapters: behind a proxy that closes every connection, the second list is the only check); otherwise it is
        dropped (a stream on another connection is closed at once) and the request sent again with the new list,
        up to :data:`RESTART_ATTEMPTS` times. A stream whose list changed by its end has given its pieces already:
        its end is a :class:`~inference.exceptions.ProviderUnavailableError` instead of a result.

        A list read on a connection no request to the replica went out on before may come from a server restarted
        with other flags or another model: its ``/props`` is read again over that connection, Jinja asked again when
        needed (:meth:`LlamaServerTemplates.reached_on`), and a request built for the route the old ``/props`` gave
        is built again for the new one (:class:`~inference._servers.routes.RouteChanged`). The request's template
        variables and tools are checked against what the server renders with.

        Raises:
            ReplicaLacks: The server (restarted) has no longer an adapter the request applies (another replica may;
                with none, its :class:`~inference.exceptions.AdapterNotFoundError`).
            ProviderUnavailableError: The server kept restarting between the adapter list and the answer.
        """
        stream = bool(arguments.get("stream"))
        held = contextlib.AsyncExitStack()  # the connection, until the answer is read (a stream: until it is closed)
        pinned = await held.enter_async_context((http or replica.http).one_connection())
        try:
            for _ in range(RESTART_ATTEMPTS):
                served = await self._read_served(replica, pinned)
                listed_on = pinned.connection
                maybe_restarted = await self._templates.reached_on(replica, pinned)  # /props read again if so
                if maybe_restarted and not request.raw_prompt and request.prompt_token_ids is None:
                    route = await self._route_choice.route(replica, request)  # the server's model may be another
                    if route != (COMPLETIONS if "prompt" in arguments else CHAT):
                        raise RouteChanged(route)
                checked = await self._templates.checked(replica, request, arguments)
                body = self._with_lora(replica, request, checked, served)
                answer = await super()._call(replica, request, body, reloaded_from=reloaded_from, http=pinned)
                answered_on = pinned.connection
                same_process = answered_on is listed_on  # (both None: an HTTP stack that does not say, a mock)
                # A server that lists no adapters has no positions to mistake: its answer is wrong only if it
                # restarted with some, which the list read after the answer shows (behind a proxy that closes every
                # connection, the only check there is).
                trusted = same_process or not served
                if stream and trusted:

                    async def check(served: list[ServedAdapter] = served) -> None:
                        if await self._read_served(replica, pinned, again=False) != served:
                            raise self._restarted_error(
                                replica, "during a stream, whose pieces may come from another adapter: generate again"
                            )

                    return _HeldEvents(answer, held.pop_all(), check)
                if stream:
                    await answer.aclose()  # the server stops generating
                else:
                    again = await self._read_served(replica, pinned, again=False)
                    if again == served and (trusted or pinned.connection is answered_on):
                        return answer  # the process that answered lists the same adapters in the same order
                self._logger.warning(
                    "%s answered on another connection than the one its adapter list was read on (it restarted?): "
                    "sending the request again with the list read again",
                    replica.http.where,
                )
        finally:
            await held.aclose()  # a no-op once a stream holds the connection
        raise self._restarted_error(
            replica,
            f"between reading its adapter list and answering, {RESTART_ATTEMPTS} times in a row; its answers "
            "were not used. Retry once the server is up",
        )

    def _restarted_error(self, replica: Replica, when: str) -> ProviderUnavailableError:
        return ProviderUnavailableError(
            f"{replica.http.where} restarted (or closed the connection) {when} (llama-server numbers adapters by "
            "position, and a restarted server may number them otherwise)",
            provider=self.name,
            url=replica.http.shown_url,
        )

    def _with_lora(
        self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any], served: list[ServedAdapter]
    ) -> dict[str, Any]:
        """``arguments`` with the ``lora`` field that applies exactly the request's adapters, by ``served``'s ids."""
        scales: dict[int, float] = {}  # server index -> scale, for every adapter the request applies
        for adapter_id, scale in request.adapters:
            chosen = self._matched.get(adapter_id)
            index = next((entry.index for entry in served if entry.path == chosen), None)
            if index is None:
                lacks = AdapterNotFoundError(
                    f"{replica.http.where} no longer has adapter {adapter_id!r} ({chosen}): it was restarted "
                    f"without it; start it with --lora {chosen}",
                    provider=self.name,
                )
                if (replica.base_url, adapter_id) not in self._lacking:  # once, not at every request
                    self._lacking.add((replica.base_url, adapter_id))
                    others = "; meanwhile its requests go to the other replicas" if len(self._replicas) > 1 else ""
                    self._logger.warning("%s%s", lacks, others)
                raise ReplicaLacks(lacks)
            self._lacking.discard((replica.base_url, adapter_id))
            scales[index] = scale
        body = {**arguments, "model": request.model}
        if "response_format" in body and "prompt" in body:
            # /v1/completions ignores response_format (llama-server reads it on the chat route only) and would
            # answer free text; its own json_schema field applies on every route.
            del body["response_format"]
            body["json_schema"] = dict(request.json_schema or {})
        if served:
            body["lora"] = [{"id": entry.index, "scale": scales.get(entry.index, 0.0)} for entry in served]
            # llama-server reuses a slot's cached prompt across requests for different adapters (llama.cpp#26207):
            # the answer would be computed partly with the previous request's adapter. Off, for correctness.
            body["cache_prompt"] = False
        return body

    def _logprobs(
        self, replica: Replica, request: GenerationRequest, entries: list[TokenLogprob], tokens: int, *,
        streamed: bool = False,
    ) -> list[TokenLogprob]:
        """The answer's token logprobs, as llama-server reports them: a token that ends inside a UTF-8 character comes
        with the next one, in one entry holding the next one's logprob (fewer entries than tokens: the provider page
        says so); none for generated tokens: the answer ended inside a UTF-8 character."""
        if not entries and tokens > 0:
            raise ProviderError(
                f"{replica.http.where} gave no logprobs for the {tokens} token(s) it generated: llama-server reports "
                "a token that ends inside a UTF-8 character only with the next token, and this answer ended on such "
                "a token: ask for more tokens (max_tokens)",
                provider=self.name,
                url=replica.http.shown_url,
            )
        return entries

    # Token level: /tokenize, /detokenize, one-token completions with every probability (_servers.llama_server_tokens)

    async def _tokenize_text(self, text: str, model: str) -> list[int]:
        return await self._tokens.tokenize(text)

    async def _detokenize_ids(self, request: TokenRequest) -> str:
        return await self._tokens.detokenize(request.token_ids)

    async def _token_vocabulary(self, model: str) -> TokenVocabulary:
        return await self._tokens.vocabulary()

    _distribution_generates_a_token = True  # a one-token completion: the sequence needs room for that token

    async def _next_token_logprobs(self, requests: list[TokenRequest]) -> NDArray[np.float32]:
        """Each sequence as a one-token ``/v1/completions`` request of its ids with every token's probability
        (``n_probs`` = the vocabulary's size), its adapters in the ``lora`` field, all sent at once (the server's
        slots run them in parallel)."""
        import numpy

        size = (await self._vocabulary_of(requests[0].model)).size
        return numpy.stack(await asyncio.gather(*(self._next_token_row(request, size) for request in requests)))

    async def _next_token_row(self, request: TokenRequest, size: int) -> NDArray[np.float32]:
        asked = GenerationRequest.from_arguments(
            provider=self.name, prompt=TokenIds(request.token_ids), model=request.model, max_tokens=1,
            temperature=0.0, extra_body=distribution_fields(size, await self._tokens.whole_character()),
        ).under(request.adapter_id, request.adapter_scales)
        async with self._chat(asked, stream=False) as (replica, _, completion):
            row, _ = self._tokens.row(replica, completion, size)
        return row

    # Adapters -----------------------------------------------------------------------------------------------

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Find the adapter among every replica's preloaded ones; record the server's path for it."""
        adapter_path = source.path
        if Path(adapter_path).is_dir():  # a bad PEFT directory is refused before any server is asked
            await asyncio.to_thread(read_peft_adapter, adapter_path, provider=self.name)
        found: str | None = None
        for replica in self._replicas:
            served = await self._read_served(replica)
            match = await self._match(replica, served, adapter_path)
            if match is None:
                files = ", ".join(entry.path for entry in served) or "none"
                raise InvalidAdapterError(
                    f"{replica.http.where} has no adapter {adapter_path} (it serves: {files}). llama-server "
                    f"loads adapters only at start: restart it with --lora {self._flag_path(adapter_path)} "
                    f"(and {_LORA_HINT}, so that adapters apply only to the requests that ask for them)",
                    provider=self.name,
                    path=adapter_path,
                )
            found = match.path
        assert found is not None
        self._matched[adapter_id] = found

    async def _unload_adapter(self, adapter_id: str) -> None:
        self._matched.pop(adapter_id, None)

    async def _list_adapters(self) -> list[str]:
        mapped = set(self._matched.values())
        ids = set(self._adapter_registry.ids())
        served = [entry for listed in await self._served_lists() for entry in listed]
        return sorted(ids | {entry.name for entry in served if entry.path not in mapped})

    async def _discover_adapter(self, adapter_id: str) -> str | None:
        """An adapter a replica has under the file name ``adapter_id`` (``math`` for ``math.gguf``)."""
        served = [entry for listed in await self._served_lists() for entry in listed]
        entry = next((entry for entry in served if entry.name == adapter_id), None)
        if entry is None:
            return None
        self._matched[adapter_id] = entry.path
        return entry.path

    async def _served_lists(self) -> list[list[ServedAdapter]]:
        """What each replica that answers lists, in the order of the base URLs (asked at once; see
        :meth:`~inference._servers.replicas.ReplicaSet.answers`): replicas restarted with other ``--lora`` files list
        other adapters.

        Raises:
            ProviderUnavailableError: No replica accepts connections.
            InferenceError: No replica answered, and one failed otherwise (a refused key, a list that is not one).
        """
        return await self._replicas.answers(self._read_served, "list its adapters")

    async def _read_served(
        self, replica: Replica, http: ServerClient | None = None, *, again: bool = True
    ) -> list[ServedAdapter]:
        """``GET /lora-adapters``, sent by ``http`` (by default the replica's pooled client).

        With ``http`` and ``again``, an answer that says the server closes the connection after it (``Connection:
        close``: a keep-alive limit) is asked again, so that the request that uses the list can go on the same
        connection.
        """
        operation = "list the server's LoRA adapters"
        http = http or replica.http
        response = await http.request("GET", f"{replica.root}/lora-adapters", operation=operation)
        if again and http is not replica.http and response.headers.get("connection", "").lower() == "close":
            response = await http.request("GET", f"{replica.root}/lora-adapters", operation=operation)
        body = http.parse_json(response, operation=operation)
        try:
            served = [ServedAdapter(index=_index(entry["id"]), path=entry["path"], name=_file_name(entry["path"]))
                      for entry in body]
            if len({entry.index for entry in served}) < len(served):  # an id names one file, or none can be chosen
                raise ValueError("an id listed twice")
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise replica.http.protocol_error(
                operation, f"an adapter list that is not llama-server's ({error!r})"
            ) from error
        return served

    async def _match(self, replica: Replica, served: list[ServedAdapter], adapter_path: str) -> ServedAdapter | None:
        """The served adapter that is ``adapter_path``: the same file, else the same bytes (a PEFT directory is
        converted first, for the server's base model)."""
        identity = path_identity(adapter_path)
        for entry in served:
            if path_identity(entry.path) == identity:
                return entry
        local: Path | None = Path(identity)
        if local is not None and local.is_dir():
            model_path = (await self._templates.props(replica)).get("model_path")
            if not isinstance(model_path, str) or not Path(model_path).is_file():
                return None  # the base model is not readable here: nothing to convert for
            cache = self._conversion_dir(adapter_path, self.adapter_cache_dir)
            local = await asyncio.to_thread(convert_peft_to_gguf_cached, local, model_path, cache)
        if local is None or not local.is_file():
            return None
        digest = await asyncio.to_thread(_content_digest, local)
        if digest is None:
            return None
        for entry in served:
            server_file = Path(entry.path)
            if server_file.is_file() and await asyncio.to_thread(_content_digest, server_file) == digest:
                return entry
        return None

    def _flag_path(self, adapter_path: str) -> str:
        path = Path(adapter_path)
        if path.is_dir():
            return f"<the GGUF of `inference convert-adapter {adapter_path} --base <the server's model>`>"
        return adapter_path


class _HeldEvents:
    """A stream's events, holding the connection they come on until the stream is closed; ``check`` runs after the
    last event (it raises to end the stream with an error instead)."""

    def __init__(self, events: Any, held: contextlib.AsyncExitStack, check: Callable[[], Awaitable[None]]) -> None:
        self._events = events
        self._held = held
        self._check = check

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._checked()

    async def _checked(self) -> AsyncIterator[Any]:
        async for event in self._events:
            yield event
        await self._events.aclose()  # the answer is read: its connection is free for the check's request
        await self._check()

    async def aclose(self) -> None:
        """Close the answer (the server stops generating), then give the connection back."""
        try:
            await self._events.aclose()
        finally:
            await self._held.aclose()


def _index(value: object) -> int:
    """An adapter's id in llama-server's list: a whole number from 0 (a float, a flag or text would be another id)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"adapter id {value!r:.50} is not an index")
    return value


def _file_name(path: str) -> str:
    name = Path(path).name
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


def _content_digest(path: Path) -> str | None:
    """What makes a GGUF LoRA file the adapter it is (:func:`~inference.adapters.gguf.lora_content_digest`), or
    ``None`` for a file that is no readable GGUF (it matches nothing)."""
    try:
        return lora_content_digest(path, provider="llamacpp-server")
    except (OSError, ValueError, KeyError, IndexError):
        return None
