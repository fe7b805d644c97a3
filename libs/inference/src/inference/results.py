"""What providers return: a generation's result, its token log-probabilities, a log-likelihood score.

Every provider returns these same types, so code that reads them never depends on the backend.
:class:`GenerationResult` is also importable from :mod:`inference.provider`, where it has always been.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchItem", "GenerationResult", "ScoreItem", "ScoreResult", "StreamEvent", "TokenLogprob"]


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token with its log-probability (natural log) and the most likely alternatives.

    Attributes:
        token: The token's text. A token that ends inside a multi-byte UTF-8 character shows the bytes it
            holds decoded with replacement (``"\\ufffd"``); the result's ``text`` is always whole characters.
        logprob: The log-probability of this token under the distribution it was chosen from: the model's
            output after the adapter, before sampling settings (temperature, top-p) reshape it.
        top_logprobs: The ``k`` most likely tokens at this position as ``(token, logprob)`` pairs, best first
            (``k`` is the request's ``logprobs``; empty when it is 0).
        token_id: The token's id in the model's vocabulary, where the backend reports it (``None`` otherwise).
    """

    token: str
    logprob: float
    top_logprobs: tuple[tuple[str, float], ...] = ()
    token_id: int | None = None


@dataclass(frozen=True)
class GenerationResult:
    """What one generation produced.

    Attributes:
        text: The generated text (without the prompt).
        model: The model that answered (for servers, the name the server reports).
        adapter_id: The adapter used, or ``None`` for the base model.
        token_count: Prompt tokens plus completion tokens; ``None`` when the backend did not report the prompt's
            tokens (a server that sends no usage in a stream).
        finish_reason: ``"stop"`` (end of sequence or a stop string) or ``"length"`` (``max_tokens`` reached).
            With ``json_schema``, ``"length"`` means the JSON may be cut short; ``"stop"`` means it is complete.
        prompt_tokens: Tokens in the prompt as the backend counted them; ``None`` when it did not say.
        completion_tokens: Tokens generated.
        logprobs: One :class:`TokenLogprob` per generated token when the request asked for ``logprobs``,
            else ``None``. Tokens cut off by a stop string are not included.
        reasoning: What a thinking model wrote before its answer, where the backend returns it separately
            (Ollama's ``message.thinking``, vLLM's ``reasoning``); ``None`` otherwise. Not part of ``text``.
        token_ids: The generated token ids when the request asked for them (``return_token_ids=True``), else
            ``None``: the tokens that make ``text``, as the model produced them. The end-of-sequence token is not
            included, nor the tokens of a stop string cut from ``text`` (a token only partly in ``text`` is), so
            ``detokenize(token_ids)`` starts with ``text`` (and is ``text`` when no stop string cut a token).
    """

    text: str
    model: str
    adapter_id: str | None
    token_count: int | None
    finish_reason: str
    prompt_tokens: int | None = 0
    completion_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    reasoning: str | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ScoreResult:
    """The log-likelihood of a continuation given a context (or of a whole text, for ``score_rolling``).

    Attributes:
        logprob: Sum of the natural-log probabilities of the continuation's tokens.
        num_tokens: How many tokens the continuation is.
        is_greedy: Every continuation token was the model's most likely token at its position (lm-eval's
            ``is_greedy``).
        model: The model that scored (for servers, the name the server reports).
        adapter_id: The adapter used, or ``None`` for the base model.
    """

    logprob: float
    num_tokens: int
    is_greedy: bool
    model: str = ""
    adapter_id: str | None = None

    @property
    def nll_per_token(self) -> float:
        """The negative log-likelihood per token (``-logprob / num_tokens``), as Text-to-LoRA reports it."""
        return -self.logprob / self.num_tokens


StreamEvent = str | GenerationResult
"""What :meth:`~inference.InferenceProvider.stream` yields: text pieces (``str``), then one
:class:`GenerationResult` (which carries the token ``logprobs`` when they were asked for)."""

BatchItem = GenerationResult | Exception
"""One place of ``generate_batch``'s answer: the result, or the error of that item."""

ScoreItem = ScoreResult | Exception
"""One place of ``score_batch``'s answer: the score, or the error of that item."""
