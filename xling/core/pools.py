"""Sizing actor pools for `map_batches` from a config's `parallel:` section.

The operators around an actor pool (reading, writing) need CPUs too; a pool whose *minimum*
size takes every CPU never gets its input and, in Ray 2.60, the pipeline waits forever
without an error (seen here with concurrency=(2, 2) on a 2-CPU machine). We check the minimum against the cluster before
starting, lower it to what can start (the maximum still lets the pool grow), and say so.
"""

from __future__ import annotations

import math

from xling.core.config import ConfigError, Parallelism

# CPUs of a task that only reads, reshapes or writes Arrow tables around a pool. Ray Data
# defaults a task to one CPU, and Ray does not start it until a whole CPU is free: beside a
# pool that holds most of the CPUs, the small tasks before and after the pool then ran one
# at a time and starved it (index, 200k documents on 2 CPUs: the pipeline took 40 s, its
# Lucene actors were busy 13 s of it). Equal values also let Ray Data fuse such tasks.
LIGHT_CPUS = 0.25

# The object store a stage's pipelines may fill, per CPU of the cluster: about a block in
# flight per task (a JSON-lines read range is 32 MiB, sources._read_items; the pools' blocks
# are smaller). Ray Data's own budget is half the cluster's object store, and the read of
# the partition runs ahead of a slower pool until that fills, so the peak grew with the
# corpus: 122 MiB at 100k documents, 298 MiB at 1 M for the index stage on 3 CPUs; with
# this budget 93 and 105 MiB at 100k and 3 M (benchmarks/scale.py, docs/design.md "Scale:
# the object store stays flat"). $XLING_STORE_MB_PER_CPU overrides it (benchmarks).
STORE_PER_CPU = 32 << 20
# ... and at least this much on a small cluster: a pool needs a few blocks queued per actor,
# whatever the cluster's size, and the index's are up to 16 MiB (4 calls of 4,096 passages).
# At 64 MiB (2 CPUs' worth) its Lucene writers waited for input: 1.4 M documents indexed at
# 0.29 of bare's rate over the whole run, against 0.35 at 128 MiB and 0.38 with Ray Data's
# budget (benchmarks/index.py, 2 CPUs; ingest's rate did not move).
STORE_FLOOR = 128 << 20


def store_budget() -> int:
    """Bytes of object store the running stage's Ray Data pipelines may hold at once: the
    cluster's CPUs times `STORE_PER_CPU`, at least `STORE_FLOOR`."""
    import os

    import ray

    per_cpu = int(float(os.environ.get("XLING_STORE_MB_PER_CPU") or 0) * 2**20) or STORE_PER_CPU
    cpus = ray.cluster_resources().get("CPU", 0.0) if ray.is_initialized() else 0.0
    return max(int(cpus * per_cpu), STORE_FLOOR)


def actor_pool(p: Parallelism, *, key: str, log=print, calls_per_actor: int | None = None):
    """`compute=` for map_batches: an ActorPoolStrategy whose minimum can actually start.
    `calls_per_actor`: map calls each actor runs at once (a coroutine UDF's batches in
    flight; Ray 2.60 deprecates passing it as the remote arg `max_concurrency`)."""
    import ray
    import ray.data

    lo, hi = p.concurrency
    total = ray.cluster_resources()
    limits = []
    if p.num_cpus:
        limits.append(math.floor((total.get("CPU", 0) - 1) / p.num_cpus))  # one CPU for reads
    if p.num_gpus:
        if total.get("GPU", 0) < p.num_gpus:
            # Ray would wait for the GPU forever, without an error.
            raise ConfigError(f"{key}.num_gpus={p.num_gpus:g} but the Ray cluster has "
                              f"{total.get('GPU', 0):g} GPUs, so no actor could start; run on "
                              f"a cluster with GPUs (`xling doctor --device cuda` checks a "
                              f"node) or set {key}.num_gpus: 0")
        limits.append(math.floor(total.get("GPU", 0) / p.num_gpus))
    fits = max(1, min(limits)) if limits else lo
    if lo > fits:
        log(f"[{key}] concurrency min {lo} x (num_cpus={p.num_cpus}, num_gpus={p.num_gpus}) does "
            f"not fit beside the pipeline's other tasks on this cluster ({total.get('CPU', 0):g} CPUs, "
            f"{total.get('GPU', 0):g} GPUs); starting "
            f"with {fits} actor(s), growing to {hi} when resources free up")
        lo = fits
    return ray.data.ActorPoolStrategy(min_size=lo, max_size=max(lo, hi),
                                      max_concurrent_calls_per_actor=calls_per_actor)


def pool_resources(p: Parallelism, num_gpus: float | None = None) -> dict:
    """What a pool holds at its minimum size: its share when pools run side by side."""
    lo = p.concurrency[0]
    gpus = p.num_gpus if num_gpus is None else num_gpus
    return {"CPU": lo * p.num_cpus, "GPU": lo * gpus}


def pool_args(p: Parallelism, *, key: str, hosts: list | None = None) -> dict:
    """`compute=`, `num_cpus=` and `num_gpus=` for a model pool's map_batches: its own actors
    sized from `p`, or, when the model lives in the run's shared hosts (core/hosts.py), two
    forwarders per host (one's next batch queued while the other's runs) that ask no CPU:
    they mostly wait, and beside a host that holds a CPU a quarter CPU each was what the
    reads needing a whole one could not get."""
    import ray.data

    if hosts:
        return dict(compute=ray.data.ActorPoolStrategy(size=2 * len(hosts)), num_cpus=0,
                    num_gpus=0)
    return dict(compute=actor_pool(p, key=key), num_cpus=p.num_cpus, num_gpus=p.num_gpus)
