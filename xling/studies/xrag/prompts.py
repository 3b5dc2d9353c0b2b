"""XRAG's prompts: the paper's Figures 18, 19 and 20 (prompts.yaml beside this module, word
for word) filled with a setting's question and articles, and the judge rows over
generations."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .data import items_for
from .options import ARTICLE_ORDERS, Options
from .settings import SETTING_SPECS, STUDY, spec_of

PROMPTS_FILE = Path(__file__).with_name("prompts.yaml")
_PROMPTS: dict[str, Any] = {}
_VAR = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LOOP = re.compile(r"^[ \t]*\{%\s*for\s*\(idx,\s*text,\s*date\)\s*in\s*articles\s*%\}[ \t]*\n"
                   r"(.*?)^[ \t]*\{%\s*endfor\s*%\}[ \t]*\n", re.M | re.S)
# a word for max_article_words: one CJK character, or a run of anything but space and CJK
WORD_UNIT = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\s\u3400-\u4dbf"
                       r"\u4e00-\u9fff\uf900-\ufaff]+")


def truncate_words(text: str, max_words: int | None) -> str:
    """The first ``max_words`` words (whitespace-separated runs; each CJK character is one
    word), followed by " …" when anything was cut."""
    if max_words is None:
        return text
    end = None
    for n, match in enumerate(WORD_UNIT.finditer(text), 1):
        if n == max_words:
            end = match.end()
        elif n > max_words:
            return text[:end].rstrip() + " …"
    return text


def order_articles(articles: list[dict], how: str, *, item_id: str, seed: int) -> list[dict]:
    """The presentation order (``article_order`` option, see ``ARTICLE_ORDERS``)."""
    ordered = list(articles)
    if how == "given":
        if all(a.get("order") is not None for a in ordered):
            ordered.sort(key=lambda a: (a["order"], a["index"]))
        return ordered
    if how == "stored":
        return ordered
    if how == "shuffled":  # per-item seed: independent of which other items are loaded
        random.Random(f"{seed}:{item_id}").shuffle(ordered)
        return ordered
    if how == "supporting_first":
        return sorted(ordered, key=lambda a: not a["supporting"])
    if how == "supporting_last":
        return sorted(ordered, key=lambda a: a["supporting"])
    if how == "date":
        return sorted(ordered, key=lambda a: (a["date"] is None, a["date"] or ""))
    raise ValueError(f"unknown article order {how!r}; choose one of {list(ARTICLE_ORDERS)}")


# --- the paper's prompt templates (prompts.yaml) ------------------------------------------

def prompts() -> dict[str, Any]:
    """The templates (``rag_answer`` = Figure 18, ``no_retrieval`` = Figure 19, ``judge`` =
    Figure 20) and their ``pdf_fixes``, read once from the data file."""
    if not _PROMPTS:
        import yaml  # PyYAML is a dependency of the config layer already

        _PROMPTS.update(yaml.safe_load(PROMPTS_FILE.read_text(encoding="utf-8")))
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

    def loop(match: re.Match) -> str:
        return "".join(_fill(match.group(1), {**values, "idx": i, "text": t, "date": d})
                       for i, t, d in articles or ())
    return _fill(_LOOP.sub(loop, template), values)


def render_prompt(question: str, articles: list[dict] | None) -> list[dict]:
    """The chat messages of one XRAG prompt (one user message): Figure 18 over the articles
    in their presentation order, numbered from 1, each with its date (xrag.txt L624, L628);
    with no articles (``None``), Figure 19 (xrag.txt L632-640)."""
    if articles is None:
        return [{"role": "user", "content": render_template("no_retrieval", question=question)}]
    numbered = [(i, a["text"], a.get("date") or "unknown") for i, a in enumerate(articles, 1)]
    return [{"role": "user",
             "content": render_template("rag_answer", question=question, articles=numbered)}]


def _row(item_id: str, setting: str, lang: str, prompt, error: str | None,
         meta: dict | None = None) -> dict:
    return {"item_id": item_id, "study": STUDY, "setting": setting, "lang": lang,
            "prompt": prompt, "error": error, "meta": meta}


def _translated(articles: list[dict], setting: str, opts: Options,
                translations: dict[str, str] | None) -> list[dict] | str:
    """The articles with the setting's X articles replaced by their English translation
    (ES: the supporting ones; ES+ED: all), or the error naming the missing translations.
    A swapped article keeps its ``doc_id`` (the flags are looked up by it)."""
    spec = spec_of(setting)
    missing, swapped = [], []
    for article in articles:
        if article["lang"] == "en" or (spec.translate == "supporting"
                                       and not article["supporting"]):
            swapped.append(article)
            continue
        text = (translations or {}).get(article["doc_id"])
        if not isinstance(text, str) or not text.strip():
            missing.append(article["doc_id"])
        else:
            swapped.append({**article, "text": text, "lang": "en", "title": None,
                            "translated": True})
    if missing:
        return (f"no English translation of article(s) {', '.join(missing)} "
                f"(translations source '{opts.translations}'; {setting} "
                f"needs the {'supporting ' if spec.translate == 'supporting' else ''}"
                "X articles in English)")
    return swapped


def build_prompt(item: dict, setting: str, opts: Options, *,
                 translations: dict[str, str] | None = None,
                 flags: dict[str, str] | None = None) -> dict:
    """The prompt row of one item in one setting (an error row when it cannot be built)."""
    spec = spec_of(setting)
    lang = item.get("lang")
    if item.get("error"):
        return _row(item["id"], setting, lang, None, item["error"])
    question = item["question"] if spec.question == "x" else item.get("en_question")
    if not question:
        return _row(item["id"], setting, lang, None,
                    f"item {item['id']} has no en_question (needed by {setting})")
    if spec.docs == "none":
        return _row(item["id"], setting, lang, render_prompt(question, None), None)
    articles = [a for a in item["articles"] if spec.docs == "all" or a["supporting"]]
    meta = None
    if spec.translate != "none":
        articles = _translated(articles, setting, opts, translations)
        if isinstance(articles, str):
            return _row(item["id"], setting, lang, None, articles)
        # translations made although translate's language check flagged them (lang_check:
        # flag): used by default, as the paper answered every item; `wrong` is the opt-in
        flagged = sorted({a["doc_id"] for a in articles if a.get("translated")
                          and a["doc_id"] in (flags or {})})
        meta = {"flagged_translations": flagged}
        if flagged and opts.flagged_translations == "wrong":
            return _row(item["id"], setting, lang, None,
                        f"translation of article(s) {', '.join(flagged)} flagged by the "
                        f"language check ({flags[flagged[0]]}); flagged_translations: wrong "
                        "counts the item as wrong", meta)
    articles = order_articles(articles, opts.article_order, item_id=item["id"],
                              seed=opts.shuffle_seed)
    articles = [{**a, "text": truncate_words(a["text"], opts.max_article_words)}
                for a in articles]
    return _row(item["id"], setting, lang, render_prompt(question, articles), None, meta)


def build_prompts(opts: Options, setting: str, lang: str, *,
                  translations: dict[str, str] | None = None,
                  flags: dict[str, str] | None = None) -> list[dict]:
    """Prompt rows ``{item_id, study, setting, lang, prompt (chat messages), error}`` of one
    cell: the instances of the setting's subset in ``lang`` (the first ``limit`` of them, in
    file order). Unusable instances are error rows; lines whose language is unknown are
    error rows of the first configured language's cells, so each is counted once per
    setting. A duplicate id within the cell is an error row."""
    spec = spec_of(setting)
    first = opts.langs[0]
    rows, seen, taken = [], set(), 0
    for item in items_for(opts.data, lang):
        if item["error"]:
            if item["lang"] == lang or (item["lang"] is None and lang == first):
                rows.append(_row(item["id"], setting, lang, None, item["error"]))
            continue
        if item["subset"] != spec.subset:
            continue
        if opts.limit is not None and taken >= opts.limit:
            break
        taken += 1
        if item["id"] in seen:
            rows.append(_row(item["id"], setting, lang, None,
                             f"duplicate id {item['id']} in {lang}/{spec.subset}"))
            continue
        seen.add(item["id"])
        rows.append(build_prompt(item, setting, opts, translations=translations, flags=flags))
    return rows


# --- judging ------------------------------------------------------------------------------

def judge_prompt(item: dict, answer: str) -> list[dict]:
    """Chat messages asking a judge whether ``answer`` is correct: Figure 20 verbatim
    (xrag.txt L650-677), one user message.

    ``item`` is a :func:`~xling.studies.xrag.data.parse_item` item, optionally with a
    ``"setting"`` key: the question and the golden answer are those of the setting's
    question language (English for the English settings), so rule 5 ("If the generated
    answer is in a different language than the golden answer, it should be considered as
    wrong") asks for the language the answer must be in. The judges reply with JSON
    ``justification`` and ``answer`` keys (tasks/judge.py reads ``answer`` as the verdict);
    lingua still checks the language afterwards, because judges "sometimes fail to do so"
    (xrag.txt L591)."""
    spec = SETTING_SPECS.get(item.get("setting") or "mono", SETTING_SPECS["mono"])
    if spec.question == "x":
        question, gold = item.get("question"), item.get("answer")
    else:
        question = item.get("en_question") or item.get("question")
        gold = item.get("en_answer") or item.get("answer")
    return [{"role": "user", "content": render_template(
        "judge", question=str(question), answer=str(gold), pred=str(answer))}]


def judge_rows(opts: Options, generations: Iterable[dict]) -> list[dict]:
    """Judge prompt rows ``{item_id, study, setting, lang, model, prompt, error}``, one per
    generation (a generation with no parsed answer, or of an unknown item, is an error row:
    nothing to judge). Convenience over :func:`judge_prompt` for the judge stage."""
    by_lang: dict[str, dict[str, dict]] = {}
    rows = []
    for generation in generations:
        lang, item_id = generation.get("lang"), str(generation.get("item_id"))
        setting = generation.get("setting")
        row = {"item_id": item_id, "study": STUDY, "setting": setting, "lang": lang,
               "model": generation.get("model"), "prompt": None, "error": None}
        rows.append(row)
        if lang not in by_lang:
            by_lang[lang] = {it["id"]: it for it in items_for(opts.data, lang)
                             if not it["error"]}
        item = by_lang[lang].get(item_id)
        parsed = generation.get("parsed")
        answer = parsed.get("answer") if isinstance(parsed, dict) else None
        if setting not in SETTING_SPECS:
            row["error"] = f"unknown setting {setting!r}"
        elif item is None:
            row["error"] = f"no XRAG item {item_id} in {lang}"
        elif not isinstance(answer, str) or not answer.strip():
            row["error"] = "no answer to judge: " + (generation.get("error") or "nothing parsed")
        else:
            row["prompt"] = judge_prompt({**item, "setting": setting}, answer)
    return rows
