"""Per-adapter summary of a results file: score, latency, tokens/s, errors; as a table, a dict or CSV."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from inference.evaluation.identity import first_row_per_pair
from inference.evaluation.inputs import AdapterSpec
from inference.evaluation.rows import check_file_path, row_key
from inference.exceptions import ConfigurationError

__all__ = ["AdapterSummary", "AdapterTimings", "EvaluationSummary", "summarise", "summary_csv_path"]


@dataclass(frozen=True)
class AdapterTimings:
    """Wall-clock seconds this run spent on one adapter (absent for adapters an earlier run finished).

    Attributes:
        load_s: ``load_adapter``.
        generate_s: From the first request to the last answer.
        unload_s: ``unload_adapter``.
    """

    load_s: float = 0.0
    generate_s: float = 0.0
    unload_s: float = 0.0


@dataclass(frozen=True)
class AdapterSummary:
    """The figures of one adapter over its rows.

    Attributes:
        adapter_id: The adapter id.
        adapter_path: Where it was loaded from (absolute).
        rows: Rows in the results file for this adapter and the prompt set.
        errors: Rows with an error (load or generation).
        load_error: The load error's sentence when the adapter could not be loaded, else ``None``.
        score: Mean score over the scored rows, or ``None`` when none was scored.
        scored: Rows with a score.
        mean_latency_s: Mean seconds per successful request.
        tokens_per_s: Completion tokens per second of request latency (one request's decoding speed).
        completion_tokens: Completion tokens over the successful rows.
        load_s: Seconds to load it in this run (``None`` if an earlier run did it).
        generate_s: Seconds of generation in this run (``None`` if an earlier run did it).
        unload_s: Seconds to unload it in this run (``None`` if an earlier run did it).
        adapter_hash: The content hash of its files (see :func:`~inference.evaluation.identity.adapter_hash`).
        nll_per_token: Mean over the rows that have it of the expected answer's negative log-likelihood per
            token (``None`` when no row has it: no ``expected``, or a provider that cannot score).
        acc: Multiple-choice accuracy, the choice with the highest log-likelihood (lm-eval's ``acc``), over the
            rows with ``choices``; ``None`` without such rows.
        acc_norm: The same with each choice's log-likelihood divided by its length in characters (lm-eval's
            ``acc_norm``).
    """

    adapter_id: str
    adapter_path: str
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


def summary_csv_path(output: str | os.PathLike[str]) -> Path:
    """Where the CSV summary of ``output`` goes: ``results.jsonl`` -> ``results.summary.csv``.

    Other names keep their suffix (``results.json`` -> ``results.json.summary.csv``).
    """
    output = Path(output)  # only .jsonl is dropped, so results.json and results.jsonl do not share one summary
    return output.with_name(f"{output.stem if output.suffix == '.jsonl' else output.name}.summary.csv")


@dataclass(frozen=True)
class EvaluationSummary:
    """The outcome of :func:`~inference.evaluation.evaluate_adapters`.

    Attributes:
        adapters: One summary per adapter, in run order.
        output: The JSONL results file.
        csv_path: The CSV summary written next to it.
        rows_total: Adapters times prompts.
        rows_written: Rows this run wrote.
        rows_resumed: Rows an earlier run had written (skipped now).
        elapsed_s: Seconds this run took.
    """

    adapters: tuple[AdapterSummary, ...]
    output: Path
    csv_path: Path
    rows_total: int
    rows_written: int
    rows_resumed: int
    elapsed_s: float

    @property
    def errors(self) -> int:
        """Rows with an error, over every adapter."""
        return sum(adapter.errors for adapter in self.adapters)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (paths as strings)."""
        data = asdict(self)
        data["output"], data["csv_path"] = str(self.output), str(self.csv_path)
        data["errors"] = self.errors
        return data

    def format_table(self) -> str:
        """A plain-text table: one line per adapter with score, latency, tokens/s and errors."""
        likelihood = [
            (name, label)
            for name, label in (("nll_per_token", "nll/token"), ("acc", "acc"), ("acc_norm", "acc_norm"))
            if any(getattr(adapter, name) is not None for adapter in self.adapters)
        ]  # columns only when some adapter has the figure
        header = ("adapter", "rows", "score", *(label for _, label in likelihood), "latency_s", "tokens/s", "errors")
        lines = [header]
        for adapter in self.adapters:
            errors = str(adapter.errors) + (" (load failed)" if adapter.load_error else "")
            lines.append(
                (
                    adapter.adapter_id,
                    str(adapter.rows),
                    _number(adapter.score, "{:.3f}"),
                    *(_number(getattr(adapter, name), "{:.3f}") for name, _ in likelihood),
                    _number(adapter.mean_latency_s, "{:.3f}"),
                    _number(adapter.tokens_per_s, "{:.1f}"),
                    errors,
                )
            )
        widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
        text = [
            "  ".join(
                cell.ljust(width) if column == 0 else cell.rjust(width)
                for column, (cell, width) in enumerate(zip(line, widths, strict=True))
            )
            for line in lines
        ]
        return "\n".join(text)

    def write_csv(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the per-adapter figures as CSV (to :attr:`csv_path` by default) and return the path.

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
                for adapter in self.adapters:
                    writer.writerow({key: "" if value is None else value for key, value in asdict(adapter).items()})
        except OSError as error:
            raise ConfigurationError(
                f"cannot write the summary {target}: {error.strerror or error}", path=str(target)
            ) from error
        return target


def summarise(
    rows: Iterable[Mapping[str, Any]],
    adapters: Sequence[AdapterSpec],
    prompt_ids: Iterable[str],
    timings: Mapping[str, AdapterTimings] | None = None,
    hashes: Mapping[str, str] | None = None,
) -> list[AdapterSummary]:
    """Summarise the rows of ``adapters`` x ``prompt_ids`` (other rows in the file are ignored).

    Each (adapter, prompt) pair counts once: where the file holds a pair twice, its first row
    (:func:`~inference.evaluation.identity.first_row_per_pair`). ``timings`` and ``hashes`` (by adapter id) fill
    the fields of the same names.
    """
    wanted = set(prompt_ids)
    by_adapter: dict[str, list[Mapping[str, Any]]] = {adapter.id: [] for adapter in adapters}
    for row in first_row_per_pair(rows):
        adapter_id, prompt_id = row_key(dict(row))
        if adapter_id in by_adapter and prompt_id in wanted:
            by_adapter[adapter_id].append(row)
    timings, hashes = timings or {}, hashes or {}
    return [
        _summarise_adapter(adapter, by_adapter[adapter.id], timings.get(adapter.id), hashes.get(adapter.id))
        for adapter in adapters
    ]


def _summarise_adapter(
    adapter: AdapterSpec, rows: list[Mapping[str, Any]], timing: AdapterTimings | None, content_hash: str | None
) -> AdapterSummary:
    ok = [row for row in rows if not row.get("error")]
    failed = [row for row in rows if row.get("error")]
    load_errors = [row["error"] for row in failed if row["error"].get("stage") == "load"]
    scores = [float(row["score"]) for row in ok if row.get("score") is not None]
    latency = sum(float(row.get("latency_s") or 0.0) for row in ok)
    completion = sum(int(row.get("completion_tokens") or 0) for row in ok)
    nll = [float(row["nll_per_token"]) for row in ok if row.get("nll_per_token") is not None]
    chosen = [row for row in ok if row.get("correct") is not None]
    return AdapterSummary(
        adapter_id=adapter.id,
        adapter_path=str(adapter.path),
        rows=len(rows),
        errors=len(failed),
        load_error=f"{load_errors[0]['type']}: {load_errors[0]['message']}" if load_errors else None,
        score=sum(scores) / len(scores) if scores else None,
        scored=len(scores),
        mean_latency_s=latency / len(ok) if ok else None,
        tokens_per_s=completion / latency if latency > 0 else None,
        completion_tokens=completion,
        load_s=timing.load_s if timing else None,
        generate_s=timing.generate_s if timing else None,
        unload_s=timing.unload_s if timing else None,
        adapter_hash=content_hash,
        nll_per_token=sum(nll) / len(nll) if nll else None,
        acc=sum(bool(row["correct"]) for row in chosen) / len(chosen) if chosen else None,
        acc_norm=sum(bool(row["correct_norm"]) for row in chosen) / len(chosen) if chosen else None,
    )


def _number(value: float | None, template: str) -> str:
    return "-" if value is None else template.format(value)
