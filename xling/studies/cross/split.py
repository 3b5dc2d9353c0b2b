"""Sentence splitting: the multilingual text layer (``xling.tasks.text``, the default) or, as
compat settings, NLTK's Punkt without the ``punkt_tab`` download (English parameters shipped
in ``data/punkt_tab_english``, s2.1, v1's choice for every language); each splitter named by
a fingerprint; and a context's split.

Every splitter but ``oracle`` is blind: a context's sentences are a function of its text and
language alone, as the paper's method sees them. Where the needles are is measured *after*
the split, for evaluation only (which sentence holds each label, and whether each needle
ended up as a sentence of its own: ``needle_isolated``). ``oracle`` is the ablation that
uses gold knowledge: the text layer's sentences with each needle found by its template, kept
whole and cut out as a sentence of its own; every table that shows it says "oracle"."""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from xling.tasks import text as text_layer

from .data import NUMBER_IN_TEXT
from .paper import ORACLE_SPLITTERS, PUNKT_ENGLISH_DIR, SPLITTERS
from .templates import load_templates

if TYPE_CHECKING:
    from .options import Options


class Sentence(NamedTuple):
    index: int
    start: int
    end: int
    text: str


@dataclass(frozen=True, eq=False)
class Splitter:
    """A sentence splitter; ``fingerprint`` names it in results. ``multilingual`` (no
    tokenizer) segments with the text layer in the text's language; ``oracle`` does too and
    then cuts each needle out as a sentence of its own by its template (``isolates_needles``,
    the oracle ablation); the Punkt kinds ignore the language."""

    kind: str
    sent_end_chars: tuple[str, ...]
    fingerprint: str
    tokenizer: Any = field(repr=False)

    @property
    def isolates_needles(self) -> bool:
        return self.kind == "oracle"

    def spans(self, text: str, lang: str | None = None) -> list[tuple[int, int]]:
        if self.tokenizer is None:
            if lang is None:
                raise ValueError("the multilingual splitter needs the text's language")
            return text_layer.sentence_spans(text, lang)
        return [(int(s), int(e)) for s, e in self.tokenizer.span_tokenize(text)]

    def sentences(self, text: str, lang: str | None = None) -> list[Sentence]:
        return [Sentence(i, s, e, text[s:e]) for i, (s, e) in enumerate(self.spans(text, lang))]


def _punkt_lines(name: str) -> list[str]:
    with open(PUNKT_ENGLISH_DIR / name, encoding="utf-8") as f:
        return [line[:-1] if line.endswith("\n") else line for line in f]


def punkt_english_parameters():
    """NLTK's English punkt_tab parameters, read as ``nltk.tokenize.punkt.load_punkt_params``
    reads its four files (``data/README.md`` gives their provenance)."""
    from nltk.tokenize.punkt import PunktParameters

    params = PunktParameters()
    params.collocations = {tuple(line.split("\t")) for line in _punkt_lines("collocations.tab")}
    params.sent_starters = set(_punkt_lines("sent_starters.txt"))
    params.abbrev_types = set(_punkt_lines("abbrev_types.txt"))
    params.ortho_context = defaultdict(int, {a: int(b) for a, b in (
        line.split("\t") for line in _punkt_lines("ortho_context.tab"))})
    return params


def _params_digest(params) -> str:
    digest = hashlib.sha256()
    for name, items in (("abbrev_types", sorted(params.abbrev_types)),
                        ("collocations", sorted(params.collocations)),
                        ("sent_starters", sorted(params.sent_starters)),
                        ("ortho_context", sorted(params.ortho_context.items()))):
        digest.update(json.dumps([name, items], ensure_ascii=False).encode("utf-8"))
    return digest.hexdigest()


def _make_splitter(kind: str, extra: tuple[str, ...], train_text: str | None) -> Splitter:
    if kind in ("multilingual", "oracle"):
        if extra:
            raise ValueError("extra_terminators apply to the Punkt splitters; the multilingual "
                             "splitter already ends sentences at every script's terminators")
        suffix = ":oracle_isolate_needles" if kind == "oracle" else ""
        return Splitter(kind, (), f"{kind}:{text_layer.fingerprint()}{suffix}", None)
    import nltk
    from nltk.tokenize.punkt import (PunktLanguageVars, PunktParameters,
                                     PunktSentenceTokenizer, PunktTrainer)

    chars = tuple(dict.fromkeys(PunktLanguageVars.sent_end_chars + tuple(extra)))
    lang_vars = (PunktLanguageVars() if chars == PunktLanguageVars.sent_end_chars else
                 type("XlingPunktLanguageVars", (PunktLanguageVars,),
                      {"sent_end_chars": chars})())
    if kind == "punkt_english":
        params = punkt_english_parameters()
    elif kind == "punkt_untrained":
        params = PunktParameters()
    elif kind == "punkt_trained":
        if not train_text:
            raise ValueError("punkt_trained needs train_text (the haystack corpus)")
        params = PunktTrainer(train_text, lang_vars=lang_vars).get_params()
    else:
        raise ValueError(f"unknown splitter {kind!r}; choose one of {list(SPLITTERS)}")
    tokenizer = PunktSentenceTokenizer(params, lang_vars=lang_vars)  # params used as given
    desc = {"impl": "nltk.tokenize.punkt.PunktSentenceTokenizer.span_tokenize",
            "nltk": nltk.__version__, "kind": kind, "sent_end_chars": list(chars),
            "params": _params_digest(params)}
    digest = hashlib.sha256(json.dumps(desc, sort_keys=True).encode("utf-8")).hexdigest()
    return Splitter(kind, chars, f"{kind}:nltk-{nltk.__version__}:{digest[:16]}", tokenizer)


@functools.lru_cache(maxsize=16)
def _cached_splitter(kind: str, extra: tuple[str, ...]) -> Splitter:
    return _make_splitter(kind, extra, None)


def make_splitter(kind: str = "multilingual", extra_terminators: Iterable[str] = (),
                  train_text: str | Iterable[str] | None = None) -> Splitter:
    """The study's splitter (see README.md). ``punkt_trained`` trains on ``train_text`` (a
    string or texts joined by blank lines); the others are cached."""
    extra = tuple(extra_terminators)
    if kind == "punkt_trained":
        if train_text is not None and not isinstance(train_text, str):
            train_text = "\n\n".join(train_text)
        return _make_splitter(kind, extra, train_text)
    return _cached_splitter(kind, extra)


def splitter_is_oracle(fingerprint: str | None) -> bool:
    """Whether a splitter fingerprint names the oracle ablation."""
    return str(fingerprint or "").split(":", 1)[0] in ORACLE_SPLITTERS


def splitter_for(opts: Options) -> Splitter:
    return make_splitter(opts.splitter, opts.extra_terminators)


def _needle_strings(template: str, city: str, label: str) -> list[str]:
    s = template.replace("{city}", city).replace("{number}", label)
    base = s.rstrip(".।")
    return list(dict.fromkeys([s, base + ".", base]))


def needle_spans(ctx: Mapping, templates: Mapping | None = None) -> list[tuple[int, int, str]]:
    """(start, end, how) of each needle in the text, in label order: the longest instance of
    the context language's needle templates (``needle`` and ``needle_variants``, with and
    without a final period) with the row's city and label that occurs exactly once; else the
    label alone (``how="label"``)."""
    templates = templates or load_templates()
    entry = templates["languages"].get(ctx["lang"], {})
    forms = [entry["needle"]["value"]] if "needle" in entry else []
    forms += list(entry.get("needle_variants", {}).get("value", []))
    text = ctx["text"]
    out = []
    for label, city in zip(ctx["labels"], ctx["cities"]):
        found = None
        candidates = sorted({s for t in forms for s in _needle_strings(t, city, label)},
                            key=lambda s: (-len(s), s))
        for s in candidates:
            i = text.find(s)
            if i >= 0 and text.find(s, i + 1) < 0:
                found = (i, i + len(s), "template")
                break
        if found is None:
            m = re.search(NUMBER_IN_TEXT.format(re.escape(label)), text)
            found = (m.start(), m.end(), "label") if m else (-1, -1, "missing")
        out.append(found)
    return out


def protect_spans(spans: Sequence[tuple[int, int]],
                  protected: Iterable[tuple[int, int]]) -> tuple[list[tuple[int, int]], int]:
    """Merge consecutive sentence spans so that no protected character span crosses a
    sentence boundary; returns the spans and the number of merges."""
    spans = [tuple(s) for s in spans]
    merges = 0
    for protected_start, protected_end in protected:
        if protected_start < 0:
            continue
        first = next((i for i, (s, e) in enumerate(spans) if e > protected_start), None)
        last = next((i for i, (s, e) in enumerate(spans) if e >= protected_end),
                    len(spans) - 1)
        if first is not None and last > first:
            spans[first:last + 1] = [(spans[first][0], spans[last][1])]
            merges += last - first
    return spans, merges


def isolate_spans(text: str, spans: Sequence[tuple[int, int]],
                  needles: Iterable[tuple[int, int]]) -> tuple[list[tuple[int, int]], int]:
    """Cut the sentence holding each needle (start, end) at the needle's edges, so that the
    needle is a sentence of its own; returns the spans and the number of cuts. The builders
    (v1 and V2) insert a needle at a sentence boundary, so its edges are boundaries even
    where the text does not mark them (a needle without a full stop, scraped text)."""
    out = [tuple(s) for s in spans]
    cuts = 0
    for start, end in sorted(needles):
        if start < 0:
            continue
        i = next((j for j, (a, b) in enumerate(out) if a <= start and end <= b), None)
        if i is None:
            continue
        a, b = out[i]
        pieces = [(a, start), (start, end), (end, b)]
        kept = [p for p in pieces if text[p[0]:p[1]].strip()]
        trimmed = []
        for p, q in kept:
            chunk = text[p:q]
            lead = len(chunk) - len(chunk.lstrip())
            trimmed.append((p + lead, p + lead + len(chunk.strip())))
        cuts += len(trimmed) - 1
        out[i:i + 1] = trimmed
    return out, cuts


@dataclass(frozen=True)
class ContextSplit:
    """A context's sentences: ``spans`` (start, end) in order (index = position in the list),
    ``label_idx`` (the sentence of each label), ``target_idx`` (of the gold label), the
    needle spans (found after a blind split, for evaluation), how many sentence merges
    protecting them and cuts isolating them the oracle took, the splitter, and per needle
    whether it is a sentence of its own (None where no template found the needle)."""

    spans: tuple[tuple[int, int], ...]
    label_idx: tuple[int, ...]
    target_idx: int
    needle_spans: tuple[tuple[int, int, str], ...]
    n_merged: int
    splitter_fp: str
    n_isolated: int = 0
    needle_isolated: tuple[bool | None, ...] = ()

    @property
    def n_sentences(self) -> int:
        return len(self.spans)

    def sentences(self, text: str) -> list[Sentence]:
        return [Sentence(i, s, e, text[s:e]) for i, (s, e) in enumerate(self.spans)]


_SPLIT_CACHE: dict[tuple, ContextSplit] = {}


def blind_spans(text: str, lang: str, splitter: Splitter) -> list[tuple[int, int]]:
    """A blind splitter's sentences: the text and its language, nothing else."""
    return splitter.spans(text, lang)


# What may trail a needle inside its own sentence: a full stop of any script, space.
_TRAIL = " \t.。।።!?"


def needle_isolated(text: str, spans: Sequence[tuple[int, int]],
                    needles: Sequence[tuple[int, int, str]]) -> list[bool | None]:
    """Per needle: is the sentence holding it the needle and nothing else (a full stop aside)?
    None for a needle no template found (its extent is unknown)."""
    out: list[bool | None] = []
    for start, end, how in needles:
        if how != "template" or start < 0:
            out.append(None)
            continue
        unit = next(((a, b) for a, b in spans if a <= start < b), None)
        out.append(unit is not None and
                   text[unit[0]:unit[1]].strip(_TRAIL) == text[start:end].strip(_TRAIL))
    return out


def context_split(ctx: Mapping, splitter: Splitter | None = None,
                  templates: Mapping | None = None) -> ContextSplit:
    """Split a context (cached per splitter and text). A blind splitter splits the text
    alone; the needles are then found by template for evaluation. The ``oracle`` splitter
    keeps each needle whole and cuts it out as a sentence of its own."""
    splitter = splitter or make_splitter()
    text = ctx["text"]
    key = (splitter.fingerprint, hashlib.sha1(text.encode("utf-8")).hexdigest(),
           tuple(ctx["labels"]), tuple(ctx["cities"]), ctx["lang"])
    if key in _SPLIT_CACHE:
        return _SPLIT_CACHE[key]
    spans = blind_spans(text, ctx["lang"], splitter)
    needles = needle_spans(ctx, templates)  # after the split: evaluation (and the oracle)
    merged = isolated = 0
    if splitter.isolates_needles:  # the oracle ablation: gold positions shape the units
        spans, merged = protect_spans(spans, [(s, e) for s, e, _ in needles])
        spans, isolated = isolate_spans(text, spans,
                                        [(s, e) for s, e, how in needles if how == "template"])
    starts = [s for s, _ in spans]

    def sentence_of(pos: int) -> int:
        return max(0, bisect.bisect_right(starts, pos) - 1)

    label_idx = tuple(sentence_of(s) if s >= 0 else -1 for s, _, _ in needles)
    target = ctx.get("target") if ctx.get("target") is not None else 0
    out = ContextSplit(tuple(spans), label_idx, label_idx[target] if label_idx else -1,
                       tuple(needles), merged, splitter.fingerprint, isolated,
                       tuple(needle_isolated(text, spans, needles)))
    if len(_SPLIT_CACHE) > 512:
        _SPLIT_CACHE.clear()
    _SPLIT_CACHE[key] = out
    return out
