"""Evaluate many LoRA adapters on one prompt set: resumable JSONL results, scoring, a per-adapter summary.

Example:
    >>> import asyncio
    >>> from inference.evaluation import evaluate_adapters
    >>> summary = asyncio.run(evaluate_adapters(  # doctest: +SKIP
    ...     "runs/*/adapter", "prompts.jsonl",
    ...     {"provider": "llamacpp", "model_path": "base.gguf", "max_tokens": 64, "temperature": 0},
    ...     "results.jsonl", scorer="exact"))
    >>> print(summary.format_table(sort_by="score"))  # doctest: +SKIP
    >>> best = summary.best("score")  # None when no adapter was scored  # doctest: +SKIP

See ``docs/evaluation.md`` for the file formats and resumption rules.
"""

from __future__ import annotations

from inference.evaluation.identity import ResultsFileMismatchError, adapter_hash, prompt_hash, run_settings
from inference.evaluation.inputs import (
    BASE_MODEL_ID,
    AdapterSpec,
    EvalPrompt,
    adapter_id_for,
    discover_adapters,
    load_prompts,
)
from inference.evaluation.progress import Progress, TerminalProgress
from inference.evaluation.rows import ROW_FIELDS, ResultsFileInUseError, read_rows
from inference.evaluation.runner import (
    DEFAULT_MAX_TOKENS,
    GENERATION_KEYS,
    MODES,
    evaluate_adapters,
    generation_settings,
)
from inference.evaluation.scoring import SCORERS, Scorer, exact_match, regex_match, resolve_scorer
from inference.evaluation.summary import (
    METRICS,
    AdapterSummary,
    AdapterTimings,
    EvaluationSummary,
    summary_csv_path,
    summary_plot_path,
)

__all__ = [
    "BASE_MODEL_ID",
    "DEFAULT_MAX_TOKENS",
    "GENERATION_KEYS",
    "METRICS",
    "MODES",
    "ROW_FIELDS",
    "SCORERS",
    "AdapterSpec",
    "AdapterSummary",
    "AdapterTimings",
    "EvalPrompt",
    "EvaluationSummary",
    "Progress",
    "ResultsFileInUseError",
    "ResultsFileMismatchError",
    "Scorer",
    "TerminalProgress",
    "adapter_hash",
    "adapter_id_for",
    "discover_adapters",
    "evaluate_adapters",
    "exact_match",
    "generation_settings",
    "load_prompts",
    "prompt_hash",
    "read_rows",
    "regex_match",
    "resolve_scorer",
    "run_settings",
    "summary_csv_path",
    "summary_plot_path",
]
