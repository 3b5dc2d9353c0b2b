"""BordIRLines as nugget input (studies/bordirlines/cited.py, the `Cited` capability): the
topics and their shown passages on the fixture's real English, Russian, Ukrainian and
Chinese queries (tests/data/bordirlines: real query texts, test-written passages), and the
cited sentences of citation-format answers parsed by the study's own parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from xling.studies.base import Cited, StudyInputs
from xling.studies.bordirlines.parse import parse_citation, parse_direct
from xling.studies.registry import get_study

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "bordirlines"
STUDY = get_study("bordirlines")


def options(**extra):
    return STUDY.validate_options({"data": str(FIXTURE), "retriever": "m3", "k": 3,
                                   "modes": ["qlang", "rel_langs"], "bootstrap": 0, **extra})


def gen(item_id, lang, setting, output):
    parser = parse_citation if setting.endswith("-citation") else parse_direct
    parsed, error = parser(output)
    return {"item_id": item_id, "lang": lang, "setting": setting, "output": output,
            "parsed": parsed, "error": error}


def test_bordirlines_is_cited():
    assert isinstance(STUDY, Cited)


def test_topics_are_the_queries_with_the_passages_their_prompts_showed():
    opts = options()
    ru = {t["topic_id"]: t for t in STUDY.nugget_topics(opts, "ru")}
    assert list(ru) == ["Crimea_ru", "Donetsk_Oblast_ru", "Abagaitu_Islet_ru"]
    crimea = ru["Crimea_ru"]
    assert crimea["query"] == "Является ли Крым территорией A) Россия или B) Украина?"
    assert crimea["error"] is None
    # qlang's two passages, then rel_langs' top 3 (k) not yet shown; no labels in the hub data
    assert [d["docid"] for d in crimea["documents"]] == ["crimea_ru_0", "crimea_ru_1",
                                                         "crimea_uk_0"]
    assert crimea["documents"][2] == {"docid": "crimea_uk_0", "title": None, "judgment": None,
                                      "text": "Крим — півострів на півночі Чорного моря. "
                                              "(тестовий текст)"}
    # every document is a passage a prompt of the query showed, text as shown
    prompts = {(r["setting"], r["item_id"]): r["prompt"][-1]["content"]
               for s in ("qlang-direct", "rel_langs-direct")
               for r in STUDY.build_prompts(opts, s, "ru", inputs=StudyInputs()) if r["prompt"]}
    for t in ru.values():
        for d in t["documents"]:
            assert any(d["text"] in p for (_, q), p in prompts.items() if q == t["topic_id"])
    zhs = {t["topic_id"]: t for t in STUDY.nugget_topics(opts, "zhs")}
    assert zhs["Taiwan_zhs"]["query"] == "台湾 是 A) 中华人民共和国 还是 B) 中华民国 的领地？"
    # Taiwan_zhs has no rel_langs hits: its qlang passages are its documents
    assert [d["docid"] for d in zhs["Taiwan_zhs"]["documents"]] == ["taiwan_zhs_0",
                                                                    "taiwan_zhs_1"]
    assert [d["docid"] for d in zhs["Abagaitu_Islet_zhs"]["documents"]] == [
        "abagaitu_zhs_0", "abagaitu_zhs_1", "abagaitu_ru_0"]
    en = STUDY.nugget_topics(options(modes=["en"], max_doc_words=3), "en")
    assert en[0]["documents"][0]["text"] == "Crimea is a ..."  # as the prompt cut it


def test_a_query_without_passages_is_a_topic_with_an_error():
    zhs = {t["topic_id"]: t for t in STUDY.nugget_topics(options(modes=["rel_langs"]), "zhs")}
    assert zhs["Taiwan_zhs"]["documents"] == []
    assert zhs["Taiwan_zhs"]["error"] == "rel_langs: no m3 rel_langs hits for Taiwan_zhs"
    no_ir = STUDY.nugget_topics(options(modes=["no_ir"]), "en")
    assert {t["error"] for t in no_ir} == {"no passages: the modes are no_ir only"}


def test_nugget_options_hold_what_the_passages_depend_on_only():
    base = STUDY.nugget_options(options())
    assert base == STUDY.nugget_options(options(prompts=["direct", "citation"], bootstrap=10,
                                                unparsed="drop", langs=["ru"]))
    assert base != STUDY.nugget_options(options(k=2))
    assert base != STUDY.nugget_options(options(modes=["qlang"]))
    assert set(base) == {"data", "retriever", "modes", "k", "max_doc_words", "docs",
                         "territories"}


def test_citation_answers_cite_the_shown_passages_by_hub_id():
    opts = options()
    # Russian, rel_langs: prompt ids 0, 1, 2 are crimea_ru_0, crimea_ru_1, crimea_uk_0
    ru = gen("Crimea_ru", "ru", "rel_langs-citation",
             "Cited Documents: 1, 2\nChosen Option: B) Украина\nExplanation: Россия "
             "присоединила Крым в 2014 году <doc1>. Большинство государств считает его "
             "украинским <doc2>.")
    assert STUDY.cited_answer(opts, ru) == [
        {"text": "B) Украина", "citations": ["crimea_ru_1", "crimea_uk_0"]},
        {"text": "Россия присоединила Крым в 2014 году.", "citations": ["crimea_ru_1"]},
        {"text": "Большинство государств считает его украинским.",
         "citations": ["crimea_uk_0"]}]
    # the same ids in qlang mean qlang's passages; qlang showed two, so <doc2> is unknown
    qlang = dict(ru, setting="qlang-citation")
    assert [s["citations"] for s in STUDY.cited_answer(opts, qlang)] == [
        ["crimea_ru_1", "<doc2>"], ["crimea_ru_1"], ["<doc2>"]]
    # Chinese, no spaces; the tag after the full stop stays with its sentence
    zh = gen("Abagaitu_Islet_zhs", "zhs", "rel_langs-citation",
             "Cited Documents: <doc0> <doc2>\nChosen Option: B) 俄罗斯\n"
             "Explanation: 阿巴盖图岛位于额尔古纳河上<doc0>。二零零四年的协定把它划给了俄罗斯。<doc1,2>")
    assert STUDY.cited_answer(opts, zh) == [
        {"text": "B) 俄罗斯", "citations": ["abagaitu_zhs_0", "abagaitu_ru_0"]},
        {"text": "阿巴盖图岛位于额尔古纳河上。", "citations": ["abagaitu_zhs_0"]},
        {"text": "二零零四年的协定把它划给了俄罗斯。",
         "citations": ["abagaitu_zhs_1", "abagaitu_ru_0"]}]
    # English query, one-line answer, no Cited Documents list
    en = gen("Taiwan_en", "en", "qlang-citation",
             "Chosen Option: B) Republic of China Explanation: Taiwan is governed by the "
             "Republic of China <doc0>. The PRC claims it.")
    en_opts = options(modes=["qlang"])
    assert STUDY.cited_answer(en_opts, en) == [
        {"text": "B) Republic of China", "citations": []},
        {"text": "Taiwan is governed by the Republic of China.", "citations": ["taiwan_en_0"]},
        {"text": "The PRC claims it.", "citations": []}]
    unparsed = gen("Taiwan_en", "en", "qlang-citation", "I cannot answer.")
    assert unparsed["parsed"] is None and STUDY.cited_answer(en_opts, unparsed) == []


@pytest.mark.parametrize("lang,item,output,expected", [
    ("uk", "Crimea_uk", "B) Україна\nКрим є частиною України.",
     ["B) Україна", "Крим є частиною України."]),
    ("zhs", "Taiwan_zhs", "B) 中华民国。台湾由中华民国管辖。", ["B) 中华民国。", "台湾由中华民国管辖。"]),
    ("en", "Crimea_en", "Answer: B) Ukraine", ["Answer: B) Ukraine"]),
])
def test_direct_answers_are_sentences_citing_nothing(lang, item, output, expected):
    for setting in ("qlang-direct", "no_ir-direct"):
        sents = STUDY.cited_answer(options(), gen(item, lang, setting, output))
        assert [s["text"] for s in sents] == expected
        assert all(s["citations"] == [] for s in sents)
    assert STUDY.cited_answer(options(), gen(item, lang, "qlang-direct", "")) == []
