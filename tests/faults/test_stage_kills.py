"""A stage's driver SIGKILLed mid-stage, then rerun: the rerun picks up where the kill left
off. The killed run is the real `xling` CLI process; the rerun calls the same entry point in
the test process, on its Ray (tests/helpers.py `here`). Each kill lands after some shards
have committed (`kill_after_commits`, or a wait for the first marker), with commits slowed
by the XLING_FAULT_COMMIT_DELAY knob so that work is in flight when it lands; the driver's
process group goes with it, its local Ray included, as a lost node would.

- translate (tiny NLLB, 10 shards): killed after 3 committed shards; the rerun runs only the
  shards left, the committed markers stay as they were, it translates exactly what the first
  run had not committed, and the cell holds every document once (the one malformed line as
  its one error row);
- index (BM25, Lucene shard builds): killed after the first committed shard; the rerun builds
  only the shards that had no marker (the others keep their Lucene pieces), merges and drops
  the pieces, and the merged index holds every document once and scores like one built in
  one go;
- generate (tiny vLLM, 8 shards, commits lagging generation): killed after 2 committed
  shards; the rerun leaves the committed shards alone, every item has one row and no error,
  and nothing is generated twice: the rerun generates just what the LLM cache lacked, and
  the uncommitted shards' rows generated before the kill come from the cache;
- narrow (CROSS, tiny BGE-M3): killed after the first committed shard; no sentence or query
  is embedded twice (each text is in the embedding cache once) and every cell's rows are
  there once.

MIRAGE-Bench's run, killed in the features stage and in the arena and resumed, is its end-to-
end test (e2e/test_mirage_study.py). The same stages' other behaviour is checked in e2e/
(test_translate, test_llm_stages, test_cross_study) and integration/test_bm25.py.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc

from helpers import (
    CROSS_CONFIG,
    VLLM,
    cache_rows,
    collection,
    contents,
    generate_cell,
    kill_after_commits,
    markers,
    narrow_cells,
    ok_here,
    queries,
    sentence_corpus,
    top,
    translate_cells,
    xling,
)
from xling.core.status import read_cell
from xling.core.store import RunStore

ROOT = Path(__file__).resolve().parents[2]


# --- translate ------------------------------------------------------------------------------

N_SHARDS = 10


def test_sigkill_mid_corpus_then_resume(tmp_path, tiny_models, ray_local):
    ids = sentence_corpus(tmp_path / "sentences.jsonl")
    run_root = str(tmp_path / "run")
    cfg = tmp_path / "resume.yaml"
    cfg.write_text(f"""
name: resume
run_root: {run_root}
ray: {{num_cpus: 2}}
translate:
  beam_size: 1
  lang_check: "off"
  shards: {N_SHARDS}
  parallel: {{concurrency: [1, 1], batch_size: 16}}
  documents:
    - {{name: s, format: jsonl, path: {tmp_path / 'sentences.jsonl'}, langs: [en],
        id_field: id, title_field: null, text_field: body, targets: [de]}}
""")
    store = RunStore(run_root)
    proc = xling("translate", "--config", str(cfg), "--no-progress",
                 env={"XLING_FAULT_COMMIT_DELAY": "1.5"}, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT)
    kill_after_commits(proc, store, "translate", timeout=300)
    first = markers(store, "translate")
    assert 3 <= len(first) < N_SHARDS, "the kill should land mid-corpus"

    out = ok_here("translate", "--config", str(cfg), "-v")
    assert f"{len(first)} already committed, {N_SHARDS - len(first)} to run" in out
    final = markers(store, "translate")
    assert len(final) == N_SHARDS
    for s, m in first.items():
        assert final[s] == m, "a committed shard was recomputed"
    [d] = translate_cells(store).values()
    manifest = store.read_json(f"{d}/_manifest.json")
    rerun_id = next(r for r in manifest["run_ids"] if r != first[min(first)]["run_id"])
    # What the rerun translated is exactly what the first run had not committed.
    assert (sum(m["rows"] for m in final.values() if m["run_id"] == rerun_id)
            == len(ids) + 1 - sum(m["rows"] for m in first.values()))
    table = read_cell(store, d)
    got = table["id"].to_pylist()
    assert len(got) == len(set(got)), "duplicated rows"
    good = [i for i, e in zip(got, table["error"].to_pylist()) if e is None]
    assert sorted(good) == sorted(ids), "missing or extra documents"
    assert manifest["errors"] == 1  # the one malformed line


# --- index (BM25 / Lucene) ------------------------------------------------------------------


def test_killed_lucene_build_resumes(tmp_path, ray_local):
    lang, n_shards = "fi", 4
    data = tmp_path / "corpus.jsonl.gz"
    with gzip.open(data, "wt", encoding="utf-8") as f:
        for d in collection(lang):
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    cfg = tmp_path / "idx.yaml"
    cfg.write_text(f"""
name: idx
run_root: {tmp_path / 'run'}
stages: [index]
ray: {{num_cpus: 2}}
index:
  engines: [bm25]
  shards: {n_shards}
  collections:
    - {{name: c, format: mrtydi, path: '{data}', langs: [{lang}]}}
""")
    args = [sys.executable, "-m", "xling.cli", "run", "--config", str(cfg), "--no-progress"]
    store = RunStore(str(tmp_path / "run"))

    def shard_markers() -> dict[int, dict]:
        out = {}
        for c in store.list_dirs("index"):
            for rel in store.list(f"index/{c}/_shards"):
                m = store.read_json(rel)
                out[m["shard"]] = m
        return out

    # The Lucene segments are built in the map step, shard by shard; a slow commit
    # (fault-injection knob) leaves a window to kill the driver after some shards.
    proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "XLING_FAULT_COMMIT_DELAY": "2"},
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not shard_markers():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "no shard committed in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its local Ray, mid-stage
    proc.wait()
    before = shard_markers()
    assert 1 <= len(before) < n_shards, "the kill should land mid-stage"
    [cell] = store.list_dirs("index")
    assert not store.exists(f"index/{cell}/_manifest.json")
    pieces = {s: store.read_parquet(f"index/{cell}/{m['file']}")["lucene_piece"].to_pylist()
              for s, m in before.items()}

    ok_here("run", "--config", str(cfg))
    manifest = store.read_json(f"index/{cell}/_manifest.json")
    assert manifest["lucene"]["documents"] == len(collection(lang))
    after = shard_markers()
    for s, m in before.items():  # committed before the kill: not redone, same pieces
        assert after[s] == m
        assert store.read_parquet(f"index/{cell}/{m['file']}")["lucene_piece"].to_pylist() \
            == pieces[s]
    # pieces are merged, then dropped (those of the killed run too)
    assert not store.list(f"index/{cell}/lucene/pieces")
    # and the merged index scores like one built in one go
    from xling.actors.lucene import index_rows, open_searcher

    single = tmp_path / "single"
    index_rows([(d["docid"], contents(d)) for d in collection(lang)], str(single), lang)
    ref, ours = (open_searcher(str(p), lang, 0.9, 0.4)
                 for p in (single, store.key(f"index/{cell}/lucene/index")))
    for qid, q in queries(lang):
        assert top(ours, q) == top(ref, q), (qid, q)


# --- generate (tiny vLLM) -------------------------------------------------------------------


def test_generate_killed_and_resumed(tmp_path, tiny_models, ray_local):
    run_root = str(tmp_path / "run")
    n = 40
    (tmp_path / "p.jsonl").write_text("".join(
        json.dumps({"item_id": f"i{k:03d}", "prompt": f"Item {k}: name a city."}) + "\n"
        for k in range(n)))
    cfg = tmp_path / "resume.yaml"
    cfg.write_text(f"""
name: resume
run_root: {run_root}
ray: {{num_cpus: 2}}
generate:
  sampling: {{max_tokens: 8}}
  shards: 8
  prompts: [{{name: items, path: {tmp_path}/p.jsonl}}]
  models:
    - name: tiny
      {VLLM}
""")
    store = RunStore(run_root)
    env = {"XLING_FAULT_COMMIT_DELAY": "3"}  # commits lag generation: work in flight at the kill
    proc = xling("generate", "--config", str(cfg), "--no-progress", env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    kill_after_commits(proc, store, "generate", n=2, timeout=400)
    before = markers(store, "generate")
    cached_before = set(cache_rows(store)["key"].to_pylist())
    assert 2 <= len(before) < 8 and len(cached_before) > sum(m["rows"] for m in before.values())
    t0 = time.time()
    ok_here("generate", "--config", str(cfg))
    rows = read_cell(store, generate_cell(store, "items", "tiny"))
    assert sorted(rows["item_id"].to_pylist()) == [f"i{k:03d}" for k in range(n)]
    assert rows.num_rows == n and pc.sum(pc.is_valid(rows["error"])).as_py() == 0
    after = markers(store, "generate")
    for s, m in before.items():  # committed shards were not redone
        assert after[s]["run_id"] == m["run_id"] and after[s]["committed_at"] == m["committed_at"]
    # Nothing generated twice: the rerun generated exactly the prompts the cache lacked, and
    # the uncommitted shards' rows that were generated before the kill came from the cache.
    cache = cache_rows(store)
    keys = cache["key"].to_pylist()
    assert len(keys) == len(set(keys)) == n
    new = {k for k, at in zip(keys, cache["created_at"].to_pylist()) if at >= t0}
    assert new.isdisjoint(cached_before) and new | cached_before == set(keys)
    redone = [r for r in rows.to_pylist() if r["cache_key"] in cached_before
              and r["cached"]]
    assert redone, "no generation of an uncommitted shard was reused from the cache"


# --- narrow (CROSS, tiny BGE-M3) ------------------------------------------------------------


def test_killed_narrowing_resumes_without_embedding_twice(tmp_path, ray_local):
    root = str(tmp_path / "run")
    store = RunStore(root)
    cmd = ["narrow", "--config", str(CROSS_CONFIG), "--no-progress", f"run_root={root}",
           "narrow.shards=4", "narrow.parallel.batch_size=8", "study.options.query_langs=[en]"]
    proc = xling(*cmd, env={"XLING_FAULT_COMMIT_DELAY": "0.7"}, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT)
    kill_after_commits(proc, store, "narrow", n=1)
    assert len(markers(store, "narrow")) < 8, "the kill should land mid-stage"
    ok_here(*cmd)
    for clang, m in narrow_cells(store).items():
        ids = read_cell(store, m["dir"], columns=["_rid"])["_rid"].to_pylist()
        assert len(ids) == len(set(ids)) == m["rows"]
        n = m["narrow"]
        assert n["sentences_distinct"] + n["queries"] == m["rows"]
        keys = store.read_parquet(
            [f for f in store.list(n["cache_dir"]) if f.endswith(".parquet")],
            columns=["key"])["key"].to_pylist()
        dup = [k for k, c in Counter(keys).items() if c > 1]
        assert not dup, f"{len(dup)} texts embedded twice"
        assert len(keys) == m["rows"]
