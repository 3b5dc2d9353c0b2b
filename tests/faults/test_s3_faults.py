"""An object store that misbehaves (dev/faultproxy.py in front of the SeaweedFS S3 server):
a stage run through it commits exactly the rows of a clean run, and a persistent failure
ends the cell with a clear error that a rerun resumes from.

The clean run and the rerun are in this process, on its Ray node (whose workers reach the
server directly). The faulty runs are the real `xling ingest` CLI with a Ray of its own, so
that the driver and every worker (the pieces' writes, the commit tasks) talk to the proxy:

- flaky: 503 SlowDown, 500 InternalError, connection resets (before and after the server
  did the request) and delays, at the rates below; the retries are counted at the proxy
  (`amz-sdk-request: attempt=N` of boto3 and of pyarrow's AWS SDK); boto3's are logged
  ("attempt N of M failed") in the driver's and the workers' logs, and so are the rounds
  RunStore.retrying adds to pyarrow's (a 503 on a short ranged GET, which the SDK does not
  retry);
- persistent: every write of one part answers 503 SlowDown; with 3 attempts a request, that
  shard's commit fails, the cell ends failed with the S3 error in one line, and the rerun
  (the store healthy again) keeps the committed shards and redoes only that one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid

import pyarrow as pa

from helpers import ROOT, ingest_config, markers, ok_here, sentence_corpus
from xling.core.status import read_cell
from xling.core.store import RunStore
from xling.dev.faultproxy import FaultProxy, Faults

N_SHARDS = 6
RATES = Faults(slowdown=0.05, error500=0.03, reset=0.03, delay=0.05, delay_s=0.3, seed=47)


def _rows(store: RunStore) -> pa.Table:
    [cell] = store.list_dirs("ingest")
    return read_cell(store, f"ingest/{cell}").sort_by("doc_id")


def _through(proxy: FaultProxy, *args: str, attempts: int | None = None):
    """`xling *args` in a process of its own, with a local Ray of its own, whose driver and
    workers reach S3 through the proxy."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["AWS_ENDPOINT_URL"] = proxy.url
    if attempts:
        env["XLING_S3_MAX_ATTEMPTS"] = str(attempts)
    return subprocess.run([sys.executable, "-m", "xling.cli", *args, "--no-progress"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)


def _logged_retries(store: RunStore) -> dict[str, int]:
    """Retry lines in the run's logs (the driver's and the local Ray workers'): boto3's
    failed attempts, and RunStore.retrying's rounds of pyarrow I/O."""
    text = "".join(store.read_bytes(f).decode(errors="replace") for f in store.list("_logs"))
    return {"boto3 attempts": len(re.findall(r"attempt \d+ of \d+ failed", text)),
            "pyarrow rounds": len(re.findall(r"round \d+ of \d+ failed", text))}


def test_a_flaky_store_loses_and_duplicates_nothing(tmp_path, s3_env, s3_server, tiny_models,
                                                    ray_local):
    sentence_corpus(tmp_path / "sentences.jsonl")
    base = f"s3://xling-test/faults-{uuid.uuid4().hex[:8]}"
    clean = ingest_config(tmp_path, f"{base}/clean", N_SHARDS, name="clean")
    ok_here("ingest", "--config", str(clean))
    expected = _rows(RunStore(f"{base}/clean"))

    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"], RATES).start()
    try:
        flaky = ingest_config(tmp_path, f"{base}/flaky", N_SHARDS, name="flaky")
        t0 = time.time()
        p = _through(proxy, "ingest", "--config", str(flaky))
        stats = proxy.stats()
    finally:
        proxy.stop()
    print(f"\nS3 faults injected at {RATES}: {stats} ({time.time() - t0:.0f}s)")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    store = RunStore(f"{base}/flaky")
    got = _rows(store)
    ids = got["doc_id"].to_pylist()
    assert len(ids) == len(set(ids)), "duplicated rows"
    assert got.equals(expected), "the flaky run's rows differ from the clean run's"
    assert all(stats["faults"][k] > 0 for k in ("slowdown", "error500", "reset_before",
                                                   "reset_after", "delay")), stats
    assert stats["retries"].get("boto3", 0) > 0 and stats["retries"].get("aws-sdk-cpp", 0) > 0
    assert stats["max_attempt"] <= 8  # bounded
    logged = _logged_retries(store)
    print(f"retries logged in the run's logs: {logged}")
    assert logged["boto3 attempts"] > 0


def test_a_persistent_failure_ends_the_cell_clearly_and_the_rerun_resumes(
        tmp_path, s3_env, s3_server, tiny_models, ray_local):
    sentence_corpus(tmp_path / "sentences.jsonl")
    run_root = f"s3://xling-test/faults-{uuid.uuid4().hex[:8]}"
    cfg = ingest_config(tmp_path, run_root, N_SHARDS, name="persistent")
    # Every write of part 3 (the pieces' move, a merged part's upload) is throttled.
    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"],
                       Faults(slowdown=1.0, match=r"^(PUT|POST) .*/part-00003\.parquet")).start()
    try:
        p = _through(proxy, "ingest", "--config", str(cfg), attempts=3)
        stats = proxy.stats()
    finally:
        proxy.stop()
    print(f"\npersistent SlowDown on part-00003: {stats}\nexit {p.returncode}: "
          f"{p.stderr.strip().splitlines()[-2:]}")
    assert p.returncode == 1
    assert "ingest: 1 of 1 cell(s) failed" in p.stderr and "SlowDown" in p.stderr
    assert stats["max_attempt"] == 3  # three attempts a request, no more
    store = RunStore(run_root)
    first = markers(store)
    assert 3 not in first and first  # (commits in flight when it failed are redone)
    [cell] = store.list_dirs("ingest")
    assert "SlowDown" in store.read_json(f"ingest/{cell}/_failed.json")["error"]

    out = ok_here("ingest", "--config", str(cfg), "-v")
    assert f"{len(first)} already committed, {N_SHARDS - len(first)} to run" in out
    final = markers(store)
    assert all(final[s] == m for s, m in first.items())
    clean = ingest_config(tmp_path, f"{run_root}-clean", N_SHARDS, name="clean")
    ok_here("ingest", "--config", str(clean))
    assert _rows(store).equals(_rows(RunStore(f"{run_root}-clean")))
