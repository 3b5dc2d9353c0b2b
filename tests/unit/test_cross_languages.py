"""CROSS in any language (issue 27): Chinese, Hindi and Somali haystacks with a needle at a
known depth go through the narrow stage's ranking (a scripted embedder), the prompts,
scoring and the tables: the needle is its own sentence, retrieved at k = 1, and the table's
measured depth is the planted one; English Punkt (the compat splitter) reproduces the
defect. Also: two files of one language and needle count run apart (tags) or are refused,
languages are data, a needle that matches no template makes no needle-only prompt, exact
match is the primary metric (Chinese numerals read), and the <=64k / >64k columns name
their length unit."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from xling.studies.cross.data import load_contexts
from xling.studies.cross.metrics import contains_gold, score_output, score_rows, strict_correct
from xling.studies.cross.narrow import narrow_inputs, select
from xling.studies.cross.options import Options
from xling.studies.cross.prompts import prompt_row, prompt_rows
from xling.studies.cross.split import context_split, make_splitter
from xling.studies.cross.tables import table_by_depth, table_summary
from xling.studies.registry import get_study

STUDY = get_study("cross")

# Haystack sentences written for this test (no dataset), and each language's needle: the
# templates.json needle with the city as the language writes it.
HAY = {
    "zh": ["村庄位于一座绿色小山的脚下。", "每个星期六，农民们把蔬菜带到市场上。", "冬天，通往城镇的道路经常因大雪而关闭。",
           "孩子们每天早上步行去学校。", "河边有一座古老的石桥。", "夏天的晚上，人们在广场上乘凉。",
           "图书馆里有很多关于历史的书。", "这里的茶叶在全国都很有名。"],
    "hi": ["गाँव एक हरी पहाड़ी की तलहटी में बसा है।", "हर शनिवार किसान सब्ज़ियाँ बाज़ार लाते हैं।",
           "सर्दियों में शहर का रास्ता अक्सर बंद हो जाता है।", "बच्चे हर सुबह पैदल स्कूल जाते हैं।",
           "नदी के किनारे एक पुराना पत्थर का पुल है।", "गर्मियों की शाम लोग चौक पर बैठते हैं।",
           "पुस्तकालय में इतिहास की कई किताबें हैं।", "यहाँ की चाय पूरे देश में मशहूर है।"],
    # scraped Somali: no space after a full stop, and v1's needle has no full stop
    "so": ["Tuulladu waxay ku taal cagta buur cagaaran.",
           "Sabti kasta beeralaydu waxay keenaan khudrad.",
           "Carruurtu subax walba lugta ayay ku aadaan dugsiga.",
           "Webiga agtiisa waxaa ku yaal buundo duug ah.",
           "Fiidkii xagaaga dadku waxay fadhiyaan fagaaraha.",
           "Maktabadda waxaa ku jira buugaag badan.", "Shaaha halkan waa caan.",
           "Roobku wuu da'ay shalay."],
}
# zh: the published NLTK/Chinese_needles.csv wording (no 的, no full stop)
NEEDLE = {"zh": ("开罗", "特别魔法数字{city}是{number}"),
          "hi": ("काहिरा", "{city} की विशेष जादुई संख्या {number} है।"),
          "so": ("Qaahira", "Lambarka gaarka ah ee {city} waa {number}")}
JOIN = {"zh": "", "hi": " ", "so": ""}
LABEL = "4753820"


def haystack(lang: str, before: int, repeat: int = 3) -> tuple[str, float]:
    """The language's sentences ``repeat`` times with the needle after sentence ``before``;
    returns the text and the planted depth (characters before the needle / all)."""
    sents = HAY[lang] * repeat
    city, template = NEEDLE[lang]
    needle = template.format(city=city, number=LABEL)
    parts = sents[:before] + [needle] + sents[before:]
    join = JOIN[lang]
    prefix = join.join(sents[:before]) + (join if before else "")
    text = join.join(parts)
    assert text.startswith(prefix + needle)
    return text, len(prefix) / len(text)


def write_csv(path: Path, rows: list[tuple[str, int, str]], city: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["context_length", "position", "text", "city", "label"])
        for length, position, text in rows:
            w.writerow([length, position, text, city, LABEL])
    return str(path)


def embed(text: str) -> np.ndarray:
    """The scripted embedder: a sentence holding a 7-digit number points the query's way,
    the rest across; a query is the unit vector [1, 0]."""
    has_number = re.search(r"(?<![0-9])[0-9]{7}(?![0-9])", text) is not None
    return np.array([1.0, 0.0] if has_number else [0.0, 1.0], dtype=np.float32)


def run_cross(opts: dict, clang: str) -> tuple[list[dict], pd.DataFrame]:
    """narrow (scripted embedder) -> 1n_k1 prompts -> a perfect reader -> item scores."""
    got = narrow_inputs(opts, clang)
    vectors = {sid: embed(text) for sid, text in got["sentences"].items()}
    vectors.update({key: np.array([1.0, 0.0], np.float32) for key in got["queries"]})
    selections = {(s["context_id"], s["qlang"]): s for s in select(opts, clang, vectors)}
    rows = prompt_rows(opts, "1n_k1", f"en-{clang}", selections=selections)
    scored = []
    for r in rows:
        assert r["error"] is None, r["error"]
        given = r["prompt"].split("#CONTEXT\n", 1)[1].rsplit("\n#ENDCONTEXT", 1)[0]
        numbers = re.findall(r"[0-9]{7}", given)
        output = numbers[0] if numbers else "UNANSWERABLE"
        scored.append({**r, "model": "perfect", "output": output})
    return rows, score_rows(scored)


@pytest.mark.parametrize("lang,blind_isolated", [("zh", False), ("hi", True), ("so", False)])
def test_needle_is_its_own_unit_retrieved_at_k1_at_the_planted_depth(tmp_path, lang,
                                                                       blind_isolated):
    """The blind splitter (the default) isolates a needle only where the text marks it (hi:
    ।); the zh needle (no full stop) and the Somali one (no full stop, scraped text) stay
    glued to the next sentence, and the selections say so. The oracle ablation cuts each
    needle out by its template."""
    cases, planted = [], {}
    for position, before in ((25, 6), (50, 12), (75, 18)):
        text, depth = haystack(lang, before)
        cases.append(("2k", position, text))
        planted[position] = depth
    path = write_csv(tmp_path / f"{lang}.csv", cases, NEEDLE[lang][0])
    opts = STUDY.validate_options({"data": [{"path": path, "lang": lang,
                                             "length_unit": "words:xling"}],
                                   "query_langs": ["en"], "ks": [1], "needles": [1],
                                   "methods": ["baseline", "cross", "needle_only"]})
    city, template = NEEDLE[lang]
    needle = template.format(city=city, number=LABEL)
    for ctx in load_contexts(opts):
        blind = context_split(ctx, make_splitter())
        i = blind.label_idx[0]
        assert (ctx["text"][slice(*blind.spans[i])] == needle) is blind_isolated
        assert blind.needle_isolated == (blind_isolated,) and blind.n_isolated == 0
        oracle = context_split(ctx, make_splitter("oracle"))
        assert oracle.n_sentences == len(HAY[lang]) * 3 + 1  # every sentence, and the needle
        assert ctx["text"][slice(*oracle.spans[oracle.label_idx[0]])] == needle
        assert oracle.needle_isolated == (True,)
        # the paper's English Punkt buries it (zh, hi: no terminator it knows; so: glued)
        punkt = context_split(ctx, make_splitter("punkt_english"))
        assert ctx["text"][slice(*punkt.spans[punkt.label_idx[0]])] != needle
        assert punkt.n_sentences < oracle.n_sentences
    rows, items = run_cross(opts, lang)
    assert [r["meta"]["target_rank"] for r in rows] == [1, 1, 1]  # retrieved at k = 1
    assert all(r["meta"]["splitter_fp"].startswith("multilingual:sentencex-") for r in rows)
    assert all(r["prompt"].count(needle) == 1 for r in rows)
    assert all(r["meta"]["needle_isolated"] == [blind_isolated] and not r["meta"]["oracle"]
               for r in rows)
    assert items["correct"].all() and (items["unit"] == "words:xling").all()
    table = table_by_depth(items)
    for (needles, depth_bin), row in table.iterrows():
        position = int(row["nominal"])
        assert depth_bin == position  # the planted depth falls in its own bin here
        assert row["measured"] == pytest.approx(100 * planted[position], abs=1e-9)
        assert row["cross@1"] == 100
    # the needle-only sanity prompt shows the needle sentence
    only = prompt_rows(opts, "1n_needle_only", f"en-{lang}")
    assert all(r["error"] is None and f"#CONTEXT\n{needle}\n#ENDCONTEXT" in r["prompt"]
               for r in only)


def test_two_files_of_one_language_and_needle_count_run_apart_or_are_refused(tmp_path):
    a_text, _ = haystack("zh", 6)
    b_text, _ = haystack("zh", 12)
    a = write_csv(tmp_path / "v1" / "Chinese_needles.csv", [("2k", 25, a_text)], "开罗")
    b = write_csv(tmp_path / "v2" / "Chinese_needles.csv", [("2k", 25, b_text)], "开罗")
    base = {"query_langs": ["en"], "ks": [1], "needles": [1]}
    with pytest.raises(ValidationError, match="would collide.*`tag`"):
        STUDY.validate_options({**base, "data": [a, b]})
    # a URI is only read at load time: the same refusal comes from load_contexts
    uri = STUDY.validate_options({**base, "data": [a, "file://" + b]})
    with pytest.raises(ValueError, match="would collide"):
        load_contexts(uri)
    opts = STUDY.validate_options({**base, "data": [{"path": a, "tag": "v1"},
                                                    {"path": b, "tag": "v2"}]})
    ids = [c["context_id"] for c in load_contexts(opts)]
    assert ids == ["1n.zh.v1.2k.25.r0", "1n.zh.v2.2k.25.r0"]
    rows, _ = run_cross(opts, "zh")
    by_id = {r["item_id"]: r["meta"] for r in rows}
    # each file keeps its own ranking: the needle sits in a different sentence in each
    assert by_id["1n.zh.v1.2k.25.r0"]["label_idx"] == [6]
    assert by_id["1n.zh.v2.2k.25.r0"]["label_idx"] == [12]
    assert all(m["target_rank"] == 1 for m in by_id.values())


def test_languages_are_data(tmp_path):
    text, _ = haystack("so", 4)
    path = write_csv(tmp_path / "Somali_needles.csv", [("2k", 25, text)], "Qaahira")
    opts = STUDY.validate_options({"data": [path], "query_langs": ["en"]})  # not in V2
    assert opts.context_langs == ["so"]
    # a query language without prompt strings is refused by name (not "not in mLongRR-V2")
    with pytest.raises(ValidationError, match="no 1-needle prompt for 'de'"):
        STUDY.validate_options({"data": [path], "query_langs": ["de"]})
    # unverified prompts are refused as before
    with pytest.raises(ValidationError, match="unverified"):
        STUDY.validate_options({"data": [path], "query_langs": ["hi"]})
    # a context language without a needle template runs its baseline only
    de = write_csv(tmp_path / "German_needles.csv",
                   [("2k", 25, "Ein Satz. Die Zahl ist 4753820. Noch ein Satz.")], "Kairo")
    with pytest.raises(ValidationError, match="no needle template.*'de'"):
        STUDY.validate_options({"data": [de], "query_langs": ["en"]})
    STUDY.validate_options({"data": [de], "query_langs": ["en"], "methods": ["baseline"]})
    with pytest.raises(ValidationError, match="extra_terminators apply to the Punkt"):
        STUDY.validate_options({"data": [path], "query_langs": ["en"],
                                "extra_terminators": ["।"]})


def test_needle_only_without_a_template_match_is_an_error_row():
    text = "村庄位于山脚下。这里的号码是4753820而已。冬天很冷。"  # not the zh needle template
    ctx = {"context_id": "1n.zh.2k.50.r0", "needles": 1, "lang": "zh", "length": "2k",
           "length_value": 2000, "unit": "words:xling", "position": 50, "run": 0,
           "text": text, "labels": [LABEL], "cities": ["开罗"], "gold": LABEL, "target": 0,
           "error": None}
    # the prompt options alone, unvalidated: the context is given, no data file is read
    opts = Options.model_construct(splitter="multilingual")
    row = prompt_row(ctx, "1n_needle_only", "en", opts)
    assert row["prompt"] is None and "match no needle template of 'zh'" in row["error"]
    base = prompt_row(ctx, "1n_baseline", "en", opts)  # the baseline does not need it
    assert base["error"] is None and base["meta"]["needle_match"] == ["label"]


def test_exact_match_is_primary_and_chinese_numerals_count():
    gold = "4753820"
    for output in ("4753820", "答案是四百七十五万三千八百二十。", "四七五三八二〇", "۴٬۷۵۳٬۸۲۰",
                   "The number is 4,753,820."):
        assert strict_correct(output, gold) and contains_gold(output, gold), output
    for output in ("14753820", "4753820.5", "4753820, 6316390 and 7252750"):
        assert contains_gold(output, gold) and not strict_correct(output, gold), output
        assert not score_output(output, gold)["correct"]  # exact by default
        assert score_output(output, gold, scoring="containment")["correct"]
    with pytest.raises(ValueError, match="scoring"):
        score_output("4753820", gold, scoring="substring")


def test_summary_length_columns_name_their_unit():
    recs = [{"model": "m", "needles": 1, "method": "baseline", "k": None, "system": "baseline",
             "length": L, "length_value": v, "position": 50, "unit": unit,
             "correct": ok, "strict": ok, "contains": True}
            for unit, ok in (("tokens:gpt-4o", True), ("words:nltk", False))
            for L, v in (("2k", 2000), ("128k", 128_000))]
    s = table_summary(pd.DataFrame(recs)).loc[(1, "m", "baseline")]
    assert s["<=64k tokens"] == 100 and s[">64k tokens"] == 100
    assert s["<=64k words"] == 0 and s[">64k words"] == 0
    assert s["all"] == s["exact"] == 50 and s["containment"] == 100
    assert "<=64k" not in s.index

