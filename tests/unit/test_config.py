"""Config loading: typed validation, dotted overrides, stable hashes, actionable errors."""

import textwrap
from pathlib import Path

import pytest

from xling.config import load_config
from xling.core.config import ConfigError, hashable, parse_override, stable_hash

BASE = """
name: t
ingest:
  tokenizer: some/tokenizer
  shards: 4
  corpora:
    - name: c
      path: data/demo/mrtydi/{lang}.jsonl.gz
      langs: [fi, sw]
"""


def write(tmp_path, text=BASE):
    p = tmp_path / "cfg.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_defaults_and_overrides(tmp_path):
    cfg = load_config(write(tmp_path), ["ingest.shards=16", "ingest.corpora.0.langs=[ar,zhs]",
                                        "ingest.parallel.concurrency=[2,4]"])
    assert cfg.run_root == "./runs/t"
    assert cfg.ingest.shards == 16
    assert cfg.ingest.corpora[0].langs == ["ar", "zhs"]
    assert cfg.ingest.parallel.concurrency == (2, 4)


def test_a_partial_parallel_keeps_its_sections_defaults(tmp_path):
    """Setting one key of a stage's `parallel` leaves the stage's other pool defaults (index:
    4,096 documents a call at half a CPU; narrow: 1,024 sentences), not Parallelism's."""
    text = BASE + textwrap.dedent("""
        index:
          collections: [{name: c, path: x.jsonl, langs: [fi]}]
          engines: [bm25, dense]
          parallel: {concurrency: [4, 4]}
          dense: {parallel: {num_cpus: 2}}
        """)
    cfg = load_config(write(tmp_path, text))
    assert cfg.index.parallel.model_dump() == {"concurrency": (4, 4), "batch_size": 4096,
                                               "num_cpus": 0.5, "num_gpus": 0.0}
    assert cfg.index.dense.parallel.model_dump() == {"concurrency": (1, 2), "batch_size": None,
                                                     "num_cpus": 2.0, "num_gpus": 0.0}
    assert cfg.index.dense.call_size() == 1024  # by what the index stores, below
    colbert = load_config(write(tmp_path, text), ["index.dense.colbert=true"])
    assert colbert.index.dense.call_size() == 256
    given = load_config(write(tmp_path, text), ["index.dense.colbert=true",
                                                "index.dense.parallel.batch_size=64"])
    assert given.index.dense.call_size() == 64
    cfg = load_config(write(tmp_path, text), ["index.parallel.batch_size=8"])
    assert (cfg.index.parallel.concurrency, cfg.index.parallel.batch_size,
            cfg.index.parallel.num_cpus) == ((4, 4), 8, 0.5)
    # a bad value is still an error, named by its key
    with pytest.raises(ConfigError, match="concurrency"):
        load_config(write(tmp_path, text), ["index.parallel.concurrency=[3,1]"])


def test_search_calls_are_sized_by_engine_unless_given(tmp_path):
    """`retrieve.parallel.batch_size` left out: BM25 searches 64 queries a call, dense as
    many as keep a call's hits near 2^19 (never under one forward batch); given, it wins."""
    from xling.jobs.retrieve import query_batch

    text = BASE + textwrap.dedent("""
        index:
          collections: [{name: c, path: x.jsonl, langs: [fi]}]
          engines: [bm25, dense]
          dense: {encode_batch_size: 64}
        retrieve:
          topics: [{name: q, path: q.tsv, langs: [fi], doc_langs: [fi]}]
          runs: [{name: b, engine: bm25, collection: c}, {name: d, engine: dense, collection: c}]
          parallel: {concurrency: [2, 2]}
        """)
    sizes = {}
    for depth in (100, 1000, 10_000):
        cfg = load_config(write(tmp_path, text), [f"retrieve.depth={depth}"])
        sizes[depth] = (query_batch(cfg, "bm25"), query_batch(cfg, "dense"))
        assert cfg.retrieve.parallel.concurrency == (2, 2)
    assert sizes == {100: (64, 2048), 1000: (64, (1 << 19) // 1000), 10_000: (64, 64)}
    cfg = load_config(write(tmp_path, text), ["retrieve.parallel.batch_size=16"])
    assert (query_batch(cfg, "bm25"), query_batch(cfg, "dense")) == (16, 16)


def test_unknown_key_names_file_key_and_fix(tmp_path):
    p = write(tmp_path, BASE + "  batchsize: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert str(p) in msg and "ingest.batchsize" in msg
    assert "did you mean 'parallel.batch_size'" in msg


def test_unknown_language_is_rejected_with_suggestion(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path), ["ingest.corpora.0.langs=[fi,swa,klingon]"])
    msg = str(e.value)
    assert "ingest.corpora[0].langs" in msg and "klingon" in msg
    assert "override" in msg


def test_override_errors():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("ingest.shards")
    assert parse_override("ray.address=null") == (["ray", "address"], None)
    assert parse_override("generate.model=Qwen/Qwen2.5-7B-Instruct") == (
        ["generate", "model"], "Qwen/Qwen2.5-7B-Instruct")


def test_bad_values_and_missing_sections(tmp_path):
    with pytest.raises(ConfigError, match="concurrency"):
        load_config(write(tmp_path), ["ingest.parallel.concurrency=[3,1]"])
    with pytest.raises(ConfigError, match="no `ingest:` section"):
        load_config(write(tmp_path, "name: t\nstages: [ingest]\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "name: [unclosed\n"))


def test_hash_ignores_operational_fields_and_key_order(tmp_path):
    a = load_config(write(tmp_path))
    b = load_config(write(tmp_path), ["ingest.shards=64", "ingest.parallel.batch_size=7",
                                      "ray.num_cpus=1", "run_root=/elsewhere"])
    c = load_config(write(tmp_path), ["ingest.tokenizer=other/tok"])
    assert stable_hash(hashable(a)) == stable_hash(hashable(b))
    assert stable_hash(hashable(a)) != stable_hash(hashable(c))
    assert stable_hash({"x": 1, "y": [1, 2]}) == stable_hash({"y": [1, 2], "x": 1})
    # Pinned: a hash must not drift between versions of Python or of this code.
    assert stable_hash({"stage": "ingest", "key": {"lang": "fi"}}) == "962928ac"  # sha256 of {"key":{"lang":"fi"},"stage":"ingest"}


def test_adding_a_language_keeps_existing_cell_ids(tmp_path, monkeypatch):
    from xling.jobs.ingest import IngestStage

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the config's paths are relative
    a = {c.id for c in IngestStage().cells(load_config(write(tmp_path)))}
    b = {c.id for c in IngestStage().cells(load_config(write(tmp_path), ["ingest.corpora.0.langs=[fi,sw,ar]"]))}
    assert a < b and len(b - a) == 1


def test_a_field_hashed_only_when_set_keeps_earlier_hashes():
    from xling.actors.llm import Sampling, cache_key
    from xling.core.llm import SamplingSpec, sampling_of

    plain = SamplingSpec(max_tokens=12)
    assert "regex" not in hashable(plain)  # cell ids of configs without it are unchanged
    assert hashable(SamplingSpec(max_tokens=12, regex="a+"))["regex"] == "a+"
    assert "regex" not in Sampling(max_tokens=12).as_dict()  # and so are cache keys
    assert cache_key("m", {}, Sampling(max_tokens=12), "p") != cache_key(
        "m", {}, Sampling(max_tokens=12, regex="a+"), "p")
    from xling.core.llm import parse_llm_spec

    assert sampling_of(parse_llm_spec({"model": "x"}), SamplingSpec(regex="<a>")).regex == "<a>"
    with pytest.raises(ValueError, match="not a regular expression"):
        SamplingSpec(regex="(")


def test_request_seeds_are_reproducible_and_independent_per_prompt():
    from xling.actors.llm import request_seed

    chat = [{"role": "user", "content": "q1"}]
    assert request_seed(0, "q1") == request_seed(0, "q1")  # a rerun draws the same sample
    assert len({request_seed(0, f"q{i}") for i in range(100)}) == 100  # prompts: independent
    assert request_seed(1, "q1") != request_seed(0, "q1")
    assert request_seed(0, chat) == request_seed(0, list(chat)) != request_seed(0, "q1")
    assert request_seed(None, "q1") is None
    assert all(0 <= request_seed(s, "x") < 2**31 for s in range(50))
