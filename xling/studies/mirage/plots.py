"""MIRAGE-Bench's figure: each language's arena leaderboard with 95% bootstrap intervals."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd


def plot_leaderboards(metrics: Iterable[Mapping], path: str | Path) -> Path | None:
    """One panel per language: each model's BT score with its 95% bootstrap interval, best
    on top (the paper's Figure 4 / Tables 7-8 as a picture). PNG at ``path``."""
    df = pd.DataFrame(list(metrics))
    if df.empty or not (df["metric"] == "bt").any():
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bt = df[df["metric"] == "bt"]
    langs = list(dict.fromkeys(bt["lang"]))
    n_cols = min(3, len(langs))
    n_rows = math.ceil(len(langs) / n_cols)
    n_models = bt.groupby("lang").size().max()
    fig, axes = plt.subplots(n_rows, n_cols,
                             figsize=(5 * n_cols, 0.35 * n_models * n_rows + 1.5), squeeze=False)
    for ax, lang in zip(axes.flat, langs):
        board = bt[bt["lang"] == lang].sort_values("value")
        y = np.arange(len(board))
        # a skewed bootstrap can put the mean outside its percentile interval: no bar then
        xerr = [np.maximum(0, board["value"] - board["ci_low"]),
                np.maximum(0, board["ci_high"] - board["value"])]
        ax.errorbar(board["value"], y, xerr=xerr, fmt="o", capsize=3)
        ax.set_yticks(y, [m.split("/")[-1] for m in board["model"]], fontsize=8)
        ax.set_title(f"{lang}")
        ax.set_xlabel("Bradley-Terry score (95% CI)")
        ax.axvline(0, color="grey", lw=0.5)
    for ax in list(axes.flat)[len(langs):]:
        ax.axis("off")
    fig.suptitle("MIRAGE-Bench arena leaderboards")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plots(metrics: Iterable[Mapping]) -> dict[str, bytes]:
    """The evaluate stage's figures: ``leaderboard.png`` (see :func:`plot_leaderboards`)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = plot_leaderboards(metrics, Path(tmp) / "leaderboard.png")
        return {"leaderboard.png": path.read_bytes()} if path else {}
