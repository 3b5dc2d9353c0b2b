"""The narrow stage's side of CROSS (jobs/narrow.py): what to embed for one context
language (each distinct sentence once, and the queries), and the selections made from the
stored embeddings: the exact ranking of each haystack's sentences against each query.

A CROSS run is narrow -> generate -> evaluate -> report (spec s5.1): the narrow stage embeds
every distinct sentence of a context language once and ranks each haystack's sentences
against each query with :func:`select`; the generate stage's CROSS prompts read those
selections; baseline and needle-only prompts need none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .data import load_contexts
from .rank import label_ranks, rank, scores_of
from .split import context_split, splitter_for
from .templates import load_templates, query_text

if TYPE_CHECKING:
    from .options import Options

# The options a narrow cell's selections depend on (the rest: order, join, methods, scoring,
# only change prompts or scores, so they reuse the selections).
NARROW_OPTIONS = ("needles", "ks", "query_langs", "query_text", "prompt_variant", "splitter",
                  "extra_terminators", "lengths", "positions", "runs", "templates", "limit")

SELECTION_FIELDS = ("context_id", "needles", "clang", "qlang", "length", "position", "run",
                    "n_sentences", "top_idx", "top_score", "label_idx", "label_rank",
                    "target_idx", "target_rank", "splitter_fp", "needle_isolated", "error")


def narrow_langs(opts: Options) -> list[str]:
    """The context languages whose sentences the narrow stage ranks (none without CROSS)."""
    return list(opts.context_langs) if "cross" in opts.methods else []


def narrow_options(opts: Options, clang: str) -> dict:
    """The options one context language's narrow cell depends on (its params, so its hash):
    the options dict of :func:`narrowed`, cut to ``NARROW_OPTIONS``."""
    given = narrowed(opts, clang).as_options()
    return {**{k: given[k] for k in NARROW_OPTIONS},
            **{k: given[k] for k in ("data", "context_langs", "methods")}}


def narrowed(opts: Options, clang: str) -> Options:
    """The options of one context language's narrow cell: its data files, its language,
    method cross (what :func:`narrow_inputs` and :func:`select` read)."""
    return opts.model_copy(update={"data": [d for d in opts.data if d.lang == clang],
                                   "context_langs": [clang], "methods": ["cross"]})


def sentence_id(text: str) -> str:
    """A sentence's (or query's) content id: equal texts share one embedding."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def query_key(qlang: str, needles: int) -> str:
    return f"q:{qlang}:{needles}"


def queries(opts: Options) -> dict[str, str]:
    """query_key -> the text the sentences are ranked against (``query_text`` option)."""
    templates = load_templates(opts.templates)
    return {query_key(q, n): query_text(q, n, opts.query_text,
                                        variant=opts.prompt_variant, templates=templates)
            for q in opts.query_langs for n in opts.needles}


def narrow_inputs(opts: Options, clang: str) -> dict:
    """What the narrow stage embeds for one context language: ``sentences`` (id -> text, each
    distinct sentence once over every context of both needle counts), ``queries`` (query key
    -> text), and the counts (``sentences_total``, ``contexts``, ``context_errors``)."""
    opts = narrowed(opts, clang)
    splitter, templates = splitter_for(opts), load_templates(opts.templates)
    sentences: dict[str, str] = {}
    total = contexts = bad = 0
    for ctx in load_contexts(opts):
        if ctx["lang"] != clang:
            continue
        contexts += 1
        if ctx.get("error"):
            bad += 1
            continue
        text = ctx["text"]
        for s, e in context_split(ctx, splitter, templates).spans:
            total += 1
            sentences.setdefault(sentence_id(text[s:e]), text[s:e])
    return {"sentences": sentences, "queries": queries(opts), "sentences_total": total,
            "contexts": contexts, "context_errors": bad}


def select(opts: Options, clang: str, vectors: Mapping[str, np.ndarray], *,
           k_max: int | None = None) -> list[dict]:
    """One selection per (context of ``clang``, query language): the exact ranking of the
    context's sentences by similarity to the query (score descending, ties by sentence
    index, s2.3), its first ``k_max`` entries (default the largest k) and each needle's
    1-based rank in the full ranking. ``vectors`` maps :func:`sentence_id` and
    :func:`query_key` to stored embeddings; a context with a sentence or query missing there
    is an error row."""
    opts = narrowed(opts, clang)
    k_max = k_max or max(opts.ks)
    splitter, templates = splitter_for(opts), load_templates(opts.templates)
    out = []
    for ctx in load_contexts(opts):
        if ctx["lang"] != clang:
            continue
        base = {"context_id": ctx["context_id"], "needles": ctx["needles"], "clang": clang,
                "length": ctx["length"], "position": str(ctx["position"]), "run": ctx["run"]}
        rows = [{**base, "qlang": q} for q in opts.query_langs]
        if ctx.get("error"):
            out += [{**r, "error": ctx["error"]} for r in rows]
            continue
        split = context_split(ctx, splitter, templates)
        text = ctx["text"]
        sids = [sentence_id(text[s:e]) for s, e in split.spans]
        missing = sum(1 for s in sids if s not in vectors)
        if missing:
            out += [{**r, "error": f"{missing} of {len(sids)} sentences have no embedding"}
                    for r in rows]
            continue
        matrix = np.stack([vectors[s] for s in sids])
        for r in rows:
            query_vector = vectors.get(query_key(r["qlang"], ctx["needles"]))
            if query_vector is None:
                out.append({**r, "error": "the query has no embedding"})
                continue
            scores = scores_of(matrix, query_vector)
            order = rank(scores)
            ranks = label_ranks(order, split.label_idx)
            top = order[:k_max]
            out.append({**r, "n_sentences": split.n_sentences,
                        "top_idx": [int(i) for i in top],
                        "top_score": [float(scores[i]) for i in top],
                        "label_idx": [int(i) for i in split.label_idx], "label_rank": ranks,
                        "target_idx": int(split.target_idx),
                        "target_rank": ranks[ctx["target"]] if ranks else None,
                        "splitter_fp": split.splitter_fp,
                        "needle_isolated": list(split.needle_isolated), "error": None})
    return [{f: r.get(f) for f in SELECTION_FIELDS} for r in out]


def needle_summary(selections: Iterable[Mapping]) -> dict:
    """How many needles ended up as a sentence of their own (one count per context, not per
    query language), and the share; ``unknown``: needles no template found."""
    per_context = {s["context_id"]: s.get("needle_isolated") or [] for s in selections
                   if not s.get("error")}
    flags = [f for v in per_context.values() for f in v]
    known = [f for f in flags if f is not None]
    return {"needles": len(flags), "isolated": sum(1 for f in known if f),
            "unknown": len(flags) - len(known),
            "isolated_share": (100.0 * sum(1 for f in known if f) / len(known)) if known else None}


def hits_at(selections: Iterable[Mapping], ks: Sequence[int]) -> dict[str, float]:
    """% of selections whose target needle ranks within k (LLM-free), per k."""
    ranks = [s["target_rank"] for s in selections if not s.get("error")]
    return {f"hit@{k}": (100.0 * sum(1 for r in ranks if r is not None and 0 < r <= k)
                         / len(ranks)) if ranks else None for k in ks}
