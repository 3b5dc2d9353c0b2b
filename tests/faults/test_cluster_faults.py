"""Fault test on a real multi-node Ray cluster: a worker node dies mid-stage.

A head and two worker nodes (`ray start`, xling/dev/localcluster.py) run `xling translate`
(the tiny NLLB, CTranslate2) over ~400 sentence records of the demo passages, then `xling
index` of their translations (BM25, Lucene), each stage with 8 shards. Once a few shards of
a stage are committed, one worker node's raylet is SIGKILLed, as a lost machine would be.
The stage must finish on the nodes left, with every record exactly once, and the shards
committed before the loss untouched (same marker, same bytes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from helpers import markers, sentence_corpus
from xling.core.status import read_cell
from xling.core.store import RunStore


ROOT = Path(__file__).resolve().parents[2]
SHARDS = 8


def _config(tmp_path: Path, corpus: Path) -> Path:
    cfg = tmp_path / "faults.yaml"
    cfg.write_text(f"""
name: faults
run_root: {tmp_path / 'run'}
stages: [translate, index]
translate:
  model: tiny:nllb_ct2
  beam_size: 1
  lang_check: "off"
  shards: {SHARDS}
  parallel: {{concurrency: [2, 2], batch_size: 8}}
  documents:
    - {{name: sents, format: jsonl, path: "{corpus}", langs: [en], targets: [de],
       id_field: id, title_field: null, text_field: body}}
index:
  engines: [bm25]
  shards: {SHARDS}
  collections:
    - {{name: sents, format: jsonl, path: "{corpus}", langs: [en], original: false,
       translated: [de], id_field: id, title_field: null, text_field: body}}
""")
    return cfg


def _kill_node(cluster, name: str) -> int:
    """SIGKILL the raylet of one node (its workers die with it)."""
    import psutil

    node = next(n for n in cluster.nodes if n.name == name)
    killed = 0
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "raylet" in cmd and node.temp_dir in cmd and "--raylet_socket_name" in cmd:
            os.kill(p.info["pid"], signal.SIGKILL)
            killed += 1
    return killed


def _stage_with_node_loss(cluster, cfg: Path, store: RunStore, stage: str, node: str,
                          tmp_path: Path) -> tuple[dict, dict, dict]:
    env = {**cluster.client_env(), "XLING_FAULT_COMMIT_DELAY": "1.0",
           "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / f"{stage}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "xling.cli", stage, "--config", str(cfg),
                             "--no-progress", "--address", cluster.address], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 400
    while len(markers(store, stage)) < 2:
        assert proc.poll() is None, (tmp_path / f"{stage}.log").read_text()[-3000:]
        assert time.time() < deadline, "no shard committed in time"
        time.sleep(0.2)
    before = markers(store, stage)
    [cell] = store.list_dirs(stage)
    parts = {s: store.read_bytes(f"{stage}/{cell}/{m['file']}") for s, m in before.items()}
    assert _kill_node(cluster, node) == 1
    assert proc.wait(timeout=600) == 0, (tmp_path / f"{stage}.log").read_text()[-4000:]
    assert len(before) < SHARDS, "the node should be lost mid-stage"
    after = markers(store, stage)
    assert len(after) == SHARDS
    for s, m in before.items():
        assert after[s] == m and store.read_bytes(f"{stage}/{cell}/{m['file']}") == parts[s]
    return before, after, store.read_json(f"{stage}/{cell}/_manifest.json")


def test_worker_node_lost_mid_translate_and_mid_index(tmp_path, tiny_models):
    from xling.dev.localcluster import start_local_cluster

    ids = sentence_corpus(tmp_path / "sentences.jsonl")
    cfg = _config(tmp_path, tmp_path / "sentences.jsonl")
    store = RunStore(str(tmp_path / "run"))
    cluster = start_local_cluster(num_workers=2, cpus_per_node=2, tmp_root=tmp_path / "cluster")
    try:
        _, _, m = _stage_with_node_loss(cluster, cfg, store, "translate", "worker1", tmp_path)
        [cell] = store.list_dirs("translate")
        got = read_cell(store, f"translate/{cell}")["id"].to_pylist()
        # every record exactly once (and the malformed line as one error row)
        assert len(got) == len(set(got)) == len(ids) + 1 and set(ids) <= set(got)
        assert m["rows"] == len(ids) + 1
        _, _, m = _stage_with_node_loss(cluster, cfg, store, "index", "worker2", tmp_path)
        [cell] = store.list_dirs("index")
        got = read_cell(store, f"index/{cell}")["doc_id"].to_pylist()
        assert len(got) == len(set(got)) == len(ids) + 1 and set(ids) <= set(got)
        # The DT documents were read in place from the translate cell (same shard count).
        assert m["inputs"]["partition"].startswith("translate/")
        assert m["lucene"]["documents"] > 0
    finally:
        cluster.stop()
