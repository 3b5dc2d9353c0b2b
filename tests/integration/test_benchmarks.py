"""Every benchmark in benchmarks/ runs here at a tiny size, both its sides (the bare engine
and xling's stage), as a smoke test of its code path: a rename in xling breaks this test,
not the next measurement (issue 48: `benchmarks/dense.py` imported a function that had
moved, and nobody knew until it was run). No timing is asserted; each must print its table
of rates, with numbers.

The benchmarks run in this process on its Ray node (`ray_local`; benchmarks/common.py's
`start_ray` joins a Ray this process is connected to), on the tiny models, except
generate.py, which loads vLLM in its own process as a user runs it (a subprocess, on the
same node through $RAY_ADDRESS).
"""

from __future__ import annotations

import importlib
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
# `whole run docs/s   12.3   45.6   3.70`: the unit, then bare, xling and their ratio.
RATE = re.compile(r"^\s*(whole run|steady) (\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.M)


def rates(out: str) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(whole run | steady, unit) -> (bare, xling, ratio), from print_ratios' lines."""
    return {(m[1], m[2]): tuple(float(x) for x in m.groups()[2:]) for m in RATE.finditer(out)}


def assert_rates(out: str, *units: str) -> None:
    got = rates(out)
    for unit in units:
        for kind in ("whole run", "steady"):
            assert (kind, unit) in got, f"no {kind} {unit} line in:\n{out}"
            bare, xling, ratio = got[kind, unit]
            assert all(math.isfinite(v) and v >= 0 for v in (bare, xling, ratio)), (kind, unit,
                                                                                   out)
            # A whole-run ratio can print as 0.00 at this size: start-up is all of it.
            assert kind == "whole run" or bare > 0 and xling > 0, (kind, unit, out)


def run_main(name: str, argv: list[str], monkeypatch, capsys) -> str:
    """benchmarks/<name>.py's main() with `argv`, in this process: what it printed. The
    environment is restored after (translate.py sets OMP_NUM_THREADS as it is imported)."""
    monkeypatch.syspath_prepend(str(BENCH))  # the benchmarks import each other by name
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    saved = dict(os.environ)
    try:
        importlib.import_module(name).main()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = capsys.readouterr().out
    print(out)  # shown when the test fails (or with -s)
    return out


@pytest.fixture
def bench(monkeypatch, capsys, tmp_path, tiny_models, ray_local):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the benchmarks' work folders
    return lambda name, *argv: run_main(name, list(argv), monkeypatch, capsys)


def test_ingest(bench):
    out = bench("ingest", "--docs", "300", "--shards", "2", "--concurrency", "1",
                "--batch-size", "100")
    assert_rates(out, "docs/s")


def test_index_and_bm25_search(bench):
    out = bench("index", "--docs", "600", "--queries", "10", "--threads", "1", "--shards", "2",
                "--depth", "10")
    assert_rates(out, "docs/s", "queries/s")
    bare, xling = map(int, re.search(r"hits: bare (\d+), xling (\d+)", out).groups())
    assert bare == xling > 0


def test_dense(bench):
    out = bench("dense", "--docs", "60", "--queries", "12", "--shards", "2", "--actors", "1",
                "--depth", "5")
    assert_rates(out, "passages/s", "queries/s")
    bare, xling = map(int, re.search(r"hits: bare (\d+), xling (\d+)", out).groups())
    assert bare == xling == 12 * 5
    # The runner's operator times, from Ray Data's block stats: the union of an operator's
    # calls is never longer than their sum (benchmarks/common.py's steady rate).
    ops = re.findall(r"^\s+(\S.*?)\s+busy\s+([\d.]+) s, union of its calls\s+([\d.]+) s$", out,
                     re.M)
    searcher = [(float(b), float(u)) for op, b, u in ops if "StoreDenseSearcher" in op]
    assert searcher and all(0 < u <= b + 1e-3 for b, u in searcher), ops


def test_translate(bench):
    out = bench("translate", "--sentences", "16", "--beam-size", "1", "--max-decode", "6",
                "--batch-size", "8", "--shards", "2", "--intra-threads", "1")
    assert_rates(out, "sent/s")
    bare, xling = map(int, re.search(r"target tokens: bare (\d+), xling (\d+)", out).groups())
    assert bare == xling > 0


def test_features(bench):
    out = bench("features", "--pairs", "8", "--ray-batch", "4", "--max-length", "64",
                "--batch-size", "4")
    assert_rates(out, "pairs/s")
    assert out.count("whole run pairs/s") == 2  # NLI and the reranker
    for diff in re.findall(r"max \|xling - bare\| \w+ (\S+)", out):
        assert float(diff) < 1e-3


def test_narrow(bench):
    out = bench("narrow", "--lengths", "2k", "--shards", "2", "--actors", "1")
    assert_rates(out, "texts/s")
    same, total = map(int, re.search(r"top-10 equal to bare's in (\d+) of (\d+)", out).groups())
    assert same == total > 0


def test_scale(bench):
    out = bench("scale", "--docs", "400", "--queries", "5", "--langs", "en,zh", "--vocab", "300")
    table = re.findall(r"^\| 400 \| (\w+) \| ([\d.]+) \| ([\d,.]+) (\w+)/s \| [\d,]+ "
                       r"\| ([\d,]+) \| ([\d,]+) / ([\d,]+) \| ([\d,]+) \|$", out, re.M)
    assert [(row[0], row[3]) for row in table] == [
        ("ingest", "docs"), ("index", "docs"), ("retrieve", "queries")], out
    for _, wall, rate, _, peak, partition, pipeline, _ in table:
        assert float(wall) > 0 and float(rate.replace(",", "")) > 0
        # the stage's object-store peak is its partition's or its pipelines'
        assert int(peak.replace(",", "")) == max(int(partition.replace(",", "")),
                                                 int(pipeline.replace(",", ""))), out


def test_generate(tmp_path, tiny_models, worker_ray):
    """vLLM in the benchmark's own process; xling's `generate` joins this test's node."""
    p = subprocess.run([sys.executable, str(BENCH / "generate.py"), "--prompts", "6",
                        "--max-tokens", "8", "--shards", "3", "--max-model-len", "512",
                        "--batch-size", "2"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    print(p.stdout)
    assert_rates(p.stdout, "prompts/s")
    bare, xling = map(int, re.search(r"output tokens: bare (\d+), xling (\d+)",
                                     p.stdout).groups())
    assert bare == xling > 0
    summed, union = map(float, re.search(r"generator calls: ([\d.]+) s summed, ([\d.]+) s their "
                                         r"union", p.stdout).groups())
    assert 0 < union <= summed
