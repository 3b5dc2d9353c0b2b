"""Fault test: SIGKILL the driver of a multi-shard stage mid-run, rerun, and check the output.

Runs the real `xling ingest` CLI (the tiny NLLB tokenizer, sentencex) on a corpus made from
the real Mr.TyDi passages in data/demo, with the run root on the SeaweedFS S3 server (a
local run root: the translate, index, generate and narrow kills in test_stage_kills.py).
The final output must hold exactly the input's record ids, and the shards committed before
the kill must not be recomputed: their markers (run id, commit time) are unchanged after
the rerun.
"""

import json
import os
import subprocess
import sys
import time

from helpers import (ROOT, ingest_config, kill_after_commits, markers, ok_here,
                     sentence_corpus, xling)
from xling.core.status import read_cell
from xling.core.store import RunStore

N_SHARDS = 12


def test_sigkill_mid_run_then_resume_on_s3(tmp_path, s3_env, tiny_models, ray_local):
    run_root = f"s3://xling-test/resume-{os.getpid()}-{int(time.time() * 1000)}"
    ids = sentence_corpus(tmp_path / "sentences.jsonl")
    cfg = ingest_config(tmp_path, run_root, N_SHARDS, name="resume")
    store = RunStore(run_root)

    # A slow commit (fault-injection knob) leaves a wide window to kill the driver in.
    proc = xling("ingest", "--config", str(cfg), "--no-progress",
                 env={"XLING_FAULT_COMMIT_DELAY": "1.5"}, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT)
    kill_after_commits(proc, store, "ingest")
    first = markers(store)
    assert 3 <= len(first) < N_SHARDS, "the kill should land mid-run"
    [cell] = [c for c in store.list_dirs("ingest")]
    assert not store.exists(f"ingest/{cell}/_manifest.json")
    committed = {s: store.read_bytes(f"ingest/{cell}/{m['file']}") for s, m in first.items()}

    # xling status sees a partial cell.
    st = subprocess.run([sys.executable, "-m", "xling.cli", "status", run_root, "--json"],
                        cwd=ROOT, capture_output=True, text=True, check=True)
    [row] = json.loads(st.stdout)
    assert row["state"] == "partial" and row["shards_done"] == len(first)

    # The rerun in this process, on its Ray (the killed one was the CLI's own process).
    out = ok_here("ingest", "--config", str(cfg), "-v")  # -v: the per-cell lines
    assert f"{len(first)} already committed, {N_SHARDS - len(first)} to run" in out

    final = markers(store)
    assert len(final) == N_SHARDS
    for s, m in first.items():  # committed shards were not recomputed, nor rewritten
        assert final[s] == m
        assert store.read_bytes(f"ingest/{cell}/{m['file']}") == committed[s]
    manifest = store.read_json(f"ingest/{cell}/_manifest.json")
    assert len(manifest["run_ids"]) == 2
    assert sum(m["run_id"] != manifest["run_ids"][0] for m in final.values()) >= 1

    table = read_cell(store, f"ingest/{cell}")
    got = table["doc_id"].to_pylist()
    assert len(got) == len(set(got)), "duplicated rows"
    good = [d for d, e in zip(got, table["error"].to_pylist()) if e is None]
    assert sorted(good) == sorted(ids), "missing or extra records"
    bad = [e for e in table["error"].to_pylist() if e]
    assert len(bad) == 1 and "malformed JSON" in bad[0]
    assert manifest["rows"] == len(ids) + 1 and manifest["errors"] == 1
    assert all(n > 0 for n in table["n_tokens"].to_pylist() if n is not None)
