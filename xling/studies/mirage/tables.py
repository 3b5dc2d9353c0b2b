"""MIRAGE-Bench's tables in markdown from the metric rows: Table 2 (tau) with Table 5
(held-out R²) and the arena's counts, Tables 3 and 4 (the ablations) when scored, and
Tables 7/8 (each language's leaderboard)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from xling.tasks.tables import fmt, pipe_table


def _num(value) -> str:
    """Three decimals; a missing value is an empty cell (as the tables always showed it)."""
    return fmt(value, 3, dash="")


def _summary_table(allm: pd.DataFrame) -> str:
    rows = []
    for lang in dict.fromkeys(allm["lang"]):
        by_metric = allm[allm["lang"] == lang].set_index("metric")

        def value(key, col="value", by_metric=by_metric):
            return by_metric[col].get(key) if key in by_metric.index else None
        r2_text = _num(value("held_out_r2"))
        if r2_text and value("held_out_r2", "ci_low") is not None:
            r2_text += (f" ({_num(value('held_out_r2', 'ci_low'))}, "
                        f"{_num(value('held_out_r2', 'ci_high'))})")
        counts = [("" if value(k) is None else str(int(value(k)))) for k in
                  ("judgments", "ties", "unparsed", "degenerate_tournaments")]
        rows.append([lang, _num(value("kendall_tau")), r2_text, *counts])
    return pipe_table(["lang", "tau", "held-out R² (95% CI)", "judgments", "ties", "unparsed",
                       "degenerate BT fits"], rows, empty=None,
                      title="MIRAGE-Bench: Table 2 (Kendall tau, surrogate vs judge) and "
                            "Table 5 (held-out R²)", heading="##")


def _ablation_table(allm: pd.DataFrame, prefix: str, title: str) -> str | None:
    sub = allm[allm["metric"].str.startswith(prefix)]
    if sub.empty:
        return None
    langs = list(dict.fromkeys(sub["lang"]))
    rows = []
    for metric in dict.fromkeys(sub["metric"]):
        found = [sub[(sub["lang"] == lang) & (sub["metric"] == metric)]["value"]
                 for lang in langs]
        values = [float(v.iloc[0]) if len(v) and v.iloc[0] is not None else float("nan")
                  for v in found]
        mean = (float(np.nanmean(values)) if not all(map(math.isnan, values))
                else float("nan"))
        rows.append([metric.removeprefix(prefix), *(_num(v) for v in values), _num(mean)])
    return pipe_table(["", *langs, "mean"], rows, empty=None, title=title, heading="###")


def _leaderboard(df: pd.DataFrame, lang: str) -> str:
    by_lang = df[(df["lang"] == lang) & (df["model"] != "all")]
    bt = by_lang[by_lang["metric"] == "bt"].set_index("model")
    rank = by_lang[by_lang["metric"] == "bt_rank"].set_index("model")["value"]
    surrogate_rank = by_lang[by_lang["metric"] == "surrogate_rank"].set_index("model")["value"]
    rows = []
    for model in rank.sort_values().index:
        row = bt.loc[model]
        rows.append([int(rank[model]), model, _num(row["value"]),
                     _num(row["value"] - row["ci_low"]), _num(row["ci_high"] - row["value"]),
                     int(surrogate_rank[model])])
    return pipe_table(["rank", "model", "score", "-CI", "+CI", "surrogate rank"], rows,
                      empty=None, heading="###",
                      title=f"Tables 7/8: {lang} leaderboard (Bradley-Terry, 95% bootstrap CI)")


def tables(metrics: Iterable[Mapping]) -> str:
    """Markdown: Table 2 (tau), Table 5 (held-out R²), the arena's counts, and Tables 7/8
    (each language's leaderboard: judge BT score with its 95% interval, surrogate rank)."""
    df = pd.DataFrame(list(metrics))
    if df.empty:
        return "## MIRAGE-Bench\n\nno results\n"
    allm = df[df["model"] == "all"]
    sections = [_summary_table(allm)]
    for prefix, title in (("feature_set_tau:", "Table 4: surrogate tau by feature set"),
                          ("regressor:", "Table 3: train / held-out R² by regressor")):
        section = _ablation_table(allm, prefix, title)
        if section is not None:
            sections.append(section)
    sections += [_leaderboard(df, lang)
                 for lang in dict.fromkeys(df.loc[df["metric"] == "bt", "lang"])]
    return "\n\n".join(sections) + "\n"
