"""actors/hits.py: merging a query's partitions, and hit rows built from arrays."""

import numpy as np
import pyarrow as pa

from xling.actors.hits import merge_partitions, merge_ranked, ranked_rows


def _batch(n):
    return pa.table({"_rid": [f"q{i}" for i in range(n)], "query_id": [f"q{i}" for i in range(n)],
                     "text": ["t"] * n, "error": pa.nulls(n, pa.string())})


def _expected(batch, hits, errors):
    """The rows hits_rows promises, one by one."""
    rows = []
    for q, h, e in zip(batch.to_pylist(), hits, errors):
        base = {"_rid": q["_rid"], "query_id": q["query_id"]}
        if e is None and h:
            rows += [{**base, "doc_id": d, "rank": r, "score": s, "doc_lang": l, "error": None}
                     for r, (d, s, l) in enumerate(h, 1)]
        else:
            rows.append({**base, "doc_id": None, "rank": None, "score": None, "doc_lang": None,
                         "error": e})
    return rows


def _arrays(h):
    return (np.array([x[0] for x in h], object), np.array([x[1] for x in h], np.float64),
            np.array([x[2] for x in h], object))


def test_hit_rows_cover_hits_no_hits_and_errors():
    batch = _batch(4)
    hits = [[("d1", 2.5, "ru"), ("d2", 1.0, "en")], [], [("d3", 0.5, "ru")], [("d9", 9.0, "fa")]]
    errors = [None, None, None, "search failed"]
    out = ranked_rows(batch, {"text", "error"}, [_arrays(h) for h in hits], errors)
    assert out.to_pylist() == _expected(batch, hits, errors)
    assert out.schema.field("rank").type == pa.int32()


def test_hit_rows_of_many_queries_row_by_row():
    rng = np.random.default_rng(0)
    batch = _batch(50)
    hits, errors = [], []
    for i in range(50):
        k = int(rng.integers(0, 6))
        hits.append([(f"d{i}-{j}", float(s), "zh")
                     for j, s in enumerate(np.sort(rng.random(k))[::-1])])
        errors.append("bad query" if i % 7 == 3 else None)
    out = ranked_rows(batch, {"text", "error"}, [_arrays(h) for h in hits], errors)
    assert out.to_pylist() == _expected(batch, hits, errors)


def test_an_empty_batch_gives_an_empty_table_with_the_hit_columns():
    out = ranked_rows(_batch(0), {"text", "error"}, [], [])
    assert out.num_rows == 0
    assert out.column_names == ["_rid", "query_id", "doc_id", "rank", "score", "doc_lang", "error"]


def test_merge_by_score_keeps_a_documents_best_occurrence_and_breaks_ties_by_id():
    parts = [[("b", 2.0, "en"), ("a", 1.0, "en")], [("a", 3.0, "ru"), ("c", 2.0, "ru")]]
    assert merge_partitions(parts, 3) == [("a", 3.0, "ru"), ("b", 2.0, "en"), ("c", 2.0, "ru")]
    assert merge_partitions(parts, 10, "interleave") == [("b", 2.0, "en"), ("a", 3.0, "ru"),
                                                        ("c", 2.0, "ru")]


def test_merge_ranked_is_merge_partitions_on_arrays():
    one = (np.array(["x", "y", "z"], object), np.array([3.0, 2.0, 1.0]), "en")
    ids, scores, langs = merge_ranked([one], 2)
    assert (list(ids), list(scores), list(langs)) == (["x", "y"], [3.0, 2.0], ["en", "en"])
    parts = [[("b", 2.0, "en"), ("a", 1.0, "en")], [("a", 3.0, "ru"), ("c", 2.0, "ru")]]
    as_arrays = [(np.array([h[0] for h in p], object), np.array([h[1] for h in p]), p[0][2])
                 for p in parts]
    for how in ("score", "interleave"):
        ids, scores, langs = merge_ranked(as_arrays, 3, how)
        assert list(zip(ids, scores, langs)) == merge_partitions(parts, 3, how)
