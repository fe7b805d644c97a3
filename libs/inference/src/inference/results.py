"""What providers return: a generation's result, its token log-probabilities, a log-likelihood score.

Every provider returns these same types, so code that reads them never depends on the backend.
:class:`GenerationResult` is also importable from :mod:`inference.provider`, where it has always been.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.messages import Message, ToolCallDict

__all__ = [
    "FINISH_REASONS",
    "BatchItem",
    "GenerationResult",
    "ScoreItem",
    "ScoreResult",
    "StreamEvent",
    "TokenLogprob",
    "ToolCall",
]

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter"})
"""The ``finish_reason`` values of a result: a finished text. A backend that ends a generation otherwise (vLLM's
``"abort"``, an ``"error"``) fails the call with a :class:`~inference.exceptions.ProviderError` instead."""


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
class ToolCall:
    """One call of a tool the model asked for (see :mod:`inference.tools`).

    Attributes:
        id: The call's id (the backend's, or one made up where it gives none): a tool message answers it with
            ``{"role": "tool", "tool_call_id": id, "content": ...}`` (:meth:`answer` builds it).
        name: The tool's name, one of the request's ``tools``.
        arguments: The arguments, parsed from the JSON the model wrote. With ``tool_choice`` ``"required"`` or a
            named tool, they always parse and validate against the tool's ``parameters`` where the backend
            constrains decoding. With ``"auto"``, a call whose arguments do not parse as a JSON object is
            reported, not dropped: ``arguments`` is then ``{}`` and :attr:`error` says why; arguments that parse
            but do not validate against ``parameters`` are kept here, with :attr:`error` set too.
        raw_arguments: The arguments as the model wrote them (JSON text); for a call built from a dict, that dict
            as JSON.
        error: ``None`` when the arguments parsed (and validated, where the tool's schema was checked); else a
            sentence saying what is wrong with them, to send back to the model or to log.
    """

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str = ""
    error: str | None = None

    def __post_init__(self) -> None:
        if not self.raw_arguments and self.error is None:
            object.__setattr__(self, "raw_arguments", json.dumps(self.arguments, ensure_ascii=False))

    def as_dict(self) -> ToolCallDict:
        """The call in OpenAI's shape, as an assistant message's ``tool_calls`` holds it:
        ``{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.raw_arguments}}

    def answer(self, content: object) -> Message:
        """The tool message that answers this call: ``{"role": "tool", "tool_call_id": id, "content": ...}``.

        Args:
            content: The tool's result: a string as it is, anything else as JSON (``json.dumps``).
        """
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
        return {"role": "tool", "tool_call_id": self.id, "content": text}


@dataclass(frozen=True)
class GenerationResult:
    """What one generation produced.

    Attributes:
        text: The generated text (without the prompt).
        model: The model that answered (for servers, the name the server reports).
        adapter_id: The adapter used, or ``None`` for the base model.
        token_count: Prompt tokens plus completion tokens; ``None`` when the backend did not report the prompt's
            tokens (a server that sends no usage in a stream).
        finish_reason: ``"stop"`` (end of sequence or a stop string), ``"length"`` (``max_tokens`` reached),
            ``"tool_calls"`` (the model called tools: :attr:`tool_calls`) or, from a hosted API, ``"content_filter"``
            (its filter cut the text). Never an engine error or an abort: those are a ``ProviderError``. With
            ``json_schema``, ``"length"`` means the JSON may be cut short (the text is the beginning of a JSON text);
            ``"stop"`` means it is complete and valid against the schema (a backend text that is not is a
            ``ProviderError``, never a result).
        prompt_tokens: Tokens in the prompt as the backend counted them; ``None`` when it did not say.
        completion_tokens: Tokens generated: the end-of-sequence token that ended the text counts, and so do the
            tokens of a stop string cut from it (as llama.cpp and vLLM count).
        logprobs: One :class:`TokenLogprob` per generated token when the request asked for ``logprobs``,
            else ``None``. Tokens cut off by a stop string are not included.
        reasoning: What a thinking model wrote before its answer, where the backend returns it separately
            (Ollama's ``message.thinking``, vLLM's ``reasoning``; in process, a leading ``<think>...</think>`` of
            the generated text); ``None`` otherwise. Not part of ``text``.
        tool_calls: The tools the model called, in order (each a :class:`ToolCall`), or ``None`` when it called
            none. ``text`` holds what it wrote besides the calls (often ``""``).
        provider: Which provider answered, where a :class:`~inference.fallback.FallbackProvider` chose among
            several (the label of the one that answered); ``None`` from a provider called directly.
        token_ids: The generated token ids when the request asked for them (``return_token_ids=True``), else
            ``None``: the tokens that make ``text``, as the model produced them. The end-of-sequence token is not
            included, nor the tokens of a stop string cut from ``text`` (a token only partly in ``text`` is), so
            ``detokenize(token_ids)`` starts with ``text`` (and is ``text`` when no stop string cut a token). The
            vLLM server's are vLLM's own, which go on to those tokens.
        choices: The ``n`` completions when the request asked for ``n > 1``, in order, each a result of its own
            (its text, finish reason, logprobs, tool calls, reasoning and token counts); ``None`` for ``n = 1``.
            This result is then the first choice (``text == choices[0].text``...) except for its token counts,
            which add up: ``completion_tokens`` is the sum over the choices, ``prompt_tokens`` the prompt's, counted
            once (as OpenAI's ``usage``), and ``token_count`` their sum. Each choice's ``prompt_tokens`` is the
            prompt's too, and its ``token_count`` the prompt plus its own completion. From a server that counts only
            the whole answer (OpenAI's ``usage``), these are the server's counts, and a choice's
            ``completion_tokens`` is 0 with ``token_count`` ``None`` (unknown).
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
    tool_calls: tuple[ToolCall, ...] | None = None
    provider: str | None = None
    token_ids: tuple[int, ...] | None = None
    choices: tuple[GenerationResult, ...] | None = None

    @classmethod
    def from_choices(
        cls, choices: Sequence[GenerationResult], *, usage: tuple[int | None, int] | None = None
    ) -> GenerationResult:
        """The result of a request for ``len(choices)`` completions: the first choice, with every choice in
        :attr:`choices` and the token counts added up (see :attr:`choices`); a single choice is returned as it is.

        Args:
            choices: The completions, in order.
            usage: ``(prompt_tokens, completion_tokens)`` of the whole request where the backend counted them
                itself (a server's ``usage``: the prompt once, the completions summed); by default the first
                choice's prompt tokens and the sum of the choices' completion tokens.

        Raises:
            ValueError: ``choices`` is empty.
        """
        if not choices:
            raise ValueError("from_choices needs at least one choice")
        first = choices[0]
        if len(choices) == 1:
            return first
        prompt_tokens, completion_tokens = (
            (first.prompt_tokens, sum(choice.completion_tokens for choice in choices)) if usage is None else usage
        )
        return replace(
            first,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            token_count=None if prompt_tokens is None else prompt_tokens + completion_tokens,
            choices=tuple(choice if choice.choices is None else replace(choice, choices=None) for choice in choices),
        )

    def as_message(self) -> Message:
        """The result as the assistant message that continues the conversation: ``{"role": "assistant",
        "content": text}``, with ``"tool_calls"`` (OpenAI's dicts) when the model called tools."""
        if not self.tool_calls:
            return {"role": "assistant", "content": self.text}
        return {"role": "assistant", "content": self.text, "tool_calls": [call.as_dict() for call in self.tool_calls]}


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
