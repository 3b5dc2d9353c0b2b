"""A real two-node Ray cluster on this machine: `ray start` x2, `ray status`, `ray job submit`."""
from __future__ import annotations

import subprocess
import time
import textwrap
from pathlib import Path
import urllib.error
import urllib.request

import pytest

from xling.dev.localcluster import HEAD_RESOURCE, WORKER_RESOURCE, LocalCluster, ray_bin, start_local_cluster


ROOT = Path(__file__).resolve().parents[2]

JOB = textwrap.dedent(
    f"""
    import ray

    ray.init()  # RAY_ADDRESS comes from the job supervisor

    @ray.remote(num_cpus=0)
    def where():
        return ray.get_runtime_context().get_node_id()

    # Pinned by the custom resources each node was started with...
    on_head = ray.get(where.options(resources={{"{HEAD_RESOURCE}": 0.01}}).remote())
    on_worker = ray.get(where.options(resources={{"{WORKER_RESOURCE}": 0.01}}).remote())
    # ...and by a STRICT_SPREAD placement group: one bundle per node, whatever the load
    # (a plain SPREAD strategy is best effort and may pack short tasks on one node).
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{{"CPU": 1}}, {{"CPU": 1}}], strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=120)
    spread = set(ray.get([
        where.options(num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=i)).remote()
        for i in range(2)]))
    print("NODES", len(ray.nodes()))
    print("ON_HEAD", on_head)
    print("ON_WORKER", on_worker)
    print("SPREAD", " ".join(sorted(spread)))
    """
)


def _line(out: str, tag: str) -> list[str]:
    for line in out.splitlines():
        if line.startswith(tag + " "):
            return line.split()[1:]
    raise AssertionError(f"no {tag} line in job output:\n{out[-3000:]}")


def _listening_addresses(cluster: LocalCluster) -> set[str]:
    import psutil

    pids = {p.pid for p in cluster.processes()}
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, NotImplementedError):
        pytest.skip("cannot list sockets here")
    return {c.laddr.ip for c in conns if c.pid in pids and c.status == psutil.CONN_LISTEN}


def test_two_nodes_job_submit_and_clean_stop(tmp_path):
    cluster = start_local_cluster(num_workers=1, cpus_per_node=1, tmp_root=tmp_path / "cluster")
    try:
        node_ids = cluster.alive_node_ids()
        assert len(node_ids) == 2

        # `ray status` reads the autoscaler's report, which trails the GCS node table by a
        # few seconds on a busy machine: poll it rather than read it once.
        deadline = time.time() + 60
        while True:
            status = subprocess.run([ray_bin(), "status", "--address", cluster.address],
                                    env=cluster.client_env(), capture_output=True, text=True,
                                    timeout=120)
            assert status.returncode == 0, status.stderr[-3000:]
            seen = sum(f"node_{n}" in status.stdout for n in node_ids)
            if seen == 2 or time.time() > deadline:
                break
            time.sleep(2)
        assert seen == 2, status.stdout
        assert "2.0 CPU" in status.stdout and WORKER_RESOURCE in status.stdout

        # Loopback only, and the dashboard API wants this cluster's token.
        addresses = _listening_addresses(cluster)
        assert addresses and addresses <= {"127.0.0.1", "::ffff:127.0.0.1"}
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{cluster.dashboard_url}/api/v0/nodes", timeout=10)
        assert e.value.code in (401, 403)

        job_dir = tmp_path / "job"
        job_dir.mkdir()
        (job_dir / "where.py").write_text(JOB)
        res = subprocess.run(
            # The repository's runtime_env file, as on a real cluster; --working-dir wins over
            # its working_dir, so this also checks the file is one Ray accepts.
            [ray_bin(), "job", "submit", "--address", cluster.dashboard_url,
             "--runtime-env", str(ROOT / "cluster" / "runtime_env.yaml"), "--working-dir", str(job_dir),
             "--", "python", "where.py"],
            env=cluster.client_env(), capture_output=True, text=True, timeout=300)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-3000:]
        assert _line(out, "NODES") == ["2"]
        on_head, on_worker = _line(out, "ON_HEAD")[0], _line(out, "ON_WORKER")[0]
        assert {on_head, on_worker} == set(node_ids)
        assert set(_line(out, "SPREAD")) == set(node_ids)
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


def test_a_node_start_timeout_is_retried_once(monkeypatch, tmp_path):
    """Control flow only (a scripted failure): Ray's fixed raylet wait can run out on a loaded
    machine; the start is tried once more, and a second timeout or another error is raised."""
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
    monkeypatch.setattr(localcluster, "_start_local_cluster", scripted([timeout, timeout]))
    with pytest.raises(localcluster.LocalClusterError, match="timed out during startup"):
        start_local_cluster(tmp_root=tmp_path)
    assert len(calls) == 2
    calls.clear()
    other = localcluster.LocalClusterError("dashboard port 8265 is in use")
    monkeypatch.setattr(localcluster, "_start_local_cluster", scripted([other]))
    with pytest.raises(localcluster.LocalClusterError, match="in use"):
        start_local_cluster(tmp_root=tmp_path)
    assert len(calls) == 1
