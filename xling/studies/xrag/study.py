"""The XRAG study (Liu et al., Findings of EMNLP 2025; README.md has the design notes): the
`Study` interface over this package's settings, options, loader, prompts, scoring and
tables. XRAG reads machine-translated articles (`Translated`) and is scored by a judge
panel (`Judged`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO

from xling.studies.base import (Cited, Evidence, Judged, PromptSet, Rendered, Rows,
                                StudyInputs, Translated)

from . import prompts, settings
from .data import iter_article_documents
from .metrics import SCORE_COLUMNS, score_generations
from .options import Options
from .tables import tables


class XRAG(Translated, Judged, Cited):
    """XRAG: cross-lingual retrieval-augmented generation over news."""

    name = "xrag"
    Options = Options
    paper = "XRAG: Cross-lingual Retrieval-Augmented Generation (Liu et al., Findings of " \
            "EMNLP 2025, arXiv:2505.10089)"
    score_columns = SCORE_COLUMNS

    def required_sections(self, opts: Options) -> dict[str, str]:
        translated = [s for s in opts.settings if settings.needs_translation(s)]
        if not translated:
            return {}
        return {"translate": f"study settings {', '.join(translated)} read the X-language "
                             "articles machine-translated to English: add translate.documents "
                             f"entry '{opts.translations}' (format: xrag) with the run's "
                             "langs and targets [en]"}

    def prompt_sets(self, opts: Options) -> list[PromptSet]:
        """One set per (language, setting), language-major (the loader caches per
        language)."""
        return [PromptSet(s, lang) for lang in opts.langs for s in opts.settings]

    def input_files(self, opts: Options) -> list[str]:
        return [opts.data]

    def parser_for(self, setting: str) -> str:
        settings.spec_of(setting)  # an unknown setting is an error
        return "answer_tag"

    def parsers(self) -> dict:
        return {}  # the generic answer_tag parser reads Figures 18 and 19's <answer>

    def build_prompts(self, opts: Options, setting: str, lang: str, *,
                      inputs: StudyInputs) -> Rows:
        return prompts.build_prompts(opts, setting, lang, translations=inputs.translations,
                                     flags=inputs.translation_flags)

    # -- nuggets (Cited): XRAG's answers cite nothing, so only nugget recall applies --------

    def nugget_options(self, opts: Options) -> dict:
        return {"data": opts.data, "limit": opts.limit,
                "subsets": sorted({settings.spec_of(s).subset for s in opts.settings})}

    def nugget_topics(self, opts: Options, lang: str, inputs=None) -> Rows:
        """The instances the settings ask (the first `limit` of each subset used), their
        articles in stored order, `is_support` as the label (1 supporting, 0 not)."""
        from .data import items_for

        subsets = self.nugget_options(opts)["subsets"]
        taken: dict[str, int] = {}
        out = []
        for item in items_for(opts.data, lang):
            if item["error"] or item["subset"] not in subsets:
                continue
            taken[item["subset"]] = taken.get(item["subset"], 0) + 1
            if opts.limit is not None and taken[item["subset"]] > opts.limit:
                continue
            out.append({"topic_id": item["id"], "query": item["question"], "error": None,
                        "documents": [{"docid": a["doc_id"], "title": a["title"],
                                       "text": a["text"], "judgment": int(a["supporting"])}
                                      for a in item["articles"]]})
        return out

    def cited_answer(self, opts: Options, generation) -> list[dict]:
        from xling.tasks.text import sentences

        answer = ((generation.get("parsed") or {}).get("answer") or "").strip()
        return [{"text": s.strip(), "citations": []}
                for s in (sentences(answer, generation["lang"]) if answer else []) if s.strip()]

    def check_config(self, opts: Options, cfg) -> None:
        """`flagged_translations: use` needs the flagged articles translated: their translate
        entry must check with `lang_check: flag` (or off), not drop them as errors."""
        if cfg.translate is None or opts.flagged_translations != "use" or \
                not any(settings.needs_translation(s) for s in opts.settings):
            return
        spec = next((d for d in cfg.translate.documents if d.name == opts.translations), None)
        check = (spec.lang_check if spec is not None else None) or cfg.translate.lang_check
        if spec is not None and check == "error":
            raise ValueError(
                f"study xrag uses flagged translations (study.options.flagged_translations: "
                f"use, as the paper answered every item), but translate.documents "
                f"'{spec.name}' drops them (lang_check: error): set lang_check: flag on that "
                "entry, or study.options.flagged_translations: wrong")

    def score(self, opts: Options, generations: Rows, evidence: Evidence) -> tuple[Rows, Rows]:
        return score_generations(opts, generations, evidence.judgments,
                                 detected=evidence.detected, labels=evidence.labels)

    def render(self, opts: Options, items: Rows, metrics: Rows) -> Rendered:
        return Rendered(tables(metrics, options=opts), {})

    def read_documents(self, fmt: str, stream: IO, *, lang: str,
                       source: str) -> Iterator[dict]:
        """Format `xrag`: the X-language articles of the multilingual instances in `lang`,
        for the translate stage (data.iter_article_documents)."""
        if fmt != "xrag":
            return super().read_documents(fmt, stream, lang=lang, source=source)
        return iter_article_documents(stream, lang=lang, source=source)

    def prompt_files(self) -> list[Path]:
        return [prompts.PROMPTS_FILE]

    # Translated
    def needs_translation(self, setting: str) -> bool:
        return settings.needs_translation(setting)

    # Judged
    def judge_rows(self, opts: Options, generations: Rows) -> Rows:
        return prompts.judge_rows(opts, generations)

    def judge_parser(self, opts: Options) -> str:
        return "verdict"  # Figure 20's JSON reply; tasks/judge.py reads "answer" as the verdict

    def answer_languages(self, opts: Options) -> list[str]:
        return list(opts.langs)
