"""The object-store budget the runner gives each stage's Ray Data pipelines
(core/pools.store_budget): per CPU of the cluster, not per document, so that the store's
peak stays flat as the corpus grows (benchmarks/scale.py measures it; docs/design.md
"Scale")."""

from __future__ import annotations

from xling.core.pools import STORE_FLOOR, STORE_PER_CPU, store_budget


def test_budget_is_per_cpu_of_the_cluster(monkeypatch):
    import ray  # not at import: see test_test_layout.py

    monkeypatch.delenv("XLING_STORE_MB_PER_CPU", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    for cpus, want in ((3.0, STORE_FLOOR), (64.0, 64 * STORE_PER_CPU),
                       (1.0, STORE_FLOOR)):  # at least the floor on a small cluster
        monkeypatch.setattr(ray, "cluster_resources", lambda c=cpus: {"CPU": c})
        assert store_budget() == want


def test_budget_before_ray_starts_and_its_override(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("XLING_STORE_MB_PER_CPU", raising=False)
    assert store_budget() == STORE_FLOOR == 128 << 20
    monkeypatch.setenv("XLING_STORE_MB_PER_CPU", "48")
    assert store_budget() == STORE_FLOOR  # no cluster yet: the floor
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    assert store_budget() == 8 * 48 << 20
