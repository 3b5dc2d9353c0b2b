"""A stage's per-part export and counts (runner `Stage.part_export`, `Stage.part_counts`),
made by the commit task: the retrieve stage's TREC run is its parts' runs joined, the same
bytes as the run of all the hits at once, its counts are the parts' summed, and a part
committed without either (an older xling) falls back to reading the parts."""

import numpy as np
import pyarrow as pa

from xling.core.cells import Cell
from xling.core.commit import _commit_shard
from xling.core.status import part_files
from xling.core.store import RunStore
from xling.core.runs import TREC_PART, export_trec
from xling.tasks.runs import hit_counts, hits_trec_bytes, trec_run_bytes


def _hits(queries: list[str], depth: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    rows = [{"query_id": q, "doc_id": f"{q}-d{r}", "rank": r, "score": float(s),
             "system": "bm25", "error": None}
            for q in queries for r, s in enumerate(np.sort(rng.random(depth))[::-1], 1)]
    rows.append({"query_id": f"bad{seed}", "doc_id": None, "rank": None, "score": None,
                 "system": "bm25", "error": "empty query"})
    return pa.Table.from_pylist(rows)


def _commit_all(store: RunStore, cell: Cell) -> list[pa.Table]:
    """Shard 0 from two pieces, shard 1 from one (moved as it is), shard 2 empty."""
    tables = [_hits(["q1", "q7"], 3, 0), _hits(["q3"], 4, 1), _hits(["q2", "q9", "q4"], 2, 2)]
    pieces = {0: tables[:2], 1: tables[2:], 2: []}
    for s, ts in pieces.items():
        rels = []
        for i, t in enumerate(ts):
            rels.append(f"{cell.dir}/_tmp/run1/{s:05d}/p{i}.parquet")
            store.write_parquet(rels[-1], t)
        done = _commit_shard(store, cell.dir, s, rels, {"rows": sum(t.num_rows for t in ts)},
                             None, "query_id", "run1", export=TREC_PART, counts=hit_counts)
        store.write_json(f"{cell.dir}/_shards/{s:05d}.json", {"shard": s, **done})  # as _mark
    return tables


def test_the_joined_part_runs_are_the_run_of_all_hits(tmp_path):
    store = RunStore(str(tmp_path / "run"))
    cell = Cell("retrieve", {"run": "r"}, {}, n_shards=3)
    tables = _commit_all(store, cell)
    assert len(store.list(f"{cell.dir}/_exports")) == 3
    assert part_files(store, cell.dir) == [f"{cell.dir}/part-0000{s}.parquet" for s in range(3)]
    info = export_trec(store, cell)
    whole = pa.concat_tables(tables)
    ok = whole.filter(pa.compute.is_null(whole["error"]))
    expected = trec_run_bytes(ok.select(["query_id", "doc_id", "rank", "score", "system"]))
    assert store.read_bytes(f"{cell.dir}/run.trec") == expected
    assert info == {"trec_run": "run.trec", "queries_with_hits": 6, "hits": ok.num_rows}
    assert [store.read_json(f"{cell.dir}/_shards/{s:05d}.json")["stats"] for s in range(3)] == [
        {"hits": 10, "queries_with_hits": 3}, {"hits": 6, "queries_with_hits": 3},
        {"hits": 0, "queries_with_hits": 0}]
    assert store.list(f"{cell.dir}/_exports") == []
    assert expected.decode().splitlines()[0] == f"q1 Q0 q1-d1 1 {ok['score'][0].as_py():.6f} bm25"


def test_a_part_without_its_export_falls_back_to_the_whole_run(tmp_path):
    store = RunStore(str(tmp_path / "run"))
    cell = Cell("retrieve", {"run": "r"}, {}, n_shards=3)
    _commit_all(store, cell)
    joined = b"".join(store.read_bytes(p) for p in store.list(f"{cell.dir}/_exports"))
    store.delete(f"{cell.dir}/_exports/part-00001.trec")
    marker = store.read_json(f"{cell.dir}/_shards/00002.json")
    store.write_json(f"{cell.dir}/_shards/00002.json", {k: v for k, v in marker.items()
                                                         if k != "stats"})
    info = export_trec(store, cell)
    assert store.read_bytes(f"{cell.dir}/run.trec") == joined
    assert info == {"trec_run": "run.trec", "queries_with_hits": 6, "hits": 16}
    assert joined == hits_trec_bytes(store.read_parquet(part_files(store, cell.dir)))


def test_a_retried_commit_whose_part_had_moved_still_writes_the_export(tmp_path):
    store = RunStore(str(tmp_path / "run"))
    cell = Cell("retrieve", {"run": "r"}, {}, n_shards=1)
    t = _hits(["q5"], 3, 5)
    store.write_parquet(f"{cell.dir}/part-00000.parquet", t)  # moved by the first attempt
    _commit_shard(store, cell.dir, 0, [f"{cell.dir}/_tmp/run1/00000/gone.parquet"],
                  {"rows": t.num_rows}, None, "query_id", "run1", export=TREC_PART)
    assert store.read_bytes(f"{cell.dir}/_exports/part-00000.trec") == hits_trec_bytes(t)
