"""Evaluation that matches the field (`xling/tasks/irmetrics.py`, `xling/jobs/evaluate.py`).

- trec_eval `-c` (the evaluate stage's default, as pyserini's 2CR for CIRAL and MIRACL):
  on the shipped CIRAL and MIRACL qrels, `evaluate(..., complete=True)` equals pytrec_eval
  run on the run padded with an empty ranking for every qrels query the run lacks (what
  trec_eval -c computes), per query and in the mean; without it, pytrec_eval as it is.
- ir-measures names (`nDCG@20`, `R@100`, `AP`, `RR@10`, `Judged@10`) beside trec_eval's;
  an unknown name names the closest valid ones; Judged@K and RR@K by hand.
- expected files (2CR style): the OK/FAIL column, its tolerance, the default file beside
  the config.

Pure Python on small files: seconds.
"""

import math
import random
from pathlib import Path

import pytest

from xling.tasks import irmetrics
from xling.tasks.irmetrics import canonical, evaluate, mean, parse_metric, qrels_dict
from xling.tasks.topics import iter_qrels

pytrec_eval = pytest.importorskip("pytrec_eval")

ROOT = Path(__file__).resolve().parents[2]
QRELS = ROOT / "tests" / "data" / "qrels"
SHIPPED = ["qrels.ciral-v1.0-sw-test-a.tsv", "qrels.ciral-v1.0-ha-test-a.tsv",
           "qrels.miracl-v1.0-fi-dev.tsv"]
TREC = ["map", "ndcg_cut_10", "ndcg_cut_20", "recall_100", "recall_1000", "P_10",
        "recip_rank", "map_cut_10", "success_1", "ndcg"]


def load(name: str, limit: int = 150) -> dict:
    with open(QRELS / name, "rb") as f:
        q = qrels_dict(iter_qrels(f))
    return {k: q[k] for k in sorted(q)[:limit]}


def some_run(qrels: dict, rng: random.Random) -> dict:
    run = {}
    for q, judged in qrels.items():
        if rng.random() < 0.25:  # the run does not answer it
            continue
        docs = [d for d in judged if rng.random() < 0.6]
        docs += [f"x{rng.randrange(10**6)}" for _ in range(rng.randint(0, 40))]
        run[q] = {d: round(rng.uniform(0, 5), 1) for d in docs}  # ties included
    run["not-judged"] = {"a": 1.0}
    return run


@pytest.mark.parametrize("name", SHIPPED)
def test_complete_equals_trec_eval_c_and_plain_equals_pytrec_eval(name):
    rng = random.Random(name)
    qrels = load(name)
    run = some_run(qrels, rng)
    assert set(qrels) - set(run)  # some qrels queries are unanswered
    ev = pytrec_eval.RelevanceEvaluator(qrels, set(TREC))
    plain_ref = ev.evaluate(run)
    c_ref = ev.evaluate({q: run.get(q, {}) for q in qrels})  # what trec_eval -c computes
    assert c_ref.keys() == qrels.keys()
    plain = evaluate(run, qrels, TREC)
    complete = evaluate(run, qrels, TREC, complete=True)
    assert plain.keys() == plain_ref.keys() and complete.keys() == qrels.keys()
    for ours, ref in ((plain, plain_ref), (complete, c_ref)):
        for q in ref:
            for m in TREC:
                assert ours[q][m] == pytest.approx(ref[q][m], abs=1e-12), (q, m)
        for m in TREC:
            want = math.fsum(v[m] for v in ref.values()) / len(ref)
            assert mean(ours, m) == pytest.approx(want, abs=1e-12)
    # -c averages over more queries, the unanswered at 0: a lower mean
    assert mean(complete, "ndcg_cut_20") < mean(plain, "ndcg_cut_20")
    assert mean(complete, "map") == pytest.approx(mean(plain, "map", queries=list(qrels)))


def test_ir_measures_names_equal_trec_eval_names():
    qrels = load(SHIPPED[0], limit=30)
    run = some_run(qrels, random.Random(1))
    pairs = {"nDCG@20": "ndcg_cut_20", "NDCG@10": "ndcg_cut_10", "R@100": "recall_100",
             "Recall@100": "recall_100", "AP": "map", "MAP": "map", "AP@10": "map_cut_10",
             "RR": "recip_rank", "MRR": "recip_rank", "P@10": "P_10",
             "Precision@10": "P_10", "Success@1": "success_1", "nDCG": "ndcg",
             "ndcg_cut.20": "ndcg_cut_20", "recall.100": "recall_100", "P.10": "P_10"}
    got = evaluate(run, qrels, [*pairs, *sorted(set(pairs.values()))], complete=True)
    for q, v in got.items():
        for irm, trec in pairs.items():
            assert v[irm] == v[trec], (q, irm)
            assert canonical(irm) == canonical(trec) == trec
    assert parse_metric("Judged@10").canonical == "Judged@10"
    assert parse_metric("MRR@10") == ("MRR@10", "RR_cut", 10, "recip_rank", "RR@10")


def test_unknown_name_names_the_closest_valid_ones():
    with pytest.raises(ValueError, match=r"unknown metric 'ndcg@20'.*nDCG@20"):
        parse_metric("ndcg@20")
    with pytest.raises(ValueError, match=r"unknown metric 'recall@100'.*Recall@100"):
        parse_metric("recall@100")
    with pytest.raises(ValueError, match=r"'ndcg_cut20'.*ndcg_cut_20"):
        parse_metric("ndcg_cut20")
    for bad in ("P_0", "nDCG@0", "AP(rel=2)", "Judged", "bleu", ""):
        with pytest.raises(ValueError, match="unknown metric"):
            parse_metric(bad)
    with pytest.raises(ValueError, match="same measure"):
        irmetrics.check_metrics(["ndcg_cut_20", "nDCG@20"])


def test_judged_and_rr_at_k_by_hand():
    qrels = {"q": {"a": 1, "b": 0, "c": -1, "e": 2}}
    # ir-measures orders by score descending, then doc_id ascending: a b c d x ...
    run = {"q": {"x": 1.0, "d": 2.0, "c": 2.0, "b": 3.0, "a": 3.0}}
    got = evaluate(run, qrels, ["Judged@1", "Judged@3", "Judged@5", "Judged@10", "RR",
                                "RR@1", "RR@2", "recip_rank"])["q"]
    assert got["Judged@1"] == 1.0 and got["Judged@3"] == 1.0  # a, b, c: judged, any grade
    assert got["Judged@5"] == 3 / 5
    assert got["Judged@10"] == 3 / 5  # fewer hits than 10: over the 5 retrieved
    # trec_eval's order: a and b tie at 3.0 -> b (doc_id descending) first; a is rank 2
    assert got["RR"] == got["recip_rank"] == 0.5
    assert got["RR@1"] == 0.0 and got["RR@2"] == 0.5
    # unanswered under -c, and a query without hits: 0 (ir-measures divides by 0 there)
    empty = evaluate({"q": {}}, qrels, ["Judged@10", "RR@10"])
    assert empty == {"q": {"Judged@10": 0.0, "RR@10": 0.0}}
    assert evaluate({}, qrels, ["Judged@10"], complete=True) == {"q": {"Judged@10": 0.0}}


def test_empty_qrels_entry_scores_zero():
    # possible in the dict form (mirage citations): trec_eval would not know the query
    assert evaluate({"q": {"a": 1.0}}, {"q": {}}, ["map_cut_10", "recall_10"]) == {
        "q": {"map_cut_10": 0.0, "recall_10": 0.0}}


# ---------------------------------------------------------------------------------------
# the evaluate stage's settings and expected files


def test_evaluate_config_names_and_average():
    from xling.core.config import ConfigError, validate
    from xling.jobs.evaluate import EvaluateConfig

    ec = validate(EvaluateConfig, {"metrics": ["nDCG@20", "R@100", "Judged@10", "map"]})
    assert ec.average == "qrels" and ec.metrics == ["nDCG@20", "R@100", "Judged@10", "map"]
    assert validate(EvaluateConfig, {"average": "run"}).average == "run"
    with pytest.raises(ConfigError, match=r"nDCG@20"):
        validate(EvaluateConfig, {"metrics": ["ndcg@20"]})
    with pytest.raises(ConfigError, match="average"):
        validate(EvaluateConfig, {"average": "all"})


def test_expected_checks_and_table(tmp_path):
    from xling.core.config import ConfigError
    from xling.core.cells import Cell
    from xling.jobs.evaluate import check_expected, markdown_table, read_expected

    f = tmp_path / "x.expected.yaml"
    f.write_text("source: test\nscores:\n"
                 "  t/bm25/sw: {ndcg_cut_20: 0.4000, recall_100: 0.5000}\n"
                 "  t/dense/en-sw: {nDCG@20: 0.3000, map: 0.1}\n")
    exp = read_expected(str(f))
    assert exp["tolerance"] == 0.005  # the default
    key = {"topics": "t", "qlang": "en", "doc_lang": "sw"}
    means = {"bm25": {"nDCG@20": 0.4040, "R@100": 0.5060},
             "dense": {"nDCG@20": 0.2990, "R@100": 0.7},
             "bm25+oracle": {"nDCG@20": 0.9, "R@100": 0.5}}
    checks = check_expected(exp, key, means, ["nDCG@20", "R@100"])
    got = {(c["system"], c["metric"]): c["ok"] for c in checks}
    assert got == {("bm25", "nDCG@20"): True, ("bm25", "R@100"): False,
                   ("dense", "nDCG@20"): True, ("dense", "map"): False}  # map: not computed
    cell = Cell("evaluate", key, {})
    md = markdown_table(cell, ["nDCG@20", "R@100"], means, [], {}, checks=checks,
                        tolerance=exp["tolerance"])
    lines = md.splitlines()
    assert lines[2] == "| system | nDCG@20 | R@100 | expected (±0.005) |"
    row = {l.split(" | ")[0][2:]: l for l in lines[4:]}
    assert row["bm25"].endswith("FAIL: R@100 0.5060 vs 0.5000 (Δ +0.0060) |")
    assert "FAIL: map n/a vs 0.1000 (not computed" in row["dense"]
    assert row["bm25+oracle"].endswith("|  |")
    f.write_text("tolerance: 0.01\nscores:\n  t/bm25/sw: {recall_100: 0.5}\n")
    exp = read_expected(str(f))
    assert [c["ok"] for c in check_expected(exp, key, means, ["nDCG@20", "R@100"])] == [True]
    # no expected numbers for the cell: no column
    assert "expected" not in markdown_table(cell, ["nDCG@20"], {"bm25": {"nDCG@20": 0.4}}, [], {})
    f.write_text("scores:\n  t/bm25/sw: {bleu: 0.5}\n")
    with pytest.raises(ConfigError, match="unknown metric 'bleu'"):
        check_expected(read_expected(str(f)), key, means, ["nDCG@20"])
    with pytest.raises(ConfigError, match="file not found"):
        read_expected(str(tmp_path / "none.yaml"))


def test_expected_file_beside_the_config_is_the_default(tmp_path, monkeypatch):
    from xling.config import load_config

    monkeypatch.chdir(ROOT)  # the demo config's data paths are relative to the repository
    text = (ROOT / "configs" / "demo.yaml").read_text()
    cfg = tmp_path / "demo.yaml"
    cfg.write_text(text)
    assert load_config(cfg).evaluate.expected is None
    (tmp_path / "demo.expected.yaml").write_text("scores: {}\n")
    assert load_config(cfg).evaluate.expected == str(tmp_path / "demo.expected.yaml")
    other = tmp_path / "other.yaml"
    other.write_text(text)
    assert load_config(other, ["evaluate.expected=/x.yaml"]).evaluate.expected == "/x.yaml"
    # the ciral config names its own, the same file (its imported runs read $CIRAL_RUNS)
    monkeypatch.setenv("CIRAL_RUNS", str(tmp_path))
    ciral = load_config(ROOT / "configs" / "retrieve-ciral.yaml")
    assert Path(ciral.evaluate.expected).name == "retrieve-ciral.expected.yaml"
