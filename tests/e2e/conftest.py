"""Every test here runs on its process's Ray node (tests/conftest.py::worker_ray)."""
import pytest


@pytest.fixture(autouse=True)
def _on_the_worker_ray(worker_ray):
    return worker_ray
