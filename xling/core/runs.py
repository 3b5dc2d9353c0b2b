"""Run cells: hits rows by query, what retrieve (searches, imported runs, fusions) and rerank
make, and what rerank, evaluate and the studies read.

    RunStage                 the stage base of those cells: each part's TREC run and hit
                             counts are made as it commits
    export_trec(store, cell) the cell's `run.trec`, joined from its parts' runs
    searched_collections     the index collections a run cell's documents come from
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from xling.core import upstream
from xling.core.cells import Cell, Stage
from xling.core.commit import part_exports
from xling.core.status import part_files, part_stats
from xling.core.store import RunStore
from xling.tasks.runs import hit_counts, hits_trec_bytes

if TYPE_CHECKING:
    from xling.config import XlingConfig

HITS = pa.schema([("query_id", pa.string()), ("lang", pa.string()), ("doc_id", pa.string()),
                  ("rank", pa.int32()), ("score", pa.float64()), ("doc_lang", pa.string()),
                  ("system", pa.string()), ("error", pa.string())])

TREC_PART = (".trec", hits_trec_bytes)  # each part's TREC run, made by its commit task


class RunStage(Stage):
    """A stage whose cells are runs (hits rows, by query): retrieve's searches, imports and
    fusions, and rerank. Each part's TREC run and hit counts are made as it commits."""

    id_column = "query_id"
    part_export = TREC_PART
    part_counts = staticmethod(hit_counts)


def export_trec(store: RunStore, cell: Cell) -> dict:
    """Write the cell's hits as a TREC run file (`run.trec`), the format other tools read:
    the parts' runs, each formatted as its part was committed (`TREC_PART`), joined. A
    query's hits are all in one part, so the join is the run of all the parts at once."""
    data = part_exports(store, cell.dir, cell.n_shards, TREC_PART[0])
    counts = part_stats(store, cell.dir)
    if data is None or counts is None:  # parts committed by an xling that made neither
        files = part_files(store, cell.dir)
        table = store.read_parquet(files) if files else HITS.empty_table()
        data, counts = hits_trec_bytes(table), hit_counts(table)
    store.write_bytes(f"{cell.dir}/run.trec", data)
    store.delete_tree(f"{cell.dir}/_exports")
    return {"trec_run": "run.trec", **counts}


def searched_collections(cfg: XlingConfig, run: Cell) -> list[str]:
    """The index collections a retrieve cell searched (an imported run: the one it names):
    its run's `collection` for its document language; a fusion's, those of the runs it
    fuses."""
    leaves = [upstream.at(cfg, d) for d in run.inputs] if "fusion" in run.params else [run]
    dl = run.key["doc_lang"]
    return sorted({leaf.params["run"]["collection"].replace("{doc_lang}", dl)
                   for leaf in leaves})
