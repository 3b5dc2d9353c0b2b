"""Nugget evaluation's control flow and scores (xling/tasks/nuggets.py, nugget_scores.py)
against /work/shared/specs/nuggets.md: its worked examples (s6, s7.1, s8, R1) worked by hand,
the prompts byte for byte against castorini/nuggetizer@d00dc3e, windows, parsing and
retries (s11). The LLM here is a script: these are control-flow tests; the stage runs the
real engine in tests/integration/test_nugget_stage.py."""

from __future__ import annotations

import asyncio
import math

import pytest

from xling.tasks import nuggets as nz
from xling.tasks.nugget_scores import (argue_aggregate, argue_topic, kappa_per_label,
                                       kendall_tau, nugget_scores, run_scores, support_scores)


def run(coro):
    return asyncio.run(coro)


class Script:
    """An `ask` that answers from a function of (chat, attempt, temperature) and counts."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    async def __call__(self, chat, attempt, temperature):
        self.calls.append((chat, attempt, temperature))
        return nz.Reply(self.fn(chat, attempt, temperature))


# ---------------------------------------------------------------------------------------
# prompts (s11.1, s11.2)

CREATOR_USER = (
    "Update the list of atomic nuggets of information (1-12 words), if needed, so they best "
    "provide the information required for the query. Leverage only the initial list of "
    "nuggets (if exists) and the provided context (this is an iterative process).  Return "
    "only the final list of all nuggets in a Pythonic list format (even if no updates). Make "
    "sure there is no redundant information. Ensure the updated nugget list has at most 30 "
    "nuggets (can be less), keeping only the most vital ones. Order them in decreasing order "
    "of importance. Prefer nuggets that provide more interesting information.\n\n"
    "Search Query: q?\nContext:\n[1] d1\n[2] d2\nSearch Query: q?\n"
    "Initial Nugget List: ['a', \"b's\"]\nInitial Nugget List Length: 2\n\n"
    "Only update the list of atomic nuggets (if needed, else return as is). Do not explain. "
    "Always answer in short nuggets (not questions). List in the form [\"a\", \"b\", ...] and "
    "a and b are strings with no mention of \".\nUpdated Nugget List:")


def test_creator_prompt_is_the_reference_byte_for_byte():
    chat = nz.messages("creator", query="q?", context="[1] d1\n[2] d2", nuggets=["a", "b's"],
                       nuggets_length=2, creator_max_nuggets=nz.PROMPT_CAP)
    assert chat[0] == {"role": "system", "content": (
        "You are NuggetizeLLM, an intelligent assistant that can update a list of atomic "
        "nuggets to best provide all the information required for the query.")}
    assert chat[1]["content"] == CREATOR_USER


def test_scorer_and_assigner_prompts_end_as_the_reference():
    s = nz.messages("scorer", query="q", nuggets=["x"], num_nuggets=1)[1]["content"]
    assert 'must be present in a "good" answer' in s  # straight quotes since 0f7c889 (D4)
    assert s.endswith("Nugget List: ['x']\n\nOnly return the list of labels (List[str]). "
                      "Do not explain.\nLabels:")
    a3 = nz.messages("assigner", query="q", context="ans", nuggets=["x"], num_nuggets=1)
    a2 = nz.messages("assigner_2grade", query="q", context="ans", nuggets=["x"], num_nuggets=1)
    assert a3[0] == a2[0]
    assert "support, partial_support, or not_support" in a3[1]["content"]
    assert "either as support or not_support" in a2[1]["content"]
    assert a3[1]["content"].endswith("Passage: ans\nNugget List: ['x']\nOnly return the list "
                                     "of labels (List[str]). Do not explain.\nLabels:")


def test_support_prompt_keeps_its_newlines_and_trailing_spaces():
    chat = nz.messages("support_trec24", statement="S.", citation="T: seg")
    assert len(chat) == 1 and chat[0]["role"] == "user"
    text = chat[0]["content"]
    assert text.startswith("\nIn this task, you will evaluate whether each statement is "
                           "supported by its corresponding citations. \nNote that")
    assert text.endswith("\n\nStatement: S.\n\nCitation: T: seg\n\nResponse:\n")
    assert text.count(" \n") == 3
    att = nz.messages("attest_argue", sentence="s", document="d")[0]["content"]
    assert att.endswith("Sentence: s\nDocument: d\nAnswer (YES/NO):")


# ---------------------------------------------------------------------------------------
# windows, parsing, retries (s11.3-s11.6)


def test_windows():
    assert nz.windows(25, 10) == [(0, 10), (10, 20), (20, 25)]
    assert [e - s for s, e in nz.windows(23, 10)] == [10, 10, 3]
    assert nz.windows(0, 10) == []


@pytest.mark.parametrize("reply,n,want", [
    ("```python\n['a', 'b']\n```", None, ["a", "b"]),
    ('["vital", "okay"]', 2, ["vital", "okay"]),
])
def test_parse_list(reply, n, want):
    assert nz.parse_list(reply, n) == (want, None)


@pytest.mark.parametrize("reply,n", [("Here are the nuggets: a, b", None), ("'abc'", None),
                                     ("['a', 1]", None), ("['vital']", 2), ("", None)])
def test_parse_list_failures(reply, n):
    value, why = nz.parse_list(reply, n)
    assert value is None and why


def test_creation_replaces_the_list_per_window_and_caps_it():
    seen = []

    def fn(chat, attempt, temperature):
        user = chat[1]["content"]
        seen.append(user)
        first = user.split("Context:\n")[1].split("\n")[0]  # numbering restarts at [1]
        return repr([f"n{len(seen)}-{i}" for i in range(40)] if len(seen) == 1
                    else [first, "kept"])

    ask = Script(fn)
    out = run(nz.create(ask, "q", [f"d{i}" for i in range(25)], nz.Knobs(), nz.Trace()))
    assert out == ["[1] d20", "kept"]  # the last window's reply, not an append
    assert len(ask.calls) == 3
    assert "Initial Nugget List Length: 30" in seen[1]  # capped at 30 after window 1
    assert "[1] d10" in seen[1] and "[11]" not in seen[1]


def test_retries_switch_to_0_2_and_stop_at_max_tries():
    ask = Script(lambda chat, attempt, t: "I cannot do that." if attempt < 2 else "['x']")
    trace = nz.Trace()
    assert run(nz.create(ask, "q", ["d"], nz.Knobs(), trace)) == ["x"]
    assert [(c[1], c[2]) for c in ask.calls] == [(0, None), (1, 0.2), (2, 0.2)]
    assert [c["attempt"] for c in trace.calls] == [0, 1, 2]
    never = Script(lambda *a: "prose")
    with pytest.raises(nz.Failed, match="no parseable reply in 5 tries"):
        run(nz.create(never, "q", ["d"], nz.Knobs(max_tries=5), nz.Trace()))
    assert len(never.calls) == 5  # the 6th attempt never happens


def test_a_failed_call_is_an_error_not_the_previous_list():
    async def ask(chat, attempt, t):
        return nz.Reply(None, error="HTTP 500")

    with pytest.raises(nz.Failed, match="the LLM call failed: HTTP 500"):
        run(nz.create(ask, "q", ["d"], nz.Knobs(), nz.Trace()))


def test_scoring_windows_strict_count_and_paper_selection():
    def fn(chat, attempt, t):
        n = int(chat[1]["content"].split("label each of the ")[1].split()[0])
        if attempt == 0 and n == 3:
            return "['vital']"  # too few labels: retried (strict zip)
        return repr(["Vital" if i % 2 else "okay" for i in range(n)])

    ask = Script(fn)
    nuggets = [f"n{i}" for i in range(23)]
    out = run(nz.score(ask, "q", nuggets, nz.Knobs(), nz.Trace()))
    assert [o["text"] for o in out] == nuggets and out[1]["importance"] == "vital"
    assert len(ask.calls) == 4  # windows 10, 10, 3 (+1 retry)
    paper = nz.select(out, nz.Knobs(compat="paper"))
    assert len(paper) == 20 and [p["text"] for p in paper[:3]] == ["n1", "n3", "n5"]
    assert all(p["importance"] == "vital" for p in paper[:11])


def test_assignment_failed_window_keeps_failed_labels_and_an_error():
    nuggets = [{"text": f"n{i}", "importance": "vital"} for i in range(12)]

    def fn(chat, attempt, t):
        n = int(chat[1]["content"].split("label each of the ")[1].split()[0])
        return "nope" if n == 2 else repr(["Support"] * n)

    out, error = run(nz.assign(Script(fn), "q", "ans", nuggets, nz.Knobs(max_tries=3),
                               nz.Trace()))
    assert [o["assignment"] for o in out] == ["support"] * 10 + ["failed"] * 2
    assert "assign window 10-12: no parseable reply in 3 tries" in error
    assert nugget_scores(out)["A"] == 10 / 12  # failed stays in the denominator (D7)


def test_support_judging_max_three_citations_and_label_precedence():
    replies = iter(["Partial Support, not full support", "No Support.", "Full Support",
                    "unsure"])
    ask = Script(lambda *a: next(replies))
    sents = [{"text": "S1", "citations": ["d1", "d2", "d3", "d4"]},
             {"text": "S2", "citations": ["d1"]}, {"text": "S3", "citations": []}]
    docs = {f"d{i}": {"title": "T", "text": f"seg{i}"} for i in range(1, 5)}
    out = run(nz.support(ask, sents, docs, nz.Knobs(), nz.Trace(), argue=False))
    assert [(o["sentence"], o["docid"], o["label"]) for o in out] == [
        (0, "d1", "FS"), (0, "d2", "NS"), (0, "d3", "FS"), (1, "d1", None)]
    assert all(c[2] == 0.1 for c in ask.calls) and len(ask.calls) == 4
    assert ask.calls[0][0][0]["content"].endswith("Citation: T: seg1\n\nResponse:\n")
    assert support_scores(out, 3)["unparsed"] == 1


# ---------------------------------------------------------------------------------------
# scores: the spec's worked examples by hand


def test_nugget_scores_worked_example_s6():
    ns = [("vital", "support"), ("vital", "partial_support"), ("vital", "not_support"),
          ("okay", "support"), ("okay", "partial_support")]
    s = nugget_scores([{"importance": i, "assignment": a} for i, a in ns])
    # V_strict 1/3; V 1.5/3; A_strict 2/5; A 3/5; W (1.5+0.5*1.5)/(3+0.5*2); W_strict 1.5/4
    assert s == pytest.approx({"V_strict": 1 / 3, "V": 0.5, "A_strict": 0.4, "A": 0.6,
                               "W": 0.5625, "W_strict": 0.375})


def test_nugget_scores_edge_labels():
    s = nugget_scores([{"importance": "okay", "assignment": "support"},
                       {"importance": "vital.", "assignment": "support"}])
    assert s["V"] == s["V_strict"] == 0.0  # no vital nugget: 0.0, not NaN
    assert s["A"] == 1.0  # "vital." is in A, in neither V nor O
    assert s["W"] == 1.0  # (0 + 0.5*1)/(0 + 0.5*1)


def test_run_scores_present_and_official_topics():
    per = {"1": dict.fromkeys(("A_strict", "V_strict", "A", "V", "W", "W_strict"), 0.6),
           "2": dict.fromkeys(("A_strict", "V_strict", "A", "V", "W", "W_strict"), 0.2)}
    out = run_scores(per, topics=["1", "2", "3", "4"])
    assert out["present"]["A"] == pytest.approx(0.4)  # NZ: mean over records present
    assert out["all_topics"]["A"] == pytest.approx(0.2)  # (0.6+0.2+0+0)/4


def test_support_scores_worked_example_s7_1():
    j = [{"sentence": 0, "docid": "d1", "label": "FS"}, {"sentence": 0, "docid": "d2",
         "label": "PS"}, {"sentence": 1, "docid": "d1", "label": "NS"}]
    s = support_scores(j, n_sentences=3)
    assert s["pair_mean"] == pytest.approx(0.5)  # (1+0.5+0)/3
    assert s["precision"] == pytest.approx(0.5)  # mean(d1 (1+0)/2, d2 0.5)
    assert s["recall"] == pytest.approx(0.25)  # mean(0.75, 0, 0)
    assert s["f1"] == pytest.approx(1 / 3)


def _r1_topics():
    """argue-viz's example-report.scores.tsv (19 NeuCLIR-2024 topics): the per-topic counts
    are in tests/data/nuggets/argue_r1.tsv (provenance in tests/data/README.md)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "nuggets" / "argue_r1.tsv"
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if line]
    return {r[0]: {"sentences": int(r[1]), "correct_sentences": int(r[2]),
                   "nuggets": int(r[3]), "correct_nuggets": int(r[4])} for r in rows}


def test_argue_aggregates_reproduce_r1():
    topics = _r1_topics()
    assert len(topics) == 19
    agg = argue_aggregate(topics)
    assert agg["sentence_support_micro"] == pytest.approx(251 / 263, abs=1e-9)
    assert agg["nugget_coverage_micro"] == pytest.approx(193 / 266, abs=1e-9)
    assert agg["sentence_support_macro"] == pytest.approx(0.9549052, abs=5e-8)
    assert agg["nugget_coverage_macro"] == pytest.approx(0.7159860, abs=5e-8)
    assert agg["f1_micro"] == pytest.approx(0.8243863, abs=5e-8)
    assert agg["f1_macro"] == pytest.approx(0.8108728, abs=5e-8)  # mean of per-topic F1
    ss, nc = agg["sentence_support_macro"], agg["nugget_coverage_macro"]
    assert 2 * ss * nc / (ss + nc) == pytest.approx(0.8183642, abs=5e-8)  # not this
    t300 = argue_topic(topics["300"])
    assert (topics["300"]["correct_sentences"], topics["300"]["sentences"]) == (14, 15)
    assert t300["f1"] == pytest.approx(0.7304348, abs=5e-8)  # 14/15 and 9/15


def test_sentence_support_needs_every_citation():
    from xling.tasks.nugget_scores import argue_counts

    sents = [{"citations": ["a", "b"]}, {"citations": ["a"]}, {"citations": []}]
    att = [{"sentence": 0, "label": True}, {"sentence": 0, "label": False},
           {"sentence": 1, "label": True}]
    c = argue_counts(sents, att, [{"assignment": "support"}, {"assignment": "partial_support"}])
    assert (c["sentences"], c["correct_sentences"]) == (2, 1)
    assert (c["nuggets"], c["correct_nuggets"]) == (2, 1)


def test_kendall_tau_worked_example_s8():
    t = kendall_tau([0.50, 0.40, 0.30, 0.20], [0.45, 0.35, 0.40, 0.10])
    assert t["tau_b"] == pytest.approx(4 / 6) and t["tau_a"] == pytest.approx(4 / 6)
    tied = kendall_tau([0.5, 0.4, 0.4, 0.2], [0.45, 0.35, 0.40, 0.10])
    assert tied["tau_b"] == pytest.approx(5 / math.sqrt(5 * 6), abs=1e-4)  # 0.9129
    assert tied["tau_a"] == pytest.approx(5 / 6, abs=1e-3)  # 0.833


def test_kappa_per_label_against_sklearn():
    from sklearn.metrics import cohen_kappa_score

    auto = ["support", "not_support", "support", "partial_support", "support"]
    human = ["support", "not_support", "not_support", "partial_support", "support"]
    k = kappa_per_label(auto, human)
    assert k["all"] == pytest.approx(cohen_kappa_score(auto, human))
    assert k["support"] == pytest.approx(cohen_kappa_score(
        [a == "support" for a in auto], [h == "support" for h in human]))


# ---------------------------------------------------------------------------------------
# RAGTIME run files (spec s2.3, s11.16)


def test_ragtime_line_passes_the_checker_and_broken_lines_do_not():
    import json

    from xling.tasks.ragruns import check_ragtime, ragtime_line

    good = ragtime_line("t", "r", "300", [{"text": "Sky is blue.", "citations": ["d1"]},
                                          {"text": "Всё.", "citations": []}])
    assert good["references"] == ["d1"]
    assert check_ragtime([json.dumps(good)]) == []
    conf = {**good, "responses": [{"text": "Sky is blue.", "citations": {"d1": 0.3}}]}
    assert check_ragtime([json.dumps(conf)]) == []
    assert "not the cited ids" in check_ragtime([json.dumps({**good, "references": []})])[0]
    long = ragtime_line("t", "r", "301", [{"text": "ｘ" * 30, "citations": []}])  # NFKC: x
    assert check_ragtime([json.dumps(long)], {"301": 30}) == []
    assert "over topic 301's limit 29" in check_ragtime([json.dumps(long)], {"301": 29})[0]
    assert "more than one line" in check_ragtime([json.dumps(good)] * 2)[0]
    bad = {**good, "responses": [{"text": "x", "citations": {"d1": 101}}]}
    assert "not in [0, 100]" in check_ragtime([json.dumps(bad)])[0]
    assert "metadata" in check_ragtime(['{"responses": []}'])[0]


def test_agreement_with_qrels_kappa_and_tau():
    """Three systems on one topic set: the judge's support of each cited document against
    its qrel (kappa), and the systems' support precision against their relevant-citation
    share (tau), worked by hand."""
    import json

    from sklearn.metrics import cohen_kappa_score

    from xling.tasks.nugget_report import agreement

    def row(system, judged):
        sup = [{"sentence": 0, "docid": f"d{i}", "label": lab, "human": h}
               for i, (lab, h) in enumerate(judged)]
        return {"study": "s", "setting": "rag", "lang": "sw", "system": system, "error": None,
                "support": json.dumps(sup),
                "sentences": json.dumps([{"text": "x", "citations": [j["docid"] for j in sup]}])}

    rows = [row("a", [("FS", 1), ("FS", 1)]), row("b", [("FS", 1), ("NS", 0)]),
            row("c", [("PS", 0), ("NS", 0)])]
    [a] = agreement(rows)
    auto = [True, True, True, False, True, False]
    human = [True, True, True, False, False, False]
    assert a["pairs"] == 6
    assert a["kappa_support"] == pytest.approx(cohen_kappa_score(auto, human))
    assert a["kappa_full"] == pytest.approx(1.0)  # FS exactly where the qrels say relevant
    # support precision a 1.0, b 0.5, c 0.25; relevant share a 1.0, b 0.5, c 0.0: same order
    assert (a["tau_b"], a["tau_a"], a["runs"]) == (pytest.approx(1.0), pytest.approx(1.0), 3)


# ---------------------------------------------------------------------------------------
# studies as nugget inputs (Cited)


def test_ragtime_study_prompts_topics_and_answers():
    from xling.studies.base import StudyInputs
    from xling.studies.registry import get_study

    study = get_study("ragtime")
    opts = study.validate_options({
        "requests": "data/demo/topics/topics.known-item-en-{doc_lang}.tsv",
        "doc_langs": ["ru", "sw"], "run": "rrf", "topics": "known-item-en", "k": 2})
    docs = {"ru-1": [{"docid": "7#0", "doc_lang": "ru", "title": None, "text": "Vilnius  is\n"
                      "the capital.", "judgment": 1}]}
    rows = study.build_prompts(opts, "report", "en", inputs=StudyInputs(retrieved=docs))
    assert [r["item_id"] for r in rows][:2] == ["ru-1", "ru-2"] and len(rows) == 8
    ru1 = rows[0]["prompt"][0]["content"]
    assert "Request: The capital of the country is Vilnius." in ru1
    assert "Documents:\n[7#0] Vilnius is the capital.\n\nReport:" in ru1
    assert rows[1]["prompt"] is None and rows[1]["error"] == "the run found no document"
    topics = study.nugget_topics(opts, "en", StudyInputs(retrieved=docs))
    assert topics[0]["documents"] == docs["ru-1"] and topics[1]["documents"] == []
    gen = {"lang": "en", "output": "Vilnius is the capital [7#0]. It is old [7#0, 7#1].",
           "parsed": {"answer": "Vilnius is the capital [7#0]. It is old [7#0, 7#1]."}}
    assert study.cited_answer(opts, gen) == [
        {"text": "Vilnius is the capital.", "citations": ["7#0"]},
        {"text": "It is old.", "citations": ["7#0", "7#1"]}]


def test_cited_sentences_in_other_scripts():
    """Sentences and citation marks in Chinese, Arabic and Russian (the RAGTIME document
    languages), cut by tasks/text.sentences."""
    from xling.tasks.ragruns import cited_sentences

    zh = cited_sentences("北京是中国的首都[d1]。上海是最大的城市[d2, d3]。", "zh")
    assert [s["citations"] for s in zh] == [["d1"], ["d2", "d3"]]
    assert zh[0]["text"] == "北京是中国的首都。"
    ar = cited_sentences("القاهرة عاصمة مصر [d1]. النيل أطول نهر [d2].", "ar")
    assert [s["citations"] for s in ar] == [["d1"], ["d2"]]
    ru = cited_sentences("Москва — столица России [d1]. Без ссылки.", "ru")
    assert ru == [{"text": "Москва — столица России.", "citations": ["d1"]},
                  {"text": "Без ссылки.", "citations": []}]


def test_xrag_and_mirage_topics_carry_their_labels():
    from xling.studies.registry import get_study

    mirage = get_study("mirage")
    opts = mirage.validate_options({"data": "tests/data/mirage/mirage-bench",
                                    "langs": ["en", "sw"]})
    t = mirage.nugget_topics(opts, "sw")[0]
    assert [d["judgment"] for d in t["documents"]].count(1) == 2  # positive_ids
    xrag = get_study("xrag")
    xopts = xrag.validate_options({"data": "data/demo/xrag/xrag.test.jsonl", "langs": ["de"],
                                   "settings": ["mono"], "limit": 2})
    xt = xrag.nugget_topics(xopts, "de")
    assert len(xt) == 2 and all(any(d["judgment"] == 1 for d in t["documents"]) for t in xt)
    assert xrag.cited_answer(xopts, {"lang": "de", "parsed": {"answer": "Berlin. Ja."}}) == [
        {"text": "Berlin.", "citations": []}, {"text": "Ja.", "citations": []}]
