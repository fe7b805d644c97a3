"""The log-likelihood figures of an evaluation row: what it scores, and nll/token, acc and acc_norm from the scores.

A row scores its expected answer (not a pattern: not with the regex scorer) and each of its choices, every one after
the prompt's text as given, as lm-eval scores; :mod:`inference.evaluation.runner` sends them in one ``score_batch``
per adapter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inference.evaluation.inputs import EvalPrompt
from inference.evaluation.rows import row_error
from inference.evaluation.scoring import Scorer, regex_match
from inference.results import ScoreResult

__all__ = ["likelihood_fields", "score_pairs", "with_likelihood"]


def score_pairs(prompt: EvalPrompt, scorer: Scorer | None) -> list[tuple[str, str]]:
    """What a row scores: its expected answer (not a pattern: not with the regex scorer), then each choice, every
    one after the prompt's text as given (no chat template, no system prompt), as lm-eval scores."""
    pairs = []
    if isinstance(prompt.expected, str) and prompt.expected and scorer is not regex_match:  # text to score
        pairs.append((prompt.prompt, prompt.expected))
    pairs += [(prompt.prompt, choice) for choice in prompt.choices or ()]
    return pairs


def likelihood_fields(
    prompt: EvalPrompt, scorer: Scorer | None, items: Sequence[ScoreResult | Exception | None]
) -> dict[str, Any]:
    """The log-likelihood fields of a row from its scores (in :func:`score_pairs` order).

    - ``nll_per_token``: of ``expected`` after the prompt, when the row has an expected answer (not a pattern:
      nothing with the regex scorer).
    - For a multiple-choice row: ``choice_logprobs`` (each choice scored after the prompt), ``predicted`` (the
      highest: lm-eval's ``acc``), ``predicted_norm`` (the highest per character of the choice: lm-eval's
      ``acc_norm``), ``correct`` and ``correct_norm``.
    - ``error`` (stage ``score``) when one of the scores failed; the figures its other scores give are kept (the
      expected answer's NLL when only a choice failed, the choices' when only the expected answer did).
    """
    items = list(items)
    failed = next((item for item in items if not isinstance(item, ScoreResult)), None)
    result: dict[str, Any] = {}
    if isinstance(prompt.expected, str) and prompt.expected and scorer is not regex_match:  # text to score
        expected = items.pop(0)
        if isinstance(expected, ScoreResult):
            result["nll_per_token"] = expected.nll_per_token
    scores = [item for item in items if isinstance(item, ScoreResult)]
    if prompt.choices is not None and len(scores) == len(prompt.choices):  # every choice scored
        sums = [score.logprob for score in scores]
        normalised = [score.logprob / len(choice) for score, choice in zip(scores, prompt.choices, strict=True)]
        predicted, predicted_norm = sums.index(max(sums)), normalised.index(max(normalised))
        result |= {
            "choice_logprobs": sums,
            "predicted": predicted,
            "predicted_norm": predicted_norm,
            "correct": predicted == prompt.answer,
            "correct_norm": predicted_norm == prompt.answer,
        }
    if failed is not None:
        error = failed if isinstance(failed, Exception) else RuntimeError("no score came back")
        result["error"] = row_error("score", error)
    return result


def with_likelihood(row: dict[str, Any], likelihood: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with the log-likelihood figures computed for it, whatever else failed (a failed generation keeps
    them). A scoring failure is the row's ``error`` (stage ``score``; its generation and score are kept), or, when
    the row has an error already (its generation failed too), its ``likelihood_error``."""
    row |= {key: value for key, value in likelihood.items() if key != "error"}
    failure = likelihood.get("error")
    if failure is not None:
        row["likelihood_error" if row.get("error") else "error"] = failure
    return row
