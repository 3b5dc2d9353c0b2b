"""CROSS on mLongRR-V2: cross-lingual needle retrieval in long contexts (Bagheri Nezhad &
Agrawal, "CROSS: Analyzing the trade-offs in long-context cross-lingual retrieval").

The pure part of the study: reading the mLongRR CSVs, the offline Punkt splitter, prompts,
exact top-k selection over given sentence scores, scoring, the failure taxonomy, input
reduction, the paper-shaped tables and plots, and a builder for V2-style cases. The
embedding model and the LLMs run elsewhere (a ``narrow`` stage hands per-sentence scores or
a ranking to :func:`prompt_rows`). Sources: the paper (``../shared/papers/cross-mlongrr.txt``,
cited "L<n>") wins over the specification (``../shared/specs/cross-mlongrr.md``, cited "s<n>"),
which documents the mLongRR v1 code (PortNLP/mLongRR) that the paper builds on.

The task (paper)
----------------
* Seven languages, en vi sw fa ru hi ar (L271); 49 (query, context) pairs, 42 of them
  cross-lingual (L29, L279). The haystack is monolingual, the needle is in the haystack's
  language, the query (the whole prompt) in another (L273-275, L293).
* Needle ``"The special magic {city} number is {number}."`` (D.1, L309; L277 prints it with a
  colon and no period), city from 23 (L311-335), number a random 7-digit integer (L277).
* 1 needle at depth 0/25/50/75/100 % (L281, L291); 3 needles "placed randomly" (L283, L295),
  gold = the largest (L295, L299). Lengths 2k-512k "words" (L285; L13/L67 say tokens).
* CROSS (L53-55): Punkt sentences, bge-m3 embeddings, the top k sentences by similarity to
  the query, k in 3, 5, 10, 20, 50, then the LLM sees only those sentences. Baseline: the
  whole context (L90, L106). Sanity check: the needle(s) alone, expected 100 % (L102).
* Accuracy = % of cases answered correctly (L299, "exact match" L106). Failure taxonomy
  (L178-181): embedding failure = the target label is not in the retrieved cap; LLM failure =
  it is, but the answer is wrong, split into incorrect vs "UNANSWERABLE" (L216-219).
  Reduction of LLM input (L145-151, Fig 14).

What is here
------------
* :func:`load_file` / :func:`load_contexts`: the mLongRR CSVs, local or ``s3://`` (pyarrow.fs).
  ``csv.field_size_limit`` is raised (their texts exceed the default 131,072 characters), quoted
  newlines are kept, and the needle count comes from the columns (``label`` vs ``label1..n``),
  never from the file name (the 1- and 3-needle files share names). A row whose labels are not
  each found exactly once in its text is an error row. Gold = the largest label as an integer.
* :func:`make_splitter`: NLTK's ``PunktSentenceTokenizer`` without the ``punkt_tab`` download
  (s2.1 option (i); sentencex is not used, s2.1). ``punkt_english`` (default) loads NLTK's
  English punkt_tab parameters shipped in ``data/cross/punkt_tab_english`` (provenance in
  ``data/cross/README.md``), ``punkt_untrained`` has empty parameters (s2.1 (ii)),
  ``punkt_trained`` trains Punkt on given text (s2.1 (iii); API only, not an option).
  ``extra_terminators`` (e.g. Hindi "।", Arabic "؟") is a flagged variant (s2.1). Every
  splitter has a ``fingerprint`` (kind, nltk version, sentence-end characters, hash of the
  parameters) that prompt rows record (``meta.splitter_fp``).
  :func:`context_split` keeps each sentence's index and merges sentences across any needle
  that a boundary would cut (counted in ``n_merged``; 0 on every shared file).
* Prompts in the query language (:func:`build_prompt`): English verbatim from the paper (1
  needle L341-355, 3 needles L361-371; ``PAPER_PROMPTS``), other languages from
  ``data/cross/templates.json``, where each string has a status (``paper``, ``v1``,
  ``v1_adapted``, ``draft``). Unverified strings are refused unless ``allow_unverified``.
* Settings ``{n}n_baseline``, ``{n}n_k{k}`` (CROSS at cap k) and ``{n}n_needle_only``; cells
  are per ``lang = f"{query}-{context}"``.
* :func:`rank` / :func:`top_k`: exact ranking of given scores, score descending and ties by
  sentence index ascending (s2.3); top-k is the prefix of the ranking, so caps are nested.
  :func:`label_ranks` gives each needle's 1-based rank. :func:`selection_text` gives the text
  the LLM sees.
* Scoring (:func:`score_output`): ``correct`` = the gold 7-digit string occurs in the output
  after digit normalization (every Unicode Nd digit -> ASCII, separators between digits
  dropped); ``strict`` = the set of 7-digit numbers in the output is exactly {gold}. Rows are
  scored one by one; :func:`reference_any_row_found` reproduces v1's "any row" bug (s1.7) only
  so that a test can pin that xling does not do it.
* :func:`failure_class`, :func:`reduction`, :func:`score_rows` (per-item scores), the tables
  (:func:`tables`: T1 summary with the paper's <=64k / >64k / mid / edge slices, accuracy by
  length, depth and k, hit@k, the query x context matrices, failure classes, reduction; pandas,
  :func:`markdown_tables` renders them) and plots (``plot_*``, matplotlib imported inside,
  drawn on an Agg canvas without pyplot state).
* :func:`build_cases`: V2-style cases from any documents (s1.8 "Missing"), seeded per case.

Decisions on what no source settles (s6; each is an option where it matters)
---------------------------------------------------------------------------
* ``order`` of the selected sentences: ``score`` (most similar first) by default. The paper
  says the LLM "processes only the top-ranked segments—irrespective of their position in the
  document" (L27) and names "Ambiguity in Sentence Ranking" among 3-needle failures (L202),
  which suggests the ranking is visible; ``document`` is the ablation. ``join``: one space
  (v1 joins sentences with spaces), or ``"\\n"``.
* ``query_text``: the question sentence in the query language (``question``, default) or
  the whole instruction (``instruction``); the paper says only "the query" (L55).
* ``embedding_failure``: ``target`` (default): the gold (largest) label is not in the cap,
  following L180 "the target label is absent"; ``all``: any needle missing counts as an
  embedding failure. ``hit@k`` and ``all@k`` are reported either way.
* Scoring is containment (the only published scoring code, s1.7) with ``strict`` beside it;
  the UNANSWERABLE token of the query language (and the English one) marks the
  ``llm_unanswerable`` subclass.
* Splitter: English Punkt parameters for every language, as v1 did (s2.1); the Hindi danda
  and Arabic question mark are not terminators unless ``extra_terminators`` says so.
* Length unit: each data entry says it (``length_unit``; the shared v1 files count GPT-4o
  tokens, V2 counts words, s1.3); the builder counts NLTK word tokens by default.
* Needle template of the builder: D.1 with a period (L309), ``needle_period: false`` for v1's
  period-less needle. 3 needles: ``placement="uniform"`` (random over the whole context,
  L283) or ``"window"`` (v1's quartile windows).

Options (``check_options``; errors read ``study.options.<key>: <what>; <fix>``): ``data``
(required: a list of CSV paths or ``{path, lang, length_unit, needles}``; ``lang`` defaults
to the file name's language, ``Swahili_needles.csv`` -> sw; ``needles``, if given, must match
the columns), ``context_langs`` (default: every language in ``data``), ``query_langs``
(default the 7), ``needles`` ([1, 3]), ``ks`` ([3, 5, 10, 20, 50]), ``methods`` (baseline,
cross; + needle_only), ``prompt_variant`` (``paper`` | ``no_unanswerable``, L234), ``order``,
``join``, ``query_text``, ``splitter`` (``punkt_english`` | ``punkt_untrained``),
``extra_terminators`` ([]), ``lengths``/``positions``/``runs`` (filters, default all),
``templates`` (path, default the packaged file), ``allow_unverified`` (false),
``embedding_failure`` (``target``), ``limit`` (first N contexts per file). Only the English
prompts are verified (``paper``), so the default seven query languages are refused until
their strings are reviewed or ``allow_unverified: true`` is set; each prompt row records the
weakest status it used (``meta.template_status``).

Digit normalization drops any one separator character between two digits, so "7 252 750"
counts, and so would "2 7252750" (a containment hit, but not ``strict``).
"""

from __future__ import annotations

import bisect
import csv
import functools
import hashlib
import io
import json
import math
import os
import random
import re
import sys
import unicodedata
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from xling.tasks.languages import get_language, validate_languages

STUDY = "cross"
LANGS = ("en", "vi", "sw", "fa", "ru", "hi", "ar")  # L271
KS = (3, 5, 10, 20, 50)  # L55
LENGTHS = ("2k", "8k", "16k", "32k", "64k", "128k", "256k", "512k")  # L285
POSITIONS = (0, 25, 50, 75, 100)  # L281, L291
WINDOW_POSITIONS = (0, 25, 50, 75)  # v1 3-needle quartile windows (s1.5)
NEEDLES = (1, 3)
METHODS = ("baseline", "cross", "needle_only")
MID_POSITIONS = (25, 50, 75)  # "mid-context" (L125)
CITIES = ("Chicago", "Yangon", "Antananarivo", "Colombo", "Almaty", "Sydney", "Mexico City",
          "Seattle", "Lagos", "Amsterdam", "Belgrade", "Cairo", "Baghdad", "Damascus", "Kigali",
          "Dakar", "Sofia", "Victoria", "Tashkent", "Mumbai", "Barcelona", "Amman",
          "Toronto")  # L313-335
DATA_DIR = Path(__file__).with_name("data")
TEMPLATES_PATH = DATA_DIR / "templates.json"
PUNKT_ENGLISH_DIR = DATA_DIR / "punkt_tab_english"

# The two boxes of Appendix D.2, verbatim. The 1-needle box (L343-355) is printed with a
# blank line after every line, an artefact of the PDF extraction that the 3-needle box
# (L363-371) does not have; both use the 3-needle layout (s2.4). Note the comma before
# "respond" in the 1-needle box (L355) and none in the 3-needle box (L371).
PAPER_PROMPTS = {
    1: ("You are a helpful AI bot that answers questions for a user. Keep your response short "
        "and direct.\n\n#CONTEXT\n{text}\n#ENDCONTEXT\n\n#QUESTION\nWhat is the special magic "
        "number? Don't give information outside the document or repeat your findings.\nIf the "
        "information is not available in the context, respond UNANSWERABLE."),
    3: ("You are a helpful AI bot that answers questions for a user. Keep your response short "
        "and direct.\n\n#CONTEXT\n{text}\n#ENDCONTEXT\n\n#QUESTION\nWhat is the largest special "
        "magic number? Don't give information outside the document or repeat your findings.\n"
        "If the information is not available in the context respond UNANSWERABLE."),
}
PROMPT_VARIANTS = ("paper", "no_unanswerable")  # L234: the UNANSWERABLE sentence removed
ORDERS = ("score", "document")
JOINS = (" ", "\n")
QUERY_TEXTS = ("question", "instruction")
SPLITTERS = ("punkt_english", "punkt_untrained", "punkt_trained")
FAILURE_RULES = ("target", "all")
FAILURES = ("correct", "embedding_failure", "llm_failure", "too_long")
FAILURE_DETAILS = ("correct", "embedding_failure", "llm_unanswerable", "llm_incorrect",
                   "too_long")

DEFAULTS: dict[str, Any] = {
    "context_langs": None,          # every language in `data`
    "query_langs": list(LANGS),
    "needles": [1, 3],
    "ks": list(KS),
    "methods": ["baseline", "cross"],
    "prompt_variant": "paper",
    "order": "score",               # L27, L202 (see the docstring)
    "join": " ",
    "query_text": "question",
    "splitter": "punkt_english",
    "extra_terminators": [],
    "lengths": None,
    "positions": None,
    "runs": None,
    "templates": None,              # the packaged data/cross/templates.json
    "allow_unverified": False,
    "embedding_failure": "target",  # L180
    "limit": None,
}
OPTIONS = ("data",) + tuple(DEFAULTS)


# --- options ------------------------------------------------------------------------------

def _bad(key: str, what: str, fix: str) -> ValueError:
    return ValueError(f"study.options.{key}: {what}; {fix}")


def _as_list(raw: Mapping, key: str, what: str) -> list:
    value = raw.get(key, DEFAULTS.get(key))
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise _bad(key, f"must be a non-empty list of {what}, got {value!r}",
                   f"e.g. `{key}: {DEFAULTS.get(key) or '[...]'}`")
    return value


def _choice(raw: Mapping, key: str, choices: Sequence) -> Any:
    value = raw.get(key, DEFAULTS[key])
    if value not in choices:
        raise _bad(key, f"unknown value {value!r}", f"choose one of {list(choices)}")
    return value


def _lang_of_file(path: str) -> str | None:
    stem = path.rstrip("/").rsplit("/", 1)[-1].split("_", 1)[0]
    try:
        return get_language(stem).code
    except Exception:  # noqa: BLE001 - any lookup failure means "not derivable"
        return None


def _data_entries(raw: Mapping) -> list[dict]:
    data = raw.get("data")
    if isinstance(data, (str, dict)):
        data = [data]
    if not isinstance(data, list) or not data:
        raise _bad("data", "required: a list of mLongRR CSV files",
                   "set e.g. `data: [../shared/data/mlongrr/1-needle/English_needles.csv]` "
                   "or entries `{path, lang, length_unit}`")
    out = []
    for i, entry in enumerate(data):
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise _bad("data", f"entry {i} must be a path or a mapping with `path`, got {entry!r}",
                       "write `- path: .../English_needles.csv`")
        unknown = sorted(set(entry) - {"path", "lang", "length_unit", "needles"})
        if unknown:
            raise _bad("data", f"entry {i} has unknown key(s) {unknown}",
                       "an entry takes path, lang, length_unit, needles")
        path = entry["path"]
        if "://" not in path and not os.path.isfile(path):
            raise _bad("data", f"file not found: {path}",
                       "give the path of an mLongRR CSV (get them with `git clone "
                       "https://github.com/PortNLP/mLongRR data/mLongRR`)")
        lang = entry.get("lang") or _lang_of_file(path)
        if lang is None:
            raise _bad("data", f"entry {i}: no language for {path}",
                       "add `lang: <code>` (the file name is not <Language>_needles.csv)")
        code = validate_languages([lang])[0].code
        if code not in LANGS:
            raise _bad("data", f"entry {i}: language {code!r} is not an mLongRR-V2 language",
                       f"CROSS covers {list(LANGS)}")
        unit = entry.get("length_unit")
        if unit is not None and not re.fullmatch(r"(words|tokens):\S+", str(unit)):
            raise _bad("data", f"entry {i}: length_unit {unit!r} is not `words:<how>` or "
                       "`tokens:<tokenizer>`", "e.g. `tokens:gpt-4o` (v1) or `words:nltk` (V2)")
        needles = entry.get("needles")
        if needles is not None and needles not in (1, 2, 3):
            raise _bad("data", f"entry {i}: needles must be 1, 2 or 3, got {needles!r}",
                       "or leave it out: the columns say it")
        out.append({"path": path, "lang": code, "length_unit": unit, "needles": needles})
    return out


def _int_list(raw: Mapping, key: str, *, allowed: Sequence[int] | None = None) -> list[int]:
    values = _as_list(raw, key, "integers")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or (
                allowed is not None and v not in allowed):
            raise _bad(key, f"bad value {v!r}",
                       f"use {'one of ' + str(list(allowed)) if allowed else 'positive integers'}")
    return sorted(dict.fromkeys(values))


def check_options(raw: Mapping | None) -> dict:
    """Validate the config's ``study.options`` and fill the defaults (``DEFAULTS``)."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(OPTIONS))
    if unknown:
        raise _bad(unknown[0], f"unknown option(s) {unknown}",
                   f"CROSS's options are {list(OPTIONS)}")
    data = _data_entries(raw)
    qlangs = [x.code for x in validate_languages(_as_list(raw, "query_langs", "language codes"))]
    outside = [q for q in qlangs if q not in LANGS]
    if outside:
        raise _bad("query_langs", f"{outside} not in mLongRR-V2", f"choose from {list(LANGS)}")
    data_langs = list(dict.fromkeys(d["lang"] for d in data))
    if raw.get("context_langs") is None:
        clangs = data_langs
    else:
        clangs = [x.code for x in validate_languages(
            _as_list(raw, "context_langs", "language codes"))]
        missing = [c for c in clangs if c not in data_langs]
        if missing:
            raise _bad("context_langs", f"{missing} have no file in `data`",
                       f"the data files cover {data_langs}")
    needles = _int_list(raw, "needles", allowed=NEEDLES)
    ks = _int_list(raw, "ks")
    methods = _as_list(raw, "methods", "methods")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise _bad("methods", f"unknown method(s) {bad}", f"choose from {list(METHODS)}")
    extra = raw.get("extra_terminators", DEFAULTS["extra_terminators"]) or []
    if not isinstance(extra, list) or any(not isinstance(t, str) or len(t) != 1 for t in extra):
        raise _bad("extra_terminators", f"must be a list of single characters, got {extra!r}",
                   'e.g. `["।", "؟", "۔"]`')
    splitter = _choice(raw, "splitter", SPLITTERS[:2])  # punkt_trained needs text: API only
    filters = {}
    for key in ("lengths", "positions", "runs"):
        v = raw.get(key)
        if v is not None:
            if not isinstance(v, list) or not v:
                raise _bad(key, f"must be a non-empty list or null, got {v!r}",
                           "leave it out to keep every value")
            v = [str(x) for x in v]
        filters[key] = v
    limit = raw.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _bad("limit", f"must be a positive integer or null, got {limit!r}",
                   "e.g. `limit: 5`")
    allow = raw.get("allow_unverified", False)
    if not isinstance(allow, bool):
        raise _bad("allow_unverified", f"must be true or false, got {allow!r}", "e.g. `true`")
    tpath = raw.get("templates")
    if tpath is not None and (not isinstance(tpath, str) or not os.path.isfile(tpath)):
        raise _bad("templates", f"file not found: {tpath!r}",
                   "give a templates.json laid out like xling/tasks/data/cross/templates.json")
    templates = load_templates(tpath)
    variant = _choice(raw, "prompt_variant", PROMPT_VARIANTS)
    for q in qlangs:
        for n in needles:
            try:
                _, status = prompt_template(q, n, variant=variant, templates=templates)
            except KeyError as e:
                raise _bad("query_langs", f"no {n}-needle prompt for {q!r} ({e})",
                           "add its strings to the templates file") from None
            if status not in templates["_verified"] and not allow:
                raise _bad("query_langs", f"the {n}-needle prompt for {q!r} uses "
                           f"{status!r} strings, which are unverified",
                           "have them reviewed (templates.json) or set `allow_unverified: true`")
    return {"data": data, "context_langs": clangs, "query_langs": list(dict.fromkeys(qlangs)),
            "needles": needles, "ks": ks, "methods": list(dict.fromkeys(methods)),
            "prompt_variant": variant, "order": _choice(raw, "order", ORDERS),
            "join": _choice(raw, "join", JOINS),
            "query_text": _choice(raw, "query_text", QUERY_TEXTS), "splitter": splitter,
            "extra_terminators": list(extra), **filters, "templates": tpath,
            "allow_unverified": allow,
            "embedding_failure": _choice(raw, "embedding_failure", FAILURE_RULES),
            "limit": limit}


# --- reading the CSVs ---------------------------------------------------------------------

def raise_csv_field_limit() -> int:
    """The shared files' texts (up to 298,020 characters; V2 rows ~3.3 MB) exceed Python's
    default ``csv.field_size_limit`` of 131,072 (s1.8). Raises it process-wide; returns it."""
    limit = sys.maxsize
    while True:
        try:
            csv.field_size_limit(limit)
            return limit
        except OverflowError:
            limit //= 2


def read_text(path: str, filesystem=None) -> str:
    """A whole UTF-8 file (BOM tolerated) from a local path or a URI pyarrow opens."""
    if filesystem is not None or "://" in path:
        import pyarrow.fs as pafs

        fs, inner = (filesystem, path) if filesystem is not None else \
            pafs.FileSystem.from_uri(path)
        with fs.open_input_stream(inner) as f:
            data = f.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    return data.decode("utf-8-sig")


def needles_in_columns(columns: Iterable[str]) -> int:
    """The needle count from the header: ``label`` -> 1, ``label1..labeln`` -> n (s1.8)."""
    cols = [c.strip() for c in columns]
    numbered = sorted(int(m.group(1)) for c in cols if (m := re.fullmatch(r"label(\d+)", c)))
    if "label" in cols and numbered:
        raise ValueError(f"both `label` and `label1..` columns: {cols}")
    if "label" in cols:
        return 1
    if numbered and numbered == list(range(1, len(numbered) + 1)):
        return len(numbered)
    raise ValueError(f"no `label` or `label1..labeln` columns: {cols}")


_NUMBER_IN_TEXT = "(?<![0-9]){}(?![0-9])"


def _length_value(length: str) -> int | None:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kK]?)\s*", str(length))
    if not m:
        return None
    return int(round(float(m.group(1)) * (1000 if m.group(2) else 1)))


def _position(value: str) -> int | str:
    v = str(value).strip()
    return int(v) if re.fullmatch(r"-?\d+", v) else v


def _floats(value) -> list[float] | None:
    if value is None or str(value).strip() == "":
        return None
    try:
        return [float(x) for x in str(value).split()]
    except ValueError:
        return None


def context_id(needles: int, lang: str, length: str, position, run: int) -> str:
    return f"{needles}n.{lang}.{length}.{position}.r{run}"


def parse_cases(text: str, *, lang: str, source: str = "<text>",
                length_unit: str | None = None, needles: int | None = None) -> list[dict]:
    """Context rows of one mLongRR CSV's text (see :func:`load_file`); never raises for a
    bad row (it becomes a row with ``error``), raises ValueError for a bad header."""
    raise_csv_field_limit()
    reader = csv.DictReader(io.StringIO(text, newline=""))
    n = needles_in_columns(reader.fieldnames or [])
    if needles is not None and needles != n:
        raise ValueError(f"{source}: the data entry says {needles} needle(s) but the columns "
                         f"hold {n}")
    for col in ("context_length", "position", "text"):
        if col not in (reader.fieldnames or []):
            raise ValueError(f"{source}: no `{col}` column in {reader.fieldnames}")
    lab_cols = ["label"] if n == 1 else [f"label{i}" for i in range(1, n + 1)]
    city_cols = ["city"] if n == 1 else [f"city{i}" for i in range(1, n + 1)]
    out, seen = [], set()
    for row_no, row in enumerate(reader, 2):
        length = str(row.get("context_length") or "").strip()
        position = _position(row.get("position") or "")
        run = int(row["run"]) if str(row.get("run") or "").strip().isdigit() else 0
        cid = context_id(n, lang, length, position, run)
        text_ = row.get("text") or ""
        labels = [str(row.get(c) or "").strip() for c in lab_cols]
        cities = [str(row.get(c) or "").strip() for c in city_cols]
        ctx = {"context_id": cid, "needles": n, "lang": lang, "length": length,
               "length_value": _length_value(length),
               "unit": length_unit or (row.get("count_unit") or "").strip() or "unknown",
               "position": position, "run": run, "text": text_, "labels": labels,
               "cities": cities, "gold": None, "target": None, "depth_chars": None,
               "depth_measured": _floats(row.get("depth_measured")),
               "source": source, "row": row_no, "error": None}
        errors = []
        if cid in seen:
            errors.append(f"duplicate case {cid}")
        seen.add(cid)
        if not text_.strip():
            errors.append("empty text")
        for lab in labels:
            if not re.fullmatch(r"[0-9]+", lab):
                errors.append(f"label {lab!r} is not a number")
            else:
                count = len(re.findall(_NUMBER_IN_TEXT.format(lab), text_))
                if count != 1:
                    errors.append(f"label {lab} occurs {count} times in the text")
        if not errors:
            gold_i = max(range(n), key=lambda i: (int(labels[i]), -i))
            ctx["gold"], ctx["target"] = labels[gold_i], gold_i
            ctx["depth_chars"] = [
                re.search(_NUMBER_IN_TEXT.format(lab), text_).start() / max(1, len(text_))
                for lab in labels]
        else:
            ctx["error"] = f"{source} row {row_no}: " + "; ".join(errors)
        out.append(ctx)
    return out


_FILE_CACHE: dict[tuple, list[dict]] = {}


def load_file(path: str, *, lang: str | None = None, length_unit: str | None = None,
              needles: int | None = None, filesystem=None) -> list[dict]:
    """The context rows of one mLongRR CSV: ``context_id`` (``{n}n.{lang}.{length}.
    {position}.r{run}``), ``needles``, ``lang``, ``length`` ("2k"), ``length_value`` (2000),
    ``unit``, ``position`` (int, or a string such as "random"), ``run`` (0 without a ``run``
    column), ``text``, ``labels``, ``cities``, ``gold`` (the largest label), ``target`` (its
    index in ``labels``), ``depth_chars`` (label start / text length, measured),
    ``depth_measured`` (the builder's count-based depth, when the file has it), ``source``,
    ``row`` and ``error``. Cached per (path, size, mtime); callers must not mutate rows."""
    lang = lang or _lang_of_file(path)
    if lang is None:
        raise ValueError(f"{path}: no language given and none in the file name")
    key: tuple = (path, lang, length_unit, needles)
    if filesystem is None and "://" not in path:
        st = os.stat(path)
        key += (st.st_size, st.st_mtime_ns)
        if key in _FILE_CACHE:
            return _FILE_CACHE[key]
    rows = parse_cases(read_text(path, filesystem), lang=lang, source=path,
                       length_unit=length_unit, needles=needles)
    if len(key) > 4:
        if len(_FILE_CACHE) > 16:
            _FILE_CACHE.clear()
        _FILE_CACHE[key] = rows
    return rows


def load_contexts(opts: Mapping, *, filesystem=None) -> list[dict]:
    """Every context the options select (checked options, :func:`check_options`)."""
    out = []
    for entry in opts["data"]:
        if entry["lang"] not in opts["context_langs"]:
            continue
        rows = load_file(entry["path"], lang=entry["lang"], length_unit=entry["length_unit"],
                         needles=entry["needles"], filesystem=filesystem)
        kept = [r for r in rows if r["needles"] in opts["needles"]
                and (opts.get("lengths") is None or r["length"] in opts["lengths"])
                and (opts.get("positions") is None or str(r["position"]) in opts["positions"])
                and (opts.get("runs") is None or str(r["run"]) in opts["runs"])]
        out += kept[:opts["limit"]] if opts.get("limit") else kept
    return out


# --- sentence splitting -------------------------------------------------------------------

class Sentence(NamedTuple):
    index: int
    start: int
    end: int
    text: str


@dataclass(frozen=True, eq=False)
class Splitter:
    """A Punkt sentence splitter; ``fingerprint`` names it in results."""

    kind: str
    sent_end_chars: tuple[str, ...]
    fingerprint: str
    tokenizer: Any = field(repr=False)

    def spans(self, text: str) -> list[tuple[int, int]]:
        return [(int(s), int(e)) for s, e in self.tokenizer.span_tokenize(text)]

    def sentences(self, text: str) -> list[Sentence]:
        return [Sentence(i, s, e, text[s:e]) for i, (s, e) in enumerate(self.spans(text))]


def _punkt_lines(name: str) -> list[str]:
    with open(PUNKT_ENGLISH_DIR / name, encoding="utf-8") as f:
        return [line[:-1] if line.endswith("\n") else line for line in f]


def punkt_english_parameters():
    """NLTK's English punkt_tab parameters, read as ``nltk.tokenize.punkt.load_punkt_params``
    reads its four files (``data/cross/README.md`` gives their provenance)."""
    from nltk.tokenize.punkt import PunktParameters

    p = PunktParameters()
    p.collocations = {tuple(line.split("\t")) for line in _punkt_lines("collocations.tab")}
    p.sent_starters = set(_punkt_lines("sent_starters.txt"))
    p.abbrev_types = set(_punkt_lines("abbrev_types.txt"))
    p.ortho_context = defaultdict(int, {a: int(b) for a, b in (
        line.split("\t") for line in _punkt_lines("ortho_context.tab"))})
    return p


def _params_digest(p) -> str:
    h = hashlib.sha256()
    for name, items in (("abbrev_types", sorted(p.abbrev_types)),
                        ("collocations", sorted(p.collocations)),
                        ("sent_starters", sorted(p.sent_starters)),
                        ("ortho_context", sorted(p.ortho_context.items()))):
        h.update(json.dumps([name, items], ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()


def _make_splitter(kind: str, extra: tuple[str, ...], train_text: str | None) -> Splitter:
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
    tok = PunktSentenceTokenizer(params, lang_vars=lang_vars)  # params used as given
    desc = {"impl": "nltk.tokenize.punkt.PunktSentenceTokenizer.span_tokenize",
            "nltk": nltk.__version__, "kind": kind, "sent_end_chars": list(chars),
            "params": _params_digest(params)}
    digest = hashlib.sha256(json.dumps(desc, sort_keys=True).encode("utf-8")).hexdigest()
    return Splitter(kind, chars, f"{kind}:nltk-{nltk.__version__}:{digest[:16]}", tok)


@functools.lru_cache(maxsize=16)
def _cached_splitter(kind: str, extra: tuple[str, ...]) -> Splitter:
    return _make_splitter(kind, extra, None)


def make_splitter(kind: str = "punkt_english", extra_terminators: Iterable[str] = (),
                  train_text: str | Iterable[str] | None = None) -> Splitter:
    """The study's splitter (see the module docstring). ``punkt_trained`` trains on
    ``train_text`` (a string or texts joined by blank lines); the others are cached."""
    extra = tuple(extra_terminators)
    if kind == "punkt_trained":
        if train_text is not None and not isinstance(train_text, str):
            train_text = "\n\n".join(train_text)
        return _make_splitter(kind, extra, train_text)
    return _cached_splitter(kind, extra)


def splitter_for(opts: Mapping) -> Splitter:
    return make_splitter(opts.get("splitter", "punkt_english"),
                         opts.get("extra_terminators") or ())


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
    for lab, city in zip(ctx["labels"], ctx["cities"]):
        found = None
        cands = sorted({s for t in forms for s in _needle_strings(t, city, lab)},
                       key=lambda s: (-len(s), s))
        for s in cands:
            i = text.find(s)
            if i >= 0 and text.find(s, i + 1) < 0:
                found = (i, i + len(s), "template")
                break
        if found is None:
            m = re.search(_NUMBER_IN_TEXT.format(re.escape(lab)), text)
            found = (m.start(), m.end(), "label") if m else (-1, -1, "missing")
        out.append(found)
    return out


def protect_spans(spans: Sequence[tuple[int, int]],
                  protected: Iterable[tuple[int, int]]) -> tuple[list[tuple[int, int]], int]:
    """Merge consecutive sentence spans so that no protected character span crosses a
    sentence boundary; returns the spans and the number of merges."""
    spans = [tuple(s) for s in spans]
    merges = 0
    for ps, pe in protected:
        if ps < 0:
            continue
        first = next((i for i, (s, e) in enumerate(spans) if e > ps), None)
        last = next((i for i, (s, e) in enumerate(spans) if e >= pe), len(spans) - 1)
        if first is not None and last > first:
            spans[first:last + 1] = [(spans[first][0], spans[last][1])]
            merges += last - first
    return spans, merges


@dataclass(frozen=True)
class ContextSplit:
    """A context's sentences: ``spans`` (start, end) in order (index = position in the list),
    ``label_idx`` (the sentence of each label), ``target_idx`` (of the gold label), the
    needle spans, how many sentence merges protecting them took, and the splitter."""

    spans: tuple[tuple[int, int], ...]
    label_idx: tuple[int, ...]
    target_idx: int
    needle_spans: tuple[tuple[int, int, str], ...]
    n_merged: int
    splitter_fp: str

    @property
    def n_sentences(self) -> int:
        return len(self.spans)

    def sentences(self, text: str) -> list[Sentence]:
        return [Sentence(i, s, e, text[s:e]) for i, (s, e) in enumerate(self.spans)]


_SPLIT_CACHE: dict[tuple, ContextSplit] = {}


def context_split(ctx: Mapping, splitter: Splitter | None = None,
                  templates: Mapping | None = None) -> ContextSplit:
    """Split a context (cached per splitter and text) with its needles kept whole."""
    splitter = splitter or make_splitter()
    text = ctx["text"]
    key = (splitter.fingerprint, hashlib.sha1(text.encode("utf-8")).hexdigest(),
           tuple(ctx["labels"]), tuple(ctx["cities"]), ctx["lang"])
    if key in _SPLIT_CACHE:
        return _SPLIT_CACHE[key]
    nspans = needle_spans(ctx, templates)
    spans, merged = protect_spans(splitter.spans(text), [(s, e) for s, e, _ in nspans])
    starts = [s for s, _ in spans]

    def idx(pos: int) -> int:
        return max(0, bisect.bisect_right(starts, pos) - 1)

    label_idx = tuple(idx(s) if s >= 0 else -1 for s, _, _ in nspans)
    target = ctx.get("target") if ctx.get("target") is not None else 0
    out = ContextSplit(tuple(spans), label_idx, label_idx[target] if label_idx else -1,
                       tuple(nspans), merged, splitter.fingerprint)
    if len(_SPLIT_CACHE) > 512:
        _SPLIT_CACHE.clear()
    _SPLIT_CACHE[key] = out
    return out


# --- exact top-k --------------------------------------------------------------------------

def rank(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Sentence indices by score descending, ties by index ascending (s2.3)."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be one-dimensional, got shape {s.shape}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    return np.lexsort((np.arange(s.size), -s))


def top_k(scores: Sequence[float] | np.ndarray, k: int) -> np.ndarray:
    """The k best sentence indices (all of them when k >= N), best first."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return rank(scores)[:k]


def label_ranks(order: Sequence[int] | np.ndarray, label_idx: Sequence[int]) -> list[int]:
    """1-based rank of each needle's sentence in a full ranking (``order`` from :func:`rank`);
    -1 for a needle that is in no sentence."""
    order = np.asarray(order)
    pos = np.empty(order.size, dtype=np.int64)
    pos[order] = np.arange(1, order.size + 1)
    return [int(pos[i]) if 0 <= i < order.size else -1 for i in label_idx]


def selection_text(text: str, spans: Sequence[tuple[int, int]], top_idx: Sequence[int], *,
                   order: str = "score", join: str = " ") -> str:
    """The text the LLM is given for a selection: the selected sentences (``top_idx`` best
    first) in rank order (``order="score"``) or document order, joined by ``join``."""
    idx = [int(i) for i in top_idx]
    if order == "document":
        idx = sorted(idx)
    elif order != "score":
        raise ValueError(f"order must be one of {list(ORDERS)}, got {order!r}")
    return join.join(text[spans[i][0]:spans[i][1]] for i in idx)


# --- templates and prompts ----------------------------------------------------------------

_PIECES = ("instruction", "question", "rules", "unanswerable")
_STATUS_ORDER = ("paper", "v1", "v1_adapted", "draft")


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
            if item["status"] not in _STATUS_ORDER:
                raise ValueError(f"{path}: {lang}.{name} has unknown status {item['status']!r}")
    return doc


def load_templates(path: str | os.PathLike | None = None) -> dict:
    """The templates file (default: the packaged ``data/cross/templates.json``)."""
    return _load_templates(str(path or TEMPLATES_PATH))


def _weakest(statuses: Iterable[str]) -> str:
    return max(statuses, key=_STATUS_ORDER.index)


def prompt_template(qlang: str, needles: int, *, variant: str = "paper",
                    templates: Mapping | None = None) -> tuple[str, str]:
    """(prompt with a ``{text}`` slot, weakest status of the strings used) for a query
    language. ``no_unanswerable`` drops the UNANSWERABLE sentence (L234)."""
    if variant not in PROMPT_VARIANTS:
        raise ValueError(f"variant must be one of {list(PROMPT_VARIANTS)}, got {variant!r}")
    t = templates or load_templates()
    entry = t["languages"][qlang]
    n = 1 if needles == 1 else 3
    pieces = {"instruction": entry["instruction"], "question": entry[f"question_{n}"],
              "rules": entry["rules"], "unanswerable": entry[f"unanswerable_{n}"]}
    layout = t["layout"]["value"]
    if variant == "no_unanswerable":
        layout = layout.replace("\n{unanswerable}", "")
        pieces.pop("unanswerable")
    out = layout
    for name, item in pieces.items():
        out = out.replace("{" + name + "}", item["value"])
    status = _weakest([t["layout"]["status"]] + [p["status"] for p in pieces.values()])
    return out, status


def build_prompt(qlang: str, needles: int, text: str, *, variant: str = "paper",
                 templates: Mapping | None = None) -> str:
    template, _ = prompt_template(qlang, needles, variant=variant, templates=templates)
    head, tail = template.split("{text}", 1)
    return head + text + tail


def query_text(qlang: str, needles: int, mode: str = "question", *,
               variant: str = "paper", templates: Mapping | None = None) -> str:
    """What the embedder compares sentences with: the question sentence in the query
    language (default), or the whole instruction without the context."""
    t = templates or load_templates()
    entry = t["languages"][qlang]
    n = 1 if needles == 1 else 3
    if mode == "question":
        return entry[f"question_{n}"]["value"]
    if mode == "instruction":
        template, _ = prompt_template(qlang, needles, variant=variant, templates=t)
        head, tail = template.split("{text}", 1)
        return "\n".join(x for x in (head.replace("#CONTEXT", "").strip(),
                                     tail.replace("#ENDCONTEXT", "").strip()) if x)
    raise ValueError(f"mode must be one of {list(QUERY_TEXTS)}, got {mode!r}")


def unanswerable_tokens(qlang: str | None, templates: Mapping | None = None) -> list[str]:
    """The UNANSWERABLE token(s) of a query language, plus the English one."""
    t = templates or load_templates()
    toks = list(t["languages"].get(qlang or "en", {}).get("unanswerable_tokens", {})
                .get("value", []))
    return list(dict.fromkeys(toks + ["UNANSWERABLE"]))


def city_names(lang: str, templates: Mapping | None = None) -> dict[str, str]:
    """English name -> the name in ``lang`` for the 23 V2 cities (L311-335)."""
    t = templates or load_templates()
    return dict(t["languages"][lang]["cities"]["value"])


# --- settings, cells and prompt rows ------------------------------------------------------

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


def settings(opts: Mapping) -> list[str]:
    out = []
    for n in opts["needles"]:
        for method in opts["methods"]:
            if method == "cross":
                out += [setting_name(n, "cross", k) for k in opts["ks"]]
            else:
                out.append(setting_name(n, method))
    return out


def cell_langs(opts: Mapping) -> list[str]:
    """``f"{query}-{context}"`` for every pair (never a dot: cell ids join with dots)."""
    return [f"{q}-{c}" for q in opts["query_langs"] for c in opts["context_langs"]]


def split_cell_lang(lang: str) -> tuple[str, str]:
    q, _, c = lang.partition("-")
    if not q or not c:
        raise ValueError(f"a CROSS cell language is `<query>-<context>`, got {lang!r}")
    return q, c


def needs_selection(setting: str) -> bool:
    return parse_setting(setting)[1] == "cross"


def words(text: str) -> int:
    """Whitespace words (the model-free length measure of the reduction)."""
    return len(text.split())


def needle_only_text(ctx: Mapping, split: ContextSplit, join: str = " ") -> str:
    """The needle(s) alone, in document order (the L102 sanity check)."""
    spans = sorted((s, e) for s, e, _ in split.needle_spans if s >= 0)
    return join.join(ctx["text"][s:e] for s, e in spans)


def given_text(ctx: Mapping, method: str, k: int | None = None, *,
               selection: Mapping | None = None, order: str = "score", join: str = " ",
               splitter: Splitter | None = None, templates: Mapping | None = None
               ) -> tuple[str, dict]:
    """The context text the LLM sees for one method, and what was measured about it.

    ``selection`` (CROSS only) holds ``scores`` (one per sentence, in sentence order) or
    ``top_idx`` (the ranking, best first, at least k long or complete) with
    ``n_sentences``; a selection made with another split is an error (ValueError)."""
    split = context_split(ctx, splitter, templates)
    info: dict[str, Any] = {"n_sentences": split.n_sentences, "splitter_fp": split.splitter_fp,
                            "n_merged": split.n_merged, "label_idx": list(split.label_idx),
                            "target_idx": split.target_idx, "label_rank": None,
                            "target_rank": None, "k": k}
    fp = (selection or {}).get("splitter_fp")
    if method == "cross" and fp is not None and fp != split.splitter_fp:
        raise ValueError(f"{ctx['context_id']}: the selection was made with splitter {fp}, "
                         f"this split is {split.splitter_fp}")
    if method == "baseline":
        text = ctx["text"]
    elif method == "needle_only":
        text = needle_only_text(ctx, split, join)
    elif method == "cross":
        if selection is None or k is None:
            raise ValueError("CROSS needs a selection and k")
        if selection.get("scores") is not None:
            scores = np.asarray(selection["scores"], dtype=np.float64)
            if scores.size != split.n_sentences:
                raise ValueError(f"{ctx['context_id']}: {scores.size} scores for "
                                 f"{split.n_sentences} sentences (splitter drift?)")
            order_all = rank(scores)
            info["label_rank"] = label_ranks(order_all, split.label_idx)
            top = order_all[:k]
        else:
            top = [int(i) for i in selection["top_idx"]]
            n = selection.get("n_sentences", split.n_sentences)
            if n != split.n_sentences:
                raise ValueError(f"{ctx['context_id']}: the selection has {n} sentences, this "
                                 f"split {split.n_sentences} (splitter drift?)")
            if len(top) < min(k, n):
                raise ValueError(f"{ctx['context_id']}: a ranking of {len(top)} for k={k}")
            full = selection.get("label_rank")
            if full is not None:
                info["label_rank"] = [int(r) for r in full]
            else:  # ranks beyond a partial ranking are unknown (None)
                pos = {i: r for r, i in enumerate(top, 1)}
                info["label_rank"] = [pos.get(i) for i in split.label_idx]
            top = top[:k]
        info["target_rank"] = info["label_rank"][ctx["target"]]
        text = selection_text(ctx["text"], split.spans, top, order=order, join=join)
        info["top_idx"] = [int(i) for i in top]
    else:
        raise ValueError(f"unknown method {method!r}")
    info.update(text_words=words(text), context_words=words(ctx["text"]),
                text_chars=len(text), context_chars=len(ctx["text"]))
    return text, info


def _found(gold: str, text: str) -> bool:
    return re.search(_NUMBER_IN_TEXT.format(re.escape(gold)), text) is not None


def prompt_row(ctx: Mapping, setting: str, qlang: str, opts: Mapping, *,
               selection: Mapping | None = None, splitter: Splitter | None = None,
               templates: Mapping | None = None) -> dict:
    """One PROMPTS row (``item_id``=context id, ``study``, ``setting``, ``lang``=``q-c``,
    ``prompt``, ``error``) with ``meta``: what scoring needs without re-reading the prompt."""
    n, method, k = parse_setting(setting)
    lang = f"{qlang}-{ctx['lang']}"
    base = {"item_id": ctx["context_id"], "study": STUDY, "setting": setting, "lang": lang,
            "prompt": None, "error": ctx.get("error"), "meta": None}
    if base["error"]:
        return base
    templates = templates or load_templates(opts.get("templates"))
    splitter = splitter or splitter_for(opts)
    try:
        text, info = given_text(ctx, method, k, selection=selection,
                                order=opts.get("order", "score"), join=opts.get("join", " "),
                                splitter=splitter, templates=templates)
        template, status = prompt_template(qlang, n, variant=opts.get("prompt_variant", "paper"),
                                           templates=templates)
    except (ValueError, KeyError) as e:
        return {**base, "error": f"{type(e).__name__}: {e}"}
    head, tail = template.split("{text}", 1)
    labels = list(ctx["labels"])
    meta = {"needles": n, "method": method, "k": k, "qlang": qlang, "clang": ctx["lang"],
            "length": ctx["length"], "length_value": ctx["length_value"], "unit": ctx["unit"],
            "position": ctx["position"], "run": ctx["run"], "gold": ctx["gold"],
            "labels": labels, "target_in_text": _found(ctx["gold"], text),
            "all_in_text": all(_found(lab, text) for lab in labels),
            "template_status": status, "prompt_variant": opts.get("prompt_variant", "paper"),
            "order": opts.get("order", "score"), "join": opts.get("join", " "), **info}
    return {**base, "prompt": head + text + tail, "meta": meta}


def prompt_rows(opts: Mapping, setting: str, lang: str, *, contexts: Sequence[Mapping] | None
                = None, selections: Mapping[tuple[str, str], Mapping] | None = None,
                filesystem=None) -> list[dict]:
    """The prompt rows of one cell (``setting``, ``lang`` = ``q-c``). ``selections`` maps
    (context_id, query language) to a selection (:func:`given_text`); CROSS rows without
    one are error rows."""
    qlang, clang = split_cell_lang(lang)
    n, method, _ = parse_setting(setting)
    if contexts is None:
        contexts = load_contexts(opts, filesystem=filesystem)
    splitter = splitter_for(opts)
    templates = load_templates(opts.get("templates"))
    out = []
    for ctx in contexts:
        if ctx["lang"] != clang or ctx["needles"] != n:
            continue
        sel = None
        if method == "cross":
            sel = (selections or {}).get((ctx["context_id"], qlang))
            if sel is None:
                out.append({"item_id": ctx["context_id"], "study": STUDY, "setting": setting,
                            "lang": lang, "prompt": None, "meta": None,
                            "error": ctx.get("error") or "no selection for this context"})
                continue
        out.append(prompt_row(ctx, setting, qlang, opts, selection=sel, splitter=splitter,
                              templates=templates))
    return out


# --- scoring ------------------------------------------------------------------------------

# Separators dropped between two digits: , . ' ’ Arabic thousands/decimal separators and
# comma, space, no-break/figure/thin/narrow no-break spaces, and invisible bidi marks.
DIGIT_SEPARATORS = (",.'\u2019\u066c\u066b\u060c \u00a0\u2007\u2009\u202f"
                    "\u200e\u200f\u061c\u2066\u2067\u2068\u2069")
_SEP_RE = re.compile("(?<=[0-9])[" + re.escape(DIGIT_SEPARATORS) + "](?=[0-9])")
_SEVEN = re.compile(r"(?<![0-9])[0-9]{7}(?![0-9])")


def normalize_digits(text: str) -> str:
    """Every Unicode decimal digit (category Nd: Persian, Arabic-Indic, Devanagari, ...)
    becomes its ASCII digit, then the separators between two digits are dropped
    (``7,252,750`` / ``7 252 750`` / ``۷٬۲۵۲٬۷۵۰`` -> ``7252750``)."""
    if not text:
        return ""
    chars = [str(unicodedata.decimal(ch)) if unicodedata.category(ch) == "Nd" else ch
             for ch in text]
    return _SEP_RE.sub("", "".join(chars))


def seven_digit_numbers(text: str) -> list[str]:
    return _SEVEN.findall(normalize_digits(text))


def contains_gold(output: str | None, gold: str) -> bool:
    """The primary metric: the gold string occurs in the normalized output (s1.7)."""
    return bool(output) and str(gold) in normalize_digits(output)


def strict_correct(output: str | None, gold: str) -> bool:
    """The secondary metric: the 7-digit numbers of the output are exactly {gold}."""
    return bool(output) and set(seven_digit_numbers(output)) == {str(gold)}


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
                 templates: Mapping | None = None) -> dict:
    return {"correct": contains_gold(output, gold), "strict": strict_correct(output, gold),
            "unanswerable": is_unanswerable(output, qlang, templates),
            "numbers": seven_digit_numbers(output or "")}


def reference_row_found(gold, output) -> int:
    """v1's 1-needle ``evaluate`` (gpt4_experiments.ipynb): raw containment, 1/0."""
    return int(str(gold) in str(output))


def reference_any_row_found(golds: Sequence, outputs: Sequence[str]) -> list[int]:
    """v1's ``evaluate_3needle_v2`` (s1.7), reproduced only so that a test can pin that
    xling does NOT score this way: a row is credited when ANY row's output contains its
    gold (``df['generated_text'].str.contains(x).any()``)."""
    return [int(any(str(g) in str(o) for o in outputs)) for g in golds]


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
    present = target_in_cap if rule == "target" else bool(all_in_cap if all_in_cap is not None
                                                           else target_in_cap)
    if not present:
        return "embedding_failure", "embedding_failure"
    return "llm_failure", "llm_unanswerable" if unanswerable else "llm_incorrect"


def reduction(context: str, given: str, tokenizer: Callable[[str], Any] | None = None) -> dict:
    """Input reduction of one prompt (L145-151): 1 - given/context in whitespace words, and
    in tokens when a tokenizer callable (returning a list or a count) is passed."""
    def ntok(s: str) -> int:
        r = tokenizer(s)
        return int(r) if isinstance(r, (int, np.integer)) else len(r)

    cw = words(context)
    out = {"reduction_words": (1 - words(given) / cw) if cw else None,
           "reduction_tokens": None}
    if tokenizer is not None:
        ct = ntok(context)
        out["reduction_tokens"] = (1 - ntok(given) / ct) if ct else None
    return out


def _system(method: str, k) -> str:
    return f"cross@{int(k)}" if method == "cross" else method


def score_rows(rows: Iterable[Mapping], *, rule: str = "target",
               templates: Mapping | None = None) -> pd.DataFrame:
    """Per-item scores. Each row holds ``output`` (None for an error/refused generation),
    ``meta`` (from :func:`prompt_row`; its keys may also sit at the top level) and
    optionally ``model``, ``item_id``, ``error``, ``too_long``/``refused`` and
    ``n_prompt_tokens``. Rows are scored one by one: only a row's own output counts."""
    recs = []
    for r in rows:
        meta = dict(r.get("meta") or {})
        get = (lambda key, default=None: r[key] if key in r and r[key] is not None
               else meta.get(key, default))
        method, k = get("method"), get("k")
        gold = get("gold") or gold_label(get("labels"))
        qlang = get("qlang")
        output = r.get("output")
        refused = bool(r.get("too_long") or r.get("refused"))
        s = score_output(output, gold, qlang=qlang, templates=templates)
        target_in = bool(get("target_in_text", True))
        all_in = bool(get("all_in_text", target_in))
        cls, detail = failure_class(correct=s["correct"], target_in_cap=target_in,
                                    all_in_cap=all_in, unanswerable=s["unanswerable"],
                                    refused=refused, rule=rule)
        tw, cw = get("text_words"), get("context_words")
        recs.append({
            "model": r.get("model", "model"), "item_id": r.get("item_id"),
            "setting": r.get("setting") or setting_name(get("needles"), method, k),
            "needles": get("needles"), "method": method, "k": k,
            "system": _system(method, k), "qlang": qlang, "clang": get("clang"),
            "length": get("length"), "length_value": get("length_value"),
            "position": get("position"), "run": get("run"), "gold": gold,
            "correct": s["correct"] and not refused, "strict": s["strict"] and not refused,
            "unanswerable": s["unanswerable"], "refused": refused,
            "failure": cls, "failure_detail": detail,
            "target_in_cap": target_in, "all_in_cap": all_in,
            "target_rank": get("target_rank"),
            "hit": (target_in if method == "cross" else None),
            "reduction_words": (1 - tw / cw) if tw is not None and cw else None,
            "n_prompt_tokens": r.get("n_prompt_tokens"),
        })
    df = pd.DataFrame.from_records(recs)
    if len(df) and df["n_prompt_tokens"].notna().any():
        df = add_token_reduction(df)
    else:
        df["reduction_tokens"] = None
    return df


def add_token_reduction(items: pd.DataFrame) -> pd.DataFrame:
    """``reduction_tokens`` = 1 - prompt tokens / the baseline's prompt tokens for the same
    (model, item_id, qlang) (refused baseline rows keep their token count)."""
    base = items[items["method"] == "baseline"].set_index(["model", "item_id", "qlang"])[
        "n_prompt_tokens"]
    base = base[~base.index.duplicated()]
    keys = list(zip(items["model"], items["item_id"], items["qlang"]))
    den = pd.Series([base.get(key) for key in keys], index=items.index, dtype="float64")
    items = items.copy()
    items["reduction_tokens"] = 1 - items["n_prompt_tokens"].astype("float64") / den
    return items


# --- tables -------------------------------------------------------------------------------

def _length_key(values: Iterable[str]) -> list[str]:
    return sorted(set(values), key=lambda v: (_length_value(v) or 0, str(v)))


def _system_key(s: str) -> tuple:
    if s.startswith("cross@"):
        return (1, int(s[6:]))
    return ({"baseline": 0, "cross": 2, "needle_only": 3}.get(s, 4), 0)


def _pct(x: pd.Series) -> float:
    x = x.dropna()
    return float(100 * x.astype(float).mean()) if len(x) else float("nan")


def accuracy_table(items: pd.DataFrame, by: str | Sequence[str], *, metric: str = "correct",
                   cross_mean: bool = True) -> pd.DataFrame:
    """% of items with ``metric`` true, rows ``needles`` x ``by``, columns system (per model
    when there are several): baseline, cross@k..., ``cross`` (unweighted mean over k, the
    paper's "CROSS" average, s3.1), needle_only."""
    by = [by] if isinstance(by, str) else list(by)
    multi = items["model"].nunique() > 1
    col = ["model", "system"] if multi else ["system"]
    g = items.groupby(["needles", *by, *col], dropna=False)[metric].apply(_pct)
    table = g.unstack(col)
    if cross_mean:
        cross_cols = [c for c in table.columns
                      if str(c[1] if multi else c).startswith("cross@")]
        if cross_cols:
            if multi:
                for m in sorted({c[0] for c in cross_cols}):
                    table[(m, "cross")] = table[[c for c in cross_cols if c[0] == m]].mean(axis=1)
            else:
                table["cross"] = table[cross_cols].mean(axis=1)
    cols = sorted(table.columns, key=lambda c: (c[0], _system_key(c[1])) if multi
                  else _system_key(c))
    table = table[cols]
    if multi:
        table.columns = [f"{m}: {s}" for m, s in table.columns]
    else:
        table.columns = [str(c) for c in table.columns]
    table.columns.name = None
    if "length" in by:
        order = _length_key(items["length"])
        table = table.reindex(sorted(table.index, key=lambda ix: (
            ix[0], *[order.index(v) if b == "length" else v
                     for b, v in zip(by, ix[1:])])))
    return table


def table_summary(items: pd.DataFrame) -> pd.DataFrame:
    """T1 (s5.5): accuracy over all cases and the paper's slices, rows needles x model x
    system: ``<=64k`` / ``>64k`` (L110: "under 64k words", the five lengths 2k-64k), ``mid``
    (depths 25/50/75, L125) and ``edge`` (0/100); ``cross`` = the mean over k."""
    def acc(g: pd.DataFrame) -> dict:
        lv, pos = g["length_value"], g["position"]
        return {"all": _pct(g["correct"]), "<=64k": _pct(g.loc[lv <= 64_000, "correct"]),
                ">64k": _pct(g.loc[lv > 64_000, "correct"]),
                "mid": _pct(g.loc[pos.isin(MID_POSITIONS), "correct"]),
                "edge": _pct(g.loc[pos.isin((0, 100)), "correct"]), "n": len(g)}

    rows = {}
    for (n, model, system), g in items.groupby(["needles", "model", "system"]):
        rows[(n, model, system)] = acc(g)
    t = pd.DataFrame.from_dict(rows, orient="index")
    t.index.names = ["needles", "model", "system"]
    for n, model in {(ix[0], ix[1]) for ix in t.index}:
        ks = [ix for ix in t.index if ix[:2] == (n, model) and str(ix[2]).startswith("cross@")]
        if ks:
            mean = t.loc[ks].drop(columns="n").mean(axis=0)
            t.loc[(n, model, "cross"), :] = [*mean.tolist(), int(t.loc[ks, "n"].sum())]
    t["n"] = t["n"].astype(int)
    return t.reindex(sorted(t.index, key=lambda ix: (ix[0], ix[1], _system_key(ix[2]))))


def table_by_length(items: pd.DataFrame) -> pd.DataFrame:
    """Fig 1 / 15 / 16: accuracy by context length."""
    return accuracy_table(items, "length")


def table_by_depth(items: pd.DataFrame) -> pd.DataFrame:
    """Fig 2 / 17: accuracy by needle depth (1 needle; 3-needle rows by window/position)."""
    return accuracy_table(items, "position")


def table_by_k(items: pd.DataFrame) -> pd.DataFrame:
    """Fig 12 / 13: CROSS accuracy by cap size k (rows needles x k, columns model)."""
    cross = items[items["method"] == "cross"]
    g = cross.groupby(["needles", "k", "model"])["correct"].apply(_pct).unstack("model")
    g.columns.name = None
    g.index = g.index.set_levels(g.index.levels[1].astype(int), level=1)
    return g


def table_pairs(items: pd.DataFrame, *, system: str = "cross", needles: int | None = None
                ) -> pd.DataFrame:
    """Fig 11 / T5: query language (rows) x context language (columns) accuracy, with a
    ``mean`` row and column (unweighted means of the cells). ``system`` ``cross`` pools every
    k (= the mean over k at equal n); or ``baseline``, ``cross@10``, ..."""
    sel = (items[items["method"] == "cross"] if system == "cross"
           else items[items["system"] == system])
    if needles is not None:
        sel = sel[sel["needles"] == needles]
    m = sel.groupby(["qlang", "clang"])["correct"].apply(_pct).unstack("clang")
    qs = [q for q in LANGS if q in m.index] + [q for q in m.index if q not in LANGS]
    cs = [c for c in LANGS if c in m.columns] + [c for c in m.columns if c not in LANGS]
    m = m.reindex(index=qs, columns=cs)
    m["mean"] = m.mean(axis=1)
    m.loc["mean"] = m.mean(axis=0)
    m.index.name, m.columns.name = "query \\ context", None
    return m


def table_failures(items: pd.DataFrame, by: Sequence[str] = ("needles", "model", "system")
                   ) -> pd.DataFrame:
    """Fig 6 / 8 / 9 / 18 / 19: failure classes in % of all items (rows sum to 100)."""
    by = list(by)
    t = pd.crosstab([items[b] for b in by], items["failure_detail"], normalize="index") * 100
    for c in FAILURE_DETAILS:
        if c not in t.columns:
            t[c] = 0.0
    t = t[list(FAILURE_DETAILS)]
    t["llm_failure"] = t["llm_unanswerable"] + t["llm_incorrect"]
    t.columns.name = None
    if "system" in by:
        t = t.reindex(sorted(t.index, key=lambda ix: tuple(
            _system_key(v) if b == "system" else v for b, v in zip(by, ix))))
    return t


def table_hits(items: pd.DataFrame) -> pd.DataFrame:
    """LLM-free retrieval: % of CROSS items whose target (``hit@k``) and all labels
    (``all@k``) were in the cap, by needles x k."""
    cross = items[items["method"] == "cross"].astype({"k": int})
    g = cross.groupby(["needles", "k"]).agg(
        **{"hit@k": ("target_in_cap", _pct), "all@k": ("all_in_cap", _pct),
           "n": ("target_in_cap", "size")})
    return g


def table_reduction(items: pd.DataFrame, *, column: str = "reduction_words") -> pd.DataFrame:
    """Fig 14: mean input reduction (%) of CROSS by context length x context language."""
    cross = items[items["method"] == "cross"].dropna(subset=[column])
    t = cross.groupby(["length", "clang"])[column].mean().unstack("clang") * 100
    t = t.reindex(index=_length_key(t.index),
                  columns=[c for c in LANGS if c in t.columns] +
                  [c for c in t.columns if c not in LANGS])
    t.columns.name = None
    return t


def to_markdown(df: pd.DataFrame, *, digits: int = 1, title: str | None = None) -> str:
    """A pandas table as GitHub markdown (no tabulate needed); NaN -> "–"."""
    def fmt(v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "–"
        if isinstance(v, (float, np.floating)):
            return f"{v:.{digits}f}"
        return str(v)

    idx_names = [n if n is not None else "" for n in (df.index.names or [None])]
    header = [*idx_names, *[str(c) for c in df.columns]]
    lines = ([f"**{title}**", ""] if title else []) + [
        "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for ix, *row in df.itertuples(index=True, name=None):  # keeps each column's type
        ix = ix if isinstance(ix, tuple) else (ix,)
        lines.append("| " + " | ".join([*(fmt(v) for v in ix), *(fmt(v) for v in row)]) + " |")
    if df.empty:
        lines.append("| (no results) |" + " |" * (len(header) - 1))
    return "\n".join(lines)


def tables(items: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Every table of the study (item scores from :func:`score_rows`) by name."""
    out = {"summary": table_summary(items), "by_length": table_by_length(items),
           "by_depth": table_by_depth(items)}
    if (items["method"] == "cross").any():
        out["by_k"] = table_by_k(items)
        out["hits"] = table_hits(items)
        for n in sorted(items["needles"].unique()):
            out[f"pairs_{n}n"] = table_pairs(items, needles=int(n))
        if items["reduction_words"].notna().any():
            out["reduction"] = table_reduction(items)
    if (items["method"] == "baseline").any():
        for n in sorted(items["needles"].unique()):
            out[f"pairs_{n}n_baseline"] = table_pairs(items, system="baseline", needles=int(n))
    out["failures"] = table_failures(items)
    return out


TABLE_TITLES = {
    "summary": "Accuracy (%): all, <=64k / >64k, mid (25-75) / edge (0, 100) (T1; L108-127)",
    "by_length": "Accuracy (%) by context length (Fig 1, 15, 16)",
    "by_depth": "Accuracy (%) by needle depth (Fig 2, 17)",
    "by_k": "CROSS accuracy (%) by cap size k (Fig 12, 13)",
    "hits": "Target / all needles in the cap (%), LLM-free",
    "reduction": "Mean input reduction (%) of CROSS, whitespace words (Fig 14)",
    "failures": "Failure classes (% of all items; Fig 6, 8, 9)",
}


def markdown_tables(items: pd.DataFrame) -> str:
    parts = []
    for name, df in tables(items).items():
        title = TABLE_TITLES.get(name) or (
            f"Query x context accuracy (%), {name.split('_')[1]}"
            f"{', baseline' if name.endswith('baseline') else ', CROSS (all k)'} (Fig 11)")
        parts.append(to_markdown(df, title=title))
    return "\n\n".join(parts) + "\n"


# --- plots (matplotlib imported inside; Agg canvas, no pyplot state) ----------------------

def _figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _save(fig, path: str | os.PathLike) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    return str(path)


def plot_accuracy(items: pd.DataFrame, by: str, path: str | os.PathLike) -> str:
    """Accuracy vs ``by`` (``length``, ``position`` or ``k``), one panel per needle count,
    one line per system (and model); a PNG at ``path``."""
    table = table_by_k(items) if by == "k" else accuracy_table(items, by)
    needles = sorted({ix[0] for ix in table.index})
    fig, axes = _figure(len(needles))
    for ax, n in zip(axes, needles):
        sub = table.xs(n, level=0)
        xs = [str(x) for x in sub.index]
        for col in sub.columns:
            ax.plot(xs, sub[col].to_numpy(dtype=float), marker="o", label=str(col))
        ax.set_title(f"{n} needle{'s' if n > 1 else ''}")
        ax.set_xlabel({"length": "context length", "position": "needle depth (%)",
                       "k": "sentence cap k"}.get(by, by))
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_pair_heatmap(items: pd.DataFrame, path: str | os.PathLike, *, system: str = "cross",
                      needles: int | None = None) -> str:
    """The query x context accuracy matrix (Fig 11's data) as a heatmap."""
    m = table_pairs(items, system=system, needles=needles)
    fig, (ax,) = _figure(1, 6.0, 5.0)
    im = ax.imshow(m.to_numpy(dtype=float), vmin=0, vmax=100, cmap="viridis")
    ax.set_xticks(range(len(m.columns)), [str(c) for c in m.columns])
    ax.set_yticks(range(len(m.index)), [str(i) for i in m.index])
    ax.set_xlabel("context language")
    ax.set_ylabel("query language")
    for (i, j), v in np.ndenumerate(m.to_numpy(dtype=float)):
        if not math.isnan(v):
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7, color="w")
    ax.figure.colorbar(im, ax=ax, label="accuracy (%)")
    ax.set_title(f"{system}{'' if needles is None else f', {needles} needle(s)'}")
    return _save(fig, path)


def plot_failures(items: pd.DataFrame, path: str | os.PathLike) -> str:
    """Stacked bars of failure classes by system (Fig 6/8/9 style), one panel per needles."""
    t = table_failures(items, by=("needles", "system"))
    needles = sorted({ix[0] for ix in t.index})
    fig, axes = _figure(len(needles))
    colors = {"correct": "#4c9a2a", "embedding_failure": "#d62728",
              "llm_unanswerable": "#ff7f0e", "llm_incorrect": "#9467bd", "too_long": "#7f7f7f"}
    for ax, n in zip(axes, needles):
        sub = t.xs(n, level=0)
        xs = [str(x) for x in sub.index]
        bottom = np.zeros(len(sub))
        for c in FAILURE_DETAILS:
            vals = sub[c].to_numpy(dtype=float)
            ax.bar(xs, vals, bottom=bottom, label=c, color=colors[c])
            bottom += vals
        ax.set_title(f"{n} needle{'s' if n > 1 else ''}")
        ax.set_ylabel("% of items")
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.legend(fontsize=6)
    return _save(fig, path)


# --- builder: V2-style cases from any documents -------------------------------------------

def make_counter(unit: str | Callable[[str], Any] = "words:nltk",
                 splitter: Splitter | None = None) -> Callable[[str], int]:
    """A length counter: ``words:nltk`` (NLTK word tokens over Punkt sentences, the V2 unit
    per s1.3), ``words:whitespace``, or a tokenizer callable (a list or a count)."""
    if callable(unit):
        def count(text: str) -> int:
            r = unit(text)
            return int(r) if isinstance(r, (int, np.integer)) else len(r)
        return count
    if unit == "words:whitespace":
        return words
    if unit == "words:nltk":
        from nltk.tokenize.destructive import NLTKWordTokenizer

        wt = NLTKWordTokenizer()
        sp = splitter or make_splitter()
        return lambda text: sum(len(wt.tokenize(s.text)) for s in sp.sentences(text))
    raise ValueError(f"unknown length unit {unit!r}: use words:nltk, words:whitespace or a "
                     "tokenizer callable")


def build_haystack(documents: Iterable[Mapping], budget: int, count: Callable[[str], int],
                   splitter: Splitter) -> tuple[str, list[str], int]:
    """v1's ``haystack_builder`` (s1.5): whole documents joined by one space while the
    running count stays <= budget; a first document longer than the budget is skipped; the
    document that would overflow is cut at the last sentence that still fits, and the
    haystack ends. Returns (text, doc ids used, count). ValueError if the documents run out."""
    parts, ids, total = [], [], 0
    for doc in documents:
        text = str(doc.get("text") or "").strip()
        if not text:
            continue
        c = count(text)
        if total + c <= budget:
            parts.append(text)
            ids.append(str(doc.get("doc_id")))
            total += c
            if total == budget:
                return " ".join(parts), ids, total
            continue
        if not parts:
            continue  # v1 skips a first article that alone is too long
        kept = []
        for s in splitter.sentences(text):
            sc = count(s.text)
            if total + sc > budget:
                break
            kept.append(s.text)
            total += sc
        if kept:
            parts.append(" ".join(kept))
            ids.append(str(doc.get("doc_id")))
        return " ".join(parts), ids, total
    raise ValueError(f"the documents hold only {total} of the {budget} units asked for")


def depth_boundary(cum: Sequence[float], p: float) -> int:
    """The exact boundary search (s1.8 "Missing" c): the first sentence boundary whose
    cumulative count is >= p % of the total (boundary b = before sentence b; N = the end)."""
    target = p / 100.0 * cum[-1]
    return bisect.bisect_left(cum, target - 1e-9)


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
        kval = _length_value(f"{length}k" if isinstance(length, int) else str(length))
        if not kval or kval <= buffer:
            raise ValueError(f"bad length {length!r}: give thousands (2) or '2k', above the "
                             f"buffer of {buffer}")
        label = f"{int(kval / 1000)}k" if kval % 1000 == 0 else str(length)
        hay, doc_ids, _ = build_haystack(docs, kval - buffer, count, splitter)
        sents = splitter.sentences(hay)
        spans = [(s.start, s.end) for s in sents]
        counts = [count(s.text) for s in sents]
        cum = [0] + list(np.cumsum(counts, dtype=np.int64).tolist())
        total = cum[-1]
        for position in positions:
            for run in range(runs):
                rng = random.Random(f"{seed}:{lang}:{label}:{position}:{run}")
                picked = rng.sample(pool, needles)
                labels: list[str] = []
                while len(labels) < needles:
                    x = str(rng.randint(1_000_000, 9_999_999))
                    if x not in labels and not re.search(_NUMBER_IN_TEXT.format(x), hay):
                        labels.append(x)
                if needles == 1:
                    bounds = [depth_boundary(cum, float(position))]
                elif placement == "uniform":
                    bounds = sorted(rng.sample(range(len(spans) + 1), 3))
                else:
                    lo = depth_boundary(cum, float(position))
                    hi = depth_boundary(cum, min(100.0, float(position) + 25))
                    inside = [b for b in range(lo, hi + 1) if b != lo]
                    if len(inside) < 2:
                        raise ValueError(f"{label}: window {position} holds too few boundaries")
                    bounds = sorted([lo] + rng.sample(inside, 2))
                texts = [_needle_text(template, names.get(c, c), lab, needle_period)
                         for c, lab in zip(picked, labels)]
                text, starts = _insert(hay, spans, bounds, texts)
                row: dict[str, Any] = {"context_length": label, "position": position,
                                       "text": text}
                if needles == 1:
                    row.update(city=names.get(picked[0], picked[0]), label=labels[0])
                else:
                    for i, (c, lab) in enumerate(zip(picked, labels), 1):
                        row[f"city{i}"] = names.get(c, c)
                        row[f"label{i}"] = lab
                row.update(
                    run=run, count_unit=unit_name, n_count=total,
                    depth_measured=" ".join(f"{cum[b] / total:.6f}" for b in bounds),
                    depth_chars=" ".join(f"{s / len(text):.6f}" for s in starts),
                    depth_sentences=" ".join(f"{b / max(1, len(spans)):.6f}" for b in bounds),
                    doc_ids=" ".join(doc_ids))
                rows.append(row)
    return rows


def write_cases_csv(rows: Sequence[Mapping], path: str | os.PathLike) -> str:
    """Write builder rows as an mLongRR CSV (v1 columns first), readable by :func:`load_file`."""
    if not rows:
        raise ValueError("no rows to write")
    n = 1 if "label" in rows[0] else 3
    head = ["context_length", "position", "text"] + (
        ["city", "label"] if n == 1 else [f"{x}{i}" for i in (1, 2, 3) for x in ("city", "label")])
    extra = [k for k in rows[0] if k not in head]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=head + extra, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return str(path)


# --- the study protocol (jobs/study.py) and the narrowing hooks (jobs/narrow.py) ----------
#
# A CROSS run is narrow -> generate -> evaluate -> report (spec s5.1): the narrow stage embeds
# every distinct sentence of a context language once and ranks each haystack's sentences
# against each query with :func:`select`; the generate stage's CROSS prompts read those
# selections (``needs_selection``); baseline and needle-only prompts need none. Every prompt
# row carries ``meta`` (what scoring needs), so evaluate reads neither prompts nor selections.

SCORE_COLUMNS = ("meta", "n_prompt_tokens", "too_long", "finish_reason")


def prompt_cells(opts: Mapping) -> list[dict]:
    """One cell per setting x ``q-c`` pair that has contexts (a language shipped with 1
    needle only gets no 3-needle cells)."""
    have = {(c["needles"], c["lang"]) for c in load_contexts(opts)}
    return [{"setting": s, "lang": lang} for s in settings(opts) for lang in cell_langs(opts)
            if (parse_setting(s)[0], split_cell_lang(lang)[1]) in have]


def input_files(opts: Mapping) -> list[str]:
    return [d["path"] for d in opts["data"] if d["lang"] in opts["context_langs"]]


def parser_for(setting: str) -> str:
    return "none"  # scoring reads the raw output (containment, s1.7)


def build_prompts(opts: Mapping, setting: str, lang: str, *, translations=None,
                  selections: Mapping[tuple[str, str], Mapping] | None = None) -> list[dict]:
    return prompt_rows(opts, setting, lang, selections=selections)


def narrow_langs(opts: Mapping) -> list[str]:
    """The context languages whose sentences the narrow stage ranks (none without CROSS)."""
    return list(opts["context_langs"]) if "cross" in opts["methods"] else []


# The options a narrow cell's selections depend on (the rest: order, join, methods, scoring,
# only change prompts or scores, so they reuse the selections).
NARROW_OPTIONS = ("needles", "ks", "query_langs", "query_text", "prompt_variant", "splitter",
                  "extra_terminators", "lengths", "positions", "runs", "templates", "limit")


def narrow_options(opts: Mapping, clang: str) -> dict:
    """The options of one context language's narrow cell (checked options in, same shape
    out, so :func:`narrow_inputs` and :func:`select` take them)."""
    return {**{k: opts[k] for k in NARROW_OPTIONS},
            "data": [d for d in opts["data"] if d["lang"] == clang], "context_langs": [clang],
            "methods": ["cross"]}


def sentence_id(text: str) -> str:
    """A sentence's (or query's) content id: equal texts share one embedding."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def query_key(qlang: str, needles: int) -> str:
    return f"q:{qlang}:{needles}"


def queries(opts: Mapping) -> dict[str, str]:
    """query_key -> the text the sentences are ranked against (``query_text`` option)."""
    templates = load_templates(opts.get("templates"))
    return {query_key(q, n): query_text(q, n, opts["query_text"],
                                        variant=opts["prompt_variant"], templates=templates)
            for q in opts["query_langs"] for n in opts["needles"]}


def narrow_inputs(opts: Mapping, clang: str) -> dict:
    """What the narrow stage embeds for one context language: ``sentences`` (id -> text, each
    distinct sentence once over every context of both needle counts), ``queries`` (query key
    -> text), and the counts (``sentences_total``, ``contexts``, ``context_errors``)."""
    splitter, templates = splitter_for(opts), load_templates(opts.get("templates"))
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


def scores_of(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Dot products in float64, row by row: a float32 product is exact in float64 and each
    row is summed alone, so equal sentences score exactly equal wherever they sit in the
    matrix (a BLAS GEMV may round its edge rows differently)."""
    return (np.asarray(vectors, np.float64) * np.asarray(query, np.float64)).sum(axis=1)


SELECTION_FIELDS = ("context_id", "needles", "clang", "qlang", "length", "position", "run",
                    "n_sentences", "top_idx", "top_score", "label_idx", "label_rank",
                    "target_idx", "target_rank", "splitter_fp", "error")


def select(opts: Mapping, clang: str, vectors: Mapping[str, np.ndarray], *,
           k_max: int | None = None) -> list[dict]:
    """One selection per (context of ``clang``, query language): the exact ranking of the
    context's sentences by similarity to the query (score descending, ties by sentence
    index, s2.3), its first ``k_max`` entries (default the largest k) and each needle's
    1-based rank in the full ranking. ``vectors`` maps :func:`sentence_id` and
    :func:`query_key` to stored embeddings; a context with a sentence or query missing there
    is an error row."""
    k_max = k_max or max(opts["ks"])
    splitter, templates = splitter_for(opts), load_templates(opts.get("templates"))
    out = []
    for ctx in load_contexts(opts):
        if ctx["lang"] != clang:
            continue
        base = {"context_id": ctx["context_id"], "needles": ctx["needles"], "clang": clang,
                "length": ctx["length"], "position": str(ctx["position"]), "run": ctx["run"]}
        rows = [{**base, "qlang": q} for q in opts["query_langs"]]
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
            qv = vectors.get(query_key(r["qlang"], ctx["needles"]))
            if qv is None:
                out.append({**r, "error": "the query has no embedding"})
                continue
            scores = scores_of(matrix, qv)
            order = rank(scores)
            ranks = label_ranks(order, split.label_idx)
            top = order[:k_max]
            out.append({**r, "n_sentences": split.n_sentences,
                        "top_idx": [int(i) for i in top],
                        "top_score": [float(scores[i]) for i in top],
                        "label_idx": [int(i) for i in split.label_idx], "label_rank": ranks,
                        "target_idx": int(split.target_idx),
                        "target_rank": ranks[ctx["target"]] if ranks else None,
                        "splitter_fp": split.splitter_fp, "error": None})
    return [{f: r.get(f) for f in SELECTION_FIELDS} for r in out]


def hits_at(selections: Iterable[Mapping], ks: Sequence[int]) -> dict[str, float]:
    """% of selections whose target needle ranks within k (LLM-free), per k."""
    ranks = [s["target_rank"] for s in selections if not s.get("error")]
    return {f"hit@{k}": (100.0 * sum(1 for r in ranks if r is not None and 0 < r <= k)
                         / len(ranks)) if ranks else None for k in ks}


_REFUSED = re.compile(r"prompt too long|maximum context length|context length|too many tokens",
                      re.I)


def score(opts: dict, generations: list[dict], judgments=None, **_) -> tuple[list, list]:
    """Items (one per generation, with its failure class) and metric rows per (setting,
    lang = q-c, model): accuracy and strict accuracy with Wilson 95% intervals, the failure
    classes, hit rate of the target (CROSS), input reduction, refused prompts; accuracy also
    by length and by depth (``accuracy|length=2k``, ``accuracy|depth=50``)."""
    from xling.studies.xrag.study import wilson

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
    items_df = score_rows(usable, rule=opts.get("embedding_failure", "target"))
    items = []
    for r, rec in zip(usable, items_df.to_dict("records")):
        rec.update(setting=r["setting"], lang=r["lang"], error=r["gen_error"])
        items.append(rec)
    for r in rows:  # a prompt that could not be built: counted, never scored as correct
        if not r["meta"]:
            items.append({"model": r.get("model"), "item_id": r.get("item_id"),
                          "setting": r.get("setting"), "lang": r.get("lang"), "correct": False,
                          "failure": "error", "error": r.get("gen_error") or "no prompt"})
    metrics = []

    def add(setting, lang, model, metric, value, n, lo=None, hi=None):
        metrics.append({"study": STUDY, "setting": setting, "lang": lang, "model": model,
                        "metric": metric, "value": value, "ci_low": lo, "ci_high": hi, "n": n})

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for it in items:
        groups[(it["setting"], it["lang"], it["model"])].append(it)
    for (setting, lang, model), its in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        n = len(its)
        for metric, key in (("accuracy", "correct"), ("strict_accuracy", "strict")):
            k = sum(1 for i in its if i.get(key))
            add(setting, lang, model, metric, 100.0 * k / n, n, *wilson(k, n))
        for cls in (*FAILURE_DETAILS[1:], "error"):
            k = sum(1 for i in its if i.get("failure_detail", i.get("failure")) == cls)
            add(setting, lang, model, cls, 100.0 * k / n, n)
        if needs_selection(setting):
            k = sum(1 for i in its if i.get("target_in_cap"))
            add(setting, lang, model, "hit", 100.0 * k / n, n, *wilson(k, n))
        for red in ("reduction_words", "reduction_tokens"):
            vals = [i[red] for i in its if i.get(red) is not None and not pd.isna(i[red])]
            if vals:
                add(setting, lang, model, red, 100.0 * float(np.mean(vals)), len(vals))
        for dim, key in (("length", "length"), ("depth", "position")):
            by: dict[str, list[bool]] = defaultdict(list)
            for i in its:
                if i.get(key) is not None:
                    by[str(i[key])].append(bool(i.get("correct")))
            for v, cs in by.items():
                add(setting, lang, model, f"accuracy|{dim}={v}", 100.0 * sum(cs) / len(cs),
                    len(cs))
    return items, metrics


def _items_frame(items: Sequence[Mapping]) -> pd.DataFrame:
    return pd.DataFrame.from_records([i for i in items if i.get("failure") != "error"])


def render(items: Sequence[Mapping], metrics: Sequence[Mapping]) -> tuple[str, dict[str, bytes]]:
    """The paper-shaped tables (markdown) and plots (PNG bytes by file name) of a run."""
    import tempfile

    df = _items_frame(items)
    errors = sum(1 for i in items if i.get("failure") == "error")
    if df.empty:
        return f"# CROSS\n\nno scored items ({errors} unusable)\n", {}
    md = "# CROSS on mLongRR\n\n" + markdown_tables(df)
    if errors:
        md += f"\n{errors} items had no usable prompt (counted as errors, not scored).\n"
    plots: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        drawn = {"accuracy_by_length.png": lambda p: plot_accuracy(df, "length", p),
                 "accuracy_by_depth.png": lambda p: plot_accuracy(df, "position", p),
                 "failures.png": lambda p: plot_failures(df, p)}
        if (df["method"] == "cross").any():
            drawn["accuracy_by_k.png"] = lambda p: plot_accuracy(df, "k", p)
            for n in sorted(df["needles"].unique()):
                drawn[f"pairs_{int(n)}n.png"] = (
                    lambda p, n=int(n): plot_pair_heatmap(df, p, needles=n))
        for name, draw in drawn.items():
            path = os.path.join(tmp, name)
            draw(path)
            plots[name] = Path(path).read_bytes()
    return md, plots

