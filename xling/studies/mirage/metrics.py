"""Scoring MIRAGE-Bench: per language the arena (Bradley-Terry with bootstrap intervals), the
surrogate's scores, tau and held-out R², the feature means and the verdict counts, as the
evaluate stage's metric rows; from this run's generations, judgments and features, or from
the hub's published ones (``source: published``)."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from xling.studies.mirage.constants import LLM_FEATURES, REGRESSORS, SETTING, STUDY
from xling.studies.mirage.data import items_of, load_judgments, load_outputs
from xling.studies.mirage.features import reduce_features
from xling.studies.mirage.options import Knobs, Options, is_published
from xling.studies.mirage.pairs import merge_orders, split_pair_id
from xling.studies.mirage.surrogate import arena, feature_set_taus, regressor_ablation


def _published_inputs(opts: Options, lang: str, knobs: Knobs
                      ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    gens, feats = load_outputs(opts.outputs, lang, opts.split)
    judgments = load_judgments(opts.judgments, lang, opts.split, knobs=knobs)
    if opts.limit:
        keep = {item["query_id"] for item in items_of(opts, lang)}
        gens, feats = gens[gens["query_id"].isin(keep)], feats[feats["query_id"].isin(keep)]
        judgments = judgments[judgments["query_id"].isin(keep)]
    return gens, feats, judgments


def _run_judgments(judgments: Sequence[Mapping], lang: str) -> pd.DataFrame:
    rows = []
    for judgment in judgments:
        if judgment.get("lang") != lang:
            continue
        query_id, model_a, model_b = split_pair_id(judgment["item_id"])
        rows.append({"query_id": query_id, "model_A": model_a, "model_B": model_b,
                     "judge": judgment.get("judge"),
                     "verdict": judgment.get("verdict") if not judgment.get("error") else None,
                     "error": judgment.get("error")})
    return pd.DataFrame(rows, columns=["query_id", "model_A", "model_B", "judge", "verdict",
                                       "error"])


def _metric(lang, model, metric, value, n=None, low=None, high=None) -> dict:
    value = None if value is None or (isinstance(value, float) and math.isnan(value)) \
        else float(value)
    return {"study": STUDY, "setting": SETTING, "lang": lang, "model": model, "metric": metric,
            "value": value, "ci_low": None if low is None else float(low),
            "ci_high": None if high is None else float(high), "n": n}


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _language_inputs(opts: Options, lang: str, knobs: Knobs, generations: Sequence[Mapping],
                     judgments: Sequence[Mapping] | None, run_features: pd.DataFrame | None
                     ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One language's generations (``item_id, model, output``), long feature rows and
    judgments (``query_id, model_A, model_B, verdict``): the hub's, or this run's."""
    if is_published(opts):
        gens, feats, judged = _published_inputs(opts, lang, knobs)
        return gens.rename(columns={"query_id": "item_id"}), feats, judged
    gens = pd.DataFrame([g for g in generations if g["lang"] == lang],
                        columns=["item_id", "model", "output", "error"])
    judged = _run_judgments(judgments or [], lang)
    if opts.both_orders:
        judged = merge_orders(judged)
    # keyed by (lang, query id): MIRACL dev ids repeat across languages
    return gens, run_features[run_features["lang"] == lang], judged


def arena_roster(opts: Options, judged: pd.DataFrame, answered: Iterable[str]
                 ) -> tuple[list[str], list[str]]:
    """The language's arena: the models the judge compared (``models`` narrows them), and
    the models that answered (or were listed) but were never judged. An unjudged model has
    no Bradley-Terry score (it would read theta = 0 +- 0) and is no surrogate training row."""
    judged_models = set(judged["model_A"]) | set(judged["model_B"])
    wanted = list(opts.models or sorted(judged_models | set(answered)))
    return ([m for m in wanted if m in judged_models],
            [m for m in wanted if m not in judged_models])


def check_held_out(opts: Options, lang: str, roster: Sequence[str], knobs: Knobs) -> None:
    """Held-out names outside the arena are refused: a name that matches no model would
    leave the surrogate trained on every model (Table 5 empty, tau in sample) silently."""
    unknown = [m for m in knobs.held_out if m not in roster]
    if unknown:
        hint = (" (source: published names the hub's model ids, e.g. google/gemma-1.1-2b-it "
                "and meta-llama/Meta-Llama-3-70B-Instruct, the paper's held-out pair, P L130)"
                if is_published(opts) else " (the generate.models names)")
        raise ValueError(f"study.options.held_out: {unknown} are not in the {lang} arena, "
                         f"whose judged models are {roster}; name held-out models among "
                         f"them{hint}")


def _language_metrics(lang: str, result: dict, roster: list[str], query_ids: list[str],
                      judged: pd.DataFrame, unjudged: list[str], knobs: Knobs) -> list[dict]:
    """The metric rows of one language's arena result."""
    final, counts, table = result["final"], result["counts"], result["table"]
    surrogate = dict(zip(final["models"], final["surrogate"]))
    surrogate_rank = {m: i + 1 for i, m in enumerate(sorted(surrogate,
                                                            key=lambda m: -surrogate[m]))}
    oof = dict(zip(final["models"], final["surrogate_oof"]))
    feature_means = table.means(query_ids)
    failures = table.failures(query_ids)
    llm = [(k, f) for k, f in enumerate(knobs.features) if f in LLM_FEATURES]
    metrics = []
    for row in result["bt"].itertuples(index=False):
        model = row.model_id
        index = roster.index(model)
        metrics += [_metric(lang, model, "bt", row.mean, knobs.tournaments, row.ci_low,
                            row.ci_high),
                    _metric(lang, model, "bt_rank", row.rank),
                    _metric(lang, model, "surrogate", surrogate[model]),
                    _metric(lang, model, "surrogate_oof", oof[model]),
                    _metric(lang, model, "surrogate_rank", surrogate_rank[model]),
                    _metric(lang, model, "held_out", float(model in knobs.held_out))]
        metrics += [_metric(lang, model, f"feature:{f}", feature_means[index][k], len(query_ids))
                    for k, f in enumerate(knobs.features)]
        metrics += [_metric(lang, model, f"llm_failures:{f}", failures[index][k], len(query_ids))
                    for k, f in llm]
    held = result["held_out_r2"][~np.isnan(result["held_out_r2"])]
    low, high = np.percentile(held, [2.5, 97.5]) if len(held) else (None, None)
    metrics += [_metric(lang, "all", "kendall_tau", final["kendall_tau"], len(roster)),
                _metric(lang, "all", "kendall_tau_oof", final["kendall_tau_oof"], len(roster)),
                _metric(lang, "all", "held_out_r2", held.mean() if len(held) else None,
                        len(held), low, high),
                # Table 5's R² is not defined on fewer than two held-out models, nor in a
                # tournament where their scores are equal (surrogate.r2): counted, not averaged
                _metric(lang, "all", "held_out_models", len(knobs.held_out)),
                _metric(lang, "all", "r2_undefined_tournaments",
                        int(np.isnan(result["held_out_r2"]).sum()), knobs.tournaments),
                _metric(lang, "all", "train_r2", final["train_r2"], len(roster)),
                _metric(lang, "all", "judged_queries", judged["query_id"].nunique()),
                _metric(lang, "all", "judged_models", len(roster)),
                _metric(lang, "all", "unjudged_models", len(unjudged)),
                _metric(lang, "all", "judgments", counts["judgments"]),
                _metric(lang, "all", "ties", counts["tie"]),
                _metric(lang, "all", "unparsed", counts["unparsed"]),
                _metric(lang, "all", "llm_failures", int(sum(failures[:, k].sum()
                                                             for k, _ in llm)),
                        len(query_ids) * len(roster) * len(llm)),
                _metric(lang, "all", "degenerate_tournaments", result["degenerate_tournaments"],
                        knobs.tournaments)]
    if "kendall_tau_argsort" in final:  # kendall_tau: reference only
        metrics.append(_metric(lang, "all", "kendall_tau_argsort", final["kendall_tau_argsort"],
                               len(roster)))
    metrics += [_metric(lang, "all", f"rf_importance:{f}", v)
                for f, v in final["importances"].items()]
    metrics += [_metric(lang, "all", f"feature_set_tau:{k}", v)
                for k, v in result.get("feature_sets", {}).items()]
    metrics += [_metric(lang, "all", f"regressor:{kind}:{split}", v)
                for kind, by_split in result.get("regressors", {}).items()
                for split, v in by_split.items()]
    return metrics


def score(opts: Options, generations: Sequence[Mapping], judgments: Sequence[Mapping] | None,
          features: Sequence[Mapping] | None = None) -> tuple[list[dict], list[dict]]:
    """Per language: the BT leaderboard with bootstrap intervals (Tables 7/8) over the judged
    models (`arena_roster`), the surrogate's scores in sample and out of fold, tau (Table 2)
    both ways and held-out R² (Table 5), feature means and the counts (ties, unparsed
    verdicts, LLM feature failures, unjudged models); ``lang="avg"`` the mean taus. Items
    are the judgments as the arena counted them. With ``source: published`` the hub's
    outputs, features and verdicts are read here instead of the run's."""
    knobs = Knobs.of(opts)
    run_features = reduce_features(opts, features or []) if not is_published(opts) else None
    items, metrics = [], []
    taus: dict[str, dict[str, float]] = {"kendall_tau": {}, "kendall_tau_oof": {}}
    for lang in opts.langs:
        gens, feats, judged = _language_inputs(opts, lang, knobs, generations, judgments,
                                               run_features)
        roster, unjudged = arena_roster(opts, judged, gens["model"])
        if len(roster) < 2 or judged.empty:
            metrics += [_metric(lang, "all", "judgments", len(judged), n=len(judged)),
                        _metric(lang, "all", "unjudged_models", len(unjudged))]
            continue
        check_held_out(opts, lang, roster, knobs)
        query_ids = sorted({str(q) for q in gens["item_id"]})
        result = arena(judged, feats, roster, knobs, query_ids=query_ids)
        if opts.ablations:  # Tables 3 and 4
            result["feature_sets"] = feature_set_taus(result["bootstrap"], feats, query_ids,
                                                      knobs)
            kinds = [k for k in REGRESSORS if k != "xgboost" or _has("xgboost")]
            result["regressors"] = regressor_ablation(
                result["bootstrap"].theta.mean(axis=0), result["table"].means(query_ids), kinds,
                n_held_out=min(4, max(1, len(roster) // 4)), random_state=knobs.rf_state)
        metrics += _language_metrics(lang, result, roster, query_ids, judged, unjudged, knobs)
        for name, by_lang in taus.items():
            by_lang[lang] = result["final"][name]
        items += [{"lang": lang, **{k: (None if isinstance(v, float) and math.isnan(v) else v)
                                    for k, v in row.items()}}
                  for row in judged.to_dict("records")]
    for name, by_lang in taus.items():
        values = [v for v in by_lang.values() if not math.isnan(v)]
        if by_lang:
            metrics.append(_metric("avg", "all", name,
                                   float(np.mean(values)) if values else None, len(values)))
    return items, metrics
