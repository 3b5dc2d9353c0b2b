"""`evaluate` stage: IR metrics of every run against qrels, oracle ceiling, paired tests.

One cell per (topic set, query language, document language), holding every system searched
for it: the retrieve stage's runs and fusions, and TREC run files named in
`evaluate.runs`. For each system it writes metric rows per query and averaged (pytrec_eval,
i.e. trec_eval's own code, through `tasks/irmetrics.py`; trec_eval or ir-measures names),
the "glass ceiling" oracle of the system's top-N, and for each configured comparison a paired
t-test per metric and the LLM-CLIR paper's PRI and Realized % (Eq. 1 and 2). Means are over
every query of the qrels, one a run does not answer counting 0 (trec_eval `-c`, as
pyserini's 2CR; `evaluate.average: run` for the queries a run answered), and so are the
per-query rows and the paired tests. A markdown table of the means (`_table.md`) goes next
to the Parquet rows and into the run report; with an expected file (`evaluate.expected`,
by default `<config>.expected.yaml` beside the config) it has an OK/FAIL column comparing
the means with the file's `scores` within its `tolerance`.

Only the metrics rows are `part-*.parquet` in a cell: every other file starts with `_`, so
that `pandas.read_parquet(cell_dir)` reads exactly the metrics rows.

The rerank stage's runs over a retrieve run are systems of the same cell, each compared with
its first stage (the paper's `*`: paired t-test, p < 0.05). After the cells, `tables.md`
(in the evaluate directory, one per run root: every evaluate cell of the run root whose
pair the config's tables show, so configs that share a run root add their systems to one
table) has the LLM-CLIR Tables 2-7 shape per topic set and metric:
rows are systems, columns are language pairs plus AVG, PRI and Realized % computed on the
AVG column (llm-clir.txt L249-257), and, with `evaluate.expected`, the paper's numbers
beside xling's.

Evaluation is small driver-side work (a few hundred queries), so it does not go through Ray;
it keeps the cell layout and the manifest-last commit of the other stages.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from xling.core import upstream
from xling.core.config import ConfigError, NoHash, Strict, hashable
from xling.core.cells import Cell, DriverStage
from xling.core.status import TABLE, read_cell, read_rows
from xling.core.store import RunStore
from xling.jobs.study import study_generations, study_of
from xling.studies.base import Evidence, Generative, Judged, Ranked, judge_scope
from xling.studies.registry import get_study
from xling.tasks.nugget_report import NUGGET_COLUMNS, nugget_results
from xling.tasks.tables import fmt

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


class PairTable(Strict):
    """A table of tables.md with the language pairs it names, in its order, as a paper's
    table names them (LLM-CLIR Table 2: the 9 CLEF pairs EN-FI ... FI-RU, which are no full
    query x document grid of one topic set)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$",
                      description="its title; a `paper:` table of the expected file with "
                                  "`topics: <name>` is printed beside it")
    pairs: list[str] = Field(min_length=1, description="'qlang-doc_lang' each (en-fi), the "
                                                       "columns in this order; AVG is over them")
    topics: list[str] | None = Field(None, description="the retrieve.topics sets the pairs "
                                                       "come from (default: all of them)")

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if len(p.split("-")) != 2 or not all(p.split("-"))]
        if bad:
            raise ValueError(f"pairs {bad}: write each as 'qlang-doc_lang', e.g. en-fi")
        if len(set(map(str.lower, v))) != len(v):
            raise ValueError(f"pairs {v} name a pair twice")
        return [p.lower() for p in v]


class EvaluateConfig(Strict):
    """`evaluate`: trec_eval metrics (pytrec_eval) per query and averaged, oracle, t-tests."""

    runs: list[ExternalRun] = []
    tables: list[PairTable] = NoHash(
        [], description="the tables of tables.md, each naming its language pairs (CLEF's 9 "
        "of LLM-CLIR Table 2 across three topic sets); default one table per topic set, "
        "every query language x document language of it")

    metrics: list[str] = Field(
        ["map", "ndcg_cut_10", "ndcg_cut_20", "recall_100", "recip_rank"],
        description="trec_eval names (map, ndcg_cut_K, recall_K, P_K, recip_rank, success_K, "
                    "...) or ir-measures names (AP, nDCG@K, R@K, P@K, RR, RR@K, Judged@K)")
    average: Literal["qrels", "run"] = Field(
        "qrels", description="qrels: mean over every query of the qrels, one without hits "
                             "counting 0 (trec_eval -c, pyserini's 2CR); run: over the queries "
                             "the run answered (trec_eval without -c)")
    oracle_depth: int = Field(100, ge=1, description="glass ceiling: relevant docs in the "
                                                     "top-N moved to the top")
    compare: list[Comparison] = []
    expected: str | None = NoHash(
        None, description="a *.expected.yaml (default: <config>.expected.yaml beside the "
        "config, when there): `scores` give _table.md an OK/FAIL column (within its "
        "`tolerance`, default 0.005); a paper's tables (`paper: tables:`) are printed beside "
        "xling's in tables.md")
    labels: str | None = Field(None, description="study with a judge panel: human labels "
                                                 "(jsonl/csv, see the study's tasks/ module) for "
                                                 "Cohen's kappa of the panel")

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: list[str]) -> list[str]:
        from xling.tasks.irmetrics import check_metrics

        return check_metrics(v)


# An evaluate cell holds its metrics rows as `part-*.parquet` and nothing else that a
# Parquet reader would pick up: every other file starts with `_` (pyarrow's dataset
# discovery, and so `pandas.read_parquet(cell_dir)`, skips those), so that reading the
# directory gives exactly the metrics rows.
DEFAULT_TOLERANCE = 0.005  # an expected file's `tolerance` when it gives none

METRICS = pa.schema([("study", pa.string()), ("setting", pa.string()), ("lang", pa.string()),
                     ("model", pa.string()), ("system", pa.string()), ("metric", pa.string()),
                     ("query_id", pa.string()), ("value", pa.float64()),
                     ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("n", pa.int64())])


def _qrels_path(template: str, qlang: str, doc_lang: str) -> str:
    return template.replace("{doc_lang}", doc_lang).replace("{lang}", qlang)


def evaluate_cells(cfg: XlingConfig) -> list[Cell]:
    if cfg.retrieve is None and cfg.study is None:
        raise ConfigError("evaluate scores the retrieve stage's runs or a study's generations: "
                          "add a `retrieve:` or a `study:` section")
    cells = []
    if cfg.study is not None and isinstance(get_study(cfg.study.task), Generative):
        cells.append(study_evaluate_cell(cfg))
    if cfg.retrieve is None:
        return cells
    if cfg.evaluate.tables:
        table_pairs(cfg)  # a table naming a pair no topic set searches fails here, early
    groups: dict[tuple, dict[str, str]] = {}
    for c in upstream.cells(cfg, "retrieve"):
        groups.setdefault((c.key["topics"], c.key["qlang"], c.key["doc_lang"]), {})[
            c.key["run"]] = c.id
    ec = cfg.evaluate
    reranked: dict[tuple, dict[str, dict]] = {}
    if cfg.rerank is not None and any(r.input for r in cfg.rerank.runs):
        inputs_of = {r.name: r.input for r in cfg.rerank.runs}
        for c in upstream.cells(cfg, "rerank"):
            if "input" in c.params:
                reranked.setdefault((c.key["topics"], c.key["qlang"], c.key["doc_lang"]), {})[
                    c.key["run"]] = {"cell": c.id, "input": inputs_of[c.key["run"]]}
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
            if reranked.get((topics, ql, dl)):
                params["reranked"] = reranked[(topics, ql, dl)]
            cells.append(Cell("evaluate", {"topics": topics, "qlang": ql, "doc_lang": dl},
                              params, inputs=[qrels, *external.values()], n_shards=1))
    return cells


def study_evaluate_cell(cfg: XlingConfig) -> Cell:
    """The evaluate stage's one cell for the study: every generation (and judgment, and
    scored feature) of it; with published inputs (`source: published`), those files."""
    study = get_study(cfg.study.task)
    ran = cfg.generate is not None and bool(study.prompt_sets(cfg.study.options))
    gens = [c.dir for c in study_generations(cfg)] if ran else []
    judged = [c.dir for c in upstream.cells(cfg, "judge")] if ran else []
    scored = [c.dir for c in upstream.cells(cfg, "features")] if ran else []
    files = study.input_files(cfg.study.options) if not gens else []
    labels = cfg.evaluate.labels
    params = {"generations": gens, "judgments": judged,
              "options": cfg.study.options.as_options(),
              "language_check": bool(cfg.judge and cfg.judge.language_check
                                     and judge_scope(study) == "generation"),
              "labels": labels}
    if scored:
        params["features"] = scored
    # the nuggets stage's assign cells: their scores go beside the study's own metrics
    nuggets = ([c.dir for c in upstream.cells(cfg, "nuggets") if c.key["step"] == "assign"]
               if ran else [])
    if nuggets:
        params["nuggets"] = nuggets
    return Cell("evaluate", {"study": cfg.study.task}, params,
                inputs=[*gens, *judged, *scored, *nuggets, *files,
                        *([labels] if labels else [])],
                n_shards=1)



STUDY_METRICS = pa.schema([("study", pa.string()), ("setting", pa.string()), ("lang", pa.string()),
                           ("model", pa.string()), ("metric", pa.string()),
                           ("value", pa.float64()), ("ci_low", pa.float64()),
                           ("ci_high", pa.float64()), ("n", pa.int64())])


def detect_languages(study: Judged, opts: dict, gens: list[dict]) -> tuple[dict, dict]:
    """{(setting, lang, model, item_id): detected code} of each parsed answer, with lingua
    restricted to the study's answer languages and English; and the detector's setting."""
    from xling.actors.langid import LanguageDetector
    from xling.tasks.languages import lingua_language

    codes = sorted({*study.answer_languages(opts), "en"})
    names = {c: lingua_language(c) for c in codes}
    lacking = [c for c, n in names.items() if n is None]
    if lacking:
        raise ConfigError(f"judge.language_check: lingua cannot detect {lacking}; set "
                          "judge.language_check: false or drop those languages")
    detector = LanguageDetector(sorted(set(names.values())))
    back = {n: c for c, n in names.items()}
    texts = [(g.get("parsed") or {}).get("answer") for g in gens]
    found = detector.detect(texts)
    detected = {(g["setting"], g["lang"], g["model"], g["item_id"]): back.get(n) if n else None
                for g, n in zip(gens, found)}
    return detected, {**detector.setting, "codes": codes}


def run_study_cell(cfg: XlingConfig, store: RunStore, cell: Cell, *, log=print) -> dict:
    """Score the study's generations the paper's way: items, metrics and the paper's tables.
    Returns the manifest's fields (jobs/evaluate.py writes the manifest)."""
    import json
    from collections import Counter

    from xling.core.status import ITEMS, PLOTS, TABLE

    study = study_of(cfg)
    opts = study.options_of(cell.params)
    gens = read_rows(store, cell.params["generations"],
                     ["item_id", "study", "setting", "lang", "model", "parsed", "output", "error",
                      *study.score_columns], "evaluate")
    evidence, check = Evidence(), None
    if cell.params["judgments"]:
        evidence.judgments = read_rows(
            store, cell.params["judgments"],
            ["item_id", "setting", "lang", "model", "judge", "verdict", "error"], "evaluate")
        evidence.labels = cell.params["labels"]
        if cell.params["language_check"]:
            evidence.detected, check = detect_languages(study, opts, gens)
    if cell.params.get("features"):
        scored = read_rows(store, cell.params["features"],
                           ["item_id", "lang", "model", "scorer", "kind", "scores", "output",
                            "error"], "evaluate")
        for r in scored:
            r["scores"] = json.loads(r["scores"]) if r["scores"] else None
        evidence.features = scored
    items, metrics = study.score(opts, gens, evidence)
    rendered = study.render(opts, items, metrics)
    nuggets = None
    if cell.params.get("nuggets"):
        more, md, nugget_items = nugget_results(read_rows(
            store, cell.params["nuggets"], NUGGET_COLUMNS, "evaluate (nuggets)"))
        metrics = [*metrics, *more]
        rendered.markdown = f"{rendered.markdown.rstrip()}\n\n{md}"
        store.write_parquet(f"{cell.dir}/_nuggets.parquet", pa.Table.from_pylist(
            [{**i, **{k: json.dumps(i[k]) for k in ("support", "argue") if k in i}}
             for i in nugget_items]))
        nuggets = {"answers": len(nugget_items), "file": "_nuggets.parquet",
                   "errors": sum(1 for i in nugget_items if i["error"])}
    table = pa.Table.from_pylist(metrics, schema=STUDY_METRICS)
    store.write_parquet(f"{cell.dir}/part-00000.parquet", table)
    # only the metrics rows are part-*.parquet: the rest starts with `_` (jobs/evaluate.py)
    store.write_parquet(f"{cell.dir}/{ITEMS}", pa.Table.from_pylist(items))
    store.write_bytes(f"{cell.dir}/{TABLE}", rendered.markdown.encode())
    for name, data in rendered.plots.items():
        store.write_bytes(f"{cell.dir}/{PLOTS}/{name}", data)
    errors = sum(1 for i in items if i.get("error"))
    log(f"[evaluate] {cell.id}: {len(gens)} generations, {errors} unusable items -> "
        f"{store.url(cell.dir)}\n{rendered.markdown}")
    return {"rows": table.num_rows, "errors": 0, "files": ["part-00000.parquet"],
            "items": {"rows": len(items), "errors": errors, "file": ITEMS,
                      # prompts the engine cut to fit max_model_len (XRAG items carry it)
                      **({"truncated": sum(1 for i in items if i.get("truncated"))}
                         if any("truncated" in i for i in items) else {}),
                      # how each item ended (XRAG: judged, failed, unjudged, unparsed...;
                      # BordIRLines: scored, unparsed, failed, invalid), so that no item
                      # leaves a denominator unseen
                      **({"outcomes": dict(sorted(Counter(
                          str(i["outcome"]) for i in items if i.get("outcome")).items()))}
                         if any(i.get("outcome") for i in items) else {})},
            "generations": len(gens), "language_check": check, "table": TABLE,
            **({"nuggets": nuggets} if nuggets else {}),
            "plots": sorted(f"{PLOTS}/{n}" for n in rendered.plots)}

class EvaluateStage(DriverStage):
    name = "evaluate"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        return evaluate_cells(cfg)

    def run_cell(self, cfg: XlingConfig, store: RunStore, cell: Cell, *, log=print) -> dict:
        if "study" in cell.key:
            return run_study_cell(cfg, store, cell, log=log)
        return evaluate_cell(cfg, store, cell, log=log)

    def after_driver(self, cfg: XlingConfig, store: RunStore, *, log=print) -> None:
        if cfg.retrieve is not None:
            write_pair_tables(cfg, store, log=log)


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
    ids: set[str] = set()
    for rc in upstream.cells(cfg, "retrieve"):
        if rc.id in cell.params["systems"].values():
            for index_id in rc.params.get("indexes", {}).values():  # searches, not imports
                try:
                    t = read_cell(store, f"index/{index_id}", columns=["doc_id"])
                except FileNotFoundError:
                    return None
                ids |= set(t["doc_id"].to_pylist())
    return ids or None


def evaluate_cell(cfg: XlingConfig, store: RunStore, cell: Cell, *, log=print) -> dict:
    """One IR cell's metric rows and table; returns the manifest's fields."""
    from xling.tasks import irmetrics
    from xling.tasks.runs import read_trec_run

    ec = cfg.evaluate
    expected = read_expected(ec.expected)  # a bad file fails before any work
    ts = next(t for t in cfg.retrieve.topics if t.name == cell.key["topics"])
    run_modes = {r.name: "imported" if r.trec else r.mode for r in cfg.retrieve.runs}
    qrels = _read_qrels(cell.params["qrels"])
    runs: dict[str, pa.Table] = {}
    for system, cell_id in cell.params["systems"].items():
        t = read_cell(store, f"retrieve/{cell_id}", columns=["query_id", "doc_id", "rank",
                                                              "score", "system", "error"])
        runs[system] = t.filter(pc.and_(pc.is_null(t["error"]), pc.is_valid(t["doc_id"])))
    for system, path in cell.params["external"].items():
        runs[system] = read_trec_run(path)
    rerank_inputs = {}
    for system, spec in cell.params.get("reranked", {}).items():
        from xling.core.status import MissingInput

        try:
            t = read_cell(store, f"rerank/{spec['cell']}", columns=["query_id", "doc_id", "rank",
                                                                     "score", "system", "error"])
        except FileNotFoundError:
            raise MissingInput(f"evaluate {cell.id} scores rerank run '{system}', whose output "
                               f"rerank/{spec['cell']} is not in the store: run `xling rerank "
                               "--config ...` first") from None
        runs[system] = t.filter(pc.and_(pc.is_null(t["error"]), pc.is_valid(t["doc_id"])))
        rerank_inputs[system] = spec["input"]
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
    complete = ec.average == "qrels"  # trec_eval -c: every query of the qrels
    for system in systems:
        pq = irmetrics.evaluate(runs[system], qrels, ec.metrics, complete=complete)
        per_query[system] = pq
        oracle = irmetrics.oracle_ceiling(runs[system], qrels, depth=ec.oracle_depth)
        per_query[f"{system}+oracle"] = irmetrics.evaluate(oracle, qrels, ec.metrics,
                                                           complete=complete)
    for system, pq in per_query.items():
        plain = system.removesuffix("+oracle")
        setting = run_modes.get(plain, "fusion" if plain in cell.params["systems"] else
                                "rerank" if plain in rerank_inputs else "external")
        means[system] = {}
        for m in ec.metrics:
            mean = irmetrics.mean(pq, m)
            means[system][m] = mean
            rows.append({**base, "setting": setting, "model": system, "system": system,
                         "metric": m, "query_id": None, "value": mean, "n": len(pq)})
            rows += [{**base, "setting": setting, "model": system, "system": system, "metric": m,
                      "query_id": q, "value": v[m], "n": 1} for q, v in sorted(pq.items())]
    comparisons = []
    implicit = [Comparison(baseline=base_, system=s) for s, base_ in rerank_inputs.items()
                if not any(c.system == s and c.baseline == base_ for c in ec.compare)]
    for comp in [*ec.compare, *implicit]:
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
    checks = check_expected(expected, cell.key, means, ec.metrics) if expected else []
    md = markdown_table(cell, ec.metrics, means, comparisons, unknown, checks=checks,
                        tolerance=expected["tolerance"] if expected else None)
    store.write_bytes(f"{cell.dir}/{TABLE}", md.encode())
    log(f"[evaluate] {cell.id}: {len(systems)} systems -> {store.url(cell.dir)}\n{md}")
    return {"rows": table.num_rows, "errors": 0, "files": ["part-00000.parquet"],
                "queries": {s: len(per_query[s]) for s in systems}, "average": ec.average,
                "answered": {s: pc.count_distinct(runs[s]["query_id"]).as_py()
                             if runs[s].num_rows else 0 for s in systems},
                "qrels_queries": len(set(qrels["query_id"].to_pylist())),
                "unknown_doc_ids": unknown, "table": TABLE,
                **({"expected": {"file": ec.expected, "tolerance": expected["tolerance"],
                                 "ok": all(c["ok"] for c in checks), "checks": checks}}
                   if checks else {})}


def read_expected(path: str | None) -> dict | None:
    """An expected file (2CR style, e.g. configs/retrieve-ciral.expected.yaml): `scores`
    maps `topics/system/doc_lang` (or `topics/system/qlang-doc_lang`) to `{metric: value}`,
    `tolerance` (default 0.005) is the largest |ours - expected| that is OK. None without a
    path; the file's `paper:` section is `write_pair_tables`'."""
    if not path:
        return None
    import yaml

    from xling.core.sources import _open

    try:
        with _open(path) as f:
            data = yaml.safe_load(f.read()) or {}
    except FileNotFoundError:
        raise ConfigError(f"evaluate.expected: file not found: {path}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"evaluate.expected: {path} is not a YAML mapping")
    scores = data.get("scores") or {}
    if not isinstance(scores, dict) or not all(isinstance(v, dict) for v in scores.values()):
        raise ConfigError(f"evaluate.expected: `scores` in {path} must map "
                          "'topics/system/doc_lang' to {metric: value}")
    return {"path": path, "source": data.get("source"), "scores": scores,
            "tolerance": float(data.get("tolerance", DEFAULT_TOLERANCE)),
            "paper": data.get("paper") or {}}


def check_expected(expected: dict, key: dict, means: dict[str, dict[str, float]],
                   metrics: list[str]) -> list[dict]:
    """Our means beside the expected scores of this cell (topic set, query and document
    language): one check per (system, metric) the file gives, `ok` when within the
    tolerance. A metric the file names that the config does not compute is a failed check
    (ours None), so that a missing measure is not taken for a match."""
    from xling.tasks import irmetrics

    ours = {irmetrics.canonical(m): m for m in metrics}
    tol = expected["tolerance"]
    checks = []
    for system, values in means.items():
        spec = None
        for k in (f"{key['topics']}/{system}/{key['doc_lang']}",
                  f"{key['topics']}/{system}/{key['qlang']}-{key['doc_lang']}"):
            spec = expected["scores"].get(k, spec)
        for metric, want in (spec or {}).items():
            try:
                name = ours.get(irmetrics.canonical(metric))
            except ValueError as e:
                raise ConfigError(f"evaluate.expected ({expected['path']}): {e}") from None
            got = values.get(name) if name else None
            got = None if got is None or math.isnan(got) else float(got)
            ok = got is not None and abs(got - float(want)) <= tol + 1e-12
            checks.append({"system": system, "metric": name or metric,
                           "expected": float(want), "value": got, "ok": ok})
    return checks


def _check_cell(checks: list[dict]) -> str:
    if not checks:
        return ""
    bad = [c for c in checks if not c["ok"]]
    if not bad:
        return "OK"
    return "FAIL: " + "; ".join(
        f"{c['metric']} {_fmt(c['value'])} vs {c['expected']:.4f}"
        + (f" (Δ {c['value'] - c['expected']:+.4f})" if c["value"] is not None else
           " (not computed: add it to evaluate.metrics)") for c in bad)


def _fmt(v: float | None, pct: bool = False) -> str:
    return fmt(v, 1 if pct else 4, dash="n/a")


def markdown_table(cell: Cell, metrics: list[str], means: dict, comparisons: list[dict],
                   unknown: dict, *, checks: list[dict] | None = None,
                   tolerance: float | None = None) -> str:
    """The cell's _table.md: means per system, with an `expected` column (OK / FAIL within the
    tolerance) when an expected file has numbers for the cell, then the comparisons."""
    title = (f"### {cell.key['topics']}: queries {cell.key['qlang']}, documents "
             f"{cell.key['doc_lang']}")
    by_system: dict[str, list[dict]] = {}
    for c in checks or []:
        by_system.setdefault(c["system"], []).append(c)
    extra = [f"expected (±{tolerance:g})"] if by_system else []
    lines = [title, "", "| system | " + " | ".join([*metrics, *extra]) + " |",
             "|---|" + "---|" * (len(metrics) + len(extra))]
    for system, ms in means.items():
        cells = [_fmt(ms[m]) for m in metrics]
        if extra:
            cells.append(_check_cell(by_system.get(system, [])))
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
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


def run_tables(cfg: XlingConfig, store: RunStore) -> list:
    """Every table of tables.md and measure as an `irmetrics.RunTable` (systems x language
    pairs), read from the stored rows of every finished evaluate cell of the run root, so
    that the table holds every first stage and reranker the run root has evaluated (other
    configs' cells of the same pairs too, and cells skipped as done). Where two cells score
    a system of one pair, this config's cell wins, then the later in name order."""
    pairs = table_pairs(cfg)
    wanted = {cell for cells in pairs.values() for cell in cells}
    mine = {c.dir for c in evaluate_cells(cfg) if "study" not in c.key}
    found = []
    for name in store.list_dirs("evaluate"):
        manifest = store.read_json_or_none(f"evaluate/{name}/_manifest.json")
        if not manifest or "study" in manifest["key"] or not manifest.get("files"):
            continue
        key = manifest["key"]
        if (key.get("topics"), key.get("qlang"), key.get("doc_lang")) in wanted:
            found.append((f"evaluate/{name}" in mine, name, manifest))
    rows = []
    for _, name, manifest in sorted(found, key=lambda f: f[:2]):
        t = store.read_parquet([f"evaluate/{name}/{f}" for f in manifest["files"]])
        t = t.filter(pc.is_null(t["query_id"]))
        rows += [{**r, "key": manifest["key"],
                  "reranked": manifest["params"].get("reranked", {})} for r in t.to_pylist()]
    return pair_tables(rows, pairs, cfg.evaluate.metrics)


def table_pairs(cfg: XlingConfig) -> dict[str, list[tuple[str, str, str]]]:
    """{table name: [(topic set, qlang, doc_lang), ...]}: `evaluate.tables`, each pair found
    in exactly one of its topic sets, or one table per topic set (its full grid)."""
    sets = {ts.name: ts for ts in cfg.retrieve.topics}
    if not cfg.evaluate.tables:
        return {ts.name: [(ts.name, ql, dl) for ql in ts.langs for dl in ts.doc_langs]
                for ts in cfg.retrieve.topics}
    out = {}
    for i, table in enumerate(cfg.evaluate.tables):
        where = f"evaluate.tables[{i}] ('{table.name}')"
        names = table.topics or list(sets)
        unknown = [n for n in names if n not in sets]
        if unknown:
            raise ConfigError(f"{where}: topics {unknown} are not retrieve.topics names "
                              f"({sorted(sets)})")
        cells = []
        for pair in table.pairs:
            ql, dl = pair.split("-")
            found = [n for n in names if ql in sets[n].langs and dl in sets[n].doc_langs]
            if len(found) != 1:
                raise ConfigError(
                    f"{where}: pair {pair} is searched by " + (
                        f"topic sets {found}: name one in the table's `topics:`" if found else
                        f"no topic set of {names}: add {ql} to the `langs` and {dl} to the "
                        "`doc_langs` of one"))
            cells.append((found[0], ql, dl))
        out[table.name] = cells
    return out


def pair_tables(rows: list[dict], tables: dict[str, list[tuple[str, str, str]]],
                metrics: list[str]) -> list:
    """The evaluate cells' mean rows (each with its cell `key` and `reranked` spec) as one
    `irmetrics.RunTable` per (table, measure): columns the table's pairs, rows its systems,
    `*` where a reranker's paired t-test against its first stage gives p < 0.05."""
    from xling.tasks import irmetrics

    out = []
    for name, cells in tables.items():
        label = {cell: irmetrics.pair_label(cell[1], cell[2]) for cell in cells}
        mine = [(r, label[k]) for r in rows
                if (k := (r["key"]["topics"], r["key"]["qlang"], r["key"]["doc_lang"])) in label]
        if not mine:
            continue
        inputs = {s: spec["input"] for r, _ in mine for s, spec in r["reranked"].items()}
        for metric in metrics:
            values: dict[str, dict[str, float]] = {}
            significant: dict[str, dict[str, bool]] = {}
            for r, pair in mine:
                if r["metric"] == metric and r["setting"] != "comparison":
                    system = r["system"] if not r["model"].endswith("+oracle") else r["model"]
                    values.setdefault(system, {})[pair] = r["value"]
                elif r["metric"] == f"{metric}:ttest_p" and r["system"] in inputs and \
                        r["model"] == f"{r['system']} vs {inputs[r['system']]}":
                    significant.setdefault(r["system"], {})[pair] = \
                        irmetrics.significant(r["value"])
            out.append(irmetrics.RunTable(name, metric, list(label.values()), values,
                                          significant, inputs))
    return out


def write_pair_tables(cfg: XlingConfig, store: RunStore, *, log=print) -> str | None:
    """`evaluate/tables.md`: the evaluate cells as systems x language pairs with AVG (the
    shape of LLM-CLIR's Tables 2-7); a study that renders IR tables (`Ranked`: LLM-CLIR) adds
    its own parts, such as PRI and Realized % and the paper's numbers beside xling's."""
    tables = run_tables(cfg, store)
    if not tables:
        return None
    study = get_study(cfg.study.task) if cfg.study is not None else None
    if isinstance(study, Ranked):
        md = study.render_runs(cfg.study.options, tables, expected=read_expected(
            cfg.evaluate.expected), config=cfg.model_dump(mode="json"))
    else:
        md = "\n".join(t.markdown() for t in tables)
    store.write_bytes("evaluate/tables.md", md.encode())
    log(f"[evaluate] tables across language pairs -> {store.url('evaluate/tables.md')}")
    return md
