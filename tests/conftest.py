"""Shared pytest fixtures, and the services one test run shares.

Layers (folders): unit/ (pure Python), integration/ (real engines on tiny models, stages
in-process), e2e/ (the CLI as a user runs it), faults/ (kills, node loss, S3 faults).

    s3_server    the run's one SeaweedFS S3 server (bucket `xling-test`), shared by every
                 xdist worker: the first test that needs it starts it, under a file lock;
                 the run's controller stops it at the end
    s3_env       the server's AWS variables, set for one test (and its subprocesses)
    worker_ray   one Ray node per test process (autouse outside unit/), 2 CPUs as the
                 tests' configs assume; sets RAY_ADDRESS, so the `xling` subprocesses join
                 it instead of each starting a Ray of their own
    ray_local    this process connected to that node, for the stages the integration tests
                 run in-process; its workers can import the test modules
    tiny_models  the tiny same-architecture models

One node per test process rather than one for the whole run: the tests of one process run
one at a time, so a job never queues behind another test's actors for the node's CPUs, and
every job sees the 2 CPUs its config was written for. A run-wide node of 8 CPUs was measured
slower: concurrent tests queued on each other's CPUs, and each job spawned more workers.
The node's processes carry the S3 server's AWS variables, as a real cluster's nodes carry
their store's credentials (Ray workers rebuild the run store from its URI, core/store.py).
What tests Ray's own start-up (`init_ray` in test_cli_basics, the multi-node clusters of
faults/) starts its own.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import environ
from xling.dev.devstore import SHADOWING_AWS_VARS, S3Server

S3_TEST_BUCKET = "xling-test"
TESTS = Path(__file__).resolve().parent
LAYERS = ("unit", "integration", "e2e", "faults")
# The modules that take minutes, longest first (measured). `make test` schedules test by
# test (pytest_xdist_make_scheduler below, in this order), so the long ones start first and the
# run does not end with one worker alone on a long test while the others idle. A module whose
# tests share a module fixture marks itself `xdist_group` (tests/unit/test_test_layout.py).
SLOW_FIRST = ("test_tiny_models", "test_cross_study", "test_mirage_study", "test_studies",
              "test_cluster_faults", "test_retrieve", "test_llmclir_ciral", "test_nugget_stage",
              "test_s3_faults", "test_benchmarks", "test_translate", "test_bm25",
              "test_llm_stages", "test_stage_kills", "test_resume", "test_localcluster",
              "test_doctor", "test_watchdog_vllm", "test_two_drivers", "test_engine_lifetimes",
              "test_sweep", "test_plan", "test_ct2_reranker", "test_hf_embedders",
              "test_devstore", "test_feature_actors", "test_runner", "test_dense",
              "test_imported_runs", "test_lease", "test_part_integrity", "test_llm_config",
              "test_study_config", "test_llmclir_texts", "test_translator_watchdog",
              "test_translate_flag", "test_report")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda it: rank.get(it.module.__name__.rsplit(".", 1)[-1], len(rank)))


def pytest_xdist_make_scheduler(config, log):
    """Test by test, in collection order; a module marked `xdist_group` as one unit. (xdist's
    own `--dist loadgroup` does this by renaming node ids, which pytest 9 no longer allows.)"""
    from xdist.scheduler import LoadScopeScheduling

    grouped = {f"tests/{p.parent.name}/{p.name}" for layer in LAYERS
               for p in (TESTS / layer).glob("test_*.py")
               if f'xdist_group("{p.stem}")' in p.read_text(encoding="utf-8")}

    class TestByTest(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path in grouped else nodeid

    return TestByTest(config, log)


def _services_dir(tmp_path_factory_or_config) -> Path:
    """One folder for the run's services: the controller's basetemp (xdist workers' basetemps
    are folders inside it)."""
    factory = getattr(tmp_path_factory_or_config, "_tmp_path_factory", tmp_path_factory_or_config)
    base = factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "services"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    from filelock import FileLock

    from xling.dev.devstore import running_server

    root = _services_dir(tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / "s3.lock")):
        srv = running_server(root / "seaweedfs")
        if srv is None:
            # The devstore CLI leaves the server running in its own session, not tied to
            # this worker (which may finish first); the controller stops it at the end.
            subprocess.run([sys.executable, "-m", "xling.dev.devstore", "start", "--dir",
                            str(root / "seaweedfs"), "--bucket", S3_TEST_BUCKET],
                           check=True, capture_output=True, text=True)
            srv = running_server(root / "seaweedfs")
    return srv


def pytest_sessionfinish(session):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller stops the server, once every worker is done
    from xling.dev.devstore import running_server

    srv = running_server(_services_dir(session.config) / "seaweedfs")
    if srv is not None:
        srv.stop()


@pytest.fixture
def s3_env(monkeypatch, s3_server) -> dict[str, str]:
    for k in SHADOWING_AWS_VARS:
        monkeypatch.delenv(k, raising=False)
    env = s3_server.env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture(scope="session")
def tiny_models() -> dict:
    """The tiny same-architecture models (built once; `make test` builds them first)."""
    from xling.dev.tiny_models import build_tiny_models

    return {k: str(v) for k, v in build_tiny_models(progress=False).items()}


@pytest.fixture(scope="session")
def worker_ray(tmp_path_factory, s3_server) -> dict[str, str]:
    from xling.dev.localcluster import pin_ray_to_loopback, start_local_cluster

    cluster = start_local_cluster(
        num_workers=0, cpus_per_node=2, tmp_root=tmp_path_factory.mktemp("ray"),
        dashboard=False,  # no test submits a job to it
        # Workers read the store as the driver does; no test may reach a model hub.
        object_store_mb=512, extra_env={**s3_server.env(), "HF_HUB_OFFLINE": "1"})
    # The drivers too (this process and its `xling` subprocesses): Ray Data's usage
    # collection is a driver-side actor and a Prometheus query per dataset otherwise.
    env = {**cluster.env(), "RAY_USAGE_STATS_ENABLED": "0"}
    with environ(env):
        pin_ray_to_loopback()  # a client of a loopback node needs it too (dev/localcluster.py)
        try:
            yield env
        finally:
            cluster.stop()


@pytest.fixture(scope="session")
def ray_local(worker_ray):
    """This process on the test process's Ray node; its workers can import the test
    modules."""
    import ray
    import ray.data

    path = os.pathsep.join([str(TESTS)] + [str(TESTS / layer) for layer in LAYERS])
    ray.init(address=worker_ray["RAY_ADDRESS"], ignore_reinit_error=True,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()
