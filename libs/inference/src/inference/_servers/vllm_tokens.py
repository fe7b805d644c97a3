"""vLLM's token level over HTTP: ``/tokenize`` and ``/detokenize``, the vocabulary from the model's tokenizer files,
full next-token distributions from one-token ``/v1/completions`` requests.

:class:`ServerTokens` is the part the vLLM provider's token-level hooks delegate to:

- ``tokenize``/``detokenize``: vLLM's own routes at the server root (``add_special_tokens`` false: no BOS added).
- The vocabulary: vLLM serves no route that gives each token's bytes (``/detokenize`` of one id writes a byte that
  ends inside a UTF-8 character as ``"\\ufffd"``, and logprob keys are such decoded strings too). So the bytes come
  from the model's tokenizer files, at the path the server reports as its model's ``root`` in ``GET /v1/models``
  (the ``--model`` directory), read here with Transformers' tokenizer when that directory is readable from this
  machine; otherwise the vocabulary, and the calls that need it, are refused with a sentence saying so. The size
  is the model's ``vocab_size`` (its output layer, what vLLM's ``logprobs=-1`` covers), ``eos_ids`` the tokenizer's and
  the generation config's end tokens (what vLLM stops on), the context the server's ``max_model_len``.
- A distribution: the sequence as a token-id prompt, ``max_tokens=1``, ``logprobs=-1`` (every token; the server
  must run with ``--max-logprobs -1``) and ``return_tokens_as_token_ids`` (keys ``token_id:N``, since decoded
  strings collide). vLLM sends the raw log-softmax of the logits, each value clamped at -9999 (JSON has no
  ``-inf``). A distribution that lacks an id is a :class:`~inference.exceptions.ProviderError`, never a row.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference._core.dependencies import import_optional
from inference._servers.openai_wire import full_distribution
from inference._servers.prompt_scoring import PromptLogprobScoring
from inference._servers.replicas import Replica, ReplicaSet
from inference._servers.wire_numbers import logprob
from inference.exceptions import ModelNotFoundError, UnsupportedOperationError
from inference.tokens import TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["DISTRIBUTION_FIELDS", "ServerTokens"]

DISTRIBUTION_FIELDS: dict[str, Any] = {"logprobs": -1, "return_tokens_as_token_ids": True}
"""The ``/v1/completions`` fields of a full next-token distribution (with ``max_tokens=1``, greedy)."""

_TOKEN_ID_PREFIX = "token_id:"


class ServerTokens:
    """Token ids and vocabularies from a vLLM server (see the module docstring).

    Args:
        replicas: The provider's replicas (all serve the same model; the first that accepts connections answers).
        scoring: The scoring part, whose ``/tokenize`` call and tokenizer facts are shared.
    """

    def __init__(self, replicas: ReplicaSet, scoring: PromptLogprobScoring) -> None:
        self._replicas = replicas
        self._scoring = scoring

    @property
    def _provider(self) -> str:
        return self._replicas.provider

    async def tokenize(self, model: str, text: str) -> list[int]:
        """``POST /tokenize`` without special tokens added."""
        return await self._replicas.first_reachable(
            lambda replica: self._scoring.tokenize(replica, model, text, special=False)
        )

    async def detokenize(self, model: str, token_ids: tuple[int, ...]) -> str:
        """``POST /detokenize``: the text of the ids, special tokens written out."""
        return await self._replicas.first_reachable(lambda replica: self._detokenize(replica, model, token_ids))

    async def _detokenize(self, replica: Replica, model: str, token_ids: tuple[int, ...]) -> str:
        operation = "detokenize token ids"
        response = await replica.http.request(
            "POST", f"{replica.root}/detokenize", operation=operation,
            json_body={"model": model, "tokens": list(token_ids)}, handlers=self._scoring.handlers(model),
        )
        body = replica.http.parse_json(response, operation=operation)
        text = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise replica.http.protocol_error(operation, f"an answer that is not a detokenized text: {body!r:.200}")
        return text

    async def vocabulary(self, model: str) -> TokenVocabulary:
        """The served model's vocabulary: bytes and special tokens from its tokenizer files (the ``root`` the server
        reports, read here), the context from the server.

        Raises:
            ModelNotFoundError: The server does not serve ``model``.
            UnsupportedOperationError: The model's directory is not readable from this machine.
        """

        async def facts_on(replica: Replica) -> tuple[Path, int]:
            directory = await self._model_directory(replica, model)
            return directory, (await self._scoring.tokenizer_info(replica, model)).max_length

        directory, max_length = await self._replicas.first_reachable(facts_on)
        return await asyncio.to_thread(_read_vocabulary, directory, max_length, self._provider)

    def row(self, replica: Replica, completion: Any, size: int) -> NDArray[np.float32]:
        """The full distribution of a one-token completion asked with :data:`DISTRIBUTION_FIELDS`.

        Raises:
            ProviderError: The answer lacks an id of the vocabulary (or names one outside it): never a partial row;
                an id's value that is not a log-probability (NaN, +inf, above 0) is a ProtocolError.
        """
        import numpy

        operation = "compute a next-token distribution"
        try:
            entries = completion["choices"][0]["logprobs"]["top_logprobs"][0]
            values = numpy.full(size, numpy.nan, dtype=numpy.float32)
            for key, value in entries.items():
                if not key.startswith(_TOKEN_ID_PREFIX):
                    raise TypeError(f"an entry {key!r}: {value!r} that is not token_id:N and a logprob")
                token = int(key[len(_TOKEN_ID_PREFIX):])
                if not 0 <= token < size:
                    raise ValueError(f"token id {token} is outside the vocabulary of {size}")
                values[token] = logprob(value, f"logprobs.top_logprobs[0][{key!r}]")  # not NaN: NaN is "missing"
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise replica.http.protocol_error(
                operation, f"an answer without a distribution keyed by token ids ({error!r:.200})"
            ) from error
        hint = " (start vLLM with --max-logprobs -1)"
        full_distribution(values, replica.http, what="logprobs of the vocabulary", hint=hint)
        return values

    def refusal(self, message: str) -> UnsupportedOperationError | None:
        """vLLM's 400 for ``logprobs=-1`` beyond its ``--max-logprobs``, as the sentence that says how to start it."""
        if "greater than max allowed" not in message:
            return None
        return UnsupportedOperationError(
            f"the vLLM server refuses every token's logprob ({message}): start it with --max-logprobs -1 (the whole "
            "vocabulary) for next_token_logprobs",
            provider=self._provider,
        )

    async def _model_directory(self, replica: Replica, model: str) -> Path:
        """The served model's directory (``root`` in ``GET /v1/models``), when it is readable here."""
        operation = "find the served model's tokenizer files"
        response = await replica.http.request("GET", f"{replica.root}/v1/models", operation=operation)
        body = replica.http.parse_json(response, operation=operation)
        entries = body.get("data") if isinstance(body, dict) else None
        entry = next(
            (item for item in entries or () if isinstance(item, dict) and item.get("id") == model
             and item.get("parent") is None),
            None,
        )
        if entry is None:
            raise ModelNotFoundError(
                f"{replica.http.where} does not serve model {model!r} (GET /v1/models lists no such base model): use "
                "the name the server was started with (--served-model-name)",
                provider=self._provider,
            )
        root = entry.get("root")
        if not isinstance(root, str) or not (Path(root) / "config.json").is_file():
            raise UnsupportedOperationError(
                f"the vLLM server names no route that gives each token's bytes, so the vocabulary is read from the "
                f"model's tokenizer files, at the path the server reports ({root!r}, its --model), which is not a "
                "model directory on this machine: run this process where that directory is readable at the same "
                "path (tokenize and TokenIds prompts work without it; detokenize, token_vocabulary and "
                "next_token_logprobs need it)",
                provider=self._provider,
            )
        return Path(root)


def _read_vocabulary(directory: Path, context_length: int, provider: str) -> TokenVocabulary:
    """The vocabulary of the model directory: its tokenizer (Transformers'), its output layer's size, and the end
    tokens of its tokenizer and generation config (what vLLM stops on, and Transformers' ``eos_ids``)."""
    from inference._inprocess.token_bytes import end_token_ids, special_ids, token_bytes

    transformers = import_optional("transformers", provider=provider, extra="transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    size = int(text_config.get("vocab_size") or len(tokenizer))
    bos = tokenizer.bos_token_id
    probe = tokenizer("probe")["input_ids"]
    return TokenVocabulary(
        size=size,
        token_bytes=token_bytes(tokenizer, size),
        special_ids=special_ids(tokenizer, size),
        bos_id=None if bos is None else int(bos),
        eos_ids=end_token_ids(tokenizer, _generation_config(transformers, directory).eos_token_id),
        adds_bos=bos is not None and len(probe) > 0 and int(probe[0]) == int(bos),
        context_length=context_length,
    )


def _generation_config(transformers: Any, directory: Path) -> Any:
    """The directory's generation config as vLLM and Transformers read it: ``generation_config.json``, else the one
    the model's config implies."""
    try:
        return transformers.GenerationConfig.from_pretrained(str(directory))
    except OSError:  # no generation_config.json
        return transformers.GenerationConfig.from_model_config(transformers.AutoConfig.from_pretrained(str(directory)))
