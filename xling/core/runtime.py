"""The Ray runtime a run uses: start or join Ray once per process, quietly, and survive a
slow local start.

    init_ray(cfg, address, level)   join a cluster (`--address`, $RAY_ADDRESS, `ray.address`)
                                    or start a local Ray with `ray.num_cpus`
    start_local_ray(num_cpus, **kw) the local node as init_ray starts it (benchmarks too)
    patient_node_lookup()           give a new raylet more than Ray's fixed 30 s to register
    worker_reuse(num_cpus)          the raylet settings that keep idle workers for reuse

A local Ray that still times out starting is retried once with a fresh node. Everything
that starts Ray for xling goes through here: the pipeline (xling/pipeline.py), the local
multi-node cluster (dev/localcluster.py), the test fixtures and the benchmarks, so that
a benchmark times xling on the Ray its users get.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xling.config import XlingConfig


def init_ray(cfg: XlingConfig, address: str | None, level: int = logging.WARNING) -> None:
    """Start or join Ray. Quiet (level above INFO): workers' stdout/stderr stay in Ray's
    session logs (log_to_driver=False). The workers read XLING_LOG_LEVEL (see core/logs.py):
    a local Ray inherits it from this process; a cluster gets it through the job's
    runtime_env, or through ray.init's when the job does not set it. Reads only `cfg.ray`."""
    import ray

    from xling.core.logs import ENV, level_name

    address = address or os.environ.get("RAY_ADDRESS") or cfg.ray.address
    if ray.is_initialized():
        return
    quiet = level > logging.INFO
    kw = dict(logging_level=logging.WARNING if quiet else level, log_to_driver=not quiet)
    if quiet:
        from xling.core.logs import quiet_ray_loggers

        quiet_ray_loggers()
    if address:
        if ENV not in os.environ:  # never conflicts with the job's runtime_env
            kw["runtime_env"] = {"env_vars": {ENV: level_name(level)}}
        ray.init(address=address, **kw)
    else:
        os.environ[ENV] = level_name(level)  # the local raylet and its workers inherit it
        start_local_ray(cfg.ray.num_cpus, **kw)
    import ray.data

    if quiet:
        quiet_ray_loggers()
    # One bar per stage from the runner is clearer than Ray Data's per-operator bars.
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(max(level, logging.WARNING) if level > logging.DEBUG
                                           else level)


def start_local_ray(num_cpus: int | None, **kw) -> None:
    """`ray.init` of a local node with xling's settings: no dashboard, idle workers kept for
    reuse (`worker_reuse`), a patient node lookup, and one retry on a start-up timeout. `kw`
    goes to `ray.init` (logging)."""
    import ray

    patient_node_lookup()  # a loaded machine may need more than Ray's fixed 30 s
    for attempt in (1, 2):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False,
                     _system_config=worker_reuse(num_cpus), **kw)
            return
        except Exception as e:  # noqa: BLE001 - only Ray's start-up timeout is retried
            if attempt == 2 or "timed out during startup" not in str(e):
                raise
            # Seen on 2 overloaded cores: the GCS answers no lookup for minutes. A fresh
            # local node (new session, new ports) usually starts.
            logging.getLogger("xling").warning(
                "the local Ray node did not start in time; starting a new one")
            ray.shutdown()


# How long an idle worker above the node's soft limit lives, and the soft limit per CPU.
IDLE_WORKER_KEEP_MS = 60_000
WORKERS_PER_CPU = 4


def worker_reuse(num_cpus: int | None) -> dict[str, int]:
    """Raylet settings (`_system_config` keys; `RAY_<key>` for `ray start`) that keep idle
    workers for the next task.

    Ray's defaults kill an idle worker after 1 s once the node holds more workers than CPUs.
    xling's stages hold CPUs with actor pools while zero-CPU tasks (shard commits, reads,
    piece writes) come and go between them, so with the defaults nearly every such task
    started a new Python process, which imports pyarrow and xling first (2-3 CPU-seconds
    each). Measured on the XRAG end-to-end test, 2 cores: 84 worker processes and 453
    CPU-seconds with the defaults, 28 and 240 with these (wall 317 s -> 188 s). An idle
    worker costs ~100 MB, and one idle for a minute is still reaped.
    """
    cpus = num_cpus or os.cpu_count() or 1
    return {"idle_worker_killing_time_threshold_ms": IDLE_WORKER_KEEP_MS,
            "num_workers_soft_limit": max(8, WORKERS_PER_CPU * cpus)}


def patient_node_lookup() -> None:
    """Ray gives a new raylet a fixed 30 s to register with the GCS (`ray start` and a local
    `ray.init`, ray/_private/node.py) and reads no setting for it. On a loaded 2-core
    machine (CI, with other tests starting their own Ray) that is sometimes not enough, and
    the node start fails. Each lookup here keeps asking for up to XLING_RAYLET_START_WAIT_S
    (default 90 s) first. Idempotent."""
    import ray._private.services as services

    lookup = services.get_node
    if getattr(lookup, "_xling_patient", False):
        return
    wait_s = float(os.environ.get("XLING_RAYLET_START_WAIT_S", "90"))

    def patient(gcs_address, node_id, *args, **kwargs):
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return lookup(gcs_address, node_id, *args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    patient._xling_patient = True  # type: ignore[attr-defined]
    services.get_node = patient
