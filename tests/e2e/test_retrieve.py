"""index -> retrieve -> evaluate through xling's CLI, with the run root on SeaweedFS.

- OG, QT and DT modes (the translate stage's tiny NLLB translations), BM25 and dense
  (tiny BGE-M3, one load shared by index and retrieve) runs, an RRF fusion, and evaluate's metrics, oracle and comparison, whose
  numbers are recomputed here with pytrec_eval from the stored runs;
- BordIRLines' language-partitioned modes over the same collection;
- bad input: an empty collection, a missing qrels file, a run whose doc ids are not in the
  collection, a language without a Lucene analyzer, modes whose translations are missing.

The modes run is the `xling run` process a user starts; its rerun and rerank, the partition
modes and the bad input call the same entry point in the test process (tests/helpers.py
`here`), where the process itself is not what is checked.
"""

import json
import os
import time
from pathlib import Path

import pytest

from helpers import here, ok, ok_here, passages
from xling.core.status import read_cell
from xling.core.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "data" / "demo"
LANGS = ["fi", "sw"]


def title_topics(tmp: Path) -> None:
    """English title queries for each language's passages; qrels: the titled passages."""
    for lang in LANGS:
        ps = passages(lang)
        titles = sorted({p["title"] for p in ps})
        (tmp / f"topics.{lang}.tsv").write_text(
            "".join(f"{lang}-{i}\t{t}\n" for i, t in enumerate(titles)), encoding="utf-8")
        (tmp / f"qrels.{lang}.txt").write_text("".join(
            f"{lang}-{i} 0 {p['docid']} 1\n" for i, t in enumerate(titles)
            for p in ps if p["title"] == t))


CONFIG = """
name: xret
run_root: {root}
ray: {{num_cpus: 2}}
translate:
  model: tiny:nllb_ct2
  beam_size: 1
  shards: 2
  parallel: {{concurrency: [1, 1], batch_size: 16}}
  documents:
    - {{name: mrtydi, format: mrtydi, path: '{demo}/mrtydi/{{lang}}.jsonl.gz', langs: [fi, sw], targets: [en]}}
  topics:
    - {{name: titles-fi, path: '{tmp}/topics.fi.tsv', langs: [en], targets: [fi]}}
    - {{name: titles-sw, path: '{tmp}/topics.sw.tsv', langs: [en], targets: [sw]}}
index:
  engines: [bm25, dense]
  shards: 3
  dense: {{model: 'tiny:bge_m3', max_length: 128, query_max_length: 32, parallel: {{concurrency: [1, 1], batch_size: 8}}}}
  collections:
    - {{name: mrtydi, format: mrtydi, path: '{demo}/mrtydi/{{lang}}.jsonl.gz', langs: [fi, sw], translated: [en]}}
retrieve:
  depth: 100
  shards: 2
  parallel: {{concurrency: [1, 1], batch_size: 8}}
  topics:
    - {{name: titles, path: '{tmp}/topics.{{doc_lang}}.tsv', langs: [en], doc_langs: [fi, sw],
       qrels: '{tmp}/qrels.{{doc_lang}}.txt', translations: 'titles-{{doc_lang}}'}}
  runs:
    - {{name: bm25-og, engine: bm25, collection: mrtydi, mode: og}}
    - {{name: bm25-qt, engine: bm25, collection: mrtydi, mode: qt}}
    - {{name: bm25-dt, engine: bm25, collection: mrtydi, mode: dt}}
    - {{name: m3-og, engine: dense, collection: mrtydi, mode: og}}
  fusion:
    - {{name: rrf, runs: [bm25-dt, m3-og], method: rrf, k: 60}}
evaluate:
  metrics: [map, ndcg_cut_10, ndcg_cut_20, recall_100, recip_rank]
  compare:
    - {{baseline: bm25-og, system: rrf}}
"""


def test_modes_fusion_and_evaluation_on_s3(tmp_path, s3_env, tiny_models, ray_local):
    import pytrec_eval
    from scipy import stats

    title_topics(tmp_path)
    root = f"s3://xling-test/retrieve-{os.getpid()}-{int(time.time() * 1000)}"
    cfg = tmp_path / "xret.yaml"
    cfg.write_text(CONFIG.format(root=root, demo=DEMO, tmp=tmp_path))
    out = ok("run", "--config", str(cfg), env=s3_env)
    store = RunStore(root)
    # One BGE-M3 load for the passages and the queries (their lengths are per call): the
    # dense hits below, and their metrics against pytrec_eval, come through that host.
    assert "embedder (tiny:bge_m3): 1 engine(s) shared by index, retrieve" in out

    runs = {}
    for d in store.list_dirs("retrieve"):
        topics, ql, dl, run, _ = d.split(".")
        runs[(dl, run)] = read_cell(store, f"retrieve/{d}")
        assert store.exists(f"retrieve/{d}/run.trec")
    assert set(runs) == {(dl, r) for dl in LANGS
                         for r in ("bm25-og", "bm25-qt", "bm25-dt", "m3-og", "rrf")}
    for dl in LANGS:
        ids = {p["docid"] for p in passages(dl)}
        for run in ("bm25-og", "bm25-qt", "bm25-dt", "m3-og", "rrf"):
            hits = runs[(dl, run)]
            found = [d for d in hits["doc_id"].to_pylist() if d]
            assert set(found) <= ids, (dl, run)  # every mode searched this language's documents
            assert hits["error"].null_count == hits.num_rows
        # Dense search is exhaustive: every query ranks every passage.
        assert runs[(dl, "m3-og")].num_rows == len(ids) * len({p["title"] for p in passages(dl)})
        # OG with English titles on the original documents: names match, so the titled
        # passage comes first (the tiny translations of QT/DT are gibberish, not checked).
        og = runs[(dl, "bm25-og")].to_pylist()
        qrels = [l.split() for l in (tmp_path / f"qrels.{dl}.txt").read_text().splitlines()]
        rel = {(q, d) for q, _, d, _ in qrels}
        firsts = [(h["query_id"], h["doc_id"]) for h in og if h["rank"] == 1]
        assert sum(f in rel for f in firsts) >= len(firsts) - 1

    # QT searched with the translate stage's query translations, not the English titles.
    qt_cells = [d for d in store.list_dirs("translate") if d.startswith("titles-fi.")]
    assert qt_cells and "mode qt" not in out

    # evaluate: every mean and per-query value equals pytrec_eval on the stored runs.
    measures = {"map", "ndcg_cut_10", "ndcg_cut_20", "recall_100", "recip_rank"}
    for d in store.list_dirs("evaluate"):
        topics, ql, dl, _ = d.split(".")
        metrics = read_cell(store, f"evaluate/{d}").to_pylist()
        qrels = {}
        for l in (tmp_path / f"qrels.{dl}.txt").read_text().splitlines():
            q, _, doc, r = l.split()
            qrels.setdefault(q, {})[doc] = int(r)
        evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"map", "ndcg_cut", "recall",
                                                           "recip_rank"})
        for run in ("bm25-og", "bm25-qt", "bm25-dt", "m3-og", "rrf"):
            trec = {}
            for h in runs[(dl, run)].to_pylist():
                if h["doc_id"]:
                    trec.setdefault(h["query_id"], {})[h["doc_id"]] = h["score"]
            # trec_eval -c (the default, evaluate.average: qrels): every query of the qrels,
            # one without hits (gibberish tiny translations) scoring 0
            ref = evaluator.evaluate({q: trec.get(q, {}) for q in qrels})
            assert ref.keys() == qrels.keys()
            for m in measures:
                mine = {r["query_id"]: r["value"] for r in metrics
                        if r["system"] == run and r["metric"] == m and r["setting"] != "comparison"}
                assert mine.keys() - {None} == ref.keys()
                for q, v in ref.items():
                    assert mine[q] == pytest.approx(v[m], abs=1e-9), (dl, run, m, q)
                mean = sum(v[m] for v in ref.values()) / len(ref)
                assert mine[None] == pytest.approx(mean, abs=1e-9)
        names = {r["metric"] for r in metrics if r["setting"] == "comparison"}
        assert {"map:pri", "map:realized_pct", "map:ttest_p"} <= names
        # The t-test is the system's per-query values against the baseline's (scipy):
        # t > 0 when the system is better.
        per = {s: {r["query_id"]: r["value"] for r in metrics if r["system"] == s
                   and r["metric"] == "map" and r["query_id"] and r["setting"] != "comparison"}
               for s in ("rrf", "bm25-og")}
        common = sorted(set(per["rrf"]) & set(per["bm25-og"]))
        if len(common) > 1 and any(per["rrf"][q] != per["bm25-og"][q] for q in common):
            ref_t = stats.ttest_rel([per["rrf"][q] for q in common],
                                    [per["bm25-og"][q] for q in common])
            [t] = [r["value"] for r in metrics if r["metric"] == "map:ttest_t"]
            [p] = [r["value"] for r in metrics if r["metric"] == "map:ttest_p"]
            assert t == pytest.approx(ref_t.statistic) and p == pytest.approx(ref_t.pvalue)
        oracle = [r for r in metrics if r["system"] == "bm25-og+oracle" and r["metric"] == "recall_100"
                  and r["query_id"] is None]
        plain = [r for r in metrics if r["system"] == "bm25-og" and r["metric"] == "recall_100"
                 and r["query_id"] is None]
        assert oracle[0]["value"] == pytest.approx(plain[0]["value"])  # the oracle only reorders
        assert "| system |" in store.read_bytes(f"evaluate/{d}/_table.md").decode()

    # A rerun finds everything done (in this process: the `xling run` process is the one above).
    again = ok_here("run", "--config", str(cfg))
    assert "FAILED" not in again and "committed" not in again

    # LLM reranking of the retrieve stage's runs (`input:`), through the OpenAI-compatible
    # backend on a local server whose scripted judge puts passages sharing a word with the
    # query first. Passage texts come from what each run's index was built on: the original
    # documents for OG, the translate stage's English translations for DT.
    import re

    from llm_server import LLMServer
    from xling.tasks.rerank import n_listwise_calls

    def judge(prompt: str) -> str:
        query = re.search(r"search query: (.*?)\.\n", prompt, re.IGNORECASE).group(1).lower().split()
        ids = re.findall(r"^\[(\d+)\] (.*)$", prompt, re.MULTILINE)
        ranked = sorted(ids, key=lambda x: -sum(w in x[1].lower() for w in query))
        return " > ".join(f"[{k}]" for k, _ in ranked)

    with LLMServer(models=("judge",)) as server:
        server.reply_fn = judge
        rerank = {"model": {"backend": "openai", "model": "judge", "base_url": server.url,
                            "api_key_env": None},
                  "runs": [{"name": "og-rr", "input": "bm25-og", "depth": 30},
                           {"name": "dt-rr", "input": "bm25-dt", "depth": 30}]}
        ok_here("rerank", "--config", str(cfg), "rerank=" + json.dumps(rerank))
        prompts = [p for (_, p) in server.seen]
    for dl in LANGS:
        ids = {p["docid"] for p in passages(dl)}
        for name, base in (("og-rr", "bm25-og"), ("dt-rr", "bm25-dt")):
            d = next(f"rerank/{c}" for c in store.list_dirs("rerank")
                     if c.startswith(f"titles.en.{dl}.{name}."))
            rr, first = read_cell(store, d), runs[(dl, base)]
            for q in set(first["query_id"].to_pylist()):
                got = [h for h in rr.to_pylist() if h["query_id"] == q]
                want = [h["doc_id"] for h in first.to_pylist() if h["query_id"] == q and h["doc_id"]]
                if not want:  # the first stage found nothing: an error row, counted
                    assert [h["error"] for h in got] == [
                        "the first-stage run has no hits for this query"]
                    continue
                assert sorted(h["doc_id"] for h in got) == sorted(want)
                assert got[0]["llm_calls"] == n_listwise_calls(min(30, len(want)))
            assert store.exists(f"{d}/run.trec")
            assert {h["doc_id"] for h in rr.to_pylist() if h["doc_id"]} <= ids
    originals = [p["text"].split("\n")[0][:40] for dl in LANGS for p in passages(dl)]
    assert any(t in p for t in originals for p in prompts)  # OG prompts show original texts


BORDIR = """
name: bordir
run_root: {root}
ray: {{num_cpus: 2}}
index:
  engines: [dense]
  shards: 2
  dense: {{model: 'tiny:bge_m3', max_length: 64, query_max_length: 32, parallel: {{concurrency: [1, 1], batch_size: 8}}}}
  collections:
    - {{name: passages, format: mrtydi, path: '{demo}/mrtydi/{{lang}}.jsonl.gz', langs: [en, fi, ru, sw]}}
retrieve:
  depth: 6
  shards: 1
  parallel: {{concurrency: [1, 1], batch_size: 8}}
  topics:
    - {{name: disputes, format: jsonl, path: '{tmp}/queries.{{lang}}.jsonl', langs: [fi, ru], doc_langs: [fi]}}
  runs:
    - {{name: qlang, engine: dense, collection: passages, mode: qlang}}
    - {{name: en, engine: dense, collection: passages, mode: en}}
    - {{name: qlang_en, engine: dense, collection: passages, mode: qlang_en}}
    - {{name: rel_langs, engine: dense, collection: passages, mode: rel_langs}}
    - {{name: swap, engine: dense, collection: passages, mode: swap}}
"""


def test_bordirlines_partition_modes(tmp_path, tiny_models, ray_local):
    for lang, rel in (("fi", ["fi", "sw"]), ("ru", ["ru", "fi", "ko"])):
        (tmp_path / f"queries.{lang}.jsonl").write_text(
            json.dumps({"query_id": f"{lang}1", "text": passages(lang)[0]["title"],
                        "rel_langs": rel}) + "\n" +
            json.dumps({"query_id": f"{lang}2", "text": "no rel_langs here"}) + "\n")
    cfg = tmp_path / "b.yaml"
    cfg.write_text(BORDIR.format(root=tmp_path / "run", demo=DEMO, tmp=tmp_path))
    ok_here("run", "--config", str(cfg))  # the retrieve CLI process: the test above
    store = RunStore(str(tmp_path / "run"))
    got = {}
    for d in store.list_dirs("retrieve"):
        _, ql, _, mode, _ = d.split(".")
        for h in read_cell(store, f"retrieve/{d}").to_pylist():
            got.setdefault((ql, mode, h["query_id"]), []).append(h)
    langs = lambda ql, mode, q: {h["doc_lang"] for h in got[(ql, mode, q)] if h["doc_id"]}
    assert langs("fi", "qlang", "fi1") == {"fi"}
    assert langs("fi", "en", "fi1") == {"en"}
    assert langs("fi", "qlang_en", "fi1") == {"fi", "en"}
    assert langs("fi", "rel_langs", "fi1") == {"fi", "sw"}
    assert langs("fi", "swap", "fi1") == {"sw"}
    for mode in ("qlang", "en", "qlang_en", "rel_langs", "swap"):
        hits = [h for h in got[("fi", mode, "fi1")] if h["doc_id"]]
        assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)  # merged by score across partitions
        assert len(hits) == min(6, 4 * len(langs("fi", mode, "fi1")))
    # ko is not indexed: the query is an error row naming the missing partition.
    [row] = got[("ru", "rel_langs", "ru1")]
    assert "no index for document language(s) ['ko']" in row["error"]
    [row] = got[("fi", "rel_langs", "fi2")]
    assert "rel_langs" in row["error"]


def test_bad_input(tmp_path, tiny_models, ray_local):
    """In this process: what is checked is the message and the exit code, not the process."""
    title_topics(tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    base = f"""
name: bad
run_root: {tmp_path / 'run'}
ray: {{num_cpus: 2}}
index:
  shards: 2
  collections:
    - {{name: c, format: mrtydi, path: '{DEMO}/mrtydi/{{lang}}.jsonl.gz', langs: [fi]}}
retrieve:
  topics:
    - {{name: t, path: '{tmp_path}/topics.fi.tsv', langs: [en], doc_langs: [fi],
       qrels: '{tmp_path}/qrels.fi.txt'}}
  runs:
    - {{name: bm25, collection: c, mode: og}}
"""
    cfg = tmp_path / "bad.yaml"

    def fails(text, *overrides, code=2):
        cfg.write_text(text)
        p = here("run", "--config", str(cfg), *overrides)
        assert p.returncode == code, p.stdout[-3000:] + p.stderr[-3000:]
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
        return p.stderr

    # Modes whose translations the config does not make: config errors naming the stage.
    err = fails(base, "retrieve.runs.0.mode=dt")
    assert "mode dt needs" in err and "translate" in err
    err = fails(base, "retrieve.runs.0.mode=qt")
    assert "mode qt needs" in err and "translate.topics" in err
    err = fails(base.replace("langs: [fi]}", "langs: [fi], translated: [en]}"))
    assert "translate stage" in err and "fi->en" in err
    # A missing qrels file.
    err = fails(base + "evaluate: {}\n", "retrieve.topics.0.qrels=/nope/qrels.txt")
    assert "qrels" in err and "/nope/qrels.txt" in err
    # retrieve before index: the index stage is named.
    err = fails(base + "stages: [retrieve]\n")
    assert "run `xling index" in err
    # An empty collection: the index cell fails, saying so.
    err = fails(base.replace(f"'{DEMO}/mrtydi/{{lang}}.jsonl.gz'", f"'{tmp_path}/empty.jsonl'")
                + "stages: [index]\n", code=1)
    assert "input is empty" in err

    # Greek has no Lucene analyzer: standard analyzer, a warning, recorded in the manifest;
    # a TREC run with doc ids not in the collection: counted and reported.
    (tmp_path / "el.jsonl").write_text(
        json.dumps({"docid": "g1", "title": "Αθήνα", "text": "Η Αθήνα είναι πρωτεύουσα"}) + "\n"
        + json.dumps({"docid": "g2", "title": "Όλυμπος", "text": "Το ψηλότερο βουνό"}) + "\n")
    (tmp_path / "el.tsv").write_text("q1\tΑΘΉΝΑ\nq2\tβουνό\n")
    (tmp_path / "el.qrels").write_text("q1 0 g1 1\nq2 0 g2 1\n")
    (tmp_path / "ext.trec").write_text("q1 Q0 g1 1 2.0 ext\nq1 Q0 zz9 2 1.0 ext\n"
                                       "q2 Q0 zz8 1 1.0 ext\n")
    cfg.write_text(f"""
name: el
run_root: {tmp_path / 'run-el'}
ray: {{num_cpus: 2}}
index:
  shards: 1
  collections:
    - {{name: c, format: mrtydi, path: '{tmp_path}/el.jsonl', langs: [el]}}
retrieve:
  topics:
    - {{name: t, path: '{tmp_path}/el.tsv', langs: [el], doc_langs: [el], qrels: '{tmp_path}/el.qrels'}}
  runs:
    - {{name: bm25, collection: c}}
evaluate:
  runs:
    - {{name: ext, path: '{tmp_path}/ext.trec', topics: t}}
""")
    out = ok_here("run", "--config", str(cfg))
    assert "no analyzer for 'el'" in out and "standard analyzer" in out
    assert "ext: 2 of 3 hits name doc ids that are not in the collection" in out
    store = RunStore(str(tmp_path / "run-el"))
    [icell] = store.list_dirs("index")
    manifest = store.read_json(f"index/{icell}/_manifest.json")
    assert manifest["analyzer"] == "standard" and manifest["analyzer_fallback"] is True
    [rcell] = store.list_dirs("retrieve")
    firsts = {h["query_id"]: h["doc_id"] for h in read_cell(store, f"retrieve/{rcell}").to_pylist()
              if h["rank"] == 1}
    assert firsts == {"q1": "g1", "q2": "g2"}  # lowercased and tokenized, not English-stemmed
    [ecell] = store.list_dirs("evaluate")
    assert store.read_json(f"evaluate/{ecell}/_manifest.json")["unknown_doc_ids"] == {"ext": 2}


def test_ciral_study_config_and_expected_numbers(monkeypatch, tmp_path):
    import yaml

    from xling.config import load_config

    monkeypatch.setenv("CIRAL_RUNS", str(tmp_path))  # the imported runs' folder
    cfg = load_config(ROOT / "configs" / "retrieve-ciral.yaml")
    expected = yaml.safe_load((ROOT / "configs" / "retrieve-ciral.expected.yaml").read_text())
    runs = {r.name: r for r in cfg.retrieve.runs}
    topics = {t.name: t for t in cfg.retrieve.topics}
    assert len(expected["scores"]) == 8
    for key, scores in expected["scores"].items():
        ts, run, dl = key.split("/")
        assert ts in topics and dl in topics[ts].doc_langs
        assert runs[run].topics is None or ts in runs[run].topics
        assert set(scores) <= set(cfg.evaluate.metrics)
    assert runs["bm25-dt"].mode == "dt" and (runs["bm25-dt"].k1, runs["bm25-dt"].b) == (0.9, 0.4)
