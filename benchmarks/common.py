"""What every benchmark reports, measured the same way on both sides.

steady state  records after the first output / time after it: what a long job runs at once
              pipelines, pools and models are up. For xling it is read off the runner's
              streams (`Runner.streams`: when each pipeline's first output reached the
              driver, with how many records, and when it ended); for the bare engine, off
              its own batches. Neither side counts its first output, so the ratio cannot
              read above 1 from start-up alone.
whole run     records / wall time, start-up included (and broken out).
"""

from __future__ import annotations


def stream_rates(runner, wall: float) -> dict:
    """xling's rates from a Runner that ran one stage: whole run, steady state, start-up."""
    streams = [s for s in runner.streams if s.get("first_output")]
    records = sum(s["records"] for s in runner.streams)
    after = sum(s["records"] - s["first_records"] for s in streams)
    busy = sum(s["ended"] - s["first_output"] for s in streams)
    startup = sum(s["first_output"] - s["started"] for s in streams)
    return {"records": records, "whole": records / wall if wall else 0.0,
            "steady": after / busy if busy > 0 else 0.0, "startup": startup,
            "first_records": sum(s["first_records"] for s in streams)}


def print_stats(runner) -> None:
    """Where xling's time went, per Ray Data operator (set XLING_STREAM_STATS=1)."""
    import re

    for st in runner.streams:
        for line in (st.get("stats") or "").splitlines():
            if re.match(r"^(Operator|\* Remote wall time|\* Remote cpu time|\* Output num rows)", line.strip()):
                print("   ", line.strip())


def print_ratios(unit: str, bare_steady: float, bare_whole: float, x: dict,
                 bare_startup: float = 0.0) -> None:
    print(f"{'':22s} {'bare':>12s} {'xling':>12s} {'ratio':>7s}")
    print(f"{'steady ' + unit:22s} {bare_steady:12.1f} {x['steady']:12.1f} "
          f"{x['steady'] / bare_steady if bare_steady else 0:7.2f}")
    print(f"{'whole run ' + unit:22s} {bare_whole:12.1f} {x['whole']:12.1f} "
          f"{x['whole'] / bare_whole if bare_whole else 0:7.2f}")
    print(f"{'start-up s':22s} {bare_startup:12.1f} {x['startup']:12.1f}")
