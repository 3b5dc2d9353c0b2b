"""Shared pytest fixtures.

S3: `s3_server` is a real SeaweedFS S3 endpoint on 127.0.0.1 for the whole session (see
xling.dev.devstore), with the bucket `xling-test`; `s3_env` points the standard AWS
variables at it for one test.
"""
from __future__ import annotations

import pytest

from xling.dev.devstore import SHADOWING_AWS_VARS, S3Server, start_seaweedfs

S3_TEST_BUCKET = "xling-test"

# The modules that take minutes (Ray, vLLM, the JVM, subprocess runs), longest first. With
# pytest-xdist (`make test`: whole files per worker) they start first, so the run does not end
# with one worker alone on a long file while the others idle. Other modules keep their order.
SLOW_FIRST = ("test_mirage_study", "test_llm_stages", "test_retrieve", "test_studies",
              "test_cross_study", "test_translate", "test_resume", "test_localcluster",
              "test_bm25", "test_cluster_faults", "test_cluster_job", "test_feature_actors",
              "test_devstore", "test_tiny_models", "test_study_config", "test_llmclir_texts",
              "test_rerank", "test_runner", "test_sweep", "test_mirage_tasks")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda it: rank.get(it.module.__name__.rsplit(".", 1)[-1], len(rank)))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    srv = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    try:
        srv.create_bucket(S3_TEST_BUCKET)
        yield srv
    finally:
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
def ray_local():
    """One local Ray for the in-process tests; workers can import the test modules."""
    import os

    import ray
    import ray.data

    from xling.core.runtime import patient_node_lookup

    patient_node_lookup()  # two xdist workers start Rays side by side on 2 cores
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True,
             runtime_env={"env_vars": {"PYTHONPATH": here}})
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()
