"""MIRAGE-Bench's tables in markdown from the metric rows: Table 2 (tau, in sample and out
of fold) with Table 5 (held-out R²) and the arena's counts, Tables 3 and 4 (the ablations)
when scored, and Tables 7/8 (each language's leaderboard); the paper's numbers
(configs/mirage.expected.yaml) beside ours."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from xling.tasks.tables import fmt, pipe_table, read_expected

# the published numbers, beside configs/mirage.yaml in the checkout
PUBLISHED = Path(os.path.abspath(__file__)).parents[3] / "configs" / "mirage.expected.yaml"


def published(path: str | Path | None = PUBLISHED) -> dict:
    """The paper's Tables 2, 5 and 7/8 (see configs/mirage.expected.yaml); ``{}`` when the
    file is not there (an installed package without the checkout's configs/)."""
    return read_expected(str(path)) if path and Path(path).is_file() else {}


def paper_model(paper: Mapping, model: str) -> str | None:
    """The data's model id of one of our models in the paper's leaderboards: the id itself,
    or a name the file's ``aliases`` give it (without case); None when the paper did not
    run it."""
    ids = {m for board in (paper.get("tables7_8") or {}).values() for m in board}
    if model in ids:
        return model
    want = model.strip().casefold()
    for model_id, names in (paper.get("aliases") or {}).items():
        if want in (str(n).strip().casefold() for n in names or ()):
            return model_id
    return None


def _num(value) -> str:
    """Three decimals; a missing value is an empty cell (as the tables always showed it)."""
    return fmt(value, 3, dash="")


def _count(value) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else str(int(value))


def _summary_table(allm: pd.DataFrame, paper: Mapping) -> str:
    table2, table5 = paper.get("table2") or {}, paper.get("table5") or {}
    compat = (allm["metric"] == "kendall_tau_argsort").any()
    rows = []
    for lang in dict.fromkeys(allm["lang"]):
        by_metric = allm[allm["lang"] == lang].set_index("metric")

        def value(key, col="value", by_metric=by_metric):
            return by_metric[col].get(key) if key in by_metric.index else None
        r2_text = _num(value("held_out_r2"))
        held_models, undefined = value("held_out_models"), value("r2_undefined_tournaments")
        if not r2_text and held_models is not None and lang != "avg":
            r2_text = (f"not defined ({_count(held_models)} held-out model"
                       f"{'' if held_models == 1 else 's'})" if held_models < 2
                       else f"not defined in all {_count(undefined)} tournaments")
        elif r2_text and value("held_out_r2", "ci_low") is not None:
            r2_text += (f" ({_num(value('held_out_r2', 'ci_low'))}, "
                        f"{_num(value('held_out_r2', 'ci_high'))})")
        paper_r2 = ""
        if lang in table5:
            mean, minus, plus = table5[lang]
            paper_r2 = f"{_num(mean)} (-{minus:.2f} / +{plus:.2f})"  # as Table 5 prints it
        paper_tau = table2.get("avg") if lang == "avg" else (table2.get("tau") or {}).get(lang)
        counts = [_count(value(k)) for k in ("judged_models", "unjudged_models", "judgments",
                                             "ties", "unparsed", "llm_failures",
                                             "degenerate_tournaments",
                                             "r2_undefined_tournaments")]
        rows.append([lang, _num(value("kendall_tau")), _num(paper_tau),
                     _num(value("kendall_tau_oof")),
                     *([_num(value("kendall_tau_argsort"))] if compat else []),
                     r2_text, paper_r2, *counts])
    header = ["lang", "tau", "paper tau", "tau out-of-fold",
              *(["tau argsort (compat)"] if compat else []), "held-out R² (95% CI)",
              "paper R² (95% CI)", "judged models", "unjudged models", "judgments",
              "ties (not in BT fit)", "unparsed", "LLM feature failures",
              "degenerate BT fits", "R² undefined (tournaments)"]
    notes = ["tau: Kendall tau-b between the judge's Bradley-Terry scores and the surrogate's "
             "predictions, the training models included (Table 2's definition); tau "
             "out-of-fold: each model predicted by a surrogate that did not train on it "
             "(leave-one-model-out over the training models, the held-out models from the "
             "fit without them). Ties and unparsed verdicts are counted and left out of the "
             "Bradley-Terry fit (as the reference code did; the paper is silent). LLM "
             "feature failures: pointwise LLM scores that could not be read (llm_parse_failure"
             ": fixed leaves them out of the feature means; reference averages them as 0). "
             "Held-out R² is the mean over the tournaments where it is defined: it is not "
             "defined on fewer than two held-out models, nor where their Bradley-Terry scores "
             "are equal (R² undefined: those tournaments, left out of the mean and the CI)."]
    if compat:
        notes.append("tau argsort (compat): the reference code's tau of the two argsort "
                     "index orders (kendall_tau: reference); not a rank correlation.")
    return pipe_table(header, rows, empty=None, notes=notes, heading="##",
                      title="MIRAGE-Bench: Table 2 (Kendall tau, surrogate vs judge) and "
                            "Table 5 (held-out R²), with the paper's numbers")


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


def _leaderboard(df: pd.DataFrame, lang: str, paper: Mapping) -> str:
    by_lang = df[(df["lang"] == lang) & (df["model"] != "all")]
    bt = by_lang[by_lang["metric"] == "bt"].set_index("model")
    rank = by_lang[by_lang["metric"] == "bt_rank"].set_index("model")["value"]
    surrogate_rank = by_lang[by_lang["metric"] == "surrogate_rank"].set_index("model")["value"]
    board = (paper.get("tables7_8") or {}).get(lang) or {}
    rows = []
    for model in rank.sort_values().index:
        row = bt.loc[model]
        published_row = board.get(paper_model(paper, model) or "")
        theirs = (["", "", "", ""] if published_row is None else
                  [str(published_row[0]), _num(published_row[1]),
                   *(fmt(v, 2) for v in published_row[2:])])
        rows.append([int(rank[model]), model, _num(row["value"]),
                     _num(row["value"] - row["ci_low"]), _num(row["ci_high"] - row["value"]),
                     int(surrogate_rank[model]), *theirs])
    return pipe_table(["rank", "model", "score", "-CI", "+CI", "surrogate rank", "paper rank",
                       "paper score", "paper -CI", "paper +CI"], rows,
                      empty=None, heading="###",
                      title=f"Tables 7/8: {lang} leaderboard (Bradley-Terry, 95% bootstrap CI; "
                            "the paper's 19-model arena beside)")


def tables(metrics: Iterable[Mapping], paper: Mapping | None = None) -> str:
    """Markdown: Table 2 (tau), Table 5 (held-out R²), the arena's counts, and Tables 7/8
    (each language's leaderboard: judge BT score with its 95% interval, surrogate rank),
    each with the paper's numbers (``paper``, default: `published()`) beside ours."""
    df = pd.DataFrame(list(metrics))
    if df.empty:
        return "## MIRAGE-Bench\n\nno results\n"
    paper = published() if paper is None else paper
    allm = df[df["model"] == "all"]
    sections = [_summary_table(allm, paper)]
    for prefix, title in (("feature_set_tau:", "Table 4: surrogate tau by feature set"),
                          ("regressor:", "Table 3: train / held-out R² by regressor")):
        section = _ablation_table(allm, prefix, title)
        if section is not None:
            sections.append(section)
    sections += [_leaderboard(df, lang, paper)
                 for lang in dict.fromkeys(df.loc[df["metric"] == "bt", "lang"])]
    return "\n\n".join(sections) + "\n"
