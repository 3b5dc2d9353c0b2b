"""A builder of V2-style mLongRR cases from any documents (s1.8 "Missing"), seeded per
case: haystacks filled to a length budget (v1's ``haystack_builder``, s1.5), needles
inserted at exact sentence boundaries, written as a CSV that ``data.load_file`` reads."""

from __future__ import annotations

import bisect
import csv
import os
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .data import NUMBER_IN_TEXT, length_value
from .paper import CITIES, POSITIONS, WINDOW_POSITIONS
from .prompts import words
from .split import Splitter, make_splitter
from .templates import load_templates


def make_counter(unit: str | Callable[[str], Any] = "words:nltk",
                 splitter: Splitter | None = None) -> Callable[[str], int]:
    """A length counter: ``words:nltk`` (NLTK word tokens over Punkt sentences, the V2 unit
    per s1.3), ``words:whitespace``, or a tokenizer callable (a list or a count)."""
    if callable(unit):
        def count(text: str) -> int:
            got = unit(text)
            return int(got) if isinstance(got, (int, np.integer)) else len(got)
        return count
    if unit == "words:whitespace":
        return words
    if unit == "words:nltk":
        from nltk.tokenize.destructive import NLTKWordTokenizer

        word_tokenizer = NLTKWordTokenizer()
        # the V2 unit is defined on Punkt's English sentences (s1.3), whatever splits the cases
        punkt = splitter if splitter is not None and splitter.tokenizer is not None else \
            make_splitter("punkt_english")
        return lambda text: sum(len(word_tokenizer.tokenize(s.text))
                                for s in punkt.sentences(text))
    raise ValueError(f"unknown length unit {unit!r}: use words:nltk, words:whitespace or a "
                     "tokenizer callable")


def build_haystack(documents: Iterable[Mapping], budget: int, count: Callable[[str], int],
                   splitter: Splitter, lang: str = "en") -> tuple[str, list[str], int]:
    """v1's ``haystack_builder`` (s1.5): whole documents joined by one space while the
    running count stays <= budget; a first document longer than the budget is skipped; the
    document that would overflow is cut at the last sentence that still fits, and the
    haystack ends. Returns (text, doc ids used, count). ValueError if the documents run out."""
    parts, ids, total = [], [], 0
    for doc in documents:
        text = str(doc.get("text") or "").strip()
        if not text:
            continue
        doc_count = count(text)
        if total + doc_count <= budget:
            parts.append(text)
            ids.append(str(doc.get("doc_id")))
            total += doc_count
            if total == budget:
                return " ".join(parts), ids, total
            continue
        if not parts:
            continue  # v1 skips a first article that alone is too long
        kept = []
        for s in splitter.sentences(text, lang):
            sentence_count = count(s.text)
            if total + sentence_count > budget:
                break
            kept.append(s.text)
            total += sentence_count
        if kept:
            parts.append(" ".join(kept))
            ids.append(str(doc.get("doc_id")))
        return " ".join(parts), ids, total
    raise ValueError(f"the documents hold only {total} of the {budget} units asked for")


def depth_boundary(cumulative: Sequence[float], percent: float) -> int:
    """The exact boundary search (s1.8 "Missing" c): the first sentence boundary whose
    cumulative count is >= ``percent`` % of the total (boundary b = before sentence b;
    N = the end)."""
    target = percent / 100.0 * cumulative[-1]
    return bisect.bisect_left(cumulative, target - 1e-9)


def _needle_text(template: str, city: str, number: str, period: bool) -> str:
    s = template.replace("{city}", city).replace("{number}", number).rstrip()
    ends = (".", "।", "؟", "?", "!")
    if period:
        return s if s.endswith(ends) else s + "."
    return s.rstrip("".join(ends))


def _insert(text: str, spans: Sequence[tuple[int, int]], boundaries: Sequence[int],
            needles: Sequence[str]) -> tuple[str, list[int]]:
    """Insert needles (in boundary order) at sentence boundaries, each joined to its
    neighbours by one space; returns the text and each needle's character start."""
    cuts = [spans[b][0] if b < len(spans) else len(text) for b in boundaries]
    out, starts, prev = "", [], 0
    for cut, needle in zip(cuts, needles):
        chunk = text[prev:cut].strip()
        if chunk:
            out = f"{out} {chunk}" if out else chunk
        if out:
            out += " "
        starts.append(len(out))
        out += needle
        prev = cut
    tail = text[prev:].strip()
    return (f"{out} {tail}" if tail else out), starts


def _boundaries(rng: random.Random, cumulative: Sequence[int], n_spans: int, needles: int,
                placement: str, position, label: str) -> list[int]:
    """Where the needles go: the boundary of ``position`` (1 needle), three distinct random
    boundaries (``uniform``, L283), or v1's window [p, p+25] % (``window``)."""
    if needles == 1:
        return [depth_boundary(cumulative, float(position))]
    if placement == "uniform":
        return sorted(rng.sample(range(n_spans + 1), 3))
    lo = depth_boundary(cumulative, float(position))
    hi = depth_boundary(cumulative, min(100.0, float(position) + 25))
    inside = [b for b in range(lo, hi + 1) if b != lo]
    if len(inside) < 2:
        raise ValueError(f"{label}: window {position} holds too few boundaries")
    return sorted([lo] + rng.sample(inside, 2))


def _draw_labels(rng: random.Random, count: int, haystack: str) -> list[str]:
    """Distinct random 7-digit labels (L277) that the haystack does not hold."""
    labels: list[str] = []
    while len(labels) < count:
        x = str(rng.randint(1_000_000, 9_999_999))
        if x not in labels and not re.search(NUMBER_IN_TEXT.format(x), haystack):
            labels.append(x)
    return labels


def _needle_columns(cities: Sequence[str], labels: Sequence[str]) -> dict[str, str]:
    """The v1 CSV's needle columns: ``city``, ``label`` or ``city1``, ``label1``, ..."""
    if len(labels) == 1:
        return {"city": cities[0], "label": labels[0]}
    out = {}
    for i, (city, label) in enumerate(zip(cities, labels), 1):
        out[f"city{i}"] = city
        out[f"label{i}"] = label
    return out


def build_cases(documents: Iterable[Mapping], *, lang: str,
                lengths: Sequence[int | str] = (2, 8, 16, 32, 64, 128, 256, 512),
                positions: Sequence[int] | None = None, needles: int = 1, runs: int = 1,
                seed: int = 0, placement: str = "uniform", needle_period: bool = True,
                unit: str | Callable[[str], Any] = "words:nltk", unit_name: str | None = None,
                splitter: Splitter | None = None, templates: Mapping | None = None,
                buffer: int = 100, cities: Sequence[str] | None = None) -> list[dict]:
    """V2-style cases from documents ``{doc_id, lang, title, text}`` (those of ``lang``, in
    the given order), as rows of the v1 CSV layout plus ``run``, ``count_unit``, ``n_count``,
    ``depth_measured`` (count before the needle / haystack count), ``depth_chars`` and
    ``depth_sentences`` (boundary / N), space-separated for several needles.

    One haystack per length (budget ``length*1000 - buffer`` units, :func:`build_haystack`);
    per (position, run) a ``random.Random(f"{seed}:{lang}:{length}:{position}:{run}")``
    draws distinct cities (English names from ``cities``, default the 23 of L313-335,
    written in ``lang``) and distinct 7-digit labels absent from the haystack. 1 needle: at
    the exact boundary of ``position`` (default 0/25/50/75/100). 3 needles: ``uniform``
    (default; three distinct random boundaries, position ``"random"``, L283) or ``window``
    (v1: needle 1 at the boundary of p, two more at distinct random boundaries inside
    [p, p+25] %, positions 0/25/50/75)."""
    templates = templates or load_templates()
    splitter = splitter or make_splitter()
    raw_count = make_counter(unit, splitter)
    memo: dict[str, int] = {}

    def count(text: str) -> int:  # documents are counted once for every length
        if text not in memo:
            memo[text] = raw_count(text)
        return memo[text]

    unit_name = unit_name or (unit if isinstance(unit, str) else "tokens:custom")
    if placement not in ("uniform", "window"):
        raise ValueError(f"placement must be uniform or window, got {placement!r}")
    if needles not in (1, 3):
        raise ValueError(f"needles must be 1 or 3, got {needles}")
    if positions is None:
        positions = POSITIONS if needles == 1 else (
            WINDOW_POSITIONS if placement == "window" else ("random",))
    entry = templates["languages"][lang]
    template = entry["needle"]["value"]
    names = entry["cities"]["value"]
    pool = list(cities or CITIES)
    docs = [d for d in documents if str(d.get("lang")) == lang]
    rows = []
    for length in lengths:
        units = length_value(f"{length}k" if isinstance(length, int) else str(length))
        if not units or units <= buffer:
            raise ValueError(f"bad length {length!r}: give thousands (2) or '2k', above the "
                             f"buffer of {buffer}")
        label = f"{int(units / 1000)}k" if units % 1000 == 0 else str(length)
        hay, doc_ids, _ = build_haystack(docs, units - buffer, count, splitter, lang)
        sentences = splitter.sentences(hay, lang)
        spans = [(s.start, s.end) for s in sentences]
        cumulative = [0] + list(np.cumsum([count(s.text) for s in sentences],
                                          dtype=np.int64).tolist())
        total = cumulative[-1]
        for position in positions:
            for run in range(runs):
                rng = random.Random(f"{seed}:{lang}:{label}:{position}:{run}")
                picked = rng.sample(pool, needles)
                labels = _draw_labels(rng, needles, hay)
                bounds = _boundaries(rng, cumulative, len(spans), needles, placement,
                                     position, label)
                texts = [_needle_text(template, names.get(c, c), number, needle_period)
                         for c, number in zip(picked, labels)]
                text, starts = _insert(hay, spans, bounds, texts)
                row: dict[str, Any] = {
                    "context_length": label, "position": position, "text": text,
                    **_needle_columns([names.get(c, c) for c in picked], labels)}
                row.update(
                    run=run, count_unit=unit_name, n_count=total,
                    depth_measured=" ".join(f"{cumulative[b] / total:.6f}" for b in bounds),
                    depth_chars=" ".join(f"{s / len(text):.6f}" for s in starts),
                    depth_sentences=" ".join(f"{b / max(1, len(spans)):.6f}" for b in bounds),
                    doc_ids=" ".join(doc_ids))
                rows.append(row)
    return rows


def write_cases_csv(rows: Sequence[Mapping], path: str | os.PathLike) -> str:
    """Write builder rows as an mLongRR CSV (v1 columns first), readable by
    ``data.load_file``."""
    if not rows:
        raise ValueError("no rows to write")
    n_needles = 1 if "label" in rows[0] else 3
    head = ["context_length", "position", "text"] + (
        ["city", "label"] if n_needles == 1
        else [f"{x}{i}" for i in (1, 2, 3) for x in ("city", "label")])
    extra = [k for k in rows[0] if k not in head]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=head + extra, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return str(path)
