"""Throughput of the `index` and `retrieve` stages (BM25) against bare pyserini/Anserini.

Corpus: documents drawn from the real vocabulary of the demo passages (data/demo: Mr.TyDi
in 11 languages + NeuCLIR Russian), Zipf-distributed word choice, 60-200 words each, under
the standard analyzer, so both sides index exactly the same texts. Queries: 3-8 words drawn
the same way.

Indexing:
- bare: Anserini's IndexCollection (what `python -m pyserini.index.lucene` runs) with
  --threads T over the corpus written as T*4 JsonCollection files (its threads work per
  file), in a JVM that is already started;
- xling: the whole `index` stage on local Ray (partition into shards, contents, Lucene
  segments built by the LuceneSegments actors in the same pass, and the merge into one
  index in the run store), from an already initialised Ray.

Search: pyserini's `LuceneSearcher.batch_search` with T threads over all queries, reading
each hit's doc id and score (what writing a run file takes), against the `retrieve` stage
(queries sharded, one BM25Searcher actor calling batch_search with T threads over the
merged index, hits rows committed as Parquet shards and a TREC file) on the same index.
Both return the top --depth hits.

Reported (benchmarks/common.py): docs/s and queries/s at steady state and over the whole
run, with the ratio xling / bare; xling's start-up (Ray Data pipelines, partition, actor and
JVM start) broken out.

Default sizes: the bare side runs about 20 s or more on 2 cores for each half (issue 28: a
fixed start-up must not decide the ratio alone): 1.4 M documents (bare IndexCollection
~21 s; at 200k it ran 4.6 s) and 6,000 queries (bare batch_search ~23 s over that index).
The whole run takes ~5 minutes and < 8 GB.

    .venv/bin/python benchmarks/index.py --docs 1400000 --queries 6000 --threads 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
import time
from pathlib import Path

from common import CPUMeter, print_cpu, print_ratios, print_stats, start_ray, stream_rates

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def vocabulary() -> list[str]:
    words: dict[str, int] = {}
    files = sorted((ROOT / "data/demo/mrtydi").glob("*.jsonl.gz"))
    lines = [l for f in files for l in gzip.open(f, "rt", encoding="utf-8")]
    lines += list((ROOT / "data/demo/neuclir-rus.jsonl").open(encoding="utf-8"))
    for line in lines:
        for w in json.loads(line)["text"].split():
            w = w.strip(".,;:()[]«»\"'!?")
            if w:
                words[w] = words.get(w, 0) + 1
    return sorted(words, key=lambda w: (-words[w], w))


def texts(n: int, lo: int, hi: int, vocab: list[str], seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.3, size=n * hi), len(vocab)) - 1
    lengths = rng.integers(lo, hi + 1, size=n)
    words = np.array(vocab, dtype=object)[ranks[:int(lengths.sum())]].tolist()
    ends = np.cumsum(lengths).tolist()
    return [" ".join(words[end - length:end]) for end, length in zip(ends, lengths.tolist())]


def write_inputs(tmp: Path, docs: list[str], queries: list[str]) -> None:
    """The xling side's inputs: docs as Mr.TyDi JSONL (`d<i>`), queries as TSV (`q<i>`)."""
    with gzip.open(tmp / "corpus.jsonl.gz", "wt", encoding="utf-8", compresslevel=1) as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"docid": f"d{i}", "title": "", "text": text}) + "\n")
    (tmp / "topics.tsv").write_text("".join(f"q{i}\t{t}\n" for i, t in enumerate(queries)))


def run_xling(cfg, index_stage, index_actor: tuple[str, int], search_actor: tuple[str, int],
              search: bool = True, num_cpus: int | None = None) -> tuple[dict, dict | None, int]:
    """Run the `index` then the `retrieve` stage on a fresh local Ray, started as xling
    starts one (`start_ray`, with `num_cpus`): their rates
    (benchmarks/common.py), and the number of hits the retrieve cell committed."""
    from xling.core.runner import Runner
    from xling.core.store import RunStore
    from xling.jobs.retrieve import RetrieveStage

    start_ray(num_cpus)
    store = RunStore(cfg.run_root)
    runner = Runner(store, progress=False, log=lambda *_: None)
    t, cpu = time.perf_counter(), CPUMeter()
    runner.run(index_stage, cfg)
    index = stream_rates(runner, time.perf_counter() - t, *index_actor)
    index["cpu"] = cpu.stop()
    print_stats(runner)
    if not search:
        return index, None, 0
    runner = Runner(store, progress=False, log=lambda *_: None)
    t, cpu = time.perf_counter(), CPUMeter()
    runner.run(RetrieveStage(), cfg)
    search = stream_rates(runner, time.perf_counter() - t, *search_actor)
    search["cpu"] = cpu.stop()
    print_stats(runner)
    [rcell] = store.list_dirs("retrieve")
    return index, search, store.read_json(f"retrieve/{rcell}/_manifest.json")["hits"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_400_000)
    ap.add_argument("--queries", type=int, default=6_000)
    ap.add_argument("--threads", type=int, default=2, help="indexing/search threads (= CPUs)")
    ap.add_argument("--shards", type=int, default=0, help="xling index shards (default 4x threads)")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--skip-search", action="store_true", help="index only")
    args = ap.parse_args()
    shards = args.shards or 4 * args.threads

    from xling.actors.lucene import STANDARD, index_collection, open_searcher, start_jvm, \
        write_json_collection
    from xling.config import validate_config

    vocab = vocabulary()
    docs = texts(args.docs, 60, 200, vocab, seed=1)
    queries = texts(args.queries, 3, 8, vocab, seed=2)
    tmp = Path(tempfile.mkdtemp(prefix="xling-bench-index-"))
    print(f"corpus: {len(docs)} docs ({sum(len(d.split()) for d in docs) / len(docs):.0f} words "
          f"avg, {len(vocab)} word types), {len(queries)} queries, threads {args.threads}, "
          f"xling shards {shards}")

    # ---- bare Anserini ---------------------------------------------------------------
    start_jvm()
    write_json_collection(((f"d{i}", t) for i, t in enumerate(docs)), str(tmp / "coll"),
                          per_file=-(-len(docs) // (4 * args.threads)))
    t, cpu = time.perf_counter(), CPUMeter()
    index_collection(str(tmp / "coll"), str(tmp / "bare-index"), STANDARD,
                     threads=args.threads, store_raw=False, store_docvectors=False)
    bare_index_s, bare_index_cpu = time.perf_counter() - t, cpu.stop()
    searcher = open_searcher(str(tmp / "bare-index"), STANDARD, 0.9, 0.4)
    qids = [f"q{i}" for i in range(len(queries))]
    if args.skip_search:
        queries = queries[:1]
    t, cpu = time.perf_counter(), CPUMeter()
    bare_hits = searcher.batch_search(queries, qids, k=args.depth, threads=args.threads)
    # What writing a run file takes: each hit's doc id and score, read once.
    n_bare_hits = sum(len([(h.docid, h.score) for h in v]) for v in bare_hits.values())
    bare_search_s, bare_search_cpu = time.perf_counter() - t, cpu.stop()

    # ---- xling -------------------------------------------------------------------------
    write_inputs(tmp, docs, queries)
    cfg = validate_config({
        "name": "bench", "run_root": str(tmp / "run"),
        "index": {"engines": ["bm25"], "contents": "text", "shards": shards,
                  "collections": [{"name": "c", "format": "mrtydi",
                                   "path": str(tmp / "corpus.jsonl.gz"), "langs": ["el"]}],
                  # the stage's batch size and CPUs; as many actors as bare has threads
                  "parallel": {"concurrency": [args.threads, args.threads]}},
        "retrieve": {"depth": args.depth, "shards": 4 * args.threads,
                     "topics": [{"name": "q", "path": str(tmp / "topics.tsv"), "langs": ["el"],
                                 "doc_langs": ["el"]}],
                     "runs": [{"name": "bm25", "collection": "c"}],
                     # one actor searching with T threads, as batch_search does
                     "threads": args.threads,
                     "parallel": {"concurrency": [1, 1], "num_cpus": 1}}})
    from xling.jobs.index import IndexStage

    class TimedIndexStage(IndexStage):
        """Times `finalize` (the merge of the Lucene pieces) apart from the rest."""

        lucene_s = 0.0

        def finalize(self, *a, **kw):
            t = time.perf_counter()
            try:
                return super().finalize(*a, **kw)
            finally:
                TimedIndexStage.lucene_s += time.perf_counter() - t

    xi, xs, n_xling_hits = run_xling(cfg, TimedIndexStage(), ("LuceneSegments", args.threads),
                                     ("StoreBM25Searcher", 1), search=not args.skip_search,
                                     num_cpus=args.threads)

    # Greek ("el") has no Anserini analyzer: both sides used the standard analyzer. The bare
    # calls have no first output to cut at: their steady rate is their whole rate, JVM
    # start excluded (it is started before both).
    print("indexing")
    print_ratios("docs/s", len(docs) / bare_index_s, len(docs) / bare_index_s, xi)
    print_cpu(len(docs), xi["cpu"], bare_index_cpu)
    print(f"  xling index merge left after the last shard (finalize) "
          f"{TimedIndexStage.lucene_s:.1f} s of the whole run")
    if args.skip_search:
        return
    print(f"hits: bare {n_bare_hits}, xling {n_xling_hits}")
    print("search")
    print_ratios("queries/s", len(queries) / bare_search_s, len(queries) / bare_search_s, xs)
    print_cpu(len(queries), xs["cpu"], bare_search_cpu)


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    main()
