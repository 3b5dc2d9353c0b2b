"""Prompt rows: the generate stage's input, written by a study's tasks/ module or by hand.

A prompt file is JSONL (or Parquet) with one row per item: `item_id`, `prompt` (a string,
or a list of `{"role", "content"}` chat messages), and optionally `study`, `setting`,
`lang`. A row that cannot be used (bad JSON, no id, no prompt) becomes a row with an
`error`, under an id that says where it was.
"""

from __future__ import annotations

import json
from typing import IO, Any, Iterator

import pyarrow as pa

PROMPTS = pa.schema([("item_id", pa.string()), ("study", pa.string()), ("setting", pa.string()),
                     ("lang", pa.string()), ("prompt", pa.string()), ("error", pa.string()),
                     ("meta", pa.string())])
OPTIONAL = ("study", "setting", "lang")


def _meta(obj: dict) -> str | None:
    """A study's per-prompt facts (JSON), carried through to the generations for scoring."""
    m = obj.get("meta")
    return m if m is None or isinstance(m, str) else json.dumps(m, ensure_ascii=False,
                                                                 sort_keys=True)


def prompt_row(obj: Any, where: str) -> dict:
    """One input object -> a PROMPTS row (chats stored as their JSON list)."""
    if not isinstance(obj, dict):
        return {"item_id": where, "prompt": None, "error": f"{where}: not a JSON object"}
    row = {k: (None if obj.get(k) is None else str(obj[k])) for k in OPTIONAL}
    row["meta"] = _meta(obj)
    item = obj.get("item_id", obj.get("id"))
    prompt = obj.get("prompt", obj.get("messages"))
    if item is None or str(item).strip() == "":
        return {**row, "item_id": where, "prompt": None, "error": f"{where}: no item_id"}
    if isinstance(prompt, list):
        prompt = json.dumps(prompt, ensure_ascii=False)
    elif prompt is not None and not isinstance(prompt, str):
        return {**row, "item_id": str(item), "prompt": None,
                "error": f"prompt must be a string or a list of chat messages, "
                         f"not {type(prompt).__name__}"}
    if prompt is None:
        return {**row, "item_id": str(item), "prompt": None, "error": "no prompt field"}
    return {**row, "item_id": str(item), "prompt": prompt, "error": None}


def iter_prompt_lines(stream: IO[bytes], *, name: str) -> Iterator[dict]:
    for n, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            yield {"item_id": f"{name}:line{n}", "prompt": None,
                   "error": f"line {n}: invalid JSON ({e})"}
            continue
        yield prompt_row(obj, f"{name}:line{n}")


def prompt_table(rows) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=PROMPTS)


def built_prompt_table(rows, *, where: str) -> pa.Table:
    """Prompt rows a study's module built: rows it could not build keep their error (and
    have no prompt); the rest are checked like file rows."""
    return prompt_table({**{k: r.get(k) for k in ("item_id", *OPTIONAL, "error")},
                         "meta": _meta(r)} if r.get("error") else prompt_row(r, where)
                        for r in rows)
