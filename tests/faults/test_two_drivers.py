"""Two drivers on one run root (core/lease.py), local and on the SeaweedFS S3 server, with the
real `xling ingest` CLI as the first driver (commits slowed so that it is mid-stage):

- a second `xling ingest` on the same root while the first is alive refuses at once (exit 2,
  one line naming the first driver's run id, pid and host, since when, and --takeover), and
  touches nothing: the first finishes its shards undisturbed;
- once the first is SIGKILLed, the second takes the root over, saying so, resumes from the
  committed shards, and the rows equal a clean run's; the lease is gone at the end;
- `--takeover` against a live driver takes the root, and the first driver stops at its next
  heartbeat, saying it lost the root; the result again equals a clean run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pyarrow as pa
import pytest

from helpers import (here, ingest_config, kill_after_commits, markers, ok_here,
                     sentence_corpus, xling)
from xling.core.lease import LEASE
from xling.core.status import read_cell
from xling.core.store import RunStore

N_SHARDS = 8


@pytest.fixture(params=["local", "s3"])
def roots(request, tmp_path) -> tuple[str, str]:
    """(the contested root, a clean run's root)."""
    if request.param == "local":
        return str(tmp_path / "run"), str(tmp_path / "clean")
    request.getfixturevalue("s3_env")
    base = f"s3://xling-test/drivers-{uuid.uuid4().hex[:8]}"
    return f"{base}/run", f"{base}/clean"


def _rows(root: str) -> pa.Table:
    store = RunStore(root)
    [cell] = store.list_dirs("ingest")
    return read_cell(store, f"ingest/{cell}").sort_by("doc_id")


def _wait_for(cond, proc, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, f"no {what} in time"
        time.sleep(0.2)


def test_second_driver_refuses_while_the_first_lives_and_takes_over_after_its_death(
        tmp_path, roots, tiny_models, ray_local):
    root, clean_root = roots
    sentence_corpus(tmp_path / "sentences.jsonl")
    cfg = ingest_config(tmp_path, root, N_SHARDS)
    store = RunStore(root)
    first = xling("ingest", "--config", str(cfg), "--no-progress",
                  env={"XLING_FAULT_COMMIT_DELAY": "1.5"}, stdout=subprocess.PIPE,
                  stderr=subprocess.STDOUT)
    _wait_for(lambda: markers(store), first, "commit")
    holder = store.read_json(LEASE)
    assert holder["pid"] == first.pid

    refused = here("ingest", "--config", str(cfg))
    print(f"\nsecond driver, first alive: exit {refused.returncode}: {refused.stderr.strip()}")
    assert refused.returncode == 2
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"xling: error: run root {store.url()} is in use by run "
                           f"{holder['run_id']} (pid {first.pid} on ")
    assert "since" in line and "--takeover" in line
    assert store.read_json(LEASE)["token"] == holder["token"]  # untouched

    kill_after_commits(first, store, "ingest", n=3)
    before = markers(store)
    assert 3 <= len(before) < N_SHARDS, "the kill should land mid-stage"
    assert store.exists(LEASE)  # a killed driver leaves its lease behind

    out = ok_here("ingest", "--config", str(cfg), "-v")
    print(next(l for l in out.splitlines() if "took over" in l))
    assert (f"took over the run root {store.url()} from run {holder['run_id']}" in out
            and "its process is gone" in out)
    assert f"{len(before)} already committed, {N_SHARDS - len(before)} to run" in out
    after = markers(store)
    assert all(after[s] == m for s, m in before.items())
    assert not store.exists(LEASE)

    ok_here("ingest", "--config", str(ingest_config(tmp_path, clean_root, N_SHARDS, "clean")))
    got = _rows(root)
    ids = got["doc_id"].to_pylist()
    assert len(ids) == len(set(ids)) and got.equals(_rows(clean_root))


def test_takeover_forces_it_and_the_first_driver_stops_at_its_next_heartbeat(
        tmp_path, tiny_models, ray_local):
    root = str(tmp_path / "run")
    sentence_corpus(tmp_path / "sentences.jsonl")
    cfg = ingest_config(tmp_path, root, N_SHARDS)
    store = RunStore(root)
    first = xling("ingest", "--config", str(cfg), "--no-progress",
                  env={"XLING_FAULT_COMMIT_DELAY": "1.5", "XLING_LEASE_TTL": "3"},
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: markers(store), first, "commit")
        out = ok_here("ingest", "--config", str(cfg), "--takeover")
        assert "--takeover" in out and f"pid {first.pid}" in out
        code = first.wait(timeout=120)
        text = first.stdout.read().decode()
        print(f"\nfirst driver after the takeover: exit {code}: "
              f"{[l for l in text.splitlines() if 'lost the run root' in l]}")
        assert code == 130 and "this driver lost the run root" in text
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert not store.exists(LEASE)
    ok_here("ingest", "--config", str(ingest_config(tmp_path, str(tmp_path / "clean"),
                                                    N_SHARDS, "clean")))
    got = _rows(root)
    assert len(set(got["doc_id"].to_pylist())) == got.num_rows
    assert got.equals(_rows(str(tmp_path / "clean")))
