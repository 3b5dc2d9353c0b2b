"""The per-record paths issue 48 made cheaper give what the slower ones gave: the LLM cache
keys built with their shared part serialised once, the chat templates encoded in one batch
call, the partition writer's one hashing pass per id (shard, uniqueness, fingerprint); and
the engine CPU recorder (actors/enginecpu.py) counts overlapping calls once."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from xling.actors import enginecpu
from xling.actors.llm import Sampling, cache_key, cache_keys
from xling.core.commit import _id_hashes, fingerprint, rid_hashes, shard_of

PROMPTS = ["héllo \"wörld\"\n\ttab", [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": "Привет, 你好 مرحبا"}], ""]


def test_cache_keys_are_cache_key_byte_for_byte():
    for sampling in (Sampling(), Sampling(temperature=0.7, stop=("\n",), regex="[ab]+")):
        for settings in ({}, {"backend": "vllm", "chat": True, "max_model_len": 1024}):
            assert cache_keys("org/m-é", settings, sampling, PROMPTS) == [
                cache_key("org/m-é", settings, sampling, p) for p in PROMPTS]


def test_one_hashing_pass_gives_shard_uniqueness_and_fingerprint():
    ids = pa.chunked_array([["d0", "ü#3", "36897421#2"], [f"x{i}" for i in range(500)]])
    shards, hashes = _id_hashes(ids, 7)
    assert shards.tolist() == shard_of(ids, 7).tolist()
    assert hashes.tolist() == rid_hashes(ids).tolist()
    assert f"{len(ids)}:{int(np.bitwise_xor.reduce(hashes)):016x}" == fingerprint(ids.to_pylist())


def test_tokenize_many_is_tokenize_for_every_prompt(tiny_models):
    from transformers import AutoTokenizer

    from xling.core.engines.vllm import VLLMEngine

    tok = AutoTokenizer.from_pretrained(tiny_models["llama_chat"])
    for chat in (True, False):
        engine = SimpleNamespace(tokenizer=tok, chat=chat)
        prompts = [p for p in PROMPTS[:2] if chat or isinstance(p, str)]
        for prefix in (None, " Passage:"):
            assert VLLMEngine.tokenize_many(engine, prompts, prefix) == [
                VLLMEngine.tokenize(engine, p, prefix) for p in prompts]


def test_engine_cpu_counts_overlapping_calls_once(tmp_path, monkeypatch):
    monkeypatch.setenv(enginecpu.ENV, str(tmp_path))
    monkeypatch.setattr(enginecpu, "_total", 0.0)
    monkeypatch.setattr(enginecpu, "WRITE_EVERY", 0.0)

    def busy(seconds: float) -> None:
        with enginecpu.engine_cpu():
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass

    start = time.process_time()
    threads = [threading.Thread(target=busy, args=(0.1,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    used = time.process_time() - start
    [recorded] = enginecpu.read_totals(str(tmp_path)).values()
    # Three threads in the engine at once: the process's CPU while any was in, not 3x.
    assert 0.1 <= recorded <= used + 1e-3


def test_json_lines_ranges_hold_each_line_once(tmp_path, monkeypatch):
    """An uncompressed JSON-lines file read in byte ranges (core/sources.py, a task each)
    gives the rows of the whole-file read, in order; a bad line's error names its range."""
    import io
    import json

    from xling.core import sources

    lines = [json.dumps({"docid": f"d{i}", "title": "", "text": "wörd " * (i % 17 + 1)},
                        ensure_ascii=False) for i in range(300)]
    lines[150] = '{"docid": "bad", "text": "\xff"}'
    path = tmp_path / "c.jsonl"
    path.write_bytes("\n".join(lines).encode().replace("\xff".encode(), b"\xff") + b"\n")
    spec = {"name": "c", "format": "mrtydi", "encoding": "auto", "id_field": "docid",
            "title_field": "title", "text_field": "text"}

    def rows(items):
        return pa.concat_tables(sources._read_document_files(
            pa.Table.from_pylist(items), spec=spec, lang="en"))

    whole = rows([{"path": str(path), "range": None}])
    monkeypatch.setattr(sources, "RANGE_BYTES", 1000)
    items = sources._read_items([str(path)], ranges=True)
    assert len(items) > 5
    ranged = rows(items)
    assert ranged["doc_id"].to_pylist() == whole["doc_id"].to_pylist()
    assert ranged["text"].to_pylist() == whole["text"].to_pylist()
    [error] = [e for e in ranged["error"].to_pylist() if e]
    assert "after byte" in error
    # a range that starts inside the file's last line holds nothing
    assert sources._LineRange(io.BytesIO(b"ab\ncdef"), 5, 7).read() == b""
