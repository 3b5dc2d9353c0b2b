"""xling/studies/xrag/ on the test-written fixture tests/data/xrag/xrag.test.jsonl."""

import csv
import io
import json
import re
from pathlib import Path

import pytest
from helpers import load_xrag_items
from pydantic import ValidationError
from sklearn.metrics import cohen_kappa_score

from xling.studies.base import Evidence, PromptSet, StudyInputs
from xling.studies.registry import get_study
from xling.studies.xrag import data, prompts
from xling.studies.xrag.settings import (LANGS, PAPER_SETTINGS, SETTING_SPECS, SETTINGS,
                                         expected_language)
from xling.tasks.languages import UnknownLanguageError
from xling.tasks.parsers import PARSERS

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_xrag_tasks")

XRAG = get_study("xrag")

DATA = Path(__file__).resolve().parents[1] / "data" / "xrag" / "xrag.test.jsonl"
# Figure 18's article block (xrag.txt L624): <text_i> text </text_i> then <date_i> date </date_i>
ARTICLE = re.compile(r"^<text_(\d+)> (.*?) </text_\1>\n<date_\1> (.*?) </date_\1>$", re.M | re.S)


def opts(**kw):
    return XRAG.validate_options({"data": str(DATA), **kw})


def build_prompts(o, setting, lang, translations=None):
    return XRAG.build_prompts(o, setting, lang, inputs=StudyInputs(translations=translations))


def score(o, gens, judgments, detected=None, labels=None):
    return XRAG.score(o, gens, Evidence(judgments=judgments, detected=detected, labels=labels))


def render(metrics, o):
    rendered = XRAG.render(o, [], metrics)
    assert rendered.plots == {}
    return rendered.markdown


def option_errors(raw) -> str:
    """The options' errors as the config shows them: `study.options.<key>: <message>`."""
    with pytest.raises(ValidationError) as info:
        XRAG.validate_options(raw)
    return "\n".join(f"study.options.{'.'.join(map(str, e['loc']))}: "
                     f"{e['msg'].removeprefix('Value error, ')}" for e in info.value.errors())


def content(row):
    assert row["error"] is None, row["error"]
    (msg,) = row["prompt"]
    assert msg["role"] == "user"
    return msg["content"]


def article_texts(text):
    """The article bodies of a prompt, in presentation order."""
    return [m.group(2) for m in ARTICLE.finditer(text)]


def article_heads(text):
    """(number, date) of each article of a prompt, in presentation order."""
    return [(m.group(1), m.group(3)) for m in ARTICLE.finditer(text)]


@pytest.fixture(scope="module")
def items():
    return {it["id"]: it for it in load_xrag_items(DATA)}


@pytest.fixture(scope="module")
def fake_translations():
    out = {}
    for lang in LANGS:
        with open(DATA, "rb") as f:
            for row in data.iter_article_documents(f, lang=lang, source="xrag-articles"):
                out[row["doc_id"]] = f"[EN translation of {row['doc_id']}] The text in English."
    return out


# --- options -----------------------------------------------------------------------------

def test_options_defaults_and_aliases():
    o = opts()
    assert o.langs == ["de", "es", "zh", "ar"]
    assert o.settings == list(PAPER_SETTINGS)  # the paper's settings only
    assert (o.article_order, o.shuffle_seed, o.max_article_words, o.limit,
            o.translations, o.expected) == ("given", 0, None, None, "xrag-articles",
                                                  "auto")
    assert opts(expected=None).expected is None
    assert opts(langs=["zh-Hans", "German"]).langs == ["zh", "de"]


@pytest.mark.parametrize("raw, match", [
    ({}, r"study\.options\.data: required"),
    ({"langs": ["fr"]}, r"study\.options\.langs: \['fr'\] not in XRAG"),
    ({"settings": ["mono", "bogus"]}, r"study\.options\.settings: unknown setting"),
    ({"article_order": "random"}, r"study\.options\.article_order: Input should be 'given'"),
    ({"limit": 0}, r"study\.options\.limit: Input should be greater than or equal to 1"),
    ({"limit": True}, r"study\.options\.limit: Input should be a valid integer"),
    ({"max_article_words": "100"}, r"study\.options\.max_article_words"),
    ({"shuffle_seed": "x"}, r"study\.options\.shuffle_seed"),
    ({"judges": 3}, r"study\.options\.judges: Extra inputs are not permitted"),
    ({"settings": ["multi_ed"]}, r"'multi_ed' it was not the paper's MonoRAG"),
    ({"expected": "/nope.yaml"}, r"study\.options\.expected: file not found"),
])
def test_options_errors(raw, match):
    raw = {"data": str(DATA), **raw} if raw else raw
    assert re.search(match, option_errors(raw))


def test_unknown_language_code_is_a_language_error():
    with pytest.raises(ValidationError) as info:
        opts(langs=["de", "dee"])
    (error,) = info.value.errors()
    assert error["loc"] == ("langs",)
    assert isinstance(error["ctx"]["error"], UnknownLanguageError)
    assert "'dee'" in error["msg"]


# --- loader ------------------------------------------------------------------------------

def test_loader_subsets_and_articles(items):
    assert len(items) == 24
    for lang in LANGS:
        for subset in ("mono", "multi"):
            assert sum(1 for it in items.values()
                       if it["lang"] == lang and it["subset"] == subset) == 3
    for it in items.values():
        assert it["error"] is None
        arts = it["articles"]
        assert [a["doc_id"] for a in arts] == [f"{it['id']}#a{k}" for k in range(8)]
        assert all(re.fullmatch(r"2024-\d\d-\d\d", a["date"]) for a in arts)
        sup = [a["lang"] for a in arts if a["supporting"]]
        dis = [a["lang"] for a in arts if not a["supporting"]]
        if it["subset"] == "mono":      # 2 supporting + 6 distracting, all English
            assert sup == ["en"] * 2 and dis == ["en"] * 6
        else:                           # 1 + 3 in X and 1 + 3 in English
            assert sorted(sup) == sorted([it["lang"], "en"])
            assert sorted(dis) == sorted([it["lang"]] * 3 + ["en"] * 3)
        assert it["en_question"] and it["en_answer"] and it["q_type"] and it["a_type"]


def test_loader_turns_bad_lines_into_error_items(tmp_path):
    path = tmp_path / "xrag.dev.jsonl"
    lines = DATA.read_text(encoding="utf-8").splitlines()
    broken = json.loads(lines[1])
    broken["is_support"] = broken["is_support"][:3]
    no_lang = json.loads(lines[2])
    no_lang["language"] = "fr"
    path.write_text("\n".join([lines[0], '{"id": "x", "question": "trunc', json.dumps(broken),
                               json.dumps(no_lang), "[1, 2]", ""] + lines[3:]) + "\n",
                    encoding="utf-8")
    loaded = load_xrag_items(path)
    assert len(loaded) == 24 + 2  # 24 lines kept (3 as errors) + 2 unreadable lines
    errors = [it for it in loaded if it["error"]]
    assert len(errors) == 4
    assert errors[0]["id"] == "xrag.dev.jsonl:line2" and "malformed JSON" in errors[0]["error"]
    assert errors[1]["id"] == broken["id"] and "is_support" in errors[1]["error"]
    assert errors[1]["lang"] == broken["language"]
    assert "'fr'" in errors[2]["error"]
    assert "expected a JSON object" in errors[3]["error"]
    # prompts: error rows, counted once per setting, the rest unaffected
    o = XRAG.validate_options({"data": str(path)})
    de = build_prompts(o, "mono", "de")
    assert [r["item_id"] for r in de if r["error"]] == [
        "xrag.dev.jsonl:line2", broken["id"], no_lang["id"], "xrag.dev.jsonl:line5"]
    assert sum(r["error"] is None for r in de) == 1
    assert all(r["error"] is None for r in build_prompts(o, "mono", "es"))


def test_article_languages_come_from_a_field_when_present(tmp_path, items):
    line = json.loads(DATA.read_text(encoding="utf-8").splitlines()[0])  # a mono de item
    line["article_langs"] = ["de", "en", "de", "en", "en", "en", "de", "de"]
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    (it,) = load_xrag_items(path)
    assert it["subset"] == "multi"
    assert [a["lang"] for a in it["articles"]] == line["article_langs"]
    assert {a["lang_source"] for a in it["articles"]} == {"field"}


def test_guess_article_language():
    assert data.guess_article_language("Der Rat hat am Montag die neue Regel für die Stadt "
                                       "beschlossen, und sie wird im Juli gelten.", "de") == "de"
    assert data.guess_article_language("The council said that the rule will apply in July.",
                                       "de") == "en"
    assert data.guess_article_language("El consejo dijo que la regla se aplicará en julio.",
                                       "es") == "es"
    assert data.guess_article_language("市议会表示，新规定将于七月生效。", "zh") == "zh"
    assert data.guess_article_language("قال المجلس إن القاعدة ستطبق في يوليو.", "ar") == "ar"
    assert data.guess_article_language("Apple said on Monday it sold 10 phones.", "zh") == "en"


def test_article_documents_for_translation(items):
    with open(DATA, "rb") as f:
        rows = list(data.iter_article_documents(f, lang="es", source="xrag-articles"))
    expected = [a for it in items.values() if it["lang"] == "es" and it["subset"] == "multi"
                for a in it["articles"] if a["lang"] == "es"]
    assert len(rows) == 12
    assert [r["doc_id"] for r in rows] == [a["doc_id"] for a in expected]
    assert [r["text"] for r in rows] == [a["text"] for a in expected]
    assert all(r["lang"] == "es" and r["source"] == "xrag-articles" and r["error"] is None
               and r["date"] for r in rows)
    assert set(rows[0]) == {"doc_id", "lang", "title", "text", "source", "date", "error"}
    # text streams and malformed lines
    bad = io.StringIO('{"broken\n' + DATA.read_text(encoding="utf-8"))
    rows = list(data.iter_article_documents(bad, lang="zh", source="s"))
    assert rows[0]["error"] and rows[0]["doc_id"] == "s:line1"
    assert len(rows) == 1 + 12


# --- prompts -----------------------------------------------------------------------------

def test_cells_inputs_parsers():
    o = opts(langs=["de", "zh"], settings=["mono", "multi"])
    assert XRAG.prompt_sets(o) == [PromptSet("mono", "de"), PromptSet("multi", "de"),
                                   PromptSet("mono", "zh"), PromptSet("multi", "zh")]
    assert XRAG.input_files(o) == [str(DATA)]
    for s in SETTINGS:
        assert XRAG.parser_for(s) == "answer_tag" and "answer_tag" in PARSERS
    assert XRAG.parsers() == {} and XRAG.judge_parser(o) == "verdict"
    assert XRAG.translation_source(o) == "xrag-articles"
    assert XRAG.score_columns == ("truncated_from", "meta")
    assert [s for s in SETTINGS if XRAG.needs_translation(s)] == [
        "multi_eq_es", "multi_en_x", "ext_multi_xq_es", "ext_multi_xq_es_ed"]
    assert expected_language("mono", "de") == "de"
    assert expected_language("mono_en", "de") == "en"
    assert expected_language("multi_eq", "zh") == "en"     # +EQ: question and answer
    assert expected_language("no_retrieval", "ar") == "en"  # Table 3 is English
    with pytest.raises(ValueError, match="unknown XRAG setting"):
        XRAG.needs_translation("bogus")


def test_study_sections_documents_and_prompt_files():
    need = XRAG.required_sections(opts(settings=["mono", "multi_en_x"]))["translate"]
    assert "multi_en_x" in need and "add translate.documents entry 'xrag-articles' " \
        "(format: xrag)" in need
    assert XRAG.required_sections(opts(settings=["mono", "multi"])) == {}
    with open(DATA, "rb") as f:   # the translate stage's `format: xrag` documents
        assert len(list(XRAG.read_documents("xrag", f, lang="es", source="s"))) == 12
    with pytest.raises(ValueError, match="no document format 'trec'"):
        XRAG.read_documents("trec", io.BytesIO(b""), lang="es", source="s")
    assert [p.name for p in XRAG.prompt_files()] == ["prompts.yaml"]
    XRAG.load_prompt_files()


N_ARTICLES = {"no_retrieval": 0, "ext_no_retrieval_xq": 0, "oracle": 2, "ext_oracle_xq": 2,
              "ext_multi_oracle_xq": 2}


@pytest.mark.parametrize("setting", SETTINGS)
def test_every_setting_builds_prompts(setting, items, fake_translations):
    o = opts()
    spec = SETTING_SPECS[setting]
    for lang in LANGS:
        rows = build_prompts(o, setting, lang, translations=fake_translations)
        assert len(rows) == 3
        for r in rows:
            assert (r["study"], r["setting"], r["lang"]) == ("xrag", setting, lang)
            it = items[r["item_id"]]
            assert it["lang"] == lang and it["subset"] == spec.subset
            text = content(r)
            heads = article_heads(text)
            n = N_ARTICLES.get(setting, 8)
            assert [int(k) for k, _ in heads] == list(range(1, n + 1))
            assert {d for _, d in heads} <= {a["date"] for a in it["articles"]}
            q = it["question"] if spec.question == "x" else it["en_question"]
            assert f"<question> {q} </question>" in text
            if n:   # Figure 18
                assert text.startswith("You are an AI assistant tasked with answering a given")
                assert text.endswith("Keep the answer as concise as possible.]</answer>")
            else:   # Figure 19
                assert text.endswith("Otherwise, output: <answer>None</answer>")
    assert len({r["item_id"] for r in rows}) == len(rows)


def test_no_retrieval_and_oracle(items):
    o = opts()
    for r in build_prompts(o, "no_retrieval", "ar"):
        text = content(r)
        assert "<text_" not in text and "<articles>" not in text
        assert f"<question> {items[r['item_id']]['en_question']} </question>" in text
        assert all(a["text"] not in text for a in items[r["item_id"]]["articles"])
    for setting in ("oracle", "ext_oracle_xq", "ext_multi_oracle_xq"):
        for r in build_prompts(o, setting, "es"):
            arts = items[r["item_id"]]["articles"]
            assert sorted(article_texts(content(r))) == sorted(a["text"] for a in arts
                                                               if a["supporting"])


def test_en_en_x_uses_the_translations(items, fake_translations):
    o = opts()
    for r in build_prompts(o, "multi_en_x", "zh", translations=fake_translations):
        text = content(r)
        it = items[r["item_id"]]
        for a in it["articles"]:
            if a["lang"] == "zh":
                assert a["text"] not in text
                assert fake_translations[a["doc_id"]] in text
            else:
                assert a["text"] in text
        assert f"<question> {it['en_question']} </question>" in text
        assert not re.search(r"[\u4e00-\u9fff]", text)  # nothing Chinese is left


def test_missing_translation_is_an_error_row_naming_the_doc(fake_translations):
    o = opts()
    missing = "ml-de-004#a0"
    assert missing in fake_translations
    partial = {k: v for k, v in fake_translations.items() if k != missing}
    for setting in ("multi_eq_es", "ext_multi_xq_es_ed"):  # ml-de-004#a0 is supporting
        rows = build_prompts(o, setting, "de", translations=partial)
        assert [r["error"] is None for r in rows] == [True, False, True]
        assert missing in rows[1]["error"] and rows[1]["prompt"] is None
        assert rows[1]["item_id"] == "ml-de-004"
    # +EQ, +ES translates only the supporting articles: a distractor's translation is unused
    distractor = "ml-de-004#a2"
    partial = {k: v for k, v in fake_translations.items() if k != distractor}
    assert all(r["error"] is None for r in build_prompts(o, "multi_eq_es", "de",
                                                                translations=partial))
    rows = build_prompts(o, "multi_en_x", "de", translations=partial)
    assert distractor in rows[1]["error"]
    none = build_prompts(o, "multi_en_x", "de")
    assert all(r["error"] and "no English translation" in r["error"] for r in none)
    # settings that do not translate ignore the dictionary
    assert all(r["error"] is None for r in build_prompts(o, "multi", "de"))


def test_article_order_options(items):
    def orders(**kw):
        return {r["item_id"]: article_texts(content(r))
                for r in build_prompts(opts(**kw), "mono", "es")}

    given, stored = orders(), orders(article_order="stored")
    for item_id, texts in given.items():
        arts = items[item_id]["articles"]
        assert texts == [a["text"] for a in sorted(arts, key=lambda a: a["order"])]
        assert stored[item_id] == [a["text"] for a in arts]
    assert given != stored
    for item_id, texts in orders(article_order="supporting_first").items():
        sup = {a["text"] for a in items[item_id]["articles"] if a["supporting"]}
        assert set(texts[:2]) == sup
    for item_id, texts in orders(article_order="supporting_last").items():
        sup = {a["text"] for a in items[item_id]["articles"] if a["supporting"]}
        assert set(texts[-2:]) == sup
    by_date = {r["item_id"]: [d for _, d in article_heads(content(r))]
               for r in build_prompts(opts(article_order="date"), "mono", "es")}
    assert all(d == sorted(d) for d in by_date.values())
    s0, s0b, s1 = (orders(article_order="shuffled", shuffle_seed=s) for s in (0, 0, 1))
    assert s0 == s0b and s0 != s1
    for item_id, texts in s1.items():
        assert sorted(texts) == sorted(given[item_id])


def test_truncation_and_limit():
    rows = build_prompts(opts(max_article_words=5), "multi", "zh")
    for r in rows:
        for body in article_texts(content(r)):
            assert body.endswith(" …")
            words = prompts.WORD_UNIT.findall(body[:-2])
            assert len(words) == 5
    assert prompts.truncate_words("这是一个测试句子", 3) == "这是一 …"
    assert prompts.truncate_words("one two three", 3) == "one two three"
    assert prompts.truncate_words("one two three four", 2) == "one two …"
    assert len(build_prompts(opts(limit=2), "mono", "de")) == 2


def test_judge_prompt_uses_the_settings_languages(items):
    it = items["ml-de-003"]
    text = prompts.judge_prompt({**it, "setting": "multi"}, "1250 Menschen")[0]["content"]
    assert f"<question> {it['question']} </question>" in text
    assert f"<golden answer> {it['answer']} </golden answer>" in text
    assert "<generated_answer> 1250 Menschen </generated_answer>" in text
    assert it["en_answer"] not in text   # no English reference: rule 5 judges the language
    assert "5. If the generated answer is in a different language than the golden answer" in text
    assert '"answer": [correct or incorrect]' in text
    for setting in ("multi_eq", "multi_en_x", "oracle"):
        text = prompts.judge_prompt({**it, "setting": setting}, "1250 people")[0]["content"]
        assert f"<question> {it['en_question']} </question>" in text
        assert f"<golden answer> {it['en_answer']} </golden answer>" in text
        assert it["question"] not in text


# --- scoring -----------------------------------------------------------------------------

def gen(item_id, lang="de", setting="mono", model="m", answer="x", error=None, output="o"):
    return {"item_id": item_id, "setting": setting, "lang": lang, "model": model,
            "parsed": None if answer is None else {"answer": answer}, "output": output,
            "error": error}


def judged(item_id, verdicts, lang="de", setting="mono", model="m"):
    return [{"item_id": item_id, "setting": setting, "lang": lang, "model": model,
             "judge": f"j{i}", "verdict": v, "error": None if v else "unparseable"}
            for i, v in enumerate(verdicts)]


@pytest.fixture
def scored():
    gens = [gen("A"), gen("B"), gen("C"), gen("D", error="engine died", output=None),
            gen("E", answer=None, error="no <answer> tag in the output", output="blah")]
    judg = (judged("A", ["correct", None, "incorrect"]) + judged("B", ["correct", None, "correct"])
            + judged("C", ["correct", "correct", "correct"]))
    detected = {("mono", "de", "m", "A"): "de", ("mono", "de", "m", "B"): "de",
                ("mono", "de", "m", "C"): "en", ("mono", "de", "m", "E"): "de"}
    # es: 2/2, zh: 0/2, ar: 1/2
    for lang, vs in (("es", ["correct", "correct"]), ("zh", ["incorrect", "incorrect"]),
                     ("ar", ["correct", "incorrect"])):
        for k, v in enumerate(vs):
            gens.append(gen(f"{lang}{k}", lang=lang))
            judg += judged(f"{lang}{k}", [v, v, v], lang=lang)
            detected[("mono", lang, "m", f"{lang}{k}")] = lang
    return score(opts(), gens, judg, detected)


def metric(metrics, name, lang="de", setting="mono", model="m"):
    (row,) = [r for r in metrics if (r["metric"], r["lang"], r["setting"], r["model"])
              == (name, lang, setting, model)]
    return row


def test_score_items(scored):
    items, _ = scored
    by = {r["item_id"]: r for r in items}
    a, b, c, d, e = (by[k] for k in "ABCDE")
    assert (a["judge_correct"], a["n_valid_judges"], a["n_judges"], a["verdict"]) == (False, 2, 3,
                                                                                      False)
    assert (b["judge_correct"], b["n_valid_judges"], b["lang_ok"], b["verdict"]) == (True, 2, True,
                                                                                     True)
    # judged correct, but answered in English for a German question
    assert (c["judge_correct"], c["lang_ok"], c["detected_lang"], c["verdict"]) == (True, False,
                                                                                    "en", False)
    assert c["expected_lang"] == "de"
    assert d["verdict"] is None and "engine died" in d["error"]
    assert e["verdict"] is False and "no answer" in e["error"] and e["lang_ok"] is None


def test_score_metrics_hand_computed(scored):
    items, m = scored
    # the paper's accuracy is over every item (xrag.txt L186): D (failed) and E (unparsed)
    # count as wrong; A, C wrong, B right -> 1/5
    acc = metric(m, "accuracy")
    assert acc["value"] == pytest.approx(100 * 1 / 5) and acc["n"] == 5
    assert acc["ci_low"] < acc["value"] < acc["ci_high"]
    assert metric(m, "judge_accuracy")["value"] == pytest.approx(100 * 2 / 5)
    # the language check covers the answers (A, B, C; E has none): C is in English
    rle = metric(m, "response_language_error_rate")
    assert rle["value"] == pytest.approx(100 * 1 / 3) and rle["n"] == 3
    assert metric(m, "wrong_language_rate")["value"] == pytest.approx(100 * 1 / 3)
    ans = metric(m, "answer_rate")
    assert ans["value"] == pytest.approx(100 * 3 / 4) and ans["n"] == 4   # D failed: not run
    assert metric(m, "n_valid_judges")["value"] == pytest.approx((2 + 2 + 3 + 0) / 4)
    counts = {k: metric(m, k) for k in ("failed", "unjudged", "unparsed")}
    assert {k: (r["value"], r["n"]) for k, r in counts.items()} == {
        "failed": (1, 5), "unjudged": (0, 5), "unparsed": (1, 5)}
    assert {r["item_id"]: r["outcome"] for r in items if r["lang"] == "de"} == {
        "A": "judged", "B": "judged", "C": "judged", "D": "failed", "E": "unparsed"}
    assert metric(m, "accuracy", "es")["value"] == 100
    assert metric(m, "accuracy", "zh")["value"] == 0
    assert metric(m, "accuracy", "ar")["value"] == 50
    # Table 4: the unweighted mean over the non-English languages
    avg = metric(m, "accuracy", "avg")
    assert avg["value"] == pytest.approx((20 + 100 + 0 + 50) / 4) and avg["n"] == 5 + 2 + 2 + 2
    assert metric(m, "response_language_error_rate", "avg")["value"] == pytest.approx(100 / 3 / 4)
    assert not [r for r in m if r["lang"] == "avg" and r["metric"] in ("failed", "unparsed")]
    assert all(r["study"] == "xrag" for r in m)


def test_failed_and_unjudged_items_stay_in_the_denominator():
    """An answer no judge could judge (F), a generation that failed (D) and one whose
    prompt was never built because its translated article was flagged by the translation
    language check (T: an error row with no output): each counts as wrong in the default
    accuracy, is counted by name, and shows in the table's n; `accuracy_over: judged` is
    the earlier accuracy over the judged items only."""
    flagged = ("no English translation of article(s) T#a1 (translations source "
               "'xrag-articles'; multi_en_x needs the X articles in English)")
    gens = [gen("A", setting="multi"), gen("B", setting="multi"), gen("F", setting="multi"),
            gen("D", setting="multi", error="HTTP 500", output=None),
            gen("T", setting="multi", error=flagged, output=None),
            gen("E", setting="multi", answer=None, error="no <answer> tag", output="blah")]
    judg = (judged("A", ["correct"] * 3, setting="multi")
            + judged("B", ["incorrect"] * 3, setting="multi")
            + judged("F", [None, None, None], setting="multi"))
    items, m = score(opts(langs=["de"]), gens, judg)
    out = {r["item_id"]: r["outcome"] for r in items}
    assert out == {"A": "judged", "B": "judged", "F": "unjudged", "D": "failed",
                   "T": "failed", "E": "unparsed"}
    acc = metric(m, "accuracy", setting="multi")
    assert (acc["value"], acc["n"]) == (pytest.approx(100 / 6), 6)
    assert [metric(m, k, setting="multi")["value"] for k in ("failed", "unjudged", "unparsed")
            ] == [2, 1, 1]
    # the earlier denominator: the items with a verdict (A, B, E)
    _, judged_only = score(opts(langs=["de"], accuracy_over="judged"), gens, judg)
    acc = metric(judged_only, "accuracy", setting="multi")
    assert (acc["value"], acc["n"]) == (pytest.approx(100 / 3), 3)
    assert metric(judged_only, "failed", setting="multi")["value"] == 2
    md = render(m, opts(langs=["de"], expected=None))
    [row] = [r for r in md.splitlines() if r.startswith("| m | multi:")
             and "failed" in r]
    assert "| 6 (2 failed, 1 unjudged, 1 unparsed) |" in row
    assert "count as wrong, as the paper's accuracy is over every item" in md


def test_score_english_baseline_and_missing_languages():
    gens = [gen("A", setting="mono_en"), gen("B", setting="mono_en")]
    judg = judged("A", ["correct"] * 3, setting="mono_en") + judged("B", ["incorrect"] * 3,
                                                                    setting="mono_en")
    detected = {("mono_en", "de", "m", "A"): "en", ("mono_en", "de", "m", "B"): "en"}
    items, m = score(opts(), gens, judg, detected)
    assert [r["verdict"] for r in items] == [True, False]  # English is expected here
    assert metric(m, "accuracy", setting="mono_en")["value"] == 50
    assert not [r for r in m if r["metric"] == "response_language_error_rate"]
    assert not [r for r in m if r["lang"] == "avg"]        # es/zh/ar missing: no average
    _, m = score(opts(langs=["de"]), gens, judg, detected)
    assert metric(m, "accuracy", "avg", "mono_en")["value"] == 50
    # without detections there is no language check
    items, m = score(opts(), gens, judg)
    assert [r["lang_ok"] for r in items] == [None, None]
    assert not [r for r in m if "language" in r["metric"]]
    # without a judge panel: no verdicts, only answer (and language) rates
    items, m = score(opts(), gens + [gen("C", setting="mono_en", answer=None)], None,
                          detected)
    assert [r["verdict"] for r in items] == [None, None, None]
    assert [r["error"] for r in items] == [None, None, None]
    assert {r["metric"] for r in m} == {"answer_rate", "wrong_language_rate"}
    assert metric(m, "answer_rate", setting="mono_en")["value"] == pytest.approx(200 / 3)


def test_kappa_against_human_labels(tmp_path):
    gens, judg, detected = _inputs_for_kappa()
    labels = {"A": "correct", "B": "correct", "C": "incorrect", "es0": "correct",
              "es1": "incorrect", "ar0": "correct", "ar1": "incorrect", "ZZ": "correct"}
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps({"item_id": k, "setting": "mono",
                                        "lang": "es" if k.startswith("es") else
                                        "ar" if k.startswith("ar") else "de",
                                        "model": "m", "label": v}) + "\n"
                            for k, v in labels.items()))
    # the panel's majorities (A is a tie over two valid votes), against the humans
    panel = [False, True, True, True, True, True, False]
    human = [labels[g["item_id"]] == "correct" for g in gens]
    items, m = score(opts(), gens, judg, detected, labels=str(path))
    assert [r["judge_correct"] for r in items] == panel
    k = metric(m, "kappa", "all", "all", "all")
    assert k["n"] == 7 and k["value"] == pytest.approx(cohen_kappa_score(panel, human))
    # the same labels as CSV, with 1/0 labels
    csv_path = tmp_path / "labels.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["item_id", "setting", "lang", "model", "label"])
        for line in path.read_text().splitlines():
            r = json.loads(line)
            w.writerow([r["item_id"], r["setting"], r["lang"], r["model"],
                        1 if r["label"] == "correct" else 0])
    _, m2 = score(opts(), gens, judg, detected, labels=str(csv_path))
    assert metric(m2, "kappa", "all", "all", "all")["value"] == pytest.approx(k["value"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"item_id": "A", "setting": "mono", "lang": "de", "model": "m", '
                   '"label": "maybe"}\n')
    with pytest.raises(ValueError, match="line 1: label must be correct/incorrect"):
        score(opts(), gens, judg, detected, labels=str(bad))


def test_judge_rows_for_generations(items):
    gens = [gen("mo-es-001", lang="es", answer="1200 personas"),
            gen("ml-zh-004", lang="zh", setting="multi_eq", answer="1337 people"),
            gen("mo-es-002", lang="es", answer=None, error="no <answer> tag in the output"),
            gen("nope", lang="es")]
    rows = XRAG.judge_rows(opts(), gens)
    assert {r["study"] for r in rows} == {"xrag"}
    assert [r["error"] is None for r in rows] == [True, True, False, False]
    assert "<generated_answer> 1200 personas </generated_answer>" in rows[0]["prompt"][0]["content"]
    zh = rows[1]["prompt"][0]["content"]
    assert f"<golden answer> {items['ml-zh-004']['en_answer']} </golden answer>" in zh  # +EQ
    assert "no <answer> tag" in rows[2]["error"] and "no XRAG item" in rows[3]["error"]


def _inputs_for_kappa():
    gens = [gen("A"), gen("B"), gen("C")]
    judg = (judged("A", ["correct", None, "incorrect"]) + judged("B", ["correct", None, "correct"])
            + judged("C", ["correct", "correct", "correct"]))
    detected = {("mono", "de", "m", k): "de" for k in "ABC"}
    for lang, vs in (("es", ["correct", "correct"]), ("ar", ["correct", "incorrect"])):
        for k, v in enumerate(vs):
            gens.append(gen(f"{lang}{k}", lang=lang))
            judg += judged(f"{lang}{k}", [v, v, v], lang=lang)
            detected[("mono", lang, "m", f"{lang}{k}")] = lang
    return gens, judg, detected


# --- tables ------------------------------------------------------------------------------

def _acc(setting, lang, model, value, metric="accuracy"):
    return {"study": "xrag", "setting": setting, "lang": lang, "model": model, "metric": metric,
            "value": value, "ci_low": None, "ci_high": None, "n": 3}


def test_tables_have_the_papers_shape(scored):
    _, m = scored
    extra = [_acc(s, lang, model, v)
             for s, v in (("mono_en", 80.0), ("multi", 40.0), ("multi_en_x", 70.0),
                          ("multi_eq", 45.0), ("multi_eq_es", 60.0), ("no_retrieval", 5.0),
                          ("ext_multi_xq_es_ed", 55.0))
             for lang in list(LANGS) + ["avg"] for model in ("m", "other")]
    extra.append({"study": "xrag", "setting": "all", "lang": "all", "model": "all",
                  "metric": "kappa", "value": 0.71, "ci_low": None, "ci_high": None, "n": 50})
    extra.append(_acc("multi", "zh", "other", 2.0, "truncated"))
    md = render(m + extra, opts(expected=None))
    t3, t4, t5 = (md.split(f"**Table {n}")[1].split("\n\n**")[0] for n in (3, 4, 5))
    assert "| Model | No Retrieval | Oracle Retrieval |" in t3
    assert "| m | 5.00 | – |" in t3
    assert "| Model | En | De | Es | Zh | Ar | Avg |" in t4
    assert "| m | 80.00 | 20.00 | 100.00 | 0.00 | 50.00 | 42.50 |" in t4
    assert "| other | 80.00 | – | – | – | – | – |" in t4
    assert ("| Model | En+En_De (En) | En+De (De) | En+En_Es (En) | En+Es (Es) | En+En_Zh (En) "
            "| En+Zh (Zh) | En+En_Ar (En) | En+Ar (Ar) | Avg (crossling.) |") in t5
    assert "| m | 70.00 | 40.00 | 70.00 | 40.00 | 70.00 | 40.00 | 70.00 | 40.00 | 40.00 |" in t5
    # a truncated cell carries a dagger, and so does the average over it
    assert ("| other | 70.00 | 40.00 | 70.00 | 40.00 | 70.00 | 40.00 † | 70.00 | 40.00 | "
            "40.00 † |") in t5 and "† some prompts of this cell were cut" in t5
    # Table 6: one table per model, the paper's four rows in its order
    t6 = md.split("**Table 6: controlled analysis of m ")[1].split("\n\n**")[0]
    assert "| Setting | En+De | En+Es | En+Zh | En+Ar | Avg |" in t6
    assert [line.split(" | ")[0] for line in t6.splitlines() if line.startswith("| ")][1:] == [
        "| XRAG-MultiR", "| +EQ", "| +EQ, +ES", "| MonoRAG (+EQ, +ES, +ED)"]
    assert "| MonoRAG (+EQ, +ES, +ED) | 70.00 | 70.00 | 70.00 | 70.00 | 70.00 |" in t6
    assert "**Table 6: controlled analysis of other " in md
    # settings the paper did not run: their own table, never in the paper's
    ext = md.split("**Not in the paper")[1].split("\n\n**")[0]
    assert "| m | ext_multi_xq_es_ed: [ext] multi, X question, all X articles in English |" in ext
    assert "ext_" not in md.split("**Not in the paper")[0]
    assert "Response-language errors" in md and "| m | mono: Monolingual retrieval | 33.33 |" in md
    assert "| other | multi: XRAG-MultiR | – | – | 2 | – | – |" in md   # truncated count
    assert "| all | 0.71 |" in md
    # every accuracy's n, with the failed and unparsed items named (D and E of `scored`)
    n = md.split("**Items behind each accuracy")[1].split("\n\n**")[0]
    assert "| m | mono: Monolingual retrieval | 5 (1 failed, 1 unparsed) | 2 | 2 | 2 | " \
           "11 (1 failed, 1 unparsed) |" in n
    assert "paper:" not in md   # expected: null
    empty = render([], opts())
    assert "Table 4" in empty and "(no results)" in empty


def test_tables_put_the_published_numbers_beside_ours(tmp_path):
    """A model the paper ran (by alias) gets the paper's row and ours - paper; a model it did
    not run shows only ours; an Avg over fewer languages than the paper's gets no difference."""
    rows = [_acc(s, lang, model, 50.0) for s in ("oracle", "mono", "mono_en", "multi",
                                                 "multi_eq", "multi_eq_es", "multi_en_x")
            for lang in list(LANGS) + ["avg"] for model in ("GPT-4o-2024-08-06", "qwen")]
    md = render(rows, opts())   # expected: auto = configs/xrag.expected.yaml
    t4 = md.split("**Table 4")[1].split("\n\n**")[0]
    assert "| ↳ paper: GPT-4o | 62.40 | 55.90 | 56.80 | 54.70 | 54.70 | 55.50 |" in t4
    assert "| ↳ Δ (ours − paper) | -12.40 | -5.90 | -6.80 | -4.70 | -4.70 | -5.50 |" in t4
    assert t4.count("paper:") == 1   # qwen: ours only
    t3 = md.split("**Table 3")[1].split("\n\n**")[0]
    assert "| ↳ paper: GPT-4o | 6.30 | 75.40 |" in t3
    assert "| ↳ Δ (ours − paper) | – | -25.40 |" in t3
    t6 = md.split("**Table 6: controlled analysis of GPT-4o-2024-08-06")[1].split("\n\n**")[0]
    assert "(paper: Table 6, GPT-4o)" in t6
    assert "| ↳ paper: GPT-4o | 65.00 | 57.33 | 62.00 | 60.33 | 61.16 |" in t6   # +EQ, +ES
    assert "paper:" not in md.split("**Table 6: controlled analysis of qwen")[1]
    # a run over two languages: its Avg is not the paper's Avg
    md = render(rows, opts(langs=["de", "zh"]))
    t4 = md.split("**Table 4")[1].split("\n\n**")[0]
    assert "| ↳ Δ (ours − paper) | -12.40 | -5.90 | -6.80 | -4.70 | -4.70 | – |" in t4
    # an expected file of one's own, by path
    own = tmp_path / "mine.expected.yaml"
    own.write_text("models: {Mine: {aliases: [qwen]}}\ntable4: {Mine: {en: 40.0}}\n")
    md = render(rows, opts(expected=str(own)))
    assert "| ↳ paper: Mine | 40.00 | – |" in md and "GPT-4o |" not in md


def test_score_counts_truncated_prompts_and_abstentions():
    gens = [dict(gen("A", setting="no_retrieval", answer="None"), truncated_from=9000),
            gen("B", setting="no_retrieval", answer="800 people")]
    items, m = score(opts(), gens, judged("A", ["incorrect"] * 3, setting="no_retrieval")
                          + judged("B", ["correct"] * 3, setting="no_retrieval"))
    assert [(i["truncated"], i["abstained"]) for i in items] == [(True, True), (False, False)]
    assert metric(m, "truncated", setting="no_retrieval")["value"] == 1
    assert metric(m, "abstain_rate", setting="no_retrieval")["value"] == 50
