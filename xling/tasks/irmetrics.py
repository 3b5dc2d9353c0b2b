"""IR evaluation through pytrec_eval (trec_eval's own code), with ir-measures' names, and the
LLM-CLIR paper's oracle, PRI and Realized %.

`evaluate` computes per-query measures with pytrec_eval, the Python binding of trec_eval
that pyserini's 2CR, ir-measures and ir_datasets use: the numbers are trec_eval's by
construction (its ordering of hits: score rounded to a C `float`, descending, ties by doc_id
descending; relevant means relevance >= 1; the rank column is ignored). Two measures that
trec_eval lacks are computed here, as ir-measures computes them: `Judged@K` (its `judged`
provider) and `RR@K` (reciprocal rank, 0 when the first relevant doc is below rank K).

Metric names (`parse_metric`, `evaluate.metrics`), either convention:

| trec_eval (pytrec_eval)          | ir-measures                  | measure               |
|----------------------------------|------------------------------|-----------------------|
| `map`, `map_cut_K`               | `AP`, `MAP`, `AP@K`          | average precision     |
| `ndcg`, `ndcg_cut_K`             | `nDCG`, `NDCG`, `nDCG@K`     | nDCG (log2, graded)   |
| `recall_K`                       | `R@K`, `Recall@K`            | recall at K           |
| `P_K`                            | `P@K`, `Precision@K`         | precision at K        |
| `recip_rank`                     | `RR`, `MRR`; `RR@K`          | reciprocal rank       |
| `success_K`                      | `Success@K`                  | a relevant doc in top K |
| `Rprec`, `bpref`                 | `Rprec`, `Bpref`             |                       |
| `num_ret`, `num_rel`, `num_rel_ret` | `NumRet`, `NumRel`, `NumRelRet` | counts          |
| —                                | `Judged@K`                   | judged share of top K |

trec_eval's dotted form (`ndcg_cut.20`, as in `trec_eval -m ndcg_cut.20`) is accepted too.
Rows and tables keep the name as the config gives it; `canonical` maps both conventions to
one name (`nDCG@20` and `ndcg_cut_20` are the same measure) for comparisons with expected
numbers. An unknown name raises ValueError naming the closest valid ones. ir-measures'
parameters (`AP(rel=2)`) are not supported.

Which queries: `evaluate` returns the queries of the run that the qrels judge (pytrec_eval's
set; trec_eval without `-c`), or with `complete=True` every query of the qrels, a query the
run does not answer scoring 0 on every measure (trec_eval `-c`, the convention of pyserini's
2CR for CIRAL and MIRACL, which the evaluate stage uses by default: `evaluate.average`).
A query in the qrels without any relevant doc is evaluated, every measure 0 (trec_eval's).

The LLM-CLIR paper's analysis tools: `oracle_ceiling` (the "glass ceiling" of a reranker
that can only reorder a run's top N), `pri` and `realized` (its Eq. 1 and 2), and
`paired_ttest`. `metric_rows` turns per-query values into metrics rows.
"""

from __future__ import annotations

import difflib
import math
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xling.tasks.runs import HITS_SCHEMA, as_hits

DEFAULT_METRICS = ("map", "ndcg_cut_10", "ndcg_cut_20", "recall_100", "recip_rank")

Run = pa.Table | Mapping[str, Mapping[str, float]]
Qrels = pa.Table | Mapping[str, Mapping[str, int]] | Iterable[Mapping]


class Measure(NamedTuple):
    """A parsed metric name: `family` is trec_eval's (`ndcg_cut`, `recall`, ...) or one of
    `Judged` / `RR_cut` (computed here); `k` the cutoff; `trec` the key pytrec_eval reports
    (None for Judged), `canonical` the one name of the measure (`canonical`)."""

    name: str
    family: str
    k: int | None
    trec: str | None
    canonical: str


# trec_eval families without and with a cutoff
_TREC_PLAIN = {"map", "ndcg", "recip_rank", "Rprec", "bpref", "num_ret", "num_rel",
               "num_rel_ret"}
_TREC_CUT = {"map_cut", "ndcg_cut", "recall", "P", "success"}
# ir-measures names (aliases included) -> trec_eval family, without and with @K
_IRM_PLAIN = {"AP": "map", "MAP": "map", "nDCG": "ndcg", "NDCG": "ndcg", "RR": "recip_rank",
              "MRR": "recip_rank", "Rprec": "Rprec", "RPrec": "Rprec", "Bpref": "bpref",
              "BPref": "bpref", "NumRet": "num_ret", "NumRel": "num_rel",
              "NumRelRet": "num_rel_ret"}
_IRM_CUT = {"AP": "map_cut", "MAP": "map_cut", "nDCG": "ndcg_cut", "NDCG": "ndcg_cut",
            "R": "recall", "Recall": "recall", "P": "P", "Precision": "P",
            "Success": "success", "RR": "RR_cut", "MRR": "RR_cut", "Judged": "Judged"}
_TREC_RE = re.compile(r"(?P<fam>[A-Za-z_]+?)[_.](?P<k>[1-9][0-9]*)")
_IRM_RE = re.compile(r"(?P<fam>[A-Za-z]+)@(?P<k>[1-9][0-9]*)")


def _suggest(name: str) -> list[str]:
    """Valid names closest to `name` (the cutoff it gives, else 10)."""
    k = (re.findall(r"[0-9]+", name) or ["10"])[-1].lstrip("0") or "10"
    valid = sorted({*_TREC_PLAIN, *(f"{f}_{k}" for f in _TREC_CUT), *_IRM_PLAIN,
                    *(f"{f}@{k}" for f in _IRM_CUT)})
    by_lower = {v.lower(): v for v in valid}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=4, cutoff=0.5)
    return [by_lower[c] for c in close]


def parse_metric(name: str) -> Measure:
    """`"ndcg_cut_10"`, `"ndcg_cut.10"`, `"nDCG@10"` -> the same measure; ValueError naming
    the closest valid names for anything else."""
    family, k = None, None
    if name in _TREC_PLAIN:
        family = name
    elif name in _IRM_PLAIN:
        family = _IRM_PLAIN[name]
    elif m := _TREC_RE.fullmatch(name):
        if m["fam"] in _TREC_CUT:
            family, k = m["fam"], int(m["k"])
    elif m := _IRM_RE.fullmatch(name):
        if m["fam"] in _IRM_CUT:
            family, k = _IRM_CUT[m["fam"]], int(m["k"])
    if family is None:
        close = _suggest(name)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(
            f"unknown metric {name!r}{hint} (trec_eval names: map, ndcg_cut_K, recall_K, P_K, "
            "recip_rank, success_K, map_cut_K, ndcg, Rprec, bpref; ir-measures names: AP, "
            "nDCG@K, R@K, P@K, RR, RR@K, Success@K, Judged@K)")
    if family == "Judged":
        return Measure(name, family, k, None, f"Judged@{k}")
    if family == "RR_cut":
        return Measure(name, family, k, "recip_rank", f"RR@{k}")
    trec = family if k is None else f"{family}_{k}"
    return Measure(name, family, k, trec, trec)


def canonical(name: str) -> str:
    """One name per measure: trec_eval's where it has one (`nDCG@20` -> `ndcg_cut_20`,
    `AP` -> `map`, `RR` -> `recip_rank`), else ir-measures' (`Judged@10`, `RR@10`)."""
    return parse_metric(name).canonical


def check_metrics(names: Iterable[str]) -> list[str]:
    """The names, each checked (ValueError as `parse_metric`); two names for one measure
    (`ndcg_cut_20` and `nDCG@20`) are an error too."""
    names = list(names)
    seen: dict[str, str] = {}
    for n in names:
        c = parse_metric(n).canonical
        if c in seen:
            raise ValueError(f"metrics {seen[c]!r} and {n!r} are the same measure: keep one")
        seen[c] = n
    return names


def qrels_dict(qrels: Qrels) -> dict[str, dict[str, int]]:
    """`{qid: {docid: relevance}}` from a qrels table, rows (`iter_qrels`) or a dict.

    A doc judged twice for one query raises ValueError (trec_eval refuses such qrels).
    """
    if isinstance(qrels, Mapping):
        return {str(q): {str(d): int(r) for d, r in docs.items()} for q, docs in qrels.items()}
    if isinstance(qrels, pa.Table):
        rows = zip(pc.cast(qrels["query_id"], pa.string()).to_pylist(),
                   pc.cast(qrels["doc_id"], pa.string()).to_pylist(),
                   qrels["relevance"].to_pylist())
    else:
        rows = ((r["query_id"], r["doc_id"], r["relevance"]) for r in qrels)
    out: dict[str, dict[str, int]] = {}
    for q, d, r in rows:
        docs = out.setdefault(str(q), {})
        if str(d) in docs:
            raise ValueError(f"qrels judge doc {d!r} twice for query {q!r}")
        docs[str(d)] = int(r)
    return out


def run_dict(run: Run) -> dict[str, dict[str, float]]:
    """`{qid: {docid: score}}` (pytrec_eval's run form) from a hits table or a dict; a doc
    listed twice for one query in a table raises ValueError."""
    if isinstance(run, Mapping):
        return {str(q): {str(d): float(s) for d, s in docs.items()} for q, docs in run.items()}
    out: dict[str, dict[str, float]] = {}
    for q, d, s in zip(pc.cast(run["query_id"], pa.string()).to_pylist(),
                       pc.cast(run["doc_id"], pa.string()).to_pylist(),
                       pc.cast(run["score"], pa.float64()).to_pylist()):
        docs = out.setdefault(q, {})
        if d in docs:
            raise ValueError(f"the run lists doc {d!r} more than once for query {q!r}")
        docs[d] = s
    return out


def trec_eval_order(doc_ids: list[str], scores: list[float]) -> list[int]:
    """Indices of the hits in the order trec_eval evaluates them: score rounded to a C
    `float` (trec_eval keeps `float sim`), descending, ties by doc_id in *descending* byte
    order (`comp_sim_docno` in trec_eval's form_res_rels.c). What `export` writes ranks in."""
    s32 = np.asarray(scores, dtype=np.float64).astype(np.float32)
    if np.isnan(s32).any():
        raise ValueError("hits with a NaN score cannot be ordered")
    idx = sorted(range(len(doc_ids)), key=doc_ids.__getitem__, reverse=True)
    idx.sort(key=lambda i: s32[i], reverse=True)  # stable: equal scores keep doc_id desc
    return idx


def _judged_at(hits: Mapping[str, float], judged: Mapping[str, int], k: int) -> float:
    """ir-measures' `Judged@k` (its judged provider): the share of the top k, ordered by
    score descending then doc_id ascending, that the qrels judge (any grade); divided by the
    number of hits when fewer than k were retrieved; 0 for no hits (ir-measures divides by
    zero there)."""
    top = sorted(hits.items(), key=lambda x: (-x[1], x[0]))[:k]
    return sum(d in judged for d, _ in top) / len(top) if top else 0.0


def evaluate(run: Run, qrels: Qrels, metrics: Iterable[str] = DEFAULT_METRICS, *,
             complete: bool = False) -> dict[str, dict[str, float]]:
    """Per-query measures, `{qid: {metric: value}}`, keyed by the names given.

    `run` is a hits table (only `query_id`, `doc_id`, `score` are read) or
    `{qid: {docid: score}}`; `qrels` a qrels table, rows or `{qid: {docid: relevance}}`.
    The queries are those of the run that the qrels have (pytrec_eval's); with `complete`
    every query of the qrels, one the run lacks scoring 0 (trec_eval `-c`).
    """
    import pytrec_eval

    specs = [parse_metric(m) for m in metrics]
    judged_all = qrels_dict(qrels)
    hits = run_dict(run)
    queries = [q for q in hits if q in judged_all]
    if complete:
        queries += [q for q in judged_all if q not in hits]
    trec = {s.trec for s in specs if s.trec}
    ref: dict[str, dict[str, float]] = {}
    if trec and queries:
        # a qrels entry without judgments (possible in the dict form) is unknown to
        # trec_eval: such a query is scored 0 below, as one without relevant docs
        ev = pytrec_eval.RelevanceEvaluator(
            {q: judged_all[q] for q in queries if judged_all[q]}, trec)
        ref = ev.evaluate({q: hits.get(q, {}) for q in queries if judged_all[q]})
    out: dict[str, dict[str, float]] = {}
    for q in queries:
        values = ref.get(q, {})
        row = {}
        for s in specs:
            if s.family == "Judged":
                v = _judged_at(hits.get(q, {}), judged_all[q], s.k)
            elif s.family == "RR_cut":
                rr = values.get("recip_rank", 0.0)
                v = rr if rr > 0 and round(1 / rr) <= s.k else 0.0
            else:
                v = values.get(s.trec, 0.0)
            row[s.name] = float(v)
        out[q] = row
    return out


def mean(per_query: Mapping[str, Mapping[str, float]], metric: str,
         queries: Iterable[str] | None = None) -> float:
    """Arithmetic mean of `metric` over the evaluated queries (nan when there are none).

    With `queries`, the mean is over those instead, a query the run did not answer counting
    0 (trec_eval's `-c`), so that a run cannot gain by leaving hard queries out.
    """
    if queries is None:
        values = [v[metric] for v in per_query.values()]
    else:
        values = [per_query[q][metric] if q in per_query else 0.0 for q in queries]
    return math.fsum(values) / len(values) if values else float("nan")


def oracle_ceiling(run: pa.Table, qrels: Qrels, depth: int = 100,
                   system: str = "oracle") -> pa.Table:
    """The "glass ceiling" of reranking `run`'s top `depth` (LLM-CLIR paper).

    Per query, among the `depth` best-ranked hits (rank column; ties by trec_eval's order)
    the relevant ones move to the top, by relevance descending then original rank; the
    non-relevant ones follow in their original order; hits below `depth` keep their places
    (so recall at cutoffs >= `depth` is the run's own, and PRI for it is 0). It is what a
    perfect reranker of the top `depth` would return. The top is taken by rank, as a
    reranker takes it; when the ranks are trec_eval's order the oracle is never below the
    run on any measure, but a run that breaks score ties otherwise (Lucene does, by its
    internal doc number) can differ where the ties cross `depth`. Scores are rewritten to
    n, n−1, … 1 so that an evaluation, which orders by score, sees the new ranks.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    t = as_hits(run)
    judged_all = qrels_dict(qrels)
    t = t.take(pc.sort_indices(t, sort_keys=[("query_id", "ascending"), ("rank", "ascending"),
                                             ("score", "descending"),
                                             ("doc_id", "descending")]))
    by_query: dict[str, list[str]] = {}
    for q, d in zip(t["query_id"].to_pylist(), t["doc_id"].to_pylist()):
        by_query.setdefault(q, []).append(d)
    cols: dict[str, list] = {c: [] for c in HITS_SCHEMA.names}
    for qid, docs in by_query.items():
        judged = judged_all.get(qid, {})
        head, tail = docs[:depth], docs[depth:]
        relevant = sorted((d for d in head if judged.get(d, 0) >= 1),
                          key=lambda d: -judged[d])  # stable: original rank among equals
        rest = [d for d in head if judged.get(d, 0) < 1]
        ordered = relevant + rest + tail
        n = len(ordered)
        cols["query_id"] += [qid] * n
        cols["doc_id"] += ordered
        cols["rank"] += list(range(1, n + 1))
        cols["score"] += [float(n - i) for i in range(n)]
    cols["system"] = [system] * len(cols["query_id"])
    return pa.table(cols, schema=HITS_SCHEMA)


def paired_ttest(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float | int]:
    """Two-sided paired t-test of a against b over their common queries.

    `t > 0` when a's values are higher. Fewer than two common queries: t and p are nan.
    When every difference is the same the t statistic is 0/0 or ±x/0: all differences 0
    (e.g. a system compared with itself) gives t = nan, p = 1.0 (no evidence of a
    difference); a constant non-zero difference gives t = ±inf, p = 0.0.
    """
    from scipy import stats

    common = sorted(set(a) & set(b))
    n = len(common)
    if n < 2:
        return {"t": float("nan"), "p": float("nan"), "n": n}
    x = np.array([a[q] for q in common], dtype=np.float64)
    y = np.array([b[q] for q in common], dtype=np.float64)
    d = x - y
    if np.all(d == d[0]):
        if d[0] == 0:
            return {"t": float("nan"), "p": 1.0, "n": n}
        return {"t": math.copysign(math.inf, d[0]), "p": 0.0, "n": n}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # near-constant differences
        res = stats.ttest_rel(x, y)
    return {"t": float(res.statistic), "p": float(res.pvalue), "n": n}


def pri(s_star: float, s1: float) -> float:
    """Potential for Reranking Improvement, LLM-CLIR paper Eq. 1: PRI = s* − s1.

    s1 is the first-stage run's score, s* its oracle ceiling's (`oracle_ceiling`).
    """
    return s_star - s1


def realized(s1: float, s2: float, s_star: float) -> float:
    """Realized % of the potential, LLM-CLIR paper Eq. 2: (s2 − s1) / PRI × 100.

    s2 is the reranked (or otherwise improved) run's score. When PRI is 0 the first stage
    is already at its ceiling for this measure (e.g. recall_100 when the oracle reorders
    only the top 100: reordering never changes which docs are in it), so there is nothing
    to realize and the ratio is undefined: nan, not 0 or ±inf, which would bias an average
    over settings.
    """
    p = pri(s_star, s1)
    if p == 0:
        return float("nan")
    return (s2 - s1) / p * 100.0


def metric_rows(per_query: Mapping[str, Mapping[str, float]], *, study: str, setting: str,
                lang: str, model: str, system: str, metrics: Iterable[str] | None = None
                ) -> list[dict]:
    """Metrics rows: for each metric, the mean (`query_id` None, `n` = queries) and then
    one row per query in query_id order (`n` = 1).

    `metrics` defaults to those of the first query; give it to get mean rows (nan, n = 0)
    for a run that answered no query.
    """
    if metrics is None:
        metrics = list(next(iter(per_query.values()), {}))
    base = {"study": study, "setting": setting, "lang": lang, "model": model,
            "system": system}
    rows = []
    for m in metrics:
        rows.append({**base, "metric": m, "query_id": None, "value": mean(per_query, m),
                     "n": len(per_query)})
        rows += [{**base, "metric": m, "query_id": q, "value": float(per_query[q][m]), "n": 1}
                 for q in sorted(per_query)]
    return rows


# ---------------------------------------------------------------------------------------
# LLM-CLIR tables (Tables 2-7): rows are systems, columns are language pairs plus AVG, `*`
# where the paired t-test against the first stage gives p < 0.05 (llm-clir.txt L143).

SIGNIFICANCE = 0.05


def pair_label(qlang: str, doc_lang: str) -> str:
    """The paper's column name of a language pair: queries en, documents ha -> "EN-HA"."""
    return f"{qlang}-{doc_lang}".upper()


def average(values: Iterable[float]) -> float:
    """The AVG column: the unweighted mean over language pairs of the per-pair means (each
    pair counts once, whatever its number of queries); nan if a pair is missing (nan)."""
    values = list(values)
    if not values or any(v is None or math.isnan(v) for v in values):
        return float("nan")
    return math.fsum(values) / len(values)


def significant(p: float | None) -> bool:
    return p is not None and not math.isnan(p) and p < SIGNIFICANCE


def pairs_table(rows: list[dict], pairs: list[str], *, digits: int = 3,
                title: str | None = None) -> str:
    """A markdown table in the paper's shape. Each row: {"label", "values": {pair: v},
    "sig": {pair: bool}} and optionally "avg" (else the mean of the pairs), "note" (a last
    column, e.g. the paper's number beside ours) and "section" (a row of its own, in italics,
    before the row, as the paper groups its rows)."""
    def fmt(v, star=False):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "n/a"
        return f"{v:.{digits}f}" + ("*" if star else "")

    has_note = any("note" in r for r in rows)
    head = ["", *pairs, "AVG"] + (["paper / Δ AVG"] if has_note else [])
    lines = ([f"### {title}", ""] if title else []) + [
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    section = None
    for r in rows:
        if r.get("section") and r["section"] != section:
            section = r["section"]
            lines.append(f"| *{section}* |" + " |" * (len(head) - 1))
        values = r.get("values", {})
        sig = r.get("sig", {})
        avg = r.get("avg", average(values.get(p, float("nan")) for p in pairs))
        cells = [r["label"], *(fmt(values.get(p), sig.get(p, False)) for p in pairs), fmt(avg)]
        if has_note:
            cells.append(r.get("note", ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@dataclass
class RunTable:
    """One topic set and measure of the evaluate stage, across its language pairs: the
    LLM-CLIR Tables 2-7 shape. `values` maps a system (and `<system>+oracle`) to its mean per
    pair label; `significant` a reranker to whether it differs from its first stage (paired
    t-test, p < 0.05) per pair; `first_stage` a reranker to the run it reranked."""

    topics: str
    metric: str
    pairs: list[str]
    values: dict[str, dict[str, float]]
    significant: dict[str, dict[str, bool]]
    first_stage: dict[str, str]

    def rows(self, order: list[str] = ()) -> list[dict]:
        """`pairs_table` rows: first stages, then each first stage's rerankers, then the
        rerankers' own oracles; systems named in `order` (a paper's row order) first, in
        that order, a first stage's oracle the order leaves out right after its run."""
        inputs = self.first_stage
        at = {name: i for i, name in enumerate(dict.fromkeys(order))}

        def reranked_oracle(system: str) -> bool:
            return system.endswith("+oracle") and system.removesuffix("+oracle") in inputs

        def place(system: str) -> float:
            base = system.removesuffix("+oracle")
            if system in at or reranked_oracle(system):
                return at.get(system, len(at) + 1)
            return at[base] + 0.5 if base in at else len(at)

        def section(system: str) -> str:
            if system in inputs:
                return f"Reranking (retriever: {inputs[system]})"
            return "Oracles of the reranked runs" if reranked_oracle(system) else \
                "First-stage retrieval"

        order = sorted(self.values.items(),
                       key=lambda kv: (place(kv[0]), kv[0] in inputs, inputs.get(kv[0], ""),
                                       kv[0]))
        return [{"label": system, "values": values, "sig": self.significant.get(system, {}),
                 "section": section(system)} for system, values in order]

    def markdown(self, order: list[str] = ()) -> str:
        return pairs_table(self.rows(order), self.pairs, title=f"{self.topics}: {self.metric}")
