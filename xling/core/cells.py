"""What a stage is: its cells (`Cell`: one slice of the grid, with its key, params, hash and
shard count), the `Stage` contract (which cells a config asks for, how to read a cell's
input, how to map it), driver stages, where a cell's input rows come from (`Source`), and
the identity a manifest records (`code_version`, `write_driver_manifest`). The runner
(core/runner.py) runs stages; the plan (core/plan.py) links their cells.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from xling.core.config import stable_hash
from xling.core.memo import per_config
from xling.core.provenance import provenance
from xling.core.store import RunStore

if TYPE_CHECKING:
    from xling.config import XlingConfig
    from xling.core.runner import Runner


RID, SHARD, CELL, ERROR = "_rid", "_shard", "_cell", "error"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


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

    after_label: str = ""  # what `after_run` makes, for the plan's summary ("fusions")

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
    read_items, read_files
           a source that is files read piece by piece: `read_items()` lists the read tasks'
           inputs (`path`, and a byte `range` where a file is cut), and `read_files` maps a
           batch of one of them to its rows (with `_rid`), as `read` does through Ray Data.
           The runner then reads every such source of a stage in one pipeline operator, not
           one per source.
    """

    key: dict
    read: Callable[[], Any]
    adapt: Callable[[pa.Table], pa.Table] | None = None
    cell: str | None = None
    read_items: Callable[[], list[dict]] | None = None
    read_files: Callable[[pa.Table], Any] | None = None
