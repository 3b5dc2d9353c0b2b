"""CROSS retrieves blind (issue 45): the default splitter's sentences are a function of the
text and its language alone (it never reads where the needles are, even when no template
finds them); the template-based needle cutting is the ``oracle`` ablation, labelled in every
table; selections and prompts record per needle whether it ended up as a sentence of its
own; a template that matches no needle of a data file is refused at validation; and every
packaged needle template matches the published mLongRR files it has (tests/data/mlongrr)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from xling.config import load_config
from xling.core.config import ConfigError
from xling.studies.cross import split as split_module
from xling.studies.cross.data import load_file
from xling.studies.cross.metrics import score_rows
from xling.studies.cross.narrow import narrow_inputs, needle_summary, select
from xling.studies.cross.options import unmatched_needles
from xling.studies.cross.prompts import prompt_rows
from xling.studies.cross.split import context_split, make_splitter, needle_spans
from xling.studies.cross.tables import markdown_tables
from xling.studies.cross.templates import load_templates
from xling.studies.registry import get_study

STUDY = get_study("cross")
MLONGRR = Path(__file__).resolve().parents[1] / "data" / "mlongrr"
# Published files (PortNLP/mLongRR @ f3edbda, cut: tests/data/mlongrr/README.md) per language
PUBLISHED = {"en": ["1-needle/English_needles.csv", "3-needles/English_needles.csv"],
             "sw": ["1-needle/Swahili_needles.csv"], "zh": ["1-needle/Chinese_needles.csv"]}


def _ctx(text: str, labels, cities, lang="en") -> dict:
    return {"context_id": "1n.en.2k.50.r0", "needles": len(labels), "lang": lang,
            "text": text, "labels": list(labels), "cities": list(cities), "target": 0}


def test_blind_splitter_never_reads_needle_positions(monkeypatch):
    """Needles in a wording no template matches: the split is the text's, whatever the labels
    and cities say, and needle_spans is consulted only after the split (for evaluation)."""
    text = ("The village lies at the foot of a green hill. Our figure for Cairo: 4753820 "
            "according to the elders and nobody doubts it. Snow closes the road in winter.")
    splitter = make_splitter()
    own = splitter.spans(text, "en")
    calls = []
    real_blind, real_needles = split_module.blind_spans, split_module.needle_spans
    monkeypatch.setattr(split_module, "blind_spans",
                        lambda *a: calls.append("split") or real_blind(*a))
    monkeypatch.setattr(split_module, "needle_spans",
                        lambda *a: calls.append("needles") or real_needles(*a))
    for labels, cities in ((["4753820"], ["Cairo"]), (["1111111"], ["Lagos"])):
        calls.clear()
        split_module._SPLIT_CACHE.clear()
        got = context_split(_ctx(text, labels, cities), splitter)
        assert list(got.spans) == own and calls == ["split", "needles"]
        assert got.n_merged == got.n_isolated == 0
    got = context_split(_ctx(text, ["4753820"], ["Cairo"]), splitter)
    assert [how for _, _, how in got.needle_spans] == ["label"]
    assert got.needle_isolated == (None,)  # no template: its extent is unknown
    # a needle glued to its sentence stays glued for the blind splitter, not for the oracle
    glued = "Snow closes the road.The special magic Cairo number is 4753820 and more text here."
    blind = context_split(_ctx(glued, ["4753820"], ["Cairo"]), splitter)
    oracle = context_split(_ctx(glued, ["4753820"], ["Cairo"]), make_splitter("oracle"))
    assert blind.needle_isolated == (False,) and oracle.needle_isolated == (True,)
    assert blind.spans == tuple(splitter.spans(glued, "en"))
    assert oracle.n_isolated == 1 and oracle.splitter_fp.startswith("oracle:")


def _write(path: Path, rows) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["context_length", "position", "text", "city", "label"])
        w.writerows(rows)
    return str(path)


def test_a_template_matching_no_needle_is_refused_at_validate(tmp_path):
    good = _write(tmp_path / "English_needles.csv", [
        ("2k", 50, "A hill. The special magic Cairo number is 4753820. A road.", "Cairo",
         "4753820")])
    bad = _write(tmp_path / "Swahili_needles.csv", [
        ("2k", 50, "Kilima. Namba ya Kairo ni 4753820. Barabara.", "Kairo", "4753820")])
    STUDY.validate_options({"data": [good], "query_langs": ["en"]})
    with pytest.raises(ValidationError, match=r"1 of 1 needles match no needle template "
                                              r"of 'sw'.*Fix languages\.sw\.needle"):
        STUDY.validate_options({"data": [good, bad], "query_langs": ["en"]})
    # the baseline alone needs no template
    STUDY.validate_options({"data": [bad], "query_langs": ["en"], "methods": ["baseline"]})
    # `xling validate` reads the config: one ConfigError line naming the file and the fix
    cfg = tmp_path / "cross.yaml"
    cfg.write_text(f"name: t\nstudy:\n  task: cross\n  options:\n    data: [{bad}]\n"
                   "    query_langs: [en]\n    methods: [baseline, needle_only]\n"
                   f"generate:\n  models: [{{name: m, backend: openai, model: m, "
                   "base_url: 'http://127.0.0.1:1/v1', api_key_env: null}]\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    problems = [line for line in str(e.value).splitlines() if line.startswith("  - ")]
    assert len(problems) == 1  # xling's config-error form: one line per problem
    assert "match no needle template of 'sw'" in problems[0]
    assert problems[0].startswith("  - study.options: ") and "Swahili_needles.csv" in problems[0]


@pytest.mark.parametrize("lang", sorted(PUBLISHED))
def test_each_template_matches_the_published_files(lang):
    templates = load_templates()
    for rel in PUBLISHED[lang]:
        path = str(MLONGRR / rel)
        assert unmatched_needles(path, lang, None) is None, rel
        for ctx in load_file(path, lang=lang):
            assert all(how == "template" for _, _, how in needle_spans(ctx, templates))
    assert "needle" in templates["languages"][lang]


def test_the_published_chinese_needle_is_found_and_measured_blind():
    """The audit's case: the zh needle of the published file (no full stop) stays glued to
    the next sentence for the blind splitter, and the split says so."""
    ctx = load_file(str(MLONGRR / "1-needle" / "Chinese_needles.csv"), lang="zh")[0]
    blind = context_split(ctx, make_splitter())
    assert [h for _, _, h in blind.needle_spans] == ["template"]
    assert blind.needle_isolated == (False,)
    unit = ctx["text"][slice(*blind.spans[blind.label_idx[0]])]
    assert unit.startswith("特别魔法数字孟买是5297426") and len(unit) > len("特别魔法数字孟买是5297426")
    oracle = context_split(ctx, make_splitter("oracle"))
    assert ctx["text"][slice(*oracle.spans[oracle.label_idx[0]])] == "特别魔法数字孟买是5297426"


def _vectors(inputs):
    """A scripted embedder: sentences with a 7-digit number point the query's way."""
    import re

    out = {sid: np.array([1.0, 0.0] if re.search(r"[0-9]{7}", t) else [0.0, 1.0], np.float32)
           for sid, t in inputs["sentences"].items()}
    out.update({k: np.array([1.0, 0.0], np.float32) for k in inputs["queries"]})
    return out


@pytest.mark.parametrize("splitter", ["multilingual", "oracle"])
def test_selections_prompts_and_tables_record_isolation_and_label_the_oracle(splitter):
    opts = STUDY.validate_options({
        "data": [str(MLONGRR / "1-needle" / "English_needles.csv")], "query_langs": ["en"],
        "ks": [1, 3], "needles": [1], "methods": ["cross"], "splitter": splitter})
    selections = select(opts, "en", _vectors(narrow_inputs(opts, "en")))
    assert all(s["needle_isolated"] is not None and len(s["needle_isolated"]) == 1
               for s in selections)
    summary = needle_summary(selections)
    assert summary["needles"] == 5 and summary["unknown"] == 0
    if splitter == "oracle":
        assert summary["isolated_share"] == 100.0
    assert STUDY.selection_summary(opts, selections)["oracle"] is (splitter == "oracle")
    by_key = {(s["context_id"], s["qlang"]): s for s in selections}
    rows = prompt_rows(opts, "1n_k3", "en-en", selections=by_key)
    assert all(r["meta"]["oracle"] is (splitter == "oracle") for r in rows)
    items = score_rows([{**r, "model": "m", "output": r["meta"]["gold"]} for r in rows])
    assert set(items["system"]) == {"cross@3" + (" (oracle)" if splitter == "oracle" else "")}
    md = markdown_tables(items)
    assert ("Oracle ablation" in md and "[oracle splitter]" in md) is (splitter == "oracle")
    assert "sentence of their own" in md  # the isolation table, per context language


def test_exact_match_reads_the_answer_the_model_gives():
    """L293/L299: the model must "provide the correct answer", "correctly identify the
    largest"; a comparative answer counts by its answer and is counted apart."""
    from xling.studies.cross.metrics import answer_number, is_comparative, score_output

    gold = "4753820"
    for output in ("The largest is 4753820, larger than 1218893.",  # the audit's case
                   "Comparing 1218893 and 4753820, the largest is 4753820.",
                   "最大的特别魔法数字是4753820，比1218893大。",
                   "4753820 (the others: 1218893 is smaller)"):
        got = score_output(output, gold)
        assert got["correct"] and got["strict"] and got["comparative"], output
        assert answer_number(output) == gold
    for output in ("4753820, 6316390 and 7252750",  # a bare list answers nothing
                   "1218893 / 4753820", "6316390 и 4753820",
                   "The largest is 7252750, not 4753820."):
        assert not score_output(output, gold)["correct"], output
    assert answer_number("4753820, 6316390 and 7252750") is None
    assert not is_comparative("The answer is 4753820.") and not is_comparative("UNANSWERABLE")
    rows = [{"output": o, "meta": {"gold": gold, "needles": 3, "method": "baseline",
                                   "qlang": "en", "labels": [gold]}}
            for o in ("The largest is 4753820, larger than 1218893", "4753820", "1218893")]
    items = score_rows(rows)
    assert items["correct"].tolist() == [True, True, False]
    assert items["comparative"].tolist() == [True, False, False]
