"""The prompt strings of every query language (``data/templates.json``, each string with a
status: ``paper``, ``v1``, ``v1_adapted``, ``draft``): the prompt of a query language, the
query text the sentences are ranked against, and the UNANSWERABLE tokens."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping

from .paper import PROMPT_VARIANTS, QUERY_TEXTS, TEMPLATES_PATH

STATUS_ORDER = ("paper", "v1", "v1_adapted", "draft")  # strongest first


@functools.lru_cache(maxsize=8)
def _load_templates(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    for key in ("layout", "languages", "_verified"):
        if key not in doc:
            raise ValueError(f"{path}: no `{key}`")
    for lang, entry in doc["languages"].items():
        for name, item in entry.items():
            if not isinstance(item, dict) or not {"value", "status", "source"} <= set(item):
                raise ValueError(f"{path}: {lang}.{name} needs value, status and source")
            if item["status"] not in STATUS_ORDER:
                raise ValueError(f"{path}: {lang}.{name} has unknown status {item['status']!r}")
    return doc


def load_templates(path: str | os.PathLike | None = None) -> dict:
    """The templates file (default: the packaged ``data/templates.json``)."""
    return _load_templates(str(path or TEMPLATES_PATH))


def _weakest(statuses: Iterable[str]) -> str:
    return max(statuses, key=STATUS_ORDER.index)


def prompt_template(qlang: str, needles: int, *, variant: str = "paper",
                    templates: Mapping | None = None) -> tuple[str, str]:
    """(prompt with a ``{text}`` slot, weakest status of the strings used) for a query
    language. ``no_unanswerable`` drops the UNANSWERABLE sentence (L234)."""
    if variant not in PROMPT_VARIANTS:
        raise ValueError(f"variant must be one of {list(PROMPT_VARIANTS)}, got {variant!r}")
    templates = templates or load_templates()
    entry = templates["languages"][qlang]
    n = 1 if needles == 1 else 3
    pieces = {"instruction": entry["instruction"], "question": entry[f"question_{n}"],
              "rules": entry["rules"], "unanswerable": entry[f"unanswerable_{n}"]}
    layout = templates["layout"]["value"]
    if variant == "no_unanswerable":
        layout = layout.replace("\n{unanswerable}", "")
        pieces.pop("unanswerable")
    out = layout
    for name, item in pieces.items():
        out = out.replace("{" + name + "}", item["value"])
    status = _weakest([templates["layout"]["status"]] + [p["status"] for p in pieces.values()])
    return out, status


def query_text(qlang: str, needles: int, mode: str = "question", *,
               variant: str = "paper", templates: Mapping | None = None) -> str:
    """What the embedder compares sentences with: the question sentence in the query
    language (default), or the whole instruction without the context."""
    templates = templates or load_templates()
    entry = templates["languages"][qlang]
    n = 1 if needles == 1 else 3
    if mode == "question":
        return entry[f"question_{n}"]["value"]
    if mode == "instruction":
        template, _ = prompt_template(qlang, needles, variant=variant, templates=templates)
        head, tail = template.split("{text}", 1)
        return "\n".join(x for x in (head.replace("#CONTEXT", "").strip(),
                                     tail.replace("#ENDCONTEXT", "").strip()) if x)
    raise ValueError(f"mode must be one of {list(QUERY_TEXTS)}, got {mode!r}")


def unanswerable_tokens(qlang: str | None, templates: Mapping | None = None) -> list[str]:
    """The UNANSWERABLE token(s) of a query language, plus the English one."""
    templates = templates or load_templates()
    tokens = list(templates["languages"].get(qlang or "en", {})
                  .get("unanswerable_tokens", {}).get("value", []))
    return list(dict.fromkeys(tokens + ["UNANSWERABLE"]))
