"""The nugget evaluation's report, for the evaluate stage's study cell: from the rows of the
nuggets stage's assign cells, the metric rows (in the study metrics' shape), the markdown
tables and the per-answer items; and the agreement of the judge's citation support with
the human labels. Pure Python (the scores themselves: tasks/nugget_scores.py).
"""

from __future__ import annotations

import json

from xling.tasks.judge import cohen_kappa
from xling.tasks.nugget_scores import (NUGGET_METRICS, argue_aggregate, argue_counts,
                                       kendall_tau, nugget_scores, run_scores, support_scores)
from xling.tasks.tables import pipe_table

# the columns of an assign cell that `nugget_results` reads
NUGGET_COLUMNS = ["item_id", "study", "setting", "lang", "system", "nuggets", "sentences",
                  "support", "attest", "n_calls", "error"]




def nugget_results(rows: list[dict]) -> tuple[list[dict], str, list[dict]]:
    """(metric rows in the study metrics' shape, markdown tables, per-answer items) of the
    assign cells' rows (`NUGGET_COLUMNS`): nugget scores per answer, then per run (system x
    language) over the answers scored (`present`, NZ's mean) and over every topic asked (an
    answer that failed counts 0); TREC 2024 support and ARGUE when the cells judged them."""
    runs: dict[tuple, list[dict]] = {}
    items = []
    for r in rows:
        nuggets = json.loads(r["nuggets"]) if r["nuggets"] else []
        sents = json.loads(r["sentences"]) if r["sentences"] else []
        item = {"item_id": r["item_id"], "setting": r["setting"], "lang": r["lang"],
                "system": r["system"], "error": r["error"], "n_nuggets": len(nuggets)}
        if r["error"] is None:
            item.update(nugget_scores(nuggets))
        if r["support"]:
            item["support"] = support_scores(json.loads(r["support"]), len(sents))
        if r["attest"]:
            item["argue"] = argue_counts(sents, json.loads(r["attest"]), nuggets)
        items.append(item)
        runs.setdefault((r["study"], r["setting"], r["lang"], r["system"]), []).append(item)
    metrics, nug_rows, sup_rows, arg_rows = [], [], [], []

    def metric(key, name, value, n):
        metrics.append({"study": key[0], "setting": key[1], "lang": key[2], "model": key[3],
                        "metric": name, "value": float(value), "ci_low": None, "ci_high": None,
                        "n": n})

    for key, its in sorted(runs.items()):
        ok = [i for i in its if i["error"] is None]
        scores = run_scores({i["item_id"]: i for i in ok}, topics=[i["item_id"] for i in its])
        for m in NUGGET_METRICS:
            metric(key, f"nugget_{m}", scores["present"][m], len(ok))
            metric(key, f"nugget_{m}@all_topics", scores["all_topics"][m], len(its))
        nug_rows.append([key[1], key[2], key[3], *(f"{scores['present'][m]:.4f}" for m in NUGGET_METRICS),
                         f"{scores['all_topics']['A']:.4f}", f"{len(ok)}/{len(its)}"])
        sup = [i["support"] for i in ok if "support" in i]
        if sup:
            vals = {k: sum(s[k] for s in sup) / len(sup)
                    for k in ("precision", "recall", "f1", "pair_mean")}
            for k, v in vals.items():
                metric(key, f"support_{k}", v, len(sup))
            sup_rows.append([key[1], key[2], key[3], *(f"{vals[k]:.4f}" for k in vals),
                             str(sum(s["pairs"] for s in sup)),
                             str(sum(s["unparsed"] for s in sup))])
        arg = {i["item_id"]: i["argue"] for i in ok if "argue" in i}
        if arg:
            agg = argue_aggregate(arg)
            for k, v in agg.items():
                if k != "topics":
                    metric(key, f"argue_{k}", v, len(arg))
            arg_rows.append([key[1], key[2], key[3], *(f"{agg[k]:.4f}" for k in (
                "sentence_support_micro", "sentence_support_macro", "nugget_coverage_micro",
                "nugget_coverage_macro", "f1_micro", "f1_macro")), str(len(arg))])
    agree = agreement(rows)
    for a in agree:
        for name in ("kappa_support", "kappa_full", "tau_b", "tau_a"):
            if a[name] is not None:
                metrics.append({"study": a["study"], "setting": a["setting"], "lang": a["lang"],
                                "model": None, "metric": f"agreement_{name}",
                                "value": float(a[name]), "ci_low": None, "ci_high": None,
                                "n": a["pairs"] if name.startswith("kappa") else a["runs"]})
    md = ["### Nugget evaluation (AutoNuggetizer, castorini/nuggetizer's method)", "",
          "Per run: the mean over the answers scored; A@all counts every topic asked "
          "(a failed answer 0); answers: scored/asked.", "",
          pipe_table(["setting", "lang", "system", *NUGGET_METRICS, "A@all", "answers"], nug_rows)]
    if sup_rows:
        md += ["", "### Citation support (TREC RAG 2024: Full 1, Partial 0.5, No 0; "
               "open-rag-eval's weighted precision/recall)", "",
               pipe_table(["setting", "lang", "system", "precision", "recall", "F1", "pair mean", "pairs",
                           "unparsed"], sup_rows)]
    if arg_rows:
        md += ["", "### RAGTIME (Auto-ARGUE: sentence support, nugget coverage, F1; "
               "f1_macro = mean of per-topic F1)", "",
               pipe_table(["setting", "lang", "system", "SS micro", "SS macro", "NC micro", "NC macro",
                           "F1 micro", "F1 macro", "topics"], arg_rows)]
    if agree:
        md += ["", "### Agreement with the human labels (qrels of the cited documents)", "",
               "kappa: the judge's TREC 2024 support of a cited document (Full or Partial; "
               "Full only) against its human relevance label, over every judged citation "
               "(Cohen's kappa, sklearn); tau: the systems ranked by support precision "
               "against by the share of their citations the qrels call relevant (Kendall, "
               "scipy; undefined with fewer than 2 systems or a constant side).", "",
               pipe_table(["setting", "lang", "kappa (FS+PS)", "kappa (FS)", "pairs",
                           "tau-b", "tau-a", "systems"],
                          [[a["setting"], a["lang"], _f(a["kappa_support"]),
                            _f(a["kappa_full"]), str(a["pairs"]), _f(a["tau_b"]),
                            _f(a["tau_a"]), str(a["runs"])] for a in agree])]
    return metrics, "\n".join(md) + "\n", items


def _f(v) -> str:
    return "n/a" if v is None or v != v else f"{v:.3f}"


def agreement(rows: list[dict]) -> list[dict]:
    """Per (study, setting, lang): Cohen's kappa between the judge's support of each cited
    document and its human label, and Kendall's tau between the systems' support precision
    and their human citation precision (the share of their judged citations labelled
    relevant). Only where the study's documents carry labels (MIRAGE's positive_ids)."""
    groups: dict[tuple, dict[str, list]] = {}
    for r in rows:
        if r["error"] is not None or not r["support"]:
            continue
        judged = [j for j in json.loads(r["support"]) if j.get("human") is not None
                  and j["label"] is not None]
        g = groups.setdefault((r["study"], r["setting"], r["lang"]), {})
        sys = g.setdefault(r["system"], {"pairs": [], "auto": [], "human": []})
        sys["pairs"] += judged
        sents = json.loads(r["sentences"]) if r["sentences"] else []
        sys["auto"].append(support_scores(json.loads(r["support"]), len(sents))["precision"])
        if judged:
            sys["human"].append(sum(j["human"] >= 1 for j in judged) / len(judged))
    out = []
    for (study, setting, lang), systems in sorted(groups.items()):
        pairs = [j for s in systems.values() for j in s["pairs"]]
        if not pairs:
            continue
        human = [j["human"] >= 1 for j in pairs]
        a = {"study": study, "setting": setting, "lang": lang, "pairs": len(pairs),
             "kappa_support": cohen_kappa([j["label"] in ("FS", "PS") for j in pairs], human),
             "kappa_full": cohen_kappa([j["label"] == "FS" for j in pairs], human),
             "tau_b": None, "tau_a": None, "runs": 0}
        ranked = [(sum(s["auto"]) / len(s["auto"]), sum(s["human"]) / len(s["human"]))
                  for s in systems.values() if s["auto"] and s["human"]]
        a["runs"] = len(ranked)
        if len(ranked) >= 2:
            tau = kendall_tau([x for x, _ in ranked], [y for _, y in ranked])
            a["tau_b"], a["tau_a"] = tau["tau_b"], tau["tau_a"]
        out.append(a)
    return out
