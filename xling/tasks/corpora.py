"""Parsers for the published document formats, one JSONL line at a time.

Pure Python: jobs stream files through Ray Data and call these on each line, so a corpus of
millions of documents is never held in memory. A line that cannot be parsed becomes a
documents row with an `error`, keyed by a hash of the line, so it is counted, not dropped.

Formats (see docs/design.md, "Published formats"):
- mrtydi / miracl: `{"docid": "36897421#2", "title": ..., "text": ...}`
- ciral: `{"docid", "title", "text", "url"}`
- neuclir: `{"id", "title", "text", "url", "time", "cc_file"}`
- jsonl: any JSON lines with a field mapping (id_field, title_field, text_field)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# (id, title, text, extra fields kept as `source`-side metadata)
FIELDS: dict[str, tuple[str, str | None, str]] = {
    "mrtydi": ("docid", "title", "text"),
    "miracl": ("docid", "title", "text"),
    "ciral": ("docid", "title", "text"),
    "neuclir": ("id", "title", "text"),
}
DATE_FIELDS = {"neuclir": "time"}

DOCUMENT_COLUMNS = ("doc_id", "lang", "title", "text", "source", "date", "error")


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
    if fmt in FIELDS:
        id_field, title_field, text_field = FIELDS[fmt]
    row: dict[str, Any] = {"doc_id": None, "lang": lang, "title": None, "text": None,
                           "source": source, "date": None, "error": None}
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        row.update(doc_id=bad_line_id(line), error=f"malformed JSON: {e.msg} at column {e.colno}")
        return row
    if not isinstance(obj, dict):
        row.update(doc_id=bad_line_id(line), error=f"expected a JSON object, got {type(obj).__name__}")
        return row
    doc_id = obj.get(id_field)
    if doc_id is None or str(doc_id).strip() == "":
        row.update(doc_id=bad_line_id(line), error=f"missing document id field '{id_field}'")
        return row
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
