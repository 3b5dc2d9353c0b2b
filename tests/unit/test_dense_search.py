"""Exact dense search (xling/actors/dense_search.py FlatIndex) and the retriever's vector matrix.

The reference is what the search promises (and what the shard-by-shard search before
FlatIndex returned): every document re-scored as the float64 sum of its float32 products,
each row reduced by numpy on its own, then ranked by score descending and doc id ascending.
Vectors as embeddings are: a large shared direction plus a small part of their own (the tiny
BGE-M3's cosines are ~0.99997), so scores sit within FAISS's float32 rounding of each other;
plus copies of documents under other ids, so that exact ties straddle the k boundary.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from xling.actors.embedder import vector_matrix
from xling.actors.dense_search import FlatIndex, merge_topk, search_shard


def _embeddings(rng, n: int, d: int = 32, spread: float = 3e-3) -> np.ndarray:
    common = rng.normal(size=d)
    x = common / np.linalg.norm(common) + spread * rng.normal(size=(n, d)) / np.sqrt(d)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _collection(seed: int, n: int = 600, d: int = 32):
    rng = np.random.default_rng(seed)
    x = _embeddings(rng, n, d)
    ids = [f"doc-{j:05d}" for j in rng.permutation(n)]
    # copies of 20 documents under ids that sort before and after the original
    for j in rng.choice(n, size=20, replace=False):
        for cid in ("!" + ids[j], ids[j] + "~"):
            ids.append(cid)
            x = np.vstack([x, x[j:j + 1]])
    q = _embeddings(np.random.default_rng(seed + 100), 40, d)
    return ids, x, q


def _reference(ids, x, q, k):
    """Every document re-scored (per-row float64 reduction), ranked by the rule."""
    exact = (x.astype(np.float64)[None, :, :] * q.astype(np.float64)[:, None, :]).sum(axis=2)
    out_ids, out_scores = [], []
    for r in range(len(q)):
        order = sorted(range(len(ids)), key=lambda j: (-exact[r, j], ids[j]))[:k]
        out_ids.append([ids[j] for j in order])
        out_scores.append([exact[r, j] for j in order])
    return out_scores, out_ids


def _cuts(n: int, shards: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    inner = np.sort(rng.choice(np.arange(1, n), size=shards - 1, replace=False))
    bounds = [0, *inner.tolist(), n]
    return list(zip(bounds, bounds[1:]))


@pytest.mark.parametrize("seed", [0, 1])
def test_flat_index_is_the_exact_ranking(seed):
    ids, x, q = _collection(seed)
    index = FlatIndex(ids, x)
    for k in (1, 7, 100, len(ids) + 3):
        scores, found = index.search(q, k)
        ref_scores, ref_ids = _reference(ids, x, q, min(k, len(ids)))
        assert found.tolist() == ref_ids
        assert scores.tolist() == ref_scores  # bit for bit: the same re-score
        # A copy ties its original exactly; both land where the ids put them.
        for shards in (1, 3, 7):  # the shard-by-shard search and its merge agree
            parts = [search_shard(q, ids[a:b], x[a:b], k) for a, b in _cuts(len(ids), shards, seed)]
            m_scores, m_ids = merge_topk(parts, k)
            assert m_ids.tolist() == ref_ids and np.array_equal(m_scores, scores)


def test_exact_ties_straddle_the_boundary():
    ids, x, q = _collection(3)
    exact = (x.astype(np.float64) * q[0].astype(np.float64)).sum(axis=1)
    _, ref_ids = _reference(ids, x, q[:1], len(ids))
    ranked = ref_ids[0]
    # the first rank whose score equals the next one's: cut k through that tie
    k = next(i + 1 for i in range(len(ranked) - 1)
             if exact[ids.index(ranked[i])] == exact[ids.index(ranked[i + 1])])
    _, found = FlatIndex(ids, x).search(q[:1], k)
    assert found[0].tolist() == ranked[:k]


def test_flat_index_agrees_with_faiss():
    import faiss

    rng = np.random.default_rng(5)
    x = rng.normal(size=(2000, 48)).astype(np.float32)  # well spread: no float32 near-ties
    q = rng.normal(size=(30, 48)).astype(np.float32)
    ids = [f"d{j}" for j in range(len(x))]
    flat = faiss.IndexFlatIP(x.shape[1])
    flat.add(x)
    f_scores, f_pos = flat.search(q, 50)
    scores, found = FlatIndex(ids, x).search(q, 50)
    assert found.tolist() == [[ids[j] for j in row] for row in f_pos]
    np.testing.assert_allclose(scores, f_scores, rtol=1e-5)


def test_near_parallel_vectors_need_few_candidates():
    # Centred, FAISS's rounding bound is small next to the score gaps, so the first
    # k + extra candidates settle (nearly) every query: one FAISS call, at most a second
    # for a few, however many documents tie within the uncentred bound.
    ids, x, q = _collection(7, n=5000)
    index = FlatIndex(ids, x)
    calls, candidates = [], index._candidates

    def counting(queries, m):
        calls.append((len(queries), m))
        return candidates(queries, m)

    index._candidates = counting
    _, found = index.search(q, 100)
    assert len(calls) <= 2 and calls[0] == (len(q), 116)
    assert sum(n for n, _ in calls[1:]) <= len(q) // 10
    assert found.tolist() == _reference(ids, x, q, 100)[1]


def test_edge_cases_and_errors():
    s, i = FlatIndex([], np.zeros((0, 3), np.float32)).search(np.ones((2, 3), np.float32), 5)
    assert s.shape == i.shape == (2, 0)
    index = FlatIndex(["b", "a"], np.eye(2, dtype=np.float32))
    assert index.search(np.ones((1, 2), np.float32), 2)[1].tolist() == [["a", "b"]]
    with pytest.raises(ValueError, match="query dim 3 != document dim 2"):
        index.search(np.ones((1, 3), np.float32), 1)
    with pytest.raises(ValueError, match="non-finite"):
        index.search(np.full((1, 2), np.inf, np.float32), 1)
    with pytest.raises(ValueError, match="non-finite"):
        FlatIndex(["a"], np.full((1, 2), np.nan, np.float32))
    with pytest.raises(ValueError, match="do not match 3 doc ids"):
        FlatIndex(["a", "b", "c"], np.eye(2, dtype=np.float32))


def test_matrix_from_arrow_columns():
    fixed = pa.chunked_array([pa.array([[1, 2], None], pa.list_(pa.float32(), 2)),
                              pa.array([[3, 4]], pa.list_(pa.float32(), 2))])
    assert vector_matrix(fixed).tolist() == [[1, 2], [0, 0], [3, 4]]
    varlen = pa.array([None, [1.5, 2.5], [3.5, 4.5]], pa.list_(pa.float32())).slice(1)
    m = vector_matrix(varlen)
    assert m.dtype == np.float32 and m.tolist() == [[1.5, 2.5], [3.5, 4.5]]
    assert vector_matrix(pa.array([None, None], pa.list_(pa.float32()))).shape == (2, 0)
    with pytest.raises(ValueError, match="different lengths"):
        vector_matrix(pa.array([[1.0, 2.0], [3.0]], pa.list_(pa.float32())))


def test_blocks_of_centred_documents(monkeypatch):
    import xling.actors.dense_search as dense_search

    ids, x, q = _collection(11)
    # blocks of 97 documents: FAISS's per-block lists (shorter than k + extra for large k)
    # merged into one
    monkeypatch.setattr(dense_search, "_CENTRED_BYTES", 4 * x.shape[1] * 97)
    index = FlatIndex(ids, x)
    for k in (5, 100, 150):
        scores, found = index.search(q, k)
        ref_scores, ref_ids = _reference(ids, x, q, k)
        assert found.tolist() == ref_ids and scores.tolist() == ref_scores
