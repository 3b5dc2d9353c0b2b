"""Torn and foreign files in a committed cell (core/integrity.py), on the real ingest stage
(tiny NLLB tokenizer, 4 shards, the demo passages' sentences):

- a part whose bytes change after its commit (a flipped byte, a truncation) is refused when
  the cell is read, naming the file and the fix; the fix (delete the cell, rerun) gives the
  rows of the first run back;
- files xling did not write in a cell directory (a stray Parquet file, a `part-` file no
  marker names, notes in `_shards/`) are never read as rows: a rerun of the partial cell
  commits the same rows as before, and reading it returns exactly those.
"""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import ingest_config, ok_here, sentence_corpus
from xling.core.integrity import PartDamaged, check_sizes
from xling.core.status import cell_state, committed_shards, part_files, read_cell
from xling.core.store import RunStore


def _ingest(tmp_path) -> tuple[RunStore, str, str]:
    sentence_corpus(tmp_path / "sentences.jsonl")
    cfg = ingest_config(tmp_path, str(tmp_path / "run"), shards=4)
    ok_here("ingest", "--config", str(cfg))
    store = RunStore(str(tmp_path / "run"))
    [cell] = store.list_dirs("ingest")
    return store, f"ingest/{cell}", str(cfg)


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by("doc_id")


def test_a_part_damaged_after_commit_is_refused_naming_the_file_and_the_fix(
        tmp_path, tiny_models, ray_local):
    store, d, cfg = _ingest(tmp_path)
    before = _sorted(read_cell(store, d))
    manifest = store.read_json(f"{d}/_manifest.json")
    for s, m in committed_shards(store, d).items():  # the marker's record, in the manifest
        assert m["digest"].startswith("xxh64:") and m["bytes"] > 0
        assert {k: manifest["shards"][str(s)][k] for k in ("rows", "bytes", "digest")} == \
            {k: m[k] for k in ("rows", "bytes", "digest")}

    flipped = store.key(f"{d}/part-00001.parquet")
    data = bytearray(open(flipped, "rb").read())
    data[len(data) // 3] ^= 0x01  # one bit, inside the data pages; the size is unchanged
    open(flipped, "wb").write(bytes(data))
    with pytest.raises(PartDamaged) as e:
        read_cell(store, d)
    msg = str(e.value)
    print("damaged part:", msg)
    assert flipped in msg and "digest" in msg and "\n" not in msg
    assert f"delete {store.url(d)}" in msg and "xling ingest --config" in msg and "--force" in msg

    cut = store.key(f"{d}/part-00002.parquet")
    size = len(open(cut, "rb").read())
    with open(cut, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(PartDamaged, match=rf"part-00002\.parquet is damaged: {size - 100} bytes, "
                                          rf"the marker says {size}"):
        check_sizes(store, d, manifest)  # the stat-only check for parts Ray reads in place

    # The fix the message names: the cell deleted and rerun gives the same rows back.
    shutil.rmtree(store.key(d))
    ok_here("ingest", "--config", cfg)
    assert _sorted(read_cell(store, d)).equals(before)


def test_files_xling_did_not_write_are_never_read_as_rows(tmp_path, tiny_models, ray_local):
    store, d, cfg = _ingest(tmp_path)
    before = _sorted(read_cell(store, d))
    rows = store.read_json(f"{d}/_manifest.json")["rows"]
    # The cell made partial again (shard 3 uncommitted), with files nobody committed in it.
    store.delete(f"{d}/_manifest.json")
    store.delete(f"{d}/_shards/00003.json")
    store.delete(f"{d}/part-00003.parquet")
    stray = before.slice(0, 7)
    pq.write_table(stray, store.key(f"{d}/part-00009.parquet"))
    pq.write_table(stray, store.key(f"{d}/notes.parquet"))
    store.write_bytes(f"{d}/_shards/notes.json", b"not a marker")
    assert part_files(store, d) == [f"{d}/part-0000{s}.parquet" for s in range(3)]
    assert cell_state(store, d)["shards_done"] == 3

    ok_here("ingest", "--config", cfg)
    manifest = store.read_json(f"{d}/_manifest.json")
    assert manifest["files"] == [f"part-0000{s}.parquet" for s in range(4)]
    assert manifest["rows"] == rows
    assert _sorted(read_cell(store, d)).equals(before)
    assert store.exists(f"{d}/part-00009.parquet")  # left alone, and unread
