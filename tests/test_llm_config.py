"""LLM settings that cannot work are refused before any work starts, with a message that
says what to fix: unknown models (vLLM and endpoint), missing keys, bad rerank settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_server import LLMServer
from xling.config import validate_config
from xling.core.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def run(tmp_path, section: dict, stage="generate"):
    (tmp_path / "p.jsonl").write_text(json.dumps({"item_id": "a", "prompt": "hi"}) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"name": "c", "run_root": str(tmp_path / "run"), stage: section}))
    return subprocess.run([sys.executable, "-m", "xling.cli", stage, "--config", str(cfg)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


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
                   "models": [{"backend": "openai", "model": "m"}]}}, "needs base_url"),
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
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("`", "`")):
        validate_config(cfg(**section))
