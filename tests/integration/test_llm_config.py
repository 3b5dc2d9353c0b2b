"""LLM settings that cannot work are refused before any work starts, with a message that
says what to fix: unknown models (vLLM and endpoint), missing keys, bad rerank settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import here
from llm_server import LLMServer
from xling.config import validate_config
from xling.core.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path, section: dict, stage="generate"):
    (tmp_path / "p.jsonl").write_text(json.dumps({"item_id": "a", "prompt": "hi"}) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"name": "c", "run_root": str(tmp_path / "run"), stage: section}))
    return here(stage, "--config", str(cfg), env={"HF_HUB_OFFLINE": "1"})


def gen(tmp_path, model: dict) -> dict:
    return {"prompts": [{"name": "p", "path": str(tmp_path / "p.jsonl")}], "models": [model]}


def test_unknown_models_stop_the_job_before_it_starts(tmp_path):
    p = run(tmp_path, gen(tmp_path, {"model": "no-such-org/no-such-model"}))
    assert p.returncode == 2 and "generate.models[0].model: 'no-such-org/no-such-model'" in p.stderr
    p = run(tmp_path, gen(tmp_path, {"model": "tiny:gpt9"}))
    assert p.returncode == 2 and "unknown tiny model 'gpt9'" in p.stderr
    (tmp_path / "empty-model").mkdir()
    p = run(tmp_path, gen(tmp_path, {"model": str(tmp_path / "empty-model")}))
    assert p.returncode == 2 and "has no config.json" in p.stderr
    with LLMServer(models=("echo",)) as server:
        p = run(tmp_path, gen(tmp_path, {"backend": "openai", "model": "gpt-9", "api_key_env": None,
                                         "base_url": server.url}))
    assert p.returncode == 2 and "'gpt-9' is not served at" in p.stderr and "echo" in p.stderr
    p = run(tmp_path, gen(tmp_path, {"backend": "openai", "model": "m", "base_url": "http://x/v1",
                                     "api_key_env": "XLING_NO_SUCH_KEY"}))
    assert p.returncode == 2 and "XLING_NO_SUCH_KEY" in p.stderr
    assert not (tmp_path / "run" / "generate").exists()  # nothing started


def cfg(**section):
    return {"name": "c", **section}


@pytest.mark.parametrize("section, message", [
    ({"generate": {"prompts": [{"name": "p", "path": "x"}],
                   "models": [{"backend": "openai", "model": "m"}]}},
     r"generate.models\[0\].base_url: required key is missing. Fix: add `base_url:`"),
    ({"generate": {"prompts": [{"name": "p", "path": "x"}],
                   "models": [{"model": "m", "base_url": "http://x/v1"}]}},
     r"generate.models\[0\].base_url: base_url is for backend openai; set backend: openai or "
     "remove base_url"),
    ({"generate": {"prompts": [{"name": "p", "path": "x"}],
                   "models": [{"backend": "openai", "model": "m", "base_url": "http://x/v1",
                               "max_model_len": 4096}]}},
     "max_model_len is for backend vllm; set backend: vllm or remove max_model_len"),
    ({"generate": {"prompts": [{"name": "p", "path": "x"}],
                   "models": [{"backend": "openai", "model": "m", "base_url": "http://x/v1",
                               "concurency": 4}]}},
     r"models\[0\].concurency: unknown key for backend openai. Fix: did you mean 'concurrency'"),
    ({"generate": {"prompts": [{"name": "p", "path": "x"}],
                   "models": [{"backend": "vertex", "model": "m"}]}},
     r"models\[0\].backend: unknown LLM backend; use one of: vllm, openai, ctranslate2 "
     r"\(got 'vertex'\)"),
    ({"generate": {"prompts": [{"name": "p", "path": "x", "parser": "yaml"}],
                   "models": [{"model": "m"}]}}, "unknown parser 'yaml'"),
    ({"generate": {"prompts": [{"name": "p", "path": "x"}],
                   "models": [{"model": "m"}, {"model": "m"}]}}, "names must be unique"),
    ({"generate": {"prompts": [{"name": "p", "path": "x"}],
                   "models": [{"model": "m", "too_long": "shorten"}]}}, "too_long"),
    ({"rerank": {"model": {"model": "m"}, "runs": [{"name": "r", "trec": "x.trec"}]}},
     "needs `topics:` and `corpus:`"),
    ({"rerank": {"model": {"model": "m"}, "runs": [{"name": "r"}]}}, "exactly one of `input`"),
    ({"rerank": {"model": {"model": "m"}, "runs": [{"name": "r", "input": "bm25"}]}},
     "input 'bm25' is not a retrieve run"),
    ({"rerank": {"model": {"model": "m"}, "runs": [
        {"name": "r", "trec": "x", "topics": {"name": "t", "path": "t", "langs": ["en"]},
         "corpus": {"name": "c", "path": "c", "langs": ["en"]}, "window": 10, "step": 20}]}},
     "would skip passages"),
])
def test_bad_llm_settings_are_config_errors(section, message):
    pattern = message if "\\" in message else message.replace("(", r"\(")
    with pytest.raises(ConfigError, match=pattern):
        validate_config(cfg(**section))


# ------------------------------------------------------------------------------------------
# LLM entries: one model per backend (core/engines/), hashed as the one flat model was


def test_every_registered_backend_is_complete():
    """Each backend module: its Spec names the backend it is registered as, builds an
    LLMEngine from engine_args() alone, and its hash-only keys (FIXED) hold their values and
    are accepted back with them (a dumped config validates)."""
    import inspect

    from xling.actors.llm import LLMEngine
    from xling.core.engines import BACKENDS, DEFAULT, spec_classes
    from xling.core.llm import engine_spec, parse_llm_spec

    assert DEFAULT == "vllm" and list(spec_classes()) == list(BACKENDS)
    for name, spec in spec_classes().items():
        assert spec.backend_name() == name
        assert issubclass(spec.ENGINE, LLMEngine)
        required = {k: "http://x/v1" if k == "base_url" else "m"
                    for k, f in spec.model_fields.items() if f.is_required()}
        entry = parse_llm_spec({**required, "backend": name})
        assert type(entry) is spec
        args = engine_spec(entry)
        assert args.pop("backend") == name
        args.pop("hang_timeout_s", None)  # make_engine's own: the watchdog (core/watchdog.py)
        inspect.signature(spec.ENGINE.__init__).bind(None, **args)  # every arg is accepted
        assert set(spec.FIXED) == set(spec.model_computed_fields)
        for key, value in spec.FIXED.items():  # hashed and dumped, never set
            assert key not in spec.own_keys() and getattr(entry, key) == value
            assert entry.model_dump()[key] == value
            assert type(parse_llm_spec({**required, "backend": name, key: value})) is spec
        assert set(spec.PER_CALL) <= set(spec.own_keys())
        assert set(entry.call_options()) <= set(spec.PER_CALL)


def test_entries_hash_as_the_flat_model_did():
    """Cell hashes hold every hashed key of the model both backends once shared; those of the
    other backend are there at their defaults, so no finished cell moved."""
    from xling.core.llm import engine_group, engine_params, parse_llm_spec

    vllm = engine_params(parse_llm_spec({"model": "tiny:llama_chat", "max_model_len": 512,
                                         "tensor_parallel_size": 2}))
    assert vllm == {"backend": "vllm", "model": "tiny:llama_chat", "chat": True,
                    "too_long": "refuse", "max_model_len": 512, "dtype": "auto",
                    "engine_kwargs": {}, "base_url": None}
    openai = engine_params(parse_llm_spec({"backend": "openai", "model": "gpt", "concurrency": 3,
                                           "base_url": "http://h/v1", "too_long": "refuse"}))
    assert openai == {"backend": "openai", "model": "gpt", "chat": True, "too_long": "refuse",
                      "max_model_len": None, "dtype": "auto", "engine_kwargs": {},
                      "base_url": "http://h/v1"}
    # too_long is sent per call: entries that differ only in it share one engine
    truncating = engine_params(parse_llm_spec({"model": "tiny:llama_chat", "max_model_len": 512,
                                               "too_long": "truncate"}))
    assert engine_group(truncating) == engine_group(vllm) != engine_group(openai)
