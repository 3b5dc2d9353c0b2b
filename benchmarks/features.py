"""Throughput of the MIRAGE-Bench feature actors (NLIScorer, CrossEncoderScorer) against the
bare models, same model, same pairs, in one run.

- NLI (support features): bare = transformers alone: the pairs tokenized in one call, sorted
  by length, cut into forward batches of --batch-size, padded, forward, softmax (what the
  actor does per Ray batch, over all pairs at once); xling = `NLIScorer` through Ray Data
  `map_batches` (Arrow batches in and out, empty-row checks, label columns from id2label).
- Cross-encoder (reranker feature): bare = one `FlagReranker.compute_score(pairs,
  normalize=False)` over all pairs; xling = `CrossEncoderScorer` through `map_batches`.

The tiny models by default; `--nli-model MoritzLaurer/mDeBERTa-v3-base-xnli-multilingual-nli-2mil7
--reranker-model BAAI/bge-reranker-v2-m3` (or local paths) on a machine with the weights.
Pairs: texts drawn from the demo passages' vocabulary (Zipf, benchmarks/index.py): premises
and passages 60-200 words, hypotheses 8-25 words, queries 3-8 words.

Same engine settings on both sides: device, forward batch size, max length, fp16 (reranker,
CUDA only, as MIRAGE-Bench ran it), and torch threads: by default one actor holding all the
CPUs (Ray gives it OMP_NUM_THREADS = its CPUs, as many torch threads as the bare side has),
so the ratio measures what the actor adds around the model. Reported (benchmarks/common.py):
pairs/s at steady state (xling: pairs / the actor operator's busy time per actor) and over
the whole run, the ratio xling / bare, and start-up (the import of transformers or
FlagEmbedding and the model load for bare, as generate.py and dense.py count it; Ray Data
pipeline, actor start, import and model load for xling); and how far xling's outputs are
from bare's.

Default sizes make each bare side run 20 s or more on 2 cores (issue 28: a fixed start-up must
not decide the ratio alone): 2,000 NLI pairs (70-120 s bare here) and 8,000 reranker pairs
(27-52 s bare; 2,000 ran 6.7 s, so start-up alone held the ratio near 0.5).

    .venv/bin/python benchmarks/features.py
    .venv/bin/python benchmarks/features.py --features reranker --pairs 2000   # one size for both
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CPUMeter, print_cpu, print_ratios, print_without_startup, start_ray  # noqa: E402
from common import stream_rates  # noqa: E402
from index import texts, vocabulary  # noqa: E402

NLI_LABELS = ("entailment", "neutral", "contradiction")


def bare_nli(model: str, premises: list[str], hypotheses: list[str], device: str,
             batch_size: int, max_length: int) -> tuple[np.ndarray, float, float, dict]:
    """transformers alone: probabilities [n, 3] in NLI_LABELS order, start-up s (the import
    of transformers and the model load), engine s, engine CPU (`CPUMeter`)."""
    import torch

    t = time.perf_counter()
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    clf = AutoModelForSequenceClassification.from_pretrained(model).to(device).eval()
    labels = [str(clf.config.id2label[i]).lower() for i in range(clf.config.num_labels)]
    load = time.perf_counter() - t

    t, cpu = time.perf_counter(), CPUMeter(ray=False)
    enc = tok(premises, hypotheses, truncation=True, max_length=max_length)
    order = np.argsort([-len(ids) for ids in enc["input_ids"]], kind="stable")
    probs = np.empty((len(premises), clf.config.num_labels), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            feats = tok.pad({k: [enc[k][i] for i in idx] for k in enc.keys()},
                            return_tensors="pt").to(device)
            probs[idx] = torch.softmax(clf(**feats).logits.float(), dim=-1).cpu().numpy()
    engine = time.perf_counter() - t
    return probs[:, [labels.index(name) for name in NLI_LABELS]], load, engine, cpu.stop()


def bare_reranker(model: str, queries: list[str], passages: list[str], device: str,
                  batch_size: int, max_length: int,
                  fp16: bool) -> tuple[np.ndarray, float, float, dict]:
    """FlagReranker alone: raw logits [n], start-up s (the import of FlagEmbedding and the
    model load), engine s, engine CPU."""
    t = time.perf_counter()
    from FlagEmbedding import FlagReranker

    reranker = FlagReranker(model, use_fp16=fp16, devices=[device], batch_size=batch_size,
                            max_length=max_length, normalize=False)
    reranker.model.to(device).eval()  # as the actor does, so the load is all in `load`
    load = time.perf_counter() - t
    t, cpu = time.perf_counter(), CPUMeter(ray=False)
    scores = reranker.compute_score([[q, p] for q, p in zip(queries, passages)],
                                    batch_size=batch_size, max_length=max_length,
                                    normalize=False)
    engine = time.perf_counter() - t
    return np.asarray(scores, dtype=np.float64), load, engine, cpu.stop()


def run_xling(cls, kwargs: dict, columns: dict[str, list[str]], outputs: tuple[str, ...],
              ray_batch: int, actors: int, resources: dict) -> tuple[np.ndarray, dict]:
    """The actor through Ray Data map_batches on an already started Ray: its outputs [n, k]
    in input order and its rates (benchmarks/common.py)."""
    import pyarrow as pa
    import ray.data

    from xling.core.runner import _operator_times

    n = len(next(iter(columns.values())))
    table = pa.table({"id": np.arange(n), **columns})
    # One block per Ray batch, so every actor of the pool gets work from the start.
    blocks = [table.slice(i, ray_batch) for i in range(0, n, ray_batch)]
    t, cpu = time.perf_counter(), CPUMeter()
    ds = ray.data.from_arrow(blocks).map_batches(
        cls, fn_constructor_kwargs=kwargs, concurrency=actors, batch_size=ray_batch,
        batch_format="pyarrow", **resources)
    stream = {"records": n, "started": time.time(), "first_output": None}
    values = np.full((n, len(outputs)), np.nan)
    errors = 0
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        if stream["first_output"] is None:
            stream["first_output"] = time.time()
        ids = batch["id"].to_numpy()
        values[ids] = np.column_stack([batch[c].to_numpy(zero_copy_only=False)
                                       for c in outputs])
        errors += batch.num_rows - batch["error"].null_count
    wall, used = time.perf_counter() - t, cpu.stop()
    stream["busy"], stream["union"] = _operator_times(ds)
    if errors:
        print(f"  xling {cls.__name__}: {errors} error rows")
    return values, {**stream_rates([stream], wall, cls.__name__, actors), "cpu": used}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=0,
                    help="pairs for every feature (default: --nli-pairs, --reranker-pairs)")
    ap.add_argument("--nli-pairs", type=int, default=2_000)
    ap.add_argument("--reranker-pairs", type=int, default=8_000)
    ap.add_argument("--features", default="nli,reranker", help="nli, reranker or both")
    ap.add_argument("--nli-model", default="tiny:nli_deberta",
                    help="hub id, local path or tiny:nli_deberta")
    ap.add_argument("--reranker-model", default="tiny:xlmr_reranker",
                    help="hub id, local path or tiny:xlmr_reranker")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32, help="forward batch, both sides")
    ap.add_argument("--ray-batch", type=int, default=0,
                    help="rows per actor call (default: the stage's, features.<model>."
                         "parallel.batch_size)")
    ap.add_argument("--actors", type=int, default=1,
                    help="actors; on CPU the machine's CPUs are shared out between them")
    args = ap.parse_args()
    features = {f.strip() for f in args.features.split(",")} - {""}
    if not features or features - {"nli", "reranker"}:
        ap.error("--features: nli, reranker or both")

    import torch

    from xling.actors.cross_encoder import CrossEncoderScorer
    from xling.actors.nli import NLIScorer
    from xling.core.models import resolve_model
    from xling.jobs.features import ScorerModel

    gpu = torch.cuda.is_available()
    device = "cuda:0" if gpu else "cpu"
    cpus = os.cpu_count() or 1
    ray_batch = args.ray_batch or ScorerModel.model_fields["parallel"].default.batch_size
    # CPU: each actor gets an equal share of the cores (and as many torch threads); the bare
    # side runs with torch's default, all cores: with one actor, the same threads.
    resources = ({"num_gpus": 1 / args.actors} if gpu
                 else {"num_cpus": max(1, cpus // args.actors)})
    vocab = vocabulary()
    n_nli = args.pairs or args.nli_pairs
    n_rerank = args.pairs or args.reranker_pairs
    # Each feature takes the first pairs of one draw: NLI's pairs are the reranker's first.
    premises = texts(max(n_nli, n_rerank), 60, 200, vocab, seed=1)
    hypotheses = texts(n_nli, 8, 25, vocab, seed=2)
    queries = texts(n_rerank, 3, 8, vocab, seed=3)
    print(f"pairs: NLI {n_nli}, reranker {n_rerank}; max_length {args.max_length}, "
          f"forward batch {args.batch_size}, "
          f"ray batch {ray_batch}, device {device}, torch threads bare "
          f"{torch.get_num_threads()}, xling {args.actors} actor(s) x {resources}")

    stop_ray = start_ray(cpus)

    if "nli" in features:
        model = resolve_model(args.nli_model, key="--nli-model")
        bare, load, engine, bare_cpu = bare_nli(model, premises[:n_nli], hypotheses, device,
                                      args.batch_size, args.max_length)
        xling, rates = run_xling(
            NLIScorer, {"model": model, "device": device, "batch_size": args.batch_size,
                        "max_length": args.max_length},
            {"premise": premises[:n_nli], "hypothesis": hypotheses}, NLI_LABELS, ray_batch,
            args.actors, resources)
        print(f"NLI ({args.nli_model}): max |xling - bare| probability "
              f"{np.nanmax(np.abs(xling - bare)):.2e}")
        report(n_nli, load, engine, rates, bare_cpu)

    if "reranker" in features:
        model = resolve_model(args.reranker_model, key="--reranker-model")
        bare, load, engine, bare_cpu = bare_reranker(model, queries, premises[:n_rerank], device,
                                           args.batch_size, args.max_length, fp16=gpu)
        xling, rates = run_xling(
            CrossEncoderScorer, {"model": model, "device": device, "use_fp16": gpu,
                                 "batch_size": args.batch_size, "max_length": args.max_length},
            {"query": queries, "passage": premises[:n_rerank]}, ("score",), ray_batch, args.actors,
            resources)
        # Not bit-equal: each side pads its forward batches to other lengths (FlagReranker
        # sorts each call's pairs), which moves logits by float32 rounding.
        print(f"cross-encoder ({args.reranker_model}): max |xling - bare| logit "
              f"{np.nanmax(np.abs(xling[:, 0] - bare)):.2e}")
        report(n_rerank, load, engine, rates, bare_cpu)
    stop_ray()


def report(n: int, startup: float, engine: float, rates: dict, bare_cpu: dict) -> None:
    """The bare call has no first output to cut at: its steady rate is the call's; its whole
    run adds its start-up (import and model load), as xling's holds its actor's."""
    print_ratios("pairs/s", n / engine, n / (startup + engine), rates, startup)
    print_without_startup(rates["whole"], n / engine)
    print_cpu(n, rates["cpu"], bare_cpu)


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    main()
