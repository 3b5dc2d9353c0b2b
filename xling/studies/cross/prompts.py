"""Settings, prompt sets and prompt rows: ``{n}n_baseline`` (the whole context, L90, L106),
``{n}n_k{k}`` (CROSS at cap k, L53-55) and ``{n}n_needle_only`` (the L102 sanity check), per
``lang = f"{query}-{context}"``. Every row carries ``meta``, what scoring needs, so
evaluate reads neither prompts nor selections."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from xling.tasks.text import count_units

from .data import NUMBER_IN_TEXT, load_contexts
from .paper import STUDY
from .rank import label_ranks, rank, selection_text
from .split import ContextSplit, Splitter, context_split, splitter_for, splitter_is_oracle
from .templates import load_templates, prompt_template

if TYPE_CHECKING:
    from .options import Options


def setting_name(needles: int, method: str, k: int | None = None) -> str:
    if method == "cross":
        return f"{needles}n_k{k}"
    return f"{needles}n_{method}"


def parse_setting(setting: str) -> tuple[int, str, int | None]:
    """``"3n_k10"`` -> (3, "cross", 10); ``"1n_baseline"`` -> (1, "baseline", None)."""
    m = re.fullmatch(r"(\d+)n_(?:k(\d+)|(baseline|needle_only))", setting)
    if not m:
        raise ValueError(f"not a CROSS setting: {setting!r}")
    if m.group(2):
        return int(m.group(1)), "cross", int(m.group(2))
    return int(m.group(1)), m.group(3), None


def settings(opts: Options) -> list[str]:
    out = []
    for n in opts.needles:
        for method in opts.methods:
            if method == "cross":
                out += [setting_name(n, "cross", k) for k in opts.ks]
            else:
                out.append(setting_name(n, method))
    return out


def cell_langs(opts: Options) -> list[str]:
    """``f"{query}-{context}"`` for every pair (never a dot: cell ids join with dots)."""
    return [f"{q}-{c}" for q in opts.query_langs for c in opts.context_langs]


def split_cell_lang(lang: str) -> tuple[str, str]:
    """``"sw-en"`` -> (query language, context language)."""
    qlang, _, clang = lang.partition("-")
    if not qlang or not clang:
        raise ValueError(f"a CROSS cell language is `<query>-<context>`, got {lang!r}")
    return qlang, clang


def needs_selection(setting: str) -> bool:
    return parse_setting(setting)[1] == "cross"


def prompt_cells(opts: Options) -> list[tuple[str, str]]:
    """(setting, ``q-c``) for every setting x pair that has contexts (a language shipped
    with 1 needle only gets no 3-needle cells)."""
    have = {(c["needles"], c["lang"]) for c in load_contexts(opts)}
    return [(s, lang) for s in settings(opts) for lang in cell_langs(opts)
            if (parse_setting(s)[0], split_cell_lang(lang)[1]) in have]


def words(text: str, lang: str | None = None) -> int:
    """The model-free length measure of the reduction: the text layer's words of ``lang``
    (characters for zh, ja, th and the other scripts without word spaces), or whitespace
    words when no language is given."""
    return count_units(text, lang)[0] if lang else len(text.split())


def needle_only_text(ctx: Mapping, split: ContextSplit, join: str = " ") -> str:
    """The needle(s) alone, in document order (the L102 sanity check). A needle that matches
    no needle template of the context language is an error (ValueError): the prompt would
    show the bare number, not the needle sentence."""
    bare = [label for label, (_, _, how) in zip(ctx["labels"], split.needle_spans)
            if how != "template"]
    if bare:
        raise ValueError(f"{ctx['context_id']}: needle(s) {bare} match no needle template of "
                         f"{ctx['lang']!r}; the needle-only prompt would be the bare number. "
                         f"Add the file's needle to the templates file (languages."
                         f"{ctx['lang']}.needle or needle_variants)")
    spans = sorted((s, e) for s, e, _ in split.needle_spans if s >= 0)
    return join.join(ctx["text"][s:e] for s, e in spans)


def needle_depths(ctx: Mapping, split: ContextSplit) -> list[float | None]:
    """Measured depth of each needle, in label order: characters before the needle's start
    (the whole needle sentence when a template matched, else the label) / characters in the
    text. The CSV's ``position`` is the nominal depth."""
    n = max(1, len(ctx["text"]))
    return [s / n if s >= 0 else None for s, _, _ in split.needle_spans]


def _cross_selection(ctx: Mapping, split: ContextSplit, k: int, selection: Mapping,
                     info: dict) -> list[int]:
    """The top k of a selection (scores, or a ranking with ``n_sentences``); sets the
    needles' ranks in ``info``."""
    if selection.get("scores") is not None:
        scores = np.asarray(selection["scores"], dtype=np.float64)
        if scores.size != split.n_sentences:
            raise ValueError(f"{ctx['context_id']}: {scores.size} scores for "
                             f"{split.n_sentences} sentences (splitter drift?)")
        order_all = rank(scores)
        info["label_rank"] = label_ranks(order_all, split.label_idx)
        return [int(i) for i in order_all[:k]]
    top = [int(i) for i in selection["top_idx"]]
    n_sentences = selection.get("n_sentences", split.n_sentences)
    if n_sentences != split.n_sentences:
        raise ValueError(f"{ctx['context_id']}: the selection has {n_sentences} sentences, "
                         f"this split {split.n_sentences} (splitter drift?)")
    if len(top) < min(k, n_sentences):
        raise ValueError(f"{ctx['context_id']}: a ranking of {len(top)} for k={k}")
    full = selection.get("label_rank")
    if full is not None:
        info["label_rank"] = [int(r) for r in full]
    else:  # ranks beyond a partial ranking are unknown (None)
        position = {i: r for r, i in enumerate(top, 1)}
        info["label_rank"] = [position.get(i) for i in split.label_idx]
    return top[:k]


def given_text(ctx: Mapping, method: str, k: int | None = None, *,
               selection: Mapping | None = None, order: str = "score", join: str = " ",
               splitter: Splitter | None = None, templates: Mapping | None = None
               ) -> tuple[str, dict]:
    """The context text the LLM sees for one method, and what was measured about it.

    ``selection`` (CROSS only) holds ``scores`` (one per sentence, in sentence order) or
    ``top_idx`` (the ranking, best first, at least k long or complete) with
    ``n_sentences``; a selection made with another split is an error (ValueError)."""
    split = context_split(ctx, splitter, templates)
    depths = needle_depths(ctx, split)
    info: dict[str, Any] = {"n_sentences": split.n_sentences, "splitter_fp": split.splitter_fp,
                            "n_merged": split.n_merged, "n_isolated": split.n_isolated,
                            "needle_match": [how for _, _, how in split.needle_spans],
                            "needle_isolated": list(split.needle_isolated),
                            "oracle": splitter_is_oracle(split.splitter_fp),
                            "depths": depths, "depth": depths[ctx["target"]],
                            "label_idx": list(split.label_idx),
                            "target_idx": split.target_idx, "label_rank": None,
                            "target_rank": None, "k": k}
    fingerprint = (selection or {}).get("splitter_fp")
    if method == "cross" and fingerprint is not None and fingerprint != split.splitter_fp:
        raise ValueError(f"{ctx['context_id']}: the selection was made with splitter "
                         f"{fingerprint}, this split is {split.splitter_fp}")
    if method == "baseline":
        text = ctx["text"]
    elif method == "needle_only":
        text = needle_only_text(ctx, split, join)
    elif method == "cross":
        if selection is None or k is None:
            raise ValueError("CROSS needs a selection and k")
        top = _cross_selection(ctx, split, k, selection, info)
        info["target_rank"] = info["label_rank"][ctx["target"]]
        text = selection_text(ctx["text"], split.spans, top, order=order, join=join)
        info["top_idx"] = top
    else:
        raise ValueError(f"unknown method {method!r}")
    info.update(text_words=words(text, ctx["lang"]),
                context_words=words(ctx["text"], ctx["lang"]),
                words_unit=count_units("", ctx["lang"])[1],
                text_chars=len(text), context_chars=len(ctx["text"]))
    return text, info


def _found(gold: str, text: str) -> bool:
    return re.search(NUMBER_IN_TEXT.format(re.escape(gold)), text) is not None


def prompt_row(ctx: Mapping, setting: str, qlang: str, opts: Options, *,
               selection: Mapping | None = None, splitter: Splitter | None = None,
               templates: Mapping | None = None) -> dict:
    """One PROMPTS row (``item_id``=context id, ``study``, ``setting``, ``lang``=``q-c``,
    ``prompt``, ``error``) with ``meta``: what scoring needs without re-reading the prompt."""
    needles, method, k = parse_setting(setting)
    lang = f"{qlang}-{ctx['lang']}"
    base = {"item_id": ctx["context_id"], "study": STUDY, "setting": setting, "lang": lang,
            "prompt": None, "error": ctx.get("error"), "meta": None}
    if base["error"]:
        return base
    templates = templates or load_templates(opts.templates)
    splitter = splitter or splitter_for(opts)
    try:
        text, info = given_text(ctx, method, k, selection=selection, order=opts.order,
                                join=opts.join, splitter=splitter, templates=templates)
        template, status = prompt_template(qlang, needles, variant=opts.prompt_variant,
                                           templates=templates)
    except (ValueError, KeyError) as e:
        return {**base, "error": f"{type(e).__name__}: {e}"}
    head, tail = template.split("{text}", 1)
    labels = list(ctx["labels"])
    meta = {"needles": needles, "method": method, "k": k, "qlang": qlang,
            "clang": ctx["lang"], "length": ctx["length"],
            "length_value": ctx["length_value"], "unit": ctx["unit"],
            "position": ctx["position"], "run": ctx["run"], "gold": ctx["gold"],
            "labels": labels, "target_in_text": _found(ctx["gold"], text),
            "all_in_text": all(_found(label, text) for label in labels),
            "template_status": status, "prompt_variant": opts.prompt_variant,
            "order": opts.order, "join": opts.join, "scoring": opts.scoring, **info}
    return {**base, "prompt": head + text + tail, "meta": meta}


def prompt_rows(opts: Options, setting: str, lang: str, *, contexts: Sequence[Mapping] | None
                = None, selections: Mapping[tuple[str, str], Mapping] | None = None,
                filesystem=None) -> list[dict]:
    """The prompt rows of one cell (``setting``, ``lang`` = ``q-c``). ``selections`` maps
    (context_id, query language) to a selection (:func:`given_text`); CROSS rows without
    one are error rows."""
    qlang, clang = split_cell_lang(lang)
    needles, method, _ = parse_setting(setting)
    if contexts is None:
        contexts = load_contexts(opts, filesystem=filesystem)
    splitter = splitter_for(opts)
    templates = load_templates(opts.templates)
    out = []
    for ctx in contexts:
        if ctx["lang"] != clang or ctx["needles"] != needles:
            continue
        selection = None
        if method == "cross":
            selection = (selections or {}).get((ctx["context_id"], qlang))
            if selection is None:
                out.append({"item_id": ctx["context_id"], "study": STUDY, "setting": setting,
                            "lang": lang, "prompt": None, "meta": None,
                            "error": ctx.get("error") or "no selection for this context"})
                continue
        out.append(prompt_row(ctx, setting, qlang, opts, selection=selection,
                              splitter=splitter, templates=templates))
    return out
