"""Parsing MIRAGE-Bench's model outputs: the RAG answer (``##Reason: … ##Answer: …`` with
``[docid]`` citations), the pointwise LLM judges' scores, and the pairwise judge's verdict;
the output parsers the generate and judge stages register."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from xling.studies.mirage.options import Knobs

# --------------------------------------------------------------------------------------
# Answers and citations (s1.4, s3.1, s3.3)
# --------------------------------------------------------------------------------------

_REF_REASON = re.compile(r"Reason(.*?)Answer:", re.S)
_REF_ANSWER = re.compile(r"Answer:(.*?)$", re.S)
_FIX_REASON = re.compile(r"#+\s*Reason\s*:?(.*?)(?=#+\s*Answer\b|\Z)", re.S | re.I)
_FIX_ANSWER = re.compile(r"#+\s*Answer\s*:?(.*)\Z", re.S | re.I)
BRACKET = re.compile(r"\[[^\]]*\]")


def answer_parts(text: str, knobs: Knobs = Knobs()) -> tuple[str, str, bool]:
    """``(reason, answer, format_ok)`` before per-feature cleaning. Reference: the dump's
    regexes (a missing part is ``""``; the dump crashed or left it unbound, s3.1)."""
    text = text or ""
    patterns = ((_REF_REASON, _REF_ANSWER) if knobs.ref("answer_parts")
                else (_FIX_REASON, _FIX_ANSWER))
    reason, answer = (pattern.search(text) for pattern in patterns)
    return (reason.group(1).strip() if reason else "", answer.group(1).strip() if answer else "",
            bool(reason and answer))


def first_paragraph(text: str) -> str:
    return text.strip().split("\n\n")[0].strip()


def unhash(text: str) -> str:
    # the dump removes every "##" and every ":" ("10:30" -> "1030"; s3.1)
    return text.replace("##", "").replace(":", "").strip()


def parse_rag_answer(text: str, knobs: Knobs = Knobs()) -> dict:
    """The generations parser: ``reason``, ``answer``, ``citations`` (every bracketed id in
    order of first appearance, unvalidated) and ``format_ok``. Never fails: an unformatted
    answer is data and scores low."""
    reason, answer, ok = answer_parts(text, knobs)
    if knobs.ref("answer_parts"):
        reason, answer = unhash(first_paragraph(reason)), unhash(first_paragraph(answer))
    ids = [i.strip() for group in BRACKET.findall(text or "") for i in group[1:-1].split(",")]
    return {"reason": reason, "answer": answer, "format_ok": ok,
            "citations": list(dict.fromkeys(i for i in ids if i))}


def bracket_ids(text: str, valid: Iterable[str], knobs: Knobs = Knobs()) -> list[str]:
    """Valid docids of every ``[...]`` group in order, duplicates kept. Reference: a group
    with a comma is split on "," without stripping, so ``[a, b]`` keeps only ``a``."""
    valid = set(valid)
    out = []
    for group in BRACKET.findall(text or ""):
        inner = group[1:-1]
        ids = inner.split(",") if "," in inner else [inner]
        if not knobs.ref("comma_citations"):
            ids = [i.strip() for i in ids]
        out += [i for i in ids if i in valid]
    return out


def cited_ids(output: str, qrels: Iterable[str], knobs: Knobs = Knobs()) -> list[str]:
    """The citations scored by MAP/Recall, in rank order. Reference: the first paragraph
    of the reason, then of the answer, duplicates kept (s3.3)."""
    if knobs.ref("citation_scope"):
        reason, answer, _ = answer_parts(output, replace(knobs, answer_parts="reference"))
        ids = (bracket_ids(first_paragraph(reason), qrels, knobs)
               + bracket_ids(first_paragraph(answer), qrels, knobs))
    else:
        ids = bracket_ids(output, qrels, knobs)
    return ids if knobs.ref("citation_ranking") else list(dict.fromkeys(ids))


def overlap_answer(output: str, knobs: Knobs = Knobs()) -> str:
    """The answer BLEU/ROUGE compare: citations removed (reference: first paragraph)."""
    answer = answer_parts(output, knobs)[1]
    if knobs.ref("answer_parts"):
        answer = first_paragraph(answer)
    return " ".join(BRACKET.sub("", answer).split())


def llm_answer(output: str) -> str:
    # s3.7: the dump's answer for the pointwise judges (first paragraph, ## and : removed)
    return unhash(first_paragraph(answer_parts(output, Knobs.reference())[1]))


def judge_answer(output: str, knobs: Knobs = Knobs()) -> str:
    """``Context: {reason} Answer: {answer}``, the answer text the pairwise and fluency
    judges see (s4.2). Reference: ``##``/``:`` removed, answer's first paragraph."""
    reason, answer, _ = answer_parts(output, knobs)
    if knobs.ref("answer_parts"):
        reason, answer = unhash(reason), unhash(first_paragraph(answer))
    return f"Context: {reason} Answer: {answer}"


# --------------------------------------------------------------------------------------
# The pointwise LLM judges' scores (s3.7, s3.8)
# --------------------------------------------------------------------------------------

def _to_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_llm_score(text: str, kind: str, knobs: Knobs = Knobs()) -> int | None:
    """``kind="score"`` (feature 10: ``Score: [[4]] Justification:``) or ``"rating"``
    (feature 11: ``##Rating: 4 ##Explanation:``). Reference: the dump's regex or 0 (s3.7,
    3.8); fixed: also ``[[n]]`` / a bare digit after the label, else None."""
    text = text or ""
    lenient = not knobs.ref("llm_parse_failure")
    if kind == "score":
        found = re.search(r"Score:(.*?)Justification:", text, re.S)
        value = _to_int(found.group(1).replace("[", "").replace("]", "")) if found else None
        if value is None and lenient:
            found = re.search(r"\[\[\s*([1-5])\s*\]\]", text)
            value = int(found.group(1)) if found else None
    else:
        found = re.search(r"Rating(.*?)Explanation:", text, re.S)
        value = _to_int(found.group(1).replace(":", "").replace("#", "")) if found else None
        if value is None and lenient:
            found = re.search(r"Rating\W*([1-5])\b", text)
            value = int(found.group(1)) if found else None
    return value if lenient else (0 if value is None else value)


# --------------------------------------------------------------------------------------
# The pairwise judge's verdicts (s4.4)
# --------------------------------------------------------------------------------------

_VERDICT_TOKEN = re.compile(r"\[\[\s*([ABC])\s*\]\]")


def parse_pairwise(text: str, knobs: Knobs = Knobs()) -> str | None:
    """``"A"``, ``"B"``, ``"tie"`` or None (unparsed). Reference: only the last 25
    characters, a later rule winning (tie over B over A; s4.4 item 2); fixed: the last
    ``[[A]]/[[B]]/[[C]]`` token anywhere."""
    text = text or ""
    if knobs.ref("pairwise_parse"):
        tail = text[-25:]
        for token, verdict in (("[[C]]", "tie"), ("[[B]]", "B"), ("[[A]]", "A")):
            if token in tail:
                return verdict
        return None
    found = _VERDICT_TOKEN.findall(text)
    return {"A": "A", "B": "B", "C": "tie"}[found[-1]] if found else None


def normalize_verdict(verdict) -> str | None:
    """A stored verdict (``"A"``, ``"B"``, ``"Tie"``/``"C"``, ``[[A]]``…) -> A / B / tie."""
    if not isinstance(verdict, str):
        return None
    text = verdict.strip().strip("[]").strip().lower()
    return {"a": "A", "b": "B", "c": "tie", "tie": "tie"}.get(text)


# --------------------------------------------------------------------------------------
# The parsers the stages register (Study.parsers)
# --------------------------------------------------------------------------------------

def parse_rag_output(text: str) -> tuple[dict | None, str | None]:
    """The generate stage's parser: reason, answer and cited ids in order. Never an error:
    an answer out of format is data (it scores low on the features)."""
    parsed = parse_rag_answer(text)
    return {k: (v if isinstance(v, str) else str(v)) for k, v in parsed.items()}, None


def parse_pair_verdict(text: str, compat: str = "fixed") -> tuple[dict | None, str | None]:
    """The judge stage's parser for pair prompts: verdict A / B / tie; nothing -> error."""
    knobs = Knobs.reference() if compat == "reference" else Knobs()
    verdict = parse_pairwise(text, knobs)
    return ({"verdict": verdict}, None) if verdict else (None, "no [[A]], [[B]] or [[C]] verdict")


def parse_pair_verdict_reference(text: str) -> tuple[dict | None, str | None]:
    """`parse_pair_verdict` with the reference rule (``pairwise_parse: reference``)."""
    return parse_pair_verdict(text, "reference")



def cited_sentences(gen: Mapping, lang: str) -> list[dict]:
    """The answer part of a generation (the parser's ``answer``, else the whole output) as
    sentences with the ids each cites (tasks/ragruns.cited_sentences), for the nuggets
    stage."""
    from xling.tasks.ragruns import cited_sentences as split

    return split(((gen.get("parsed") or {}).get("answer") or gen.get("output") or ""), lang)
