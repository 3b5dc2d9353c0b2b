"""A RAGTIME-shaped study (TREC 2025 RAGTIME: one English report per request, citing
documents found by multilingual retrieval): the request's top documents of one retrieve run
or fusion of this config (e.g. an RRF of BM25 over the translated documents and BM25 with
translated queries over the originals), a cited report per request from the generate
stage, and the nuggets stage's nugget and citation scores. The report prompt is xling's
own (the track gives no prompt); its run file is the nuggets stage's `run.ragtime.jsonl`.

The documents come to the study as `StudyInputs.retrieved` (jobs/study.py reads the run's
hits, the texts and the qrels); the study reads only its request files.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from xling.studies.base import (Cited, Evidence, PromptSet, Rendered, Retrieving, Rows,
                                StudyInputs, StudyOptions)

SETTING = "report"
PROMPT = ("Write a short report in English that answers the request below, using only the "
          "documents given. Write one fact per sentence and end each sentence with the ids "
          "of the documents that support it in square brackets, like [{example}]. At most "
          "{limit} characters.\n\nRequest: {request}\n\nDocuments:\n{documents}\n\nReport:")


class Options(StudyOptions):
    requests: str = Field(description="the requests, a TSV (id, text) per document language: "
                                      "a path with {doc_lang}")
    doc_langs: list[str] = Field(min_length=1, description="the document languages searched")
    lang: str = Field("en", description="the requests' (and reports') language")
    run: str = Field(description="the retrieve run or fusion whose hits the reports read")
    topics: str = Field(description="the retrieve.topics set the run searched")
    k: int = Field(5, ge=1, description="documents per request, merged over doc_langs by rank")
    texts: Literal["og", "dt"] = Field(
        "dt", description="what the report model reads: og the original documents, dt their "
                          "translations into the request language")
    limit: int | None = Field(None, ge=1, description="the first requests only")
    char_limit: int = Field(2000, ge=1, description="report length in NFKC characters "
                                                    "(NeuCLIR-2024 request files: 2000)")


def read_requests(opts: Options) -> dict[str, str]:
    """{request id: text} of every doc language's file, in file order."""
    out: dict[str, str] = {}
    for dl in opts.doc_langs:
        with open(opts.requests.replace("{doc_lang}", dl), encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    qid, _, text = line.rstrip("\n").partition("\t")
                    out.setdefault(qid.strip(), text.strip())
    items = list(out.items())
    return dict(items[:opts.limit] if opts.limit else items)


class RAGTIME(Retrieving, Cited):
    name = "ragtime"
    Options = Options
    paper = "TREC 2025 RAGTIME-shaped reports (multilingual retrieval, cited English reports)"

    def retrieval(self, opts: Options) -> dict:
        return {"run": opts.run, "topics": opts.topics, "qlang": opts.lang,
                "doc_langs": list(opts.doc_langs), "k": opts.k, "texts": opts.texts}

    def prompt_sets(self, opts: Options) -> list[PromptSet]:
        return [PromptSet(SETTING, opts.lang)]

    def input_files(self, opts: Options) -> list[str]:
        return [opts.requests.replace("{doc_lang}", dl) for dl in opts.doc_langs]

    def parser_for(self, setting: str) -> str:
        return "none"

    def parsers(self) -> dict:
        return {}

    def build_prompts(self, opts: Options, setting: str, lang: str, *,
                      inputs: StudyInputs) -> Rows:
        rows = []
        for qid, text in read_requests(opts).items():
            docs = (inputs.retrieved or {}).get(qid, [])
            row = {"item_id": qid, "study": self.name, "setting": setting, "lang": lang,
                   "prompt": None, "error": None if docs else "the run found no document"}
            if docs:
                listing = "\n".join(f"[{d['docid']}] {' '.join(d['text'].split())}"
                                    for d in docs)
                row["prompt"] = [{"role": "user", "content": PROMPT.format(
                    example=docs[0]["docid"], limit=opts.char_limit, request=text,
                    documents=listing)}]
            rows.append(row)
        return rows

    # -- Cited ---------------------------------------------------------------------------

    def nugget_options(self, opts: Options) -> dict:
        given = opts.as_options()
        return {k: given[k] for k in ("requests", "doc_langs", "lang", "run", "topics", "k",
                                      "texts", "limit")}

    def nugget_topics(self, opts: Options, lang: str, inputs: StudyInputs | None = None) -> Rows:
        retrieved = (inputs.retrieved if inputs else None) or {}
        return [{"topic_id": qid, "query": text, "error": None,
                 "documents": retrieved.get(qid, [])}
                for qid, text in read_requests(opts).items()]

    def cited_answer(self, opts: Options, generation: Mapping) -> list[dict]:
        from xling.tasks.ragruns import cited_sentences

        text = (generation.get("parsed") or {}).get("answer") or generation.get("output") or ""
        return cited_sentences(text, generation["lang"])

    # -- scoring: the reports' shape (the nuggets stage scores their content) -------------

    def score(self, opts: Options, generations: Rows, evidence: Evidence) -> tuple[Rows, Rows]:
        items, metrics = [], []
        by_model: dict[str, list[dict]] = {}
        for g in generations:
            text = (g.get("parsed") or {}).get("answer") or g.get("output") or ""
            sents = self.cited_answer(opts, g) if not g.get("error") else []
            n = len(unicodedata.normalize("NFKC", " ".join(s["text"] for s in sents)))
            item = {"item_id": g["item_id"], "model": g["model"], "lang": g["lang"],
                    "error": g.get("error") if not text else None, "characters": n,
                    "over_limit": n > opts.char_limit, "sentences": len(sents),
                    "cited_sentences": sum(bool(s["citations"]) for s in sents)}
            items.append(item)
            by_model.setdefault(g["model"], []).append(item)
        for model, its in sorted(by_model.items()):
            for name in ("characters", "sentences", "cited_sentences", "over_limit"):
                metrics.append({"study": self.name, "setting": SETTING, "lang": opts.lang,
                                "model": model, "metric": name,
                                "value": sum(float(i[name]) for i in its) / len(its),
                                "ci_low": None, "ci_high": None, "n": len(its)})
        return items, metrics

    def render(self, opts: Options, items: Rows, metrics: Rows) -> Rendered:
        from xling.tasks.tables import pipe_table

        m = {(r["model"], r["metric"]): r["value"] for r in metrics}
        models = sorted({r["model"] for r in metrics})
        rows = [[model, f"{m[(model, 'characters')]:.0f}", f"{m[(model, 'sentences')]:.2f}",
                 f"{m[(model, 'cited_sentences')]:.2f}", f"{100 * m[(model, 'over_limit')]:.0f}"]
                for model in models]
        return Rendered(pipe_table(
            ["model", "characters (mean)", "sentences", "cited sentences", "% over limit"],
            rows, title=f"RAGTIME-shaped reports over run '{opts.run}' (top {opts.k} "
                        f"documents, {opts.texts} texts; limit {opts.char_limit} "
                        "NFKC characters)", heading="###"), {})
