"""The `xling` command line: it parses the arguments and hands them to xling/pipeline.py.

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

The config keys in `--help` (the overview of `xling --help`, each stage's `settings`) are
generated from the config models: a key's line is its pydantic `Field` description, its
choices and its default, written once where the key is declared.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
import types
import typing
from collections import Counter
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from xling import pipeline
from xling.config import XlingConfig, load_config
from xling.core.config import ConfigError
from xling.core.store import StoreError

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

# ---------------------------------------------------------------------------------------
# config keys in --help, from the models' Field descriptions

WIDTH, KEY_COLUMN = 92, 22


def _study_names() -> dict[str, tuple]:
    """Choices that the models do not spell as a Literal: the study registry's names."""
    from xling.studies.registry import NAMES

    return {"study.task": NAMES}


def _models(annotation) -> list[type[BaseModel]]:
    """The pydantic models inside a field's type (X, X | None, list[X], a union...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list = []
    for arg in typing.get_args(annotation):
        out += [m for m in _models(arg) if m not in out]
    return out


def _unwrapped(annotation) -> list:
    """X for X | None (and each member of a union)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _is_list(annotation) -> bool:
    return any(typing.get_origin(a) in (list, tuple) for a in _unwrapped(annotation))


def _choices(annotation) -> tuple:
    """A Literal's values, through `| None` and list[...]."""
    for a in _unwrapped(annotation):
        if typing.get_origin(a) is typing.Literal:
            return typing.get_args(a)
        if typing.get_origin(a) is list:
            found = _choices(typing.get_args(a)[0])
            if found:
                return found
    return ()


def _default(field):
    if field.default_factory is not None:
        try:
            return field.default_factory()
        except TypeError:  # a factory of the validated data: no default to show
            return None
    return None if field.default is PydanticUndefined else field.default


def _show(value) -> str:
    """A default as a user writes it in YAML; '' when there is nothing worth showing."""
    if value is None or isinstance(value, BaseModel) or (
            isinstance(value, (str, list, tuple, dict)) and not value):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) or "null" for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_show(v) or "null" for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v) or 'null'}" for k, v in value.items()) + "}"
    return str(value)


def _doc(model: type[BaseModel]) -> str:
    """The first sentence of a model's docstring, without its "`section`:" lead."""
    text = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
    text = re.sub(r"^`\w+:?`:?\s*", "", text)
    end = re.search(r"\.(\s|$)", text)
    text = text[:end.start()] if end else text
    return text.split("; ")[0] if len(text) > 80 else text  # a short line


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _entry(indent: int, key: str, text: str) -> list[str]:
    """`key  text`, the text wrapped in its column."""
    head = " " * indent + key
    if not text:
        return [head]
    first = head.ljust(KEY_COLUMN) if len(head) < KEY_COLUMN - 1 else head + "  "
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=" " * KEY_COLUMN,
                         break_long_words=False, break_on_hyphens=False)


def _common_models() -> set:
    """Models that three or more sections use (parallelism, sampling): shown on one line."""
    count: Counter = Counter()
    for field in XlingConfig.model_fields.values():
        seen = set()
        for section in _models(field.annotation):
            for f in section.model_fields.values():
                for m in _models(f.annotation):
                    seen.add(m)
                    for g in m.model_fields.values():
                        seen.update(_models(g.annotation))
        count.update(seen)
    return {m for m, n in count.items() if n >= 3}


def _is_llm(model: type[BaseModel]) -> bool:
    """An LLM entry: the models with a `backend` (one per backend, or one for all)."""
    return "backend" in model.model_fields


class _KeyHelp:
    """Renders config sections as `key  description (choices) [default]` lines. A section's
    own nested models get a line per key, indented; deeper or common models one line with
    their keys and defaults in braces; LLM entries one block after the sections."""

    def __init__(self) -> None:
        self.common = _common_models()
        self.choices = _study_names()
        self.llm_uses: list[str] = []
        self.llm_models: list[type[BaseModel]] = []

    def compact(self, model: type[BaseModel], value, defaults: bool = True) -> str:
        """`{key (a|b) [default], ...}`: the defaults of `value` when it is an instance."""
        parts = []
        for name, f in model.model_fields.items():
            v = getattr(value, name) if isinstance(value, model) else (
                _default(f) if defaults else None)
            choices = _choices(f.annotation)
            part = name + (f" ({'|'.join(map(str, choices))})" if 1 < len(choices) <= 4 else "")
            shown = _show(v)
            parts.append(part + (f" [{shown}]" if shown else ""))
        return "{" + ", ".join(parts) + "}"

    def fields(self, model: type[BaseModel], path: str, depth: int, value=None) -> list[str]:
        lines = []
        for name, f in model.model_fields.items():
            v = getattr(value, name) if isinstance(value, model) else _default(f)
            lines += self.field(name, f, f"{path}.{name}", depth, v)
        return lines

    def field(self, name: str, f, path: str, depth: int, value) -> list[str]:
        models, listed = _models(f.annotation), _is_list(f.annotation)
        label = name + ("[]" if listed and models else "")
        indent, desc = 2 + 2 * depth, f.description or ""
        if models and any(_is_llm(m) for m in models):
            self.llm_uses.append(path + ("[]" if listed else ""))
            self.llm_models += [m for m in models if _is_llm(m) and m not in self.llm_models]
            what = "LLM entries (below)" if listed else "an LLM entry (below)"
            return _entry(indent, label, f"{desc}; {what}" if desc else what)
        if models:
            desc = desc or _doc(models[0])
            if len(models) > 1 or depth >= 1 or models[0] in self.common:
                # an optional model left unset (None) means the stage's own default
                compact = " ".join(self.compact(m, value, defaults=listed or value is not None)
                                   for m in models)
                return _entry(indent, label, f"{desc}: {compact}" if desc else compact)
            return _entry(indent, label, desc) + self.fields(models[0], path, depth + 1, value)
        choices = self.choices.get(path) or _choices(f.annotation)
        if choices and not all(str(c) in desc for c in choices):
            desc = _join(desc, "(" + " | ".join(map(str, choices)) + ")")
        shown = _show(value)
        return _entry(indent, label, _join(desc, f"[{shown}]" if shown else ""))

    def section(self, name: str) -> list[str]:
        [model] = _models(XlingConfig.model_fields[name].annotation)
        return [f"settings ({name}.*, each overridable as KEY=VALUE):",
                *self.fields(model, name, 0)]

    def llm_block(self) -> list[str]:
        if not self.llm_models:
            return []
        lines = [f"LLM entries ({', '.join(self.llm_uses)}):"]
        variants = self.llm_models
        shared = [n for n in variants[0].model_fields if all(n in v.model_fields for v in variants)]
        if len(variants) > 1:  # one model per backend: the keys they share, then each one's
            backends = {v: _choices(v.model_fields["backend"].annotation)
                        or (_default(v.model_fields["backend"]),) for v in variants}
            shared.remove("backend")
            lines += _entry(2, "backend", " | ".join(str(b) for bs in backends.values()
                                                     for b in bs))
        for name in shared:
            f = variants[0].model_fields[name]
            lines += self.field(name, f, f"llm.{name}", 0, _default(f))
        if len(variants) > 1:
            for v in variants:
                lines.append(f"  with backend: {' | '.join(map(str, backends[v]))}")
                for name, f in v.model_fields.items():
                    if name not in shared and name != "backend":
                        lines += self.field(name, f, f"llm.{name}", 1, _default(f))
        return lines


def settings_help(*sections: str) -> str:
    """The `settings` part of a stage's --help: every key of these config sections."""
    keys = _KeyHelp()
    blocks = [keys.section(s) for s in sections]
    blocks.append(keys.llm_block())
    return "\n\n".join("\n".join(b) for b in blocks if b) + "\n"


def sections_help() -> str:
    """The config overview of `xling --help`: one line per top-level key."""
    keys = _KeyHelp()
    lines = ["config sections (`xling STAGE --help` lists a stage's keys):"]
    for name, f in XlingConfig.model_fields.items():
        models = _models(f.annotation)
        text = f.description or (_doc(models[0]) if models else "")
        if models and not text:
            text = keys.compact(models[0], None)
        for path, choices in keys.choices.items():
            if path.startswith(name + "."):
                text = f"{text}; {path.split('.', 1)[1]}: {' | '.join(choices)}"
        lines += _entry(2, name, text)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# the parser

# stage -> (one-line help, description, text after the settings)
STAGES: dict[str, tuple[str, str, str]] = {
    "ingest": (
        "read corpora into documents rows (sharded, resumable)",
        "Read each corpus x language into the documents schema, with sentence and token "
        "counts; malformed records become error rows.", ""),
    "translate": (
        "translate documents (DT) and topics (QT) with NLLB (CTranslate2)",
        "Translate each source x language into each target language, sentence by sentence, "
        "with one CTranslate2 actor pool for all directions. Output: translations rows (id, "
        "kind, src_lang, tgt_lang, title, text, segments, n_segments, token counts, model, "
        "compute_type, beam_size, error) under translate/<source>.<src>.<tgt>.<hash>/. Empty, "
        "wrong-language or unreadable records become error rows.",
        "example:\n"
        "  xling translate --config configs/demo.yaml translate.beam_size=2 "
        "translate.shards=32\n"),
    "index": (
        "build BM25 (Lucene) and dense (BGE-M3) indexes, sharded and merged",
        "Index each collection x language (original documents, and the translate stage's "
        "document translations listed in `translated:`) with each engine. BM25: every shard "
        "is indexed by its own task with Anserini's analyzer for the language, then the "
        "shards are merged into one Lucene index in the run store (scores equal a "
        "single-index build). Dense: BGE-M3 embeddings, stored as shards and searched exactly.",
        "A language without a Lucene analyzer is indexed with the standard analyzer (a "
        "warning,\nand analyzer_fallback: true in the manifest).\n"),
    "retrieve": (
        "first-stage runs (BM25, dense) in OG/QT/DT/BordIRLines modes, fusion",
        "Search each topic set x query language x document language with each run; queries "
        "are sharded over an actor pool of searchers. Output: hits rows (query_id, lang, "
        "doc_id, rank, score, doc_lang, system) and a TREC run file per cell. Fusions (RRF, "
        "interpolation) follow their runs.",
        """modes (runs[].mode):
  og                original queries, original documents
  qt                queries translated into the document language (translate stage)
  dt                original queries, documents translated into the query language
  qlang | en | qlang_en | rel_langs | swap   BordIRLines: per-query language partitions
                    (rel_langs: a rel_langs topic column)
"""),
    "rerank": (
        "LLM reranking of runs: listwise (RankGPT windows) or pairwise (PRP)",
        "Rerank the top `depth` hits of each query of a retrieve run (or a TREC run file) "
        "with an LLM. listwise: RankZephyr's prompt over windows of 20, step 10, from the "
        "bottom up; pairwise: PRP, both orders asked, bubble sort with k passes. All queries "
        "of an actor batch advance together, so every LLM call is a full batch. Output: hits "
        "rows with the LLM's order, per-query call / malformed-output counts, and a TREC run "
        "file per cell.",
        "example:\n  CIRAL_RUNS=/data/ciral-runs xling rerank --config "
        "configs/retrieve-ciral.yaml rerank.runs.0.doc_tokens=256\n"),
    "generate": (
        "prompt rows through vLLM / API models -> generations rows (cached)",
        "Run every prompt set through every model: the files under generate.prompts, and "
        "with a `study:` section one prompt set per study setting x language, built by the "
        "study ({studies}). Output: generations rows (item_id, study, setting, lang, model, "
        "prompt_hash, prompt, output, parsed, n_prompt_tokens, n_output_tokens, latency_s, "
        "finish_reason, too_long, truncated_from, cached, cache_key, error). Generations are "
        "cached by (model, engine settings, sampling params, prompt): reruns reuse them, other "
        "models or params do not. Empty, too long and failed prompts become error rows.",
        "example:\n"
        "  xling generate --config configs/demo.yaml "
        "generate.models.0.model=Qwen/Qwen2.5-7B-Instruct \\\n"
        "      generate.models.0.parallel.num_gpus=1\n"),
    "narrow": (
        "rank each long context's sentences against the query (CROSS): embed once, keep the "
        "top k",
        "For a study that narrows long contexts (cross): one cell per context language embeds "
        "every distinct sentence of its contexts once with BGE-M3 (cached in the run store "
        "under _cache/emb/, so reruns, new query languages and new k embed nothing new), then "
        "ranks each context's sentences against each query language exactly (score "
        "descending, ties by sentence index) and writes the top max(ks) with every needle's "
        "rank to narrow/<study>.<lang>.<hash>/_selections.parquet. The generate stage's CROSS "
        "prompts read it.",
        "example:\n"
        "  xling narrow --config configs/cross.yaml narrow.parallel.num_gpus=1\n"
        "  xling narrow --config configs/cross.yaml 'study.options.query_langs=[en,fa]' "
        "--dry-run\n"),
    "features": (
        "model-scored features of a study's generations (NLI, reranker, language id, LLM "
        "scores, lexical metrics)",
        "Score every model's generations of each (setting, language) with the scorers the "
        "study asks for (one cell per setting x language x scorer): an NLI classifier on "
        "(cited passage, reason sentence) pairs, a cross-encoder on (query, cited passage), "
        "language-id probabilities, a pointwise LLM judge, and citation MAP/recall, BLEU and "
        "ROUGE-L. Raw scores are stored (features/<study>.<setting>.<lang>.<scorer>.<hash>/); "
        "the evaluate stage reduces them with the study's formulas. MIRAGE-Bench uses them "
        "for its surrogate judge.",
        "example:\n"
        "  xling features --config configs/mirage.yaml features.nli.parallel.num_gpus=1\n"),
    "judge": (
        "a panel of LLM judges over a study's generations -> judgments rows",
        "Ask every judge of the panel about every generation of the study (one cell per "
        "generate cell x judge). Judges are LLM entries like generate.models: vLLM models and "
        "OpenAI-compatible endpoints, mixed freely. Output: judgments rows (item_id, study, "
        "setting, lang, model, judge, verdict, raw, tokens, cached, error). A failed or "
        "unparseable judge call is an error row; the evaluate stage votes over the valid "
        "judges and stores how many there were. A study that compares systems pairwise "
        "(MIRAGE-Bench's arena) gets one cell per setting x language x judge instead, with "
        "one prompt per pair of models (model = the answer shown first, model_b the other); "
        "adding a model later asks only the new pairs.",
        "example:\n"
        "  xling judge --config configs/xrag.yaml judge.judges.0.model=gpt-4o "
        "judge.judges.0.backend=openai\n"),
    "evaluate": (
        "IR metrics of runs; a study's metrics and paper tables",
        "Score every run of every topic set against its qrels (pytrec_eval, trec_eval -c by "
        "default): per-query and mean rows, the oracle 'glass ceiling' of each run's top-N, "
        "and for each comparison a paired t-test, PRI = s* - s1 and Realized % = (s2 - s1) / "
        "PRI x 100 (LLM-CLIR Eq. 1-2). With a `study:` section it also scores the study's "
        "generations the paper's way ({studies}). Writes metrics Parquet, per-item rows and "
        "a markdown table.", ""),
}
# the config sections listed under a stage's settings, when not just its own
SECTIONS = {"generate": ("generate", "study")}

SWEEP_EXAMPLES = """examples:
  # BM25's k1 and b: every combination (first key slowest)
  xling sweep -c configs/retrieve-ciral.yaml --grid 'retrieve.runs.0.k1=0.6,0.9,1.2' \\
      --grid 'retrieve.runs.0.b=0.4,0.75'
  # LLM-CLIR Figure 2, the listwise reranker's document length (one model load):
  xling sweep -c CONFIG_WITH_RERANK --grid 'rerank.runs.0.doc_tokens=64,128,256'
  # or in the config:   sweep: {grid: {rerank.runs.0.doc_tokens: [64, 128, 256]}}
"""


class _Parser(argparse.ArgumentParser):
    """An epilog may be a function: it is called only when the help is printed, so the
    config models are read for --help and not for every command."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


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
    p.add_argument("--takeover", action="store_true",
                   help="take the run root from the driver that holds it (core/lease.py)")
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


def _stage_epilog(name: str, after: str):
    def epilog() -> str:
        return settings_help(*SECTIONS.get(name, (name,))) + (f"\n{after}" if after else "")
    return epilog


def build_parser() -> argparse.ArgumentParser:
    from xling.studies.registry import NAMES

    parser = _Parser(
        prog="xling", description="Cross-lingual retrieval and RAG studies as resumable Ray jobs.",
        epilog=lambda: f"{sections_help()}\n{EXAMPLES}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"xling {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("run", help="run all stages listed in the config's `stages:`",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run the config's stages in order. Finished cells are "
                                   "skipped, so rerunning a killed job resumes it.",
                       epilog=sections_help)
    _stage_args(p)
    for name, (short, description, after) in STAGES.items():
        p = sub.add_parser(name, help=short, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description=textwrap.fill(description.format(
                               studies=", ".join(NAMES)), WIDTH),
                           epilog=_stage_epilog(name, after))
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
        epilog=_stage_epilog("sweep", SWEEP_EXAMPLES))
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
    p = sub.add_parser(
        "doctor", help="check every engine on this machine: versions, devices, libraries, "
                       "a one-record smoke each",
        description="For torch, vLLM, CTranslate2, FAISS, FlagEmbedding, the JVM with Lucene "
                    "and Thai segmentation: version, devices, the native libraries it loads, "
                    "and one record through it on DEVICE with the tiny models (`xling models "
                    "tiny`). Each failure is printed with its fix; exit status 1 if any.")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="cuda: every GPU engine must use a GPU; auto: cuda where torch sees one")
    p.add_argument("--only", default=None, metavar="ENGINES",
                   help="comma-separated: torch,vllm,ctranslate2,faiss,flagembedding,jvm,thai")
    p.add_argument("--timeout", type=float, default=600, help="seconds per engine")
    p.add_argument("-v", "--verbose", action="store_true", help="list every loaded library")
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


# ---------------------------------------------------------------------------------------
# dispatch


def dispatch(args) -> int:
    """The parsed command -> xling/pipeline.py (or dev/ for `xling models tiny`)."""
    if args.command == "status":
        return pipeline.show_status(args.run_root, args.json)
    if args.command == "results":
        return pipeline.export_results(args.run_root, args.format, args.output,
                                       means=args.means, trec=args.trec)
    if args.command == "doctor":
        from xling.doctor import check_engines, doctor

        return doctor(args.device, check_engines(args.only) if args.only else None,
                      verbose=args.verbose, timeout=args.timeout)
    if args.command == "models" and args.models_command == "convert":
        return pipeline.convert_model(load_config(args.config, args.overrides), args.config,
                                      force=args.force)
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
        pipeline.smoke_root(cfg, args.limit)
        print(f"xling: smoke run, the first {args.limit} records of every input, in "
              f"{cfg.run_root}", file=sys.stderr)
    if args.command == "validate":
        return pipeline.validate(cfg)
    if args.command == "sweep":
        return pipeline.run_sweep(cfg, args)
    return pipeline.run_stages(cfg, cfg.stages if args.command == "run" else [args.command],
                               args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return dispatch(args)
    except (ConfigError, StoreError) as e:
        print(f"xling: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xling: interrupted; committed shards are kept, rerun to resume", file=sys.stderr)
        return 130
    except Exception as e:
        from xling.core.cells import StageFailed

        if isinstance(e, StageFailed):
            print(f"xling: {e}\n  (see `xling status` and the cells' _failed.json)", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
