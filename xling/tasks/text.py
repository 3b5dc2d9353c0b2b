"""The multilingual text layer: sentences, word counts, digits and numbers, language ID.

Every study that cuts, counts or identifies text goes through here, so that one set of rules
serves every language of the five papers and each result can record which rules it used
(:func:`fingerprint`, ``LanguageID.fingerprint``).

* :func:`sentences` / :func:`sentence_spans`: sentencex (Wikimedia's rule-based segmenter,
  per-language abbreviations and terminators) plus xling's rules for what it misses:
  line breaks end a sentence; a full stop and a space between a lower-case word and a
  capital end one (sentencex's fallback English abbreviations miss "ewé kan. Ní", Yoruba);
  Burmese ends sentences at ။ only (sentencex also at the genitive ၏); a strong
  terminator of a non-Latin script (``。！？`` zh/ja, ``।`` Devanagari/Bengali, ``؟ ۔``
  Arabic script, ``។`` Khmer, ``။`` Burmese, ``።`` Ethiopic, ``։`` Armenian) ends one even
  with no space after it (closing quotes and reference marks ``[1]`` stay with it); a
  Latin-script full stop with no space before the next word (``end.Next``, scraped text) ends one unless it sits
  between digits (``4753820.5``), after a one-letter abbreviation (``U.S.``) or before a
  web or file suffix (``example.com``, ``a.pdf``); Thai and Lao, which mark sentences with
  spaces rather than punctuation, split at a space between two letters of the script (not
  at the spaces Thai sets around numbers and foreign words), and keep phrases whole: no cut
  inside brackets, before the repetition mark ๆ/ໆ, next to a connective (และ, หรือ, ซึ่ง,
  ...), and a unit of fewer than ten letters joins its neighbour. zh/ja text without
  punctuation is not split at spaces: scraped CJK text has spaces where markup was removed.
  Round two (``xling-text-2``): sentencex's cuts are kept only after a terminator (it also
  cuts before list markers, "of A) Russia or B) Japan?", in every language); in scripts
  without case, a full stop after a one-letter word or inside a chain of short ones is an
  abbreviation (Thai พ.ศ., Ethiopic ዓ.ም, Telugu చ.కి.మీ., Arabic ق.م, Khmer គ.ស.); Thai,
  Lao, Burmese and Ethiopic are cut by these rules alone (sentencex cuts พ.ศ. and ignores
  ።); Ethiopic ``፡፡`` (two word spaces, the typed full stop) ends a sentence; nothing is cut
  inside a CJK title ``《》〈〉``; a short speech tag after a closing quote (``。”她说。``,
  ``。」と言った。``) stays with the quote.
* :func:`count_units` / :func:`count_words`: whitespace words for scripts with word spaces,
  characters for those without (zh, ja, th, lo, km, my); :func:`word_unit` names the unit.
* :func:`normalize_digits` (every Unicode decimal digit to ASCII) and :func:`parse_number` /
  :func:`normalize_numerals` (also Chinese numerals, positional and digit by digit).
* :class:`LanguageID`: lingua (default) or langid.py (the MIRAGE paper's tool, a compat
  backend), over xling language codes, with the backend and its version in ``setting``.

Languages are looked up in :mod:`xling.tasks.languages`; an unknown code is an
:class:`~xling.tasks.languages.UnknownLanguageError`, never a silent fallback. Pure Python:
sentencex, lingua and langid are imported when first used.
"""

from __future__ import annotations

import bisect
import copy
import functools
import re
import unicodedata
from collections.abc import Sequence
from importlib.metadata import version

from xling.tasks.languages import Language, get_language

__all__ = [
    "LANGID_BACKENDS",
    "RULES",
    "LanguageID",
    "backend_version",
    "identifiable",
    "count_units",
    "count_words",
    "fingerprint",
    "normalize_digits",
    "normalize_numerals",
    "parse_number",
    "sentence_spans",
    "sentences",
    "word_unit",
]

# The version of xling's rules on top of sentencex; bump it when a rule changes results.
RULES = "xling-text-2"

# Scripts (ISO 15924, as in languages.Language.script) written without spaces between
# words: counted in characters. Thai and Lao also mark sentence ends with spaces.
NO_SPACE_SCRIPTS = frozenset({"Hans", "Hant", "Jpan", "Thai", "Laoo", "Khmr", "Mymr", "Tibt"})
SPACE_SENTENCE_SCRIPTS = frozenset({"Thai", "Laoo"})
CASED_SCRIPTS = frozenset({"Latn", "Cyrl", "Grek", "Armn"})

# Terminators that end a sentence whatever follows (none of them occurs inside a number or
# an abbreviation): CJK full stop / ! / ? (and halfwidth), danda and double danda, Arabic
# question mark, Urdu full stop, Khmer khan, Burmese section, Ethiopic full stop and
# question mark, Armenian full stop, Georgian paragraph separator.
_STRONG = "。！？｡।॥؟۔។။።፧։჻"
_CLOSERS = "\"'”’»」』）)]】》〉"
# Ethiopic: two word spaces (፡፡) are typed for the full stop ። (Amharic news text).
_ETHIOPIC_STOP = "፡፡"
# Closing quotes and brackets, and Wikipedia's reference marks ("।[1][4]"), stay with the
# sentence they close.
_STRONG_RE = re.compile(
    f"(?:[{_STRONG}]|{_ETHIOPIC_STOP})+(?:[{re.escape(_CLOSERS)}]|\\[[^\\]\\s]{{1,12}}\\])*"
    f"(?=\\s*[^\\s{re.escape(_CLOSERS)}\\[])")
# A Latin full stop (or ! ?) glued to the next word: "tahay.Waxaan", "4753820.haa". Not
# between digits (decimals) and not after a single letter ("U.S.", "e.g."): the match must
# follow two letters or a digit (checked in `_cuts`).
_GLUED_RE = re.compile(r"[.!?]+(?=[^\W\d_]{2})(?!(?:com|org|net|edu|gov|int|info|io|html?|pdf)\b)")
# A full stop (or ! ?) and a space between a lower-case word of three letters or more and a
# capital: "ewé kan. Ní" (Yoruba), where sentencex's fallback English abbreviations ("Kan.")
# keep the sentences together. Abbreviations are capitalised or shorter ("Dr.", "vs.").
_SPACED_RE = re.compile(r"[.!?]+\s+(?=[^\W\d_])")
# Both patterns start at the stop, so that re scans for it (most pieces hold one or two);
# what precedes it is checked per match, over the word before it only.
_LETTER = re.compile(r"[^\W\d_]")
_DIGIT = re.compile(r"\d")


def _word_before(piece: str, at: int) -> str:
    """The run of letters that ends at ``at``."""
    start = at
    while start > 0 and _LETTER.match(piece, start - 1):
        start -= 1
    return piece[start:at]


_CJK_CHAR = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
# Thai and Lao: a space between two letters of the script (not around digits, Latin words
# or brackets, which Thai also sets off with spaces).
_THAI_SPACE_RE = re.compile("(?<=[\u0e01-\u0e4e\u0e81-\u0ecd])\\s+(?=[\u0e01-\u0e4e\u0e81-\u0ecd])")
# Characters of the no-space scripts that count one unit each (CJK, kana, Thai, Lao,
# Khmer, Burmese, Tibetan blocks); combining marks are not counted.
_NO_SPACE_CHAR = re.compile(
    f"[{_CJK_CHAR}\u0e00-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\u0f00-\u0fff"
    "\U00020000-\U0002fa1f]")

# ISO 639-1 codes where the dataset code differs (sentencex and langid.py speak ISO 639-1).
_ISO = {"iw": "he", "zhs": "zh", "zht": "zh"}
# Languages whose sentencex rules xling replaces: sentencex's Burmese rules end a sentence at
# ၏, which is also the genitive marker ("of"); with its generic rules, ။ ends a sentence
# through xling's strong terminators.
_SENTENCEX_CODE = {"my": "en"}


def _lang(lang: str) -> Language:
    """The language table's row; raises UnknownLanguageError (a ValueError) with the fix."""
    return get_language(lang)


def iso_code(lang: str) -> str:
    """The ISO 639-1 code of a language (``iw`` -> ``he``, ``zhs`` -> ``zh``)."""
    code = _lang(lang).code
    return _ISO.get(code, code)


@functools.lru_cache(maxsize=1)
def _sentencex():
    from sentencex import segment

    return segment


def fingerprint() -> str:
    """Names the segmenter and the rules, e.g. ``sentencex-1.0.32+xling-text-2``."""
    return f"sentencex-{version('sentencex')}+{RULES}"


# Every rule's match above starts at one of these; a cut falls after it, inside the piece.
_STOP_RE = re.compile(f"[{_STRONG}.!?፡]")

# Scripts that xling cuts by its own rules alone: sentencex's Thai rules cut the era
# abbreviation (พ.ศ. -> พ. / ศ.) and its fallback knows neither ። nor ၊ from ။.
OWN_RULES_SCRIPTS = frozenset({"Thai", "Laoo", "Mymr", "Ethi"})
# What a sentencex piece must end with for its cut to stand (before closing quotes and
# reference marks): any script's full stop, ! or ?, the Armenian and Greek stops. sentencex
# also cuts before list markers ("territory of A) Russia or B) Japan?"), which end nothing.
_ENDS = f".!?…‼⁇⁈⁉．;:{_STRONG}፡"
_END_TAIL_RE = re.compile(rf"[{re.escape(_ENDS)}][{re.escape(_CLOSERS)}\s]*"
                          rf"(?:\[[^\]\s]{{1,12}}\])*[{re.escape(_CLOSERS)}\s]*$")
# Titles in CJK text: 《奔跑吧！梅勒斯》 is one name, whatever stops it holds.
_TITLE_RE = re.compile("《[^《》\n]{0,80}》|〈[^〈〉\n]{0,80}〉")
# A speech tag after a quote's closing mark: 。”她说。 / 。」と彼は言った。 (a unit that short
# is the attribution of the quote before it, not a sentence of its own).
_SPEECH_TAG_RE = re.compile(r"^[^\s。！？]{0,6}(?:说|說|道|问|問|称|稱|表示|指出|回答|と[^。！？]{0,8})"
                            r"[。！？]$|^と")
_QUOTE_CLOSERS = "”’」』\""

# Thai and Lao phrases: a space is no sentence end next to a connective ("and", "or",
# "which", "of", "is", ...), before the repetition mark, or inside brackets; a unit of
# fewer than this many letters (not counting marks) joins its neighbour.
_MIN_PHRASE = 10
_ABBREV_START = re.compile(r"[^\W\d_]{1,3}\.[^\W\d_]")  # "ปี พ.ศ. 2531": the era goes with it
_THAI_CONNECTIVES = ("และ", "หรือ", "แต่", "ซึ่ง", "ที่", "โดย", "เพื่อ", "คือ", "ของ", "กับ",
                     "ได้แก่", "เช่น", "อาทิ", "รวมทั้ง", "รวมถึง", "ตลอดจน", "จึง", "ก็", "ว่า",
                     "เป็น", "ให้", "อย่างไรก็ตาม", "ๆ",
                     "ແລະ", "ຫຼື", "ຫລື", "ແຕ່", "ຊຶ່ງ", "ເຊິ່ງ", "ທີ່", "ໂດຍ", "ເພື່ອ", "ຄື",
                     "ຂອງ", "ກັບ", "ເປັນ", "ວ່າ", "ຈຶ່ງ", "ກໍ", "ໆ")
_MARK = re.compile(r"[\u0300-\u036f\u0e31\u0e34-\u0e3a\u0e47-\u0e4e\u0eb1\u0eb4-\u0ebc\u0ec8-\u0ecd]")


def _cuts(piece: str, script: str) -> list[int]:
    """Offsets inside ``piece`` (one sentencex sentence) where xling's rules add a boundary."""
    if script not in SPACE_SENTENCE_SCRIPTS and not _STOP_RE.search(piece, 0, len(piece) - 1):
        return []  # no stop before the last character: most pieces, at a third of the cost
    return _rule_cuts(piece, script)


def _rule_cuts(piece: str, script: str) -> list[int]:
    """`_cuts` by the rules themselves, on any piece."""
    cuts = {m.end() for m in _STRONG_RE.finditer(piece)}
    if script in CASED_SCRIPTS:
        for m in _GLUED_RE.finditer(piece):
            at = m.start()
            if (at >= 1 and _DIGIT.match(piece, at - 1)) or (
                    at >= 2 and _LETTER.match(piece, at - 1) and _LETTER.match(piece, at - 2)):
                cuts.add(m.end())
        for m in _SPACED_RE.finditer(piece):
            word = _word_before(piece, m.start())
            if len(word) >= 3 and word.islower() and piece[m.end()].isupper():
                cuts.add(m.end())
    elif script in OWN_RULES_SCRIPTS:
        # no sentencex: ! and ? before a space end a sentence here too
        cuts |= {m.end() for m in re.finditer(r"[!?]+(?=\s)", piece)}
    if script in SPACE_SENTENCE_SCRIPTS:
        cuts |= {m.end() for m in _THAI_SPACE_RE.finditer(piece)}
    return sorted(c for c in cuts if 0 < c < len(piece))


def _base_letters(word: str) -> int:
    """Letters of a word, not counting combining marks (Telugu కి is one, Thai พ one)."""
    return sum(1 for c in word if unicodedata.category(c).startswith("L"))


def _word_at(text: str, end: int) -> tuple[int, str]:
    """The word (letters and marks) that ends at ``end``, with its start."""
    start = end
    while start > 0 and unicodedata.category(text[start - 1])[0] in "LM":
        start -= 1
    return start, text[start:end]


def _abbreviation(text: str, stop: int) -> bool:
    """Whether the full stop at ``stop`` (in a script without case) ends an abbreviation: a
    one-letter word (డా., د.), or a short word in a chain of them (พ.ศ., ዓ.ም, చ.కి.మీ.,
    ق.م., খ্রি. পূ.): it follows one ("ศ" of พ.ศ.) or another comes next."""
    start, word = _word_at(text, stop)
    n = _base_letters(word)
    if n == 0 or n > 3:
        return False
    if n == 1:
        return True
    if start > 0 and text[start - 1] == ".":
        return True
    after = re.match(r" ?([^\W\d_][^\s.]{0,5})\.", text[stop + 1:stop + 9])
    return bool(after and _base_letters(after.group(1)) <= 3)


def _stop_before(text: str, cut: int) -> int:
    """The position of the full stop a cut follows (over closers and spaces), or -1."""
    i = cut - 1
    while i >= 0 and (text[i].isspace() or text[i] in _CLOSERS):
        i -= 1
    return i if i >= 0 and text[i] == "." else -1


def _sentencex_pieces(body: str, iso: str) -> list[tuple[int, int]]:
    """sentencex's sentences of one line as (start, end) offsets, whitespace left out."""
    pieces, cursor = [], 0
    for piece in _sentencex()(iso, body):
        core = piece.strip()
        if not core:
            continue
        at = body.find(core, cursor)
        if at < 0:  # sentencex changed the text: a bug to surface, not to paper over
            raise RuntimeError(f"sentencex returned text not in the input: {core[:40]!r}")
        cursor = at + len(core)
        pieces.append((at, cursor))
    return pieces


def _line_cuts(body: str, language: Language) -> list[int]:
    """The sentence boundaries inside one line (offsets into it)."""
    script = language.script
    if script in OWN_RULES_SCRIPTS:
        pieces = [(0, len(body))]
    else:
        iso = _SENTENCEX_CODE.get(language.code, iso_code(language.code))
        pieces = _sentencex_pieces(body, iso)
    cuts = {b for a, b in pieces[:-1] if _END_TAIL_RE.search(body, a, b)}
    for a, b in pieces:
        cuts.update(a + c for c in _cuts(body[a:b], script))
    if script not in CASED_SCRIPTS:
        cuts = {c for c in cuts if (stop := _stop_before(body, c)) < 0
                or not _abbreviation(body, stop)}
    titles = [(m.start(), m.end()) for m in _TITLE_RE.finditer(body)]
    if titles:
        starts = [a for a, _ in titles]
        cuts = {c for c in cuts if not ((i := bisect.bisect_left(starts, c) - 1) >= 0
                                        and c < titles[i][1])}
    if script in SPACE_SENTENCE_SCRIPTS:
        cuts = _thai_phrases(body, cuts)
    return sorted(c for c in cuts if 0 < c < len(body))


def _bracket_depths(body: str) -> list[int]:
    depth, out = 0, []
    for ch in body:
        out.append(depth)
        depth = depth + 1 if ch in "([" else max(0, depth - 1) if ch in ")]" else depth
    return out


def _thai_phrases(body: str, cuts: set[int]) -> set[int]:
    """Thai and Lao cuts kept only between phrases (see ``_THAI_CONNECTIVES``)."""
    depth = _bracket_depths(body)
    kept = set()
    for c in cuts:
        # a window each side: the connectives are short, and a whole-line slice per cut
        # would cost a long line its length squared
        before, after = body[max(0, c - 40):c].rstrip(), body[c:c + 40].lstrip()
        if (depth[c] > 0 or after.startswith(_THAI_CONNECTIVES) or _ABBREV_START.match(after)
                or before.endswith(_THAI_CONNECTIVES)) and not _END_TAIL_RE.search(before):
            continue
        kept.add(c)
    # one pass: a short unit joins the next (the last one joins the one before it)
    bounds, start = [], 0
    for cut in sorted(kept):
        if _letters(body[start:cut]) >= _MIN_PHRASE:
            bounds.append(cut)
            start = cut
    if bounds and _letters(body[start:]) < _MIN_PHRASE:
        bounds.pop()
    return set(bounds)


def _letters(unit: str) -> int:
    """Characters of a Thai or Lao unit, not counting spaces and combining marks."""
    return sum(1 for ch in _MARK.sub("", unit) if not ch.isspace())


def _trimmed(text: str, start: int, end: int) -> tuple[int, int] | None:
    """(start, end) without surrounding whitespace; None when only whitespace is left."""
    chunk = text[start:end]
    stripped = chunk.strip()
    if not stripped:
        return None
    lead = len(chunk) - len(chunk.lstrip())
    return start + lead, start + lead + len(stripped)


def _speech_tag(text: str, prev: tuple[int, int], span: tuple[int, int], script: str) -> bool:
    """A CJK unit that is the speech tag of the quote the unit before it closes."""
    return (script in ("Hans", "Hant", "Jpan") and text[prev[1] - 1] in _QUOTE_CLOSERS
            and bool(_SPEECH_TAG_RE.search(text[span[0]:span[1]])))


def sentence_spans(text: str, lang: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of the sentences of ``text``, in order, without the
    whitespace between them (see the module docstring for the rules)."""
    language = _lang(lang)
    spans: list[tuple[int, int]] = []
    for line in re.finditer(r"[^\n]+", text or ""):  # a line break always ends a sentence
        offset, body = line.start(), line.group()
        bounds = [0, *_line_cuts(body, language), len(body)]
        line_spans: list[tuple[int, int]] = []
        for a, b in zip(bounds, bounds[1:]):
            span = _trimmed(text, offset + a, offset + b)
            if not span:
                continue
            if line_spans and _speech_tag(text, line_spans[-1], span, language.script):
                line_spans[-1] = (line_spans[-1][0], span[1])
            else:
                line_spans.append(span)
        spans += line_spans
    return spans


def sentences(text: str, lang: str) -> list[str]:
    """The sentences of ``text`` (see :func:`sentence_spans`)."""
    return [text[s:e] for s, e in sentence_spans(text, lang)]


# --------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------


def word_unit(lang: str) -> str:
    """``"characters"`` for languages written without word spaces (zh, ja, th, lo, km, my),
    else ``"words"`` (whitespace-separated tokens with a letter or digit)."""
    return "characters" if _lang(lang).script in NO_SPACE_SCRIPTS else "words"


def count_units(text: str, lang: str) -> tuple[int, str]:
    """(count, unit) of ``text``; unit as :func:`word_unit`. In ``characters`` each CJK,
    kana, Thai, Lao, Khmer, Burmese or Tibetan letter counts one (combining marks none) and
    a run of any other letters or digits ("GPT", "2024") counts one, as a word."""
    unit = word_unit(lang)
    text = text or ""
    if unit == "words":
        return sum(1 for t in text.split() if any(c.isalnum() for c in t)), unit
    n = 0
    for token in text.split():
        rest = _NO_SPACE_CHAR.sub(" ", token)
        n += sum(1 for c in _NO_SPACE_CHAR.findall(token)
                 if not unicodedata.category(c).startswith("M"))
        n += sum(1 for t in rest.split() if any(c.isalnum() for c in t))
    return n, unit


def count_words(text: str, lang: str) -> int:
    """The count of :func:`count_units` (its unit is :func:`word_unit`)."""
    return count_units(text, lang)[0]


# --------------------------------------------------------------------------------------
# Digits and numbers
# --------------------------------------------------------------------------------------


def normalize_digits(text: str) -> str:
    """Every Unicode decimal digit (category Nd: Arabic-Indic ٤, Persian ۴, Devanagari ४,
    Bengali ৪, Thai ๔, fullwidth ４, ...) becomes its ASCII digit; nothing else changes."""
    if not text:
        return ""
    return "".join(str(unicodedata.decimal(c)) if unicodedata.category(c) == "Nd" else c
                   for c in text)


_ZH_DIGITS = {"〇": 0, "零": 0, "一": 1, "壹": 1, "二": 2, "贰": 2, "貳": 2, "两": 2, "兩": 2,
              "三": 3, "叁": 3, "參": 3, "四": 4, "肆": 4, "五": 5, "伍": 5, "六": 6, "陆": 6,
              "陸": 6, "七": 7, "柒": 7, "八": 8, "捌": 8, "九": 9, "玖": 9}
_ZH_SMALL = {"十": 10, "拾": 10, "百": 100, "佰": 100, "千": 1000, "仟": 1000}
_ZH_BIG = {"万": 10**4, "萬": 10**4, "亿": 10**8, "億": 10**8}
_ZH_CHARS = "".join([*_ZH_DIGITS, *_ZH_SMALL, *_ZH_BIG])
_ZH_RUN = re.compile(f"[0-9{_ZH_CHARS}]*[{_ZH_CHARS}][0-9{_ZH_CHARS}]*")
# Separators dropped inside a written number: , . is not one (it is a decimal point).
_GROUPING = re.compile("(?<=[0-9])[,'\u2019\u066c\u060c \u00a0\u2007\u2009\u202f](?=[0-9]{3})")


def _chinese(s: str) -> int | None:
    """A Chinese numeral: digit by digit (四七五三八二〇) or positional
    (四百七十五万三千八百二十, 475万3820); None if it is neither."""
    tokens = re.findall(f"[0-9]+|[{_ZH_CHARS}]", s)
    if "".join(tokens) != s:
        return None
    if not any(t in _ZH_SMALL or t in _ZH_BIG for t in tokens):
        return int("".join(str(_ZH_DIGITS[t]) if t in _ZH_DIGITS else t for t in tokens))
    total = section = 0
    number: int | None = None
    for t in tokens:
        if t in _ZH_SMALL:
            section += (1 if number is None else number) * _ZH_SMALL[t]
            number = None
        elif t in _ZH_BIG:
            if t in ("亿", "億"):
                total = (total + section + (number or 0)) * _ZH_BIG[t]
            else:
                total += (section + (number or 0)) * _ZH_BIG[t]
            section, number = 0, None
        else:
            value = _ZH_DIGITS[t] if t in _ZH_DIGITS else int(t)
            if number not in (None, 0):
                return None  # two digits without a unit between them: not positional
            number = value
    return total + section + (number or 0)


def parse_number(text: str) -> int | None:
    """The integer a string writes, or None: any Unicode digits (with thousands separators:
    ``4,753,820``, ``۴٬۷۵۳٬۸۲۰``) or a Chinese numeral (``四百七十五万三千八百二十``,
    ``四七五三八二〇``). Decimals and other text are not integers: None."""
    s = _GROUPING.sub("", normalize_digits((text or "").strip()))
    if re.fullmatch(r"[0-9]+", s):
        return int(s)
    return _chinese(s) if s else None


def normalize_numerals(text: str) -> str:
    """:func:`normalize_digits`, then every Chinese numeral written out in ASCII digits
    (``数字是四百七十五万三千八百二十`` -> ``数字是4753820``); other text is unchanged."""
    out = normalize_digits(text)

    def repl(m: re.Match) -> str:
        value = _chinese(m.group())
        return m.group() if value is None else str(value)

    return _ZH_RUN.sub(repl, out)


# --------------------------------------------------------------------------------------
# Language identification
# --------------------------------------------------------------------------------------

LANGID_BACKENDS = ("lingua", "langid")

# Decimals kept of a backend's probabilities (lingua's last bits vary from call to call).
DECIMALS = 10


_BACKEND_PACKAGES = {"lingua": "lingua-language-detector", "langid": "langid"}


def backend_version(backend: str) -> str:
    """The installed version of a language-ID backend (for manifests, without loading it)."""
    if backend not in LANGID_BACKENDS:
        raise ValueError(f"unknown language-ID backend {backend!r}; use one of "
                         f"{list(LANGID_BACKENDS)}")
    return version(_BACKEND_PACKAGES[backend])


@functools.lru_cache(maxsize=1)
def _langid_identifier():
    """langid.py's identifier over all its languages, decoded once per process (its base64 +
    bz2 + pickle model string takes seconds). Each `LanguageID` takes a shallow copy:
    `set_languages` gives the copy new sliced arrays and never writes to the shared ones."""
    from langid.langid import LanguageIdentifier, model

    return LanguageIdentifier.from_modelstring(model, norm_probs=True)


def _langid_classes() -> frozenset[str]:
    return frozenset(_langid_identifier().nb_classes)


def identifiable(languages: Sequence[str], backend: str = "lingua") -> list[str]:
    """The codes among ``languages`` that ``backend`` can identify, in order (lingua: those
    with a lingua name in the language table; langid: those among langid.py's 97)."""
    backend_version(backend)  # an unknown backend is an error here too
    if backend == "lingua":
        return [c for c in languages if _lang(c).lingua is not None]
    return [c for c in languages if iso_code(c) in _langid_classes()]


class LanguageID:
    """Language identification over xling language codes, with the backend named.

    ``backend="lingua"`` (default): lingua restricted to ``languages`` (a short text is far
    less often mistaken for a related language). ``backend="langid"``: langid.py (Lui &
    Baldwin 2012, the tool the MIRAGE paper names), normalized probabilities
    (``norm_probs``); ``restrict=False`` keeps all of its 97 languages as candidates, as the
    off-the-shelf tool does, and reports the requested ones. A language the backend cannot
    identify is an error naming it. ``detect(texts)`` -> the code of each text (None for an
    empty one); ``probabilities(texts)`` -> ``{code: p}`` per text (None for an empty one).
    ``setting`` (a dict) and ``fingerprint`` (a string) name backend, version and languages.
    """

    def __init__(self, languages: Sequence[str], backend: str = "lingua", *,
                 restrict: bool = True, low_accuracy: bool = False):
        if backend not in LANGID_BACKENDS:
            raise ValueError(f"unknown language-ID backend {backend!r}; use one of "
                             f"{list(LANGID_BACKENDS)}")
        codes = list(dict.fromkeys(_lang(c).code for c in languages))
        if not codes:
            raise ValueError("LanguageID needs at least one language")
        self.backend, self.codes = backend, codes
        if backend == "lingua":
            self._init_lingua(codes, low_accuracy)
        else:
            self._init_langid(codes, restrict)
        self.fingerprint = (f"{backend}-{self.setting['version']}:"
                            f"{'restricted' if restrict else 'all'}:{','.join(sorted(codes))}")
        self.setting["fingerprint"] = self.fingerprint

    def _init_lingua(self, codes: list[str], low_accuracy: bool) -> None:
        from lingua import Language as Lingua, LanguageDetectorBuilder

        names = {c: _lang(c).lingua for c in codes}
        lacking = [c for c, n in names.items() if n is None]
        if lacking:
            raise ValueError(f"lingua cannot identify {lacking}; drop them from the languages "
                             "or use another backend")
        distinct = sorted(set(names.values()))
        if len(distinct) < 2:
            raise ValueError(f"lingua needs two candidate languages or more, got {codes}")
        builder = LanguageDetectorBuilder.from_languages(*(getattr(Lingua, n) for n in distinct))
        self._lingua = (builder.with_low_accuracy_mode() if low_accuracy else builder).build()
        self._back = {}
        for c, n in names.items():
            self._back.setdefault(n, c)  # zh and zhs share CHINESE: the first code wins
        self.setting = {"backend": "lingua", "version": version("lingua-language-detector"),
                        "languages": codes, "candidates": "restricted",
                        "mode": "low_accuracy" if low_accuracy else "high_accuracy"}

    def _init_langid(self, codes: list[str], restrict: bool) -> None:
        try:
            import langid  # noqa: F401
        except ImportError as e:  # pragma: no cover - langid is a dependency
            raise ValueError("backend 'langid' needs the langid package (pip install "
                             "langid)") from e
        identifier = copy.copy(_langid_identifier())
        iso = {c: iso_code(c) for c in codes}
        lacking = [c for c, i in iso.items() if i not in identifier.nb_classes]
        if lacking:
            raise ValueError(f"langid.py has no model for {lacking}; drop them or use "
                             "backend 'lingua'")
        if restrict:
            identifier.set_languages(sorted(set(iso.values())))
        self._langid, self._iso = identifier, iso
        self.setting = {"backend": "langid", "version": version("langid"),
                        "languages": codes, "candidates": "restricted" if restrict else "all",
                        "norm_probs": True}

    def probabilities(self, texts: Sequence[str | None]) -> list[dict[str, float] | None]:
        out: list[dict[str, float] | None] = [None] * len(texts)
        todo = [i for i, t in enumerate(texts) if t and t.strip()]
        if self.backend == "lingua":
            found = self._lingua.compute_language_confidence_values_in_parallel(
                [texts[i] for i in todo])
            for i, values in zip(todo, found):
                by_name = {v.language.name: float(v.value) for v in values}
                out[i] = {c: round(by_name.get(_lang(c).lingua, 0.0), DECIMALS)
                          for c in sorted(self.codes)}
            return out
        for i in todo:
            ranked = dict(self._langid.rank(texts[i]))
            out[i] = {c: round(float(ranked.get(self._iso[c], 0.0)), DECIMALS)
                      for c in sorted(self.codes)}
        return out

    def detect(self, texts: Sequence[str | None]) -> list[str | None]:
        """The most likely code per text; None for an empty text or when no candidate is
        likely (lingua) or the best is not one of ``languages`` (langid, unrestricted)."""
        if self.backend == "lingua":
            todo = [i for i, t in enumerate(texts) if t and t.strip()]
            found = self._lingua.detect_languages_in_parallel_of([texts[i] for i in todo])
            out: list[str | None] = [None] * len(texts)
            for i, lang in zip(todo, found):
                out[i] = self._back.get(lang.name) if lang is not None else None
            return out
        back = {i: c for c, i in reversed(list(self._iso.items()))}
        return [back.get(self._langid.classify(t)[0]) if t and t.strip() else None
                for t in texts]
