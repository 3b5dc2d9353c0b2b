"""Moving code changes no cell: every config plans the cells it planned before (issue 25).

A cell's id ends in the hash of its params, and its directory (so every committed result)
is named by it. `tests/data/golden/cells.json` was written by `python tests/golden_plan.py
--write` before the studies moved into packages; a refactor that changes one id would re-run
finished work for every user of that config.
"""

from __future__ import annotations

import json

import pytest

from golden_plan import FIXTURE, configs, plans

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_golden_plan")


@pytest.fixture(scope="module")
def planned() -> dict[str, list[str]]:
    return plans()


def test_every_config_is_covered():
    assert sorted(json.loads(FIXTURE.read_text())) == sorted(p.name for p in configs())


@pytest.mark.parametrize("config", [p.name for p in configs()])
def test_cells_are_unchanged(planned, config):
    want = json.loads(FIXTURE.read_text())[config]
    got = planned[config]
    assert got == want, (f"{config}: cells changed: new {sorted(set(got) - set(want))[:5]}, "
                         f"gone {sorted(set(want) - set(got))[:5]}")
