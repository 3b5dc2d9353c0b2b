"""Results out: `xling results` (CSV / Parquet / LaTeX of every evaluate cell's metrics
rows, TREC runs under pyserini's names), and evaluate cells whose directory reads as exactly
their metrics rows (`pandas.read_parquet(cell_dir)`): the per-item rows, the table and the
plots start with `_`.

No Ray: the retrieve cells are written by hand into a local run root and the evaluate stage
runs in the driver, as it always does; the study cell goes through `run_study_cell` with a
stand-in study module. Seconds.
"""

import io
import json
import types

import pandas as pd
import pyarrow as pa
import pytest

from xling import cli
from xling.config import validate_config
from xling.core.cells import Cell, write_driver_manifest
from xling.core.status import read_cell
from xling.core.store import RunStore
from xling.jobs import evaluate as E
from xling.core.results import export_trec_runs, latex_table, metrics_table, pyserini_run_name
from xling.studies.base import Rendered
from xling.tasks.runs import HITS_SCHEMA

QRELS = "q1 0 d1 1\nq1 0 d2 0\nq2 0 d3 2\nq3 0 d4 1\n"  # q3: no run answers it


def ir_config(tmp_path, **evaluate):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "docs.sw.jsonl").write_text(json.dumps({"docid": "d1", "text": "x"}) + "\n")
    (tmp_path / "topics.tsv").write_text("q1\tone\nq2\ttwo\nq3\tthree\n")
    (tmp_path / "qrels.sw.txt").write_text(QRELS)
    return validate_config({
        "name": "res", "run_root": str(tmp_path / "run"),
        "index": {"engines": ["bm25"], "collections": [
            {"name": "c", "format": "mrtydi", "path": str(tmp_path / "docs.{lang}.jsonl"),
             "langs": ["sw"]}]},
        "retrieve": {"topics": [{"name": "t", "path": str(tmp_path / "topics.tsv"),
                                 "langs": ["en"], "doc_langs": ["sw"],
                                 "qrels": str(tmp_path / "qrels.{doc_lang}.txt")}],
                     "runs": [{"name": "bm25", "collection": "c", "mode": "og"},
                              {"name": "bm25b", "collection": "c", "mode": "og", "k1": 1.2}]},
        "evaluate": {"metrics": ["nDCG@20", "recall_100", "AP"], **evaluate}})


HITS = {"bm25": [("q1", "d1", 1, 2.0), ("q1", "d2", 2, 1.0), ("q2", "d9", 1, 3.0),
                 ("q2", "d3", 2, 1.0)],
        "bm25b": [("q1", "d2", 1, 2.0), ("q1", "d1", 2, 1.0), ("q2", "d3", 1, 3.0)]}


def write_runs(cfg, store):
    from xling.jobs.retrieve import export_trec, run_cells

    for c in run_cells(cfg):
        rows = [{"query_id": q, "doc_id": d, "rank": r, "score": s, "system": c.key["run"]}
                for q, d, r, s in HITS[c.key["run"]]]
        t = pa.Table.from_pylist(rows, schema=HITS_SCHEMA).append_column(
            "error", pa.nulls(len(rows), pa.string()))
        store.write_parquet(f"{c.dir}/part-00000.parquet", t)
        # its shard marker, as a commit writes it: finalize reads the parts markers name
        store.write_json(f"{c.dir}/_shards/00000.json", {"shard": 0, "file": "part-00000.parquet",
                                                         "rows": len(rows), "errors": 0})
        extra = export_trec(store, c)
        store.write_json(f"{c.dir}/_manifest.json", {"key": c.key, "rows": len(rows),
                                                     "errors": 0, "n_shards": 1,
                                                     "files": ["part-00000.parquet"], **extra})


def run_ir(tmp_path, **evaluate):
    cfg = ir_config(tmp_path, **evaluate)
    store = RunStore(cfg.run_root)
    write_runs(cfg, store)
    [cell] = E.evaluate_cells(cfg)
    [manifest] = E.EvaluateStage().run_driver(cfg, store, log=lambda *_: None)
    assert manifest == store.read_json(f"{cell.dir}/_manifest.json")
    assert manifest["provenance"]  # every driver manifest carries it
    return cfg, store, cell, manifest


def test_ir_cell_reads_as_its_metrics_rows_and_averages_over_the_qrels(tmp_path):
    cfg, store, cell, manifest = run_ir(tmp_path)
    cell_dir = store.fs_path(cell.dir)
    df = pd.read_parquet(cell_dir)
    rows = read_cell(store, cell.dir)
    assert len(df) == rows.num_rows == manifest["rows"]
    assert set(df.columns) == set(rows.column_names)
    assert manifest["table"] == "_table.md" and store.exists(f"{cell.dir}/_table.md")
    # trec_eval -c: q3 (unanswered) is a query of every system, at 0, and in the mean
    means = df[df["query_id"].isna() & (df["setting"] != "comparison")]
    per = df[df["query_id"].notna()]
    assert set(per[per["system"] == "bm25"]["query_id"]) == {"q1", "q2", "q3"}
    assert (means["n"] == 3).all() and manifest["average"] == "qrels"
    ap = means[(means["system"] == "bm25b") & (means["metric"] == "AP")]["value"].item()
    assert ap == pytest.approx((1 / 2 + 1 + 0) / 3)  # q1: d1 at rank 2; q2: d3 at 1; q3: 0
    assert manifest["answered"] == {"bm25": 2, "bm25b": 2}
    # today's convention, as an option: over the queries the run answered
    cfg2, store2, cell2, m2 = run_ir(tmp_path / "run-mode", average="run")
    df2 = pd.read_parquet(store2.fs_path(cell2.dir))
    ap2 = df2[df2["query_id"].isna() & (df2["system"] == "bm25b") & (df2["metric"] == "AP")]
    assert ap2["value"].item() == pytest.approx((1 / 2 + 1) / 2) and ap2["n"].item() == 2


def test_expected_file_gives_ok_fail_in_the_table_and_manifest(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("tolerance: 0.001\nscores:\n"
                   "  t/bm25b/sw: {map: 0.5, ndcg_cut_20: 0.1}\n"
                   "  t/bm25/sw: {R@100: 0.6667}\n")
    cfg, store, cell, manifest = run_ir(tmp_path, expected=str(exp))
    table = store.read_bytes(f"{cell.dir}/_table.md").decode()
    assert "| system | nDCG@20 | recall_100 | AP | expected (±0.001) |" in table
    line = {l.split(" | ")[0][2:]: l for l in table.splitlines() if l.startswith("| bm25")}
    assert line["bm25"].endswith("| OK |")
    assert "FAIL: nDCG@20" in line["bm25b"] and "AP" not in line["bm25b"].split("FAIL")[1]
    assert manifest["expected"]["ok"] is False
    assert {(c["system"], c["metric"], c["ok"]) for c in manifest["expected"]["checks"]} == {
        ("bm25b", "AP", True), ("bm25b", "nDCG@20", False), ("bm25", "recall_100", True)}


def test_study_cell_reads_as_its_metrics_rows(tmp_path, monkeypatch):
    from xling.jobs import evaluate as S

    store = RunStore(str(tmp_path / "run"))
    gen = "generate/g.abc"
    gens = [{"item_id": str(i), "study": "s", "setting": "x", "lang": "de", "model": "m",
             "parsed": [("answer", "a")], "output": "a", "error": None} for i in range(3)]
    store.write_parquet(f"{gen}/part-00000.parquet", pa.Table.from_pylist(gens))
    store.write_json(f"{gen}/_manifest.json", {"files": ["part-00000.parquet"], "rows": 3,
                                                "errors": 0, "n_shards": 1})
    metrics = [{"study": "s", "setting": "x", "lang": "de", "model": "m", "metric": "acc",
                "value": 1.0, "ci_low": None, "ci_high": None, "n": 3}]
    # a scripted study: only the evaluate cell's control flow is under test here
    fake = types.SimpleNamespace(
        score_columns=(), options_of=lambda params: params["options"],
        score=lambda opts, gens, evidence: ([{"item_id": g["item_id"], "ok": True}
                                             for g in gens], metrics),
        render=lambda opts, items, m: Rendered("| acc |\n", {"acc.png": b"\x89PNG fake"}))
    monkeypatch.setattr(S, "study_of", lambda cfg: fake)
    cell = Cell("evaluate", {"study": "s"},
                {"options": {}, "generations": [gen], "judgments": [], "labels": None,
                 "language_check": False})
    m = write_driver_manifest(store, cell, S.run_study_cell(None, store, cell,
                                                            log=lambda *_: None), seconds=0)
    df = pd.read_parquet(store.fs_path(cell.dir))
    assert pa.Table.from_pandas(df, preserve_index=False).to_pylist() == metrics
    assert m["items"]["file"] == "_items.parquet" and m["table"] == "_table.md"
    assert m["plots"] == ["_plots/acc.png"]
    assert store.read_parquet([f"{cell.dir}/_items.parquet"]).num_rows == 3
    assert store.read_bytes(f"{cell.dir}/_plots/acc.png").startswith(b"\x89PNG")
    assert not any(f.rsplit("/", 1)[-1] == "items.parquet" for f in store.list(cell.dir))

    # `xling results` takes study rows and IR rows into one table
    cfg, _, _, _ = run_ir(tmp_path)  # the same run root
    t = metrics_table(store)
    kinds = set(zip(t["cell"].to_pylist(), t["metric"].to_pylist()))
    assert (cell.id, "acc") in kinds and any(m == "nDCG@20" for _, m in kinds)
    assert t.column_names[0] == "cell" and "query_id" in t.column_names


def test_results_cli_formats_and_trec_export(tmp_path, capsys):
    cfg, store, cell, manifest = run_ir(tmp_path)
    root = cfg.run_root
    assert cli.main(["results", root]) == 0
    out = capsys.readouterr().out
    df = pd.read_csv(io.StringIO(out))
    assert len(df) == manifest["rows"] and df["cell"].unique().tolist() == [cell.id]
    assert cli.main(["results", root, "--means", "-o", str(tmp_path / "m.csv")]) == 0
    means = pd.read_csv(tmp_path / "m.csv")
    assert means["query_id"].isna().all() and 0 < len(means) < len(df)
    assert cli.main(["results", root, "-f", "parquet", "-o", str(tmp_path / "m.parquet")]) == 0
    assert len(pd.read_parquet(tmp_path / "m.parquet")) == len(df)
    assert cli.main(["results", root, "-f", "parquet"]) == 2  # binary needs -o
    assert "needs -o" in capsys.readouterr().err
    assert cli.main(["results", root, "-f", "latex", "--trec", str(tmp_path / "trec")]) == 0
    tex = capsys.readouterr().out
    assert tex.startswith("\\begin{tabular}") and "\\toprule" in tex
    assert "nDCG@20 & recall\\_100 & AP" in tex and "bm25b+oracle" in tex
    assert "en$\\rightarrow$sw" in tex and ":ttest" not in tex
    names = sorted(p.name for p in (tmp_path / "trec").iterdir())
    assert names == ["run.t-en-sw.bm25.txt", "run.t-en-sw.bm25b.txt"]
    first = (tmp_path / "trec" / "run.t-en-sw.bm25.txt").read_text().splitlines()[0].split()
    assert first == ["q1", "Q0", "d1", "1", "2.000000", "bm25"]
    assert cli.main(["results", str(tmp_path / "empty")]) == 2


def test_pyserini_names_and_latex_by_hand(tmp_path):
    assert pyserini_run_name({"topics": "ciral-v1.0-ha-test-a", "run": "bm25-dt"}) == \
        "run.ciral-v1.0-ha-test-a.bm25-dt.txt"
    assert pyserini_run_name({"topics": "test-a", "qlang": "en", "doc_lang": "ha",
                              "run": "bm25 dt"}) == "run.test-a-en-ha.bm25-dt.txt"
    assert pyserini_run_name({"run": "ext"}) == "run.external.ext.txt"
    t = pa.Table.from_pylist([
        {"study": "s_1", "setting": "og", "lang": "en->sw", "system": "a", "metric": "map",
         "query_id": None, "value": 0.25},
        {"study": "s_1", "setting": "og", "lang": "en->sw", "system": "a", "metric": "map",
         "query_id": "q1", "value": 0.5},
        {"study": "s_1", "setting": "og", "lang": "en->sw", "system": "a", "metric": "P_10",
         "query_id": None, "value": float("nan")}])
    assert latex_table(t).splitlines()[2:5] == [
        "study & setting & lang & system & map & P\\_10 \\\\", "\\midrule",
        "s\\_1 & og & en$\\rightarrow$sw & a & 0.2500 & -- \\\\"]
    assert export_trec_runs(RunStore(str(tmp_path / "none")), tmp_path / "out") == []
