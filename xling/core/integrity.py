"""Committed parts checked against their shard markers when they are read.

A shard's commit task records the part's size and an xxh64 digest of its bytes in the
shard marker (`part_digest`), and the cell's manifest copies them. Reading a finished cell
(`read_parts`) reads each part's bytes once, checks size, digest and row count against the
manifest, and parses the rows from those same bytes, so a part damaged after its commit
(truncated, overwritten, bit rot) fails with the file's name and the fix instead of
returning other rows. Parts committed before markers had a digest are checked for their
row count only. `check_sizes` is the cheap check (one stat or HEAD per part) for parts that
Ray reads in place as a downstream stage's partition.

Files in a cell directory that xling did not write are never read as rows: a cell's rows are
the files its markers and manifest name (runner.part_files, read_cell), nothing listed.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from xling.core.store import RunStore, StoreError, concat_parts

_CHUNK = 8 << 20


class PartDamaged(StoreError):
    """A committed part's bytes differ from what its commit recorded."""


def _digest(data: bytes) -> str:
    return f"xxh64:{xxhash.xxh64_hexdigest(data)}"


def part_digest(store: RunStore, rel: str) -> dict:
    """What a shard marker records of its part: bytes and digest (the file read once)."""
    def digest() -> dict:
        h, n = xxhash.xxh64(), 0
        with store.fs.open_input_stream(store.fs_path(rel)) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                n += len(chunk)
        return {"bytes": n, "digest": f"xxh64:{h.hexdigest()}"}

    return store.retrying(f"read {store.url(rel)}", digest)


def _read_all(store: RunStore, rel: str) -> bytes:
    def read() -> bytes:
        with store.fs.open_input_stream(store.fs_path(rel)) as f:
            return f.read()

    return store.retrying(f"read {store.url(rel)}", read)


def _damaged(store: RunStore, rel_dir: str, name: str, what: str) -> PartDamaged:
    stage = rel_dir.split("/", 1)[0]
    return PartDamaged(
        f"{store.url(f'{rel_dir}/{name}')} is damaged: {what}, unlike when it was committed. "
        f"Redo the cell: delete {store.url(rel_dir)} and rerun `xling {stage} --config ...` "
        f"(or rerun it with --force, which redoes every {stage} cell)")


def _recorded(manifest: dict, name: str) -> dict:
    """The manifest's record of part `name` (its shard's entry; none for a driver cell's)."""
    m = re.fullmatch(r"part-(\d+)\.parquet", name)
    return manifest.get("shards", {}).get(str(int(m.group(1))), {}) if m else {}


def marker_shard(rel: str) -> int | None:
    """The shard of a marker path (`.../_shards/NNNNN.json`); None for any other file."""
    m = re.fullmatch(r"(\d{5})\.json", rel.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def read_parts(store: RunStore, rel_dir: str, manifest: dict,
               columns: list[str] | None = None) -> pa.Table:
    """The rows of a finished cell's parts, each checked against the manifest first."""
    files = []
    for name in manifest["files"]:
        rec = _recorded(manifest, name)
        try:
            data = _read_all(store, f"{rel_dir}/{name}")
        except FileNotFoundError:
            raise _damaged(store, rel_dir, name, "the file is missing") from None
        if "bytes" in rec and len(data) != rec["bytes"]:
            raise _damaged(store, rel_dir, name, f"{len(data)} bytes, the marker says "
                                                 f"{rec['bytes']}")
        if "digest" in rec and _digest(data) != rec["digest"]:
            raise _damaged(store, rel_dir, name, f"digest {_digest(data)}, the marker says "
                                                 f"{rec['digest']}")
        try:
            f = pq.ParquetFile(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as e:
            raise _damaged(store, rel_dir, name, f"not readable as Parquet ({e})") from None
        if "rows" in rec and f.metadata.num_rows != rec["rows"]:
            raise _damaged(store, rel_dir, name, f"{f.metadata.num_rows} rows, the marker says "
                                                 f"{rec['rows']}")
        files.append(f)
    return concat_parts(files, columns)


def check_sizes(store: RunStore, rel_dir: str, manifest: dict) -> None:
    """Every part the manifest lists is there with its recorded size (no bytes read)."""
    import pyarrow.fs as pafs

    names = manifest["files"]
    infos = store.fs.get_file_info([store.fs_path(f"{rel_dir}/{n}") for n in names])
    for name, info in zip(names, infos):
        rec = _recorded(manifest, name)
        if info.type == pafs.FileType.NotFound:
            raise _damaged(store, rel_dir, name, "the file is missing")
        if "bytes" in rec and info.size != rec["bytes"]:
            raise _damaged(store, rel_dir, name, f"{info.size} bytes, the marker says "
                                                 f"{rec['bytes']}")
