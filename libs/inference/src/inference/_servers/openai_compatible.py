"""Generation over the OpenAI API, shared by the providers that talk to such servers.

:class:`OpenAICompatibleProvider` sends ``/v1/chat/completions`` requests (whole and streamed), or
``/v1/completions`` requests of plain text where its route choice says so (vLLM, for a model without a chat
template), as JSON over the pooled :class:`~inference._servers.http.ServerClient` (not through the ``openai``
client, whose request transforms and response models cost more than the rest of a call), spreads them over one or
more servers (replicas), skips a replica that refuses connections, answers 502/503/504 or did not answer within
the timeout, and maps every failure into the error tree.

A provider is assembled from parts, each with one job, set by its constructor; the generation path below asks each
part at its step, and a part left out is skipped:

- ``_replicas``: the servers, their order, asking them all (:mod:`~inference._servers.replicas`);
- ``_route_choice``: chat or completions, per replica (:mod:`~inference._servers.routes`);
- ``_limits``: what the server refuses, refused before sending; its context size (:mod:`~inference._servers.limits`);
- ``_lora``: runtime LoRA adapters across the replicas: fan-out, placement, healing, reconcile, discovery
  (:mod:`~inference._servers.served_adapters`, over :mod:`~inference._servers.runtime_lora`'s routes).

The wire format (request bodies, answer readers, server-sent events) is :mod:`inference._servers.openai_wire`. A
subclass gives its name, its settings (in :mod:`inference.registry`) and its parts: the vLLM provider all of them
(and :mod:`~inference._servers.prompt_scoring` for ``score``), the OpenAI provider a route choice only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from inference._core.dependencies import import_optional
from inference._core.redaction import redact_url
from inference._core.validation import GenerationRequest
from inference._servers.answer_reading import server_message
from inference._servers.context_overflow import context_overflow
from inference._servers.http import ErrorHandlers, ServerAnswer, ServerClient
from inference._servers.limits import ServerLimits
from inference._servers.openai_wire import (
    CHAT,
    COMPLETIONS,
    LOGPROB_READERS,
    OPENAI_OPTIONS,
    ChunkTally,
    ServerEvents,
    about_schema,
    generation_result,
    model_name,
    operation_of,
    quoted_model,
    reasoning_of,
    refuses_schema_type,
    request_arguments,
    response_format,
    returned_token_ids,
    token_counts,
    tool_calls_of,
)
from inference._servers.replicas import Replica, ReplicaDown, ReplicaLacks, ReplicaSet, unavailable_is_down
from inference._servers.routes import RouteChanged, RouteChoice
from inference._servers.served_adapters import ServedAdapters
from inference.exceptions import (
    InferenceError,
    InvalidRequestError,
    ProviderError,
    ServerAdapterNotFoundError,
    ServerModelNotFoundError,
    ServerResponseError,
)
from inference.options import OptionMap
from inference.provider import GenerationResult, InferenceProvider, StreamEvent
from inference.results import TokenLogprob

__all__ = ["OpenAICompatibleProvider"]


class OpenAICompatibleProvider(InferenceProvider):
    """Generates through ``/v1/chat/completions`` on one or more OpenAI-compatible servers.

    Subclasses set :attr:`name` (a provider type in :mod:`inference.registry`, whose settings must include
    ``base_url``, ``api_key``, ``timeout`` and ``max_retries``), :attr:`server_label` and :attr:`env_prefix`,
    call ``super().__init__(**arguments)`` with their constructor's arguments, then set the parts their server
    needs (see the module docstring).

    Sampling options the OpenAI API lacks (``top_k``, ``repetition_penalty``) are sent as extra body fields,
    only when set. Streams ask for a final usage chunk (``stream_options.include_usage``).

    Attributes:
        server_label: What the server is called in messages (``"vLLM"``).
        env_prefix: Prefix of the provider's environment variables (``"VLLM"``), for hints.
        model_hint: What to do when the server does not serve the model asked for.
        greedy_n: The server takes ``n > 1`` with temperature 0. vLLM refuses it ("n must be 1 when using greedy
            sampling"): its greedy choices are asked one request each (its prefix cache shares their prompt).
    """

    server_label: ClassVar[str] = "OpenAI-compatible server"
    env_prefix: ClassVar[str] = "OPENAI"
    options: ClassVar[OptionMap] = OPENAI_OPTIONS
    model_hint: ClassVar[str] = "use a model the server serves; GET /v1/models lists them"
    greedy_n: ClassVar[bool] = True

    def __init__(self, arguments: Mapping[str, Any] | None = None) -> None:
        super().__init__(arguments)
        settings = self._settings
        # Imported with the provider (never by ``import inference``), not at the first request.
        import_optional("httpx", provider=self.name)
        self.base_url: str = settings["base_url"]
        self._api_key: str | None = settings["api_key"]
        self._settings = {key: value for key, value in settings.items() if key != "api_key"}  # the key: once
        self._replicas = ReplicaSet(self, settings)
        self._logger = logging.getLogger(f"inference.{self.name}")
        # The parts (see the module docstring); a subclass replaces those its server has.
        self._route_choice = RouteChoice()
        self._limits: ServerLimits | None = None
        self._lora: ServedAdapters | None = None

    def __repr__(self) -> str:
        key = "***" if self._api_key else "None"
        adapters = f", adapters={sorted(self._adapter_registry.ids())}" if self.supports_adapters else ""
        return f"{type(self).__name__}(base_url={redact_url(self.base_url)!r}, api_key={key}{adapters})"

    @property
    def replicas(self) -> tuple[str, ...]:
        """The base URLs of the servers this provider uses, in configuration order."""
        return tuple(replica.base_url for replica in self._replicas)

    @property
    def timeout(self) -> float:
        """Seconds to wait for one answer."""
        return self._replicas[0].http.timeout

    @property
    def max_retries(self) -> int:
        """Retries of transient failures."""
        return self._replicas[0].http.max_retries

    async def aclose(self) -> None:
        """Close the pooled connections. The provider makes new ones if it is used again."""
        await self._replicas.aclose()

    # Generation -----------------------------------------------------------------------------------------

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        """One request: its answer's choices (``n`` of them, with the server's usage), the missing ones asked for
        one request each where the server answered fewer (:meth:`_more_choices`)."""
        if request.n > 1 and not self.greedy_n and request.temperature is not None and request.temperature < _GREEDY:
            return GenerationResult.from_choices(
                await self._more_choices(request, 0, f"{self.server_label} refuses n > 1 with greedy sampling")
            )
        async with self._chat(request, stream=False) as (replica, route, completion):
            if isinstance(completion, dict) and completion.get("error") and not completion.get("choices"):
                raise ProviderError(  # an error in a 200 answer (some gateways): the server's words, not a guess
                    f"{replica.http.where} answered {operation_of(request)} with an error: "
                    f"{server_message(completion)}. The server failed; its log says why",
                    provider=self.name,
                    url=replica.http.shown_url,
                )
            try:
                usage = completion.get("usage")
                # A server that reports no usage: the completion tokens are unknown too, so 0 as before, and
                # the prompt's tokens are None, as in a stream without usage.
                prompt_tokens: int | None
                prompt_tokens, completion_tokens = token_counts(usage) if usage is not None else (None, 0)
                answered_model = model_name(completion.get("model"), request)
                choices = sorted(completion["choices"], key=_choice_index)[: request.n]
                if not choices:
                    raise IndexError("no choices")
                alone = completion_tokens if len(choices) == 1 else None  # usage counts one choice's tokens
                results = [
                    self._choice(replica, request, route, choice, answered_model, prompt_tokens, alone,
                                 completion_tokens)
                    for choice in choices
                ]
            except (AttributeError, IndexError, KeyError, TypeError) as error:
                raise replica.http.protocol_error(
                    operation_of(request), f"an answer that is not a {route} completion ({error!r})"
                ) from error
        if request.n == 1:
            return results[0]
        if len(results) < request.n:
            more = await self._more_choices(
                request, len(results), f"{replica.http.where} answered {len(results)} of the {request.n} choices"
            )
            results += more
            completion_tokens += sum(result.completion_tokens for result in more)
        return GenerationResult.from_choices(results, usage=(prompt_tokens, completion_tokens))

    def _choice(
        self,
        replica: Replica,
        request: GenerationRequest,
        route: str,
        choice: Any,
        answered_model: str,
        prompt_tokens: int | None,
        tokens: int | None,
        all_tokens: int,
    ) -> GenerationResult:
        """One choice of an answer as a result. Its completion tokens are ``tokens`` (the usage of an answer of one
        choice), else as many as its ``token_ids`` (vLLM's, asked for with ``n``); else unknown: 0, and its
        ``token_count`` ``None`` (the server counts only the whole answer: ``all_tokens``)."""
        message = choice["message"] if route == CHAT else None
        if route == CHAT and not isinstance(message, Mapping):  # null is no answer, not an empty one
            raise TypeError(f"choices[{_choice_index(choice)}].message is {json.dumps(message)[:100]}, not an object")
        text = (message.get("content") if message is not None else choice.get("text")) or ""
        if not isinstance(text, str):
            raise TypeError(f"the answer's text is {type(text).__name__}, not text")
        ids = choice.get("token_ids")
        counted = tokens is None and ids is not None  # vLLM's, asked for with n
        token_ids = returned_token_ids(ids) if request.return_token_ids or counted else None
        if tokens is None and token_ids is not None:
            tokens = len(token_ids)
        logprobs = (
            self._logprobs(replica, request, LOGPROB_READERS[route](choice.get("logprobs"), request.logprobs),
                           all_tokens if tokens is None else tokens)
            if request.logprobs is not None
            else None
        )
        result = generation_result(
            request,
            text,
            answered_model,
            choice.get("finish_reason"),
            prompt_tokens,
            tokens or 0,
            logprobs,
            reasoning_of(message) if message is not None else "",
            tool_calls_of(message, request) if message is not None else [],
            token_ids,
        )
        return result if tokens is not None else dataclasses.replace(result, token_count=None)

    async def _more_choices(self, request: GenerationRequest, have: int, why: str) -> list[GenerationResult]:
        """The choices ``have`` to ``n - 1`` of a request, one request of one completion each, at once (seeds
        ``seed + have``..., as :class:`~inference.options.ByRequests` gives them): where the answer held only
        ``have`` (a server that ignores ``n``: llama_cpp.server, Ollama's ``/v1``), or the server refuses its ``n``
        (``why``)."""
        from inference._core.batches import all_or_none

        self._logger.debug("%s: asking for choices %d to %d one request each", why, have, request.n - 1)
        seeds = [None if request.seed is None else request.seed + index for index in range(have, request.n)]
        return await all_or_none([self._generate(dataclasses.replace(request, n=1, seed=seed)) for seed in seeds])

    def _logprobs(
        self, replica: Replica, request: GenerationRequest, entries: list[TokenLogprob], tokens: int, *,
        streamed: bool = False,
    ) -> list[TokenLogprob]:
        """The token logprobs of an answer; a server that sends none for generated tokens is refused."""
        if not entries and tokens > 0:
            raise replica.http.protocol_error(
                operation_of(request, streamed=streamed),
                "an answer without the token logprobs asked for (logprobs/top_logprobs): the server does not "
                "support them on chat completions; ask without logprobs, or use a server that has them (vLLM)",
            )
        return entries

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """Stream the chat completion, asking for a final usage chunk (``stream_options.include_usage``).

        A server that sends that chunk (vLLM, OpenAI) gives the counts :meth:`generate` gives. A server that
        ignores the option (llama_cpp.server) sends one chunk per generated token: the completion tokens are
        counted from those chunks, and the prompt tokens, which such a server does not report, are ``None``
        (so is ``token_count``).
        """
        operation = operation_of(request, streamed=True)
        async with self._chat(request, stream=True) as (replica, route, events):
            tally = ChunkTally(request, route)
            iterator = events.__aiter__()
            chunks = 0
            while True:
                try:
                    chunk = await iterator.__anext__()
                    chunks += 1
                except StopAsyncIteration:
                    break
                except InferenceError:
                    raise
                except Exception as error:
                    raise replica.http.error_from_exception(error, operation=operation) from error
                try:
                    piece = tally.add(chunk)
                except (AttributeError, IndexError, KeyError, TypeError) as error:
                    raise replica.http.protocol_error(
                        operation, f"a stream chunk that is not a {route} chunk ({error})"
                    ) from error
                if piece:
                    yield piece
            if tally.finish_reason is None and not chunks:  # llama_cpp.server's answer to a prompt over its context
                raise replica.http.protocol_error(
                    operation,
                    "an empty stream (a 200 with no event: a server that cannot start the answer may say why only "
                    "to generate, as llama_cpp.server does for a prompt longer than its context)",
                )
            if tally.finish_reason is None:
                raise replica.http.protocol_error(
                    operation,
                    "a stream that ended without a finish_reason (it was cut short, or is not an OpenAI "
                    "chat completion stream)",
                )
        completion_tokens = tally.tokens()[1]
        if request.logprobs is not None and not tally.logprobs and completion_tokens > 0:
            self._logprobs(replica, request, [], completion_tokens, streamed=True)  # raises: the server sent none
        yield tally.result()

    @asynccontextmanager
    async def _chat(self, request: GenerationRequest, *, stream: bool) -> AsyncIterator[tuple[Replica, str, Any]]:
        """Send the request to a replica on its route and hold it there until the caller is done with the answer.

        Replicas are tried least-busy first (round-robin among equals); one that cannot be reached or answers
        502/503/504 before the answer starts (marked down), or that cannot serve the request
        (:class:`~inference._servers.replicas.ReplicaLacks`), is skipped. One that does not answer within the
        timeout (or stops sending a stream) is marked down too, but the request is not sent elsewhere: the server
        may have run it; the caller gets the :class:`~inference.exceptions.ProviderTimeoutError`. A stream is closed
        on exit, which makes the server abort the generation.
        """
        failures: list[tuple[Replica, InferenceError]] = []
        lacking: list[InferenceError] = []  # what replicas that cannot serve the request said
        lora = self._lora
        ordered = self._replicas.in_order()
        for replica in ordered if lora is None else lora.order_for(request, ordered):
            replica.in_flight += 1
            if lora is not None:
                lora.started(replica, request)
            with replica.down_if_hung():  # it took the request and went silent: later ones go elsewhere
                try:
                    try:
                        if request.raw_prompt or request.prompt_token_ids is not None:
                            route = COMPLETIONS  # a raw prompt (text or token ids) goes there, whatever the api
                        else:
                            with unavailable_is_down():  # finding out may ask the replica (llama-server's /props)
                                route = await self._route_choice.route(replica, request)
                        arguments = self._arguments(replica, request, route, stream=stream)
                        try:
                            answer = await self._create(replica, request, arguments)
                        except ServerResponseError as refused:
                            other = self._route_choice.after_refusal(replica, route, refused)
                            if other is None:
                                raise
                            route = other
                            arguments = self._arguments(replica, request, route, stream=stream)
                            answer = await self._create(replica, request, arguments)
                        except RouteChanged as changed:
                            route = changed.route
                            arguments = self._arguments(replica, request, route, stream=stream)
                            answer = await self._create(replica, request, arguments)
                    except ReplicaDown as down:
                        replica.mark_down(down.error)
                        failures.append((replica, down.error))
                        continue
                    except ReplicaLacks as lacks:
                        lacking.append(lacks.error)
                        continue
                    replica.mark_up()
                    try:
                        yield replica, route, answer
                    finally:
                        if stream:
                            await answer.aclose()
                    return
                finally:
                    replica.in_flight -= 1
                    if lora is not None:
                        lora.finished(replica, request)
        if lacking:
            raise lacking[0]  # it says how to fix it; a replica also down is logged
        raise self._replicas.all_down(failures)

    def _arguments(self, replica: Replica, request: GenerationRequest, route: str, *, stream: bool) -> dict[str, Any]:
        """The JSON body of ``request`` on ``route`` for ``replica`` (its schema style; the adapter's name as the
        server takes it)."""
        arguments = request_arguments(
            request, route, stream=stream, schema_style=replica.schema_style, options=self.options,
            provider=self.name,
        )
        if self._lora is not None and request.adapter_id is not None:
            arguments["model"] = self._lora.model_for(request)
        return arguments

    async def _create(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """One request on ``replica``, within the server's limits, its adapter placed there first (the parts'); not
        sent to a replica found serving other weights under its adapter's name.

        The first refusal of ``max_tokens`` teaches the replica its ``max_model_len`` (vLLM's sentence
        ``max_tokens=N cannot be greater than max_model_len=M``); a default ``max_tokens`` is then sent again
        without it, an explicit one is an :class:`InvalidRequestError`.
        """
        limits = self._limits
        if limits is not None:
            limits.check(request)
            limits.fit(replica, request, arguments)
        if self._lora is not None:
            await self._lora.place_for(replica, request)
            await self._lora.refuse_other_weights(replica, request)
        try:
            return await self._create_healing(replica, request, arguments)
        except ServerResponseError as error:
            if limits is None or not limits.learned(replica, error):
                raise
            limits.fit(replica, request, arguments)
            return await self._create_healing(replica, request, arguments)

    async def _create_healing(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """One request on ``replica``; an adapter the replica lost is loaded again and the request retried once
        (self-healing, with runtime LoRA routes)."""
        try:
            return await self._create_structured(replica, request, arguments)
        except ServerAdapterNotFoundError as error:
            lost = error
            path = self._lora.lost_path(request) if self._lora is not None else None
            if path is None:
                raise
        assert self._lora is not None and request.adapter_id is not None  # a lost adapter implies one was asked for
        await self._lora.reload_lost(replica, request.adapter_id, path)
        try:
            return await self._call(replica, request, arguments, reloaded_from=path)
        except InferenceError as error:
            raise error from lost

    async def _create_structured(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """One request on ``replica``; a ``json_schema`` the server refuses is an invalid request.

        A server that refuses OpenAI's ``response_format`` type ``json_schema`` itself (llama_cpp.server: a 422
        or 500 naming the allowed types) is asked again with ``{"type": "json_object", "schema": ...}``, and the
        replica remembers it.

        Raises:
            ReplicaDown: The replica did not accept the connection, or answered 502/503/504 (another may take the
                request).
            InvalidRequestError: The server could not use the ``json_schema`` (a 400 or 422 about it).
            InferenceError: Any other failure, mapped by :meth:`_generation_handlers`.
        """
        try:
            return await self._send(replica, request, arguments)
        except ServerResponseError as error:
            if request.json_schema is None or error.status_code not in (400, 422, 500):
                raise
            refused = error
        # llama_cpp.server 0.3 answers 500 with pydantic's literal_error ("Input should be 'text' or 'json_object'")
        if replica.schema_style == "json_schema" and refuses_schema_type(str(refused)):
            replica.schema_style = "json_object"
            retry = {**arguments, "response_format": response_format(request.json_schema, "json_object")}
            try:
                return await self._send(replica, request, retry)
            except ServerResponseError as error:
                if error.status_code not in (400, 422):
                    raise
                refused = error
        if refused.status_code not in (400, 422) or not about_schema(str(refused)):
            raise refused
        raise InvalidRequestError(
            f"{replica.http.where} could not use the json_schema ({refused}): simplify the schema to what the "
            "server's structured-output backend supports (OpenAI's strict mode needs additionalProperties false "
            "and every property required)",
            provider=self.name,
        ) from refused

    async def _send(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """One chat request on ``replica``, as it is.

        Raises:
            ReplicaDown: The replica did not accept the connection, or answered 502/503/504 (another may take the
                request).
            InferenceError: Any other failure, mapped by :meth:`_generation_handlers`.
        """
        with unavailable_is_down():
            return await self._call(replica, request, arguments)

    async def _call(
        self,
        replica: Replica,
        request: GenerationRequest,
        arguments: dict[str, Any],
        *,
        reloaded_from: str | None = None,
        http: ServerClient | None = None,
    ) -> Any:
        """POST ``arguments`` to their route (``/completions`` when they carry a ``prompt``, else
        ``/chat/completions``): the parsed JSON answer, or for a stream an open :class:`ServerEvents`.

        ``http`` sends it (a :meth:`~ServerClient.one_connection` client); by default the replica's pooled client.

        Raises:
            InferenceError: The request failed, mapped by status with :meth:`_generation_handlers`.
        """
        http = http or replica.http
        url = replica.urls[COMPLETIONS if "prompt" in arguments else CHAT]
        operation = operation_of(request, streamed=bool(arguments.get("stream")))
        handlers = self._generation_handlers(request, reloaded_from)
        if arguments.get("stream"):
            return await ServerEvents.open(http, url, arguments, operation=operation, handlers=handlers)
        response = await http.request("POST", url, operation=operation, json_body=arguments, handlers=handlers)
        return http.parse_json(response, operation=operation)

    def _generation_handlers(self, request: GenerationRequest, reloaded_from: str | None) -> ErrorHandlers:
        def not_found(answer: ServerAnswer) -> ServerResponseError | None:
            return self._generation_not_found(answer, request, reloaded_from)

        def bad_request(answer: ServerAnswer) -> ServerResponseError | None:
            refused = context_overflow(answer) or self._route_choice.refusal(answer)
            if refused is None and self._lora is not None:
                refused = self._lora.refusal(answer)
            return refused

        return {404: not_found, 400: bad_request}

    def _generation_not_found(
        self, answer: ServerAnswer, request: GenerationRequest, reloaded_from: str | None
    ) -> ServerResponseError | None:
        """A 404 to a chat request: a missing route (wrong base URL), an adapter the server lacks, or a model it does
        not serve."""
        if self._lora is not None:
            lacks_adapter = self._lora.not_found(answer, request, reloaded_from)
            if lacks_adapter is not None:
                return lacks_adapter
        if answer.route_missing:
            return answer.error(
                ServerResponseError,
                f"{answer.where} has no route {answer.response.request.url.path}: set {self.env_prefix}_BASE_URL "
                "(or base_url) to the server's OpenAI-compatible base URL, which ends with /v1",
            )
        return answer.error(
            ServerModelNotFoundError,
            f"{answer.where} does not serve model {quoted_model(answer) or request.model!r} ({answer.message}): "
            f"{self.model_hint}",
        )


_GREEDY = 1e-5
"""A temperature below this is greedy sampling (vLLM's ``_SAMPLING_EPS``)."""


def _choice_index(choice: Any) -> int:
    """A choice's ``index`` (its place among the ``n``); a choice without one keeps its place (sorting is stable)."""
    index = choice.get("index") if isinstance(choice, Mapping) else None
    return index if isinstance(index, int) and not isinstance(index, bool) else 0
