"""The paper's published numbers (`configs/bordirlines.expected.yaml`): Table 4's concurrence
scores per (model, IR mode) and the citation analysis' rates, read for the report tables."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from xling.studies.bordirlines.data import MODES, stamp

# Table 4's columns (bordirlines.txt L466): (xling metric, the paper's header).
TABLE_METRICS = (("KB CS", "KB CS"), ("Control CS", "Con CS"), ("Non-control CS", "Non CS"),
                 ("Delta CS", "ΔCS"), ("Delta CS unnormalized", "ΔCS abs"),
                 ("Consistency CS unk", "Cst CS (unk)"), ("Consistency CS all", "Cst CS (all)"),
                 ("Response Countries mean", "# Country, mean"),
                 ("Response Countries σ", "# Country, std dev"))


def load_published(path: str | os.PathLike) -> dict:
    """The paper's numbers (``configs/bordirlines.expected.yaml``) -> ``{"source",
    "retriever", "prompt", "aliases": {xling model name: paper label}, "table4": {(label,
    mode): {metric: value}}, "citation": {"model", "mode", "langs": {lang: {"cr", "nr"}}}}``.
    Values as printed (CS in %); ``None`` where the paper prints none."""
    return _load_published(stamp(Path(path)))


@functools.lru_cache(maxsize=4)
def _load_published(file_stamp: tuple) -> dict:
    raw = yaml.safe_load(Path(file_stamp[0]).read_text("utf-8"))
    if not isinstance(raw, Mapping) or not isinstance(raw.get("table4"), Mapping):
        raise ValueError("no `table4:` mapping")
    columns = raw.get("columns")
    known = [m for m, _ in TABLE_METRICS]
    if not isinstance(columns, list) or any(c not in known for c in columns):
        raise ValueError(f"`columns:` must list metrics among {known}")
    table4: dict[tuple[str, str], dict[str, float | None]] = {}
    for label, rows in raw["table4"].items():
        if not isinstance(rows, Mapping):
            raise ValueError(f"table4.{label}: expected {{mode: [values]}}")
        for mode, values in rows.items():
            if mode not in MODES and mode != "random":
                raise ValueError(f"table4.{label}.{mode}: not a mode of {MODES}")
            if not isinstance(values, list) or len(values) != len(columns):
                raise ValueError(f"table4.{label}.{mode}: expected {len(columns)} values")
            table4[(str(label), mode)] = {
                c: None if v is None else float(v) for c, v in zip(columns, values)}
    aliases: dict[str, str] = {}
    for label, names in (raw.get("models") or {}).items():
        for name in [label, *(names or [])]:
            aliases[str(name).casefold()] = str(label)
    return {"source": raw.get("source", file_stamp[0]), "retriever": raw.get("retriever"),
            "prompt": raw.get("prompt", "direct"), "aliases": aliases, "table4": table4,
            "citation": raw.get("citation") or {}}


def paper_label(published: dict | None, model: str) -> str | None:
    """The paper's name for an xling model name (the file's `models:`), or None."""
    return (published or {}).get("aliases", {}).get(str(model).casefold())
