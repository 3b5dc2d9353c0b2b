"""Helpers that several test files share (each study's section is its own)."""

from __future__ import annotations

import os

# --- XRAG (xling/studies/xrag) -------------------------------------------------------------


def load_xrag_items(path: str) -> list[dict]:
    """Every instance of an XRAG jsonl file, in file order (xling/studies/xrag/data.py's
    items: ``id, lang, subset, question, answer, en_question, en_answer, q_type, a_type,
    crossdoc_type, articles, error``); a line that cannot be used is an item with an
    ``error`` (its id is ``<file>:line<n>`` when the line has none)."""
    from xling.studies.xrag.data import iter_items, open_path

    with open_path(str(path)) as f:
        return list(iter_items(f, os.path.basename(str(path))))
