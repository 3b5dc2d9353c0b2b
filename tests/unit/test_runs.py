"""Hits tables and TREC run files (`xling/tasks/runs.py`).

- round trip: table -> TREC file (path, text stream, binary stream, .gz) -> table, equal up
  to the 6 decimals pyserini writes scores with; the written lines are pyserini's format;
- a malformed line (field count, rank, score, NaN) raises ValueError naming its line;
- `rerank_by_score` orders ties by doc_id descending (trec_eval's order) and re-ranks;
- `to_dict`, `hits_table` from the dict and row forms, `as_hits` on stage-shaped tables.
"""

import gzip
import io

import numpy as np
import pyarrow as pa
import pytest

from xling.tasks.runs import (HITS_SCHEMA, as_hits, hits_table, read_trec_run,
                              rerank_by_score, to_dict, write_trec_run)


def sample() -> pa.Table:
    rows = [
        {"query_id": "2", "doc_id": "TUKO#1#0", "rank": 1, "score": 12.3456789, "system": "bm25"},
        {"query_id": "2", "doc_id": "d-β", "rank": 2, "score": -0.5, "system": "bm25"},
        {"query_id": "10", "doc_id": "x", "rank": 1, "score": 1e-7, "system": "bm25"},
    ]
    return pa.Table.from_pylist(rows, schema=HITS_SCHEMA)


def test_round_trip_through_every_kind_of_destination(tmp_path):
    t = sample()
    text = io.StringIO()
    write_trec_run(t, text)
    assert text.getvalue().splitlines() == [
        "2 Q0 TUKO#1#0 1 12.345679 bm25",
        "2 Q0 d-β 2 -0.500000 bm25",
        "10 Q0 x 1 0.000000 bm25",
    ]
    binary = io.BytesIO()
    write_trec_run(t, binary)
    assert binary.getvalue().decode("utf-8") == text.getvalue()
    path = tmp_path / "run.trec"
    write_trec_run(t, path)
    gz = tmp_path / "run.trec.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    for back in (read_trec_run(path), read_trec_run(str(gz)),
                 read_trec_run(io.BytesIO(binary.getvalue())),
                 read_trec_run(io.StringIO(text.getvalue()))):
        assert back.schema == HITS_SCHEMA
        assert back.drop_columns(["score"]).equals(t.drop_columns(["score"]))
        assert back["score"].to_pylist() == pytest.approx(t["score"].to_pylist(), abs=1e-6)
    assert read_trec_run(path, system="other")["system"].to_pylist() == ["other"] * 3


def test_written_in_rank_order_queries_in_first_seen_order():
    t = pa.Table.from_pylist([
        {"query_id": "b", "doc_id": "3", "rank": 3, "score": 1.0, "system": "s"},
        {"query_id": "a", "doc_id": "9", "rank": 1, "score": 5.0, "system": "s"},
        {"query_id": "b", "doc_id": "1", "rank": 1, "score": 3.0, "system": "s"},
        {"query_id": "b", "doc_id": "2", "rank": 2, "score": 2.0, "system": "s"},
    ], schema=HITS_SCHEMA)
    buf = io.StringIO()
    write_trec_run(t, buf)
    assert [l.split()[:4] for l in buf.getvalue().splitlines()] == [
        ["b", "Q0", "1", "1"], ["b", "Q0", "2", "2"], ["b", "Q0", "3", "3"], ["a", "Q0", "9", "1"]]


@pytest.mark.parametrize("line, match", [
    ("q1 Q0 d3 3 0.5", "line 3 has 5 fields"),
    ("q1 Q0 d3 3 0.5 tag extra", "line 3 has 7 fields"),
    ("q1 Q0 d3 third 0.5 tag", "line 3: rank 'third'"),
    ("q1 Q0 d3 3 high tag", "line 3: score 'high'"),
    ("q1 Q0 d3 3 nan tag", "line 3: score is NaN"),
])
def test_malformed_line_names_its_number(line, match):
    text = "q1 Q0 d1 1 2.0 tag\nq1 Q0 d2 2 1.0 tag\n" + line + "\n"
    with pytest.raises(ValueError, match=match):
        read_trec_run(io.BytesIO(text.encode()))


def test_blank_lines_and_crlf_are_read():
    t = read_trec_run(io.BytesIO(b"q1 Q0 d1 1 2.0 tag\r\n\n  \nq1\tQ0\td2\t2\t1.5\ttag\n"))
    assert t["doc_id"].to_pylist() == ["d1", "d2"] and t["rank"].to_pylist() == [1, 2]


def test_empty_run_file():
    t = read_trec_run(io.BytesIO(b""))
    assert t.num_rows == 0 and t.schema == HITS_SCHEMA


def test_whitespace_in_an_id_cannot_be_written():
    t = hits_table({"q 1": {"d": 1.0}}, system="s")
    with pytest.raises(ValueError, match="without whitespace"):
        write_trec_run(t, io.StringIO())


def test_null_rank_cannot_be_written():
    t = sample().set_column(2, "rank", pa.array([1, None, 1], pa.int32()))
    with pytest.raises(ValueError, match="null"):
        write_trec_run(t, io.StringIO())


def test_rerank_by_score_breaks_ties_by_doc_id_descending():
    t = pa.Table.from_pylist([
        {"query_id": "q", "doc_id": d, "rank": 1, "score": s, "system": "s"}
        for d, s in [("a", 1.0), ("c", 1.0), ("b", 2.0), ("B", 1.0), ("ä", 1.0)]
    ], schema=HITS_SCHEMA)
    r = rerank_by_score(t)
    # byte order: "B" < "a" < "c" < "ä"; descending among the 1.0 ties
    assert r["doc_id"].to_pylist() == ["b", "ä", "c", "a", "B"]
    assert r["rank"].to_pylist() == [1, 2, 3, 4, 5]


def test_rerank_groups_queries_and_restarts_ranks():
    t = hits_table([{"query_id": q, "doc_id": d, "score": s}
                    for q, d, s in [("2", "x", 1.0), ("1", "y", 3.0), ("2", "z", 4.0),
                                    ("1", "w", 0.5)]], system="s")
    assert [(r["query_id"], r["doc_id"], r["rank"]) for r in t.to_pylist()] == [
        ("1", "y", 1), ("1", "w", 2), ("2", "z", 1), ("2", "x", 2)]


def test_hits_table_forms_and_to_dict():
    d = {"q1": {"a": 0.5, "b": 2.0}, "q2": {"c": 1.0}}
    t = hits_table(d, system="dense")
    assert to_dict(t) == {"q1": {"b": 2.0, "a": 0.5}, "q2": {"c": 1.0}}
    assert t["system"].to_pylist() == ["dense"] * 3
    listed = hits_table({"q1": [("a", 0.5), ("b", 2.0)]}, system="s")  # ranks = positions
    assert listed["rank"].to_pylist() == [1, 2]
    with pytest.raises(ValueError, match="system"):
        hits_table(d)


def test_to_dict_refuses_a_doc_listed_twice():
    t = hits_table({"q": [("a", 1.0), ("a", 0.5)]}, system="s")
    with pytest.raises(ValueError, match="more than once"):
        to_dict(t)


def test_as_hits_drops_stage_columns_and_types_empty_lists():
    stage = pa.table({"query_id": ["q"], "lang": ["sw"], "doc_id": ["d"],
                      "rank": pa.array([1], pa.int64()), "score": [1.0], "doc_lang": ["sw"],
                      "system": ["s"], "error": pa.nulls(1, pa.string())})
    assert as_hits(stage).schema == HITS_SCHEMA
    empty = pa.table({"query_id": [], "doc_id": [], "rank": pa.array([], pa.int32()),
                      "score": pa.array([], pa.float64()), "system": []})
    assert as_hits(empty).schema == HITS_SCHEMA
    with pytest.raises(ValueError, match="missing"):
        as_hits(stage.drop_columns(["score"]))


def test_trec_lines_equal_python_formatting_at_every_magnitude():
    """The Arrow-built lines against a per-hit f-string: scores at every magnitude and
    sign, values a half-millionth apart from a rounding edge, -0.0, inf; queries out of
    order, ranks shuffled, ids in several scripts."""
    rng = np.random.default_rng(7)
    edges = [0.0, -0.0, 5e-7, -5e-7, 1.5e-6, 2.5e-6, 0.0000015, 1.0000005, 123.4567885,
             0.1234565, 1e-300, -1e-9, 4503599627.3704955, 1e15 + 0.5, 1e300, -1e300,
             float("inf"), float("-inf"), 0.016393442622950821, 12.3456789]
    n = 5000
    scores = np.concatenate([edges, rng.standard_normal(n) * 10.0 ** rng.integers(-9, 12, n),
                             np.round(rng.random(n), 7) + 5e-7])
    m = len(scores)
    qids = [f"q{i % 37}" if i % 3 else f"查询-{i % 11}" for i in range(m)]
    docs = [f"d{i}" if i % 2 else f"وثيقة#{i}" for i in range(m)]
    t = pa.table({"query_id": qids, "doc_id": docs,
                  "rank": pa.array(rng.permutation(m) + 1, pa.int32()),
                  "score": scores, "system": ["bm25-dt"] * m}, schema=HITS_SCHEMA)
    first = {q: i for i, q in reversed(list(enumerate(qids)))}
    ranks = t["rank"].to_pylist()
    order = sorted(range(m), key=lambda i: (first[qids[i]], ranks[i], i))
    want = "".join(f"{qids[i]} Q0 {docs[i]} {ranks[i]} {scores[i]:.6f} bm25-dt\n" for i in order)
    buf = io.StringIO()
    write_trec_run(t, buf)
    assert buf.getvalue() == want
    # one table in several chunks, and one longer than a formatting chunk
    import xling.tasks.runs as runs

    chunked = pa.concat_tables([t.slice(0, 100), t.slice(100)])
    small, runs._TREC_CHUNK = runs._TREC_CHUNK, 1000
    try:
        assert runs.trec_run_bytes(chunked) == want.encode()
    finally:
        runs._TREC_CHUNK = small


@pytest.mark.parametrize("bad", ["", "a b", "a\u3000b", "a\u00a0b", "a\x1fb", "a\u2028b"])
def test_any_unicode_whitespace_or_empty_id_cannot_be_written(bad):
    t = hits_table([{"query_id": "q", "doc_id": "ok", "score": 2.0},
                    {"query_id": "q", "doc_id": bad, "score": 1.0}], system="s")
    with pytest.raises(ValueError, match="row 1: .*without whitespace"):
        write_trec_run(t, io.StringIO())
