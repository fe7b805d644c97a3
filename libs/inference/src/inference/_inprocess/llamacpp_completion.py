"""One llama.cpp request's generated tokens, turned into its text, pieces, logprobs and finish reason.

Both ways the llama.cpp provider generates (one request at a time with ``Llama.generate``, or many sequences
in one decode loop, :mod:`inference._inprocess.llamacpp_batch`) feed each sampled token to a
:class:`Completion`, so the rules of when a request ends and what its text is live here only:

- an end-of-generation token ends it (``finish_reason="stop"``) and is not part of the text;
- a stop string ends it; the text stops before it, and the token that completed it has no logprob entry;
- a JSON-schema mask that is complete ends it (``"stop"``);
- otherwise it ends after its token limit (``"length"``);
- logits that are not finite (NaN, infinity, or all equal: an adapter or scale too large for the model's
  numbers) fail it with :class:`~inference.ProviderError` before their token counts, whatever token the sampler
  drew from them.

Text is decoded incrementally from each token's bytes, so a character split over two tokens appears once
whole, and pieces (see :class:`~inference._inprocess.streaming.PieceAssembler`) never show a stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import Any

from inference._core.validation import GenerationRequest
from inference._inprocess.base import non_finite_logits
from inference._inprocess.llamacpp_logits import JsonMask, finite_logits, token_logprob
from inference._inprocess.streaming import PieceAssembler, PieceSink, tokens_of_text
from inference.provider import GenerationResult
from inference.results import TokenLogprob

__all__ = ["Completion", "TokenText"]


class TokenText:
    """What a completion needs to know about the model's tokens (all on the worker thread).

    Args:
        llama_cpp: The ``llama_cpp`` module.
        numpy: The ``numpy`` module.
        llama: The ``Llama`` object.
        provider: The provider's name, for errors.
    """

    def __init__(self, llama_cpp: Any, numpy: Any, llama: Any, provider: str = "llamacpp") -> None:
        self.llama_cpp = llama_cpp
        self.numpy = numpy
        self.llama = llama
        self.provider = provider
        self.vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self.n_vocab: int = llama.n_vocab()

    def is_end(self, token: int) -> bool:
        """True for the model's end-of-generation tokens."""
        return bool(self.llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def raw_bytes(self, token: int) -> bytes:
        """The bytes a token adds to the text (special tokens render as nothing)."""
        return bytes(self.llama.detokenize([token]))

    def shown(self, token: int) -> str:
        """A token as logprob entries name it (special tokens by their text)."""
        return bytes(self.llama.detokenize([token], special=True)).decode("utf-8", errors="replace")

    def logits(self, ctx: Any, row: int) -> Any:
        """The logits row ``row`` of the last ``llama_decode`` (``-1``: the last row), as a numpy view."""
        return self.numpy.ctypeslib.as_array(self.llama_cpp.llama_get_logits_ith(ctx, row), shape=(self.n_vocab,))


class Completion:
    """The state of one request's generation, fed one sampled token at a time.

    Args:
        request: The request (its stop strings, logprobs and ``max_tokens``).
        tokens: The model's token helpers.
        sink: Receives each text piece as it becomes safe to show; ``None`` when nobody streams.
        limit: The most tokens to generate (``max_tokens``, or less where the context ends first).
        mask: The request's JSON-schema mask, if it has a schema.
    """

    def __init__(
        self,
        request: GenerationRequest,
        tokens: TokenText,
        sink: PieceSink | None,
        limit: int,
        mask: JsonMask | None,
    ) -> None:
        self.request = request
        self.tokens = tokens
        self.limit = limit
        self.mask = mask
        self.generated: list[int] = []
        self.logprobs: list[TokenLogprob] | None = None if request.logprobs is None else []
        self.finish_reason = "length"
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # same text as one decode
        self._pieces = PieceAssembler(request.stop, sink)
        self._text = ""
        self._stopped = False
        self._cut = False  # a stop string cut the text

    def add(self, token: int, logits: Callable[[], Any] | None = None) -> bool:
        """Take the next sampled token; return ``True`` when the request is complete.

        Args:
            token: The sampled token.
            logits: Gives the raw logits that chose it (checked to be finite; read for logprobs).

        Raises:
            ProviderError: The logits are not finite: no token can be read from them.
        """
        row = None if logits is None else logits()
        if row is not None and not finite_logits(self.tokens.numpy, row):
            raise non_finite_logits(self.tokens.provider, self.request.adapters)
        self.generated.append(token)
        if self.tokens.is_end(token):
            self.finish_reason = "stop"
            return True
        if self.logprobs is not None and row is not None:
            self.logprobs.append(
                token_logprob(self.tokens.numpy, row, token, self.request.logprobs or 0, self.tokens.shown)
            )
        self._text += self._decoder.decode(self.tokens.raw_bytes(token))  # byte pieces concatenate to the text
        cut = self._pieces.update(self._text)
        if cut is not None:
            self._text, self.finish_reason, self._stopped, self._cut = self._text[:cut], "stop", True, True
            return True
        if self.mask is not None and self.mask.consume(token):
            self.finish_reason = "stop"  # the JSON is complete
            return True
        return len(self.generated) >= self.limit

    def _decode(self, tokens: list[int]) -> str:
        """The text of ``tokens`` (as the pieces decoded one by one make it)."""
        return b"".join(self.tokens.raw_bytes(token) for token in tokens).decode("utf-8", errors="replace")

    def result(self, *, model: str, prompt_tokens: int) -> GenerationResult:
        """The request's result (the last pieces go to the sink first)."""
        if not self._stopped:
            self._text += self._decoder.decode(b"", final=True)
            self._pieces.finish(self._text)
            self._stopped = True
        made = self.generated[:-1] if self.generated and self.tokens.is_end(self.generated[-1]) else self.generated
        kept = tokens_of_text(self._text, made, self._decode) if self._cut else len(made)
        return GenerationResult(
            text=self._text,
            model=model,
            adapter_id=self.request.adapter_id,
            token_count=prompt_tokens + len(self.generated),
            finish_reason=self.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(self.generated),
            logprobs=None if self.logprobs is None else tuple(self.logprobs[:kept]),
            token_ids=tuple(made[:kept]) if self.request.return_token_ids else None,
        )
