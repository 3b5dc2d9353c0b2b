"""Judge panels: verdict parsing, majority vote, the response-language check, agreement.

Shared by the studies that score free-form answers with a panel of LLM judges (XRAG uses
three judges and a majority vote, AND a check that the answer is in the expected language).
Pure Python; scikit-learn only for Cohen's kappa, imported when it is asked for.

Conventions (the evaluate stage and the study modules rely on them):

* A judge's output is a JSON object with a ``verdict`` (or, as XRAG's Figure 20 asks, an
  ``answer``) of ``"correct"`` or ``"incorrect"`` (:func:`parse_verdict`). An output that does not parse, or a judge call that failed, is a
  *missing* vote (``None``), never a vote either way.
* :func:`majority_vote` counts the valid votes only. ``correct`` needs a strict majority of
  them: **a tie is not correct** (one ``correct`` and one ``incorrect`` vote, with the third
  judge failed, is ``False``). No valid vote at all is ``(None, 0)``: the item is unscored,
  not wrong.
* :func:`language_ok` compares languages, not spellings: ``"zh"``, ``"zh-Hans"``,
  ``"CHINESE"`` (lingua's enum name) and ``"zho_Hans"`` are all Chinese; Simplified and
  Traditional Chinese count as the same language. An undetected language (``None``: lingua
  finds no letters in answers such as ``"42"`` or ``"2024"``) is not held against the
  answer.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from xling.tasks.languages import UnknownLanguageError, get_language

__all__ = ["VERDICTS", "cohen_kappa", "language_ok", "majority_vote", "normalize_verdict",
           "parse_verdict"]

VERDICTS = ("correct", "incorrect")
_FENCE = re.compile(r"```[a-zA-Z]*\s*|\s*```")


def normalize_verdict(value: Any) -> str | None:
    """``"Correct"``, ``" INCORRECT. "``, True/False -> ``"correct"``/``"incorrect"``;
    anything else -> None."""
    if isinstance(value, bool):
        return "correct" if value else "incorrect"
    if not isinstance(value, str):
        return None
    v = value.strip().strip(".!\"'`*[]").strip().lower()
    return v if v in VERDICTS else None


def _objects(text: str):
    """Candidate ``{...}`` substrings, outermost first, with balanced braces (braces inside
    quoted strings are skipped)."""
    i = text.find("{")
    while i != -1:
        depth, quote, esc = 0, None, False
        for j in range(i, len(text)):
            c = text[j]
            if quote:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    yield text[i:j + 1]
                    break
        else:
            # an unbalanced object (or an apostrophe in prose opened a "string"): try the
            # longest prefix ending at a closing brace, then move on
            k = text.rfind("}", i)
            if k > i:
                yield text[i:k + 1]
        i = text.find("{", i + 1)


def _load(candidate: str) -> Any:
    try:
        return json.loads(candidate)
    except ValueError:
        pass
    try:  # single quotes, True/False: a Python literal
        return ast.literal_eval(candidate)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None


def parse_verdict(text: str | None) -> tuple[dict | None, str | None]:
    """A judge's output -> (``{"verdict": "correct"|"incorrect"}`` plus ``"reason"`` when the
    judge gave one, as a string), or (None, why not). The dict is flat and string-valued:
    usable as a generations ``parsed`` value (tasks/parsers.py's contract).

    Tolerates ```` ```json ```` fences, prose around the object, single-quoted keys and
    values, and any case (``{"Verdict": "Correct"}``). The first object that has a
    ``verdict`` key (else ``answer``, XRAG's Figure 20 key, with ``justification`` as the
    reason) decides; a verdict other than correct/incorrect is an error, not a guess. Bare words without an object (``"Correct."``) are errors too: the prompt asks for
    JSON, and "incorrect" contains "correct".
    """
    if text is None:
        return None, "no judge output"
    if not isinstance(text, str):
        return None, f"judge output is {type(text).__name__}, not text"
    if not text.strip():
        return None, "empty judge output"
    body = _FENCE.sub("\n", text)
    seen_object = False
    for cand in _objects(body):
        obj = _load(cand)
        if not isinstance(obj, dict):
            continue
        seen_object = True
        keys = {str(k).strip().lower(): k for k in obj}
        # "verdict", or "answer" as in XRAG's judge prompt (xrag.txt L673-676, Figure 20)
        key = next((k for k in ("verdict", "answer") if k in keys), None)
        if key is None:
            continue
        raw = obj[keys[key]]
        if isinstance(raw, list) and len(raw) == 1:  # "answer": ["correct"], as templated
            raw = raw[0]
        verdict = normalize_verdict(raw)
        if verdict is None:
            return None, f"{key} must be 'correct' or 'incorrect', got {raw!r}"
        out = {"verdict": verdict}
        why = next((k for k in ("reason", "justification") if k in keys), None)
        reason = obj.get(keys[why]) if why else None
        if reason is not None:
            out["reason"] = reason if isinstance(reason, str) else json.dumps(reason)
        return out, None
    if seen_object:
        return None, "JSON object without a 'verdict' key (or XRAG's 'answer')"
    return None, "no JSON object in the judge output"


def majority_vote(verdicts: Sequence[str | bool | None]) -> tuple[bool | None, int]:
    """(correct?, number of valid votes). Votes are ``"correct"``/``"incorrect"`` (any case)
    or booleans; None and anything else are missing votes. Correct needs more than half of
    the valid votes; a tie is not correct; no valid vote -> (None, 0)."""
    valid = [v for v in (normalize_verdict(x) for x in verdicts) if v is not None]
    if not valid:
        return None, 0
    n_correct = sum(v == "correct" for v in valid)
    return 2 * n_correct > len(valid), len(valid)


def _language_key(code: Any) -> str | None:
    """A code's language, without script: ISO 639-3 from NLLB (``deu``, ``zho``, ``arb``);
    a code the table does not know falls back to its lower-cased primary subtag."""
    if code is None:
        return None
    c = str(code).strip()
    if not c:
        return None
    try:
        return get_language(c).nllb.split("_")[0]
    except UnknownLanguageError:
        return re.split(r"[-_]", c.lower())[0]


def language_ok(detected: str | None, expected: str) -> bool:
    """Is an answer detected as ``detected`` in the ``expected`` language?

    ``detected=None`` (nothing detected) is True: see the module docstring."""
    if _language_key(detected) is None:
        return True
    return _language_key(detected) == _language_key(expected)


def cohen_kappa(a: Sequence, b: Sequence) -> float:
    """Cohen's kappa of two raters' labels on the same items
    (``sklearn.metrics.cohen_kappa_score``; NaN when both raters give one and the same label
    to every item, where kappa is undefined)."""
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa: {len(a)} labels against {len(b)}; the two raters "
                         "must label the same items")
    if not a:
        raise ValueError("cohen_kappa: no labels")
    import warnings

    from sklearn.metrics import cohen_kappa_score

    with warnings.catch_warnings():  # the undefined case warns; NaN says it already
        warnings.simplefilter("ignore")
        return float(cohen_kappa_score(a, b))
