"""The cell ids (key and hash) that `xling validate` plans for every `configs/*.yaml`.

The golden test (tests/unit/test_golden_plan.py) compares them with `tests/data/golden/cells.json`,
written by `python tests/golden_plan.py --write` before a refactor: a change that moves code
must not move a cell (its directory, hence every committed result, is named by its hash).

Configs that name remote data (hub ids, s3://my-bucket) are planned over local stand-ins:
the test fixtures for the studies' data, and empty files under a fixed folder for the S3
corpora (planning lists files but never reads them). The stand-ins are the same before and
after, so equal ids mean the code plans the same cells.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "golden" / "cells.json"
S3_STANDIN = Path("/tmp/xling-golden-s3")
_LANGS = ("ha", "so", "sw", "yo", "fi", "it", "ru", "de", "en")

# remote data -> the test fixture with the same layout
_STANDINS = {
    "hf:AmazonScience/XRAG/xrag.test.jsonl": "tests/data/xrag/xrag.test.jsonl",
    "hf:AmazonScience/XRAG": "tests/data/xrag/xrag.test.jsonl",
    "hf:borderlines/bordirlines": "tests/data/bordirlines",
    "hf:nthakur/mirage-bench": "tests/data/mirage/mirage-bench",
    "data/mirage-bench-output": "tests/data/mirage/mirage-bench-output",
    "data/mirage-bench-pairwise-judgments": "tests/data/mirage/mirage-bench-pairwise-judgments",
    "data/mLongRR/Dataset/1-Needle/GPT4o/English_needles.csv":
        "tests/data/mlongrr/1-needle/English_needles.csv",
    "data/mLongRR/Dataset/1-Needle/GPT4o/Swahili_needles.csv":
        "tests/data/mlongrr/1-needle/Swahili_needles.csv",
    "data/mLongRR/Dataset/3-Needles/GPT4o/English_needles.csv":
        "tests/data/mlongrr/3-needles/English_needles.csv",
}


def _s3_standin(value: str) -> str:
    local = str(S3_STANDIN) + "/" + value.removeprefix("s3://my-bucket/")
    for lang in _LANGS if ("{lang}" in local or "{doc_lang}" in local) else ("",):
        path = Path(local.replace("{lang}", lang).replace("{doc_lang}", lang).replace("*", "x"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return local


def _env_standin(value: str) -> str:
    """`${NAME}/...` (licensed data, imported runs: configs/retrieve-clef2003.yaml) -> empty
    files under a fixed folder, every {lang} x {doc_lang} of them."""
    import itertools
    import re

    local = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", rf"{S3_STANDIN}/env/\1", value)
    for lang, doc_lang in itertools.product(_LANGS, repeat=2):
        path = Path(local.replace("{lang}", lang).replace("{doc_lang}", doc_lang)
                    .replace("*", "x"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return local


def _local(node):
    if isinstance(node, dict):
        return {k: _local(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_local(v) for v in node]
    if isinstance(node, str):
        if node in _STANDINS:
            return _STANDINS[node]
        if node.startswith("s3://my-bucket/"):
            return _s3_standin(node)
        if "${" in node:
            return _env_standin(node)
    return node


def plan(config: Path) -> list[str]:
    """`[stage] cell-id` lines, in validate's order, for one config over its stand-ins."""
    from xling.pipeline import stage_registry
    from xling.config import validate_config
    from xling.core.runner import Runner
    from xling.core.store import RunStore

    data = _local(yaml.safe_load(config.read_text()))
    if config.name == "mirage.yaml":  # the fixture holds two of the paper's 18 languages
        data["study"]["options"]["langs"] = ["en", "sw"]
    data["run_root"] = str(S3_STANDIN / "runs" / config.stem)
    cfg = validate_config(data, source=str(config))
    runner = Runner(RunStore(cfg.run_root))
    return [f"[{name}] {c['cell']}" for name in cfg.stages if name != "report"
            for c in runner.plan(stage_registry()[name](), cfg)]


def configs() -> list[Path]:
    return sorted(p for p in (ROOT / "configs").glob("*.yaml")
                  if not p.name.endswith(".expected.yaml"))


def plans() -> dict[str, list[str]]:
    import os

    os.chdir(ROOT)  # configs name their data relative to the checkout
    return {p.name: plan(p) for p in configs()}


if __name__ == "__main__":
    got = plans()
    if "--write" in sys.argv:
        FIXTURE.write_text(json.dumps(got, indent=1) + "\n")
    print(json.dumps({k: len(v) for k, v in got.items()}, indent=1))
