"""The study's plots as PNG files: accuracy by length, depth or k, the query x context
heatmap and the failure classes (matplotlib imported inside; an Agg canvas, no pyplot
state)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from .paper import FAILURE_DETAILS
from .tables import accuracy_table, table_by_k, table_failures, table_pairs, with_depth_bin

FAILURE_COLORS = {"correct": "#4c9a2a", "embedding_failure": "#d62728",
                  "llm_unanswerable": "#ff7f0e", "llm_incorrect": "#9467bd",
                  "too_long": "#7f7f7f"}


def _figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _save(fig, path: str | os.PathLike) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    return str(path)


def plot_accuracy(items: pd.DataFrame, by: str, path: str | os.PathLike) -> str:
    """Accuracy vs ``by`` (``length``, ``depth`` (measured, nearest 25 %), ``position``
    (nominal) or ``k``), one panel per needle count, one line per system (and model); a PNG
    at ``path``."""
    if by == "depth":
        items, by = with_depth_bin(items).dropna(subset=["depth_bin"]), "depth_bin"
    table = table_by_k(items) if by == "k" else accuracy_table(items, by)
    needles = sorted({ix[0] for ix in table.index})
    fig, axes = _figure(len(needles))
    for ax, n in zip(axes, needles):
        panel = table.xs(n, level=0)
        xs = [str(x) for x in panel.index]
        for col in panel.columns:
            ax.plot(xs, panel[col].to_numpy(dtype=float), marker="o", label=str(col))
        ax.set_title(f"{n} needle{'s' if n > 1 else ''}")
        ax.set_xlabel({"length": "context length", "position": "nominal needle depth (%)",
                       "depth_bin": "measured needle depth (%)",
                       "k": "sentence cap k"}.get(by, by))
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_pair_heatmap(items: pd.DataFrame, path: str | os.PathLike, *, system: str = "cross",
                      needles: int | None = None) -> str:
    """The query x context accuracy matrix (Fig 11's data) as a heatmap."""
    matrix = table_pairs(items, system=system, needles=needles)
    fig, (ax,) = _figure(1, 6.0, 5.0)
    image = ax.imshow(matrix.to_numpy(dtype=float), vmin=0, vmax=100, cmap="viridis")
    ax.set_xticks(range(len(matrix.columns)), [str(c) for c in matrix.columns])
    ax.set_yticks(range(len(matrix.index)), [str(i) for i in matrix.index])
    ax.set_xlabel("context language")
    ax.set_ylabel("query language")
    for (i, j), v in np.ndenumerate(matrix.to_numpy(dtype=float)):
        if not math.isnan(v):
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7, color="w")
    ax.figure.colorbar(image, ax=ax, label="accuracy (%)")
    ax.set_title(f"{system}{'' if needles is None else f', {needles} needle(s)'}")
    return _save(fig, path)


def plot_failures(items: pd.DataFrame, path: str | os.PathLike) -> str:
    """Stacked bars of failure classes by system (Fig 6/8/9 style), one panel per needles."""
    table = table_failures(items, by=("needles", "system"))
    needles = sorted({ix[0] for ix in table.index})
    fig, axes = _figure(len(needles))
    for ax, n in zip(axes, needles):
        panel = table.xs(n, level=0)
        xs = [str(x) for x in panel.index]
        bottom = np.zeros(len(panel))
        for c in FAILURE_DETAILS:
            vals = panel[c].to_numpy(dtype=float)
            ax.bar(xs, vals, bottom=bottom, label=c, color=FAILURE_COLORS[c])
            bottom += vals
        ax.set_title(f"{n} needle{'s' if n > 1 else ''}")
        ax.set_ylabel("% of items")
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.legend(fontsize=6)
    return _save(fig, path)
