"""The one interface every study implements, and the capabilities a study may declare.

A study turns a paper into data for the stages: its options (a pydantic model), its prompt
sets (setting x language), the prompt rows of each set, the parsers its outputs need, the
scoring of generations into items and metrics, and the rendering of the paper's tables and
plots. The stages reach a study only through this module's types: a stage asks
`isinstance(study, Judged)`, never `hasattr`. `registry.py` maps names to classes.

Options are validated into the study's frozen `Options` model (`Study.validate_options`),
and every study step receives that object and reads it by attribute (`opts.langs`). Its dict
form (`StudyOptions.as_options`) exists for one purpose: cell params carry and hash it, so the
hashes of finished cells stay what they were when the options were a hand-checked dict. A
stage that holds only a cell's params turns them back into the object with
`Study.options_of`.
"""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

Rows = list[dict]
# an output parser: the model's text -> (the parsed fields, or None and the reason)
Parser = Callable[[str], tuple[dict | None, str | None]]


class StudyOptions(BaseModel):
    """A study's `study.options`: unknown keys are errors, each field documents itself, and
    the validated object is immutable (one instance serves every cell of a config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def as_options(self) -> dict:
        """The dict that cell params carry (and hash); `Study.options_of` reads it back."""
        return self.model_dump(mode="json")


@dataclass(frozen=True)
class PromptSet:
    """One (setting, language) set of prompts of a study; one generate cell per model."""

    setting: str
    lang: str


@dataclass
class Rendered:
    """The paper's tables (markdown) and plots (file name -> PNG bytes) of one evaluation."""

    markdown: str
    plots: dict[str, bytes]


@functools.lru_cache(maxsize=64)
def _options_from_json(model: type[StudyOptions], text: str) -> StudyOptions:
    """Validated once per distinct dict: validation may read the data files' headers, and
    every cell of a config carries the same dict."""
    return model.model_validate(json.loads(text))


class Study(ABC):
    """A paper as data: its name, options and required config sections. What it does is
    declared by capabilities (below): `Generative` (prompts, scoring, tables) and those
    built on it, or `Ranked` (tables over the retrieve and rerank runs).

    Every step takes `opts`, the study's validated `Options` object, so one instance serves
    any config.
    """

    name: ClassVar[str]
    Options: ClassVar[type[StudyOptions]]
    paper: ClassVar[str] = ""  # the paper's title, for the report

    def validate_options(self, raw: Mapping | None) -> StudyOptions:
        """`study.options` -> the study's Options object; raises pydantic's ValidationError."""
        return self.Options.model_validate(dict(raw or {}))

    def options_of(self, params: Mapping) -> StudyOptions:
        """The Options object of a cell's params (their `options`: the `as_options` dict the
        cell was planned and hashed with)."""
        return _options_from_json(self.Options, json.dumps(params["options"], sort_keys=True))

    def check_config(self, opts: StudyOptions, cfg) -> None:
        """Checks of the options against the rest of the config (e.g. the models that
        generate runs), at `xling validate`, before any stage: raise ValueError naming the
        fix (shown as one config error). Nothing by default."""

    def required_sections(self, opts: StudyOptions) -> dict[str, str]:
        """Config sections these options need -> why, shown when one is missing (config.py
        checks them, at `xling validate`). None by default."""
        return {}

    def read_documents(self, fmt: str, stream, *, lang: str, source: str):
        """Document rows (tasks/corpora.py's schema) of a corpus file in one of this study's
        own formats (registry.DOCUMENT_FORMATS), read incrementally."""
        raise ValueError(f"study {self.name!r} reads no document format {fmt!r}")

    def prompt_files(self) -> list[Path]:
        """The prompt template files this study ships (checked to load by the tests)."""
        return []

    def load_prompt_files(self) -> None:
        """Read and check every prompt file; raises on one that is missing or malformed."""
        import yaml

        for path in self.prompt_files():
            text = Path(path).read_text("utf-8")
            if Path(path).suffix in (".yaml", ".yml"):
                if not isinstance(yaml.safe_load(text), dict):
                    raise ValueError(f"{path}: not a mapping of prompt templates")


@dataclass
class StudyInputs:
    """What upstream stages made for a prompt set: translations (doc id -> English text)
    for a `Translated` setting, the narrow stage's selections for a `Narrowed` one."""

    translations: dict[str, str] | None = None
    # doc id -> the language check's finding on a translation made anyway (lang_check: flag)
    translation_flags: dict[str, str] | None = None
    # (context id, query language) -> the narrow stage's selection row (its `order`...)
    selections: dict[tuple[str, str], dict] | None = None
    # a `Retrieving` study's documents: query id -> [{docid, doc_lang, title, text,
    # judgment}], the run's top k, merged over the document languages by rank
    retrieved: dict[str, list[dict]] | None = None


@dataclass
class Evidence:
    """Everything beside the generations that `score` may read."""

    judgments: Rows | None = None
    labels: str | None = None  # evaluate.labels: human labels for the judge panel's kappa
    detected: dict | None = None  # (setting, lang, model, item_id) -> detected language
    features: Rows | None = None  # the features stage's scored rows


# ---------------------------------------------------------------------------------------
# capabilities: a study declares one by subclassing it


class Generative(Study):
    """The study builds prompt sets for the generate stage and scores the generations into
    the paper's items, metrics and tables (the evaluate stage's study cell)."""

    # generation columns beyond the common ones that `score` reads
    score_columns: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def prompt_sets(self, opts: StudyOptions) -> list[PromptSet]:
        """The (setting, language) prompt sets the options select."""

    @abstractmethod
    def input_files(self, opts: StudyOptions) -> list[str]:
        """The data files the prompts are built from (their changes mark cells stale)."""

    @abstractmethod
    def parser_for(self, setting: str) -> str:
        """The name of the output parser of a setting's generations."""

    @abstractmethod
    def parsers(self) -> dict[str, Parser]:
        """The output parsers this study registers, by the names configs and cells use."""

    @abstractmethod
    def build_prompts(self, opts: StudyOptions, setting: str, lang: str, *,
                      inputs: StudyInputs) -> Rows:
        """The prompt rows of one set (tasks/prompts.py's schema); a row the study cannot
        build keeps its error."""

    @abstractmethod
    def score(self, opts: StudyOptions, generations: Rows, evidence: Evidence
              ) -> tuple[Rows, Rows]:
        """Generations (with judgments, features...) -> (items, metric rows)."""

    @abstractmethod
    def render(self, opts: StudyOptions, items: Rows, metrics: Rows) -> Rendered:
        """The paper's tables and plots from the items and metrics."""


class Translated(Generative):
    """Some settings read documents machine-translated by the translate stage."""

    @abstractmethod
    def needs_translation(self, setting: str) -> bool: ...

    def translation_source(self, opts: StudyOptions) -> str:
        """The translate.documents entry whose English translations the settings read."""
        return opts.translations


class Narrowed(Generative):
    """The narrow stage ranks the study's sentences (CROSS)."""

    @abstractmethod
    def needs_selection(self, setting: str) -> bool: ...

    @abstractmethod
    def selection_lang(self, lang: str) -> str:
        """A prompt set's language -> the narrow cell's (context) language."""

    @abstractmethod
    def narrow_langs(self, opts: StudyOptions) -> list[str]: ...

    @abstractmethod
    def narrow_options(self, opts: StudyOptions, lang: str) -> dict:
        """The part of the options the narrow cell of context language `lang` depends on:
        its params' `options` (so its hash), with the `data` entries it reads. A part, not
        an options dict to read back: `narrow_inputs` and `select` get the whole options."""

    @abstractmethod
    def narrow_inputs(self, opts: StudyOptions, lang: str) -> dict:
        """{"sentences": {id: text}, "queries": {id: text}} of context language `lang`, to
        embed."""

    @abstractmethod
    def select(self, opts: StudyOptions, lang: str, vectors: Mapping) -> Rows:
        """The selections of context language `lang` from the stored vectors."""

    @abstractmethod
    def hits_at(self, selections: Sequence[Mapping], ks: Sequence[int]) -> dict[str, float]: ...

    def selection_summary(self, opts: StudyOptions, selections: Sequence[Mapping]) -> dict:
        """What the narrow manifest records about the selections beside hit@k (e.g. how
        many needles ended up as a sentence of their own); none by default."""
        return {}


class Judged(Generative):
    """A judge panel rates each generation."""

    @abstractmethod
    def judge_rows(self, opts: StudyOptions, generations: Rows) -> Rows: ...

    @abstractmethod
    def judge_parser(self, opts: StudyOptions) -> str: ...

    @abstractmethod
    def answer_languages(self, opts: StudyOptions) -> list[str]:
        """The languages an answer may be in (judge.language_check tells them apart, with
        English)."""


class PairJudged(Generative):
    """A judge compares the generations of two models on the same item."""

    @abstractmethod
    def pair_rows(self, opts: StudyOptions, generations: Rows) -> Rows: ...

    @abstractmethod
    def judge_parser(self, opts: StudyOptions) -> str: ...


class Featured(Generative):
    """The features stage scores the generations (lexical, langid, NLI, reranker, LLM)."""

    @abstractmethod
    def scorers(self, opts: StudyOptions) -> list[str]: ...

    @abstractmethod
    def feature_inputs(self, opts: StudyOptions, scorer: str, lang: str,
                       generations: Rows) -> Rows: ...

    @abstractmethod
    def lexical_scores(self, opts: StudyOptions, rows: Rows) -> Rows: ...

    @abstractmethod
    def langid_langs(self, opts: StudyOptions) -> list[str]:
        """The languages the langid scorer tells apart."""

    def llm_setting(self, opts: StudyOptions) -> dict:
        """What the llm scorer's manifest records about its prompts (e.g. their wording);
        nothing by default."""
        return {}

    @abstractmethod
    def llm_feature_names(self, opts: StudyOptions) -> list[str]:
        """The names of the LLM-scored features (for the features stage's messages)."""

    @abstractmethod
    def llm_input_kinds(self, opts: StudyOptions) -> dict[str, str]:
        """The last part of an LLM feature input's id (`item|model|<part>`) -> the `kind` of
        its score, which the stored row carries for `score` to parse."""


class Ranked(Study):
    """An IR study: its systems are the retrieve and rerank stages' runs, scored by the
    evaluate stage's cells against qrels; the study renders the paper's tables across those
    cells. It builds no prompts of its own (its LLM calls are the rerank stage's)."""

    @abstractmethod
    def render_runs(self, opts: StudyOptions, tables: list, *, expected: Mapping | None,
                    config: Mapping) -> str:
        """The paper's tables (markdown) from the evaluate stage's `irmetrics.RunTable`s,
        the expected file (`evaluate.expected`, with its `paper:` section) and the config's
        sections as a dict."""


class Retrieving(Generative):
    """The prompts read the top documents of one of the config's retrieve runs (or
    fusions): jobs/study.py reads its hits, texts and qrels into `StudyInputs.retrieved`."""

    @abstractmethod
    def retrieval(self, opts: StudyOptions) -> dict:
        """{run, topics, qlang, doc_langs, k, texts ("og" | "dt")}."""


class Cited(Generative):
    """Answers grounded in documents: the nuggets stage (jobs/nuggets.py) creates each
    topic's nuggets from its judged documents, then judges every answer's nuggets and
    citations, as TREC RAG and RAGTIME do."""

    @abstractmethod
    def nugget_options(self, opts: StudyOptions) -> dict:
        """The part of the options the topics and documents depend on (the nugget cells'
        hash: a system added to the study must not change it)."""

    @abstractmethod
    def nugget_topics(self, opts: StudyOptions, lang: str,
                      inputs: StudyInputs | None = None) -> Rows:
        """The language's topics: `topic_id`, `query`, `documents` ([{docid, title, text,
        judgment}], the documents the answers were given, in the given order; `judgment`
        the human relevance label, None where there is none), `error`."""

    @abstractmethod
    def cited_answer(self, opts: StudyOptions, generation: Mapping) -> list[dict]:
        """A generation's answer as sentences, `[{text, citations: [docid...]}]` (the text
        without citation marks); [] for no answer. `generation`: a generate row (`item_id`,
        `setting`, `lang`, `model`, `parsed`, `output`, `error`)."""


def judge_scope(study: Study) -> str:
    """What the judge stage rates: single generations or pairs of them."""
    return "pairs" if isinstance(study, PairJudged) else "generation"
