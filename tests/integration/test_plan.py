"""One run, one plan (core/plan.py): a run of translate and index over a corpus in S3 lists
each source prefix once, however many stages ask for the translate cells; the plan it
writes to `_runs/<run id>/plan.json` holds the cells with their typed inputs; `--dry-run`
shows each node's state; a missing input is one config error before any work."""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path

import pytest

from helpers import here, ok_here
from xling.core.store import RunStore

MRTYDI = Path(__file__).resolve().parents[2] / "data" / "demo" / "mrtydi"


def _plain(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def _config(tmp_path: Path, corpus: str, run_root: str, stages: str) -> Path:
    cfg = tmp_path / "plan.yaml"
    cfg.write_text(f"""
name: plan
run_root: {run_root}
stages: {stages}
ray: {{num_cpus: 2}}
translate:
  model: tiny:nllb_ct2
  beam_size: 1
  shards: 2
  parallel: {{concurrency: [1, 1], batch_size: 16}}
  documents:
    - {{name: mrtydi, format: mrtydi, path: "{corpus}/{{lang}}/*.jsonl.gz", langs: [fi, sw],
       targets: [en]}}
index:
  engines: [bm25]
  shards: 1
  collections:
    - {{name: mrtydi, format: mrtydi, path: "{corpus}/{{lang}}/*.jsonl.gz", langs: [fi, sw],
       translated: [en]}}
""")
    return cfg


def test_a_run_lists_each_source_prefix_once(tmp_path, s3_env, tiny_models, ray_local,
                                             monkeypatch):
    import xling.core.sources as sources

    stamp = f"{os.getpid()}-{int(time.time() * 1000)}"
    corpus = RunStore(f"s3://xling-test/plan-corpus-{stamp}")
    for lang in ("fi", "sw"):
        corpus.write_bytes(f"{lang}/corpus.jsonl.gz", (MRTYDI / f"{lang}.jsonl.gz").read_bytes())
    listed = collections.Counter()
    real_list = RunStore.list

    def counting_list(self, prefix=""):
        if self.url().startswith(corpus.url()):
            listed[self.url(prefix)] += 1
        return real_list(self, prefix)

    patterns = collections.Counter()
    real_files = sources._list_files

    def counting_files(pattern, where, lang):
        patterns[pattern] += 1
        return real_files(pattern, where, lang)

    monkeypatch.setattr(RunStore, "list", counting_list)
    monkeypatch.setattr(sources, "_list_files", counting_files)
    run_root = f"s3://xling-test/plan-run-{stamp}"
    cfg = _config(tmp_path, corpus.url(), run_root, "[translate, index]")
    # Before the run: the plan with every node pending.
    out = _plain(ok_here("run", "--config", str(cfg), "--dry-run", env=s3_env))
    assert "[plan] translate 2 cell(s); needs 2 source file(s) [2 pending]" in out, out
    assert "[plan] index 4 cell(s); needs 2 translate cell(s), 2 source file(s) [4 pending]" in out
    patterns.clear()
    listed.clear()
    ok_here("run", "--config", str(cfg), env=s3_env)
    # Two languages: two patterns, each listed once for the whole run (translate's cells,
    # index's, and index's DT cells that ask translate for theirs).
    assert patterns == {f"{corpus.url()}/{lang}/*.jsonl.gz": 1 for lang in ("fi", "sw")}
    assert sum(listed.values()) == 2, listed

    store = RunStore(run_root)
    [run_id] = store.list_dirs("_runs")
    plan = json.loads(store.read_bytes(f"_runs/{run_id}/plan.json"))
    assert plan["run_id"] == run_id and plan["stages"] == ["translate", "index"]
    by_dir = {n["dir"]: n for n in plan["nodes"]}
    dt = [n for n in plan["nodes"] if n["stage"] == "index" and n["key"]["text_lang"] == "en"]
    assert len(dt) == 2
    for node in dt:  # DT: the index of a language's translation reads that translate cell
        [up] = node["inputs"].values()
        assert by_dir[up]["stage"] == "translate"
        assert by_dir[up]["key"]["src"] == node["key"]["lang"]
        assert node["sources"] == []
    og = [n for n in plan["nodes"] if n["stage"] == "index" and n["key"]["text_lang"] != "en"]
    assert all(n["inputs"] == {} and len(n["sources"]) == 1 for n in og)
    # After it: every node done.
    out = _plain(ok_here("run", "--config", str(cfg), "--dry-run", env=s3_env))
    assert "[plan] translate 2 cell(s); needs 2 source file(s) [2 done]" in out, out
    assert "[4 done]" in out

    # index alone on a fresh run root: its DT inputs are not there, one error before work.
    lonely = _config(tmp_path, corpus.url(), f"{run_root}-alone", "[index]")
    p = here("run", "--config", str(lonely), env=s3_env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "2 input cell(s) are not done" in p.stderr and "run `xling translate" in p.stderr
    assert not RunStore(f"{run_root}-alone").list("index")


@pytest.mark.parametrize("name", ["demo.yaml", "demo-mirage.yaml", "demo-cross.yaml"])
def test_validate_prints_the_plan(name, capsys):
    from xling.config import load_config
    from xling.pipeline import validate

    root = Path(__file__).resolve().parents[2]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        assert validate(load_config(str(root / "configs" / name), [])) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[plan]")]
    assert lines and any("cell(s)" in line for line in lines)
    if name == "demo.yaml":
        assert "[plan]   embedder (tiny:bge_m3): index -> retrieve" in lines
        assert "[plan]   tiny-chat (tiny:llama_chat): generate -> judge" in lines
