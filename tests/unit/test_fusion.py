"""Fusion (`xling/tasks/fusion.py`) against pyserini's own fusion code.

Runs are made over real qrels doc ids (the CIRAL sw test-a qrels in tests/data always; CIRAL
and MIRACL qrels from ../shared when present) plus unjudged fake ids, with scores rounded
so that there are ties, queries missing from some runs, and one run whose rank column does
not follow its scores (RRF must use the ranks as given, as pyserini does). They are written
as TREC files; pyserini reads them as `TrecRun`s and fuses them with
`pyserini.fusion.reciprocal_rank_fusion` / `interpolation` / `average` / `normalize`,
xling reads the same files with `read_trec_run`. Every fused list must be the same docs in
the same ranks, with scores equal to 1e-9 (they are in fact bit-identical). Plus hand cases:
the RRF formula, the tie order, depth and top cuts, the Kahan-summed case where plain
summation would order two docs the other way, min-max edge cases, empty inputs.
"""

import random
from pathlib import Path

import pyarrow as pa
import pytest

from xling.tasks.fusion import interpolate, rrf
from xling.tasks.runs import HITS_SCHEMA, hits_table, read_trec_run, write_trec_run
from xling.tasks.topics import iter_qrels

# pyserini's fusion is pandas only (no Java); skip only if pyserini is not installed.
pyserini_fusion = pytest.importorskip("pyserini.fusion")
from pyserini.trectools import TrecRun  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LOCAL_QRELS = ROOT / "tests" / "data" / "qrels"
SHARED_QRELS = ROOT.parent / "shared" / "data" / "ir" / "qrels"
SHARED_FILES = ["qrels.ciral-v1.0-yo-test-a.tsv", "qrels.miracl-v1.0-sw-dev.tsv"]


def qrels_file(name: str) -> Path:
    if (LOCAL_QRELS / name).is_file():
        return LOCAL_QRELS / name
    if not (SHARED_QRELS / name).is_file():
        pytest.skip(f"{SHARED_QRELS} not found (a clone without ../shared)")
    return SHARED_QRELS / name


def judged_docs(path: Path, max_queries: int = 60) -> dict[str, list[str]]:
    with open(path, "rb") as f:
        docs: dict[str, list[str]] = {}
        for r in iter_qrels(f):
            docs.setdefault(r["query_id"], []).append(r["doc_id"])
    return {q: docs[q] for q in sorted(docs)[:max_queries]}


def make_runs(path: Path, tmp_path: Path, seed: int) -> list[Path]:
    rng = random.Random(seed)
    docs = judged_docs(path)
    paths = []
    for i in range(3):
        hits: dict[str, dict[str, float]] = {}
        for q, judged in docs.items():
            if rng.random() < 0.15:  # a query this run does not answer
                continue
            pool = judged + [f"fake-{q}-{j}" for j in range(40)]
            chosen = rng.sample(pool, rng.randint(1, len(pool)))
            hits[q] = {d: round(rng.uniform(0, 3), 1) for d in chosen}  # many ties
        t = hits_table(hits, system=f"run{i}")
        if i == 2:  # ranks that are not the score order: RRF must read the rank column
            ranks = t["rank"].to_pylist()
            by_q: dict[str, list[int]] = {}
            for q, r in zip(t["query_id"].to_pylist(), ranks):
                by_q.setdefault(q, []).append(r)
            for v in by_q.values():
                rng.shuffle(v)
            shuffled = [r for q in dict.fromkeys(t["query_id"].to_pylist()) for r in by_q[q]]
            t = t.set_column(2, "rank", pa.array(shuffled, pa.int32()))
        p = tmp_path / f"{path.stem}.run{i}.trec"
        write_trec_run(t, p)
        paths.append(p)
    return paths


def pyserini_lists(run: TrecRun) -> dict[str, list[tuple[str, int, float]]]:
    out: dict[str, list] = {}
    df = run.run_data
    for t, d, r, s in zip(df["topic"], df["docid"], df["rank"], df["score"]):
        out.setdefault(str(t), []).append((str(d), int(r), float(s)))  # topics parse as ints
    return out


def xling_lists(t: pa.Table) -> dict[str, list[tuple[str, int, float]]]:
    out: dict[str, list] = {}
    for r in t.to_pylist():
        out.setdefault(r["query_id"], []).append((r["doc_id"], r["rank"], r["score"]))
    return out


def assert_same(ours: pa.Table, theirs: TrecRun) -> None:
    a, b = xling_lists(ours), pyserini_lists(theirs)
    assert a.keys() == b.keys()
    for q in a:
        assert [x[:2] for x in a[q]] == [x[:2] for x in b[q]], f"query {q}"
        assert [x[2] for x in a[q]] == pytest.approx([x[2] for x in b[q]], abs=1e-9, rel=0)


QRELS = ["qrels.ciral-v1.0-sw-test-a.tsv", *SHARED_FILES]


@pytest.mark.parametrize("name", QRELS)
@pytest.mark.parametrize("depth, top", [(1000, 1000), (10, 5), (25, 100)])
def test_rrf_equals_pyserini(name, depth, top, tmp_path):
    paths = make_runs(qrels_file(name), tmp_path, seed=depth + sum(map(ord, name)))
    ours = [read_trec_run(p) for p in paths]
    theirs = [TrecRun(str(p)) for p in paths]
    for n in (2, 3):
        fused = rrf(ours[:n], k=60, depth=depth, top=top, system="hybrid")
        assert set(fused["system"].to_pylist()) == {"hybrid"}
        assert_same(fused, pyserini_fusion.reciprocal_rank_fusion(
            theirs[:n], rrf_k=60, depth=depth, k=top))
    assert_same(rrf(ours, k=10, depth=depth, top=top),
                pyserini_fusion.reciprocal_rank_fusion(theirs, rrf_k=10, depth=depth, k=top))


@pytest.mark.parametrize("name", QRELS)
def test_interpolation_equals_pyserini(name, tmp_path):
    paths = make_runs(qrels_file(name), tmp_path, seed=7)
    ours = [read_trec_run(p) for p in paths]
    theirs = [TrecRun(str(p)) for p in paths]
    for depth, top in [(1000, 1000), (10, 5)]:
        assert_same(interpolate(ours[:2], [0.3, 1 - 0.3], normalize="none", depth=depth, top=top),
                    pyserini_fusion.interpolation(theirs[:2], alpha=0.3, depth=depth, k=top))
        assert_same(interpolate(ours, [1 / 3] * 3, normalize="none", depth=depth, top=top),
                    pyserini_fusion.average(theirs, depth=depth, k=top))
    # pyserini normalises over the whole run, xling over the fused depth: same when the
    # depth reaches every hit
    assert_same(interpolate(ours, [1.0] * 3, normalize="minmax", depth=10_000, top=1000),
                pyserini_fusion.normalize(theirs, depth=10_000, k=1000))


def test_rrf_by_hand():
    a = hits_table({"q": [("d1", 9.0), ("d2", 8.0)]}, system="a")
    b = hits_table({"q": [("d2", 5.0), ("d3", 4.0)]}, system="b")
    got = rrf([a, b], k=60)
    assert got["doc_id"].to_pylist() == ["d2", "d1", "d3"]
    assert got["rank"].to_pylist() == [1, 2, 3]
    assert got["score"].to_pylist() == [1 / 61 + 1 / 62, 1 / 61, 1 / 62]
    assert got.schema == HITS_SCHEMA and got["system"].to_pylist() == ["rrf"] * 3


def test_equal_fused_scores_order_by_doc_id_ascending():
    a = hits_table({"q": [("x", 1.0)]}, system="a")
    b = hits_table({"q": [("a", 1.0)]}, system="b")
    assert rrf([a, b])["doc_id"].to_pylist() == ["a", "x"]


def test_depth_takes_best_ranked_and_top_cuts(tmp_path):
    rows = [{"query_id": "q", "doc_id": d, "rank": r, "score": 0.0, "system": "a"}
            for d, r in [("c", 3), ("a", 1), ("b", 2)]]  # rows out of rank order
    a = pa.Table.from_pylist(rows, schema=HITS_SCHEMA)
    b = hits_table({"q": [("z", 1.0)]}, system="b")
    assert sorted(rrf([a, b], depth=2)["doc_id"].to_pylist()) == ["a", "b", "z"]
    assert rrf([a, b], top=2)["doc_id"].to_pylist() == ["a", "z"]


def test_three_runs_sum_like_pandas_kahan(tmp_path):
    # a is ranked 1, 2, 7 and b 7, 1, 2: equal sums in exact arithmetic, but the float sums
    # differ in the last bit, and plain left-to-right summation puts a first where pandas'
    # compensated sum (so pyserini) puts b first.
    orders = [["a", "f1", "f2", "f3", "f4", "f5", "b"],
              ["b", "a", "g1", "g2", "g3", "g4", "g5"],
              ["h1", "b", "h2", "h3", "h4", "h5", "a"]]
    runs = [hits_table({"q": [(d, 0.0) for d in o]}, system=f"r{i}")
            for i, o in enumerate(orders)]
    plain = {d: sum(1 / (60 + o.index(d) + 1) for o in orders) for d in "ab"}
    assert plain["a"] > plain["b"]
    paths = []
    for i, r in enumerate(runs):
        paths.append(tmp_path / f"r{i}.trec")
        write_trec_run(r, paths[-1])
    theirs = pyserini_fusion.reciprocal_rank_fusion([TrecRun(str(p)) for p in paths])
    ours = rrf(runs)
    assert_same(ours, theirs)
    assert ours["doc_id"].to_pylist()[:2] == ["b", "a"]


def test_interpolate_by_hand():
    a = hits_table({"q": [("d1", 10.0), ("d2", 6.0), ("d3", 2.0)], "solo": [("s", 4.0)]},
                   system="a")
    b = hits_table({"q": [("d3", 0.5), ("d4", 0.1)]}, system="b")
    got = interpolate([a, b], [0.5, 2.0], normalize="minmax")
    rows = {(r["query_id"], r["doc_id"]): r["score"] for r in got.to_pylist()}
    # a: d1 1, d2 0.5, d3 0; b: d3 1, d4 0; a query with one hit normalises to 1
    assert rows == {("q", "d1"): 0.5, ("q", "d2"): 0.25, ("q", "d3"): 2.0, ("q", "d4"): 0.0,
                    ("solo", "s"): 0.5}
    assert got.filter(pa.compute.equal(got["query_id"], "q"))["doc_id"].to_pylist() == [
        "d3", "d1", "d2", "d4"]
    raw = interpolate([a, b], [1.0, 1.0], normalize="none")
    assert {(r["query_id"], r["doc_id"]): r["score"] for r in raw.to_pylist()}[("q", "d3")] == 2.5
    with pytest.raises(ValueError, match="2 weights for 1 runs"):
        interpolate([a], [1.0, 1.0])
    with pytest.raises(ValueError, match="normalize"):
        interpolate([a, b], [1.0, 1.0], normalize="zscore")


def test_empty_inputs_as_the_retrieve_stage_builds_them():
    # retrieve._fuse builds per-query tables from Python lists: an empty one has null types
    empty = pa.table({"query_id": [], "doc_id": [], "rank": pa.array([], pa.int32()),
                      "score": pa.array([], pa.float64()), "system": []})
    a = hits_table({"q": [("d1", 1.0)]}, system="a")
    assert rrf([a, empty])["doc_id"].to_pylist() == ["d1"]
    assert interpolate([empty, a], [1.0, 1.0])["doc_id"].to_pylist() == ["d1"]
    assert rrf([empty, empty]).num_rows == 0
