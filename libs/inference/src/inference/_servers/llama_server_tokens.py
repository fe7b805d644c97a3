"""llama-server's token level over HTTP: ``/tokenize``, ``/detokenize``, and full next-token distributions.

:class:`LlamaServerTokens` is the part the ``llamacpp-server`` provider's token-level hooks delegate to:

- ``tokenize``: ``POST /tokenize`` with ``add_special`` false (no BOS) and ``parse_special`` true (text that spells a
  special token is that token, the rule of :mod:`inference._core.scoring`); ``detokenize``: ``POST /detokenize``
  (special tokens written out).
- A distribution: ``/v1/completions`` of the ids, one token, ``logprobs`` = the vocabulary's size (llama-server's
  ``n_probs``): llama-server answers every token's probability before sampling with its ``id`` and ``bytes``, the
  softmax of the logits, normalised with a float32 sum (on Gemma 3's 262,144 ids the row's logsumexp was up to 4.5e-4
  off 0), so the row is renormalised here in float64. A distribution that lacks an id is a
  :class:`~inference.exceptions.ProviderError`.
- The vocabulary: its size and context from ``GET /v1/models`` (``meta.n_vocab``, ``meta.n_ctx``: one slot's
  context), each id's bytes from one full distribution (every entry carries its ``bytes``; a control token's are
  empty there, so those ids are detokenized one by one, which writes their text: they are ``special_ids``), BOS and
  EOS from ``GET /props`` (their text, tokenized), ``adds_bos`` from ``/tokenize`` with and without
  ``add_special``. llama-server does not say which tokens end a generation: ``eos_ids`` holds its EOS token only
  (llama.cpp in process lists every end-of-generation token).
- Flash attention (llama-server's default ``-fa auto`` turns it on, on the CPU too) computes attention with f16
  queries: its distributions then differ from llama.cpp in process by up to about 3e-3 nats on the tiny models;
  with ``-fa off`` and an f32 KV cache they agree within 1e-6.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from inference._servers.openai_wire import COMPLETIONS, full_distribution
from inference._servers.replicas import Replica, ReplicaSet
from inference._servers.wire_numbers import logprob
from inference.tokens import TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["LlamaServerTokens", "distribution_fields"]


def distribution_fields(size: int, forced: int) -> dict[str, Any]:
    """The ``/v1/completions`` fields of a full next-token distribution (with ``max_tokens=1``, greedy): every
    token's probability (``n_probs``), before the sampling chain, and a ``logit_bias`` that makes the sampled token
    ``forced``, a token that is a whole character: llama-server leaves out of its answer, probabilities included, a
    token it samples that ends inside a UTF-8 character or ends the generation. The probabilities are the logits'
    softmax, before the bias (measured: the same with and without it)."""
    return {"logprobs": size, "post_sampling_probs": False, "logit_bias": [[forced, 100.0]]}


class LlamaServerTokens:
    """Token ids, vocabularies and distributions from a llama-server (see the module docstring).

    Args:
        replicas: The provider's replicas (started with the same model; the first that accepts connections answers).
        props: The provider's reader of a replica's ``GET /props`` (read once per replica).
    """

    def __init__(self, replicas: ReplicaSet, props: Callable[[Replica], Awaitable[dict[str, Any]]]) -> None:
        self._replicas = replicas
        self._props = props
        self._whole_character: int | None = None

    async def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """``POST /tokenize``: the ids of ``text``, special-token text read as those tokens; BOS added with
        ``special``."""
        return await self._replicas.first_reachable(lambda replica: self._tokenize(replica, text, special))

    async def _tokenize(self, replica: Replica, text: str, special: bool) -> list[int]:
        body = await self._post(replica, "/tokenize", {"content": text, "add_special": special, "parse_special": True},
                                "tokenize text")
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise replica.http.protocol_error("tokenize text", f"an answer that is not a token list: {body!r:.200}")
        return tokens

    async def detokenize(self, token_ids: tuple[int, ...]) -> str:
        """``POST /detokenize``: the text of the ids, special tokens written out."""
        return await self._replicas.first_reachable(lambda replica: self._detokenize(replica, token_ids))

    async def _detokenize(self, replica: Replica, token_ids: tuple[int, ...]) -> str:
        body = await self._post(replica, "/detokenize", {"tokens": list(token_ids)}, "detokenize token ids")
        text = body.get("content") if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise replica.http.protocol_error("detokenize token ids", f"an answer that is not a text: {body!r:.200}")
        return text

    async def vocabulary(self) -> TokenVocabulary:
        """The served model's vocabulary (see the module docstring), from the first replica that accepts
        connections."""
        return await self._replicas.first_reachable(self._vocabulary)

    async def _vocabulary(self, replica: Replica) -> TokenVocabulary:
        operation = "read the served model's vocabulary"
        response = await replica.http.request("GET", f"{replica.root}/v1/models", operation=operation)
        body = replica.http.parse_json(response, operation=operation)
        try:
            meta = body["data"][0]["meta"]
            size, context = int(meta["n_vocab"]), int(meta["n_ctx"])
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise replica.http.protocol_error(
                operation, f"a model list without llama-server's meta.n_vocab and meta.n_ctx ({error!r})"
            ) from error
        first = await self._tokenize(replica, "x", False)
        response = await replica.http.request(
            "POST", replica.urls[COMPLETIONS], operation=operation,
            json_body={"prompt": first, "max_tokens": 1, "temperature": 0.0,
                       **distribution_fields(size, await self.whole_character())},
        )
        _, pieces = self.row(replica, replica.http.parse_json(response, operation=operation), size)
        # A control token's bytes are empty in the distribution (its text is not written there); /detokenize writes
        # it out. Those are the control tokens.
        empty = [token for token, piece in enumerate(pieces) if not piece]
        texts = await asyncio.gather(*(self.detokenize((token,)) for token in empty))
        written = {token: text.encode("utf-8") for token, text in zip(empty, texts, strict=True) if text}
        pieces = tuple(written.get(token, piece) for token, piece in enumerate(pieces))
        props = await self._props(replica)
        bos, eos = await self._single_token(props.get("bos_token")), await self._single_token(props.get("eos_token"))
        with_special = await self.tokenize("x", special=True)
        adds_bos = bos is not None and with_special == [bos, *first]
        return TokenVocabulary(
            size=size,
            token_bytes=pieces,
            special_ids=frozenset(written) | {token for token in (bos, eos) if token is not None},
            bos_id=bos,
            eos_ids=() if eos is None else (eos,),
            adds_bos=adds_bos,
            context_length=context,
        )

    def row(self, replica: Replica, completion: Any, size: int) -> tuple[NDArray[np.float32], tuple[bytes, ...]]:
        """The full distribution of a one-token completion asked with :func:`distribution_fields`, and each id's
        bytes. The row is renormalised in float64 (its logsumexp subtracted): llama-server sums the probabilities in
        float32, which on a large vocabulary (Gemma 3's 262,144 ids) leaves every entry up to 4.5e-4 nats high.

        Raises:
            ProviderError: The answer lacks an id of the vocabulary: never a partial row; an id's value that is not
                a log-probability (NaN, +inf, above 0) is a ProtocolError.
        """
        import numpy

        values = numpy.full(size, numpy.nan, dtype=numpy.float64)
        pieces: list[bytes] = [b""] * size
        try:
            entries = completion["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            for place, entry in enumerate(entries):
                token = entry["id"]
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < size:
                    raise ValueError(f"token id {token!r} is not in the vocabulary of {size}")
                # not NaN: a NaN in the row is a missing id
                values[token] = logprob(entry["logprob"], f"logprobs.content[0].top_logprobs[{place}].logprob")
                pieces[token] = bytes(entry["bytes"])
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise replica.http.protocol_error(
                "compute a next-token distribution", f"an answer without llama-server's token probabilities ({error!r})"
            ) from error
        full_distribution(values, replica.http, what="probabilities of the vocabulary (n_probs)")
        total = numpy.logaddexp.reduce(values)
        if not numpy.isfinite(total):
            raise replica.http.protocol_error(
                "compute a next-token distribution", "probabilities of the vocabulary that are all 0"
            )
        return (values - total).astype(numpy.float32), tuple(pieces)

    async def whole_character(self) -> int:
        """A token that is one whole character (the first of ``"x"``), found once: what a distribution request
        samples (see :func:`distribution_fields`)."""
        if self._whole_character is None:
            self._whole_character = (await self.tokenize("x"))[0]
        return self._whole_character

    async def _single_token(self, text: object) -> int | None:
        """The id of a special token's text (``/props``' ``bos_token``), when it is one token."""
        if not isinstance(text, str) or not text:
            return None
        ids = await self.tokenize(text)
        return ids[0] if len(ids) == 1 else None

    async def _post(self, replica: Replica, path: str, body: dict[str, Any], operation: str) -> Any:
        response = await replica.http.request("POST", f"{replica.root}{path}", operation=operation, json_body=body)
        return replica.http.parse_json(response, operation=operation)
