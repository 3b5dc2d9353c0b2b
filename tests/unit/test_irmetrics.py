"""IR metrics (`xling/tasks/irmetrics.py`) against pytrec_eval, the trec_eval binding.

Parity: on real qrels (the CIRAL sw test-a file in tests/data always; CIRAL, MIRACL and
Mr.TyDi files from ../shared when present), as published and with some grades raised to 2-3
and some 0s turned to -1 (graded gains, negative judgments), runs are generated from random
subsets of the judged docs plus unjudged fake ids, with scores that tie exactly, scores that
differ only beyond float32 precision, queries left out, a query with no hits, and a query
the qrels do not have. Every per-query value of map, map_cut_K, ndcg, ndcg_cut_K, recall_K,
P_K and recip_rank (pytrec_eval's default cutoffs 5 ... 1000) must equal pytrec_eval's to
1e-9, for the same set of queries, with the run given as a dict and as a hits table whose
rank column is shuffled (ranks are ignored).

Conventions pinned by name: ties by doc_id descending, float32 scores, a query without
relevant docs, a query with no hits. Hand cases: the measures of a small graded run, the
oracle ceiling, PRI and Realized % (s1 0.30, s2 0.36, s* 0.50: PRI 0.20, 30 %), the paired
t-test, metric rows.
"""

import math
import random
from pathlib import Path

import pyarrow as pa
import pytest

from xling.tasks import irmetrics
from xling.tasks.irmetrics import (evaluate, mean, metric_rows, oracle_ceiling, paired_ttest,
                                   pri, qrels_dict, realized)
from xling.tasks.runs import HITS_SCHEMA, hits_table
from xling.tasks.topics import iter_qrels

pytrec_eval = pytest.importorskip("pytrec_eval")

ROOT = Path(__file__).resolve().parents[2]
LOCAL_QRELS = ROOT / "tests" / "data" / "qrels"
SHARED_QRELS = ROOT.parent / "shared" / "data" / "ir" / "qrels"
LOCAL_FILES = ["qrels.ciral-v1.0-sw-test-a.tsv"]
SHARED_FILES = [
    "qrels.ciral-v1.0-ha-dev.tsv", "qrels.ciral-v1.0-so-test-b.tsv",
    "qrels.ciral-v1.0-sw-test-b.tsv",  # has a query without relevant docs
    "qrels.ciral-v1.0-yo-test-a-pools.tsv", "qrels.miracl-v1.0-ar-dev.tsv",
    "qrels.miracl-v1.0-en-dev.tsv", "qrels.miracl-v1.0-sw-dev.tsv",
    "qrels.miracl-v1.0-zh-dev.tsv", "qrels.mrtydi-v1.1-sw.test.txt",
]
MEASURES = {"map", "map_cut", "ndcg", "ndcg_cut", "recall", "P", "recip_rank"}
MAX_QUERIES = 120  # per file, to keep the test fast


def load_qrels(name: str) -> dict[str, dict[str, int]]:
    path = LOCAL_QRELS / name
    if not path.is_file():
        path = SHARED_QRELS / name
        if not path.is_file():
            pytest.skip(f"{SHARED_QRELS} not found (a clone without ../shared)")
    with open(path, "rb") as f:
        q = qrels_dict(iter_qrels(f))
    return {k: q[k] for k in sorted(q)[:MAX_QUERIES]}


def graded(qrels: dict, rng: random.Random) -> dict:
    out = {}
    for q, docs in qrels.items():
        out[q] = {}
        for d, r in docs.items():
            if r >= 1 and rng.random() < 0.3:
                r = rng.choice([2, 3])
            elif r == 0 and rng.random() < 0.1:
                r = -1
            out[q][d] = r
    return out


def random_run(qrels: dict, rng: random.Random) -> dict[str, dict[str, float]]:
    run: dict[str, dict[str, float]] = {}
    for q, judged in qrels.items():
        if rng.random() < 0.1:  # a query the run does not answer
            continue
        docs = [d for d in judged if rng.random() < 0.7]
        docs += [f"unjudged-{rng.randrange(10**6)}" for _ in range(rng.randint(0, 150))]
        run[q] = {}
        for d in docs:
            u = rng.random()
            if u < 0.5:
                s = round(rng.uniform(0, 20), 1)  # exact ties
            elif u < 0.9:
                s = rng.uniform(-5, 5)
            else:  # equal as float32 (1e-9, -1e-8) or not (2e-7)
                s = 7.0 + rng.choice([0.0, 1e-9, -1e-8, 2e-7])
            run[q][d] = s
    first = sorted(qrels)[0]
    run[first] = {}  # a query with no hits
    run["not-in-qrels"] = {"x": 1.0, "y": 0.5}
    return run


def shuffled_table(run: dict, rng: random.Random) -> pa.Table:
    rows = []
    for q, docs in run.items():
        ranks = list(range(1, len(docs) + 1))
        rng.shuffle(ranks)
        rows += [{"query_id": q, "doc_id": d, "rank": r, "score": s, "system": "s"}
                 for (d, s), r in zip(docs.items(), ranks)]
    return pa.Table.from_pylist(rows, schema=HITS_SCHEMA)


def assert_matches_pytrec_eval(run: dict, qrels: dict, rng: random.Random) -> None:
    ref = pytrec_eval.RelevanceEvaluator(qrels, MEASURES).evaluate(run)
    names = sorted(next(iter(ref.values())))
    assert len(names) == 1 + 9 + 1 + 9 + 9 + 9 + 1  # every default cutoff is compared
    as_dict = evaluate(run, qrels, names)
    as_table = evaluate(shuffled_table(run, rng), qrels, names)
    assert as_dict.keys() == ref.keys()
    assert as_table.keys() == {q for q in ref if run[q]}  # a table cannot hold an empty query
    for ours in (as_dict, as_table):
        for q in ours:
            for m in names:
                assert ours[q][m] == pytest.approx(ref[q][m], abs=1e-9, rel=0), (q, m)


@pytest.mark.parametrize("name", LOCAL_FILES + SHARED_FILES)
def test_every_measure_equals_pytrec_eval_on_real_qrels(name):
    rng = random.Random(sum(map(ord, name)))
    qrels = load_qrels(name)
    for q in (qrels, graded(qrels, rng)):
        run = random_run(q, rng)
        assert_matches_pytrec_eval(run, q, rng)


def test_qrels_forms_agree():
    qrels = load_qrels(LOCAL_FILES[0])
    rows = [{"query_id": q, "doc_id": d, "relevance": r}
            for q, docs in qrels.items() for d, r in docs.items()]
    run = random_run(qrels, random.Random(3))
    expect = evaluate(run, qrels)
    assert evaluate(run, pa.Table.from_pylist(rows)) == expect  # as evaluate.py reads them
    assert evaluate(run, iter(rows)) == expect
    assert set(next(iter(expect.values()))) == set(irmetrics.DEFAULT_METRICS)


def ref(run, qrels, measures=("recip_rank",)):
    return pytrec_eval.RelevanceEvaluator(qrels, set(measures)).evaluate(run)


def test_ties_break_by_doc_id_descending():
    qrels = {"q": {"a": 1, "b": 0, "c": 0}}
    run = {"q": {"a": 1.0, "b": 1.0, "c": 1.0}}
    assert ref(run, qrels)["q"]["recip_rank"] == 1 / 3  # c, b, a
    assert evaluate(run, qrels, ["recip_rank"])["q"]["recip_rank"] == 1 / 3
    assert irmetrics.trec_eval_order(["a", "c", "b"], [1.0, 1.0, 2.0]) == [2, 1, 0]


def test_scores_are_compared_as_float32():
    qrels = {"q": {"a": 1, "b": 0}}
    tied = {"q": {"a": 1.0 + 1e-9, "b": 1.0}}  # one float32
    apart = {"q": {"a": 1.0 + 2e-7, "b": 1.0}}
    assert ref(tied, qrels)["q"]["recip_rank"] == 0.5
    assert evaluate(tied, qrels, ["recip_rank"])["q"]["recip_rank"] == 0.5
    assert evaluate(apart, qrels, ["recip_rank"])["q"]["recip_rank"] == 1.0


def test_query_without_relevant_docs_is_evaluated_as_zero():
    qrels = {"q": {"a": 0, "b": -1}, "r": {"a": 1}}
    run = {"q": {"a": 2.0, "b": 1.0}, "r": {"a": 1.0}}
    names = ["map", "ndcg_cut_10", "recall_100", "P_5", "recip_rank", "map_cut_10", "ndcg"]
    ours = evaluate(run, qrels, names)
    assert ours["q"] == {m: 0.0 for m in names}
    assert ref(run, qrels, ["map", "ndcg_cut", "recall", "P", "recip_rank"])["q"]["map"] == 0.0


def test_query_with_no_hits_and_queries_outside_qrels():
    qrels = {"q": {"a": 1}, "r": {"b": 1}}
    run = {"q": {}, "s": {"a": 1.0}}
    assert ref(run, qrels).keys() == {"q"}
    assert evaluate(run, qrels, ["map", "P_5"]) == {"q": {"map": 0.0, "P_5": 0.0}}


def test_small_graded_run_by_hand():
    qrels = {"q": {"a": 2, "b": 1, "c": -1, "d": 0, "e": 3}}
    run = {"q": {"c": 5.0, "a": 4.0, "b": 3.0, "d": 2.0, "x": 1.0}}
    got = evaluate(run, qrels, ["map", "map_cut_2", "ndcg_cut_5", "recall_2", "recall_5",
                                "P_5", "P_10", "recip_rank"])["q"]
    # ranks: c (non-relevant, no gain), a (2), b (1), d, x; e (3) not retrieved; R = 3
    assert got["map"] == pytest.approx((1 / 2 + 2 / 3) / 3)
    assert got["map_cut_2"] == pytest.approx((1 / 2) / 3)
    dcg = 2 / math.log2(3) + 1 / math.log2(4)
    idcg = 3 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    assert got["ndcg_cut_5"] == pytest.approx(dcg / idcg)
    assert got["recall_2"] == pytest.approx(1 / 3) and got["recall_5"] == pytest.approx(2 / 3)
    assert got["P_5"] == pytest.approx(2 / 5) and got["P_10"] == pytest.approx(2 / 10)
    assert got["recip_rank"] == 0.5


def test_bad_input_raises():
    with pytest.raises(ValueError, match="unknown metric 'ndcg@10'"):
        evaluate({}, {}, ["ndcg@10"])
    with pytest.raises(ValueError, match="unknown metric"):
        evaluate({}, {}, ["P_0"])
    dup = hits_table({"q": [("a", 1.0), ("a", 2.0)]}, system="s")
    with pytest.raises(ValueError, match="more than once"):
        evaluate(dup, {"q": {"a": 1}})
    with pytest.raises(ValueError, match="twice"):
        evaluate({}, [{"query_id": "q", "doc_id": "a", "relevance": 1}] * 2)


def test_oracle_ceiling_by_hand():
    run = hits_table({"q": [(f"d{i}", 10.0 - i) for i in range(1, 7)],
                      "unjudged": [("u1", 2.0), ("u2", 1.0)]}, system="bm25")
    qrels = {"q": {"d2": 1, "d4": 2, "d6": 1, "d1": 0}}
    got = oracle_ceiling(run, qrels, depth=5)
    assert got.schema == HITS_SCHEMA and set(got["system"].to_pylist()) == {"oracle"}
    q = [r for r in got.to_pylist() if r["query_id"] == "q"]
    # top 5: relevant d4 (2) then d2 (1) first, then d1 d3 d5; d6 is below the depth
    assert [r["doc_id"] for r in q] == ["d4", "d2", "d1", "d3", "d5", "d6"]
    assert [r["rank"] for r in q] == [1, 2, 3, 4, 5, 6]
    assert [r["score"] for r in q] == [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    u = [r["doc_id"] for r in got.to_pylist() if r["query_id"] == "unjudged"]
    assert u == ["u1", "u2"]
    per_query = evaluate(got, qrels, ["recip_rank", "P_2", "recall_5"])
    assert per_query["q"] == {"recip_rank": 1.0, "P_2": 1.0, "recall_5": 2 / 3}


def test_oracle_ceiling_uses_ranks_and_is_never_below_the_run():
    qrels = load_qrels(LOCAL_FILES[0])
    rng = random.Random(5)
    run = random_run(qrels, rng)
    # ranks in trec_eval's order, so that the run's top 20 is the one evaluation sees
    table = hits_table({q: [(list(docs)[i], list(docs.values())[i])
                            for i in irmetrics.trec_eval_order(list(docs), list(docs.values()))]
                        for q, docs in run.items()}, system="s")
    names = ["map", "ndcg_cut_10", "ndcg_cut_20", "recall_100", "recip_rank", "P_10"]
    base = evaluate(table, qrels, names)
    oracle = evaluate(oracle_ceiling(table, qrels, depth=20), qrels, names)
    assert base.keys() == oracle.keys()
    for q in base:
        for m in names:
            assert oracle[q][m] >= base[q][m] - 1e-12, (q, m)
        assert oracle[q]["recall_100"] == pytest.approx(base[q]["recall_100"])  # same set


def test_pri_and_realized():
    assert pri(0.50, 0.30) == pytest.approx(0.20)
    assert realized(0.30, 0.36, 0.50) == pytest.approx(30.0)
    assert realized(0.30, 0.27, 0.50) == pytest.approx(-15.0)  # the reranker hurt
    assert math.isnan(realized(0.40, 0.45, 0.40))  # no potential: undefined


def test_paired_ttest_by_hand():
    a = {"1": 0.5, "2": 0.6, "3": 0.7, "only-a": 0.9}
    b = {"1": 0.4, "2": 0.4, "3": 0.6, "only-b": 0.0}
    # d = 0.1, 0.2, 0.1: mean 2/15, sd sqrt(1/300), t = (2/15) / (sd / sqrt 3) = 4; with
    # 2 degrees of freedom the two-sided p is 1 - t / sqrt(t^2 + 2)
    got = paired_ttest(a, b)
    assert got["n"] == 3
    assert got["t"] == pytest.approx(4.0)
    assert got["p"] == pytest.approx(1 - 4 / math.sqrt(18))
    assert paired_ttest(b, a)["t"] == pytest.approx(-4.0)
    same = paired_ttest(a, a)
    assert math.isnan(same["t"]) and same["p"] == 1.0 and same["n"] == 4
    shifted = paired_ttest({"1": 0.5, "2": 0.25}, {"1": 0.25, "2": 0.0})
    assert shifted["t"] == math.inf and shifted["p"] == 0.0
    one = paired_ttest({"1": 0.5}, {"1": 0.2})
    assert math.isnan(one["t"]) and math.isnan(one["p"]) and one["n"] == 1


def test_mean_and_metric_rows():
    pq = {"2": {"map": 0.5, "P_5": 0.2}, "1": {"map": 0.25, "P_5": 0.4}}
    assert mean(pq, "map") == 0.375
    assert mean(pq, "map", queries=["1", "2", "3", "4"]) == 0.1875  # unanswered count 0
    assert math.isnan(mean({}, "map"))
    rows = metric_rows(pq, study="ciral-test-a", setting="QT", lang="sw->sw", model="bm25",
                       system="bm25-qt")
    assert [(r["metric"], r["query_id"], r["value"], r["n"]) for r in rows] == [
        ("map", None, 0.375, 2), ("map", "1", 0.25, 1), ("map", "2", 0.5, 1),
        ("P_5", None, pytest.approx(0.3), 2), ("P_5", "1", 0.4, 1), ("P_5", "2", 0.2, 1)]
    assert {k: rows[0][k] for k in ("study", "setting", "lang", "model", "system")} == {
        "study": "ciral-test-a", "setting": "QT", "lang": "sw->sw", "model": "bm25",
        "system": "bm25-qt"}
    empty = metric_rows({}, study="s", setting="x", lang="l", model="m", system="y",
                        metrics=["map"])
    assert len(empty) == 1 and math.isnan(empty[0]["value"]) and empty[0]["n"] == 0
