"""XRAG: cross-lingual retrieval-augmented generation over news (Liu et al., Findings of
EMNLP 2025, arXiv:2505.10089; data ``AmazonScience/XRAG`` on the hub). "xrag.txt L<n>"
below is line n of the paper's text, ``../shared/papers/xrag.txt``; the paper is the
authority for everything this module runs.

A question in X (de, es, zh, ar) is answered from given news articles. Two subsets
(xrag.txt L173):

* **monolingual retrieval** (``subset="mono"``): 2 supporting + 6 distracting articles, all
  English. Paper Table 4: accuracy per model x language, their average, and the English
  baseline (the original English question over the same articles, xrag.txt L224).
* **multilingual retrieval** (``subset="multi"``): 1 supporting + 3 distracting articles in
  X and 1 + 3 in English. Paper Table 5: accuracy per language, the cross-lingual average,
  and the En+En_X baseline (English question, the X articles machine-translated to
  English, xrag.txt L243).

Answers are scored by a judge panel (majority vote over the judges whose verdict parsed)
AND a response-language check (lingua): a correct answer in the wrong language is not
correct (xrag.txt L186, L591).

The published jsonl (what :func:`load_items` reads)
-----------------------------------------------------
One instance per line: ``id, question, answer, en_question, en_answer, q_type, a_type,
crossdoc_type`` and the parallel lists ``articles`` (article texts), ``dates``, ``urls``,
``is_support`` (1 = supporting) and ``article_order``; the question language is
``language`` (``lang`` is accepted too). Confirmed from public code that reads the dev file;
the dataset card lists the first fields. Not confirmed, and therefore assumed here:

* **article languages** are not labelled in the release (a public analysis of the corpus
  says as much). A per-article list under ``article_langs``/``article_languages``/
  ``langs`` is used when present; otherwise each article's language is decided between X
  and English only (an instance holds no third language) by its script for zh/ar (share of
  CJK / Arabic letters) and by function-word counts for de/es. The subset follows: an
  instance with at least 2 articles in X is multilingual, else monolingual (and all its
  articles are English). An explicit ``subset``/``retrieval`` field wins when present.
* ``article_order`` is read as the position of each article in the prompt (ascending), and
  ``article_order: "given"`` (the default) presents the articles in that order, falling back
  to the stored order; ``crossdoc_type``, ``q_type``, ``a_type`` are passed through.
* ``doc_id`` of an article is ``f"{id}#a{k}"`` with k its index in the stored list, whatever
  the presentation order (the translate stage's documents use the same ids).

Settings (``SETTING_SPECS``)
----------------------------
A setting is one subset, the language of the question (Q; the expected answer is in the
question's language, xrag.txt L89 Eq. 1, and "+EQ" changes both, L247), which articles are
shown, and which X-language articles are replaced by their English machine translation
(none, the supporting ones, or all). The paper's settings (``PAPER_SETTINGS``, the default):

============  ======  ===  ==========  =========  =============================================
setting       subset  Q    articles    X -> En    paper
============  ======  ===  ==========  =========  =============================================
no_retrieval  mono    en   none        -          Table 3 "No Retrieval" (Figure 19 prompt)
oracle        mono    en   supporting  -          Table 3 "Oracle Retrieval" (xrag.txt L201-203)
mono          mono    X    all         -          Table 4, De/Es/Zh/Ar columns
mono_en       mono    en   all         -          Table 4, En column
multi         multi   X    all         -          Table 5 En+X columns; Table 6 "XRAG-MultiR"
multi_eq      multi   en   all         -          Table 6 "+EQ"
multi_eq_es   multi   en   all         supporting Table 6 "+EQ, +ES"
multi_en_x    multi   en   all         all        Table 5 En+En_X; Table 6 "MonoRAG" (+EQ,+ES,+ED)
============  ======  ===  ==========  =========  =============================================

Table 6 and its twins (Tables 9-11; xrag.txt L247-257, L690-712) replace, one after the
other, the question (EQ), the supporting articles (ES) and the distracting articles (ED)
with their English counterparts; "MonoRAG" (+EQ, +ES, +ED) is the En+En_X baseline itself.
Table 3 uses the English questions of the monolingual subset (xrag.txt L201, L203).

Settings the paper did not run are extensions, named ``ext_*`` so that they cannot be
mistaken for the paper's, and shown only in the tables' "not in the paper" section:
``ext_no_retrieval_xq`` and ``ext_oracle_xq`` (Table 3's settings with the question in X),
``ext_multi_oracle_xq`` (multi, supporting articles only, X question), ``ext_multi_xq_es``
(multi, X question, the X supporting article in English) and ``ext_multi_xq_es_ed`` (multi,
X question, every X article in English). Settings of earlier xling versions that were
misread ablations (``multi_es``, ``multi_ed``, ``mono_eq``, ``multi_oracle``) are refused with
a pointer to their replacement (``RENAMED``); ``multi_eq`` now is the paper's +EQ.

Prompts (``xling/tasks/data/xrag/prompts.yaml``): Figure 18 (xrag.txt L624, L628) for every
setting with articles, Figure 19 (L632-640, with the ``<answer>None</answer>`` abstain) for
those without, and Figure 20 (L650-677) for the judges, each word for word (the file says
where the PDF text lost a line break, bracket or list number and how it was restored). The
translation of X articles is the translate stage's (NLLB in configs/xrag.yaml; the paper
used Google Translate, xrag.txt L237, L243).

Options (``check_options``; errors read ``study.options.<key>: <what>; <fix>``): ``data``
(required: path or URI of ``xrag.{dev,test}.jsonl``), ``langs`` (default de, es, zh, ar),
``settings`` (default: ``PAPER_SETTINGS``), ``article_order`` (``given`` = the release's
``article_order``, default; ``stored``, ``shuffled`` (per-item seed from ``shuffle_seed``,
default 0), ``supporting_first``, ``supporting_last``, ``date``), ``max_article_words``
(default None: whole articles, as the paper; a CJK character counts as a word),
``translations`` (the translate stage's documents source holding the X articles in English,
default ``xrag-articles``), ``limit`` (first N instances per language and subset, default
None), ``expected`` (the published numbers shown beside ours: ``auto``, the default, reads
``configs/xrag.expected.yaml`` of the checkout when it exists; a path or URI; or null for
none).

Cells and the English settings: every setting, English ones included, has one cell per X
in ``langs`` (``lang`` = the X whose instances it runs; an English question that several X
share is one cached generation); the answer must be in ``expected_language(setting,
lang)``. Table 3's columns and Table 4's "En" column are those settings' averages over X.

Metrics (``score``), each per (setting, lang, model): ``accuracy`` (% of scored
generations that the panel judged correct AND whose answer is in the expected language;
Wilson 95% interval), ``judge_accuracy`` (panel only), ``response_language_error_rate`` (%
of answers in English where the expected language is not English: the paper's
response-language failure, Figure 5), ``wrong_language_rate`` (% of answers not in the
expected language), ``answer_rate`` (% of generations with an ``<answer>``),
``abstain_rate`` (settings without articles: % of answers that are Figure 19's ``None``),
``n_valid_judges`` (mean), ``unscored`` (count of generations without a verdict),
``truncated`` (count of prompts the engine cut to fit ``max_model_len``, only when there
are any; the tables flag such cells with a dagger); plus ``lang="avg"`` rows: the
unweighted mean over the configured languages (Table 4's average over the non-English
languages, Table 5's cross-lingual average), written only when every language has a value.
With a human labels file, ``kappa`` (setting and lang "all"; model "all", and per judged
model when there are several): Cohen's kappa of the panel's majority verdict (before the
language check) against the human label.

Labels file (``score(labels=...)``): JSON lines, or CSV/TSV by extension, one row per
labelled generation: ``item_id, setting, lang, model, label`` with label
``correct``/``incorrect`` (1/0 and true/false are accepted).

For the judge stage, :func:`judge_rows` turns generations into judge prompt rows
(:func:`judge_prompt` per generation, with the setting's question and gold answer).
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from xling.tasks.judge import cohen_kappa, language_ok, majority_vote, normalize_verdict
from xling.tasks.languages import validate_languages
from xling.tasks.textio import iter_lines

STUDY = "xrag"
LANGS = ("de", "es", "zh", "ar")


@dataclass(frozen=True)
class Setting:
    subset: str            # "mono" | "multi": which instances
    question: str          # "x" | "en": the question's language, and so the answer's
                           # (xrag.txt L89 Eq. 1; "+EQ" changes both, L247)
    docs: str              # "all" | "supporting" | "none": which articles are shown
    translate: str         # "none" | "supporting" | "all": which X-language articles are
                           # replaced by their English translation (ES / ES+ED)
    label: str             # the row or column name in the tables
    paper: str | None      # where the paper reports it; None: an extension (ext_*)


SETTING_SPECS: dict[str, Setting] = {
    # the paper's settings (xrag.txt L194-257, L690-712)
    "no_retrieval": Setting("mono", "en", "none", "none", "No Retrieval",
                            "Table 3 (L194-203; Figure 19 prompt)"),
    "oracle": Setting("mono", "en", "supporting", "none", "Oracle Retrieval",
                      "Table 3 (L194-203)"),
    "mono": Setting("mono", "x", "all", "none", "Monolingual retrieval",
                    "Table 4, De/Es/Zh/Ar (L211-219)"),
    "mono_en": Setting("mono", "en", "all", "none", "English baseline (En)",
                       "Table 4, En (L224)"),
    "multi": Setting("multi", "x", "all", "none", "XRAG-MultiR",
                     "Table 5, En+X; Table 6, XRAG-MultiR (L230-255)"),
    "multi_eq": Setting("multi", "en", "all", "none", "+EQ", "Table 6, +EQ (L247-255)"),
    "multi_eq_es": Setting("multi", "en", "all", "supporting", "+EQ, +ES",
                           "Table 6, +EQ, +ES (L247-257)"),
    "multi_en_x": Setting("multi", "en", "all", "all", "MonoRAG (+EQ, +ES, +ED)",
                          "Table 5, En+En_X; Table 6, MonoRAG (L237, L243, L255)"),
    # extensions: not in the paper, never in its tables
    "ext_no_retrieval_xq": Setting("mono", "x", "none", "none",
                                   "[ext] no retrieval, X question", None),
    "ext_oracle_xq": Setting("mono", "x", "supporting", "none",
                             "[ext] oracle (mono), X question", None),
    "ext_multi_oracle_xq": Setting("multi", "x", "supporting", "none",
                                   "[ext] oracle (multi), X question", None),
    "ext_multi_xq_es": Setting("multi", "x", "all", "supporting",
                               "[ext] multi, X question, X supporting article in English", None),
    "ext_multi_xq_es_ed": Setting("multi", "x", "all", "all",
                                  "[ext] multi, X question, all X articles in English", None),
}
SETTINGS = tuple(SETTING_SPECS)
PAPER_SETTINGS = tuple(s for s, spec in SETTING_SPECS.items() if spec.paper)
# Names of earlier xling versions, which misread the paper's ablations.
RENAMED = {
    "multi_es": "it was not a paper setting (X question, English answer) and is gone; "
                "the paper's +EQ, +ES is multi_eq_es",
    "multi_ed": "it was not the paper's MonoRAG; MonoRAG is multi_en_x, and 'X question, "
                "all X articles in English' is ext_multi_xq_es_ed",
    "mono_eq": "it was not a paper setting (English question, X answer) and is gone",
    "multi_oracle": "it is not a paper setting; use ext_multi_oracle_xq",
}
TRANSLATE_ROLES = ("none", "supporting", "all")

ARTICLE_ORDERS = ("given", "stored", "shuffled", "supporting_first", "supporting_last",
                  "date")
DEFAULTS: dict[str, Any] = {
    "langs": list(LANGS),
    "settings": list(PAPER_SETTINGS),
    "article_order": "given",      # the release's article_order (see the docstring)
    "shuffle_seed": 0,
    "max_article_words": None,     # no truncation: the paper gives whole articles
    "translations": "xrag-articles",
    "limit": None,
    "expected": "auto",            # configs/xrag.expected.yaml of the checkout, if any
}
OPTIONS = ("data",) + tuple(DEFAULTS)

_LANG_FIELDS = ("language", "lang")
_ARTICLE_LANG_FIELDS = ("article_langs", "article_languages", "langs")
_SUBSET_FIELDS = ("subset", "retrieval", "retrieval_setting")
_SUBSET_NAMES = {"mono": "mono", "monolingual": "mono", "monolingual_retrieval": "mono",
                 "multi": "multi", "multilingual": "multi", "multilingual_retrieval": "multi"}


# --- options ------------------------------------------------------------------------------

def _bad(key: str, what: str, fix: str) -> ValueError:
    return ValueError(f"study.options.{key}: {what}; {fix}")


def _positive_int_or_none(raw: dict, key: str) -> int | None:
    v = raw.get(key, DEFAULTS[key])
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _bad(key, f"must be a positive integer or null, got {v!r}",
                   f"set e.g. `{key}: 100`, or remove it for no limit")
    return v


def _list_option(raw: dict, key: str, what: str, choices) -> list:
    """A list option (a single string is a one-item list); empty or not a list is an error."""
    value = raw.get(key, DEFAULTS[key])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise _bad(key, f"must be a non-empty list of {what}, got {value!r}",
                   f"choose from {list(choices)}")
    return value


def check_options(raw: dict | None) -> dict:
    """Validate the config's ``study.options`` and fill the defaults (``DEFAULTS``)."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(OPTIONS))
    if unknown:
        raise _bad(unknown[0], f"unknown option(s) {unknown}",
                   f"XRAG's options are {list(OPTIONS)}")
    data = raw.get("data")
    if not isinstance(data, str) or not data.strip():
        raise _bad("data", "required: the path of an XRAG jsonl file",
                   "set `data: path/to/xrag.test.jsonl` (AmazonScience/XRAG on the hub)")
    if "://" not in data and not os.path.isfile(data):
        raise _bad("data", f"file not found: {data}",
                   "download xrag.{dev,test}.jsonl from AmazonScience/XRAG and give its path")
    langs = _list_option(raw, "langs", "language codes", LANGS)
    resolved = [lang.code for lang in validate_languages(langs)]  # UnknownLanguageError
    outside = [c for c, r in zip(langs, resolved) if r not in LANGS]
    if outside:
        raise _bad("langs", f"{outside} not in XRAG", f"XRAG has {list(LANGS)}")
    settings = _list_option(raw, "settings", "setting names", SETTINGS)
    bad = [s for s in settings if s not in SETTING_SPECS]
    renamed = [s for s in bad if s in RENAMED]
    if renamed:
        raise _bad("settings", f"unknown setting(s) {bad}: {renamed[0]!r} {RENAMED[renamed[0]]}",
                   f"the paper's settings are {list(PAPER_SETTINGS)}")
    if bad:
        raise _bad("settings", f"unknown setting(s) {bad}", f"choose from {list(SETTINGS)}")
    order = raw.get("article_order", DEFAULTS["article_order"])
    if order not in ARTICLE_ORDERS:
        raise _bad("article_order", f"unknown order {order!r}",
                   f"choose one of {list(ARTICLE_ORDERS)}")
    seed = raw.get("shuffle_seed", DEFAULTS["shuffle_seed"])
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise _bad("shuffle_seed", f"must be an integer, got {seed!r}", "set e.g. `0`")
    translations = raw.get("translations", DEFAULTS["translations"])
    if not isinstance(translations, str) or not translations.strip():
        raise _bad("translations", f"must be a source name, got {translations!r}",
                   "name the translate stage's documents source of the XRAG articles")
    expected = raw.get("expected", DEFAULTS["expected"])
    if expected is False:
        expected = None
    if expected is not None and (not isinstance(expected, str) or not expected.strip()):
        raise _bad("expected", f"must be 'auto', a path or null, got {expected!r}",
                   "set `expected: configs/xrag.expected.yaml`, or null for no published "
                   "numbers")
    if expected not in (None, "auto") and "://" not in expected \
            and not os.path.isfile(expected):
        raise _bad("expected", f"file not found: {expected}",
                   "give the path of an xrag.expected.yaml (configs/ has the paper's), "
                   "or null")
    return {"data": data, "langs": list(dict.fromkeys(resolved)),
            "settings": list(dict.fromkeys(settings)), "article_order": order,
            "shuffle_seed": seed, "max_article_words": _positive_int_or_none(raw,
                                                                             "max_article_words"),
            "translations": translations, "limit": _positive_int_or_none(raw, "limit"),
            "expected": expected}


# --- loading ------------------------------------------------------------------------------

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]")
_ARABIC = re.compile(r"[\u0600-\u06ff\u0750-\u077f\ufb50-\ufdff\ufe70-\ufeff]")
_LETTER = re.compile(r"[^\W\d_]")
_WORD = re.compile(r"[^\W\d_]+")
_FUNCTION_WORDS = {
    "en": frozenset("the and of to in is that was for on with said will it are by as at from "
                    "has have be this which were their after its".split()),
    "de": frozenset("der die das und ist nicht mit den von für auf dem sich des ein eine einer "
                    "wird hat im zu auch nach bei dass sie werden wurde sind".split()),
    "es": frozenset("el la los las y que del en por con una un para se es al su como más fue "
                    "dijo será sus este esta".split()),
}


def guess_article_language(text: str, lang: str) -> str:
    """Decide between ``lang`` (de/es/zh/ar) and ``"en"`` for one article (see the module
    docstring); anything undecidable is English."""
    if lang in ("zh", "ar"):
        letters = _LETTER.findall(text)
        if not letters:
            return "en"
        script = _CJK if lang == "zh" else _ARABIC
        share = sum(1 for c in letters if script.match(c)) / len(letters)
        return lang if share >= 0.3 else "en"
    words = [w.lower() for w in _WORD.findall(text)]
    own = sum(w in _FUNCTION_WORDS.get(lang, ()) for w in words)
    eng = sum(w in _FUNCTION_WORDS["en"] for w in words)
    return lang if own > eng else "en"


def _error_item(item_id: str, error: str, lang: str | None = None) -> dict:
    return {"id": item_id, "lang": lang, "subset": None, "question": None, "answer": None,
            "en_question": None, "en_answer": None, "q_type": None, "a_type": None,
            "crossdoc_type": None, "articles": [], "error": error}


def parse_item(obj: Any, where: str) -> dict:
    """One decoded jsonl object -> an item (see :func:`load_items`); never raises."""
    if not isinstance(obj, dict):
        return _error_item(where, f"{where}: expected a JSON object, got {type(obj).__name__}")
    item_id = obj.get("id")
    if item_id is None or str(item_id).strip() == "":
        return _error_item(where, f"{where}: no id")
    item_id = str(item_id)
    lang_raw = next((obj[k] for k in _LANG_FIELDS if obj.get(k)), None)
    lang = str(lang_raw).strip().lower() if lang_raw is not None else None
    if lang not in LANGS:
        return _error_item(item_id, f"{where}: language {lang_raw!r} is not one of {list(LANGS)}")

    def fail(msg: str) -> dict:
        return _error_item(item_id, f"{where} (id {item_id}): {msg}", lang)

    for key in ("question", "answer"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            return fail(f"missing or empty '{key}'")
    texts, support, dates = obj.get("articles"), obj.get("is_support"), obj.get("dates")
    if not isinstance(texts, list) or not texts:
        return fail("'articles' must be a non-empty list")
    if not isinstance(support, list) or len(support) != len(texts):
        return fail(f"'is_support' must be a list as long as 'articles' ({len(texts)})")
    if dates is None:
        dates = [None] * len(texts)
    if not isinstance(dates, list) or len(dates) != len(texts):
        return fail(f"'dates' must be a list as long as 'articles' ({len(texts)})")
    order = obj.get("article_order")
    if order is not None and (not isinstance(order, list) or len(order) != len(texts)):
        return fail(f"'article_order' must be a list as long as 'articles' ({len(texts)})")
    urls = obj.get("urls") if isinstance(obj.get("urls"), list) else None
    titles = obj.get("titles") if isinstance(obj.get("titles"), list) else None
    langs_field = next((obj[k] for k in _ARTICLE_LANG_FIELDS if isinstance(obj.get(k), list)),
                       None)
    articles = []
    for k, text in enumerate(texts):
        if isinstance(text, dict):  # tolerate {"text"/"title"/...} article objects
            title = text.get("title")
            text = text.get("text", text.get("body"))
        else:
            title = titles[k] if titles and k < len(titles) else None
        if not isinstance(text, str) or not text.strip():
            return fail(f"article {k} is empty or not text")
        s = support[k]
        if isinstance(s, str) and s.strip().lower() in ("0", "1", "true", "false"):
            s = s.strip().lower() in ("1", "true")
        if not isinstance(s, (bool, int)) or (not isinstance(s, bool) and s not in (0, 1)):
            return fail(f"is_support[{k}] must be 0/1, got {support[k]!r}")
        try:
            pos = None if order is None else float(order[k])
        except (TypeError, ValueError):
            return fail(f"article_order[{k}] must be a number, got {order[k]!r}")
        art_lang, source = None, "heuristic"
        if langs_field is not None and k < len(langs_field) and langs_field[k]:
            art_lang, source = str(langs_field[k]).strip().lower(), "field"
        articles.append({
            "doc_id": f"{item_id}#a{k}", "index": k, "lang": art_lang, "lang_source": source,
            "title": None if title is None else str(title), "text": text,
            "date": None if dates[k] is None else str(dates[k]), "supporting": bool(s),
            "order": pos, "url": urls[k] if urls and k < len(urls) else None})
    subset_raw = next((obj[k] for k in _SUBSET_FIELDS if obj.get(k) is not None), None)
    subset = _SUBSET_NAMES.get(str(subset_raw).strip().lower()) if subset_raw is not None \
        else None
    if subset_raw is not None and subset is None:
        return fail(f"unknown subset {subset_raw!r}; expected mono(lingual) or multi(lingual)")
    for a in articles:
        if a["lang"] is None:
            a["lang"] = guess_article_language(a["text"], lang)
    if subset is None:
        subset = "multi" if sum(a["lang"] == lang for a in articles) >= 2 else "mono"
    if subset == "mono":
        for a in articles:
            if a["lang_source"] == "heuristic":
                a["lang"] = "en"
    if not any(a["supporting"] for a in articles):
        return fail("no supporting article (is_support has no 1)")

    def opt_str(key):
        v = obj.get(key)
        return None if v is None else str(v)

    return {"id": item_id, "lang": lang, "subset": subset, "question": obj["question"],
            "answer": obj["answer"], "en_question": opt_str("en_question"),
            "en_answer": opt_str("en_answer"), "q_type": opt_str("q_type"),
            "a_type": opt_str("a_type"), "crossdoc_type": obj.get("crossdoc_type"),
            "articles": articles, "error": None}


def _open(path: str) -> IO[bytes]:
    if "://" in path:
        import pyarrow.fs as pafs

        fs, inner = pafs.FileSystem.from_uri(path)
        return fs.open_input_stream(inner)
    return open(path, "rb")


def _iter_items(stream: IO, name: str, only: str | None = None) -> Iterator[dict]:
    """Items of a jsonl stream; with ``only``, instances of another XRAG language are
    skipped before they are parsed (unreadable lines are always yielded)."""
    for n, raw in enumerate(iter_lines(stream), 1):
        where = f"{name}:line{n}"
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as e:
            yield _error_item(where, f"{where}: invalid UTF-8 at byte {e.start}")
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            yield _error_item(where, f"{where}: malformed JSON ({e})")
            continue
        if only is not None and isinstance(obj, dict):
            code = next((obj[k] for k in _LANG_FIELDS if obj.get(k)), None)
            if isinstance(code, str) and code.strip().lower() in LANGS \
                    and code.strip().lower() != only:
                continue
        yield parse_item(obj, where)


def load_items(path: str) -> list[dict]:
    """Every instance of an XRAG jsonl file, in file order: dicts with ``id, lang, subset
    ("mono"|"multi"), question, answer, en_question, en_answer, q_type, a_type,
    crossdoc_type, articles, error``; each article ``{doc_id, index, lang, lang_source,
    title, text, date, supporting, order, url}``. A line that cannot be used is an item
    with an ``error`` (its id is ``<file>:line<n>`` when the line has none)."""
    with _open(path) as f:
        return list(_iter_items(f, os.path.basename(path)))


_CACHE: dict[tuple, list[dict]] = {}


def _items_for(path: str, lang: str) -> list[dict]:
    """The items of one language (plus unreadable lines, see build_prompts), cached for the
    last (file, language) so the cells of one language parse the file once."""
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_mtime_ns, st.st_size, lang)
    except OSError:
        key = (path, None, None, lang)
    if key not in _CACHE:
        _CACHE.clear()
        with _open(path) as f:
            _CACHE[key] = [it for it in _iter_items(f, os.path.basename(path), lang)
                           if it["lang"] in (lang, None)]
    return _CACHE[key]


def iter_article_documents(stream: IO, *, lang: str, source: str) -> Iterator[dict]:
    """Documents rows (``doc_id, lang, title, text, source, date, error``) of the articles
    in ``lang`` of the multilingual instances in ``lang``: what the En+En_X and +ED settings
    need translated to English. A line that cannot be read is an error row."""
    for item in _iter_items(stream, source, lang):
        if item["error"]:
            if item["lang"] in (lang, None):
                yield {"doc_id": item["id"], "lang": lang, "title": None, "text": None,
                       "source": source, "date": None, "error": item["error"]}
            continue
        if item["lang"] != lang or item["subset"] != "multi":
            continue
        for a in item["articles"]:
            if a["lang"] == lang:
                yield {"doc_id": a["doc_id"], "lang": lang, "title": a["title"],
                       "text": a["text"], "source": source, "date": a["date"], "error": None}


# --- prompts ------------------------------------------------------------------------------

def needs_translation(setting: str) -> bool:
    """Does the setting read English translations of X articles (+ES, En+En_X)?"""
    return _spec(setting).translate != "none"


def expected_language(setting: str, lang: str) -> str:
    """The language an answer in this cell must be in: the question's (xrag.txt L89)."""
    return "en" if _spec(setting).question == "en" else lang


def prompt_cells(opts: dict) -> list[dict]:
    """One cell per (language, setting), language-major (the loader caches per language)."""
    return [{"setting": s, "lang": lang} for lang in opts["langs"] for s in opts["settings"]]


def input_files(opts: dict) -> list[str]:
    return [opts["data"]]


def parser_for(setting: str) -> str:
    _spec(setting)
    return "answer_tag"


def _spec(setting: str) -> Setting:
    try:
        return SETTING_SPECS[setting]
    except KeyError:
        raise ValueError(f"unknown XRAG setting {setting!r}; choose from {list(SETTINGS)}") \
            from None


_UNIT = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\s\u3400-\u4dbf\u4e00-\u9fff"
                   r"\uf900-\ufaff]+")


def truncate_words(text: str, max_words: int | None) -> str:
    """The first ``max_words`` words (whitespace-separated runs; each CJK character is one
    word), followed by " …" when anything was cut."""
    if max_words is None:
        return text
    end = None
    for n, m in enumerate(_UNIT.finditer(text), 1):
        if n == max_words:
            end = m.end()
        elif n > max_words:
            return text[:end].rstrip() + " …"
    return text


def order_articles(articles: list[dict], how: str, *, item_id: str, seed: int) -> list[dict]:
    """The presentation order (``article_order`` option, see ``ARTICLE_ORDERS``)."""
    arts = list(articles)
    if how == "given":
        if all(a.get("order") is not None for a in arts):
            arts.sort(key=lambda a: (a["order"], a["index"]))
        return arts
    if how == "stored":
        return arts
    if how == "shuffled":  # per-item seed: independent of which other items are loaded
        random.Random(f"{seed}:{item_id}").shuffle(arts)
        return arts
    if how == "supporting_first":
        return sorted(arts, key=lambda a: not a["supporting"])
    if how == "supporting_last":
        return sorted(arts, key=lambda a: a["supporting"])
    if how == "date":
        return sorted(arts, key=lambda a: (a["date"] is None, a["date"] or ""))
    raise ValueError(f"unknown article order {how!r}; choose one of {list(ARTICLE_ORDERS)}")


# --- the paper's prompt templates (xling/tasks/data/xrag/prompts.yaml) -------------------

_PROMPTS_FILE = os.path.join(os.path.dirname(__file__), "prompts.yaml")
_PROMPTS: dict[str, Any] = {}
_VAR = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LOOP = re.compile(r"^[ \t]*\{%\s*for\s*\(idx,\s*text,\s*date\)\s*in\s*articles\s*%\}[ \t]*\n"
                   r"(.*?)^[ \t]*\{%\s*endfor\s*%\}[ \t]*\n", re.M | re.S)


def prompts() -> dict[str, Any]:
    """The templates (``rag_answer`` = Figure 18, ``no_retrieval`` = Figure 19, ``judge`` =
    Figure 20) and their ``pdf_fixes``, read once from the data file."""
    if not _PROMPTS:
        import yaml  # PyYAML is a dependency of the config layer already

        with open(_PROMPTS_FILE, encoding="utf-8") as f:
            _PROMPTS.update(yaml.safe_load(f))
    return _PROMPTS


def _fill(template: str, values: dict[str, str]) -> str:
    """Replace ``{{ name }}`` in one pass (a value that holds braces stays as it is)."""
    return _VAR.sub(lambda m: str(values[m.group(1)]), template)


def render_template(name: str, *, articles: list[tuple[Any, str, str]] | None = None,
                    **values: str) -> str:
    """A template of prompts.yaml filled in: ``{{ name }}`` from ``values``, and the
    ``{% for (idx, text, date) in articles %}`` block once per article (its tag lines
    dropped, as Jinja's trim_blocks does)."""
    template = prompts()[name]

    def loop(m: re.Match) -> str:
        return "".join(_fill(m.group(1), {**values, "idx": i, "text": t, "date": d})
                       for i, t, d in articles or ())
    return _fill(_LOOP.sub(loop, template), values)


def render_prompt(question: str, articles: list[dict] | None) -> list[dict]:
    """The chat messages of one XRAG prompt (one user message): Figure 18 over the articles
    in their presentation order, numbered from 1, each with its date (xrag.txt L624, L628);
    with no articles (``None``), Figure 19 (xrag.txt L632-640)."""
    if articles is None:
        return [{"role": "user", "content": render_template("no_retrieval", question=question)}]
    arts = [(i, a["text"], a.get("date") or "unknown") for i, a in enumerate(articles, 1)]
    return [{"role": "user",
             "content": render_template("rag_answer", question=question, articles=arts)}]


def _row(item_id: str, setting: str, lang: str, prompt, error: str | None) -> dict:
    return {"item_id": item_id, "study": STUDY, "setting": setting, "lang": lang,
            "prompt": prompt, "error": error}


def build_prompt(item: dict, setting: str, opts: dict, *,
                 translations: dict[str, str] | None = None) -> dict:
    """The prompt row of one item in one setting (an error row when it cannot be built)."""
    spec = _spec(setting)
    lang = item.get("lang")
    if item.get("error"):
        return _row(item["id"], setting, lang, None, item["error"])
    question = item["question"] if spec.question == "x" else item.get("en_question")
    if not question:
        return _row(item["id"], setting, lang, None,
                    f"item {item['id']} has no en_question (needed by {setting})")
    if spec.docs == "none":
        return _row(item["id"], setting, lang, render_prompt(question, None), None)
    arts = [a for a in item["articles"] if spec.docs == "all" or a["supporting"]]
    if spec.translate != "none":  # ES: the supporting X articles; ES+ED: all X articles
        missing, swapped = [], []
        for a in arts:
            if a["lang"] == "en" or (spec.translate == "supporting" and not a["supporting"]):
                swapped.append(a)
                continue
            text = (translations or {}).get(a["doc_id"])
            if not isinstance(text, str) or not text.strip():
                missing.append(a["doc_id"])
            else:
                swapped.append({**a, "text": text, "lang": "en", "title": None})
        if missing:
            return _row(item["id"], setting, lang, None,
                        f"no English translation of article(s) {', '.join(missing)} "
                        f"(translations source '{opts.get('translations')}'; {setting} "
                        f"needs the {'supporting ' if spec.translate == 'supporting' else ''}"
                        "X articles in English)")
        arts = swapped
    arts = order_articles(arts, opts.get("article_order", "given"), item_id=item["id"],
                          seed=opts.get("shuffle_seed", 0))
    limit = opts.get("max_article_words")
    arts = [{**a, "text": truncate_words(a["text"], limit)} for a in arts]
    return _row(item["id"], setting, lang, render_prompt(question, arts), None)


def build_prompts(opts: dict, setting: str, lang: str, *,
                  translations: dict[str, str] | None = None) -> list[dict]:
    """Prompt rows ``{item_id, study, setting, lang, prompt (chat messages), error}`` of one
    cell: the instances of the setting's subset in ``lang`` (the first ``limit`` of them, in
    file order). Unusable instances are error rows; lines whose language is unknown are
    error rows of the first configured language's cells, so each is counted once per
    setting. A duplicate id within the cell is an error row."""
    spec = _spec(setting)
    first = opts["langs"][0] if opts.get("langs") else lang
    rows, seen, n = [], set(), 0
    for item in _items_for(opts["data"], lang):
        if item["error"]:
            if item["lang"] == lang or (item["lang"] is None and lang == first):
                rows.append(_row(item["id"], setting, lang, None, item["error"]))
            continue
        if item["subset"] != spec.subset:
            continue
        if opts.get("limit") is not None and n >= opts["limit"]:
            break
        n += 1
        if item["id"] in seen:
            rows.append(_row(item["id"], setting, lang, None,
                             f"duplicate id {item['id']} in {lang}/{spec.subset}"))
            continue
        seen.add(item["id"])
        rows.append(build_prompt(item, setting, opts, translations=translations))
    return rows


# --- judging ------------------------------------------------------------------------------

def judge_prompt(item: dict, answer: str) -> list[dict]:
    """Chat messages asking a judge whether ``answer`` is correct: Figure 20 verbatim
    (xrag.txt L650-677), one user message.

    ``item`` is a :func:`load_items` item, optionally with a ``"setting"`` key: the question
    and the golden answer are those of the setting's question language (English for the
    English settings), so rule 5 ("If the generated answer is in a different language than
    the golden answer, it should be considered as wrong") asks for the language the answer
    must be in. The judges reply with JSON ``justification`` and ``answer`` keys
    (tasks/judge.py reads ``answer`` as the verdict); lingua still checks the language
    afterwards, because judges "sometimes fail to do so" (xrag.txt L591)."""
    spec = SETTING_SPECS.get(item.get("setting") or "mono", SETTING_SPECS["mono"])
    if spec.question == "x":
        question, gold = item.get("question"), item.get("answer")
    else:
        question = item.get("en_question") or item.get("question")
        gold = item.get("en_answer") or item.get("answer")
    return [{"role": "user", "content": render_template(
        "judge", question=str(question), answer=str(gold), pred=str(answer))}]


def judge_rows(opts: dict, generations: Iterable[dict]) -> list[dict]:
    """Judge prompt rows ``{item_id, study, setting, lang, model, prompt, error}``, one per
    generation (a generation with no parsed answer, or of an unknown item, is an error row:
    nothing to judge). Convenience over :func:`judge_prompt` for the judge stage."""
    by_lang: dict[str, dict[str, dict]] = {}
    rows = []
    for g in generations:
        lang, item_id = g.get("lang"), str(g.get("item_id"))
        row = {"item_id": item_id, "study": STUDY, "setting": g.get("setting"), "lang": lang,
               "model": g.get("model"), "prompt": None, "error": None}
        rows.append(row)
        if lang not in by_lang:
            by_lang[lang] = {it["id"]: it for it in _items_for(opts["data"], lang)
                             if not it["error"]}
        item = by_lang[lang].get(item_id)
        parsed = g.get("parsed")
        answer = parsed.get("answer") if isinstance(parsed, dict) else None
        if g.get("setting") not in SETTING_SPECS:
            row["error"] = f"unknown setting {g.get('setting')!r}"
        elif item is None:
            row["error"] = f"no XRAG item {item_id} in {lang}"
        elif not isinstance(answer, str) or not answer.strip():
            row["error"] = "no answer to judge: " + (g.get("error") or "nothing parsed")
        else:
            row["prompt"] = judge_prompt({**item, "setting": g["setting"]}, answer)
    return rows


# --- scoring ------------------------------------------------------------------------------

Key = tuple[str, str, str, str]  # (setting, lang, model, item_id)
# Extra generation columns the evaluate stage reads for score(): the engine's record of a
# prompt cut to fit max_model_len (counted per cell, flagged in the tables).
SCORE_COLUMNS = ("truncated_from",)


def _key(row: dict) -> Key:
    return (str(row.get("setting")), str(row.get("lang")), str(row.get("model")),
            str(row.get("item_id")))


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float | None, float | None]:
    """Wilson score interval of k/n, in %."""
    if n == 0:
        return None, None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return 100 * max(0.0, mid - half), 100 * min(1.0, mid + half)


def read_labels(path: str) -> dict[Key, bool]:
    """Human labels: JSON lines or CSV (by extension: .csv/.tsv, else JSON lines) with
    ``item_id, setting, lang, model, label``; label ``correct``/``incorrect`` (or 1/0,
    true/false). A local path or a URI pyarrow opens (``s3://...``). A row that breaks the
    format is a ValueError naming its line."""
    import csv

    out: dict[Key, bool] = {}
    with _open(path) as f:
        text = f.read().decode("utf-8-sig")
    if path.endswith((".csv", ".tsv")):
        reader = csv.DictReader(io.StringIO(text, newline=""),
                                delimiter="\t" if path.endswith(".tsv") else ",")
        rows = [(n, r) for n, r in enumerate(reader, 2)]
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except ValueError as e:
                    raise ValueError(f"{path}: line {n}: malformed JSON ({e})") from None
    for n, r in rows:
        if not isinstance(r, dict):
            raise ValueError(f"{path}: line {n}: expected an object")
        missing = [k for k in ("item_id", "setting", "lang", "model", "label")
                   if r.get(k) in (None, "")]
        if missing:
            raise ValueError(f"{path}: line {n}: missing {missing}")
        lab = r["label"]
        if isinstance(lab, str) and lab.strip() in ("0", "1"):
            lab = lab.strip() == "1"
        elif isinstance(lab, int) and not isinstance(lab, bool) and lab in (0, 1):
            lab = bool(lab)
        v = normalize_verdict(lab)
        if v is None:
            raise ValueError(f"{path}: line {n}: label must be correct/incorrect, got {lab!r}")
        out[_key(r)] = v == "correct"
    return out


def score(opts: dict, generations: list[dict], judgments: list[dict] | None,
          detected: dict | None = None, labels: str | None = None
          ) -> tuple[list[dict], list[dict]]:
    """Per-generation verdicts and the metrics rows (see the module docstring).

    A generation's verdict: the judges' majority (valid judges only; a tie is not correct)
    AND its answer's language (``detected[(setting, lang, model, item_id)]``) is the
    expected one; without ``detected`` there is no language check. A generation that failed
    (an error and no output at all) has no verdict; one whose output (even blank) has no
    parsed answer and no valid judge is incorrect (it did not answer in the asked format).
    ``judgments=None`` (no judge panel): no verdicts, only the answer and language rates.
    """
    panel = judgments is not None
    votes: dict[Key, dict[str, str | None]] = defaultdict(dict)
    for j in judgments or ():
        verdict = None if j.get("error") else normalize_verdict(j.get("verdict"))
        votes[_key(j)][str(j.get("judge"))] = verdict  # a re-judged item: the last one
    items = []
    for g in generations:
        k = _key(g)
        setting, lang, model, item_id = k
        row = {"study": STUDY, "item_id": item_id, "setting": setting, "lang": lang,
               "model": model, "verdict": None, "judge_correct": None, "n_valid_judges": 0,
               "n_judges": len(votes.get(k, {})), "answered": None, "lang_ok": None,
               "detected_lang": None, "expected_lang": None, "abstained": None,
               "truncated": g.get("truncated_from") is not None, "error": None}
        items.append(row)
        if setting not in SETTING_SPECS:
            row["error"] = f"unknown setting {setting!r}"
            continue
        row["expected_lang"] = expected_language(setting, lang)
        output = g.get("output")
        if g.get("error") and output is None:  # the call failed: nothing to score
            row["error"] = f"generation failed: {g['error']}"
            continue
        parsed = g.get("parsed")
        row["answered"] = isinstance(parsed, dict) and bool(str(parsed.get("answer") or "").strip())
        if SETTING_SPECS[setting].docs == "none" and row["answered"]:  # Figure 19's abstain
            row["abstained"] = _ABSTAIN.fullmatch(str(parsed["answer"]).strip()) is not None
        if detected is not None and row["answered"]:
            d = detected.get(k)
            row["detected_lang"] = d
            row["lang_ok"] = language_ok(d, row["expected_lang"])
        if not panel:
            continue
        correct, n_valid = majority_vote(list(votes.get(k, {}).values()))
        row["n_valid_judges"] = n_valid
        if correct is None:
            if row["answered"]:
                row["error"] = "no valid judgment"
                continue
            correct = False
            row["error"] = f"no answer in the output: {g.get('error') or 'nothing parsed'}"
        row["judge_correct"] = correct
        row["verdict"] = bool(correct and row["lang_ok"] is not False)
    metrics = _metrics(opts, items, panel, detected is not None)
    if labels:
        metrics += _kappa_rows(items, read_labels(labels))
    return items, metrics


_ABSTAIN = re.compile(r"[\[\s\"'*]*none[\]\s\"'.*]*", re.I)


def _mrow(setting, lang, model, metric, value, n, ci=(None, None)) -> dict:
    return {"study": STUDY, "setting": setting, "lang": lang, "model": model,
            "metric": metric, "value": value, "ci_low": ci[0], "ci_high": ci[1], "n": n}


def _metrics(opts: dict, items: list[dict], panel: bool, with_language: bool) -> list[dict]:
    cells: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in items:
        if r["setting"] in SETTING_SPECS:
            cells[(r["setting"], r["lang"], r["model"])].append(r)
    out: list[dict] = []
    per: dict[tuple[str, str, str], dict[str, dict]] = defaultdict(dict)  # (s, m, metric)

    def rate(setting, lang, model, name, hits, n):
        return _mrow(setting, lang, model, name, 100 * hits / n if n else None, n,
                     wilson(hits, n))

    for (setting, lang, model), rows in sorted(cells.items()):
        ran = [r for r in rows if r["answered"] is not None]
        metric_rows = [rate(setting, lang, model, "answer_rate",
                            sum(r["answered"] for r in ran), len(ran))]
        if panel:
            scored = [r for r in rows if r["verdict"] is not None]
            n = len(scored)
            metric_rows += [
                rate(setting, lang, model, "accuracy", sum(r["verdict"] for r in scored), n),
                rate(setting, lang, model, "judge_accuracy",
                     sum(r["judge_correct"] for r in scored), n),
                _mrow(setting, lang, model, "n_valid_judges",
                      sum(r["n_valid_judges"] for r in scored) / n if n else None, n),
                _mrow(setting, lang, model, "unscored", float(len(rows) - n), len(rows))]
        if with_language:
            checked = [r for r in rows if r["lang_ok"] is not None]
            metric_rows.append(rate(setting, lang, model, "wrong_language_rate",
                                    sum(not r["lang_ok"] for r in checked), len(checked)))
            if expected_language(setting, lang) != "en":
                eng = sum(r["detected_lang"] is not None and language_ok(r["detected_lang"], "en")
                          for r in checked)
                metric_rows.append(rate(setting, lang, model, "response_language_error_rate",
                                        eng, len(checked)))
        if SETTING_SPECS[setting].docs == "none":
            told = [r for r in ran if r["answered"]]
            metric_rows.append(rate(setting, lang, model, "abstain_rate",
                                    sum(bool(r["abstained"]) for r in told), len(told)))
        cut = sum(bool(r.get("truncated")) for r in rows)
        if cut:
            metric_rows.append(_mrow(setting, lang, model, "truncated", float(cut), len(rows)))
        out += metric_rows
        for r in metric_rows:
            if r["metric"] not in ("unscored", "truncated"):
                per[(setting, model, r["metric"])][lang] = r
    for (setting, model, metric), by_lang in sorted(per.items()):
        vals = [by_lang.get(lang) for lang in opts["langs"]]
        if any(v is None or v["value"] is None for v in vals):
            continue
        out.append(_mrow(setting, "avg", model, metric,
                         sum(v["value"] for v in vals) / len(vals), sum(v["n"] for v in vals)))
    return out


def _kappa_rows(items: list[dict], labels: dict[Key, bool]) -> list[dict]:
    pairs: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for r in items:
        k = (r["setting"], r["lang"], r["model"], r["item_id"])
        if k in labels and r["judge_correct"] is not None:
            pairs[r["model"]].append((r["judge_correct"], labels[k]))
    out = []
    groups = [("all", [p for ps in pairs.values() for p in ps])]
    if len(pairs) > 1:
        groups += sorted(pairs.items())
    for model, ps in groups:
        value = cohen_kappa([a for a, _ in ps], [b for _, b in ps]) if ps else None
        if value is not None and math.isnan(value):
            value = None
        out.append(_mrow("all", "all", model, "kappa", value, len(ps)))
    return out


# --- tables -------------------------------------------------------------------------------

_CHECKOUT_EXPECTED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), "configs", "xrag.expected.yaml")
TABLE6_ROWS = ("multi", "multi_eq", "multi_eq_es", "multi_en_x")  # xrag.txt L250-253
DAGGER = "†"


def expected_path(opts: dict | None) -> str | None:
    """The published-numbers file the tables read: the ``expected`` option (``auto``: the
    checkout's configs/xrag.expected.yaml, beside configs/xrag.yaml, when it exists)."""
    v = (opts or {}).get("expected", DEFAULTS["expected"])
    if v == "auto":
        return _CHECKOUT_EXPECTED if os.path.isfile(_CHECKOUT_EXPECTED) else None
    return v or None


def load_expected(path: str | None) -> dict:
    """An xrag.expected.yaml (see configs/xrag.expected.yaml) as a dict; ``{}`` for None."""
    if not path:
        return {}
    import yaml

    with _open(path) as f:
        data = yaml.safe_load(f.read().decode("utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of tables")
    return data


def paper_model(expected: dict, model: str) -> str | None:
    """The paper's name of one of our models (by the expected file's ``aliases``, without
    case), or None when the paper did not run it."""
    want = model.strip().lower()
    for name, spec in (expected.get("models") or {}).items():
        names = [name, *((spec or {}).get("aliases") or [])]
        if want in (str(n).strip().lower() for n in names):
            return name
    return None


def _fmt(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def _delta(ours, paper) -> str:
    if ours is None or paper is None:
        return "–"
    return f"{ours - paper:+.2f}"


def _table(title: str, header: list[str], rows: list[list[str]], notes=()) -> str:
    lines = [f"**{title}**", "", "| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if not rows:
        lines.append("| " + " | ".join(["(no results)"] + [""] * (len(header) - 1)) + " |")
    body = "\n".join(lines)
    flagged = any(DAGGER in c for r in rows for c in r)
    notes = list(notes) + ([f"{DAGGER} some prompts of this cell were cut to fit the model's "
                            "max_model_len (metric `truncated`; the generate manifests count "
                            "them too): raise max_model_len before comparing."]
                           if flagged else [])
    return body + "".join(f"\n\n{n}" for n in notes)


def tables(metrics: Iterable[dict], options: dict | None = None) -> str:
    """Markdown tables in the paper's shapes: Table 3 (models x No Retrieval / Oracle
    Retrieval, English questions), Table 4 (models x En, De, Es, Zh, Ar, Avg), Table 5
    (models x En+En_X and En+X per language, Avg (crossling.)), Table 6 (one table per
    model: rows XRAG-MultiR, +EQ, +EQ, +ES, MonoRAG; columns En+De..En+Ar, Avg); then the
    settings not in the paper, the response-language errors, answer and abstain rates, and
    the judge-human kappa when present. A model the paper ran (the ``expected`` option's
    file, matched by alias) gets the paper's row and the difference (ours - paper) under
    its own; cells with truncated prompts carry a dagger."""
    val: dict[tuple[str, str, str, str], float | None] = {}
    models: list[str] = []
    for r in metrics:
        if r.get("study", STUDY) != STUDY:
            continue
        val[(r["setting"], r["lang"], r["model"], r["metric"])] = r["value"]
        if r["model"] != "all" and r["model"] not in models:
            models.append(r["model"])
    models.sort()
    langs = list(LANGS)
    expected = load_expected(expected_path(options))
    run_langs = set((options or {}).get("langs") or LANGS)
    full = run_langs == set(LANGS)  # our Avg is over the same languages as the paper's
    avg_note = [] if full else [
        f"Avg is over the run's languages ({', '.join(sorted(run_langs))}); the paper's is "
        "over all four, so no difference is shown for it."]

    def get(setting, lang, model, metric="accuracy"):
        return val.get((setting, lang, model, metric))

    def cut(setting, lang, model) -> bool:
        if lang == "avg":
            return any(cut(setting, x, model) for x in run_langs)
        return bool(val.get((setting, lang, model, "truncated")))

    def cell(setting, lang, model, metric="accuracy"):
        return _fmt(get(setting, lang, model, metric)) + (
            f" {DAGGER}" if cut(setting, lang, model) else "")

    def has(model, settings, metric="accuracy"):
        return any(k[2] == model and k[0] in settings and k[3] == metric for k in val)

    def with_paper(label, model, ours: list, cols: list, paper: list | None, pname):
        """Our row, then (for a model the paper ran) the paper's row and the difference."""
        rows = [[label] + [cell(s, lang, model) for s, lang in cols]]
        if paper is not None:
            rows.append([f"↳ paper: {pname}"] + [_fmt(v) for v in paper])
            rows.append(["↳ Δ (ours − paper)"] + [
                # an average over X is the paper's only over the same four languages
                "–" if (lang == "avg" and not full and SETTING_SPECS[s].question == "x")
                else _delta(o, pv) for o, pv, (s, lang) in zip(ours, paper, cols)])
        return rows

    out = []
    # Table 3 (xrag.txt L194-201): English questions; our value is the mean over the X cells.
    cols = [("no_retrieval", "avg"), ("oracle", "avg")]
    rows = []
    for m in models:
        if not has(m, {"no_retrieval", "oracle"}):
            continue
        pname = paper_model(expected, m)
        pub = (expected.get("table3") or {}).get(pname) if pname else None
        paper = [pub.get("no_retrieval"), pub.get("oracle")] if pub else None
        rows += with_paper(m, m, [get(s, l, m) for s, l in cols], cols, paper, pname)
    out.append(_table("Table 3: no retrieval and oracle retrieval (English questions of the "
                      "monolingual subset), accuracy (%)",
                      ["Model", "No Retrieval", "Oracle Retrieval"], rows,
                      ["Ours: the mean over the X cells run (each asks the English questions "
                       "of its language's monolingual instances)."]))
    # Table 4 (xrag.txt L211-219)
    cols = [("mono_en", "avg")] + [("mono", lang) for lang in langs] + [("mono", "avg")]
    rows = []
    for m in models:
        if not has(m, {"mono", "mono_en"}):
            continue
        pname = paper_model(expected, m)
        pub = (expected.get("table4") or {}).get(pname) if pname else None
        paper = [pub.get(k) for k in ("en", *langs, "avg")] if pub else None
        rows += with_paper(m, m, [get(s, l, m) for s, l in cols], cols, paper, pname)
    out.append(_table("Table 4: monolingual retrieval (2 supporting + 6 distracting English "
                      "articles), accuracy (%)",
                      ["Model", "En"] + [lang.capitalize() for lang in langs] + ["Avg"], rows,
                      avg_note))
    # Table 5 (xrag.txt L230-237)
    cols = [c for lang in langs for c in (("multi_en_x", lang), ("multi", lang))] + \
        [("multi", "avg")]
    header = ["Model"] + [h for lang in langs for h in (
        f"En+En_{lang.capitalize()} (En)", f"En+{lang.capitalize()} ({lang.capitalize()})")] + \
        ["Avg (crossling.)"]
    rows = []
    for m in models:
        if not has(m, {"multi", "multi_en_x"}):
            continue
        pname = paper_model(expected, m)
        pub = (expected.get("table5") or {}).get(pname) if pname else None
        paper = [v for lang in langs for v in ((pub.get("en_x") or {}).get(lang),
                                               (pub.get("x") or {}).get(lang))] + \
            [pub.get("avg")] if pub else None
        rows += with_paper(m, m, [get(s, l, m) for s, l in cols], cols, paper, pname)
    out.append(_table("Table 5: multilingual retrieval (1 supporting + 3 distracting articles "
                      "in X and the same in English), accuracy (%)", header, rows,
                      avg_note + ["En_X: the X articles machine-translated to English by the "
                                  "translate stage (the paper used Google Translate)."]))
    # Table 6 and Tables 9-11 (xrag.txt L247-257, L690-712): one table per model
    t6 = []
    for m in models:
        if not has(m, set(TABLE6_ROWS)):
            continue
        pname = paper_model(expected, m)
        pub = (expected.get("table6") or {}).get(pname) if pname else None
        rows = []
        for s in TABLE6_ROWS:
            cols = [(s, lang) for lang in langs] + [(s, "avg")]
            paper = [(pub.get(s) or {}).get(k) for k in (*langs, "avg")] if pub else None
            rows += with_paper(SETTING_SPECS[s].label, m, [get(c, l, m) for c, l in cols],
                               cols, paper, pname)
        where = f" (paper: Table {pub.get('table', 6)}, {pname})" if pub else ""
        t6.append(_table(f"Table 6: controlled analysis of {m} on the multilingual retrieval "
                         f"subset{where}, accuracy (%)",
                         ["Setting"] + [f"En+{lang.capitalize()}" for lang in langs] + ["Avg"],
                         rows, avg_note if pub else []))
    out += t6 or [_table("Table 6: controlled analysis (multilingual retrieval), accuracy (%)",
                         ["Setting"] + [f"En+{lang.capitalize()}" for lang in langs] + ["Avg"],
                         [])]
    # settings the paper did not run
    ext = [s for s in SETTINGS if SETTING_SPECS[s].paper is None]
    rows = [[m, f"{s}: {SETTING_SPECS[s].label}"] + [cell(s, lang, m) for lang in langs]
            + [cell(s, "avg", m)] for s in ext for m in models if has(m, {s})]
    if rows:
        out.append(_table("Not in the paper (ext_* settings), accuracy (%)",
                          ["Model", "Setting"] + [lang.capitalize() for lang in langs]
                          + ["Avg"], rows))
    for metric, title in (
            ("response_language_error_rate", "Response-language errors (% answered in English)"),
            ("answer_rate", "Answer rate (% of outputs with an <answer> tag)"),
            ("abstain_rate", "Abstain rate (% of answers that are <answer>None</answer>)"),
            ("truncated", "Truncated prompts (count)")):
        f = (lambda v: "–" if v is None else str(int(v))) if metric == "truncated" else _fmt
        rows = [[m, f"{s}: {SETTING_SPECS[s].label}"]
                + [f(get(s, lang, m, metric)) for lang in langs]
                + [f(get(s, "avg", m, metric))]
                for s in SETTINGS for m in models if has(m, {s}, metric)]
        if rows:
            out.append(_table(title, ["Model", "Setting"] + [lang.capitalize() for lang in langs]
                              + ["Avg"], rows))
    kappa = [(k[2], v) for k, v in val.items() if k[3] == "kappa"]
    if kappa:
        out.append(_table("Judge panel vs humans, Cohen's kappa", ["Judged model", "kappa"],
                          [[m, "–" if v is None else f"{v:.2f}"] for m, v in sorted(kappa)]))
    return "\n\n".join(out) + "\n"
