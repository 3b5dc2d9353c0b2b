"""The shipped CIRAL config (configs/retrieve-ciral.yaml) end to end with the tiny models:
every stage of it (translate, index, retrieve with its imported first stages and both
hybrids, rerank with its five models, evaluate, report), with only its data, models and
parallelism swapped for small ones; its runs, fusions, rerank runs and evaluate section
are the shipped ones. RankZephyr and Llama are the tiny vLLM chat model (one engine for
both, loaded once: same model and settings), Aya-101 the tiny mT5 through CTranslate2 on
the CPU (tiny:aya_ct2); RankGPT-3.5/4.1 are OpenAI-compatible models
served on 127.0.0.1 (tests/llm_server.py), answering each window with its passages
reversed, so those reranked runs differ from their first stages. (BM25-DT over the tiny
model's translations finds nothing for the English queries: its rerankers' rows are the
error rows "no hits", counted, and score 0.)

It shows (issue 49): one tables.md with every reranker of the run root, the rerank of an
imported first stage (NV-Embed-v2) with its `*` and PRI row, and the hybrid of an imported
run with its oracle; a second config on the same run root adds to the same tables.md.

Data: the Hausa test-a topics and qrels of CIRAL v1.0 (tests/data), three queries; the
documents are the judged ids of those queries and a few others, their texts the Hausa
paragraph of tests/data/text/paragraphs.json (CIRAL's texts are not in the repository)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import yaml

from helpers import ok
from llm_server import LLMServer
from xling.core.status import read_cell
from xling.core.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
TOPICS = ROOT / "tests/data/topics/topics.ciral-v1.0-ha-test-a.tsv"
QRELS = ROOT / "tests/data/qrels/qrels.ciral-v1.0-ha-test-a.tsv"
IMPORTED = ("mgte", "repllama", "e5", "nv-embed-v2")
DEPTH = 6  # candidates per query: PRP's 10 passes sort them all


def tiny_data(tmp: Path) -> None:
    queries = TOPICS.read_text().splitlines()[:3]
    qids = [q.split("\t")[0] for q in queries]
    judged: dict[str, list[str]] = {}
    for line in QRELS.read_text().splitlines():
        q, _, d, _ = line.split()
        if q in qids and len(judged.setdefault(q, [])) < 4:
            judged[q].append(d)
    ids = sorted({d for ds in judged.values() for d in ds}) + [f"FILL#{i}" for i in range(4)]
    sentences = json.loads((ROOT / "tests/data/text/paragraphs.json").read_text())[
        "paragraphs"]["ha"]["sentences"]
    with (tmp / "ha.jsonl").open("w") as f:
        for k, d in enumerate(ids):
            f.write(json.dumps({"docid": d, "title": "", "url": "",
                                "text": " ".join(sentences[k % 4:] + sentences[:k % 4])},
                               ensure_ascii=False) + "\n")
    (tmp / "topics.tsv").write_text("\n".join(queries) + "\n")
    (tmp / "qrels.tsv").write_text("".join(l + "\n" for l in QRELS.read_text().splitlines()
                                           if l.split()[0] in qids))
    rng = random.Random(49)
    (tmp / "runs").mkdir()
    for name in IMPORTED:
        with (tmp / "runs" / f"{name}.ha.trec").open("w") as f:
            for q in qids:
                for k, d in enumerate(rng.sample(ids, len(ids))):
                    f.write(f"{q} Q0 {d} {k + 1} {30 - k}.5 {name}\n")


def tiny_config(tmp: Path, server: LLMServer) -> dict:
    """configs/retrieve-ciral.yaml with tiny data, models and parallelism."""
    cfg = yaml.safe_load((ROOT / "configs/retrieve-ciral.yaml").read_text())
    one = {"concurrency": [1, 1], "batch_size": 8}
    cfg.update(run_root=str(tmp / "run"), ray={"num_cpus": 2})
    t = cfg["translate"]
    for k in ("quantization", "compute_type", "device", "max_batch_tokens"):
        t.pop(k)
    t.update(model="tiny:nllb_ct2", shards=1, parallel=one)
    t["documents"][0].update(path=str(tmp / "{lang}.jsonl"), langs=["ha"])
    ix = cfg["index"]
    ix.update(shards=1, dense={"model": "tiny:bge_m3", "max_length": 64, "query_max_length": 32,
                               "parallel": one})
    ix["collections"][0].update(path=str(tmp / "{lang}.jsonl"), langs=["ha"])
    r = cfg["retrieve"]
    r.update(depth=DEPTH, shards=1, parallel=one)
    r["topics"] = r["topics"][:2]  # test-a and native-ha: the Hausa ones
    for ts in r["topics"]:
        ts.update(path=str(tmp / "topics.tsv"), qrels=str(tmp / "qrels.tsv"), doc_langs=["ha"])
    r["runs"][0]["topics"] = ["native-ha"]
    vllm = {"backend": "vllm", "model": "tiny:llama_chat", "max_model_len": 1024,
            "dtype": "float32", "enforce_eager": True,
            "parallel": {"concurrency": [1, 1], "batch_size": 4}}
    rr = cfg["rerank"]
    rr.update(shards=1)
    for m in rr["models"]:
        if m.get("backend") == "openai":
            m.update(base_url=server.url, api_key_env=None)
        elif m.get("backend") == "ctranslate2":  # Aya-101: the tiny mT5, on the CPU
            m.update(model="tiny:aya_ct2", device="cpu",
                     parallel={"concurrency": [1, 1], "batch_size": 4})
        else:  # rankzephyr and llama: the same tiny engine
            name = m["name"]
            m.clear()
            m.update(name=name, **vllm)
    return cfg


def reversed_window(prompt: str) -> str:
    n = len(re.findall(r"^\[\d+\]", prompt, re.MULTILINE))
    return " > ".join(f"[{i}]" for i in range(n, 0, -1))


def test_the_shipped_ciral_config_with_tiny_models(tmp_path, tiny_models):
    tiny_data(tmp_path)
    env = {"CIRAL_RUNS": str(tmp_path / "runs")}
    with LLMServer(models=("gpt-3.5-turbo", "gpt-4.1")) as server:
        server.reply_fn = reversed_window
        cfg = tiny_config(tmp_path, server)
        (tmp_path / "ciral.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        out = ok("run", "--config", str(tmp_path / "ciral.yaml"), env=env)
        assert server.calls["gpt-3.5-turbo"] and server.calls["gpt-4.1"]
    store = RunStore(cfg["run_root"])
    # RankZephyr and Llama are one tiny engine here, loaded once for all their 12 runs
    [run_id] = store.list_dirs("_runs")
    plan = store.read_json(f"_runs/{run_id}/plan.json")
    assert [(e["model"], e["stages"]) for e in plan["engines"] if "rerank" in e["stages"]] == [
        ("tiny:llama_chat", ["rerank"]), ("tiny:aya_ct2", ["rerank"])]
    assert "[rerank] committed 28 cell(s)" in out
    md = store.read_bytes("evaluate/tables.md").decode()
    test_a = md.split("### test-a: ndcg_cut_20")[1].split("###")[0]
    rows = {l.split("|")[1].strip(): l for l in test_a.splitlines() if l.startswith("| ")}
    # every reranker of the config, five models, in one table
    reranks = [r["name"] for r in cfg["rerank"]["runs"]]
    assert set(reranks) <= set(rows)
    # the imported first stages, the hybrid of an imported run, and their oracles
    for system in (*IMPORTED, "nv-hybrid", "hybrid"):
        assert system in rows and f"{system}+oracle" in rows
    # the rerank of the imported NV-Embed-v2 is linked: a PRI row against its oracle
    headroom = md.split("### test-a: ndcg_cut_20")[1].split("PRI and Realized %")[1]
    [pri] = [l for l in headroom.splitlines() if l.startswith("| nv-rankzephyr-dt | nv-embed-v2 |")]
    s1, s_star, p, s2, realized = (float(c) for c in pri.strip("|").split("|")[2:])
    first = float(rows["nv-embed-v2"].split("|")[2].rstrip("* "))
    oracle = float(rows["nv-embed-v2+oracle"].split("|")[2])
    assert abs(s1 - first) < 6e-4 and abs(s_star - oracle) < 6e-4
    assert abs(p - (s_star - s1)) < 2e-4
    # the evaluate cell links it too: its t-test row against NV-Embed-v2
    [ecell] = [d for d in store.list_dirs("evaluate") if d.startswith("test-a.")]
    metrics = read_cell(store, f"evaluate/{ecell}").to_pylist()
    assert any(r["model"] == "nv-rankzephyr-dt vs nv-embed-v2" and r["metric"] ==
               "ndcg_cut_20:pri" for r in metrics)
    (tmp_path / "tables.md").write_text(md)  # for a reader of the test's folder

    # A second config on the same run root, with one reranker: its evaluate cell is new,
    # and tables.md still holds every reranker the run root has evaluated.
    cfg["rerank"]["runs"] = cfg["rerank"]["runs"][:1]
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    ok("evaluate", "--config", str(tmp_path / "one.yaml"), env=env)
    md2 = store.read_bytes("evaluate/tables.md").decode()
    test_a = md2.split("### test-a: ndcg_cut_20")[1].split("###")[0]
    assert set(reranks) <= {l.split("|")[1].strip() for l in test_a.splitlines()
                            if l.startswith("| ")}
