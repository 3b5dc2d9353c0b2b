"""XRAG: cross-lingual retrieval-augmented generation over news (Liu et al., Findings of
EMNLP 2025, arXiv:2505.10089; data ``AmazonScience/XRAG`` on the hub).

A question in X (de, es, zh, ar) is answered from eight given news articles. Two subsets:

* **monolingual retrieval** (``subset="mono"``): 2 supporting + 6 distracting articles, all
  English. Paper Table 4: accuracy per model x language, their average, and the English
  baseline (the English version of the question over the same articles).
* **multilingual retrieval** (``subset="multi"``): 1 supporting + 3 distracting articles in
  X and 1 + 3 in English. Paper Table 5: accuracy per language, the cross-lingual average,
  and the En+En_X baseline (English question, the X articles machine-translated to
  English).

Answers are scored by a judge panel (majority vote over the judges whose verdict parsed)
AND a response-language check: a correct answer in the wrong language is not correct.

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

Settings (``SETTINGS``; assumptions about the paper's Table 6 ablations marked)
--------------------------------------------------------------------------------
Each setting is one subset plus the language of the question (Q), the language the answer
must be in (S, the "solution"), and whether the X articles are replaced by their English
translation (D):

================  ======  ===  ===  ===  ===========================================
setting           subset  Q    S    D    paper
================  ======  ===  ===  ===  ===========================================
mono              mono    X    X    -    Table 4, X columns
mono_en           mono    en   en   -    Table 4, English baseline (En)
mono_eq           mono    en   X    -    Table 6 +EQ (English question, answer in X)
multi             multi   X    X    -    Table 5, X columns
multi_en_x        multi   en   en   en   Table 5, En+En_X baseline (= +EQ+ES+ED)
multi_eq          multi   en   X    -    Table 6 +EQ
multi_es          multi   X    en   -    Table 6 +ES (assumed: English answer)
multi_eq_es       multi   en   en   -    Table 6 +EQ+ES
multi_ed          multi   X    X    en   Table 6 +ED (X articles in English: "MonoRAG")
no_retrieval      mono    X    X    -    no articles (the paper's closed-book check)
oracle            mono    X    X    -    supporting articles only
multi_oracle      multi   X    X    -    supporting articles only (1 in X, 1 English)
================  ======  ===  ===  ===  ===========================================

We could not read the paper's body, so the exact reading of +EQ/+ES/+ED (E = English;
Q/S/D = question / solution (answer) / documents) and of "MonoRAG" is ours; so is the
wording of every prompt below (question, articles numbered with their dates, the
instruction to answer in the question's language, the final answer in ``<answer>`` tags;
the judge sees question, gold answer and model answer and returns a JSON verdict).

Options (``check_options``; errors read ``study.options.<key>: <what>; <fix>``): ``data``
(required: path or URI of ``xrag.{dev,test}.jsonl``), ``langs`` (default de, es, zh, ar),
``settings`` (default: all of ``SETTINGS``), ``article_order`` (``given`` = the release's
``article_order``, default; ``stored``, ``shuffled`` (per-item seed from ``shuffle_seed``,
default 0), ``supporting_first``, ``supporting_last``, ``date``), ``max_article_words``
(default None: whole articles; a CJK character counts as a word), ``translations`` (the
translate stage's documents source holding the X articles in English, default
``xrag-articles``), ``limit`` (first N instances per language and subset, default None).

Cells and the English baselines: every setting, English ones included, has one cell per X
in ``langs`` (``lang`` = the X whose instances it runs); the language the answer must be in
is ``expected_language(setting, lang)`` ("en" for mono_en, multi_en_x, multi_es,
multi_eq_es). The "En" and "En+En_X" columns are those settings' averages over X.

Metrics (``score``), each per (setting, lang, model): ``accuracy`` (% of scored
generations that the panel judged correct AND whose answer is in the expected language;
Wilson 95% interval), ``judge_accuracy`` (panel only), ``response_language_error_rate`` (%
of answers in English where the expected language is not English: the paper's
response-language failure), ``wrong_language_rate`` (% of answers not in the expected
language), ``answer_rate`` (% of generations with an ``<answer>``), ``n_valid_judges``
(mean), ``unscored`` (count of generations without a verdict); plus ``lang="avg"`` rows:
the unweighted mean over the configured languages (Table 4's average over the non-English
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
from xling.tasks.languages import get_language, validate_languages
from xling.tasks.textio import iter_lines

STUDY = "xrag"
LANGS = ("de", "es", "zh", "ar")


@dataclass(frozen=True)
class Setting:
    subset: str            # "mono" | "multi": which instances
    question: str          # "x" | "en": question language
    response: str          # "x" | "en": the language the answer must be in
    docs: str              # "all" | "supporting" | "none"
    translate: bool        # X articles replaced by their English translation (ED)
    label: str             # for tables


SETTING_SPECS: dict[str, Setting] = {
    "mono": Setting("mono", "x", "x", "all", False, "Monolingual retrieval"),
    "mono_en": Setting("mono", "en", "en", "all", False, "Mono English baseline (En)"),
    "mono_eq": Setting("mono", "en", "x", "all", False, "Mono +EQ"),
    "multi": Setting("multi", "x", "x", "all", False, "Multilingual retrieval"),
    "multi_en_x": Setting("multi", "en", "en", "all", True, "Multi En+En_X (+EQ+ES+ED)"),
    "multi_eq": Setting("multi", "en", "x", "all", False, "Multi +EQ"),
    "multi_es": Setting("multi", "x", "en", "all", False, "Multi +ES"),
    "multi_eq_es": Setting("multi", "en", "en", "all", False, "Multi +EQ+ES"),
    "multi_ed": Setting("multi", "x", "x", "all", True, "Multi +ED (MonoRAG)"),
    "no_retrieval": Setting("mono", "x", "x", "none", False, "No retrieval"),
    "oracle": Setting("mono", "x", "x", "supporting", False, "Oracle (mono)"),
    "multi_oracle": Setting("multi", "x", "x", "supporting", False, "Oracle (multi)"),
}
SETTINGS = tuple(SETTING_SPECS)

ARTICLE_ORDERS = ("given", "stored", "shuffled", "supporting_first", "supporting_last",
                  "date")
DEFAULTS: dict[str, Any] = {
    "langs": list(LANGS),
    "settings": list(SETTINGS),
    "article_order": "given",      # the release's article_order (see the docstring)
    "shuffle_seed": 0,
    "max_article_words": None,     # no truncation: the paper gives whole articles
    "translations": "xrag-articles",
    "limit": None,
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
    return {"data": data, "langs": list(dict.fromkeys(resolved)),
            "settings": list(dict.fromkeys(settings)), "article_order": order,
            "shuffle_seed": seed, "max_article_words": _positive_int_or_none(raw,
                                                                             "max_article_words"),
            "translations": translations, "limit": _positive_int_or_none(raw, "limit")}


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
    """Does the setting read English translations of the X articles (+ED, En+En_X)?"""
    return _spec(setting).translate


def expected_language(setting: str, lang: str) -> str:
    """The language an answer in this cell must be in."""
    return "en" if _spec(setting).response == "en" else lang


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


def _language_name(code: str) -> str:
    return get_language(code).name


def _instruction(spec: Setting, lang: str, retrieval: bool) -> str:
    q_lang = lang if spec.question == "x" else "en"
    a_lang = lang if spec.response == "x" else "en"
    if q_lang == a_lang:
        say = "Answer in the same language as the question."
    else:
        say = f"Answer in {_language_name(a_lang)}."
    use = ("Answer the question using the information in the articles. "
           if retrieval else "Answer the question. ")
    return use + say + " Write your final answer between <answer> and </answer>."


def render_prompt(question: str, articles: list[dict] | None, instruction: str) -> list[dict]:
    """The chat messages of one XRAG prompt: the articles numbered with their dates, then the
    question, then the instruction (no articles: the question and the instruction)."""
    if not articles:
        return [{"role": "user", "content": f"Question: {question}\n\n{instruction}"}]
    parts = [f"Here are {len(articles)} news articles, each with its publication date."]
    for i, a in enumerate(articles, 1):
        date = a.get("date") or "unknown"
        head = f"Article {i} (published {date})"
        title = f"{a['title']}\n" if a.get("title") else ""
        parts.append(f"{head}:\n{title}{a['text']}")
    parts.append(f"Question: {question}")
    parts.append(instruction)
    return [{"role": "user", "content": "\n\n".join(parts)}]


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
        return _row(item["id"], setting, lang,
                    render_prompt(question, None, _instruction(spec, lang, False)), None)
    arts = [a for a in item["articles"] if spec.docs == "all" or a["supporting"]]
    if spec.translate:
        missing, swapped = [], []
        for a in arts:
            if a["lang"] == "en":
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
                        "needs the X articles in English)")
        arts = swapped
    arts = order_articles(arts, opts.get("article_order", "given"), item_id=item["id"],
                          seed=opts.get("shuffle_seed", 0))
    limit = opts.get("max_article_words")
    arts = [{**a, "text": truncate_words(a["text"], limit)} for a in arts]
    return _row(item["id"], setting, lang,
                render_prompt(question, arts, _instruction(spec, lang, True)), None)


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
    """Chat messages asking a judge whether ``answer`` is correct.

    ``item`` is a :func:`load_items` item, optionally with a ``"setting"`` key: then the
    question and the gold answer are those the setting used (English for the English
    baselines and +EQ/+ES), with the English gold answer added as a reference when they are
    not English. The judge is told to ignore the answer's language (checked separately)."""
    spec = SETTING_SPECS.get(item.get("setting") or "mono", SETTING_SPECS["mono"])
    question = item.get("question") if spec.question == "x" else \
        item.get("en_question") or item.get("question")
    gold = item.get("answer") if spec.response == "x" else \
        item.get("en_answer") or item.get("answer")
    ref = ""
    if spec.response == "x" and item.get("en_answer") and item.get("en_answer") != gold:
        ref = f"Gold answer in English (for reference): {item['en_answer']}\n"
    content = (
        "You are judging an answer to a question about recent news. Decide whether the "
        "model's answer is correct by comparing it with the gold answer.\n"
        "- Correct: it gives the same information as the gold answer (paraphrases, "
        "translations and extra explanation that does not contradict it are fine).\n"
        "- Incorrect: it is wrong, incomplete, contradicts the gold answer, or does not "
        "answer the question.\n"
        "Do not judge the language the answer is written in; that is checked separately.\n\n"
        f"Question: {question}\n"
        f"Gold answer: {gold}\n"
        f"{ref}"
        f"Model answer: {answer}\n\n"
        'Reply with a JSON object only: {"verdict": "correct"} or {"verdict": "incorrect"}, '
        'optionally with a short "reason".')
    return [{"role": "user", "content": content}]


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
               "detected_lang": None, "expected_lang": None, "error": None}
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
        out += metric_rows
        for r in metric_rows:
            if r["metric"] != "unscored":
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

def _fmt(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [f"**{title}**", "", "| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if not rows:
        lines.append("| " + " | ".join(["(no results)"] + [""] * (len(header) - 1)) + " |")
    return "\n".join(lines)


def tables(metrics: Iterable[dict]) -> str:
    """Markdown tables shaped like the paper's: Table 4 (monolingual retrieval: models x
    De/Es/Zh/Ar, Avg over them, En baseline), Table 5 (multilingual retrieval: the same with
    the En+En_X baseline), Table 6 (ablations: model x setting rows, language columns), the
    response-language error rates, and the judge-human kappa when present."""
    val: dict[tuple[str, str, str, str], float | None] = {}
    models: list[str] = []
    langs = [lang for lang in LANGS]
    for r in metrics:
        if r.get("study", STUDY) != STUDY:
            continue
        val[(r["setting"], r["lang"], r["model"], r["metric"])] = r["value"]
        if r["model"] != "all" and r["model"] not in models:
            models.append(r["model"])
    models.sort()
    cols = [lang.capitalize() for lang in langs]

    def get(setting, lang, model, metric="accuracy"):
        return _fmt(val.get((setting, lang, model, metric)))

    def present(setting, metric="accuracy"):
        return any(k[0] == setting and k[3] == metric for k in val)

    out = []
    for num, base, extra, extra_name, what in (
            (4, "mono", "mono_en", "En", "monolingual retrieval"),
            (5, "multi", "multi_en_x", "En+En_X", "multilingual retrieval")):
        rows = [[m] + [get(base, lang, m) for lang in langs] + [get(base, "avg", m),
                                                                get(extra, "avg", m)]
                for m in models if present(base) or present(extra)]
        out.append(_table(f"Table {num}: {what}, accuracy (%)",
                          ["Model"] + cols + ["Avg", extra_name], rows))
    rows = []
    for s in ("mono", "mono_eq", "multi", "multi_eq", "multi_es", "multi_eq_es", "multi_ed",
              "multi_en_x", "no_retrieval", "oracle", "multi_oracle"):
        if present(s):
            rows += [[m, SETTING_SPECS[s].label] + [get(s, lang, m) for lang in langs]
                     + [get(s, "avg", m)] for m in models]
    out.append(_table("Table 6: ablations, accuracy (%)", ["Model", "Setting"] + cols + ["Avg"],
                      rows))
    for metric, title in (
            ("response_language_error_rate", "Response-language errors (% answered in English)"),
            ("answer_rate", "Answer rate (% of outputs with an <answer> tag)")):
        rows = [[m, SETTING_SPECS[s].label] + [get(s, lang, m, metric) for lang in langs]
                + [get(s, "avg", m, metric)] for s in SETTINGS if present(s, metric)
                for m in models]
        if rows:
            out.append(_table(title, ["Model", "Setting"] + cols + ["Avg"], rows))
    kappa = [(k[2], v) for k, v in val.items() if k[3] == "kappa"]
    if kappa:
        out.append(_table("Judge panel vs humans, Cohen's kappa", ["Judged model", "kappa"],
                          [[m, "–" if v is None else f"{v:.2f}"] for m, v in sorted(kappa)]))
    return "\n\n".join(out) + "\n"
