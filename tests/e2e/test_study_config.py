"""Study configs: bad options, missing sections and missing files are refused before any
work starts (exit 2, a message that says what to fix); a good config expands into the
cells a researcher expects (settings x languages x models, x judges)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import here

ROOT = Path(__file__).resolve().parents[2]
XRAG = str(ROOT / "configs/xrag.yaml")
BORD = str(ROOT / "configs/bordirlines.yaml")
XDATA = f"study.options.data={ROOT}/tests/data/xrag/xrag.test.jsonl"
XTR = f"translate.documents.0.path={ROOT}/tests/data/xrag/xrag.test.jsonl"
BDATA = f"study.options.data={ROOT}/tests/data/bordirlines"
CROSS = str(ROOT / "configs/demo-cross.yaml")


def xling(*args) -> subprocess.CompletedProcess:
    """`xling *args` in this process: the configs are refused (or only planned) before Ray
    starts, so no process of its own is needed (tests/helpers.py `here`)."""
    return here(*args)


@pytest.mark.parametrize("args, needle", [
    ((XRAG, XDATA, XTR, "study.options.langs=[de, xx]"), "Unknown language code: 'xx'"),
    ((XRAG, XDATA, XTR, "study.options.settings=[mono, bogus]"), "unknown setting(s) ['bogus']"),
    ((XRAG, "study.options.data=/nope/xrag.jsonl", XTR), "file not found: /nope/xrag.jsonl"),
    ((XRAG, XDATA, "translate=null"),
     "add translate.documents entry 'xrag-articles' (format: xrag)"),
    ((XRAG, XDATA, XTR, "study=null"), "judge scores a study's generations"),
    ((XRAG, XDATA, XTR, "study=null", "judge=null"), "generate needs prompts"),
    ((XRAG, XDATA, XTR, "evaluate.labels=/nope/labels.jsonl"),
     "evaluate.labels: file not found"),
    ((XRAG, XDATA, XTR, "study.task=nosuchstudy"), "study.task"),
    ((BORD, BDATA, "study.options.modes=[qlang, sideways]"), "study.options.modes"),
    ((BORD, "study.options.data=/nope"), "study.options.data"),
    ((BORD, BDATA, "study.options.langs=[ru, xx]"), "'xx'"),
    ((CROSS, "narrow=null"), "needs a `narrow:` section"),
    ((XRAG, XDATA, XTR, "narrow={model: tiny:bge_m3}"), "with task: cross"),
    ((CROSS, "study.options.allow_unverified=false"), "allow_unverified: true"),
    ((CROSS, "study.options.data=[/nope/English_needles.csv]"), "git clone"),
])
def test_bad_study_configs_are_refused_before_work(tmp_path, args, needle):
    p = xling("run", "--config", *args, f"run_root={tmp_path}/run")
    assert p.returncode == 2, p.stdout + p.stderr
    assert needle in p.stderr, p.stderr
    assert not (tmp_path / "run").exists()  # nothing was written


def test_study_cells_are_settings_x_langs_x_models_x_judges(tmp_path):
    p = xling("run", "--config", XRAG, XDATA, XTR, "study.options.langs=[de, zh]",
              "translate.documents.0.langs=[de, zh]",
              "study.options.settings=[mono, multi_en_x, no_retrieval]",
              f"run_root={tmp_path}/run", "--dry-run")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    gen = [x for x in lines if x.startswith("[generate]")]
    judge = [x for x in lines if x.startswith("[judge]")]
    assert len(gen) == 3 * 2 * 3 and len(judge) == 3 * 2 * 3 * 3
    assert sum(x.startswith("[translate]") for x in lines) == 2  # de->en, zh->en articles
    assert sum(x.startswith("[evaluate]") for x in lines) == 1
    assert any("xrag.multi_en_x.zh.gpt-4o.judge-gpt-4o." in x for x in judge)
    p = xling("run", "--config", BORD, BDATA, "study.options.prompts=[direct, citation]",
              f"run_root={tmp_path}/run2", "--dry-run")
    assert p.returncode == 0, p.stderr
    gen = [x for x in p.stdout.splitlines() if x.startswith("[generate]")]
    # no_ir-direct + (qlang, rel_langs) x (direct, citation), 4 fixture languages, 3 models
    assert len(gen) == 5 * 4 * 3
