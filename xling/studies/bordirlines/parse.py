"""BordIRLines' answer parsers (direct and citation outputs -> the chosen option and the
cited documents) and the mapping of a chosen option to a claimant of the territory."""

from __future__ import annotations

import re

from xling.studies.bordirlines.data import LETTERS, borderlines_of
from xling.studies.bordirlines.options import Options, split_setting

Parsed = tuple[dict | None, str | None]


def parser_for(setting: str) -> str:
    """The name of the parser of a setting's outputs (:meth:`BordIRLines.parsers`)."""
    _, prompt = split_setting(setting)
    return f"bordirlines_{prompt}"


_MARKUP_RE = re.compile(r"\*\*|__|`")


def _unmark(text: str) -> str:
    return _MARKUP_RE.sub("", text)


_CITED_RE = re.compile(r"cited\s+documents?\s*[:：]", re.IGNORECASE)
_CHOSEN_RE = re.compile(r"chosen\s+option\s*[:：]", re.IGNORECASE)
_EXPL_RE = re.compile(r"explanation\s*[:：]", re.IGNORECASE)
_DOCTAG_RE = re.compile(r"<\s*doc\s*(\d+(?:\s*,\s*\d+)*)\s*>", re.IGNORECASE)
_LABEL_RE = re.compile(r"^\s*(?:(?:final\s+)?answer|chosen\s+option|option|response)\s*[:：]\s*",
                       re.IGNORECASE)


def parse_direct(text: str | None) -> Parsed:
    """The chosen option of a direct-prompt output: its first non-empty line, without
    markdown and an ``Answer:``-style label (or the ``Chosen Option:`` line, if the model
    used the citation format). Mapping it to a claimant is :func:`map_option`'s job."""
    if text is None or not text.strip():
        return None, "empty output"
    body = _unmark(text)
    chosen = _CHOSEN_RE.search(body)
    if chosen:
        body = body[chosen.end():]
        body = _EXPL_RE.split(body, maxsplit=1)[0]
    for line in body.splitlines():
        line = _LABEL_RE.sub("", line).strip()
        if line:
            return {"option": " ".join(line.split())}, None
    return None, "no option in the output"


def _numbers(text: str) -> str:
    return ",".join(dict.fromkeys(str(int(n)) for n in re.findall(r"\d+", text)))


def parse_citation(text: str | None) -> Parsed:
    """A citation-prompt output -> ``{"cited", "option", "explanation", "cited_text"}``.

    ``cited``: the document ids after ``Cited Documents:`` (the prompt's comma-separated
    ``0, 3``, or tags ``<doc0> <doc3>`` or ``<doc0,3>`` -> ``"0,3"``; ids count from 0 as in
    the prompt); ``option``: the text after ``Chosen Option:`` (to the end
    of its line, or ``Explanation:``); ``explanation``: the rest after ``Explanation:``;
    ``cited_text``: the ``<docN>`` numbers used in the explanation. Labels are matched case-
    insensitively, with markdown emphasis removed. No ``Chosen Option:`` is an error.
    """
    if text is None or not text.strip():
        return None, "empty output"
    body = _unmark(text)
    chosen = _CHOSEN_RE.search(body)
    if not chosen:
        return None, "no 'Chosen Option:' in the output"
    rest = body[chosen.end():]
    explained = _EXPL_RE.search(rest)
    option_part = rest[: explained.start()] if explained else rest
    lines = [ln.strip() for ln in option_part.splitlines() if ln.strip()]
    option = " ".join(lines[0].split()) if lines else ""
    if not option:
        return None, "empty 'Chosen Option:' in the output"
    cited = ""
    cited_label = _CITED_RE.search(body)
    if cited_label:
        # up to the next label (normally Chosen Option), or a blank line
        segment = body[cited_label.end():]
        ends = [x.start() for x in (_CHOSEN_RE.search(segment), _EXPL_RE.search(segment)) if x]
        segment = segment[: min(ends)] if ends else segment
        cited = _numbers(segment.split("\n\n", 1)[0])
    explanation = rest[explained.end():].strip() if explained else ""
    cited_text = ",".join(dict.fromkeys(
        str(int(n)) for m in _DOCTAG_RE.finditer(explanation) for n in m.group(1).split(",")))
    return {"cited": cited, "option": option, "explanation": explanation,
            "cited_text": cited_text}, None


# --------------------------------------------------------------------------------------
# Mapping an answer to a claimant
# --------------------------------------------------------------------------------------


def _clean_option(text: str) -> str:
    text = _unmark(text).strip().strip("\"'“”«»")
    return " ".join(text.split())


_LEAD_LETTER_RE = re.compile(
    r"^(?:option\s*)?(?:[(（]\s*([A-Ha-h])\s*[)）]|\[\s*([A-Ha-h])\s*\]"
    r"|([A-Ha-h])\s*(?:[).:：）]|$))", re.IGNORECASE)
_ANY_LETTER_RE = re.compile(r"(?<![A-Za-z])([A-H])[)）]")
_OPTION_WORD_RE = re.compile(r"\boption\s*\(?([A-Ha-h])\b\)?", re.IGNORECASE)


def _spaced(ch: str) -> bool:
    """True for a letter or digit of the Latin, Greek, Cyrillic or Armenian scripts, where a
    name must match whole words ("Niger" not inside "Nigeria"). Elsewhere names match as
    substrings: Hebrew and Arabic attach prefixes to words, and Chinese, Thai... have no
    spaces; longest-first masking keeps "Sudan" from matching inside "South Sudan"."""
    return ch.isalnum() and ord(ch) < 0x0590


def _fold(text: str) -> str:
    """Case-folded, typographic apostrophes and dashes made plain."""
    return text.casefold().translate({0x2019: "'", 0x2018: "'", 0x02bc: "'", 0x2013: "-",
                                      0x2014: "-", 0x2010: "-"})


def _name_pattern(name: str) -> re.Pattern:
    left = r"(?<!\w)" if _spaced(name[0]) else ""
    right = r"(?!\w)" if _spaced(name[-1]) else ""
    return re.compile(left + re.escape(name) + right)


def _match_names(text: str, names: list[tuple[str, int]]) -> set[int]:
    """Claimant indexes whose names occur in ``text``; longer names first, each match masked,
    so "Republic of China" does not also match inside "People's Republic of China"."""
    haystack = _fold(text)
    found: set[int] = set()
    for name, index in sorted(names, key=lambda x: -len(x[0])):
        if not name:
            continue
        pattern = _name_pattern(_fold(name))
        if pattern.search(haystack):
            found.add(index)
            haystack = pattern.sub("\x00", haystack)
    return found


def map_option(option_text: str | None, lang: str, territory: str,
               opts: Options | None = None) -> str | None:
    """The canonical (English, table) claimant chosen by ``option_text``, or None.

    Accepted, in this order: a leading option letter (``B``, ``B)``, ``(b)``, ``[B]``,
    ``Option B``, ``B. Sudan``); the name of exactly one claimant, in ``lang``'s options
    for the territory or in English (case-insensitive; longest names first); a single
    ``X)`` letter or ``Option X`` anywhere. A letter beyond the options, several claimants,
    or nothing recognisable gives None.
    """
    if not option_text or not option_text.strip():
        return None
    borderlines = borderlines_of(opts)
    found_territory = borderlines.territory(territory)
    if found_territory is None:
        return None
    claimants = found_territory.claimants
    text = _clean_option(option_text)
    lead = _LEAD_LETTER_RE.match(text)
    if lead:
        index = LETTERS.index(next(g for g in lead.groups() if g).upper())
        if index < len(claimants):
            return claimants[index]
    names = [(c, i) for i, c in enumerate(claimants)]
    for names_in in (lang, "en"):  # the query language's options, then the English ones
        translated = borderlines.options(names_in, found_territory.name)
        if translated and len(translated) == len(claimants):
            names += [(c, i) for i, c in enumerate(translated)]
    found = _match_names(text, names)
    if len(found) == 1:
        return claimants[found.pop()]
    if found:
        return None
    letters = {x.upper() for x in _ANY_LETTER_RE.findall(text)}
    letters |= {x.upper() for x in _OPTION_WORD_RE.findall(text)}
    if len(letters) == 1:
        index = LETTERS.index(letters.pop())
        if index < len(claimants):
            return claimants[index]
    return None


