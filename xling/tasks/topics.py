"""Readers for topics (queries) and relevance judgments in their published formats.

Streamed from binary streams with `read(n)` only (pyarrow's input streams, gzip, S3), so a
file is never loaded whole. Every reader yields plain dicts:

- queries rows: `query_id, lang, text, error` (`text` is what gets retrieved with or
  translated; CLEF topics also keep `title`, `desc`, `narr`);
- qrels rows: `query_id, doc_id, relevance`.

Formats:
- TREC topics TSV (MIRACL, Mr.TyDi, CIRAL, `topics.*.tsv`): `qid<TAB>text` per line;
- CLEF 2003 topics: SGML `<top>` blocks with `<num>` and per-language `<XX-title>`,
  `<XX-desc>`, `<XX-narr>` (also plain `<title>`…, and TREC-style topics whose tags are not
  closed); the query text is title + description, the setting the LLM-CLIR paper uses;
- NeuCLIR topic JSONL (TREC NeuCLIR 2022-2024, also HC4): one topic a line, `topic_id` and
  `topics`, a list of `{lang, source, topic_title, topic_description, topic_narrative}`
  with the English original and, per language, its human and machine translations; fields
  are named as ir_datasets names them (`title`, `ht_title`, `mt_description`, ...);
- TREC qrels: `qid Q0 docid rel` (whitespace separated; MIRACL/CIRAL use tabs).

A line or topic that cannot be read becomes a row with an `error` (queries) or raises
`ValueError` naming the line (qrels, which are ground truth: a bad qrels file must stop
evaluation, not shift its numbers).
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from collections.abc import Iterator
from typing import IO, Any

from xling.tasks.textio import CHUNK, iter_lines

QUERY_FIELDS = ("title", "desc", "narr")
NEUCLIR_FIELDS = tuple(f"{v}{f}" for v in ("", "ht_", "mt_")
                       for f in ("title", "description", "narrative"))
# NeuCLIR writes languages as ISO 639-3.
_ISO3 = {"en": "eng", "fa": "fas", "ru": "rus", "zh": "zho", "ar": "ara", "de": "deu",
         "fr": "fra", "es": "spa", "ja": "jpn", "ko": "kor"}


def _decode(raw: bytes | str, where: str) -> tuple[str | None, str | None]:
    if isinstance(raw, str):
        return raw, None
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start} of {where}"


def _bad_id(raw: bytes | str) -> str:
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "replace")
    return "bad-topic:" + hashlib.sha1(data).hexdigest()[:16]


def iter_tsv_topics(stream: IO, *, lang: str) -> Iterator[dict[str, Any]]:
    """`qid<TAB>text` lines -> queries rows. Blank lines are skipped."""
    for n, raw in enumerate(iter_lines(stream), 1):
        line, error = _decode(raw, f"line {n}")
        if line is not None and not line.strip():
            continue
        row = {"query_id": None, "lang": lang, "text": None, "error": error}
        if line is not None:
            qid, sep, text = line.rstrip("\r").partition("\t")
            if not sep or not qid.strip():
                row["error"] = f"line {n} is not `qid<TAB>text`"
            elif not text.strip():
                row.update(query_id=qid.strip(), error="empty query text")
            else:
                row.update(query_id=qid.strip(), text=text.strip())
        if row["query_id"] is None:
            row["query_id"] = _bad_id(raw)
        yield row



def iter_jsonl_topics(stream: IO, *, lang: str) -> Iterator[dict[str, Any]]:
    """JSON lines `{"query_id", "text"[, "lang", "rel_langs"]}` -> queries rows.

    `qid`/`id` and `query`/`query_text` are accepted for the id and text; `rel_langs` (a
    list of language codes, e.g. the languages of a disputed territory's claimants) is what
    BordIRLines' rel_langs and swap retrieval modes search. A bad line is an error row.
    """
    for n, raw in enumerate(iter_lines(stream), 1):
        line, error = _decode(raw, f"line {n}")
        if line is not None and not line.strip():
            continue
        row = {"query_id": None, "lang": lang, "text": None, "rel_langs": None, "error": error}
        if line is not None:
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                row["error"] = f"line {n} is not a JSON object: {e}"
                obj = None
            if obj is not None:
                qid = next((obj[k] for k in ("query_id", "qid", "id") if obj.get(k) is not None), None)
                text = next((obj[k] for k in ("text", "query", "query_text") if obj.get(k)), None)
                rel = obj.get("rel_langs")
                row.update(query_id=None if qid is None else str(qid), lang=obj.get("lang") or lang,
                           text=text.strip() if isinstance(text, str) and text.strip() else None,
                           rel_langs=[str(x) for x in rel] if isinstance(rel, list) else None)
                if qid is None:
                    row["error"] = f"line {n} has no query_id"
                elif row["text"] is None:
                    row["error"] = "empty query text"
        if row["query_id"] is None:
            row["query_id"] = _bad_id(raw)
        yield row

def iter_neuclir_topics(stream: IO, *, lang: str, fields: tuple[str, ...] = ()
                        ) -> Iterator[dict[str, Any]]:
    """NeuCLIR topic JSONL -> queries rows in `lang`.

    `title`/`description`/`narrative` are the English original (so `lang` must be en);
    `ht_*`/`mt_*` are the human/machine translation into `lang`. No fields: `title` for en,
    `ht_title` otherwise. `title`/`desc`/`narr` keep the chosen version's three fields.
    """
    fields = tuple(fields) or (("title",) if lang == "en" else ("ht_title",))
    # (version, topic key): "ht_title" -> ("ht", "topic_title"), "title" -> ("org", ...)
    wanted = [(v or "org", f"topic_{name}") for v, _, name in (f.rpartition("_") for f in fields)]
    versions = {v for v, _ in wanted}
    version = sorted(versions)[0]  # the one whose title/desc/narr the row keeps
    if "org" in versions and lang != "en":
        raise ValueError(f"NeuCLIR fields {[f for f in fields if '_' not in f]} are the English "
                         f"original: use langs [en], or ht_/mt_ fields for {lang}")
    if versions - {"org"} and lang == "en":
        raise ValueError("NeuCLIR ht_/mt_ fields are translations out of English: use langs "
                         "[fa], [ru], [zh] with them, or title/description for en")
    want = _ISO3.get(lang, lang)
    for n, raw in enumerate(iter_lines(stream), 1):
        line, error = _decode(raw, f"line {n}")
        if line is not None and not line.strip():
            continue
        row = {"query_id": None, "lang": lang, "text": None, "error": error,
               **dict.fromkeys(QUERY_FIELDS)}
        try:
            obj = json.loads(line) if line is not None else None
            qid = str(obj["topic_id"]) if obj is not None else None
            found = {}
            for t in obj["topics"] if obj is not None else ():
                src = str(t.get("source", "")).lower()
                key = ("org" if t.get("lang") == "eng" else
                       "ht" if "human" in src else "mt") if t.get("lang") in ("eng", want) else None
                if key:
                    found.setdefault(key, t)
        except (ValueError, KeyError, TypeError) as e:
            row.update(query_id=_bad_id(raw), error=f"line {n} is not a NeuCLIR topic: {e!r}")
            yield row
            continue
        if qid is None:
            row["query_id"] = _bad_id(raw)
            yield row
            continue
        row["query_id"] = qid
        topic = found.get(version)
        if topic is None:
            row["error"] = f"topic {qid} has no {version} version in {want}"
            yield row
            continue
        row.update(title=topic.get("topic_title"), desc=topic.get("topic_description"),
                   narr=topic.get("topic_narrative"))
        parts = []
        for v, key in wanted:
            value = (found.get(v) or {}).get(key)
            if value:
                parts.append(" ".join(str(value).split()))
        if parts:
            row["text"] = " ".join(parts)
        else:
            row["error"] = f"topic {qid} has none of the fields {list(fields)}"
        yield row


# CLEF: `<num> C141 </num>`, `<DE-title> … </DE-title>`; also `<title>`, and the unclosed
# TREC style (`<num> Number: 401`, `<desc> Description:`).
_TOP = re.compile(rb"<top>(.*?)</top>", re.I | re.S)
_TAG = re.compile(r"<(?:([a-z]{2,3})-)?(num|title|desc|narr)>", re.I)
_LABEL = re.compile(r"^\s*(?:number|description|narrative|title)\s*:\s*", re.I)


def iter_clef_topics(stream: IO, *, lang: str, fields: tuple[str, ...] = ("title", "desc"),
                     encoding: str = "auto") -> Iterator[dict[str, Any]]:
    """CLEF `<top>` blocks -> queries rows with `text` = the chosen fields joined by a space.

    `encoding` "auto" tries UTF-8 and falls back to Latin-1 per topic (CLEF topic files of
    2000-2003 are Latin-1; later ones UTF-8).
    """
    for block in _blocks(stream):
        try:
            text = block.decode("latin-1" if encoding == "latin-1" else "utf-8")
        except UnicodeDecodeError as e:
            if encoding == "utf-8":
                yield {"query_id": _bad_id(block), "lang": lang, "text": None,
                       "error": f"invalid UTF-8 at byte {e.start} of a <top> block"}
                continue
            text = block.decode("latin-1")
        yield clef_topic(text, lang=lang, fields=fields, raw=block)


def clef_topic(sgml: str, *, lang: str, fields: tuple[str, ...] = ("title", "desc"),
               raw: bytes | None = None) -> dict[str, Any]:
    """One `<top>` block's inside -> a queries row (with title / desc / narr kept)."""
    tags = list(_TAG.finditer(sgml))
    values: dict[str, str] = {}
    for m, nxt in zip(tags, [*tags[1:], None]):
        body = sgml[m.end(): nxt.start() if nxt else len(sgml)]
        body = re.sub(r"</[^>]*>", " ", body)  # the closing tag, when there is one
        body = " ".join(html.unescape(_LABEL.sub("", body)).split())
        values.setdefault(m.group(2).lower(), body)
    row = {"query_id": values.get("num") or None, "lang": lang, "text": None,
           **{f: values.get(f) or None for f in QUERY_FIELDS}, "error": None}
    if not row["query_id"]:
        row["query_id"] = _bad_id(raw if raw is not None else sgml)
        row["error"] = "topic without <num>"
        return row
    unknown = [f for f in fields if f not in QUERY_FIELDS]
    if unknown:
        raise ValueError(f"unknown CLEF topic field(s) {unknown}; choose from {QUERY_FIELDS}")
    text = " ".join(values[f] for f in fields if values.get(f))
    if text:
        row["text"] = text
    else:
        row["error"] = f"topic has none of the fields {list(fields)}"
    return row


def _blocks(stream: IO) -> Iterator[bytes]:
    buf = b""
    while data := stream.read(CHUNK):
        buf += data if isinstance(data, bytes) else data.encode("utf-8")
        last = 0
        for m in _TOP.finditer(buf):
            yield m.group(1)
            last = m.end()
        buf = buf[last:]
    if buf.strip():
        start = buf.lower().find(b"<top>")
        if start >= 0:  # an unterminated last topic is still read
            yield buf[start + 5:]


def iter_qrels(stream: IO) -> Iterator[dict[str, Any]]:
    """TREC qrels lines `qid iter docid rel` -> qrels rows. A bad line raises ValueError."""
    for n, raw in enumerate(iter_lines(stream), 1):
        line, error = _decode(raw, f"qrels line {n}")
        if error:
            raise ValueError(error)
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4:
            raise ValueError(f"qrels line {n} has {len(parts)} fields, expected 4 "
                             f"(qid Q0 docid relevance): {line[:120]!r}")
        try:
            rel = int(parts[3])
        except ValueError:
            raise ValueError(f"qrels line {n}: relevance {parts[3]!r} is not an integer") from None
        yield {"query_id": parts[0], "doc_id": parts[2], "relevance": rel}
