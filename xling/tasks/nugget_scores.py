"""The scores of nugget evaluation (/work/shared/specs/nuggets.md s6-s8): nugget recall per
answer and run (castorini/nuggetizer@d00dc3e `core/metrics.py`), the weighted variants of
the paper (via vectara/open-rag-eval, third party), TREC 2024 citation support (open-rag-
eval's weighted precision/recall), RAGTIME's Auto-ARGUE sentence support, nugget coverage and
F1 (hltcoe/argue-viz README and `example-report.scores.tsv`), and agreement with people
(Kendall's tau via scipy, Cohen's kappa via scikit-learn). Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import mean

NUGGET_METRICS = ("A_strict", "V_strict", "A", "V", "W", "W_strict")
PARTIAL = {"support": 1.0, "partial_support": 0.5}
SUPPORT_SCORE = {"FS": 1.0, "PS": 0.5, "NS": 0.0}


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0  # NZ core/metrics.py L34-39: empty -> 0.0


def nugget_scores(nuggets: Sequence[Mapping]) -> dict[str, float]:
    """One answer's scores from its nuggets (`importance`, `assignment`): s(support) = 1,
    s(partial_support) = 0.5, anything else 0 (not_support, failed, odd strings); V and O are
    the nuggets labelled exactly "vital" / "okay"; A is every nugget. W weighs okay by 0.5
    (the paper's, as open-rag-eval computes it, but with |O| itself in the denominator:
    ORE's max(|O|, 1) inflates it when O is empty, spec s6)."""
    strict = [1.0 if n["assignment"] == "support" else 0.0 for n in nuggets]
    part = [PARTIAL.get(n["assignment"], 0.0) for n in nuggets]
    vital = [i for i, n in enumerate(nuggets) if n["importance"] == "vital"]
    okay = [i for i, n in enumerate(nuggets) if n["importance"] == "okay"]

    def weighted(s: list[float]) -> float:
        return _ratio(sum(s[i] for i in vital) + 0.5 * sum(s[i] for i in okay),
                      len(vital) + 0.5 * len(okay))

    return {"A_strict": _ratio(sum(strict), len(nuggets)),
            "V_strict": _ratio(sum(strict[i] for i in vital), len(vital)),
            "A": _ratio(sum(part), len(nuggets)),
            "V": _ratio(sum(part[i] for i in vital), len(vital)),
            "W": weighted(part), "W_strict": weighted(strict)}


def run_scores(per_topic: Mapping[str, Mapping[str, float]],
               topics: Iterable[str] | None = None) -> dict[str, dict[str, float]]:
    """A run's means: `present` over the topics scored (NZ `calculate_global_metrics`) and,
    with the official `topics`, `all_topics` over those (a topic without a score counts 0,
    as the track does; spec s11.9)."""
    out = {"present": {m: (mean(s[m] for s in per_topic.values()) if per_topic else 0.0)
                       for m in NUGGET_METRICS}}
    if topics is not None:
        topics = list(topics)
        out["all_topics"] = {m: _ratio(sum(per_topic[t][m] for t in topics if t in per_topic),
                                       len(topics)) for m in NUGGET_METRICS}
    return out


# ---------------------------------------------------------------------------------------
# TREC RAG 2024 citation support


def support_scores(judgments: Sequence[Mapping], n_sentences: int) -> dict[str, float | int]:
    """One answer's support scores from its (sentence, docid, label FS/PS/NS/None) judgments,
    as open-rag-eval computes them (the official definitions were not read, spec s7.1):
    `precision` = mean over distinct cited ids of the mean of that id's scores; `recall` =
    mean over all `n_sentences` of the sentence's mean score (an uncited sentence 0);
    `pair_mean` over every judgment; `f1` their harmonic mean. Unparseable labels (None) are
    counted in `unparsed` and left out of the means."""
    scored = [j for j in judgments if j["label"] in SUPPORT_SCORE]
    by_doc: dict[str, list[float]] = {}
    by_sent: dict[int, list[float]] = {}
    for j in scored:
        s = SUPPORT_SCORE[j["label"]]
        by_doc.setdefault(j["docid"], []).append(s)
        by_sent.setdefault(j["sentence"], []).append(s)
    precision = mean(mean(v) for v in by_doc.values()) if by_doc else 0.0
    recall = _ratio(sum(mean(v) for v in by_sent.values()), n_sentences)
    return {"precision": precision, "recall": recall,
            "f1": _ratio(2 * precision * recall, precision + recall),
            "pair_mean": mean(SUPPORT_SCORE[j["label"]] for j in scored) if scored else 0.0,
            "pairs": len(judgments), "unparsed": len(judgments) - len(scored)}


# ---------------------------------------------------------------------------------------
# RAGTIME / Auto-ARGUE


def argue_counts(sentences: Sequence[Mapping], attestations: Sequence[Mapping],
                 nuggets: Sequence[Mapping]) -> dict[str, int]:
    """One topic's ARGUE counts: sentences with citations; those attested by **all** their
    judged citations (spec s11.14); citations and supporting citations; nuggets and the
    nuggets the answer supports (the assignment's `support`: nugget coverage)."""
    by_sent: dict[int, list[bool]] = {}
    for a in attestations:
        by_sent.setdefault(a["sentence"], []).append(bool(a["label"]))
    cited = [i for i, s in enumerate(sentences) if s.get("citations")]
    return {"sentences": len(cited),
            "correct_sentences": sum(1 for i in cited if by_sent.get(i) and all(by_sent[i])),
            "citations": len(attestations),
            "supporting_citations": sum(bool(a["label"]) for a in attestations),
            "nuggets": len(nuggets),
            "correct_nuggets": sum(n["assignment"] == "support" for n in nuggets)}


def argue_topic(c: Mapping[str, int]) -> dict[str, float]:
    ss = _ratio(c["correct_sentences"], c["sentences"])
    nc = _ratio(c["correct_nuggets"], c["nuggets"])
    return {"sentence_support": ss, "nugget_coverage": nc,
            "citation_support": _ratio(c.get("supporting_citations", 0), c.get("citations", 0)),
            "f1": _ratio(2 * ss * nc, ss + nc)}


def argue_aggregate(per_topic: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """`_micro` = ratios of summed counts (f1_micro = F1 of the two micro values); `_macro`
    = means of per-topic values, and **f1_macro = the mean of per-topic F1**, not the F1 of
    the macros (argue-viz's scores.tsv; spec s7.2, R1)."""
    tops = [argue_topic(c) for c in per_topic.values()]
    tot = {k: sum(c[k] for c in per_topic.values())
           for k in ("sentences", "correct_sentences", "nuggets", "correct_nuggets")}
    ss = _ratio(tot["correct_sentences"], tot["sentences"])
    nc = _ratio(tot["correct_nuggets"], tot["nuggets"])
    return {"sentence_support_micro": ss, "nugget_coverage_micro": nc,
            "f1_micro": _ratio(2 * ss * nc, ss + nc),
            "sentence_support_macro": mean(t["sentence_support"] for t in tops) if tops else 0.0,
            "nugget_coverage_macro": mean(t["nugget_coverage"] for t in tops) if tops else 0.0,
            "f1_macro": mean(t["f1"] for t in tops) if tops else 0.0, "topics": len(tops)}


# ---------------------------------------------------------------------------------------
# agreement with people (spec s8)


def kendall_tau(auto: Sequence[float], manual: Sequence[float]) -> dict[str, float]:
    """Kendall's tau between two conditions' run-level scores: tau-b (scipy's default, spec
    s8) and tau-a (concordant minus discordant pairs over all pairs; differs with ties)."""
    from scipy.stats import kendalltau

    if len(auto) != len(manual) or len(auto) < 2:
        raise ValueError(f"kendall_tau: needs two equal lists of 2+ runs, got {len(auto)} "
                         f"and {len(manual)}")
    tau_b = float(kendalltau(auto, manual).statistic)
    n = len(auto)
    s = sum(math.copysign(1, (auto[i] - auto[j]) * (manual[i] - manual[j]))
            for i in range(n) for j in range(i + 1, n)
            if (auto[i] - auto[j]) * (manual[i] - manual[j]) != 0)
    return {"tau_b": tau_b, "tau_a": s / (n * (n - 1) / 2), "runs": n}


def kappa_per_label(auto: Sequence[str], human: Sequence[str]) -> dict[str, float]:
    """Cohen's kappa overall and, per label, of the one-vs-rest binary labels
    (scikit-learn, through tasks/judge.cohen_kappa; NaN where undefined)."""
    from xling.tasks.judge import cohen_kappa

    out = {"all": cohen_kappa(auto, human)}
    for label in sorted(set(auto) | set(human)):
        out[label] = cohen_kappa([a == label for a in auto], [h == label for h in human])
    return out
