"""One table of every language in the five studies, and strict lookups into it.

Datasets, translation models, language identification and Lucene all name languages
differently: BordIRLines writes Hebrew as ``iw`` and Chinese as ``zhs``/``zht``, NLLB wants
``heb_Hebr``/``zho_Hans``, lingua calls it ``HEBREW``, and Anserini's ``-language`` flag
knows only some ISO 639-1 codes (and silently analyzes every other language as English).
This module is the single place where those names meet:

* :data:`LANGUAGES` maps each code *as the datasets write it* to a :class:`Language` with
  its NLLB-200 code, script, lingua enum name and Lucene analyzer language;
* :data:`ALIASES` maps other spellings (``he``, ``zh-Hant``, ``fil``...) to those codes;
* :func:`get_language` also accepts NLLB codes (``fin_Latn``) and English names
  (``Swahili``, ``Azeri``: mLongRR names its files ``<Language>_needles.csv``);
* :func:`validate_languages` checks a whole config's codes at once and raises one
  :class:`UnknownLanguageError` that lists every bad code with close matches, so a typo
  fails at config validation instead of hours into a job.

``Language.code`` is the dataset spelling, so two entries can share an NLLB code (``zh``
for XRAG/MIRACL and ``zhs`` for BordIRLines are both ``zho_Hans``). Compare ``.nllb`` to
ask "same language?" across datasets.

Lucene: ``lucene`` is the value to pass to Anserini ``-language`` / pyserini
``--language`` / ``LuceneSearcher.set_language``. ``lucene_fallback`` is True when
Anserini has no analyzer for the language and ``"en"`` (Anserini's DefaultEnglishAnalyzer:
StandardTokenizer, lowercase, English stopwords, Porter) is used instead; this is what
Anserini itself does for an unknown ``-language`` value, made explicit here. Scripts
written without spaces (Lao, Khmer, Burmese, Dzongkha) tokenize badly under that fallback;
BM25 numbers for them should be read with that in mind.

Pure Python on purpose: importable by config validation without Ray, models or lingua.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ALIASES",
    "ANSERINI_ANALYZERS",
    "ANSERINI_WHITESPACE",
    "LANGUAGES",
    "NLLB_200_CODES",
    "STUDY_LANGUAGES",
    "UNSUPPORTED",
    "Language",
    "UnknownLanguageError",
    "get_language",
    "lingua_language",
    "lucene_language",
    "nllb_code",
    "validate_languages",
]

_WHERE = "xling/tasks/languages.py (LANGUAGES and ALIASES)"


@dataclass(frozen=True)
class Language:
    """One language as one dataset writes it.

    code: the dataset's code (``en``, ``zhs``, ``iw``); name: English name;
    nllb: NLLB-200 code (``heb_Hebr``); script: ISO 15924 (the NLLB suffix, ``Hebr``);
    lingua: ``lingua.Language`` member name, or None if lingua cannot detect it;
    lucene: Anserini/pyserini analyzer language; lucene_fallback: True when that is the
    ``"en"`` stand-in because Anserini has no analyzer for this language.
    """

    code: str
    name: str
    nllb: str
    script: str
    lingua: str | None
    lucene: str
    lucene_fallback: bool


# --------------------------------------------------------------------------------------
# Reference lists
# --------------------------------------------------------------------------------------

# The 202 language codes of NLLB-200 (facebook/nllb-200-*), in the model's order. Copied
# from transformers' models/nllb/tokenization_nllb.py FAIRSEQ_LANGUAGE_CODES (which is the
# fairseq/flores200 list); tests/unit/test_languages.py checks the two stay equal.
NLLB_200_CODES: frozenset[str] = frozenset(
    """
    ace_Arab ace_Latn acm_Arab acq_Arab aeb_Arab afr_Latn ajp_Arab aka_Latn amh_Ethi apc_Arab
    arb_Arab ars_Arab ary_Arab arz_Arab asm_Beng ast_Latn awa_Deva ayr_Latn azb_Arab azj_Latn
    bak_Cyrl bam_Latn ban_Latn bel_Cyrl bem_Latn ben_Beng bho_Deva bjn_Arab bjn_Latn bod_Tibt
    bos_Latn bug_Latn bul_Cyrl cat_Latn ceb_Latn ces_Latn cjk_Latn ckb_Arab crh_Latn cym_Latn
    dan_Latn deu_Latn dik_Latn dyu_Latn dzo_Tibt ell_Grek eng_Latn epo_Latn est_Latn eus_Latn
    ewe_Latn fao_Latn pes_Arab fij_Latn fin_Latn fon_Latn fra_Latn fur_Latn fuv_Latn gla_Latn
    gle_Latn glg_Latn grn_Latn guj_Gujr hat_Latn hau_Latn heb_Hebr hin_Deva hne_Deva hrv_Latn
    hun_Latn hye_Armn ibo_Latn ilo_Latn ind_Latn isl_Latn ita_Latn jav_Latn jpn_Jpan kab_Latn
    kac_Latn kam_Latn kan_Knda kas_Arab kas_Deva kat_Geor knc_Arab knc_Latn kaz_Cyrl kbp_Latn
    kea_Latn khm_Khmr kik_Latn kin_Latn kir_Cyrl kmb_Latn kon_Latn kor_Hang kmr_Latn lao_Laoo
    lvs_Latn lij_Latn lim_Latn lin_Latn lit_Latn lmo_Latn ltg_Latn ltz_Latn lua_Latn lug_Latn
    luo_Latn lus_Latn mag_Deva mai_Deva mal_Mlym mar_Deva min_Latn mkd_Cyrl plt_Latn mlt_Latn
    mni_Beng khk_Cyrl mos_Latn mri_Latn zsm_Latn mya_Mymr nld_Latn nno_Latn nob_Latn npi_Deva
    nso_Latn nus_Latn nya_Latn oci_Latn gaz_Latn ory_Orya pag_Latn pan_Guru pap_Latn pol_Latn
    por_Latn prs_Arab pbt_Arab quy_Latn ron_Latn run_Latn rus_Cyrl sag_Latn san_Deva sat_Beng
    scn_Latn shn_Mymr sin_Sinh slk_Latn slv_Latn smo_Latn sna_Latn snd_Arab som_Latn sot_Latn
    spa_Latn als_Latn srd_Latn srp_Cyrl ssw_Latn sun_Latn swe_Latn swh_Latn szl_Latn tam_Taml
    tat_Cyrl tel_Telu tgk_Cyrl tgl_Latn tha_Thai tir_Ethi taq_Latn taq_Tfng tpi_Latn tsn_Latn
    tso_Latn tuk_Latn tum_Latn tur_Latn twi_Latn tzm_Tfng uig_Arab ukr_Cyrl umb_Latn urd_Arab
    uzn_Latn vec_Latn vie_Latn war_Latn wol_Latn xho_Latn ydd_Hebr yor_Latn yue_Hant zho_Hans
    zho_Hant zul_Latn
    """.split()
)

# Anserini's language-specific analyzers: io.anserini.analysis.AnalyzerMap (the same list
# is hard-coded in SimpleSearcher.set_language, which pyserini's LuceneSearcher calls).
ANSERINI_ANALYZERS: dict[str, str] = {
    "ar": "ArabicAnalyzer",
    "bn": "BengaliAnalyzer",
    "da": "DanishAnalyzer",
    "de": "GermanAnalyzer",
    "es": "SpanishAnalyzer",
    "fa": "PersianAnalyzer",
    "fi": "FinnishAnalyzer",
    "fr": "FrenchAnalyzer",
    "hi": "HindiAnalyzer",
    "hu": "HungarianAnalyzer",
    "id": "IndonesianAnalyzer",
    "it": "ItalianAnalyzer",
    "ja": "JapaneseAnalyzer",
    "ko": "KoreanAnalyzer",
    "nl": "DutchAnalyzer",
    "no": "NorwegianAnalyzer",
    "pl": "MorfologikAnalyzer",
    "pt": "PortugueseAnalyzer",
    "ru": "RussianAnalyzer",
    "sv": "SwedishAnalyzer",
    "te": "TeluguAnalyzer",
    "th": "ThaiAnalyzer",
    "tr": "TurkishAnalyzer",
    "uk": "UkrainianMorfologikAnalyzer",
    "zh": "CJKAnalyzer",
}

# Languages Anserini analyzes with WhitespaceAnalyzer: IndexCollection/SearchCollection
# special-case ("ha", "so", "sw", "yo") and SimpleSearcher.set_language says "For Mr.TyDi: sw
# ... whitespace" and "Also use whitespace analyzer for ha, so, yo in CIRAL". The CIRAL
# regressions (ciral-v1.0-{ha,so,sw,yo}.yaml) and pyserini's ciral/miracl two-click matrices
# pass `-language ha|so|sw|yo`; MIRACL yo passes `--pretokenized`, the same analyzer.
ANSERINI_WHITESPACE: frozenset[str] = frozenset({"ha", "so", "sw", "yo"})

# "en" is Anserini's default (DefaultEnglishAnalyzer, Porter stemming); pyserini's MIRACL
# matrix passes `--language en` for English.
_LUCENE_ENGLISH = "en"


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------


def _lang(
    code: str, name: str, nllb: str, lingua: str | None, lucene: str | None = None
) -> Language:
    """A row; the script is NLLB's suffix, and Lucene falls back to "en" unless Anserini
    has an analyzer (or the whitespace rule) for the code or one is given explicitly."""
    if lucene is None:
        known = code in ANSERINI_ANALYZERS or code in ANSERINI_WHITESPACE or code == _LUCENE_ENGLISH
        lucene = code if known else _LUCENE_ENGLISH
        fallback = not known
    else:
        fallback = lucene == _LUCENE_ENGLISH and code != _LUCENE_ENGLISH
    return Language(
        code=code,
        name=name,
        nllb=nllb,
        script=nllb.split("_", 1)[1],
        lingua=lingua,
        lucene=lucene,
        lucene_fallback=fallback,
    )


_ROWS: list[Language] = [
    # --- Languages of XRAG, MIRACL/MIRAGE-Bench, Mr.TyDi, CIRAL, CLEF 2003, mLongRR. -------
    # Order matters only for reverse NLLB lookups: the first row with an NLLB code wins, so
    # the plain ISO 639-1 code ("zh") is listed before dataset-specific ones ("zhs").
    _lang("en", "English", "eng_Latn", "ENGLISH"),
    # XRAG/MIRACL/Mr.TyDi/BordIRLines Arabic is Modern Standard Arabic -> arb_Arab (NLLB's
    # other Arabic codes are dialects: arz Egyptian, ary Moroccan, apc Levantine, ...).
    _lang("ar", "Arabic", "arb_Arab", "ARABIC"),
    _lang("bn", "Bengali", "ben_Beng", "BENGALI"),  # countries_info.json calls it "Bangla"
    _lang("de", "German", "deu_Latn", "GERMAN"),
    _lang("es", "Spanish", "spa_Latn", "SPANISH"),
    # Iranian (Western) Persian -> pes_Arab. Afghanistan's Dari would be prs_Arab, but
    # BordIRLines uses "fa" for both countries, and MIRACL fa is Persian Wikipedia.
    _lang("fa", "Persian", "pes_Arab", "PERSIAN"),
    _lang("fi", "Finnish", "fin_Latn", "FINNISH"),
    _lang("fr", "French", "fra_Latn", "FRENCH"),
    _lang("hi", "Hindi", "hin_Deva", "HINDI"),
    _lang("id", "Indonesian", "ind_Latn", "INDONESIAN"),
    _lang("it", "Italian", "ita_Latn", "ITALIAN"),
    _lang("ja", "Japanese", "jpn_Jpan", "JAPANESE"),
    _lang("ko", "Korean", "kor_Hang", "KOREAN"),
    _lang("nl", "Dutch", "nld_Latn", "DUTCH"),
    _lang("pt", "Portuguese", "por_Latn", "PORTUGUESE"),
    _lang("ru", "Russian", "rus_Cyrl", "RUSSIAN"),
    _lang("sv", "Swedish", "swe_Latn", "SWEDISH"),
    # Swahili: NLLB has only the individual language Kiswahili, swh_Latn (not macro "swa").
    _lang("sw", "Swahili", "swh_Latn", "SWAHILI"),
    _lang("te", "Telugu", "tel_Telu", "TELUGU"),
    _lang("th", "Thai", "tha_Thai", "THAI"),
    _lang("vi", "Vietnamese", "vie_Latn", "VIETNAMESE"),
    _lang("yo", "Yoruba", "yor_Latn", "YORUBA"),
    # Hausa: lingua 2.x has no Hausa (no ha in its 75 languages).
    _lang("ha", "Hausa", "hau_Latn", None),
    _lang("so", "Somali", "som_Latn", "SOMALI"),
    # XRAG and MIRACL write Chinese as "zh": Simplified script -> zho_Hans. CJKAnalyzer
    # (bigrams) is script-agnostic; lingua has one CHINESE for both scripts.
    _lang("zh", "Chinese", "zho_Hans", "CHINESE"),
    # --- BordIRLines (queries/prompts.<code>, countries_info.json) -------------------------
    # BordIRLines splits Chinese by script: zhs = PRC (Simplified), zht = ROC (Traditional).
    _lang("zhs", "Chinese (Simplified)", "zho_Hans", "CHINESE", lucene="zh"),
    _lang("zht", "Chinese (Traditional)", "zho_Hant", "CHINESE", lucene="zh"),
    # BordIRLines writes Hebrew as "iw" (the pre-1989 ISO 639-1 code Google still uses).
    _lang("iw", "Hebrew", "heb_Hebr", "HEBREW"),
    # BordIRLines Azerbaijani is Azerbaijan's, in Latin script -> North Azerbaijani azj_Latn
    # (azb_Arab is Iranian South Azerbaijani). mLongRR calls it "Azeri".
    _lang("az", "Azerbaijani", "azj_Latn", "AZERBAIJANI"),
    _lang("bs", "Bosnian", "bos_Latn", "BOSNIAN"),
    _lang("da", "Danish", "dan_Latn", "DANISH"),
    _lang("el", "Greek", "ell_Grek", "GREEK"),
    _lang("hr", "Croatian", "hrv_Latn", "CROATIAN"),
    _lang("ht", "Haitian Creole", "hat_Latn", None),
    _lang("hy", "Armenian", "hye_Armn", "ARMENIAN"),
    _lang("is", "Icelandic", "isl_Latn", "ICELANDIC"),
    _lang("ka", "Georgian", "kat_Geor", "GEORGIAN"),
    _lang("km", "Khmer", "khm_Khmr", None),
    _lang("ky", "Kyrgyz", "kir_Cyrl", None),
    _lang("lo", "Lao", "lao_Laoo", None),
    # Malagasy: NLLB has only Plateau Malagasy, plt_Latn (the standard variety).
    _lang("mg", "Malagasy", "plt_Latn", None),
    # Mongolian (Mongolia, Cyrillic script) -> Halh Mongolian khk_Cyrl.
    _lang("mn", "Mongolian", "khk_Cyrl", "MONGOLIAN"),
    # Malay (Malaysia, Brunei) -> Standard Malay zsm_Latn. No Anserini analyzer; the
    # Indonesian one ("id") would be a closer stand-in than "en" but is not what Anserini does.
    _lang("ms", "Malay", "zsm_Latn", "MALAY"),
    _lang("my", "Burmese", "mya_Mymr", None),
    # Nepali -> npi_Deva (NLLB's individual-language code for Nepali).
    _lang("ne", "Nepali", "npi_Deva", None),
    _lang("sl", "Slovenian", "slv_Latn", "SLOVENE"),  # lingua spells it SLOVENE
    _lang("sn", "Shona", "sna_Latn", "SHONA"),
    # Albanian (Kosovo) -> Tosk Albanian als_Latn, NLLB's only Albanian.
    _lang("sq", "Albanian", "als_Latn", "ALBANIAN"),
    # BordIRLines Serbian prompts are in Cyrillic ("Да ли је ...") -> srp_Cyrl.
    _lang("sr", "Serbian", "srp_Cyrl", "SERBIAN"),
    _lang("tg", "Tajik", "tgk_Cyrl", None),
    _lang("ti", "Tigrinya", "tir_Ethi", None),
    # Amharic, the other Ethiopic-script language of the CROSS audit's real text (lingua 1.x
    # has no Amharic).
    _lang("am", "Amharic", "amh_Ethi", None),
    # BordIRLines/countries_info call it "Filipino" with code tl -> Tagalog tgl_Latn.
    _lang("tl", "Tagalog", "tgl_Latn", "TAGALOG"),
    _lang("tr", "Turkish", "tur_Latn", "TURKISH"),
    _lang("uk", "Ukrainian", "ukr_Cyrl", "UKRAINIAN"),
    _lang("ur", "Urdu", "urd_Arab", "URDU"),
    # BordIRLines Uzbek prompts are in Latin script -> Northern Uzbek uzn_Latn.
    _lang("uz", "Uzbek", "uzn_Latn", None),
    # --- countries_info.json languages with no BordIRLines query file ---------------------
    # (controllers/claimants whose language BorderLines did not translate into). Listed so
    # a country's language resolves; see UNSUPPORTED for the two NLLB lacks.
    _lang("dz", "Dzongkha", "dzo_Tibt", None),
    _lang("ro", "Romanian", "ron_Latn", "ROMANIAN"),
    _lang("rw", "Kinyarwanda", "kin_Latn", None),
]

LANGUAGES: dict[str, Language] = {}
for _row in _ROWS:
    if _row.code in LANGUAGES:
        raise RuntimeError(f"duplicate language code {_row.code!r} in {_WHERE}")
    LANGUAGES[_row.code] = _row
del _row

# Other spellings of codes in LANGUAGES (lower-case keys; lookups are case-insensitive).
ALIASES: dict[str, str] = {
    "he": "iw",  # current ISO 639-1 Hebrew; BordIRLines uses the old "iw"
    "in": "id",  # old ISO 639-1 Indonesian (same vintage as "iw")
    "zh-hans": "zh",
    "zh-cn": "zh",
    "zh-hant": "zht",
    "zh-tw": "zht",
    "fil": "tl",  # ISO 639-2 Filipino; countries_info.json names tl "Filipino"
}

# Codes that occur in the studies' data but that NLLB-200 cannot translate, with why.
UNSUPPORTED: dict[str, str] = {
    "mfe": "Morisyen (Mauritius in BordIRLines countries_info.json) has no NLLB-200 code "
    "and no BordIRLines query file",
    "to": "Tongan (Tonga in BordIRLines countries_info.json) has no NLLB-200 code "
    "and no BordIRLines query file",
}

# The languages each study uses, as its data writes them.
STUDY_LANGUAGES: dict[str, tuple[str, ...]] = {
    "xrag": ("en", "de", "es", "zh", "ar"),
    # The 49 query languages: shared/data/borderlines/queries/prompts.<code>.
    "bordirlines": (
        "ar", "az", "bn", "bs", "da", "el", "en", "es", "fa", "fr", "hi", "hr", "ht", "hy",
        "id", "is", "it", "iw", "ja", "ka", "km", "ko", "ky", "lo", "mg", "mn", "ms", "my",
        "ne", "nl", "pt", "ru", "sl", "sn", "so", "sq", "sr", "sw", "tg", "th", "ti", "tl",
        "tr", "uk", "ur", "uz", "vi", "zhs", "zht",
    ),  # fmt: skip
    # mLongRR paper: en vi id sw so; the PortNLP/mLongRR repo also ships Azeri and Chinese.
    "mlongrr": ("en", "sw", "vi", "id", "so", "az", "zh"),
    "mirage": (
        "ar", "bn", "de", "en", "es", "fa", "fi", "fr", "hi", "id", "ja", "ko", "ru", "sw",
        "te", "th", "yo", "zh",
    ),  # fmt: skip
    "mrtydi": ("ar", "bn", "en", "fi", "id", "ja", "ko", "ru", "sw", "te", "th"),
    "ciral": ("ha", "so", "sw", "yo", "en"),
    "clef2003": ("en", "de", "fi", "it", "ru", "fr", "es", "nl", "sv", "pt"),
}
STUDY_LANGUAGES["miracl"] = STUDY_LANGUAGES["mirage"]


# --------------------------------------------------------------------------------------
# Indexes for lookup
# --------------------------------------------------------------------------------------

_BY_NLLB: dict[str, str] = {}
for _l in LANGUAGES.values():
    _BY_NLLB.setdefault(_l.nllb, _l.code)

# English names (and a few other names the data uses), lower-cased. A name shared by
# several rows ("Chinese") goes to the first, i.e. the plain ISO code.
_BY_NAME: dict[str, str] = {}
for _l in LANGUAGES.values():
    _BY_NAME.setdefault(_l.name.lower(), _l.code)
del _l
_BY_NAME.update(
    {
        "azeri": "az",  # mLongRR: Azeri_needles.csv
        "bangla": "bn",  # countries_info.json
        "farsi": "fa",
        "filipino": "tl",  # countries_info.json
        "slovene": "sl",
        "kirghiz": "ky",
        "haitian": "ht",
        "myanmar": "my",
        "modern standard arabic": "ar",
        "simplified chinese": "zhs",
        "traditional chinese": "zht",
    }
)

_NLLB_RE = re.compile(r"([a-z]{3})[_-]([a-z]{4})")


def _resolve(code: object) -> str | None:
    """The LANGUAGES key for ``code``, or None."""
    if not isinstance(code, str):
        return None
    s = code.strip()
    if s in LANGUAGES:
        return s
    low = s.lower()
    if low in LANGUAGES:  # dataset codes are all lower case; "EN" (CLEF tags) is safe
        return low
    key = low.replace("_", "-")
    if key in ALIASES:
        return ALIASES[key]
    m = _NLLB_RE.fullmatch(low)
    if m:  # NLLB code, any case: "fin_Latn", "FIN_LATN", "fin-Latn"
        nllb = f"{m.group(1)}_{m.group(2).title()}"
        if nllb in _BY_NLLB:
            return _BY_NLLB[nllb]
    return _BY_NAME.get(" ".join(low.replace("_", " ").split()))


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


def _suggest(code: object, n: int = 3) -> list[str]:
    """Close matches among codes, aliases, NLLB codes and names (best first)."""
    if not isinstance(code, str) or not code.strip():
        return []
    word = code.strip().lower()
    candidates: dict[str, str] = {}  # lower-case form -> display form
    for c in LANGUAGES:
        candidates.setdefault(c, c)
    for a in ALIASES:
        candidates.setdefault(a, a)
    for nl in _BY_NLLB:
        candidates.setdefault(nl.lower(), nl)
    for name in _BY_NAME:
        candidates.setdefault(name, name.title())
    scored = []
    for i, (low, shown) in enumerate(candidates.items()):
        sm = difflib.SequenceMatcher(None, word, low)
        score = sm.ratio()
        if low[:1] == word[:1]:
            score += 0.1  # same first letter: "sx" -> "sw" before "ex"
        if len(low) == len(word):
            score += 0.05
        if score >= 0.6:
            scored.append((-score, i, shown))
    scored.sort()
    return [shown for _, _, shown in scored[:n]]


class UnknownLanguageError(ValueError):
    """A language code that is not in the table; the message lists every bad code, close
    matches for each, and where the table lives. ``codes`` holds the bad codes and
    ``suggestions`` maps each (a non-string by its ``repr``) to its close matches."""

    def __init__(self, codes: Iterable[object]):
        self.codes = list(codes)
        self.suggestions: dict[str, list[str]] = {}
        parts = []
        for c in self.codes:
            sugg = _suggest(c)
            self.suggestions[c if isinstance(c, str) else repr(c)] = sugg
            if isinstance(c, str) and c.strip().lower() in UNSUPPORTED:
                part = f"{c!r} ({UNSUPPORTED[c.strip().lower()]})"
            elif not isinstance(c, str):
                part = f"{c!r} (not a string)"
            elif sugg:
                part = f"{c!r} (did you mean {', '.join(repr(s) for s in sugg)}?)"
            else:
                part = f"{c!r} (no close match)"
            parts.append(part)
        n = len(parts)
        head = "Unknown language code" if n == 1 else f"{n} unknown language codes"
        msg = (
            f"{head}: {'; '.join(parts)}. Known languages are in {_WHERE}; "
            "dataset codes (e.g. 'en', 'zhs', 'iw'), aliases (e.g. 'he'), NLLB-200 codes "
            "(e.g. 'fin_Latn') and English names (e.g. 'Swahili') are accepted."
        )
        super().__init__(msg)


# --------------------------------------------------------------------------------------
# Public lookups
# --------------------------------------------------------------------------------------


def get_language(code: str) -> Language:
    """The :class:`Language` for a dataset code, alias, NLLB code or English name.

    Lookups ignore case and surrounding spaces. Raises :class:`UnknownLanguageError`.
    """
    key = _resolve(code)
    if key is None:
        raise UnknownLanguageError([code])
    return LANGUAGES[key]


def nllb_code(code: str) -> str:
    """NLLB-200 code (``"sw"`` -> ``"swh_Latn"``)."""
    return get_language(code).nllb


def lingua_language(code: str) -> str | None:
    """``lingua.Language`` member name (``"ENGLISH"``), or None if lingua lacks it."""
    return get_language(code).lingua


def lucene_language(code: str) -> str:
    """Anserini ``-language`` / pyserini ``--language`` value; see ``lucene_fallback``."""
    return get_language(code).lucene


def validate_languages(codes: Iterable[str]) -> list[Language]:
    """Resolve every code, in order; raise one :class:`UnknownLanguageError` naming all the
    bad ones. A single string is taken as one code, not as a sequence of letters."""
    if isinstance(codes, str):
        codes = [codes]
    out: list[Language] = []
    bad: list[object] = []
    for c in codes:
        key = _resolve(c)
        if key is None:
            bad.append(c)
        else:
            out.append(LANGUAGES[key])
    if bad:
        raise UnknownLanguageError(bad)
    return out


def _check_table() -> None:
    """Fail at import if an edit breaks the table's invariants (cheap, pure Python)."""
    problems = []
    for lang in LANGUAGES.values():
        if lang.nllb not in NLLB_200_CODES:
            problems.append(f"{lang.code}: {lang.nllb!r} is not an NLLB-200 code")
        if lang.code != lang.code.lower():
            problems.append(f"{lang.code}: dataset codes must be lower case")
        ok = lang.lucene in ANSERINI_ANALYZERS or lang.lucene in ANSERINI_WHITESPACE
        if not (ok or lang.lucene == _LUCENE_ENGLISH):
            problems.append(f"{lang.code}: Anserini has no analyzer for {lang.lucene!r}")
    for alias, target in ALIASES.items():
        if target not in LANGUAGES or alias in LANGUAGES or alias != alias.lower():
            problems.append(f"alias {alias!r} -> {target!r}")
    for study, codes in STUDY_LANGUAGES.items():
        problems += [f"{study}: {c!r} not in LANGUAGES" for c in codes if c not in LANGUAGES]
    problems += [f"UNSUPPORTED {c!r} is also in the table" for c in UNSUPPORTED if _resolve(c)]
    if problems:
        raise RuntimeError(f"Inconsistent language table in {_WHERE}: " + "; ".join(problems))


_check_table()
