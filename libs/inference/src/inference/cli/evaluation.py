"""``inference eval`` (many adapters on one prompt set, :mod:`inference.evaluation`) and ``inference lm-eval``
(lm-eval-harness's command line with the model ``inference`` registered).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from inference.cli.options import _step_config
from inference.cli.running import _print_json, _run_async, _UsageError
from inference.exceptions import InferenceError, InvalidRequestError, MissingDependencyError


def _eval(args: argparse.Namespace) -> int:
    from inference.evaluation import METRICS, TerminalProgress, evaluate_adapters, summary_csv_path, summary_plot_path
    from inference.evaluation.plot import PLOT_EXTRA, can_plot
    from inference.evaluation.rows import check_file_path

    check_file_path(args.output)  # --output /dev/stdout | cat would hang reading its own pipe: refused first
    check_file_path(summary_csv_path(args.output), "summary file")
    if args.plot is not False:
        check_file_path(summary_plot_path(args.output), "plot file")
    if args.plot and not can_plot():  # asked for: say so before the run, not after it
        raise MissingDependencyError(
            f"--plot needs matplotlib, which is not installed: run pip install 'inference-adapters[{PLOT_EXTRA}]', "
            "or leave --plot out"
        )
    if args.sort is not None and args.sort not in METRICS:
        raise _UsageError(f"--sort {args.sort!r}: use one of {', '.join(METRICS)}")
    if args.mode == "score" and args.score:
        raise _UsageError(
            "--score judges generated text, and --score-only generates none: drop one of them (the log-likelihood "
            "figures need no --score)"
        )
    if args.concurrency < 1:
        raise _UsageError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.adapters_in_flight < 1:
        raise _UsageError(f"--adapters-in-flight must be at least 1, got {args.adapters_in_flight}")
    if args.score and ":" not in args.score and args.score not in ("exact", "regex"):
        raise _UsageError(f"--score {args.score!r}: use exact, regex or an import path pkg.module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:  # let --score find the user's own modules
        sys.path.insert(0, os.getcwd())
    config = _step_config(args, generation_keys=True)
    progress = TerminalProgress(sys.stderr, enabled=False if args.no_progress else None)
    try:
        summary = _run_async(
            lambda: evaluate_adapters(
                args.adapters,
                args.prompts,
                config,
                args.output,
                max_concurrency=args.concurrency,
                scorer=args.score,
                on_progress=progress,
                adapters_in_flight=args.adapters_in_flight,
                mode=args.mode,
                base=args.base,
            )
        )
    finally:
        progress.close()
    plot, plot_note = _eval_plot(summary, args.plot, can_plot(), PLOT_EXTRA)
    if args.json:
        _print_json({**summary.to_dict(), "plot_path": None if plot is None else str(plot)})
    else:
        print(summary.format_table(sort_by=args.sort))
        drawn = f"  plot: {plot}" if plot is not None else ""
        print(
            f"\nresults: {summary.output}  summary: {summary.csv_path}{drawn}  "
            f"({summary.rows_written} rows written, {summary.rows_resumed} resumed)"
        )
        print(_eval_times(summary.timings(), summary.elapsed_s))
    if plot_note:
        print(f"inference: {plot_note}", file=sys.stderr)
    everyone = [*([summary.base] if summary.base is not None else []), *summary.adapters]
    rows = sum(adapter.rows for adapter in everyone)
    if rows and summary.errors == rows:
        first = next(adapter for adapter in everyone if adapter.errors)
        detail = first.load_error or "see the error and score_error fields of the rows"
        print(f"inference: error: every row failed (first adapter {first.adapter_id}: {detail})", file=sys.stderr)
        return 1
    if summary.errors:
        print(f"inference: {summary.errors} of {rows} rows have errors (see {summary.output})", file=sys.stderr)
    return 0


def _eval_plot(summary: Any, asked: bool | None, available: bool, extra: str) -> tuple[Path | None, str | None]:
    """Draw the summary's plot where asked (``--plot``) or by default where matplotlib is installed: its path, and a
    note for stderr when none was drawn although it could have been wanted."""
    if asked is False:
        return None, None
    if not available:
        return None, (
            f"no plot drawn: matplotlib is not installed (pip install 'inference-adapters[{extra}]'; --no-plot "
            "skips this note)"
        )
    try:
        return summary.write_plot(), None
    except InferenceError as error:  # the run's results stand; the plot is extra
        nothing_to_draw = isinstance(error, InvalidRequestError)  # no score, nll/token or acc in any adapter
        return None, f"no plot drawn: {error}" if asked or not nothing_to_draw else None


def _eval_times(timings: dict[str, float], elapsed_s: float) -> str:
    """``time: scoring 3.2 s, generating 40.1 s, loading 1.2 s, unloading 0.3 s (this run: 45.0 s)``."""
    names = (("score_s", "scoring"), ("generate_s", "generating"), ("load_s", "loading"), ("unload_s", "unloading"))
    parts = [f"{label} {timings[key]:.1f} s" for key, label in names if timings.get(key)]
    return f"time: {', '.join(parts) or 'nothing to do'} (this run: {elapsed_s:.1f} s)"


def _lm_eval(args: argparse.Namespace) -> int:
    from inference._core.dependencies import import_optional

    integration = import_optional("inference.integrations.lm_eval", provider="lm-eval", extra="lm-eval")
    status: int = integration.main(list(args.lm_eval_args))
    return status
