"""A stage finds its inputs by the upstream stage's name (core/upstream.py), never by
importing it: the lookups answer with the upstream stage's own cells, once per command, and
reach the stage classes through the pipeline's registry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from xling.core import memo, upstream
from xling.core.cells import StageFailed

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo(monkeypatch):
    from xling.config import load_config

    monkeypatch.chdir(ROOT)  # the demo names its data relative to the checkout
    return load_config(ROOT / "configs" / "demo.yaml")


def test_lookups_answer_with_the_upstream_stages_own_cells(demo):
    from xling.pipeline import stage_registry

    stages = stage_registry()
    with memo.run_scope():
        retrieve = upstream.cells(demo, "retrieve")
        assert [c.dir for c in retrieve] == [c.dir for c in stages["retrieve"]().all_cells(demo)]
        assert {"rrf", "rrf-dt", "bm25-qt"} <= {c.key["run"] for c in retrieve}  # fusions too
        searched = 0
        for c in retrieve:
            for index_id in c.params.get("indexes", {}).values():
                found = upstream.cell(demo, "index", index_id)
                assert found.id == index_id
                assert upstream.find(demo, "index", **found.key) is found
                searched += 1
            for d in c.inputs:  # an input that is a cell is found at its directory
                if d.startswith(("retrieve/", "translate/")):
                    assert upstream.at(demo, d).dir == d
        assert searched > 0
        # a QT run reads the translate cell of its topics, by kind, source and languages
        qt = next(c for c in retrieve if c.key["run"] == "bm25-qt" and c.key["doc_lang"] == "fi")
        assert upstream.translation(demo, "query", "known-item-en-fi", "en", "fi").dir == \
            qt.inputs[0]
        with pytest.raises(StageFailed, match="no doc translation 'known-item-en-fi'"):
            upstream.translation(demo, "doc", "known-item-en-fi", "en", "fi")
        with pytest.raises(StageFailed, match="no index cell"):
            upstream.find(demo, "index", collection="mrtydi", lang="fi", text_lang="fi",
                          engine="splade")
        with pytest.raises(StageFailed, match="makes no cell"):
            upstream.cell(demo, "translate", "no-such-id")
        assert upstream.cells(demo, "rerank") == []  # no rerank section: no cells
        with pytest.raises(StageFailed, match="no stage named 'summarize'"):
            upstream.stage("summarize")


def test_asking_again_in_a_command_lists_nothing_again(demo):
    with memo.run_scope():
        upstream.cells(demo, "retrieve")
        listed = memo.listings()
        assert listed > 0
        first = upstream.cells(demo, "index")
        assert upstream.cells(demo, "index") == first
        upstream.translation(demo, "doc", "mrtydi", "fi", "en")
        assert memo.listings() == listed


def test_a_stage_used_alone_reaches_the_registry_by_name():
    """Nothing has imported the pipeline: the first lookup imports it by name."""
    code = (
        "import sys\n"
        "from xling.config import load_config\n"
        "from xling.jobs.retrieve import RetrieveStage\n"
        "assert 'xling.pipeline' not in sys.modules\n"
        "cells = RetrieveStage().cells(load_config('configs/demo.yaml'))\n"
        "assert 'xling.pipeline' in sys.modules and cells\n"
        "print(len(cells))\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) > 0
