"""MIRAGE-Bench behind the Study interface: one setting (the published RAG prompt) per
language, an arena judged pairwise, and features scored by the features stage; this class
delegates to the package's modules (README.md has the design notes)."""

from __future__ import annotations

from pathlib import Path

from xling.studies.base import (Cited, Evidence, Featured, PairJudged, PromptSet, Rendered,
                                Rows, StudyInputs)
from xling.studies.mirage import data, features, pairs, parse, plots, tables
from xling.studies.mirage.metrics import score as score_languages
from xling.studies.mirage.constants import LANGS, SCORERS, SETTING, STUDY
from xling.studies.mirage.options import Options, check_names, is_published
from xling.studies.mirage.prompts import PROMPT_FILE, rebuild_prompt


class MIRAGE(PairJudged, Featured, Cited):
    """MIRAGE-Bench (Thakur et al., NAACL 2025): a multilingual RAG arena whose leaderboard a
    surrogate judge learns from heuristic features."""

    name = STUDY
    Options = Options
    paper = ("MIRAGE-Bench: Automatic Multilingual Benchmark Arena for Retrieval-Augmented "
             "Generation Systems")

    def required_sections(self, opts: Options) -> dict[str, str]:
        if is_published(opts):
            return {}
        why = ("study mirage with source: run {what}: add a `{section}:` section (or set "
               "study.options.source: published to read the hub's {hub})")
        out = {"generate": why.format(what="generates the arena's answers", section="generate",
                                      hub="answers"),
               "judge": why.format(what="judges every pair of answers", section="judge",
                                   hub="verdicts")}
        if features.scorers(opts):
            out["features"] = why.format(what="scores the surrogate's features "
                                              "(study.options.features)",
                                         section="features", hub="features")
        return out

    def check_config(self, opts: Options, cfg) -> None:
        """The held-out models are checked at validation, not after generate, features and
        judge have run (issue 45): on the run route against the generate.models names, on
        the published route against the models the published judgments compare."""
        if not opts.held_out:
            return
        if is_published(opts):
            roster = data.published_roster(opts.judgments, tuple(opts.langs), opts.split)
            check_names(opts.held_out, opts.models or roster,
                        "the published judgments' models (hub model ids, e.g. "
                        "google/gemma-1.1-2b-it and meta-llama/Meta-Llama-3-70B-Instruct, the "
                        "paper's held-out pair, P L130)")
        elif cfg.generate is not None:
            roster = list(opts.models or [m.name for m in cfg.generate.models])
            check_names(opts.held_out, roster, "the arena's models (study.options.models, "
                        "else the generate.models names)")

    # -- prompts ---------------------------------------------------------------------

    def prompt_sets(self, opts: Options) -> list[PromptSet]:
        if is_published(opts):
            return []
        return [PromptSet(SETTING, lang) for lang in opts.langs]

    def input_files(self, opts: Options) -> list[str]:
        return data.input_files(opts)

    def prompt_files(self) -> list[Path]:
        return [PROMPT_FILE]

    def build_prompts(self, opts: Options, setting: str, lang: str, *,
                      inputs: StudyInputs) -> Rows:
        """One user message per query: the published prompt, or its instruction replaced
        (``instruction``: paper | api_scripts, s2.2)."""
        rows = []
        for item in data.items_of(opts, lang):
            row = {"item_id": item["query_id"], "study": STUDY, "setting": setting,
                   "lang": lang, "prompt": None, "error": item["error"]}
            if not item["error"]:
                try:
                    text = rebuild_prompt(item["prompt"], lang, opts.instruction)
                    row["prompt"] = [{"role": "user", "content": text}]
                except ValueError as e:
                    row["error"] = str(e)
            rows.append(row)
        return rows

    # -- parsers ---------------------------------------------------------------------

    def parser_for(self, setting: str) -> str:
        return "mirage_rag"

    def parsers(self) -> dict:
        return {"mirage_rag": parse.parse_rag_output,
                "mirage_pairwise": parse.parse_pair_verdict,
                "mirage_pairwise_reference": parse.parse_pair_verdict_reference}

    # -- the arena (PairJudged) ------------------------------------------------------

    def pair_rows(self, opts: Options, generations: Rows) -> Rows:
        return pairs.pair_rows(opts, generations)

    def judge_parser(self, opts: Options) -> str:
        """The parser of the arena's verdicts, by ``pairwise_parse``."""
        return "mirage_pairwise" + ("_reference" if opts.pairwise_parse == "reference"
                                    else "")

    # -- features (Featured) ---------------------------------------------------------

    def scorers(self, opts: Options) -> list[str]:
        return features.scorers(opts)

    def feature_inputs(self, opts: Options, scorer: str, lang: str, generations: Rows) -> Rows:
        return features.feature_inputs(opts, scorer, lang, generations)

    def lexical_scores(self, opts: Options, rows: Rows) -> Rows:
        return features.lexical_scores(opts, rows)

    def langid_langs(self, opts: Options) -> list[str]:
        return list(LANGS)

    def llm_setting(self, opts: Options) -> dict:
        return {"feature_prompts": opts.feature_prompts}

    def llm_feature_names(self, opts: Options) -> list[str]:
        return list(SCORERS["llm"])

    def llm_input_kinds(self, opts: Options) -> dict[str, str]:
        # features.feature_inputs: feature 10 asks for a score, feature 11 for a rating
        return {"overlap": "score", "fluency": "rating"}

    # -- nuggets and citations (Cited) ----------------------------------------------

    def nugget_options(self, opts: Options) -> dict:
        given = opts.as_options()
        return {k: given[k] for k in ("data", "split", "limit")}

    def nugget_topics(self, opts: Options, lang: str, inputs=None) -> Rows:
        """Each query's passages as the prompt gave them, with the dataset's labels
        (positive_ids 1, negative_ids 0) as judgments."""
        return [{"topic_id": item["query_id"], "query": item["query"], "error": item["error"],
                 "documents": [{"docid": d, "title": None, "text": t,
                                "judgment": item["qrels"].get(d)} for d, t in item["passages"]]}
                for item in data.items_of(opts, lang)]

    def cited_answer(self, opts: Options, generation) -> list[dict]:
        return parse.cited_sentences(generation, generation["lang"])

    # -- scoring and rendering -------------------------------------------------------

    def score(self, opts: Options, generations: Rows, evidence: Evidence) -> tuple[Rows, Rows]:
        return score_languages(opts, generations, evidence.judgments, features=evidence.features)

    def render(self, opts: Options, items: Rows, metrics: Rows) -> Rendered:
        return Rendered(tables.tables(metrics), plots.plots(metrics))
