"""Throughput of the `translate` stage against bare CTranslate2, same model, same sentences.

Sentences: real Mr.TyDi and NeuCLIR passages from data/demo, split with sentencex, repeated
under new ids up to --sentences; each sentence is one document, so both sides translate
exactly the same inputs.

Bare engine: one `ctranslate2.Translator` with the same threads, the sentences tokenized
with the model's `tokenizer.json` and fed the way xling's actor feeds it (each actor call's
sentences sorted by length and cut into the same padded token batches, submitted
asynchronously), then detokenized: so the ratio measures xling's overhead only. (A single
`translate_batch` over everything with CTranslate2's own token batching ran 1.3-2.9x slower
here than these batches: that was a mis-tuned bare side, not xling beating the engine.)

xling: the whole `translate` stage on local Ray (partition into shards, reading, the
Translator actor with sentence segmentation, splitting, token batching, async CTranslate2,
reassembly, ordered streaming, per-shard Parquet commits and manifests).

Same options on both sides: beam size, compute type, threads, batch budget, and the same
decode bound for every sentence (the bench sets ratio high enough that every sentence gets
`--max-decode` tokens, the only bound a single bare call can express).

Reported (benchmarks/common.py): sentences/s at steady state (after each side's first
output) and over the whole run, their ratios, and start-up (model load for bare; Ray Data
pipelines, partition and actor start for xling), with the padding efficiency.

    .venv/bin/python benchmarks/translate.py --sentences 6000
    .venv/bin/python benchmarks/translate.py --model /models/nllb-600M-ct2 --device cuda \
        --compute-type int8_float16 --max-batch-tokens 16384 --batch-size 2048
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
import time
from pathlib import Path

from common import CPUMeter, print_cpu, print_ratios, start_ray, stream_rates

# Ray starts each actor with OMP_NUM_THREADS = its num_cpus (1); the bare engine gets the same
# environment, or the two sides would run different thread pools under the same settings.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]


def real_sentences(n: int, tokenizer: str, max_tokens: int = 200) -> list[tuple[str, str]]:
    """(id, sentence) pairs from the real demo passages, repeated up to n.

    Sentences over the stage's split limit (`max_input_tokens`, 200) are left out: the bare
    engine cannot take them (NLLB has 1024 positions) and the stage would split them, so the
    two sides would no longer translate the same inputs.
    """
    from sentencex import segment
    from tokenizers import Tokenizer

    base = []
    for f in sorted((ROOT / "data/demo/mrtydi").glob("*.jsonl.gz")):
        for line in gzip.open(f, "rt", encoding="utf-8"):
            text = json.loads(line)["text"]
            base += [s.strip() for p in text.split("\n") for s in segment("en", p) if s.strip()]
    for line in (ROOT / "data/demo/neuclir-rus.jsonl").open(encoding="utf-8"):
        text = json.loads(line)["text"]
        base += [s.strip() for p in text.split("\n") for s in segment("ru", p)
                 if len(s.strip()) > 20]
    tok = Tokenizer.from_file(f"{tokenizer}/tokenizer.json")
    base = [s for s, e in zip(base, tok.encode_batch(base, add_special_tokens=False))
            if len(e.ids) <= max_tokens]
    return [(f"s{i}", base[i % len(base)]) for i in range(n)]


def bare(model: str, sents: list[str], a) -> dict:
    """CTranslate2 at its best here, fed exactly as xling's actor feeds it: the sentences of
    each actor call (`batch_size` documents) sorted by length and cut into padded token
    batches (`token_batches`), each batch submitted asynchronously with the same options."""
    import ctranslate2
    from tokenizers import Tokenizer

    from xling.actors.segments import token_batches

    t0 = time.perf_counter()
    engine = ctranslate2.Translator(model, device=a.device, compute_type=a.compute_type,
                                    inter_threads=1, intra_threads=a.intra_threads)
    tok = Tokenizer.from_file(f"{model}/tokenizer.json")
    load = time.perf_counter() - t0
    t0, cpu = time.perf_counter(), CPUMeter()
    sources = [["eng_Latn", *e.tokens, "</s>"]
               for e in tok.encode_batch(sents, add_special_tokens=False)]
    hyps: list = [None] * len(sources)
    for lo in range(0, len(sources), a.batch_size):
        window = list(range(lo, min(lo + a.batch_size, len(sources))))
        jobs = []
        for idx in token_batches([len(sources[i]) for i in window], a.max_batch_tokens):
            ids = [window[i] for i in idx]
            jobs.append((ids, engine.translate_batch(
                [sources[i] for i in ids], target_prefix=[["deu_Latn"]] * len(ids),
                asynchronous=True, beam_size=a.beam_size, max_batch_size=0,
                max_input_length=0, max_decoding_length=a.max_decode + 1,
                return_end_token=True)))
        for ids, results in jobs:
            for i, r in zip(ids, results):
                hyps[i] = [t for t in r.result().hypotheses[0][1:] if t != "</s>"]
    texts = [tok.decode([tok.token_to_id(t) for t in h if tok.token_to_id(t) is not None],
                        skip_special_tokens=True) for h in hyps]
    wall, used = time.perf_counter() - t0, cpu.stop()
    assert len(texts) == len(sents)
    return {"load": load, "wall": wall, "cpu": used, "tgt_tokens": sum(len(h) for h in hyps),
            "lengths": [len(s) for s in sources],
            "steady": len(sents) / wall}


def xling_stage(model: str, corpus: Path, a) -> dict:
    """The whole stage on a fresh run root; wall time, rows and target tokens."""
    from xling.config import validate_config
    from xling.core.runner import Runner
    from xling.core.status import read_cell
    from xling.core.store import RunStore
    from xling.jobs.translate import TranslateStage

    run_root = tempfile.mkdtemp(prefix="xling-bench-")
    cfg = validate_config({"name": "bench", "run_root": run_root, "translate": {
        "model": model, "beam_size": a.beam_size, "compute_type": a.compute_type,
        "device": a.device, "intra_threads": a.intra_threads,
        "max_batch_tokens": a.max_batch_tokens, "lang_check": "off", "shards": a.shards,
        # Every sentence may produce max_decode tokens, as in the single bare call.
        "decode": {"ratio": 1000.0, "extra": 0, "max_tokens": a.max_decode},
        "parallel": {"concurrency": [1, 1], "batch_size": a.batch_size,
                     "num_gpus": 1 if a.device == "cuda" else 0},
        "documents": [{"name": "bench", "format": "jsonl", "path": str(corpus), "langs": ["en"],
                       "targets": ["de"], "id_field": "id", "title_field": None,
                       "text_field": "text"}]}})
    t0, cpu = time.perf_counter(), CPUMeter()
    runner = Runner(RunStore(run_root), progress=False, log=lambda *_: None)
    [rep] = runner.run(TranslateStage(), cfg)
    wall, used = time.perf_counter() - t0, cpu.stop()
    table = read_cell(RunStore(run_root), rep.cell.dir, columns=["n_tgt_tokens", "error"])
    assert rep.errors == 0, "benchmark sentences must all translate"
    return {"wall": wall, "rows": rep.rows, "cpu": used,
            "rates": stream_rates(runner, wall, "StoreTranslator", 1),
            "tgt_tokens": sum(n or 0 for n in table["n_tgt_tokens"].to_pylist())}


def write_corpus(path: Path, pairs) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": s}, ensure_ascii=False) + "\n"
                            for i, s in pairs), encoding="utf-8")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=6000)
    ap.add_argument("--model", default="tiny:nllb_ct2", help="a CTranslate2 dir or tiny:nllb_ct2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compute-type", default="default")
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--intra-threads", type=int, default=2)
    ap.add_argument("--max-batch-tokens", type=int, default=4096)
    ap.add_argument("--max-decode", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=512, help="documents per actor call")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--num-cpus", type=int, default=2, help="local Ray CPUs")
    a = ap.parse_args()

    from xling.actors.segments import padding_efficiency, token_batches
    from xling.core.models import resolve_model

    model = resolve_model(a.model)
    pairs = real_sentences(a.sentences, model)
    with tempfile.TemporaryDirectory() as d:
        b = bare(model, [s for _, s in pairs], a)
        stop_ray = start_ray(a.num_cpus)
        x = xling_stage(model, write_corpus(Path(d) / "all.jsonl", pairs), a)
        stop_ray()
    n = len(pairs)
    lengths = b["lengths"]
    pad = padding_efficiency(lengths, token_batches(lengths, a.max_batch_tokens,
                                                    window=a.batch_size))
    print(f"sentences {n}   model {a.model}   device {a.device}   beam {a.beam_size}   "
          f"padding eff {pad:.3f} (both sides)")
    print(f"target tokens: bare {b['tgt_tokens']}, xling {x['tgt_tokens']}; bare load "
          f"{b['load']:.2f} s, translate {b['wall']:.1f} s; xling run {x['wall']:.1f} s")
    print_ratios("sent/s", b["steady"], n / b["wall"], x["rates"], b["load"])
    print_cpu(n, x["cpu"], b["cpu"])


if __name__ == "__main__":
    main()
