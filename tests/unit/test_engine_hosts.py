"""Which stages of a run share an LLM engine (core/hosts.plan_hosts): every stage of the run
that asks for the same engine, whatever their per-call settings and sampling, also across
stages that do not use it; never an endpoint. When room is needed, the engine whose next
use is farthest away is stopped first. The shared path itself runs for real in
tests/e2e/test_studies.py (XRAG: generate and judge on one tiny vLLM engine) and
tests/integration/test_engine_lifetimes.py (hosts killed, restarted, evicted)."""

from __future__ import annotations

from xling.core.hosts import host_key, plan_hosts
from xling.core.llm import parse_llm_spec


def spec(name: str, model: str = "org/chat", **kw):
    return parse_llm_spec({"name": name, "model": model, "max_model_len": 1024, **kw})


def test_neighbouring_stages_share_an_engine_across_per_call_settings():
    gen = spec("tiny", too_long="truncate", sampling={"temperature": 0.0, "max_tokens": 8})
    judge_a = spec("judge-a", too_long="refuse")
    judge_b = spec("judge-b", sampling={"temperature": 1.0, "max_tokens": 32, "seed": 2})
    other = spec("big", model="org/other")
    assert host_key(gen) == host_key(judge_a) == host_key(judge_b) != host_key(other)
    hosts = plan_hosts([("generate", [gen, other]), ("judge", [judge_a, judge_b])])
    span = ("generate", "judge")
    assert hosts.spans == {(host_key(gen), "generate"): span, (host_key(gen), "judge"): span}
    # The hosts are sized from every entry of the span (the judges' as well).
    assert hosts.specs[host_key(gen)] == [gen, judge_a, judge_b]
    hosts.stage_start("judge")
    assert hosts.shares(judge_b) and not hosts.shares(other)
    hosts.stage_start("generate")
    assert not hosts.shares(other)  # asked for by generate alone: stays in its pool


def test_an_engine_setting_that_changes_the_engine_is_not_shared():
    a, b = spec("a"), spec("b", max_model_len=2048)
    assert plan_hosts([("generate", [a]), ("judge", [b])]).spans == {}


def test_an_engine_lives_from_its_first_use_to_its_last_across_other_stages():
    a = spec("a")
    hosts = plan_hosts([("generate", [a]), ("features", []), ("judge", [spec("j")])])
    assert set(hosts.spans.values()) == {("generate", "judge")}
    hosts.stage_start("features")
    assert not hosts.shares(a)  # kept through features, not used by it
    assert hosts.next_use(host_key(a)) == 2
    # An engine that one stage alone asks for stays in that stage's pool.
    hosts = plan_hosts([("generate", [a]), ("features", [spec("f", model="org/nli")])])
    assert hosts.spans == {}


def test_release_stops_the_engine_whose_next_use_is_farthest_first():
    llm, other = spec("a"), spec("b", model="org/other")
    hosts = plan_hosts([("generate", [llm, other]), ("rerank", [other]), ("features", []),
                        ("judge", [llm])])
    ka, kb = host_key(llm), host_key(other)
    killed = []
    hosts._kill = lambda key: (killed.append(key), hosts.live.pop(key), hosts.holds.pop(key))
    hosts.live = {ka: ["host-a"], kb: ["host-b"]}
    hosts.holds = {ka: {"CPU": 1.0}, kb: {"CPU": 1.0}}
    hosts._free = lambda: {"CPU": 1.0, "GPU": 0.0}  # a whole CPU left: nothing to stop
    hosts.stage_start("features")  # a next used by judge (3); b never again
    assert hosts.next_use(kb) == 4 and hosts.next_use(ka) == 3
    assert hosts.release(until=lambda: len(hosts.live) < 2)
    assert killed == [kb] and list(hosts.live) == [ka]
    # A stage after its last use stops it: b's last use was rerank.
    hosts.live[kb], hosts.holds[kb] = ["host-b"], {"CPU": 1.0}
    hosts.stage = "rerank"
    hosts.stage_done("rerank")
    assert killed == [kb, kb] and list(hosts.live) == [ka]


def test_endpoints_are_never_hosted():
    api = parse_llm_spec({"name": "api", "backend": "openai", "model": "m",
                          "base_url": "http://127.0.0.1:9/v1", "api_key_env": None})
    assert plan_hosts([("generate", [api]), ("judge", [api])]).spans == {}


def test_index_retrieve_and_narrow_share_one_embedder_across_per_call_settings():
    from xling.core.config import Parallelism
    from xling.core.hosts import embedder_spec

    def m3(parallel=Parallelism(), fp16=False, model="/models/bge-m3"):
        return embedder_spec("BAAI/bge-m3", model, parallel, use_fp16=fp16, device=None)

    index, retrieve = m3(Parallelism(concurrency=(1, 1))), m3(Parallelism(batch_size=8))
    hosts = plan_hosts([("index", [index]), ("retrieve", [retrieve]), ("generate", [spec("g")])])
    span = ("index", "retrieve")
    assert host_key(index) == host_key(retrieve)
    assert set(hosts.spans.values()) == {span}
    assert hosts.specs[host_key(index)] == [index, retrieve]  # sized from both pools
    # fp16 or another model is another loaded model
    assert plan_hosts([("index", [index]), ("retrieve", [m3(fp16=True)])]).spans == {}
    assert plan_hosts([("index", [index]), ("retrieve", [m3(model="/other")])]).spans == {}
    # a stage between them does not end the span: BGE-M3 is loaded once for index..narrow
    assert set(plan_hosts([("index", [index]), ("rerank", []), ("narrow", [m3()])])
               .spans.values()) == {("index", "narrow")}
