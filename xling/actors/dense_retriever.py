"""Dense (BGE-M3) first-stage retrieval for Ray Data: embed queries, search shards exactly.

The actor holds one query embedder (`actors.embedder.make_embedder`: BGE-M3) and, per index
location, the embedding shards loaded once (a few locations cached per actor). Each query
row names its partitions (index locations); for each, the batch's dense-only queries are
searched together in one exact search over all the location's shards at once (one
`dense_search.FlatIndex`, built when the location is loaded: the exact top-k of the union
is what merging the shards' exact top-k lists gives, without the merge); a hybrid query
(weighted dense + sparse + ColBERT of BGE-M3, scored against every document) is scored shard
by shard and the per-shard top-k lists merged exactly (`actors.dense_search`). Partitions
are then merged per query (`actors.hits`).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyarrow as pa

from xling.actors.embedder import Embedder, MultiVector, make_embedder, vector_matrix
from xling.actors.enginecpu import engine_cpu


class DenseRetriever:
    """Ray Data actor. Input rows: `query_id`, `text`, `partitions`, `partition_langs`,
    optional weights `w_dense`, `w_sparse`, `w_colbert`. Output: one row per hit (`doc_id`,
    `rank`, `score`, `doc_lang`) with the input's other columns; failures are error rows.

    `load(location)` returns the shards of an index location as a list of pyarrow tables
    with `doc_id`, `dense` and, when built, `sparse_ids`, `sparse_weights`, `colbert`,
    `colbert_len` (rows with an `error` are left out by the loader).
    """

    def __init__(self, embedder: dict, load, k: int = 100, merge: str = "score",
                 max_open: int = 4, threads: int | None = None):
        if threads:  # Ray gives an actor OMP_NUM_THREADS = its num_cpus; this overrides it
            import faiss
            import torch

            faiss.omp_set_num_threads(threads)
            torch.set_num_threads(threads)

        self.k, self.merge, self.load, self.max_open = k, merge, load, max_open
        self.embedder_kwargs = dict(embedder)
        self.embedders: dict[tuple, Embedder] = {}
        self.indexes: OrderedDict = OrderedDict()
        self._embedder(sparse=False, colbert=False)  # load the model now, not on first batch

    def _embedder(self, sparse: bool, colbert: bool) -> Embedder:
        """The query embedder with the outputs a batch's weights need: the loaded model with
        its outputs switched where it can (MultiVector), else a model of its own."""
        key = (sparse, colbert)
        if key not in self.embedders:
            base = next(iter(self.embedders.values()), None)
            if isinstance(base, MultiVector):
                self.embedders[key] = base.with_outputs(sparse=sparse, colbert=colbert)
            else:
                outputs = {k: True for k, on in (("sparse", sparse), ("colbert", colbert)) if on}
                self.embedders[key] = make_embedder(**{**self.embedder_kwargs, **outputs,
                                                       "text_column": "text"})
        return self.embedders[key]

    def index(self, location: str) -> dict:
        """The location's shards (`shards`, for the hybrid score) and one FlatIndex over all
        of them (`flat`), loaded and built once (the max_open last used are kept)."""
        if location not in self.indexes:
            from xling.actors.dense_search import FlatIndex

            if len(self.indexes) >= self.max_open:
                self.indexes.popitem(last=False)
            shards = [_arrays(t) for t in self.load(location) if t.num_rows]
            # One matrix for the location; the shards' matrices become views of it.
            dense = np.concatenate([sh["dense"] for sh in shards]) if shards else None
            start = 0
            for sh in shards:
                sh["dense"], start = dense[start:start + len(sh["ids"])], start + len(sh["ids"])
            flat = FlatIndex([d for sh in shards for d in sh["ids"]], dense) if shards else None
            self.indexes[location] = {"shards": shards, "flat": flat}
        self.indexes.move_to_end(location)
        return self.indexes[location]

    def __call__(self, batch: pa.Table) -> pa.Table:
        from xling.actors.dense_search import hybrid_topk, merge_topk
        from xling.actors.hits import merge_ranked, ranked_rows

        n = batch.num_rows
        cols = batch.to_pydict()
        weights = [{k: float((cols.get(f"w_{k}") or [1.0 if k == "dense" else 0.0] * n)[i])
                    for k in ("dense", "sparse", "colbert")} for i in range(n)]
        need_sparse = any(w["sparse"] for w in weights)
        need_colbert = any(w["colbert"] for w in weights)
        emb = self._embedder(need_sparse, need_colbert)(
            batch.select(["text"]).append_column("error", batch["error"]))
        q = _arrays(emb.append_column("doc_id", pa.array([str(i) for i in range(n)])),
                    keep_nulls=True)
        errors = emb["error"].to_pylist()
        # found[i][j]: query i's hits in its j-th partition as (doc ids, scores, partition
        # language) (kept in the query's own order, which `merge: interleave` follows)
        found: list[dict] = [{} for _ in range(n)]
        # (location, partition language) -> the (query, position) pairs that search it
        todo: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for i in range(n):
            if errors[i] is None and not cols["partitions"][i]:
                errors[i] = "no partition to search (no index for the query's languages)"
            if errors[i] is not None:
                continue
            for j, key in enumerate(zip(cols["partitions"][i], cols["partition_langs"][i])):
                todo.setdefault(key, []).append((i, j))
        for (location, plang), rows in todo.items():
            try:
                index = self.index(location)
            except Exception as e:  # an unreadable index: its queries are error rows
                for i, _ in rows:
                    errors[i] = f"cannot load dense index {location}: {type(e).__name__}: {e}"
                continue
            # Dense-only queries are searched together, in one search over all the shards;
            # each (query, document) score is the same whatever else is in the call.
            dense, hybrid = [], []
            for i, j in rows:
                (hybrid if weights[i]["sparse"] or weights[i]["colbert"] else dense).append((i, j))
            groups = ([(dense, False)] if dense else []) + [([r], True) for r in hybrid]
            for group, is_hybrid in groups:
                qs = [i for i, _ in group]
                if not index["shards"]:
                    for i, j in group:
                        found[i][j] = (np.array([], object), np.array([]), plang)
                    continue
                with engine_cpu():
                    if is_hybrid:
                        scores, ids = merge_topk([hybrid_topk(_one(q, qs[0]), sh,
                                                              weights[qs[0]], self.k)
                                                  for sh in index["shards"]], self.k)
                    else:
                        scores, ids = index["flat"].search(q["dense"][qs], self.k)
                for r, (i, j) in enumerate(group):
                    found[i][j] = (ids[r], np.asarray(scores[r], np.float64), plang)
        drop = {"text", "error", "partitions", "analyzers", "partition_langs",
                "w_dense", "w_sparse", "w_colbert"}
        merged = [None if errors[i] else
                  merge_ranked([found[i][j] for j in sorted(found[i])], self.k, self.merge)
                  for i in range(n)]
        return ranked_rows(batch, drop, merged, errors)


def _arrays(t: pa.Table, keep_nulls: bool = False) -> dict:
    """Embedding table -> numpy arrays (dense matrix; sparse dicts; ColBERT matrices)."""
    if not keep_nulls and "error" in t.column_names:
        t = t.filter(pa.compute.is_null(t["error"]))
    out = {"ids": t["doc_id"].to_pylist(), "dense": vector_matrix(t["dense"])}
    if "sparse_ids" in t.column_names:
        out["sparse"] = [dict(zip(a or [], w or [])) for a, w in
                         zip(t["sparse_ids"].to_pylist(), t["sparse_weights"].to_pylist())]
    if "colbert" in t.column_names:
        out["colbert"] = [None if v is None else np.asarray(v, np.float32).reshape(l, -1)
                          for v, l in zip(t["colbert"].to_pylist(), t["colbert_len"].to_pylist())]
    return out


def _one(q: dict, i: int) -> dict:
    return {k: (v[i:i + 1] if k == "dense" else v[i]) for k, v in q.items() if k != "ids"}
