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

CPU           beside the rates, CPU seconds per 1,000 records (`CPUMeter`, `print_cpu`):
              xling's: every process of the run, sampled (this one and its descendants, Ray's
              GCS, raylets, workers and actors, which Ray starts outside this tree); the
              engine's: what the actors spent inside their
              engine calls (xling/actors/enginecpu.py; workers inherit the folder named by
              $XLING_ENGINE_CPU_DIR, which `start_ray` sets); bare's: the same process-tree
              count around the bare side. overhead = (xling - engine) / bare: the CPU xling
              spends outside the engine, in units of the bare engine's own. Per-process and
              per-record CPU do not depend on how many cores share the work, nor on the
              other load of a shared machine (the machine's own count is printed beside it).

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

    import tempfile

    import ray
    import ray.data

    from xling.actors.enginecpu import ENV
    from xling.core.runtime import start_local_ray

    # Where the workers record their engine CPU (inherited from this process's environment
    # by a node started here; a job's runtime environment on a cluster joined).
    if not ray.is_initialized():
        os.environ.setdefault(ENV, tempfile.mkdtemp(prefix="xling-engine-cpu-"))
    if ray.is_initialized():
        stop = lambda: None  # noqa: E731 - the caller's Ray, not ours to end
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(logging_level=logging.WARNING,
                 runtime_env={"env_vars": {ENV: os.environ[ENV]}})
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


def _ray_session() -> str | None:
    """The session folder of the Ray node this process is connected to: every process of
    that node (GCS, raylet, workers) names it on its command line."""
    try:
        import ray

        if ray.is_initialized():
            return ray._private.worker.global_worker.node.get_session_dir_path()
    except Exception:  # noqa: BLE001 - no node to follow: this process's tree only
        pass
    return None


class CPUMeter:
    """CPU seconds from here to `stop()` of the processes a run uses (`tree`): this one, its
    descendants, and every process whose command line names a marker (the Ray session this
    process is connected to, and `markers`, e.g. a subprocess's $RAY_TMPDIR) with their
    descendants. Ray starts its GCS and raylets as daemons, outside this process's tree,
    and workers end while a stage runs, so they are sampled every `every` seconds (user +
    system of each process, its children's left out, so a reaped worker counts once; what a
    process uses after its last sample is lost, well under a second each). The sampler's
    own CPU is taken off. Also the engine calls the workers recorded (`engine`; None where
    no worker records, e.g. a Ray node started without $XLING_ENGINE_CPU_DIR), and the
    whole machine's CPU and load average (`machine`, `load`), for a shared machine."""

    def __init__(self, markers: tuple[str, ...] = (), every: float = 0.5, ray: bool = True):
        """`ray=False`: not the connected Ray node's processes (a bare side run beside it)."""
        import threading

        from xling.actors.enginecpu import ENV, read_totals

        self._markers = tuple(m for m in (_ray_session() if ray else None, *markers) if m)
        self._folder = os.environ.get(ENV)
        self._engine = read_totals(self._folder, (os.getpid(),)) if self._folder else {}
        self._machine, self._load = cpu_seconds()["machine"], os.getloadavg()[0]
        self._first: dict = {}  # (pid, start time) -> CPU at the first sample
        self._last: dict = {}  # (pid, start time) -> CPU at the last sample
        self._names: dict = {}  # (pid, start time) -> what it was at its last sample
        self._sampler_cpu = 0.0
        self._sample(first=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _processes(self):
        import psutil

        roots = [psutil.Process()]
        if self._markers:
            for p in psutil.process_iter(["cmdline"]):
                line = " ".join(p.info["cmdline"] or ())
                if any(m in line for m in self._markers):
                    roots.append(p)
        seen = {}
        for root in roots:
            try:
                for p in [root, *root.children(recursive=True)]:
                    seen[p.pid] = p
            except psutil.Error:
                pass
        return seen.values()

    def _sample(self, first: bool = False) -> None:
        import psutil

        for p in self._processes():
            try:
                key, t = (p.pid, p.create_time()), p.cpu_times()
                self._names[key] = _process_name(p)
            except psutil.Error:
                continue
            self._last[key] = t.user + t.system
            if first:
                self._first[key] = self._last[key]

    def _run(self, every: float) -> None:
        import time as _time

        while not self._stop.wait(every):
            t = _time.thread_time()
            self._sample()
            self._sampler_cpu += _time.thread_time() - t

    def stop(self) -> dict:
        from xling.actors.enginecpu import read_totals

        self._stop.set()
        self._thread.join()
        self._sample()
        used_by = {k: v - self._first.get(k, 0.0) for k, v in self._last.items()}
        tree = sum(used_by.values())
        where: dict[str, float] = {}
        for k, v in used_by.items():
            where[self._names[k]] = where.get(self._names[k], 0.0) + v
        where["driver"] = where.get("driver", 0.0) - self._sampler_cpu
        engine = read_totals(self._folder, (os.getpid(),)) if self._folder else {}
        used = sum(v - self._engine.get(pid, 0.0) for pid, v in engine.items())
        return {"tree": tree - self._sampler_cpu, "engine": used if engine else None,
                "where": dict(sorted(where.items(), key=lambda kv: -kv[1])),
                "machine": cpu_seconds()["machine"] - self._machine,
                "load": (self._load + os.getloadavg()[0]) / 2}


def _process_name(p) -> str:
    """A process by what it does: this one (the driver), a Ray worker by its title (its task
    or actor at the sample; ray::IDLE between tasks), else its program's name."""
    import psutil

    if p.pid == os.getpid():
        return "driver"
    try:
        line = p.cmdline()
    except psutil.Error:
        return p.name()
    if line and line[0].startswith("ray::"):  # ray::Class(...).method: the method left out
        title = line[0]
        return (title[:title.rfind(").") + 1] if ")." in title else title)[:90]
    return os.path.basename(line[0]) if line else p.name()


def print_cpu(records: int, xling: dict, bare: dict | None, bare_records: int | None = None,
              engine_label: str = "") -> dict:
    """The CPU lines beside the ratios: xling's, the engine's and bare's CPU seconds per
    1,000 records, and overhead = (xling - engine) / bare. Returns those figures."""
    k = max(records, 1) / 1000
    x, e = xling["tree"] / k, (xling["engine"] / k if xling["engine"] is not None else None)
    b = bare["tree"] / (max(bare_records or records, 1) / 1000) if bare else None
    over = (x - e) / b if e is not None and b else None
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    print(f"{'CPU-s per 1k records':22s} xling {fmt(x)}, engine {fmt(e)}{engine_label}, "
          f"bare {fmt(b)}, overhead {fmt(over)}")
    print(f"{'':22s} (xling's processes {xling['tree']:.1f} CPU-s; the machine's "
          f"{xling['machine']:.1f} CPU-s during xling, load avg {xling['load']:.1f})")
    top = list(xling.get("where", {}).items())[:8]
    print(f"{'':22s} xling's CPU-s by process: " + ", ".join(f"{n} {v:.1f}" for n, v in top))
    return {"xling": x, "engine": e, "bare": b, "overhead": over}
