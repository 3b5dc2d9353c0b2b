"""A real two-node Ray cluster on this machine (`ray start` x2, xling.dev.localcluster, the same
code as cluster/local-ray-cluster.sh): `ray status`, loopback-only listeners, the dashboard's
token, and a stage submitted with `ray job submit`.

The job uploads the repository as its working dir, with the repository's runtime_env file as
on a real cluster, and runs `xling ingest`; its actor pool is sized so that one actor fits
per node, and the cluster's state API must show the job's DocumentStats actors, and batches
they finished, on both nodes. Then the cluster stops and leaves no process behind.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
import urllib.error
import urllib.request

import pytest

from xling.core.store import RunStore
from xling.dev.localcluster import HEAD_RESOURCE, WORKER_RESOURCE, LocalCluster, ray_bin, start_local_cluster


ROOT = Path(__file__).resolve().parents[2]


def _listening_addresses(cluster: LocalCluster) -> set[str]:
    import psutil

    pids = {p.pid for p in cluster.processes()}
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, NotImplementedError):
        pytest.skip("cannot list sockets here")
    return {c.laddr.ip for c in conns if c.pid in pids and c.status == psutil.CONN_LISTEN}


def _ray_status(cluster: LocalCluster, node_ids: list[str]) -> str:
    """`ray status` reads the autoscaler's report, which trails the GCS node table by a few
    seconds on a busy machine: poll it rather than read it once."""
    deadline = time.time() + 60
    while True:
        status = subprocess.run([ray_bin(), "status", "--address", cluster.address],
                                env=cluster.client_env(), capture_output=True, text=True,
                                timeout=120)
        assert status.returncode == 0, status.stderr[-3000:]
        if all(f"node_{n}" in status.stdout for n in node_ids) or time.time() > deadline:
            return status.stdout
        time.sleep(2)


def test_two_nodes_job_submit_and_clean_stop(tmp_path, tiny_models):
    venv_bin = str(Path(sys.executable).parent)
    cluster = start_local_cluster(num_workers=1, cpus_per_node=3, tmp_root=tmp_path / "cluster",
                                  extra_env={"PATH": f"{venv_bin}:{os.environ['PATH']}"})
    try:
        node_ids = cluster.alive_node_ids()
        assert len(node_ids) == 2
        status = _ray_status(cluster, node_ids)
        assert all(f"node_{n}" in status for n in node_ids), status
        assert "6.0 CPU" in status and HEAD_RESOURCE in status and WORKER_RESOURCE in status

        # Loopback only, and the dashboard API wants this cluster's token.
        addresses = _listening_addresses(cluster)
        assert addresses and addresses <= {"127.0.0.1", "::ffff:127.0.0.1"}
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{cluster.dashboard_url}/api/v0/nodes", timeout=10)
        assert e.value.code in (401, 403)

        run_root = tmp_path / "run"
        res = subprocess.run(
            # --working-dir wins over the file's working_dir, so this also checks that the
            # repository's runtime_env file (its excludes) is one Ray accepts.
            [ray_bin(), "job", "submit", "--address", cluster.dashboard_url,
             "--runtime-env", str(ROOT / "cluster" / "runtime_env.yaml"),
             "--working-dir", str(ROOT),
             "--", "xling", "ingest", "--config", "configs/demo.yaml", "--no-progress",
             f"run_root={run_root}", f"ingest.tokenizer={tiny_models['nllb_hf']}",
             "ingest.corpora.0.langs=[fi,sw,ru]", "ingest.parallel.concurrency=[2,2]",
             "ingest.parallel.num_cpus=2", "ingest.parallel.batch_size=1"],
            env=cluster.client_env(), capture_output=True, text=True, timeout=600)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert "succeeded" in out.lower()

        store = RunStore(str(run_root))
        rows = [store.read_json(p) for p in store.list("ingest") if p.endswith("_manifest.json")]
        assert sorted(m["key"]["lang"] for m in rows) == ["fi", "ru", "ru", "sw"]
        assert all(m["errors"] == 0 and m["rows"] > 0 for m in rows)

        def state(kind):
            url = f"{cluster.dashboard_url}/api/v0/{kind}?limit=10000&detail=true"
            req = urllib.request.Request(url, headers=cluster.http_headers())
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.load(r)["data"]["result"]["result"]

        both = set(node_ids)
        actors = [a for a in state("actors") if "DocumentStats" in a.get("class_name", "")]
        assert {a["node_id"] for a in actors} == both, actors
        # And each of them did work: finished DocumentStats batches ran on both nodes.
        calls = [t for t in state("tasks") if "DocumentStats" in (t.get("name") or "")
                 and t.get("state") == "FINISHED" and t.get("type") == "ACTOR_TASK"]
        assert {t["node_id"] for t in calls} == both, calls
    finally:
        stopped = cluster.stop()
    assert stopped > 0
    assert cluster.processes() == []
    leftovers = subprocess.run(["pgrep", "-af", str(cluster.nodes[0].temp_dir)], capture_output=True, text=True)
    assert leftovers.stdout == ""


def test_node_lookup_waits_longer_than_rays_fixed_30_s(monkeypatch):
    """A raylet that registers late (a loaded machine) is waited for; one that never does
    still fails, after XLING_RAYLET_START_WAIT_S."""
    import ray._private.services as services

    from xling.core.runtime import patient_node_lookup

    calls = []

    def late(gcs_address, node_id):  # registers on the third ask
        calls.append(node_id)
        if len(calls) < 3:
            raise RuntimeError("node info not available yet")
        return {"node_id": node_id}

    monkeypatch.setattr(services, "get_node", late)
    monkeypatch.setenv("XLING_RAYLET_START_WAIT_S", "5")
    patient_node_lookup()
    patient_node_lookup()  # idempotent: wrapped once
    assert services.get_node("gcs", "n1") == {"node_id": "n1"} and len(calls) == 3

    monkeypatch.setenv("XLING_RAYLET_START_WAIT_S", "0.6")

    def never(gcs_address, node_id):
        raise RuntimeError("node info not available")

    monkeypatch.setattr(services, "get_node", never)
    patient_node_lookup()
    with pytest.raises(RuntimeError):
        services.get_node("gcs", "n3")


def test_a_node_start_timeout_is_retried(monkeypatch, tmp_path):
    """Control flow only (a scripted failure): Ray's fixed raylet wait can run out on a loaded
    machine; the start is tried again, up to START_ATTEMPTS in all, and the last timeout or
    another error is raised."""
    from xling.dev import localcluster

    calls = []

    def scripted(errors):
        def start(**kw):
            calls.append(kw)
            if errors:
                raise errors.pop(0)
            return "cluster"
        return start

    timeout = localcluster.LocalClusterError("`ray start` for worker1 failed (exit 1)\n"
                                             "Exception: The current node timed out during "
                                             "startup.")
    monkeypatch.setattr(localcluster, "_start_local_cluster", scripted([timeout]))
    assert start_local_cluster(tmp_root=tmp_path) == "cluster" and len(calls) == 2
    calls.clear()
    died = localcluster.LocalClusterError("`ray start` for worker1 failed: its raylet died "
                                          "during startup: ... Timed out waiting for file")
    monkeypatch.setattr(localcluster, "_start_local_cluster", scripted([died]))
    assert start_local_cluster(tmp_root=tmp_path) == "cluster" and len(calls) == 2
    calls.clear()
    attempts = localcluster.START_ATTEMPTS
    assert attempts >= 2
    monkeypatch.setattr(localcluster, "_start_local_cluster", scripted([timeout] * attempts))
    with pytest.raises(localcluster.LocalClusterError, match="timed out during startup"):
        start_local_cluster(tmp_root=tmp_path)
    assert len(calls) == attempts
    calls.clear()
    other = localcluster.LocalClusterError("dashboard port 8265 is in use")
    monkeypatch.setattr(localcluster, "_start_local_cluster", scripted([other]))
    with pytest.raises(localcluster.LocalClusterError, match="in use"):
        start_local_cluster(tmp_root=tmp_path)
    assert len(calls) == 1


def test_a_raylet_that_died_starting_is_seen_in_its_log(tmp_path):
    """What `_ray_start` watches for while `ray start` waits (Ray's own wait is minutes): the
    fatal line of this start's raylet, not of an earlier session in the same folder."""
    from xling.dev.localcluster import _raylet_crash

    fatal = ("[2026-11-26 07:03:31,286 C 30338 30338] (raylet) node_manager.cc:3588: ... "
             "Check failed: ... Timed out waiting for file /tmp/x/w1/session_2/"
             "dashboard_agent_listen_port_e562")
    old = tmp_path / "session_1" / "logs"
    old.mkdir(parents=True)
    (old / "raylet.err").write_text(fatal + "\n")
    earlier = set(tmp_path.glob("session_*"))
    assert _raylet_crash(tmp_path, earlier) is None
    new = tmp_path / "session_2" / "logs"
    new.mkdir(parents=True)
    (new / "raylet.err").write_text("")
    assert _raylet_crash(tmp_path, earlier) is None  # starting, nothing fatal yet
    (new / "raylet.err").write_text("*** SIGABRT received\n" + fatal + "\n")
    assert "Timed out waiting for file" in _raylet_crash(tmp_path, earlier)
