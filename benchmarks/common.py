"""What every benchmark reports, measured the same way on both sides.

steady state  what a long job runs at once pipelines, pools and models are up. For xling:
              records / the model operator's busy time per actor, where its busy time is
              the time its actors spent inside their calls (Ray Data's operator stats,
              recorded by the runner in `Runner.streams` and the manifest's `stream`):
              the calls' summed time / actors, or the union of the calls' intervals where
              that is shorter. An async actor runs several calls at once (generate: 4),
              and the sum counts each overlap once per call, the union once. Neither is
              below an actor's busy time: the sum / actors is exact for actors that run
              one call at a time, the union for a single actor (a pool of several async
              actors would need each actor's own intervals; Ray Data records no actor).
              That is the pool's rate when it is never starved: it holds everything xling
              does around the engine inside the actor, and nothing of start-up, so it can
              only read above the bare engine's rate if the engine itself ran faster.
              For the bare engine: records / engine time, load excluded.
whole run     records / wall time, start-up included (and broken out).

Ray: each benchmark starts a fresh local node as xling starts one (`start_ray`), or joins
the node this process is already connected to, or the one $RAY_ADDRESS names (the smoke
tests, tests/integration/test_benchmarks.py, run every benchmark on their test node).
"""

from __future__ import annotations

import os


def stream_rates(runner_or_streams, wall: float, actor: str, actors: int) -> dict:
    """xling's rates from the streams of one stage run (a Runner, or the manifest's
    `stream` entries): whole run, steady state (see above), start-up (until the first
    output reached the driver). `actor` names the model operator (its class name)."""
    streams = getattr(runner_or_streams, "streams", runner_or_streams)
    records = sum(s["records"] for s in streams)
    busy = sum(t for s in streams for op, t in s.get("busy", {}).items() if actor in op)
    union = sum(t for s in streams for op, t in s.get("union", {}).items() if actor in op)
    per_actor = min(busy / actors, union) if union > 0 else busy / actors
    startup = sum(s["first_output"] - s["started"] for s in streams if s.get("first_output"))
    return {"records": records, "whole": records / wall if wall else 0.0,
            "steady": records / per_actor if per_actor > 0 else 0.0, "startup": startup,
            "busy": busy, "union": union}


def start_ray(num_cpus: int | None):
    """A local Ray node of `num_cpus` started as xling starts one (`start_local_ray`), or
    the Ray this process is connected to, or the cluster $RAY_ADDRESS names. Returns what
    ends it here: `ray.shutdown`, or nothing to do where this process was connected before."""
    import logging

    import ray
    import ray.data

    from xling.core.runtime import start_local_ray

    if ray.is_initialized():
        stop = lambda: None  # noqa: E731 - the caller's Ray, not ours to end
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(logging_level=logging.WARNING)
        stop = ray.shutdown
    else:
        start_local_ray(num_cpus, logging_level=logging.WARNING)
        stop = ray.shutdown
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars, ctx.print_on_execution_start = False, False
    return stop


def print_stats(runner) -> None:
    """Where xling's time went, per Ray Data operator (set XLING_STREAM_STATS=1)."""
    import re

    for st in runner.streams:
        for line in (st.get("stats") or "").splitlines():
            if re.match(r"^(Operator|\* Remote wall time|\* Remote cpu time|\* Output num rows)", line.strip()):
                print("   ", line.strip())


def print_ratios(unit: str, bare_steady: float, bare_whole: float, x: dict,
                 bare_startup: float = 0.0) -> None:
    # The whole run first: it is what a user waits for. Steady state is a diagnostic.
    print(f"{'':22s} {'bare':>12s} {'xling':>12s} {'ratio':>7s}")
    print(f"{'whole run ' + unit:22s} {bare_whole:12.1f} {x['whole']:12.1f} "
          f"{x['whole'] / bare_whole if bare_whole else 0:7.2f}")
    print(f"{'steady ' + unit:22s} {bare_steady:12.1f} {x['steady']:12.1f} "
          f"{x['steady'] / bare_steady if bare_steady else 0:7.2f}")
    print(f"{'start-up s':22s} {bare_startup:12.1f} {x['startup']:12.1f}")
    if "cpu" in x:  # from run_xling: is the machine busy, and with what
        print(f"{'CPU-s during xling':22s} machine {x['cpu']['machine']:.1f}, "
              f"driver {x['cpu']['driver']:.1f}")


def print_without_startup(xling_whole: float, bare_rate: float,
                          what: str = "a bare side without its start-up") -> None:
    """The whole-run ratio against the bare side's rate without (part of) its start-up,
    beside the one with it: the benchmarks count bare's import and model load in its whole
    run, as xling's holds its actors'."""
    print(f"  (whole-run ratio against {what}: {xling_whole / bare_rate:.2f})")


def cpu_seconds() -> dict:
    """CPU seconds used so far by this process (the driver: planning, Ray Data's executor,
    the runner's commits) and by the whole machine (/proc/stat; Linux), to tell a stage's
    overhead on the driver from its workers' work."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    out = {"driver": ru.ru_utime + ru.ru_stime}
    try:
        with open("/proc/stat") as f:
            user, nice, system = (int(x) for x in f.readline().split()[1:4])
        out["machine"] = (user + nice + system) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        out["machine"] = float("nan")
    return out
