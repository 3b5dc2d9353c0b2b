"""The run's plan: every cell the command's configs ask of each stage, with its inputs and
the engines it uses, built once per command and shown before any work.

    build_plan(cfgs, stages, registry)   the DAG: one `Node` per cell, in stage order
    Plan.check_inputs(store)             inputs that neither this run makes nor a run before
                                         it made: one ConfigError before Ray starts
    Plan.describe(store=None)            what `xling validate` and `--dry-run` print
    Plan.to_json(run_id)                 what each run writes to `_runs/<run id>/plan.json`
    gpu_fit_errors(plan)                 engines that Ray would put on one GPU but whose
                                         memory does not fit there

A node's inputs are typed edges, found from the cell itself: a cell names an upstream cell
by its id (`indexes: {fi: <index cell id>}`, `translation: <id>`) or by its directory
(`translate/<id>`) in its params or inputs, so each such reference is an edge whose role is
where it was found. Whatever else a cell reads is a source file, listed once per command
(core/memo.py). Cell ids and hashes are the stages' own: the plan only reads them.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xling.core.config import ConfigError
from xling.core.cells import Cell
from xling.core.status import cell_state

if TYPE_CHECKING:
    from xling.config import XlingConfig
    from xling.core.store import RunStore


@dataclass
class Node:
    """One cell of the plan."""

    stage: str
    cell: Cell
    runs: bool  # one of this command's stages (else: a stage it reads from)
    after: bool = False  # made by the stage's `after_run` (a fusion), not by its pipeline
    inputs: dict[str, str] = field(default_factory=dict)  # role -> upstream node dir
    sources: list[str] = field(default_factory=list)  # files from outside the run store

    @property
    def dir(self) -> str:
        return self.cell.dir


@dataclass
class EngineUse:
    """One engine (an LLM or an embedder, by the key that lets stages share it) and the
    stages of the command that use it, in run order."""

    key: str
    label: str
    model: str
    stages: list[str]
    specs: list = field(repr=False, default_factory=list)

    @property
    def first(self) -> str:
        return self.stages[0]

    @property
    def last(self) -> str:
        return self.stages[-1]


@dataclass
class Plan:
    stages: list[str]  # this command's stages, in run order (report included)
    nodes: list[Node]
    engines: list[EngineUse]
    unlisted: dict[str, str] = field(default_factory=dict)  # stage -> why it has no nodes
    after_labels: dict[str, str] = field(default_factory=dict)  # stage -> what after_run makes

    def of(self, stage: str) -> list[Node]:
        return [n for n in self.nodes if n.stage == stage]

    def run_cells(self, stage: str) -> list[Cell]:
        """The cells the stage's pipeline runs (its `cells`, without what `after_run` makes)."""
        return [n.cell for n in self.of(stage) if not n.after]

    def engine_specs(self, stage: str) -> list:
        """The shareable engine entries the stage's pools run."""
        return [spec for e in self.engines for st, spec in e.specs if st == stage]

    def check_inputs(self, store: "RunStore") -> None:
        """Every input of a node to run is made by this run or was committed before: else
        one ConfigError naming the missing cells and the command that makes them."""
        made = {n.dir for n in self.nodes if n.runs}
        by_dir = {n.dir: n for n in self.nodes}
        missing: dict[str, list[str]] = {}
        for node in self.nodes:
            if not node.runs:
                continue
            for role, up in node.inputs.items():
                if up in made or up in missing:
                    continue
                if store.read_json_or_none(f"{up}/_manifest.json") is None:
                    missing.setdefault(up, []).append(f"{node.dir} ({role})")
        if missing:
            stages = sorted({by_dir[d].stage for d in missing})
            lines = [f"  {d}, needed by {', '.join(needs[:2])}"
                     + (f" and {len(needs) - 2} more" if len(needs) > 2 else "")
                     for d, needs in list(missing.items())[:8]]
            more = f"\n  ... and {len(missing) - 8} more" if len(missing) > 8 else ""
            raise ConfigError(
                f"{len(missing)} input cell(s) are not done and this command does not make "
                f"them:\n" + "\n".join(lines) + more + "\n"
                + "; ".join(f"run `xling {s} --config ...` first" for s in stages)
                + " (or add " + ", ".join(stages) + " to the stages you run)")

    # ---- what a person reads -------------------------------------------------------
    def describe(self, store: "RunStore | None" = None, *, force: bool = False) -> list[str]:
        """Per stage: its cells and what they need; then each engine with its first and last
        stage. With `store` (`--dry-run`), each node's state: done, partial k/n, pending,
        stale (started with another shard count)."""
        lines = []
        width = max([len(s) for s in self.stages] + [5])
        for stage in self.stages:
            nodes = self.of(stage)
            if stage == "report":
                lines.append(f"{stage:<{width}}  the run's report (report/index.html)")
                continue
            if stage in self.unlisted:
                lines.append(f"{stage:<{width}}  cells not listed: {self.unlisted[stage]}")
                continue
            needs: dict[str, set] = {}
            files = set()
            for n in nodes:
                for up in n.inputs.values():
                    needs.setdefault(up.split("/", 1)[0], set()).add(up)
                files.update(n.sources)
            what = [f"{len(v)} {k} cell(s)" for k, v in needs.items()]
            if files:
                what.append(f"{len(files)} source file(s)")
            text = f"{stage:<{width}}  {len(nodes):>4} cell(s)"
            after = sum(n.after for n in nodes)
            if after:
                text += f" ({after} made after its pipeline: {self.after_labels.get(stage, '')})"
            text += f"; needs {', '.join(what)}" if what else ""
            if store is not None:
                states: dict[str, int] = {}
                for n in nodes:
                    state = node_state(store, n, force=force)
                    states[state.split(" ")[0]] = states.get(state.split(" ")[0], 0) + 1
                text += "  [" + ", ".join(f"{v} {k}" for k, v in states.items()) + "]"
            lines.append(text)
        if self.engines:
            lines.append("engines (each loaded once, at its first stage, released after its "
                         "last):")
            for e in self.engines:
                span = e.first if e.first == e.last else f"{e.first} -> {e.last}"
                lines.append(f"  {e.label} ({e.model}): {span}"
                             + (f" (used by {', '.join(e.stages)})" if len(e.stages) > 2 else ""))
        return lines

    def to_json(self, run_id: str) -> dict:
        return {
            "run_id": run_id,
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "stages": self.stages,
            "nodes": [{"stage": n.stage, "cell": n.cell.id, "dir": n.dir, "key": n.cell.key,
                       "hash": n.cell.hash, "n_shards": n.cell.n_shards, "runs": n.runs,
                       "inputs": n.inputs, "sources": n.sources} for n in self.nodes],
            "engines": [{"label": e.label, "model": e.model, "key": e.key,
                         "stages": e.stages, "first": e.first, "last": e.last}
                        for e in self.engines],
        }


def node_state(store: "RunStore", node: Node, *, force: bool = False) -> str:
    """done, partial k/n, pending, or stale (its _plan.json has another shard count)."""
    if force:
        return "pending (--force)"
    state = cell_state(store, node.dir)
    if state["state"] == "done":
        return "done"
    plan = store.read_json_or_none(f"{node.dir}/_plan.json")
    if plan and plan.get("n_shards") != node.cell.n_shards:
        return f"stale ({plan.get('n_shards')} shards, now {node.cell.n_shards})"
    if state["shards_done"]:
        return f"partial {state['shards_done']}/{node.cell.n_shards}"
    return "pending"


# ---------------------------------------------------------------------------------------
# building it


def _references(value: Any, path: str, out: list[tuple[str, str]]) -> None:
    """Every string in a cell's params, with where it was found (`indexes.fi`)."""
    if isinstance(value, str):
        out.append((path, value))
    elif isinstance(value, dict):
        for k, v in value.items():
            _references(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _references(v, f"{path}.{i}" if path else str(i), out)


def _edges(cell: Cell, by_id: dict[str, str], by_dir: set[str]) -> tuple[dict, list]:
    inputs, sources = {}, []
    for i, ref in enumerate(cell.inputs):
        if ref in by_dir:
            inputs["input" if len(cell.inputs) == 1 else f"input.{i}"] = ref
        else:
            sources.append(ref)
    found: list[tuple[str, str]] = []
    _references(cell.params, "", found)
    for role, ref in found:
        up = ref if ref in by_dir else by_id.get(ref)
        if up is not None and up != cell.dir and up not in inputs.values():
            inputs[role] = up
    return inputs, sources


def build_plan(cfgs: "list[XlingConfig]", stages: list[str], registry: dict) -> Plan:
    """The plan of `stages` (this command's) over `cfgs` (one config, or a sweep's grid).

    Besides this command's stages, every stage of each config (its `stages:`, and each
    stage with a section) is planned too, so that an input made by an earlier command is a
    node the plan knows (not run here).
    Cells are the stages' own `cells` (each built once, core/memo.py); a cell that several
    grid points ask for is one node."""
    from xling.core.hosts import host_key, shareable

    order = list(stages)
    for cfg in cfgs:
        for s in [*cfg.stages, *(s for s in registry if getattr(cfg, s, None) is not None)]:
            if s not in order:
                order.append(s)
    rank = {s: i for i, s in enumerate(registry)}
    planned = sorted((s for s in order if s != "report"), key=lambda s: rank.get(s, len(rank)))
    nodes: list[Node] = []
    seen: set[str] = set()
    unlisted: dict[str, str] = {}
    for stage in planned:
        runs = stage in stages
        for cfg in cfgs:
            if not runs and getattr(cfg, stage, None) is None:
                continue
            try:
                cells = registry[stage]().cells(cfg)
                made_after = [c for c in registry[stage]().all_cells(cfg) if c not in cells]
            except Exception as e:  # noqa: BLE001 - a stage this command only reads from
                if runs:
                    raise
                unlisted[stage] = str(e).split("\n", 1)[0]
                continue
            for cell in [*cells, *made_after]:
                if cell.dir not in seen:
                    seen.add(cell.dir)
                    nodes.append(Node(stage, cell, runs, after=cell in made_after))
    by_id = {n.cell.id: n.dir for n in nodes}
    by_dir = set(by_id.values())
    for n in nodes:
        n.inputs, n.sources = _edges(n.cell, by_id, by_dir)
    engines: dict[str, EngineUse] = {}
    for stage in stages:
        if stage == "report" or not hasattr(registry.get(stage), "engines"):
            continue
        for cfg in cfgs:
            for spec in registry[stage]().engines(cfg):
                if not shareable(spec):
                    continue
                use = engines.setdefault(host_key(spec), EngineUse(
                    host_key(spec), spec.label, spec.model, []))
                if stage not in use.stages:
                    use.stages.append(stage)
                use.specs.append((stage, spec))
    labels = {s: getattr(registry[s], "after_label", "") for s in planned}
    return Plan([s for s in order if s in stages], nodes, list(engines.values()), unlisted,
                labels)


# ---------------------------------------------------------------------------------------
# GPU fit


def gpu_fit_errors(plan: Plan, gpus_per_node: float | None = None) -> list[str]:
    """Engines whose actors Ray may place on one GPU, counting only `num_gpus`, while vLLM
    reserves `gpu_memory_utilization` of the device each: two actors of 0.5 GPU at 0.9 fit
    Ray's count and not the GPU, and the second engine fails or hangs as it starts. Checked
    among engines alive at the same time (a hosted engine lives from its first stage to its
    last; a stage's own pools live during it)."""
    idx = {s: i for i, s in enumerate(plan.stages)}
    errors = []
    for stage in plan.stages:
        alive = []
        for e in plan.engines:
            if idx[e.first] <= idx[stage] <= idx[e.last]:
                for st, spec in e.specs:
                    if len(e.stages) > 1 or st == stage:
                        alive.append(spec)
                        break
        frac = []
        for spec in alive:
            g = spec.parallel.num_gpus
            util = getattr(spec, "gpu_memory_utilization", None)
            if util is None or not 0 < g < 1:
                continue
            frac += [(spec, g, util)] * max(1, spec.parallel.concurrency[1])
        # Ray packs fractional actors onto a GPU while their num_gpus sum to <= 1.
        frac.sort(key=lambda t: t[1])
        packed, share, mem = [], 0.0, 0.0
        for spec, g, util in frac:
            if share + g <= 1 + 1e-9:
                packed.append((spec, g, util))
                share += g
                mem += util
        if len(packed) > 1 and mem > 1 + 1e-9:
            names = sorted({f"{s.label} (num_gpus={g:g}, gpu_memory_utilization={u:g})"
                            for s, g, u in packed})
            msg = (f"{stage}: Ray may place {len(packed)} engine actors on one GPU "
                   f"({', '.join(names)}): their num_gpus sum to {share:g} but vLLM would "
                   f"reserve {mem:.2f} of the GPU's memory. Set each entry's "
                   f"gpu_memory_utilization to at most {1 / len(packed):.2f} (or num_gpus: 1)")
            if msg not in errors:
                errors.append(msg)
    return errors
