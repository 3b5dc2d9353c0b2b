"""`evaluate` stage: IR metrics of every run against qrels, oracle ceiling, paired tests.

One cell per (topic set, query language, document language), holding every system searched
for it: the retrieve stage's runs and fusions, and TREC run files named in
`evaluate.runs`. For each system it writes metric rows per query and averaged (trec_eval
conventions, `tasks/irmetrics.py`, checked against pytrec_eval), the "glass ceiling" oracle
of the system's top-N, and for each configured comparison a paired t-test per metric and
the LLM-CLIR paper's PRI and Realized % (Eq. 1 and 2). A markdown table of the means goes
next to the Parquet rows (`table.md`) and into the run report.

Evaluation is small driver-side work (a few hundred queries), so it does not go through Ray;
it keeps the cell layout and the manifest-last commit of the other stages.
"""

from __future__ import annotations

import io
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from xling.core.config import ConfigError, Strict, hashable
from xling.core.runner import Cell, Stage, code_version, now, read_cell
from xling.core.store import RunStore

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `evaluate:` section


class Comparison(Strict):
    """A paired comparison: t-test, and PRI / Realized % against the baseline's oracle."""

    baseline: str
    system: str


class ExternalRun(Strict):
    """A TREC run file made elsewhere, evaluated beside xling's runs."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
    path: str
    topics: str = Field(description="the retrieve.topics set it answers")
    qlang: str | None = None
    doc_lang: str | None = None


class EvaluateConfig(Strict):
    """`evaluate`: trec_eval-convention metrics per query and averaged, oracle, t-tests."""

    runs: list[ExternalRun] = []

    metrics: list[str] = Field(
        ["map", "ndcg_cut_10", "ndcg_cut_20", "recall_100", "recip_rank"],
        description="pytrec_eval names: map, ndcg_cut_K, recall_K, P_K, recip_rank")
    oracle_depth: int = Field(100, ge=1, description="glass ceiling: relevant docs in the "
                                                     "top-N moved to the top")
    compare: list[Comparison] = []
    labels: str | None = Field(None, description="study with a judge panel: human labels "
                                                 "(jsonl/csv, see the study's tasks/ module) for "
                                                 "Cohen's kappa of the panel")

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: list[str]) -> list[str]:
        import re

        for m in v:
            if not re.fullmatch(r"map|recip_rank|(ndcg_cut|recall|P|map_cut)_\d+", m):
                raise ValueError(f"unknown metric {m!r}: use map, recip_rank, ndcg_cut_K, "
                                 "recall_K, P_K or map_cut_K")
        return v



METRICS = pa.schema([("study", pa.string()), ("setting", pa.string()), ("lang", pa.string()),
                     ("model", pa.string()), ("system", pa.string()), ("metric", pa.string()),
                     ("query_id", pa.string()), ("value", pa.float64()),
                     ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("n", pa.int64())])


def _qrels_path(template: str, qlang: str, doc_lang: str) -> str:
    return template.replace("{doc_lang}", doc_lang).replace("{lang}", qlang)


def evaluate_cells(cfg: XlingConfig) -> list[Cell]:
    from xling.jobs.retrieve import fusion_cells, run_cells

    if cfg.retrieve is None and cfg.study is None:
        raise ConfigError("evaluate scores the retrieve stage's runs or a study's generations: "
                          "add a `retrieve:` or a `study:` section")
    cells = []
    if cfg.study is not None:
        from xling.jobs.study import evaluate_cell as study_cell

        cells.append(study_cell(cfg))
    if cfg.retrieve is None:
        return cells
    groups: dict[tuple, dict[str, str]] = {}
    for c in [*run_cells(cfg), *fusion_cells(cfg)]:
        groups.setdefault((c.key["topics"], c.key["qlang"], c.key["doc_lang"]), {})[
            c.key["run"]] = c.id
    ec = cfg.evaluate
    for i, ts in enumerate(cfg.retrieve.topics):
        for (topics, ql, dl), systems in groups.items():
            if topics != ts.name:
                continue
            if not ts.qrels:
                raise ConfigError(f"retrieve.topics[{i}] ('{ts.name}') has no `qrels:` file, "
                                  "which evaluate needs")
            qrels = _qrels_path(ts.qrels, ql, dl)
            if not qrels.startswith("s3://") and not Path(qrels).is_file():
                raise ConfigError(f"retrieve.topics[{i}].qrels: file not found: {qrels}")
            external = {r.name: r.path for r in ec.runs
                        if r.topics == topics and r.qlang in (None, ql) and r.doc_lang in (None, dl)}
            for name, path in external.items():
                if not Path(path).is_file():
                    raise ConfigError(f"evaluate.runs '{name}': file not found: {path}")
            params = {"qrels": qrels, "systems": systems, "external": external,
                      "settings": hashable(ec)}
            cells.append(Cell("evaluate", {"topics": topics, "qlang": ql, "doc_lang": dl},
                              params, inputs=[qrels, *external.values()], n_shards=1))
    return cells


class EvaluateStage(Stage):
    name = "evaluate"
    driver = True  # runs in the driver: see the module docstring

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        return evaluate_cells(cfg)

    def read(self, cell, cfg):  # pragma: no cover - driver stage
        raise NotImplementedError

    def map(self, ds, cells, cfg):  # pragma: no cover - driver stage
        raise NotImplementedError

    def run_driver(self, cfg: XlingConfig, store: RunStore, *, force: bool = False,
                   log=print) -> list[dict]:
        out = []
        for cell in self.cells(cfg):
            if not force and store.read_json_or_none(f"{cell.dir}/_manifest.json"):
                log(f"[evaluate] {cell.id}: done earlier, skipped")
                continue
            if "study" in cell.key:
                from xling.jobs.study import run_evaluate

                out.append(run_evaluate(cfg, store, cell, log=log))
            else:
                out.append(evaluate_cell(cfg, store, cell, log=log))
        return out


def _read_qrels(path: str) -> pa.Table:
    from xling.core.sources import _open
    from xling.tasks.topics import iter_qrels

    with _open(path) as f:
        rows = list(iter_qrels(io.BytesIO(f.read())))
    if not rows:
        raise ConfigError(f"qrels file {path} has no judgments")
    return pa.Table.from_pylist(rows)


def _collection_ids(cfg: XlingConfig, store: RunStore, cell: Cell) -> set[str] | None:
    """Doc ids of the collection the cell's systems searched (None when unknown)."""
    from xling.jobs.retrieve import run_cells

    ids: set[str] = set()
    for rc in run_cells(cfg):
        if rc.id in cell.params["systems"].values():
            for index_id in rc.params["indexes"].values():
                try:
                    t = read_cell(store, f"index/{index_id}", columns=["doc_id"])
                except FileNotFoundError:
                    return None
                ids |= set(t["doc_id"].to_pylist())
    return ids or None


def evaluate_cell(cfg: XlingConfig, store: RunStore, cell: Cell, *, log=print) -> dict:
    from xling.tasks import irmetrics
    from xling.tasks.runs import read_trec_run

    t0 = time.time()
    ec = cfg.evaluate
    ts = next(t for t in cfg.retrieve.topics if t.name == cell.key["topics"])
    run_modes = {r.name: r.mode for r in cfg.retrieve.runs}
    qrels = _read_qrels(cell.params["qrels"])
    runs: dict[str, pa.Table] = {}
    for system, cell_id in cell.params["systems"].items():
        t = read_cell(store, f"retrieve/{cell_id}", columns=["query_id", "doc_id", "rank",
                                                              "score", "system", "error"])
        runs[system] = t.filter(pc.and_(pc.is_null(t["error"]), pc.is_valid(t["doc_id"])))
    for system, path in cell.params["external"].items():
        runs[system] = read_trec_run(path)
    known = _collection_ids(cfg, store, cell)
    unknown = {}
    if known is not None:
        for system, t in runs.items():
            bad = sum(1 for d in t["doc_id"].to_pylist() if d not in known)
            if bad:
                unknown[system] = bad
                log(f"[evaluate] warning: {system}: {bad} of {t.num_rows} hits name doc ids "
                    f"that are not in the collection (counted as non-relevant)")

    rows: list[dict] = []
    means: dict[str, dict[str, float]] = {}
    per_query: dict[str, dict] = {}
    base = dict(study=ts.name, lang=f"{cell.key['qlang']}->{cell.key['doc_lang']}")
    systems = list(runs)
    for system in systems:
        pq = irmetrics.evaluate(runs[system], qrels, ec.metrics)
        per_query[system] = pq
        oracle = irmetrics.oracle_ceiling(runs[system], qrels, depth=ec.oracle_depth)
        per_query[f"{system}+oracle"] = irmetrics.evaluate(oracle, qrels, ec.metrics)
    for system, pq in per_query.items():
        plain = system.removesuffix("+oracle")
        setting = run_modes.get(plain, "fusion" if plain in cell.params["systems"] else "external")
        means[system] = {}
        for m in ec.metrics:
            mean = irmetrics.mean(pq, m)
            means[system][m] = mean
            rows.append({**base, "setting": setting, "model": system, "system": system,
                         "metric": m, "query_id": None, "value": mean, "n": len(pq)})
            rows += [{**base, "setting": setting, "model": system, "system": system, "metric": m,
                      "query_id": q, "value": v[m], "n": 1} for q, v in sorted(pq.items())]
    comparisons = []
    for comp in ec.compare:
        if comp.baseline not in runs or comp.system not in runs:
            continue
        for m in ec.metrics:
            a = {q: v[m] for q, v in per_query[comp.baseline].items()}
            b = {q: v[m] for q, v in per_query[comp.system].items()}
            test = irmetrics.paired_ttest(b, a)  # t > 0: the system beats the baseline
            s1, s2 = means[comp.baseline][m], means[comp.system][m]
            s_star = means[f"{comp.baseline}+oracle"][m]
            pri = irmetrics.pri(s_star, s1)
            realized = irmetrics.realized(s1, s2, s_star)
            label = f"{comp.system} vs {comp.baseline}"
            comparisons.append({"comparison": label, "metric": m, "baseline": s1, "system": s2,
                                "oracle": s_star, "pri": pri, "realized_pct": realized,
                                "t": test["t"], "p": test["p"], "n": test["n"]})
            for name, value in (("ttest_p", test["p"]), ("ttest_t", test["t"]), ("pri", pri),
                                ("realized_pct", realized)):
                rows.append({**base, "setting": "comparison", "model": label, "system": comp.system,
                             "metric": f"{m}:{name}", "query_id": None, "value": value,
                             "n": test["n"]})
    for r in rows:
        r.setdefault("ci_low", None)
        r.setdefault("ci_high", None)
    table = pa.Table.from_pylist(rows, schema=METRICS).append_column(
        "error", pa.nulls(len(rows), pa.string()))
    store.write_parquet(f"{cell.dir}/part-00000.parquet", table)
    md = markdown_table(cell, ec.metrics, means, comparisons, unknown)
    store.write_bytes(f"{cell.dir}/table.md", md.encode())
    manifest = {"stage": "evaluate", "cell": cell.id, "key": cell.key, "params": cell.params,
                "config_hash": cell.hash, "code_version": code_version(), "n_shards": 1,
                "rows": table.num_rows, "errors": 0, "files": ["part-00000.parquet"],
                "queries": {s: len(per_query[s]) for s in systems},
                "qrels_queries": len(set(qrels["query_id"].to_pylist())),
                "unknown_doc_ids": unknown, "table": "table.md",
                "timings": {"this_run_seconds": round(time.time() - t0, 3)},
                "finished_at": now()}
    store.write_json(f"{cell.dir}/_manifest.json", manifest)
    log(f"[evaluate] {cell.id}: {len(systems)} systems -> {store.url(cell.dir)}\n{md}")
    return manifest


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.1f}" if pct else f"{v:.4f}"


def markdown_table(cell: Cell, metrics: list[str], means: dict, comparisons: list[dict],
                   unknown: dict) -> str:
    title = (f"### {cell.key['topics']}: queries {cell.key['qlang']}, documents "
             f"{cell.key['doc_lang']}")
    lines = [title, "", "| system | " + " | ".join(metrics) + " |",
             "|---|" + "---|" * len(metrics)]
    for system, ms in means.items():
        lines.append(f"| {system} | " + " | ".join(_fmt(ms[m]) for m in metrics) + " |")
    if comparisons:
        lines += ["", "| comparison | metric | s1 | s2 | oracle s* | PRI | Realized % | t | p |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in comparisons:
            lines.append(f"| {c['comparison']} | {c['metric']} | {_fmt(c['baseline'])} | "
                         f"{_fmt(c['system'])} | {_fmt(c['oracle'])} | {_fmt(c['pri'])} | "
                         f"{_fmt(c['realized_pct'], True)} | {_fmt(c['t'])} | {_fmt(c['p'])} |")
    if unknown:
        lines += ["", "Hits naming doc ids not in the collection: "
                  + ", ".join(f"{s}: {n}" for s, n in unknown.items())]
    return "\n".join(lines) + "\n"
