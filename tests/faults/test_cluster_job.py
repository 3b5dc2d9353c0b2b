"""A stage submitted with `ray job submit` to a local two-node Ray cluster.

The cluster is two real raylets on this machine (xling.dev.localcluster, the same code as
cluster/local-ray-cluster.sh). The job uploads the repository as its working dir and runs
`xling ingest`; its actor pool is sized so that one actor fits per node, and the cluster's
state API must show actors of the job's DocumentStats pool on both nodes.
"""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path


from xling.dev.localcluster import start_local_cluster
from xling.core.store import RunStore

ROOT = Path(__file__).resolve().parents[2]


def test_ray_job_submit_runs_on_both_nodes(tmp_path, tiny_models):
    venv_bin = str(Path(sys.executable).parent)
    cluster = start_local_cluster(num_workers=1, cpus_per_node=3, tmp_root=tmp_path / "rc",
                                  extra_env={"PATH": f"{venv_bin}:{os.environ['PATH']}"})
    try:
        run_root = tmp_path / "run"
        cmd = [f"{venv_bin}/ray", "job", "submit", "--address", cluster.dashboard_url,
               "--working-dir", str(ROOT),
               "--runtime-env-json", json.dumps({"excludes": [".venv", "runs", ".xling-cache",
                                                              ".git"]}),
               "--", "xling", "ingest", "--config", "configs/demo.yaml", "--no-progress",
               f"run_root={run_root}", f"ingest.tokenizer={tiny_models['nllb_hf']}",
               "ingest.corpora.0.langs=[fi,sw,ru]", "ingest.parallel.concurrency=[2,2]",
               "ingest.parallel.num_cpus=2", "ingest.parallel.batch_size=1"]
        res = subprocess.run(cmd, env=cluster.client_env(), capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
        assert "succeeded" in (res.stdout + res.stderr).lower()

        store = RunStore(str(run_root))
        rows = [store.read_json(p) for p in store.list("ingest") if p.endswith("_manifest.json")]
        assert sorted(m["key"]["lang"] for m in rows) == ["fi", "ru", "ru", "sw"]
        assert all(m["errors"] == 0 and m["rows"] > 0 for m in rows)

        def state(kind):
            url = f"{cluster.dashboard_url}/api/v0/{kind}?limit=10000&detail=true"
            req = urllib.request.Request(url, headers=cluster.http_headers())
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.load(r)["data"]["result"]["result"]

        both = set(cluster.alive_node_ids())
        assert len(both) == 2
        actors = [a for a in state("actors") if "DocumentStats" in a.get("class_name", "")]
        assert {a["node_id"] for a in actors} == both, actors
        # And each of them did work: finished DocumentStats batches ran on both nodes.
        calls = [t for t in state("tasks") if "DocumentStats" in (t.get("name") or "")
                 and t.get("state") == "FINISHED" and t.get("type") == "ACTOR_TASK"]
        assert {t["node_id"] for t in calls} == both, calls
    finally:
        cluster.stop()
