"""Studies as data: the glue between a config's `study:` section and its study package.

A study is a package `xling/studies/<task>/` behind `xling.studies.base.Study`, plus a
config. The study says which (setting, language) prompt sets it has, builds their prompt
rows, names their output parser, and turns generations (and judgments, features) into
metrics and the paper's tables. This file turns that into the generate, judge, features and
evaluate stages' cells and inputs through the interface alone (capabilities are asked with
isinstance), so adding a study, a setting, a language or a model touches no job code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import Field, field_serializer, model_validator

from xling.core import upstream
from xling.core.config import ConfigError, Strict
from xling.core.cells import Cell
from xling.core.runs import searched_collections
from xling.core.sources import passage_texts
from xling.core.status import SELECTIONS, read_rows, require_done
from xling.core.store import RunStore
from xling.studies.base import (Generative, Narrowed, Retrieving, Study, StudyInputs,
                                StudyOptions, Translated)
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
    # the study's validated Options object (typed Any so that --help shows one line, not a
    # model without fields); dumped, and so hashed, as its `as_options` dict
    options: Any = Field(default_factory=dict, description=(
        "the study's options (its Options model: xling/studies/<task>/options.py)"))

    @field_serializer("options")
    def _options_dict(self, options: StudyOptions) -> dict:
        return options.as_options()

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
    if not isinstance(study, Generative):
        return []  # a Ranked study's LLM calls are the rerank stage's
    files = study.input_files(opts)
    out = []
    for pset in study.prompt_sets(opts):
        setting, lang = pset.setting, pset.lang
        ps = {"study": cfg.study.task, "setting": setting, "lang": lang,
              "parser": study.parser_for(setting), "options": opts.as_options(),
              "files": files}
        if isinstance(study, Translated) and study.needs_translation(setting):
            source = study.translation_source(opts)
            try:
                if cfg.translate is None:
                    raise StageFailed("no translate section")
                ps["translation"] = upstream.translation(cfg, "doc", source, lang, "en").id
            except StageFailed:
                raise ConfigError(
                    f"study setting '{setting}' ({lang}) reads the {lang} articles "
                    f"machine-translated to English: add translate.documents entry "
                    f"'{source}' (format: {cfg.study.task}) with langs including {lang} "
                    "and targets [en]") from None
        if isinstance(study, Narrowed) and study.needs_selection(setting):
            ps["selection"] = upstream.find(cfg, "narrow", study=cfg.study.task,
                                            lang=study.selection_lang(lang)).id
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

    cell = upstream.cell(cfg, "translate", cell_id)
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
        inputs.selections = read_selections(store, upstream.cell(cfg, "narrow",
                                                                 ps["selection"]))
    study = study_of(cfg)
    opts = study.options_of(ps)
    if "retrieved" in ps:
        inputs.retrieved = retrieved_documents(cfg, study.retrieval(opts))
    rows = study.build_prompts(opts, ps["setting"], ps["lang"], inputs=inputs)
    return built_prompt_table(rows, where=f"{ps['setting']}.{ps['lang']}")


def read_selections(store: RunStore, cell: Cell) -> dict[tuple[str, str], dict]:
    """(context_id, query language) -> selection row of a committed narrow cell."""
    require_done(store, cell, "the study's narrowed prompts")
    t = store.read_parquet(f"{cell.dir}/{SELECTIONS}")
    return {(r["context_id"], r["qlang"]): r for r in t.to_pylist() if not r["error"]}


def study_generations(cfg: XlingConfig) -> list[Cell]:
    """The generate cells of the study's prompt sets (what judge, features, nuggets and
    evaluate read)."""
    return [c for c in upstream.cells(cfg, "generate") if "study" in c.params["prompts"]]


def retrieval_cells(cfg: XlingConfig, spec: dict) -> list[Cell]:
    """The retrieve (or fusion) cells of a `Retrieving` study's run: one per doc language."""
    if cfg.retrieve is None:
        raise ConfigError(f"study '{cfg.study.task}' reads the hits of retrieve run "
                          f"'{spec['run']}': add a `retrieve:` section that makes it")
    cells = [c for c in upstream.cells(cfg, "retrieve")
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

    store = RunStore(cfg.run_root)
    ts = next(t for t in cfg.retrieve.topics if t.name == spec["topics"])
    out: dict[str, list[dict]] = {}
    for cell in retrieval_cells(cfg, spec):
        dl = cell.key["doc_lang"]
        hits = read_rows(store, [cell.dir], ["query_id", "doc_id", "rank", "score", "error"],
                         f"study {cfg.study.task}")
        top = [h for h in hits if h["error"] is None and h["rank"] <= spec["k"]]
        text_lang = dl if spec["texts"] == "og" else spec["qlang"]
        leaf = upstream.at(cfg, cell.inputs[0]) if "fusion" in cell.params else cell
        docs = [upstream.documents(cfg, col, dl, text_lang)
                for col in searched_collections(cfg, leaf)]
        texts = passage_texts(docs, {h["doc_id"] for h in top})
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
