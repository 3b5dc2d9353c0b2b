"""xling/tasks/judge.py: verdict parsing, majority vote, language check, Cohen's kappa."""

import math

import pytest
from sklearn.metrics import cohen_kappa_score

from xling.tasks.judge import cohen_kappa, language_ok, majority_vote, parse_verdict


@pytest.mark.parametrize("text, verdict", [
    ('{"verdict": "correct"}', "correct"),
    ('  {"verdict":"incorrect", "reason": "wrong year"}\n', "incorrect"),
    ('```json\n{"verdict": "correct", "reason": "same number"}\n```', "correct"),
    ('```\n{"verdict": "incorrect"}\n```', "incorrect"),
    ('Let me compare. The model says 1250, the gold says 1250.\n'
     '{"verdict": "correct"}\nThat is my judgment.', "correct"),
    ("{'verdict': 'incorrect', 'reason': \"it's another city\"}", "incorrect"),
    ('{"Verdict": "CORRECT"}', "correct"),
    ('{"verdict": "Incorrect."}', "incorrect"),
    ('{"reason": "the {braces} in here", "verdict": "correct"}', "correct"),
    ('Here is one: {"note": "x"} and the verdict: {"verdict": "incorrect"}', "incorrect"),
])
def test_parse_verdict_accepts(text, verdict):
    parsed, err = parse_verdict(text)
    assert err is None
    assert parsed["verdict"] == verdict


def test_parse_verdict_output_is_flat_strings():
    parsed, err = parse_verdict('```json\n{"verdict": "incorrect", "Reason": "wrong year", '
                                '"confidence": 0.9}\n```')
    assert err is None and parsed == {"verdict": "incorrect", "reason": "wrong year"}
    parsed, _ = parse_verdict('{"verdict": "correct", "reason": ["a", "b"]}')
    assert parsed == {"verdict": "correct", "reason": '["a", "b"]'}


@pytest.mark.parametrize("text, why", [
    ("The answer is correct.", "no JSON object"),
    ("Correct", "no JSON object"),
    ("", "empty"),
    (None, "no judge output"),
    ('{"verdict": "partially correct"}', "verdict must be"),
    ('{"verdict": 1}', "verdict must be"),
    ('{"score": 5}', "without a 'verdict'"),
    ("{verdict: correct", "no JSON object"),
    ("asdf }{ qwer", "no JSON object"),
])
def test_parse_verdict_rejects(text, why):
    parsed, err = parse_verdict(text)
    assert parsed is None
    assert why in err


@pytest.mark.parametrize("votes, expected", [
    (["correct", None, "incorrect"], (False, 2)),      # a tie over the valid votes
    (["correct", None, "correct"], (True, 2)),
    (["correct", "incorrect", "correct"], (True, 3)),
    (["incorrect", "incorrect", "correct"], (False, 3)),
    (["Correct", "garbage", None], (True, 1)),         # unparseable = missing vote
    ([None, None, None], (None, 0)),
    ([], (None, 0)),
    ([True, False, True], (True, 3)),
])
def test_majority_vote(votes, expected):
    assert majority_vote(votes) == expected


@pytest.mark.parametrize("detected, expected, ok", [
    ("de", "de", True),
    ("en", "de", False),
    ("GERMAN", "de", True),         # lingua's enum name
    ("ENGLISH", "zh", False),
    ("zh-Hans", "zh", True),
    ("zht", "zh", True),            # Traditional Chinese is still Chinese
    ("arb_Arab", "ar", True),
    ("es", "en", False),
    (None, "de", True),             # nothing detected ("42"): not held against the answer
    ("", "ar", True),
    ("xx", "xx", True),             # codes outside the table compare as strings
    ("xx", "de", False),
])
def test_language_ok(detected, expected, ok):
    assert language_ok(detected, expected) is ok


def test_cohen_kappa_hand_computed_and_sklearn():
    a = [True, True, False, False]
    b = [True, False, False, False]
    # p_o = 3/4; p_e = 1/2 * 1/4 + 1/2 * 3/4 = 1/2; kappa = (3/4 - 1/2) / (1 - 1/2)
    assert cohen_kappa(a, b) == pytest.approx(0.5)
    a2 = ["correct", "incorrect", "correct", "correct", "incorrect", "correct"]
    b2 = ["correct", "correct", "correct", "incorrect", "incorrect", "correct"]
    assert cohen_kappa(a2, b2) == pytest.approx(cohen_kappa_score(a2, b2))
    assert math.isnan(cohen_kappa([True, True], [True, True]))  # undefined, not an error


def test_cohen_kappa_needs_paired_labels():
    with pytest.raises(ValueError, match="same items"):
        cohen_kappa([True], [True, False])
    with pytest.raises(ValueError, match="no labels"):
        cohen_kappa([], [])
