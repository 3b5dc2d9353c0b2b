"""Throughput of the dense (BGE-M3) `index` and `retrieve` stages against bare FlagEmbedding.

Same model (the tiny BGE-M3-architecture model by default, `--model BAAI/bge-m3` on a GPU
machine with the weights), same texts, same max lengths, in one run:

- embedding: `BGEM3FlagModel.encode` (dense vectors) over all passages in one call, with
  the forward batch size xling uses, against the whole `index` stage with `engines: [dense]`
  (partition into shards, one embedder actor per CPU/GPU, embeddings committed as Parquet
  shards in the run store), from an already initialised Ray;
- search: encode the queries and one exact FAISS `IndexFlatIP` search over all embeddings,
  against the `retrieve` stage (query rows sharded, a DenseRetriever actor embedding them,
  exact per-shard search with the float64 re-score and the global merge, hits committed).

Corpus: texts drawn from the demo passages' vocabulary (Zipf), 60-200 words, queries 3-8.
Reported (benchmarks/common.py): passages/s and queries/s at steady state and over the whole
run, the ratio xling / bare, and xling's start-up (pipelines, actor start and model load:
~15 s on 2 cores); xling also does what bare leaves out: shard files, hits rows, TREC export.

    .venv/bin/python benchmarks/dense.py --docs 20000 --queries 2000
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
from common import print_ratios  # noqa: E402
from index import run_xling, texts, vocabulary, write_inputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=2_000)
    ap.add_argument("--model", default="tiny:bge_m3", help="hub id, local path or tiny:bge_m3")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--encode-batch-size", type=int, default=32)
    ap.add_argument("--actors", type=int, default=0,
                    help="xling embedder actors (default: 1 on a GPU; on CPU one per core, "
                         "since Ray gives each actor one torch thread where bare torch uses all)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="FAISS/torch threads per search actor")
    ap.add_argument("--depth", type=int, default=100)
    args = ap.parse_args()

    import faiss
    import torch

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

    # ---- bare FlagEmbedding + FAISS --------------------------------------------------------
    bare = M3Embedder(model, max_length=args.max_length, batch_size=args.encode_batch_size,
                      use_fp16=gpu).model  # the BGEM3FlagModel, loaded as xling loads it
    t = time.perf_counter()
    emb = bare.encode(docs, batch_size=args.encode_batch_size, max_length=args.max_length,
                      return_dense=True, return_sparse=False)["dense_vecs"]
    bare_embed_s = time.perf_counter() - t
    t = time.perf_counter()
    q = bare.encode(queries, batch_size=args.encode_batch_size, max_length=args.max_length,
                    return_dense=True, return_sparse=False)["dense_vecs"]
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(np.ascontiguousarray(emb, dtype=np.float32))
    _, ids = index.search(np.ascontiguousarray(q, dtype=np.float32), args.depth)
    n_bare_hits = int((ids >= 0).sum())
    bare_search_s = time.perf_counter() - t
    # The cost of exactness, apart: xling's shard search (FAISS candidates, then the float64
    # re-score that makes ties and shard counts not matter, and the global merge) against
    # FAISS alone, on the same vectors, in this process.
    from xling.actors.dense_search import merge_topk, search_shard

    doc_ids = [f"d{i}" for i in range(len(docs))]
    qv = np.ascontiguousarray(q, dtype=np.float32)
    t = time.perf_counter()
    index.search(qv, args.depth)
    faiss_s = time.perf_counter() - t
    t = time.perf_counter()
    cuts = np.linspace(0, len(docs), args.shards + 1).astype(int)
    merge_topk([search_shard(qv, doc_ids[a:b], emb[a:b], args.depth)
                for a, b in zip(cuts, cuts[1:])], args.depth)
    exact_s = time.perf_counter() - t
    del bare

    # ---- xling ------------------------------------------------------------------------------
    tmp = Path(tempfile.mkdtemp(prefix="xling-bench-dense-"))
    write_inputs(tmp, docs, queries)
    args.actors = args.actors or (1 if gpu else os.cpu_count())
    pool = {"concurrency": [args.actors, args.actors], "batch_size": 8 * args.encode_batch_size,
            "num_gpus": 1 if gpu else 0,
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
                     "parallel": pool}})
    from xling.jobs.index import IndexStage

    xe, xs, n_xling_hits = run_xling(cfg, IndexStage(), ("EmbedBatches", args.actors),
                                     ("StoreDenseSearcher", args.actors))
    # The bare calls have no first output to cut at: steady = whole, model load excluded.
    print(f"hits: bare {n_bare_hits}, xling {n_xling_hits}")
    print("embedding")
    print_ratios("passages/s", len(docs) / bare_embed_s, len(docs) / bare_embed_s, xe)
    print(f"exactness: FAISS search {faiss_s * 1000:.1f} ms, xling exact search over "
          f"{args.shards} shards + merge {exact_s * 1000:.1f} ms ({exact_s / faiss_s:.1f}x)")
    print("search (query embedding + exact search + hits)")
    print_ratios("queries/s", len(queries) / bare_search_s, len(queries) / bare_search_s, xs)


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    main()
