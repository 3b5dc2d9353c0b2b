"""IR evaluation with trec_eval's conventions, and the LLM-CLIR paper's oracle and PRI.

`evaluate` computes, per query, the measures trec_eval (and pytrec_eval, its Python
binding, which the tests compare against) reports under the same names: `map`,
`map_cut_K`, `ndcg`, `ndcg_cut_K`, `recall_K`, `P_K` and `recip_rank`. Conventions, each
checked against pytrec_eval:

- the run's rank column is ignored. A query's hits are ordered by score, descending, with
  the score first rounded to a C `float` (trec_eval keeps `float sim`; scores that differ
  only beyond float32 precision are ties), and ties broken by doc_id in *descending* byte
  order (`comp_sim_docno` in trec_eval's form_res_rels.c);
- relevant means relevance >= 1 (trec_eval's default `relevance_level`); a judged doc with
  a relevance of 0 or below, and an unjudged doc, are non-relevant and have no gain;
- the queries evaluated are those in both the run and the qrels. A query that is in the
  qrels but has no relevant doc is evaluated, and every measure is 0 for it (trec_eval
  guards its divisions by the number of relevant docs and by the ideal DCG);
- a query the run names with no hits (possible in the dict form) is evaluated, all 0;
- there is no depth cut: every retrieved doc counts for `map` and `recip_rank`.

Definitions (R = number of relevant docs of the query, rel(i) the doc at rank i):
  P_K = |relevant in top K| / K (K even when fewer were retrieved);
  recall_K = |relevant in top K| / R;
  map = (1/R) Σ_{i: rel(i)} P_i; map_cut_K the same sum over i <= K;
  recip_rank = 1 / rank of the first relevant doc;
  ndcg_cut_K = DCG@K / IDCG@K with DCG@K = Σ_{i<=K} gain(i) / log2(i + 1) and gain the
  relevance grade (Järvelin & Kekäläinen 2002, trec_eval's log2 discount), IDCG from the
  query's judged grades sorted descending; `ndcg` is the same without a cut.

The LLM-CLIR paper's analysis tools: `oracle_ceiling` (the "glass ceiling" of a reranker
that can only reorder a run's top N), `pri` and `realized` (its Eq. 1 and 2), and
`paired_ttest`. `metric_rows` turns per-query values into metrics rows.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xling.tasks.runs import HITS_SCHEMA, as_hits

DEFAULT_METRICS = ("map", "ndcg_cut_10", "ndcg_cut_20", "recall_100", "recip_rank")
_METRIC = re.compile(r"(map|recip_rank|ndcg)|(ndcg_cut|recall|P|map_cut)_([1-9][0-9]*)")

Run = pa.Table | Mapping[str, Mapping[str, float]]
Qrels = pa.Table | Mapping[str, Mapping[str, int]] | Iterable[Mapping]


def parse_metric(name: str) -> tuple[str, int | None]:
    """`"ndcg_cut_10"` -> `("ndcg_cut", 10)`, `"map"` -> `("map", None)`."""
    m = _METRIC.fullmatch(name)
    if not m:
        raise ValueError(f"unknown metric {name!r}: use map, recip_rank, ndcg, ndcg_cut_K, "
                         "recall_K, P_K or map_cut_K (pytrec_eval's names)")
    return (m.group(1), None) if m.group(1) else (m.group(2), int(m.group(3)))


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


def _run_lists(run: Run) -> dict[str, tuple[list[str], list[float]]]:
    """`{qid: (doc_ids, scores)}`; a doc listed twice for one query raises ValueError."""
    if isinstance(run, Mapping):
        return {str(q): ([str(d) for d in docs], [float(s) for s in docs.values()])
                for q, docs in run.items()}
    out: dict[str, tuple[list[str], list[float]]] = {}
    seen: set[tuple[str, str]] = set()
    for q, d, s in zip(pc.cast(run["query_id"], pa.string()).to_pylist(),
                       pc.cast(run["doc_id"], pa.string()).to_pylist(),
                       pc.cast(run["score"], pa.float64()).to_pylist()):
        if (q, d) in seen:
            raise ValueError(f"the run lists doc {d!r} more than once for query {q!r}")
        seen.add((q, d))
        docs, scores = out.setdefault(q, ([], []))
        docs.append(d)
        scores.append(s)
    return out


def trec_eval_order(doc_ids: list[str], scores: list[float]) -> list[int]:
    """Indices of the hits in the order trec_eval evaluates them (see the module docstring)."""
    s32 = np.asarray(scores, dtype=np.float64).astype(np.float32)
    if np.isnan(s32).any():
        raise ValueError("hits with a NaN score cannot be ordered")
    idx = sorted(range(len(doc_ids)), key=doc_ids.__getitem__, reverse=True)
    idx.sort(key=lambda i: s32[i], reverse=True)  # stable: equal scores keep doc_id desc
    return idx


def _measures(rels: np.ndarray, judged: Mapping[str, int],
              specs: list[tuple[str, str, int | None]]) -> dict[str, float]:
    """The measures of one query; `rels` are the relevance grades in evaluation order."""
    n = len(rels)
    is_rel = rels >= 1
    n_rel = sum(1 for r in judged.values() if r >= 1)
    gains = np.where(is_rel, rels, 0).astype(np.float64)
    ideal = np.sort(np.array([r for r in judged.values() if r >= 1], dtype=np.float64))[::-1]
    hits_at = np.cumsum(is_rel)  # relevant docs in the top i+1
    ranks = np.arange(1, n + 1, dtype=np.float64)
    prec_at_rel = np.where(is_rel, hits_at / ranks, 0.0)
    out = {}
    for name, family, k in specs:
        cut = n if k is None else min(k, n)
        found = int(hits_at[cut - 1]) if cut else 0
        if family == "P":
            v = found / k
        elif family == "recall":
            v = found / n_rel if n_rel else 0.0
        elif family in ("map", "map_cut"):
            v = float(prec_at_rel[:cut].sum()) / n_rel if n_rel else 0.0
        elif family == "recip_rank":
            first = np.flatnonzero(is_rel)
            v = 1.0 / (first[0] + 1) if len(first) else 0.0
        else:  # ndcg, ndcg_cut
            icut = len(ideal) if k is None else min(k, len(ideal))
            idcg = float((ideal[:icut] / np.log2(np.arange(2, icut + 2))).sum())
            dcg = float((gains[:cut] / np.log2(np.arange(2, cut + 2))).sum())
            v = dcg / idcg if idcg > 0 else 0.0
        out[name] = float(v)
    return out


def evaluate(run: Run, qrels: Qrels, metrics: Iterable[str] = DEFAULT_METRICS
             ) -> dict[str, dict[str, float]]:
    """Per-query measures, `{qid: {metric: value}}`, as pytrec_eval's `evaluate` gives them.

    `run` is a hits table (only `query_id`, `doc_id`, `score` are read) or
    `{qid: {docid: score}}`; `qrels` a qrels table, rows or `{qid: {docid: relevance}}`.
    """
    specs = [(m, *parse_metric(m)) for m in metrics]
    judged_all = qrels_dict(qrels)
    out: dict[str, dict[str, float]] = {}
    for qid, (docs, scores) in _run_lists(run).items():
        judged = judged_all.get(qid)
        if judged is None:
            continue
        order = trec_eval_order(docs, scores)
        rels = np.array([judged.get(docs[i], 0) for i in order], dtype=np.int64)
        out[qid] = _measures(rels, judged, specs)
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


def parse_published(value) -> tuple[float, bool]:
    """A number as a paper's table prints it -> (value, marked): "0.419*" -> (0.419, True)."""
    if isinstance(value, (int, float)):
        return float(value), False
    text = str(value).strip()
    return float(text.rstrip("* ").strip()), text.endswith("*")


def pri_on_average(first: Iterable[float], oracle: Iterable[float],
                   reranked: Iterable[float]) -> dict[str, float]:
    """PRI and Realized % as the paper computes them (llm-clir.txt L249-257): on the AVG
    column, s1 = AVG of the first stage, s* = AVG of its oracle, s2 = AVG of the reranker,
    not as a mean of per-pair ratios. E.g. CLEF, NV-Embed-v2 and RankGPT-4.1 (DT):
    PRI = 0.586 - 0.323 = 0.263, Realized = (0.443 - 0.323) / 0.263 = 45.6 %."""
    s1, s_star, s2 = average(first), average(oracle), average(reranked)
    return {"s1": s1, "s_star": s_star, "s2": s2, "pri": pri(s_star, s1),
            "realized_pct": realized(s1, s2, s_star)}


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
