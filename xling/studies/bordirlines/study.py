"""The BordIRLines study behind the Study interface: options, prompt sets, prompts,
parsers, scoring and the report, each delegated to its module (README.md: design notes)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from xling.studies.base import Cited, Evidence, PromptSet, Rendered, Rows, StudyInputs
from xling.studies.bordirlines import cited, data, parse
from xling.studies.bordirlines.options import STUDY, Options, settings


class BordIRLines(Cited):
    """Which country owns a disputed territory, asked in each claimant's language and in
    English, with the hub's retrieved Wikipedia passages (no judge: the answers are
    multiple-choice; no translate stage: the passages are read in their languages)."""

    name: ClassVar[str] = STUDY
    Options: ClassVar[type[Options]] = Options
    paper: ClassVar[str] = ("Multilingual Retrieval Augmented Generation for Culturally-"
                            "Sensitive Tasks (BordIRLines; Li et al., arXiv:2410.01171)")
    # The study reads its data (queries, hits, passages) from study.options alone: it needs
    # no translate, narrow or judge section.
    def prompt_sets(self, opts: Options) -> list[PromptSet]:
        """One set per (setting, query language): settings ``<mode>-<prompt>``."""
        return [PromptSet(setting, lang) for setting in settings(opts) for lang in opts.langs]

    def input_files(self, opts: Options) -> list[str]:
        return data.input_files(opts)

    def parser_for(self, setting: str) -> str:
        return parse.parser_for(setting)

    def parsers(self) -> dict:
        return {"bordirlines_direct": parse.parse_direct,
                "bordirlines_citation": parse.parse_citation}

    def build_prompts(self, opts: Options, setting: str, lang: str, *,
                      inputs: StudyInputs) -> Rows:
        from xling.studies.bordirlines.prompts import build_prompts

        return build_prompts(opts, setting, lang, translations=inputs.translations)

    # -- nuggets and citation support (Cited; cited.py) --------------------------------

    def nugget_options(self, opts: Options) -> dict:
        return cited.nugget_options(opts)

    def nugget_topics(self, opts: Options, lang: str, inputs: StudyInputs | None = None) -> Rows:
        return cited.nugget_topics(opts, lang)

    def cited_answer(self, opts: Options, generation: Mapping) -> list[dict]:
        return cited.cited_answer(opts, generation)

    def score(self, opts: Options, generations: Rows, evidence: Evidence) -> tuple[Rows, Rows]:
        """Items and metrics (``evidence`` is not read: no judge, no features)."""
        from xling.studies.bordirlines.metrics import score

        return score(opts, generations)

    def render(self, opts: Options, items: Rows, metrics: Rows) -> Rendered:
        from xling.studies.bordirlines.tables import render_tables

        return Rendered(markdown=render_tables(metrics, opts), plots={})

    def prompt_files(self) -> list[Path]:
        return [Path(__file__).with_name("prompts.yaml")]
