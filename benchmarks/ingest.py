"""Throughput of the `ingest` stage against its bare engine, on the same documents, in one run.

Bare engine: one Python process that parses the JSONL, segments with sentencex and counts
tokens with the same `tokenizers` file, in a loop. xling: the full stage on local Ray
(partition into shards, DocumentStats actor pool, ordered streaming, per-shard commits,
manifests). Ray's own start-up is excluded from both (it is paid once per job).

    .venv/bin/python benchmarks/ingest.py --docs 20000 --shards 16
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import tempfile
import time
from pathlib import Path

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


def bare(path: Path, tokenizer_dir: str) -> float:
    from sentencex import segment
    from tokenizers import Tokenizer

    from xling.tasks.corpora import parse_document_line

    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    t0 = time.perf_counter()
    n = 0
    with path.open(encoding="utf-8") as f:
        batch = []
        for line in f:
            row = parse_document_line(line, fmt="mrtydi", lang="en", source="bench")
            batch.append(row)
            if len(batch) == 64:
                n += _measure(batch, tok, segment)
                batch = []
        n += _measure(batch, tok, segment)
    return n / (time.perf_counter() - t0)


def _measure(batch, tok, segment) -> int:
    ids = tok.encode_batch([r["text"] for r in batch], add_special_tokens=False)
    for r, e in zip(batch, ids):
        r["n_tokens"] = len(e.ids)
        r["n_segments"] = sum(1 for p in r["text"].split("\n") for s in segment("en", p) if s.strip())
    return len(batch)


def xling_stage(path: Path, tokenizer_dir: str, shards: int, concurrency: int,
                batch_size: int) -> tuple[float, float]:
    import ray
    import ray.data

    from xling.config import validate_config
    from xling.jobs.ingest import IngestStage
    from xling.core.runner import Runner
    from xling.core.store import RunStore

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars, ctx.print_on_execution_start = False, False
    run_root = tempfile.mkdtemp(prefix="xling-bench-")
    cfg = validate_config({"name": "bench", "run_root": run_root, "ingest": {
        "tokenizer": tokenizer_dir, "shards": shards,
        "parallel": {"concurrency": [concurrency, concurrency], "batch_size": batch_size},
        "corpora": [{"name": "bench", "format": "mrtydi", "path": str(path), "langs": ["en"]}]}})
    t0 = time.perf_counter()
    [rep] = Runner(RunStore(run_root), progress=False, log=lambda *_: None).run(IngestStage(), cfg)
    wall = time.perf_counter() - t0
    ray.shutdown()
    return rep.rows / wall, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=2, help="DocumentStats actors")
    ap.add_argument("--batch-size", type=int, default=512)
    args = ap.parse_args()
    from xling.dev.tiny_models import build_tiny_models

    tok = str(build_tiny_models(progress=False)["nllb_hf"])
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "docs.jsonl"
        make_corpus(path, args.docs)
        b = bare(path, tok)
        x, wall = xling_stage(path, tok, args.shards, args.concurrency, args.batch_size)
    print(f"documents            {args.docs}")
    print(f"bare engine          {b:10.1f} docs/s  (1 process)")
    print(f"xling ingest stage   {x:10.1f} docs/s  ({args.concurrency} actors, {args.shards} shards, "
          f"{wall:.1f} s incl. partition and commits)")
    print(f"ratio xling / bare   {x / b:10.2f}")


if __name__ == "__main__":
    main()
