"""The stage runner: cells, deterministic shards, commit protocol, skip-what-is-done.

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
import re
import socket
import subprocess
import time
import traceback
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from xling.core.config import ConfigError, stable_hash
from xling.core.pools import LIGHT_CPUS
from xling.core.provenance import provenance
from xling.core.memo import per_config
from xling.core.store import RunStore

if TYPE_CHECKING:
    from xling.config import XlingConfig

RID, SHARD, CELL, ERROR = "_rid", "_shard", "_cell", "error"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def shard_of(rids: Iterable[str] | pa.Array, n_shards: int) -> np.ndarray:
    """Stable shard of each record id: xxh64 of the UTF-8 id, modulo n_shards.

    Independent of Python's hash seed, the process, the machine and the order of records.
    """
    values = rids.to_pylist() if isinstance(rids, (pa.Array, pa.ChunkedArray)) else rids
    return np.fromiter((xxhash.xxh64_intdigest(str(r).encode()) % n_shards for r in values),
                       dtype=np.int64)


def fingerprint(rids: Iterable[str]) -> str:
    """Order-independent fingerprint of a set of record ids."""
    acc = 0
    n = 0
    for r in rids:
        acc ^= xxhash.xxh64_intdigest(str(r).encode(), seed=1)
        n += 1
    return f"{n}:{acc:016x}"


def describe_error(e: BaseException) -> str:
    """One readable line for an exception, digging the user's error out of Ray's wrappers."""
    chain, seen = [], set()
    while isinstance(e, BaseException) and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = getattr(e, "cause", None) or e.__cause__
    pattern = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failed)):\s")
    wrappers = ("UserCodeException", "RayTaskError", "RaySystemError")
    for exc in chain:  # Ray puts the worker's traceback, ending in the real error, in str()
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        found = [l.strip() for l in text.splitlines()
                 if (m := pattern.match(l.strip()))
                 and not m.group(1).rsplit(".", 1)[-1].startswith(wrappers)]
        if found:
            return found[-1]
    first = re.sub(r"\x1b\[[0-9;]*m", "", str(chain[0])).strip().splitlines() or [""]
    return f"{type(chain[0]).__name__}: {first[0]}"


def code_version() -> str:
    import xling

    version = getattr(xling, "__version__", "0")
    try:
        here = os.path.dirname(os.path.abspath(xling.__file__))
        sha = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        if sha:
            return f"{version}+g{sha}{'.dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        pass
    return version


# ---------------------------------------------------------------------------------------
# cells and stages


@dataclass(frozen=True)
class Cell:
    """One slice of the grid (study, setting, language, model...) run by one stage."""

    stage: str
    key: dict[str, str]
    params: dict[str, Any]
    inputs: list[str] = field(default_factory=list, compare=False)
    n_shards: int = field(default=1, compare=False)

    @cached_property
    def hash(self) -> str:
        return stable_hash({"stage": self.stage, "key": self.key, "params": self.params})

    @property
    def id(self) -> str:
        return ".".join([*self.key.values(), self.hash])

    @property
    def dir(self) -> str:
        return f"{self.stage}/{self.id}"


class Stage(ABC):
    """A stage: which cells a config asks for, how to read a cell's input, how to map it.

    `read(cell)` returns a Ray Dataset whose rows carry a unique string `_rid`. `map(ds,
    cells)` maps the input rows of several cells at once (one actor pool per model, shared
    by every cell of the run); rows carry `_cell` (an index into `cells`) so a stage whose
    cells differ in a setting can look it up per row. Every output row keeps its input's
    `_rid`, `_cell` and `_shard` (1:1 or 1:N), and failures are rows with a non-null
    `error`, never exceptions.
    """

    name: str = ""
    id_column: str = RID  # where a record id goes when the runner adds an error row
    token_column: str | None = None  # output tokens for the progress bar (see TOKEN_COLUMNS)
    # A file made from each part as it is committed, by the commit task (in parallel, while
    # the pipeline runs): (suffix, part table -> bytes), kept at `_exports/part-NNNNN<suffix>`
    # for `finalize` to join (`part_exports`), e.g. the TREC run of 10 M hits.
    part_export: tuple[str, Callable[[pa.Table], bytes]] | None = None
    # Counts made from each part by its commit task and kept in its marker (`stats`), so
    # that `finalize` sums them (`part_stats`) instead of reading every part back.
    part_counts: Callable[[pa.Table], dict[str, int]] | None = None

    def __init_subclass__(cls, **kw):
        # Within a command, a stage's cells are built once per config (core/memo.py): the
        # stages downstream ask for them again and again to find their inputs.
        super().__init_subclass__(**kw)
        for name in ("cells", "all_cells"):
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "__isabstractmethod__", False) \
                    and not getattr(method, "__memoized__", False):
                setattr(cls, name, per_config(method))

    @abstractmethod
    def cells(self, cfg: XlingConfig) -> list[Cell]: ...

    @abstractmethod
    def read(self, cell: Cell, cfg: XlingConfig): ...

    @abstractmethod
    def map(self, ds, cells: list[Cell], cfg: XlingConfig): ...

    def group(self, cell: Cell) -> str:
        """Cells with the same group share one pipeline (and its actor pools)."""
        return ""

    def engines(self, cfg: XlingConfig) -> list:
        """The LLM entries (core/engines) and embedders (`hosts.EmbedderSpec`) whose engines
        this stage's pools run: an engine that stages next to each other in a run ask for
        starts once for all of them (core/hosts.py)."""
        return []

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream: tuple[str, ...] = ()) -> None:
        """Driver-side work before Ray starts (e.g. converting a model into the store).

        `upstream` names the stages that run before this one in the same invocation, so a
        missing input they will make is not an error yet.
        """

    def after_run(self, cfg: XlingConfig, runner: "Runner") -> None:
        """Runs after every cell of the stage is done (e.g. fusions of the stage's runs)."""

    def all_cells(self, cfg: XlingConfig) -> list[Cell]:
        """Every cell the stage leaves in its folder: `cells`, plus what `after_run` makes."""
        return self.cells(cfg)

    def source(self, cell: Cell, cfg: XlingConfig) -> "Source | None":
        """Where the cell's input rows come from, so cells reading the same rows share one
        partition (see `Source`). None: `read(cell)` is partitioned for this cell alone."""
        return None

    def pool_key(self, cell: Cell, cfg: XlingConfig) -> str:
        """With `group`, which cells of a run (of several configs, in a sweep) may share a
        pipeline: by default cells of configs whose stage section differs do not, since
        `map` may read that section. Stages whose `map` reads only cell params return ""."""
        section = getattr(cfg, self.name, None)
        return stable_hash(section.model_dump(mode="json")) if section is not None else ""

    def engine_of(self, cells: list[Cell], cfg: XlingConfig):
        """The entry (of `engines`) whose engine the group's pool runs, or None."""
        return None

    def resources(self, cells: list[Cell], cfg: XlingConfig) -> dict:
        """The CPUs/GPUs the group's actor pools hold at their minimum size, for running
        groups side by side (see `Runner._run_groups`)."""
        return {"CPU": 1.0}

    def read_block_rows(self, cells: list[Cell], cfg: XlingConfig) -> int | None:
        """Rows per block to read the partition in, for a stage whose map is cheap per row
        (None: Ray Data's default, at least 200 blocks). Each block is a task of every
        operator before the pool, and on a small cluster those tasks' start-up, not their
        work, paced the pipeline (index, 200k documents: 208 blocks of 961 rows)."""
        return None

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        """Work on a cell's committed shards before it is marked done (e.g. merging a
        Lucene index); what it returns goes into the manifest."""
        return {}


class DriverStage(Stage):
    """A stage that runs in the driver, cell by cell, without Ray (evaluate). `run_cell`
    computes one cell and returns what its manifest adds; `run_driver` skips done cells and
    writes every manifest the same way (`driver_manifest`), provenance included."""

    def read(self, cell: Cell, cfg: XlingConfig):  # pragma: no cover - driver stage
        raise NotImplementedError(f"{self.name} runs in the driver: call run_driver")

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):  # pragma: no cover
        raise NotImplementedError(f"{self.name} runs in the driver: call run_driver")

    @abstractmethod
    def run_cell(self, cfg: XlingConfig, store: RunStore, cell: Cell, *, log=print) -> dict:
        """Compute and write one cell's files; return the manifest's stage-specific fields
        (`rows`, `errors`, `files`...)."""

    def after_driver(self, cfg: XlingConfig, store: RunStore, *, log=print) -> None:
        """Work over every cell once they are done (e.g. tables across cells)."""

    def run_driver(self, cfg: XlingConfig, store: RunStore, *, force: bool = False,
                   log=print) -> list[dict]:
        out = []
        for cell in self.cells(cfg):
            if not force and store.read_json_or_none(f"{cell.dir}/_manifest.json"):
                log(f"[{self.name}] {cell.id}: done earlier, skipped")
                continue
            t0 = time.time()
            fields = self.run_cell(cfg, store, cell, log=log)
            out.append(write_driver_manifest(store, cell, fields, seconds=time.time() - t0))
        self.after_driver(cfg, store, log=log)
        return out


def write_driver_manifest(store: RunStore, cell: Cell, fields: dict, *,
                          seconds: float) -> dict:
    """The manifest of a driver cell: identity, code version and provenance, then `fields`."""
    manifest = {"stage": cell.stage, "cell": cell.id, "key": cell.key, "params": cell.params,
                "config_hash": cell.hash, "code_version": code_version(), "n_shards": 1,
                **fields, "provenance": provenance(),
                "timings": {"this_run_seconds": round(seconds, 3)}, "finished_at": now()}
    store.write_json(f"{cell.dir}/_manifest.json", manifest)
    return manifest


class StageFailed(RuntimeError):
    pass


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
class Source:
    """Where a cell's input rows come from, declared by `Stage.source`, so that every cell
    (of any stage) reading the same rows shares one partition instead of copying them.

    key    what the rows are, as JSON data: equal keys (and shard counts) mean equal rows
    read   the rows as a Ray Dataset with `_rid` (partitioned when no partition exists)
    adapt  partition rows -> this stage's input rows with `_rid`, one per record; it runs
           in the processing pipeline, so cells that adapt the same rows differently still
           share their partition
    cell   a committed xling cell whose part files are the partition (shard s = its
           part-s), used as is when its shard count matches; those rows have no `_rid`
           until `adapt` sets it, so a source with `cell` needs an `adapt`
    """

    key: dict
    read: Callable[[], Any]
    adapt: Callable[[pa.Table], pa.Table] | None = None
    cell: str | None = None


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
                           f"inputs {first['started'] - t0:.0f}s, pipeline start "
                           f"{first['first_output'] - first['started']:.0f}s)")
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
        done = {int(p.rsplit("/", 1)[-1].split(".")[0]) for p in
                self.store.list(f"{cell.dir}/_shards") if p.endswith(".json")}
        return sum(v["rows"] for s, v in info["shards"].items() if int(s) not in done)

    def _fail(self, stage: Stage, cell: Cell, e: BaseException, reports: dict) -> None:
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
        reads = [fresh[w][0].read() for w in wheres]
        if self.limit:
            reads = [r.limit(self.limit) for r in reads]
        parts = [r.map_batches(functools.partial(_tag_cell, index=i), batch_format="pyarrow")
                 for i, r in enumerate(reads)]
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
        and shard; a partition several cells share is read once per cell."""
        import ray.data

        by_cell: dict[int, list[int]] = {}
        for i, s in todo:
            by_cell.setdefault(i, []).append(s)
        parts = []
        for i, shards in by_cell.items():
            info = inputs[cells[i].id]
            shard_of_file = {self.store.fs_path(f): s for s in shards
                             for f in info["shards"][str(s)]["files"]}
            # With `block_rows`, one read task per file, which also tags the rows and cuts
            # them into blocks of `block_rows` (`_in_blocks`), all fused into one task. More
            # read blocks than files would make Ray Data split each read's output instead,
            # and a split read fuses with nothing: every block was then a task of its own
            # before the pool (ingest, 200k documents on 2 cores: 128 tagging tasks, the pool
            # idle a third of the time, 9.1-10.1k documents/s against 11.3k now).
            ds = ray.data.read_parquet(list(shard_of_file), filesystem=self.store.fs,
                                       shuffle=None, include_paths=True, num_cpus=LIGHT_CPUS,
                                       override_num_blocks=len(shard_of_file) if block_rows
                                       else None)
            ds = ds.map_batches(
                functools.partial(_tag_rows, cell=i, shard_of_file=shard_of_file,
                                  adapt=info.get("adapt")),
                # Without `block_rows`, the default CPU fuses it into a one-CPU pool (translate:
                # as its own operator beside the pool, its ~200 small tasks halved the pool's
                # rate).
                batch_format="pyarrow", num_cpus=LIGHT_CPUS if block_rows else None)
            parts.append(_in_blocks(ds, block_rows) if block_rows else ds)
        return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]

    def _mark(self, stage: Stage, cell: Cell, shard: int, result: dict, started: float) -> None:
        """The shard's part file is in place: write its marker (the commit point)."""
        delay = float(os.environ.get("XLING_FAULT_COMMIT_DELAY", "0") or 0)
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
                                                           "committed_at", "seconds")}
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


def rid_hashes(rids) -> np.ndarray:
    """8-byte hashes of record ids: what workers tell the driver instead of the ids."""
    values = rids.to_pylist() if isinstance(rids, (pa.Array, pa.ChunkedArray)) else rids
    return np.fromiter((xxhash.xxh64_intdigest(str(r).encode(), seed=2) for r in values),
                       dtype=np.uint64, count=len(values))


def _tag_cell(batch: pa.Table, *, index: int) -> pa.Table:
    return batch.append_column(CELL, pa.array([index] * batch.num_rows, pa.int64()))


def _tag_rows(batch: pa.Table, *, cell: int, shard_of_file: dict[str, int],
              adapt=None) -> pa.Table:
    """Partition rows -> the stage's input rows, with their cell and shard."""
    paths = pc.unique(batch["path"])
    shards = pc.take(pa.array([shard_of_file[p] for p in paths.to_pylist()], pa.int64()),
                     pc.index_in(batch["path"], value_set=paths))
    batch = batch.drop_columns([c for c in ("path", CELL, SHARD) if c in batch.column_names])
    if adapt is not None:
        batch = adapt(batch)
    return batch.append_column(SHARD, shards).append_column(
        CELL, pa.array(np.full(batch.num_rows, cell), pa.int64()))


def _write_pieces(batch: pa.Table, *, store: RunStore, dirs: list[str], run_id: str,
                  id_column: str, token_column: str | None = None) -> pa.Table:
    """map_batches task after the stage's map: each (cell, shard) slice of an output block
    goes to a temporary file in the store; only metadata goes back to the driver (with the
    slice's output tokens, for the progress bar's tok/s)."""
    out = {k: [] for k in ("cell", "shard", "path", "rows", "rids", "tokens")}
    token_column = token_column or next((c for c in TOKEN_COLUMNS if c in batch.column_names),
                                        None)
    if batch.num_rows == 0:
        return pa.table(out, schema=_PIECES)
    if ERROR not in batch.column_names:
        batch = batch.append_column(ERROR, pa.nulls(batch.num_rows, pa.string()))
    cells, shards = batch[CELL].to_numpy(), batch[SHARD].to_numpy()
    keys = cells * 1_000_000_000 + shards
    for key in np.unique(keys):
        c, s = int(key // 1_000_000_000), int(key % 1_000_000_000)
        piece = batch.filter(pa.array(keys == key))
        # Many rows can share a record (a query's hits): hash each distinct id once.
        rids = np.unique(rid_hashes(pc.unique(piece[RID])))
        piece = piece.drop_columns([x for x in (RID, SHARD, CELL) if x != id_column])
        rel = f"{dirs[c]}/_tmp/{run_id}/{s:05d}/{uuid.uuid4().hex}.parquet"
        store.write_parquet(rel, piece)
        out["cell"].append(c)
        out["shard"].append(s)
        out["path"].append(rel)
        out["rows"].append(piece.num_rows)
        out["rids"].append(rids)
        tokens = 0
        if token_column and token_column in piece.column_names:
            tokens = pc.sum(piece[token_column]).as_py() or 0
        out["tokens"].append(int(tokens))
    return pa.table(out, schema=_PIECES)


_PIECES = pa.schema([("cell", pa.int64()), ("shard", pa.int64()), ("path", pa.string()),
                     ("rows", pa.int64()), ("rids", pa.list_(pa.uint64())),
                     ("tokens", pa.int64())])
# Output columns whose sum is a stage's generated tokens (the progress bar's tok/s), unless
# the stage names its own `token_column`: LLM rows (generate, judge), translations.
TOKEN_COLUMNS = ("n_output_tokens", "n_tgt_tokens")


def _commit_shard(store: RunStore, cell_dir: str, shard: int, pieces: list[str],
                  expected: dict, seen: set | None, id_column: str, run_id: str,
                  adapt=None, export=None, counts=None) -> dict:
    """Ray task: a shard's output pieces -> `part-NNNNN.parquet`, written under a temporary
    name and moved into place; records the stage lost become error rows. Returns what the
    shard's marker records. The stage's `part_export` is written before the part moves into
    place, so a committed part always has its export, and its marker the stage's
    `part_counts`."""
    name = f"part-{shard:05d}.parquet"
    final = f"{cell_dir}/{name}"
    if pieces and not all(store.exists(p) for p in pieces) and store.exists(final):
        # A retry of this task after it moved the pieces (its node died before it returned):
        # no other task writes this shard's part in this run, so the part is its work.
        table = store.read_parquet(final, columns=None if export or counts else [ERROR])
        _write_export(store, cell_dir, shard, export, table)
        errors = int(table.num_rows - pc.sum(pc.is_null(table[ERROR])).as_py())
        return {"file": name, "rows": table.num_rows, "errors": errors,
                "input_rows": expected["rows"], "input_fingerprint": expected.get("fingerprint"),
                "lost_records": 0, "pieces": len(pieces), "host": socket.gethostname(),
                **({"stats": counts(table)} if counts else {})}
    lost: list[str] = []
    if seen is not None and len(seen) < expected["rows"]:
        rows = store.read_parquet(expected["files"])
        ids = (rows if RID in rows.column_names or adapt is None else adapt(rows))[RID]
        lost = [r for r, h in zip(ids.to_pylist(), rid_hashes(ids)) if int(h) not in seen]
    if len(pieces) == 1 and not lost:
        table = store.read_parquet(pieces[0], columns=None if export or counts else [ERROR])
        _write_export(store, cell_dir, shard, export, table)
        store.move(pieces[0], final)
    else:
        tables = [store.read_parquet(p) for p in pieces]
        if lost:  # never silent gaps
            tables.append(pa.table({id_column: lost, ERROR: [
                "stage produced no output for this record"] * len(lost)}))
        table = (pa.concat_tables(tables, promote_options="default") if tables
                 else pa.table({ERROR: pa.array([], pa.string())}))
        tmp = f"{cell_dir}/_tmp/{run_id}/{name}"
        store.write_parquet(tmp, table)
        _write_export(store, cell_dir, shard, export, table)
        store.move(tmp, final)
        for p in pieces:
            store.delete(p)
    errors = int(table.num_rows - pc.sum(pc.is_null(table[ERROR])).as_py()) if table.num_rows else 0
    return {"file": name, "rows": table.num_rows, "errors": errors,
            "input_rows": expected["rows"], "input_fingerprint": expected.get("fingerprint"),
            "lost_records": len(lost), "pieces": len(pieces), "host": socket.gethostname(),
            **({"stats": counts(table)} if counts else {})}


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


def _export_path(cell_dir: str, shard: int, suffix: str) -> str:
    return f"{cell_dir}/_exports/part-{shard:05d}{suffix}"


def _write_export(store: RunStore, cell_dir: str, shard: int, export, table: pa.Table) -> None:
    if export:
        store.write_bytes(_export_path(cell_dir, shard, export[0]), export[1](table))


def part_exports(store: RunStore, cell_dir: str, n_shards: int, suffix: str) -> bytes | None:
    """The committed parts' exports joined in part order; None where a part has none
    (committed by an xling that wrote none). The caller removes `_exports/` once it has
    written what it joined."""
    paths = [_export_path(cell_dir, s, suffix) for s in range(n_shards)]
    if not all(store.exists(p) for p in paths):
        return None
    return b"".join(store.read_bytes(p) for p in paths)


def _write_shards(batch: pa.Table, *, store: RunStore, dirs: list[str],
                  n_shards: list[int]) -> pa.Table:
    """map_batches task: split input rows by (source, shard) into Parquet files in the store;
    returns the files with 8-byte hashes of their record ids (the driver checks uniqueness
    and fingerprints from those, never reading the rows)."""
    if RID not in batch.column_names:
        raise ValueError(f"stage input has no `{RID}` column (record id)")
    batch = batch.set_column(batch.column_names.index(RID), RID, pc.cast(batch[RID], pa.string()))
    cells = batch[CELL].to_numpy()
    shards = np.zeros(len(cells), dtype=np.int64)
    for c in np.unique(cells):
        rows = cells == c
        shards[rows] = shard_of(batch[RID].filter(pa.array(rows)), n_shards[c])
    batch = batch.append_column(SHARD, pa.array(shards, pa.int64()))
    out = {k: [] for k in ("cell", "shard", "path", "rids", "xor")}
    for c, s in sorted({(int(c), int(s)) for c, s in zip(cells, shards)}):
        part = batch.filter(pa.array((cells == c) & (shards == s)))
        rel = f"{dirs[c]}/{s:05d}/{uuid.uuid4().hex}.parquet"
        store.write_parquet(rel, part.drop_columns([CELL]))
        ids = part[RID].to_pylist()
        out["cell"].append(c)
        out["shard"].append(s)
        out["path"].append(rel)
        out["rids"].append(rid_hashes(ids))
        # `fingerprint`'s XOR, computed here so that it combines across files
        out["xor"].append(functools.reduce(
            lambda a, r: a ^ xxhash.xxh64_intdigest(str(r).encode(), seed=1), ids, 0))
    return pa.table({**out, "rids": pa.array(out["rids"], pa.list_(pa.uint64())),
                     "xor": pa.array(out["xor"], pa.uint64())})


# ---------------------------------------------------------------------------------------
# reading state


# Side files of a cell, beside its part files. Names starting with "_" are skipped by
# pyarrow's dataset discovery, so `pd.read_parquet(cell_dir)` reads exactly the cell's rows.
TABLE = "_table.md"  # the cell's markdown table (the report prints it)
ITEMS = "_items.parquet"  # a study's per-item scores
PLOTS = "_plots"  # a study's figures, `_plots/<name>.png`


def part_files(store: RunStore, rel_dir: str) -> list[str]:
    """The Parquet parts a cell has committed so far: what `Stage.finalize` reads, before
    the manifest that lists them exists."""
    parent = rel_dir.strip("/")
    return sorted(f for f in store.list(rel_dir) if f.rsplit("/", 1)[0] == parent and
                  re.fullmatch(r"part-\d+\.parquet", f.rsplit("/", 1)[-1]))


def part_stats(store: RunStore, rel_dir: str) -> dict[str, int] | None:
    """The stage's `part_counts` of a cell, summed over its committed parts; None where a
    part's marker has none (committed by an xling that made none)."""
    markers = committed_shards(store, rel_dir).values()
    if not markers or not all("stats" in m for m in markers):
        return None
    keys = {k for m in markers for k in m["stats"]}
    return {k: sum(m["stats"].get(k, 0) for m in markers) for k in sorted(keys)}


def committed_shards(store: RunStore, rel_dir: str) -> dict[int, dict]:
    """The shard markers of a cell, by shard number."""
    markers = (store.read_json(p) for p in store.list(f"{rel_dir}/_shards") if p.endswith(".json"))
    return {int(m["shard"]): m for m in markers}


def cell_state(store: RunStore, rel_dir: str) -> dict:
    """done / partial / failed / pending, with row and error counts, for one cell dir."""
    manifest = store.read_json_or_none(f"{rel_dir}/_manifest.json")
    if manifest:
        return {"state": "done", "rows": manifest["rows"], "errors": manifest["errors"],
                "shards_done": manifest["n_shards"], "n_shards": manifest["n_shards"],
                "message": manifest.get("finished_at", "")}
    plan = store.read_json_or_none(f"{rel_dir}/_plan.json") or {}
    markers = list(committed_shards(store, rel_dir).values())
    failed = store.read_json_or_none(f"{rel_dir}/_failed.json")
    state = "failed" if failed else ("partial" if plan or markers else "pending")
    return {"state": state, "rows": sum(m["rows"] for m in markers),
            "errors": sum(m["errors"] for m in markers), "shards_done": len(markers),
            "n_shards": plan.get("n_shards", 0),
            "message": (failed or {}).get("error", "")}


def run_status(store: RunStore) -> list[dict]:
    """State of every cell of every stage under a run root."""
    rows = []
    for stage in store.list_dirs():
        if stage.startswith((".", "_")):
            continue
        for cell in store.list_dirs(stage):
            if cell.startswith((".", "_")):
                continue
            rows.append({"stage": stage, "cell": cell, **cell_state(store, f"{stage}/{cell}")})
    return rows


def read_cell(store: RunStore, rel_dir: str, columns: list[str] | None = None) -> pa.Table:
    """The committed output of a finished cell (only files its manifest lists)."""
    manifest = store.read_json_or_none(f"{rel_dir}/_manifest.json")
    if not manifest:
        raise FileNotFoundError(f"{store.url(rel_dir)} is not a finished cell (no _manifest.json)")
    return store.read_parquet([f"{rel_dir}/{f}" for f in manifest["files"]], columns=columns)


class MissingInput(StageFailed, ConfigError):
    """An earlier stage's output is not in the store: before Ray starts this is a config-time
    error (exit 2) naming the stage to run; on a worker it fails the cell."""


def require_done(store: RunStore, cell: Cell, needed_by: str) -> dict:
    manifest = store.read_json_or_none(f"{cell.dir}/_manifest.json")
    if manifest is None:
        raise MissingInput(
            f"{needed_by} needs the {cell.stage} stage's output {cell.id}, which is not in "
            f"{store.url(cell.stage)}: run `xling {cell.stage} --config ...` first")
    return manifest


def read_rows(store: RunStore, dirs: list[str], columns: list[str], needed_by: str) -> list[dict]:
    """The rows of committed cells as dicts (`parsed` maps as dicts)."""
    rows = []
    for d in dirs:
        try:
            rows += read_cell(store, d, columns=columns).to_pylist()
        except FileNotFoundError:
            raise MissingInput(f"{needed_by} needs {d}, which is not committed in {store.url()}: "
                               f"run `xling {d.split('/')[0]} --config ...` first") from None
    for r in rows:
        if r.get("parsed") is not None:
            r["parsed"] = dict(r["parsed"])
    return rows
