"""xling/studies/cross (CROSS on mLongRR-V2): the CSV loader, the offline Punkt splitter and
its pinned counts, exact top-k against a brute-force argsort, "needle rank <= k" against the
text the LLM gets, digit normalization, row-wise scoring against v1's "any row" bug, the
failure taxonomy with scripted readers, reduction, tables, plots, the V2-style builder, the
options model and the Study class.

Fixtures: tests/data/mlongrr (the 2k rows of the shared CSVs, see its README). The checks on
the full shared files are skipped when ../shared is not there.
"""

from __future__ import annotations

import csv
import io
import math
import os
import random
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from xling.studies.base import Evidence, Narrowed, StudyInputs
from xling.studies.cross.build import build_cases, make_counter, write_cases_csv
from xling.studies.cross.data import length_value, load_contexts, load_file, needles_in_columns
from xling.studies.cross.metrics import (add_token_reduction, contains_gold, failure_class,
                                         gold_label, is_unanswerable, normalize_digits,
                                         score_rows, seven_digit_numbers, strict_correct,
                                         system_name)
from xling.studies.cross.narrow import narrow_inputs, narrow_options, select, sentence_id
from xling.studies.cross.options import Options
from xling.studies.cross.paper import (CITIES, KS, LANGS, LENGTHS, MID_POSITIONS, ORDERS,
                                       PAPER_PROMPTS, POSITIONS, WINDOW_POSITIONS)
from xling.studies.cross.plots import plot_accuracy, plot_failures, plot_pair_heatmap
from xling.studies.cross.prompts import (cell_langs, given_text, needs_selection,
                                         parse_setting, prompt_rows, settings, words)
from xling.studies.cross.rank import label_ranks, rank, selection_text
from xling.studies.cross.split import context_split, make_splitter, protect_spans, splitter_for
from xling.studies.cross.tables import (markdown_tables, table_by_length, table_failures,
                                        table_pairs, table_summary, tables)
from xling.studies.cross.templates import (load_templates, prompt_template, query_text,
                                           unanswerable_tokens)
from xling.studies.registry import get_study

STUDY = get_study("cross")


def validated(raw: dict) -> Options:
    """`study.options` -> the Options object (what the study's steps read)."""
    return STUDY.validate_options(raw)


def option_errors(raw: dict) -> str:
    """The options' errors as `study.options.<key>: <message>` lines."""
    with pytest.raises(ValidationError) as info:
        validated(raw)
    return "\n".join("study.options." + ".".join(map(str, e["loc"])) + ": "
                     + e["msg"].removeprefix("Value error, ") for e in info.value.errors())


# --- helpers only the tests use ------------------------------------------------------------

def top_k(scores, k: int) -> np.ndarray:
    """The k best sentence indices (all of them when k >= N), best first: the prefix of the
    ranking (s2.3)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return rank(scores)[:k]


def build_prompt(qlang: str, needles: int, text: str, *, variant: str = "paper") -> str:
    template, _ = prompt_template(qlang, needles, variant=variant)
    head, tail = template.split("{text}", 1)
    return head + text + tail


def city_names(lang: str) -> dict[str, str]:
    """English name -> the name in ``lang`` for the 23 V2 cities (L311-335)."""
    return dict(load_templates()["languages"][lang]["cities"]["value"])


def reference_row_found(gold, output) -> int:
    """v1's 1-needle ``evaluate`` (gpt4_experiments.ipynb): raw containment, 1/0."""
    return int(str(gold) in str(output))


def reference_any_row_found(golds, outputs) -> list[int]:
    """v1's ``evaluate_3needle_v2`` (s1.7), reproduced only so that a test can pin that
    xling does NOT score this way: a row is credited when ANY row's output contains its
    gold (``df['generated_text'].str.contains(x).any()``)."""
    return [int(any(str(g) in str(o) for o in outputs)) for g in golds]


def reduction(context: str, given: str, tokenizer=None) -> dict:
    """Input reduction of one prompt (L145-151): 1 - given/context in whitespace words, and
    in tokens when a tokenizer callable (returning a list or a count) is passed."""
    def ntok(s: str) -> int:
        got = tokenizer(s)
        return int(got) if isinstance(got, (int, np.integer)) else len(got)

    context_words = words(context)
    out = {"reduction_words": (1 - words(given) / context_words) if context_words else None,
           "reduction_tokens": None}
    if tokenizer is not None:
        context_tokens = ntok(context)
        out["reduction_tokens"] = (1 - ntok(given) / context_tokens) if context_tokens else None
    return out


REPO = Path(__file__).resolve().parents[2]
FIX = Path(__file__).resolve().parents[1] / "data" / "mlongrr"
FILES = {"en1": "1-needle/English_needles.csv", "sw1": "1-needle/Swahili_needles.csv",
         "en3": "3-needles/English_needles.csv"}
# The English Punkt splitter these numbers were measured with (spec s5.7 pins them with the
# splitter; nltk 3.10.3 in the spec, 3.10.4 here: same counts).
FINGERPRINT = "punkt_english:nltk-3.10.4:f11076fa98d91cd0"


def _shared() -> Path | None:
    env = os.environ.get("XLING_SHARED_DATA")
    cands = ([Path(env)] if env else []) + [REPO.parent / "shared" / "data",
                                            REPO / "shared" / "data"]
    for c in cands:
        if all((c / "mlongrr" / f).is_file() for f in FILES.values()):
            return c / "mlongrr"
    return None


SHARED = _shared()
needs_shared = pytest.mark.skipif(
    SHARED is None, reason="../shared/data/mlongrr not found (set XLING_SHARED_DATA)")
PAPER = REPO.parent / "shared" / "papers" / "cross-mlongrr.txt"


def fixture(name: str) -> list[dict]:
    return load_file(str(FIX / FILES[name]))


def all_fixture_contexts() -> list[dict]:
    return [c for name in FILES for c in fixture(name)]


def perfect_reader(prompt: str) -> str:
    """Answers the largest 7-digit number between #CONTEXT and #ENDCONTEXT."""
    ctx = prompt.split("#CONTEXT\n", 1)[1].rsplit("\n#ENDCONTEXT", 1)[0]
    nums = seven_digit_numbers(ctx)
    return str(max(map(int, nums))) if nums else "UNANSWERABLE"


def first_number_reader(prompt: str) -> str:
    ctx = prompt.split("#CONTEXT\n", 1)[1].rsplit("\n#ENDCONTEXT", 1)[0]
    nums = seven_digit_numbers(ctx)
    return f"The number is {nums[0]}." if nums else "UNANSWERABLE"


# ---------------------------------------------------------------------------- loader

def test_loader_on_fixtures():
    en1, sw1, en3 = fixture("en1"), fixture("sw1"), fixture("en3")
    assert [len(en1), len(sw1), len(en3)] == [5, 5, 4]
    # same file name, the count comes from the columns
    assert {c["needles"] for c in en1} == {1} and {c["needles"] for c in en3} == {3}
    assert [c["context_id"] for c in en1] == [f"1n.en.2k.{p}.r0" for p in POSITIONS]
    assert [c["context_id"] for c in en3] == [f"3n.en.2k.{p}.r0" for p in WINDOW_POSITIONS]
    assert {c["lang"] for c in sw1} == {"sw"}
    for c in en1 + sw1 + en3:
        assert c["error"] is None and c["length_value"] == 2000
        for lab in c["labels"]:
            assert re.fullmatch(r"[0-9]{7}", lab) and c["text"].count(lab) == 1
    # 3-needle gold = max of the ints (spec s5.7)
    assert [c["gold"] for c in en3] == ["7252750", "6316390", "7782685", "8927166"]
    assert all(c["gold"] == gold_label(c["labels"]) for c in en3)
    assert all(c["labels"][c["target"]] == c["gold"] for c in en3)
    # measured character depth is within 5 points of nominal (1 needle)
    for c in en1 + sw1:
        assert abs(c["depth_chars"][0] - c["position"] / 100) <= 0.05, c["context_id"]


def test_loader_needle_count_from_columns_not_name(tmp_path):
    three = (FIX / FILES["en3"]).read_bytes()
    fake = tmp_path / "1-needle" / "English_needles.csv"  # a 1-needle name, 3-needle columns
    fake.parent.mkdir()
    fake.write_bytes(three)
    rows = load_file(str(fake))
    assert {r["needles"] for r in rows} == {3} and rows[0]["context_id"].startswith("3n.")
    with pytest.raises(ValueError, match="says 1 needle"):
        load_file(str(fake), needles=1)
    assert needles_in_columns(["context_length", "label"]) == 1
    assert needles_in_columns(["label1", "label2"]) == 2
    with pytest.raises(ValueError):
        needles_in_columns(["label", "label1"])
    with pytest.raises(ValueError):
        needles_in_columns(["city", "text"])


def test_loader_big_fields_quoted_newlines_errors_and_uri(tmp_path):
    text = ("A long line of filler words. " * 8000 + "\n\nNew paragraph here. The special "
            "magic Cairo number is 1234567 And more text.\nLast line.")
    assert len(text) > 131_072
    path = tmp_path / "English_needles.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["context_length", "position", "text", "city", "label"])
        w.writerow(["2k", "50", text, "Cairo", "1234567"])
        w.writerow(["2k", "75", "No label here.", "Cairo", "7654321"])
        w.writerow(["2k", "100", "Twice 1111111 and 1111111.", "Cairo", "1111111"])
    old = csv.field_size_limit(131_072)  # Python's default: the file does not parse
    try:
        with pytest.raises(csv.Error, match="field larger than field limit"):
            list(csv.reader(io.StringIO(path.read_text("utf-8"), newline="")))
    finally:
        csv.field_size_limit(old)
    rows = load_file(str(path))
    assert rows[0]["error"] is None and rows[0]["text"] == text  # newlines kept
    assert "occurs 0 times" in rows[1]["error"] and "occurs 2 times" in rows[2]["error"]
    uri = load_file("file://" + str(path.resolve()))  # through pyarrow.fs
    assert [r["text"] for r in uri] == [r["text"] for r in rows]


@needs_shared
def test_full_shared_files():
    sizes = {}
    for name, rel in FILES.items():
        path = SHARED / rel
        old = csv.field_size_limit(131_072)
        try:
            with pytest.raises(csv.Error):
                list(csv.reader(io.StringIO(path.read_text("utf-8"), newline="")))
        finally:
            csv.field_size_limit(old)
        rows = load_file(str(path))
        sizes[name] = len(rows)
        assert all(r["error"] is None for r in rows)
        assert sum("\n" in r["text"] for r in rows) == {"en1": 5, "sw1": 0, "en3": 4}[name]
        assert max(len(r["text"]) for r in rows) == {"en1": 297_922, "sw1": 226_873,
                                                     "en3": 298_020}[name]
        # the fixtures are exactly the 2k rows
        assert [r["text"] for r in rows if r["length"] == "2k"] == [
            r["text"] for r in fixture(name)]
    assert sizes == {"en1": 25, "sw1": 25, "en3": 20}


# ---------------------------------------------------------------------------- splitter

def test_splitter_pins_on_fixtures():
    sp = make_splitter("punkt_english")
    assert sp.fingerprint == FINGERPRINT and sp.sent_end_chars == (".", "?", "!")
    got = {}
    for name in FILES:
        got[name] = [(context_split(c, sp).n_sentences, list(context_split(c, sp).label_idx))
                     for c in fixture(name)]
    assert got["en1"] == [(33, [0]), (33, [8]), (33, [18]), (33, [23]), (34, [33])]
    assert got["sw1"] == [(49, [0]), (49, [13]), (49, [25]), (49, [41]), (49, [48])]
    assert got["en3"] == [(33, [0, 0, 1]), (33, [8, 8, 9]), (33, [18, 18, 23]),
                          (33, [23, 25, 27])]
    for c in all_fixture_contexts():
        sents = sp.sentences(c["text"])
        assert [s.index for s in sents] == list(range(len(sents)))
        # spans cover the text up to whitespace, in order, without overlap
        assert re.sub(r"\s+", "", "".join(s.text for s in sents)) == re.sub(r"\s+", "", c["text"])
        assert all(a.end <= b.start for a, b in zip(sents, sents[1:]))
        assert all(c["text"][a.end:b.start].strip() == "" for a, b in zip(sents, sents[1:]))
        # the same sentences nltk's own tokenize() gives with these parameters
        assert [s.text for s in sents] == sp.tokenizer.tokenize(c["text"])


def test_splitter_keeps_every_needle_in_one_sentence():
    sp = make_splitter("punkt_english")
    for c in all_fixture_contexts():
        split = context_split(c, sp)
        assert split.n_merged == 0, c["context_id"]
        for (s, e, how), i in zip(split.needle_spans, split.label_idx):
            assert how == "template"  # the whole needle sentence was found, not just the label
            ss, se = split.spans[i]
            assert ss <= s and e <= se, (c["context_id"], c["text"][s:e])
    # ... and a needle that a boundary would cut is kept whole by merging
    spans, merged = protect_spans([(0, 10), (11, 20), (21, 30)], [(5, 15)])
    assert spans == [(0, 20), (21, 30)] and merged == 1
    assert protect_spans([(0, 10), (11, 20)], [(11, 20)]) == ([(0, 10), (11, 20)], 0)
    text = "Intro sentence. The special magic Cairo number is 1234567. Mr. X came. End here."
    ctx = {"context_id": "t", "lang": "en", "text": text, "labels": ["1234567"],
           "cities": ["Cairo"], "target": 0}
    split = context_split(ctx, sp)
    assert split.label_idx == (1,)
    assert text[slice(*split.spans[1])] == "The special magic Cairo number is 1234567."


@needs_shared
def test_splitter_on_the_full_shared_files_and_sentence_counts():
    sp, untrained = make_splitter("punkt_english"), make_splitter("punkt_untrained")
    counts = {}
    english = []
    for name, rel in FILES.items():
        rows = load_file(str(SHARED / rel))
        sents = []
        for c in rows:
            split = context_split(c, sp)
            assert split.n_merged == 0, c["context_id"]
            for (s, e, how), i in zip(split.needle_spans, split.label_idx):
                assert how == "template" and split.spans[i][0] <= s and e <= split.spans[i][1]
            sents += [c["text"][s:e] for s, e in split.spans]
            if c["length"] == "64k" and c["position"] == 0 and name == "en1":
                assert split.n_sentences == 1445  # spec s5.7
                assert len(untrained.spans(c["text"])) == 1436
        counts[name] = (len(sents), len(set(sents)))
        if name != "sw1":
            english += sents
    # total sentence occurrences vs distinct sentence texts, per file and for English
    assert counts == {"en1": (13_815, 1_346), "sw1": (9_890, 1_074), "en3": (11_048, 1_378)}
    assert (len(english), len(set(english))) == (24_863, 1_403)


def test_splitter_variants_and_fingerprints():
    hi = "यह पहला वाक्य है। यह दूसरा वाक्य है। क्या यह तीसरा वाक्य है? हाँ।"
    ar = "هذه جملة أولى. هل هذه جملة ثانية؟ نعم هذه جملة ثالثة."
    en = "Mr. Smith went to Washington. He arrived at 5 p.m. on Monday. Did he stay? Yes."
    ru = "Это первое предложение. Второе предложение здесь! А третье?"
    base = make_splitter("punkt_english")
    extra = make_splitter("punkt_english", extra_terminators=["।", "؟"])
    assert len(base.spans(hi)) == 2  # the danda is not a terminator of English Punkt
    assert len(extra.spans(hi)) == 4 and len(extra.spans(ar)) == 3
    assert len(base.spans(ar)) == 2
    assert [s.text for s in base.sentences(en)] == [
        "Mr. Smith went to Washington.", "He arrived at 5 p.m. on Monday.", "Did he stay?", "Yes."]
    assert len(base.spans(ru)) == 3
    untrained = make_splitter("punkt_untrained")
    trained = make_splitter("punkt_trained", train_text=[en, ru] * 5)
    fps = {base.fingerprint, extra.fingerprint, untrained.fingerprint, trained.fingerprint}
    assert len(fps) == 4 and all(":nltk-" in f for f in fps)
    assert make_splitter("punkt_english") is base  # cached
    with pytest.raises(ValueError):
        make_splitter("punkt_trained")
    with pytest.raises(ValueError):
        make_splitter("sentencex")
    with pytest.raises(ValueError, match="extra_terminators"):
        make_splitter("multilingual", extra_terminators=["।"])


# ---------------------------------------------------------------------------- top-k

def _brute(scores: np.ndarray) -> np.ndarray:
    return np.argsort(-scores.astype(np.float64), kind="stable")


@pytest.mark.parametrize("n", [1, 2, 7, 33, 49, 60])
def test_top_k_equals_brute_force_argsort_with_ties(n):
    rng = np.random.default_rng(n)
    cases = [rng.standard_normal(n).astype(np.float32),        # distinct
             rng.integers(0, 3, n).astype(np.float64),          # mostly ties
             np.round(rng.random(n), 1),                        # some ties
             np.zeros(n), np.array([0.0, -0.0] * n)[:n]]        # all tied, signed zero
    for scores in cases:
        brute = _brute(scores)
        order = rank(scores)
        assert order.tolist() == brute.tolist()
        lex = np.lexsort((np.arange(n), -scores.astype(np.float64)))  # spec s5.7's check
        assert order.tolist() == lex.tolist()
        prev: list[int] = []
        for k in [0, 1, 2, 3, 5, 10, 20, 50, n - 1, n, n + 5]:
            if k < 0:
                continue
            top = top_k(scores, k).tolist()
            assert top == brute[:k].tolist() and top[:len(prev)] == prev[:len(top)]
            assert len(top) == min(k, n)
            prev = top
        for a, b in zip(order, order[1:]):  # ties go by index, ascending
            assert scores[a] > scores[b] or (scores[a] == scores[b] and a < b)
        idx = rng.integers(0, n, 3).tolist()
        assert label_ranks(order, idx) == [int(np.where(brute == i)[0][0]) + 1 for i in idx]
    with pytest.raises(ValueError):
        rank([1.0, float("nan")])


def _score_sets(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random(n), rng.integers(0, 4, n).astype(float), np.zeros(n),
            np.linspace(0, 1, n)[::-1]]


def test_needle_rank_le_k_iff_gold_in_selected_text():
    sp = make_splitter()
    checked = hits = 0
    for c in all_fixture_contexts():
        split = context_split(c, sp)
        seed = zlib.crc32(c["context_id"].encode())
        for scores in _score_sets(split.n_sentences, seed):
            order = rank(scores)
            for k in sorted({*KS, 1, split.n_sentences, split.n_sentences + 3}):
                for sel_order in ORDERS:
                    for sel in ({"scores": scores},
                                {"top_idx": order[:max(k, 50)].tolist(),
                                 "n_sentences": split.n_sentences,
                                 "label_rank": label_ranks(order, split.label_idx)}):
                        text, info = given_text(c, "cross", k, selection=sel, order=sel_order,
                                                splitter=sp)
                        assert (info["target_rank"] <= k) == (c["gold"] in text)
                        for lab, r in zip(c["labels"], info["label_rank"]):
                            assert (r <= k) == (lab in text)
                        assert len(info["top_idx"]) == min(k, split.n_sentences)
                        checked += 1
                        hits += info["target_rank"] <= k
    assert checked > 1000 and 0 < hits < checked


def _fixture_options(**kw) -> Options:
    return validated({"data": [str(FIX / f) for f in FILES.values()],
                      "query_langs": ["en"], **kw})


def test_select_is_exact_with_constructed_ties_anywhere_in_the_matrix():
    """The narrow stage's ranking (select) on vectors where sentences share one vector (so
    their scores tie exactly), the copies placed first, spread and in the matrix's last rows:
    every k of every selection equals a brute-force ranking by (-score, index)."""
    opts = _fixture_options()
    got = narrow_inputs(opts, "en")
    sids = list(got["sentences"])
    rng = np.random.default_rng(0)
    base = rng.standard_normal((4, 16)).astype(np.float32)
    for placement in ("first", "spread", "tail"):
        vec = {}
        for i, sid in enumerate(sids):
            tied = {"first": i < 6, "spread": i % 5 == 0, "tail": i >= len(sids) - 6}[placement]
            vec[sid] = base[i % 2] if tied else rng.standard_normal(16).astype(np.float32)
        for key in got["queries"]:
            vec[key] = base[2]
        sels = select(opts, "en", vec, k_max=60)
        assert sels and not [s for s in sels if s["error"]]
        for sel in sels:
            ctx = next(c for c in load_contexts(opts) if c["context_id"] == sel["context_id"])
            split = context_split(ctx, splitter_for(opts))
            rows = [vec[sentence_id(ctx["text"][a:b])] for a, b in split.spans]
            scores = [math.fsum(float(x) * float(y) for x, y in zip(r, base[2])) for r in rows]
            brute = sorted(range(len(rows)), key=lambda i: (-scores[i], i))
            for k in range(1, len(sel["top_idx"]) + 1):
                assert sel["top_idx"][:k] == brute[:k], (placement, sel["context_id"], k)
            assert sel["label_rank"] == [brute.index(i) + 1 for i in split.label_idx]
            assert sel["target_rank"] == sel["label_rank"][ctx["target"]]
    # a context with a sentence that has no vector is an error row, not a crash
    del vec[sids[0]]
    assert any(s["error"] for s in select(opts, "en", vec))


def test_narrow_inputs_count_each_distinct_sentence_once():
    """The haystacks of one language share their text across depths and needle counts: the
    narrow stage embeds the distinct sentences (the closing note's counts)."""
    opts = _fixture_options(query_langs=["en", "sw"], allow_unverified=True,
                            splitter="punkt_english")
    en, sw = narrow_inputs(opts, "en"), narrow_inputs(opts, "sw")
    assert (en["contexts"], en["sentences_total"], len(en["sentences"])) == (9, 298, 47)
    assert (sw["contexts"], sw["sentences_total"], len(sw["sentences"])) == (5, 245, 53)
    assert set(en["queries"]) == {"q:en:1", "q:en:3", "q:sw:1", "q:sw:3"}
    assert narrow_options(opts, "sw")["data"] == [d for d in opts.as_options()["data"]
                                                  if d["lang"] == "sw"]


def test_selection_text_orders():
    text = "A one. B two. C three. D four."
    spans = make_splitter("punkt_english").spans(text)
    assert selection_text(text, spans, [2, 0], order="score") == "C three. A one."
    assert selection_text(text, spans, [2, 0], order="document") == "A one. C three."
    assert selection_text(text, spans, [2, 0], order="document", join="\n") == "A one.\nC three."


# ---------------------------------------------------------------------------- prompts

def test_english_prompts_are_the_papers_boxes():
    for n in (1, 3):
        template, status = prompt_template("en", n)
        assert template == PAPER_PROMPTS[n] and status == "paper"
    p = build_prompt("en", 3, "CTX {text} 1234567")
    assert p.startswith("You are a helpful AI bot") and "#CONTEXT\nCTX {text} 1234567\n" in p
    assert p.endswith("If the information is not available in the context respond UNANSWERABLE.")
    assert PAPER_PROMPTS[1].endswith("context, respond UNANSWERABLE.")  # L355 has the comma
    short, _ = prompt_template("en", 1, variant="no_unanswerable")
    assert short.endswith("or repeat your findings.") and "UNANSWERABLE" not in short
    assert query_text("en", 1) == "What is the special magic number?"
    assert query_text("en", 3) == "What is the largest special magic number?"
    assert "#CONTEXT" not in query_text("en", 3, "instruction")
    if not PAPER.exists():
        pytest.skip("the paper text (../shared/papers) is not in this checkout")
    paper = PAPER.read_text("utf-8")
    assert PAPER_PROMPTS[3] in paper  # L363-371, verbatim
    # L343-355: the same lines with a blank line after each (PDF extraction)
    assert "\n\n".join(x for x in PAPER_PROMPTS[1].split("\n") if x) in paper
    assert '"The special magic {city} number is {number}."' in paper  # L309
    for city in CITIES:
        assert f"- {city}\n" in paper


def test_templates_file_and_unverified_strings():
    t = load_templates()
    # the seven prompt languages, and context-only entries (a needle, no prompt) for the
    # first release's Somali and Chinese haystacks
    assert set(t["languages"]) == set(LANGS) | {"so", "zh"}
    assert t["languages"]["so"]["needle"]["status"] == "v1"
    assert "{number}" in t["languages"]["zh"]["needle"]["value"]
    for lang, entry in ((c, t["languages"][c]) for c in LANGS):
        assert set(entry["cities"]["value"]) == set(CITIES), lang
        for name in ("instruction", "question_1", "question_3", "rules", "unanswerable_1",
                     "unanswerable_3", "unanswerable_tokens", "needle"):
            assert entry[name]["value"] and entry[name]["source"], (lang, name)
        assert "{city}" in entry["needle"]["value"] and "{number}" in entry["needle"]["value"]
    status = {(q, n): prompt_template(q, n)[1] for q in LANGS for n in (1, 3)}
    assert status[("en", 1)] == status[("en", 3)] == "paper"
    assert status[("vi", 1)] == status[("sw", 1)] == "v1_adapted"
    assert all(status[(q, n)] == "draft" for q in ("fa", "ru", "hi", "ar") for n in (1, 3))
    assert status[("vi", 3)] == status[("sw", 3)] == "draft"
    # every draft string says so; the v1 strings are the v1 notebook's (via the source)
    for entry in t["languages"].values():
        for item in entry.values():
            if item["status"] == "draft":
                assert "unverified" in item["source"] or "Appendix B" in item["source"]
    hi = build_prompt("hi", 1, "संदर्भ")
    assert "विशेष जादुई संख्या क्या है?" in hi and "#CONTEXT\nसंदर्भ\n#ENDCONTEXT" in hi
    assert unanswerable_tokens("sw") == ["HAKUNA MAJIBU", "UNANSWERABLE"]
    assert city_names("sw")["Mexico City"] == "Jiji la Meksiko"


def test_validated():
    en1 = str(FIX / FILES["en1"])
    data = [en1, {"path": str(FIX / FILES["en3"]), "length_unit": "tokens:gpt-4o"},
            str(FIX / FILES["sw1"])]
    assert "study.options.query_langs: the 1-needle prompt for 'vi'" in option_errors(
        {"data": data})  # the default 7 query languages include drafts
    opts = validated({"data": data, "query_langs": ["en"]})
    assert opts.context_langs == ["en", "sw"] and opts.ks == [3, 5, 10, 20, 50]
    assert opts.order == "score" and opts.join == " " and opts.needles == [1, 3]
    assert opts.embedding_failure == "target" and opts.splitter == "multilingual"
    assert opts.scoring == "exact"
    everything = validated({"data": data, "allow_unverified": True})
    assert everything.query_langs == list(LANGS)
    for bad, match in ((dict(ks=[0]), "ks"), (dict(methods=["rag"]), "methods"),
                       (dict(order="random"), "order"), (dict(foo=1), "foo"),
                       (dict(data=["nope.csv"]), "data"), (dict(query_langs=["de"]), "query_langs"),
                       (dict(context_langs=["fa"]), "context_langs"),
                       (dict(extra_terminators=["ab"]), "extra_terminators"),
                       (dict(data=[{"path": en1, "length_unit": "pages"}]), "data"),
                       (dict(query_langs=["xx-nope"]), "query_langs"),
                       (dict(data=[{"path": en1, "lang": "xx-nope"}]), "data"),
                       (dict(data=[{"path": en1, "tag": "a b"}]), "data"),
                       (dict(scoring="substring"), "scoring")):
        assert f"study.options.{match}" in option_errors(
            {"data": data, "query_langs": ["en"], **bad}), bad
    ctxs = load_contexts(validated({"data": data, "query_langs": ["en"],
                                    "needles": [1], "positions": [0, 100], "limit": 1}))
    assert [c["context_id"] for c in ctxs] == ["1n.en.2k.0.r0", "1n.sw.2k.0.r0"]
    assert load_contexts(opts)[5]["unit"] == "tokens:gpt-4o"


def test_settings_cells_and_prompt_rows():
    opts = validated({"data": [str(FIX / f) for f in FILES.values()],
                      "query_langs": ["en", "sw"], "allow_unverified": True,
                      "methods": ["baseline", "cross", "needle_only"], "ks": [3, 50],
                      "splitter": "punkt_english"})
    assert settings(opts) == ["1n_baseline", "1n_k3", "1n_k50", "1n_needle_only",
                              "3n_baseline", "3n_k3", "3n_k50", "3n_needle_only"]
    assert cell_langs(opts) == ["en-en", "en-sw", "sw-en", "sw-sw"]
    assert parse_setting("3n_k10") == (3, "cross", 10) and needs_selection("1n_k3")
    assert parse_setting("1n_needle_only") == (1, "needle_only", None)
    base = prompt_rows(opts, "1n_baseline", "sw-en")
    assert len(base) == 5 and all(r["error"] is None for r in base)
    ctx = fixture("en1")[2]
    assert ctx["text"] in base[2]["prompt"] and base[2]["prompt"].startswith("Wewe ni roboti")
    meta = base[2]["meta"]
    assert (meta["qlang"], meta["clang"], meta["template_status"]) == ("sw", "en", "v1_adapted")
    assert meta["splitter_fp"] == FINGERPRINT and meta["target_in_text"]
    assert meta["n_sentences"] == 33 and meta["order"] == "score"
    only = prompt_rows(opts, "3n_needle_only", "en-en")
    assert only[0]["prompt"].count("The special magic") == 3
    missing = prompt_rows(opts, "1n_k3", "en-en")
    assert all(r["error"] == "no selection for this context" for r in missing)
    sels = {(c["context_id"], "en"): {"scores": np.arange(33.0)} for c in fixture("en1")[:4]}
    sels[("1n.en.2k.100.r0", "en")] = {"scores": np.arange(33.0)}  # 34 sentences: drift
    rows = prompt_rows(opts, "1n_k3", "en-en", selections=sels)
    assert [r["error"] is None for r in rows] == [True] * 4 + [False]
    assert "splitter drift" in rows[4]["error"]
    m = rows[0]["meta"]
    assert m["top_idx"] == [32, 31, 30] and m["target_rank"] == 33 and not m["target_in_text"]
    ctx = fixture("en1")[1]  # target in sentence 8
    partial = {"top_idx": [8, 1, 2], "n_sentences": 33}
    punkt = splitter_for(opts)
    _, info = given_text(ctx, "cross", 3, selection=partial, splitter=punkt)
    assert info["label_rank"] == [1] and info["target_rank"] == 1
    _, info = given_text(ctx, "cross", 2, selection={"top_idx": [1, 2], "n_sentences": 33},
                         splitter=punkt)
    assert info["label_rank"] == [None]  # beyond a partial ranking: unknown
    with pytest.raises(ValueError, match="splitter"):
        given_text(ctx, "cross", 3, selection={**partial, "splitter_fp": "other"},
                   splitter=punkt)


# ---------------------------------------------------------------------------- scoring

def test_digit_normalization():
    gold = "7252750"
    for out in ("7252750", "The answer is 7,252,750.", "7 252 750", "7.252.750", "7'252'750",
                "۷۲۵۲۷۵۰", "٧٢٥٢٧٥٠", "७२५२७५०", "۷٬۲۵۲٬۷۵۰", "7\u2009252\u2009750",
                "7\u00a0252\u00a0750", "7\u202f252\u202f750", "٧،٢٥٢،٧٥٠", "7’252’750",
                "العدد هو ۷۲۵۲۷۵۰.", "संख्या ७,२५२,७५० है।"):
        assert contains_gold(out, gold), out
        assert strict_correct(out, gold), out
    assert normalize_digits("۲۱۳۸۱۰۹ and २१३८१०९") == "2138109 and 2138109"
    assert normalize_digits("2k, 8k and 1, 2") == "2k, 8k and 1, 2"  # only between digits
    assert not contains_gold("725275", gold) and not contains_gold(None, gold)
    assert not contains_gold("UNANSWERABLE", gold)
    # containment vs strict
    for out in ("7252750 and 6316390", "72527501", "The numbers: 6316390, 7252750"):
        assert contains_gold(out, gold) and not strict_correct(out, gold), out
    assert seven_digit_numbers("a 7252750, b ۶۳۱۶۳۹۰") == ["7252750", "6316390"]
    assert is_unanswerable("Jibu: hakuna majibu", "sw") and is_unanswerable("unanswerable.")
    assert not is_unanswerable("7252750", "en")


def test_scoring_is_row_wise_not_any_row():
    golds = ["7252750", "6316390", "8927166"]
    outputs = ["6316390", "The largest is 7252750.", "UNANSWERABLE"]
    # v1's evaluate_3needle_v2 credits a row when ANY row's output holds its gold
    assert reference_any_row_found(golds, outputs) == [1, 1, 0]
    assert [reference_row_found(g, o) for g, o in zip(golds, outputs)] == [0, 0, 0]
    rows = [{"output": o, "meta": {"gold": g, "needles": 3, "method": "baseline", "qlang": "en",
                                   "labels": [g]}} for g, o in zip(golds, outputs)]
    df = score_rows(rows)
    assert df["correct"].tolist() == [False, False, False]
    assert df["failure_detail"].tolist() == ["llm_incorrect", "llm_incorrect", "llm_unanswerable"]
    df = score_rows([{"output": "7252750", "meta": rows[0]["meta"]}])
    assert df["correct"].tolist() == [True]
    assert gold_label(["1000000", "999999", "1000001"]) == "1000001"


def test_failure_class_rules():
    fc = failure_class
    assert fc(correct=True, target_in_cap=False) == ("correct", "correct")
    assert fc(correct=False, target_in_cap=False) == ("embedding_failure", "embedding_failure")
    assert fc(correct=False, target_in_cap=True, unanswerable=True) == (
        "llm_failure", "llm_unanswerable")
    assert fc(correct=False, target_in_cap=True) == ("llm_failure", "llm_incorrect")
    assert fc(correct=False, target_in_cap=True, all_in_cap=False, rule="all")[0] == \
        "embedding_failure"
    assert fc(correct=True, target_in_cap=True, refused=True) == ("too_long", "too_long")


def _scored_items(reader, qlangs=("en",), ks=(3, 5, 10, 20, 50), rule="target", model="m"):
    opts = validated({"data": [str(FIX / f) for f in FILES.values()],
                      "query_langs": list(qlangs), "allow_unverified": True,
                      "ks": list(ks), "methods": ["baseline", "cross", "needle_only"],
                      "embedding_failure": rule})
    contexts = load_contexts(opts)
    sp = splitter_for(opts)
    rows = []
    for setting in settings(opts):
        for lang in cell_langs(opts):
            q = lang.split("-")[0]
            sels = {}
            for c in contexts:
                n = context_split(c, sp).n_sentences
                rng = np.random.default_rng(zlib.crc32(f"{c['context_id']}:{q}".encode()))
                sels[(c["context_id"], q)] = {"scores": rng.random(n)}
            for r in prompt_rows(opts, setting, lang, contexts=contexts, selections=sels):
                assert r["error"] is None, r["error"]
                rows.append({**r, "model": model, "output": reader(r["prompt"])})
    return score_rows(rows, rule=rule)


def test_perfect_reader_accuracy_equals_needle_retrieval_rate():
    items = _scored_items(perfect_reader, qlangs=("en", "sw"))
    cross = items[items["method"] == "cross"]
    assert len(cross) == 14 * 2 * 5
    assert 0 < cross["target_in_cap"].mean() < 1  # hits and misses both occur
    assert (cross["correct"] == cross["target_in_cap"]).all()
    for (n, k), g in cross.groupby(["needles", "k"]):
        assert g["correct"].mean() == g["target_in_cap"].mean()
    assert (cross["failure"] != "llm_failure").all()
    assert ((cross["failure"] == "embedding_failure") == ~cross["target_in_cap"]).all()
    assert (cross["target_rank"] <= cross["k"]).tolist() == cross["target_in_cap"].tolist()
    others = items[items["method"] != "cross"]
    assert others["correct"].all() and others["strict"].all()  # baseline, needle only: 100 %


def test_always_unanswerable_reader_fails_in_the_llm_only_where_the_needle_was_there():
    items = _scored_items(lambda p: "UNANSWERABLE")
    cross = items[items["method"] == "cross"]
    assert not items["correct"].any()
    hits = int(cross["target_in_cap"].sum())
    assert 0 < hits < len(cross)
    assert int((cross["failure_detail"] == "llm_unanswerable").sum()) == hits
    assert int((cross["failure"] == "embedding_failure").sum()) == len(cross) - hits
    base = items[items["method"] == "baseline"]
    assert (base["failure_detail"] == "llm_unanswerable").all()
    t = table_failures(items)
    classes = ["correct", "embedding_failure", "llm_failure", "too_long"]
    assert np.allclose(t[classes].sum(axis=1), 100)


def test_first_number_reader_and_the_all_needles_rule():
    items = _scored_items(first_number_reader)
    three = items[(items["needles"] == 3) & (items["method"] == "baseline")]
    # wrong exactly where the first label in the text is not the largest
    first_is_max = {c["context_id"]: c["labels"][0] == c["gold"] for c in fixture("en3")}
    assert three["correct"].tolist() == [first_is_max[i] for i in three["item_id"]]
    strict = _scored_items(perfect_reader, ks=(3,), rule="all")
    cross = strict[(strict["method"] == "cross") & (strict["needles"] == 3)]
    assert ((cross["failure"] == "embedding_failure") ==
            (~cross["all_in_cap"] & ~cross["correct"])).all()


def test_reduction():
    text = "one two three four five six seven eight nine ten"
    r = reduction(text, "one two")
    assert r["reduction_words"] == pytest.approx(0.8) and r["reduction_tokens"] is None
    by_tokens = reduction(text, "one two", tokenizer=str.split)
    assert by_tokens["reduction_tokens"] == pytest.approx(0.8)
    assert reduction(text, "one two", tokenizer=len)["reduction_tokens"] == pytest.approx(
        1 - 7 / len(text))
    items = _scored_items(perfect_reader, ks=(3,))
    cross = items[items["method"] == "cross"]
    assert (cross["reduction_words"] > 0.5).all()
    assert (items[items["method"] == "baseline"]["reduction_words"] == 0).all()
    df = pd.DataFrame({"model": ["m", "m"], "item_id": ["a", "a"], "qlang": ["en", "en"],
                       "method": ["baseline", "cross"], "n_prompt_tokens": [1000, 150]})
    assert add_token_reduction(df)["reduction_tokens"].tolist() == pytest.approx([0.0, 0.85])


# ---------------------------------------------------------------------------- tables, plots

def test_tables_and_plots(tmp_path):
    items = pd.concat([_scored_items(perfect_reader, qlangs=("en", "sw"), model="perfect"),
                       _scored_items(lambda p: "UNANSWERABLE", qlangs=("en", "sw"),
                                     model="lazy")], ignore_index=True)
    t = tables(items)
    assert {"by_length", "by_depth", "by_k", "hits", "failures", "pairs_1n", "pairs_3n",
            "reduction", "pairs_1n_baseline"} <= set(t)
    by_len = t["by_length"]
    assert "perfect: baseline" in by_len.columns and "perfect: cross" in by_len.columns
    assert (by_len["perfect: baseline"] == 100).all() and (by_len["lazy: cross@3"] == 0).all()
    cross_cols = [c for c in by_len.columns if c.startswith("perfect: cross@")]
    assert np.allclose(by_len["perfect: cross"], by_len[cross_cols].mean(axis=1))
    pairs = t["pairs_1n"]
    assert list(pairs.columns) == ["en", "sw", "mean"] and list(pairs.index) == ["en", "sw", "mean"]
    assert list(t["by_k"].index.get_level_values(1).unique()) == [3, 5, 10, 20, 50]
    md = markdown_tables(items)
    assert "| needles | length | lazy: baseline |" in md and "(Fig 14)" in md
    paths = [plot_accuracy(items, "length", tmp_path / "len.png"),
             plot_accuracy(items, "position", tmp_path / "depth.png"),
             plot_accuracy(items, "k", tmp_path / "k.png"),
             plot_pair_heatmap(items, tmp_path / "pairs.png", needles=1),
             plot_failures(items, tmp_path / "fail.png")]
    for p in paths:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and Path(p).stat().st_size > 5000


def test_seven_by_seven_matrix_and_length_averaging():
    rng = random.Random(0)
    recs = [{"model": "m", "needles": 1, "method": "cross", "k": 3, "system": "cross@3",
             "qlang": q, "clang": c, "correct": rng.random() < 0.5}
            for q in LANGS for c in LANGS for _ in range(4)]
    m = table_pairs(pd.DataFrame(recs))
    assert m.shape == (8, 8) and list(m.index)[:7] == list(LANGS)
    assert np.allclose(m.loc["mean"].iloc[:7], m.iloc[:7, :7].mean(axis=0))
    # spec C1: 59 % on the five lengths <= 64k and 0 beyond gives 36.9 % over all eight
    recs = [{"model": "m", "needles": 1, "method": "baseline", "k": None, "system": "baseline",
             "length": L, "correct": i < (59 if length_value(L) <= 64_000 else 0)}
            for L in LENGTHS for i in range(100)]
    t = table_by_length(pd.DataFrame(recs))
    assert list(t.index.get_level_values(1)) == list(LENGTHS)
    assert t["baseline"].mean() == pytest.approx(36.875)
    # T1 slices; spec C2: 27 % mid-context (25/50/75) and 52 % at the edges give 37 % overall
    recs = [{"model": "m", "needles": 1, "method": m, "k": k, "system": system_name(m, k),
             "length": L, "length_value": length_value(L), "position": p, "unit": "words:nltk",
             "correct": i < ((27 if p in MID_POSITIONS else 52) if L in LENGTHS[:5] else 0)
             if m == "baseline" else i < 90 + (k or 0) % 7}
            for m, k in (("baseline", None), ("cross", 3), ("cross", 10))
            for L in LENGTHS for p in POSITIONS for i in range(100)]
    s = table_summary(pd.DataFrame(recs)).loc[(1, "m")]
    assert s.loc["baseline", "<=64k words"] == pytest.approx(37)
    assert s.loc["baseline", ">64k words"] == 0
    assert s.loc["baseline", "all"] == pytest.approx(37 * 5 / 8)
    assert s.loc["baseline", "mid"] == pytest.approx(27 * 5 / 8)
    assert s.loc["cross", "all"] == pytest.approx((93 + 93) / 2) and s.loc["cross", "n"] == 8000
    assert list(s.index) == ["baseline", "cross@3", "cross@10", "cross"]


# ---------------------------------------------------------------------------- builder

WORDS = ("river market council school bridge harvest festival station library farmer teacher "
         "engineer village coast mountain report season museum garden weather road project "
         "family water city train").split()


def _docs(lang: str = "en", n_docs: int = 24, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        sents = []
        for _ in range(rng.randint(8, 14)):
            ws = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
            if rng.random() < 0.2:
                ws.insert(0, "Mr. Dale said the")
            if rng.random() < 0.2:
                ws.append(str(rng.randint(2, 99)))
            sents.append(" ".join(ws).capitalize() + rng.choice([".", ".", "?"]))
        docs.append({"doc_id": f"{lang}-{d}", "lang": lang, "title": f"Doc {d}",
                     "text": " ".join(sents)})
    return docs


def test_builder_is_deterministic_and_depths_are_exact(tmp_path):
    docs = _docs() + _docs("sw", 3)
    kw = dict(lang="en", lengths=("1k", "0.5k"), runs=2, seed=3)
    a, b = build_cases(docs, **kw), build_cases(docs, **kw)
    assert a == b and len(a) == 2 * 5 * 2
    other = build_cases(docs, **{**kw, "seed": 4})
    assert [r["label"] for r in other] != [r["label"] for r in a]
    p1 = write_cases_csv(a, tmp_path / "x" / "English_needles.csv")
    p2 = write_cases_csv(b, tmp_path / "y" / "English_needles.csv")
    assert Path(p1).read_bytes() == Path(p2).read_bytes()
    sp = make_splitter()
    count = make_counter("words:nltk", sp)
    loaded = load_file(p1)
    assert len(loaded) == len(a) and all(c["error"] is None for c in loaded)
    assert {c["needles"] for c in loaded} == {1} and loaded[0]["unit"] == "words:nltk"
    for row, ctx in zip(a, loaded):
        p = row["position"] / 100
        kval = length_value(row["context_length"])
        assert kval - 100 - 40 <= row["n_count"] <= kval - 100  # budget filled, not exceeded
        # the needle (D.1, with a period, L309) is a sentence of its own
        split = context_split(ctx, sp)
        i = split.label_idx[0]
        assert ctx["text"][slice(*split.spans[i])] == \
            f"The special magic {row['city']} number is {row['label']}."
        assert row["city"] in CITIES
        # measured depth = count before the needle / haystack count, within one sentence of p
        hay = ctx["text"].replace(ctx["text"][slice(*split.spans[i])], "").replace("  ", " ")
        counts = [count(s.text) for s in sp.sentences(hay.strip(), "en")]
        measured = float(row["depth_measured"])
        assert measured == pytest.approx(sum(counts[:i]) / sum(counts), abs=1e-6)
        longest = max(counts) / sum(counts)
        assert p <= measured + 1e-9 and measured - p <= longest  # first boundary >= p
        assert abs(ctx["depth_chars"][0] - p) <= longest + 0.05
    r0 = [r for r in a if r["position"] == 0]
    r100 = [r for r in a if r["position"] == 100]
    assert all(r["text"].startswith("The special magic") for r in r0)
    assert all(r["text"].endswith(f"{r['label']}.") for r in r100)
    no_period = build_cases(docs, **{**kw, "lengths": ("0.5k",), "runs": 1},
                            needle_period=False)
    assert all(f"number is {r['label']} " in r["text"] or r["text"].endswith(r["label"])
               for r in no_period)


def test_builder_three_needles_uniform_and_window(tmp_path):
    docs = _docs()
    uni = build_cases(docs, lang="en", lengths=("1k",), needles=3, runs=3, seed=1)
    assert [r["position"] for r in uni] == ["random"] * 3
    for r in uni:
        labels = [r[f"label{i}"] for i in (1, 2, 3)]
        cities = [r[f"city{i}"] for i in (1, 2, 3)]
        assert len(set(labels)) == 3 and len(set(cities)) == 3
        assert all(r["text"].count(x) == 1 for x in labels)
        depths = [float(x) for x in r["depth_measured"].split()]
        assert depths == sorted(depths) and len(set(depths)) == 3
    assert len({r["label1"] for r in uni}) == 3  # runs differ
    win = build_cases(docs, lang="en", lengths=("1k",), needles=3, placement="window", seed=1)
    assert [r["position"] for r in win] == [0, 25, 50, 75]
    for r in win:
        depths = [float(x) for x in r["depth_measured"].split()]
        assert r["position"] / 100 <= depths[0] and depths[-1] <= r["position"] / 100 + 0.25 + 0.05
    path = write_cases_csv(win, tmp_path / "English_needles.csv")
    loaded = load_file(path)
    assert {c["needles"] for c in loaded} == {3} and all(c["error"] is None for c in loaded)
    assert all(c["gold"] == gold_label(c["labels"]) for c in loaded)
    assert all(context_split(c).n_merged == 0 for c in loaded)
    # other languages: the needle and city names of templates.json
    hi_docs = [{"doc_id": f"h{i}", "lang": "hi", "title": "", "text": " ".join(
        f"यह वाक्य संख्या {j} है।" for j in range(40))} for i in range(8)]
    hi = build_cases(hi_docs, lang="hi", lengths=("0.5k",), positions=(50,),
                     unit="words:whitespace")
    assert "की विशेष जादुई संख्या" in hi[0]["text"] and hi[0]["city"] in city_names("hi").values()
    with pytest.raises(ValueError, match="hold only"):
        build_cases(hi_docs[:1], lang="hi", lengths=("2k",), unit="words:whitespace")


# ---------------------------------------------------------------------------- the Study class

def test_study_class_ties_the_modules_to_the_stages():
    assert isinstance(STUDY, Narrowed) and STUDY.name == "cross" and STUDY.parsers() == {}
    STUDY.load_prompt_files()
    opts = validated({"data": [str(FIX / f) for f in FILES.values()], "query_langs": ["en"],
                      "ks": [3], "methods": ["baseline", "cross"]})
    assert "narrow" in STUDY.required_sections(opts)
    assert STUDY.required_sections(opts.model_copy(update={"methods": ["baseline"]})) == {}
    sets = [(p.setting, p.lang) for p in STUDY.prompt_sets(opts)]
    assert sets == [("1n_baseline", "en-en"), ("1n_baseline", "en-sw"), ("1n_k3", "en-en"),
                    ("1n_k3", "en-sw"), ("3n_baseline", "en-en"), ("3n_k3", "en-en")]
    assert STUDY.parser_for("1n_k3") == "none" and STUDY.needs_selection("1n_k3")
    assert not STUDY.needs_selection("3n_baseline") and STUDY.selection_lang("sw-en") == "en"
    assert STUDY.narrow_langs(opts) == ["en", "sw"] and len(STUDY.input_files(opts)) == 3
    # narrow -> prompts -> score -> render, with a vector per sentence and query
    # the narrow cell's params carry the part of the options its selections depend on;
    # narrow_inputs and select read the context language's share of the whole options
    narrow_opts = STUDY.narrow_options(opts, "en")
    assert narrow_opts["context_langs"] == ["en"] and narrow_opts["methods"] == ["cross"]
    assert {d["lang"] for d in narrow_opts["data"]} == {"en"}
    got = STUDY.narrow_inputs(opts, "en")
    rng = np.random.default_rng(1)
    vectors = {k: rng.standard_normal(8).astype(np.float32)
               for k in [*got["sentences"], *got["queries"]]}
    selections = STUDY.select(opts, "en", vectors)
    assert set(STUDY.hits_at(selections, [3])) == {"hit@3"}
    by_key = {(s["context_id"], s["qlang"]): s for s in selections}
    gens = []
    for setting, lang in sets:
        if lang != "en-en":
            continue
        rows = STUDY.build_prompts(opts, setting, lang, inputs=StudyInputs(selections=by_key))
        assert rows and all(r["error"] is None for r in rows)
        gens += [{**r, "model": "perfect", "output": perfect_reader(r["prompt"])} for r in rows]
    items, metrics = STUDY.score(opts, gens, Evidence())
    acc = {(m["setting"], m["metric"]): m["value"] for m in metrics}
    assert acc[("1n_baseline", "accuracy")] == 100 and ("1n_k3", "hit") in acc
    rendered = STUDY.render(opts, items, metrics)
    assert rendered.markdown.startswith("# CROSS on mLongRR")
    assert "accuracy_by_k.png" in rendered.plots
