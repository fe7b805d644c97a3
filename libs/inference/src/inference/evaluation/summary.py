"""Per-adapter summary of a results file: score, log-likelihood figures, latency, errors, each adapter's difference
from the base model, the best adapter per figure; as a table, a dict, CSV or a plot."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from inference.evaluation.identity import first_row_per_pair
from inference.evaluation.inputs import BASE_MODEL_ID, AdapterSpec
from inference.evaluation.rows import check_file_path, row_key
from inference.exceptions import ConfigurationError, InvalidRequestError

__all__ = [
    "COMPARED_METRICS",
    "METRICS",
    "METRIC_LABELS",
    "AdapterSummary",
    "AdapterTimings",
    "EvaluationSummary",
    "summarise",
    "summary_csv_path",
    "summary_plot_path",
]


METRICS: dict[str, str] = {
    "score": "higher",
    "nll_per_token": "lower",
    "acc": "higher",
    "acc_norm": "higher",
    "mean_latency_s": "lower",
    "tokens_per_s": "higher",
}
"""The figures :meth:`EvaluationSummary.best` and :meth:`~EvaluationSummary.ranked` rank by, and which way is better
(``"higher"`` or ``"lower"``)."""

COMPARED_METRICS = ("score", "nll_per_token", "acc", "acc_norm")
"""The figures whose difference from the base model each adapter carries (``score_delta``...), each measured over
the prompts where both have the figure."""

METRIC_LABELS: dict[str, str] = {
    "score": "score",
    "nll_per_token": "nll/token",
    "acc": "acc",
    "acc_norm": "acc_norm",
    "mean_latency_s": "latency_s",
    "tokens_per_s": "tokens/s",
}
"""How the table, the "best" lines and the plot name each figure."""


@dataclass(frozen=True)
class AdapterTimings:
    """Wall-clock seconds this run spent on one adapter (absent for adapters an earlier run finished).

    Attributes:
        load_s: ``load_adapter``.
        generate_s: From the first generation request to the last answer.
        unload_s: ``unload_adapter``.
        score_s: From the first scoring request (every expected answer and choice of the adapter's prompts, in one
            batch) to the last score.
    """

    load_s: float = 0.0
    generate_s: float = 0.0
    unload_s: float = 0.0
    score_s: float = 0.0


@dataclass(frozen=True)
class AdapterSummary:
    """The figures of one adapter (or of the base model) over its rows.

    Attributes:
        adapter_id: The adapter id (:data:`~inference.evaluation.inputs.BASE_MODEL_ID`, ``"(base)"``, for the base
            model).
        adapter_path: Where it was loaded from (absolute); ``None`` for weights in memory and the base model.
        rows: Rows in the results file for this adapter and the prompt set.
        errors: Rows with an error (load, generation or scoring), or whose scorer raised.
        load_error: The load error's sentence when the adapter could not be loaded, else ``None``.
        score: Mean score over the scored rows (a row whose log-likelihood scoring failed keeps its score), or
            ``None`` when none was scored.
        scored: Rows with a score.
        mean_latency_s: Mean seconds per successful generation request (``None`` when nothing was generated).
        tokens_per_s: Completion tokens per second of request latency (one request's decoding speed).
        completion_tokens: Completion tokens over the rows whose generation succeeded.
        load_s: Seconds to load it in this run (``None`` if an earlier run did it).
        generate_s: Seconds of generation in this run (``None`` if an earlier run did it).
        unload_s: Seconds to unload it in this run (``None`` if an earlier run did it).
        adapter_hash: The content hash of its files or weights (see
            :func:`~inference.evaluation.identity.adapter_hash`); ``None`` for the base model.
        nll_per_token: Mean over the rows that have it of the expected answer's negative log-likelihood per
            token (``None`` when no row has it: no ``expected``, or a provider that cannot score). Lower is better.
            A row whose generation failed keeps it.
        acc: Multiple-choice accuracy, the choice with the highest log-likelihood (lm-eval's ``acc``), over the
            rows with ``choices`` whose choices were all scored; ``None`` without such rows.
        acc_norm: The same with each choice's log-likelihood divided by its length in characters (lm-eval's
            ``acc_norm``).
        score_s: Seconds of scoring (log-likelihoods) in this run (``None`` if an earlier run did it).
        score_delta: The mean score minus the base model's, both over the prompts where the adapter and the base
            model both have a score (so a prompt that failed on one side counts on neither; the difference can
            then differ from ``score`` minus the base's ``score``); ``None`` without a base row or without such
            prompts.
        nll_per_token_delta: The same for ``nll_per_token``: negative is better.
        acc_delta: The same for ``acc``: positive is better.
        acc_norm_delta: The same for ``acc_norm``: positive is better.
    """

    adapter_id: str
    adapter_path: str | None
    rows: int
    errors: int
    load_error: str | None
    score: float | None
    scored: int
    mean_latency_s: float | None
    tokens_per_s: float | None
    completion_tokens: int
    load_s: float | None = None
    generate_s: float | None = None
    unload_s: float | None = None
    adapter_hash: str | None = None
    nll_per_token: float | None = None
    acc: float | None = None
    acc_norm: float | None = None
    score_s: float | None = None
    score_delta: float | None = None
    nll_per_token_delta: float | None = None
    acc_delta: float | None = None
    acc_norm_delta: float | None = None


def summary_csv_path(output: str | os.PathLike[str]) -> Path:
    """Where the CSV summary of ``output`` goes: ``results.jsonl`` -> ``results.summary.csv``.

    Any other name is kept whole, followed by ``-summary.csv`` (``results`` -> ``results-summary.csv``,
    ``results.json`` -> ``results.json-summary.csv``): only a ``.jsonl`` file's summary ends in ``.summary.csv``, so
    two output files never share a summary (``results`` and ``results.jsonl`` did).

    Example:
        >>> summary_csv_path("out/results.jsonl").name, summary_csv_path("out/results").name
        ('results.summary.csv', 'results-summary.csv')
    """
    output = Path(output)
    if output.suffix == ".jsonl":
        return output.with_name(f"{output.stem}.summary.csv")
    return output.with_name(f"{output.name}-summary.csv")


def summary_plot_path(output: str | os.PathLike[str]) -> Path:
    """Where the plot of ``output``'s summary goes, beside the CSV: ``results.jsonl`` -> ``results.summary.png``
    (``results`` -> ``results-summary.png``)."""
    return summary_csv_path(output).with_suffix(".png")


@dataclass(frozen=True)
class EvaluationSummary:
    """The outcome of :func:`~inference.evaluation.evaluate_adapters`.

    Which adapter is best: ``summary.best("acc")`` (``None`` when no adapter has that figure), or
    ``summary.ranked("nll_per_token")`` for all of them, best first; each knows which way is better
    (:data:`METRICS`).

    Attributes:
        adapters: One summary per adapter, in run order (the base model is not among them: see ``base``).
        output: The JSONL results file.
        csv_path: The CSV summary written next to it.
        rows_total: Rows of the run: adapters (and the base model) times prompts.
        rows_written: Rows this run wrote.
        rows_resumed: Rows an earlier run had written (skipped now).
        elapsed_s: Seconds this run took.
        base: The base model's figures (no adapter), the reference of each adapter's ``*_delta``; ``None`` when the
            run had no base row (``base=False``).
        mode: ``"generate"`` (rows were generated, and scored where the provider can) or ``"score"`` (only scored).
    """

    adapters: tuple[AdapterSummary, ...]
    output: Path
    csv_path: Path
    rows_total: int
    rows_written: int
    rows_resumed: int
    elapsed_s: float
    base: AdapterSummary | None = None
    mode: str = "generate"

    @property
    def errors(self) -> int:
        """Rows with an error, over every adapter and the base model."""
        return sum(adapter.errors for adapter in self._everyone())

    @property
    def plot_path(self) -> Path:
        """Where :meth:`write_plot` writes by default: beside the CSV (``results.summary.png``)."""
        return self.csv_path.with_suffix(".png")

    def timings(self) -> dict[str, float]:
        """Seconds this run spent loading, scoring, generating and unloading, summed over the adapters (and the base
        model). With several adapters in flight they overlap, so the sum can exceed :attr:`elapsed_s`."""
        return {
            name: sum(getattr(adapter, name) or 0.0 for adapter in self._everyone())
            for name in ("load_s", "score_s", "generate_s", "unload_s")
        }

    def ranked(self, metric: str) -> list[AdapterSummary]:
        """The adapters that have ``metric``, best first (lower first for ``nll_per_token`` and
        ``mean_latency_s``, higher first for the others); ties keep the run order. The base model is not ranked.

        Raises:
            InvalidRequestError: ``metric`` is not one of :data:`METRICS`.
        """
        higher = _direction(metric) == "higher"
        having = [adapter for adapter in self.adapters if getattr(adapter, metric) is not None]
        return sorted(having, key=lambda adapter: float(getattr(adapter, metric)), reverse=higher)

    def best(self, metric: str) -> AdapterSummary | None:
        """The best adapter by ``metric`` (see :meth:`ranked`), or ``None`` when no adapter has that figure (no
        scorer, no expected answers, no choices, or every row failed).

        Example:
            >>> summary = EvaluationSummary((), Path("r.jsonl"), Path("r.summary.csv"), 0, 0, 0, 0.0)
            >>> print(summary.best("acc"))
            None

        Raises:
            InvalidRequestError: ``metric`` is not one of :data:`METRICS`.
        """
        ranked = self.ranked(metric)
        return ranked[0] if ranked else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (paths as strings)."""
        data = asdict(self)
        data["output"], data["csv_path"] = str(self.output), str(self.csv_path)
        data["errors"] = self.errors
        data["timings"] = self.timings()
        data["best"] = {
            metric: {"adapter_id": best.adapter_id, "value": getattr(best, metric), "better": METRICS[metric]}
            for metric in COMPARED_METRICS
            if (best := self.best(metric)) is not None
        }
        return data

    def format_table(self, sort_by: str | None = None) -> str:
        """A plain-text table: the base model's line first (where there is one), then one line per adapter, in run
        order or best first by ``sort_by`` (a :data:`METRICS` name); then the best adapter per figure, with which
        way is better.

        An adapter's figures carry their difference from the base model in brackets: ``0.650 (+0.150)``. Generating
        runs show the score, latency and tokens/s; the log-likelihood columns appear when some adapter has them.

        Raises:
            InvalidRequestError: ``sort_by`` is not one of :data:`METRICS`.
        """
        adapters = list(self.adapters)
        if sort_by is not None:  # best first, then the adapters without the figure, in run order
            adapters = self.ranked(sort_by) + [adapter for adapter in adapters if getattr(adapter, sort_by) is None]
        everyone = [*([self.base] if self.base is not None else []), *adapters]
        likelihood = [
            name for name in ("nll_per_token", "acc", "acc_norm") if any(getattr(a, name) is not None for a in everyone)
        ]  # columns only when some adapter has the figure
        generated = self.mode != "score"
        compared = (["score"] if generated else []) + likelihood
        header = (
            "adapter",
            "rows",
            *(METRIC_LABELS[name] for name in compared),
            *(("latency_s", "tokens/s") if generated else ()),
            "errors",
        )
        lines = [header]
        for adapter in everyone:
            errors = str(adapter.errors) + (" (load failed)" if adapter.load_error else "")
            lines.append(
                (
                    adapter.adapter_id,
                    str(adapter.rows),
                    *(self._figure(adapter, name) for name in compared),
                    *(
                        (_number(adapter.mean_latency_s, "{:.3f}"), _number(adapter.tokens_per_s, "{:.1f}"))
                        if generated
                        else ()
                    ),
                    errors,
                )
            )
        widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
        text = [
            "  ".join(
                cell.ljust(width) if column == 0 else cell.rjust(width)
                for column, (cell, width) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
            for line in lines
        ]
        bests = [(name, self.best(name)) for name in compared]
        if len(self.adapters) > 1 or self.base is not None:
            label_width = max((len(METRIC_LABELS[name]) for name, best in bests if best is not None), default=0)
            for name, best in bests:
                if best is None:
                    continue
                reference = getattr(self.base, name) if self.base is not None else None
                text.append(
                    f"best {(METRIC_LABELS[name] + ':').ljust(label_width + 1)} {best.adapter_id} "
                    f"{getattr(best, name):.3f} ({METRICS[name]} is better"
                    + (f"; base model {reference:.3f}" if reference is not None else "")
                    + ")"
                )
        return "\n".join(text)

    def write_csv(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the per-adapter figures as CSV (to :attr:`csv_path` by default) and return the path: the base
        model's line first (``adapter_id`` ``(base)``) where the run has one, then the adapters in run order.

        Raises:
            ConfigurationError: The file cannot be written (the message names it), or the path is not a regular
                file (a pipe, a device).
        """
        target = Path(path) if path is not None else self.csv_path
        check_file_path(target, "summary file")
        names = [field.name for field in fields(AdapterSummary)]
        try:
            with open(target, "w", newline="", encoding="utf-8") as handle:
                writer = csv.DictWriter(handle, fieldnames=names)
                writer.writeheader()
                for adapter in self._everyone():
                    writer.writerow({key: "" if value is None else value for key, value in asdict(adapter).items()})
        except OSError as error:
            raise ConfigurationError(
                f"cannot write the summary {target}: {error.strerror or error}", path=str(target)
            ) from error
        return target

    def write_plot(self, path: str | os.PathLike[str] | None = None, *, metrics: Sequence[str] | None = None) -> Path:
        """Draw each figure per adapter as a PNG (to :attr:`plot_path` by default, beside the CSV) and return the
        path: one panel per figure (those of :data:`COMPARED_METRICS` some adapter has, or ``metrics``), the base
        model as a dashed line, the best adapter marked, which way is better in the title. Needs matplotlib (the
        ``plot`` extra); see :func:`~inference.evaluation.plot.plot_summary`.

        Raises:
            MissingDependencyError: matplotlib is not installed (``pip install 'inference-adapters[plot]'``).
            InvalidRequestError: No adapter has any of the figures, or a name is not one of :data:`METRICS`.
            ConfigurationError: The file cannot be written.
        """
        from inference.evaluation.plot import plot_summary  # matplotlib only when a plot is drawn

        return plot_summary(self, Path(path) if path is not None else self.plot_path, metrics=metrics)

    def _everyone(self) -> list[AdapterSummary]:
        return [*([self.base] if self.base is not None else []), *self.adapters]

    def _figure(self, adapter: AdapterSummary, name: str) -> str:
        value = getattr(adapter, name)
        text = _number(value, "{:.3f}")
        delta = getattr(adapter, f"{name}_delta", None) if adapter is not self.base else None
        return text if delta is None else f"{text} ({delta:+.3f})"


def _direction(metric: str) -> str:
    if metric not in METRICS:
        raise InvalidRequestError(
            f"unknown metric {metric!r}: use one of {', '.join(METRICS)} (nll_per_token and mean_latency_s: lower "
            "is better; the others: higher is better)"
        )
    return METRICS[metric]


def summarise(
    rows: Iterable[Mapping[str, Any]],
    adapters: Sequence[AdapterSpec],
    prompt_ids: Iterable[str],
    timings: Mapping[str, AdapterTimings] | None = None,
    hashes: Mapping[str, str | None] | None = None,
) -> list[AdapterSummary]:
    """Summarise the rows of ``adapters`` x ``prompt_ids`` (other rows in the file are ignored).

    Each (adapter, prompt) pair counts once: where the file holds a pair twice, its first row
    (:func:`~inference.evaluation.identity.first_row_per_pair`). Each figure is averaged over the rows that have it,
    whatever else failed in them. When the base model (:data:`~inference.evaluation.inputs.BASE_MODEL_ID`) is among
    ``adapters``, every other adapter's ``*_delta`` figures are set: each over the prompts where both the adapter
    and the base model have that figure. ``timings`` and ``hashes`` (by adapter id) fill the fields of the same
    names.
    """
    wanted = set(prompt_ids)
    by_adapter: dict[str, list[Mapping[str, Any]]] = {adapter.id: [] for adapter in adapters}
    for row in first_row_per_pair(rows):
        adapter_id, prompt_id = row_key(dict(row))
        if adapter_id in by_adapter and prompt_id in wanted:
            by_adapter[adapter_id].append(row)
    timings, hashes = timings or {}, hashes or {}
    base = by_adapter.get(BASE_MODEL_ID)
    return [
        _summarise_adapter(
            adapter,
            by_adapter[adapter.id],
            timings.get(adapter.id),
            hashes.get(adapter.id),
            None if base is None or adapter.id == BASE_MODEL_ID else base,
        )
        for adapter in adapters
    ]


def _summarise_adapter(
    adapter: AdapterSpec,
    rows: list[Mapping[str, Any]],
    timing: AdapterTimings | None,
    content_hash: str | None,
    base: list[Mapping[str, Any]] | None,
) -> AdapterSummary:
    failed = [row for row in rows if row.get("error")]
    load_errors = [row["error"] for row in failed if row["error"].get("stage") == "load"]
    generated = [row for row in rows if _generated(row)]  # a scoring failure keeps its generation
    timed = [row for row in generated if row.get("latency_s") is not None]  # score-only rows have no latency
    latency = sum(float(row["latency_s"]) for row in timed)
    completion = sum(int(row.get("completion_tokens") or 0) for row in generated)
    figures = [_figures(row) for row in rows]
    return AdapterSummary(
        adapter_id=adapter.id,
        adapter_path=None if adapter.path is None else str(adapter.path),
        rows=len(rows),
        errors=len(failed) + sum(1 for row in rows if not row.get("error") and row.get("score_error")),
        load_error=f"{load_errors[0]['type']}: {load_errors[0]['message']}" if load_errors else None,
        score=_mean(figures, "score"),
        scored=sum("score" in row for row in figures),
        mean_latency_s=latency / len(timed) if timed else None,
        tokens_per_s=completion / latency if latency > 0 else None,
        completion_tokens=completion,
        load_s=timing.load_s if timing else None,
        generate_s=timing.generate_s if timing else None,
        unload_s=timing.unload_s if timing else None,
        adapter_hash=content_hash,
        nll_per_token=_mean(figures, "nll_per_token"),
        acc=_mean(figures, "acc"),
        acc_norm=_mean(figures, "acc_norm"),
        score_s=timing.score_s if timing else None,
        **(_deltas(rows, base) if base is not None else {}),
    )


def _generated(row: Mapping[str, Any]) -> bool:
    """Whether the row's generation succeeded (no error, or only its scoring failed) in a generating run."""
    error = row.get("error")
    return row.get("output") is not None and (not error or error.get("stage") == "score")


def _figures(row: Mapping[str, Any]) -> dict[str, float]:
    """The :data:`COMPARED_METRICS` a row has (``acc`` and ``acc_norm`` as 1.0 or 0.0), whatever else failed."""
    figures: dict[str, float] = {}
    for name in ("score", "nll_per_token"):
        if row.get(name) is not None:
            figures[name] = float(row[name])
    if row.get("correct") is not None:
        figures["acc"] = float(bool(row["correct"]))
        figures["acc_norm"] = float(bool(row.get("correct_norm")))
    return figures


def _mean(figures: Sequence[Mapping[str, float]], name: str) -> float | None:
    values = [row[name] for row in figures if name in row]
    return sum(values) / len(values) if values else None


def _deltas(rows: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Each of :data:`COMPARED_METRICS` of ``rows`` minus the base model's, both over the prompts where both have
    that figure (a prompt that failed on one side is left out of both means)."""
    mine = {str(row["prompt_id"]): _figures(row) for row in rows}
    theirs = {str(row["prompt_id"]): _figures(row) for row in base}
    deltas: dict[str, float | None] = {}
    for name in COMPARED_METRICS:
        shared = {prompt for prompt, figures in mine.items() if name in figures and name in theirs.get(prompt, {})}
        value = _mean([figures for prompt, figures in mine.items() if prompt in shared], name)
        reference = _mean([figures for prompt, figures in theirs.items() if prompt in shared], name)
        deltas[f"{name}_delta"] = None if value is None or reference is None else value - reference
    return deltas


def _number(value: float | None, template: str) -> str:
    return "-" if value is None else template.format(value)
