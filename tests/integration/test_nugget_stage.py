"""The nuggets stage on the real engine: the tiny Llama (vLLM on CPU, in a Ray actor) as the
nugget judge of the MIRAGE fixture's answers (two scripted generators behind a local
OpenAI-compatible server). The first run is SIGKILLed while the stage commits; the resume
adds a second system. The tiny model's replies do not parse (so every window ends as an
error row after `max_tries`, which is what these rows must say), and the point here is the
stage's life: the create cells made once and reused by the second system (from the
manifests), and no prompt asked twice across the kill (the run store's LLM cache holds each
completion once)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from helpers import MIRAGE_DATA, STRENGTH, generator_reply, kill_after_commits, manifests, \
    ok_here, xling
from llm_server import LLMServer
from xling.core.status import read_cell
from xling.core.store import RunStore


def _config(path, run_root: str, url: str, tiny: str, systems: list[str]) -> None:
    api = "{{name: {m}, backend: openai, model: {m}, base_url: '" + url + "', api_key_env: null}}"
    path.write_text(textwrap.dedent(f"""\
        name: nuggets-it
        run_root: {run_root}
        ray: {{num_cpus: 2}}
        study:
          task: mirage
          options:
            data: {MIRAGE_DATA}/mirage-bench
            langs: [en]
            reference_model: s1
            held_out: []
            features: [citation_MAP@10, answer_bleu]
        generate:
          sampling: {{max_tokens: 16}}
          models: [{", ".join(api.format(m=m) for m in systems)}]
        features: {{}}
        judge:
          judges: [{api.format(m="arena")}]
          language_check: false
        nuggets:
          judge: {{name: tiny, backend: vllm, model: {tiny}, max_model_len: 1024,
                  dtype: float32, enforce_eager: true, too_long: truncate,
                  parallel: {{concurrency: [1, 1], batch_size: 4}}}}
          sampling: {{max_tokens: 12}}
          max_tries: 2
          support: [trec24]
          shards: 2
        stages: [generate, nuggets]
        """))


def _cache_keys(store: RunStore) -> list[str]:
    files = [f for f in store.list("_cache/llm") if f.endswith(".parquet")]
    return store.read_parquet(files, columns=["key"])["key"].to_pylist() if files else []


@pytest.mark.timeout(900)
def test_nuggets_killed_and_resumed_with_a_second_system(tmp_path, tiny_models, ray_local):
    run_root = str(tmp_path / "run")
    store = RunStore(run_root)
    cfg = tmp_path / "n.yaml"
    with LLMServer(models=(*STRENGTH, "arena"), delay_s=0.0) as server:
        server.reply_fn = lambda prompt, model: generator_reply(prompt, model)
        _config(cfg, run_root, server.url, "tiny:llama_chat", ["s1"])
        proc = xling("run", "--config", str(cfg), "--no-progress",
                     env={"XLING_FAULT_COMMIT_DELAY": "nuggets=0.5"},
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        kill_after_commits(proc, store, "nuggets", n=1, timeout=600)
        before = _cache_keys(store)
        _config(cfg, run_root, server.url, "tiny:llama_chat", ["s1", "s2"])
        ok_here("run", "--config", str(cfg))
    keys = _cache_keys(store)
    assert len(before) > 0 and len(keys) == len(set(keys)), "a prompt was asked twice"

    done = manifests(store, "nuggets")
    create = [m for m in done if m["key"]["step"] == "create"]
    assign = [m for m in done if m["key"]["step"] == "assign"]
    assert [m["key"]["lang"] for m in create] == ["en"]
    # one create cell per language, its id without any system in it ...
    assert all("s1" not in m["cell"] and "s2" not in m["cell"] for m in create)
    # ... read by both systems' assign cells
    assert {(m["key"]["system"], m["key"]["lang"]) for m in assign} == {
        ("s1", "en"), ("s2", "en")}
    by_lang = {m["key"]["lang"]: m["dir"] for m in create}
    assert all(m["params"]["nuggets"] == by_lang[m["key"]["lang"]] for m in assign)

    calls = 0
    for m in create:
        rows = read_cell(store, m["dir"]).to_pylist()
        assert len(rows) == 4 and len({r["item_id"] for r in rows}) == 4
        for r in rows:  # gibberish never parses: NZ's loop, then an error row, no guess
            trace = json.loads(r["trace"])
            if r["nuggets"] is None:
                assert "no parseable reply in 2 tries" in r["error"] \
                    or "the LLM call failed" in r["error"]
                assert [c["temperature"] for c in trace][:2] in ([None, 0.2], [None])
            calls += len(trace)
    assert calls > 0
    # every call of every committed row is in the cache exactly once
    assert sum(m["nuggets"]["calls"] for m in create) == calls
    for m in assign:
        rows = read_cell(store, m["dir"]).to_pylist()
        assert len(rows) == 4 and all(r["error"] for r in rows if r["nuggets"] is None)
