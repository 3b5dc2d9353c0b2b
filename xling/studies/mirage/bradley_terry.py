"""Bradley-Terry strengths of the arena's models (choix) and the seeded bootstrap of
tournaments that gives Tables 7/8 their 95% intervals (s5)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from xling.studies.mirage.options import Knobs


def bt_fit(n_models: int, prefs: Sequence[tuple[int, int]], alpha: float = 0.0
           ) -> tuple[np.ndarray, bool]:
    """Centred natural-log strengths (P(i beats j) = sigmoid(theta_i - theta_j)) and a
    ``degenerate`` flag. choix's ILSR, falling back to ``opt_pairwise`` (alpha 1e-6 unless
    ``alpha`` is set) when ILSR fails, as the reference does (s5.1); degenerate = that
    fallback, or a model without a win or without a loss (its MLE is infinite)."""
    import choix
    prefs = list(prefs)
    if not prefs:
        return np.zeros(n_models), True
    wins, losses = np.zeros(n_models), np.zeros(n_models)
    for winner, loser in prefs:
        wins[winner] += 1
        losses[loser] += 1
    degenerate = bool(((wins == 0) | (losses == 0)).any())
    try:
        with np.errstate(divide="ignore", invalid="ignore"):  # counted as degenerate instead
            theta = choix.ilsr_pairwise(n_models, prefs, alpha=alpha)
    except (ValueError, RuntimeError):
        theta = choix.opt_pairwise(n_models, prefs, alpha=alpha or 1e-6)
        degenerate = True
    theta = np.asarray(theta, dtype=float)
    return theta - theta.mean(), degenerate


@dataclass
class Bootstrap:
    """``theta[t, m]`` per tournament, ``draws[t]`` the drawn query ids (with duplicates)."""

    models: tuple[str, ...]
    theta: np.ndarray
    draws: list[list[str]]
    degenerate: int = 0

    def summary(self) -> pd.DataFrame:
        """Mean, 2.5/97.5 percentiles, ``-``/``+`` half-widths and rank (Tables 7/8)."""
        mean = self.theta.mean(axis=0)
        low, high = np.percentile(self.theta, [2.5, 97.5], axis=0)
        df = pd.DataFrame({"model_id": self.models, "mean": mean, "ci_low": low,
                           "ci_high": high, "ci_minus": mean - low, "ci_plus": high - mean})
        df = df.sort_values("mean", ascending=False, kind="stable").reset_index(drop=True)
        df.insert(0, "rank", np.arange(1, len(df) + 1))
        return df


def tournaments(prefs: Mapping[str, Sequence[tuple[int, int]]], models: Sequence[str],
                knobs: Knobs = Knobs()) -> Bootstrap:
    """``knobs.tournaments`` BT fits, each on ``knobs.matches`` query ids drawn uniformly with
    replacement from the sorted judged ids (a "match" = one query with all its judgments;
    P L190, s5.2). Seeded with ``numpy.random.default_rng(bootstrap_seed)`` only."""
    ids = sorted(prefs)
    rng = np.random.default_rng(knobs.bootstrap_seed)
    drawn = rng.integers(0, len(ids), size=(knobs.tournaments, knobs.matches))
    theta = np.empty((knobs.tournaments, len(models)))
    degenerate = 0
    for t, row in enumerate(drawn):
        theta[t], bad = bt_fit(len(models), [p for i in row for p in prefs[ids[i]]],
                               knobs.bt_alpha)
        degenerate += bad
    return Bootstrap(tuple(models), theta, [[ids[i] for i in row] for row in drawn], degenerate)
