"""The run-root lease (core/lease.py) on a local root and on the SeaweedFS S3 server: who may
take it, when, and what a refused driver is told. The two drivers as real `xling` processes
are faults/test_two_drivers.py."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import uuid

import pytest

from xling.core import lease as lease_mod
from xling.core.lease import LEASE, LeaseHeld, acquire
from xling.core.store import RunStore


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> RunStore:
    if request.param == "local":
        return RunStore(str(tmp_path / "run"))
    request.getfixturevalue("s3_env")
    return RunStore(f"s3://xling-test/lease-{uuid.uuid4().hex[:8]}")


def plant(store: RunStore, **over) -> dict:
    """A lease held by another driver (another host unless `over` says otherwise)."""
    now = time.time()
    info = {"run_id": "20261129T000000-other", "host": "node-b", "pid": 4242,
            "proc_start": None, "command": "xling translate --config x.yaml",
            "started": now - 600, "heartbeat": now - 5, "ttl_s": 90, "token": "other", **over}
    store.write_json(LEASE, info)
    return info


def test_taken_beaten_and_released(store):
    lines = []
    held = acquire(store, "run-a", log=lines.append, ttl=3)
    try:
        info = store.read_json(LEASE)
        assert info["run_id"] == "run-a" and info["pid"] == os.getpid()
        assert info["host"] == socket.gethostname() and info["ttl_s"] == 3
        assert info["started_at"] and info["heartbeat_at"] and info["command"].startswith("xling")
        first = info["heartbeat"]
        time.sleep(1.2)  # beats every ttl/6 = 0.5 s
        assert store.read_json(LEASE)["heartbeat"] > first
        assert not lines  # nobody was taken over
    finally:
        held.release()
    assert not store.exists(LEASE)


def test_a_live_holder_refuses_with_who_since_when_and_what_to_do(store):
    plant(store)
    with pytest.raises(LeaseHeld) as e:
        acquire(store, "run-b")
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("20261129T000000-other", "pid 4242 on node-b", "xling translate --config x.yaml",
                 "since", "--takeover", "expires"):
        assert part in msg, (part, msg)
    # planted 5 s ago; a loaded CI machine may take a second or more to get here
    assert 5 <= int(re.search(r"last heartbeat (\d+)s ago", msg).group(1)) <= 30, msg
    assert store.read_json(LEASE)["token"] == "other"  # untouched


def test_a_stopped_heartbeat_expires_and_is_taken_over_saying_so(store):
    plant(store, heartbeat=time.time() - 200)
    lines = []
    held = acquire(store, "run-b", log=lines.append)
    try:
        assert store.read_json(LEASE)["run_id"] == "run-b"
        [line] = lines
        assert "took over" in line and "20261129T000000-other" in line
        assert 200 <= int(re.search(r"heartbeat stopped (\d+)s ago", line).group(1)) <= 230, line
    finally:
        held.release()


def test_takeover_forces_it(store):
    plant(store)
    lines = []
    held = acquire(store, "run-b", takeover=True, log=lines.append)
    try:
        assert store.read_json(LEASE)["run_id"] == "run-b"
        assert "--takeover" in lines[0] and "node-b" in lines[0]
    finally:
        held.release()


def test_a_holder_on_this_host_whose_process_is_gone_is_taken_over_at_once(store):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    plant(store, host=socket.gethostname(), pid=dead.pid)
    lines = []
    held = acquire(store, "run-b", log=lines.append)
    try:
        assert "its process is gone" in lines[0]
    finally:
        held.release()


def test_a_driver_whose_lease_was_taken_learns_it_at_its_next_heartbeat(store):
    held = acquire(store, "run-a", ttl=600)  # no beat during the test
    try:
        plant(store, token="usurper", heartbeat=time.time())
        assert held.heartbeat() is False and held.lost
        assert store.read_json(LEASE)["token"] == "usurper"  # not overwritten
    finally:
        held.release()  # a lost lease is not ours to remove
    assert store.read_json(LEASE)["token"] == "usurper"


def test_a_taken_over_driver_stops_before_recording_a_failure(store, capsys):
    """The new driver clears the pieces in flight at its start, so the old one can fail a
    commit before its next heartbeat; it then stops (exit 130) and marks nothing failed."""
    held = acquire(store, "run-a", ttl=600)  # no beat during the test
    try:
        lease_mod.stop_if_lost(store)  # still ours: nothing happens
        assert not held.lost
        plant(store, token="usurper", heartbeat=time.time())
        with pytest.raises(KeyboardInterrupt):
            lease_mod.stop_if_lost(store)
        held.say_lost()  # the heartbeat thread's line is not said twice
        err = capsys.readouterr().err
        assert err.count("this driver lost the run root") == 1 and "20261129T000000-other" in err
        assert store.read_json(LEASE)["token"] == "usurper"
    finally:
        held.release()


def test_run_roots_are_leased_separately(tmp_path):
    a = acquire(RunStore(str(tmp_path / "a")), "run-a")
    b = acquire(RunStore(str(tmp_path / "b")), "run-b")
    a.release()
    b.release()


def test_a_store_without_conditional_writes_falls_back_to_read_back(store, monkeypatch):
    if not store.is_s3:
        pytest.skip("the fallback is for S3 stores")
    # The probe result for this endpoint says "ignored", as for a store without them.
    key = (store.s3.meta.endpoint_url, store.bucket)
    monkeypatch.setitem(lease_mod._CONDITIONAL, key, False)
    t0 = time.time()
    held = acquire(store, "run-a")
    try:
        assert time.time() - t0 >= lease_mod.SETTLE_S  # written, then read back
        assert store.read_json(LEASE)["run_id"] == "run-a"
    finally:
        held.release()
    assert not store.exists(LEASE)
    plant(store)
    with pytest.raises(LeaseHeld):
        acquire(store, "run-b")


def test_seaweedfs_honours_conditional_writes(s3_env):
    store = RunStore(f"s3://xling-test/lease-{uuid.uuid4().hex[:8]}")
    assert lease_mod._S3Backend(store).conditional()
    assert not store.list("")  # the probe object is gone
