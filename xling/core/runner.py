"""The stage runner, on the driver: skip what is done, partition each cell's input, stream
its pending shards through the stage's pipeline, commit shard by shard, finish the cell.
Split by concern: what a stage and a cell are (core/cells.py), the commit protocol's worker
tasks (core/commit.py), reading a run root's state (core/status.py), and this module.

Layout of one cell (all under `{run_root}/{stage}/{cell_id}/`):

    _plan.json              what the cell is (key, params, hash, shard count); written first
    _tmp/<run_id>/...       output pieces written by workers of the current run (never read
                            by anything but the shard's commit task)
    part-NNNNN.parquet      committed output of shard NNNNN
    _shards/NNNNN.json      shard NNNNN is committed: file, rows, errors, run id, times
    _failed.json            the last run of this cell raised; cleared when the cell finishes
    _manifest.json          written last: the cell is done (config, hash, code version,
                            input fingerprints, row and error counts, timings)

and of its input, the partition (`Source` says whose):

    _partitions/<hash>/     a source's rows split by shard, shared by every cell (of any
                            stage) that reads the same source with the same shard count:
                            `_done.json` (rows, fingerprint per shard) + NNNNN/*.parquet
    {cell}/_input/          the same, for a stage that declares no source
    {upstream cell}/        a committed cell's part files, read in place as the partition

A record's shard is a stable hash of its id (`_rid`) modulo the shard count, so the same input
always lands in the same shard. Workers write their output; the driver receives metadata
only and commits a shard once all its records are out. A killed run leaves committed shards
alone; the next run redoes only shards without a marker, and overwrites their deterministic
output names, so nothing is duplicated.

Why not Ray Data's `DataContext.checkpoint_config`: it checkpoints by row id inside one Ray
Data pipeline and resumes that pipeline, but it cannot express our unit of commitment (a
shard whose rows were all produced, with a manifest that other stages and `xling status`
read), and it offers no place for input fingerprints or per-shard counts.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from xling.core.cells import (
    CELL,
    RID,
    Cell,
    Source,
    Stage,
    StageFailed,
    code_version,
    describe_error,
    now,
)
from xling.core.commit import (
    _commit_shard,
    _read_sources,
    _tag_cell,
    _tag_rows,
    _write_pieces,
    _write_shards,
)
from xling.core.config import stable_hash
from xling.core.integrity import check_sizes, marker_shard
from xling.core.pools import LIGHT_CPUS, store_budget
from xling.core.provenance import provenance
from xling.core.status import cell_state, committed_shards
from xling.core.store import RunStore

if TYPE_CHECKING:
    from xling.config import XlingConfig

# ---------------------------------------------------------------------------------------
# the runner


@dataclass
class CellReport:
    cell: Cell
    state: str  # done | skipped | failed
    rows: int = 0
    errors: int = 0
    shards_run: int = 0
    shards_total: int = 0
    seconds: float = 0.0
    message: str = ""


@dataclass
class _Shard:
    """Driver-side state of one shard in flight: its output pieces and the ids seen."""

    pieces: list[str] = field(default_factory=list)
    seen: set = field(default_factory=set)
    started: float = field(default_factory=time.time)


class Runner:
    """`log` gets the stage lines (start, end, failures); `detail` the per-cell lines
    (inputs, shards, commits, skips), `log` when not given. The CLI sends `detail` to the
    run's log file, and to the console only with -v (see core/logs.py)."""

    def __init__(self, store: RunStore, *, force: bool = False, progress: bool = True,
                 log=print, detail=None, limit: int | None = None):
        self.store = store
        self.force = force
        self.limit = limit  # smoke runs: each partition keeps its first `limit` records
        self.progress = progress
        self.log = log
        self.detail = detail or log
        self._progress = None  # the running stage's Progress (shared by its groups)
        self.run_id = f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
        self.driver_bytes: dict[str, int] = {}  # cell id -> metadata bytes the driver received
        self.concurrent_groups = 0  # the most groups that ran at once (for tests and logs)
        # Per processed group: when it started, when its first output reached the driver
        # (with how many records), when it ended, and each operator's busy seconds, from
        # which benchmarks read the steady-state rate.
        self.streams: list[dict] = []
        # Per stage: where the wait for its first output went (see `run`).
        self.startup: dict[str, dict] = {}
        self._schemas: dict[str, bytes] = {}  # folder -> its Parquet files' schema

    # ---- public --------------------------------------------------------------------
    def plan(self, stage: Stage, cfg: XlingConfig) -> list[dict]:
        """What a run would do, without starting Ray or writing anything."""
        return [self.describe(cell) for cell in stage.cells(cfg)]

    def describe(self, cell: Cell, inputs: dict[str, str] | None = None) -> dict:
        """A cell's state and what a run would do with it; `inputs` are the plan's edges
        (role -> upstream cell dir), listed after the cell's own inputs."""
        state = cell_state(self.store, cell.dir)
        todo = "nothing (done)" if state["state"] == "done" and not self.force else (
            f"{cell.n_shards - state['shards_done']} of {cell.n_shards} shards"
            if not self.force else f"all {cell.n_shards} shards (--force)")
        edges = [f"{role}: {self.store.url(d)}" for role, d in (inputs or {}).items()
                 if d not in cell.inputs]
        return {"cell": cell.id, "dir": self.store.url(cell.dir), "state": state["state"],
                "shards_done": state["shards_done"], "n_shards": cell.n_shards,
                "todo": todo, "inputs": [*cell.inputs, *edges]}

    def run(self, stage: Stage, cfg: XlingConfig | list) -> list[CellReport]:
        """Run every cell of a stage: skip done ones, partition, process, commit, finish.

        `cfg` may be a list of configs (the grid points of a sweep): their cells run
        together, so a model that serves several grid points is loaded once.
        """
        import ray.data

        # Ray 2.60's datasource v2 lists explicit file paths in one ListFiles task that took
        # 60 s for 464 shard files here (130 ms a file); v1 reads the same files in 8 s.
        ctx = ray.data.DataContext.get_current()
        ctx.use_datasource_v2 = False
        # Start mapping only once each pool's minimum of actors is up, so work spreads over
        # them (and nodes) from the first batch; a pool that cannot start fails with Ray's
        # "Timed out while starting actors" instead of waiting silently. 30 min leaves room
        # for a cloud autoscaler to bring up GPU nodes.
        ctx.wait_for_min_actors_s = 1800
        # Workers commit their own output, so the stream need not arrive in order, and one
        # slow batch holds up nothing behind it.
        ctx.execution_options.preserve_order = False
        # A bounded object store: what is in flight, not the corpus (core/pools.py).
        ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(
            object_store_memory=store_budget())
        t0, first_stream = time.time(), len(self.streams)
        reports: dict[str, CellReport] = {}
        cells, cfg_of = [], {}
        for c in cfg if isinstance(cfg, list) else [cfg]:
            for cell in stage.cells(c):
                if cell.id not in cfg_of:
                    cells.append(cell)
                    cfg_of[cell.id] = c
        todo = []
        for cell in cells:
            manifest = self.store.read_json_or_none(f"{cell.dir}/_manifest.json")
            if manifest and not self.force:
                self.detail(f"[{stage.name}] {cell.id}: done earlier ({manifest['rows']} rows, "
                            f"{manifest['errors']} errors), skipped")
                reports[cell.id] = CellReport(cell, "skipped", manifest["rows"],
                                              manifest["errors"], 0, manifest["n_shards"])
            else:
                todo.append(cell)
        skipped = len(cells) - len(todo)
        # One console line per stage: this one when nothing runs, else the closing line
        # (the progress bar shows that it started).
        (self.detail if todo else self.log)(
            f"[{stage.name}] {len(cells)} cell(s), all already done (skipped)" if not todo
            else f"[{stage.name}] {len(cells)} cell(s): {len(todo)} to run"
            + (f", {skipped} already done (skipped)" if skipped else ""))
        t_prepare = time.time()
        try:
            inputs = self._prepare(stage, todo, cfg_of, reports)
        except Exception as e:  # e.g. a source that cannot be read: those cells fail
            inputs = {}
            for cell in todo:
                if cell.id not in reports:
                    self._fail(stage, cell, e, reports)
        ready = [c for c in todo if c.id in inputs and c.id not in reports]
        groups: dict[tuple, list[Cell]] = {}
        for cell in ready:
            key = (stage.group(cell), stage.pool_key(cell, cfg_of[cell.id]))
            groups.setdefault(key, []).append(cell)
        from xling.core.logs import Progress

        # Off a terminal, a line at most every 15 s; the closing line below has the totals.
        self._progress = Progress(sum(self._pending_rows(c, inputs[c.id]) for c in ready),
                                  stage.name, enabled=self.progress and bool(ready),
                                  min_gap_s=15.0, final_line=False)
        try:
            self._run_groups(stage, list(groups.values()), cfg_of, inputs, reports)
        finally:
            self._progress.close()
        for cell in ready:
            if cell.id not in reports:
                try:
                    reports[cell.id] = self._finish(stage, cell, inputs[cell.id], t0,
                                                    cfg_of[cell.id])
                except Exception as e:
                    self._fail(stage, cell, e, reports)
        ordered = [reports[c.id] for c in cells]
        failed = [r for r in ordered if r.state == "failed"]
        ran = [r for r in ordered if r.state == "done"]
        if ran:
            skipped = len(ordered) - len(ran) - len(failed)
            # Start-up (Ray Data's planning, the pools' model loads) is what comes before
            # the first output: the part of the stage's time that does not grow with data.
            streams = [st for st in self.streams[first_stream:] if st["first_output"]]
            startup = ""
            if streams:
                first = min(streams, key=lambda st: st["first_output"])
                # where it waited: planning and partitioning the inputs, then the pipeline's
                # start (executor, actor pools, model loads) until its first output
                self.startup[stage.name] = {
                    "first_output_s": round(first["first_output"] - t0, 2),
                    "plan_s": round(t_prepare - t0, 2),
                    "partition_s": round(first["started"] - t_prepare, 2),
                    "pipeline_s": round(first["first_output"] - first["started"], 2)}
                startup = (f" (first output after {first['first_output'] - t0:.0f}s: "
                           f"{first['started'] - t0:.0f}s before the pipeline (inputs, shared "
                           f"engines), {first['first_output'] - first['started']:.0f}s in it)")
            self.log(f"[{stage.name}] committed {len(ran)} cell(s): "
                     f"{sum(r.rows for r in ran):,} rows, {sum(r.errors for r in ran):,} errors, "
                     f"{time.time() - t0:.0f}s{startup}, {self._progress.summary()}"
                     + (f"; {skipped} already done" if skipped else "")
                     + f" -> {self.store.url(stage.name)}")
        if failed:
            raise StageFailed(f"{stage.name}: {len(failed)} of {len(ordered)} cell(s) failed: "
                              + "; ".join(f"{r.cell.id}: {r.message}" for r in failed))
        return ordered

    def _pending_rows(self, cell: Cell, info: dict) -> int:
        """Input records of the cell's shards that are not committed (the progress total)."""
        done = {marker_shard(p) for p in self.store.list(f"{cell.dir}/_shards")}
        return sum(v["rows"] for s, v in info["shards"].items() if int(s) not in done)

    def _fail(self, stage: Stage, cell: Cell, e: BaseException, reports: dict) -> None:
        from xling.core.lease import stop_if_lost

        stop_if_lost(self.store)  # a driver that was taken over stops, marking nothing
        message = describe_error(e)
        self.store.write_json(f"{cell.dir}/_failed.json", {
            "run_id": self.run_id, "at": now(), "error": message,
            "traceback": "".join(traceback.format_exception(e))})
        self.log(f"[{stage.name}] {cell.id}: FAILED: {message}")
        reports[cell.id] = CellReport(cell, "failed", message=message)

    # ---- groups side by side ---------------------------------------------------------
    def _run_groups(self, stage: Stage, groups: list[list[Cell]], cfg_of: dict,
                    inputs: dict, reports: dict) -> None:
        """Process the groups (one pipeline and actor pool each), concurrently where their
        resources fit in the cluster together; the others queue. A group that does not fit
        even alone runs by itself (an autoscaler may add the nodes it waits for).

        The run's engine hosts (core/hosts.py) hold their CPUs and GPUs across groups and
        stages, outside Ray Data's view: they count as taken, groups that would start one
        go last (so it outlives the stage with nothing queued behind it), and when a group
        cannot start for what idle hosts hold, they are stopped (a later stage that
        shares them starts them again)."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        from xling.core.hosts import active_hosts

        if not groups:
            return
        hosts = active_hosts()
        if len(groups) == 1 and hosts is None:
            self._run_group(stage, groups[0], cfg_of, inputs, reports)
            return
        import ray

        total = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        log_release = functools.partial(
            self.detail, f"[{stage.name}] stopped idle shared engines (the farthest next use "
                         "first) to make room for the next group; each starts again at its "
                         "next use")

        def engine(gi: int):  # the shared engine the group's pool forwards to, if any
            if hosts is None:
                return None
            spec = stage.engine_of(groups[gi], cfg_of[groups[gi][0].id])
            return spec if spec is not None and hosts.shares(spec) else None

        def demand(gi: int) -> dict:  # asked again: a group's host may have started since
            spec = engine(gi)
            if spec is not None and hosts.is_live(spec):  # counted in hosts.held()
                return _with_tasks({})
            return _with_tasks(stage.resources(groups[gi], cfg_of[groups[gi][0].id]))

        def fits(gi: int, running: dict) -> bool:
            taken = dict(hosts.held()) if hosts is not None else {}
            for other in running.values():
                for k, v in demand(other).items():
                    taken[k] = taken.get(k, 0) + v
            return all(v <= total.get(k, 0) - taken.get(k, 0) + 1e-9
                       for k, v in demand(gi).items())

        if len(groups) == 1:  # on this thread, so that Ctrl-C stops it
            if not fits(0, {}) and hosts.release(keep=engine(0), until=lambda: fits(0, {})):
                log_release()
            self._run_group(stage, groups[0], cfg_of, inputs, reports)
            return
        queue, running = list(range(len(groups))), {}
        if hosts is not None:  # groups that would start a host last, those that use one first
            queue.sort(key=lambda gi: (engine(gi) is not None)
                       - 2 * (engine(gi) is not None and hosts.is_live(engine(gi))))
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            while queue or running:
                for gi in list(queue):
                    if not fits(gi, running):
                        if running:
                            continue
                        if hosts is not None and hosts.release(
                                keep=engine(gi), until=functools.partial(fits, gi, running)):
                            log_release()
                    running[pool.submit(self._run_group, stage, groups[gi], cfg_of, inputs,
                                        reports)] = gi
                    queue.remove(gi)
                self.concurrent_groups = max(self.concurrent_groups, len(running))
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in done:
                    running.pop(fut)

    def _run_group(self, stage: Stage, cells: list[Cell], cfg_of: dict, inputs: dict,
                   reports: dict) -> None:
        self.concurrent_groups = max(self.concurrent_groups, 1)
        try:
            self._process(stage, cells, cfg_of[cells[0].id], inputs)
        except Exception as e:  # committed shards stay; the cells are marked failed
            for cell in cells:
                self._fail(stage, cell, e, reports)

    # ---- steps ---------------------------------------------------------------------
    def _prepare(self, stage: Stage, cells: list[Cell], cfg_of: dict,
                 reports: dict) -> dict[str, dict]:
        """Plan every cell and find (or make) the partition of its input.

        Returns {cell id: input info}; a cell whose input is bad (empty, duplicate ids, a
        changed shard count) is marked failed here and left out, so the others still run.
        """
        out, fresh = {}, {}
        for cell in cells:
            if self.force:
                self.store.delete_tree(cell.dir)
            try:
                self._write_plan(cell)
            except StageFailed as e:
                self._fail(stage, cell, e, reports)
                continue
            source = stage.source(cell, cfg_of[cell.id])
            if source is None:  # a partition of the cell's own
                source = Source({"cell": cell.dir}, functools.partial(stage.read, cell,
                                                                      cfg_of[cell.id]))
                where = f"{cell.dir}/_input"
            else:
                where = "_partitions/" + stable_hash({"source": source.key,
                                                      "n_shards": cell.n_shards}, 16)
            info = self._upstream_partition(source, cell) if source.cell else None
            info = info or self.store.read_json_or_none(f"{where}/_done.json")
            if info:
                out[cell.id] = {**info, "adapt": source.adapt}
            else:
                fresh.setdefault(where, (source, []))[1].append(cell)
        if fresh:
            made = self._partition(stage, fresh, reports)
            for where, (source, group) in fresh.items():
                for cell in group:
                    if where in made and cell.id not in reports:
                        out[cell.id] = {**made[where], "adapt": source.adapt}
        return out

    def _upstream_partition(self, source: Source, cell: Cell) -> dict | None:
        """A committed cell's part files as this cell's partition, without a copy: shard s
        is its part-s when the shard counts match (records shard by the same id hash)."""
        manifest = self.store.read_json_or_none(f"{source.cell}/_manifest.json")
        if not manifest or manifest["n_shards"] != cell.n_shards:
            return None
        check_sizes(self.store, source.cell, manifest)
        ins, files = manifest["inputs"]["shards"], set(manifest["files"])
        shards = {s: {"rows": v["rows"], "fingerprint": v["fingerprint"],
                      "files": [f"{source.cell}/part-{int(s):05d}.parquet"]}
                  for s, v in ins.items() if f"part-{int(s):05d}.parquet" in files}
        if sum(v["rows"] for v in shards.values()) != manifest["rows"]:
            return None  # not one output row per input record: partition it instead
        return {"rows": manifest["inputs"]["rows"], "fingerprint": manifest["inputs"]["fingerprint"],
                "shards": shards, "partition": source.cell, "upstream": True}

    def _write_plan(self, cell: Cell) -> None:
        path = f"{cell.dir}/_plan.json"
        plan = self.store.read_json_or_none(path)
        if plan and plan["n_shards"] != cell.n_shards:
            raise StageFailed(
                f"cell {cell.id} was started with {plan['n_shards']} shards but the config now says "
                f"{cell.n_shards}. Finish it with shards={plan['n_shards']} or redo it with --force.")
        if not plan:
            self.store.write_json(path, {"stage": cell.stage, "cell": cell.id, "key": cell.key,
                                         "params": cell.params, "hash": cell.hash,
                                         "n_shards": cell.n_shards, "inputs": cell.inputs,
                                         "created_at": now()})

    def _partition(self, stage: Stage, fresh: dict[str, tuple[Source, list[Cell]]],
                   reports: dict) -> dict[str, dict]:
        """Split each distinct source into shard files under its partition dir, all in one
        Ray Data pipeline; a source that several cells read is read and written once."""
        wheres = list(fresh)
        for where in wheres:
            self.store.delete_tree(where)
        # Sources that are files read one by one go through one operator together (each
        # operator is visited at every step of Ray Data's scheduler: one per source made a
        # stage of many small sources spend its driver's CPU there); a smoke run's `limit`
        # is per source, so it reads each on its own.
        items = [] if self.limit else [
            {**item, CELL: i} for i, w in enumerate(wheres) if fresh[w][0].read_files
            for item in fresh[w][0].read_items()]
        readers = {i: fresh[wheres[i]][0].read_files for i in {it[CELL] for it in items}}
        parts = []
        if items:
            import ray.data

            parts.append(ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
                _read_sources, batch_size=1, batch_format="pyarrow",
                fn_kwargs={"readers": readers}))
        for i, where in enumerate(wheres):
            if i not in readers:
                read = fresh[where][0].read()
                read = read.limit(self.limit) if self.limit else read
                parts.append(read.map_batches(functools.partial(_tag_cell, index=i),
                                              batch_format="pyarrow"))
        ds = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
        writer = functools.partial(_write_shards, store=self.store, dirs=wheres,
                                   n_shards=[fresh[w][1][0].n_shards for w in wheres])
        # Whole blocks, not small batches: every file written here is a read task later, and
        # on small machines a read task costs more than the rows in a small file.
        written = ds.map_batches(writer, batch_format="pyarrow", batch_size=None).take_all()
        pieces: dict[tuple[int, int], list[dict]] = {}
        for w in written:
            pieces.setdefault((int(w["cell"]), int(w["shard"])), []).append(w)
        out = {}
        for i, where in enumerate(wheres):
            shards, total, acc, dups = {}, 0, 0, 0
            for s in sorted(s for (c, s) in pieces if c == i):
                ps = pieces[(i, s)]
                # Equal ids hash to the same shard, so uniqueness is checked shard by shard.
                hashes = np.concatenate([np.asarray(p["rids"], dtype=np.uint64) for p in ps])
                dups += len(hashes) - len(np.unique(hashes))
                xor = functools.reduce(lambda a, b: a ^ b, (int(p["xor"]) for p in ps), 0)
                shards[str(s)] = {"rows": len(hashes), "fingerprint": f"{len(hashes)}:{xor:016x}",
                                  "files": sorted(p["path"] for p in ps)}
                total += len(hashes)
                acc ^= xor
            try:
                if dups:
                    files = [f for v in shards.values() for f in v["files"]]
                    ids = self.store.read_parquet(files, columns=[RID])[RID].to_pylist()
                    seen, examples = set(), []
                    for r in ids:
                        if r in seen and len(examples) < 5:
                            examples.append(r)
                        seen.add(r)
                    raise StageFailed(f"input has {dups} duplicate record id(s), e.g. "
                                      f"{examples}; ids must be unique within a cell")
                if total == 0:
                    raise StageFailed("input is empty ("
                                      f"{', '.join(fresh[where][1][0].inputs)})")
            except StageFailed as e:
                for cell in fresh[where][1]:
                    self._fail(stage, cell, e, reports)
                continue
            info = {"rows": total, "fingerprint": f"{total}:{acc:016x}", "shards": shards,
                    "partition": where, "written_at": now(), "run_id": self.run_id}
            self.store.write_json(f"{where}/_done.json", info)
            out[where] = info
        return out

    def _process(self, stage: Stage, cells: list[Cell], cfg: XlingConfig, inputs: dict) -> None:
        """Stream the pending shards of some cells through one pipeline.

        Workers write each output block, split by (cell, shard), to temporary files in the
        run store and send the driver only metadata (file, row count, 8-byte hashes of the
        record ids). A shard whose records have all come out is committed by a Ray task
        (its pieces become one part file under the deterministic name); the driver then
        writes the shard's marker. Nothing but metadata reaches the driver.
        """
        import ray
        import ray.data

        from xling.core.logs import Progress

        todo: list[tuple[int, int]] = []
        for i, cell in enumerate(cells):
            self.store.delete_tree(f"{cell.dir}/_tmp")
            info, done = inputs[cell.id], committed_shards(self.store, cell.dir)
            self.detail(f"[{stage.name}] {cell.id}: {info['rows']} input rows, {cell.n_shards} "
                        f"shards, {len(done)} already committed, {cell.n_shards - len(done)} to run")
            for s in range(cell.n_shards):
                if s in done:
                    continue
                if str(s) in info["shards"]:
                    todo.append((i, s))
                else:  # a shard no record hashed to: nothing to stream, commit it empty
                    self._mark(stage, cell, s, _commit_shard(
                        self.store, cell.dir, s, [], {"rows": 0}, None, stage.id_column,
                        self.run_id, export=stage.part_export, counts=stage.part_counts),
                        time.time())
        if not todo:
            return
        expected = {(i, s): inputs[cells[i].id]["shards"][str(s)] for i, s in todo}
        ds = self._read_pending(cells, todo, inputs, stage.read_block_rows(cells, cfg))
        out = stage.map(ds, cells, cfg)
        meta = out.map_batches(
            _write_pieces, batch_format="pyarrow", batch_size=None, num_cpus=LIGHT_CPUS,
            fn_kwargs=dict(store=self.store, dirs=[c.dir for c in cells], run_id=self.run_id,
                           id_column=stage.id_column, token_column=stage.token_column))
        total = sum(e["rows"] for e in expected.values())
        # The stage's bar (run() makes it); a stage's group processed on its own gets one.
        bar = self._progress or Progress(total, stage.name, enabled=self.progress)
        commit = ray.remote(num_cpus=LIGHT_CPUS, max_retries=3)(_commit_shard)
        flight: dict[tuple[int, int], _Shard] = {}
        committing: dict = {}  # ObjectRef -> (cell index, shard, started)
        closed: set[tuple[int, int]] = set()

        def submit(key, lost_check: bool) -> None:
            st = flight.pop(key)
            closed.add(key)
            ref = commit.remote(self.store, cells[key[0]].dir, key[1], st.pieces, expected[key],
                                st.seen if lost_check else None, stage.id_column, self.run_id,
                                inputs[cells[key[0]].id].get("adapt"), stage.part_export,
                                stage.part_counts)
            committing[ref] = (key, st.started)

        def collect(block: bool) -> None:
            while committing:
                ready, _ = ray.wait(list(committing), num_returns=1, timeout=None if block else 0)
                if not ready:
                    return
                (i, s), started = committing.pop(ready[0])
                self._mark(stage, cells[i], s, ray.get(ready[0]), started)

        stream = {"cells": [c.id for c in cells], "records": total, "started": time.time(),
                  "first_output": None, "first_records": 0}
        for batch in meta.iter_batches(batch_format="pyarrow", batch_size=None):
            rows = batch.to_pylist()
            if stream["first_output"] is None:
                stream["first_output"] = time.time()
                stream["first_records"] = sum(len(r["rids"]) for r in rows)
            weight = sum(max(1, len(r["rids"])) for r in rows)
            for r in rows:  # the batch's Arrow bytes, shared out by each piece's id count
                cid = cells[r["cell"]].id
                self.driver_bytes[cid] = self.driver_bytes.get(cid, 0) + round(
                    batch.nbytes * max(1, len(r["rids"])) / weight)
            new = 0
            for r in rows:
                key = (r["cell"], r["shard"])
                if key in closed:  # cannot happen with 1:1 or whole-batch 1:N stages
                    raise StageFailed(f"{cells[key[0]].id}: output for shard {key[1]} arrived "
                                      "after the shard was committed; rerun with --force")
                st = flight.setdefault(key, _Shard())
                st.pieces.append(r["path"])
                before = len(st.seen)
                st.seen.update(r["rids"])
                new += len(st.seen) - before
                if len(st.seen) >= expected[key]["rows"]:
                    submit(key, lost_check=False)
            bar.update(new, tokens=sum(int(r.get("tokens") or 0) for r in rows))
            collect(block=False)
        for key in todo:  # shards the stage lost records of (or all of them)
            if key not in closed:
                flight.setdefault(key, _Shard())
                submit(key, lost_check=True)
        collect(block=True)
        if bar is not self._progress:
            bar.close()
        stream["ended"] = time.time()
        stream["busy"], stream["union"] = _operator_times(meta)
        if os.environ.get("XLING_STREAM_STATS"):  # Ray Data's per-operator times (benchmarks)
            stream["stats"] = meta.stats()
        self.streams.append(stream)

    def _read_pending(self, cells: list[Cell], todo: list[tuple[int, int]], inputs: dict,
                      block_rows: int | None = None):
        """The pending shards' input rows, each tagged with its cell (an index into `cells`)
        and shard; a file several cells read is read once and tagged for each.

        One read per schema, not per cell: the cells of a group share one read operator, so
        Ray Data's scheduler, whose every step visits each operator, has two operators to
        visit instead of two per cell (a stage of 12 small cells spent most of its driver
        CPU in those steps)."""
        import pyarrow.parquet as pq
        import ray.data

        targets: dict[str, list[tuple[int, int]]] = {}  # file -> its (cell, shard)s
        for i, s in todo:
            for f in inputs[cells[i].id]["shards"][str(s)]["files"]:
                targets.setdefault(self.store.fs_path(f), []).append((i, s))
        by_schema: dict[bytes, list[str]] = {}
        for path in targets:
            # the files of one folder (a partition's shard, a cell's parts) share a schema
            folder = path.rsplit("/", 1)[0]
            key = self._schemas.get(folder)
            if key is None:
                key = self._schemas[folder] = pq.read_schema(
                    path, filesystem=self.store.fs).remove_metadata().serialize().to_pybytes()
            by_schema.setdefault(key, []).append(path)
        adapt = {i: inputs[cells[i].id].get("adapt") for i, _ in todo}
        parts = []
        for files in by_schema.values():
            # With `block_rows`, one read task per file, which also tags the rows and cuts
            # them into blocks of `block_rows` (`_in_blocks`), all fused into one task. More
            # read blocks than files would make Ray Data split each read's output instead,
            # and a split read fuses with nothing: every block was then a task of its own
            # before the pool (ingest, 200k documents on 2 cores: 128 tagging tasks, the pool
            # idle a third of the time, 9.1-10.1k documents/s against 11.3k now).
            ds = ray.data.read_parquet(files, filesystem=self.store.fs, shuffle=None,
                                       include_paths=True, num_cpus=LIGHT_CPUS,
                                       override_num_blocks=len(files) if block_rows else None)
            ds = ds.map_batches(
                functools.partial(_tag_rows, targets={f: targets[f] for f in files},
                                  adapt=adapt),
                # Without `block_rows`, the default CPU fuses it into a one-CPU pool (translate:
                # as its own operator beside the pool, its ~200 small tasks halved the pool's
                # rate).
                batch_format="pyarrow", num_cpus=LIGHT_CPUS if block_rows else None)
            parts.append(_in_blocks(ds, block_rows) if block_rows else ds)
        return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]

    def _mark(self, stage: Stage, cell: Cell, shard: int, result: dict, started: float) -> None:
        """The shard's part file is in place: write its marker (the commit point)."""
        delay = _fault_commit_delay(stage.name)
        if delay:
            time.sleep(delay)  # fault-injection hook: widens the window for kill tests
        self.store.write_json(f"{cell.dir}/_shards/{shard:05d}.json", {
            "shard": shard, **result, "run_id": self.run_id,
            "started_at": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(),
            "committed_at": now(), "seconds": round(time.time() - started, 3)})

    def _finish(self, stage: Stage, cell: Cell, inputs: dict, t0: float,
                cfg: XlingConfig) -> CellReport:
        store, d = self.store, cell.dir
        markers = committed_shards(store, d)
        missing = [s for s in range(cell.n_shards) if s not in markers]
        if missing:
            raise StageFailed(f"{cell.id}: shards {missing[:10]} have no output after the run")
        extra = stage.finalize(cell, cfg, store)
        rows = sum(m["rows"] for m in markers.values())
        errors = sum(m["errors"] for m in markers.values())
        manifest = {
            "stage": stage.name, "cell": cell.id, "key": cell.key, "params": cell.params,
            "config_hash": cell.hash, "code_version": code_version(),
            "provenance": provenance(),  # git sha, python and library versions
            "inputs": {"sources": cell.inputs, "rows": inputs["rows"],
                       "fingerprint": inputs["fingerprint"],
                       "partition": inputs.get("partition"),
                       "shards": {s: {"rows": v["rows"], "fingerprint": v["fingerprint"]}
                                  for s, v in inputs["shards"].items()}},
            "n_shards": cell.n_shards, "rows": rows, "errors": errors,
            "files": [markers[s]["file"] for s in sorted(markers)],
            "shards": {str(s): {k: markers[s][k] for k in ("rows", "errors", "run_id",
                                                           "committed_at", "seconds", "bytes",
                                                           "digest") if k in markers[s]}
                       for s in sorted(markers)},
            "run_ids": sorted({m["run_id"] for m in markers.values()}),
            "driver_bytes": self.driver_bytes.get(cell.id, 0),
            # The pipeline that processed this cell in this run (shared with its group): its
            # start, first output, end and each operator's busy seconds (benchmarks/common.py).
            "stream": next(({k: v for k, v in st.items() if k not in ("cells", "stats")}
                            for st in self.streams if cell.id in st["cells"]), None),
            "timings": {"first_commit": min(m["committed_at"] for m in markers.values()),
                        "last_commit": max(m["committed_at"] for m in markers.values()),
                        "this_run_seconds": round(time.time() - t0, 3)},
            "finished_at": now(),
            **extra,
        }
        store.delete_tree(f"{d}/_tmp")
        store.delete(f"{d}/_failed.json")
        store.write_json(f"{d}/_manifest.json", manifest)  # last: marks the cell done
        self.detail(f"[{stage.name}] {cell.id}: committed {rows} rows ({errors} errors) -> "
                    f"{store.url(d)}")
        ran = sum(m["run_id"] == self.run_id for m in markers.values())
        return CellReport(cell, "done", rows, errors, ran, cell.n_shards, time.time() - t0)


def _fault_commit_delay(stage: str) -> float:
    """$XLING_FAULT_COMMIT_DELAY, the fault-injection hook's sleep before each commit: seconds
    for every stage (`1.5`), or per stage (`judge=0.7,index=1`), so that a kill test slows
    only the stage it kills in."""
    value = os.environ.get("XLING_FAULT_COMMIT_DELAY", "").strip()
    if "=" not in value:
        return float(value or 0)
    per_stage = dict(item.split("=", 1) for item in value.split(",") if item.strip())
    return float(per_stage.get(stage, 0) or 0)


def _operator_times(ds) -> tuple[dict[str, float], dict[str, float]]:
    """Per operator of a finished pipeline: the seconds spent in its tasks or actor calls,
    summed over them (`busy`), and the seconds in which at least one of them ran (`union`:
    the union of their intervals, per node, each node's clock being its own). A benchmark
    divides by these to get an actor pool's steady rate: an async actor runs several batches
    at once, which the sum counts once per call and the union once."""
    def ops(stats):  # each stats object holds its last operators; the earlier ones are parents
        yield from stats.metadata.items()
        for parent in stats.parents or ():
            yield from ops(parent)

    busy, union = {}, {}
    try:
        for name, blocks in ops(ds._raw_stats()):
            calls = [(e.node_id, e.start_time_s, e.end_time_s) for e in
                     (b.exec_stats for b in blocks) if e and e.start_time_s is not None
                     and e.end_time_s is not None]
            if calls:
                busy[name] = round(sum(end - start for _, start, end in calls), 3)
                union[name] = round(union_seconds(calls), 3)
    except Exception:  # a private Ray Data API: an accounting aid, never a failure
        pass
    return busy, union


def union_seconds(intervals) -> float:
    """The length of the union of (node, start, end) intervals, taken per node."""
    total, by_node = 0.0, {}
    for node, start, end in intervals:
        by_node.setdefault(node, []).append((start, end))
    for spans in by_node.values():
        reach = float("-inf")
        for start, end in sorted(spans):
            if end > reach:
                total += end - max(start, reach)
                reach = end
    return total


def _with_tasks(demand: dict) -> dict:
    """A group's resources: its actor pools' minimum plus room for its read/write tasks."""
    return {**demand, "CPU": demand.get("CPU", 0) + 0.5}


def _in_blocks(ds, rows: int):
    """`ds` cut into blocks of at most `rows` rows, in the tasks that make its blocks.

    `repartition(target_num_rows_per_block=)` fuses into the map before it only when both
    ask the same resources, and it asks one CPU with no way to say otherwise; its logical
    operator's (private) remote arguments are set to the reads' quarter CPU here. Should a
    Ray version move them, it runs as an operator of its own: the same blocks, more tasks."""
    ds = ds.repartition(target_num_rows_per_block=rows)
    args = getattr(getattr(getattr(ds, "_logical_plan", None), "dag", None),
                   "ray_remote_args", None)
    if isinstance(args, dict):
        args["num_cpus"] = LIGHT_CPUS
    return ds
