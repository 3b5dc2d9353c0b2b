"""Throughput of the dense (BGE-M3) `index` and `retrieve` stages against bare FlagEmbedding.

Same model (the tiny BGE-M3-architecture model by default, `--model BAAI/bge-m3` on a GPU
machine with the weights), same texts, same max lengths, in one run:

- embedding: `BGEM3FlagModel.encode` (dense vectors) over all passages in one call, with
  the forward batch size xling uses, against the whole `index` stage with `engines: [dense]`
  (partition into shards, one embedder actor per CPU/GPU, embeddings committed as Parquet
  shards in the run store), from an already initialised Ray;
- search: encode all queries in one call and one exact FAISS `IndexFlatIP` search over all
  of them (FAISS's way for batch work: one `search` over every query, all threads), against
  the `retrieve` stage (query rows sharded, DenseRetriever actors embedding them, one exact
  search per batch over all the index's shards at once with the float64 re-score of the
  candidates, hits rows committed, TREC run file written).

Corpus: texts drawn from the demo passages' vocabulary (Zipf), 60-200 words, queries 3-8.

Reported, whole run first (what a user waits for: records / wall time, start-up included),
then the steady rate as a diagnostic (benchmarks/common.py), and where xling's search wall
time went: start-up (until the first output), each Ray Data operator's busy seconds (summed
over its tasks or actors, so a pool of 2 can show twice the wall; and the union of their
intervals, which counts overlapping calls once), and the time outside the
pipeline (planning, the last commits, the TREC export). Bare's steady rate is that of its
calls alone; its whole run adds its start-up, the import of FlagEmbedding and the model
load, as xling's holds its actors' (the search ratio without it is printed too).

Default sizes: a corpus the tiny model embeds in about a minute on 2 cores (20k passages;
the bare embedding then runs ~50 s), and enough queries that the bare search (encode + one
FAISS search) runs over 20 s, so that xling's fixed start-up does not decide the search
ratio alone: 200k queries (bare 24.6 s here: FAISS over 20k x 64-dim vectors is ~0.03 ms a
query, the tiny model's query encoding ~0.09 ms; at 100k the bare side ran 11.5 s). The
whole run takes ~7 minutes and < 6 GB.

    .venv/bin/python benchmarks/dense.py --docs 20000 --queries 200000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index import run_xling, texts, vocabulary, write_inputs  # noqa: E402
from common import CPUMeter, print_cpu, print_without_startup  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=200_000)
    ap.add_argument("--model", default="tiny:bge_m3", help="hub id, local path or tiny:bge_m3")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--encode-batch-size", type=int, default=32)
    ap.add_argument("--actors", type=int, default=0,
                    help="xling embedder/searcher actors (default: 1 on a GPU; on CPU one per "
                         "core, since Ray gives each actor one torch thread where bare torch "
                         "uses all)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="FAISS/torch threads per search actor")
    ap.add_argument("--search-batch-size", type=int, default=0,
                    help="queries per retrieve actor call (default: the stage's own, "
                         "retrieve.query_batch: 2,048 at depth 100)")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--search-only", action="store_true",
                    help="skip the bare passage embedding (FAISS then searches the vectors "
                         "xling's index stage committed): the search ratio in less time")
    args = ap.parse_args()

    import faiss
    import torch

    from xling.actors.embedder import vector_matrix
    from xling.actors.dense_search import FlatIndex
    from xling.actors.embedder import M3Embedder
    from xling.config import validate_config
    from xling.core.models import resolve_model

    model = resolve_model(args.model, key="--model")
    vocab = vocabulary()
    docs = texts(args.docs, 60, 200, vocab, seed=1)
    queries = texts(args.queries, 3, 8, vocab, seed=2)
    gpu = torch.cuda.is_available()
    print(f"model {args.model}, {len(docs)} passages, {len(queries)} queries, max_length "
          f"{args.max_length}, device {'cuda' if gpu else 'cpu'}, torch threads "
          f"{torch.get_num_threads()}")

    # ---- bare FlagEmbedding (+ FAISS below, after xling, on the passages' vectors) -----
    # A script that embeds imports FlagEmbedding, then loads the model: its start-up, as
    # xling's start-up holds its actors' import and load (generate.py counts vLLM's alike).
    # torch and faiss are imported above already: their import is left out, in bare's favour.
    t = time.perf_counter()
    bare = M3Embedder(model, max_length=args.max_length, batch_size=args.encode_batch_size,
                      use_fp16=gpu).model  # the BGEM3FlagModel, loaded as xling loads it
    bare_load_s = time.perf_counter() - t
    emb, bare_embed_s = None, 0.0
    if not args.search_only:
        t, cpu = time.perf_counter(), CPUMeter()
        emb = bare.encode(docs, batch_size=args.encode_batch_size, max_length=args.max_length,
                          return_dense=True, return_sparse=False)["dense_vecs"]
        bare_embed_s, bare_embed_cpu = time.perf_counter() - t, cpu.stop()
    t, cpu = time.perf_counter(), CPUMeter()
    q = bare.encode(queries, batch_size=args.encode_batch_size, max_length=args.max_length,
                    return_dense=True, return_sparse=False)["dense_vecs"]
    bare_encode_s, bare_encode_cpu = time.perf_counter() - t, cpu.stop()
    del bare

    # ---- xling ------------------------------------------------------------------------------
    tmp = Path(tempfile.mkdtemp(prefix="xling-bench-dense-"))
    write_inputs(tmp, docs, queries)
    args.actors = args.actors or (1 if gpu else os.cpu_count())
    # The stages' own call sizes (index.dense.call_size, retrieve.query_batch).
    pool = {"concurrency": [args.actors, args.actors], "num_gpus": 1 if gpu else 0,
            # On CPU: half a core each, so that the pool's actors fit beside the pipeline's
            # read tasks; torch still runs one thread per actor (Ray's OMP_NUM_THREADS).
            "num_cpus": 1 if gpu else 0.5}
    cfg = validate_config({
        "name": "bench", "run_root": str(tmp / "run"),
        "index": {"engines": ["dense"], "contents": "text", "shards": args.shards,
                  "collections": [{"name": "c", "format": "mrtydi",
                                   "path": str(tmp / "corpus.jsonl.gz"), "langs": ["en"]}],
                  "dense": {"model": args.model, "max_length": args.max_length,
                            "query_max_length": args.max_length, "fp16": gpu,
                            "encode_batch_size": args.encode_batch_size, "parallel": pool}},
        "retrieve": {"depth": args.depth, "shards": args.shards,
                     "topics": [{"name": "q", "path": str(tmp / "topics.tsv"), "langs": ["en"],
                                 "doc_langs": ["en"]}],
                     "runs": [{"name": "m3", "engine": "dense", "collection": "c"}],
                     "threads": args.threads,
                     "parallel": {**pool, "batch_size": args.search_batch_size or None}}})
    from xling.core.store import RunStore
    from xling.jobs.index import IndexStage, index_cells
    from xling.jobs.retrieve import query_batch

    search_batch = query_batch(cfg, "dense")

    xe, xs, n_xling_hits = run_xling(cfg, IndexStage(), ("EmbedBatches", args.actors),
                                     ("StoreDenseSearcher", args.actors))
    store = RunStore(cfg.run_root)
    [rcell] = store.list_dirs("retrieve")
    stream = store.read_json(f"retrieve/{rcell}/_manifest.json")["stream"]
    if emb is None:  # --search-only: the vectors xling's index stage committed
        [icell] = index_cells(cfg)
        files = store.read_json(f"{icell.dir}/_manifest.json")["files"]
        emb = np.concatenate([vector_matrix(store.read_parquet(f"{icell.dir}/{f}",
                                                               columns=["dense"])["dense"])
                              for f in files])

    # ---- bare FAISS: one search over all queries -------------------------------------------
    qv = np.ascontiguousarray(q, dtype=np.float32)
    t, cpu = time.perf_counter(), CPUMeter()
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(np.ascontiguousarray(emb, dtype=np.float32))
    _, ids = index.search(qv, args.depth)
    faiss_s, faiss_cpu = time.perf_counter() - t, cpu.stop()
    n_bare_hits = int((ids >= 0).sum())
    bare_search_s = bare_encode_s + faiss_s
    # The cost of exactness, apart, on the same vectors in this process: FAISS's one search
    # against what a retrieve actor does (one FlatIndex over all shards, built once; one
    # exact search per batch: FAISS's candidates, the float64 re-score, the ranking rule).
    t = time.perf_counter()
    flat = FlatIndex([f"d{i}" for i in range(len(emb))], emb)
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    for start in range(0, len(qv), search_batch):
        flat.search(qv[start:start + search_batch], args.depth)
    exact_s = time.perf_counter() - t

    print(f"hits: bare {n_bare_hits}, xling {n_xling_hits}")
    if not args.search_only:
        print("embedding")
        report("passages/s", len(docs) / bare_embed_s, xe, bare_load_s)
        print_cpu(len(docs), xe["cpu"], bare_embed_cpu)
    print("search (query embedding + exact search + hits)")
    report("queries/s", len(queries) / bare_search_s, xs, bare_load_s)
    print_cpu(len(queries), xs["cpu"],
              {"tree": bare_encode_cpu["tree"] + faiss_cpu["tree"]})
    print(f"  bare: start-up {bare_load_s:.1f} s (import of FlagEmbedding, model load) + encode "
          f"{bare_encode_s:.1f} s + FAISS (add + one search) {faiss_s:.2f} s")
    print_without_startup(xs["whole"], len(queries) / bare_search_s)
    print(f"  exactness: xling FlatIndex build "
          f"{build_s:.2f} s + exact search in batches of {search_batch} "
          f"{exact_s:.2f} s ({exact_s / faiss_s:.2f}x FAISS)")
    wall = xs["records"] / xs["whole"]
    print(f"  xling search wall {wall:.1f} s: start-up {xs['startup']:.1f} s, pipeline "
          f"{stream['ended'] - stream['started']:.1f} s, outside the pipeline (plan, last "
          f"commits, TREC export) {wall - (stream['ended'] - stream['started']):.1f} s")
    for op, busy in sorted(stream.get("busy", {}).items(), key=lambda kv: -kv[1]):
        print(f"    {op:60s} busy {busy:8.3f} s, union of its calls "
              f"{stream.get('union', {}).get(op, 0.0):8.3f} s")


def report(unit: str, bare: float, x: dict, bare_startup: float) -> None:
    """Whole-run ratio first (what a user waits for: bare's start-up included), the steady
    one as a diagnostic. `bare` is the rate of bare's calls alone."""
    whole = bare / (1 + bare * bare_startup / x["records"])  # records / (start-up + calls)
    print(f"  {'':24s} {'bare':>10s} {'xling':>10s} {'ratio':>6s}")
    for name, b, value in (("whole run", whole, x["whole"]), ("steady", bare, x["steady"])):
        print(f"  {name + ' ' + unit:24s} {b:10.1f} {value:10.1f} {value / b:6.2f}")
    print(f"  {'start-up s':24s} {bare_startup:10.1f} {x['startup']:10.1f}")


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    main()
