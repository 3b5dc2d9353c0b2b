"""Parsers for the published document formats, streamed one record at a time.

Pure Python: jobs call these on streams or lines of corpus files, so a corpus of millions of
documents is never held in memory. A record that cannot be parsed becomes a documents row
with an `error` (keyed by its DOCNO, or a hash of the record), so it is counted, not dropped.

`parse_document_line` parses one JSONL line; `iter_documents` reads a whole binary stream
(JSON lines, or CLEF SGML) incrementally with `read(n)` only.

Formats (see docs/design.md, "Published formats"):
- mrtydi / miracl: `{"docid": "36897421#2", "title": ..., "text": ...}`
- ciral: `{"docid", "title", "text", "url"}`
- neuclir: `{"id", "title", "text", "url", "time", "cc_file"}`
- jsonl: any JSON lines with a field mapping (id_field, title_field, text_field)
- clef: CLEF 2003 SGML, `<DOC><DOCNO>…</DOCNO>…</DOC>` blocks with per-newspaper field tags
  (TITLE_TAGS, TEXT_TAGS, DATE_TAGS below); Latin-1 or UTF-8
- parquet: any Parquet file with a column mapping (id_field, title_field, text_field), read
  one row group at a time

Topics and qrels (CLEF `<top>`, TREC topics TSV, TREC qrels) are in tasks/topics.py.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

from xling.tasks.textio import CHUNK, iter_lines

# (id, title, text, extra fields kept as `source`-side metadata)
FIELDS: dict[str, tuple[str, str | None, str]] = {
    "mrtydi": ("docid", "title", "text"),
    "miracl": ("docid", "title", "text"),
    "ciral": ("docid", "title", "text"),
    "neuclir": ("id", "title", "text"),
}
DATE_FIELDS = {"neuclir": "time"}



_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def bad_line_id(line: str) -> str:
    return "bad-line:" + hashlib.sha1(line.encode("utf-8", "replace")).hexdigest()[:16]


def parse_document_line(line: str, *, fmt: str, lang: str, source: str,
                        id_field: str = "docid", title_field: str | None = "title",
                        text_field: str = "text") -> dict[str, Any] | None:
    """One JSONL line -> a documents row (`doc_id, lang, title, text, source, date, error`).

    Returns None for blank lines, which are not records.
    """
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return _error_row(bad_line_id(line), lang, source,
                          f"malformed JSON: {e.msg} at column {e.colno}")
    if not isinstance(obj, dict):
        return _error_row(bad_line_id(line), lang, source,
                          f"expected a JSON object, got {type(obj).__name__}")
    row = document_from_object(obj, fmt=fmt, lang=lang, source=source, id_field=id_field,
                               title_field=title_field, text_field=text_field)
    if row["doc_id"] is None:
        row["doc_id"] = bad_line_id(line)
    if _SURROGATE_ESCAPE.search(line):
        # json.loads turns an unpaired \ud800-\udfff escape into a str that no UTF-8 (and
        # no Arrow column) can hold.
        for field in ("doc_id", "title", "text", "date"):
            try:
                (row[field] or "").encode("utf-8")
            except UnicodeEncodeError:
                doc_id = bad_line_id(line) if field == "doc_id" else row["doc_id"]
                return _error_row(doc_id, lang, source, f"{field} holds an unpaired surrogate "
                                  "escape (\\ud800-\\udfff), which is not Unicode text")
    return row


def document_from_object(obj: dict, *, fmt: str, lang: str, source: str,
                         id_field: str = "docid", title_field: str | None = "title",
                         text_field: str = "text") -> dict[str, Any]:
    """A parsed record (a JSON object, a Parquet row) -> a documents row.

    A record without an id gets `doc_id=None` and an error; the caller names it.
    """
    if fmt in FIELDS:
        id_field, title_field, text_field = FIELDS[fmt]
    doc_id = obj.get(id_field)
    if doc_id is None or str(doc_id).strip() == "":
        return _error_row(None, lang, source, f"missing document id field '{id_field}'")
    row = _error_row(None, lang, source, None)
    row["doc_id"] = str(doc_id)
    title = obj.get(title_field) if title_field else None
    row["title"] = None if title is None else str(title)
    text = obj.get(text_field)
    if fmt in DATE_FIELDS and obj.get(DATE_FIELDS[fmt]) is not None:
        row["date"] = str(obj[DATE_FIELDS[fmt]])
    if not isinstance(text, str):
        row["error"] = f"missing or non-string text field '{text_field}'"
    elif not text.strip():
        row["text"] = text
        row["error"] = "empty text"
    else:
        row["text"] = text
    return row


# --- streaming readers -------------------------------------------------------------------

ENCODINGS = ("auto", "utf-8", "latin-1")


def iter_documents(stream: BinaryIO, *, fmt: str, lang: str, source: str, encoding: str = "auto",
                   id_field: str = "docid", title_field: str | None = "title",
                   text_field: str = "text") -> Iterator[dict[str, Any]]:
    """Documents rows from a binary stream of one corpus file, read incrementally.

    `fmt` is "clef" (SGML) or one of the JSON-lines formats of `parse_document_line`.
    `encoding` is "utf-8" (undecodable input becomes an error row), "latin-1", or "auto":
    UTF-8 for JSON lines (so the same as "utf-8"), UTF-8 falling back to Latin-1 per <DOC>
    block for CLEF, whose 2003 collections mix both.
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    if fmt == "clef":
        yield from _iter_clef(stream, lang=lang, source=source, encoding=encoding)
        return
    if fmt not in FIELDS and fmt != "jsonl":
        raise ValueError(f"unknown document format {fmt!r}")
    for n, raw in enumerate(iter_lines(stream), 1):
        row = line_row(raw, n, encoding=encoding, fmt=fmt, lang=lang, source=source,
                       id_field=id_field, title_field=title_field, text_field=text_field)
        if row is not None:
            yield row


def line_row(raw: bytes, n: int | str, *, encoding: str, fmt: str, lang: str, source: str,
             id_field: str = "docid", title_field: str | None = "title",
             text_field: str = "text") -> dict[str, Any] | None:
    """Line `n` (from 1) of a JSON-lines file, undecoded and without its newline -> a
    documents row, or None for a blank line."""
    try:
        line = raw.decode("latin-1" if encoding == "latin-1" else "utf-8")
    except UnicodeDecodeError as e:
        return _error_row(bad_line_id(raw.decode("utf-8", "replace")), lang, source,
                          f"invalid UTF-8 at byte {e.start} of line {n}")
    return parse_document_line(line, fmt=fmt, lang=lang, source=source, id_field=id_field,
                               title_field=title_field, text_field=text_field)


def iter_parquet_documents(source, *, lang: str, source_name: str, id_field: str = "docid",
                           title_field: str | None = "title", text_field: str = "text",
                           batch_rows: int = 2048) -> Iterator[dict[str, Any]]:
    """Documents rows from a Parquet file (a path or a seekable file), a batch at a time."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(source)
    names = pf.schema_arrow.names
    missing = [f for f in (id_field, text_field, title_field) if f and f not in names]
    if missing:
        raise ValueError(f"Parquet columns {missing} not found (columns: {names}); set "
                         f"id_field / title_field / text_field to the right names")
    cols = list(dict.fromkeys(c for c in (id_field, title_field, text_field) if c))
    n = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
        for obj in batch.to_pylist():
            n += 1
            row = document_from_object(obj, fmt="jsonl", lang=lang, source=source_name,
                                       id_field=id_field, title_field=title_field,
                                       text_field=text_field)
            if row["doc_id"] is None:
                row["doc_id"] = f"bad-row:{n}"
            yield row


def _error_row(doc_id: str | None, lang: str, source: str, error: str | None) -> dict[str, Any]:
    """A documents row with no content (`error=None` gives the blank row parsers fill in)."""
    return {"doc_id": doc_id, "lang": lang, "title": None, "text": None, "source": source,
            "date": None, "error": error}


# --- CLEF 2003 SGML ------------------------------------------------------------------------
# Each newspaper has its own tag set (LA Times, Glasgow Herald, Frankfurter Rundschau,
# Spiegel, SDA, Aamulehti, La Stampa, Izvestia); these are the union of their field tags.
TITLE_TAGS = ("title", "headline", "headlines", "head", "ti")
TEXT_TAGS = ("text", "ld", "te", "tx", "body", "lead")
DATE_TAGS = ("date", "dd")

_DOC_TAG = re.compile(rb"<(/?)doc(?:\s[^>]*)?>", re.I)
_RAW_DOCNO = re.compile(rb"<docno(?:\s[^>]*)?>\s*(.*?)\s*</docno\s*>", re.I | re.S)
# Alternation order does not matter: `(?:\s[^>]*)?>` forces the whole tag name to match.
_FIELD = re.compile(r"<(docno|%s)(?:\s[^>]*)?>(.*?)</\1\s*>"
                    % "|".join(TITLE_TAGS + TEXT_TAGS + DATE_TAGS), re.I | re.S)
_PARAGRAPH = re.compile(r"</?p(?:\s[^>]*)?>", re.I)
_MARKUP = re.compile(r"<[^>]*>")


def _doc_blocks(stream: BinaryIO) -> Iterator[tuple[int, bytes, bool]]:
    """(file offset, bytes inside <DOC>...</DOC>, terminated?) for each DOC block.

    A <DOC> opened before the previous one was closed ends that one as unterminated, so one
    broken document cannot swallow the rest of the file.
    """
    buf, base, start = b"", 0, None  # base: file offset of buf[0]; start: open block in buf
    while True:
        data = stream.read(CHUNK)
        buf += data
        pos = 0
        while m := _DOC_TAG.search(buf, pos):
            closing = m.group(1) == b"/"
            if start is not None:
                yield base + start, buf[start:m.start()], closing
            start, pos = (None if closing else m.end()), m.end()
        if not data:
            break
        # Keep the open block, or else a tag that the chunk boundary may have cut.
        keep = start if start is not None else max(buf.rfind(b"<", pos), pos)
        buf, base = buf[keep:], base + keep
        start = None if start is None else 0
    if start is not None:
        yield base + start, buf[start:], False


def _iter_clef(stream: BinaryIO, *, lang: str, source: str, encoding: str) -> Iterator[dict[str, Any]]:
    for offset, raw, terminated in _doc_blocks(stream):
        m = _RAW_DOCNO.search(raw)
        error_id = m.group(1).decode("latin-1") if m else bad_line_id(raw.decode("utf-8", "replace"))
        if not terminated:
            yield _error_row(error_id, lang, source, "unterminated <DOC> (file truncated?)")
            continue
        try:
            sgml = raw.decode("latin-1" if encoding == "latin-1" else "utf-8")
        except UnicodeDecodeError as e:
            if encoding == "utf-8":
                yield _error_row(error_id, lang, source,
                                 f"invalid UTF-8 at byte {offset + e.start} of the file")
                continue
            sgml = raw.decode("latin-1")
        yield _clef_row(sgml, error_id, lang=lang, source=source)


def _clef_row(sgml: str, error_id: str, *, lang: str, source: str) -> dict[str, Any]:
    found = [(m.group(1).lower(), m.group(2)) for m in _FIELD.finditer(sgml)]
    doc_id = next((_clean(v) for k, v in found if k == "docno"), "")
    if not doc_id:
        return _error_row(error_id, lang, source, "missing <DOCNO>")
    title_tag = next((k for k, _ in found if k in TITLE_TAGS), None)
    title = " ".join(_clean(v) for k, v in found if k == title_tag)
    texts = [k for k, _ in found if k in TEXT_TAGS]
    text = "\n".join(t for k, v in found if k in TEXT_TAGS and (t := _clean(v)))
    return {"doc_id": doc_id, "lang": lang, "title": title or None,
            "text": text if texts else None, "source": source,
            "date": next((_clean(v) for k, v in found if k in DATE_TAGS), None),
            "error": None if text else "empty text"}


def _clean(sgml: str) -> str:
    """Plain text of an SGML field: <P> ends a paragraph ("\\n"), other markup is dropped."""
    paragraphs = (" ".join(html.unescape(_MARKUP.sub(" ", p)).split()) for p in _PARAGRAPH.split(sgml))
    return "\n".join(p for p in paragraphs if p)
