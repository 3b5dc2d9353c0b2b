"""`xling sweep`: a grid of overrides as one run (real Lucene index, BM25 search, evaluate).

BM25's k1 is swept over the demo's Finnish Mr.TyDi passages and known-item topics. The index
cells are the same at every grid point, so they are built once; each grid point gets its
own retrieve cell; the comparison table has one column per grid point; a rerun skips all.
"""

from pathlib import Path

import pytest

from xling.core.config import ConfigError
from xling.core.store import RunStore
from xling.core.sweep import as_overrides, comparison_table, grid_points, parse_grid

ROOT = Path(__file__).resolve().parents[2]


def test_grid_expansion_and_table():
    grid = parse_grid(["retrieve.runs.0.k1=0.6,1.2", "retrieve.runs.0.b=0.4,0.75"])
    assert grid == {"retrieve.runs.0.k1": [0.6, 1.2], "retrieve.runs.0.b": [0.4, 0.75]}
    points = grid_points(grid)
    assert points == [{"retrieve.runs.0.k1": 0.6, "retrieve.runs.0.b": 0.4},
                      {"retrieve.runs.0.k1": 0.6, "retrieve.runs.0.b": 0.75},
                      {"retrieve.runs.0.k1": 1.2, "retrieve.runs.0.b": 0.4},
                      {"retrieve.runs.0.k1": 1.2, "retrieve.runs.0.b": 0.75}]
    assert as_overrides(points[1]) == ["retrieve.runs.0.k1=0.6", "retrieve.runs.0.b=0.75"]
    assert as_overrides({"rerank.runs.0.langs": ["fi", "de"]}) == ["rerank.runs.0.langs=[fi, de]"]
    row = {"study": "t", "setting": "og", "lang": "fi->fi", "system": "bm25", "model": None,
           "metric": "map"}
    table = comparison_table(points[:2], [[{**row, "value": 0.5}], [{**row, "value": 0.25}]])
    assert table.splitlines()[-1] == "| t | og | fi->fi | bm25 |  | map | 0.5000 | 0.2500 |"
    with pytest.raises(ConfigError, match="given twice"):
        parse_grid(["a.b=1,2", "a.b=3"])
    with pytest.raises(ConfigError, match="no grid"):
        grid_points({})


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(f"""
name: sweep
run_root: {tmp_path / 'run'}
stages: [index, retrieve, evaluate]
ray: {{num_cpus: 2}}
index:
  engines: [bm25]
  shards: 2
  collections:
    - {{name: mrtydi, format: mrtydi, path: "{ROOT}/data/demo/mrtydi/{{lang}}.jsonl.gz",
       langs: [fi]}}
retrieve:
  depth: 20
  shards: 1
  topics:
    - {{name: known-item-fi, path: "{ROOT}/data/demo/topics/topics.known-item-{{lang}}.tsv",
       langs: [fi], doc_langs: [fi],
       qrels: "{ROOT}/data/demo/topics/qrels.known-item-{{lang}}.txt"}}
  runs:
    - {{name: bm25, engine: bm25, collection: mrtydi, mode: og}}
evaluate:
  metrics: [recip_rank, recall_10]
sweep:
  grid: {{retrieve.runs.0.k1: [0.6, 1.2]}}
""")
    return cfg


def test_sweep_runs_the_grid_in_one_run_root(ray_local, tmp_path, capsys):
    from xling.cli import main

    cfg = _config(tmp_path)
    assert main(["sweep", "--config", str(cfg), "--no-progress",
                 "--grid", "retrieve.runs.0.b=0.4,0.75"]) == 0
    out = capsys.readouterr().out
    store = RunStore(str(tmp_path / "run"))
    assert len(store.list_dirs("index")) == 1  # the grid points share the index cell
    assert len(store.list_dirs("retrieve")) == 4  # one per (k1, b)
    [table] = [p for p in store.list("report") if "/sweep-" in p]
    lines = store.read_bytes(table).decode().splitlines()
    head = lines[2]
    assert head.count("k1=") == 4 and "k1=0.6, b=0.4" in head and "k1=1.2, b=0.75" in head
    mrr = [l for l in lines if "| recip_rank |" in l and "| bm25 |" in l and "oracle" not in l]
    assert len(mrr) == 1
    values = [float(v) for v in mrr[0].strip("| ").split(" | ")[-4:]]
    assert all(0 < v <= 1 for v in values)
    assert "[sweep] 4 grid points" in out
    # A rerun: every cell is done, nothing runs again (-v: a line per skipped cell).
    assert main(["sweep", "--config", str(cfg), "--no-progress", "-v",
                 "--grid", "retrieve.runs.0.b=0.4,0.75"]) == 0
    again = capsys.readouterr().out
    assert "committed" not in again and again.count("skipped") >= 5
