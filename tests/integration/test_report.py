"""The run report: report/index.html and report/summary.md from a run root's evaluate cells.

The run root is written here with the store API (no Ray, no models): two retrieval evaluate
cells of a small config, one evaluate cell of an earlier config (superseded), two study
cells (one with a plot its module drew, one without), and the LLM-CLIR `tables.md`. The
HTML is opened in headless Chromium (Debian's `chromium`; the test skips without it, and
`.ci/run` installs it), which must find every table and load every image.
"""
from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from xling.core.store import RunStore
from xling.jobs.report import markdown_to_html, write_report

REPO = Path(__file__).resolve().parents[2]


def small_config(run_root: str):
    from xling.config import validate_config

    return validate_config({
        "name": "report-test", "run_root": run_root,
        "index": {"engines": ["bm25"], "collections": [
            {"name": "mrtydi", "format": "mrtydi", "path": "data/demo/mrtydi/{lang}.jsonl.gz",
             "langs": ["fi", "sw"]}]},
        "retrieve": {"topics": [
            {"name": "known-item", "path": "data/demo/topics/topics.known-item-{lang}.tsv",
             "langs": ["fi", "sw"], "doc_langs": ["fi", "sw"],
             "qrels": "data/demo/topics/qrels.known-item-{lang}.txt"}],
            "runs": [{"name": "bm25", "engine": "bm25", "collection": "mrtydi", "mode": "og"},
                     {"name": "bm25-rm3", "engine": "bm25", "collection": "mrtydi",
                      "mode": "og", "k1": 1.2}]},
        "evaluate": {"metrics": ["ndcg_cut_10", "recall_100"],
                     "compare": [{"baseline": "bm25", "system": "bm25-rm3"}]},
    }, source="test_report")


def png(color: str) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    FigureCanvasAgg(fig)
    fig.add_subplot(1, 1, 1).bar([0, 1], [0.3, 0.7], color=color)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)
    return buf.getvalue()


def manifest(cell_dir: str, rows: int, **extra) -> dict:
    stage, cell = cell_dir.split("/")
    return {"stage": stage, "cell": cell, "config_hash": cell.rsplit(".", 1)[-1],
            "code_version": "0.1.0+gtest", "n_shards": 1, "rows": rows, "errors": 0,
            "files": ["part-00000.parquet"], "finished_at": "2026-01-01T00:00:00+00:00",
            **extra}


def ir_cell(store: RunStore, d: str, key: dict, shift: float, marker: str) -> None:
    rows = []
    for system, base in (("bm25", 0.4), ("bm25-rm3", 0.55 + shift)):
        for m in ("ndcg_cut_10", "recall_100"):
            vals = [min(1.0, base + 0.05 * q) for q in range(6)]
            rows.append({"setting": "og", "model": system, "system": system, "metric": m,
                         "query_id": None, "value": sum(vals) / 6, "n": 6})
            rows += [{"setting": "og", "model": system, "system": system, "metric": m,
                      "query_id": f"q{q}", "value": v, "n": 1} for q, v in enumerate(vals)]
    for m in ("ndcg_cut_10", "recall_100"):
        rows.append({"setting": "comparison", "model": "bm25-rm3 vs bm25", "system": "bm25-rm3",
                     "metric": f"{m}:ttest_p", "query_id": None, "value": 0.01, "n": 6})
    store.write_parquet(f"{d}/part-00000.parquet", pa.Table.from_pylist(rows))
    store.write_bytes(f"{d}/table.md", (
        f"### {marker}: queries {key['qlang']}, documents {key['doc_lang']}\n\n"
        "| system | ndcg_cut_10 | recall_100 |\n|---|---|---|\n"
        "| bm25 | 0.4625 | 0.4625 |\n| bm25-rm3 | 0.6125 | 0.6125 |\n").encode())
    store.write_json(f"{d}/_manifest.json", manifest(d, len(rows), key=key, table="table.md"))


def study_cell(store: RunStore, d: str, study: str, plots: dict[str, bytes],
               table: str = "_table.md", plot_dir: str = "_plots/") -> None:
    rows = [{"study": study, "setting": s, "lang": lang, "model": "tiny-chat",
             "metric": "accuracy", "value": v, "ci_low": v - 5, "ci_high": v + 5, "n": 40}
            for s, v in (("mono", 61.0), ("multi", 48.5)) for lang in ("de", "zh")]
    store.write_parquet(f"{d}/part-00000.parquet", pa.Table.from_pylist(rows))
    store.write_bytes(f"{d}/{table}", (
        f"# {study.upper()} on the test data\n\n"
        "**Table 4: monolingual retrieval, accuracy (%)**\n\n"
        "| Model | De | Zh | Avg | paper Avg |\n|---|---|---|---|---|\n"
        "| tiny-chat | 61.0* | 61.0 | 61.0 (56.0, 66.0) | 58.2 |\n"
        "| *published* | 60.1 | 59.3 | 59.7 | |\n\n"
        "`*` p < 0.05 against the baseline.\n").encode())
    for name, data in plots.items():
        store.write_bytes(f"{d}/{plot_dir}{name}", data)
    store.write_json(f"{d}/_manifest.json", manifest(
        d, len(rows), key={"study": study}, table=table,
        plots=sorted(plot_dir + n for n in plots)))


@pytest.fixture
def run_root(tmp_path, monkeypatch):
    """A run root with the small config's evaluate cells, one superseded cell and two study
    cells; returns (store, config)."""
    monkeypatch.chdir(REPO)  # the config's data paths are relative to the repository
    store = RunStore(str(tmp_path / "run"))
    cfg = small_config(store.url())
    from xling.jobs.evaluate import evaluate_cells

    for i, c in enumerate(evaluate_cells(cfg)):
        ir_cell(store, c.dir, c.key, 0.01 * i, f"CURRENT-{c.key['qlang']}{c.key['doc_lang']}")
    ir_cell(store, "evaluate/known-item.fi.fi.0badc0de", {"topics": "known-item", "qlang": "fi",
                                                         "doc_lang": "fi"}, 0.0, "SUPERSEDED")
    store.write_bytes("evaluate/tables.md", b"### known-item: ndcg_cut_10\n\n"
                      b"|  | FI-FI | SW-SW | AVG |\n|---|---|---|---|\n"
                      b"| *First-stage retrieval* | | | |\n| bm25 | 0.463 | 0.463 | 0.463 |\n"
                      b"| bm25-rm3 | 0.613* | 0.623* | 0.618 |\n")
    study_cell(store, "evaluate/xrag.1234abcd", "xrag", {}, table="table.md")  # older layout
    study_cell(store, "evaluate/cross.5678ef01", "cross", {"accuracy_by_k.png": png("tab:red")})
    return store, cfg


def test_report_html_and_markdown(run_root):
    store, cfg = run_root
    from xling.pipeline import stage_registry

    text = write_report(store, cfg, stage_registry())
    # the config asks for four evaluate cells (fi/sw x fi/sw), an index and a retrieve cell
    # per pair: the study cells are not the config's, so they are superseded too
    page = store.read_bytes("report/index.html").decode()
    assert store.read_bytes("report/summary.md").decode() == text
    assert "## Results" in text and "CURRENT-fifi" in text and "CURRENT-swsw" in text
    assert "SUPERSEDED" not in text.split("## Cells")[0], "superseded results are not shown"
    assert "## Superseded cells" in text and "known-item.fi.fi.0badc0de" in text
    assert "xrag.1234abcd" in text.split("## Superseded cells")[1]
    assert re.search(r"not started yet: .*index/mrtydi", text)
    # results first: tables, then cells; confidence intervals, query counts, significance
    assert page.index('id="results"') < page.index('id="cells"') < page.index('id="provenance"')
    assert "SUPERSEDED" not in page.split('id="cells"')[0]
    assert re.search(r"<td[^>]*>6</td>", page), "query counts"
    assert re.search(r"0\.6\d{3} \[0\.\d{4}, 0\.\d{4}\]\*", page), "CI and significance mark"
    assert "bm25-rm3 vs bm25" in page
    assert "<em>First-stage retrieval</em>" in page and "0.613*" in page
    # one bar chart for the retrieval study
    figs = re.findall(r'<img src="([^"]+)"', page)
    assert figs == ["plots/retrieval/ndcg_cut_10.png"]
    assert store.read_bytes("report/plots/retrieval/ndcg_cut_10.png")[:8] == b"\x89PNG\r\n\x1a\n"
    # provenance: config hash, git sha or its absence, versions, models
    from xling.core.config import hashable, stable_hash

    assert f"hash {stable_hash(hashable(cfg))}" in page and "git sha" in page
    assert "torch" in page and "pyarrow" in page and "Python" in page
    assert "- config: report-test" in text and "- libraries: " in text


def test_report_every_cell_current(run_root):
    """Without a config every cell is current; studies' plots are copied, and a study that
    drew none gets the report's own bar chart."""
    store, _ = run_root
    text = write_report(store)
    page = store.read_bytes("report/index.html").decode()
    assert "Superseded" not in text and "superseded" not in page.split("<main>")[1]
    assert "SUPERSEDED" in text  # the old cell is just another cell now
    figs = re.findall(r'<img src="([^"]+)"', page)
    assert sorted(figs) == ["plots/cross-5678ef01/accuracy_by_k.png",
                            "plots/retrieval/ndcg_cut_10.png",
                            "plots/xrag-1234abcd/main_metric.png"]
    assert store.read_bytes("report/plots/cross-5678ef01/accuracy_by_k.png") == \
        store.read_bytes("evaluate/cross.5678ef01/_plots/accuracy_by_k.png")
    assert "<h3>XRAG on the test data</h3>" in page  # study tables' headings shifted down
    assert "<strong>Table 4: monolingual retrieval, accuracy (%)</strong>" in page
    assert "61.0*" in page and "61.0 (56.0, 66.0)" in page


def test_markdown_tables():
    out = markdown_to_html("# T\n\n**Table 1**\n\n| a | b\\|c |\n|:---|---:|\n| x | 1.5* |\n"
                           "| *y* | 2 |\n\n- one\n- two\n\ntext with `code`", demote=2)
    assert "<h3>T</h3>" in out and "<strong>Table 1</strong>" in out
    assert '<th style="text-align:left">a</th>' in out and ">b|c</th>" in out
    assert '<td class="num" style="text-align:right">1.5*</td>' in out
    assert "<td><em>y</em></td>" in out.replace(' style="text-align:left"', "")
    assert "<ul><li>one</li><li>two</li></ul>" in out and "<code>code</code>" in out
    assert out.count("<table>") == 1 and '<div class="blk"><p><strong>Table 1' in out


def test_provenance_without_heavy_imports():
    code = ("import sys, json; from xling.core.provenance import provenance; p = provenance(); "
            "print(json.dumps([p, [m for m in ('torch', 'ray', 'vllm') if m in sys.modules]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    import json

    p, imported = json.loads(out)
    assert imported == []
    assert set(p) >= {"xling", "git_sha", "python", "libraries"}
    assert p["libraries"]["torch"] and p["libraries"]["pyarrow"]
    assert "vllm" in p["libraries"] and "FlagEmbedding" in p["libraries"]


def test_model_provenance():
    from xling.core.provenance import model_provenance

    ms = model_provenance({"translate": {"model": "tiny:nllb_ct2"},
                           "generate": {"models": [
                               {"model": "Qwen/Qwen2.5-7B-Instruct"},
                               {"model": "gpt-4o", "backend": "openai"}]},
                           "judge": {"judges": [{"model": "Qwen/Qwen2.5-7B-Instruct"}]}})
    by = {m["model"]: m for m in ms}
    assert by["Qwen/Qwen2.5-7B-Instruct"]["keys"] == \
        "generate.models.0.model, judge.judges.0.model"
    assert by["Qwen/Qwen2.5-7B-Instruct"]["revision"].startswith("hub ")
    assert "API" in by["gpt-4o"]["revision"] and "tiny" in by["tiny:nllb_ct2"]["revision"]


# ---------------------------------------------------------------------------------------
# headless Chromium


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def headless(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chrome'}",
         *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(chromium() is None, reason="needs headless Chromium (Debian: apt-get "
                    "install chromium; .ci/run installs it)")
def test_report_in_chromium(run_root, tmp_path):
    store, _ = run_root
    write_report(store)
    url = (Path(store.url()) / "report" / "index.html").as_uri()
    dom = headless(tmp_path, "--virtual-time-budget=5000", "--dump-dom", url).stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body, dom[-2000:]
    assert 'data-images="3/3"' in body.group(0) and 'data-images-ok="true"' in body.group(0)
    # every table of the report: the retrieval tables.md, per cell its CI summary and
    # table.md, the two studies' tables and metric rows, cells, provenance
    assert dom.count("<table>") >= 12 and dom.count("<img ") == 3
    assert "CURRENT-fifi" in dom and "ndcg_cut_10" in dom

    # the check is not vacuous: a missing plot is seen as not loaded
    Path(store.url("report/plots/xrag-1234abcd/main_metric.png")).unlink()
    dom = headless(tmp_path, "--virtual-time-budget=5000", "--dump-dom", url).stdout
    assert 'data-images="2/3"' in dom and 'data-images-ok="false"' in dom


def test_fusion_cells_are_the_configs_own(tmp_path, monkeypatch):
    """Fusions are made after the retrieve runs (`after_run`); the report counts them as the
    config's cells, not as cells of a superseded config."""
    monkeypatch.chdir(REPO)
    from xling.pipeline import stage_registry
    from xling.config import validate_config
    from xling.jobs.report import config_cells
    from xling.jobs.retrieve import fusion_cells

    cfg = small_config(str(tmp_path / "run")).model_dump(mode="json")
    cfg["retrieve"]["fusion"] = [{"name": "rrf", "runs": ["bm25", "bm25-rm3"], "method": "rrf"}]
    cfg = validate_config(cfg, source="test_report")
    dirs, unknown = config_cells([cfg], stage_registry())
    fused = {c.dir for c in fusion_cells(cfg)}
    assert len(fused) == 4 and fused <= dirs and not unknown
