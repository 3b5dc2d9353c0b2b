"""BordIRLines' prompts: the paper's Table 5 templates (prompts.yaml) rendered as chat
messages, and the prompt rows of one (setting, query language) set."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from xling.studies.bordirlines.data import LETTERS, borderlines_of, load_docs, load_queries, \
    shown_hits
from xling.studies.bordirlines.options import STUDY, Options, split_setting

PROMPT_FILE = Path(__file__).with_name("prompts.yaml")
# The paper's Table 5 prompts (prompts.yaml; each text cites its line of
# papers/bordirlines.txt there).
PROMPT_TEMPLATES: dict[str, str] = yaml.safe_load(PROMPT_FILE.read_text("utf-8"))
# The system prompt of the direct format ("System Prompt", Table 5, bordirlines.txt L484).
SYSTEM_PROMPT = PROMPT_TEMPLATES["system"]

# One "word" for truncation: a character of a script written without spaces, or a run of
# other non-space characters.
_NOSPACE = ("\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff"
            "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff")
_WORD_RE = re.compile(rf"[{_NOSPACE}]|[^\s{_NOSPACE}]+")


def truncate_words(text: str, max_words: int | None) -> str:
    """``text`` cut after ``max_words`` words (see the ``max_doc_words`` option), marked
    with ' ...'."""
    if not max_words:
        return text
    for count, word in enumerate(_WORD_RE.finditer(text), 1):
        if count == max_words:
            rest = text[word.end():]
            return text if not rest.strip() else text[: word.end()] + " ..."
    return text


def options_lines(options: Iterable[str]) -> str:
    """The lettered options, one a line, as the authors' get_multiple_choice writes them."""
    return "\n".join(f"{LETTERS[i]}) {o}" for i, o in enumerate(options))


def _fill(template: str, **values: str) -> str:
    # str.replace, one placeholder at a time, in order: a value (a passage, a query) may hold
    # braces or text that looks like a placeholder, and is never filled again.
    out, rest = "", template
    while rest:
        hits = [(rest.find("{" + k + "}"), k) for k in values if "{" + k + "}" in rest]
        if not hits:
            return out + rest
        pos, key = min(hits)
        out += rest[:pos] + values[key]
        rest = rest[pos + len(key) + 2:]
    return out


def _documents(kind: str, texts: list[str]) -> str:
    return "\n\n".join(_fill(PROMPT_TEMPLATES[f"{kind}_document"], document_id=str(i),
                             document_text=t) for i, t in enumerate(texts))


def render_direct(query: str, options: str, docs: list[str] | None) -> list[dict]:
    """The paper's direct prompt (Table 5, bordirlines.txt L484, L486-487) as chat messages:
    the system prompt, then the documents (``Document: 0`` / ``Text: ...``, ids from 0; none
    for ``docs=None``, the no_ir prompt), the instruction, the query, the options, "Answer:".
    ``options``: the lettered lines (:func:`options_lines`)."""
    templates = PROMPT_TEMPLATES
    if docs is None:
        documents, source = "", templates["direct_source_no_documents"]
    else:
        documents = _documents("direct", docs) + "\n\n"
        source = templates["direct_source_documents"]
    user = _fill(templates["direct"], documents=documents, source=source, query=query,
                 options=options)
    return [{"role": "system", "content": templates["system"]},
            {"role": "user", "content": user}]


def render_citation(query: str, options: str, docs: list[str]) -> list[dict]:
    """The paper's citation prompt (Table 5, bordirlines.txt L488-491: Command-R's grounded-
    generation prompt) as chat messages: the System and User Preambles as the system message
    (as the authors' code sends it to chat models), then the query, the documents (ids from
    0), the instruction and the options."""
    templates = PROMPT_TEMPLATES
    user = _fill(templates["citation_user"], query=query,
                 documents=_documents("citation", docs), options=options)
    return [{"role": "system", "content": templates["citation_system"]},
            {"role": "user", "content": user}]


def _translation_maps(translations) -> tuple[dict[str, str], dict[str, str]]:
    """(doc id -> text, query id -> text) from translations rows (id, kind, text) or from
    a mapping {"doc": {...}, "query": {...}} or a flat {id: text} (applied to both)."""
    docs: dict[str, str] = {}
    queries: dict[str, str] = {}
    if not translations:
        return docs, queries
    if isinstance(translations, Mapping):
        if set(translations) <= {"doc", "query"}:
            docs.update(translations.get("doc") or {})
            queries.update(translations.get("query") or {})
        else:
            docs.update(translations)
            queries.update(translations)
        return docs, queries
    for row in translations:
        if row.get("text") is None or row.get("error"):
            continue
        (queries if row.get("kind") == "query" else docs)[str(row["id"])] = row["text"]
    return docs, queries


def build_prompts(opts: Options, setting: str, lang: str, *, translations=None) -> list[dict]:
    """Prompt rows for the ``lang`` queries in ``setting``, in ``queries.tsv`` order.

    Rows: ``item_id`` (the query_id), ``study``, ``setting``, ``lang``, ``prompt`` (chat
    messages) and ``error``. A query that cannot be prompted (no hits in the mode, no swap
    partner, a passage missing from the docs file, a territory or options not in the table)
    is a row with an ``error`` and no prompt. ``translations`` (optional) replaces the text of
    passages (rows of kind ``doc``) and queries (kind ``query``) by id: translations rows
    ``{id, kind, text}``, ``{"doc": {id: text}, "query": {id: text}}`` or a flat ``{id: text}``.
    """
    mode, prompt = split_setting(setting)
    if mode == "no_ir" and prompt == "citation":
        raise ValueError("no_ir has no passages to cite: use the setting 'no_ir-direct'")
    borderlines = borderlines_of(opts)
    doc_translations, query_translations = _translation_maps(translations)
    docs = load_docs(opts.docs) if mode != "no_ir" and opts.docs else None
    rows = []
    for query in load_queries(opts.data).values():
        if query["lang"] != lang:
            continue
        row = {"item_id": query["query_id"], "study": STUDY, "setting": setting, "lang": lang,
               "prompt": None, "error": None}
        rows.append(row)
        territory = borderlines.territory(query["territory"])
        if territory is None:
            row["error"] = f"territory {query['territory']!r} is not in the BorderLines table"
            continue
        options = borderlines.options(lang, territory.name)
        if options is None:
            row["error"] = (f"no {lang} options for {territory.name} in the BorderLines "
                            f"queries ({lang} is not the language of any of its claimants)")
            continue
        if len(options) != len(territory.claimants):
            row["error"] = (f"{len(options)} {lang} options for {territory.name}, but it has "
                            f"{len(territory.claimants)} claimants")
            continue
        text = query_translations.get(query["query_id"], query["text"])
        if mode == "no_ir":
            row["prompt"] = render_direct(text, options_lines(options), None)
            continue
        passages, row["error"] = shown_passages(opts, mode, query, docs, doc_translations)
        if passages is not None:
            render = render_direct if prompt == "direct" else render_citation
            row["prompt"] = render(text, options_lines(options), [p["text"] for p in passages])
    return rows


def shown_passages(opts: Options, mode: str, query: dict, docs: Mapping | None,
                   doc_translations: Mapping | None = None) -> tuple[list[dict] | None, str | None]:
    """The passages a query's prompt shows in ``mode`` (not no_ir), in prompt order (the
    prompt's document id is the list index): ``[{doc_id, doc_lang, text}]`` (text as shown:
    translated, cut to ``max_doc_words``), or an error. ``docs``: :func:`load_docs`."""
    hits, error = shown_hits(opts, mode, query)
    if error:
        return None, error
    if docs is None:
        return None, "no passages file (study.options.docs)"
    doc_translations = doc_translations or {}
    missing = [h["doc_id"] for h in hits
               if h["doc_id"] not in docs and h["doc_id"] not in doc_translations]
    if missing:
        return None, f"passage(s) {missing} not in {opts.docs}"
    return [{"doc_id": h["doc_id"], "doc_lang": h["doc_lang"],
             "text": truncate_words(doc_translations.get(h["doc_id"]) or docs[h["doc_id"]][1],
                                    opts.max_doc_words)} for h in hits], None
