"""Studies as data: the glue between a config's `study:` section and its study package.

A study is a package `xling/studies/<task>/` behind `xling.studies.base.Study`, plus a
config. The study says which (setting, language) prompt sets it has, builds their prompt
rows, names their output parser, and turns generations (and judgments, features) into
metrics and the paper's tables. This file turns that into the generate, judge, features and
evaluate stages' cells and inputs through the interface alone (capabilities are asked with
isinstance), so adding a study, a setting, a language or a model touches no job code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from pydantic import Field, model_validator

from xling.core.config import ConfigError, Strict
from xling.core.cells import Cell
from xling.core.status import read_rows, require_done
from xling.core.store import RunStore
from xling.jobs.features import FeaturesStage
from xling.jobs.generate import GenerateStage
from xling.jobs.judge import JudgeStage
from xling.jobs.narrow import NarrowStage, narrow_cell, read_selections
from xling.jobs.nuggets import NuggetStage, nugget_results
from xling.jobs.translate import TranslateStage, translate_cell
from xling.studies.base import (Evidence, Featured, Judged, Narrowed, PairJudged, Retrieving,
                                Study, StudyInputs, Translated, judge_scope)
from xling.studies.registry import NAMES, get_study

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `study:` section


class StudyConfig(Strict):
    """`study`: a study package (`xling/studies/<task>/`) and its options. The study builds
    the generate stage's prompts, the judge prompts, and the metrics and tables of the
    evaluate stage; `options` are validated by the study's Options model."""

    task: Literal[NAMES] = Field(  # type: ignore[valid-type]
        description=f"the study: {' | '.join(NAMES)} (xling/studies/<task>/)")
    options: dict = Field(default_factory=dict, description="the study's options (its Options "
                                                            "model: xling/studies/<task>/options.py)")

    @model_validator(mode="before")
    @classmethod
    def _options(cls, data):
        from pydantic import ValidationError

        if not isinstance(data, dict) or data.get("task") not in NAMES:
            return data  # the Literal reports the unknown task
        study = get_study(data["task"])
        try:
            options = study.validate_options(data.get("options"))
        except ValidationError as e:  # re-rooted under `options`, so errors name the key
            raise ValidationError.from_exception_data(
                cls.__name__, [_option_error(study, err) for err in e.errors()]) from None
        return {**data, "options": options}


def _option_error(study: Study, err: dict):
    """One error of a study's Options, located under `options`; an unknown key names the
    close one and the valid keys, as every other config error does."""
    import difflib

    from pydantic_core import InitErrorDetails

    loc = ("options", *err["loc"])
    if err["type"] != "extra_forbidden" or len(err["loc"]) != 1:
        return InitErrorDetails(type=err["type"], loc=loc, input=err["input"],
                                ctx=err.get("ctx", {}))
    valid = sorted(study.Options.model_fields)
    close = difflib.get_close_matches(str(err["loc"][0]), valid, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return InitErrorDetails(type="value_error", loc=loc, input=err["input"], ctx={
        "error": ValueError(f"unknown key. Fix: {hint}Valid keys here: {', '.join(valid)}")})


def study_of(cfg: XlingConfig) -> Study:
    return get_study(cfg.study.task)


def prompt_sets(cfg: XlingConfig) -> list[dict]:
    """The study's prompt sets: setting, lang, parser, input files and (for settings over
    machine-translated documents) the translate cell that holds the translations."""
    from xling.core.cells import StageFailed

    study, opts = study_of(cfg), cfg.study.options
    files = study.input_files(opts)
    out = []
    for pset in study.prompt_sets(opts):
        setting, lang = pset.setting, pset.lang
        ps = {"study": cfg.study.task, "setting": setting, "lang": lang,
              "parser": study.parser_for(setting), "options": opts, "files": files}
        if isinstance(study, Translated) and study.needs_translation(setting):
            source = study.translation_source(opts)
            try:
                if cfg.translate is None:
                    raise StageFailed("no translate section")
                ps["translation"] = translate_cell(cfg, "doc", source, lang, "en").id
            except StageFailed:
                raise ConfigError(
                    f"study setting '{setting}' ({lang}) reads the {lang} articles "
                    f"machine-translated to English: add translate.documents entry "
                    f"'{source}' (format: {cfg.study.task}) with langs including {lang} "
                    "and targets [en]") from None
        if isinstance(study, Narrowed) and study.needs_selection(setting):
            ps["selection"] = narrow_cell(cfg, study.selection_lang(lang)).id
        if isinstance(study, Retrieving):
            ps["retrieved"] = [c.id for c in retrieval_cells(cfg, study.retrieval(opts))]
        out.append(ps)
    if not out:
        raise ConfigError(f"study '{cfg.study.task}': the options select no prompt set "
                          "(check settings and langs)")
    return out


def translations(cfg: XlingConfig, store: RunStore, cell_id: str
                 ) -> tuple[dict[str, str], dict[str, str]]:
    """(doc_id -> English text, doc_id -> language-check flag) of a committed translate cell
    (error rows left out: the study then reports those articles as missing; flags only from
    cells made with translate.lang_check: flag)."""
    import pyarrow.compute as pc

    from xling.core.status import read_cell

    cell = next(c for c in TranslateStage().cells(cfg) if c.id == cell_id)
    require_done(store, cell, "the study's prompts")
    spec = next((s for s in cfg.translate.documents if s.name == cell.key["source"]), None)
    flagged = ((spec.lang_check if spec is not None else None) or cfg.translate.lang_check) \
        == "flag"
    t = read_cell(store, cell.dir, columns=["id", "text", "error",
                                            *(["lang_flag"] if flagged else [])])
    t = t.filter(pc.is_null(t["error"]))
    ids = t["id"].to_pylist()
    flags = ({i: f for i, f in zip(ids, t["lang_flag"].to_pylist()) if f} if flagged else {})
    return dict(zip(ids, t["text"].to_pylist())), flags


def prompt_rows(cfg: XlingConfig, ps: dict) -> pa.Table:
    """The prompt set's rows (tasks/prompts.py's PROMPTS schema); rows the study could not
    build keep their error."""
    from xling.tasks.prompts import built_prompt_table

    store = RunStore(cfg.run_root)
    inputs = StudyInputs()
    if "translation" in ps:
        inputs.translations, inputs.translation_flags = translations(cfg, store,
                                                                     ps["translation"])
    if "selection" in ps:
        cell = next(c for c in NarrowStage().cells(cfg) if c.id == ps["selection"])
        inputs.selections = read_selections(store, cell)
    if "retrieved" in ps:
        inputs.retrieved = retrieved_documents(cfg, study_of(cfg).retrieval(ps["options"]))
    rows = study_of(cfg).build_prompts(ps["options"], ps["setting"], ps["lang"], inputs=inputs)
    return built_prompt_table(rows, where=f"{ps['setting']}.{ps['lang']}")


def retrieval_cells(cfg: XlingConfig, spec: dict) -> list[Cell]:
    """The retrieve (or fusion) cells of a `Retrieving` study's run: one per doc language."""
    from xling.jobs.retrieve import first_stage_cells, fusion_cells

    if cfg.retrieve is None:
        raise ConfigError(f"study '{cfg.study.task}' reads the hits of retrieve run "
                          f"'{spec['run']}': add a `retrieve:` section that makes it")
    cells = [c for c in [*first_stage_cells(cfg), *fusion_cells(cfg)]
             if c.key["run"] == spec["run"] and c.key["topics"] == spec["topics"]
             and c.key["qlang"] == spec["qlang"] and c.key["doc_lang"] in spec["doc_langs"]]
    missing = sorted(set(spec["doc_langs"]) - {c.key["doc_lang"] for c in cells})
    if missing:
        raise ConfigError(f"study '{cfg.study.task}': retrieve makes no run '{spec['run']}' "
                          f"of topics '{spec['topics']}' ({spec['qlang']}) over {missing}: "
                          "add it to retrieve.runs or retrieve.fusion")
    return cells


def retrieved_documents(cfg: XlingConfig, spec: dict) -> dict[str, list[dict]]:
    """{query id: its top `k` documents}: the run's hits of every doc language merged by
    rank (then score), each with its text (the original, or its translation into the
    query language: `texts: dt`) and its qrels label (None where unjudged)."""
    import io

    from xling.core.sources import _open
    from xling.jobs.rerank import _collections, _texts, text_documents
    from xling.jobs.retrieve import first_stage_cells, fusion_cells

    store = RunStore(cfg.run_root)
    by_dir = {c.dir: c for c in [*first_stage_cells(cfg), *fusion_cells(cfg)]}
    ts = next(t for t in cfg.retrieve.topics if t.name == spec["topics"])
    out: dict[str, list[dict]] = {}
    for cell in retrieval_cells(cfg, spec):
        dl = cell.key["doc_lang"]
        hits = read_rows(store, [cell.dir], ["query_id", "doc_id", "rank", "score", "error"],
                         f"study {cfg.study.task}")
        top = [h for h in hits if h["error"] is None and h["rank"] <= spec["k"]]
        text_lang = dl if spec["texts"] == "og" else spec["qlang"]
        leaf = by_dir[cell.inputs[0]] if "fusion" in cell.params else cell
        docs = [text_documents(cfg, col, dl, text_lang) for col in _collections(cfg, leaf)]
        texts = _texts(docs, {h["doc_id"] for h in top}, cfg)
        qrels = {}
        if ts.qrels:  # {lang} is the query language, as the evaluate stage reads it
            from xling.tasks.topics import iter_qrels

            with _open(ts.qrels.replace("{doc_lang}", dl).replace("{lang}", spec["qlang"])) as f:
                qrels = {(r["query_id"], r["doc_id"]): r["relevance"]
                         for r in iter_qrels(io.BytesIO(f.read()))}
        for h in top:
            if h["doc_id"] in texts:
                out.setdefault(h["query_id"], []).append({
                    "docid": h["doc_id"], "doc_lang": dl, "title": None,
                    "text": texts[h["doc_id"]], "rank": h["rank"], "score": h["score"],
                    "judgment": qrels.get((h["query_id"], h["doc_id"]))})
    return {q: sorted(ds, key=lambda d: (d["rank"], -d["score"]))[:spec["k"]]
            for q, ds in out.items()}


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

    def judged(self, cfg: XlingConfig) -> Judged | PairJudged:
        study = study_of(cfg)
        if not isinstance(study, (Judged, PairJudged)):
            raise ConfigError(f"judge: study '{cfg.study.task}' has no judge prompts; remove the "
                              "`judge:` section")
        return study

    def judge_rows(self, cfg: XlingConfig, cell: Cell, gens: list[dict]) -> list[dict]:
        return self.judged(cfg).judge_rows(cell.params["options"], gens)

    def scope(self, cfg: XlingConfig) -> str:
        return judge_scope(study_of(cfg))

    def parser(self, cfg: XlingConfig) -> str:
        return self.judged(cfg).judge_parser(cfg.study.options)

    def pair_rows(self, cfg: XlingConfig, cell: Cell, gens: list[dict]) -> list[dict]:
        return self.judged(cfg).pair_rows(cell.params["options"], gens)


class StudyFeaturesStage(FeaturesStage):
    """The features stage over the study's generations, with the study's scorers."""

    def generation_cells(self, cfg: XlingConfig) -> list[Cell]:
        return study_generations(cfg)

    def study(self, cfg: XlingConfig) -> Featured:
        study = study_of(cfg)
        if not isinstance(study, Featured):
            raise ConfigError(f"features: study '{cfg.study.task}' scores no features; remove "
                              "the `features:` section")
        return study


class StudyNuggetStage(NuggetStage):
    """The nuggets stage over the study's generations (a `Cited` study's topics)."""

    def generation_cells(self, cfg: XlingConfig) -> list[Cell]:
        return study_generations(cfg)

    def topic_inputs(self, cfg: XlingConfig, lang: str) -> StudyInputs:
        study = study_of(cfg)
        if not isinstance(study, Retrieving):
            return StudyInputs()
        return StudyInputs(retrieved=retrieved_documents(
            cfg, study.retrieval(cfg.study.options)))

    def topic_input_dirs(self, cfg: XlingConfig) -> list[str]:
        study = study_of(cfg)
        if not isinstance(study, Retrieving):
            return []
        return [c.dir for c in retrieval_cells(cfg, study.retrieval(cfg.study.options))]


def evaluate_cell(cfg: XlingConfig) -> Cell:
    """The evaluate stage's one cell for the study: every generation (and judgment, and
    scored feature) of it; with published inputs (`source: published`), those files."""
    study = study_of(cfg)
    ran = cfg.generate is not None and bool(study.prompt_sets(cfg.study.options))
    gens = [c.dir for c in study_generations(cfg)] if ran else []
    judged = [c.dir for c in StudyJudgeStage().cells(cfg)] if ran and cfg.judge else []
    scored = [c.dir for c in StudyFeaturesStage().cells(cfg)] if ran and cfg.features else []
    files = study.input_files(cfg.study.options) if not gens else []
    labels = cfg.evaluate.labels
    params = {"generations": gens, "judgments": judged, "options": cfg.study.options,
              "language_check": bool(cfg.judge and cfg.judge.language_check
                                     and StudyJudgeStage().scope(cfg) == "generation"),
              "labels": labels}
    if scored:
        params["features"] = scored
    # the nuggets stage's assign cells: their scores go beside the study's own metrics
    nuggets = ([c.dir for c in StudyNuggetStage().assign_stage().cells(cfg)]
               if ran and cfg.nuggets else [])
    if nuggets:
        params["nuggets"] = nuggets
    return Cell("evaluate", {"study": cfg.study.task}, params,
                inputs=[*gens, *judged, *scored, *nuggets, *files,
                        *([labels] if labels else [])],
                n_shards=1)


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

    study, opts = study_of(cfg), cell.params["options"]
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
        more, md, nugget_items = nugget_results(store, cell.params["nuggets"])
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
