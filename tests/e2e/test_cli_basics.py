"""What a new user meets first: --version, validate's output, --limit, and no stray
process-wide settings (each run as a subprocess, as a user would)."""

import os
import subprocess
import sys
import textwrap

import yaml

XLING = [sys.executable, "-m", "xling.cli"]


def _xling(*args, env=None):
    return subprocess.run([*XLING, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _config(tmp_path, corpus_path="data/demo/mrtydi/{lang}.jsonl.gz"):
    p = tmp_path / "cfg.yaml"
    p.write_text(textwrap.dedent(f"""
        name: basics
        run_root: {tmp_path / 'run'}
        ingest:
          tokenizer: tiny:nllb_hf
          shards: 2
          corpora:
            - {{name: mrtydi, format: mrtydi, path: "{corpus_path}", langs: [fi, sw]}}
        """))
    return p


def test_version():
    p = _xling("--version")
    assert p.returncode == 0 and p.stdout.startswith("xling ")
    assert p.stdout.split()[1][0].isdigit()


def test_validate_prints_yaml_and_an_error_alone(tmp_path):
    p = _xling("validate", "-c", str(_config(tmp_path)))
    assert p.returncode == 0, p.stderr
    config, cells = p.stdout.split("\n[ingest]", 1)
    assert yaml.safe_load(config)["ingest"]["corpora"][0]["langs"] == ["fi", "sw"]
    assert cells.count("cell ") == 2
    # A planning error (no file for sw) is printed alone: no config dump before it.
    p = _xling("validate", "-c", str(_config(tmp_path, "data/demo/mrtydi/{lang}.nope")))
    assert p.returncode == 2 and p.stdout == ""
    assert "no files match" in p.stderr and len(p.stderr.splitlines()) <= 3


def test_limit_runs_in_a_smoke_root(tmp_path):
    p = _xling("ingest", "-c", str(_config(tmp_path)), "--limit", "5", "--dry-run")
    assert p.returncode == 0, p.stderr
    smoke = f"{tmp_path / 'run'}/_smoke/limit-5"
    assert f"smoke run, the first 5 records of every input, in {smoke}" in p.stderr
    outs = [l.split("out: ")[1] for l in p.stdout.splitlines() if "out: " in l]
    assert len(outs) == 2 and all(o.startswith(f"{smoke}/ingest/") for o in outs)
    p = _xling("ingest", "-c", str(_config(tmp_path)), "--limit", "0", "--dry-run")
    assert p.returncode == 2 and "--limit N" in p.stderr
    # a sweep's grid points follow it into the smoke root
    p = _xling("sweep", "-c", str(_config(tmp_path)), "--grid", "ingest.tokenizer=a/b,c/d",
               "--limit", "5", "--dry-run")
    assert p.returncode == 0, p.stderr
    outs = [l.split("out: ")[1] for l in p.stdout.splitlines() if "out: " in l]
    assert len(outs) == 4 and all(o.startswith(f"{smoke}/ingest/") for o in outs)


def test_starting_lucene_leaves_openai_key_unset():
    code = ("import os; from xling.actors.lucene import start_jvm; start_jvm(); "
            "from pyserini.analysis import get_lucene_analyzer; "
            "print(os.environ.get('OPENAI_API_KEY'))")
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "None"


def test_a_local_ray_that_times_out_starting_is_started_again(monkeypatch, tmp_path):
    """Control flow only (Ray's own start-up is what the stage tests run): one retry, for
    Ray's start-up timeout and nothing else."""
    import logging

    import pytest
    import ray

    from xling.core.runtime import init_ray
    from xling.config import load_config

    cfg = load_config(_config(tmp_path))
    calls = []

    def init(**kw):
        calls.append(kw)
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen ...")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("XLING_LOG_LEVEL", "WARNING")  # init_ray sets it; restored afterwards
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    init_ray(cfg, None, logging.WARNING)
    assert len(calls) == 3 and calls[1] == "shutdown" and calls[2]["num_cpus"] == cfg.ray.num_cpus
    # idle workers are kept for reuse (test_runner.py checks it on a real node)
    assert calls[2]["_system_config"]["idle_worker_killing_time_threshold_ms"] == 60_000

    calls.clear()
    monkeypatch.setattr(ray, "init", lambda **kw: (_ for _ in ()).throw(RuntimeError("bad")))
    with pytest.raises(RuntimeError, match="bad"):  # other errors are not retried
        init_ray(cfg, None, logging.WARNING)
    assert calls == []


def test_help_lists_every_config_key_with_its_field_description(capsys):
    """`--help` is generated from the config models: every section in the overview, every
    key of a stage's section with its Field description, the studies from the registry."""
    import pytest

    from xling.cli import STAGES, _models, build_parser
    from xling.config import XlingConfig
    from xling.studies.registry import NAMES

    def help_of(*argv):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*argv, "--help"])
        return capsys.readouterr().out

    top = help_of()
    assert all(f"\n  {name}" in top for name in XlingConfig.model_fields)
    assert " | ".join(NAMES) in " ".join(top.split())
    assert " | ".join(NAMES) in " ".join(help_of("generate").split())  # study.task
    for stage in STAGES:
        text = " ".join(help_of(stage).split())
        assert f"settings ({stage}.*" in text
        [section] = _models(XlingConfig.model_fields[stage].annotation)
        for key, field in section.model_fields.items():
            assert f" {key}" in text, (stage, key)
            if field.description:
                assert " ".join(field.description.split()) in text, (stage, key)


def test_dry_run_names_the_engines_a_run_starts_once(tmp_path, tiny_models):
    p = _xling("run", "-c", "configs/demo.yaml", "--dry-run", f"run_root={tmp_path / 'run'}")
    assert p.returncode == 0, p.stderr
    shared = [l for l in p.stdout.splitlines() if l.startswith("[xling] would start")]
    assert sorted(shared) == [
        "[xling] would start embedder (tiny:bge_m3) once for index, retrieve",
        "[xling] would start tiny-chat (tiny:llama_chat) once for generate, judge"]
