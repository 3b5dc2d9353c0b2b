"""xling/studies/bordirlines/: loaders (real BorderLines files, the hub layout fixture),
prompts, parsers, option mapping, the BorderLines concurrence scores computed by hand from
their definitions on real territories, citation/inclusion rates averaged per query, and the
report table (the paper's Table 4, with the published numbers beside xling's). The prompts'
wording is checked against the paper in test_bordirlines_prompts.py, the published numbers in
test_bordirlines_published.py."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from xling.studies.base import Evidence, PromptSet, Rendered, StudyInputs
from xling.studies.bordirlines.data import (
    LETTERS,
    PACKAGED,
    UNKNOWN,
    input_files,
    load_borderlines,
    load_docs,
    load_hits,
    load_queries,
)
from xling.studies.bordirlines.metrics import score
from xling.studies.bordirlines.options import MODES, Options
from xling.studies.bordirlines.parse import map_option, parse_citation, parse_direct, parser_for
from xling.studies.bordirlines.prompts import (
    PROMPT_TEMPLATES,
    SYSTEM_PROMPT,
    build_prompts,
    truncate_words,
)
from xling.studies.bordirlines.tables import render_tables
from xling.studies.registry import get_study

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_bordirlines_tasks")

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "bordirlines"
STUDY = get_study("bordirlines")
validate = STUDY.validate_options  # study.options -> the Options object


@pytest.fixture(scope="module")
def bl():
    return load_borderlines()


@pytest.fixture(scope="module")
def opts():
    # the fixture's hits are BGE-M3's (one openai file tells the retrievers apart)
    return validate({"data": str(FIXTURE), "modes": list(MODES), "retriever": "m3",
                     "prompts": ["direct", "citation"], "k": 3, "bootstrap": 0})


def make_data(tmp_path: Path, bl, pairs) -> Options:
    """A hub-layout dir whose queries.tsv holds the real BorderLines query of each
    (territory, lang); options for the no_ir mode (no passages needed)."""
    lines = ["query_id\tquery_text\tterritory\tlanguage"]
    for terr, lang in pairs:
        qid = f"{terr.replace(' ', '_')}_{lang}"
        lines.append(f"{qid}\t{bl.queries[lang][terr][0]}\t{terr}\t{lang}")
    (tmp_path / "queries.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return validate({"data": str(tmp_path), "modes": ["no_ir"], "bootstrap": 0})


def gen(terr, lang, output, *, setting="no_ir-direct", model="m", error=None, parser=None):
    parse = parser or parse_direct
    parsed, perr = (None, None) if error else parse(output)
    # a failed call has no output (core/llm.py); a parser's failure keeps the output
    return {"item_id": f"{terr.replace(' ', '_')}_{lang}", "setting": setting, "lang": lang,
            "model": model, "parsed": parsed, "output": None if error else output,
            "error": error or perr}


def metric_map(metrics, setting="no_ir-direct", lang="all", model="m"):
    return {m["metric"]: m for m in metrics
            if m["setting"] == setting and m["lang"] == lang and m["model"] == model}


# --------------------------------------------------------------------------------------
# BorderLines data: the real 49-language query files
# --------------------------------------------------------------------------------------


def test_packaged_table_and_query_files(bl):
    assert len(bl.territories) == 251
    assert sum(not t.known for t in bl.territories.values()) == 90
    langs = sorted(p.suffix[1:] for p in (PACKAGED / "queries").glob("prompts.*")
                   if p.suffix != ".txt")
    assert len(langs) == 49 and sorted(k for k in bl.queries) == langs
    order = list(bl.territories)
    for lang in langs:
        prompts = (PACKAGED / "queries" / f"prompts.{lang}").read_text("utf-8").splitlines()
        choices = (PACKAGED / "queries" / f"choices.{lang}").read_text("utf-8").splitlines()
        # line i <-> the i-th territory (CSV order) with a claimant whose Lang_Code is lang
        owners = [t for t in order if lang in bl.territories[t].claimant_langs]
        assert len(prompts) == len(choices) == len(owners), lang
        for name, p, c in zip(owners, prompts, choices):
            opts_ = json.loads(c)
            terr = bl.territories[name]
            assert len(opts_) == len(terr.claimants), (lang, name)
            # each option appears lettered in its own query line
            for i, o in enumerate(opts_):
                assert f"{LETTERS[i]}) {o}" in p, (lang, name, o)
    # the alignment is also consistent across lines: within a language, one claimant always
    # has one translated name (a shifted line would break this)
    for lang, qs in bl.queries.items():
        names: dict[str, set] = {}
        for name, (_, opts_) in qs.items():
            for claimant, native in zip(bl.territories[name].claimants, opts_):
                names.setdefault(claimant, set()).add(native)
        assert all(len(v) == 1 for v in names.values()), lang
    # English is the control language: prompts_q_mc.txt/choices.txt hold all 251 territories,
    # in CSV order, equal to the table's Query and Claimants
    q_mc = (PACKAGED / "queries" / "prompts_q_mc.txt").read_text("utf-8").splitlines()
    c_mc = (PACKAGED / "queries" / "choices.txt").read_text("utf-8").splitlines()
    assert len(q_mc) == len(c_mc) == 251
    for name, q, c in zip(order, q_mc, c_mc):
        assert q == bl.territories[name].query_en
        assert tuple(json.loads(c)) == bl.territories[name].claimants
    # prompts.en (the territories with an English-speaking claimant) repeats those lines
    en_lines = (PACKAGED / "queries" / "prompts.en").read_text("utf-8").splitlines()
    en_owners = [t for t in order if "en" in bl.territories[t].claimant_langs]
    assert len(en_lines) == 38 == len(en_owners)
    assert en_lines == [bl.territories[t].query_en for t in en_owners]
    # Suriname is missing from countries_info.json; prompts.nl is its 4 territories (Dutch)
    assert list(bl.queries["nl"]) == ["French Guiana", "Marouini River", "Tigri Area",
                                      "Courantyne River"]


def test_specific_territories(bl):
    crimea = bl.territories["Crimea"]
    assert crimea.claimants == ("Russia", "Ukraine") and crimea.claimant_langs == ("ru", "uk")
    assert crimea.controller == "Russia" and crimea.controller_lang == "ru"
    assert bl.queries["ru"]["Crimea"][1] == ("Россия", "Украина")
    assert bl.queries["zhs"]["Aksai Chin"][1] == ("印度", "中华民国", "中华人民共和国")
    assert bl.territories["Donetsk Oblast"].controller == UNKNOWN
    assert not bl.territories["Donetsk Oblast"].known


def test_bordirlines_language_codes_resolve():
    from xling.tasks.languages import validate_languages

    codes = [lang.code for lang in validate_languages(["zhs", "zht", "iw", "he"])]
    assert codes == ["zhs", "zht", "iw", "iw"]


# --------------------------------------------------------------------------------------
# Hub layout loaders and options
# --------------------------------------------------------------------------------------


def test_loaders_read_the_hub_layout(opts):
    queries = load_queries(FIXTURE)
    assert len(queries) == 11
    assert queries["Crimea_uk"] == {"query_id": "Crimea_uk", "territory": "Crimea", "lang": "uk",
                                    "text": "Крим є територією A) Росія чи B) Україна?"}
    hits = load_hits(FIXTURE, "zhs", "m3", "rel_langs")
    assert [h["doc_id"] for h in hits["Abagaitu_Islet_zhs"]] == [
        "abagaitu_zhs_0", "abagaitu_zhs_1", "abagaitu_ru_0"]
    assert [h["rank"] for h in hits["Abagaitu_Islet_zhs"]] == [1, 2, 3]
    assert "Taiwan_zhs" not in hits
    # English control hits under data/control/ are read for lang en
    en = load_hits(FIXTURE, "en", "m3", "qlang")
    assert set(en) == {"Crimea_en", "Donetsk_Oblast_en", "Abagaitu_Islet_en", "Taiwan_en"}
    assert [h["doc_id"] for h in load_hits(FIXTURE, "ru", "openai", "qlang")["Crimea_ru"]] \
        == ["crimea_ru_1"]
    docs = load_docs(FIXTURE / "docs.json")
    assert docs["crimea_uk_0"][0] == "uk" and "Крим" in docs["crimea_uk_0"][1]
    assert opts.langs == ["en", "ru", "uk", "zhs"]
    assert opts.docs == str((FIXTURE / "docs.json").resolve())
    files = input_files(opts)
    assert str((FIXTURE / "queries.tsv").resolve()) in files
    assert any(f.endswith("control_query_hits.tsv") for f in files)
    assert all(Path(f).is_file() for f in files)


def test_check_options_defaults():
    o = validate({"data": str(FIXTURE)})
    # the paper's main results: OpenAI-embedding hits (L123), direct answers (Table 4, L477)
    assert o.retriever == "openai" and o.modes == ["no_ir", "qlang", "rel_langs"]
    # whole passages, as the paper (L101); unparsed answers counted as the authors' code does
    assert o.prompts == ["direct"] and o.k == 10 and o.max_doc_words is None
    assert o.unparsed == "authors"
    assert o.expected is None
    assert o.territories is None  # the packaged copy: no checkout path in the cell hash
    assert validate(o.as_options()) == o  # idempotent
    assert validate({"data": str(FIXTURE), "langs": ["zhs", "ru"]}).langs == ["zhs", "ru"]


@pytest.mark.parametrize("raw, key", [
    ({}, "data"),
    ({"data": "/nonexistent/bordirlines"}, "data"),
    ({"data": str(FIXTURE), "retriever": "bm25"}, "retriever"),
    ({"data": str(FIXTURE), "modes": ["qlang", "both"]}, "modes"),
    ({"data": str(FIXTURE), "prompts": []}, "prompts"),
    ({"data": str(FIXTURE), "langs": ["xx"]}, "langs"),
    ({"data": str(FIXTURE), "langs": ["zht"]}, "langs"),  # known code, no queries
    ({"data": str(FIXTURE), "k": 0}, "k"),
    ({"data": str(FIXTURE), "k": True}, "k"),  # not a number of passages
    ({"data": str(FIXTURE), "bootstrap": None}, "bootstrap"),
    ({"data": str(FIXTURE), "max_doc_words": "long"}, "max_doc_words"),
    ({"data": str(FIXTURE), "unparsed": "wrong"}, "unparsed"),
    ({"data": str(FIXTURE), "docs": "/nonexistent/docs.json"}, "docs"),
    ({"data": str(FIXTURE), "territories": "/nonexistent"}, "territories"),
    ({"data": str(FIXTURE), "n_hits": 10}, "n_hits"),
    ({"data": str(FIXTURE), "expected": "/nonexistent/expected.yaml"}, "expected"),
])
def test_check_options_errors(raw, key):
    with pytest.raises(ValidationError) as raised:
        validate(raw)
    (error,) = raised.value.errors()
    assert error["loc"][0] == key  # shown as study.options.<key> in the config's errors
    if error["type"] == "value_error":  # our own validators: what is wrong; the fix
        assert re.fullmatch(r"Value error, .+; .+", error["msg"], re.DOTALL), error["msg"]


def test_queries_tsv_under_data_as_the_hub_writes_it(tmp_path):
    # the hub's writer (parse_search_results.py) puts queries.tsv in data/, beside the hits
    shutil.copytree(FIXTURE / "data", tmp_path / "data")
    shutil.copy(FIXTURE / "queries.tsv", tmp_path / "data" / "queries.tsv")
    shutil.copy(FIXTURE / "docs.json", tmp_path / "data" / "all_docs.json")
    o = validate({"data": str(tmp_path), "retriever": "m3", "k": 3, "bootstrap": 0})
    assert len(load_queries(tmp_path)) == 11
    assert o.docs == str((tmp_path / "data" / "all_docs.json").resolve())
    rows = build_prompts(o, "qlang-direct", "ru")
    assert rows[0]["error"] is None and "Document: 0\nText: " in rows[0]["prompt"][1]["content"]
    assert str((tmp_path / "data" / "queries.tsv").resolve()) in input_files(o)


def test_openai_hits_are_read_from_the_hub_layout(tmp_path):
    # the default retriever reads data/<lang>/openai/<mode>/<lang>_query_hits.tsv
    o = validate({"data": str(FIXTURE), "modes": ["qlang"], "k": 3, "bootstrap": 0,
                  "langs": ["ru"]})
    assert o.retriever == "openai"
    rows = {r["item_id"]: r for r in build_prompts(o, "qlang-direct", "ru")}
    assert rows["Crimea_ru"]["prompt"][1]["content"].startswith(
        "Document: 0\nText: В 2014 году")
    assert rows["Donetsk_Oblast_ru"]["error"] == "no openai qlang hits for Donetsk_Oblast_ru"
    assert any("/ru/openai/qlang/" in f for f in input_files(o))


def test_docs_required_only_for_retrieval_modes(tmp_path):
    shutil.copy(FIXTURE / "queries.tsv", tmp_path / "queries.tsv")
    with pytest.raises(ValidationError, match=r"docs\n\s+Value error, no passages file"):
        validate({"data": str(tmp_path)})
    assert validate({"data": str(tmp_path), "modes": ["no_ir"]}).docs is None


# --------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------


def test_prompt_cells(opts):
    cells = STUDY.prompt_sets(opts)
    settings = list(dict.fromkeys(c.setting for c in cells))
    # no_ir has nothing to cite: it runs with the direct prompt only
    assert settings == ["no_ir-direct", "qlang-direct", "qlang-citation", "rel_langs-direct",
                        "rel_langs-citation", "qlang_en-direct", "qlang_en-citation",
                        "en-direct", "en-citation", "swap-direct", "swap-citation"]
    assert len(cells) == len(settings) * 4
    assert STUDY.prompt_sets(validate({"data": str(FIXTURE)}))[:2] == [
        PromptSet("no_ir-direct", "en"), PromptSet("no_ir-direct", "ru")]
    assert parser_for("qlang-citation") == "bordirlines_citation"
    assert parser_for("no_ir-direct") == "bordirlines_direct"
    for name in ("bordirlines_direct", "bordirlines_citation"):
        assert callable(STUDY.parsers()[name])


def test_every_mode_builds_prompts(opts):
    n_queries = {"en": 4, "ru": 3, "uk": 2, "zhs": 2}
    for cell in STUDY.prompt_sets(opts):
        rows = build_prompts(opts, cell.setting, cell.lang)
        assert len(rows) == n_queries[cell.lang], cell
        ok = [r for r in rows if r["error"] is None]
        # every (setting, lang) has prompts, except swap for English: no fixture territory
        # has an English-speaking claimant, so no English query has a swap partner
        assert ok or cell in (PromptSet("swap-direct", "en"), PromptSet("swap-citation", "en")), \
            cell
        for r in rows:
            assert r["study"] == "bordirlines" and r["setting"] == cell.setting
            assert r["lang"] == cell.lang
            assert (r["prompt"] is None) == (r["error"] is not None)
        assert len({r["item_id"] for r in rows}) == len(rows)


def test_prompt_contents(opts):
    rows = {r["item_id"]: r for r in build_prompts(opts, "rel_langs-citation", "zhs")}
    system, user = rows["Abagaitu_Islet_zhs"]["prompt"]
    assert system["role"] == "system" and user["role"] == "user"
    assert system["content"] == PROMPT_TEMPLATES["citation_system"]
    # documents numbered from 0, as in the paper (Table 5: "Document: 0 Text: ...")
    assert "Document: 0\nText: 阿巴盖图岛是额尔古纳河上的一个小岛。" in user["content"]
    assert "Document: 2\nText: Остров Абагайту" in user["content"]
    assert "Document: 3" not in user["content"]
    for label in ("Cited Documents:", "Chosen Option:", "Explanation:"):
        assert label in user["content"]
    assert "Options:\nA) 中华人民共和国\nB) 俄罗斯\nC) 中华民国" in user["content"]
    assert user["content"].startswith("Query: 阿巴盖图岛 是")
    # a query without hits in the mode is an error row, not dropped
    assert rows["Taiwan_zhs"]["prompt"] is None
    assert rows["Taiwan_zhs"]["error"] == "no m3 rel_langs hits for Taiwan_zhs"

    no_ir = build_prompts(opts, "no_ir-direct", "ru")[0]["prompt"]
    assert no_ir[0] == {"role": "system", "content": SYSTEM_PROMPT}
    no_ir = no_ir[1]["content"]
    assert "Document:" not in no_ir and "Considering your prior knowledge," in no_ir
    assert no_ir.rstrip().endswith("Answer:") and "A) Россия\nB) Украина" in no_ir
    # k caps the passages; qlang_en adds the English ones after the query language's
    qe = build_prompts(opts, "qlang_en-direct", "ru")[0]["prompt"][1]["content"]
    assert "Document: 2\nText: Crimea is a peninsula" in qe and "Document: 3" not in qe
    # the retriever option picks the hits folder
    o = opts.model_copy(update={"retriever": "openai"})
    rows = build_prompts(o, "qlang-direct", "ru")
    assert "Document: 0\nText: В 2014 году" in rows[0]["prompt"][1]["content"]
    assert rows[1]["error"] == "no openai qlang hits for Donetsk_Oblast_ru"
    with pytest.raises(ValueError):
        build_prompts(opts, "no_ir-citation", "ru")
    with pytest.raises(ValueError):
        build_prompts(opts, "bm25-direct", "ru")


def test_swap_mode(opts):
    # swap: the qlang passages of the next claimant language's query of the territory
    ru = {r["item_id"]: r for r in build_prompts(opts, "swap-direct", "ru")}
    assert "Document: 0\nText: Крим — півострів" in ru["Crimea_ru"]["prompt"][1]["content"]
    assert "Является ли Крым" in ru["Crimea_ru"]["prompt"][1]["content"]  # own query
    uk = {r["item_id"]: r for r in build_prompts(opts, "swap-direct", "uk")}
    assert "Document: 0\nText: Крым — полуостров" in uk["Crimea_uk"]["prompt"][1]["content"]
    zhs = {r["item_id"]: r for r in build_prompts(opts, "swap-direct", "zhs")}
    # Abagaitu Islet: claimant languages zhs, ru, zht; the fixture has zhs and ru queries
    assert "Document: 0\nText: Остров Абагайту" in zhs["Abagaitu_Islet_zhs"]["prompt"][1][
        "content"]
    assert "only one claimant language" in zhs["Taiwan_zhs"]["error"]
    en = build_prompts(opts, "swap-direct", "en")
    assert all("not a claimant language" in r["error"] for r in en)


def test_truncation_and_translations(opts):
    assert truncate_words("one two three four", 2) == "one two ..."
    assert truncate_words("one two", 2) == "one two"
    assert truncate_words("阿巴盖图岛是小岛", 3) == "阿巴盖 ..."
    assert truncate_words("x " * 5, None) == "x " * 5
    o = opts.model_copy(update={"max_doc_words": 3})
    user = build_prompts(o, "en-direct", "uk")[0]["prompt"][1]["content"]
    assert "Document: 0\nText: Crimea is a ...\n\nDocument: 1" in user
    tr = {"crimea_uk_0": "Crimea is a peninsula (translated)"}
    user = build_prompts(opts, "qlang-direct", "uk", translations=tr)[0]["prompt"][1]["content"]
    assert "Document: 0\nText: Crimea is a peninsula (translated)" in user
    rows = [{"id": "Crimea_uk", "kind": "query", "text": "Is Crimea Ukrainian?"}]
    user = build_prompts(opts, "no_ir-direct", "uk", translations=rows)[0]["prompt"][1]["content"]
    assert "Query: Is Crimea Ukrainian?" in user


def test_missing_passage_is_an_error_row(opts, tmp_path):
    docs = json.loads((FIXTURE / "docs.json").read_text("utf-8"))
    del docs["uk"]["crimea_uk_1"]
    (tmp_path / "docs.json").write_text(json.dumps(docs), "utf-8")
    rows = build_prompts(opts.model_copy(update={"docs": str(tmp_path / "docs.json")}),
                         "qlang-direct", "uk")
    assert "crimea_uk_1" in rows[0]["error"] and rows[1]["error"] is None


def test_passages_are_whole_by_default_and_cut_only_on_request(opts, tmp_path):
    """The paper passes each retrieved paragraph whole (bordirlines.txt L101);
    max_doc_words cuts them only when set. A 400-word Ukrainian passage in the prompt."""
    docs = json.loads((FIXTURE / "docs.json").read_text("utf-8"))
    long = " ".join(["Кримський півострів"] * 200)  # 400 words
    docs["uk"]["crimea_uk_1"] = long
    (tmp_path / "docs.json").write_text(json.dumps(docs, ensure_ascii=False), "utf-8")
    o = opts.model_copy(update={"docs": str(tmp_path / "docs.json")})
    assert o.max_doc_words is None
    user = build_prompts(o, "qlang-direct", "uk")[0]["prompt"][1]["content"]
    assert f"Text: {long}\n\n" in user and " ..." not in user
    cut = o.model_copy(update={"max_doc_words": 300})
    user = build_prompts(cut, "qlang-direct", "uk")[0]["prompt"][1]["content"]
    assert long not in user and "Text: " + " ".join(long.split()[:300]) + " ...\n" in user


# --------------------------------------------------------------------------------------
# Parsers
# --------------------------------------------------------------------------------------


def test_parse_citation():
    ok = ("Cited Documents: <doc1> <doc3>\nChosen Option: B) Sudan\n"
          "Explanation: because <doc1> says so.")
    parsed, err = parse_citation(ok)
    assert err is None
    assert parsed == {"cited": "1,3", "option": "B) Sudan",
                      "explanation": "because <doc1> says so.", "cited_text": "1"}
    # sloppy: case, spaces, markdown bold, bare numbers, label and option on separate lines
    sloppy = ("**cited documents :**  3, 5,3\n\n**CHOSEN OPTION:**\n  A)  Russia \n"
              "explanation: because <doc5> and <doc3, 5>.")
    parsed, err = parse_citation(sloppy)
    assert err is None
    assert parsed["cited"] == "3,5" and parsed["option"] == "A) Russia"
    assert parsed["cited_text"] == "5,3"
    one_line = "Cited Documents: <doc2> Chosen Option: C) 中华民国 Explanation: because <doc2>."
    parsed, _ = parse_citation(one_line)
    assert parsed["cited"] == "2" and parsed["option"] == "C) 中华民国"
    parsed, _ = parse_citation("Chosen Option: A) India")  # no citations, no explanation
    assert parsed == {"cited": "", "option": "A) India", "explanation": "", "cited_text": ""}
    # broken
    assert parse_citation("Cited Documents: 1\nExplanation: because.") == (
        None, "no 'Chosen Option:' in the output")
    assert parse_citation("Chosen Option:\nExplanation: because")[0] is None
    assert parse_citation("")[0] is None and parse_citation(None)[0] is None
    assert STUDY.parsers()["bordirlines_citation"](ok) == parse_citation(ok)


def test_parse_direct():
    assert parse_direct("B) Sudan") == ({"option": "B) Sudan"}, None)
    assert parse_direct("  **Answer:**  B)   Sudan\n\nBecause ...") == (
        {"option": "B) Sudan"}, None)
    assert parse_direct("\n\nfinal answer: (b)")[0] == {"option": "(b)"}
    assert parse_direct("Chosen Option: A) Россия\nExplanation: ...")[0] == {
        "option": "A) Россия"}
    assert parse_direct("   \n ")[0] is None and parse_direct(None)[0] is None
    assert parse_direct("Answer:")[1] == "no option in the output"
    assert STUDY.parsers()["bordirlines_direct"]("A) India") == ({"option": "A) India"}, None)


# --------------------------------------------------------------------------------------
# map_option
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, lang, terr, expected", [
    # letters
    ("B", "en", "Abyei", "Sudan"),
    ("B)", "en", "Abyei", "Sudan"),
    ("(b)", "en", "Abyei", "Sudan"),
    ("Option B", "en", "Abyei", "Sudan"),
    ("**B) Sudan**", "en", "Abyei", "Sudan"),
    ("a.", "en", "Abyei", "South Sudan"),
    ("C）中华人民共和国", "zhs", "Aksai Chin", "People's Republic of China"),
    ("I pick option C.", "en", "Aksai Chin", "People's Republic of China"),
    # names in the query language (the real choices files) or in English
    ("中华人民共和国", "zhs", "Aksai Chin", "People's Republic of China"),
    ("中华民国", "zhs", "Aksai Chin", "Republic of China"),
    ("中華民國", "zht", "Taiwan", "Republic of China"),
    ("Украина", "ru", "Crimea", "Ukraine"),
    ("Росія", "uk", "Crimea", "Russia"),
    ("السودان", "ar", "Abyei", "Sudan"),
    ("جنوب السودان", "ar", "Abyei", "South Sudan"),  # longest name first
    ("भारत", "hi", "Aksai Chin", "India"),
    ("South Sudan", "en", "Abyei", "South Sudan"),
    ("sudan", "en", "Abyei", "Sudan"),
    ("Republic of China", "zhs", "Taiwan", "Republic of China"),
    ("People's Republic of China", "zhs", "Taiwan", "People's Republic of China"),
    ("People’s Republic of China", "en", "Taiwan", "People's Republic of China"),
    ("Ukraine", "ru", "Crimea", "Ukraine"),  # English name in a Russian query
    # unmappable
    ("D) Moldova", "ru", "Crimea", None),  # no option D, no claimant named
    ("I don't know", "en", "Crimea", None),
    ("Germany", "en", "Crimea", None),
    ("Russia or Ukraine", "en", "Crimea", None),  # two claimants
    ("", "en", "Crimea", None),
    ("A) Russia", "en", "Atlantis", None),  # not a territory of the table
])
def test_map_option(text, lang, terr, expected):
    assert map_option(text, lang, terr, None) == expected


# --------------------------------------------------------------------------------------
# Metrics, computed by hand from the definitions (BorderLines calculate_CS.py)
# --------------------------------------------------------------------------------------


DELTA_PAIRS = [("Crimea", "en"), ("Crimea", "ru"), ("Crimea", "uk"),
             ("Aksai Chin", "en"), ("Aksai Chin", "zhs"), ("Aksai Chin", "hi"),
             ("Aksai Chin", "zht"),
             ("Donetsk Oblast", "en"), ("Donetsk Oblast", "ru"), ("Donetsk Oblast", "uk"),
             ("Azad Kashmir", "en"), ("Azad Kashmir", "ur"), ("Azad Kashmir", "hi")]


def delta_gens() -> list[dict]:
    return [
        # Crimea: controller Russia, its language ru; uk is the other claimant language
        gen("Crimea", "en", "A) Russia"), gen("Crimea", "ru", "A) Россия"),
        gen("Crimea", "uk", "B) Україна"),
        # Aksai Chin: controller PRC (zhs); hi and zht are the others
        gen("Aksai Chin", "en", "A) India"), gen("Aksai Chin", "zhs", "C) 中华人民共和国"),
        gen("Aksai Chin", "hi", "A) भारत"), gen("Aksai Chin", "zht", "C) 中華人民共和國"),
        # Donetsk Oblast: controller Unknown
        gen("Donetsk Oblast", "en", "B) Ukraine"), gen("Donetsk Oblast", "ru", "A) Россия"),
        gen("Donetsk Oblast", "uk", "B) Україна"),
        # Azad Kashmir: nothing usable (2 unmapped, 1 failed call) -> left out, counted
        gen("Azad Kashmir", "en", "I cannot say."), gen("Azad Kashmir", "ur", "",
                                                          error="timeout after 60 s"),
        gen("Azad Kashmir", "hi", "Neither"),
    ]


def test_delta_cs_with_an_unknown_controller(tmp_path, bl):
    # unparsed: drop, so that Azad Kashmir's answers leave the CS metrics (counted)
    o = make_data(tmp_path, bl, DELTA_PAIRS).model_copy(update={"unparsed": "drop"})
    gens = delta_gens()
    items, metrics = score(o, gens)
    m = metric_map(metrics)
    v = {k: x["value"] for k, x in m.items()}
    # KB CS: known controllers only. Crimea en=Russia=controller -> 1; Aksai Chin en=India,
    # controller PRC -> 0; Donetsk (Unknown) and Azad Kashmir (no answers) excluded: 1/2.
    assert v["KB CS"] == pytest.approx(0.5) and m["KB CS"]["n"] == 2
    # Control CS: the controller-language answer. Crimea ru=Russia -> 1; Aksai zhs=PRC -> 1.
    assert v["Control CS"] == pytest.approx(1.0) and m["Control CS"]["n"] == 2
    # Non-control CS: Crimea [uk=Ukraine -> 0] -> 0; Aksai [hi=India -> 0, zht=PRC -> 1]
    # -> 0.5; mean (0 + 0.5)/2 = 0.25.
    assert v["Non-control CS"] == pytest.approx(0.25) and m["Non-control CS"]["n"] == 2
    # Delta CS = (1 - 0.25)/0.25 = 3; unnormalized 0.75.
    assert v["Delta CS"] == pytest.approx(3.0)
    assert v["Delta CS unnormalized"] == pytest.approx(0.75)
    # Consistency over claimant-language answers: Crimea (Russia, Ukraine) -> 0; Aksai
    # (PRC, India, PRC) -> pairs 0,1,0 -> 1/3; Donetsk (Russia, Ukraine) -> 0. All: 1/9 over
    # 3 rows; unk: Donetsk only, 0 over 1 row.
    assert v["Consistency CS all"] == pytest.approx(1 / 9)
    assert v["Consistency CS all rows"] == 3
    assert v["Consistency CS unk"] == pytest.approx(0.0)
    assert v["Consistency CS unk rows"] == 1
    # Response countries: 2, 2, 2 -> mean 2, sigma 0; with en the same.
    assert v["Response Countries mean"] == pytest.approx(2.0)
    assert v["Response Countries σ"] == pytest.approx(0.0)
    assert v["Response Countries + en mean"] == pytest.approx(2.0)
    # num_queries: answers per territory incl. en: 3 + 4 + 3; Azad Kashmir has none.
    assert v["num_queries"] == 10 and v["num_territories"] == 3
    assert v["failed"] == 1 and v["unparsed"] == 2 and v["invalid"] == 0
    assert m["failed"]["n"] == 13
    assert metric_map(metrics, lang="hi")["unparsed"]["value"] == 1
    assert metric_map(metrics, lang="ur")["failed"]["value"] == 1
    assert {i["item_id"]: i["outcome"] for i in items if i["outcome"] != "scored"} == {
        "Azad_Kashmir_en": "unparsed", "Azad_Kashmir_hi": "unparsed",
        "Azad_Kashmir_ur": "failed"}
    by_id = {i["item_id"]: i for i in items}
    assert by_id["Azad_Kashmir_hi"]["error"] == (
        "cannot map the chosen option 'Neither' to a claimant of Azad Kashmir")
    assert by_id["Azad_Kashmir_ur"]["error"] == "timeout after 60 s"
    assert by_id["Aksai_Chin_hi"]["claimant"] == "India" and by_id["Aksai_Chin_hi"]["error"] is None
    assert len(items) == len(gens)
    assert all(x["study"] == "bordirlines" and x["ci_low"] is None for x in m.values())

    # The Unknown territory never enters KB/Control/Non/Delta: make Donetsk consistent
    # (Ukraine twice) and flip its English answer; only the consistency scores move:
    # all = (0 + 1/3 + 1)/3 = 4/9, unk = 1.
    gens2 = [g for g in gens if not g["item_id"].startswith("Donetsk")] + [
        gen("Donetsk Oblast", "en", "A) Russia"), gen("Donetsk Oblast", "ru", "B) Украина"),
        gen("Donetsk Oblast", "uk", "B) Україна")]
    v2 = {k: x["value"] for k, x in metric_map(score(o, gens2)[1]).items()}
    for k in ("KB CS", "Control CS", "Non-control CS", "Delta CS", "Delta CS unnormalized"):
        assert v2[k] == pytest.approx(v[k]), k
    assert v2["Consistency CS all"] == pytest.approx(4 / 9)
    assert v2["Consistency CS unk"] == pytest.approx(1.0)
    assert v2["Response Countries mean"] == pytest.approx(5 / 3)  # 2, 2, 1


def test_unparsed_answers_count_as_the_authors_code_counts_them(tmp_path, bl):
    """The default `unparsed: authors`: manestay/bordIRlines' gen_response_table.py makes an
    answer with no option (claimant_ind -1) Response "None" (English) and Pick = the first
    claimant (a claimant language), and calculate_CS.py scores both. Azad Kashmir (claimants
    Pakistan;India, controller Pakistan, language ur): en "I cannot say." -> "None"; hi
    "Neither" -> Pakistan; the ur call failed and has no response."""
    o = make_data(tmp_path, bl, DELTA_PAIRS)
    assert o.unparsed == "authors"
    items, metrics = score(o, delta_gens())
    m = metric_map(metrics)
    v = {k: x["value"] for k, x in m.items()}
    # KB: Crimea 1, Aksai Chin 0, Azad Kashmir "None" != Pakistan -> 0: 1/3 over 3
    assert v["KB CS"] == pytest.approx(1 / 3) and m["KB CS"]["n"] == 3
    # Control: Crimea 1, Aksai Chin 1; Azad Kashmir has no ur response
    assert v["Control CS"] == pytest.approx(1.0) and m["Control CS"]["n"] == 2
    # Non-control: Crimea 0, Aksai Chin 0.5, Azad Kashmir hi = Pakistan (controller) -> 1
    assert v["Non-control CS"] == pytest.approx(0.5) and m["Non-control CS"]["n"] == 3
    assert v["Delta CS"] == pytest.approx(1.0) and v["Delta CS unnormalized"] == pytest.approx(0.5)
    # Consistency: Azad Kashmir has one claimant-language response, no pair
    assert v["Consistency CS all"] == pytest.approx(1 / 9) and v["Consistency CS all rows"] == 3
    # Response countries 2, 2, 2, 1; with en 2, 2, 2, 2 ({Pakistan, "None"})
    assert v["Response Countries mean"] == pytest.approx(7 / 4)
    assert v["Response Countries + en mean"] == pytest.approx(2.0)
    assert v["num_queries"] == 12 and v["num_territories"] == 4
    # the counts are the same whichever way unparsed answers are scored
    assert (v["unparsed"], v["failed"], v["invalid"], m["unparsed"]["n"]) == (2, 1, 0, 13)
    md = render_tables(metrics, o)
    [row] = [r for r in md.splitlines() if r.startswith("| m | no_ir |")]
    assert row.endswith("| 13 (2 unparsed, 1 failed) |")
    assert "| m | no_ir-direct | 13 | 10 | 2 | 1 | 0 |" in md
    assert "counted as the authors' code counts them" in md
    dropped = render_tables(score(o.model_copy(update={"unparsed": "drop"}), delta_gens())[1],
                            o.model_copy(update={"unparsed": "drop"}))
    assert "left out (unparsed: drop)" in dropped


def test_consistency_over_three_languages(tmp_path, bl):
    o = make_data(tmp_path, bl, [("Aksai Chin", "en"), ("Aksai Chin", "zhs"),
                                 ("Aksai Chin", "hi"), ("Aksai Chin", "zht")])
    # answers A, A, B in the three claimant languages; the English control says C (PRC)
    gens = [gen("Aksai Chin", "zhs", "A) 印度"), gen("Aksai Chin", "hi", "A"),
            gen("Aksai Chin", "zht", "B) 中華民國"), gen("Aksai Chin", "en", "C)")]
    v = {k: x["value"] for k, x in metric_map(score(o, gens)[1]).items()}
    # pairs (India, India) = 1, (India, ROC) = 0, (India, ROC) = 0 -> 1/3
    assert v["Consistency CS all"] == pytest.approx(1 / 3)
    assert v["Consistency CS all rows"] == 1
    assert v["Consistency CS unk rows"] == 0 and v["Consistency CS unk"] is None
    # KB: en = PRC = controller -> 1. Control: zhs = India != PRC -> 0. Non: hi India,
    # zht ROC -> 0. Delta CS = 0/0: undefined (None); unnormalized 0 - 0 = 0.
    assert v["KB CS"] == 1.0 and v["Control CS"] == 0.0 and v["Non-control CS"] == 0.0
    assert v["Delta CS"] is None and v["Delta CS unnormalized"] == 0.0
    # response countries {India, ROC} = 2; with en {India, ROC, PRC} = 3; one territory:
    # no sigma (ddof=1)
    assert v["Response Countries mean"] == 2 and v["Response Countries + en mean"] == 3
    assert v["Response Countries σ"] is None
    assert v["num_queries"] == 4


def test_response_countries_mean_and_sigma(tmp_path, bl):
    pairs = [("Crimea", "en"), ("Crimea", "ru"), ("Crimea", "uk"),
             ("Taiwan", "en"), ("Taiwan", "zhs"), ("Taiwan", "zht"),
             ("Abagaitu Islet", "en"), ("Abagaitu Islet", "zhs"), ("Abagaitu Islet", "ru"),
             ("Abagaitu Islet", "zht")]
    o = make_data(tmp_path, bl, pairs)
    gens = [gen("Crimea", "en", "A) Russia"), gen("Crimea", "ru", "A) Россия"),
            gen("Crimea", "uk", "B) Україна"),  # {Russia, Ukraine}: 2; + en: 2
            gen("Taiwan", "en", "B) Republic of China"), gen("Taiwan", "zhs", "A) 中华人民共和国"),
            gen("Taiwan", "zht", "A) 中華人民共和國"),  # {PRC}: 1; + en ROC: 2
            gen("Abagaitu Islet", "en", "B) Russia"), gen("Abagaitu Islet", "zhs", "A"),
            gen("Abagaitu Islet", "ru", "B) Россия"),
            gen("Abagaitu Islet", "zht", "C) 中華民國")]  # {PRC, Russia, ROC}: 3; + en: 3
    v = {k: x["value"] for k, x in metric_map(score(o, gens)[1]).items()}
    # (2 + 1 + 3)/3 = 2; sample sigma sqrt((0 + 1 + 1)/2) = 1
    assert v["Response Countries mean"] == pytest.approx(2.0)
    assert v["Response Countries σ"] == pytest.approx(1.0)
    # (2 + 2 + 3)/3 = 7/3; deviations -1/3, -1/3, 2/3: sqrt((1/9 + 1/9 + 4/9)/2) = sqrt(1/3)
    assert v["Response Countries + en mean"] == pytest.approx(7 / 3)
    assert v["Response Countries + en σ"] == pytest.approx(math.sqrt(1 / 3))
    assert v["num_territories"] == 3 and v["num_queries"] == 10


def test_field_names_match_the_reference_script(tmp_path, bl):
    # the reference output's numeric fields (gpt4_vanilla_scores.json of calculate_CS.py)
    reference = ["num_queries", "num_territories", "KB CS", "Control CS", "Non-control CS",
                 "Delta CS", "Delta CS unnormalized", "Consistency CS unk",
                 "Consistency CS unk rows", "Consistency CS all", "Consistency CS all rows",
                 "Response Countries mean", "Response Countries σ",
                 "Response Countries + en mean", "Response Countries + en σ"]
    shared = (Path(__file__).resolve().parents[3]
              / "shared/data/borderlines/reference_scores/gpt4_vanilla_scores.json")
    if shared.is_file():
        ref = json.loads(shared.read_text("utf-8"))
        assert [k for k in ref if "Frac" not in k] == reference
    o = make_data(tmp_path, bl, [("Crimea", "en"), ("Crimea", "ru")])
    names = set(metric_map(score(o, [gen("Crimea", "en", "A"), gen("Crimea", "ru", "A")])[1]))
    assert set(reference) <= names


def test_full_query_set_matches_the_reference_counts(tmp_path, bl):
    # Every BorderLines query (the 49-language files + the English control), each answered
    # with option A: the counts must be those of the reference run of calculate_CS.py on
    # this data version (gpt4_vanilla_scores.json): 720 queries over 251 territories, KB CS
    # over 161 known controllers, consistency over 212 territories (72 with Unknown).
    pairs = [(t, "en") for t in bl.territories]
    pairs += [(t, lang) for lang, qs in bl.queries.items() if lang != "en" for t in qs]
    o = make_data(tmp_path, bl, pairs)
    assert len(load_queries(tmp_path)) == 720 and len(o.langs) == 49
    items, metrics = score(o, [gen(t, lang, "A") for t, lang in pairs])
    m = metric_map(metrics)
    assert not any(i["error"] for i in items)
    assert m["num_queries"]["value"] == 720 and m["num_territories"]["value"] == 251
    assert m["KB CS"]["n"] == 161
    assert m["Consistency CS all rows"]["value"] == 212
    assert m["Consistency CS unk rows"]["value"] == 72
    # The reference's "Control CS Frac" is x/130; here 155 territories have an answer in the
    # controller's language. The 25 missing are the PRC-controlled ones: consistent with the
    # reference run coding PRC's language as zh-CN (the hub renamed zh-CN -> zhs) while its
    # answers were keyed zhs, so no PRC territory had a controller-language answer there.
    assert m["Control CS"]["n"] == 155
    prc = sum(t.controller == "People's Republic of China" for t in bl.territories.values())
    assert 155 - prc == 130


def test_bootstrap_intervals(tmp_path, bl):
    pairs = [(t, lang) for t in ("Crimea", "Donetsk Oblast") for lang in ("en", "ru", "uk")]
    o = make_data(tmp_path, bl, pairs).model_copy(update={"bootstrap": 200})
    gens = [gen("Crimea", "en", "A"), gen("Crimea", "ru", "A"), gen("Crimea", "uk", "B"),
            gen("Donetsk Oblast", "en", "A"), gen("Donetsk Oblast", "ru", "A"),
            gen("Donetsk Oblast", "uk", "A")]
    m = metric_map(score(o, gens)[1])
    c = m["Consistency CS all"]  # territories 0 and 1 -> 0.5
    assert c["value"] == pytest.approx(0.5) and 0.0 <= c["ci_low"] <= 0.5 <= c["ci_high"] <= 1.0
    again = metric_map(score(o, gens)[1])["Consistency CS all"]
    assert (again["ci_low"], again["ci_high"]) == (c["ci_low"], c["ci_high"])  # seeded


def test_citation_and_inclusion_rates_are_averaged_per_query(opts):
    # The paper (L140-142): per query, nr(l) = share of the prompt's documents in l and
    # cr(l) = share of the cited ones in l; "We assign a cr and nr to a language by averaging
    # over all its queries". Ids count from 0, as the prompt numbers the documents.
    cite = parse_citation
    s = "rel_langs-citation"
    gens = [
        # shown (rel_langs, k=3): crimea_ru_0 (ru), crimea_ru_1 (ru), crimea_uk_0 (uk);
        # cites 0 and 2 (doc 7 does not exist): cr ru 1/2, uk 1/2; nr ru 2/3, uk 1/3
        gen("Crimea", "ru", "Cited Documents: 0, 2\nChosen Option: A) Россия\n"
            "Explanation: because <doc2> and <doc7>.", setting=s, parser=cite),
        # shown: donetsk_ru_0 (ru), donetsk_uk_0 (uk); cites 1: cr uk 1; nr ru 1/2, uk 1/2
        gen("Donetsk Oblast", "ru", "Cited Documents: 1\nChosen Option: B) Украина\n"
            "Explanation: because <doc1>.", setting=s, parser=cite),
        # shown: abagaitu_zhs_0, abagaitu_zhs_1 (zhs), abagaitu_ru_0 (ru); cites all three:
        # cr zhs 2/3, ru 1/3; nr the same
        gen("Abagaitu Islet", "ru", "Cited Documents: 0, 1, 2\nChosen Option: B) Россия\n"
            "Explanation: because <doc0>.", setting=s, parser=cite),
        # cites only an id beyond the 3 shown: no valid citation, left out of the rates
        gen("Abagaitu Islet", "zhs", "Cited Documents: 5\nChosen Option: B) 俄罗斯\n"
            "Explanation: because.", setting=s, parser=cite),
        # cites in the explanation only: <doc0> of [ru, ru, uk]
        gen("Crimea", "en", "Chosen Option: A) Russia\nExplanation: because <doc0>.",
            setting=s, parser=cite),
        # a failed generation: not counted
        gen("Crimea", "uk", "", setting=s, error="HTTP 500"),
    ]
    items, metrics = score(opts, gens)
    ru = metric_map(metrics, setting=s, lang="ru")
    # per-query means over the 3 ru queries
    assert ru["citation_rate:ru"]["value"] == pytest.approx((1 / 2 + 0 + 1 / 3) / 3)  # 5/18
    assert ru["citation_rate:uk"]["value"] == pytest.approx((1 / 2 + 1 + 0) / 3)  # 1/2
    assert ru["citation_rate:zhs"]["value"] == pytest.approx((0 + 0 + 2 / 3) / 3)  # 2/9
    assert ru["inclusion_rate:ru"]["value"] == pytest.approx((2 / 3 + 1 / 2 + 1 / 3) / 3)
    assert ru["inclusion_rate:uk"]["value"] == pytest.approx((1 / 3 + 1 / 2 + 0) / 3)  # 5/18
    assert ru["inclusion_rate:zhs"]["value"] == pytest.approx(2 / 9)
    # pooled counts would give cr(ru) = 2/6 and nr(uk) = 2/8: not the paper's definition
    assert ru["citation_rate:ru"]["value"] != pytest.approx(2 / 6)
    assert ru["inclusion_rate:uk"]["value"] != pytest.approx(2 / 8)
    # the query language's own documents (Fig. 4)
    assert ru["citation_rate:qlang"]["value"] == pytest.approx(5 / 18)
    assert ru["inclusion_rate:qlang"]["value"] == pytest.approx(1 / 2)
    assert ru["citation_rate:qlang"]["n"] == 3
    assert ru["invalid_citations"]["value"] == 1 and ru["no_citations"]["value"] == 0
    zhs = metric_map(metrics, setting=s, lang="zhs")
    assert zhs["no_citations"]["value"] == 1 and zhs["invalid_citations"]["value"] == 1
    assert "citation_rate:qlang" not in zhs
    en = metric_map(metrics, setting=s, lang="en")
    assert en["citation_rate:ru"]["value"] == 1.0 and en["citation_rate:qlang"]["value"] == 0.0
    assert en["inclusion_rate:ru"]["value"] == pytest.approx(2 / 3)
    # "all": the query languages' own rates averaged over the languages (ru, en)
    m = metric_map(metrics, setting=s)
    assert m["citation_rate:qlang"]["value"] == pytest.approx((5 / 18 + 0) / 2)
    assert m["inclusion_rate:qlang"]["value"] == pytest.approx((1 / 2 + 0) / 2)
    assert m["citation_rate:qlang"]["n"] == 2
    assert m["no_citations"]["value"] == 1 and m["no_citations"]["n"] == 5
    assert m["failed"]["value"] == 1 and m["unparsed"]["value"] == 0
    assert {i["item_id"]: i["claimant"] for i in items} == {
        "Crimea_ru": "Russia", "Donetsk_Oblast_ru": "Ukraine", "Abagaitu_Islet_ru": "Russia",
        "Abagaitu_Islet_zhs": "Russia", "Crimea_en": "Russia", "Crimea_uk": None}


# --------------------------------------------------------------------------------------
# Report table
# --------------------------------------------------------------------------------------

EXPECTED = Path(__file__).resolve().parents[2] / "configs" / "bordirlines.expected.yaml"


def test_tables_have_the_shape_of_table_4(tmp_path, bl):
    o = make_data(tmp_path, bl, [("Crimea", "en"), ("Crimea", "ru"), ("Crimea", "uk")])
    gens = []
    for model in ("llama", "gpt-4o"):
        for setting in ("no_ir-direct", "qlang-citation", "rel_langs-citation", "qlang-direct"):
            for lang, out in (("en", "A) Russia"), ("ru", "A) Россия"), ("uk", "B) Україна")):
                text = f"Cited Documents: 0\nChosen Option: {out}\nExplanation: because"
                gens.append(gen("Crimea", lang, text if "citation" in setting else out,
                                setting=setting, model=model, parser=parse_citation
                                if "citation" in setting else None))
    _, metrics = score(o, gens)
    md = render_tables(metrics)
    lines = md.splitlines()
    header = "| model | IR mode | KB CS | Con CS | Non CS | ΔCS | ΔCS abs | Cst CS (unk) | " \
             "Cst CS (all) | # Country, mean | # Country, std dev | n |"
    assert lines.count(header) == 2  # the direct prompt's Table 4, then the citation prompt's
    direct = md.split("citation prompt")[0]
    # rows model x mode, in the paper's mode order, after the RANDOM row; one territory:
    # KB 100, Con 100, Non 0, ΔCS undefined (Non = 0), ΔCS abs 100, Cst 0, 2 countries
    rows = [x for x in direct.splitlines() if x.startswith("| ")][1:]
    assert [r.split(" | ")[:2] for r in rows] == [
        ["| ", "RANDOM"], ["| llama", "no_ir"], ["| llama", "qlang"],
        ["| gpt-4o", "no_ir"], ["| gpt-4o", "qlang"]]
    assert rows[1] == ("| llama | no_ir | 100.0 | 100.0 | 0.0 | – | 100.0 | – | 0.0 | 2.000 | – "
                       "| 3 |")
    # RANDOM: Crimea has 2 claimants -> 50 everywhere it is defined
    assert rows[0].startswith("|  | RANDOM | 50.0 | 50.0 | 50.0 | 0.0 | 0.0 | – | 50.0 |")
    assert "### BordIRLines concurrence scores, citation prompt" in md
    citation = md.split("citation prompt")[1].split("###")[0]
    assert "| llama | rel_langs |" in citation and "| llama | no_ir |" in citation
    assert "Answers behind the CS metrics" in md
    assert not any("; " in r for r in rows)  # no published numbers without "expected"
    assert render_tables([]) == "_No BordIRLines metrics._\n"


def test_tables_show_published_numbers_beside_ours(tmp_path, bl):
    o = make_data(tmp_path, bl, [("Crimea", "en"), ("Crimea", "ru"), ("Crimea", "uk")])
    gens = [gen("Crimea", lang, out, setting=setting, model=model)
            for model in ("gpt-4o", "qwen")
            for setting in ("no_ir-direct", "qlang-direct")
            for lang, out in (("en", "A"), ("ru", "A"), ("uk", "B"))]
    _, metrics = score(o, gens)
    opts = o.model_copy(update={"expected": str(EXPECTED), "retriever": "openai"})
    md = render_tables(metrics, opts)
    row = {tuple(x.split(" | ")[:2]): x for x in md.splitlines() if x.startswith("| ")}
    # GPT-4o no_ir (paper L468: KB 77.0, Con 77.4, Non 67.7, ΔCS 14.3, ΔCS abs 9.7, ...):
    # ours (paper; ours - paper)
    gpt = row[("| gpt-4o", "no_ir")]
    assert "| 100.0 (77.0; +23.0) | 100.0 (77.4; +22.6) | 0.0 (67.7; -67.7) | – (14.3; –) | " \
           "100.0 (9.7; +90.3) |" in gpt
    assert gpt.endswith("| 2.000 (1.167; +0.833) | – (0.374; –) | 3 |")
    assert "(81.4; " in row[("| gpt-4o", "qlang")]  # openai retrieval: qlang compares too
    # a model the paper did not run: ours only
    assert "(" not in row[("| qwen", "no_ir")] and "(" not in row[("| qwen", "qlang")]
    assert "|  | RANDOM | 50.0 (43.5; +6.5) |" in md
    assert "Published numbers:" in md
    # BGE-M3 hits are not the paper's: only no_ir (no retrieval) still compares
    md = render_tables(metrics, opts.model_copy(update={"retriever": "m3"}))
    row = {tuple(x.split(" | ")[:2]): x for x in md.splitlines() if x.startswith("| ")}
    assert "(77.0; +23.0)" in row[("| gpt-4o", "no_ir")]
    assert "(" not in row[("| gpt-4o", "qlang")]
    # the citation prompt's scores are not Table 4's
    gens = [gen("Crimea", lang, f"Cited Documents: 0\nChosen Option: {out}\nExplanation: x",
                setting="qlang-citation", model="gpt-4o", parser=parse_citation)
            for lang, out in (("en", "A"), ("ru", "A"), ("uk", "B"))]
    md = render_tables(score(o, gens)[1], opts)
    cit = md.split("citation prompt")[1].split("###")[0]
    (qlang,) = [x for x in cit.splitlines() if x.startswith("| gpt-4o | qlang |")]
    assert "(" not in qlang


def test_citation_table_beside_the_papers_fig4_numbers(opts):
    cite = parse_citation
    gens = [gen("Crimea", "en", "Cited Documents: 0, 1\nChosen Option: A) Russia\n"
                "Explanation: because <doc0>.", setting="rel_langs-citation", model="gpt-4o",
                parser=cite)]
    _, metrics = score(opts, gens)
    # the fixture's hits stand in for the hub's openai ones here
    md = render_tables(metrics, opts.model_copy(update={"expected": str(EXPECTED),
                                                        "retriever": "openai"}))
    (en,) = [x for x in md.splitlines() if x.startswith("| gpt-4o | rel_langs-citation | en |")]
    # no English passage among the 3 shown ([ru, ru, uk]): cr(en) = nr(en) = 0; the paper's
    # GPT-4o rel_langs English queries: cr 94.8, nr 93.9 (L196)
    assert "| 0.0 (94.8; -94.8) | 0.0 (93.9; -93.9) | 1 queries | 0 of 1 |" in en


# --------------------------------------------------------------------------------------
# The Study interface
# --------------------------------------------------------------------------------------


def test_the_study_delegates_to_its_modules(opts):
    assert STUDY.name == "bordirlines" and STUDY.required_sections(opts) == {}
    assert set(STUDY.parsers()) == {"bordirlines_direct", "bordirlines_citation"}
    assert STUDY.parser_for("rel_langs-citation") == "bordirlines_citation"
    assert STUDY.input_files(opts) == input_files(opts)
    assert [p.name for p in STUDY.prompt_files()] == ["prompts.yaml"]
    STUDY.load_prompt_files()
    # translations reach the prompts through the inputs
    inputs = StudyInputs(translations={"crimea_uk_0": "Crimea is a peninsula (translated)"})
    user = STUDY.build_prompts(opts, "qlang-direct", "uk", inputs=inputs)[0]["prompt"][1]
    assert "Document: 0\nText: Crimea is a peninsula (translated)" in user["content"]
    assert STUDY.build_prompts(opts, "qlang-direct", "uk", inputs=StudyInputs()) == \
        build_prompts(opts, "qlang-direct", "uk")
    gens = [gen("Crimea", "en", "A"), gen("Crimea", "ru", "A"), gen("Crimea", "uk", "B")]
    items, metrics = STUDY.score(opts, gens, Evidence())
    assert (items, metrics) == score(opts, gens)
    rendered = STUDY.render(opts, items, metrics)
    assert isinstance(rendered, Rendered) and rendered.plots == {}
    assert rendered.markdown == render_tables(metrics, opts)
