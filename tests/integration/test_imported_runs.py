"""Imported first stages (`retrieve.runs[].trec`): TREC files made elsewhere become retrieve
cells (ImportStage, after the searches), and the fusion of them is pyserini's fusion of the
same files (`pyserini.fusion`, TrecRun), run by the retrieve stage's own after-run on a
local Ray: RRF as the paper's hybrid (k 60, top-100 lists cut to 100, footnote 4, L483)
and score interpolation. The runs are over the real CIRAL sw qrels' doc ids plus unjudged
ones, with score ties, queries one run lacks, a run deeper than retrieve.depth (the import
keeps its 100 best-ranked, as pyserini's `depth` takes the first 100 lines of a file in
rank order) and a run whose rank column does not follow its scores (RRF reads the ranks).
Evaluate then scores the imported runs and the fusion with their oracles."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow.compute as pc
import pytest

from xling.core.status import read_cell
from xling.core.store import RunStore
from xling.tasks.runs import hits_table, write_trec_run
from xling.tasks.topics import iter_qrels

pyserini_fusion = pytest.importorskip("pyserini.fusion")
from pyserini.trectools import TrecRun  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QRELS = ROOT / "tests/data/qrels/qrels.ciral-v1.0-sw-test-a.tsv"


def make_runs(tmp: Path) -> list[str]:
    with open(QRELS, "rb") as f:
        judged: dict[str, list[str]] = {}
        for r in iter_qrels(f):
            judged.setdefault(r["query_id"], []).append(r["doc_id"])
    queries = sorted(judged)[:15]
    rng = random.Random(49)
    for i, name in enumerate(("nv", "e5")):
        hits = {}
        for q in queries:
            if i == 1 and rng.random() < 0.2:
                continue  # a query this run does not answer
            pool = judged[q] + [f"fake-{q}-{j}" for j in range(150)]
            chosen = rng.sample(pool, 130 if i == 0 else 40)
            hits[q] = {d: round(rng.uniform(0, 3), 1) for d in chosen}  # many ties
        t = hits_table(hits, system=name)
        if i == 1:  # ranks that are not the score order: RRF must read the rank column
            by_q: dict[str, list[int]] = {}
            for k, q in enumerate(t["query_id"].to_pylist()):
                by_q.setdefault(q, []).append(t["rank"][k].as_py())
            for v in by_q.values():
                rng.shuffle(v)
            ranks = [r for q in dict.fromkeys(t["query_id"].to_pylist()) for r in by_q[q]]
            t = t.set_column(t.schema.get_field_index("rank"), "rank",
                             pc.cast(ranks, t.schema.field("rank").type))
        write_trec_run(t, tmp / f"{name}.sw.trec")
    (tmp / "topics.tsv").write_text("".join(f"{q}\tquery {q}\n" for q in queries))
    (tmp / "docs.jsonl").write_text('{"docid": "d", "text": "x"}\n')
    return queries


CONFIG = """
name: imported
run_root: {tmp}/run
ray: {{num_cpus: 2}}
index:
  engines: [bm25]
  collections: [{{name: ciral, format: jsonl, path: '{tmp}/docs.jsonl', langs: [sw]}}]
retrieve:
  depth: 100
  topics: [{{name: test-a, path: '{tmp}/topics.tsv', langs: [en], doc_langs: [sw], qrels: '{qrels}'}}]
  runs:
    - {{name: nv, trec: '{tmp}/nv.{{doc_lang}}.trec', collection: ciral}}
    - {{name: e5, trec: '{tmp}/e5.{{doc_lang}}.trec', collection: ciral}}
  fusion:
    - {{name: hybrid, runs: [nv, e5], method: rrf, k: 60}}
    - {{name: mix, runs: [nv, e5], method: interpolate, weights: [0.3, 0.7], normalize: none}}
evaluate: {{metrics: [ndcg_cut_20, map]}}
"""


def lists(rows) -> dict[str, list[tuple[str, int, float]]]:
    out: dict[str, list] = {}
    for q, d, r, s in rows:
        out.setdefault(str(q), []).append((str(d), int(r), float(s)))
    return out


def assert_same(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for q in ours:
        assert [x[:2] for x in ours[q]] == [x[:2] for x in theirs[q]], f"query {q}"
        assert [x[2] for x in ours[q]] == pytest.approx([x[2] for x in theirs[q]], abs=1e-9)


def test_fusion_of_imported_runs_is_pyserinis(tmp_path, ray_local):
    from xling.config import load_config
    from xling.core.runner import Runner
    from xling.jobs.evaluate import EvaluateStage
    from xling.jobs.retrieve import RetrieveStage, fusion_cells, import_cells

    queries = make_runs(tmp_path)
    (tmp_path / "c.yaml").write_text(CONFIG.format(tmp=tmp_path, qrels=QRELS))
    cfg = load_config(tmp_path / "c.yaml")
    store = RunStore(cfg.run_root)
    assert RetrieveStage().cells(cfg) == []  # nothing to search: the imports come after
    RetrieveStage().after_run(cfg, Runner(store, progress=False, log=lambda *_: None))
    cells = {c.key["run"]: c for c in [*import_cells(cfg), *fusion_cells(cfg)]}
    assert set(cells) == {"nv", "e5", "hybrid", "mix"}

    def ours(name: str) -> dict:
        t = read_cell(store, cells[name].dir).sort_by([("query_id", "ascending"),
                                                       ("rank", "ascending")])
        assert t["error"].null_count == t.num_rows
        return lists(zip(*(t[c].to_pylist() for c in ("query_id", "doc_id", "rank", "score"))))

    theirs = [TrecRun(str(tmp_path / f"{n}.sw.trec")) for n in ("nv", "e5")]
    # the import: each query's 100 best-ranked lines of the file, ranks and scores as given
    nv = ours("nv")
    assert sorted(nv) == queries and all(len(v) == 100 for v in nv.values())
    df = theirs[0].run_data
    want = lists(zip(df["topic"], df["docid"], df["rank"], df["score"]))
    assert nv == {q: v[:100] for q, v in want.items()}

    def pyserini(run) -> dict:
        df = run.run_data
        return lists(zip(df["topic"], df["docid"], df["rank"], df["score"]))

    assert_same(ours("hybrid"), pyserini(pyserini_fusion.reciprocal_rank_fusion(
        theirs, rrf_k=60, depth=100, k=100)))
    assert_same(ours("mix"), pyserini(pyserini_fusion.interpolation(
        theirs, alpha=0.3, depth=100, k=100)))

    # evaluate: the imported runs and the fusions are systems with their oracles
    EvaluateStage().run_driver(cfg, store, log=lambda *_: None)
    [ecell] = store.list_dirs("evaluate")
    rows = read_cell(store, f"evaluate/{ecell}").to_pylist()
    means = {(r["model"], r["metric"]): r["value"] for r in rows if r["query_id"] is None}
    for system in ("nv", "e5", "hybrid", "mix"):
        assert means[(f"{system}+oracle", "map")] >= means[(system, "map")] > 0
    assert {r["setting"] for r in rows if r["system"] == "nv"} == {"imported"}
    assert {r["setting"] for r in rows if r["system"] == "hybrid"} == {"fusion"}
