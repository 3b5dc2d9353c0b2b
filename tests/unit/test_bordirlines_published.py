"""The published BordIRLines numbers (configs/bordirlines.expected.yaml): the derived columns
of the paper's Table 4 recomputed from its own base numbers (ΔCS = (Con - Non) / Non and
ΔCS abs = Con - Non, to the rounding of the printed values), the differences the text
quotes, the transcription against the paper text, and the published numbers beside xling's
in the report table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from xling.studies.bordirlines.data import load_borderlines, load_queries
from xling.studies.bordirlines.metrics import random_metrics
from xling.studies.bordirlines.published import load_published
from xling.studies.registry import get_study

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_bordirlines_published")

validate = get_study("bordirlines").validate_options  # study.options -> the options dict

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = ROOT / "configs" / "bordirlines.expected.yaml"
PAPER = ROOT.parent / "shared" / "papers" / "bordirlines.txt"
HALF = 0.05  # half a unit of the printed last digit (one decimal)


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(EXPECTED.read_text("utf-8"))


def row_dict(raw, values) -> dict:
    return dict(zip(raw["columns"], values))


def delta_bounds(con: float, non: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """The ranges of Con - Non and 100 (Con - Non) / Non over the values that round to the
    printed Con and Non."""
    lo_c, hi_c, lo_n, hi_n = con - HALF, con + HALF, non - HALF, non + HALF
    return (lo_c - hi_n, hi_c - lo_n), (100 * (lo_c / hi_n - 1), 100 * (hi_c / lo_n - 1))


def within(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] - HALF - 1e-9 <= value <= bounds[1] + HALF + 1e-9


def table4_rows(raw):
    for label, rows in raw["table4"].items():
        for mode, values in rows.items():
            yield label, mode, row_dict(raw, values)


def test_delta_cs_recomputed_from_con_and_non(raw):
    checked = 0
    for label, mode, r in table4_rows(raw):
        if label == "RANDOM":
            assert r["Delta CS"] == r["Delta CS unnormalized"] == 0
            continue
        absolute, relative = delta_bounds(r["Control CS"], r["Non-control CS"])
        assert within(r["Delta CS unnormalized"], absolute), (label, mode, r)
        assert within(r["Delta CS"], relative), (label, mode, r)
        checked += 1
    assert checked == 7 * 6  # 7 models x 6 IR modes


def test_gpt4o_no_ir_by_hand(raw):
    r = row_dict(raw, raw["table4"]["GPT-4o"]["no_ir"])
    assert round(r["Control CS"] - r["Non-control CS"], 1) == r["Delta CS unnormalized"] == 9.7
    assert round(100 * (77.4 - 67.7) / 67.7, 1) == r["Delta CS"] == 14.3


def test_li_et_al_rows_have_the_delta_columns_swapped(raw):
    # In the quoted no_ir rows of Li et al. (2024b) "ΔCS" is Con - Non and "ΔCS abs" the
    # relative difference; BLOOM-560M's printed Con CS (67.7) fits neither, 67.1 fits both.
    for name, values in raw["li2024b_no_ir"].items():
        r = row_dict(raw, values)
        con = 67.1 if name == "BLOOM-560M" else r["Control CS"]
        absolute, relative = delta_bounds(con, r["Non-control CS"])
        assert within(r["Delta CS"], absolute), name
        assert within(r["Delta CS unnormalized"], relative), name
    bloom = row_dict(raw, raw["li2024b_no_ir"]["BLOOM-560M"])
    absolute, relative = delta_bounds(bloom["Control CS"], bloom["Non-control CS"])
    assert not within(bloom["Delta CS"], absolute)
    assert not within(bloom["Delta CS unnormalized"], relative)


def test_differences_quoted_in_the_text(raw):
    for q in raw["text_5_1"]:
        r = row_dict(raw, raw["table4"][q["model"]][q["mode"]])
        value = r[q["metric"]]
        if "minus" in q:
            value -= row_dict(raw, raw["table4"][q["model"]][q["minus"]])[q["metric"]]
        assert abs(value - q["value"]) < 1e-6, q


def test_published_file_loads_and_maps_models():
    pub = load_published(EXPECTED)
    assert pub["retriever"] == "openai" and pub["prompt"] == "direct"
    assert pub["aliases"]["gpt-4o"] == "GPT-4o" and pub["aliases"]["llama3.1-8b"] == "Llama-3 8B"
    assert pub["table4"][("GPT-4o", "no_ir")]["KB CS"] == 77.0
    assert pub["table4"][("GPT-4o", "swap")]["KB CS"] is None
    assert pub["table4"][("RANDOM", "random")]["Consistency CS all"] == 43.5
    assert len(pub["table4"]) == 1 + 7 * 6
    assert pub["citation"]["langs"]["ko"] == {"cr": 28.5, "nr": 54.7}
    # the config points at it and its model names are the paper's
    cfg = yaml.safe_load((ROOT / "configs" / "bordirlines.yaml").read_text("utf-8"))
    assert cfg["study"]["options"]["expected"] == "configs/bordirlines.expected.yaml"
    assert cfg["study"]["options"]["retriever"] == "openai"
    assert cfg["study"]["options"]["prompts"] == ["direct"]
    assert all(m["name"] in pub["aliases"] for m in cfg["generate"]["models"])


def test_transcription_matches_the_paper_text(raw):
    if not PAPER.is_file():
        pytest.skip(f"the paper text is not here ({PAPER}); the transcription is checked "
                    "against it when ../shared/papers is present")
    lines = PAPER.read_text("utf-8").splitlines()
    labels = {"GPT-40": "GPT-4o", "GPT-40-mini": "GPT-4o-mini", "Llama-3 1B": "Llama-3 1B",
              "Llama-3 3B": "Llama-3 3B", "Llama-3 8B": "Llama-3 8B",
              "Command-R 7B": "Command-R 7B", "Command-R": "Command-R"}
    modes = ["no_ir", "qlang", "qlang_en", "en", "rel_langs", "swap"]
    seen = set()
    for line in lines:
        cols = line.split("\t")
        if cols[0] not in labels or len(cols) != 11:
            continue
        label = labels[cols[0]]
        seen.add(label)
        for j, cell in enumerate(cols[2:]):
            printed = [float(x) for x in re.sub(r"</?u>", "", cell).replace("- ", "-").split()]
            ours = [raw["table4"][label][m][j] for m in modes]
            # an empty cell (KB CS of swap_docs) is missing from the PDF text
            assert printed == [x for x in ours if x is not None], (label, j)
        if label != "Command-R 7B":  # the PDF's "qlang+en qlang+en": see the yaml's header
            assert cols[1] == "no_ir qlang+en qlang+en en_only rel_langs swap_docs"
    assert seen == set(labels.values())
    (random,) = [x.split("\t") for x in lines if x.startswith("\tRANDOM\t")]
    assert [float(x) for x in random[2:9]] == raw["table4"]["RANDOM"]["random"][:7]


def test_random_row_is_the_expected_score_of_a_random_answer(tmp_path):
    # every BorderLines query, English control included: the expected consistency of a
    # uniformly random answer over the 72 Unknown-controller territories with two or more
    # claimant languages
    bl = load_borderlines()
    lines = ["query_id\tquery_text\tterritory\tlanguage"]
    for t in bl.territories:
        lines.append(f"{t}_en\tq\t{t}\ten")
    for lang, qs in bl.queries.items():
        if lang != "en":
            lines += [f"{t}_{lang}\tq\t{t}\t{lang}" for t in qs]
    (tmp_path / "queries.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    o = validate({"data": str(tmp_path), "modes": ["no_ir"], "bootstrap": 0})
    queries = load_queries(tmp_path)
    rand = {m["metric"]: m for m in random_metrics(o, bl, queries)}
    assert rand["num_territories"]["value"] == 251
    assert rand["Consistency CS unk"]["n"] == 72 and rand["Consistency CS all"]["n"] == 212
    assert rand["KB CS"]["n"] == 161
    assert {m["model"] for m in rand.values()} == {"RANDOM"}
    # 1/k averaged over each column's territories: KB CS over the 161 known controllers
    known = [1 / len(t.claimants) for t in bl.territories.values() if t.known]
    assert rand["KB CS"]["value"] == pytest.approx(sum(known) / len(known))
    assert round(100 * rand["KB CS"]["value"], 1) == 46.1
    for name in ("Control CS", "Non-control CS", "Consistency CS all", "Consistency CS unk"):
        assert 0.4 < rand[name]["value"] < 0.5, name
    # the paper's 43.5 (every CS column) is the mean 1/k over the 90 Unknown-controller
    # territories
    unknown = [1 / len(t.claimants) for t in bl.territories.values() if not t.known]
    assert len(unknown) == 90 and round(100 * sum(unknown) / len(unknown), 1) == 43.5
