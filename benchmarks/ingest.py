"""Throughput of the `ingest` stage against its bare engine, on the same documents, in one run.

Bare engine: as many Python processes as xling has actors, parsing the JSONL, segmenting with
sentencex and counting tokens with the same `tokenizers` file (`encode_batch_fast`), fed the
same batches. xling:
the full stage on local Ray (partition into shards, DocumentStats actor pool, workers'
commits, manifests). Ray's own start-up is excluded (it is paid once per job). Steady state
and whole run as in benchmarks/common.py.

    .venv/bin/python benchmarks/ingest.py --docs 200000 --shards 16
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from pathlib import Path

from common import CPUMeter, print_cpu, print_ratios, print_stats, start_ray, stream_rates

ROOT = Path(__file__).resolve().parents[1]


def make_corpus(path: Path, n_docs: int) -> int:
    """Real Mr.TyDi passages from data/demo, repeated under new ids up to n_docs (Finnish-
    tagged file per language is not needed: the stage treats them as one language)."""
    docs = []
    for f in sorted((ROOT / "data/demo/mrtydi").glob("*.jsonl.gz")):
        docs += [json.loads(l) for l in gzip.open(f, "rt", encoding="utf-8")]
    with path.open("w", encoding="utf-8") as out:
        for i in range(n_docs):
            d = docs[i % len(docs)]
            out.write(json.dumps({"docid": f"{d['docid']}-{i}", "title": d["title"],
                                  "text": d["text"]}, ensure_ascii=False) + "\n")
    return n_docs


_TOK = None


def _init(tokenizer_dir: str) -> None:
    global _TOK
    from tokenizers import Tokenizer

    _TOK = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")


def _work(lines: list[str]) -> int:
    from sentencex import segment

    from xling.tasks.corpora import parse_document_line

    batch = [parse_document_line(line, fmt="mrtydi", lang="en", source="bench") for line in lines]
    return _measure(batch, _TOK, segment)


def _measure(batch, tok, segment) -> int:
    # The counts only, as the tokenizers docs give them fastest: no offsets, no id lists.
    encodings = tok.encode_batch_fast([r["text"] for r in batch], add_special_tokens=False)
    for r, e in zip(batch, encodings):
        r["n_tokens"] = len(e)
        r["n_segments"] = sum(1 for p in r["text"].split("\n") for s in segment("en", p)
                              if s.strip())
    return len(batch)


def bare(path: Path, tokenizer_dir: str, processes: int, batch_size: int) -> dict:
    """The same parse + segment + count, in `processes` worker processes (as many as xling's
    actors), fed batches of `batch_size` lines."""
    import multiprocessing as mp

    lines = path.read_text(encoding="utf-8").splitlines()
    batches = [lines[i:i + batch_size] for i in range(0, len(lines), batch_size)]
    t0, cpu = time.perf_counter(), CPUMeter()
    with mp.get_context("spawn").Pool(processes, initializer=_init,
                                      initargs=(tokenizer_dir,)) as pool:
        start = time.perf_counter() - t0
        n = sum(pool.imap_unordered(_work, batches))
    wall = time.perf_counter() - t0
    return {"whole": n / wall, "steady": n / (wall - start), "startup": start,
            "cpu": cpu.stop()}


def xling_stage(path: Path, tokenizer_dir: str, shards: int, concurrency: int) -> dict:
    from xling.config import validate_config
    from xling.jobs.ingest import IngestStage
    from xling.core.runner import Runner
    from xling.core.store import RunStore

    stop_ray = start_ray(2)
    run_root = tempfile.mkdtemp(prefix="xling-bench-")
    cfg = validate_config({"name": "bench", "run_root": run_root, "ingest": {
        "tokenizer": tokenizer_dir, "shards": shards,
        # The stage's own batch size and CPUs; the pool pinned to as many actors as bare
        # has processes.
        "parallel": {"concurrency": [concurrency, concurrency]},
        "corpora": [{"name": "bench", "format": "mrtydi", "path": str(path), "langs": ["en"]}]}})
    t0, cpu = time.perf_counter(), CPUMeter()
    runner = Runner(RunStore(run_root), progress=False, log=lambda *_: None)
    runner.run(IngestStage(), cfg)
    wall = time.perf_counter() - t0
    used = cpu.stop()
    stop_ray()
    print_stats(runner)
    return {**stream_rates(runner, wall, "DocumentStats", concurrency), "cpu": used}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=2, help="DocumentStats actors")
    ap.add_argument("--batch-size", type=int, default=512,
                    help="lines per bare task (xling uses the stage's ingest.parallel.batch_size)")
    args = ap.parse_args()
    from xling.dev.tiny_models import build_tiny_models

    tok = str(build_tiny_models(progress=False)["nllb_hf"])
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "docs.jsonl"
        make_corpus(path, args.docs)
        b = bare(path, tok, args.concurrency, args.batch_size)
        x = xling_stage(path, tok, args.shards, args.concurrency)
    print(f"documents {args.docs}; {args.concurrency} processes (bare) / actors (xling), "
          f"{args.shards} shards")
    print_ratios("docs/s", b["steady"], b["whole"], x, b["startup"])
    print_cpu(args.docs, x["cpu"], b["cpu"])


if __name__ == "__main__":
    main()
