"""Reading the published XRAG jsonl: instances with their articles (each article's language
decided when the release does not label it), and the documents the translate stage reads.

README.md ("The published jsonl") says which fields are confirmed and which are assumed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import IO, Any

from xling.tasks.textio import iter_lines

from .settings import LANGS

_LANG_FIELDS = ("language", "lang")
_ARTICLE_LANG_FIELDS = ("article_langs", "article_languages", "langs")
_SUBSET_FIELDS = ("subset", "retrieval", "retrieval_setting")
_SUBSET_NAMES = {"mono": "mono", "monolingual": "mono", "monolingual_retrieval": "mono",
                 "multi": "multi", "multilingual": "multi", "multilingual_retrieval": "multi"}

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
    """Decide between ``lang`` (de/es/zh/ar) and ``"en"`` for one article (README.md: by
    script for zh/ar, by function words for de/es); anything undecidable is English."""
    if lang in ("zh", "ar"):
        letters = _LETTER.findall(text)
        if not letters:
            return "en"
        script = _CJK if lang == "zh" else _ARABIC
        share = sum(1 for c in letters if script.match(c)) / len(letters)
        return lang if share >= 0.3 else "en"
    words = [w.lower() for w in _WORD.findall(text)]
    own = sum(w in _FUNCTION_WORDS.get(lang, ()) for w in words)
    english = sum(w in _FUNCTION_WORDS["en"] for w in words)
    return lang if own > english else "en"


def _error_item(item_id: str, error: str, lang: str | None = None) -> dict:
    return {"id": item_id, "lang": lang, "subset": None, "question": None, "answer": None,
            "en_question": None, "en_answer": None, "q_type": None, "a_type": None,
            "crossdoc_type": None, "articles": [], "error": error}


class _Unusable(Exception):
    """An instance that cannot be used; the message says why."""


def parse_item(obj: Any, where: str) -> dict:
    """One decoded jsonl object -> an item; never raises.

    An item: ``id, lang, subset ("mono"|"multi"), question, answer, en_question, en_answer,
    q_type, a_type, crossdoc_type, articles, error``; each article ``{doc_id, index, lang,
    lang_source, title, text, date, supporting, order, url}``. An object that cannot be used
    is an item with an ``error`` (its id is ``where`` when the object has none)."""
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
    try:
        return _parse_instance(obj, item_id, lang)
    except _Unusable as e:
        return _error_item(item_id, f"{where} (id {item_id}): {e}", lang)


def _parse_instance(obj: dict, item_id: str, lang: str) -> dict:
    for key in ("question", "answer"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise _Unusable(f"missing or empty '{key}'")
    articles = _parse_articles(obj, item_id)
    subset_raw = next((obj[k] for k in _SUBSET_FIELDS if obj.get(k) is not None), None)
    subset = _SUBSET_NAMES.get(str(subset_raw).strip().lower()) if subset_raw is not None \
        else None
    if subset_raw is not None and subset is None:
        raise _Unusable(f"unknown subset {subset_raw!r}; expected mono(lingual) or "
                        "multi(lingual)")
    for article in articles:
        if article["lang"] is None:
            article["lang"] = guess_article_language(article["text"], lang)
    if subset is None:  # at least 2 articles in X: multilingual (README.md)
        subset = "multi" if sum(a["lang"] == lang for a in articles) >= 2 else "mono"
    if subset == "mono":
        for article in articles:
            if article["lang_source"] == "heuristic":
                article["lang"] = "en"
    if not any(a["supporting"] for a in articles):
        raise _Unusable("no supporting article (is_support has no 1)")

    def opt_str(key):
        value = obj.get(key)
        return None if value is None else str(value)

    return {"id": item_id, "lang": lang, "subset": subset, "question": obj["question"],
            "answer": obj["answer"], "en_question": opt_str("en_question"),
            "en_answer": opt_str("en_answer"), "q_type": opt_str("q_type"),
            "a_type": opt_str("a_type"), "crossdoc_type": obj.get("crossdoc_type"),
            "articles": articles, "error": None}


def _parse_articles(obj: dict, item_id: str) -> list[dict]:
    """The instance's articles from its parallel lists, in stored order; ``lang`` is None
    where no per-article language field gives it."""
    texts, support, dates = obj.get("articles"), obj.get("is_support"), obj.get("dates")
    if not isinstance(texts, list) or not texts:
        raise _Unusable("'articles' must be a non-empty list")
    if not isinstance(support, list) or len(support) != len(texts):
        raise _Unusable(f"'is_support' must be a list as long as 'articles' ({len(texts)})")
    if dates is None:
        dates = [None] * len(texts)
    if not isinstance(dates, list) or len(dates) != len(texts):
        raise _Unusable(f"'dates' must be a list as long as 'articles' ({len(texts)})")
    order = obj.get("article_order")
    if order is not None and (not isinstance(order, list) or len(order) != len(texts)):
        raise _Unusable(f"'article_order' must be a list as long as 'articles' ({len(texts)})")
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
            raise _Unusable(f"article {k} is empty or not text")
        supporting = support[k]
        if isinstance(supporting, str) and supporting.strip().lower() in ("0", "1", "true",
                                                                          "false"):
            supporting = supporting.strip().lower() in ("1", "true")
        if not isinstance(supporting, (bool, int)) or (not isinstance(supporting, bool)
                                                       and supporting not in (0, 1)):
            raise _Unusable(f"is_support[{k}] must be 0/1, got {support[k]!r}")
        try:
            position = None if order is None else float(order[k])
        except (TypeError, ValueError):
            raise _Unusable(f"article_order[{k}] must be a number, got {order[k]!r}") from None
        article_lang, source = None, "heuristic"
        if langs_field is not None and k < len(langs_field) and langs_field[k]:
            article_lang, source = str(langs_field[k]).strip().lower(), "field"
        articles.append({
            "doc_id": f"{item_id}#a{k}", "index": k, "lang": article_lang,
            "lang_source": source, "title": None if title is None else str(title),
            "text": text, "date": None if dates[k] is None else str(dates[k]),
            "supporting": bool(supporting), "order": position,
            "url": urls[k] if urls and k < len(urls) else None})
    return articles


def open_path(path: str) -> IO[bytes]:
    """A local file or a URI pyarrow opens (``s3://...``), for binary reading."""
    if "://" in path:
        import pyarrow.fs as pafs

        fs, inner = pafs.FileSystem.from_uri(path)
        return fs.open_input_stream(inner)
    return open(path, "rb")


def iter_items(stream: IO, name: str, only: str | None = None) -> Iterator[dict]:
    """Items (:func:`parse_item`) of a jsonl stream, in file order; a line that cannot be
    read is an error item with the id ``<name>:line<n>``. With ``only``, instances of another
    XRAG language are skipped before they are parsed (unreadable lines are always
    yielded)."""
    for line_no, raw in enumerate(iter_lines(stream), 1):
        where = f"{name}:line{line_no}"
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


_ITEMS_CACHE: dict[tuple, list[dict]] = {}


def items_for(path: str, lang: str) -> list[dict]:
    """The items of one language (plus unreadable lines, see build_prompts), cached for the
    last (file, language) so the cells of one language parse the file once."""
    try:
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size, lang)
    except OSError:
        key = (path, None, None, lang)
    if key not in _ITEMS_CACHE:
        _ITEMS_CACHE.clear()
        with open_path(path) as f:
            _ITEMS_CACHE[key] = [it for it in iter_items(f, os.path.basename(path), lang)
                                 if it["lang"] in (lang, None)]
    return _ITEMS_CACHE[key]


def iter_article_documents(stream: IO, *, lang: str, source: str) -> Iterator[dict]:
    """Documents rows (``doc_id, lang, title, text, source, date, error``) of the articles
    in ``lang`` of the multilingual instances in ``lang``: what the En+En_X and +ED settings
    need translated to English. A line that cannot be read is an error row."""
    for item in iter_items(stream, source, lang):
        if item["error"]:
            if item["lang"] in (lang, None):
                yield {"doc_id": item["id"], "lang": lang, "title": None, "text": None,
                       "source": source, "date": None, "error": item["error"]}
            continue
        if item["lang"] != lang or item["subset"] != "multi":
            continue
        for article in item["articles"]:
            if article["lang"] == lang:
                yield {"doc_id": article["doc_id"], "lang": lang, "title": article["title"],
                       "text": article["text"], "source": source, "date": article["date"],
                       "error": None}
