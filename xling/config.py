"""The whole experiment's config: the top-level model that assembles every stage's section,
checks the links between sections, and loads a YAML file with dotted overrides.

It sits above `jobs/` (it imports each stage's section), beside the CLI; `core/config.py`
has the machinery (strict models, hashing, overrides, error formatting).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from xling.core.config import ConfigError, NoHash, RayConfig, Strict, read_config, validate
from xling.core.sweep import SweepConfig
from xling.jobs.evaluate import EvaluateConfig
from xling.jobs.features import FeaturesConfig
from xling.jobs.generate import GenerateConfig
from xling.jobs.index import IndexConfig
from xling.jobs.ingest import IngestConfig
from xling.jobs.judge import JudgeConfig
from xling.jobs.narrow import NarrowConfig
from xling.jobs.nuggets import NuggetsConfig
from xling.jobs.rerank import RerankConfig
from xling.jobs.retrieve import RetrieveConfig
from xling.jobs.study import StudyConfig
from xling.jobs.translate import TranslateConfig
from xling.studies.base import Cited, Narrowed
from xling.studies.registry import get_study, names_with

__all__ = ["ConfigError", "STAGE_ORDER", "XlingConfig", "load_config", "validate_config"]


STAGE_ORDER = ("ingest", "translate", "index", "retrieve", "rerank", "narrow", "generate",
               "features", "judge", "nuggets", "evaluate", "report")


class XlingConfig(Strict):
    """The whole experiment. One file per study; sweeps override fields from the CLI."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                      description="the experiment's name; run_root defaults to ./runs/<name>")
    run_root: str | None = NoHash(None, description="local path or s3://bucket/prefix")
    stages: list[Literal[STAGE_ORDER]] | None = NoHash(  # type: ignore[valid-type]
        None, description="stages `xling run` runs, in order (default: every stage with a "
                          "section, then report)")
    ray: RayConfig = NoHash(RayConfig())
    ingest: IngestConfig | None = None
    translate: TranslateConfig | None = None
    index: IndexConfig | None = None
    retrieve: RetrieveConfig | None = None
    rerank: RerankConfig | None = None
    study: StudyConfig | None = None
    narrow: NarrowConfig | None = None
    generate: GenerateConfig | None = None
    features: FeaturesConfig | None = None
    judge: JudgeConfig | None = None
    nuggets: NuggetsConfig | None = None
    evaluate: EvaluateConfig | None = None
    sweep: SweepConfig | None = NoHash(None, description="the grid `xling sweep` runs")

    @model_validator(mode="after")
    def _defaults(self) -> "XlingConfig":
        if self.run_root is None:
            object.__setattr__(self, "run_root", f"./runs/{self.name}")
        if self.stages is None:
            object.__setattr__(self, "stages", [s for s in STAGE_ORDER
                                                if s == "report" or getattr(self, s) is not None])
        for stage in self.stages:
            if stage != "report" and getattr(self, stage) is None:
                raise ValueError(
                    f"stage '{stage}' is listed in `stages` but has no `{stage}:` section"
                )
        return self

    @model_validator(mode="after")
    def _study_links(self) -> "XlingConfig":
        study = get_study(self.study.task) if self.study is not None else None
        if self.narrow is not None and not isinstance(study, Narrowed):
            narrowing = names_with(Narrowed)
            raise ValueError("narrow ranks the sentences of a study that narrows long contexts: "
                             f"it needs a `study:` section with task: {' or '.join(narrowing)} "
                             "(remove `narrow:` otherwise)")
        for section, why in (study.required_sections(self.study.options).items()
                             if study is not None else ()):
            if getattr(self, section) is None:
                raise ValueError(why)
        if study is not None:
            study.check_config(self.study.options, self)
        for name in ("judge", "features", "nuggets"):
            if getattr(self, name) is not None and (self.study is None or self.generate is None):
                raise ValueError(f"{name} scores a study's generations: it needs `study:` and "
                                 "`generate:` sections")
        if self.nuggets is not None and not isinstance(study, Cited):
            raise ValueError(f"nuggets: study '{self.study.task}' has no documents to make "
                             "nuggets from; it works on the studies that cite documents: "
                             f"{', '.join(names_with(Cited))} (remove `nuggets:` otherwise)")
        if self.generate is not None and not self.generate.prompts and self.study is None:
            raise ValueError("generate needs prompts: list files under generate.prompts, or add "
                             "a `study:` section whose study package builds them")
        if self.evaluate is not None and self.evaluate.labels is not None:
            if self.judge is None:
                raise ValueError("evaluate.labels (kappa of the judge panel) needs a `judge:` "
                                 "section")
            if not self.evaluate.labels.startswith("s3://") and not Path(
                    self.evaluate.labels).is_file():
                raise ValueError(f"evaluate.labels: file not found: {self.evaluate.labels}")
        return self

    @model_validator(mode="after")
    def _links(self) -> "XlingConfig":
        """Cross-section references: runs -> index collections -> translations."""
        tr = self.translate
        if self.index is not None:
            for i, c in enumerate(self.index.collections):
                if not c.translated:
                    continue
                src = next((d for d in (tr.documents if tr else []) if d.name == c.name), None)
                gaps = [(l, t) for l in c.langs for t in c.translated
                        if src is None or l not in src.langs or t not in src.targets]
                if gaps:
                    raise ValueError(
                        f"index.collections[{i}] ('{c.name}') indexes document translations "
                        f"{', '.join(f'{l}->{t}' for l, t in gaps)} that the translate stage does "
                        f"not make: add a translate.documents entry named '{c.name}' with those "
                        "langs and targets, and run the translate stage first")
        if self.rerank is not None:
            known = ({x.name for x in [*self.retrieve.runs, *self.retrieve.fusion]}
                     if self.retrieve else set())
            for i, run in enumerate(self.rerank.runs):
                if run.input is not None and run.input not in known:
                    raise ValueError(f"rerank.runs[{i}] ('{run.name}'): input '{run.input}' is "
                                     f"not a retrieve run or fusion (known: {sorted(known)})")
        r = self.retrieve
        if r is None:
            return self
        if self.index is None:
            raise ValueError("retrieve searches index.collections: add an `index:` section")
        cols = {c.name: c for c in self.index.collections}
        for i, run in enumerate(r.runs):
            where = f"retrieve.runs[{i}] ('{run.name}')"
            per_lang = "{doc_lang}" in run.collection
            if per_lang and run.mode not in ("og", "qt", "dt"):
                raise ValueError(f"{where}: a collection per document language "
                                 f"('{run.collection}') needs mode og, qt or dt")
            col = cols.get(run.collection)
            if col is None and not per_lang:
                raise ValueError(f"{where}: unknown collection '{run.collection}'; "
                                 f"index.collections has {sorted(cols)}")
            if run.engine not in self.index.engines and run.trec is None:
                raise ValueError(f"{where}: engine '{run.engine}' is not built; add it to "
                                 f"index.engines (now {self.index.engines})")
            if run.mode not in ("og", "qt", "dt"):
                continue
            for ts in r.topics:
                if run.topics is not None and ts.name not in run.topics:
                    continue
                for ql in ts.langs:
                    for dl in ts.doc_langs:
                        col = cols.get(run.collection_for(dl))
                        if col is None:
                            raise ValueError(
                                f"{where}: topics '{ts.name}' search {dl} documents, and "
                                f"collection '{run.collection_for(dl)}' is not in "
                                f"index.collections ({sorted(cols)})")
                        if dl not in col.langs:
                            raise ValueError(f"{where}: topics '{ts.name}' search {dl} documents "
                                             f"but collection '{col.name}' has langs {col.langs}")
                        if run.trec is not None:  # imported: the collection names its texts
                            continue
                        if run.mode in ("og", "qt") and not col.original:
                            raise ValueError(f"{where}: mode {run.mode} searches the original "
                                             f"documents; set original: true on '{col.name}'")
                        if run.mode == "dt" and ql not in col.translated:
                            raise ValueError(
                                f"{where}: mode dt needs the {dl} documents of '{col.name}' "
                                f"translated into {ql} (the translate stage's DT): add {ql} to "
                                f"index.collections '{col.name}' translated: and to its "
                                "translate.documents targets")
                        if run.mode == "qt" and ql != dl:
                            name = (ts.translations or ts.name).replace("{doc_lang}", dl)
                            spec = next((t for t in (tr.topics if tr else [])
                                         if t.name == name), None)
                            if spec is None or ql not in spec.langs or dl not in spec.targets:
                                raise ValueError(
                                    f"{where}: mode qt needs topics '{ts.name}' translated "
                                    f"{ql}->{dl} by the translate stage: add a translate.topics "
                                    f"entry named '{name}' with langs [{ql}] and targets [{dl}]")
        return self


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> XlingConfig:
    """Read, override and validate a config. Raises ConfigError with actionable messages."""
    data, given = read_config(path, overrides)
    _expected_beside(data, path)
    return validate_config(data, source=str(path), overrides=given)


def _expected_beside(data: dict, path: str | Path) -> None:
    """`evaluate.expected` defaults to `<config>.expected.yaml` beside the config, when that
    file exists (pyserini 2CR style); `expected: null` in the config turns it off."""
    ev = data.get("evaluate") if isinstance(data, dict) else None
    if not isinstance(ev, dict) or "expected" in ev or str(path).startswith("s3://"):
        return
    p = Path(path)
    beside = p.with_name(f"{p.name.removesuffix(p.suffix)}.expected.yaml")
    if beside.is_file():
        ev["expected"] = str(beside)


def validate_config(data: dict, source: str = "<config>",
                    overrides: dict[str, str] | None = None) -> XlingConfig:
    from xling.core.datasets import resolve_named
    from xling.core.store import StoreError

    try:
        resolve_named(data)  # irds:, pyserini: and hf: names -> files in the run store
    except (ConfigError, StoreError) as e:
        raise ConfigError(f"{source}: {e}") from None
    return validate(XlingConfig, data, source, overrides)
