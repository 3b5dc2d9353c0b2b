"""The stage contract on local Ray: shards, commits, skip, --force, error rows, lost rows.

A small scripted stage stands in for a model here because what is under test is the
runner's control flow; the real stages and engines have their own integration tests.
"""

import pyarrow as pa
import pytest

from xling.core.runner import Cell, Runner, Stage, StageFailed, cell_state, read_cell, shard_of
from xling.core.store import RunStore


def _upper(batch: pa.Table, drop=(), boom=False) -> pa.Table:
    if boom:
        raise RuntimeError("model exploded")
    rows = []
    for r in batch.to_pylist():
        if r["id"] in drop:
            continue  # a buggy stage losing a record
        err = None if r["text"] else "empty text"
        rows.append({**r, "out": r["text"].upper() if r["text"] else None, "error": err})
    return pa.Table.from_pylist(rows)


class EchoStage(Stage):
    name = "echo"
    id_column = "id"

    def __init__(self, rows, n_shards=5, drop=(), boom=False, tag="a"):
        self.rows, self.n_shards, self.drop, self.boom, self.tag = rows, n_shards, drop, boom, tag

    def cells(self, cfg):
        return [Cell("echo", {"set": self.tag}, {"v": 1}, inputs=["<memory>"], n_shards=self.n_shards)]

    def read(self, cell, cfg):
        import ray.data

        return ray.data.from_items([{"_rid": r["id"], **r} for r in self.rows])

    def map(self, ds, cells, cfg):
        import functools

        return ds.map_batches(functools.partial(_upper, drop=self.drop, boom=self.boom),
                              batch_format="pyarrow", batch_size=7)


ROWS = [{"id": f"d{i:03d}", "text": "" if i % 10 == 3 else f"text {i}"} for i in range(60)]


def test_shards_are_stable_and_spread():
    ids = [f"doc-{i}" for i in range(1000)]
    a = shard_of(ids, 16)
    assert list(a) == list(shard_of(list(reversed(ids)), 16))[::-1]
    assert set(a) == set(range(16))
    assert shard_of(["36897421#2"], 1000)[0] == shard_of(["36897421#2"], 1000)[0]


def test_run_commit_skip_force(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    stage = EchoStage(ROWS)
    [rep] = Runner(store, progress=False).run(stage, None)
    cell = stage.cells(None)[0]
    out = read_cell(store, cell.dir)
    assert sorted(out["id"].to_pylist()) == [r["id"] for r in ROWS]
    assert rep.rows == 60 and rep.errors == 6
    m = store.read_json(f"{cell.dir}/_manifest.json")
    assert m["rows"] == 60 and m["errors"] == 6 and m["n_shards"] == 5
    assert m["inputs"]["rows"] == 60 and len(m["files"]) == 5
    # Every committed file sits under its deterministic name; nothing temporary is left.
    assert not [p for p in store.list(cell.dir) if "/_tmp/" in p]
    # Skip: nothing recomputed.
    [rep2] = Runner(store, progress=False).run(stage, None)
    assert rep2.state == "skipped"
    assert store.read_json(f"{cell.dir}/_manifest.json") == m
    # Force: everything recomputed under a new run id.
    r3 = Runner(store, force=True, progress=False)
    r3.run(stage, None)
    m3 = store.read_json(f"{cell.dir}/_manifest.json")
    assert m3["run_ids"] == [r3.run_id] and m3["rows"] == 60


def test_lost_records_become_error_rows(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    stage = EchoStage(ROWS, drop={"d010", "d020"}, tag="lossy")
    [rep] = Runner(store, progress=False).run(stage, None)
    out = read_cell(store, stage.cells(None)[0].dir).to_pylist()
    lost = {r["id"]: r["error"] for r in out if r["id"] in ("d010", "d020")}
    assert set(lost) == {"d010", "d020"} and all("no output" in e for e in lost.values())
    assert rep.rows == 60 and rep.errors == 8


def test_failed_cell_is_marked_and_reported(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    stage = EchoStage(ROWS, boom=True, tag="boom")
    with pytest.raises(StageFailed, match="model exploded"):
        Runner(store, progress=False).run(stage, None)
    st = cell_state(store, stage.cells(None)[0].dir)
    assert st["state"] == "failed" and "model exploded" in st["message"]


def test_duplicate_ids_and_shard_count_change_are_refused(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    with pytest.raises(StageFailed, match="duplicate record id"):
        Runner(store, progress=False).run(EchoStage(ROWS + ROWS[:2], tag="dup"), None)
    Runner(store, progress=False).run(EchoStage(ROWS, n_shards=3, tag="n"), None)
    cell = EchoStage(ROWS, n_shards=3, tag="n").cells(None)[0]
    store.delete(f"{cell.dir}/_manifest.json")  # as if killed before the end
    with pytest.raises(StageFailed, match="started with 3 shards"):
        Runner(store, progress=False).run(EchoStage(ROWS, n_shards=4, tag="n"), None)



def test_xling_status_shows_done_partial_failed(ray_local, tmp_path):
    import subprocess
    import sys

    store = RunStore(str(tmp_path / "run"))
    Runner(store, progress=False).run(EchoStage(ROWS, tag="good"), None)
    with pytest.raises(StageFailed):
        Runner(store, progress=False).run(EchoStage(ROWS, boom=True, tag="bad"), None)
    half = EchoStage(ROWS, drop={"d001"}, tag="half")
    Runner(store, progress=False).run(half, None)
    cell = half.cells(None)[0]
    # As a driver killed after 3 of 5 shard commits leaves it: no manifest, 3 markers.
    store.delete(f"{cell.dir}/_manifest.json")
    for rel in sorted(p for p in store.list(f"{cell.dir}/_shards"))[3:]:
        store.delete(rel)
    res = subprocess.run([sys.executable, "-m", "xling.cli", "status", store.url()],
                         capture_output=True, text=True, check=True)
    lines = {l.split()[1].split(".")[0]: l.split() for l in res.stdout.splitlines()[2:]}
    assert lines["good"][2:6] == ["done", "5/5", "60", "6"]
    assert lines["bad"][2:4] == ["failed", "0/5"] and "model exploded" in " ".join(lines["bad"])
    assert lines["half"][2:4] == ["partial", "3/5"]
    # And the partial cell resumes: only the two missing shards run.
    [rep] = Runner(store, progress=False).run(half, None)
    assert rep.state == "done" and rep.shards_run == 2 and rep.rows == 60


class TwoGroupStage(EchoStage):
    """Two cells partitioned together but processed in separate groups (pipelines)."""

    def cells(self, cfg):
        return [Cell("echo", {"set": t}, {"v": 1}, inputs=["<memory>"], n_shards=3)
                for t in ("first", "second")]

    def read(self, cell, cfg):
        import ray.data

        tag = cell.key["set"]
        return ray.data.from_items([{"_rid": f"{tag}-{r['id']}", "id": f"{tag}-{r['id']}",
                                     "text": r["text"]} for r in self.rows])

    def group(self, cell):
        return cell.key["set"]


def test_each_group_commits_its_own_rows(ray_local, tmp_path):
    # Regression: `_cell` stored at partition time indexed all fresh cells, while the second
    # group's pipeline indexes its own cells from 0, so its rows were committed to the first.
    store = RunStore(str(tmp_path / "run"))
    stage = TwoGroupStage(ROWS[:20])
    Runner(store, progress=False).run(stage, None)
    for cell in stage.cells(None):
        ids = read_cell(store, cell.dir)["id"].to_pylist()
        assert sorted(ids) == sorted(f"{cell.key['set']}-{r['id']}" for r in ROWS[:20])
