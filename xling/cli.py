"""The `xling` command line.

    xling run     --config FILE [KEY=VALUE ...]   run every stage the config lists, in order
    xling <stage> --config FILE [KEY=VALUE ...]   run one stage (ingest, translate, index,
                                                  retrieve, rerank, narrow, generate, features,
                                                  judge, evaluate, report)
    xling validate --config FILE [KEY=VALUE ...]  check a config and print it with cell hashes
    xling status  RUN_ROOT                        done / partial / failed cells, rows, errors
    xling models  tiny                            build the tiny offline test models
    xling models  convert --config FILE           convert translate.model to CTranslate2,
                                                  cached in the run store

Every stage takes --dry-run (print cells, shards and inputs; run nothing), --force (redo
finished cells), --limit N (a smoke run on the first N records of every cell's input, in
RUN_ROOT/_smoke/limit-N) and --address (a Ray cluster; RAY_ADDRESS works too, which is what
`ray job submit -- xling ...` sets).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from xling.config import XlingConfig, load_config
from xling.core.config import ConfigError
from xling.core.store import RunStore, StoreError

EXAMPLES = """examples:
  xling run --config configs/demo.yaml
  xling ingest --config configs/demo.yaml ingest.shards=16 --dry-run
  xling ingest --config configs/demo.yaml run_root=s3://my-bucket/xling/demo
  ray job submit --address http://HEAD:8265 --working-dir . -- xling run --config configs/demo.yaml
  xling translate --config configs/demo.yaml translate.beam_size=2 --dry-run
  xling generate --config configs/demo.yaml generate.sampling.temperature=0.7
  xling run --config configs/xrag.yaml 'study.options.langs=[de]' generate.models.0.model=Qwen/Qwen2.5-7B-Instruct
  xling models convert --config configs/translate-clef2003.yaml translate.model=facebook/nllb-200-distilled-1.3B
  xling status runs/demo
"""


LLM_ENTRIES = """  LLM entries (rerank.model, generate.models[], judge.judges[]):
    name              label in cells and the `model` column             [the model]
    backend           vllm (offline engine) or openai (any OpenAI-compatible endpoint)
    model             vllm: hub id, local path or tiny:llama_chat; openai: served name
    chat              prompts through the chat template / chat API           [true]
    too_long          vllm: refuse (error row) or truncate (cut in the middle;
                      truncated_from recorded) prompts over max_model_len  [refuse]
    max_model_len / dtype / tensor_parallel_size / gpu_memory_utilization /
    enforce_eager / engine_kwargs        vllm.LLM(...) arguments
    base_url / api_key_env [OPENAI_API_KEY] / concurrency [8] / timeout_s [120] /
    max_retries [5] / backoff_s [1]       openai: retries 429/5xx/timeouts with backoff
    sampling          {temperature, top_p, max_tokens, stop, seed}: overrides the section's
    parallel          concurrency (min, max) / batch_size / num_gpus (= tensor_parallel_size)
"""


def stage_registry() -> dict:
    from xling.jobs.evaluate import EvaluateStage
    from xling.jobs.index import IndexStage
    from xling.jobs.ingest import IngestStage
    from xling.jobs.narrow import NarrowStage
    from xling.jobs.rerank import RerankStage
    from xling.jobs.retrieve import RetrieveStage
    from xling.jobs.study import StudyFeaturesStage, StudyGenerateStage, StudyJudgeStage
    from xling.jobs.translate import TranslateStage

    # generate and judge come with the study glue: plain prompt files work through it too.
    return {"ingest": IngestStage, "translate": TranslateStage, "index": IndexStage,
            "retrieve": RetrieveStage, "rerank": RerankStage, "narrow": NarrowStage,
            "generate": StudyGenerateStage,
            "features": StudyFeaturesStage, "judge": StudyJudgeStage, "evaluate": EvaluateStage}


def _stage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="experiment YAML (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="dotted overrides, e.g. ingest.shards=16 run_root=s3://bucket/run")
    p.add_argument("--dry-run", action="store_true",
                   help="print the cells, shards and inputs that would run, and what is done")
    p.add_argument("--force", action="store_true", help="redo cells that are already done")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="smoke run: every cell reads only the first N records of its input, "
                        "under RUN_ROOT/_smoke/limit-N, apart from the full results")
    p.add_argument("--address", default=None,
                   help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="per-cell lines and the workers' (JVM, vLLM...) logs on the console; "
                        "-vv: debug. Default: $XLING_LOG_LEVEL, else WARNING (quiet: stage "
                        "lines, progress, results; the rest in {run_root}/_logs/)")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xling")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xling", description="Cross-lingual retrieval and RAG studies as resumable Ray jobs.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"xling {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("run", help="run all stages listed in the config's `stages:`",
                       description="Run the config's stages in order. Finished cells are "
                                   "skipped, so rerunning a killed job resumes it.")
    _stage_args(p)
    p = sub.add_parser("ingest", help="read corpora into documents rows (sharded, resumable)",
                       description="Read each corpus x language into the documents schema, "
                                   "with sentence and token counts; malformed records become "
                                   "error rows.")
    _stage_args(p)
    p = sub.add_parser(
        "translate", help="translate documents (DT) and topics (QT) with NLLB (CTranslate2)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Translate each source x language into each target language, sentence by "
                    "sentence, with one CTranslate2 actor pool for all directions. Output: "
                    "translations rows (id, kind, src_lang, tgt_lang, title, text, segments, "
                    "n_segments, token counts, model, compute_type, beam_size, error) under "
                    "translate/<source>.<src>.<tgt>.<hash>/. Empty, wrong-language or unreadable "
                    "records become error rows.",
        epilog="""settings (translate.*, all overridable as KEY=VALUE):
  model             CTranslate2 dir, hub id / Transformers dir (converted once into the
                    run store), or tiny:nllb_ct2                     [tiny:nllb_ct2]
  quantization      weights when converting: int8, int8_float16, float16, ...   [int8]
  compute_type      CTranslate2 compute type at load time                    [default]
  beam_size         beam width                                                     [4]
  device            auto, cpu or cuda                                           [auto]
  inter_threads / intra_threads   CTranslate2 replicas per actor / threads each  [1 / 0]
  max_batch_tokens  padded tokens per engine batch (batch_type=tokens)          [4096]
  max_input_tokens  longer sentences are split before translation               [200]
  decode.ratio / decode.extra / decode.max_tokens
                    a sentence of n tokens may produce min(max_tokens, ratio*n+extra)
  lang_check        error: a text that looks like another language is an error row
  shards            deterministic shards per cell (each commits on its own)      [16]
  parallel.concurrency / batch_size / num_gpus (fractions share a GPU) / num_cpus

example:
  xling translate --config configs/demo.yaml translate.beam_size=2 translate.shards=32
""")
    _stage_args(p)
    p = sub.add_parser(
        "index", help="build BM25 (Lucene) and dense (BGE-M3) indexes, sharded and merged",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Index each collection x language (original documents, and the translate "
                    "stage's document translations listed in `translated:`) with each engine. "
                    "BM25: every shard is indexed by its own task with Anserini's analyzer for "
                    "the language, then the shards are merged into one Lucene index in the run "
                    "store (scores equal a single-index build). Dense: BGE-M3 embeddings, "
                    "stored as shards and searched exactly.",
        epilog="""settings (index.*, all overridable as KEY=VALUE):
  collections       corpora (same fields as translate.documents) + original: true|false
                    and translated: [langs] (needs the translate stage's DT)
  engines           [bm25], [dense] or both                                   [[bm25]]
  contents          title_text (title, newline, text) or text              [title_text]
  bm25.store_raw / bm25.store_docvectors / bm25.optimize / bm25.threads / bm25.heap
  dense.model       hub id, local path or tiny:bge_m3                    [tiny:bge_m3]
  dense.max_length / dense.query_max_length   tokens (the papers use 512)       [512]
  dense.sparse / dense.colbert   also store BGE-M3's lexical weights / ColBERT vectors
  dense.fp16        half precision on CUDA                                     [false]
  shards            shards per index cell (parallel indexing tasks)               [8]

A language without a Lucene analyzer is indexed with the standard analyzer (a warning,
and analyzer_fallback: true in the manifest).
""")
    _stage_args(p)
    p = sub.add_parser(
        "retrieve", help="first-stage runs (BM25, dense) in OG/QT/DT/BordIRLines modes, fusion",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Search each topic set x query language x document language with each "
                    "run; queries are sharded over an actor pool of searchers. Output: hits "
                    "rows (query_id, lang, doc_id, rank, score, doc_lang, system) and a TREC "
                    "run file per cell. Fusions (RRF, interpolation) follow their runs.",
        epilog="""settings (retrieve.*):
  topics[]          name, format (tsv|clef|jsonl|neuclir), path, langs (query languages),
                    doc_langs (document languages; {doc_lang} in path/qrels), qrels,
                    fields (clef, neuclir, irds:, pyserini: query fields, e.g. [ht_title]),
                    translations (the translate.topics entry holding their QT)
                    path and qrels may name a standard set, fetched once into the run
                    store: irds:neuclir/1/{lang}/trec-2022, pyserini:ciral-v1.0-ha-test-a
  runs[]            name, engine (bm25|dense), collection, mode, k1 [0.9], b [0.4],
                    weights (dense: {dense: 1, sparse: 0.3, colbert: 1}), merge
  modes             og  original queries, original documents
                    qt  queries translated into the document language (translate stage)
                    dt  original queries, documents translated into the query language
                    qlang | en | qlang_en | rel_langs | swap   BordIRLines: per-query
                        language partitions (rel_langs: a rel_langs topic column)
  fusion[]          name, runs, method (rrf|interpolate), k [60], depth [1000], weights
  depth             hits kept per query                                           [100]
""")
    _stage_args(p)
    p = sub.add_parser(
        "rerank", help="LLM reranking of runs: listwise (RankGPT windows) or pairwise (PRP)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Rerank the top `depth` hits of each query of a retrieve run (or a TREC "
                    "run file) with an LLM. listwise: RankZephyr's prompt over windows of 20, "
                    "step 10, from the bottom up; pairwise: PRP, both orders asked, bubble sort "
                    "with k passes. All queries of an actor batch advance together, so every "
                    "LLM call is a full batch. Output: hits rows with the LLM's order, per-query "
                    "call / malformed-output counts, and a TREC run file per cell.",
        epilog="""settings (rerank.*):
  model             one LLM entry (below)
  sampling          default greedy; max_tokens 6 x window (listwise) or 8 (pairwise)
  runs[]            name; input (a retrieve run or fusion) or trec + topics + corpus;
                    method listwise|pairwise; depth [100]; window [20]; step [10];
                    passes [10] (pairwise: top-k sorted); doc_tokens [128] (64/128/256)
  batch_queries     queries in lockstep per actor call                          [64]
  cache             reuse stored LLM answers (same model, params, prompt)       [true]

""" + LLM_ENTRIES + """
example:
  xling rerank --config configs/retrieve-ciral.yaml rerank.model.model=castorini/rank_zephyr_7b_v1_full
""")
    _stage_args(p)
    p = sub.add_parser(
        "generate", help="prompt rows through vLLM / API models -> generations rows (cached)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run every prompt set through every model: the files under "
                    "generate.prompts, and with a `study:` section one prompt set per study "
                    "setting x language, built by the study's tasks/ module (xrag, "
                    "bordirlines). Output: generations rows "
                    "(item_id, study, setting, lang, model, prompt_hash, prompt, output, parsed, "
                    "n_prompt_tokens, n_output_tokens, latency_s, finish_reason, too_long, "
                    "truncated_from, cached, cache_key, error). Generations are cached by (model, "
                    "engine settings, sampling params, prompt): reruns reuse them, other models "
                    "or params do not. Empty, too long and failed prompts become error rows.",
        epilog="""settings (generate.*):
  models[]          LLM entries (below); entries that differ only in sampling/too_long
                    share one loaded engine
  prompts[]         name, path (JSONL/Parquet: item_id, prompt or messages, study,
                    setting, lang), parser (none | answer_tag | json)
  (study.*)         task (xrag | bordirlines) and options: data, langs, settings or
                    modes/prompts, article order, truncation... (configs/xrag.yaml and
                    configs/bordirlines.yaml list them with their defaults)
  sampling          {temperature: 0, top_p: 1, max_tokens: 256, stop: [], seed: 0}
  cache             reuse stored generations                                    [true]
  shards            deterministic shards per cell                                  [4]

""" + LLM_ENTRIES + """
example:
  xling generate --config configs/demo.yaml generate.models.0.model=Qwen/Qwen2.5-7B-Instruct \\
      generate.models.0.parallel.num_gpus=1
""")
    _stage_args(p)
    p = sub.add_parser(
        "narrow", help="rank each long context's sentences against the query (CROSS): "
                       "embed once, keep the top k",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="For a study that narrows long contexts (cross): one cell per context "
                    "language embeds every distinct sentence of its contexts once with "
                    "BGE-M3 (cached in the run store under _cache/emb/, so reruns, new query "
                    "languages and new k embed nothing new), then ranks each context's "
                    "sentences against each query language exactly (score descending, ties by "
                    "sentence index) and writes the top max(ks) with every needle's rank to "
                    "narrow/<study>.<lang>.<hash>/_selections.parquet. The generate stage's "
                    "CROSS prompts read it.",
        epilog="""settings (narrow.*):
  model             hub id, local path or tiny:bge_m3                       [BAAI/bge-m3]
  max_length        tokens per sentence; longer ones are truncated and counted    [512]
  fp16              half precision on CUDA                                       [false]
  encode_batch_size texts per forward pass                                          [32]
  cache             reuse vectors stored in the run store                         [true]
  shards            deterministic shards per cell                                    [4]
  parallel.concurrency / batch_size / num_gpus / num_cpus

example:
  xling narrow --config configs/cross.yaml narrow.parallel.num_gpus=1
  xling narrow --config configs/cross.yaml 'study.options.query_langs=[en,fa]' --dry-run
""")
    _stage_args(p)
    p = sub.add_parser(
        "features", help="model-scored features of a study's generations (NLI, reranker, "
                         "language id, LLM scores, lexical metrics)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Score every model's generations of each (setting, language) with the "
                    "scorers the study asks for (one cell per setting x language x scorer): "
                    "an NLI classifier on (cited passage, reason sentence) pairs, a "
                    "cross-encoder on (query, cited passage), language-id probabilities, a "
                    "pointwise LLM judge, and citation MAP/recall, BLEU and ROUGE-L. Raw scores "
                    "are stored (features/<study>.<setting>.<lang>.<scorer>.<hash>/); the "
                    "evaluate stage reduces them with the study's formulas. MIRAGE-Bench uses "
                    "them for its surrogate judge.",
        epilog="""settings (features.*):
  nli               {model, batch_size, max_length, device, parallel}
                    [MoritzLaurer/mDeBERTa-v3-base-xnli-multilingual-nli-2mil7]
  reranker          the same for the cross-encoder               [BAAI/bge-reranker-v2-m3]
  llm               an LLM entry (see `xling generate --help`): the pointwise judge
  sampling          for the LLM judge             {temperature: 0.1, max_tokens: 512}
  cache / shards    as in generate

example:
  xling features --config configs/mirage.yaml features.nli.parallel.num_gpus=1
""")
    _stage_args(p)
    p = sub.add_parser(
        "judge", help="a panel of LLM judges over a study's generations -> judgments rows",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Ask every judge of the panel about every generation of the study (one "
                    "cell per generate cell x judge). Judges are LLM entries like "
                    "generate.models: vLLM models and OpenAI-compatible endpoints, mixed freely. "
                    "Output: judgments rows (item_id, study, setting, lang, model, judge, "
                    "verdict, raw, tokens, cached, error). A failed or unparseable judge call is "
                    "an error row; the evaluate stage votes over the valid judges and stores "
                    "how many there were. A study that compares systems pairwise (MIRAGE-Bench's "
                    "arena) gets one cell per setting x language x judge instead, with one "
                    "prompt per pair of models (model = the answer shown first, model_b the "
                    "other); adding a model later asks only the new pairs.",
        epilog="""settings (judge.*):
  judges[]          LLM entries (see `xling generate --help`); XRAG uses 3
  sampling          {temperature: 0, max_tokens: 256, ...}
  language_check    lingua check of the answer's language (restricted to the study's
                    languages + English), ANDed with the vote in evaluate        [true]
  cache / shards    as in generate

example:
  xling judge --config configs/xrag.yaml judge.judges.0.model=gpt-4o judge.judges.0.backend=openai
""")
    _stage_args(p)
    p = sub.add_parser(
        "evaluate", help="IR metrics of runs; a study's metrics and paper tables",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Score every run of every topic set against its qrels (pytrec_eval, "
                    "trec_eval -c by default): per-query and mean rows, the "
                    "oracle 'glass ceiling' of each run's top-N, and for each comparison a "
                    "paired t-test, PRI = s* - s1 and Realized % = (s2 - s1) / PRI x 100 "
                    "(LLM-CLIR Eq. 1-2). With a `study:` section it also scores the study's "
                    "generations the paper's way (XRAG: panel majority AND language check, "
                    "accuracy per model x language x setting, response-language errors, kappa; "
                    "BordIRLines: KB/Con/Non/Cst CS, #countries, citation vs retrieval rate). "
                    "Writes metrics Parquet, per-item rows and a markdown table.",
        epilog="""settings (evaluate.*):
  metrics           trec_eval or ir-measures names (ndcg_cut_20 or nDCG@20, recall_100 or
                    R@100, map or AP, recip_rank or RR, RR@10, P@10, Judged@10)
                                     [map, ndcg_cut_10, ndcg_cut_20, recall_100, recip_rank]
  average           qrels: over every query of the qrels, none answered = 0 (trec_eval -c,
                    pyserini 2CR); run: over the queries a run answered           [qrels]
  expected          2CR-style expected scores: an OK/FAIL column in the table
                                     [<config>.expected.yaml beside the config, if any]
  oracle_depth      top-N the oracle reorders                                     [100]
  compare[]         {baseline: RUN, system: RUN}: t-test, PRI, Realized %
  runs[]            TREC run files made elsewhere: {name, path, topics, qlang, doc_lang}
  labels            study: human labels of the judged items, for Cohen's kappa
""")
    _stage_args(p)
    p = sub.add_parser("report", help="write and print a summary of the run root")
    _stage_args(p)
    p = sub.add_parser(
        "sweep", help="run a config's stages over a grid of overrides (one run root)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Expand a grid of dotted overrides into one config per grid point and run "
                    "the stages for all of them together: cells that grid points share run "
                    "once, cells done earlier are skipped, and grid points served by the same "
                    "model share its actor pool (loaded once). Ends with a table comparing the "
                    "grid points' evaluate metrics (also written to report/sweep-*.md).",
        epilog="""examples:
  # BM25's k1 and b: every combination (first key slowest)
  xling sweep -c configs/retrieve-ciral.yaml --grid 'retrieve.runs.0.k1=0.6,0.9,1.2' \
      --grid 'retrieve.runs.0.b=0.4,0.75'
  # LLM-CLIR Figure 2, the listwise reranker's document length (one model load):
  xling sweep -c CONFIG_WITH_RERANK --grid 'rerank.runs.0.doc_tokens=64,128,256'
  # or in the config:   sweep: {grid: {rerank.runs.0.doc_tokens: [64, 128, 256]}}
""")
    _stage_args(p)
    p.add_argument("--grid", action="append", default=[], metavar="KEY=v1,v2,...",
                   help="a swept key and its values (repeatable; adds to the config's "
                        "`sweep: grid:`)")
    p = sub.add_parser("validate", help="check a config; print it resolved, with cell hashes")
    p.add_argument("--config", "-c", required=True)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    p = sub.add_parser("status", help="which cells are done, partial or failed",
                       description="Read manifests and shard markers under RUN_ROOT (a path or "
                                   "s3://bucket/prefix) and print each cell's state.")
    p.add_argument("run_root")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser(
        "results", help="export the metrics rows (and TREC runs) of a run root",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Gather the metrics rows of every finished evaluate cell under RUN_ROOT "
                    "(IR cells: per system, metric and query, mean rows with query_id empty, "
                    "oracles and comparisons; study cells: the study's rows) into one table, "
                    "the cell id first. With --trec DIR, also copy every retrieve and rerank "
                    "cell's TREC run into DIR under pyserini's names "
                    "(run.<topics>.<run>.txt).",
        epilog="""examples:
  xling results runs/demo                          # CSV on stdout
  xling results s3://bucket/xling/ciral --format parquet -o ciral.parquet
  xling results runs/demo --format latex --means   # systems x metrics, booktabs
  xling results runs/demo --trec runs-out/ -o metrics.csv
""")
    p.add_argument("run_root")
    p.add_argument("--format", "-f", choices=["csv", "parquet", "latex"], default="csv")
    p.add_argument("-o", "--output", default=None, help="file to write (default: stdout)")
    p.add_argument("--means", action="store_true",
                   help="only the mean rows (query_id empty); latex always shows those")
    p.add_argument("--trec", default=None, metavar="DIR",
                   help="also write the TREC runs there, named run.<topics>.<run>.txt")
    p = sub.add_parser("models", help="model utilities")
    msub = p.add_subparsers(dest="models_command", metavar="WHAT", required=True)
    t = msub.add_parser("tiny", help="build the tiny offline test models (cached)",
                        description="Build tiny NLLB (CTranslate2), BGE-M3 and Llama-chat models "
                                    "with the real architectures, for tests and the demo.")
    t.add_argument("--dir", default=None, help="cache dir (default: $XLING_CACHE/models/tiny)")
    t.add_argument("--force", action="store_true", help="rebuild even if cached")
    t.add_argument("--list", action="store_true", help="also print each model's path")
    c = msub.add_parser(
        "convert", help="convert translate.model to CTranslate2 and cache it in the run store",
        description="Convert the config's translate.model (a hub id or a Transformers NLLB "
                    "directory) to CTranslate2 with translate.quantization, and upload it to "
                    "{run_root}/_models/ct2/, where translate actors on every node load it. "
                    "A conversion already in the store is reused (--force redoes it). The "
                    "translate stage does this by itself when needed; run it ahead to keep "
                    "the conversion out of a cluster job.")
    c.add_argument("--config", "-c", required=True)
    c.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    c.add_argument("--force", action="store_true", help="convert again even if cached")
    return parser


def init_ray(cfg: XlingConfig, address: str | None, level: int = logging.WARNING) -> None:
    """Start or join Ray. Quiet (level above INFO): workers' stdout/stderr stay in Ray's
    session logs (log_to_driver=False). The workers read XLING_LOG_LEVEL (see core/logs.py):
    a local Ray inherits it from this process; a cluster gets it through the job's
    runtime_env, or through ray.init's when the job does not set it."""
    import ray

    from xling.core.logs import ENV, level_name

    address = address or os.environ.get("RAY_ADDRESS") or cfg.ray.address
    if ray.is_initialized():
        return
    quiet = level > logging.INFO
    kw = dict(logging_level=logging.WARNING if quiet else level, log_to_driver=not quiet)
    if quiet:
        from xling.core.logs import quiet_ray_loggers

        quiet_ray_loggers()
    if address:
        if ENV not in os.environ:  # never conflicts with the job's runtime_env
            kw["runtime_env"] = {"env_vars": {ENV: level_name(level)}}
        ray.init(address=address, **kw)
    else:
        os.environ[ENV] = level_name(level)  # the local raylet and its workers inherit it
        from xling.dev.localcluster import patient_node_lookup

        patient_node_lookup()  # a loaded machine may need more than Ray's fixed 30 s
        for attempt in (1, 2):
            try:
                ray.init(num_cpus=cfg.ray.num_cpus, include_dashboard=False, **kw)
                break
            except Exception as e:  # noqa: BLE001 - only Ray's start-up timeout is retried
                if attempt == 2 or "timed out during startup" not in str(e):
                    raise
                # Seen on 2 overloaded cores: the GCS answers no lookup for minutes. A fresh
                # local node (new session, new ports) usually starts.
                logging.getLogger("xling").warning(
                    "the local Ray node did not start in time; starting a new one")
                ray.shutdown()
    import ray.data

    if quiet:
        quiet_ray_loggers()
    # One bar per stage from the runner is clearer than Ray Data's per-operator bars.
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(max(level, logging.WARNING) if level > logging.DEBUG
                                           else level)


def make_console(cfg: XlingConfig, args):
    """The run's Console (core/logs.py) at the -v / XLING_LOG_LEVEL level, with Python
    logging set up for it; its log file is attached by `attach_logs` once the store is
    checked (a refused config writes nothing)."""
    from xling.core.logs import Console, configure_python_logging, resolve_level

    level = resolve_level(getattr(args, "verbose", 0))
    console = Console(level, progress=not getattr(args, "no_progress", False))
    configure_python_logging(level, None)
    return console


def attach_logs(console, cfg: XlingConfig, run_id: str) -> None:
    from xling.core.logs import configure_python_logging, local_log_dir, native_stderr_to

    console.log_dir = local_log_dir(cfg.run_root, cfg.name)
    console.run_id = run_id
    console.path = os.path.join(console.log_dir, f"xling-{run_id}.log")
    if not console.verbose:  # before the handlers below bind sys.stderr
        os.makedirs(console.log_dir, exist_ok=True)
        native_stderr_to(os.path.join(console.log_dir, f"native-{run_id}.log"))
    configure_python_logging(console.level, console.path)


def sync_logs(console, store: RunStore, *, workers: bool = False, address=None) -> str:
    """End of a stage (and of the run): for an S3 run root, upload the local log files to
    {run_root}/_logs/; at the end, copy a local Ray's worker logs next to them. Returns
    the one-line note saying where the logs are."""
    from xling.core.logs import copy_worker_logs

    if not console.path:
        return ""
    local_ray = not (address or os.environ.get("RAY_ADDRESS"))
    worker_dir = os.path.join(console.log_dir, "ray-workers", console.run_id)
    copied = copy_worker_logs(worker_dir) if workers and local_ray else 0
    where = console.log_dir
    if store.is_s3:
        for root, _, files in os.walk(console.log_dir):
            for f in files:
                path = os.path.join(root, f)
                rel = os.path.relpath(path, console.log_dir).replace(os.sep, "/")
                if rel.startswith("ray-workers/") and console.run_id not in rel:
                    continue
                if f.startswith("xling-") and console.run_id not in f:
                    continue
                with open(path, "rb") as fh:
                    store.write_bytes(f"_logs/{rel}", fh.read())
        where = f"{store.url('_logs')} (local copy: {console.log_dir})"
    if not workers:
        return ""
    if copied:
        return (f"[xling] logs: {where}: xling-{console.run_id}.log, and the Ray workers' "
                f"(JVM, vLLM...) in ray-workers/{console.run_id}/")
    import sys as _sys

    if "ray" in _sys.modules and _sys.modules["ray"].is_initialized():
        return (f"[xling] logs: {where}: xling-{console.run_id}.log; the Ray workers' (JVM, "
                "vLLM...) are in Ray's session logs on each node (`ray logs`, the dashboard)")
    return f"[xling] log: {where}/xling-{console.run_id}.log"


def run_stages(cfg: XlingConfig | list[XlingConfig], stages: list[str], args) -> int:
    """Run stages of one config, or of a sweep's configs together (one run root)."""
    from xling.core.runner import Runner
    from xling.jobs.report import write_report

    cfgs = cfg if isinstance(cfg, list) else [cfg]
    store = RunStore(cfgs[0].run_root)
    registry = stage_registry()
    console = make_console(cfgs[0], args)
    runner = Runner(store, force=args.force, progress=console.progress, log=console.say,
                    detail=console.detail, limit=getattr(args, "limit", None))
    if args.dry_run:
        # Planning reads the cells' manifests from the store: reach an S3 one first, so that
        # a missing credential or endpoint is one line naming the fix, not a botocore trace.
        # (A local root is left alone: a dry run creates nothing.)
        if store.is_s3:
            store.check(write=False)
        for name in stages:
            if name == "report":
                print(f"[report] would write {store.url('report/index.html')} and "
                      f"{store.url('report/summary.md')}")
                continue
            seen = set()
            for c in (c for one in cfgs for c in runner.plan(registry[name](), one)):
                if c["cell"] in seen:
                    continue
                seen.add(c["cell"])
                print(f"[{name}] {c['cell']}: {c['state']} ({c['shards_done']}/{c['n_shards']} "
                      f"shards committed); would run {c['todo']}\n    out: {c['dir']}\n    in:  "
                      + "\n         ".join(c["inputs"]))
        return 0
    # Everything that can be checked without Ray is checked before Ray starts: inputs,
    # models, languages (cells), then the run store.
    for one in cfgs:
        for name in stages:
            if name != "report":
                registry[name]().cells(one)
    store.check()
    for one in cfgs:
        for i, name in enumerate(stages):
            if name != "report":
                registry[name]().prepare(one, store, upstream=tuple(stages[:i]))
    attach_logs(console, cfgs[0], runner.run_id)
    if any(s != "report" and not getattr(registry[s], "driver", False) for s in stages):
        init_ray(cfgs[0], args.address, console.level)
    try:
        for name in stages:
            if name == "report":
                print_report(console, store, write_report(store, cfgs, registry))
            elif getattr(registry[name], "driver", False):
                run_driver_stage(console, registry[name], cfgs, store, args.force)
            else:
                stage = registry[name]()
                runner.run(stage, cfgs if len(cfgs) > 1 else cfgs[0])
                for one in cfgs:
                    stage.after_run(one, runner)
            sync_logs(console, store)
    finally:
        note = sync_logs(console, store, workers=True, address=args.address)
        if note:
            console.say(note)
        console.close()
    return 0


def run_driver_stage(console, stage_cls, cfgs: list[XlingConfig], store: RunStore,
                     force: bool) -> None:
    """A stage that runs in the driver (evaluate): its per-cell lines are details; one line
    says what it did."""
    import inspect
    import time

    t0, cells = time.time(), {}
    for one in cfgs:
        for c in stage_cls().cells(one):
            cells.setdefault(c.id, c)
    done = sum(1 for c in cells.values()
               if not force and store.read_json_or_none(f"{c.dir}/_manifest.json"))

    def log(text: str) -> None:  # warnings stay on the console; cell lines and tables go
        first = text.split("\n", 1)[0].lower()
        (console.say if "warning" in first or "error:" in first else console.detail)(text)

    takes_log = "log" in inspect.signature(stage_cls.run_driver).parameters
    for one in cfgs:
        kw = {"log": log} if takes_log else {}
        stage_cls().run_driver(one, store, force=force, **kw)
    name = stage_cls.name
    if done == len(cells):
        console.say(f"[{name}] {len(cells)} cell(s), all already done (skipped)")
    else:
        console.say(f"[{name}] {len(cells) - done} cell(s) done" + (
            f", {done} already done (skipped)" if done else "")
            + f", {time.time() - t0:.0f}s -> {store.url(name)}")


def print_report(console, store: RunStore, text: str) -> None:
    """The report: all of it with -v; otherwise its summary line and results, once."""
    from xling.core.logs import report_digest

    if console.verbose:
        console.say(text)
    else:
        console.detail(text)
        where = store.url("report/summary.md")
        if store.exists("report/index.html"):
            where = f"{store.url('report/index.html')} ({where})"
        console.say(report_digest(text, where))


def smoke_root(cfg: XlingConfig, limit: int) -> None:
    """--limit N: the run moves to RUN_ROOT/_smoke/limit-N. Cells keep their ids, so the cut
    rows must never share a root with full results."""
    cfg.run_root = f"{cfg.run_root.rstrip('/')}/_smoke/limit-{limit}"


def run_sweep(base: XlingConfig, args) -> int:
    """`xling sweep`: the grid's configs through the stages, then the comparison table."""
    from xling.core.sweep import as_overrides, comparison_table, grid_points, parse_grid

    grid = {**(base.sweep.grid if base.sweep else {}), **parse_grid(args.grid)}
    points = grid_points(grid)
    cfgs = [load_config(args.config, [*args.overrides, *as_overrides(p)]) for p in points]
    if args.limit is not None:  # `base` was moved by main; the grid's configs follow it
        for c in cfgs:
            smoke_root(c, args.limit)
    if len({c.run_root for c in cfgs}) > 1:
        raise ConfigError("a sweep runs in one run root: do not sweep `run_root`")
    print(f"[sweep] {len(points)} grid points over {', '.join(grid)}")
    code = run_stages(cfgs, [s for s in base.stages if s != "report"], args)
    if code or args.dry_run:
        return code
    store = RunStore(base.run_root)
    table = comparison_table(points, [sweep_metrics(c, store) for c in cfgs])
    from xling.core.config import stable_hash

    path = f"report/sweep-{stable_hash(grid)}.md"
    store.write_bytes(path, (f"# Sweep over {', '.join(grid)}\n\n{table}\n").encode())
    print(f"{table}\n[sweep] -> {store.url(path)}")
    if "report" in base.stages:
        from xling.core.logs import Console, resolve_level
        from xling.jobs.report import write_report

        print_report(Console(resolve_level(args.verbose)), store,
                     write_report(store, cfgs, stage_registry()))
    return 0


def sweep_metrics(cfg: XlingConfig, store: RunStore) -> list[dict]:
    """The mean rows of a grid point's evaluate cells (none without an `evaluate:` section)."""
    if cfg.evaluate is None:
        return []
    import pyarrow.compute as pc

    from xling.core.runner import read_cell

    rows = []
    for cell in stage_registry()["evaluate"]().cells(cfg):
        try:
            t = read_cell(store, cell.dir)
        except FileNotFoundError:
            continue
        if "query_id" in t.column_names:
            t = t.filter(pc.is_null(t["query_id"]))
        rows += t.to_pylist()
    return rows


def results_command(args) -> int:
    """`xling results`: see xling/core/results.py."""
    from xling.core.results import export_trec_runs, metrics_table, write_results

    store = RunStore(args.run_root)
    store.check(write=False)
    if not store.list_dirs("evaluate") and not args.trec:
        raise ConfigError(f"{store.url()} has no evaluate cells: run `xling evaluate` first "
                          "(or check the path; see `xling status`)")
    table = metrics_table(store, means_only=args.means)
    try:
        data = write_results(table, args.format, args.output)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if data is not None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    elif args.output:
        print(f"{table.num_rows} metrics rows -> {args.output}", file=sys.stderr)
    if args.trec:
        files = export_trec_runs(store, args.trec)
        print(f"{len(files)} TREC runs -> {args.trec}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "status":
            from xling.core.runner import run_status
            from xling.jobs.report import status_table

            store = RunStore(args.run_root)
            if not store.is_s3 and not Path(store.key()).is_dir():
                raise StoreError(f"no run root at {store.url()}: check the path (a run creates "
                                 "it; `xling status` only reads)")
            store.check(write=False)
            rows = run_status(store)
            if not rows and store.is_s3 and not store.list(""):
                raise StoreError(f"nothing under {store.url()}: check the prefix (a run "
                                 "creates it; `xling status` only reads)")
            print(json.dumps(rows, indent=2) if args.json else status_table(rows))
            return 0
        if args.command == "results":
            return results_command(args)
        if args.command == "models" and args.models_command == "convert":
            from xling.core.models import prepare_ct2_model

            cfg = load_config(args.config, args.overrides)
            if cfg.translate is None:
                raise ConfigError(f"{args.config}: no `translate:` section, so no model to convert")
            store = RunStore(cfg.run_root)
            store.check()
            local, rel = prepare_ct2_model(cfg.translate.model, cfg.translate.quantization,
                                           store, force=args.force)
            print(f"{cfg.translate.model}: " + (f"already a CTranslate2 model at {local}" if local
                                                else f"CTranslate2 model at {store.url(rel)}"))
            return 0
        if args.command == "models":
            from xling.dev.tiny_models import build_tiny_models

            paths = build_tiny_models(Path(args.dir) if args.dir else None, force=args.force)
            if args.list:
                for k, v in paths.items():
                    print(f"{k:12s} {v}")
            return 0
        cfg = load_config(args.config, args.overrides)
        if getattr(args, "limit", None) is not None:
            if args.limit < 1:
                raise ConfigError("--limit N: N is a number of records, 1 or more")
            smoke_root(cfg, args.limit)
            print(f"xling: smoke run, the first {args.limit} records of every input, in "
                  f"{cfg.run_root}", file=sys.stderr)
        if args.command == "validate":
            from xling.core.runner import Runner

            import yaml

            # Plan first: a planning error (a missing file, say) is printed alone, not after
            # hundreds of lines of resolved config.
            runner = Runner(RunStore(cfg.run_root))
            planned = [(name, c) for name in cfg.stages if name != "report"
                       for c in runner.plan(stage_registry()[name](), cfg)]
            print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False,
                                 allow_unicode=True, width=100), end="")
            for name, c in planned:
                print(f"[{name}] cell {c['cell']} -> {c['dir']}")
            return 0
        if args.command == "sweep":
            return run_sweep(cfg, args)
        stages = cfg.stages if args.command == "run" else [args.command]
        return run_stages(cfg, stages, args)
    except (ConfigError, StoreError) as e:
        print(f"xling: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xling: interrupted; committed shards are kept, rerun to resume", file=sys.stderr)
        return 130
    except Exception as e:
        from xling.core.runner import StageFailed

        if isinstance(e, StageFailed):
            print(f"xling: {e}\n  (see `xling status` and the cells' _failed.json)", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
