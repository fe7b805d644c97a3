"""The vLLM provider: generation over the OpenAI-compatible API, LoRA adapters over vLLM's runtime routes.

One provider may front several vLLM servers (replicas): adapters are loaded on every replica (all or
nothing), generations are spread across them and skip a replica that does not accept connections.

The provider is assembled from the server parts in :mod:`inference._servers` (see
:mod:`~inference._servers.openai_compatible`); what is vLLM's own is here: its runtime LoRA routes and their
refusals (``_LORA_ROUTES``), its limits, and the check of a local adapter against ``--max-lora-rank``.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from inference._core.lifecycle import Discovered
from inference._core.validation import GenerationRequest, ScoreRequest, TokenRequest
from inference._servers.http import ErrorHandlers, ServerAnswer
from inference._servers.limits import DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS
from inference._servers.limits import ServerLimits
from inference._servers.openai_compatible import OpenAICompatibleProvider
from inference._servers.placement import AdapterPlacement
from inference._servers.prompt_scoring import PromptLogprobScoring
from inference._servers.routes import ChatTemplateProbe
from inference._servers.runtime_lora import (
    LoRARoutes,
    RuntimeLoRA,
    absolute_if_local,
    already_loaded,
    shared_adapter_dir,
)
from inference._servers.served_adapters import ReconcileReport, ReplicaReconciliation, ServedAdapters
from inference._servers.vllm_tokens import DISTRIBUTION_FIELDS, ServerTokens
from inference.adapters.peft import read_peft_adapter
from inference.adapters.source import AdapterSource
from inference.exceptions import InvalidAdapterError, ServerInvalidAdapterError, ServerResponseError
from inference.options import OptionMap, Sent
from inference.results import ScoreResult
from inference.tokens import TokenIds, TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["ReconcileReport", "ReplicaReconciliation", "VLLMProvider"]

MAX_TEMPERATURE = 2.0
"""vLLM's largest temperature (``temperature must be in [0, 2]``)."""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's ``--max-lora-rank`` accepts."""

_RESOLVER_FAILED = re.compile(
    r"LoRA adapter '(?P<name>[^']*)' was found but could not be loaded: ?(?P<reason>.*)", re.S
)
"""vLLM's 400 when a LoRA resolver plugin found the adapter a request names but loading it failed."""


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


def _load_refusals(adapter_id: str, adapter_path: str) -> ErrorHandlers:
    """vLLM's refusals of ``POST /v1/load_lora_adapter`` (backends.md), as errors that say what to do."""

    def not_found(answer: ServerAnswer) -> ServerResponseError:
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
        return already_loaded(answer, adapter_id, adapter_path)

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

    return {400: bad_request, 404: not_found, 500: server_error}


_LORA_ROUTES = LoRARoutes(
    server="vLLM",
    enable_hint="start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1",
    preload_hint="start vLLM with --lora-modules {adapter_id}=<path>",
    load_refusals=_load_refusals,
    request_refusal=_resolver_could_not_load,
)
"""vLLM's runtime LoRA routes (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, ``/v1/models``), which
exist only with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``, and what their refusals mean."""


def _check_local_adapter(adapter_path: str, max_lora_rank: int, *, provider: str) -> None:
    """Refuse, before sending, an adapter directory on this machine that vLLM would refuse (rank above
    ``max_lora_rank``; what :func:`~inference.adapters.peft.read_peft_adapter` refuses)."""
    if not os.path.exists(adapter_path):
        return  # the server may see another filesystem, or take it as a Hub repo id
    adapter = read_peft_adapter(adapter_path, provider=provider)
    if adapter.rank <= max_lora_rank:
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
        f"adapter at {adapter_path} has rank {adapter.rank}, above max_lora_rank {max_lora_rank}: {advice}",
        provider=provider,
        path=adapter_path,
    )


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
    request once; a server that got the name from another path first is refused, never answered with those
    weights. :meth:`reconcile_adapters` does the same for every adapter at once.

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

    Token level (:mod:`inference._servers.vllm_tokens`): ``tokenize``/``detokenize`` through ``/tokenize`` and
    ``/detokenize``; ``token_vocabulary`` from the model's tokenizer files at the path the server reports (``root``
    in ``GET /v1/models``), which must be readable from this machine (vLLM serves no token bytes);
    ``next_token_logprobs`` as one-token ``/v1/completions`` requests of the ids with every token's logprob, which
    needs the server started with ``--max-logprobs -1``; :class:`~inference.tokens.TokenIds` prompts on
    ``/v1/completions``; ``return_token_ids`` through vLLM's field of that name.

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
            :class:`~inference.exceptions.ConfigurationError` saying what to set. It must exist and be writable
            (checked here; ``~`` is expanded, a relative path made absolute).
        api: The route of generations: ``"auto"``, ``"chat"`` or ``"completions"`` (see above); else ``VLLM_API``;
            else ``"auto"``.
        replica_down_s: Seconds a replica that is down (refused a connection, answered 502/503/504, or did not
            answer within ``timeout``) is tried after the others (then in turn again); else
            ``VLLM_REPLICA_DOWN_S``; else 5.

    Example:
        >>> provider = VLLMProvider(base_url="http://127.0.0.1:8100/v1", api_key="secret")
        >>> provider
        VLLMProvider(base_url='http://127.0.0.1:8100/v1', api_key=***, adapters=[])
    """

    name = "vllm"
    options: ClassVar[OptionMap] = {
        **OpenAICompatibleProvider.options,
        "chat_template": Sent("chat_template", "vLLM's chat request field: the template used instead of the model's"),
        "chat_template_kwargs": Sent("chat_template_kwargs", "vLLM's chat request field"),
        "thinking": Sent(
            "chat_template_kwargs.enable_thinking",
            "the template's switch; the reasoning comes back apart where vLLM runs a --reasoning-parser",
        ),
        "return_token_ids": Sent("return_token_ids", "vLLM's request field: the answer's token_ids, as vLLM gives them "
                                 "(a final end token and a cut stop string's tokens included)"),
        "n": Sent(
            "n",
            "vLLM's n: the prompt computed once, seeds seed, seed + 1, ... (the choices of n requests with those "
            "seeds); each choice counted by its token_ids. Greedy (temperature 0), which vLLM refuses with n > 1: "
            "n requests, their prompt shared by vLLM's prefix cache",
        ),
    }
    server_label = "vLLM"
    env_prefix = "VLLM"
    greedy_n = False  # "n must be 1 when using greedy sampling" (vLLM 0.32): greedy choices go one request each
    model_hint = (
        "use the name the server was started with (--served-model-name, or the --model path); GET /v1/models lists it"
    )
    supports_adapters = True
    hot_swaps_adapters = True
    batches_mixed_adapters = True
    supports_scoring = True
    supports_tokenize = True
    supports_next_token_logprobs = True
    supports_token_prompts = True
    _lora: ServedAdapters  # narrowed: this provider always has runtime LoRA routes
    _scoring: PromptLogprobScoring

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
        *,
        replica_down_s: float | None = None,
    ) -> None:
        super().__init__(locals())
        self.max_lora_rank: int = self._settings["max_lora_rank"]
        self.adapter_dir: str | None = self._settings["adapter_dir"]
        self.api: str = self._settings["api"]
        self.adapter_placement: str = self._settings["adapter_placement"]
        self.placement: AdapterPlacement | None = None
        """Which replica holds which adapter (``adapter_placement="on-demand"``); ``None`` with ``"all"``."""
        if self.adapter_placement == "on-demand":
            settings = self._settings
            self.placement = AdapterPlacement(self._replicas, settings["max_loras"], settings["spread_after"])
        # The parts this provider is assembled from; OpenAICompatibleProvider's generation path asks them.
        self._route_choice = ChatTemplateProbe(self.api, server=self.server_label, env_prefix=self.env_prefix)
        self._limits = ServerLimits(provider=self.name, server=self.server_label, max_temperature=MAX_TEMPERATURE)
        lora = RuntimeLoRA(_LORA_ROUTES)
        self._lora = ServedAdapters(self._replicas, lora, self._adapter_registry, self.placement)
        self._scoring = PromptLogprobScoring(self._replicas, self.model_hint, self._chat)
        self._tokens = ServerTokens(self._replicas, self._scoring)

    # Adapters: vLLM's runtime LoRA routes on every replica (inference._servers.served_adapters) ----------------

    def _adapter_weights_dir(self) -> str | None:
        """``adapter_dir``: the servers read adapters from their own filesystem, so weights from memory must be
        written where they can read them.

        Raises:
            ConfigurationError: No ``adapter_dir`` (``VLLM_ADAPTER_DIR``) is set.
        """
        return shared_adapter_dir(
            self.adapter_dir, server=self.server_label, env_prefix=self.env_prefix, provider=self.name
        )

    def _adapter_path_argument(self, adapter_path: object) -> str:
        """The path as the servers receive it: one that exists here is sent absolute (vLLM would resolve a relative
        path against its own working directory, or take it for a Hugging Face Hub repo id)."""
        return absolute_if_local(super()._adapter_path_argument(adapter_path))

    async def _check_adapter_source(self, source: AdapterSource) -> None:
        _check_local_adapter(source.path, self.max_lora_rank, provider=self.name)

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        await self._check_adapter_source(source)
        await self._lora.load(adapter_id, source.path)

    async def _unload_adapter(self, adapter_id: str) -> None:
        await self._lora.unload(adapter_id)

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
        return await self._lora.list_adapters()

    async def _discover_adapter(self, adapter_id: str) -> str | Discovered | None:
        """An adapter the server lists but this object did not load (an earlier process, ``--lora-modules``).

        It is then used and unloaded like one loaded here, so ``inference adapters unload ID`` works from a
        new process. An id that process replaced is served as ``id@n``: the newest such name is used. Asks
        every replica; ``None`` when none that answers lists it.

        Raises:
            ProviderUnavailableError: No replica accepts connections (the id cannot be looked up).
        """
        return await self._lora.discover(adapter_id)

    async def _discover_replaced_adapter(self, adapter_id: str) -> Discovered | None:
        """Before a first load here: the newest ``id@n`` the servers list for the id (an earlier process replaced
        it), which the load replaces (``replace=True``) or adopts (the same path), never leaves behind. One
        ``GET /v1/models`` per replica.

        Raises:
            ProviderUnavailableError: No replica accepts connections.
        """
        found = await self._lora.discover(adapter_id)
        return found if isinstance(found, Discovered) else None

    async def reconcile_adapters(self) -> ReconcileReport:
        """Make every replica hold the adapters this provider loaded; report what differed.

        Reads each replica's ``GET /v1/models`` (LoRA entries are those with a ``parent``), loads again the
        adapters a replica lost (a restarted server forgets runtime-loaded adapters), and lists the LoRA
        adapters a replica serves that this provider did not load (left alone), and those it serves under the
        name of one loaded here from another path (``mismatched``: left alone, and sent none of that adapter's
        requests while it does). A replica that cannot be reached is reported, not raised.

        Returns:
            One :class:`ReplicaReconciliation` per replica.
        """
        return await self._lora.reconcile()

    async def replica_adapters(self) -> dict[str, list[str] | str]:
        """What each replica holds now, by its own ``GET /v1/models``: base URL (as shown: credentials written into
        it are ``***``) -> sorted adapter ids, or the error that replica gave (one that cannot be reached is
        reported, not raised)."""
        return await self._lora.listings()

    # Scoring: /tokenize, then prompt logprobs from /v1/completions (inference._servers.prompt_scoring) ----------

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        """Score the continuation with the prompt logprobs of one ``/v1/completions`` request.

        The tokens follow :mod:`inference._core.scoring`'s rule, with the server's tokenizer (``/tokenize``);
        the whole sequence is sent as token ids with ``prompt_logprobs``, and the scored positions' logprobs
        and ranks are read back.
        """
        return await self._scoring.score(request)

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        """Score the whole text in windows that fit the server's context (``max_model_len - 2`` tokens each)."""
        return await self._scoring.score_rolling(request)

    # Token level: /tokenize, /detokenize, one-token completions with every logprob (inference._servers.vllm_tokens) ---

    async def _tokenize_text(self, text: str, model: str) -> list[int]:
        return await self._tokens.tokenize(model, text)

    async def _detokenize_ids(self, request: TokenRequest) -> str:
        return await self._tokens.detokenize(request.model, request.token_ids)

    async def _token_vocabulary(self, model: str) -> TokenVocabulary:
        """The served model's vocabulary, from its tokenizer files at the path the server reports (see
        :mod:`inference._servers.vllm_tokens`): refused when that directory is not readable from this machine."""
        return await self._tokens.vocabulary(model)

    _distribution_generates_a_token = True  # a one-token completion: the sequence needs room for that token

    async def _next_token_logprobs(self, requests: list[TokenRequest]) -> NDArray[np.float32]:
        """Each sequence as a one-token ``/v1/completions`` request of its ids with every token's logprob (the server
        must run with ``--max-logprobs -1``), under its adapter's name, all sent at once (the server batches them)."""
        import numpy

        size = (await self._vocabulary_of(requests[0].model)).size
        return numpy.stack(await asyncio.gather(*(self._next_token_row(request, size) for request in requests)))

    async def _next_token_row(self, request: TokenRequest, size: int) -> NDArray[np.float32]:
        asked = GenerationRequest.from_arguments(
            provider=self.name, prompt=TokenIds(request.token_ids), model=request.model, max_tokens=1,
            temperature=0.0, extra_body=DISTRIBUTION_FIELDS,
        ).under(request.adapter_id)
        try:
            async with self._chat(asked, stream=False) as (replica, _, completion):
                return self._tokens.row(replica, completion, size)
        except ServerResponseError as error:
            refused = self._tokens.refusal(str(error)) if error.status_code == 400 else None
            if refused is None:
                raise
            raise refused from error
