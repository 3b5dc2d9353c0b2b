"""BordIRLines' scoring: generations -> items (the chosen claimant of each answer) and the
metrics: BorderLines' concurrence scores with bootstrap intervals, the RANDOM row, the
error counts, and the citation analysis' citation and inclusion rates."""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from xling.studies.bordirlines.data import BorderLines, Territory, borderlines_of, \
    load_queries, shown_hits
from xling.studies.bordirlines.options import STUDY, Options, split_setting
from xling.studies.bordirlines.parse import map_option


@dataclass
class _TerritoryCS:
    """One territory's contribution to the CS metrics of one (model, setting)."""

    unknown: bool
    kb: float  # nan: not counted
    control: float
    non: float  # mean over non-controller-language responses
    cons: float  # mean over response pairs
    n_countries: int
    n_countries_en: int
    n_queries: int


def _territory_cs(territory: Territory, responses: dict[str, str], response_en: str | None
                  ) -> _TerritoryCS:
    """The per-territory terms of BorderLines' concurrence scores (Li et al. 2024, Sec. 4;
    calculate_CS.py). ``responses``: {claimant language: chosen claimant} (Responses_d);
    ``response_en``: the English control answer (Response_en)."""
    nan = math.nan
    kb = control = non = nan
    if territory.known:
        # KB CS: does the English control answer name the controller?
        if response_en is not None:
            kb = float(response_en == territory.controller)
        # Control CS: the answer in the controller's language; Non-control CS: the mean over
        # the answers in the other claimant languages.
        others = []
        for lang, claim in responses.items():
            if territory.controller_lang and lang == territory.controller_lang:
                control = float(claim == territory.controller)
            else:
                others.append(claim == territory.controller)
        if others:
            non = sum(others) / len(others)
    # Consistency CS: agreement over all pairs of claimant-language answers.
    pairs = [a == b for a, b in itertools.combinations(responses.values(), 2)]
    cons = sum(pairs) / len(pairs) if pairs else nan
    with_en = dict(responses)
    if response_en is not None:
        with_en["en"] = response_en
    return _TerritoryCS(unknown=not territory.known, kb=kb, control=control, non=non, cons=cons,
                        n_countries=len(set(responses.values())),
                        n_countries_en=len(set(with_en.values())), n_queries=len(with_en))


_TERM_FIELDS = ("kb", "control", "non", "cons", "n_countries", "n_countries_en")


def _cs_stats(rows: list[_TerritoryCS]) -> dict[str, tuple[float | None, int]]:
    """The CS metrics of a list of territories: {name: (value, n)}; the field names of
    BorderLines' calculate_CS.py output."""
    columns = {f: np.array([getattr(r, f) for r in rows], dtype=float) for f in _TERM_FIELDS}
    unknown = np.array([r.unknown for r in rows], dtype=bool)

    def mean(x):
        x = x[~np.isnan(x)]
        return (float(x.mean()) if x.size else None), int(x.size)

    kb, control, non = mean(columns["kb"]), mean(columns["control"]), mean(columns["non"])
    cons_all, cons_unk = mean(columns["cons"]), mean(columns["cons"][unknown])
    out = {"num_queries": (float(sum(r.n_queries for r in rows)), len(rows)),
           "num_territories": (float(len(rows)), len(rows)),
           "KB CS": kb, "Control CS": control, "Non-control CS": non}
    # Delta CS = (Control CS - Non-control CS) / Non-control CS; unnormalized: the difference.
    if control[0] is not None and non[0] is not None:
        difference = control[0] - non[0]
        out["Delta CS"] = (difference / non[0] if non[0] else None, non[1])
        out["Delta CS unnormalized"] = (difference, non[1])
    else:
        out["Delta CS"] = out["Delta CS unnormalized"] = (None, 0)
    out["Consistency CS unk"] = cons_unk
    out["Consistency CS unk rows"] = (float(cons_unk[1]), cons_unk[1])
    out["Consistency CS all"] = cons_all
    out["Consistency CS all rows"] = (float(cons_all[1]), cons_all[1])
    n_rows = len(rows)
    for key, field in (("Response Countries", "n_countries"),
                       ("Response Countries + en", "n_countries_en")):
        counts = columns[field]
        out[f"{key} mean"] = (float(counts.mean()) if n_rows else None, n_rows)
        # pandas' Series.std(): the sample standard deviation (ddof=1)
        out[f"{key} σ"] = (float(counts.std(ddof=1)) if n_rows > 1 else None, n_rows)
    return out


def _bootstrap(rows: list[_TerritoryCS], n_boot: int, seed: int = 0
               ) -> dict[str, tuple[float, float]]:
    """95% percentile intervals of the CS metrics, resampling territories."""
    if n_boot <= 0 or len(rows) < 2:
        return {}
    rng = np.random.default_rng(seed)
    columns = {f: np.array([getattr(r, f) for r in rows], dtype=float) for f in _TERM_FIELDS}
    columns["cons_unk"] = np.where([r.unknown for r in rows], columns["cons"], np.nan)
    samples = rng.integers(0, len(rows), size=(n_boot, len(rows)))

    def nanmean(x):
        s = x[samples]
        cnt = (~np.isnan(s)).sum(axis=1)
        tot = np.nansum(s, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)

    estimates = {
        "KB CS": nanmean(columns["kb"]), "Control CS": nanmean(columns["control"]),
        "Non-control CS": nanmean(columns["non"]),
        "Consistency CS all": nanmean(columns["cons"]),
        "Consistency CS unk": nanmean(columns["cons_unk"]),
        "Response Countries mean": columns["n_countries"][samples].mean(axis=1),
        "Response Countries + en mean": columns["n_countries_en"][samples].mean(axis=1)}
    with np.errstate(invalid="ignore", divide="ignore"):
        estimates["Delta CS unnormalized"] = (estimates["Control CS"]
                                              - estimates["Non-control CS"])
        estimates["Delta CS"] = np.where(
            estimates["Non-control CS"] != 0,
            estimates["Delta CS unnormalized"] / estimates["Non-control CS"], np.nan)
    out = {}
    for name, values in estimates.items():
        values = values[np.isfinite(values)]
        if values.size:
            lo, hi = np.percentile(values, [2.5, 97.5])
            out[name] = (float(lo), float(hi))
    return out


def _metric(setting, lang, model, metric, value, n, ci=None) -> dict:
    return {"study": STUDY, "setting": setting, "lang": lang, "model": model, "metric": metric,
            "value": None if value is None else float(value),
            "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None, "n": int(n)}


def _cited_numbers(parsed: Mapping) -> list[int]:
    nums: list[int] = []
    for key in ("cited", "cited_text"):
        val = parsed.get(key)
        if isinstance(val, str) and val:
            nums += [int(x) for x in re.findall(r"\d+", val)]
    return list(dict.fromkeys(nums))


# What an answer that names no claimant counts as under `unparsed: authors`: the authors'
# gen_response_table.py (manestay/bordIRlines @ de66e19) writes Response "None" for it.
NO_ANSWER = "None"
# An item's outcome (its `outcome` column, counted per cell and in the evaluate manifest):
# scored (names a claimant), unparsed (an output that names none), failed (no output: the
# call or its prompt failed), invalid (a query or territory the data does not have).
OUTCOMES = ("scored", "unparsed", "failed", "invalid")


def _item(opts: Options, borderlines: BorderLines, queries: dict, gen: Mapping) -> dict:
    """One generation's item: its territory, chosen option and claimant, or its error, and
    its outcome (OUTCOMES)."""
    query = queries.get(str(gen.get("item_id")))
    territory = borderlines.territory(query["territory"]) if query else None
    parsed = gen.get("parsed")
    item = {"item_id": gen.get("item_id"), "study": STUDY, "setting": gen.get("setting"),
            "lang": gen.get("lang"), "model": gen.get("model"),
            "territory": territory.name if territory else (query or {}).get("territory"),
            "option": None, "claimant": None, "outcome": "scored", "error": None,
            "_parsed": parsed}
    if query is None:
        item["error"] = f"unknown query id {gen.get('item_id')!r} (not in queries.tsv)"
        item["outcome"] = "invalid"
    elif territory is None:
        item["error"] = f"territory {query['territory']!r} is not in the BorderLines table"
        item["outcome"] = "invalid"
    elif gen.get("output") is None:  # the call failed, or its prompt could not be built
        item["error"] = str(gen.get("error") or "no output")
        item["outcome"] = "failed"
    elif not isinstance(parsed, Mapping):  # an output the parser could not read
        item["error"] = str(gen.get("error") or "no parsed output")
        item["outcome"] = "unparsed"
    else:
        option = parsed.get("option") or parsed.get("answer")
        item["option"] = option
        claimant = map_option(option, query["lang"], territory.name, opts) if option else None
        if claimant is None:
            item["error"] = (f"cannot map the chosen option {option!r} to a claimant of "
                             f"{territory.name}")
            item["outcome"] = "unparsed"
        else:
            item["claimant"] = claimant
    return item


def score(opts: Options, generations: Iterable[Mapping]) -> tuple[list[dict], list[dict]]:
    """Items and metrics of BordIRLines generations (the answers are multiple-choice: no
    judge).

    ``generations``: dicts with ``item_id`` (query_id), ``setting``, ``lang``, ``model``,
    ``parsed`` (the parser's dict, or None), ``output`` and ``error``.

    Items: one row per generation with the ``territory``, the chosen ``option`` text, the
    canonical ``claimant``, its ``outcome`` (OUTCOMES) and an ``error`` (the generation's
    own, or "cannot map the chosen option ..."). An unparsed answer (an output that names no
    claimant) counts in the CS metrics as the authors' code counts it (option ``unparsed:
    authors``: see `_response`) or is left out (``unparsed: drop``); failed and invalid
    items are left out (the authors' code has no row for a query without a response).

    Metrics (``lang`` "all" unless said), per (model, setting):

    * the BorderLines concurrence scores over the territories with at least one mapped
      answer (all of them in a full run, as in calculate_CS.py), under its names:
      ``KB CS``, ``Control CS``, ``Non-control CS``, ``Delta CS``, ``Delta CS unnormalized``,
      ``Consistency CS all``/``unk`` (+ ``rows``), ``Response Countries mean``/``σ`` (+ ``en``
      variants), ``num_queries``, ``num_territories``; fractions in [0, 1]; 95% bootstrap
      intervals over territories for the means;
    * per query language and "all": the ``unparsed``, ``failed`` and ``invalid`` counts
      (n = generations);
    * model ``RANDOM``, setting ``random``: the expected CS metrics of an answer drawn
      uniformly from the options (1/k per territory with k claimants), over the territories
      and languages of the run's queries: the paper's RANDOM row (Table 4);
    * for citation settings, the paper's citation analysis (bordirlines.txt L140-142): per
      answer, the inclusion rate nr(l) = share of the prompt's passages in language l and
      the citation rate cr(l) = share of the cited passages (``Cited Documents`` and
      ``<docN>`` in the explanation, distinct ids) in l; per query language, both averaged
      over its queries ("We assign a cr and nr to a language by averaging over all its
      queries"): ``citation_rate:<l>`` / ``inclusion_rate:<l>``, and ``citation_rate:qlang``
      / ``inclusion_rate:qlang`` for l = the query language (Fig. 4); n = queries. The
      queries are those with a parsed answer that cites at least one shown passage (the
      others: ``no_citations``); ``invalid_citations`` counts ids outside 0..K-1. Under
      "all", the ``qlang`` rates averaged over the query languages (n = languages).
    """
    borderlines = borderlines_of(opts)
    queries = load_queries(opts.data)
    items = [_item(opts, borderlines, queries, gen) for gen in generations]
    metrics: list[dict] = []
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for item in items:
        groups[(item["model"], item["setting"])].append(item)
    for (model, setting), group in groups.items():
        metrics += _cs_metrics(opts, borderlines, queries, model, setting, group)
        metrics += _count_metrics(model, setting, group)
        try:
            mode, prompt = split_setting(setting)
        except ValueError:
            continue
        if prompt == "citation" and mode != "no_ir":
            metrics += _citation_metrics(opts, queries, model, setting, mode, group)
    if items:
        metrics += random_metrics(opts, borderlines, queries)
    out_items = [{k: v for k, v in item.items() if not k.startswith("_")} for item in items]
    return out_items, metrics


def _response(opts: Options, item: dict, territory: Territory, qlang: str
              ) -> tuple[str | None, str | None]:
    """(the English control response, the claimant-language response) an item gives its
    territory's response set; None where it gives none. An unparsed answer gives what the
    authors' gen_response_table.py makes of it (`unparsed: authors`): Response_en "None",
    Pick = the first claimant; with `unparsed: drop` nothing."""
    claimant = item["claimant"]
    if claimant is None:
        if item["outcome"] != "unparsed" or opts.unparsed != "authors":
            return None, None
        en, claim = NO_ANSWER, territory.claimants[0]
    else:
        en = claim = claimant
    return (en if qlang == "en" else None,
            claim if qlang in territory.claimant_langs else None)


def _cs_metrics(opts, borderlines, queries, model, setting, items) -> list[dict]:
    # Territories in scope: those with at least one answer in their response set (in a full
    # run, every territory, as in calculate_CS.py; a territory whose answers all failed is
    # left out rather than counted as 0 response countries).
    responses: dict[str, dict[str, str]] = defaultdict(dict)
    response_en: dict[str, str] = {}
    scope: list[str] = []
    for item in items:
        territory = borderlines.territory(item["territory"]) if item["territory"] else None
        if territory is None or item["outcome"] in ("failed", "invalid"):
            continue
        qlang = queries[str(item["item_id"])]["lang"]
        en, claim = _response(opts, item, territory, qlang)
        if en is None and claim is None:
            continue
        if territory.name not in scope:
            scope.append(territory.name)
        if en is not None:  # the control query (also the claimant query of English claimants)
            response_en[territory.name] = en
        if claim is not None:
            responses[territory.name].setdefault(qlang, claim)
    rows = [_territory_cs(borderlines.territories[t], responses.get(t, {}), response_en.get(t))
            for t in scope]
    stats = _cs_stats(rows)
    intervals = _bootstrap(rows, opts.bootstrap)
    return [_metric(setting, "all", model, name, value, n, intervals.get(name))
            for name, (value, n) in stats.items()]


def _count_metrics(model, setting, items) -> list[dict]:
    """Per query language and "all": how many answers had each outcome (n = answers), so
    that no answer leaves the CS metrics' denominators unseen."""
    by_lang: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_lang[item["lang"]].append(item)
    out = []
    for lang, group in [("all", items)] + sorted(by_lang.items(), key=lambda x: str(x[0])):
        for outcome in OUTCOMES[1:]:
            out.append(_metric(setting, lang, model, outcome,
                               sum(1 for it in group if it["outcome"] == outcome), len(group)))
    return out


def random_metrics(opts: Options, borderlines: BorderLines, queries: dict) -> list[dict]:
    """The paper's RANDOM row: the expected CS metrics of a uniformly random option, over
    the territories of the run's queries (the query languages in ``opts.langs``). Each
    expected concurrence is 1/k for a territory with k claimants (a random answer names the
    controller, or agrees with another random answer, with probability 1/k); each metric
    keeps the scope it has for a model: KB over known controllers with an English query,
    Control over those with a controller-language query, Non over those with another
    claimant-language query, consistency over territories with two or more claimant-
    language queries."""
    langs_of: dict[str, set[str]] = defaultdict(set)
    for query in queries.values():
        territory = borderlines.territory(query["territory"])
        if territory is not None and query["lang"] in opts.langs:
            langs_of[territory.name].add(query["lang"])
    nan = math.nan
    rows = []
    for name, langs in langs_of.items():
        territory = borderlines.territories[name]
        chance = 1.0 / len(territory.claimants)
        claim = [lang for lang in territory.langs() if lang in langs]
        known = territory.known
        rows.append(_TerritoryCS(
            unknown=not known, kb=chance if known and "en" in langs else nan,
            control=chance if known and territory.controller_lang in claim else nan,
            non=chance if known and any(lang != territory.controller_lang for lang in claim)
            else nan,
            cons=chance if len(claim) >= 2 else nan, n_countries=0, n_countries_en=0,
            n_queries=len(langs)))
    stats = _cs_stats(rows)
    keep = ("KB CS", "Control CS", "Non-control CS", "Delta CS", "Delta CS unnormalized",
            "Consistency CS unk", "Consistency CS all", "num_territories")
    return [_metric("random", "all", "RANDOM", k, stats[k][0], stats[k][1]) for k in keep]


def _citation_shares(opts, queries, mode, items):
    """Per query language: one (nr, cr) pair of {doc_lang: share} per answer citing a shown
    passage; and per query language the ids outside the shown passages, the answers citing
    none, and the answers counted."""
    per_lang: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    invalid: dict[str, int] = defaultdict(int)
    uncited: dict[str, int] = defaultdict(int)
    answers: dict[str, int] = defaultdict(int)
    for item in items:
        parsed = item["_parsed"]
        query = queries.get(str(item["item_id"]))
        if (item["outcome"] in ("failed", "invalid") or not isinstance(parsed, Mapping)
                or query is None):
            continue
        hits, err = shown_hits(opts, mode, query)
        if err:
            continue
        lang = query["lang"]
        answers[lang] += 1
        cited = _cited_numbers(parsed)
        valid = [n for n in cited if 0 <= n < len(hits)]  # ids count from 0, as in the prompt
        invalid[lang] += len(cited) - len(valid)
        if not valid:
            uncited[lang] += 1
            continue
        nr: dict[str, float] = defaultdict(float)
        for h in hits:
            nr[h["doc_lang"]] += 1 / len(hits)
        cr: dict[str, float] = defaultdict(float)
        for n in valid:
            cr[hits[n]["doc_lang"]] += 1 / len(valid)
        per_lang[lang].append((nr, cr))
    return per_lang, invalid, uncited, answers


def _citation_metrics(opts, queries, model, setting, mode, items) -> list[dict]:
    per_lang, invalid, uncited, answers = _citation_shares(opts, queries, mode, items)
    out = []
    own_cr, own_nr = [], []
    for lang in sorted(answers):
        pairs = per_lang.get(lang, [])
        n_pairs = len(pairs)
        if n_pairs:
            for doc_lang in sorted({dl for nr, _ in pairs for dl in nr}):
                out.append(_metric(setting, lang, model, f"inclusion_rate:{doc_lang}",
                                   sum(nr.get(doc_lang, 0.0) for nr, _ in pairs) / n_pairs,
                                   n_pairs))
                out.append(_metric(setting, lang, model, f"citation_rate:{doc_lang}",
                                   sum(cr.get(doc_lang, 0.0) for _, cr in pairs) / n_pairs,
                                   n_pairs))
            nr_own = sum(nr.get(lang, 0.0) for nr, _ in pairs) / n_pairs
            cr_own = sum(cr.get(lang, 0.0) for _, cr in pairs) / n_pairs
            own_nr.append(nr_own)
            own_cr.append(cr_own)
            out.append(_metric(setting, lang, model, "inclusion_rate:qlang", nr_own, n_pairs))
            out.append(_metric(setting, lang, model, "citation_rate:qlang", cr_own, n_pairs))
        out.append(_metric(setting, lang, model, "no_citations", uncited[lang], answers[lang]))
        out.append(_metric(setting, lang, model, "invalid_citations", invalid[lang],
                           answers[lang]))
    if answers:
        n_langs = len(own_cr)
        out.append(_metric(setting, "all", model, "inclusion_rate:qlang",
                           sum(own_nr) / n_langs if n_langs else None, n_langs))
        out.append(_metric(setting, "all", model, "citation_rate:qlang",
                           sum(own_cr) / n_langs if n_langs else None, n_langs))
        out.append(_metric(setting, "all", model, "no_citations", sum(uncited.values()),
                           sum(answers.values())))
        out.append(_metric(setting, "all", model, "invalid_citations", sum(invalid.values()),
                           sum(answers.values())))
    return out
