"""The stage runner: cells, deterministic shards, commit protocol, skip-what-is-done.

Layout of one cell (all under `{run_root}/{stage}/{cell_id}/`):

    _plan.json              what the cell is (key, params, hash, shard count); written first
    _input/_done.json       the input, partitioned by shard: rows and a fingerprint per shard
    _input/NNNNN/*.parquet  input rows of shard NNNNN (`_rid`, `_shard` + the stage's columns)
    _tmp/<run_id>/...       output being written by the current run (never read)
    part-NNNNN.parquet      committed output of shard NNNNN
    _shards/NNNNN.json      shard NNNNN is committed: file, rows, errors, run id, times
    _failed.json            the last run of this cell raised; cleared when the cell finishes
    _manifest.json          written last: the cell is done (config, hash, code version,
                            input fingerprints, row and error counts, timings)

A record's shard is a stable hash of its id (`_rid`) modulo the shard count, so the same input
always lands in the same shard. A killed run leaves committed shards alone; the next run
redoes only shards without a marker, and overwrites their deterministic output names, so
nothing is duplicated.

Why not Ray Data's `DataContext.checkpoint_config`: it checkpoints by row id inside one Ray
Data pipeline and resumes that pipeline, but it cannot express our unit of commitment (a
shard whose rows were all produced, with a manifest that other stages and `xling status`
read), and it offers no place for input fingerprints or per-shard counts. The runner keeps
one streaming pipeline per stage group, shared by its cells (one actor pool per model,
loaded once), and commits shards as they stream out of it in order.
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
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from xling.core.config import ConfigError, stable_hash
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

    @abstractmethod
    def cells(self, cfg: XlingConfig) -> list[Cell]: ...

    @abstractmethod
    def read(self, cell: Cell, cfg: XlingConfig): ...

    @abstractmethod
    def map(self, ds, cells: list[Cell], cfg: XlingConfig): ...

    def group(self, cell: Cell) -> str:
        """Cells with the same group share one pipeline (and its actor pools)."""
        return ""

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream: tuple[str, ...] = ()) -> None:
        """Driver-side work before Ray starts (e.g. converting a model into the store).

        `upstream` names the stages that run before this one in the same invocation, so a
        missing input they will make is not an error yet.
        """

    def after_run(self, cfg: XlingConfig, runner: "Runner") -> None:
        """Runs after every cell of the stage is done (e.g. fusions of the stage's runs)."""

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        """Work on a cell's committed shards before it is marked done (e.g. merging a
        Lucene index); what it returns goes into the manifest."""
        return {}


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


class Runner:
    def __init__(self, store: RunStore, *, force: bool = False, progress: bool = True,
                 log=print):
        self.store = store
        self.force = force
        self.progress = progress
        self.log = log
        self.run_id = f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"

    # ---- public --------------------------------------------------------------------
    def plan(self, stage: Stage, cfg: XlingConfig) -> list[dict]:
        """What a run would do, without starting Ray or writing anything."""
        out = []
        for cell in stage.cells(cfg):
            state = cell_state(self.store, cell.dir)
            todo = "nothing (done)" if state["state"] == "done" and not self.force else (
                f"{cell.n_shards - state['shards_done']} of {cell.n_shards} shards"
                if not self.force else f"all {cell.n_shards} shards (--force)")
            out.append({"cell": cell.id, "dir": self.store.url(cell.dir), "state": state["state"],
                        "shards_done": state["shards_done"], "n_shards": cell.n_shards,
                        "todo": todo, "inputs": cell.inputs})
        return out

    def run(self, stage: Stage, cfg: XlingConfig) -> list[CellReport]:
        """Run every cell of a stage: skip done ones, partition, process, commit, finish."""
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
        t0 = time.time()
        reports: dict[str, CellReport] = {}
        cells, todo = stage.cells(cfg), []
        for cell in cells:
            manifest = self.store.read_json_or_none(f"{cell.dir}/_manifest.json")
            if manifest and not self.force:
                self.log(f"[{stage.name}] {cell.id}: done earlier ({manifest['rows']} rows, "
                         f"{manifest['errors']} errors), skipped")
                reports[cell.id] = CellReport(cell, "skipped", manifest["rows"],
                                              manifest["errors"], 0, manifest["n_shards"])
            else:
                todo.append(cell)
        try:
            inputs = self._prepare(stage, todo, cfg, reports)
        except Exception as e:  # e.g. a source that cannot be read: those cells fail
            inputs = {}
            for cell in todo:
                if cell.id not in reports:
                    self._fail(stage, cell, e, reports)
        ready = [c for c in todo if c.id in inputs and c.id not in reports]
        groups: dict[str, list[Cell]] = {}
        for cell in ready:
            groups.setdefault(stage.group(cell), []).append(cell)
        for group in groups.values():
            try:
                self._process(stage, group, cfg, inputs)
            except Exception as e:  # committed shards stay; the cells are marked failed
                for cell in group:
                    self._fail(stage, cell, e, reports)
        for cell in ready:
            if cell.id not in reports:
                try:
                    reports[cell.id] = self._finish(stage, cell, inputs[cell.id], t0, cfg)
                except Exception as e:
                    self._fail(stage, cell, e, reports)
        ordered = [reports[c.id] for c in cells]
        failed = [r for r in ordered if r.state == "failed"]
        if failed:
            raise StageFailed(f"{stage.name}: {len(failed)} of {len(ordered)} cell(s) failed: "
                              + "; ".join(f"{r.cell.id}: {r.message}" for r in failed))
        return ordered

    def _fail(self, stage: Stage, cell: Cell, e: BaseException, reports: dict) -> None:
        message = describe_error(e)
        self.store.write_json(f"{cell.dir}/_failed.json", {
            "run_id": self.run_id, "at": now(), "error": message,
            "traceback": "".join(traceback.format_exception(e))})
        self.log(f"[{stage.name}] {cell.id}: FAILED: {message}")
        reports[cell.id] = CellReport(cell, "failed", message=message)

    # ---- steps ---------------------------------------------------------------------
    def _prepare(self, stage: Stage, cells: list[Cell], cfg: XlingConfig,
                 reports: dict) -> dict[str, dict]:
        """Plan every cell and partition the inputs of those not yet partitioned.

        Returns {cell id: input info}; a cell whose input is bad (empty, duplicate ids, a
        changed shard count) is marked failed here and left out, so the others still run.
        """
        out, fresh = {}, []
        for cell in cells:
            if self.force:
                self.store.delete_tree(cell.dir)
            try:
                self._write_plan(cell)
            except StageFailed as e:
                self._fail(stage, cell, e, reports)
                continue
            found = self.store.read_json_or_none(f"{cell.dir}/_input/_done.json")
            if found:
                out[cell.id] = found
            else:
                self.store.delete_tree(f"{cell.dir}/_input")
                fresh.append(cell)
        if fresh:
            out.update(self._partition(stage, fresh, cfg, reports))
        return out

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

    def _partition(self, stage: Stage, cells: list[Cell], cfg: XlingConfig,
                   reports: dict) -> dict[str, dict]:
        """Split the inputs of several cells into shard files, in one Ray Data pipeline."""
        parts = [stage.read(cell, cfg).map_batches(functools.partial(_tag_cell, index=i),
                                                   batch_format="pyarrow")
                 for i, cell in enumerate(cells)]
        ds = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
        writer = functools.partial(_write_shards, store=self.store,
                                   dirs=[f"{c.dir}/_input" for c in cells],
                                   n_shards=[c.n_shards for c in cells])
        # Whole blocks, not small batches: every file written here is a read task later, and
        # on small machines a read task costs more than the rows in a small file.
        written = ds.map_batches(writer, batch_format="pyarrow", batch_size=None).take_all()
        files: dict[tuple[int, int], list[str]] = {}
        for w in written:
            files.setdefault((int(w["cell"]), int(w["shard"])), []).append(w["path"])
        out = {}
        for i, cell in enumerate(cells):
            shards, seen, dups, total = {}, set(), [], 0
            for s in sorted(s for (c, s) in files if c == i):
                rids = self.store.read_parquet(files[(i, s)], columns=[RID])[RID].to_pylist()
                for r in rids:
                    if r in seen:
                        dups.append(r)
                    seen.add(r)
                shards[str(s)] = {"rows": len(rids), "fingerprint": fingerprint(rids),
                                  "files": sorted(files[(i, s)])}
                total += len(rids)
            try:
                if dups:
                    raise StageFailed(f"input has {len(dups)} duplicate record id(s), e.g. "
                                      f"{dups[:5]}; ids must be unique within a cell")
                if total == 0:
                    raise StageFailed(f"input is empty ({', '.join(cell.inputs)})")
            except StageFailed as e:
                self._fail(stage, cell, e, reports)
                continue
            info = {"rows": total, "fingerprint": fingerprint(seen), "shards": shards,
                    "written_at": now(), "run_id": self.run_id}
            self.store.write_json(f"{cell.dir}/_input/_done.json", info)
            out[cell.id] = info
        return out

    def _process(self, stage: Stage, cells: list[Cell], cfg: XlingConfig, inputs: dict) -> None:
        """Stream the pending shards of some cells through one pipeline; commit each shard."""
        import ray.data
        from tqdm import tqdm

        todo: list[tuple[int, int]] = []  # (cell index, shard), in stream order
        for i, cell in enumerate(cells):
            self.store.delete_tree(f"{cell.dir}/_tmp")
            info, done = inputs[cell.id], committed_shards(self.store, cell.dir)
            self.log(f"[{stage.name}] {cell.id}: {info['rows']} input rows, {cell.n_shards} "
                     f"shards, {len(done)} already committed, {cell.n_shards - len(done)} to run")
            for s in range(cell.n_shards):
                if s in done:
                    continue
                if str(s) in info["shards"]:
                    todo.append((i, s))
                else:  # a shard no record hashed to: nothing to stream, commit it empty
                    self._commit(stage, cell, s, [], {"rows": 0, "fingerprint": fingerprint([])},
                                 set(), time.time())
        if not todo:
            return
        # Ordered streaming lets a shard commit as soon as the next shard's rows appear,
        # while one long-lived actor pool serves every shard of every cell in the group.
        ray.data.DataContext.get_current().execution_options.preserve_order = True
        owner = {self.store.fs_path(f): i for i, s in todo
                 for f in inputs[cells[i].id]["shards"][str(s)]["files"]}
        # `_cell` in the input files indexes the cells partitioned together, which need not
        # be this group (a rerun, other cells done): set it from the file each row came from.
        ds = ray.data.read_parquet(list(owner), filesystem=self.store.fs, shuffle=None,
                                   include_paths=True)
        ds = ds.map_batches(functools.partial(_retag_cell, owner=owner), batch_format="pyarrow")
        out = stage.map(ds, cells, cfg)
        total = sum(inputs[cells[i].id]["shards"][str(s)]["rows"] for i, s in todo)
        label = cells[0].id if len(cells) == 1 else f"{len(cells)} cells"
        bar = tqdm(total=total, desc=f"{stage.name} {label}", unit="rec",
                   disable=not self.progress, dynamic_ncols=True)
        delay = float(os.environ.get("XLING_FAULT_COMMIT_DELAY", "0") or 0)
        current, parts, seen, started = None, [], set(), time.time()

        def commit(key):
            if delay:
                time.sleep(delay)  # fault-injection hook: widens the window for kill tests
            cell = cells[key[0]]
            self._commit(stage, cell, key[1], parts, inputs[cell.id]["shards"][str(key[1])],
                         seen, started)

        for batch in out.iter_batches(batch_format="pyarrow", batch_size=None):
            if batch.num_rows == 0:
                continue
            keys = batch[CELL].to_numpy() * 1_000_000_000 + batch[SHARD].to_numpy()
            # A batch may span a shard boundary: split it where (cell, shard) changes.
            bounds = np.flatnonzero(np.diff(keys)) + 1
            for lo, hi in zip([0, *bounds], [*bounds, len(keys)]):
                piece = batch.slice(lo, hi - lo)
                key = (int(piece[CELL][0].as_py()), int(piece[SHARD][0].as_py()))
                if current is not None and key != current:
                    commit(current)
                    parts, seen, started = [], set(), time.time()
                current = key
                parts.append(piece)
                new = set(piece[RID].to_pylist()) - seen
                seen |= new
                bar.update(len(new))
        if current is not None:
            commit(current)
        bar.close()

    def _commit(self, stage: Stage, cell: Cell, shard: int, parts: list, expected: dict,
                seen: set, started: float) -> None:
        """Write a shard's output under a temporary name, move it into place, then mark it."""
        store, d = self.store, cell.dir
        tables = list(parts)
        missing = expected["rows"] - len(seen)
        if missing:
            # The stage lost records: they become error rows, never silent gaps.
            rids = store.read_parquet(expected["files"], columns=[RID])[RID].to_pylist()
            lost = [r for r in rids if r not in seen]
            tables.append(pa.table({RID: lost, stage.id_column: lost,
                                    ERROR: ["stage produced no output for this record"] * len(lost)}))
        table = (pa.concat_tables(tables, promote_options="default") if tables
                 else pa.table({ERROR: pa.array([], pa.string())}))
        if ERROR not in table.column_names:
            table = table.append_column(ERROR, pa.nulls(table.num_rows, pa.string()))
        table = table.drop_columns([c for c in (RID, SHARD, CELL) if c in table.column_names
                                    and c != stage.id_column])
        name = f"part-{shard:05d}.parquet"
        tmp = f"{d}/_tmp/{self.run_id}/{name}"
        store.write_parquet(tmp, table)
        store.move(tmp, f"{d}/{name}")
        errors = int(table.num_rows - pc.sum(pc.is_null(table[ERROR])).as_py()) if table.num_rows else 0
        store.write_json(f"{d}/_shards/{shard:05d}.json", {
            "shard": shard, "file": name, "rows": table.num_rows, "errors": errors,
            "input_rows": expected["rows"], "input_fingerprint": expected["fingerprint"],
            "lost_records": missing, "run_id": self.run_id, "host": socket.gethostname(),
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
            "inputs": {"sources": cell.inputs, "rows": inputs["rows"],
                       "fingerprint": inputs["fingerprint"],
                       "shards": {s: {"rows": v["rows"], "fingerprint": v["fingerprint"]}
                                  for s, v in inputs["shards"].items()}},
            "n_shards": cell.n_shards, "rows": rows, "errors": errors,
            "files": [markers[s]["file"] for s in sorted(markers)],
            "shards": {str(s): {k: markers[s][k] for k in ("rows", "errors", "run_id",
                                                           "committed_at", "seconds")}
                       for s in sorted(markers)},
            "run_ids": sorted({m["run_id"] for m in markers.values()}),
            "timings": {"first_commit": min(m["committed_at"] for m in markers.values()),
                        "last_commit": max(m["committed_at"] for m in markers.values()),
                        "this_run_seconds": round(time.time() - t0, 3)},
            "finished_at": now(),
            **extra,
        }
        store.delete_tree(f"{d}/_tmp")
        store.delete(f"{d}/_failed.json")
        store.write_json(f"{d}/_manifest.json", manifest)  # last: marks the cell done
        self.log(f"[{stage.name}] {cell.id}: committed {rows} rows ({errors} errors) -> "
                 f"{store.url(d)}")
        ran = sum(m["run_id"] == self.run_id for m in markers.values())
        return CellReport(cell, "done", rows, errors, ran, cell.n_shards, time.time() - t0)


def _tag_cell(batch: pa.Table, *, index: int) -> pa.Table:
    return batch.append_column(CELL, pa.array([index] * batch.num_rows, pa.int64()))


def _retag_cell(batch: pa.Table, *, owner: dict[str, int]) -> pa.Table:
    cells = pa.array([owner[p] for p in batch["path"].to_pylist()], pa.int64())
    batch = batch.drop_columns(["path"])
    return batch.set_column(batch.column_names.index(CELL), CELL, cells)


def _write_shards(batch: pa.Table, *, store: RunStore, dirs: list[str],
                  n_shards: list[int]) -> pa.Table:
    """map_batches task: split input rows by (cell, shard) into Parquet files in the store."""
    if RID not in batch.column_names:
        raise ValueError(f"stage input has no `{RID}` column (record id)")
    batch = batch.set_column(batch.column_names.index(RID), RID, pc.cast(batch[RID], pa.string()))
    cells = batch[CELL].to_numpy()
    shards = np.zeros(len(cells), dtype=np.int64)
    for c in np.unique(cells):
        rows = cells == c
        shards[rows] = shard_of(batch[RID].filter(pa.array(rows)), n_shards[c])
    batch = batch.append_column(SHARD, pa.array(shards, pa.int64()))
    out_c, out_s, out_p = [], [], []
    for c, s in sorted({(int(c), int(s)) for c, s in zip(cells, shards)}):
        part = batch.filter(pa.array((cells == c) & (shards == s)))
        rel = f"{dirs[c]}/{s:05d}/{uuid.uuid4().hex}.parquet"
        store.write_parquet(rel, part)
        out_c.append(c)
        out_s.append(s)
        out_p.append(rel)
    return pa.table({"cell": out_c, "shard": out_s, "path": out_p})


# ---------------------------------------------------------------------------------------
# reading state


def part_files(store: RunStore, rel_dir: str) -> list[str]:
    """The Parquet parts a cell has committed so far: what `Stage.finalize` reads, before
    the manifest that lists them exists."""
    return sorted(f for f in store.list(rel_dir) if f.rsplit("/", 1)[-1].startswith("part-"))


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
