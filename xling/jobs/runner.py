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
one streaming pipeline per cell (one actor pool per model, loaded once) and commits shards as
they stream out of it in order.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import socket
import subprocess
import time
import traceback
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from xling.jobs.config import XlingConfig, stable_hash
from xling.jobs.store import RunStore

RID, SHARD, ERROR = "_rid", "_shard", "error"


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

    `read` returns a Ray Dataset whose rows carry a unique string `_rid`. `map` returns the
    output Dataset; every output row keeps its input's `_rid` and `_shard` (1:1 or 1:N), and
    failures are rows with a non-null `error`, never exceptions.
    """

    name: str = ""
    id_column: str = RID  # where a record id goes when the runner adds an error row

    @abstractmethod
    def cells(self, cfg: XlingConfig) -> list[Cell]: ...

    @abstractmethod
    def read(self, cell: Cell, cfg: XlingConfig): ...

    @abstractmethod
    def map(self, ds, cell: Cell, cfg: XlingConfig): ...

    def describe(self, cell: Cell) -> str:
        return ", ".join(f"{k}={v}" for k, v in cell.key.items())


class StageFailed(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------
# the runner


@dataclass
class CellReport:
    cell: Cell
    state: str  # done | skipped | failed | dry-run
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
        reports = []
        for cell in stage.cells(cfg):
            try:
                reports.append(self.run_cell(stage, cell, cfg))
            except Exception as e:  # the cell is marked failed; other cells still run
                self.store.write_json(f"{cell.dir}/_failed.json", {
                    "run_id": self.run_id, "at": now(), "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()})
                self.log(f"[{stage.name}] {cell.id}: FAILED: {type(e).__name__}: {e}")
                reports.append(CellReport(cell, "failed", message=str(e)))
        failed = [r for r in reports if r.state == "failed"]
        if failed:
            raise StageFailed(f"{stage.name}: {len(failed)} of {len(reports)} cell(s) failed: "
                              + "; ".join(f"{r.cell.id}: {r.message}" for r in failed))
        return reports

    def run_cell(self, stage: Stage, cell: Cell, cfg: XlingConfig) -> CellReport:
        store, d = self.store, cell.dir
        manifest = store.read_json_or_none(f"{d}/_manifest.json")
        if manifest and not self.force:
            self.log(f"[{stage.name}] {cell.id}: done earlier ({manifest['rows']} rows, "
                     f"{manifest['errors']} errors), skipped")
            return CellReport(cell, "skipped", manifest["rows"], manifest["errors"],
                              0, manifest["n_shards"])
        if self.force:
            store.delete_tree(d)
        t0 = time.time()
        self._write_plan(cell)
        inputs = self._partition(stage, cell, cfg)
        done = self._committed(cell)
        pending = [s for s in range(cell.n_shards) if s not in done]
        self.log(f"[{stage.name}] {cell.id}: {inputs['rows']} input rows, {cell.n_shards} shards, "
                 f"{len(done)} already committed, {len(pending)} to run")
        store.delete_tree(f"{d}/_tmp")
        if pending:
            self._process(stage, cell, cfg, inputs, pending)
        report = self._finish(stage, cell, inputs, t0)
        report.shards_run = len(pending)
        return report

    # ---- steps ---------------------------------------------------------------------
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

    def _partition(self, stage: Stage, cell: Cell, cfg: XlingConfig) -> dict:
        """Split the input into shard files once; later runs reuse them."""
        done_path = f"{cell.dir}/_input/_done.json"
        found = self.store.read_json_or_none(done_path)
        if found:
            return found
        self.store.delete_tree(f"{cell.dir}/_input")
        ds = stage.read(cell, cfg)
        writer = functools.partial(_write_shards, store=self.store,
                                   rel_dir=f"{cell.dir}/_input", n_shards=cell.n_shards)
        written = ds.map_batches(writer, batch_format="pyarrow", batch_size=4096).take_all()
        files: dict[int, list[str]] = {}
        for w in written:
            files.setdefault(int(w["shard"]), []).append(w["path"])
        shards, seen, dups, total = {}, set(), [], 0
        for s in sorted(files):
            rids = self.store.read_parquet(files[s], columns=[RID])[RID].to_pylist()
            for r in rids:
                if r in seen:
                    dups.append(r)
                seen.add(r)
            shards[str(s)] = {"rows": len(rids), "fingerprint": fingerprint(rids),
                              "files": sorted(files[s])}
            total += len(rids)
        if dups:
            raise StageFailed(f"input of {cell.id} has {len(dups)} duplicate record id(s), e.g. "
                              f"{dups[:5]}; ids must be unique within a cell")
        if total == 0:
            raise StageFailed(f"input of {cell.id} is empty ({', '.join(cell.inputs)})")
        info = {"rows": total, "fingerprint": fingerprint(seen), "shards": shards,
                "written_at": now(), "run_id": self.run_id}
        self.store.write_json(done_path, info)
        return info

    def _committed(self, cell: Cell) -> dict[int, dict]:
        out = {}
        for rel in self.store.list(f"{cell.dir}/_shards"):
            if rel.endswith(".json"):
                marker = self.store.read_json(rel)
                out[int(marker["shard"])] = marker
        return out

    def _process(self, stage: Stage, cell: Cell, cfg: XlingConfig, inputs: dict,
                 pending: list[int]) -> None:
        import ray.data
        from tqdm import tqdm

        # Shards with no input rows have nothing to stream; commit them empty.
        for s in [s for s in pending if str(s) not in inputs["shards"]]:
            self._commit(stage, cell, s, None, {"rows": 0, "fingerprint": fingerprint([])}, set())
        pending = [s for s in pending if str(s) in inputs["shards"]]
        if not pending:
            return
        # Ordered streaming lets a shard commit as soon as the next shard's rows appear,
        # while one long-lived actor pool serves every shard of the cell.
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        files = [self.store.fs_path(f) for s in pending for f in inputs["shards"][str(s)]["files"]]
        ds = ray.data.read_parquet(files, filesystem=self.store.fs, shuffle=None)
        out = stage.map(ds, cell, cfg)
        total = sum(inputs["shards"][str(s)]["rows"] for s in pending)
        bar = tqdm(total=total, desc=f"{stage.name} {cell.id}", unit="rec",
                   disable=not self.progress, dynamic_ncols=True)
        delay = float(os.environ.get("XLING_FAULT_COMMIT_DELAY", "0") or 0)
        current, parts, seen = None, [], set()
        started = time.time()
        for batch in out.iter_batches(batch_format="pyarrow", batch_size=None):
            if batch.num_rows == 0:
                continue
            shards = batch[SHARD].to_numpy()
            # A batch may span a shard boundary: split it where the shard changes.
            bounds = np.flatnonzero(np.diff(shards)) + 1
            for lo, hi in zip([0, *bounds], [*bounds, len(shards)]):
                piece, s = batch.slice(lo, hi - lo), int(shards[lo])
                if current is not None and s != current:
                    if delay:
                        time.sleep(delay)  # fault-injection hook for resume tests
                    self._commit(stage, cell, current, parts, inputs["shards"][str(current)], seen,
                                 started)
                    parts, seen, started = [], set(), time.time()
                current = s
                parts.append(piece)
                new = set(piece[RID].to_pylist()) - seen
                seen |= new
                bar.update(len(new))
        if current is not None:
            self._commit(stage, cell, current, parts, inputs["shards"][str(current)], seen, started)
        bar.close()

    def _commit(self, stage: Stage, cell: Cell, shard: int, parts: list | None, expected: dict,
                seen: set, started: float | None = None) -> None:
        """Write a shard's output under a temporary name, move it into place, then mark it."""
        store, d = self.store, cell.dir
        table = pa.concat_tables(parts, promote_options="default") if parts else None
        missing = expected["rows"] - len(seen)
        if missing:
            # The stage lost records: they become error rows, never silent gaps.
            rids = store.read_parquet(expected["files"], columns=[RID])[RID].to_pylist()
            lost = [r for r in rids if r not in seen]
            extra = pa.table({RID: lost, SHARD: [shard] * len(lost), stage.id_column: lost,
                              ERROR: ["stage produced no output for this record"] * len(lost)})
            table = extra if table is None else pa.concat_tables([table, extra],
                                                                 promote_options="default")
        if table is None:
            table = pa.table({ERROR: pa.array([], pa.string())})
        if ERROR not in table.column_names:
            table = table.append_column(ERROR, pa.nulls(table.num_rows, pa.string()))
        table = table.drop_columns([c for c in (RID, SHARD) if c in table.column_names
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
            "started_at": _dt.datetime.fromtimestamp(started or time.time(),
                                                     _dt.timezone.utc).isoformat(),
            "committed_at": now(), "seconds": round(time.time() - (started or time.time()), 3)})

    def _finish(self, stage: Stage, cell: Cell, inputs: dict, t0: float) -> CellReport:
        store, d = self.store, cell.dir
        markers = self._committed(cell)
        missing = [s for s in range(cell.n_shards) if s not in markers]
        if missing:
            raise StageFailed(f"{cell.id}: shards {missing[:10]} have no output after the run")
        rows = sum(m["rows"] for m in markers.values())
        errors = sum(m["errors"] for m in markers.values())
        manifest = {
            "stage": stage.name, "cell": cell.id, "key": cell.key, "params": cell.params,
            "config_hash": cell.hash, "code_version": code_version(),
            "inputs": {"sources": cell.inputs, "rows": inputs["rows"],
                       "fingerprint": inputs["fingerprint"],
                       "shards": {s: {k: v["rows"] if k == "rows" else v["fingerprint"]
                                      for k in ("rows", "fingerprint")}
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
        }
        store.delete_tree(f"{d}/_tmp")
        store.delete(f"{d}/_failed.json")
        store.write_json(f"{d}/_manifest.json", manifest)  # last: marks the cell done
        self.log(f"[{stage.name}] {cell.id}: committed {rows} rows ({errors} errors) -> "
                 f"{store.url(d)}")
        return CellReport(cell, "done", rows, errors, 0, cell.n_shards, time.time() - t0)


def _write_shards(batch: pa.Table, *, store: RunStore, rel_dir: str, n_shards: int) -> pa.Table:
    """map_batches task: split input rows by shard into Parquet files in the store."""
    if RID not in batch.column_names:
        raise ValueError(f"stage input has no `{RID}` column (record id)")
    batch = batch.set_column(batch.column_names.index(RID), RID, pc.cast(batch[RID], pa.string()))
    shards = shard_of(batch[RID], n_shards)
    batch = batch.append_column(SHARD, pa.array(shards, pa.int64()))
    out_s, out_p, out_n = [], [], []
    for s in np.unique(shards):
        part = batch.filter(pa.array(shards == s))
        rel = f"{rel_dir}/{int(s):05d}/{uuid.uuid4().hex}.parquet"
        store.write_parquet(rel, part)
        out_s.append(int(s))
        out_p.append(rel)
        out_n.append(part.num_rows)
    return pa.table({"shard": out_s, "path": out_p, "rows": out_n})


# ---------------------------------------------------------------------------------------
# reading state


def cell_state(store: RunStore, rel_dir: str) -> dict:
    """done / partial / failed / pending, with row and error counts, for one cell dir."""
    manifest = store.read_json_or_none(f"{rel_dir}/_manifest.json")
    if manifest:
        return {"state": "done", "rows": manifest["rows"], "errors": manifest["errors"],
                "shards_done": manifest["n_shards"], "n_shards": manifest["n_shards"],
                "message": manifest.get("finished_at", "")}
    plan = store.read_json_or_none(f"{rel_dir}/_plan.json") or {}
    markers = [store.read_json(p) for p in store.list(f"{rel_dir}/_shards") if p.endswith(".json")]
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
