"""What the `xling` commands do, once cli.py has parsed them: the pipeline that knows every
stage.

    stage_registry()               stage name -> stage class
    run_stages(cfg, stages, args)  `xling run` and `xling <stage>`: check everything that
                                   can be checked without Ray, start Ray (core/runtime.py)
                                   if a stage needs it, run the stages in order
    run_sweep(cfg, args)           `xling sweep`: a grid's configs through the stages, then
                                   the comparison table
    validate(cfg)                  `xling validate`: the resolved config and its cells
    show_status / export_results / convert_model
                                   `xling status`, `xling results`, `xling models convert`

Stages that subclass `core.cells.DriverStage` (evaluate) run in this process, without Ray;
the others go through the Runner. Errors a user can fix are `ConfigError` / `StoreError`
(cli.py prints them as one line, exit 2).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from xling.config import XlingConfig, load_config
from xling.core import upstream
from xling.core.config import ConfigError
from xling.core.store import RunStore, StoreError


def stage_registry() -> dict:
    from xling.jobs.evaluate import EvaluateStage
    from xling.jobs.index import IndexStage
    from xling.jobs.ingest import IngestStage
    from xling.jobs.narrow import NarrowStage
    from xling.jobs.rerank import RerankStage
    from xling.jobs.retrieve import RetrieveStage
    from xling.jobs.features import FeaturesStage
    from xling.jobs.generate import GenerateStage
    from xling.jobs.judge import JudgeStage
    from xling.jobs.nuggets import NuggetStage
    from xling.jobs.translate import TranslateStage

    return {"ingest": IngestStage, "translate": TranslateStage, "index": IndexStage,
            "retrieve": RetrieveStage, "rerank": RerankStage, "narrow": NarrowStage,
            "generate": GenerateStage,
            "features": FeaturesStage, "judge": JudgeStage, "nuggets": NuggetStage,
            "evaluate": EvaluateStage}


# Stages find their inputs by the upstream stage's name (core/upstream.py), through this.
upstream.use_registry(stage_registry)


def is_driver_stage(stage_cls) -> bool:
    """A stage that runs in the driver, cell by cell, without Ray."""
    from xling.core.cells import DriverStage

    return issubclass(stage_cls, DriverStage)


# ---------------------------------------------------------------------------------------
# the console and the run's log files


def make_console(cfg: XlingConfig, args):
    """The run's Console (core/logs.py) at the -v / XLING_LOG_LEVEL level, with Python
    logging set up for it; its log file is attached by `attach_logs` once the store is
    checked (a refused config writes nothing)."""
    from xling.core.logs import Console, configure_python_logging, resolve_level

    level = resolve_level(getattr(args, "verbose", 0))
    console = Console(level, progress=not getattr(args, "no_progress", False))
    configure_python_logging(level, None)
    return console


def attach_logs(console, cfg: XlingConfig, run_id: str) -> None:
    from xling.core.logs import configure_python_logging, local_log_dir, native_stderr_to

    console.log_dir = local_log_dir(cfg.run_root, cfg.name)
    console.run_id = run_id
    console.path = os.path.join(console.log_dir, f"xling-{run_id}.log")
    if not console.verbose:  # before the handlers below bind sys.stderr
        os.makedirs(console.log_dir, exist_ok=True)
        native_stderr_to(os.path.join(console.log_dir, f"native-{run_id}.log"))
    configure_python_logging(console.level, console.path)


def sync_logs(console, store: RunStore, *, workers: bool = False, address=None) -> str:
    """End of a stage (and of the run): for an S3 run root, upload the local log files to
    {run_root}/_logs/; at the end, copy a local Ray's worker logs next to them. Returns
    the one-line note saying where the logs are."""
    from xling.core.logs import copy_worker_logs

    if not console.path:
        return ""
    local_ray = not (address or os.environ.get("RAY_ADDRESS"))
    worker_dir = os.path.join(console.log_dir, "ray-workers", console.run_id)
    copied = copy_worker_logs(worker_dir) if workers and local_ray else 0
    where = console.log_dir
    if store.is_s3:
        for root, _, files in os.walk(console.log_dir):
            for f in files:
                path = os.path.join(root, f)
                rel = os.path.relpath(path, console.log_dir).replace(os.sep, "/")
                if rel.startswith("ray-workers/") and console.run_id not in rel:
                    continue
                if f.startswith("xling-") and console.run_id not in f:
                    continue
                with open(path, "rb") as fh:
                    store.write_bytes(f"_logs/{rel}", fh.read())
        where = f"{store.url('_logs')} (local copy: {console.log_dir})"
    if not workers:
        return ""
    if copied:
        return (f"[xling] logs: {where}: xling-{console.run_id}.log, and the Ray workers' "
                f"(JVM, vLLM...) in ray-workers/{console.run_id}/")
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return (f"[xling] logs: {where}: xling-{console.run_id}.log; the Ray workers' (JVM, "
                "vLLM...) are in Ray's session logs on each node (`ray logs`, the dashboard)")
    return f"[xling] log: {where}/xling-{console.run_id}.log"


# ---------------------------------------------------------------------------------------
# running stages


def run_stages(cfg: XlingConfig | list[XlingConfig], stages: list[str], args) -> int:
    """Run stages of one config, or of a sweep's configs together (one run root), from one
    plan (core/plan.py) built once for the command."""
    from xling.core.memo import run_scope

    with run_scope():
        return _run_plan(cfg if isinstance(cfg, list) else [cfg], stages, args)


def _run_plan(cfgs: list[XlingConfig], stages: list[str], args) -> int:
    from xling.core.hosts import plan_hosts, sharing
    from xling.core.lease import acquire as acquire_lease
    from xling.core.plan import build_plan
    from xling.core.runner import Runner
    from xling.core.runtime import init_ray
    from xling.jobs.report import write_report

    store = RunStore(cfgs[0].run_root)
    registry = stage_registry()
    console = make_console(cfgs[0], args)
    runner = Runner(store, force=args.force, progress=console.progress, log=console.say,
                    detail=console.detail, limit=getattr(args, "limit", None))
    # Everything that can be checked without Ray is checked before Ray starts: inputs,
    # models, languages (the plan's cells), GPU fit, then the run store.
    plan = build_plan(cfgs, stages, registry)
    ray_stages = [s for s in stages if s != "report" and not is_driver_stage(registry[s])]
    hosts = plan_hosts([(name, plan.engine_specs(name)) for name in ray_stages],
                       log=console.say)
    if args.dry_run:
        # Planning reads the cells' manifests from the store: reach an S3 one first, so that
        # a missing credential or endpoint is one line naming the fix, not a botocore trace.
        # (A local root is left alone: a dry run creates nothing.)
        if store.is_s3:
            store.check(write=False)
        print("\n".join(f"[plan] {line}" for line in plan.describe(store, force=args.force)))
        for name in stages:
            if name == "report":
                print(f"[report] would write {store.url('report/index.html')} and "
                      f"{store.url('report/summary.md')}")
                continue
            for node in plan.of(name):
                if not node.runs or node.after:  # an after_run cell is not in the pipeline
                    continue
                c = runner.describe(node.cell, inputs=node.inputs)
                print(f"[{name}] {c['cell']}: {c['state']} ({c['shards_done']}/{c['n_shards']} "
                      f"shards committed); would run {c['todo']}\n    out: {c['dir']}\n    in:  "
                      + "\n         ".join(c["inputs"]))
        for line in hosts.describe():
            print(f"[xling] would {line}")
        return 0
    check_gpu_fit(plan)
    store.check()
    plan.check_inputs(store)
    lease = None if set(stages) <= {"report"} else acquire_lease(  # one driver per run root
        store, runner.run_id, takeover=getattr(args, "takeover", False), log=console.say)
    try:  # from here on, the lease is released however the command ends
        for one in cfgs:
            for i, name in enumerate(stages):
                if name != "report":
                    registry[name]().prepare(one, store, upstream=tuple(stages[:i]))
        attach_logs(console, cfgs[0], runner.run_id)
        store.write_json(f"_runs/{runner.run_id}/plan.json", plan.to_json(runner.run_id))
        console.detail(f"[xling] plan: {store.url(f'_runs/{runner.run_id}/plan.json')}\n"
                       + "\n".join(plan.describe()))
        if ray_stages:
            init_ray(cfgs[0], args.address, console.level)
        with sharing(hosts):
            for name in stages:
                if name == "report":
                    print_report(console, store, write_report(store, cfgs, registry))
                elif is_driver_stage(registry[name]):
                    run_driver_stage(console, registry[name], cfgs, store, args.force)
                else:
                    stage = registry[name]()
                    hosts.stage_start(name)
                    runner.run(stage, cfgs if len(cfgs) > 1 else cfgs[0])
                    hosts.stage_done(name)
                    for one in cfgs:
                        stage.after_run(one, runner)
                sync_logs(console, store)
    finally:
        note = sync_logs(console, store, workers=True, address=args.address)
        if note:
            console.say(note)
        console.close()
        if lease is not None:
            lease.release()
    return 0


def check_gpu_fit(plan) -> None:
    """Engines that Ray would put on one GPU but whose memory does not fit there: one config
    error before anything starts (core/plan.gpu_fit_errors)."""
    from xling.core.plan import gpu_fit_errors

    errors = gpu_fit_errors(plan)
    if errors:
        raise ConfigError("the plan's engines do not fit their GPUs: " + "; ".join(errors))


def run_driver_stage(console, stage_cls, cfgs: list[XlingConfig], store: RunStore,
                     force: bool) -> None:
    """A stage that runs in the driver (evaluate): its per-cell lines are details; one line
    says what it did."""
    t0, cells = time.time(), {}
    for one in cfgs:
        for c in stage_cls().cells(one):
            cells.setdefault(c.id, c)
    done = sum(1 for c in cells.values()
               if not force and store.read_json_or_none(f"{c.dir}/_manifest.json"))

    def log(text: str) -> None:  # warnings stay on the console; cell lines and tables go
        first = text.split("\n", 1)[0].lower()
        (console.say if "warning" in first or "error:" in first else console.detail)(text)

    for one in cfgs:
        stage_cls().run_driver(one, store, force=force, log=log)
    name = stage_cls.name
    if done == len(cells):
        console.say(f"[{name}] {len(cells)} cell(s), all already done (skipped)")
    else:
        console.say(f"[{name}] {len(cells) - done} cell(s) done" + (
            f", {done} already done (skipped)" if done else "")
            + f", {time.time() - t0:.0f}s -> {store.url(name)}")


def print_report(console, store: RunStore, text: str) -> None:
    """The report: all of it with -v; otherwise its summary line and results, once."""
    from xling.core.logs import report_digest

    if console.verbose:
        console.say(text)
    else:
        console.detail(text)
        where = store.url("report/summary.md")
        if store.exists("report/index.html"):
            where = f"{store.url('report/index.html')} ({where})"
        console.say(report_digest(text, where))


def smoke_root(cfg: XlingConfig, limit: int) -> None:
    """--limit N: the run moves to RUN_ROOT/_smoke/limit-N. Cells keep their ids, so the cut
    rows must never share a root with full results."""
    cfg.run_root = f"{cfg.run_root.rstrip('/')}/_smoke/limit-{limit}"


# ---------------------------------------------------------------------------------------
# sweeps


def run_sweep(base: XlingConfig, args) -> int:
    """`xling sweep`: the grid's configs through the stages, then the comparison table."""
    from xling.core.config import stable_hash
    from xling.core.sweep import as_overrides, comparison_table, grid_points, parse_grid

    grid = {**(base.sweep.grid if base.sweep else {}), **parse_grid(args.grid)}
    points = grid_points(grid)
    cfgs = [load_config(args.config, [*args.overrides, *as_overrides(p)]) for p in points]
    if args.limit is not None:  # `base` was moved by the CLI; the grid's configs follow it
        for c in cfgs:
            smoke_root(c, args.limit)
    if len({c.run_root for c in cfgs}) > 1:
        raise ConfigError("a sweep runs in one run root: do not sweep `run_root`")
    print(f"[sweep] {len(points)} grid points over {', '.join(grid)}")
    code = run_stages(cfgs, [s for s in base.stages if s != "report"], args)
    if code or args.dry_run:
        return code
    store = RunStore(base.run_root)
    table = comparison_table(points, [sweep_metrics(c, store) for c in cfgs])
    path = f"report/sweep-{stable_hash(grid)}.md"
    store.write_bytes(path, (f"# Sweep over {', '.join(grid)}\n\n{table}\n").encode())
    print(f"{table}\n[sweep] -> {store.url(path)}")
    if "report" in base.stages:
        from xling.core.logs import Console, resolve_level
        from xling.jobs.report import write_report

        print_report(Console(resolve_level(args.verbose)), store,
                     write_report(store, cfgs, stage_registry()))
    return 0


def sweep_metrics(cfg: XlingConfig, store: RunStore) -> list[dict]:
    """The mean rows of a grid point's evaluate cells (none without an `evaluate:` section)."""
    if cfg.evaluate is None:
        return []
    import pyarrow.compute as pc

    from xling.core.status import read_cell

    rows = []
    for cell in stage_registry()["evaluate"]().cells(cfg):
        try:
            t = read_cell(store, cell.dir)
        except FileNotFoundError:
            continue
        if "query_id" in t.column_names:
            t = t.filter(pc.is_null(t["query_id"]))
        rows += t.to_pylist()
    return rows


# ---------------------------------------------------------------------------------------
# the other commands


def validate(cfg: XlingConfig) -> int:
    """`xling validate`: the resolved config as YAML, every cell with its directory, then the
    plan: per stage its cells and what they need, each engine's first and last stage."""
    import yaml

    from xling.core.memo import run_scope
    from xling.core.plan import build_plan

    registry = stage_registry()
    stages = list(cfg.stages)
    with run_scope():
        # Plan first: a planning error (a missing file, say) is printed alone, not after
        # hundreds of lines of resolved config.
        plan = build_plan([cfg], stages, registry)
        check_gpu_fit(plan)
    store = RunStore(cfg.run_root)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False,
                         allow_unicode=True, width=100), end="")
    for name in stages:
        for cell in (plan.run_cells(name) if name != "report" else []):
            print(f"[{name}] cell {cell.id} -> {store.url(cell.dir)}")
    print("\n".join(f"[plan] {line}" for line in plan.describe()))
    return 0


def show_status(run_root: str, as_json: bool = False) -> int:
    """`xling status`: each cell's state, read from manifests and shard markers."""
    from xling.core.status import run_status
    from xling.jobs.report import status_table

    store = RunStore(run_root)
    if not store.is_s3 and not Path(store.key()).is_dir():
        raise StoreError(f"no run root at {store.url()}: check the path (a run creates "
                         "it; `xling status` only reads)")
    store.check(write=False)
    rows = run_status(store)
    if not rows and store.is_s3 and not store.list(""):
        raise StoreError(f"nothing under {store.url()}: check the prefix (a run "
                         "creates it; `xling status` only reads)")
    print(json.dumps(rows, indent=2) if as_json else status_table(rows))
    return 0


def export_results(run_root: str, fmt: str = "csv", output: str | None = None, *,
                   means: bool = False, trec: str | None = None) -> int:
    """`xling results`: see xling/core/results.py."""
    from xling.core.results import export_trec_runs, metrics_table, write_results

    store = RunStore(run_root)
    store.check(write=False)
    if not store.list_dirs("evaluate") and not trec:
        raise ConfigError(f"{store.url()} has no evaluate cells: run `xling evaluate` first "
                          "(or check the path; see `xling status`)")
    table = metrics_table(store, means_only=means)
    try:
        data = write_results(table, fmt, output)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if data is not None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    elif output:
        print(f"{table.num_rows} metrics rows -> {output}", file=sys.stderr)
    if trec:
        files = export_trec_runs(store, trec)
        print(f"{len(files)} TREC runs -> {trec}", file=sys.stderr)
    return 0


def convert_model(cfg: XlingConfig, config_path: str, force: bool = False) -> int:
    """`xling models convert`: translate.model to CTranslate2, cached in the run store."""
    from xling.core.models import prepare_ct2_model

    if cfg.translate is None:
        raise ConfigError(f"{config_path}: no `translate:` section, so no model to convert")
    store = RunStore(cfg.run_root)
    store.check()
    local, rel = prepare_ct2_model(cfg.translate.model, cfg.translate.quantization,
                                   store, force=force)
    print(f"{cfg.translate.model}: " + (f"already a CTranslate2 model at {local}" if local
                                        else f"CTranslate2 model at {store.url(rel)}"))
    return 0
