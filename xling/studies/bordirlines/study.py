"""BordIRLines: cross-lingual RAG on territorial disputes (loaders, prompts, parsers, metrics).

BordIRLines (Li et al., "BordIRlines: A Dataset for Evaluating Cross-lingual
Retrieval-Augmented Generation", 2024; extended as "Multilingual Retrieval Augmented
Generation for Culturally-Sensitive Tasks", ACL Findings 2025, arXiv:2410.01171) asks an
LLM which country owns a disputed territory, in the language of each claimant and in English,
with Wikipedia passages retrieved in several ways. It builds on BorderLines (Li et al., "This
Land is {Your, My} Land", NAACL 2024), whose territory table, 49-language queries and
consistency scores (CS) it reuses.

Data this module reads:

* the BorderLines table, packaged in ``xling/tasks/data/borderlines`` (``territories``
  option): ``disputed_territories.csv``, ``countries_info.json`` and ``queries/``. Line *i* of
  ``queries/{prompts,choices}.<lang>`` belongs to the *i*-th CSV territory (CSV order) with a
  claimant whose ``Lang_Code`` is ``<lang>``; English, the control language, has every
  territory in ``prompts_q_mc.txt``/``choices.txt``;
* the BordIRLines hub layout (``data`` option): ``queries.tsv`` (``query_id, query_text,
  territory, language``), hits ``data/<lang>/<openai|m3>/<mode>/<lang>_query_hits.tsv``
  (``query_id, territory, rank, score, doc_id, doc_lang``; the English control queries may also
  sit under ``data/control/<retriever>/<mode>/control_query_hits.tsv``) and the passages
  ``{lang: {doc_id: text}}`` (``docs`` option).

Retrieval modes (the paper's Table 1 and the code's ``--retrieval_over``): ``no_ir`` (no
passages), ``qlang`` (passages in the query's language), ``rel_langs`` (in the query's
language, English and the other relevant languages), ``qlang_en`` (query language +
English), ``en`` (English only) and ``swap`` (the ablation ``swap_docs``/``ablate_swap``: the
``qlang`` passages of the *next* claimant language's query of the same territory, so e.g. the
Russian query sees the Ukrainian passages). The hits are the hub's, per retriever; the
default is ``openai`` (text-embedding-3-large), the retriever of the paper's main results
(bordirlines.txt L123).

Prompts (:data:`PROMPT_TEMPLATES`, ``bordirlines_prompts.yaml``): the paper's Table 5
verbatim (bordirlines.txt L483-493). ``direct`` (the system prompt, documents as ``Document:
i`` / ``Text:`` with 0-based ids, the instruction, the query, the lettered options,
``Answer:``) is the format of every CS metric of the paper (Fig. 3, Table 4: "in the direct
answer format", L477) and the default. ``citation`` is Command-R's grounded-generation prompt
(System and User Preamble as the system message; ``Cited Documents:``, ``Chosen Option:``,
``Explanation:`` with ``<docN>`` citations, N from 0), the format of the citation analysis
(Section 5.2, Fig. 4). ``no_ir`` has no passages to cite, so it is always run with the direct
prompt (setting ``no_ir-direct``), as in the original code, which refuses citation without
documents.

Metrics (:func:`score`): the BorderLines concurrence scores, computed as the original
``calculate_CS.py`` does and under its field names (``KB CS``, ``Control CS``, ``Non-control
CS``, ``Delta CS``...), per (model, setting) over territories, and the expected scores of a
uniformly random answer (the paper's RANDOM row); plus, for citation settings, the paper's
citation rate (cr) and inclusion rate (nr) per document language, computed per query and
averaged over the queries of each query language (L140-142). :func:`tables` prints Table 4
(rows model x IR mode) with the published numbers of ``configs/bordirlines.expected.yaml``
beside xling's where the model, mode, prompt and retriever match.
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from xling.tasks.languages import UnknownLanguageError, validate_languages

__all__ = [
    "MODES",
    "PROMPTS",
    "PROMPT_TEMPLATES",
    "RETRIEVERS",
    "STUDY",
    "check_options",
    "input_files",
    "load_borderlines",
    "load_docs",
    "load_hits",
    "load_published",
    "load_queries",
    "map_option",
    "parse_citation",
    "parse_direct",
    "parser_for",
    "prompt_cells",
    "build_prompts",
    "render_citation",
    "render_direct",
    "score",
    "tables",
]

STUDY = "bordirlines"
MODES = ("no_ir", "qlang", "rel_langs", "qlang_en", "en", "swap")
PROMPTS = ("direct", "citation")
RETRIEVERS = ("openai", "m3")

PACKAGED = Path(__file__).resolve().parent / "data"
UNKNOWN = "Unknown"  # the table's Controller for territories without a controller
LETTERS = "ABCDEFGH"  # the original's option letters (LETTERS_MC = "A)".."H)")

# Directory of each mode's hits in the hub layout; swap re-uses the qlang hits.
_HITS_MODE = {"qlang": "qlang", "rel_langs": "rel_langs", "qlang_en": "qlang_en", "en": "en",
              "swap": "qlang"}

DEFAULTS = {
    # The paper's main results use OpenAI embeddings (text-embedding-3-large): "We mainly
    # report results using OpenAI embeddings" (bordirlines.txt L123); M3 is the alternative.
    "retriever": "openai",
    "modes": ["no_ir", "qlang", "rel_langs"],
    # Every CS metric of the paper (Fig. 3, Table 4) is computed on the direct format
    # (L146, L477); citation is the format of the citation analysis (Section 5.2).
    "prompts": ["direct"],
    # The paper's generation runs use the top 10 passages per query (generation.py
    # --num_paragraphs default 10; the hub README loads n_hits=10).
    "k": 10,
    "max_doc_words": 300,
    "bootstrap": 1000,
    "expected": None,
}
OPTION_KEYS = ("data", "docs", "retriever", "modes", "prompts", "langs", "k", "territories",
               "max_doc_words", "bootstrap", "expected")

# The paper's Table 5 prompts (bordirlines_prompts.yaml; each text cites its line of
# papers/bordirlines.txt there).
PROMPT_TEMPLATES: dict[str, str] = yaml.safe_load(
    (Path(__file__).with_name("prompts.yaml")).read_text("utf-8"))
# The system prompt of the direct format ("System Prompt", Table 5, bordirlines.txt L484).
SYSTEM_PROMPT = PROMPT_TEMPLATES["system"]


def _err(key: str, what: str, fix: str) -> ValueError:
    return ValueError(f"study.options.{key}: {what}; {fix}")


# ======================================================================================
# BorderLines: territories, countries, 49-language queries
# ======================================================================================


@dataclass(frozen=True)
class Territory:
    """One row of ``disputed_territories.csv``; ``claimant_langs[i]`` is the query language
    of ``claimants[i]`` ("" for a country missing from ``countries_info.json``)."""

    name: str
    claimants: tuple[str, ...]
    controller: str
    region: str
    query_en: str
    claimant_langs: tuple[str, ...]
    controller_lang: str  # "" when unknown (Controller "Unknown" or not in countries_info)

    @property
    def known(self) -> bool:
        return self.controller != UNKNOWN

    def langs(self) -> list[str]:
        """The distinct claimant languages in claimant order."""
        return list(dict.fromkeys(c for c in self.claimant_langs if c))


@dataclass(frozen=True)
class BorderLines:
    root: Path
    territories: dict[str, Territory]  # CSV order
    countries: dict[str, str]  # country -> Lang_Code
    # lang -> territory -> (query text, options in claimant order)
    queries: dict[str, dict[str, tuple[str, tuple[str, ...]]]]

    def territory(self, name: str) -> Territory | None:
        t = self.territories.get(name)
        if t is None and "_" in name:
            t = self.territories.get(name.replace("_", " "))
        return t

    def options(self, lang: str, territory: str) -> tuple[str, ...] | None:
        q = self.queries.get(lang, {}).get(territory)
        return q[1] if q else None


# countries_info.json (borderlines @ 5de2146) lacks Suriname, a claimant of 4 territories
# (French Guiana, Marouini River, Tigri Area, Courantyne River); the 4 lines of
# queries/prompts.nl are exactly those territories' queries, so its language is Dutch.
_MISSING_COUNTRIES = {"Suriname": "nl"}


def _read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f if line.strip()]


@functools.lru_cache(maxsize=8)
def _load_borderlines(root: str) -> BorderLines:
    base = Path(root)
    with open(base / "countries_info.json", encoding="utf-8") as f:
        info = json.load(f)
    countries = {**_MISSING_COUNTRIES, **{c: v["Lang_Code"] for c, v in info.items()}}
    territories: dict[str, Territory] = {}
    with open(base / "disputed_territories.csv", encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            claimants = tuple(c.strip() for c in row["Claimants"].split(";") if c.strip())
            ctrl = row["Controller"].strip()
            territories[row["Territory"]] = Territory(
                name=row["Territory"], claimants=claimants, controller=ctrl,
                region=row.get("Region", ""), query_en=row.get("Query", ""),
                claimant_langs=tuple(countries.get(c, "") for c in claimants),
                controller_lang=countries.get(ctrl, "") if ctrl != UNKNOWN else "")
    order = list(territories.values())
    queries: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {}
    qdir = base / "queries"
    for p in sorted(qdir.glob("prompts.*")):
        lang = p.suffix[1:]
        if lang == "txt":
            continue
        prompts = _read_lines(p)
        choices = [tuple(json.loads(x)) for x in _read_lines(qdir / f"choices.{lang}")]
        owners = [t for t in order if lang in t.claimant_langs]
        if not (len(prompts) == len(choices) == len(owners)):
            raise ValueError(
                f"{p}: {len(prompts)} queries and {len(choices)} option lists, but "
                f"{len(owners)} territories have a claimant whose language is {lang!r}; the "
                f"query files must have one line per such territory, in table order")
        queries[lang] = {t.name: (q, c) for t, q, c in zip(owners, prompts, choices)}
    # English is the control language: every territory, from prompts_q_mc.txt/choices.txt.
    en_q, en_c = _read_lines(qdir / "prompts_q_mc.txt"), _read_lines(qdir / "choices.txt")
    if not (len(en_q) == len(en_c) == len(order)):
        raise ValueError(f"{qdir}: prompts_q_mc.txt/choices.txt must have one line per "
                         f"territory ({len(order)}), not {len(en_q)}/{len(en_c)}")
    queries["en"] = {t.name: (q, tuple(json.loads(c))) for t, q, c in zip(order, en_q, en_c)}
    return BorderLines(base, territories, countries, queries)


def _territory_root(path: str | os.PathLike | None) -> Path:
    p = Path(path) if path else PACKAGED
    return p.parent if p.is_file() else p


def load_borderlines(territories: str | os.PathLike | None = None) -> BorderLines:
    """The BorderLines table, countries and queries (``territories``: a BorderLines data
    directory, or its ``disputed_territories.csv``; default: the packaged copy)."""
    return _load_borderlines(str(_territory_root(territories).resolve()))


def _bl(opts: Mapping | None) -> BorderLines:
    return load_borderlines((opts or {}).get("territories"))


# ======================================================================================
# BordIRLines hub layout: queries.tsv, hits, docs
# ======================================================================================


def _stamp(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_mtime_ns, st.st_size


_QUERY_COLS = ("query_id", "query_text", "territory", "language")
_HIT_COLS = ("query_id", "territory", "rank", "score", "doc_id", "doc_lang")


def _tsv_rows(path: Path, cols: tuple[str, ...]) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [c for c in cols if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; the header must be "
                             f"{chr(9).join(cols)!r} (tab separated)")
        return list(reader)


@functools.lru_cache(maxsize=4)
def _load_queries(stamp: tuple) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for row in _tsv_rows(Path(stamp[0]), _QUERY_COLS):
        lang = row["language"].strip()
        if lang == "control":  # the hub's name for the English control queries
            lang = "en"
        qid = row["query_id"].strip()
        if qid and qid not in out:
            out[qid] = {"query_id": qid, "text": row["query_text"],
                        "territory": row["territory"].strip(), "lang": lang}
    return out


def queries_file(data: str | os.PathLike) -> Path:
    """The ``queries.tsv`` of a hub-layout directory: ``<data>/queries.tsv``, or
    ``<data>/data/queries.tsv`` where the hub's writer (parse_search_results.py) puts it,
    next to ``all_docs.json`` and the hits."""
    top = Path(data) / "queries.tsv"
    nested = Path(data) / "data" / "queries.tsv"
    return nested if not top.is_file() and nested.is_file() else top


def load_queries(data: str | os.PathLike) -> dict[str, dict]:
    """``queries.tsv`` -> {query_id: {query_id, text, territory, lang}} in file order
    (language ``control`` is read as ``en``; a repeated query_id keeps its first row)."""
    return _load_queries(_stamp(queries_file(data)))


def _hits_paths(data: Path, lang: str, retriever: str, mode_dir: str) -> list[Path]:
    paths = [data / "data" / lang / retriever / mode_dir / f"{lang}_query_hits.tsv"]
    if lang == "en":
        paths.append(data / "data" / "control" / retriever / mode_dir / "control_query_hits.tsv")
    return paths


@functools.lru_cache(maxsize=64)
def _load_hits_file(stamp: tuple) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    path = Path(stamp[0])
    for n, row in enumerate(_tsv_rows(path, _HIT_COLS), 2):
        try:
            rank, score = int(row["rank"]), float(row["score"])
        except ValueError as e:
            raise ValueError(f"{path}:{n}: bad rank/score ({e})") from None
        out[row["query_id"].strip()].append(
            {"doc_id": row["doc_id"].strip(), "doc_lang": row["doc_lang"].strip(),
             "rank": rank, "score": score})
    for hits in out.values():
        hits.sort(key=lambda h: h["rank"])
    return dict(out)


@functools.lru_cache(maxsize=64)
def _merge_hits(stamps: tuple) -> dict[str, list]:
    merged: dict[str, list] = {}
    for stamp in stamps:
        for qid, hits in _load_hits_file(stamp).items():
            merged.setdefault(qid, hits)
    return merged


def load_hits(data: str | os.PathLike, lang: str, retriever: str, mode: str) -> dict[str, list]:
    """Hits of the ``lang`` queries in one mode: {query_id: [{doc_id, doc_lang, rank, score}]}
    sorted by rank (shared, cached lists: do not modify). For English,
    ``data/control/...`` adds the control queries that ``data/en/...`` does not have. A
    missing file is no hits."""
    paths = _hits_paths(Path(data), lang, retriever, _HITS_MODE.get(mode, mode))
    return _merge_hits(tuple(_stamp(p) for p in paths if p.is_file()))


@functools.lru_cache(maxsize=2)
def _load_docs(stamp: tuple) -> dict[str, tuple[str, str]]:
    with open(stamp[0], encoding="utf-8") as f:
        obj = json.load(f)
    if not isinstance(obj, dict):
        raise ValueError(f"{stamp[0]}: expected a JSON object {{lang: {{doc_id: text}}}}")
    out: dict[str, tuple[str, str]] = {}
    for lang, docs in obj.items():
        if not isinstance(docs, dict):
            raise ValueError(f"{stamp[0]}: the value of {lang!r} must be {{doc_id: text}}")
        for doc_id, text in docs.items():
            out.setdefault(str(doc_id), (lang, text if isinstance(text, str) else str(text)))
    return out


def load_docs(path: str | os.PathLike) -> dict[str, tuple[str, str]]:
    """The passages JSON ``{lang: {doc_id: text}}`` -> {doc_id: (lang, text)}."""
    return _load_docs(_stamp(Path(path)))


# ======================================================================================
# Options
# ======================================================================================


def _as_list(key: str, value, allowed: tuple[str, ...]) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise _err(key, f"must be a non-empty list, not {value!r}",
                   f"choose from {', '.join(allowed)}")
    bad = [v for v in value if v not in allowed]
    if bad:
        raise _err(key, f"unknown value(s) {bad}", f"choose from {', '.join(allowed)}")
    return list(dict.fromkeys(value))


def _as_int(key: str, value, *, minimum: int, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        more = " or null to turn it off" if allow_none else ""
        raise _err(key, f"must be an integer >= {minimum}, not {value!r}",
                   f"give an integer >= {minimum}{more}")
    return value


def check_options(raw: Mapping | None) -> dict:
    """Validate the config's ``study.options`` for BordIRLines and fill in defaults.

    Options:

    * ``data`` (required): directory in the BordIRLines hub layout (``queries.tsv`` and
      ``data/<lang>/<retriever>/<mode>/<lang>_query_hits.tsv``).
    * ``docs``: the passages JSON ``{lang: {doc_id: text}}``; default ``<data>/docs.json``, or
      the hub's ``<data>/data/all_docs.json`` when that is the file present. Needed only
      when a mode other than ``no_ir`` is run.
    * ``retriever``: ``openai`` (default: text-embedding-3-large, the hits of the paper's
      main results, bordirlines.txt L123) or ``m3`` (BGE-M3 hits); the hits of
      ``data/<lang>/<retriever>/<mode>/``.
    * ``modes``: default ``[no_ir, qlang, rel_langs]``; any of :data:`MODES`.
    * ``prompts``: default ``[direct]`` (the format of the paper's CS metrics, Table 4);
      add ``citation`` for the citation analysis (``no_ir`` always uses the direct prompt:
      there is nothing to cite).
    * ``langs``: query languages; default every language in ``queries.tsv``. Codes are
      checked against ``xling/tasks/languages.py`` (``zhs``, ``zht``, ``iw`` as the data
      writes them; aliases such as ``he`` are turned into the data's code).
    * ``k``: passages per prompt, default 10 (the paper's top-10).
    * ``territories``: a BorderLines data directory (or its ``disputed_territories.csv``);
      default the packaged copy in ``xling/tasks/data/borderlines``.
    * ``max_doc_words``: each passage is cut after this many words, default 300 (a word is a
      whitespace-separated token, or one character of a script written without spaces:
      Chinese, Japanese, Thai, Lao, Khmer, Burmese, Tibetan); ``null`` keeps passages whole.
      Wikipedia paragraphs are almost always shorter; the cap bounds a 10-passage prompt.
    * ``bootstrap``: resamples of territories for the 95% percentile intervals of the CS
      metrics, default 1000 (seed 0); 0 turns the intervals off.
    * ``expected``: the paper's published numbers (``configs/bordirlines.expected.yaml``),
      shown beside xling's in :func:`tables`; default none (xling's numbers only).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise _err("(all)", f"must be a mapping, not {type(raw).__name__}",
                   f"write the options as keys: {', '.join(OPTION_KEYS)}")
    unknown = [k for k in raw if k not in OPTION_KEYS]
    if unknown:
        raise _err(str(unknown[0]), f"unknown option(s) {unknown}",
                   f"BordIRLines takes {', '.join(OPTION_KEYS)}")
    opts: dict = {}

    data = raw.get("data")
    if not data or not isinstance(data, (str, os.PathLike)):
        raise _err("data", "missing", "give the directory of the BordIRLines hub data "
                   "(queries.tsv, data/<lang>/<retriever>/<mode>/<lang>_query_hits.tsv)")
    data_p = Path(data).expanduser()
    if not data_p.is_dir():
        raise _err("data", f"{str(data_p)!r} is not a directory",
                   "give the directory that holds queries.tsv and data/")
    if not queries_file(data_p).is_file():
        raise _err("data", f"no queries.tsv in {str(data_p)!r} (nor in its data/)",
                   "point it at the root of the hub layout (queries.tsv with query_id, "
                   "query_text, territory, language)")
    opts["data"] = str(data_p.resolve())

    opts["retriever"] = raw.get("retriever", DEFAULTS["retriever"])
    if opts["retriever"] not in RETRIEVERS:
        raise _err("retriever", f"unknown retriever {opts['retriever']!r}",
                   f"choose from {', '.join(RETRIEVERS)}")
    opts["modes"] = _as_list("modes", raw.get("modes", DEFAULTS["modes"]), MODES)
    opts["prompts"] = _as_list("prompts", raw.get("prompts", DEFAULTS["prompts"]), PROMPTS)
    opts["k"] = _as_int("k", raw.get("k", DEFAULTS["k"]), minimum=1)
    opts["max_doc_words"] = _as_int("max_doc_words",
                                    raw.get("max_doc_words", DEFAULTS["max_doc_words"]),
                                    minimum=1, allow_none=True)
    opts["bootstrap"] = _as_int("bootstrap", raw.get("bootstrap", DEFAULTS["bootstrap"]),
                                minimum=0)
    expected = raw.get("expected")
    if expected:
        exp_p = Path(expected).expanduser()
        if not exp_p.is_file():
            raise _err("expected", f"{str(exp_p)!r} does not exist",
                       "give configs/bordirlines.expected.yaml (the paper's numbers) or null")
        try:
            load_published(exp_p)
        except (ValueError, yaml.YAMLError) as e:
            raise _err("expected", f"cannot read {str(exp_p)!r} ({e})",
                       "use the layout of configs/bordirlines.expected.yaml") from None
        opts["expected"] = str(exp_p.resolve())
    else:
        opts["expected"] = None

    terr = raw.get("territories")
    root = _territory_root(terr)
    for need in ("disputed_territories.csv", "countries_info.json", "queries/choices.txt"):
        if not (root / need).is_file():
            raise _err("territories", f"no {need} in {str(root)!r}",
                       "give a BorderLines data directory (disputed_territories.csv, "
                       "countries_info.json, queries/) or leave it out for the packaged copy")
    # The packaged copy stays None: an absolute path would tie every cell's hash to where
    # the checkout lives, so moving or re-cloning it would re-run finished cells.
    opts["territories"] = str(root.resolve()) if terr else None
    try:
        bl = load_borderlines(root)
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        raise _err("territories", f"cannot read the BorderLines data ({e})",
                   "use an unchanged copy of manestay/borderlines' files") from None

    needs_docs = any(m != "no_ir" for m in opts["modes"])
    docs = raw.get("docs")
    if docs:
        docs_p = Path(docs).expanduser()
        if not docs_p.is_file():
            raise _err("docs", f"{str(docs_p)!r} does not exist",
                       "give the passages JSON {lang: {doc_id: text}}")
    else:
        docs_p = data_p / "docs.json"
        if not docs_p.is_file() and (data_p / "data" / "all_docs.json").is_file():
            docs_p = data_p / "data" / "all_docs.json"
        if needs_docs and not docs_p.is_file():
            raise _err("docs", f"no passages file: {str(data_p / 'docs.json')!r} does not "
                       "exist", "give `docs:` (JSON {lang: {doc_id: text}}) or run only "
                       "mode no_ir")
    opts["docs"] = str(docs_p.resolve()) if docs_p.is_file() else None

    try:
        queries = load_queries(data_p)
    except (ValueError, UnicodeDecodeError) as e:
        raise _err("data", f"cannot read queries.tsv ({e})",
                   "use the hub's queries.tsv (tab separated, with a header)") from None
    present = list(dict.fromkeys(q["lang"] for q in queries.values()))
    try:
        validate_languages(present)
    except UnknownLanguageError as e:
        raise _err("data", f"queries.tsv has language codes that xling does not know ({e})",
                   "add them to xling/tasks/languages.py or fix the file") from None
    langs = raw.get("langs")
    if langs is None:
        opts["langs"] = sorted(present)
    else:
        if isinstance(langs, str):
            langs = [langs]
        if not isinstance(langs, (list, tuple)) or not langs:
            raise _err("langs", f"must be a non-empty list of language codes, not {langs!r}",
                       "e.g. [en, ru, uk, zhs]; leave it out for every language")
        try:
            resolved = [lang.code for lang in validate_languages(langs)]
        except UnknownLanguageError as e:
            raise _err("langs", str(e), "use the codes BordIRLines writes (e.g. zhs, zht, "
                       "iw)") from None
        absent = [c for c in resolved if c not in present]
        if absent:
            raise _err("langs", f"no queries in {absent} in queries.tsv",
                       f"choose from {', '.join(sorted(present))}")
        opts["langs"] = list(dict.fromkeys(resolved))
    unknown_t = sorted({q["territory"] for q in queries.values()
                        if bl.territory(q["territory"]) is None})
    if len(unknown_t) == len({q["territory"] for q in queries.values()}):
        raise _err("territories", f"none of the territories of queries.tsv is in "
                   f"{opts['territories']} (e.g. {unknown_t[:3]})",
                   "use the BorderLines table the queries were made from")
    return opts


# ======================================================================================
# Prompts
# ======================================================================================


def _split_setting(setting: str) -> tuple[str, str]:
    mode, _, prompt = setting.rpartition("-")
    if mode not in MODES or prompt not in PROMPTS:
        raise ValueError(f"unknown BordIRLines setting {setting!r}; settings are "
                         f"'<mode>-<prompt>' with mode in {MODES} and prompt in {PROMPTS}")
    return mode, prompt


def _settings(opts: Mapping) -> list[str]:
    out = []
    for mode in opts["modes"]:
        for prompt in opts["prompts"]:
            out.append("no_ir-direct" if mode == "no_ir" else f"{mode}-{prompt}")
    return list(dict.fromkeys(out))


def prompt_cells(opts: Mapping) -> list[dict]:
    """One cell per (setting, query language): settings ``<mode>-<prompt>``."""
    return [{"setting": s, "lang": lang} for s in _settings(opts) for lang in opts["langs"]]


def input_files(opts: Mapping) -> list[str]:
    """The local files the prompts depend on (for input fingerprints)."""
    data = Path(opts["data"])
    bl = _bl(opts)
    files = [queries_file(data), bl.root / "disputed_territories.csv",
             bl.root / "countries_info.json", bl.root / "queries" / "prompts_q_mc.txt",
             bl.root / "queries" / "choices.txt"]
    for lang in opts["langs"]:
        files += [bl.root / "queries" / f"prompts.{lang}", bl.root / "queries" / f"choices.{lang}"]
    modes = [m for m in opts["modes"] if m != "no_ir"]
    if modes and opts.get("docs"):
        files.append(Path(opts["docs"]))
    if "swap" in modes:  # the swap partner can be any claimant language
        hit_langs = sorted({q["lang"] for q in load_queries(data).values()})
    else:
        hit_langs = list(opts["langs"])
    for mode in modes:
        for lang in hit_langs:
            files += _hits_paths(data, lang, opts["retriever"], _HITS_MODE[mode])
    return sorted(dict.fromkeys(str(p) for p in files if p.is_file()))


# One "word" for truncation: a character of a script written without spaces, or a run of
# other non-space characters.
_NOSPACE = ("\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff"
            "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff")
_WORD_RE = re.compile(rf"[{_NOSPACE}]|[^\s{_NOSPACE}]+")


def truncate_words(text: str, max_words: int | None) -> str:
    """``text`` cut after ``max_words`` words (see :func:`check_options`), marked with ' ...'."""
    if not max_words:
        return text
    for n, m in enumerate(_WORD_RE.finditer(text), 1):
        if n == max_words:
            rest = text[m.end():]
            return text if not rest.strip() else text[: m.end()] + " ..."
    return text


def _options_lines(options: Iterable[str]) -> str:
    """The lettered options, one a line, as the authors' get_multiple_choice writes them."""
    return "\n".join(f"{LETTERS[i]}) {o}" for i, o in enumerate(options))


def _fill(template: str, **values: str) -> str:
    # str.replace, one placeholder at a time, in order: a value (a passage, a query) may hold
    # braces or text that looks like a placeholder, and is never filled again.
    out, rest = "", template
    while rest:
        hits = [(rest.find("{" + k + "}"), k) for k in values if "{" + k + "}" in rest]
        if not hits:
            return out + rest
        pos, key = min(hits)
        out += rest[:pos] + values[key]
        rest = rest[pos + len(key) + 2:]
    return out


def _documents(kind: str, texts: list[str]) -> str:
    return "\n\n".join(_fill(PROMPT_TEMPLATES[f"{kind}_document"], document_id=str(i),
                             document_text=t) for i, t in enumerate(texts))


def render_direct(query: str, options: str, docs: list[str] | None) -> list[dict]:
    """The paper's direct prompt (Table 5, bordirlines.txt L484, L486-487) as chat messages:
    the system prompt, then the documents (``Document: 0`` / ``Text: ...``, ids from 0; none
    for ``docs=None``, the no_ir prompt), the instruction, the query, the options, "Answer:".
    ``options``: the lettered lines (:func:`_options_lines`)."""
    t = PROMPT_TEMPLATES
    if docs is None:
        documents, source = "", t["direct_source_no_documents"]
    else:
        documents, source = _documents("direct", docs) + "\n\n", t["direct_source_documents"]
    user = _fill(t["direct"], documents=documents, source=source, query=query, options=options)
    return [{"role": "system", "content": t["system"]}, {"role": "user", "content": user}]


def render_citation(query: str, options: str, docs: list[str]) -> list[dict]:
    """The paper's citation prompt (Table 5, bordirlines.txt L488-491: Command-R's grounded-
    generation prompt) as chat messages: the System and User Preambles as the system message
    (as the authors' code sends it to chat models), then the query, the documents (ids from
    0), the instruction and the options."""
    t = PROMPT_TEMPLATES
    user = _fill(t["citation_user"], query=query, documents=_documents("citation", docs),
                 options=options)
    return [{"role": "system", "content": t["citation_system"]},
            {"role": "user", "content": user}]


def _query_index(opts: Mapping) -> dict[tuple[str, str], dict]:
    """(territory, lang) -> query row (the first in queries.tsv)."""
    return _query_index_of(_stamp(queries_file(opts["data"])), str(_bl(opts).root))


@functools.lru_cache(maxsize=4)
def _query_index_of(stamp: tuple, root: str) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    bl = load_borderlines(root)
    for q in _load_queries(stamp).values():
        t = bl.territory(q["territory"])
        out.setdefault((t.name if t else q["territory"], q["lang"]), q)
    return out


def _shown_hits(opts: Mapping, mode: str, query: dict) -> tuple[list[dict] | None, str | None]:
    """The top-k hits a query's prompt shows in ``mode`` (not no_ir), or an error."""
    bl = _bl(opts)
    terr = bl.territory(query["territory"])
    if terr is None:
        return None, f"territory {query['territory']!r} is not in the BorderLines table"
    src = query
    if mode == "swap":
        # The ablation's partner: the next claimant language (cyclically, in claimant order,
        # among languages that have a query of this territory), as in BordIRLines
        # generation_lib.get_other_lang.
        index = _query_index(opts)
        langs = [lang for lang in terr.langs() if (terr.name, lang) in index]
        if query["lang"] not in langs:
            return None, (f"swap: {query['lang']} is not a claimant language of "
                          f"{terr.name} (claimant languages: {', '.join(langs) or 'none'})")
        if len(langs) < 2:
            return None, f"swap: {terr.name} has only one claimant language ({langs[0]})"
        other = langs[(langs.index(query["lang"]) + 1) % len(langs)]
        src = index[(terr.name, other)]
    hits = load_hits(opts["data"], src["lang"], opts["retriever"], mode).get(src["query_id"])
    if not hits:
        where = f" (the swap partner {src['query_id']})" if src is not query else ""
        return None, (f"no {opts['retriever']} {_HITS_MODE[mode]} hits for "
                      f"{src['query_id']}{where}")
    return hits[: opts["k"]], None


def _translation_maps(translations) -> tuple[dict[str, str], dict[str, str]]:
    """(doc id -> text, query id -> text) from translations rows (id, kind, text) or from
    a mapping {"doc": {...}, "query": {...}} or a flat {id: text} (applied to both)."""
    docs: dict[str, str] = {}
    queries: dict[str, str] = {}
    if not translations:
        return docs, queries
    if isinstance(translations, Mapping):
        if set(translations) <= {"doc", "query"}:
            docs.update(translations.get("doc") or {})
            queries.update(translations.get("query") or {})
        else:
            docs.update(translations)
            queries.update(translations)
        return docs, queries
    for row in translations:
        if row.get("text") is None or row.get("error"):
            continue
        (queries if row.get("kind") == "query" else docs)[str(row["id"])] = row["text"]
    return docs, queries


def build_prompts(opts: Mapping, setting: str, lang: str, *, translations=None) -> list[dict]:
    """Prompt rows for the ``lang`` queries in ``setting``, in ``queries.tsv`` order.

    Rows: ``item_id`` (the query_id), ``study``, ``setting``, ``lang``, ``prompt`` (chat
    messages) and ``error``. A query that cannot be prompted (no hits in the mode, no swap
    partner, a passage missing from the docs file, a territory or options not in the table)
    is a row with an ``error`` and no prompt. ``translations`` (optional) replaces the text of
    passages (rows of kind ``doc``) and queries (kind ``query``) by id: translations rows
    ``{id, kind, text}``, ``{"doc": {id: text}, "query": {id: text}}`` or a flat ``{id: text}``.
    """
    mode, prompt = _split_setting(setting)
    if mode == "no_ir" and prompt == "citation":
        raise ValueError("no_ir has no passages to cite: use the setting 'no_ir-direct'")
    bl = _bl(opts)
    doc_tr, query_tr = _translation_maps(translations)
    docs = load_docs(opts["docs"]) if mode != "no_ir" and opts.get("docs") else None
    rows = []
    for q in load_queries(opts["data"]).values():
        if q["lang"] != lang:
            continue
        row = {"item_id": q["query_id"], "study": STUDY, "setting": setting, "lang": lang,
               "prompt": None, "error": None}
        rows.append(row)
        terr = bl.territory(q["territory"])
        if terr is None:
            row["error"] = f"territory {q['territory']!r} is not in the BorderLines table"
            continue
        options = bl.options(lang, terr.name)
        if options is None:
            row["error"] = (f"no {lang} options for {terr.name} in the BorderLines queries "
                            f"({lang} is not the language of any of its claimants)")
            continue
        if len(options) != len(terr.claimants):
            row["error"] = (f"{len(options)} {lang} options for {terr.name}, but it has "
                            f"{len(terr.claimants)} claimants")
            continue
        text = query_tr.get(q["query_id"], q["text"])
        if mode == "no_ir":
            row["prompt"] = render_direct(text, _options_lines(options), None)
            continue
        hits, error = _shown_hits(opts, mode, q)
        if error:
            row["error"] = error
            continue
        if docs is None:
            row["error"] = "no passages file (study.options.docs)"
            continue
        missing = [h["doc_id"] for h in hits
                   if h["doc_id"] not in docs and h["doc_id"] not in doc_tr]
        if missing:
            row["error"] = f"passage(s) {missing} not in {opts['docs']}"
            continue
        texts = [truncate_words(doc_tr.get(h["doc_id"]) or docs[h["doc_id"]][1],
                                opts.get("max_doc_words")) for h in hits]
        row["prompt"] = (render_direct(text, _options_lines(options), texts)
                         if prompt == "direct"
                         else render_citation(text, _options_lines(options), texts))
    return rows


# ======================================================================================
# Parsers
# ======================================================================================

Parsed = tuple[dict | None, str | None]


def parser_for(setting: str) -> str:
    """The name in ``xling.tasks.parsers.PARSERS`` for a setting's outputs."""
    _, prompt = _split_setting(setting)
    return f"bordirlines_{prompt}"


_MARKUP_RE = re.compile(r"\*\*|__|`")


def _unmark(text: str) -> str:
    return _MARKUP_RE.sub("", text)


_LABEL_RE = re.compile(r"^\s*(?:(?:final\s+)?answer|chosen\s+option|option|response)\s*[:：]\s*",
                       re.IGNORECASE)


def parse_direct(text: str | None) -> Parsed:
    """The chosen option of a direct-prompt output: its first non-empty line, without
    markdown and an ``Answer:``-style label (or the ``Chosen Option:`` line, if the model
    used the citation format). Mapping it to a claimant is :func:`map_option`'s job."""
    if text is None or not text.strip():
        return None, "empty output"
    body = _unmark(text)
    m = re.search(r"chosen\s+option\s*[:：]", body, re.IGNORECASE)
    if m:
        body = body[m.end():]
        body = re.split(r"explanation\s*[:：]", body, maxsplit=1, flags=re.IGNORECASE)[0]
    for line in body.splitlines():
        line = _LABEL_RE.sub("", line).strip()
        if line:
            return {"option": " ".join(line.split())}, None
    return None, "no option in the output"


_CITED_RE = re.compile(r"cited\s+documents?\s*[:：]", re.IGNORECASE)
_CHOSEN_RE = re.compile(r"chosen\s+option\s*[:：]", re.IGNORECASE)
_EXPL_RE = re.compile(r"explanation\s*[:：]", re.IGNORECASE)
_DOCTAG_RE = re.compile(r"<\s*doc\s*(\d+(?:\s*,\s*\d+)*)\s*>", re.IGNORECASE)


def _numbers(text: str) -> str:
    return ",".join(dict.fromkeys(str(int(n)) for n in re.findall(r"\d+", text)))


def parse_citation(text: str | None) -> Parsed:
    """A citation-prompt output -> ``{"cited", "option", "explanation", "cited_text"}``.

    ``cited``: the document ids after ``Cited Documents:`` (the prompt's comma-separated
    ``0, 3``, or tags ``<doc0> <doc3>`` or ``<doc0,3>`` -> ``"0,3"``; ids count from 0 as in
    the prompt); ``option``: the text after ``Chosen Option:`` (to the end
    of its line, or ``Explanation:``); ``explanation``: the rest after ``Explanation:``;
    ``cited_text``: the ``<docN>`` numbers used in the explanation. Labels are matched case-
    insensitively, with markdown emphasis removed. No ``Chosen Option:`` is an error.
    """
    if text is None or not text.strip():
        return None, "empty output"
    body = _unmark(text)
    chosen = _CHOSEN_RE.search(body)
    if not chosen:
        return None, "no 'Chosen Option:' in the output"
    rest = body[chosen.end():]
    expl = _EXPL_RE.search(rest)
    option_part = rest[: expl.start()] if expl else rest
    lines = [ln.strip() for ln in option_part.splitlines() if ln.strip()]
    option = " ".join(lines[0].split()) if lines else ""
    if not option:
        return None, "empty 'Chosen Option:' in the output"
    cited = ""
    cm = _CITED_RE.search(body)
    if cm:
        # up to the next label (normally Chosen Option), or a blank line
        seg = body[cm.end():]
        ends = [x.start() for x in (_CHOSEN_RE.search(seg), _EXPL_RE.search(seg)) if x]
        seg = seg[: min(ends)] if ends else seg
        cited = _numbers(seg.split("\n\n", 1)[0])
    explanation = rest[expl.end():].strip() if expl else ""
    cited_text = ",".join(dict.fromkeys(
        str(int(n)) for m in _DOCTAG_RE.finditer(explanation) for n in m.group(1).split(",")))
    return {"cited": cited, "option": option, "explanation": explanation,
            "cited_text": cited_text}, None


# ======================================================================================
# Mapping an answer to a claimant
# ======================================================================================


def _clean_option(text: str) -> str:
    text = _unmark(text).strip().strip("\"'“”«»")
    return " ".join(text.split())


_LEAD_LETTER_RE = re.compile(
    r"^(?:option\s*)?(?:[(（]\s*([A-Ha-h])\s*[)）]|\[\s*([A-Ha-h])\s*\]"
    r"|([A-Ha-h])\s*(?:[).:：）]|$))", re.IGNORECASE)
_ANY_LETTER_RE = re.compile(r"(?<![A-Za-z])([A-H])[)）]")
_OPTION_WORD_RE = re.compile(r"\boption\s*\(?([A-Ha-h])\b\)?", re.IGNORECASE)


def _spaced(ch: str) -> bool:
    """True for a letter or digit of the Latin, Greek, Cyrillic or Armenian scripts, where a
    name must match whole words ("Niger" not inside "Nigeria"). Elsewhere names match as
    substrings: Hebrew and Arabic attach prefixes to words, and Chinese, Thai... have no
    spaces; longest-first masking keeps "Sudan" from matching inside "South Sudan"."""
    return ch.isalnum() and ord(ch) < 0x0590


def _fold(text: str) -> str:
    """Case-folded, typographic apostrophes and dashes made plain."""
    return text.casefold().translate({0x2019: "'", 0x2018: "'", 0x02bc: "'", 0x2013: "-",
                                      0x2014: "-", 0x2010: "-"})


def _name_pattern(name: str) -> re.Pattern:
    left = r"(?<!\w)" if _spaced(name[0]) else ""
    right = r"(?!\w)" if _spaced(name[-1]) else ""
    return re.compile(left + re.escape(name) + right)


def _match_names(text: str, names: list[tuple[str, int]]) -> set[int]:
    """Claimant indexes whose names occur in ``text``; longer names first, each match masked,
    so "Republic of China" does not also match inside "People's Republic of China"."""
    hay = _fold(text)
    found: set[int] = set()
    for name, idx in sorted(names, key=lambda x: -len(x[0])):
        if not name:
            continue
        pat = _name_pattern(_fold(name))
        if pat.search(hay):
            found.add(idx)
            hay = pat.sub("\x00", hay)
    return found


def map_option(option_text: str | None, lang: str, territory: str,
               opts: Mapping | None = None) -> str | None:
    """The canonical (English, table) claimant chosen by ``option_text``, or None.

    Accepted, in this order: a leading option letter (``B``, ``B)``, ``(b)``, ``[B]``,
    ``Option B``, ``B. Sudan``); the name of exactly one claimant, in ``lang``'s options
    for the territory or in English (case-insensitive; longest names first); a single
    ``X)`` letter or ``Option X`` anywhere. A letter beyond the options, several claimants,
    or nothing recognisable gives None.
    """
    if not option_text or not option_text.strip():
        return None
    bl = _bl(opts)
    terr = bl.territory(territory)
    if terr is None:
        return None
    n = len(terr.claimants)
    text = _clean_option(option_text)
    m = _LEAD_LETTER_RE.match(text)
    if m:
        idx = LETTERS.index(next(g for g in m.groups() if g).upper())
        if idx < n:
            return terr.claimants[idx]
    names = [(c, i) for i, c in enumerate(terr.claimants)]
    native = bl.options(lang, terr.name)
    if native and len(native) == n:
        names += [(c, i) for i, c in enumerate(native)]
    en = bl.options("en", terr.name)
    if en and len(en) == n:
        names += [(c, i) for i, c in enumerate(en)]
    found = _match_names(text, names)
    if len(found) == 1:
        return terr.claimants[found.pop()]
    if found:
        return None
    letters = {x.upper() for x in _ANY_LETTER_RE.findall(text)}
    letters |= {x.upper() for x in _OPTION_WORD_RE.findall(text)}
    if len(letters) == 1:
        idx = LETTERS.index(letters.pop())
        if idx < n:
            return terr.claimants[idx]
    return None


# ======================================================================================
# Metrics
# ======================================================================================


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


def _territory_cs(terr: Territory, responses: dict[str, str], response_en: str | None
                  ) -> _TerritoryCS:
    """The per-territory terms of BorderLines' concurrence scores (Li et al. 2024, Sec. 4;
    calculate_CS.py). ``responses``: {claimant language: chosen claimant} (Responses_d);
    ``response_en``: the English control answer (Response_en)."""
    nan = math.nan
    kb = control = non = nan
    if terr.known:
        # KB CS: does the English control answer name the controller?
        if response_en is not None:
            kb = float(response_en == terr.controller)
        # Control CS: the answer in the controller's language; Non-control CS: the mean over
        # the answers in the other claimant languages.
        others = []
        for lang, claim in responses.items():
            if terr.controller_lang and lang == terr.controller_lang:
                control = float(claim == terr.controller)
            else:
                others.append(claim == terr.controller)
        if others:
            non = sum(others) / len(others)
    # Consistency CS: agreement over all pairs of claimant-language answers.
    pairs = [a == b for a, b in itertools.combinations(responses.values(), 2)]
    cons = sum(pairs) / len(pairs) if pairs else nan
    with_en = dict(responses)
    if response_en is not None:
        with_en["en"] = response_en
    return _TerritoryCS(unknown=not terr.known, kb=kb, control=control, non=non, cons=cons,
                        n_countries=len(set(responses.values())),
                        n_countries_en=len(set(with_en.values())), n_queries=len(with_en))


def _cs_stats(rows: list[_TerritoryCS]) -> dict[str, tuple[float | None, int]]:
    """The CS metrics of a list of territories: {name: (value, n)}; the field names of
    BorderLines' calculate_CS.py output."""
    arr = {f: np.array([getattr(r, f) for r in rows], dtype=float)
           for f in ("kb", "control", "non", "cons", "n_countries", "n_countries_en")}
    unk = np.array([r.unknown for r in rows], dtype=bool)

    def m(x):
        x = x[~np.isnan(x)]
        return (float(x.mean()) if x.size else None), int(x.size)

    kb, control, non = m(arr["kb"]), m(arr["control"]), m(arr["non"])
    cons_all, cons_unk = m(arr["cons"]), m(arr["cons"][unk])
    out = {"num_queries": (float(sum(r.n_queries for r in rows)), len(rows)),
           "num_territories": (float(len(rows)), len(rows)),
           "KB CS": kb, "Control CS": control, "Non-control CS": non}
    # Delta CS = (Control CS - Non-control CS) / Non-control CS; unnormalized: the difference.
    if control[0] is not None and non[0] is not None:
        d = control[0] - non[0]
        out["Delta CS"] = (d / non[0] if non[0] else None, non[1])
        out["Delta CS unnormalized"] = (d, non[1])
    else:
        out["Delta CS"] = out["Delta CS unnormalized"] = (None, 0)
    out["Consistency CS unk"] = cons_unk
    out["Consistency CS unk rows"] = (float(cons_unk[1]), cons_unk[1])
    out["Consistency CS all"] = cons_all
    out["Consistency CS all rows"] = (float(cons_all[1]), cons_all[1])
    n = len(rows)
    for key, f in (("Response Countries", "n_countries"), ("Response Countries + en",
                                                           "n_countries_en")):
        x = arr[f]
        out[f"{key} mean"] = (float(x.mean()) if n else None, n)
        # pandas' Series.std(): the sample standard deviation (ddof=1)
        out[f"{key} σ"] = (float(x.std(ddof=1)) if n > 1 else None, n)
    return out


_CI_METRICS = ("KB CS", "Control CS", "Non-control CS", "Delta CS", "Delta CS unnormalized",
               "Consistency CS unk", "Consistency CS all", "Response Countries mean",
               "Response Countries + en mean")


def _bootstrap(rows: list[_TerritoryCS], n_boot: int, seed: int = 0
               ) -> dict[str, tuple[float, float]]:
    """95% percentile intervals of the CS metrics, resampling territories."""
    if n_boot <= 0 or len(rows) < 2:
        return {}
    rng = np.random.default_rng(seed)
    cols = {f: np.array([getattr(r, f) for r in rows], dtype=float)
            for f in ("kb", "control", "non", "cons", "n_countries", "n_countries_en")}
    cols["cons_unk"] = np.where([r.unknown for r in rows], cols["cons"], np.nan)
    idx = rng.integers(0, len(rows), size=(n_boot, len(rows)))

    def nanmean(x):
        s = x[idx]
        cnt = (~np.isnan(s)).sum(axis=1)
        tot = np.nansum(s, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)

    est = {"KB CS": nanmean(cols["kb"]), "Control CS": nanmean(cols["control"]),
           "Non-control CS": nanmean(cols["non"]), "Consistency CS all": nanmean(cols["cons"]),
           "Consistency CS unk": nanmean(cols["cons_unk"]),
           "Response Countries mean": cols["n_countries"][idx].mean(axis=1),
           "Response Countries + en mean": cols["n_countries_en"][idx].mean(axis=1)}
    with np.errstate(invalid="ignore", divide="ignore"):
        est["Delta CS unnormalized"] = est["Control CS"] - est["Non-control CS"]
        est["Delta CS"] = np.where(est["Non-control CS"] != 0,
                                   est["Delta CS unnormalized"] / est["Non-control CS"], np.nan)
    out = {}
    for k, v in est.items():
        v = v[np.isfinite(v)]
        if v.size:
            lo, hi = np.percentile(v, [2.5, 97.5])
            out[k] = (float(lo), float(hi))
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


def score(opts: Mapping, generations: Iterable[Mapping], judgments=None
          ) -> tuple[list[dict], list[dict]]:
    """Items and metrics of BordIRLines generations (``judgments`` is not used: the answers
    are multiple-choice).

    ``generations``: dicts with ``item_id`` (query_id), ``setting``, ``lang``, ``model``,
    ``parsed`` (the parser's dict, or None), ``output`` and ``error``.

    Items: one row per generation with the ``territory``, the chosen ``option`` text, the
    canonical ``claimant`` and an ``error`` (the generation's own, or "cannot map the chosen
    option ..."); errored and unmapped rows are left out of every CS metric.

    Metrics (``lang`` "all" unless said), per (model, setting):

    * the BorderLines concurrence scores over the territories with at least one mapped
      answer (all of them in a full run, as in calculate_CS.py), under its names:
      ``KB CS``, ``Control CS``, ``Non-control CS``, ``Delta CS``, ``Delta CS unnormalized``,
      ``Consistency CS all``/``unk`` (+ ``rows``), ``Response Countries mean``/``σ`` (+ ``en``
      variants), ``num_queries``, ``num_territories``; fractions in [0, 1]; 95% bootstrap
      intervals over territories for the means;
    * per query language and "all": ``errors`` and ``unmapped`` counts (n = generations);
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
    bl = _bl(opts)
    queries = load_queries(opts["data"])
    items: list[dict] = []
    for g in generations:
        setting, lang, model = g.get("setting"), g.get("lang"), g.get("model")
        q = queries.get(str(g.get("item_id")))
        terr = bl.territory(q["territory"]) if q else None
        item = {"item_id": g.get("item_id"), "study": STUDY, "setting": setting, "lang": lang,
                "model": model, "territory": terr.name if terr else (q or {}).get("territory"),
                "option": None, "claimant": None, "error": None, "_unmapped": False,
                "_parsed": g.get("parsed")}
        items.append(item)
        parsed = g.get("parsed")
        if g.get("error"):
            item["error"] = str(g["error"])
        elif q is None:
            item["error"] = f"unknown query id {g.get('item_id')!r} (not in queries.tsv)"
        elif terr is None:
            item["error"] = f"territory {q['territory']!r} is not in the BorderLines table"
        elif not isinstance(parsed, Mapping):
            item["error"] = "no parsed output"
        else:
            option = parsed.get("option") or parsed.get("answer")
            item["option"] = option
            claimant = map_option(option, q["lang"], terr.name, opts) if option else None
            if claimant is None:
                item["error"] = (f"cannot map the chosen option {option!r} to a claimant of "
                                 f"{terr.name}")
                item["_unmapped"] = True
            else:
                item["claimant"] = claimant

    metrics: list[dict] = []
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for it in items:
        groups[(it["model"], it["setting"])].append(it)
    for (model, setting), its in groups.items():
        metrics += _cs_metrics(opts, bl, queries, model, setting, its)
        metrics += _count_metrics(model, setting, its)
        try:
            mode, prompt = _split_setting(setting)
        except ValueError:
            continue
        if prompt == "citation" and mode != "no_ir":
            metrics += _citation_metrics(opts, queries, model, setting, mode, its)
    if items:
        metrics += _random_metrics(opts, bl, queries)
    out_items = [{k: v for k, v in it.items() if not k.startswith("_")} for it in items]
    return out_items, metrics


def _cs_metrics(opts, bl, queries, model, setting, its) -> list[dict]:
    # Territories in scope: those with at least one mapped answer (in a full run, every
    # territory, as in calculate_CS.py; a territory whose answers all failed is left out
    # rather than counted as 0 response countries).
    responses: dict[str, dict[str, str]] = defaultdict(dict)
    response_en: dict[str, str] = {}
    scope: list[str] = []
    for it in its:
        terr = bl.territory(it["territory"]) if it["territory"] else None
        if terr is None or it["claimant"] is None:
            continue
        if terr.name not in scope:
            scope.append(terr.name)
        qlang = queries[str(it["item_id"])]["lang"]
        if qlang == "en":  # the control query (also the claimant query of English claimants)
            response_en[terr.name] = it["claimant"]
        if qlang in terr.claimant_langs:
            responses[terr.name].setdefault(qlang, it["claimant"])
    rows = [_territory_cs(bl.territories[t], responses.get(t, {}), response_en.get(t))
            for t in scope]
    stats = _cs_stats(rows)
    cis = _bootstrap(rows, int(opts.get("bootstrap", DEFAULTS["bootstrap"]) or 0))
    return [_metric(setting, "all", model, name, v, n, cis.get(name))
            for name, (v, n) in stats.items()]


def _count_metrics(model, setting, its) -> list[dict]:
    by_lang: dict[str, list[dict]] = defaultdict(list)
    for it in its:
        by_lang[it["lang"]].append(it)
    out = []
    for lang, group in [("all", its)] + sorted(by_lang.items(), key=lambda x: str(x[0])):
        errors = sum(1 for it in group if it["error"] and not it["_unmapped"])
        unmapped = sum(1 for it in group if it["_unmapped"])
        out.append(_metric(setting, lang, model, "errors", errors, len(group)))
        out.append(_metric(setting, lang, model, "unmapped", unmapped, len(group)))
    return out


def _random_metrics(opts, bl, queries) -> list[dict]:
    """The paper's RANDOM row: the expected CS metrics of a uniformly random option, over
    the territories of the run's queries (the query languages in ``opts["langs"]``). Each
    expected concurrence is 1/k for a territory with k claimants (a random answer names the
    controller, or agrees with another random answer, with probability 1/k); each metric
    keeps the scope it has for a model: KB over known controllers with an English query,
    Control over those with a controller-language query, Non over those with another
    claimant-language query, consistency over territories with two or more claimant-
    language queries."""
    langs_of: dict[str, set[str]] = defaultdict(set)
    for q in queries.values():
        terr = bl.territory(q["territory"])
        if terr is not None and q["lang"] in opts["langs"]:
            langs_of[terr.name].add(q["lang"])
    nan = math.nan
    rows = []
    for name, langs in langs_of.items():
        terr = bl.territories[name]
        p = 1.0 / len(terr.claimants)
        claim = [lang for lang in terr.langs() if lang in langs]
        known = terr.known
        rows.append(_TerritoryCS(
            unknown=not known, kb=p if known and "en" in langs else nan,
            control=p if known and terr.controller_lang in claim else nan,
            non=p if known and any(lang != terr.controller_lang for lang in claim) else nan,
            cons=p if len(claim) >= 2 else nan, n_countries=0, n_countries_en=0,
            n_queries=len(langs)))
    stats = _cs_stats(rows)
    keep = ("KB CS", "Control CS", "Non-control CS", "Delta CS", "Delta CS unnormalized",
            "Consistency CS unk", "Consistency CS all", "num_territories")
    return [_metric("random", "all", "RANDOM", k, stats[k][0], stats[k][1]) for k in keep]


def _citation_metrics(opts, queries, model, setting, mode, its) -> list[dict]:
    # per query language: one (nr, cr) pair of {doc_lang: share} per counted answer
    per_lang: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    invalid: dict[str, int] = defaultdict(int)
    uncited: dict[str, int] = defaultdict(int)
    answers: dict[str, int] = defaultdict(int)
    for it in its:
        parsed = it["_parsed"]
        q = queries.get(str(it["item_id"]))
        if (it["error"] and not it["_unmapped"]) or not isinstance(parsed, Mapping) or q is None:
            continue
        hits, err = _shown_hits(opts, mode, q)
        if err:
            continue
        lang = q["lang"]
        answers[lang] += 1
        nums = _cited_numbers(parsed)
        valid = [n for n in nums if 0 <= n < len(hits)]  # ids count from 0, as in the prompt
        invalid[lang] += len(nums) - len(valid)
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
    out = []
    own_cr, own_nr = [], []
    for lang in sorted(answers):
        pairs = per_lang.get(lang, [])
        n = len(pairs)
        if n:
            for dl in sorted({dl for nr, _ in pairs for dl in nr}):
                out.append(_metric(setting, lang, model, f"inclusion_rate:{dl}",
                                   sum(nr.get(dl, 0.0) for nr, _ in pairs) / n, n))
                out.append(_metric(setting, lang, model, f"citation_rate:{dl}",
                                   sum(cr.get(dl, 0.0) for _, cr in pairs) / n, n))
            nr_q = sum(nr.get(lang, 0.0) for nr, _ in pairs) / n
            cr_q = sum(cr.get(lang, 0.0) for _, cr in pairs) / n
            own_nr.append(nr_q)
            own_cr.append(cr_q)
            out.append(_metric(setting, lang, model, "inclusion_rate:qlang", nr_q, n))
            out.append(_metric(setting, lang, model, "citation_rate:qlang", cr_q, n))
        out.append(_metric(setting, lang, model, "no_citations", uncited[lang], answers[lang]))
        out.append(_metric(setting, lang, model, "invalid_citations", invalid[lang],
                           answers[lang]))
    if answers:
        k = len(own_cr)
        out.append(_metric(setting, "all", model, "inclusion_rate:qlang",
                           sum(own_nr) / k if k else None, k))
        out.append(_metric(setting, "all", model, "citation_rate:qlang",
                           sum(own_cr) / k if k else None, k))
        out.append(_metric(setting, "all", model, "no_citations", sum(uncited.values()),
                           sum(answers.values())))
        out.append(_metric(setting, "all", model, "invalid_citations", sum(invalid.values()),
                           sum(answers.values())))
    return out


# ======================================================================================
# Report table
# ======================================================================================

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
    return _load_published(_stamp(Path(path)))


@functools.lru_cache(maxsize=4)
def _load_published(stamp: tuple) -> dict:
    raw = yaml.safe_load(Path(stamp[0]).read_text("utf-8"))
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
    return {"source": raw.get("source", stamp[0]), "retriever": raw.get("retriever"),
            "prompt": raw.get("prompt", "direct"), "aliases": aliases, "table4": table4,
            "citation": raw.get("citation") or {}}


def _is_cs(metric: str) -> bool:
    return not metric.startswith("Response Countries")


def _fmt(metric: str, v) -> str:
    """A value as the paper prints it: CS (and rates) x100 with one decimal, # Country with
    three."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if metric.startswith("Response Countries"):
        return f"{v:.3f}"
    return f"{100 * v:.1f}"


def _beside(metric: str, ours, paper) -> str:
    """xling's value, and where the paper has one: ``ours (paper; ours - paper)``."""
    text = _fmt(metric, ours)
    if paper is None:
        return text
    scale, digits = (100.0, 1) if _is_cs(metric) else (1.0, 3)
    p = f"{paper:.{digits}f}"
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return f"{text} ({p}; –)"
    return f"{text} ({p}; {scale * ours - paper:+.{digits}f})"


def _paper_label(published: dict | None, model: str) -> str | None:
    return (published or {}).get("aliases", {}).get(str(model).casefold())


def tables(metrics: Iterable[Mapping], options: Mapping | None = None) -> str:
    """Markdown: the paper's Table 4 (bordirlines.txt L466-477) for each prompt run, rows
    model x IR mode (no_ir, qlang, qlang_en, en, rel_langs, swap; the paper's qlang+en,
    en_only and swap_docs) after the RANDOM row, columns KB CS, Con CS, Non CS, ΔCS, ΔCS
    abs, Cst CS (unk), Cst CS (all), # Country mean and std dev; CS in %. ``no_ir`` runs
    with the direct prompt only, so its rows are the ``no_ir-direct`` numbers in every
    prompt's table.

    With ``options["expected"]`` (the study options; the paper's numbers, :func:`load_published`), a cell whose
    model, mode, prompt and retriever the paper ran shows ``xling (paper; xling - paper)``;
    the other cells show xling's number only. Then, for citation settings, the citation and
    inclusion rates of the query language's own documents per query language (Fig. 4;
    beside the paper's where it quotes them), and the answers left out of the CS metrics."""
    rows = [m for m in metrics if m.get("study", STUDY) == STUDY]
    cs: dict[tuple[str, str, str], float | None] = {}
    models, prompts, modes_of = [], [], defaultdict(list)
    for m in rows:
        if m.get("lang") != "all":
            continue
        if m.get("setting") == "random":
            cs[("RANDOM", "random", m["metric"])] = m["value"]
            continue
        try:
            mode, prompt = _split_setting(m["setting"])
        except (ValueError, KeyError):
            continue
        cs[(m["model"], m["setting"], m["metric"])] = m["value"]
        if m["model"] not in models:
            models.append(m["model"])
        if mode not in modes_of[m["model"]]:
            modes_of[m["model"]].append(mode)
        if prompt not in prompts:
            prompts.append(prompt)
    if not models:
        return "_No BordIRLines metrics._\n"
    prompts = [p for p in PROMPTS if p in prompts]
    opts = options or {}
    published = load_published(opts["expected"]) if opts.get("expected") else None
    retriever = opts.get("retriever")

    def paper(model: str, mode: str, prompt: str) -> dict | None:
        if published is None:
            return None
        if mode == "random":
            return published["table4"].get(("RANDOM", "random"))
        label = _paper_label(published, model)
        if label is None or prompt != published["prompt"]:
            return None
        if mode != "no_ir" and retriever != published["retriever"]:
            return None  # no_ir has no retrieval: comparable whatever the retriever
        return published["table4"].get((label, mode))

    head = ["model", "IR mode"] + [h for _, h in TABLE_METRICS]
    lines: list[str] = []
    for prompt in prompts:
        if lines:
            lines.append("")
        if prompt == "direct":
            lines.append("### BordIRLines Table 4: concurrence scores, direct prompt (%)")
        else:
            lines.append("### BordIRLines concurrence scores, citation prompt (%; the paper's "
                         "Table 4 is the direct prompt's; no_ir rows are the direct prompt's)")
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        table_rows = []
        if prompt == "direct" and any(k[0] == "RANDOM" for k in cs):
            table_rows.append(("", "RANDOM", "random", paper("", "random", prompt)))
        for model in models:
            for mode in [x for x in MODES if x in modes_of[model]]:
                setting = "no_ir-direct" if mode == "no_ir" else f"{mode}-{prompt}"
                if not any(k[0] == model and k[1] == setting for k in cs):
                    continue
                table_rows.append((str(model), mode, setting, paper(model, mode, prompt)))
        for model, mode, setting, pub in table_rows:
            key = "RANDOM" if setting == "random" else model
            cells = [model, mode] + [
                _beside(metric, cs.get((key, setting, metric)), (pub or {}).get(metric))
                for metric, _ in TABLE_METRICS]
            lines.append("| " + " | ".join(cells) + " |")
    if published is not None:
        lines += ["", f"Published numbers: {published['source']}, Table 4 (the direct prompt, "
                  f"{published['retriever']} retrieval). A cell with one shows "
                  "`xling (paper; xling − paper)`, where the model, the IR mode, the prompt "
                  "and the retriever match (no_ir for any retriever); the others show "
                  "xling's number only. The paper's modes qlang+en, en_only and swap_docs "
                  "are qlang_en, en and swap here."]

    # Citation analysis (Fig. 4): cr / nr of the query language's own documents.
    cite: dict[tuple[str, str], dict[str, dict[str, tuple]]] = defaultdict(
        lambda: defaultdict(dict))
    for m in rows:
        if m["metric"] in ("citation_rate:qlang", "inclusion_rate:qlang", "no_citations"):
            cite[(m["model"], m["setting"])][m["lang"]][m["metric"]] = (m["value"], m["n"])
    if cite:
        lines += ["", "### Citation rate (cr) and inclusion rate (nr) of the query language's "
                  "documents (%, averaged over each query language's queries; Fig. 4)", "",
                  "| model | setting | query language | cr(l_q) | nr(l_q) | queries | "
                  "answers citing nothing |", "|---|---|---|---|---|---|---|"]
        pc = (published or {}).get("citation") or {}
        for (model, setting), by_lang in cite.items():
            mode, _ = _split_setting(setting)
            match = (published is not None and pc
                     and _paper_label(published, model) == pc.get("model")
                     and mode == pc.get("mode") and retriever == published["retriever"])
            for lang in sorted(by_lang, key=lambda x: (x != "all", x)):
                r = by_lang[lang]
                pub = (pc.get("langs") or {}).get(lang) if match else None
                cr, n = r.get("citation_rate:qlang", (None, 0))
                nr, _ = r.get("inclusion_rate:qlang", (None, 0))
                nc = r.get("no_citations")
                label = "all (mean over languages)" if lang == "all" else lang
                unit = "languages" if lang == "all" else "queries"
                lines.append(
                    f"| {model} | {setting} | {label} | "
                    f"{_beside('', cr, (pub or {}).get('cr'))} | "
                    f"{_beside('', nr, (pub or {}).get('nr'))} | {n} {unit} | "
                    f"{int(nc[0]) if nc else 0} of {nc[1] if nc else 0} |")

    counts: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for m in rows:
        if m.get("lang") == "all" and m["metric"] in ("errors", "unmapped"):
            key = (m["model"], m["setting"])
            counts[key][m["metric"]] = m["value"]
            counts[key]["n"] = m["n"]
    if counts:
        lines += ["", "### Answers left out of the CS metrics", "",
                  "| model | setting | generations | errors | unmapped |", "|---|---|---|---|---|"]
        for (model, setting), c in counts.items():
            lines.append(f"| {model} | {setting} | {int(c.get('n', 0))} | "
                         f"{int(c.get('errors') or 0)} | {int(c.get('unmapped') or 0)} |")
    return "\n".join(lines) + "\n"
