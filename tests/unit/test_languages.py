"""The language table against the real data files, NLLB-200, lingua and Anserini configs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from xling.tasks import languages as L
from xling.tasks.languages import (
    ALIASES,
    LANGUAGES,
    STUDY_LANGUAGES,
    UNSUPPORTED,
    Language,
    UnknownLanguageError,
    get_language,
    lingua_language,
    lucene_language,
    nllb_code,
    validate_languages,
)

REPO = Path(__file__).resolve().parents[2]


def _shared_data() -> Path | None:
    env = os.environ.get("XLING_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates += [REPO / "shared" / "data", REPO.parent / "shared" / "data"]
    for c in candidates:
        if (c / "borderlines").is_dir() and (c / "ir").is_dir():
            return c
    return None


DATA = _shared_data()
needs_data = pytest.mark.skipif(
    DATA is None, reason="shared/data not found (set XLING_SHARED_DATA)"
)

# The 49 BordIRLines query languages, written down here too so the check runs without data.
BORDIRLINES_49 = (
    "ar az bn bs da el en es fa fr hi hr ht hy id is it iw ja ka km ko ky lo mg mn ms my ne nl "
    "pt ru sl sn so sq sr sw tg th ti tl tr uk ur uz vi zhs zht"
).split()


# --- shape of the table ------------------------------------------------------------------


def test_every_study_language_resolves_to_itself():
    assert len(BORDIRLINES_49) == 49
    assert sorted(STUDY_LANGUAGES["bordirlines"]) == sorted(BORDIRLINES_49)
    for study, codes in STUDY_LANGUAGES.items():
        for code in codes:
            lang = get_language(code)
            assert lang.code == code, (study, code)
    assert set(STUDY_LANGUAGES["xrag"]) == {"en", "de", "es", "zh", "ar"}
    assert set(STUDY_LANGUAGES["ciral"]) == {"ha", "so", "sw", "yo", "en"}
    assert set(STUDY_LANGUAGES["mirage"]) == set(
        "ar bn de en es fa fi fr hi id ja ko ru sw te th yo zh".split()
    )
    assert set(STUDY_LANGUAGES["mrtydi"]) == set("ar bn en fi id ja ko ru sw te th".split())
    assert set(STUDY_LANGUAGES["clef2003"]) == set("en de fi it ru fr es nl sv pt".split())
    assert {"en", "sw"} <= set(STUDY_LANGUAGES["mlongrr"])


def test_rows_are_consistent():
    for code, lang in LANGUAGES.items():
        assert isinstance(lang, Language)
        assert lang.code == code == code.lower()
        assert lang.script == lang.nllb.split("_")[1]
        assert re.fullmatch(r"[A-Z][a-z]{3}", lang.script)
        assert lang.name and lang.name[0].isupper()
    for alias, target in ALIASES.items():
        assert alias not in LANGUAGES and target in LANGUAGES
        assert get_language(alias) is LANGUAGES[target]


def test_language_is_frozen():
    with pytest.raises(Exception):
        get_language("en").nllb = "fra_Latn"  # type: ignore[misc]


@pytest.mark.parametrize(
    "code, nllb",
    [
        ("en", "eng_Latn"),
        ("zh", "zho_Hans"),
        ("zhs", "zho_Hans"),
        ("zht", "zho_Hant"),
        ("iw", "heb_Hebr"),
        ("he", "heb_Hebr"),
        ("ar", "arb_Arab"),
        ("sw", "swh_Latn"),
        ("fa", "pes_Arab"),
        ("ms", "zsm_Latn"),
        ("mg", "plt_Latn"),
        ("mn", "khk_Cyrl"),
        ("sq", "als_Latn"),
        ("uz", "uzn_Latn"),
        ("az", "azj_Latn"),
        ("ne", "npi_Deva"),
        ("sr", "srp_Cyrl"),
        ("ha", "hau_Latn"),
        ("yo", "yor_Latn"),
        ("so", "som_Latn"),
        ("fi", "fin_Latn"),
    ],
)
def test_known_nllb_mappings(code, nllb):
    assert nllb_code(code) == nllb


# --- the data ----------------------------------------------------------------------------


@needs_data
def test_every_bordirlines_query_language_resolves():
    qdir = DATA / "borderlines" / "queries"
    codes = sorted(p.suffix[1:] for p in qdir.glob("prompts.*") if p.suffix != ".txt")
    assert len(codes) == 49, codes
    assert codes == sorted(BORDIRLINES_49)
    choices = sorted(p.suffix[1:] for p in qdir.glob("choices.*") if p.suffix != ".txt")
    assert choices == codes
    for lang in validate_languages(codes):
        assert lang.code in codes  # dataset spelling kept: zhs stays zhs, iw stays iw


@needs_data
def test_countries_info_languages_resolve_or_are_listed_unsupported():
    info = json.loads((DATA / "borderlines" / "countries_info.json").read_text(encoding="utf-8"))
    codes = {v["Lang_Code"] for v in info.values()}
    unsupported = codes & set(UNSUPPORTED)
    assert unsupported == {"mfe", "to"}
    validate_languages(sorted(codes - unsupported))
    # Their English names (Bangla, Filipino, ...) resolve to the same language; the name
    # "Chinese" cannot tell zhs from zht, so compare the NLLB language part, not the script.
    for v in info.values():
        if v["Lang_Code"] in UNSUPPORTED:
            continue
        by_name = get_language(v["Lang_Name"]).nllb.split("_")[0]
        assert by_name == get_language(v["Lang_Code"]).nllb.split("_")[0], v


@needs_data
def test_serbian_and_uzbek_scripts_match_the_query_files():
    qdir = DATA / "borderlines" / "queries"
    sr = (qdir / "prompts.sr").read_text(encoding="utf-8")
    uz = (qdir / "prompts.uz").read_text(encoding="utf-8")
    zht = (qdir / "prompts.zht").read_text(encoding="utf-8")
    assert re.search("[\u0400-\u04ff]", sr) and get_language("sr").script == "Cyrl"
    assert not re.search("[\u0400-\u04ff]", uz) and get_language("uz").script == "Latn"
    assert "還是" in zht and get_language("zht").script == "Hant"


@needs_data
def test_every_ir_topic_and_qrels_language_resolves():
    pat = re.compile(r"^(?:topics|qrels)\.(ciral|miracl|mrtydi)-v1\.[01]-([a-z]+)[-.]")
    found: dict[str, set[str]] = {}
    for p in list((DATA / "ir" / "topics").iterdir()) + list((DATA / "ir" / "qrels").iterdir()):
        m = pat.match(p.name)
        assert m, p.name
        found.setdefault(m.group(1), set()).add(m.group(2))
    assert found["ciral"] == {"ha", "so", "sw", "yo"}
    assert {"ar", "de", "en", "es", "fa", "fi", "hi", "ja", "ru", "sw", "zh"} <= found["miracl"]
    for dataset, codes in found.items():
        study = "mirage" if dataset == "miracl" else dataset
        assert codes <= set(STUDY_LANGUAGES[study]), (dataset, codes)
        for lang in validate_languages(sorted(codes)):
            assert lang.code in codes
    sample = DATA / "ir" / "sample-docs" / "mrtydi-1.1"
    mrtydi = sorted(p.name for p in sample.iterdir() if p.is_dir())
    assert mrtydi == sorted(STUDY_LANGUAGES["mrtydi"])


@needs_data
def test_mlongrr_file_names_resolve():
    names = {p.name.split("_")[0] for p in (DATA / "mlongrr").rglob("*_needles.csv")}
    assert names == {"English", "Swahili"}
    assert {get_language(n).code for n in names} == {"en", "sw"}
    assert get_language("Azeri").code == "az"  # the mLongRR repo's other files


@needs_data
def test_lucene_languages_match_published_anserini_and_pyserini_configs():
    expected = DATA / "ir" / "expected"
    checked = 0
    # pyserini two-click matrices: `--language xx --topics {miracl,ciral}-v1.0-xx-...`
    for f in ("miracl.yaml", "ciral.yaml"):
        text = (expected / f).read_text(encoding="utf-8")
        for lang, topic_lang in re.findall(
            r"--language (\w+) --topics (?:miracl|ciral)-v1\.0-(\w+)-", text
        ):
            assert lang == topic_lang
            assert lucene_language(topic_lang) == lang
            assert not get_language(topic_lang).lucene_fallback
            checked += 1
        # MIRACL yo is searched --pretokenized: WhitespaceAnalyzer, which `-language yo` gives.
        if f == "miracl.yaml":
            assert "--pretokenized --topics miracl-v1.0-yo-" in text
            assert lucene_language("yo") in L.ANSERINI_WHITESPACE
    # Anserini regressions: {ciral,miracl,mrtydi}-v1.x-<lang>[-aca].yaml use `-language <lang>`;
    # ciral-v1.0-<lang>-en.yaml index NLLB English translations with the default analyzer.
    for y in sorted((expected / "anserini-regressions").glob("*.yaml")):
        m = re.match(r"(?:ciral|miracl|mrtydi)-v1\.[01]-([a-z]+)(-en|-aca)?\.yaml$", y.name)
        assert m, y.name
        langs = set(re.findall(r"-language (\w+)", y.read_text(encoding="utf-8")))
        if m.group(2) == "-en":
            assert langs == set() and lucene_language("en") == "en"
        else:
            assert langs == {lucene_language(m.group(1))}, y.name
        checked += 1
    assert checked >= 30


# --- the reference lists -----------------------------------------------------------------


def test_embedded_nllb_list_equals_transformers():
    tok = pytest.importorskip("transformers.models.nllb.tokenization_nllb")
    codes = tok.FAIRSEQ_LANGUAGE_CODES
    assert len(codes) == len(set(codes)) == 202
    assert set(codes) == L.NLLB_200_CODES


def test_all_nllb_codes_are_nllb_200_codes():
    tok = pytest.importorskip("transformers.models.nllb.tokenization_nllb")
    valid = set(tok.FAIRSEQ_LANGUAGE_CODES)
    bad = {c: lang.nllb for c, lang in LANGUAGES.items() if lang.nllb not in valid}
    assert not bad


def test_all_lingua_names_exist_in_installed_lingua():
    lingua = pytest.importorskip("lingua")
    names = {lang.name for lang in lingua.Language.all()}
    bad = {c: l.lingua for c, l in LANGUAGES.items() if l.lingua and l.lingua not in names}
    assert not bad
    # None only where lingua really lacks the language (checked by ISO 639-1 code).
    iso = {lang.iso_code_639_1.name.lower(): lang.name for lang in lingua.Language.all()}
    for code, lang in LANGUAGES.items():
        plain = {"iw": "he", "zhs": "zh", "zht": "zh"}.get(code, code)
        assert lang.lingua == iso.get(plain), code
    assert lingua_language("en") == "ENGLISH"
    assert lingua_language("ha") is None
    assert getattr(lingua.Language, lingua_language("iw")) == lingua.Language.HEBREW


def test_lucene_values_are_ones_anserini_knows():
    for code, lang in LANGUAGES.items():
        if lang.lucene_fallback:
            assert lang.lucene == "en", code
            assert code not in L.ANSERINI_ANALYZERS and code not in L.ANSERINI_WHITESPACE
        else:
            assert (
                lang.lucene in L.ANSERINI_ANALYZERS
                or lang.lucene in L.ANSERINI_WHITESPACE
                or lang.lucene == "en"
            ), code
    # CLEF 2003 languages all have dedicated analyzers (English: the default one).
    for code in STUDY_LANGUAGES["clef2003"]:
        assert lucene_language(code) == code and not get_language(code).lucene_fallback
    assert [lucene_language(c) for c in ("ha", "so", "sw", "yo")] == ["ha", "so", "sw", "yo"]
    assert lucene_language("zht") == lucene_language("zhs") == "zh"
    assert get_language("iw").lucene_fallback and lucene_language("he") == "en"


# --- lookups -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling, code",
    [
        ("en", "en"),
        ("EN", "en"),
        (" de ", "de"),
        ("he", "iw"),
        ("HE", "iw"),
        ("iw", "iw"),
        ("in", "id"),
        ("zh", "zh"),
        ("zh-Hant", "zht"),
        ("zh_TW", "zht"),
        ("zh-CN", "zh"),
        ("fil", "tl"),
        ("fin_Latn", "fi"),
        ("FIN_LATN", "fi"),
        ("fin-Latn", "fi"),
        ("zho_Hans", "zh"),  # first row with that NLLB code: the plain ISO code
        ("zho_Hant", "zht"),
        ("heb_Hebr", "iw"),
        ("swh_Latn", "sw"),
        ("Swahili", "sw"),
        ("english", "en"),
        ("Azeri", "az"),
        ("Bangla", "bn"),
        ("Haitian Creole", "ht"),
        ("Chinese (Traditional)", "zht"),
    ],
)
def test_get_language_spellings(spelling, code):
    assert get_language(spelling).code == code


def test_unknown_code_raises_with_suggestion():
    with pytest.raises(UnknownLanguageError) as ei:
        get_language("zhx")
    err = ei.value
    assert isinstance(err, ValueError)
    msg = str(err)
    assert "'zhx'" in msg and "did you mean" in msg
    assert "zhs" in err.suggestions["zhx"] and "zht" in err.suggestions["zhx"]
    assert "xling/tasks/languages.py" in msg
    assert err.codes == ["zhx"]

    with pytest.raises(UnknownLanguageError, match=r"'fin_Latn'"):
        nllb_code("fin_Lat")
    with pytest.raises(UnknownLanguageError, match=r"'Swahili'"):
        lucene_language("Swahilli")
    with pytest.raises(UnknownLanguageError, match="no close match"):
        lingua_language("qqqq")
    for bad in ("", None, 3):
        with pytest.raises(UnknownLanguageError):
            get_language(bad)  # type: ignore[arg-type]


def test_unsupported_codes_say_why():
    with pytest.raises(UnknownLanguageError, match="Morisyen.*no NLLB-200 code"):
        get_language("mfe")
    with pytest.raises(UnknownLanguageError, match="Tongan"):
        get_language("to")


def test_validate_languages_lists_all_bad_codes():
    ok = validate_languages(["en", "he", "zhs", "fin_Latn"])
    assert [l.code for l in ok] == ["en", "iw", "zhs", "fi"]
    assert [l.code for l in validate_languages("sw")] == ["sw"]  # a str is one code
    assert validate_languages([]) == []

    with pytest.raises(UnknownLanguageError) as ei:
        validate_languages(["en", "sx", "zhs", "xx", "zhx", "de"])
    err = ei.value
    assert err.codes == ["sx", "xx", "zhx"]
    msg = str(err)
    assert msg.startswith("3 unknown language codes")
    for bad in ("'sx'", "'xx'", "'zhx'"):
        assert bad in msg
    assert "'en'" not in msg.split(". Known")[0] and "'de'" not in msg
    assert "sw" in err.suggestions["sx"]


def test_import_is_pure_python():
    code = (
        "import sys; import xling.tasks.languages as m; "
        "heavy = {'ray', 'torch', 'transformers', 'lingua', 'ctranslate2', 'pyserini', 'numpy'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
