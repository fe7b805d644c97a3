"""The vLLM provider: generation over the OpenAI-compatible API, LoRA adapters over vLLM's runtime routes.

One provider may front several vLLM servers (replicas): adapters are loaded on every replica (all or
nothing), generations are spread across them and skip a replica that does not accept connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inference._core.lifecycle import Discovered, parse_versioned_name
from inference._core.redaction import redact_url
from inference._core.scoring import ScoreTokens, Vocabulary, rolling_windows, score_tokens, too_long
from inference._core.validation import GenerationRequest, ScoreRequest
from inference._servers.http import ErrorHandlers, ServerAnswer, is_connect_failure
from inference._servers.openai_compatible import (
    CHAT,
    COMPLETIONS,
    DOWN_SECONDS,
    OpenAICompatibleProvider,
    Replica,
    ReplicaDown,
    quoted_model,
)
from inference._servers.placement import AdapterPlacement
from inference.adapters.peft import read_peft_adapter
from inference.adapters.source import AdapterSource
from inference.exceptions import (
    ConfigurationError,
    InferenceError,
    InvalidAdapterError,
    InvalidRequestError,
    ProviderUnavailableError,
    RuntimeLoRADisabledError,
    ServerAdapterAlreadyLoadedError,
    ServerAdapterNotFoundError,
    ServerInvalidAdapterError,
    ServerModelNotFoundError,
    ServerResponseError,
)
from inference.options import GenerationOptions
from inference.results import ScoreResult

__all__ = ["ReconcileReport", "ReplicaReconciliation", "VLLMProvider"]

logger = logging.getLogger("inference.vllm")

_RUNTIME_LORA_HINT = "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"

DEFAULT_MAX_TOKENS: int = GenerationOptions().max_tokens
"""``generate``'s default ``max_tokens``; left at it, the server's context decides."""

MAX_TEMPERATURE = 2.0
"""vLLM's largest temperature (``temperature must be in [0, 2]``)."""

_MAX_TOKENS_REFUSED = re.compile(r"cannot be greater than max_model_len=(\d+)")
"""vLLM's 400 for a ``max_tokens`` beyond its context: ``max_tokens=4096 cannot be greater than max_model_len=512``."""

_NO_CHAT_TEMPLATE = "chat template"
"""In vLLM's 400 for chat on a model without one: ``As of transformers v4.44, default chat template is no longer
allowed, so you must provide a chat template if the tokenizer does not define one.``"""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's ``--max-lora-rank`` accepts."""


@dataclass(frozen=True)
class ReplicaReconciliation:
    """What :meth:`VLLMProvider.reconcile_adapters` found and did on one replica.

    Attributes:
        base_url: The replica's base URL (credentials in it hidden).
        reloaded: Adapters the provider had loaded that the server had lost, loaded again.
        failed: Adapters the server had lost that could not be loaded again (the log says why).
        unexpected: LoRA adapters the server serves that this provider did not load (``--lora-modules``,
            a resolver plugin, another client); left alone.
        error: Why the replica could not be reconciled (e.g. it is down), else ``None``.
    """

    base_url: str
    reloaded: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class ReconcileReport:
    """The outcome of :meth:`VLLMProvider.reconcile_adapters`, one entry per replica.

    Attributes:
        replicas: One :class:`ReplicaReconciliation` per replica, in configuration order.
    """

    replicas: tuple[ReplicaReconciliation, ...]

    @property
    def reloaded(self) -> list[str]:
        """Adapters reloaded on at least one replica, sorted."""
        return sorted({adapter_id for replica in self.replicas for adapter_id in replica.reloaded})

    @property
    def unexpected(self) -> list[str]:
        """Adapters some replica serves that this provider did not load, sorted."""
        return sorted({adapter_id for replica in self.replicas for adapter_id in replica.unexpected})

    @property
    def ok(self) -> bool:
        """True when every replica answered and holds every adapter the provider loaded."""
        return all(replica.error is None and not replica.failed for replica in self.replicas)


def _adapter_id(served_name: str) -> str:
    """The adapter id a served LoRA name stands for: ``a0@3`` (a replaced id's weights) is ``a0``."""
    parsed = parse_versioned_name(served_name)
    return served_name if parsed is None else parsed[0]


class VLLMProvider(OpenAICompatibleProvider):
    """Generates through one or more vLLM servers and loads LoRA adapters into them at run time.

    Generation uses the OpenAI-compatible ``/v1/chat/completions`` route, as JSON over a pooled ``httpx`` client
    (the path it shares with :class:`~inference.openai_provider.OpenAIProvider`); an adapter is chosen by
    sending its id as the ``model``. A model without a chat template (a base model) cannot chat on vLLM, so with
    ``api="auto"`` (the default) the provider asks each server once, before its first generation, whether its
    model has one (``POST /tokenize`` of a chat message, which generates nothing) and sends generations for a
    model without one to ``/v1/completions`` as plain text: the prompt, or the system prompt, a blank line and the
    prompt, or a message list's contents separated by blank lines (what the in-process providers do for such a
    model). ``api="chat"`` or ``"completions"`` chooses the route for every request.

    ``load_adapter``/``unload_adapter`` call vLLM's runtime routes, which exist only when the server runs with
    ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``. An adapter directory that exists on this
    machine is checked before it is sent (PEFT LoRA, no DoRA, no bias, rank at most ``max_lora_rank``); another
    path is sent as it is (the server may see another filesystem, or take it as a Hugging Face Hub repo id).

    Self-healing: when a server answers that it does not know an adapter this provider loaded (it was
    restarted), the provider loads it again from the remembered path on that server and retries the
    request once. :meth:`reconcile_adapters` does the same for every adapter at once.

    Replicas: give several base URLs (a list, or comma-separated) to spread generations over several
    independent vLLM servers serving the same model. Adapter loads and unloads go to every replica; a
    load that fails on one is undone on the others.

    Scores and structure: a message list is sent as the chat ``messages``; ``logprobs=k`` asks for OpenAI's
    ``logprobs: true, top_logprobs: k`` (each generated token's logprob, before sampling settings); ``json_schema``
    is sent as ``response_format: {"type": "json_schema", ...}`` (vLLM compiles it with its structured-output
    backend; a schema it refuses is an :class:`~inference.exceptions.InvalidRequestError`). :meth:`score` and
    :meth:`score_rolling` tokenize with the server's ``POST /tokenize`` (the rule of
    :mod:`inference._core.scoring`) and read the scored tokens' ``prompt_logprobs`` (logprob and rank) from one
    ``/v1/completions`` request of token ids per sequence. The EOS token that starts an empty context on a
    model without BOS comes from ``GET /tokenizer_info``, which vLLM serves only with
    ``--enable-tokenizer-info-endpoint``. Trap: vLLM computes prompt logprobs without a LoRA's ``lm_head``
    delta (vllm#51594), so adapters that train ``lm_head`` score as if it were untrained.

    Adapters live on the servers, so they outlive this object: ``list_adapters`` reads ``GET /v1/models``
    (the LoRA entries, those with a ``parent``) on every replica and merges them with what this object
    loaded, and an adapter a server lists can be used and unloaded by id from any new provider.

    Args:
        base_url: The server's OpenAI-compatible base URL, ending with ``/v1``, or several (a list or a
            comma-separated string); else ``VLLM_BASE_URL``; else ``http://localhost:8100/v1``.
        api_key: Key the servers were started with (``--api-key``); else ``VLLM_API_KEY``. Never shown.
        timeout: Seconds to wait for one answer; else ``VLLM_TIMEOUT``; else 120.
        max_retries: Retries of connect errors and 429/502/503/504; else ``VLLM_MAX_RETRIES``; else 2.
        max_lora_rank: Largest adapter rank accepted before sending (match the servers'
            ``--max-lora-rank``); else ``VLLM_MAX_LORA_RANK``; else 16.
        adapter_dir: A directory this process writes and every server reads at the same path (a shared volume),
            where adapters given as :class:`~inference.AdapterWeights` are written for the servers to load; else
            ``VLLM_ADAPTER_DIR``; without one, ``load_adapter`` of weights in memory raises
            :class:`~inference.exceptions.ConfigurationError` saying what to set.
        api: The route of generations: ``"auto"``, ``"chat"`` or ``"completions"`` (see above); else ``VLLM_API``;
            else ``"auto"``.

    Example:
        >>> provider = VLLMProvider(base_url="http://127.0.0.1:8100/v1", api_key="secret")
        >>> provider
        VLLMProvider(base_url='http://127.0.0.1:8100/v1', api_key=***, adapters=[])
    """

    name = "vllm"
    server_label = "vLLM"
    env_prefix = "VLLM"
    model_hint = (
        "use the name the server was started with (--served-model-name, or the --model path); GET /v1/models lists it"
    )
    supports_adapters = True
    hot_swaps_adapters = True
    batches_mixed_adapters = True
    supports_scoring = True

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        max_lora_rank: int | None = None,
        adapter_dir: str | None = None,
        api: str | None = None,
        adapter_placement: str | None = None,
        max_loras: int | None = None,
        spread_after: int | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            max_lora_rank=max_lora_rank,
            adapter_dir=adapter_dir,
            api=api,
            adapter_placement=adapter_placement,
            max_loras=max_loras,
            spread_after=spread_after,
        )
        self.max_lora_rank: int = self._settings["max_lora_rank"]
        self.adapter_dir: str | None = self._settings["adapter_dir"]
        self.api: str = self._settings["api"]
        self.adapter_placement: str = self._settings["adapter_placement"]
        self.placement: AdapterPlacement | None = None
        """Which replica holds which adapter (``adapter_placement="on-demand"``); ``None`` with ``"all"``."""
        if self.adapter_placement == "on-demand":
            settings = self._settings
            self.placement = AdapterPlacement(self._replicas, settings["max_loras"], settings["spread_after"])
        self._placing: dict[str, asyncio.Lock] = {}  # replica URL -> one placement change at a time there

    def __repr__(self) -> str:
        key = "***" if self._api_key else "None"
        adapters = sorted(self._adapter_registry.ids())
        return f"VLLMProvider(base_url={redact_url(self.base_url)!r}, api_key={key}, adapters={adapters})"

    # Generation: the shared OpenAI-compatible path, plus self-healing and vLLM's adapter errors ----------

    async def _create(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """One chat request on ``replica``, within the server's limits (:meth:`_fit_max_tokens`).

        The first refusal of ``max_tokens`` teaches the replica its ``max_model_len`` (from vLLM's sentence
        ``max_tokens=N cannot be greater than max_model_len=M``); a default ``max_tokens`` is then sent again
        without it, an explicit one is an :class:`InvalidRequestError`.
        """
        self._check_ranges(request)
        self._fit_max_tokens(replica, request, arguments)
        adapter_id = request.adapter_id
        if self.placement is not None and adapter_id is not None and not self.placement.holds(replica, adapter_id):
            path = self._adapter_path(adapter_id)
            if path is not None:  # placed here now (its holders are busy or down); else vLLM says it lacks it
                await self._place_on(replica, adapter_id, path)
        try:
            return await self._create_healing(replica, request, arguments)
        except ServerResponseError as error:
            refused = _MAX_TOKENS_REFUSED.search(str(error)) if error.status_code == 400 else None
            if refused is None:
                raise
            replica.max_model_len = int(refused.group(1))
            self._fit_max_tokens(replica, request, arguments)
            return await self._create_healing(replica, request, arguments)

    async def _create_healing(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """One chat request on ``replica``; reloads a lost adapter and retries once (self-healing)."""
        try:
            return await super()._create(replica, request, arguments)
        except ServerAdapterNotFoundError as lost:
            path = self._adapter_path(request.adapter_id) if request.adapter_id else None
            if path is None:
                raise
            first = lost
        assert request.adapter_id is not None  # a lost adapter implies one was asked for
        logger.warning(
            "%s lost adapter %r (restarted?); loading it again from %s", replica.http.where, request.adapter_id, path
        )
        started = time.perf_counter()
        try:
            await self._load_on(replica, request.adapter_id, path, healing=True)
        except Exception:
            self._adapter_registry.note_reload(request.adapter_id, (time.perf_counter() - started) * 1000, ok=False)
            raise
        self._adapter_registry.note_reload(request.adapter_id, (time.perf_counter() - started) * 1000)
        try:
            return await self._call(replica, request, arguments, reloaded_from=path)
        except InferenceError as error:
            raise error from first

    def _generation_handlers(self, request: GenerationRequest, reloaded_from: str | None) -> ErrorHandlers:
        return {**super()._generation_handlers(request, reloaded_from), 400: _bad_generation}

    def _adapter_weights_dir(self) -> str | None:
        """``adapter_dir``: the servers read adapters from their own filesystem, so weights from memory must be
        written where they can read them.

        Raises:
            ConfigurationError: No ``adapter_dir`` (``VLLM_ADAPTER_DIR``) is set.
        """
        if self.adapter_dir is None:
            raise ConfigurationError(
                "adapters given as AdapterWeights must be written where the vLLM servers can read them: set "
                "VLLM_ADAPTER_DIR (or adapter_dir=) to a directory this process writes and every server reads at the "
                "same path (a shared volume), or save the adapter yourself and pass its path",
                provider=self.name,
            )
        return self.adapter_dir

    async def _route(self, replica: Replica, request: GenerationRequest) -> str:
        """The ``api`` setting; for ``"auto"``, what the replica's model needs, found out once per replica."""
        if self.api != "auto":
            return self.api
        probe = replica.route
        if probe is None:
            probe = replica.route = asyncio.ensure_future(self._find_route(replica))
        try:
            return await asyncio.shield(probe)
        except BaseException:
            if probe.done() and replica.route is probe:
                replica.route = None  # not found out (server down, a timeout): ask again next time
            raise

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
            if error.status_code == 400 and _NO_CHAT_TEMPLATE in str(error):
                logger.info(
                    "%s: the model has no chat template; generating through /v1/completions", replica.http.where
                )
                return COMPLETIONS
            if error.status_code == 404:
                return CHAT
            raise
        except InferenceError as error:
            if is_connect_failure(error):
                raise ReplicaDown(error) from error
            raise
        return CHAT

    def _generation_not_found(
        self, answer: ServerAnswer, request: GenerationRequest, reloaded_from: str | None
    ) -> ServerResponseError | None:
        named = quoted_model(answer)
        if answer.route_missing or request.adapter_id is None or named not in (None, request.adapter_id):
            return super()._generation_not_found(answer, request, reloaded_from)
        if reloaded_from is not None:
            sentence = (
                f"{answer.where} still has no adapter {request.adapter_id!r} after it was loaded again from "
                f"{reloaded_from!r} ({answer.message}): check the server's log; unload_adapter and "
                "load_adapter it again, or call reconcile_adapters()"
            )
        else:
            sentence = (
                f"{answer.where} has no adapter {request.adapter_id!r} ({answer.message}): load it with "
                f"load_adapter({request.adapter_id!r}, path) first, or start vLLM with "
                f"--lora-modules {request.adapter_id}=<path>"
            )
        return answer.error(ServerAdapterNotFoundError, sentence)

    # Scoring: /tokenize, then prompt logprobs from /v1/completions ------------------------------------------

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        """Score the continuation with the prompt logprobs of one ``/v1/completions`` request.

        The tokens follow :mod:`inference._core.scoring`'s rule, with the server's tokenizer (``/tokenize``);
        the whole sequence is sent as token ids with ``prompt_logprobs``, and the scored positions' logprobs
        and ranks are read back.
        """
        replica = self._scoring_replica()
        info = await self._tokenizer_info(replica, request.model)
        context = request.context
        stripped = context.rstrip()
        texts = {stripped, context + request.continuation} if stripped else {context + request.continuation}
        encoded = {text: await self._tokenize(replica, request.model, text, special=False) for text in texts}
        vocabulary = Vocabulary(
            encode=lambda text: encoded[text], adds_bos=info.adds_bos, bos_id=info.bos_id, eos_id=info.eos_id
        )
        sequence = score_tokens(vocabulary, request.context, request.continuation, provider=self.name)
        # vLLM reads every token sent (the last one's logprob comes from the one before) and generates one more.
        if len(sequence.tokens) + 1 > info.max_length:
            raise too_long(
                len(sequence.tokens) - 1, info.max_length - 2, provider=self.name, setting="vLLM's --max-model-len"
            )
        logprob, greedy, model = await self._prompt_logprobs(replica, request, sequence)
        return ScoreResult(
            logprob=logprob,
            num_tokens=len(sequence.scored),
            is_greedy=greedy,
            model=model,
            adapter_id=request.adapter_id,
        )

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        """Score the whole text in windows that fit the server's context: each window is sent with one token
        before its scored tokens, and vLLM generates one token more, so ``max_model_len - 2`` tokens are scored
        per window."""
        replica = self._scoring_replica()
        info = await self._tokenizer_info(replica, request.model)
        tokens = await self._tokenize(replica, request.model, request.continuation, special=False)
        vocabulary = Vocabulary(
            encode=lambda text: tokens, adds_bos=info.adds_bos, bos_id=info.bos_id, eos_id=info.eos_id
        )
        windows = rolling_windows(vocabulary, request.continuation, info.max_length - 2, provider=self.name)
        total, greedy, model = 0.0, True, request.adapter_id or request.model
        for window in windows:
            logprob, window_greedy, model = await self._prompt_logprobs(replica, request, window)
            total += logprob
            greedy = greedy and window_greedy
        count = sum(len(window.scored) for window in windows)  # a start token written in the text is not scored
        return ScoreResult(
            logprob=total, num_tokens=count, is_greedy=greedy, model=model, adapter_id=request.adapter_id
        )

    def _scoring_replica(self) -> Replica:
        """The replica that scores: the least busy one that is up (all replicas serve the same model)."""
        return self._replicas_in_order()[0]

    def _fit_max_tokens(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> None:
        """Keep ``max_tokens`` within the replica's context, once it is known (``replica.max_model_len``).

        vLLM refuses a ``max_tokens`` above its ``max_model_len`` with a 400. Left at its default (4096; the same
        value given explicitly counts as the default), ``max_tokens`` is not sent, and vLLM generates up to the
        end of its context; asked for explicitly, it is an :class:`InvalidRequestError` naming the limit.
        """
        limit = replica.max_model_len
        if limit is None or request.max_tokens <= limit:
            return
        if request.max_tokens == DEFAULT_MAX_TOKENS:
            arguments.pop("max_tokens", None)
            return
        raise InvalidRequestError(
            f"max_tokens={request.max_tokens} is more than {replica.http.where}'s context of {limit} tokens "
            f"(its max_model_len): ask for at most {limit}",
            provider=self.name,
        )

    def _check_ranges(self, request: GenerationRequest) -> None:
        """What vLLM refuses with a 400, refused before sending: temperature outside [0, 2], a seed beyond int64."""
        if request.temperature is not None and request.temperature > MAX_TEMPERATURE:
            raise InvalidRequestError(
                f"temperature must be in [0, {MAX_TEMPERATURE:g}] on vLLM, got {request.temperature:g}",
                provider=self.name,
            )
        if request.seed is not None and not -(2**63) <= request.seed < 2**63:
            raise InvalidRequestError(
                f"seed must fit in a signed 64-bit integer on vLLM, got {request.seed}", provider=self.name
            )

    async def _tokenize(self, replica: Replica, model: str, text: str, *, special: bool) -> list[int]:
        """``POST /tokenize`` (vLLM's own route, at the server root): the token ids of ``text``."""
        operation = "tokenize text for scoring"
        response = await replica.http.request(
            "POST",
            f"{replica.root}/tokenize",
            operation=operation,
            json_body={"model": model, "prompt": text, "add_special_tokens": special},
            handlers=self._scoring_handlers(model),
        )
        body = replica.http.parse_json(response, operation=operation)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise replica.http.protocol_error(operation, f"an answer that is not a token list: {body!r:.200}")
        if isinstance(body.get("max_model_len"), int):
            replica.max_model_len = body["max_model_len"]
        return tokens

    async def _tokenizer_info(self, replica: Replica, model: str) -> _TokenizerInfo:
        """What the scoring rule needs of the server's tokenizer, found once per replica and model.

        ``adds_bos``/``bos_id``: ``"x"`` tokenized with and without special tokens (the extra first token is
        BOS). ``eos_id`` (and a BOS the tokenizer does not add): from ``GET /tokenizer_info``, which exists only
        when vLLM runs with ``--enable-tokenizer-info-endpoint``; else ``None``.
        """
        cached: _TokenizerInfo | None = replica.tokenizers.get(model)
        if cached is not None:
            return cached
        plain = await self._tokenize(replica, model, "x", special=False)
        special = await self._tokenize(replica, model, "x", special=True)
        adds_bos = len(special) == len(plain) + 1 and special[1:] == plain
        bos_id = special[0] if adds_bos else None
        eos_id = None
        config = await self._tokenizer_config(replica)
        for name in ("bos_token", "eos_token"):
            value = config.get(name)
            text = value.get("content") if isinstance(value, dict) else value
            if isinstance(text, str) and text:
                ids = await self._tokenize(replica, model, text, special=False)
                if len(ids) == 1:
                    if name == "eos_token":
                        eos_id = ids[0]
                    elif bos_id is None:
                        bos_id = ids[0]
        info = _TokenizerInfo(adds_bos, bos_id, eos_id, replica.max_model_len or 0)
        if info.max_length < 3:
            raise replica.http.protocol_error("tokenize text for scoring", "a /tokenize answer without max_model_len")
        replica.tokenizers[model] = info
        return info

    async def _tokenizer_config(self, replica: Replica) -> dict[str, Any]:
        """``GET /tokenizer_info`` (``--enable-tokenizer-info-endpoint``), or ``{}`` where the route is off."""
        operation = "read the tokenizer's special tokens"
        try:
            response = await replica.http.request("GET", f"{replica.root}/tokenizer_info", operation=operation)
        except ServerResponseError as error:
            if error.status_code == 404:
                return {}
            raise
        body = replica.http.parse_json(response, operation=operation)
        return body if isinstance(body, dict) else {}

    async def _prompt_logprobs(
        self, replica: Replica, request: ScoreRequest, sequence: ScoreTokens
    ) -> tuple[float, bool, str]:
        """``(sum of logprobs, all greedy, model)`` of ``sequence.scored``, from vLLM's ``prompt_logprobs``.

        ``prompt_logprobs[i]`` (``None`` for the first token) maps token ids (as strings) to ``{"logprob",
        "rank", "decoded_token"}`` for the prompt's token ``i`` given the tokens before it; rank 1 is greedy.
        """
        model = request.adapter_id or request.model
        operation = f"score with {'adapter' if request.adapter_id else 'model'} {model!r}"
        response = await replica.http.request(
            "POST",
            f"{replica.root}/v1/completions",
            operation=operation,
            json_body={
                "model": model,
                "prompt": list(sequence.tokens),
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 1,
                "add_special_tokens": False,
            },
            handlers=self._scoring_handlers(model, request.adapter_id),
        )
        body = replica.http.parse_json(response, operation=operation)
        try:
            positions = body["choices"][0]["prompt_logprobs"]
            total, greedy = 0.0, True
            for index in range(sequence.start, len(sequence.tokens)):
                entry = positions[index][str(sequence.tokens[index])]
                logprob, rank = entry["logprob"], entry.get("rank")
                if not isinstance(logprob, (int, float)) or isinstance(logprob, bool):
                    raise TypeError(f"logprob {logprob!r} is not a number")
                total += float(logprob)
                greedy = greedy and rank == 1
            answered = body.get("model") or model
        except (KeyError, IndexError, TypeError) as error:
            raise replica.http.protocol_error(
                operation, f"an answer without the prompt_logprobs of every scored token ({error!r})"
            ) from error
        return total, greedy, str(answered)

    def _scoring_handlers(self, model: str, adapter_id: str | None = None) -> ErrorHandlers:
        def not_found(answer: ServerAnswer) -> ServerResponseError:
            if answer.route_missing:
                return answer.error(
                    ServerResponseError,
                    f"{answer.where} has no route {answer.response.request.url.path}: scoring needs a vLLM server "
                    "(its /tokenize and /v1/completions routes); set VLLM_BASE_URL (or base_url) to it",
                )
            if adapter_id is not None:
                return answer.error(
                    ServerAdapterNotFoundError,
                    f"{answer.where} has no adapter {adapter_id!r} ({answer.message}): load it with "
                    f"load_adapter({adapter_id!r}, path) first",
                )
            return answer.error(
                ServerModelNotFoundError,
                f"{answer.where} does not serve model {model!r} ({answer.message}): {self.model_hint}",
            )

        return {404: not_found, 400: _resolver_could_not_load}

    # Adapters -------------------------------------------------------------------------------------------

    def _adapter_path_argument(self, adapter_path: object) -> str:
        """The path as the servers receive it: one that exists here is sent absolute.

        vLLM would resolve a relative path against its own working directory, or take it for a Hugging Face
        Hub repo id.
        """
        path = super()._adapter_path_argument(adapter_path)
        if not os.path.isabs(path) and os.path.exists(path):
            return os.path.abspath(path)
        return path

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        self._check_local_adapter(adapter_path)
        if self.placement is not None:
            await self._load_on_demand(adapter_id, adapter_path)
            return
        outcomes = await asyncio.gather(
            *(self._load_on(replica, adapter_id, adapter_path) for replica in self._replicas),
            return_exceptions=True,
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if not failures:
            return
        loaded = [replica for replica, outcome in zip(self._replicas, outcomes, strict=True) if outcome is None]
        if loaded:
            logger.warning(
                "loading adapter %r failed on %d of %d vLLM replicas; unloading it from the others",
                adapter_id,
                len(failures),
                len(self._replicas),
            )
            await self._roll_back(loaded, adapter_id)
        raise failures[0]

    # On-demand placement (adapter_placement="on-demand"; the rules are in inference._servers.placement) -------

    async def _load_on_demand(self, adapter_id: str, adapter_path: str) -> None:
        """Load a new adapter on one replica: the one placement picks, or the next when it cannot be reached."""
        assert self.placement is not None
        failures: list[tuple[Replica, InferenceError]] = []
        for candidate in self.placement.ranked_for_load():
            replica = next(replica for replica in self._replicas if replica is candidate)
            try:
                await self._place_on(replica, adapter_id, adapter_path)
                return
            except ReplicaDown as down:
                replica.down_until = time.monotonic() + DOWN_SECONDS
                failures.append((replica, down.error))
        raise self._all_down(failures)

    async def _place_on(self, replica: Replica, adapter_id: str, adapter_path: str) -> None:
        """Load ``adapter_id`` on ``replica``, first unloading there the adapter placement says makes room.

        Raises:
            ReplicaDown: The replica did not accept the connection.
        """
        placement = self.placement
        assert placement is not None
        async with self._placing.setdefault(replica.base_url, asyncio.Lock()):
            if placement.holds(replica, adapter_id):
                return  # another request placed it meanwhile
            try:
                evicted = placement.to_evict(replica)
            except LookupError:
                evicted = None  # every adapter there is in use: go over capacity rather than fail the request
                logger.warning("%s is full and every adapter on it is in use; loading %r beyond max_loras",
                               replica.http.where, adapter_id)
            try:
                if evicted is not None:
                    await self._unload_on(replica, evicted)
                    placement.removed(evicted, replica)
                    logger.info("%s: unloaded adapter %r to make room for %r", replica.http.where, evicted, adapter_id)
                await self._load_on(replica, adapter_id, adapter_path)
            except ProviderUnavailableError as error:
                raise ReplicaDown(error) from error
            placement.placed(replica, adapter_id)

    def _replicas_for(self, request: GenerationRequest) -> list[Replica]:
        ordered = self._replicas_in_order()
        if self.placement is None or request.adapter_id is None:
            return ordered
        chosen = self.placement.order_for(request.adapter_id, ordered)
        return [replica for candidate in chosen for replica in ordered if replica is candidate]

    def _started_on(self, replica: Replica, request: GenerationRequest) -> None:
        if self.placement is not None and request.adapter_id is not None:
            self.placement.started(replica, request.adapter_id)

    def _finished_on(self, replica: Replica, request: GenerationRequest) -> None:
        if self.placement is not None and request.adapter_id is not None:
            self.placement.finished(replica, request.adapter_id)

    async def _roll_back(self, replicas: list[Replica], adapter_id: str) -> None:
        outcomes = await asyncio.gather(
            *(self._unload_on(replica, adapter_id) for replica in replicas), return_exceptions=True
        )
        for replica, outcome in zip(replicas, outcomes, strict=True):
            if isinstance(outcome, Exception):
                logger.error(
                    "could not unload adapter %r from %s after a failed load elsewhere (%s): unload it by hand",
                    adapter_id,
                    replica.base_url,
                    outcome,
                )

    def _check_local_adapter(self, adapter_path: str) -> None:
        """Refuse, before sending, an adapter directory on this machine that vLLM would refuse."""
        if not os.path.exists(adapter_path):
            return  # the server may see another filesystem, or take it as a Hub repo id
        adapter = read_peft_adapter(adapter_path, provider=self.name)
        if adapter.rank <= self.max_lora_rank:
            return
        fitting = [rank for rank in VLLM_LORA_RANKS if rank >= adapter.rank]
        if not fitting:
            advice = f"vLLM serves ranks up to {VLLM_LORA_RANKS[-1]}: train the adapter with a smaller rank"
        else:
            advice = (
                f"start vLLM with --max-lora-rank {fitting[0]} (or more; it accepts "
                f"{', '.join(map(str, VLLM_LORA_RANKS))}) and set VLLM_MAX_LORA_RANK={fitting[0]} "
                f"(or max_lora_rank={fitting[0]})"
            )
        raise InvalidAdapterError(
            f"adapter at {adapter_path} has rank {adapter.rank}, above max_lora_rank {self.max_lora_rank}: {advice}",
            provider=self.name,
            path=adapter_path,
        )

    async def _load_on(self, replica: Replica, adapter_id: str, adapter_path: str, *, healing: bool = False) -> None:
        self._adapter_registry.refuse_changed(adapter_id)  # a heal, a placement or a reconcile: the same weights
        def not_found(answer: ServerAnswer) -> ServerResponseError:
            if answer.route_missing:
                return _runtime_lora_disabled(answer)
            return answer.error(
                ServerInvalidAdapterError,
                f"{answer.where} found no adapter at {adapter_path!r} ({answer.message}): the path must exist "
                "on the vLLM server's machine and hold adapter_config.json and the adapter weights "
                "(a path that does not exist there is tried as a Hugging Face Hub repo id)",
                path=adapter_path,
            )

        def bad_request(answer: ServerAnswer) -> ServerResponseError | None:
            if "conflicts with a served base model" in answer.message:
                return answer.error(
                    ServerResponseError,
                    f"{answer.where} serves its base model as {adapter_id!r} ({answer.message}): load the adapter "
                    "under another id",
                    path=adapter_path,
                )
            if "already" in answer.message.lower():
                return answer.error(
                    ServerAdapterAlreadyLoadedError,
                    f"{answer.where} already has an adapter named {adapter_id!r} ({answer.message}): "
                    "unload it first or choose another id",
                    path=adapter_path,
                )
            return None

        def server_error(answer: ServerAnswer) -> ServerResponseError:
            if "max_lora_rank" in answer.message:
                advice = (
                    "restart vLLM with a --max-lora-rank at least the adapter's rank "
                    f"(one of {', '.join(map(str, VLLM_LORA_RANKS))}; the default is 16)"
                )
            else:
                advice = (
                    "vLLM refuses adapters whose rank exceeds --max-lora-rank, DoRA adapters, bias other than "
                    "'none' and unsupported modules_to_save; its log says which"
                )
            return answer.error(
                ServerInvalidAdapterError,
                f"{answer.where} could not load adapter {adapter_id!r} from {adapter_path!r} "
                f"({answer.message}): {advice}",
                path=adapter_path,
            )

        try:
            await replica.http.request(
                "POST",
                f"{replica.root}/v1/load_lora_adapter",
                operation=f"load adapter {adapter_id!r}",
                json_body={"lora_name": adapter_id, "lora_path": adapter_path},
                handlers={400: bad_request, 404: not_found, 500: server_error},
            )
        except ServerAdapterAlreadyLoadedError:
            if healing:
                return  # another request reloaded it first: the server has it again, which is what healing wants
            # A retried POST (after a 504 from a proxy, say) finds the load it already made: when the server
            # serves this very name from this very path, the load succeeded.
            with contextlib.suppress(InferenceError):
                if (await self._served_adapters(replica)).get(adapter_id) == adapter_path:
                    return
            raise

    async def _unload_adapter(self, adapter_id: str) -> None:
        replicas = list(self._replicas)
        if self.placement is not None:
            replicas = [replica for replica in self._replicas if self.placement.holds(replica, adapter_id)]
        outcomes = await asyncio.gather(
            *(self._unload_on(replica, adapter_id) for replica in replicas), return_exceptions=True
        )
        if self.placement is not None:
            for index, (replica, outcome) in enumerate(zip(replicas, outcomes, strict=True)):
                if isinstance(outcome, ProviderUnavailableError):  # a restarted server has forgotten it anyway
                    logger.warning(
                        "%s is unreachable; forgetting adapter %r there (if it comes back still holding it, "
                        "reconcile_adapters() lists it as unexpected)", replica.http.where, adapter_id
                    )
                    outcomes[index] = None
                if not isinstance(outcomes[index], BaseException):
                    self.placement.removed(adapter_id, replica)
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            raise failures[0]  # the adapter stays recorded: unloading again retries where it failed

    async def _unload_on(self, replica: Replica, adapter_id: str) -> None:
        def not_found(answer: ServerAnswer) -> ServerResponseError | None:
            if answer.route_missing:
                return _runtime_lora_disabled(answer)
            return None

        try:
            await replica.http.request(
                "POST",
                f"{replica.root}/v1/unload_lora_adapter",
                operation=f"unload adapter {adapter_id!r}",
                json_body={"lora_name": adapter_id},
                handlers={404: not_found},
            )
        except RuntimeLoRADisabledError:
            raise
        except ServerResponseError as error:
            if error.status_code != 404:
                raise
            # The server no longer has it (restarted): the unload's goal is met there.
            logger.info("%s had already lost adapter %r; nothing to unload there", replica.http.where, adapter_id)

    async def reconcile_adapters(self) -> ReconcileReport:
        """Make every replica hold the adapters this provider loaded; report what differed.

        Reads each replica's ``GET /v1/models`` (LoRA entries are those with a ``parent``), loads again the
        adapters a replica lost (a restarted server forgets runtime-loaded adapters), and lists the LoRA
        adapters a replica serves that this provider did not load (left alone). A replica that cannot be
        reached is reported, not raised.

        Returns:
            One :class:`ReplicaReconciliation` per replica.
        """
        expected = {name: self._adapter_path(name) for name in self._adapter_registry.backend_names().values()}
        placement = self.placement

        def held(replica: Replica) -> dict[str, str | None]:  # with on-demand placement, what it was given
            return expected if placement is None else {name: expected.get(name) for name in placement.held_by(replica)}

        results = await asyncio.gather(*(self._reconcile_one(replica, held(replica)) for replica in self._replicas))
        return ReconcileReport(replicas=tuple(results))

    async def _served_adapters(self, replica: Replica) -> dict[str, str]:
        """The LoRA adapters ``replica`` lists in ``GET /v1/models``: name -> path (``root``).

        LoRA entries are those with a ``parent`` (the base model's name); the base model's is ``null``, and
        servers without LoRA support (llama_cpp.server) send no ``parent`` at all.
        """
        operation = "list models"
        response = await replica.http.request("GET", f"{replica.root}/v1/models", operation=operation)
        body = replica.http.parse_json(response, operation=operation)
        entries = body.get("data") if isinstance(body, dict) else None
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise replica.http.protocol_error(operation, "an answer that is not a model list (no data[] of objects)")
        served: dict[str, str] = {}
        for entry in entries:
            name, parent, root = entry.get("id"), entry.get("parent"), entry.get("root")
            if not isinstance(name, str) or not name:
                raise replica.http.protocol_error(operation, f"a model entry without an id: {entry!r:.200}")
            if parent:
                served[name] = root if isinstance(root, str) else ""
        return served

    async def replica_adapters(self) -> dict[str, list[str] | str]:
        """What each replica holds now, by its own ``GET /v1/models``: base URL -> sorted adapter ids, or the error
        that replica gave (one that cannot be reached is reported, not raised)."""

        async def one(replica: Replica) -> list[str] | str:
            try:
                return sorted(await self._served_adapters(replica))
            except InferenceError as error:
                return f"{type(error).__name__}: {error}"

        listings = await asyncio.gather(*(one(replica) for replica in self._replicas))
        return {replica.base_url: listing for replica, listing in zip(self._replicas, listings, strict=True)}

    async def _served_by_replicas(self) -> list[dict[str, str]]:
        """What each replica that answers lists (see :meth:`_served_adapters`), in configuration order.

        A replica that fails is logged and left out, as long as another one answered: adapters are loaded
        on every replica, so the others say what the provider serves.

        Raises:
            ProviderUnavailableError: No replica accepts connections.
            InferenceError: No replica answered, and one failed otherwise (its error, e.g. a refused key).
        """
        outcomes = await asyncio.gather(
            *(self._served_adapters(replica) for replica in self._replicas), return_exceptions=True
        )
        answered: list[dict[str, str]] = []
        failures: list[tuple[Replica, InferenceError]] = []
        for replica, outcome in zip(self._replicas, outcomes, strict=True):
            if isinstance(outcome, InferenceError):
                failures.append((replica, outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                answered.append(outcome)
        if not answered:
            other = [error for _, error in failures if not isinstance(error, ProviderUnavailableError)]
            raise other[0] if other else self._all_down(failures)
        for replica, error in failures:
            logger.warning(
                "vLLM replica %s did not list its adapters (%s); using the others' lists", replica.http.shown_url, error
            )
        return answered

    async def _list_adapters(self) -> list[str]:
        """The adapters this object loaded, and every LoRA adapter the servers list in ``GET /v1/models``.

        A new process thus lists what an earlier one loaded (``inference adapters list``), and adapters
        given with ``--lora-modules``. With replicas, the union of what they list: an adapter on any replica
        can be used, since a replica that lacks it gets it loaded again from the path another one reports.
        Adapters this object is unloading are left out. The object's own record covers vLLM versions that
        do not list runtime-loaded adapters.

        Raises:
            ProviderUnavailableError: No replica accepts connections.
            ProtocolError: The answer is not a model list.
        """
        served = {_adapter_id(name) for listing in await self._served_by_replicas() for name in listing}
        registry = self._adapter_registry
        loaded = set(registry.ids())
        being_unloaded = {adapter_id for adapter_id in served - loaded if registry.path_of(adapter_id) is not None}
        return sorted(loaded | (served - being_unloaded))

    async def _discover_adapter(self, adapter_id: str) -> str | Discovered | None:
        """An adapter the server lists but this object did not load (an earlier process, ``--lora-modules``).

        It is then used and unloaded like one loaded here, so ``inference adapters unload ID`` works from a
        new process. An id that process replaced is served as ``id@n``: the newest such name is used. Asks
        every replica; ``None`` when none that answers lists it.

        Raises:
            ProviderUnavailableError: No replica accepts connections (the id cannot be looked up).
        """
        listings = await self._served_by_replicas()
        for served in listings:
            if adapter_id in served:
                return served[adapter_id] or adapter_id
        # an id another process replaced: the newest of the versioned names it left (``id@n``)
        versions = [
            (parsed[1], name, served[name] or name)
            for served in listings
            for name in served
            if (parsed := parse_versioned_name(name)) is not None and parsed[0] == adapter_id
        ]
        if not versions:
            return None
        version, name, path = max(versions)
        return Discovered(path=path, backend=name, version=version)

    async def _reconcile_one(self, replica: Replica, expected: dict[str, str | None]) -> ReplicaReconciliation:
        try:
            served = set(await self._served_adapters(replica))
        except InferenceError as error:
            return ReplicaReconciliation(base_url=replica.http.shown_url, error=str(error))
        reloaded: list[str] = []
        failed: list[str] = []
        for adapter_id in sorted(set(expected) - served):
            path = expected[adapter_id]
            if path is None:
                continue
            try:
                started = time.perf_counter()
                await self._load_on(replica, adapter_id, path)
                self._adapter_registry.note_reload(adapter_id, (time.perf_counter() - started) * 1000)
            except ServerAdapterAlreadyLoadedError:
                continue  # the server has it but does not list it (some vLLM versions)
            except InferenceError as error:
                logger.error("%s: could not load adapter %r again: %s", replica.http.where, adapter_id, error)
                failed.append(adapter_id)
            else:
                reloaded.append(adapter_id)
        return ReplicaReconciliation(
            base_url=replica.http.shown_url,
            reloaded=tuple(reloaded),
            failed=tuple(failed),
            unexpected=tuple(sorted(served - set(expected))),
        )


@dataclass(frozen=True)
class _TokenizerInfo:
    """What scoring needs of a served model's tokenizer (see :meth:`VLLMProvider._tokenizer_info`)."""

    adds_bos: bool
    bos_id: int | None
    eos_id: int | None
    max_length: int  # max_model_len: the longest prompt plus generated tokens


_RESOLVER_FAILED = re.compile(
    r"LoRA adapter '(?P<name>[^']*)' was found but could not be loaded: ?(?P<reason>.*)", re.S
)
"""vLLM's 400 when a LoRA resolver plugin found the adapter a request names but loading it failed."""


def _bad_generation(answer: ServerAnswer) -> ServerResponseError | None:
    """A 400 to a generation: a LoRA resolver's broken adapter, or chat on a model without a chat template."""
    if _NO_CHAT_TEMPLATE in answer.message and "no longer allowed" in answer.message:
        return answer.error(
            ServerResponseError,
            f"{answer.where} cannot chat with its model: it has no chat template ({answer.message}). Generate "
            "through /v1/completions instead: VLLM_API=auto (the default) or completions (or api=...), or start "
            "vLLM with --chat-template",
        )
    return _resolver_could_not_load(answer)


def _resolver_could_not_load(answer: ServerAnswer) -> ServerResponseError | None:
    """The 400 of vLLM's LoRA resolver (``VLLM_PLUGINS``): the adapter exists but is broken or unsupported."""
    match = _RESOLVER_FAILED.search(answer.message)
    if match is None:
        return None
    name, reason = match.group("name"), match.group("reason").strip() or "no reason given"
    return answer.error(
        ServerInvalidAdapterError,
        f"{answer.where} found adapter {name!r} through its LoRA resolver plugin but could not load it "
        f"({reason}): fix the adapter the resolver serves (adapter_config.json and weights of a PEFT LoRA, rank "
        "within --max-lora-rank, no DoRA), or load a working one with load_adapter",
    )


def _runtime_lora_disabled(answer: ServerAnswer) -> ServerResponseError:
    return answer.error(
        RuntimeLoRADisabledError,
        f"{answer.where} refused runtime LoRA loading (404 on {answer.response.request.url.path}): "
        f"{_RUNTIME_LORA_HINT}",
    )
