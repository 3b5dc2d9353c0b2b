"""Reading what a run root holds, without running anything: a cell's committed parts and
shard markers, its state (done, partial, failed), the state of every cell of a run root
(`xling status`), a committed cell's rows, and the check that an upstream cell is done
(`require_done`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from xling.core.cells import Cell, StageFailed
from xling.core.config import ConfigError
from xling.core.integrity import marker_shard, read_parts
from xling.core.store import RunStore

if TYPE_CHECKING:
    pass

# ---------------------------------------------------------------------------------------
# reading state


# Side files of a cell, beside its part files. Names starting with "_" are skipped by
# pyarrow's dataset discovery, so `pd.read_parquet(cell_dir)` reads exactly the cell's rows.
TABLE = "_table.md"  # the cell's markdown table (the report prints it)
ITEMS = "_items.parquet"  # a study's per-item scores
PLOTS = "_plots"  # a study's figures, `_plots/<name>.png`
SELECTIONS = "_selections.parquet"  # a narrow cell's ranked sentences (the study reads them)
# An index cell's Lucene index, a folder that is complete once its marker is written (index
# writes it, retrieve's searchers fetch it).
INDEX_DIR = "lucene/index"
LUCENE_MARKER = "_xling_lucene.json"


def part_files(store: RunStore, rel_dir: str) -> list[str]:
    """The Parquet parts a cell has committed so far: what `Stage.finalize` reads, before
    the manifest that lists them exists."""
    # The files the markers name: a file xling did not commit is never read as rows.
    return sorted(f"{rel_dir.strip('/')}/{m['file']}"
                  for m in committed_shards(store, rel_dir).values())


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
    markers = (store.read_json(p) for p in store.list(f"{rel_dir}/_shards")
               if marker_shard(p) is not None)  # not what others left in _shards/
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
    return read_parts(store, rel_dir, manifest, columns)  # each part checked against its marker


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
