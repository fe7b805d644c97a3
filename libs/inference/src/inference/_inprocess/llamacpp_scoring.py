"""Scoring on llama.cpp: the shared scoring rule (:mod:`inference._core.scoring`) over the model's tokenizer, each
sequence evaluated once (:func:`~inference._inprocess.llamacpp_logits.score_sequence`). On the worker thread."""

from __future__ import annotations

import math
from typing import Any

from inference._core.dependencies import import_optional
from inference._core.scoring import ScoreTokens, Vocabulary, rolling_windows, score_tokens, too_long
from inference._core.validation import AdapterScales, ScoreRequest
from inference._inprocess.base import non_finite_logits
from inference._inprocess.llamacpp_logits import score_sequence
from inference._inprocess.llamacpp_prompt import LlamaPrompts
from inference.results import ScoreResult

__all__ = ["score", "vocabulary"]


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


def score(
    prompts: LlamaPrompts, llama: Any, request: ScoreRequest, adapters: AdapterScales, *, rolling: bool
) -> ScoreResult:
    """Score ``request`` on ``llama`` (``adapters`` applied): its continuation after its context, or the whole text
    in rolling windows of the context's size."""
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
    numpy = import_optional("numpy", provider=provider, extra="llamacpp")
    logprob, greedy, count = 0.0, True, 0
    for sequence in sequences:
        value, is_greedy = score_sequence(model.llama_cpp(), numpy, llama, sequence)
        if not math.isfinite(value):  # NaN or infinite logits: finite ones give a finite log-softmax
            raise non_finite_logits(provider, adapters)
        logprob, greedy, count = logprob + value, greedy and is_greedy, count + len(sequence.scored)
    return ScoreResult(logprob, count, greedy, model=model.name, adapter_id=request.adapter_id)
