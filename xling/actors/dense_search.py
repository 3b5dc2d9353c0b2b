"""Exact top-k search over embedding shards, and the exact merge of per-shard top-k lists.

Functions and one index class on numpy arrays. The dense retriever searches all the shards
of an index at once (`FlatIndex` over their union, built once per actor: no merge needed)
and scores a hybrid query shard by shard, merging the per-shard lists (`merge_topk`);
searching N shards and merging gives what one search over all of them gives.

Ranking rule (everywhere here): score descending, then doc id ascending (Python string
order). It is a total order, and each shard returns exactly its first min(k, shard size)
documents under it, so the merged top-k (the first k of the union, same order) is exactly
the top-k of the whole collection: a document of the global top-k is among the first k of
its own shard. Ties at the k boundary need nothing more: a tied document with a smaller id
is ranked before the boundary in its shard too, and one with a larger id would lose globally
as well. Doc ids are not de-duplicated (a flat search over the union does not either).

Scores are float64 and computed per (query, document) pair, independent of the shard or the
batch the pair is in: FAISS (exact inner product over float32, on the documents minus
their mean; see `FlatIndex`) chooses the candidates, and only they are re-scored, each as
the float64 sum of its float32 products.
FAISS's float32 scores are rounded, and may round differently with the code path (SIMD or
BLAS) it picks for a shape, so near-ties (gaps of 1e-8 happen: the tiny test model's vectors
are nearly parallel) could come out in one order in a shard and another in the whole; the
re-score cannot. Candidates are fetched until the last one fetched is, even allowing for
FAISS's rounding, strictly below the k-th re-scored one, so none outside can belong in.

Hybrid (BGE-M3, as in BordIRLines with weights dense 1 / sparse 0.3 / ColBERT 1):
`w_dense * dense + w_sparse * lexical + w_colbert * colbert`, scored against every document
of a shard, where
- dense is the inner product of the normalised vectors;
- lexical is the sum over token ids in both texts of q_weight * d_weight
  (`BGEM3FlagModel.compute_lexical_matching_score`);
- colbert is the mean over the query's vectors of the best inner product with any of the
  document's vectors (`BGEM3FlagModel.colbert_score`; the query's vectors are every token
  after [CLS], </s> included).
FlagEmbedding's `compute_score(...)["colbert+sparse+dense"]` is this sum divided by the sum
of the weights (same ranking).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

_BLOCK = 4096  # rows per float64 re-score block: bounded memory on big shards
_CENTRED_BYTES = 256 << 20  # per block of centred documents that FAISS searches


def search_shard(queries: np.ndarray, doc_ids: Sequence[str], docs: np.ndarray, k: int,
                 *, extra: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner-product search of one shard (`FlatIndex(doc_ids, docs).search`).

    queries [nq, d] and docs [nd, d] (float32); doc_ids[j] names docs[j]. Returns scores
    [nq, k'] float64 and ids [nq, k'] (object array of str), k' = min(k, nd), each row in
    ranking-rule order. `extra` is how many candidates beyond k FAISS fetches at first.
    """
    return FlatIndex(doc_ids, docs).search(queries, k, extra=extra)


class FlatIndex:
    """Exact top-k inner-product search over one set of documents, prepared once.

    What a search needs of the documents is computed here, not per call: the float32
    matrix (the only copy of the vectors it keeps), the integer keys that sort like the ids,
    the mean vector c and the norms that bound FAISS's rounding. FAISS (exact inner product,
    `faiss.knn`, what `IndexFlatIP` runs) picks the candidates from the documents minus
    their mean, a block at a time: q.x = q.c + q.(x - c) ranks the same, and the float32
    rounding error scales with |x - c| instead of |x|. Embeddings share a large common
    direction (the tiny test model's cosines are ~0.99997, so |x - c| is ~0.003 |x|); with
    the raw vectors FAISS's error bound spanned a large part of the collection, all of which
    was then re-scored, while centred the first k + extra candidates settle nearly every
    query. Centring a block per call costs 1/nq of the search itself.
    """

    def __init__(self, doc_ids: Sequence[str], docs: np.ndarray):
        self.ids = np.asarray(list(doc_ids), dtype=object)
        x = np.ascontiguousarray(docs, dtype=np.float32)
        if x.size == 0:
            x = x.reshape(0, x.shape[1] if x.ndim == 2 else 0)
        if x.ndim != 2 or x.shape[0] != len(self.ids):
            raise ValueError(f"docs {x.shape} do not match {len(self.ids)} doc ids")
        norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
        if not np.isfinite(norms).all():
            raise ValueError("non-finite values in the query or document vectors")
        self.x, self.order = x, _id_order(self.ids)
        self.xmax = float(norms.max()) if len(norms) else 0.0
        self.center = x.mean(axis=0, dtype=np.float64).astype(np.float32) if len(x) else \
            np.zeros(x.shape[1], np.float32)
        self.cnorm = float(np.linalg.norm(self.center.astype(np.float64)))
        self.rmax = max((float(np.sqrt(np.einsum("ij,ij->i", r, r, dtype=np.float64)).max())
                         for r in self._centred()), default=0.0)

    def _centred(self):
        """The documents minus their mean, in float32 blocks of bounded size."""
        step = max(1, _CENTRED_BYTES // (4 * max(1, self.x.shape[1])))
        for start in range(0, len(self.x), step):
            yield self.x[start:start + step] - self.center

    def _candidates(self, q: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's m best documents per query by the centred float32 inner product:
        (scores [nq, m] float32, positions [nq, m]); every document left out scores at most
        its row's lowest."""
        import faiss

        found, cand, start = [], [], 0
        for r in self._centred():
            f, c = faiss.knn(q, r, min(m, len(r)), metric=faiss.METRIC_INNER_PRODUCT)
            found.append(f)
            cand.append(c + start)
            start += len(r)
        if len(found) == 1:
            return found[0], cand[0]
        # The m best of the blocks' m best are the m best of all (a block's own m-th caps
        # what it left out).
        found, cand = np.concatenate(found, axis=1), np.concatenate(cand, axis=1)
        top = np.argpartition(-found, m - 1, axis=1)[:, :m]
        return np.take_along_axis(found, top, axis=1), np.take_along_axis(cand, top, axis=1)

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, queries: np.ndarray, k: int,
               *, extra: int = 16) -> tuple[np.ndarray, np.ndarray]:
        """(scores [nq, k'] float64, ids [nq, k'] object), k' = min(k, len(self)), each row
        the first k' documents under the ranking rule (see the module doc)."""
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        nq, nd = q.shape[0], len(self.ids)
        kk = max(0, min(int(k), nd))
        if kk == 0 or nq == 0:
            return np.zeros((nq, kk)), np.empty((nq, kk), dtype=object)
        d = self.x.shape[1]
        if q.shape[1] != d:
            raise ValueError(f"query dim {q.shape[1]} != document dim {d}")
        q64 = q.astype(np.float64)
        qnorms = np.linalg.norm(q64, axis=1)
        if not np.isfinite(qnorms).all():
            raise ValueError("non-finite values in the query or document vectors")
        qc = q64 @ self.center.astype(np.float64)
        # A bound on |FAISS's score + q.c - our float64 score|, doubled for safety: FAISS's
        # float32 inner product with the centred vector (d roundings of at most
        # |q||x - c| 2^-24 each, one more for x - c itself), and the float64 ones of q.x
        # and q.c. It decides when enough candidates are in.
        tol = 2.0 * qnorms * ((d + 2) * 2.0 ** -24 * self.rmax
                              + 2 * d * 2.0 ** -53 * (self.xmax + self.cnorm))
        scores = np.zeros((nq, kk))
        pos = np.zeros((nq, kk), dtype=np.int64)
        todo, m = np.arange(nq), min(nd, kk + max(0, extra))
        while todo.size:
            found, cand = self._candidates(q[todo], m)
            exact = _row_dots(self.x, cand, q[todo])
            # ranking rule, row by row: score descending, then doc id ascending (stable)
            top = np.lexsort((self.order[cand], -exact), axis=-1)[:, :kk]
            best = np.take_along_axis(exact, top, axis=1)
            # a document not fetched might still tie or beat the k-th: fetch more for those
            again = (found.min(axis=1) + qc[todo] + tol[todo] >= best[:, -1]) if m < nd else \
                np.zeros(len(todo), dtype=bool)
            done = ~again
            rows = todo[done]
            scores[rows] = best[done]
            pos[rows] = np.take_along_axis(cand, top, axis=1)[done]
            todo, m = todo[again], min(nd, 2 * m)
        return scores, self.ids[pos]


def merge_topk(parts: Sequence[tuple[np.ndarray, np.ndarray]],
               k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-shard (scores [nq, ki], ids [nq, ki]) -> the global top-k (scores, ids) [nq, k'].

    k' = min(k, sum of ki). Exact when every part holds its shard's first min(k, shard size)
    documents under the ranking rule (what `search_shard` and `hybrid_topk` return).
    """
    if not parts:
        raise ValueError("merge_topk: no parts to merge")
    scores = np.concatenate([np.atleast_2d(np.asarray(s, dtype=np.float64)) for s, _ in parts],
                            axis=1)
    ids = np.concatenate([np.atleast_2d(np.asarray(i, dtype=object)) for _, i in parts], axis=1)
    if scores.shape != ids.shape:
        raise ValueError(f"merge_topk: scores {scores.shape} and ids {ids.shape} differ")
    kk = max(0, min(int(k), scores.shape[1]))
    if scores.size == 0:
        return np.zeros((scores.shape[0], kk)), np.empty((scores.shape[0], kk), dtype=object)
    # One integer key per distinct id, in string order, for all rows at once.
    _, order = np.unique(ids.ravel(), return_inverse=True)
    top = np.lexsort((order.reshape(ids.shape), -scores), axis=-1)[:, :kk]
    return np.take_along_axis(scores, top, axis=1), np.take_along_axis(ids, top, axis=1)


def rank_topk(scores: np.ndarray, ids: Sequence[str], k: int) -> np.ndarray:
    """Positions of the first k of `scores` under the ranking rule, best first."""
    n = len(scores)
    k = max(0, min(int(k), n))
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if k < n:
        kth = np.partition(scores, n - k)[n - k]
        keep = np.flatnonzero(scores >= kth)  # every score tied with the k-th, so ids decide
    else:
        keep = np.arange(n)
    order = sorted(keep.tolist(), key=lambda j: (-scores[j], ids[j]))
    return np.array(order[:k], dtype=np.int64)


# ---- hybrid (dense + lexical + ColBERT) ----------------------------------------------------

def hybrid_scores(q: Mapping, docs: Mapping, weights) -> np.ndarray:
    """Hybrid score of one query against every document of a shard: float64 [nd].

    q: {"dense": [d] or [1, d], "sparse": {token id: weight}, "colbert": [Lq, d]};
    docs: {"ids": [nd], "dense": [nd, d], "sparse": [nd dicts], "colbert": [nd arrays
    [Ld, d]]}; weights: {"dense", "sparse", "colbert"} or a (dense, sparse, colbert)
    triple. A part whose weight is 0 is skipped and need not be present. Token ids may be
    ints (our `sparse_ids`) or strings (FlagEmbedding's `lexical_weights`).
    """
    w_dense, w_sparse, w_colbert = _weights(weights)
    nd = len(docs["ids"]) if "ids" in docs else len(docs["dense"])
    total = np.zeros(nd)
    if w_dense:
        qd = np.asarray(_need(q, "dense", "query"), dtype=np.float32).reshape(-1)
        total += w_dense * _dots(np.asarray(_need(docs, "dense", "shard"), np.float32), qd)
    if w_sparse:
        qs = _int_keys(_need(q, "sparse", "query"))
        total += w_sparse * np.array([lexical_score(qs, d) for d in _need(docs, "sparse", "shard")],
                                     dtype=np.float64)
    if w_colbert:
        qc = np.asarray(_need(q, "colbert", "query"), dtype=np.float64)
        total += w_colbert * np.array([colbert_score(qc, d)
                                       for d in _need(docs, "colbert", "shard")], dtype=np.float64)
    return total


def hybrid_topk(q: Mapping, docs: Mapping, weights, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact hybrid top-k of one query in one shard: (scores [1, k'], ids [1, k'])."""
    scores = hybrid_scores(q, docs, weights)
    ids = np.asarray(list(docs["ids"]), dtype=object)
    top = rank_topk(scores, ids, k)
    return scores[top][None, :], ids[top][None, :]


def lexical_score(q_weights: Mapping, d_weights: Mapping) -> float:
    """Sum over token ids present in both of q_weight * d_weight (BGE-M3's lexical match)."""
    if d_weights is None:
        raise ValueError("a document has no lexical weights (an error row in the shard?)")
    q_weights, d_weights = _int_keys(q_weights), _int_keys(d_weights)
    s = 0.0
    for token, w in q_weights.items():
        dw = d_weights.get(token)
        if dw is not None:
            s += float(w) * float(dw)
    return s


def colbert_score(q_vecs: np.ndarray, d_vecs: np.ndarray) -> float:
    """Mean over query vectors of the best inner product with a document vector (BGE-M3)."""
    if d_vecs is None:
        raise ValueError("a document has no ColBERT vectors (an error row in the shard?)")
    q = np.asarray(q_vecs, dtype=np.float64)
    d = np.asarray(d_vecs, dtype=np.float64)
    if q.shape[0] == 0 or d.shape[0] == 0:
        return 0.0
    return float((q @ d.reshape(-1, q.shape[1]).T).max(axis=1).sum() / q.shape[0])


def _dots(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row-wise x @ q as a float64 sum of (exact) float32 products, the same for a row
    whatever rows surround it: numpy reduces each contiguous row on its own."""
    q64 = np.asarray(q, dtype=np.float64).reshape(-1)
    out = np.empty(x.shape[0])
    for start in range(0, x.shape[0], _BLOCK):
        block = np.asarray(x[start:start + _BLOCK], dtype=np.float64)
        out[start:start + len(block)] = (block * q64).sum(axis=1)
    return out


def _id_order(ids: np.ndarray) -> np.ndarray:
    """Integer keys that sort like the doc id strings (Python order; equal ids by position)."""
    return np.argsort(np.argsort(ids, kind="stable"), kind="stable")


def _row_dots(x: np.ndarray, cand: np.ndarray, q: np.ndarray) -> np.ndarray:
    """exact[r, j] = x[cand[r, j]] . q[r], each a float64 sum of exact float32 products
    reduced over its own contiguous row (so equal to `_dots` of that row, whatever else is
    in the call)."""
    q64 = np.asarray(q, dtype=np.float64)
    out = np.empty(cand.shape)
    step = max(1, _BLOCK // max(1, cand.shape[1]))
    for start in range(0, cand.shape[0], step):
        block = x[cand[start:start + step]].astype(np.float64)  # [rows, m, d]
        out[start:start + step] = (block * q64[start:start + step, None, :]).sum(axis=2)
    return out


def _weights(weights) -> tuple[float, float, float]:
    if isinstance(weights, Mapping):
        unknown = set(weights) - {"dense", "sparse", "colbert"}
        if unknown:
            raise ValueError(f"unknown hybrid weights {sorted(unknown)}: "
                             "use dense, sparse, colbert")
        return tuple(float(weights.get(k, 0.0)) for k in ("dense", "sparse", "colbert"))
    w = tuple(float(v) for v in weights)
    if len(w) != 3:
        raise ValueError("hybrid weights: (dense, sparse, colbert)")
    return w


def _need(obj: Mapping, key: str, what: str):
    value = obj.get(key)
    if value is None:
        raise ValueError(f"the {what} has no {key!r} representation but its weight is not 0")
    return value


def _int_keys(weights: Mapping) -> Mapping:
    if weights and isinstance(next(iter(weights)), str):
        return {int(t): w for t, w in weights.items()}
    return weights
