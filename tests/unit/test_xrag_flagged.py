"""XRAG and translations that translate's language check flagged (issue 45): by default the
flagged translation is used (the paper translated with Google Translate and answered every
item), each prompt records which of its articles were flagged, and the flagged share is a
metric and a table per setting and language; `flagged_translations: wrong` is the opt-in
that makes such an item an error row (wrong under accuracy_over: all); a translate entry
that drops flagged articles (lang_check: error) is refused at validation when they are to
be used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xling.config import load_config
from xling.core.config import ConfigError
from xling.studies.base import Evidence, StudyInputs
from xling.studies.registry import get_study
from xling.studies.xrag import data

XRAG = get_study("xrag")
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "xrag" / "xrag.test.jsonl"
FLAG = "wrong language: declared 'de' but the text looks like English (0.97)"


def _translations():
    out = {}
    for lang in ("de", "zh"):
        with open(DATA, "rb") as f:
            for row in data.iter_article_documents(f, lang=lang, source="xrag-articles"):
                out[row["doc_id"]] = f"[EN translation of {row['doc_id']}] The text."
    return out


def _prompts(opts, flags):
    return XRAG.build_prompts(opts, "multi_en_x", "de", inputs=StudyInputs(
        translations=_translations(), translation_flags=flags))


def test_flagged_translation_is_used_by_default_and_recorded():
    opts = XRAG.validate_options({"data": str(DATA)})
    assert opts.flagged_translations == "use"  # the default, left out of the cell hash:
    assert "flagged_translations" not in opts.as_options()
    flagged = "ml-de-004#a0"
    rows = _prompts(opts, {flagged: FLAG})
    assert all(r["error"] is None for r in rows)  # every item answered
    by_id = {r["item_id"]: r for r in rows}
    assert by_id["ml-de-004"]["meta"] == {"flagged_translations": [flagged]}
    assert "[EN translation of ml-de-004#a0]" in by_id["ml-de-004"]["prompt"][0]["content"]
    assert all(r["meta"] == {"flagged_translations": []} for r in rows
               if r["item_id"] != "ml-de-004")
    # settings that read no translation record nothing
    mono = XRAG.build_prompts(opts, "mono", "de", inputs=StudyInputs())
    assert all(r["meta"] is None for r in mono)


def test_counting_flagged_as_wrong_is_the_opt_in():
    opts = XRAG.validate_options({"data": str(DATA), "flagged_translations": "wrong"})
    assert opts.flagged_translations == "wrong"
    rows = {r["item_id"]: r for r in _prompts(opts, {"ml-de-004#a0": FLAG})}
    bad = rows["ml-de-004"]
    assert bad["prompt"] is None and "flagged by the language check" in bad["error"]
    assert "flagged_translations: wrong" in bad["error"]
    assert bad["meta"] == {"flagged_translations": ["ml-de-004#a0"]}
    assert sum(r["error"] is not None for r in rows.values()) == 1


def _gen(item_id, flagged, lang="de"):
    return {"item_id": item_id, "setting": "multi_en_x", "lang": lang, "model": "m",
            "parsed": {"answer": "x"}, "output": "<answer>x</answer>", "error": None,
            "meta": json.dumps({"flagged_translations": ["d#a0"] if flagged else []})}


def test_flagged_share_is_reported_per_setting_and_language():
    opts = XRAG.validate_options({"data": str(DATA), "langs": ["de", "zh"]})
    gens = [_gen("a", True), _gen("b", False), _gen("c", False), _gen("d", False),
            _gen("e", True, "zh"), _gen("f", True, "zh")]
    judgments = [{"item_id": g["item_id"], "setting": "multi_en_x", "lang": g["lang"],
                  "model": "m", "judge": "j", "verdict": "correct", "error": None}
                 for g in gens]
    items, metrics = XRAG.score(opts, gens, Evidence(judgments=judgments))
    assert [i["flagged_translation"] for i in items] == [True, False, False, False, True, True]
    rate = {(r["lang"], r["setting"]): r for r in metrics
            if r["metric"] == "flagged_translation_rate"}
    assert rate[("de", "multi_en_x")]["value"] == pytest.approx(25.0)
    assert rate[("de", "multi_en_x")]["n"] == 4
    assert rate[("zh", "multi_en_x")]["value"] == pytest.approx(100.0)
    assert rate[("avg", "multi_en_x")]["value"] == pytest.approx(62.5)
    # used: every item is judged, the flagged ones too (accuracy over all six)
    acc = {r["lang"]: r["value"] for r in metrics
           if r["metric"] == "accuracy" and r["setting"] == "multi_en_x"}
    assert acc["de"] == acc["zh"] == 100.0
    md = XRAG.render(opts, items, metrics).markdown
    assert "Flagged translations" in md and "25.0" in md


def test_a_translate_entry_that_drops_flagged_articles_is_refused(tmp_path):
    text = (ROOT / "configs" / "demo.yaml").read_text()
    assert "lang_check: flag" in text
    cfg = tmp_path / "demo.yaml"
    cfg.write_text(text.replace("lang_check: flag", "lang_check: error"))
    with pytest.raises(ConfigError) as e:
        load_config(cfg, ["run_root=/tmp/unused"])
    lines = [line for line in str(e.value).splitlines() if line.startswith("  - ")]
    assert len(lines) == 1 and "set lang_check: flag on that entry" in lines[0]
    load_config(cfg, ["run_root=/tmp/unused", "study.options.flagged_translations=wrong"])
    load_config(ROOT / "configs" / "demo.yaml", ["run_root=/tmp/unused"])
