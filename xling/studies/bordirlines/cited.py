"""BordIRLines as input of the nuggets stage (studies/base.py `Cited`): each query is a
topic, its documents the passages its prompts showed, and an answer's sentences carry the
hub ids of the passages it cites (the prompts number them 0..k-1)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from xling.studies.bordirlines.data import load_docs, load_queries
from xling.studies.bordirlines.options import Options, split_setting
from xling.studies.bordirlines.parse import _DOCTAG_RE
from xling.studies.bordirlines.prompts import shown_passages

# What the passages shown depend on (options.py); never the models, prompts or metrics.
TOPIC_OPTIONS = ("data", "retriever", "modes", "k", "max_doc_words", "docs", "territories")


def nugget_options(opts: Options) -> dict:
    given = opts.as_options()
    return {k: given[k] for k in TOPIC_OPTIONS}


def nugget_topics(opts: Options, lang: str) -> list[dict]:
    """The ``lang`` queries (queries.tsv order). Documents: the passages the prompts of
    every retrieval mode showed, mode by mode in `modes` order and in prompt order within a
    mode, each passage once (so one set of nuggets serves every mode's answers); the hub has
    no human relevance label, so `judgment` is None. A query no mode has passages for is a
    topic with an `error` (the modes' errors, as its prompt rows have them)."""
    modes = [m for m in opts.modes if m != "no_ir"]
    docs = load_docs(opts.docs) if modes and opts.docs else None
    out = []
    for query in load_queries(opts.data).values():
        if query["lang"] != lang:
            continue
        documents: dict[str, dict] = {}
        errors = []
        for mode in modes:
            passages, error = shown_passages(opts, mode, query, docs)
            if error:
                errors.append(f"{mode}: {error}")
                continue
            for p in passages:
                documents.setdefault(p["doc_id"], {"docid": p["doc_id"], "title": None,
                                                    "text": p["text"], "judgment": None})
        error = None if documents else ("; ".join(errors) if errors else
                                        "no passages: the modes are no_ir only")
        out.append({"topic_id": query["query_id"], "query": query["text"], "error": error,
                    "documents": list(documents.values())})
    return out


def _positions(text: str) -> list[int]:
    return [int(n) for m in _DOCTAG_RE.finditer(text) for n in m.group(1).split(",")]


def _clean(text: str) -> str:
    text = re.sub(r"\s+", " ", _DOCTAG_RE.sub("", text))
    return re.sub(r"\s+([.,;:!?。，、；：！？])", r"\1", text).strip()


def cited_answer(opts: Options, generation: Mapping) -> list[dict]:
    """A generation as sentences ``[{text, citations}]`` in its own language.

    ``direct`` (and ``no_ir``): the output's sentences, citing nothing. ``citation``: the
    chosen option as the first sentence, citing the ``Cited Documents`` list, then the
    explanation's sentences, each citing its ``<docN>`` tags (taken out of the text). A
    prompt id N is the N-th passage the prompt showed, given as its hub doc id; an id beyond
    them stays ``<docN>``, a document the judge cannot find (counted ``unknown_doc``).
    """
    from xling.tasks.text import sentences

    lang = generation["lang"]
    mode, prompt = split_setting(generation["setting"])
    parsed = generation.get("parsed") or {}
    if prompt == "direct" or mode == "no_ir":
        text = (generation.get("output") or "").strip()
        return [{"text": s, "citations": []}
                for s in (x.strip() for x in (sentences(text, lang) if text else [])) if s]
    if not parsed.get("option"):
        return []
    query = load_queries(opts.data).get(str(generation["item_id"]))
    docs = load_docs(opts.docs) if opts.docs else None
    passages = (shown_passages(opts, mode, query, docs)[0] if query else None) or []

    def ids(positions: list[int]) -> list[str]:
        return list(dict.fromkeys(passages[n]["doc_id"] if n < len(passages) else f"<doc{n}>"
                                  for n in positions))

    listed = [int(n) for n in re.findall(r"\d+", parsed.get("cited") or "")]
    out = [{"text": _clean(parsed["option"]), "citations": ids(listed)}]
    explanation = parsed.get("explanation") or ""
    for sent in sentences(explanation.strip(), lang) if explanation.strip() else []:
        text, cited = _clean(sent), ids(_positions(sent))
        if text:
            out.append({"text": text, "citations": cited})
        elif cited:  # tags cut off after their sentence's full stop belong to it
            out[-1]["citations"] = list(dict.fromkeys(out[-1]["citations"] + cited))
    return out
