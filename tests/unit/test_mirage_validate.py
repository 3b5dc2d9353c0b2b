"""MIRAGE checks at `xling validate` what it can (issue 45): held-out names against the
config's models (run route) or the published judgments' roster (published route), as one
config error before any stage; R² on fewer than two held-out models, or in a tournament
where their scores are equal, is "not defined" (counted, never averaged); the paper's
Figures 11-12 wording for features 10-11 is an option, and the features manifest records
which wording made them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from xling.config import load_config
from xling.core.config import ConfigError
from xling.studies.base import Evidence
from xling.studies.mirage import constants, features, surrogate, tables
from xling.studies.mirage.options import Knobs
from xling.studies.mirage.prompts import PROMPTS
from xling.studies.registry import get_study

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "mirage"
STUDY = get_study("mirage")


def _problem(exc: ConfigError) -> str:
    lines = [line for line in str(exc).splitlines() if line.startswith("  - ")]
    assert len(lines) == 1, str(exc)  # one config error, one line
    return lines[0]


def test_run_route_held_out_names_are_checked_at_validate():
    common = [f"study.options.data={DATA}/mirage-bench", "run_root=/tmp/unused"]
    # configs/mirage.yaml names its generate models; the paper's hub ids match none of them
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs/mirage.yaml",
                    [*common, "study.options.held_out=[google/gemma-1.1-2b-it, llama3-70b]"])
    line = _problem(e.value)
    assert "held_out ['google/gemma-1.1-2b-it'] are not among the arena's models" in line
    assert "gemma-1.1-2b" in line and "Traceback" not in str(e.value)
    # holding out all but one model leaves no surrogate to train
    cfg = load_config(ROOT / "configs/mirage.yaml", common)
    names = [m.name for m in cfg.generate.models]
    with pytest.raises(ConfigError, match="leaves fewer than two"):
        load_config(ROOT / "configs/mirage.yaml",
                    [*common, f"study.options.held_out=[{', '.join(names[1:])}]"])
    assert cfg.study.options.held_out == ["gemma-1.1-2b", "llama3-70b"]


def test_the_demo_holds_out_two_models_of_its_arena():
    cfg = load_config(ROOT / "configs/demo-mirage.yaml", ["run_root=/tmp/unused"])
    held = cfg.study.options.held_out
    names = {m.name for m in cfg.generate.models}
    assert len(held) >= 2 and set(held) <= names and len(names - set(held)) >= 2


def test_published_route_held_out_names_are_checked_against_the_roster():
    d = str(DATA)
    common = [f"study.options.data={d}/mirage-bench", "run_root=/tmp/unused",
              "study.options.source=published", f"study.options.outputs={d}/mirage-bench-output",
              f"study.options.judgments={d}/mirage-bench-pairwise-judgments",
              "study.options.langs=[en]"]
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs/mirage.yaml",
                    [*common, "study.options.held_out={published: [gemma-2b, gpt-4-azure]}"])
    assert "held_out ['gemma-2b'] are not among the published judgments' models" in \
        _problem(e.value)
    ok = load_config(ROOT / "configs/mirage.yaml", common)
    assert ok.study.options.held_out == list(constants.HELD_OUT)


def _arena_metrics(held_out):
    opts = STUDY.validate_options({
        "data": f"{DATA}/mirage-bench", "source": "published",
        "outputs": f"{DATA}/mirage-bench-output",
        "judgments": f"{DATA}/mirage-bench-pairwise-judgments", "langs": ["en"],
        "tournaments": 10, "matches": 4, "held_out": held_out})
    _, metrics = STUDY.score(opts, [], Evidence())
    return metrics, {(r["model"], r["metric"]): r["value"] for r in metrics}


def test_r2_on_one_held_out_model_is_reported_as_not_defined():
    metrics, m = _arena_metrics(["google/gemma-1.1-2b-it"])
    assert m[("all", "held_out_r2")] is None  # before: 0.000 (0.000, 0.000)
    assert m[("all", "held_out_models")] == 1
    assert m[("all", "r2_undefined_tournaments")] == 10
    md = tables.tables(metrics)
    assert "not defined (1 held-out model)" in md and "R² undefined (tournaments)" in md
    metrics, m = _arena_metrics(list(constants.HELD_OUT))
    assert m[("all", "held_out_r2")] is not None and m[("all", "held_out_models")] == 2


def test_near_equal_held_out_models_are_guarded_and_counted():
    """Two held-out models of equal strength in some tournaments: those tournaments' R² is
    not defined (counted), and the mean is over the others (before: one R² of about -1e18
    made the mean -1.2e17)."""
    models = ["m0", "m1", "m2", "m3", "m4"]
    theta = np.array([[0.0, 1.0, 2.0, 2.0, 3.0],            # m2 = m3: not defined
                      [0.0, 1.0, 2.0, 2.0 + 1e-10, 3.0],    # ~equal: not defined
                      [0.0, 1.0, 1.5, 2.5, 3.0]])
    x = np.array([[0.0], [1.0], [2.0], [2.2], [3.0]])

    class Boot:  # the Bootstrap's fields surrogate_tournaments reads
        pass

    boot = Boot()
    boot.models, boot.theta, boot.draws = models, theta, [["q"]] * 3

    class Table:
        def means(self, draws):
            return x

    knobs = Knobs(held_out=("m2", "m3"), surrogate="linear")
    got = surrogate.surrogate_tournaments(boot, Table(), knobs)["held_out_r2"]
    assert np.isnan(got[0]) and np.isnan(got[1]) and np.isfinite(got[2])
    assert int(np.isnan(got).sum()) == 2


@pytest.mark.parametrize("wording", ["reference", "paper"])
def test_features_10_11_wording_switch(wording):
    """feature_prompts selects the wording of features 10-11 through the features stage's
    inputs: the research code's (reference, the default) or the paper's Figures 11-12."""
    from xling.studies.mirage.data import items_of

    raw = {"data": f"{DATA}/mirage-bench", "langs": ["en"], "reference_model": "a",
           "held_out": []}
    if wording == "paper":
        raw["feature_prompts"] = "paper"
    opts = STUDY.validate_options(raw)
    assert opts.feature_prompts == wording  # reference by default
    # ... and left out of the cells' options dict at its default (their ids stay)
    assert ("feature_prompts" in opts.as_options()) == (wording == "paper")
    qid = items_of(opts, "en")[0]["query_id"]
    gens = [{"item_id": qid, "model": m, "output": f"##Reason: r\n##Answer: {m}",
             "error": None} for m in ("a", "b")]
    rows = features.feature_inputs(opts, "llm", "en", gens)
    prompts = {r["input_id"].rsplit("|", 1)[1]: r["prompt"] for r in rows
               if r["model"] == "b"}
    other = "reference" if wording == "paper" else "paper"
    for feature, name in (("overlap", "answer_overlap"), ("fluency", "fluency")):
        mine, theirs = PROMPTS[f"{name}_{wording}"], PROMPTS[f"{name}_{other}"]
        head = mine.split("{{")[0]
        assert prompts[feature].startswith(head) and head != theirs.split("{{")[0][:len(head)]
    # Figure 12 says Fluency where the research code says Coherence
    word = "Fluency (1-5)" if wording == "paper" else "Coherence (1-5)"
    assert word in prompts["fluency"]


@pytest.mark.parametrize("wording", ["reference", "paper"])
def test_the_features_manifest_records_the_wording(tmp_path, wording):
    """The llm features cell's manifest (FeaturesStage.finalize) says which wording made
    features 10-11."""
    from types import SimpleNamespace

    import pyarrow as pa

    from xling.core.store import RunStore
    from xling.jobs.features import FeaturesStage

    store = RunStore(str(tmp_path))
    store.write_parquet("cell/part-00000.parquet",
                        pa.table({"cached": [False], "error": pa.array([None], pa.string())}))
    # its shard marker, as a commit writes it: finalize reads the parts markers name
    store.write_json("cell/_shards/00000.json", {"shard": 0, "file": "part-00000.parquet",
                                                 "rows": 1, "errors": 0})
    options = STUDY.validate_options({"data": f"{DATA}/mirage-bench", "held_out": [],
                                      "feature_prompts": wording})
    cell = SimpleNamespace(dir="cell", key={"scorer": "llm", "lang": "en"},
                           params={"options": options.as_options()})
    cfg = SimpleNamespace(study=SimpleNamespace(task="mirage", options=options))
    out = FeaturesStage().finalize(cell, cfg, store)
    assert out["feature_prompts"] == wording and out["scored"]["rows"] == 1
