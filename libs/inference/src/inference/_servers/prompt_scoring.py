"""Scoring on a server: tokens from its ``POST /tokenize``, log-probabilities from its ``prompt_logprobs``.

:class:`PromptLogprobScoring` is the part a server provider that scores is assembled from (vLLM's routes). The
tokens follow :mod:`inference._core.scoring`'s rule with the server's own tokenizer (on the first replica that
accepts connections); the whole sequence is sent as token ids to ``/v1/completions`` with ``prompt_logprobs``, the
way the provider sends a generation (its replica choice, adapter placement and reloading of a lost adapter), and the
scored positions' logprobs and ranks are read back. The EOS token that starts an empty context on a model without
BOS comes from ``GET /tokenizer_info``, which vLLM serves only with ``--enable-tokenizer-info-endpoint``. Each
``/tokenize`` answer also teaches the replica its context size (``max_model_len``), which
:class:`~inference._servers.limits.ServerLimits` then applies to generations.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from inference._core.scoring import ScoreTokens, Vocabulary, rolling_windows, score_tokens, too_long
from inference._core.validation import GenerationRequest, ScoreRequest
from inference._servers.http import ErrorHandlers, ServerAnswer
from inference._servers.replicas import Replica, ReplicaSet
from inference._servers.wire_numbers import logprob
from inference.exceptions import ServerModelNotFoundError, ServerResponseError
from inference.results import ScoreResult
from inference.tokens import TokenIds

__all__ = ["PromptLogprobScoring", "Send", "TokenizerInfo"]

Send = Callable[..., AbstractAsyncContextManager[tuple[Replica, str, Any]]]
"""How a server provider sends a generation request (its ``_chat``): ``send(request, stream=False)``, an async
context manager of ``(replica, route, parsed answer)``."""


@dataclass(frozen=True)
class TokenizerInfo:
    """What scoring needs of a served model's tokenizer (see :meth:`PromptLogprobScoring.tokenizer_info`)."""

    adds_bos: bool
    bos_id: int | None
    eos_id: int | None
    max_length: int  # max_model_len: the longest prompt plus generated tokens


class PromptLogprobScoring:
    """Scores continuations and whole texts with a server's ``/tokenize`` and ``prompt_logprobs``.

    Args:
        replicas: The provider's replicas (the first that accepts connections tokenizes: all serve the same model).
        model_hint: What to do when the server does not serve the model asked for.
        send: How the provider sends a generation (:data:`Send`): the scored sequence goes that way.
    """

    def __init__(self, replicas: ReplicaSet, model_hint: str, send: Send) -> None:
        self._replicas = replicas
        self._model_hint = model_hint
        self._send = send

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """Score the continuation with the prompt logprobs of one ``/v1/completions`` request."""
        context = request.context
        stripped = context.rstrip()
        texts = {stripped, context + request.continuation} if stripped else {context + request.continuation}

        async def tokens_on(replica: Replica) -> tuple[TokenizerInfo, dict[str, list[int]]]:
            info = await self.tokenizer_info(replica, request.model)
            return info, {text: await self.tokenize(replica, request.model, text, special=False) for text in texts}

        info, encoded = await self._replicas.first_reachable(tokens_on)
        vocabulary = Vocabulary(
            encode=lambda text: encoded[text], adds_bos=info.adds_bos, bos_id=info.bos_id, eos_id=info.eos_id
        )
        sequence = score_tokens(vocabulary, request.context, request.continuation, provider=self._replicas.provider)
        # vLLM reads every token sent (the last one's logprob comes from the one before) and generates one more.
        if len(sequence.tokens) + 1 > info.max_length:
            raise too_long(
                len(sequence.tokens) - 1,
                info.max_length - 2,
                provider=self._replicas.provider,
                setting=f"{self._replicas.server}'s --max-model-len",
            )
        logprob, greedy, model = await self._prompt_logprobs(request, sequence)
        return ScoreResult(
            logprob=logprob,
            num_tokens=len(sequence.scored),
            is_greedy=greedy,
            model=model,
            adapter_id=request.adapter_id,
        )

    async def score_rolling(self, request: ScoreRequest) -> ScoreResult:
        """Score the whole text in windows that fit the server's context: each window is sent with one token
        before its scored tokens, and vLLM generates one token more, so ``max_model_len - 2`` tokens are scored
        per window."""

        async def tokens_on(replica: Replica) -> tuple[TokenizerInfo, list[int]]:
            info = await self.tokenizer_info(replica, request.model)
            return info, await self.tokenize(replica, request.model, request.continuation, special=False)

        info, tokens = await self._replicas.first_reachable(tokens_on)
        vocabulary = Vocabulary(
            encode=lambda text: tokens, adds_bos=info.adds_bos, bos_id=info.bos_id, eos_id=info.eos_id
        )
        provider = self._replicas.provider
        windows = rolling_windows(vocabulary, request.continuation, info.max_length - 2, provider=provider)
        total, greedy, model = 0.0, True, request.adapter_id or request.model
        for window in windows:
            logprob, window_greedy, model = await self._prompt_logprobs(request, window)
            total += logprob
            greedy = greedy and window_greedy
        count = sum(len(window.scored) for window in windows)  # a start token written in the text is not scored
        return ScoreResult(
            logprob=total, num_tokens=count, is_greedy=greedy, model=model, adapter_id=request.adapter_id
        )

    async def tokenize(self, replica: Replica, model: str, text: str, *, special: bool) -> list[int]:
        """``POST /tokenize`` (vLLM's own route, at the server root): the token ids of ``text``."""
        operation = "tokenize text for scoring"
        response = await replica.http.request(
            "POST",
            f"{replica.root}/tokenize",
            operation=operation,
            json_body={"model": model, "prompt": text, "add_special_tokens": special},
            handlers=self.handlers(model),
        )
        body = replica.http.parse_json(response, operation=operation)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise replica.http.protocol_error(operation, f"an answer that is not a token list: {body!r:.200}")
        if isinstance(body.get("max_model_len"), int):
            replica.max_model_len = body["max_model_len"]
        return tokens

    async def tokenizer_info(self, replica: Replica, model: str) -> TokenizerInfo:
        """What the scoring rule needs of the server's tokenizer, found once per replica and model.

        ``adds_bos``/``bos_id``: ``"x"`` tokenized with and without special tokens (the extra first token is
        BOS). ``eos_id`` (and a BOS the tokenizer does not add): from ``GET /tokenizer_info``, which exists only
        when vLLM runs with ``--enable-tokenizer-info-endpoint``; else ``None``.
        """
        cached: TokenizerInfo | None = replica.tokenizers.get(model)
        if cached is not None:
            return cached
        plain = await self.tokenize(replica, model, "x", special=False)
        special = await self.tokenize(replica, model, "x", special=True)
        adds_bos = len(special) == len(plain) + 1 and special[1:] == plain
        bos_id = special[0] if adds_bos else None
        eos_id = None
        config = await self._tokenizer_config(replica)
        for name in ("bos_token", "eos_token"):
            value = config.get(name)
            text = value.get("content") if isinstance(value, dict) else value
            if isinstance(text, str) and text:
                ids = await self.tokenize(replica, model, text, special=False)
                if len(ids) == 1:
                    if name == "eos_token":
                        eos_id = ids[0]
                    elif bos_id is None:
                        bos_id = ids[0]
        info = TokenizerInfo(adds_bos, bos_id, eos_id, replica.max_model_len or 0)
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

    async def _prompt_logprobs(self, request: ScoreRequest, sequence: ScoreTokens) -> tuple[float, bool, str]:
        """``(sum of logprobs, all greedy, model)`` of ``sequence.scored``, from vLLM's ``prompt_logprobs``.

        The sequence goes as a one-token generation of its ids (``send``: the provider's way, so the request goes
        to a replica that holds the adapter, places it there, or loads it again where the server lost it, as a
        generation's). ``prompt_logprobs[i]`` (``None`` for the first token) maps token ids (as strings) to
        ``{"logprob", "rank", "decoded_token"}`` for the prompt's token ``i`` given the tokens before it; rank 1 is
        greedy.
        """
        model = request.adapter_id or request.model
        operation = f"score with {'adapter' if request.adapter_id else 'model'} {model!r}"
        asked = GenerationRequest.from_arguments(
            provider=self._replicas.provider, prompt=TokenIds(sequence.tokens), model=request.model,
            max_tokens=1, temperature=0.0, extra_body={"prompt_logprobs": 1, "add_special_tokens": False},
        ).under(request.adapter_id)
        async with self._send(asked, stream=False) as (replica, _, body):
            pass
        try:
            positions = body["choices"][0]["prompt_logprobs"]
            total, greedy = 0.0, True
            for index in range(sequence.start, len(sequence.tokens)):
                token = str(sequence.tokens[index])
                entry = positions[index][token]
                total += logprob(entry["logprob"], f"prompt_logprobs[{index}][{token!r}].logprob")
                greedy = greedy and entry.get("rank") == 1
            answered = body.get("model") or model
        except (KeyError, IndexError, TypeError) as error:
            raise replica.http.protocol_error(
                operation, f"an answer without the prompt_logprobs of every scored token ({error!r})"
            ) from error
        return total, greedy, str(answered)

    def handlers(self, model: str) -> ErrorHandlers:
        """What a 404 to ``/tokenize`` or ``/detokenize`` means: the route is missing (not a vLLM server), or the
        server does not serve ``model``."""

        def not_found(answer: ServerAnswer) -> ServerResponseError:
            if answer.route_missing:
                return answer.error(
                    ServerResponseError,
                    f"{answer.where} has no route {answer.response.request.url.path}: scoring and the token level "
                    f"need a {self._replicas.server} server (its /tokenize and /v1/completions routes); set "
                    f"{self._replicas.env_prefix}_BASE_URL (or base_url) to it",
                )
            return answer.error(
                ServerModelNotFoundError,
                f"{answer.where} does not serve model {model!r} ({answer.message}): {self._model_hint}",
            )

        return {404: not_found}
