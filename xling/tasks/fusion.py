"""Fusion of runs: Reciprocal Rank Fusion and weighted score interpolation.

Both take hits tables (`xling.tasks.runs`) and return one, and follow pyserini's fusion
(`pyserini.fusion`, `pyserini.trectools.TrecRun.merge`, pyserini 1.6) so that a fused run
made here is the one pyserini makes from the same TREC run files, down to the last bit of
its scores and the order of equal ones:

- each input run contributes its top `depth` hits per query. pyserini takes the first
  `depth` lines of the query in file order; here the `depth` best-ranked by the rank
  column (stable), the same hits for files in rank order, as every TREC writer makes them;
- RRF uses the run's rank column as it is (pyserini does not re-sort by score unless
  asked to with `--resort`);
- a doc's contributions are summed in input-run order with Kahan compensation, which is
  what pandas' groupby-sum does underneath pyserini (`_kahan_sum`); for three or more
  runs plain summation can differ in the last bit and flip two docs whose sums are equal
  in exact arithmetic;
- the fused list is ordered by score descending, ties by doc_id *ascending* (pyserini's
  `sort_values(['topic', 'score', 'docid'], ascending=[True, False, True])`; trec_eval
  itself would break such ties the other way), then cut to `top` per query and ranked
  from 1.

A doc that a run does not return (or returns below `depth`) contributes nothing from it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xling.tasks.runs import HITS_SCHEMA, as_hits

NORMALIZE = ("minmax", "none")


def rrf(runs: Sequence[pa.Table], k: int = 60, depth: int = 1000, top: int = 1000,
        system: str = "rrf") -> pa.Table:
    """Reciprocal Rank Fusion of hits tables.

    Cormack, Clarke & Büttcher (SIGIR 2009), "Reciprocal Rank Fusion outperforms Condorcet
    and individual rank learning methods": score(d) = Σ_r 1 / (k + rank_r(d)), k = 60.
    """
    contributions = []
    for run in runs:
        head = _heads(run, depth)
        rank = head["rank"].to_numpy(zero_copy_only=False).astype(np.float64)
        contributions.append((head, 1.0 / (k + rank)))
    return _merge(contributions, top, system)


def interpolate(runs: Sequence[pa.Table], weights: Sequence[float],
                normalize: str = "minmax", depth: int = 1000, top: int = 1000,
                system: str = "interpolate") -> pa.Table:
    """Weighted sum of the runs' scores: score(d) = Σ_r w_r · s_r(d).

    `normalize="minmax"` first maps each run's scores per query to [0, 1],
    (s − min) / (max − min), over the `depth` hits that take part in the fusion (so the
    result does not depend on how far below `depth` a run was retrieved); a query whose
    hits all have one score gets 1.0 for each, as pyserini's `normalize` does. With
    `weights = [α, 1 − α]` and `normalize="none"` this is pyserini's `interpolation`;
    with weights 1/n, its `average`.
    """
    if len(weights) != len(runs):
        raise ValueError(f"{len(weights)} weights for {len(runs)} runs")
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be one of {NORMALIZE}, got {normalize!r}")
    contributions = []
    for run, w in zip(runs, weights):
        head = _heads(run, depth)
        score = head["score"].to_numpy(zero_copy_only=False)
        if normalize == "minmax":
            score = _minmax(head["query_id"], score)
        # pyserini scales each run first, then sums: w * s rounded once, then added.
        contributions.append((head, score * float(w)))
    return _merge(contributions, top, system)


def _heads(run: pa.Table, depth: int) -> pa.Table:
    """Each query's `depth` best-ranked hits (stable on ties in rank), grouped by query."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    t = as_hits(run)
    if t.num_rows == 0:
        return t
    if pc.any(pc.is_nan(t["score"])).as_py():
        raise ValueError("hits with a NaN score cannot be fused")
    t = t.take(pc.sort_indices(t, sort_keys=[("query_id", "ascending"),
                                             ("rank", "ascending")]))  # stable
    q = t["query_id"].to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
    pos = np.arange(len(q)) - np.repeat(starts, np.diff(np.r_[starts, len(q)]))
    return t.filter(pa.array(pos < depth))


def _minmax(query_ids: pa.ChunkedArray, score: np.ndarray) -> np.ndarray:
    q = query_ids.to_numpy(zero_copy_only=False)
    out = np.empty_like(score)
    if len(q) == 0:
        return out
    # `_heads` leaves each query's rows adjacent.
    starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
    for a, b in zip(starts, np.r_[starts[1:], len(q)]):
        s = score[a:b]
        low, high = s.min(), s.max()
        out[a:b] = 1.0 if high - low == 0 else (s - low) / (high - low)
    return out


def _kahan_sum(acc: dict, key, value: float) -> None:
    # Kahan-compensated running sum, step for step as pandas' cython group_sum does it
    # (y = v - c; t = s + y; c = t - s - y; s = t; a NaN compensation, from an infinite
    # value, is reset to 0 there, pandas GH#53606).
    s, c = acc.get(key, (0.0, 0.0))
    y = value - c
    t = s + y
    c = t - s - y
    acc[key] = (t, 0.0 if c != c else c)


def _merge(contributions: list[tuple[pa.Table, np.ndarray]], top: int, system: str
           ) -> pa.Table:
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    acc: dict[tuple[str, str], tuple[float, float]] = {}
    for head, values in contributions:
        for key, v in zip(zip(head["query_id"].to_pylist(), head["doc_id"].to_pylist()),
                          values.tolist()):
            _kahan_sum(acc, key, v)
    by_query: dict[str, list[tuple[str, float]]] = {}
    for (qid, doc), (s, _) in acc.items():
        by_query.setdefault(qid, []).append((doc, s))
    cols: dict[str, list] = {c: [] for c in HITS_SCHEMA.names}
    for qid in sorted(by_query):
        hits = sorted(by_query[qid], key=lambda x: x[0])  # doc_id ascending ...
        hits.sort(key=lambda x: x[1], reverse=True)  # ... within equal scores (stable)
        for rank, (doc, s) in enumerate(hits[:top], 1):
            cols["query_id"].append(qid)
            cols["doc_id"].append(doc)
            cols["rank"].append(rank)
            cols["score"].append(s)
    cols["system"] = [system] * len(cols["query_id"])
    return pa.table(cols, schema=HITS_SCHEMA)
