"""The stage contract on local Ray: shards, commits, skip, --force, error rows, lost rows.

A small scripted stage stands in for a model here because what is under test is the
runner's control flow; the real stages and engines have their own integration tests.
"""

import pyarrow as pa
import pytest

from xling.core.cells import Cell, Stage, StageFailed
from xling.core.commit import shard_of
from xling.core.runner import Runner
from xling.core.status import cell_state, read_cell
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
    from helpers import here

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
    res = here("status", store.url())
    assert res.returncode == 0, res.stderr
    lines = {l.split()[1].split(".")[0]: l.split() for l in res.stdout.splitlines()[2:]}
    assert lines["good"][2:6] == ["done", "5/5", "60", "6"]
    assert lines["bad"][2:4] == ["failed", "0/5"] and "model exploded" in " ".join(lines["bad"])
    assert lines["half"][2:4] == ["partial", "3/5"]
    # And the partial cell resumes: only the two missing shards run.
    [rep] = Runner(store, progress=False).run(half, None)
    assert rep.state == "done" and rep.shards_run == 2 and rep.rows == 60
    # A mistyped run root is an error that creates nothing.
    missing = tmp_path / "rnu"
    res = here("status", str(missing))
    assert res.returncode == 2 and "no run root at" in res.stderr and not missing.exists()


def test_limit_cuts_every_input_for_a_smoke_run(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    stage = EchoStage(ROWS, tag="smoke")
    [rep] = Runner(store, progress=False, limit=7).run(stage, None)
    out = read_cell(store, stage.cells(None)[0].dir)
    assert rep.state == "done" and rep.rows == 7 and out.num_rows == 7
    assert len(set(out["id"].to_pylist())) == 7 and set(out["id"].to_pylist()) <= {
        r["id"] for r in ROWS}


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


# ------------------------------------------------------------------------------------------
# Distributed commit, shared partitions, groups side by side


BIG = [{"id": f"b{i:04d}", "text": f"{i} " + "x" * 2000} for i in range(1500)]


def test_driver_receives_only_metadata(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    stage = EchoStage(BIG, n_shards=4, tag="big")
    runner = Runner(store, progress=False)
    runner.run(stage, None)
    cell = stage.cells(None)[0]
    m = store.read_json(f"{cell.dir}/_manifest.json")
    out = read_cell(store, cell.dir)
    assert sorted(out["id"].to_pylist()) == [r["id"] for r in BIG]
    text_bytes = sum(len(r["text"]) for r in BIG) * 2  # text and its upper-case copy
    pieces = sum(s["pieces"] for s in (store.read_json(p) for p in
                                       store.list(f"{cell.dir}/_shards")))
    # O(metadata): an 8-byte id hash per row, plus a file name and counts per piece.
    assert 0 < m["driver_bytes"] <= 16 * len(BIG) + 256 * pieces
    assert m["driver_bytes"] < text_bytes / 50


class SharedSourceStage(EchoStage):
    """Two cells (say, two target languages) that read the same rows."""

    def cells(self, cfg):
        return [Cell("echo", {"set": t}, {"v": 1}, inputs=["<memory>"], n_shards=3)
                for t in ("en", "de")]

    def source(self, cell, cfg):
        from xling.core.cells import Source

        return Source({"rows": "ROWS[:30]"}, lambda: EchoStage.read(self, cell, cfg))


def test_cells_reading_one_source_share_one_partition(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    stage = SharedSourceStage(ROWS[:30])
    Runner(store, progress=False).run(stage, None)
    parts = {p.split("/")[1] for p in store.list("_partitions")}
    assert len(parts) == 1  # read and written once for both cells
    for cell in stage.cells(None):
        m = store.read_json(f"{cell.dir}/_manifest.json")
        assert m["inputs"]["partition"] == f"_partitions/{next(iter(parts))}"
        assert sorted(read_cell(store, cell.dir)["id"].to_pylist()) == \
            [r["id"] for r in ROWS[:30]]
        assert not store.list(f"{cell.dir}/_input")


def _as_input(batch: pa.Table) -> pa.Table:
    return pa.table({"_rid": batch["id"], "id": batch["id"], "text": batch["out"],
                     "error": batch["error"]})


class DownstreamStage(EchoStage):
    """Reads the committed output of an EchoStage cell, as index reads translations."""

    def __init__(self, store: RunStore, upstream: str, n_shards: int, tag: str):
        super().__init__([], n_shards=n_shards, tag=tag)
        self.store, self.upstream = store, upstream

    def source(self, cell, cfg):
        from xling.core.cells import Source

        def read():
            import ray.data

            files = [self.store.fs_path(f"{self.upstream}/{f}") for f in
                     self.store.read_json(f"{self.upstream}/_manifest.json")["files"]]
            return ray.data.read_parquet(files, filesystem=self.store.fs).map_batches(
                lambda b: b.append_column("_rid", b["id"]), batch_format="pyarrow")

        return Source({"cell": self.upstream}, read, adapt=_as_input, cell=self.upstream)


def test_a_committed_cell_is_read_as_the_partition(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    up = EchoStage(ROWS, n_shards=5, tag="up")
    Runner(store, progress=False).run(up, None)
    up_dir = up.cells(None)[0].dir
    # Same shard count: the upstream part files are the partition, nothing is copied.
    same = DownstreamStage(store, up_dir, 5, "same")
    Runner(store, progress=False).run(same, None)
    cell = same.cells(None)[0]
    m = store.read_json(f"{cell.dir}/_manifest.json")
    assert m["inputs"]["partition"] == up_dir and not store.list("_partitions")
    out = {r["id"]: r["out"] for r in read_cell(store, cell.dir).to_pylist()}
    assert out["d001"] == "TEXT 1" and len(out) == len(ROWS)
    # Another shard count: the rows are partitioned as usual.
    other = DownstreamStage(store, up_dir, 3, "other")
    Runner(store, progress=False).run(other, None)
    m = store.read_json(f"{other.cells(None)[0].dir}/_manifest.json")
    assert m["inputs"]["partition"].startswith("_partitions/")
    assert m["rows"] == len(ROWS)


def _block_sizes(batch: pa.Table) -> pa.Table:
    """The map sees each block whole (batch_size=None): note its rows and shards."""
    from xling.core.cells import SHARD

    shards = len(set(batch[SHARD].to_pylist()))
    return _upper(batch).append_column("block", pa.array([[batch.num_rows, shards]] *
                                                         batch.num_rows))


class BlockStage(EchoStage):
    """Reads its partition in blocks of 8 rows, as ingest, index and narrow read theirs."""

    def read(self, cell, cfg):
        import ray.data

        # two source blocks: partition files of ~10 rows each shard
        return ray.data.from_items([{"_rid": r["id"], **r} for r in self.rows],
                                   override_num_blocks=2)

    def read_block_rows(self, cells, cfg):
        return 8

    def map(self, ds, cells, cfg):
        from xling.core.pools import LIGHT_CPUS

        return ds.map_batches(_block_sizes, batch_format="pyarrow", batch_size=None,
                              num_cpus=LIGHT_CPUS)


def test_partition_read_in_blocks_of_the_stage_rows_in_one_task_per_file(ray_local, tmp_path,
                                                                          monkeypatch):
    """`read_block_rows`: one fused task per partition file reads, tags and cuts its rows
    into blocks of at most that many rows, each of one shard (a split read would run every
    block as a task of its own before the pool); every row arrives once."""
    monkeypatch.setenv("XLING_STREAM_STATS", "1")
    store = RunStore(str(tmp_path / "run"))
    stage = BlockStage(ROWS, n_shards=3, tag="blocks")
    runner = Runner(store, progress=False)
    runner.run(stage, None)
    cell = stage.cells(None)[0]
    out = read_cell(store, cell.dir)
    assert sorted(out["id"].to_pylist()) == [r["id"] for r in ROWS]
    blocks = [b for b in out["block"].to_pylist()]
    assert max(rows for rows, _ in blocks) == 8 and {shards for _, shards in blocks} == {1}
    stats = runner.streams[-1]["stats"]
    read = next(line for line in stats.splitlines() if "ReadParquet" in line)
    assert "ReadParquet->MapBatches(_tag_rows)->StreamingRepartition" in read, stats
    files = sum(len(s["files"]) for s in store.read_json(
        f"{store.read_json(f'{cell.dir}/_manifest.json')['inputs']['partition']}"
        "/_done.json")["shards"].values())
    assert f": {files} tasks executed" in read, stats


class Sleeper:
    """An actor that notes when it was alive (files, so the test sees both pools)."""

    def __init__(self, log_dir: str, group: str):
        import os
        import time

        self.path = os.path.join(log_dir, f"{group}-{os.getpid()}")
        with open(self.path + ".start", "w") as f:
            f.write(str(time.time()))

    def __call__(self, batch: pa.Table) -> pa.Table:
        import time

        time.sleep(0.3)
        with open(self.path + ".last", "w") as f:
            f.write(str(time.time()))
        return _upper(batch)


class TwoPoolStage(TwoGroupStage):
    def __init__(self, rows, log_dir, num_cpus):
        super().__init__(rows)
        self.log_dir, self.num_cpus = log_dir, num_cpus

    def map(self, ds, cells, cfg):
        import ray.data

        return ds.map_batches(Sleeper, batch_format="pyarrow", batch_size=4,
                              fn_constructor_args=(self.log_dir, cells[0].key["set"]),
                              compute=ray.data.ActorPoolStrategy(size=1), num_cpus=self.num_cpus)

    def resources(self, cells, cfg):
        return {"CPU": self.num_cpus}


def _lifetimes(log_dir):
    import glob

    out = {}
    for start in glob.glob(f"{log_dir}/*.start"):
        group = start.rsplit("/", 1)[1].split("-")[0]
        last = start[:-len(".start")] + ".last"
        out[group] = (float(open(start).read()), float(open(last).read()))
    return out


def test_groups_that_fit_run_side_by_side(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    log_dir = tmp_path / "alive"
    log_dir.mkdir()
    runner = Runner(store, progress=False)
    runner.run(TwoPoolStage(ROWS[:24], str(log_dir), 0.5), None)
    life = _lifetimes(log_dir)
    (a0, a1), (b0, b1) = life["first"], life["second"]
    assert runner.concurrent_groups == 2
    assert a0 < b1 and b0 < a1  # the two model pools were alive at the same time
    for cell in TwoPoolStage(ROWS[:24], "", 0.5).cells(None):
        assert len(read_cell(store, cell.dir)) == 24


def test_groups_that_do_not_fit_queue(ray_local, tmp_path):
    store = RunStore(str(tmp_path / "run"))
    log_dir = tmp_path / "alive"
    log_dir.mkdir()
    runner = Runner(store, progress=False)
    import ray

    half = ray.cluster_resources()["CPU"] / 2  # 2 x (half + 0.5) CPUs > the cluster's
    runner.run(TwoPoolStage(ROWS[:12], str(log_dir), half), None)
    assert runner.concurrent_groups == 1
    assert set(_lifetimes(log_dir)) == {"first", "second"}


def test_idle_workers_are_kept_for_the_next_tasks(ray_local):
    """The node keeps idle workers (core/runtime.py worker_reuse): six zero-CPU tasks held
    together at a barrier (so six workers, more than the node's CPUs) run again after Ray's
    default 1 s idle timeout on the same worker processes instead of new ones."""
    import os
    import time

    import ray

    @ray.remote(num_cpus=0)
    class Barrier:
        def __init__(self):
            self.n = 0

        def arrive(self) -> int:
            self.n += 1
            return self.n

        def count(self) -> int:
            return self.n

    @ray.remote(num_cpus=0)
    def pid(barrier, n: int) -> int:
        ray.get(barrier.arrive.remote())
        deadline = time.time() + 120
        while ray.get(barrier.count.remote()) < n and time.time() < deadline:
            time.sleep(0.1)
        return os.getpid()

    def round_of_six() -> set[int]:
        barrier = Barrier.remote()
        return set(ray.get([pid.remote(barrier, 6) for _ in range(6)]))

    first = round_of_six()
    time.sleep(3)
    assert len(first) == 6 and round_of_six() == first


# ------------------------------------------------------------------------------------------
# Groups beside a shared engine's hosts (core/hosts.py)


class Holder:
    """Stands in for an EngineHost: it only holds CPUs, as a host's engine does."""

    def ping(self) -> bool:
        return True


class HostedPoolStage(TwoPoolStage):
    """Group "first" forwards to a shared engine (no CPU of its own), "second" does not."""

    def __init__(self, rows, log_dir, spec):
        super().__init__(rows, log_dir, 1.0)
        self.spec = spec

    def engine_of(self, cells, cfg):
        return self.spec if cells[0].key["set"] == "first" else None

    def map(self, ds, cells, cfg):
        import ray.data

        cpus = 0 if cells[0].key["set"] == "first" else self.num_cpus
        return ds.map_batches(Sleeper, batch_format="pyarrow", batch_size=4,
                              fn_constructor_args=(self.log_dir, cells[0].key["set"]),
                              compute=ray.data.ActorPoolStrategy(size=1), num_cpus=cpus)


def test_groups_beside_shared_engine_hosts(ray_local, tmp_path):
    """The group that uses a live host runs first; the other cannot start beside what the
    host holds, so once nothing runs, the idle host is stopped and the group runs (without
    that, its pool waited for the CPUs forever)."""
    import ray

    from xling.core.hosts import host_key, plan_hosts, sharing
    from xling.core.llm import parse_llm_spec

    spec = parse_llm_spec({"name": "chat", "model": "org/chat"})
    hosts = plan_hosts([("echo", [spec]), ("judge", [spec])])
    # What a host may hold: all but the one CPU the stages' tasks need (hosts._start).
    held = ray.cluster_resources()["CPU"] - 1
    holder = ray.remote(Holder).options(num_cpus=held).remote()
    assert ray.get(holder.ping.remote())
    hosts.live[host_key(spec)], hosts.holds[host_key(spec)] = [holder], {"CPU": held}
    hosts.stage_start("echo")
    log_dir = tmp_path / "alive"
    log_dir.mkdir()
    lines = []
    runner = Runner(RunStore(str(tmp_path / "run")), progress=False, detail=lines.append)
    with sharing(hosts):
        runner.run(HostedPoolStage(ROWS[:12], str(log_dir), spec), None)
        assert not hosts.live  # stopped to make room
    life = _lifetimes(log_dir)
    assert life["first"][1] < life["second"][0]  # the host's group first, then the other
    assert any("stopped idle shared engines" in line for line in lines)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(holder.ping.remote())
    for cell in HostedPoolStage(ROWS[:12], "", spec).cells(None):
        assert len(read_cell(RunStore(str(tmp_path / "run")), cell.dir)) == 12
