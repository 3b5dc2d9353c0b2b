"""The commit protocol's worker side: deterministic shards (`shard_of`, `fingerprint`,
`rid_hashes`), the tasks that tag partition rows, write each output block's pieces
(`_write_pieces`) and turn a shard's pieces into its part file with its export
(`_commit_shard`), and the partition writer (`_write_shards`). They run in Ray tasks; the
driver (core/runner.py) sees only their metadata. The layout they write is in
core/runner.py's docstring.
"""

from __future__ import annotations

import socket
import uuid
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from xling.core.cells import CELL, ERROR, RID, SHARD
from xling.core.integrity import part_digest
from xling.core.store import RunStore

if TYPE_CHECKING:
    pass


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


def rid_hashes(rids) -> np.ndarray:
    """8-byte hashes of record ids: what workers tell the driver instead of the ids. They
    are `fingerprint`'s (seed 1), so that the partition writer hashes an id once for both
    (`_id_hashes`); nothing persists them."""
    values = rids.to_pylist() if isinstance(rids, (pa.Array, pa.ChunkedArray)) else rids
    return np.fromiter((xxhash.xxh64_intdigest(str(r).encode(), seed=1) for r in values),
                       dtype=np.uint64, count=len(values))


def _id_hashes(rids: pa.Array | pa.ChunkedArray, n_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """(`shard_of`, `rid_hashes`) of string ids in one pass: each id encoded once, its two
    digests taken together (the shard's seed 0 is persisted in every layout, so it stays)."""
    values = rids.to_pylist()
    both = np.fromiter(((xxhash.xxh64_intdigest(b) % n_shards,
                         xxhash.xxh64_intdigest(b, seed=1))
                        for b in (str(r).encode() for r in values)),
                       dtype=np.dtype((np.uint64, 2)), count=len(values))
    return both[:, 0].astype(np.int64), both[:, 1]


def _tag_cell(batch: pa.Table, *, index: int) -> pa.Table:
    return batch.append_column(CELL, pa.array([index] * batch.num_rows, pa.int64()))


def _read_sources(batch: pa.Table, *, readers: dict[int, Any]):
    """map_batches over read items (`path`, a byte `range`...) tagged with their source's
    index, one a batch: the item's rows, read by its source's reader and tagged."""
    for item in batch.to_pylist():
        i = item.pop(CELL)
        for t in readers[i](pa.Table.from_pylist([item])):
            yield _tag_cell(t, index=i)


def _tag_rows(batch: pa.Table, *, targets: dict[str, list[tuple[int, int]]],
              adapt: dict[int, Any]) -> pa.Table:
    """Partition rows -> the stage's input rows, with their cell and shard: a file's rows
    once for each (cell, shard) that reads it, each through its cell's `adapt`."""
    paths = batch["path"]
    batch = batch.drop_columns([c for c in ("path", CELL, SHARD) if c in batch.column_names])
    if batch.num_rows == 0:
        return batch.append_column(SHARD, pa.array([], pa.int64())).append_column(
            CELL, pa.array([], pa.int64()))
    out, unique = [], pc.unique(paths).to_pylist()
    for path in unique:
        rows = batch.filter(pc.equal(paths, path)) if len(unique) > 1 else batch
        for cell, shard in targets[path]:
            t = adapt[cell](rows) if adapt.get(cell) is not None else rows
            out.append(t.append_column(SHARD, pa.array(np.full(t.num_rows, shard), pa.int64()))
                        .append_column(CELL, pa.array(np.full(t.num_rows, cell), pa.int64())))
    return pa.concat_tables(out) if len(out) > 1 else out[0]


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
                **part_digest(store, final), **({"stats": counts(table)} if counts else {})}
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
            **part_digest(store, final), **({"stats": counts(table)} if counts else {})}


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
    hashes = np.zeros(len(cells), dtype=np.uint64)
    for c in np.unique(cells):
        rows = cells == c
        shards[rows], hashes[rows] = _id_hashes(batch[RID].filter(pa.array(rows)), n_shards[c])
    batch = batch.append_column(SHARD, pa.array(shards, pa.int64()))
    out = {k: [] for k in ("cell", "shard", "path", "rids", "xor")}
    keys = cells * 1_000_000_000 + shards
    for key in np.unique(keys):
        c, s = int(key // 1_000_000_000), int(key % 1_000_000_000)
        rows = keys == key
        part = batch.filter(pa.array(rows))
        rel = f"{dirs[c]}/{s:05d}/{uuid.uuid4().hex}.parquet"
        store.write_parquet(rel, part.drop_columns([CELL]))
        out["cell"].append(c)
        out["shard"].append(s)
        out["path"].append(rel)
        out["rids"].append(hashes[rows])
        # `fingerprint`'s XOR, computed here so that it combines across files
        out["xor"].append(int(np.bitwise_xor.reduce(hashes[rows])))
    return pa.table({**out, "rids": pa.array(out["rids"], pa.list_(pa.uint64())),
                     "xor": pa.array(out["xor"], pa.uint64())})
