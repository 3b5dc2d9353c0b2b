"""Studies as data: the glue between a config's `study:` section and its tasks/ module.

A study is a module `xling/tasks/<task>.py` plus a config. The module says which
(setting, language) prompt sets the study has, builds their prompt rows, names their
output parser, and turns generations (and judgments) into metrics and the paper's tables.
This file turns that into the generate, judge and evaluate stages' cells and inputs, so
adding a setting, a language or a model to a study touches no job code.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from pydantic import Field, model_validator

from xling.core.config import ConfigError, Strict
from xling.core.runner import Cell, read_rows, require_done
from xling.core.store import RunStore
from xling.jobs.features import FeaturesStage
from xling.jobs.generate import GenerateStage
from xling.jobs.judge import JudgeStage
from xling.jobs.narrow import NarrowStage, narrow_cell, read_selections
from xling.jobs.translate import TranslateStage, translate_cell

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `study:` section


STUDIES = ("xrag", "bordirlines", "mirage", "cross")  # modules under xling/tasks/


class StudyConfig(Strict):
    """`study`: a study's tasks/ module (`xling/tasks/<task>.py`) and its options. The module
    builds the generate stage's prompts, the judge prompts, and the metrics and tables of
    the evaluate stage; `options` are checked by the module's `check_options`."""

    task: Literal[STUDIES]  # type: ignore[valid-type]
    options: dict = Field(default_factory=dict, description="the study's options (see the "
                                                            "module's check_options)")

    @model_validator(mode="after")
    def _options(self) -> "StudyConfig":
        import importlib

        module = importlib.import_module(f"xling.studies.{self.task}.study")
        object.__setattr__(self, "options", module.check_options(dict(self.options)))
        return self




def study_module(cfg: XlingConfig) -> ModuleType:
    return importlib.import_module(f"xling.studies.{cfg.study.task}.study")


def prompt_sets(cfg: XlingConfig) -> list[dict]:
    """The study's prompt sets: setting, lang, parser, input files and (for settings over
    machine-translated documents) the translate cell that holds the translations."""
    from xling.core.runner import StageFailed

    mod, opts = study_module(cfg), cfg.study.options
    files = mod.input_files(opts)
    out = []
    for pc in mod.prompt_cells(opts):
        ps = {"study": cfg.study.task, "setting": pc["setting"], "lang": pc["lang"],
              "parser": mod.parser_for(pc["setting"]), "options": opts, "files": files}
        if getattr(mod, "needs_translation", lambda s: False)(pc["setting"]):
            source = opts["translations"]
            try:
                if cfg.translate is None:
                    raise StageFailed("no translate section")
                ps["translation"] = translate_cell(cfg, "doc", source, pc["lang"], "en").id
            except StageFailed:
                raise ConfigError(
                    f"study setting '{pc['setting']}' ({pc['lang']}) reads the {pc['lang']} "
                    f"articles machine-translated to English: add translate.documents entry "
                    f"'{source}' (format: {cfg.study.task}) with langs including {pc['lang']} "
                    "and targets [en]") from None
        if getattr(mod, "needs_selection", lambda s: False)(pc["setting"]):
            ps["selection"] = narrow_cell(cfg, mod.split_cell_lang(pc["lang"])[1]).id
        out.append(ps)
    if not out:
        raise ConfigError(f"study '{cfg.study.task}': the options select no prompt set "
                          "(check settings and langs)")
    return out


def translations(cfg: XlingConfig, store: RunStore, cell_id: str) -> dict[str, str]:
    """doc_id -> English text of a committed translate cell (error rows left out: the study
    then reports those articles as missing)."""
    import pyarrow.compute as pc

    from xling.core.runner import read_cell

    cell = next(c for c in TranslateStage().cells(cfg) if c.id == cell_id)
    require_done(store, cell, "the study's prompts")
    t = read_cell(store, cell.dir, columns=["id", "text", "error"])
    t = t.filter(pc.is_null(t["error"]))
    return dict(zip(t["id"].to_pylist(), t["text"].to_pylist()))


def prompt_rows(cfg: XlingConfig, ps: dict) -> pa.Table:
    """The prompt set's rows (tasks/prompts.py's PROMPTS schema); rows the study could not
    build keep their error."""
    from xling.tasks.prompts import built_prompt_table

    store = RunStore(cfg.run_root)
    tr = translations(cfg, store, ps["translation"]) if "translation" in ps else None
    extra = {}
    if "selection" in ps:
        cell = next(c for c in NarrowStage().cells(cfg) if c.id == ps["selection"])
        extra["selections"] = read_selections(store, cell)
    rows = study_module(cfg).build_prompts(ps["options"], ps["setting"], ps["lang"],
                                           translations=tr, **extra)
    return built_prompt_table(rows, where=f"{ps['setting']}.{ps['lang']}")


STUDY_METRICS = pa.schema([("study", pa.string()), ("setting", pa.string()), ("lang", pa.string()),
                           ("model", pa.string()), ("metric", pa.string()),
                           ("value", pa.float64()), ("ci_low", pa.float64()),
                           ("ci_high", pa.float64()), ("n", pa.int64())])


class StudyGenerateStage(GenerateStage):
    """The generate stage with the study's prompt sets added to generate.prompts' files."""

    def prompt_sets(self, cfg: XlingConfig) -> list[tuple[dict, dict, list[str]]]:
        sets = super().prompt_sets(cfg)
        for ps in prompt_sets(cfg) if cfg.study is not None else []:
            sets.append(({"study": ps["study"], "setting": ps["setting"], "lang": ps["lang"]},
                         {k: v for k, v in ps.items() if k != "files"}, ps["files"]))
        return sets

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream=()) -> None:
        super().prepare(cfg, store, upstream)
        if cfg.study is not None and "translate" not in upstream:
            needed = {c.params["prompts"].get("translation") for c in self.cells(cfg)} - {None}
            for tc in TranslateStage().cells(cfg) if needed else []:
                if tc.id in needed:
                    require_done(store, tc, "the study's prompts")
        if cfg.study is not None and "narrow" not in upstream:
            needed = {c.params["prompts"].get("selection") for c in self.cells(cfg)} - {None}
            for nc in NarrowStage().cells(cfg) if needed else []:
                if nc.id in needed:
                    require_done(store, nc, "the study's CROSS prompts")

    def prompt_rows(self, cell: Cell, cfg: XlingConfig) -> pa.Table:
        if "study" in cell.params["prompts"]:
            return prompt_rows(cfg, cell.params["prompts"])
        return super().prompt_rows(cell, cfg)


def study_generations(cfg: XlingConfig) -> list[Cell]:
    return [c for c in StudyGenerateStage().cells(cfg) if "study" in c.params["prompts"]]


class StudyJudgeStage(JudgeStage):
    """The judge stage over the study's generations, with the study's judge prompts."""

    def generation_cells(self, cfg: XlingConfig) -> list[Cell]:
        return study_generations(cfg)

    def judge_rows(self, cfg: XlingConfig, cell: Cell, gens: list[dict]) -> list[dict]:
        return study_module(cfg).judge_rows(cell.params["options"], gens)

    def scope(self, cfg: XlingConfig) -> str:
        return getattr(study_module(cfg), "JUDGE_SCOPE", "generation")

    def parser(self, cfg: XlingConfig) -> str:
        return study_module(cfg).judge_parser(cfg.study.options)

    def pair_rows(self, cfg: XlingConfig, cell: Cell, gens: list[dict]) -> list[dict]:
        return study_module(cfg).pair_rows(cell.params["options"], gens)


class StudyFeaturesStage(FeaturesStage):
    """The features stage over the study's generations, with the study's scorers."""

    def generation_cells(self, cfg: XlingConfig) -> list[Cell]:
        return study_generations(cfg)

    def study(self, cfg: XlingConfig) -> ModuleType:
        return study_module(cfg)


def evaluate_cell(cfg: XlingConfig) -> Cell:
    """The evaluate stage's one cell for the study: every generation (and judgment, and
    scored feature) of it; with published inputs (`source: published`), those files."""
    mod = study_module(cfg)
    ran = cfg.generate is not None and bool(mod.prompt_cells(cfg.study.options))
    gens = [c.dir for c in study_generations(cfg)] if ran else []
    judged = [c.dir for c in StudyJudgeStage().cells(cfg)] if ran and cfg.judge else []
    scored = [c.dir for c in StudyFeaturesStage().cells(cfg)] if ran and cfg.features else []
    files = mod.input_files(cfg.study.options) if not gens else []
    labels = cfg.evaluate.labels
    params = {"generations": gens, "judgments": judged, "options": cfg.study.options,
              "language_check": bool(cfg.judge and cfg.judge.language_check
                                     and StudyJudgeStage().scope(cfg) == "generation"),
              "labels": labels}
    if scored:
        params["features"] = scored
    return Cell("evaluate", {"study": cfg.study.task}, params,
                inputs=[*gens, *judged, *scored, *files, *([labels] if labels else [])],
                n_shards=1)


def detect_languages(opts: dict, gens: list[dict]) -> tuple[dict, dict]:
    """{(setting, lang, model, item_id): detected code} of each parsed answer, with lingua
    restricted to the study's languages and English; and the detector's setting."""
    from xling.actors.langid import LanguageDetector
    from xling.tasks.languages import lingua_language

    codes = sorted({*opts["langs"], "en"})
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


def run_evaluate(cfg: XlingConfig, store: RunStore, cell: Cell, *, log=print) -> dict:
    """Score the study's generations the paper's way: items, metrics and the paper's tables."""
    import time

    from xling.core.provenance import provenance
    from xling.core.runner import code_version, now

    t0 = time.time()
    mod, opts = study_module(cfg), cell.params["options"]
    gens = read_rows(store, cell.params["generations"],
                     ["item_id", "study", "setting", "lang", "model", "parsed", "output", "error",
                      *getattr(mod, "SCORE_COLUMNS", ())], "evaluate")
    judgments, extra, check = None, {}, None
    if cell.params["judgments"]:
        judgments = read_rows(store, cell.params["judgments"],
                              ["item_id", "setting", "lang", "model", "judge", "verdict", "error"],
                              "evaluate")
        extra["labels"] = cell.params["labels"]
        if cell.params["language_check"]:
            extra["detected"], check = detect_languages(opts, gens)
    if cell.params.get("features"):
        import json

        scored = read_rows(store, cell.params["features"],
                           ["item_id", "lang", "model", "scorer", "kind", "scores", "output",
                            "error"], "evaluate")
        for r in scored:
            r["scores"] = json.loads(r["scores"]) if r["scores"] else None
        extra["features"] = scored
    items, metrics = mod.score(opts, gens, judgments, **extra)
    table = pa.Table.from_pylist(metrics, schema=STUDY_METRICS)
    store.write_parquet(f"{cell.dir}/part-00000.parquet", table)
    # only the metrics rows are part-*.parquet: the rest starts with `_` (jobs/evaluate.py)
    from xling.core.runner import ITEMS, PLOTS, TABLE

    store.write_parquet(f"{cell.dir}/{ITEMS}", pa.Table.from_pylist(items))
    if hasattr(mod, "render"):  # tables and plots drawn from the items
        md, plots = mod.render(items, metrics)
    else:  # a module's tables may take the study options (XRAG: its published numbers)
        import inspect

        md = mod.tables(metrics, options=opts) \
            if "options" in inspect.signature(mod.tables).parameters else mod.tables(metrics)
        plots = mod.plots(metrics) if hasattr(mod, "plots") else {}
    store.write_bytes(f"{cell.dir}/{TABLE}", md.encode())
    for name, data in plots.items():
        store.write_bytes(f"{cell.dir}/{PLOTS}/{name}", data)
    errors = sum(1 for i in items if i.get("error"))
    manifest = {"stage": "evaluate", "cell": cell.id, "key": cell.key, "params": cell.params,
                "config_hash": cell.hash, "code_version": code_version(), "n_shards": 1,
                "rows": table.num_rows, "errors": 0, "files": ["part-00000.parquet"],
                "items": {"rows": len(items), "errors": errors, "file": ITEMS,
                          # prompts the engine cut to fit max_model_len (XRAG items carry it)
                          **({"truncated": sum(1 for i in items if i.get("truncated"))}
                             if any("truncated" in i for i in items) else {})},
                "generations": len(gens), "language_check": check, "table": TABLE,
                "plots": sorted(f"{PLOTS}/{n}" for n in plots), "provenance": provenance(),
                "timings": {"this_run_seconds": round(time.time() - t0, 3)},
                "finished_at": now()}
    store.write_json(f"{cell.dir}/_manifest.json", manifest)
    log(f"[evaluate] {cell.id}: {len(gens)} generations, {errors} unusable items -> "
        f"{store.url(cell.dir)}\n{md}")
    return manifest
