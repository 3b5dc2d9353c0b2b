"""Scoring: exact match (the paper's "exact match accuracy", L106: the number the model gives
as its answer is the gold, L293/L299; a comparative answer such as "4753820, larger than
1218893" counts by its answer and is counted apart as `comparative`) first, and containment
of the gold string (v1's only published scoring code, s1.7) second, both after digit and Chinese-numeral normalization (the text
layer); the ``scoring`` option says which is ``correct``. Also the failure taxonomy
(L178-181, L216-219), input reduction (L145-151), per-item scores and the metric rows."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xling.tasks.tables import wilson
from xling.tasks.text import normalize_numerals

from .paper import FAILURE_DETAILS, FAILURE_RULES, SCORINGS, STUDY
from .prompts import needs_selection, setting_name
from .templates import unanswerable_tokens

if TYPE_CHECKING:
    from .options import Options

# Separators dropped between two digits: , . ' ’ Arabic thousands/decimal separators and
# comma, space, no-break/figure/thin/narrow no-break spaces, and invisible bidi marks.
DIGIT_SEPARATORS = (",.'\u2019\u066c\u066b\u060c \u00a0\u2007\u2009\u202f"
                    "\u200e\u200f\u061c\u2066\u2067\u2068\u2069")
_SEPARATOR_RE = re.compile("(?<=[0-9])[" + re.escape(DIGIT_SEPARATORS) + "](?=[0-9])")
_SEVEN_DIGITS = re.compile(r"(?<![0-9])[0-9]{7}(?![0-9])")
# A generation error that means the prompt did not fit the model's window.
_REFUSED = re.compile(r"prompt too long|maximum context length|context length|too many tokens",
                      re.I)


def normalize_digits(text: str) -> str:
    """Every Unicode decimal digit (category Nd: Persian, Arabic-Indic, Devanagari, ...)
    becomes its ASCII digit and every Chinese numeral its ASCII number (the text layer's
    ``normalize_numerals``), then the separators between two digits are dropped
    (``7,252,750`` / ``7 252 750`` / ``۷٬۲۵۲٬۷۵۰`` / ``七百二十五万二千七百五十`` ->
    ``7252750``)."""
    if not text:
        return ""
    return _SEPARATOR_RE.sub("", normalize_numerals(text))


def seven_digit_numbers(text: str) -> list[str]:
    return _SEVEN_DIGITS.findall(normalize_digits(text))


def contains_gold(output: str | None, gold: str) -> bool:
    """Containment (``scoring: containment``, v1's code, s1.7): the gold string occurs in
    the normalized output; credits "14753820", "4753820.5" and a list of every needle."""
    return bool(output) and str(gold) in normalize_digits(output)


# What may stand between the numbers of a bare list ("6316390, 7252750 and 4753820"): a list
# names candidates, it does not answer which one is the largest.
_LIST_GAP = re.compile(r"[\s,;/、，；&+]*(?:and|or|und|oder|et|ou|y|o|na|au|iyo|ama|và|hoặc|"
                       r"dan|atau|и|или|و|أو|या|और|va|yoki|和|或|及)?[\s,;/、，；&+]*",
                       re.IGNORECASE)


def answer_number(output: str | None) -> str | None:
    """The number the model gives as its answer (L299: accuracy is whether the model
    "correctly identif[ies] ... the largest"; L293 "provide the correct answer"), not every
    number it names: the only 7-digit number; of several, the one named most often, the first
    on a tie ("The largest is 4753820, larger than 1218893" -> 4753820; "Comparing 1218893
    and 4753820, the largest is 4753820" -> 4753820). None without a number, and for a bare
    list of different numbers ("6316390, 7252750 and 4753820"), which answers nothing."""
    text = normalize_digits(output or "")
    found = list(_SEVEN_DIGITS.finditer(text))
    if not found:
        return None
    numbers = [m.group() for m in found]
    if len(set(numbers)) > 1 and all(
            _LIST_GAP.fullmatch(text[a.end():b.start()]) for a, b in zip(found, found[1:])):
        return None
    counts = {n: numbers.count(n) for n in numbers}
    return max(dict.fromkeys(numbers), key=lambda n: counts[n])  # first of the most named


def is_comparative(output: str | None) -> bool:
    """An answer that names other numbers beside its own ("... larger than 1218893"): the
    tables count these apart, so that either reading of them can be checked."""
    numbers = set(seven_digit_numbers(output or ""))
    return len(numbers) > 1 and answer_number(output) is not None


def strict_correct(output: str | None, gold: str) -> bool:
    """Exact match (``scoring: exact``, the default; L106 "exact match accuracy"): the
    answer the model gives (:func:`answer_number`) is the gold."""
    return bool(output) and answer_number(output) == str(gold)


def is_unanswerable(output: str | None, qlang: str | None = None,
                    templates: Mapping | None = None) -> bool:
    if not output:
        return False
    low = output.casefold()
    return any(t.casefold() in low for t in unanswerable_tokens(qlang, templates))


def gold_label(labels: Sequence) -> str:
    """The gold answer: the only label, or the largest of several as integers (L295, L299)."""
    return str(max(int(str(x).strip()) for x in labels))


def score_output(output: str | None, gold: str, *, qlang: str | None = None,
                 templates: Mapping | None = None, scoring: str = "exact") -> dict:
    """``correct`` by the ``scoring`` rule, with ``strict`` (exact) and ``contains`` beside."""
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {list(SCORINGS)}, got {scoring!r}")
    strict, contains = strict_correct(output, gold), contains_gold(output, gold)
    return {"correct": strict if scoring == "exact" else contains, "strict": strict,
            "contains": contains, "unanswerable": is_unanswerable(output, qlang, templates),
            "numbers": seven_digit_numbers(output or ""), "answer": answer_number(output),
            "comparative": is_comparative(output)}


def failure_class(*, correct: bool, target_in_cap: bool, all_in_cap: bool | None = None,
                  unanswerable: bool = False, refused: bool = False,
                  rule: str = "target") -> tuple[str, str]:
    """(class, detail) of one item (L178-181, L216-219). Classes: ``correct``,
    ``embedding_failure`` (the target label, or with ``rule="all"`` any label, is not in
    what the LLM saw), ``llm_failure`` (everything needed was there; detail
    ``llm_unanswerable`` or ``llm_incorrect``), ``too_long`` (the prompt was refused)."""
    if rule not in FAILURE_RULES:
        raise ValueError(f"rule must be one of {list(FAILURE_RULES)}, got {rule!r}")
    if refused:
        return "too_long", "too_long"
    if correct:
        return "correct", "correct"
    if rule == "target":
        present = target_in_cap
    else:
        present = bool(all_in_cap if all_in_cap is not None else target_in_cap)
    if not present:
        return "embedding_failure", "embedding_failure"
    return "llm_failure", "llm_unanswerable" if unanswerable else "llm_incorrect"


ORACLE_LABEL = " (oracle)"


def system_name(method: str, k, oracle: bool = False) -> str:
    """``cross@<k>`` for CROSS at a cap, else the method (a column of the tables); CROSS on
    the oracle splitter's sentences (needles cut out by their template) is ``cross@<k>
    (oracle)``, so that no table shows it as the method's own result."""
    if method != "cross":
        return method
    return f"cross@{int(k)}" + (ORACLE_LABEL if oracle else "")


def _score_one(row: Mapping, rule: str, templates: Mapping | None, scoring: str) -> dict:
    meta = dict(row.get("meta") or {})

    def get(key, default=None):  # a top-level key wins over meta's
        return row[key] if key in row and row[key] is not None else meta.get(key, default)

    method, k = get("method"), get("k")
    oracle = bool(get("oracle", False)) and method == "cross"
    isolated = [f for f in (get("needle_isolated") or []) if f is not None]
    gold = get("gold") or gold_label(get("labels"))
    qlang = get("qlang")
    refused = bool(row.get("too_long") or row.get("refused"))
    scored = score_output(row.get("output"), gold, qlang=qlang, templates=templates,
                          scoring=scoring)
    target_in = bool(get("target_in_text", True))
    all_in = bool(get("all_in_text", target_in))
    cls, detail = failure_class(correct=scored["correct"], target_in_cap=target_in,
                                all_in_cap=all_in, unanswerable=scored["unanswerable"],
                                refused=refused, rule=rule)
    text_words, context_words = get("text_words"), get("context_words")
    return {
        "model": row.get("model", "model"), "item_id": row.get("item_id"),
        "setting": row.get("setting") or setting_name(get("needles"), method, k),
        "needles": get("needles"), "method": method, "k": k,
        "system": system_name(method, k, oracle), "oracle": oracle,
        "needles_isolated": sum(1 for f in isolated if f), "needles_known": len(isolated),
        "qlang": qlang, "clang": get("clang"),
        "length": get("length"), "length_value": get("length_value"),
        "position": get("position"), "run": get("run"), "gold": gold,
        "correct": scored["correct"] and not refused,
        "strict": scored["strict"] and not refused,
        "contains": scored["contains"] and not refused, "scoring": scoring,
        "unit": get("unit"), "depth": get("depth"),
        "unanswerable": scored["unanswerable"], "refused": refused,
        "comparative": scored["comparative"],
        "failure": cls, "failure_detail": detail,
        "target_in_cap": target_in, "all_in_cap": all_in,
        "target_rank": get("target_rank"),
        "hit": (target_in if method == "cross" else None),
        "reduction_words": ((1 - text_words / context_words)
                            if text_words is not None and context_words else None),
        "n_prompt_tokens": row.get("n_prompt_tokens"),
    }


def score_rows(rows: Iterable[Mapping], *, rule: str = "target",
               templates: Mapping | None = None, scoring: str = "exact") -> pd.DataFrame:
    """Per-item scores. Each row holds ``output`` (None for an error/refused generation),
    ``meta`` (from ``prompts.prompt_row``; its keys may also sit at the top level) and
    optionally ``model``, ``item_id``, ``error``, ``too_long``/``refused`` and
    ``n_prompt_tokens``. Rows are scored one by one: only a row's own output counts.
    ``correct`` follows ``scoring`` (``exact`` or ``containment``); ``depth`` is the
    measured depth of the target needle (``position`` the nominal one)."""
    frame = pd.DataFrame.from_records([_score_one(r, rule, templates, scoring)
                                       for r in rows])
    if len(frame) and frame["n_prompt_tokens"].notna().any():
        frame = add_token_reduction(frame)
    else:
        frame["reduction_tokens"] = None
    return frame


def add_token_reduction(items: pd.DataFrame) -> pd.DataFrame:
    """``reduction_tokens`` = 1 - prompt tokens / the baseline's prompt tokens for the same
    (model, item_id, qlang) (refused baseline rows keep their token count); Fig 14, L145-151."""
    base = items[items["method"] == "baseline"].set_index(["model", "item_id", "qlang"])[
        "n_prompt_tokens"]
    base = base[~base.index.duplicated()]
    keys = list(zip(items["model"], items["item_id"], items["qlang"]))
    den = pd.Series([base.get(key) for key in keys], index=items.index, dtype="float64")
    items = items.copy()
    items["reduction_tokens"] = 1 - items["n_prompt_tokens"].astype("float64") / den
    return items



def score_items(opts: Options, generations: Sequence[Mapping]) -> list[dict]:
    """One item per generation: the scored ones (:func:`score_rows`), then those whose prompt
    could not be built (``failure: error``: counted, never scored as correct)."""
    rows = []
    for g in generations:
        meta = g.get("meta")
        meta = json.loads(meta) if isinstance(meta, str) else (meta or {})
        err = g.get("error")
        refused = bool(err and _REFUSED.search(err))
        rows.append({**g, "meta": meta, "refused": refused, "too_long": None,  # the policy
                     "output": None if err else g.get("output"),
                     "gen_error": err})
    usable = [r for r in rows if r["meta"]]
    scored = score_rows(usable, rule=opts.embedding_failure, scoring=opts.scoring)
    items = []
    for r, rec in zip(usable, scored.to_dict("records")):
        rec.update(setting=r["setting"], lang=r["lang"], error=r["gen_error"])
        items.append(rec)
    for r in rows:
        if not r["meta"]:
            items.append({"model": r.get("model"), "item_id": r.get("item_id"),
                          "setting": r.get("setting"), "lang": r.get("lang"), "correct": False,
                          "failure": "error", "error": r.get("gen_error") or "no prompt"})
    return items


def _group_metrics(setting: str, lang: str, model: str, group: list[dict]) -> list[dict]:
    metrics = []

    def add(metric, value, n, lo=None, hi=None):
        metrics.append({"study": STUDY, "setting": setting, "lang": lang, "model": model,
                        "metric": metric, "value": value, "ci_low": lo, "ci_high": hi, "n": n})

    n = len(group)
    # the primary metric first (exact match by default, L106), then both rules by name
    for metric, key in (("accuracy", "correct"), ("exact_accuracy", "strict"),
                        ("containment_accuracy", "contains")):
        k = sum(1 for i in group if i.get(key))
        add(metric, 100.0 * k / n, n, *wilson(k, n))
    k = sum(1 for i in group if i.get("comparative"))
    add("comparative_answers", 100.0 * k / n, n)  # answers that also name other numbers
    for cls in (*FAILURE_DETAILS[1:], "error"):
        k = sum(1 for i in group if i.get("failure_detail", i.get("failure")) == cls)
        add(cls, 100.0 * k / n, n)
    if needs_selection(setting):
        k = sum(1 for i in group if i.get("target_in_cap"))
        add("hit", 100.0 * k / n, n, *wilson(k, n))
        # the splitter: 100 = the oracle ablation (needles cut out by template), 0 = blind
        add("oracle_splitter", 100.0 * any(i.get("oracle") for i in group), n)
        known = sum(i.get("needles_known") or 0 for i in group)
        if known:
            add("needle_isolated", 100.0 * sum(i.get("needles_isolated") or 0 for i in group)
                / known, known)
    for red in ("reduction_words", "reduction_tokens"):
        vals = [i[red] for i in group if i.get(red) is not None and not pd.isna(i[red])]
        if vals:
            add(red, 100.0 * float(np.mean(vals)), len(vals))
    for dim, key in (("length", "length"), ("depth", "depth_bin"), ("position", "position")):
        by: dict[str, list[bool]] = defaultdict(list)
        for i in group:
            value = depth_bin(i.get("depth")) if key == "depth_bin" else i.get(key)
            if value is not None:
                by[str(value)].append(bool(i.get("correct")))
        for value, correct in by.items():
            add(f"accuracy|{dim}={value}", 100.0 * sum(correct) / len(correct), len(correct))
    return metrics


def depth_bin(depth: float | None) -> int | None:
    """A measured depth (0..1) as the nearest of the nominal grid 0/25/50/75/100 (%)."""
    if depth is None or pd.isna(depth):
        return None
    return int(25 * round(float(depth) * 4))


def score(opts: Options, generations: Sequence[Mapping]) -> tuple[list, list]:
    """Items (one per generation, with its failure class) and metric rows per (setting,
    lang = q-c, model): accuracy (by the ``scoring`` option), exact and containment accuracy
    with Wilson 95% intervals, the failure classes, hit rate of the target (CROSS), input
    reduction, refused prompts; accuracy also by length, by measured depth (nearest 25 %)
    and by nominal position (``accuracy|length=2k``, ``accuracy|depth=50``,
    ``accuracy|position=50``)."""
    items = score_items(opts, generations)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for item in items:
        groups[(item["setting"], item["lang"], item["model"])].append(item)
    metrics = []
    for (setting, lang, model), group in sorted(groups.items(),
                                                key=lambda kv: tuple(map(str, kv[0]))):
        metrics += _group_metrics(setting, lang, model, group)
    return items, metrics
