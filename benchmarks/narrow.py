"""Throughput of the CROSS narrowing stage against a bare BGE-M3 encode plus numpy top-k, on
the same sentences of the same mLongRR contexts, in one run.

- bare: `BGEM3FlagModel.encode` (loaded as xling loads it) over the distinct sentences and the
  queries in one call, then for every (context, query language) the dot products and a
  stable argsort, top max(k);
- xling: the `narrow` stage (jobs/narrow.py) on a fresh run root through the runner: the
  distinct sentences through the `StoreEmbedder` actor pool (the embedding cache, Arrow
  batches, commits), then the exact ranking of every haystack on the driver.

Both sides embed each distinct sentence once. Reported, whole run first (records / wall
time, start-up included, the ranking included on both sides), then the steady rate as a
diagnostic (benchmarks/common.py). The gain xling has over a per-context pipeline, which
would embed every sentence of every haystack, is reported separately: sentences in all
contexts / distinct sentences (the haystacks of one language share their text across
lengths, depths and needle counts).

Data, by default: 1-needle haystacks of 16k, 128k and 1,280k words built by the study's own
builder (`studies/cross/build.build_cases`, as for a language the shared files lack) from
random sentences over the demo corpus' vocabulary, in the scripts the demo holds. The 1,280k
haystack holds ~79k distinct sentences, so the bare embedding runs ~18-20 s here (2 cores,
tiny model) and xling's fixed start-up does not decide the ratio alone. `--shared` uses the
shared mLongRR files instead (`../shared/data/mlongrr`, every length up to 64k of English 1-
and 3-needle; ~2,300 distinct sentences, ~1.3 s of bare embedding: a start-up benchmark).

Threads: bare torch uses every core. xling's actors share them out (each actor's `num_cpus`,
which Ray turns into its torch threads): by default one actor per core on CPU, as dense.py
runs them. One actor with two torch threads ran at 0.58 of bare steady, two of one thread
at 0.70 (2 cores): OpenMP's threads wait on each other whenever the pipeline's other tasks
take a core. Ray is told of one CPU more than the machine has, so that the pipeline's light
read and commit tasks still find a slot beside the actors.

    .venv/bin/python benchmarks/narrow.py
    .venv/bin/python benchmarks/narrow.py --shared
    .venv/bin/python benchmarks/narrow.py --model BAAI/bge-m3 --lengths 2k,8k,16k --shared   # GPU
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
from common import print_ratios, print_stats, print_without_startup, stream_rates  # noqa: E402
from common import CPUMeter, print_cpu, start_ray  # noqa: E402
from index import texts, vocabulary  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared/data/mlongrr"


def data_files(lang_file: str) -> list[str]:
    base = SHARED if SHARED.is_dir() else ROOT / "tests/data/mlongrr"
    return [str(p) for p in (base / "1-needle" / lang_file, base / "3-needles" / lang_file)
            if p.is_file()]


def synthetic_files(out: Path, lengths: list[str]) -> list[str]:
    """1-needle haystacks at `lengths` (whitespace words), built by the study's builder from
    random sentences (6-24 words over the demo's vocabulary, 10 a document): each length's
    haystack starts with the shorter ones' documents, as real ones do, so the distinct
    sentences are about the longest haystack's."""
    from xling.studies.cross.build import build_cases, write_cases_csv
    from xling.studies.cross.data import length_value

    words = max(length_value(x) for x in lengths)
    vocab = vocabulary()
    sentences = texts(words // 14 + 1000, 5, 23, vocab, seed=3)
    # A sentence starts with a capital and ends on a lower-case Latin word of 5+ letters:
    # before a lower-case word, or after "в" or "i.e", the splitter rightly reads a period
    # as no sentence end.
    last = [w for w in vocab if len(w) >= 5 and w.isascii() and w.isalpha() and w.islower()]
    sentences = [f"{x[:1].upper()}{x[1:]} {last[i % len(last)]}." for i, x in enumerate(sentences)]
    docs = [{"doc_id": f"s{i}", "lang": "en", "title": "", "text": " ".join(sentences[i:i + 10])}
            for i in range(0, len(sentences), 10)]
    rows = build_cases(docs, lang="en", lengths=lengths, needles=1, unit="words:whitespace")
    return [write_cases_csv(rows, out / "1-needle" / "English_needles.csv")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny:bge_m3", help="hub id, local path or tiny:bge_m3")
    ap.add_argument("--file", default="English_needles.csv", help="mLongRR file name")
    ap.add_argument("--lengths", default=None,
                    help="context lengths: built (default 16k,128k,1280k), or kept of the shared "
                         "files with --shared (default all, 2k-64k)")
    ap.add_argument("--shared", action="store_true",
                    help="the shared mLongRR files instead of built haystacks")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--encode-batch-size", type=int, default=32)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--actors", type=int, default=0,
                    help="StoreEmbedder actors, the cores shared out between them as torch "
                         "threads (default: one per core on CPU, one on a GPU)")
    args = ap.parse_args()

    import ray
    import torch

    from xling.actors.embedder import M3Embedder
    from xling.config import validate_config
    from xling.core.models import resolve_model
    from xling.core.runner import Runner
    from xling.core.store import RunStore
    from xling.jobs.narrow import NarrowStage
    from xling.studies.registry import get_study

    gpu = torch.cuda.is_available()
    tmp = Path(tempfile.mkdtemp(prefix="xling-bench-narrow-"))
    if args.shared:
        lengths = (args.lengths or "2k,8k,16k,32k,64k").split(",")
        files = data_files(args.file)
    else:
        lengths = (args.lengths or "16k,128k,1280k").split(",")
        t = time.perf_counter()
        files = synthetic_files(tmp / "data", lengths)
        print(f"built {files[0]} in {time.perf_counter() - t:.1f} s")
    cross = get_study("cross")
    opts = cross.validate_options({"data": files, "query_langs": ["en"], "lengths": lengths})
    clang = opts.context_langs[0]
    t = time.perf_counter()
    got = cross.narrow_inputs(opts, clang)
    split_s = time.perf_counter() - t
    sentences, queries = list(got["sentences"].values()), got["queries"]
    n = len(sentences) + len(queries)
    print(f"{len(files)} file(s), lengths {','.join(lengths)}: {got['contexts']} contexts, "
          f"{got['sentences_total']} sentences, {len(sentences)} distinct, {len(queries)} "
          f"queries; model {args.model}, device {'cuda' if gpu else 'cpu'}, split "
          f"{split_s:.2f} s")

    # ---- bare: BGEM3FlagModel.encode + numpy top-k -----------------------------------------
    model = resolve_model(args.model, key="--model")
    t = time.perf_counter()
    bare = M3Embedder(model, max_length=args.max_length, batch_size=args.encode_batch_size,
                      use_fp16=gpu).model
    load = time.perf_counter() - t
    t, cpu = time.perf_counter(), CPUMeter()
    vecs = bare.encode([*sentences, *queries.values()], batch_size=args.encode_batch_size,
                       max_length=args.max_length, return_dense=True,
                       return_sparse=False)["dense_vecs"]
    embed_s = time.perf_counter() - t
    vec = dict(zip([*got["sentences"], *queries], np.asarray(vecs, np.float32)))
    t = time.perf_counter()
    bare_sel = cross.select(opts, clang, vec)
    rank_s, bare_cpu = time.perf_counter() - t, cpu.stop()
    del bare

    # ---- xling: the narrow stage -------------------------------------------------------------
    cpus = os.cpu_count() or 1
    args.actors = args.actors or (1 if gpu else cpus)
    # One logical CPU more than the cores: the slot the light read and commit tasks take
    # beside the actors (they use a few percent of a core). On a Ray joined as it is, the
    # actors share out all its CPUs but that one.
    stop_ray = start_ray(cpus + (0 if gpu else 1))
    cores = int(ray.cluster_resources().get("CPU", cpus + 1)) - 1
    cfg = validate_config({
        "name": "bench", "run_root": str(tmp / "run"),
        "study": {"task": "cross", "options": {"data": files, "query_langs": ["en"],
                                               "lengths": lengths,
                                               "methods": ["cross"]}},
        "narrow": {"model": args.model, "max_length": args.max_length,
                   "fp16": gpu, "encode_batch_size": args.encode_batch_size,
                   "shards": args.shards,
                   # the cores shared out between the actors as their torch threads (Ray
                   # makes an actor's num_cpus its threads); on a GPU one actor
                   "parallel": {"concurrency": [args.actors, args.actors],
                                "num_gpus": 1 if gpu else 0,
                                "num_cpus": 1 if gpu else max(1, cores // args.actors)}}})
    store = RunStore(cfg.run_root)
    runner = Runner(store, progress=False, log=lambda *_: None)
    t, cpu = time.perf_counter(), CPUMeter()
    runner.run(NarrowStage(), cfg)
    wall, used = time.perf_counter() - t, cpu.stop()
    rates = stream_rates(runner, wall, "StoreEmbedder", args.actors)
    print_stats(runner)
    [cell] = store.list_dirs("narrow")
    manifest = store.read_json(f"narrow/{cell}/_manifest.json")
    xsel = store.read_parquet(f"narrow/{cell}/_selections.parquet").to_pylist()
    stop_ray()

    pairs = list(zip(sorted(bare_sel, key=lambda s: s["context_id"]),
                     sorted(xsel, key=lambda s: s["context_id"])))
    same = sum(a["top_idx"][:10] == b["top_idx"][:10] for a, b in pairs)
    dscore = max(max(abs(x - y) for x, y in zip(a["top_score"], b["top_score"]))
                 for a, b in pairs)
    print(f"top-10 equal to bare's in {same} of {len(pairs)} haystacks; largest score "
          f"difference in the top {len(pairs[0][0]['top_score'])}: {dscore:.1e} (the two "
          f"embedding runs batch the sentences differently: float rounding)")
    print(f"ranking every haystack (bare and in xling's finalize): {rank_s * 1000:.0f} ms")
    print("embedding (distinct sentences + queries)")
    # Bare's whole run holds its start-up (the import of FlagEmbedding and the model load),
    # as xling's holds its actor's, and as generate.py, dense.py and features.py count it.
    print_ratios("texts/s", n / embed_s, n / (load + embed_s + rank_s), rates, load)
    print_without_startup(rates["whole"], n / (embed_s + rank_s))
    print_cpu(n, used, bare_cpu)
    nm = manifest["narrow"]
    print(f"xling's reuse: {nm['sentences_total']} sentences in the haystacks, "
          f"{nm['sentences_distinct']} distinct embedded once: "
          f"{nm['sentences_total'] / max(1, nm['sentences_distinct']):.1f}x fewer than a "
          f"per-context pipeline; a rerun with a new query language embeds 0 sentences")


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    main()
