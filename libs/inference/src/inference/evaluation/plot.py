"""A PNG of an evaluation summary: each figure per adapter, the base model as a reference line, the best marked.

Needs matplotlib, the ``plot`` extra (``pip install 'inference-adapters[plot]'``); it is imported only when a plot
is drawn, never at ``import inference``. The figure is drawn with matplotlib's object API and its Agg canvas, so
no pyplot state or global backend of the calling program is touched and no display is needed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.evaluation.rows import check_file_path
from inference.evaluation.summary import COMPARED_METRICS, METRIC_LABELS, METRICS, AdapterSummary
from inference.exceptions import ConfigurationError, InvalidRequestError, MissingDependencyError

if TYPE_CHECKING:
    from inference.evaluation.summary import EvaluationSummary

__all__ = ["LABELLED_ADAPTERS", "PLOT_EXTRA", "can_plot", "plot_summary"]

PLOT_EXTRA = "plot"
"""The pip extra that installs matplotlib: ``pip install 'inference-adapters[plot]'``."""

LABELLED_ADAPTERS = 40
"""Up to this many adapters, one labelled bar each; beyond, a line over the run order (a checkpoint sweep's curve)."""

_COLOUR = "#4C72B0"
_BEST = "#DD8452"


def can_plot() -> bool:
    """Whether matplotlib can be found (without importing it)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def plot_summary(
    summary: EvaluationSummary, path: str | os.PathLike[str], *, metrics: Sequence[str] | None = None
) -> Path:
    """Draw ``summary`` as a PNG at ``path`` and return the path.

    One panel per figure: by default each of ``score``, ``nll_per_token``, ``acc`` and ``acc_norm`` that some adapter
    has. Up to :data:`LABELLED_ADAPTERS` adapters, a horizontal bar per adapter in run order; more, a line over the
    run order. The base model's figure is a dashed line, the best adapter is drawn in another colour, and each
    panel's title says which way is better.

    Raises:
        MissingDependencyError: matplotlib is not installed.
        InvalidRequestError: A name of ``metrics`` is unknown, or no adapter has any figure to draw.
        ConfigurationError: ``path`` is not a regular file, or cannot be written.
    """
    names = list(metrics) if metrics is not None else [name for name in COMPARED_METRICS if _values(summary, name)]
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise InvalidRequestError(f"cannot plot {', '.join(map(repr, unknown))}: use names of {', '.join(METRICS)}")
    names = [name for name in names if _values(summary, name)]
    if not names:
        raise InvalidRequestError(
            "no adapter has a figure to plot (score, nll_per_token, acc or acc_norm): give a scorer, expected "
            "answers or multiple-choice prompts, or check the rows' errors"
        )
    target = Path(path)
    check_file_path(target, "plot file")
    figure_class, canvas_class = _matplotlib()
    adapters = list(summary.adapters)
    labelled = len(adapters) <= LABELLED_ADAPTERS
    if labelled:  # panels two by two, the adapters' names on the left of each row of panels
        columns = min(2, len(names))
        rows = -(-len(names) // columns)
        width = 1.5 + max(len(_label(adapter.adapter_id)) for adapter in adapters) * 0.07 + 4.2 * columns
        height = rows * max(2.4, 1.3 + 0.3 * len(adapters))
        figure = figure_class(figsize=(width, height), layout="constrained")
        grid = figure.subplots(rows, columns, squeeze=False, sharey=True)
        axes = [axis for line in grid for axis in line][: len(names)]
        for axis in [axis for line in grid for axis in line][len(names) :]:
            axis.set_visible(False)
        axes[0].invert_yaxis()  # run order, top to bottom (once: the panels share the axis)
    else:
        figure = figure_class(figsize=(10.0, 0.6 + 2.6 * len(names)), layout="constrained")
        axes = figure.subplots(len(names), 1, squeeze=False, sharex=True)[:, 0]
    canvas_class(figure)
    for axis, name in zip(axes, names, strict=True):
        _panel(axis, name, adapters, summary.base, summary.best(name), labelled=labelled)
    if not labelled:
        for axis in axes[:-1]:
            axis.set_xlabel("")  # the panels share the run order: named once, at the bottom
    mode = "log-likelihoods only" if summary.mode == "score" else "generated"
    figure.suptitle(f"{summary.output.name}: {len(adapters)} adapters ({mode})", fontsize=10)
    try:
        figure.savefig(target, format="png", dpi=100)
    except OSError as error:
        raise ConfigurationError(
            f"cannot write the plot {target}: {error.strerror or error}", path=str(target)
        ) from error
    return target


def _panel(
    axis: Any,
    name: str,
    adapters: list[AdapterSummary],
    base: AdapterSummary | None,
    best: AdapterSummary | None,
    *,
    labelled: bool,
) -> None:
    values = [getattr(adapter, name) for adapter in adapters]
    colours = [_BEST if adapter is best else _COLOUR for adapter in adapters]
    reference = getattr(base, name) if base is not None else None
    if labelled:
        positions = list(range(len(adapters)))
        axis.barh(positions, [float("nan") if value is None else value for value in values], color=colours)
        axis.set_yticks(positions, [_label(adapter.adapter_id) for adapter in adapters], fontsize=8)
        if reference is not None:
            axis.axvline(reference, color="black", linestyle="--", linewidth=1, label=f"base model {reference:.3f}")
        axis.set_xlabel(METRIC_LABELS[name])
    else:
        points = [(index, value) for index, value in enumerate(values) if value is not None]
        axis.plot([index for index, _ in points], [value for _, value in points], color=_COLOUR, linewidth=1,
                  marker=".", markersize=3)  # fmt: skip
        if best is not None:
            index = adapters.index(best)
            axis.plot([index], [values[index]], marker="*", markersize=12, color=_BEST, linestyle="none",
                      label=f"best: {_label(best.adapter_id)}")  # fmt: skip
        if reference is not None:
            axis.axhline(reference, color="black", linestyle="--", linewidth=1, label=f"base model {reference:.3f}")
        axis.set_ylabel(METRIC_LABELS[name])
        axis.set_xlabel("adapter (run order)")
    better = METRICS[name]
    title = f"{METRIC_LABELS[name]} ({better} is better)"
    if best is not None:
        title += f"\nbest: {_label(best.adapter_id)} {getattr(best, name):.3f}"
    axis.set_title(title, fontsize=9)
    axis.grid(True, axis="x" if labelled else "y", alpha=0.3)
    if reference is not None or not labelled:
        axis.legend(fontsize=7, loc="best")


def _values(summary: EvaluationSummary, name: str) -> list[float]:
    return [value for adapter in summary.adapters if (value := getattr(adapter, name, None)) is not None]


def _label(adapter_id: str, most: int = 40) -> str:
    """An adapter id short enough for an axis: its start and its end around ``...``."""
    if len(adapter_id) <= most:
        return adapter_id
    keep = (most - 3) // 2
    return f"{adapter_id[:keep]}...{adapter_id[-keep:]}"


def _matplotlib() -> tuple[Any, Any]:
    """matplotlib's ``Figure`` and Agg canvas, or the error saying which extra installs them."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise MissingDependencyError(
            f"drawing the evaluation plot needs matplotlib, which cannot be imported ({error}): run pip install "
            f"'inference-adapters[{PLOT_EXTRA}]'"
        ) from error
    return Figure, FigureCanvasAgg
