"""An operator's busy time, as the benchmarks' steady rate divides by it (issue 48): the
union of its calls' intervals (runner `union_seconds`, checked against sympy's interval
union), not their sum, for an actor that runs several batches at once; and
benchmarks/common.py's `stream_rates` on the two cases each measure is exact for."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import sympy

from xling.core.runner import _operator_times, union_seconds

_spec = importlib.util.spec_from_file_location(
    "bench_common", Path(__file__).resolve().parents[2] / "benchmarks" / "common.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
stream_rates = _common.stream_rates


def reference(intervals) -> float:
    total = 0.0
    for node in {n for n, _, _ in intervals}:
        total += float(sympy.Union(*(sympy.Interval(s, e) for n, s, e in intervals
                                     if n == node)).measure)
    return total


@pytest.mark.parametrize("seed", range(5))
def test_union_matches_sympy(seed):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, 100, 40)
    intervals = [(f"node{rng.integers(0, 2)}", int(s), int(s + rng.integers(0, 15)))
                 for s in starts]
    assert union_seconds(intervals) == pytest.approx(reference(intervals))


def test_overlaps_count_once_gaps_not_at_all_and_nodes_apart():
    # Four calls at once on one actor, then an idle second, then one more call.
    calls = [("a", 0.0, 2.0)] * 4 + [("a", 3.0, 4.0)]
    assert union_seconds(calls) == 3.0
    # The same clock readings on two nodes are two nodes' time (their clocks are their own).
    assert union_seconds([("a", 0.0, 2.0), ("b", 0.0, 2.0)]) == 4.0
    assert union_seconds([("a", 0.0, 1.0), ("a", 1.0, 2.0), ("a", 0.5, 1.5)]) == 2.0
    assert union_seconds([]) == 0.0


def _block(node, start, end):
    return SimpleNamespace(exec_stats=SimpleNamespace(node_id=node, start_time_s=start,
                                                      end_time_s=end))


def test_operator_times_walks_parents_and_skips_blocks_without_times():
    parent = SimpleNamespace(metadata={"ReadFiles": [_block("a", 0.0, 1.0), _block("a", 0.5, 2.0)]},
                             parents=[])
    stats = SimpleNamespace(metadata={"MapBatches(Gen)": [_block("a", 1.0, 3.0)] * 3
                                      + [SimpleNamespace(exec_stats=None)]},
                            parents=[parent])
    busy, union = _operator_times(SimpleNamespace(_raw_stats=lambda: stats))
    assert busy == {"MapBatches(Gen)": 6.0, "ReadFiles": 2.5}
    assert union == {"MapBatches(Gen)": 2.0, "ReadFiles": 2.0}
    assert _operator_times(object()) == ({}, {})  # no stats: no figures, never a failure


def test_steady_rate_divides_by_the_shorter_of_sum_per_actor_and_union():
    # One async actor, 4 calls at once for 10 s: busy 10 s, not 40.
    one_async = [{"records": 1000, "busy": {"MapBatches(Gen)": 40.0},
                  "union": {"MapBatches(Gen)": 10.0}, "started": 0.0, "first_output": 2.0}]
    r = stream_rates(one_async, 20.0, "Gen", 1)
    assert (r["steady"], r["whole"], r["startup"]) == (100.0, 50.0, 2.0)
    # Two actors, one call at a time each, 10 s each, overlapping: busy 20 s / 2 actors.
    two_sync = [{"records": 1000, "busy": {"MapBatches(Gen)": 20.0},
                 "union": {"MapBatches(Gen)": 12.0}, "started": 0.0, "first_output": 1.0}]
    assert stream_rates(two_sync, 20.0, "Gen", 2)["steady"] == 100.0
    # A stream without interval figures (nothing recorded): the sum per actor.
    assert stream_rates([{"records": 10, "busy": {"Gen": 5.0}}], 1.0, "Gen", 1)["steady"] == 2.0
