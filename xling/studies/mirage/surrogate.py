"""MIRAGE-Bench's surrogate judge (s6): per-model feature means, the regressor that learns
the Bradley-Terry leaderboard from them (Algorithm 1), R² on the held-out models (Table 5),
Kendall tau against the judge (Table 2), and the ablations of Tables 3 and 4."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from xling.studies.mirage.bradley_terry import Bootstrap, tournaments
from xling.studies.mirage.constants import FEATURE_SETS, REGRESSORS
from xling.studies.mirage.options import Knobs
from xling.studies.mirage.pairs import preferences


class FeatureTable:
    """Per (query, model) feature values, null read as 0.0 (the reference's ``or 0.0``)."""

    def __init__(self, rows: pd.DataFrame, models: Sequence[str], features: Sequence[str]):
        self.models, self.features = tuple(models), tuple(features)
        self.qids = sorted(set(rows["query_id"]))
        self._query_index = {q: i for i, q in enumerate(self.qids)}
        model_index = {m: i for i, m in enumerate(models)}
        feature_index = {f: i for i, f in enumerate(features)}
        # one row more than the queries: a query without features reads that zero row
        self.values = np.zeros((len(self.qids) + 1, len(models), len(features)))
        for query_id, model, feature, value in rows[
                ["query_id", "model", "feature", "value"]].itertuples(index=False):
            if (model in model_index and feature in feature_index and value is not None
                    and not pd.isna(value)):
                self.values[self._query_index[query_id], model_index[model],
                            feature_index[feature]] = float(value)

    def means(self, query_ids: Sequence[str]) -> np.ndarray:
        """``X[m, f] = (1/|Q|) sum_{q in Q} value(q, m, f)`` over the list *with* its
        duplicates; a query without features counts 0 (s6.1)."""
        rows = [self._query_index.get(q, len(self.qids)) for q in query_ids]
        return self.values[rows].mean(axis=0)


def make_regressor(kind: str, random_state: int | None):
    """Table 3's regressors with library defaults (hyperparameters unpublished, s6.4)."""
    if kind == "random_forest":
        from sklearn.ensemble import RandomForestRegressor
        return RandomForestRegressor(random_state=random_state)
    if kind == "linear":
        from sklearn.linear_model import LinearRegression
        return LinearRegression()
    if kind == "mlp":
        from sklearn.neural_network import MLPRegressor
        return MLPRegressor(random_state=random_state)
    if kind == "svr":
        from sklearn.svm import SVR
        return SVR()
    if kind == "xgboost":
        from xgboost import XGBRegressor  # optional: not a dependency of xling
        return XGBRegressor(random_state=random_state)
    raise ValueError(f"unknown regressor {kind!r}; use one of {REGRESSORS}")


def r2(truth: Sequence[float], pred: Sequence[float]) -> float:
    """Coefficient of determination as sklearn's ``r2_score`` (constant ``truth``: 1.0 if
    predicted exactly, else 0.0)."""
    truth, pred = np.asarray(truth, float), np.asarray(pred, float)
    ss_res, ss_tot = ((truth - pred) ** 2).sum(), ((truth - truth.mean()) ** 2).sum()
    if ss_tot == 0:
        return 1.0 if ss_res == 0 else 0.0
    return float(1 - ss_res / ss_tot)


def kendall_tau(scores_a: Sequence[float], scores_b: Sequence[float],
                knobs: Knobs = Knobs()) -> float:
    """tau-b of two score vectors aligned by model. Reference: tau of the two
    ``reversed(argsort)`` orders (s6.3), which depends on how models are numbered."""
    from scipy.stats import kendalltau
    scores_a, scores_b = np.asarray(scores_a, float), np.asarray(scores_b, float)
    if knobs.ref("kendall_tau"):
        scores_a = np.argsort(scores_a)[::-1].astype(float)
        scores_b = np.argsort(scores_b)[::-1].astype(float)
    return float(kendalltau(scores_a, scores_b).statistic)


def _split(models: Sequence[str], held_out: Iterable[str]) -> tuple[list[int], list[int]]:
    held = set(held_out)
    return ([i for i, m in enumerate(models) if m not in held],
            [i for i, m in enumerate(models) if m in held])


def surrogate_tournaments(boot: Bootstrap, table: FeatureTable, knobs: Knobs = Knobs()
                          ) -> dict[str, np.ndarray]:
    """Algorithm 1 (P L128-144): per tournament, X = features averaged over its drawn
    queries, Y = its theta; fit on the train models, R² on the held-out ones (Table 5)."""
    train, test = _split(boot.models, knobs.held_out)
    r2_held, r2_train = [], []
    for theta, draws in zip(boot.theta, boot.draws):
        x = table.means(draws)
        reg = make_regressor(knobs.surrogate, knobs.rf_state).fit(x[train], theta[train])
        r2_train.append(r2(theta[train], reg.predict(x[train])))
        r2_held.append(r2(theta[test], reg.predict(x[test])) if test else float("nan"))
    return {"held_out_r2": np.array(r2_held), "train_r2": np.array(r2_train)}


def surrogate_final(boot: Bootstrap, table: FeatureTable, query_ids: Sequence[str],
                    knobs: Knobs = Knobs()) -> dict:
    """s6.2: X = feature means over all ``query_ids`` of the language, Y = mean theta; fit on
    the train models, predict all; tau between the judge's and the surrogate's scores."""
    train, test = _split(boot.models, knobs.held_out)
    x, y = table.means(query_ids), boot.theta.mean(axis=0)
    reg = make_regressor(knobs.surrogate, knobs.rf_state).fit(x[train], y[train])
    pred = reg.predict(x)
    importances = getattr(reg, "feature_importances_", None)
    return {"models": boot.models, "judge": y, "surrogate": pred,
            "kendall_tau": kendall_tau(y, pred, knobs), "train_r2": r2(y[train], pred[train]),
            "held_out_r2": r2(y[test], pred[test]) if test else float("nan"),
            "importances": (dict(zip(table.features, importances))
                            if importances is not None else {})}


def arena(judgments: pd.DataFrame, features: pd.DataFrame, models: Sequence[str],
          knobs: Knobs = Knobs(), query_ids: Sequence[str] | None = None) -> dict:
    """One language: BT bootstrap, per-tournament surrogate R², final surrogate and tau."""
    prefs, counts = preferences(judgments, models)
    boot = tournaments(prefs, models, knobs)
    table = FeatureTable(features, models, knobs.features)
    per_tournament = surrogate_tournaments(boot, table, knobs)
    final = surrogate_final(boot, table, query_ids if query_ids is not None else table.qids,
                            knobs)
    return {"bootstrap": boot, "bt": boot.summary(), "counts": counts,
            "degenerate_tournaments": boot.degenerate, "table": table, **per_tournament,
            "final": final}


def regressor_ablation(theta: Sequence[float], x: np.ndarray, kinds: Sequence[str] = REGRESSORS,
                       n_held_out: int = 4, repeats: int = 50, seed: int = 0,
                       random_state: int | None = 0) -> dict[str, dict[str, float]]:
    """Table 3 (P L196-215): random train/held-out splits of the models (``n_held_out`` held
    out), ``repeats`` times; mean train and held-out R² per regressor."""
    theta = np.asarray(theta, float)
    rng = np.random.default_rng(seed)
    splits = [rng.permutation(len(theta)) for _ in range(repeats)]
    out = {}
    for kind in kinds:
        train_r2, held_r2 = [], []
        for perm in splits:
            test, train = perm[:n_held_out], perm[n_held_out:]
            reg = make_regressor(kind, random_state).fit(x[train], theta[train])
            train_r2.append(r2(theta[train], reg.predict(x[train])))
            held_r2.append(r2(theta[test], reg.predict(x[test])))
        out[kind] = {"train_r2": float(np.mean(train_r2)), "held_out_r2": float(np.mean(held_r2))}
    return out


def feature_set_taus(boot: Bootstrap, features: pd.DataFrame, query_ids: Sequence[str],
                     knobs: Knobs = Knobs()) -> dict[str, float]:
    """Table 4 (P L220-225): the final surrogate's tau with each of ``FEATURE_SETS``."""
    out = {}
    for name, subset in FEATURE_SETS.items():
        out[name] = surrogate_final(boot, FeatureTable(features, boot.models, subset),
                                    query_ids, replace(knobs, features=subset))["kendall_tau"]
    return out
