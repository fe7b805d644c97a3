"""Scoring on llama.cpp: the shared scoring rule (:mod:`inference._core.scoring`) over the model's tokenizer.

Two ways, both on the worker thread: :func:`score` evaluates a request's sequences alone, one after another
(:func:`~inference._inprocess.llamacpp_logits.score_sequence`, ``n_parallel=1``); :class:`ScoreWork` is a request
as a sequence of the decode loop (:mod:`inference._inprocess.llamacpp_batch`, ``n_parallel > 1``), fed in chunks
beside other requests' tokens, its logits read at the scored positions after each step. Both sum the same
log-probabilities (:func:`~inference._inprocess.llamacpp_logits.logprob_of`) of the same logits.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from inference._core.dependencies import import_optional
from inference._core.scoring import ScoreTokens, Vocabulary, rolling_windows, score_tokens, too_long
from inference._core.validation import AdapterScales, ScoreRequest
from inference._inprocess.base import non_finite_logits
from inference._inprocess.llamacpp_logits import finite_logits, logprob_of, score_sequence
from inference._inprocess.llamacpp_prompt import LlamaPrompts
from inference.results import ScoreResult

__all__ = ["SHARED_CONTEXT_MIN", "ScoreJob", "ScoreWork", "score", "score_windows", "start_score", "vocabulary"]


def vocabulary(prompts: LlamaPrompts, llama: Any) -> Vocabulary:
    """The scoring rule's view of the model's tokenizer (:mod:`inference._core.scoring`)."""
    llama_cpp = prompts.model.llama_cpp()
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    bos, eos = llama.token_bos(), llama.token_eos()
    return Vocabulary(
        encode=lambda text: prompts.encode(llama, text, add_bos=False),
        adds_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        bos_id=bos if bos >= 0 else None,
        eos_id=eos if eos >= 0 else None,
    )


def score_windows(prompts: LlamaPrompts, llama: Any, request: ScoreRequest, *, rolling: bool) -> list[ScoreTokens]:
    """The sequences that score ``request``: its continuation after its context, or the whole text in rolling
    windows of the context's size (each checked against the context)."""
    model = prompts.model
    provider, n_ctx = model.provider, model.settings.n_ctx
    words = vocabulary(prompts, llama)
    sequences: list[ScoreTokens]
    if rolling:
        sequences = rolling_windows(words, request.continuation, n_ctx, provider=provider)
    else:
        sequences = [score_tokens(words, request.context, request.continuation, provider=provider)]
    for sequence in sequences:
        if len(sequence.tokens) - 1 > n_ctx:
            length = len(sequence.tokens) - 1
            raise too_long(length, n_ctx, provider=provider, setting="n_ctx (LLAMACPP_N_CTX)")
    return sequences


def score(
    prompts: LlamaPrompts, llama: Any, request: ScoreRequest, adapters: AdapterScales, *, rolling: bool
) -> ScoreResult:
    """Score ``request`` on ``llama`` (``adapters`` applied), its sequences evaluated alone one after another."""
    model = prompts.model
    provider = model.provider
    sequences = score_windows(prompts, llama, request, rolling=rolling)
    numpy = import_optional("numpy", provider=provider, extra="llamacpp")
    logprob, greedy, count = 0.0, True, 0
    for sequence in sequences:
        value, is_greedy = score_sequence(model.llama_cpp(), numpy, llama, sequence)
        if not math.isfinite(value):  # NaN or infinite logits: finite ones give a finite log-softmax
            raise non_finite_logits(provider, adapters)
        logprob, greedy, count = logprob + value, greedy and is_greedy, count + len(sequence.scored)
    return ScoreResult(logprob, count, greedy, model=model.name, adapter_id=request.adapter_id)


@dataclass(frozen=True)
class ScoreJob:
    """A score request as it waits for the decode loop.

    Attributes:
        request: The validated request (its ``adapter_id`` is the backend's name, applied with scale 1).
        rolling: ``score_rolling`` (the whole continuation in windows) rather than ``score``.
    """

    request: ScoreRequest
    rolling: bool

    @property
    def adapters(self) -> AdapterScales:
        """The adapters the request is scored with (``()``: the base model)."""
        adapter_id = self.request.adapter_id
        return ((adapter_id, 1.0),) if adapter_id is not None else ()


SHARED_CONTEXT_MIN = 2
"""The fewest context tokens a score shares with others of the decode loop (one token is not worth a step)."""


@dataclass(eq=False)
class ScoreWork:
    """A score request in the decode loop: its windows fed one after another to one sequence of the loop.

    The loop feeds :attr:`prompt` (the current window's tokens but the last) in chunks, asks for logits where
    :meth:`logits_at` says, notes each such row (:meth:`note`) and, after the step, calls :meth:`read`. When a
    window is all in, :meth:`next_window` moves to the next one (the loop frees the sequence's cells first) or
    says the request is done (:meth:`result`).

    Attributes:
        windows: The sequences to evaluate, each from an empty sequence.
        adapters: The adapters applied (for the error of non-finite logits).
        model: The model's name, for the result.
        adapter_id: The adapter id of the result.
        llama_cpp: The ``llama_cpp`` module.
        numpy: The ``numpy`` module.
        n_vocab: The vocabulary's size (a logits row's length).
        provider: The provider's name, for errors.
    """

    windows: list[ScoreTokens]
    adapters: AdapterScales
    model: str
    adapter_id: str | None
    llama_cpp: Any
    numpy: Any
    n_vocab: int
    provider: str
    window: int = 0
    logprob: float = 0.0
    greedy: bool = True
    count: int = 0
    pending: list[tuple[int, int]] = field(default_factory=list)  # (batch row, position) of the step decoded

    @property
    def prompt(self) -> tuple[int, ...]:
        """The tokens the model reads for the current window."""
        return self.windows[self.window].tokens[:-1]

    @property
    def cells(self) -> int:
        """The KV cells it needs: its longest window's."""
        return max(len(window.tokens) - 1 for window in self.windows)

    @functools.cached_property
    def shared_context(self) -> tuple[int, ...] | None:
        """The tokens before its first scored token, which another score of the loop may read for it (the decode
        loop shares them: :class:`~inference._inprocess.llamacpp_batch.ContinuousBatcher`); ``None`` for a score
        of several windows, or a context too short to be worth sharing (a lone BOS)."""
        if len(self.windows) != 1 or self.windows[0].start < SHARED_CONTEXT_MIN:
            return None
        return self.windows[0].tokens[: self.windows[0].start]

    def logits_at(self, position: int) -> bool:
        """Whether the logits after ``prompt[position]`` score a token."""
        return position + 1 >= self.windows[self.window].start

    def note(self, row: int, position: int) -> None:
        """Row ``row`` of the step being built holds the logits after ``prompt[position]``."""
        self.pending.append((row, position))

    def read(self, ctx: Any) -> None:
        """Add the scored tokens of the step just decoded (their rows in ``ctx``'s logits).

        Raises:
            ProviderError: The logits are not finite (an adapter too large for the model's numbers).
        """
        numpy, tokens = self.numpy, self.windows[self.window].tokens
        pending, self.pending = self.pending, []
        for row, position in pending:
            logits = numpy.ctypeslib.as_array(self.llama_cpp.llama_get_logits_ith(ctx, row), shape=(self.n_vocab,))
            if not finite_logits(numpy, logits):
                raise non_finite_logits(self.provider, self.adapters)
            target = tokens[position + 1]
            self.logprob += logprob_of(numpy, logits, target)
            self.greedy = self.greedy and int(numpy.argmax(logits)) == target
            self.count += 1

    def next_window(self) -> bool:
        """Move to the next window; ``False`` when this was the last."""
        if self.window + 1 >= len(self.windows):
            return False
        self.window += 1
        return True

    def result(self) -> ScoreResult:
        """The request's score, once every window is read."""
        return ScoreResult(self.logprob, self.count, self.greedy, model=self.model, adapter_id=self.adapter_id)

    def close(self) -> None:
        """Nothing to release (a generation's sampler is closed here)."""


def start_score(prompts: LlamaPrompts, llama: Any, job: ScoreJob) -> ScoreWork:
    """Tokenise and check a score request for the decode loop (raises an inference error to refuse it)."""
    model = prompts.model
    numpy = import_optional("numpy", provider=model.provider, extra="llamacpp")
    windows = score_windows(prompts, llama, job.request, rolling=job.rolling)
    return ScoreWork(
        windows,
        job.adapters,
        model.name,
        job.request.adapter_id,
        model.llama_cpp(),
        numpy,
        int(llama.n_vocab()),
        model.provider,
    )
