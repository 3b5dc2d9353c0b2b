"""Each engine lives for the run (core/hosts.EngineHosts): started at its first use in the
plan, kept through stages that do not use it, stopped after its last use; an engine killed
between two stages starts again at its next use; and two engines that do not fit the node
together are never loaded together (the one used again farthest away makes room). Real
tiny BGE-M3 hosts (actors/embedder.EmbedderHost) on the test process's Ray node (2 CPUs).
The GPU-fit refusal is planned from the config alone: `xling validate`, no Ray."""

from __future__ import annotations

import textwrap

import pytest

from xling.core.config import ConfigError, Parallelism


def _m3(path: str, *, fp16: bool = False):
    from xling.core.hosts import embedder_spec

    # one CPU a host: on the 2-CPU node one host leaves the stages their CPU, two do not
    return embedder_spec("tiny:bge_m3", path, Parallelism(concurrency=(1, 1), num_cpus=1),
                         use_fp16=fp16, device="cpu")


def _alive(handles) -> bool:
    import ray

    info, _ = ray.get(handles[0].describe.remote({}))
    return bool(info)


def test_an_engine_killed_between_two_stages_starts_again_at_its_next_use(tiny_models,
                                                                          ray_local):
    import ray

    from xling.core.hosts import host_key, plan_hosts, sharing

    m3 = _m3(tiny_models["bge_m3"])
    hosts = plan_hosts([("index", [m3]), ("rerank", []), ("narrow", [m3])], log=lambda _: None)
    with sharing(hosts):
        hosts.stage_start("index")
        first = hosts.handles(m3)
        assert _alive(first)
        hosts.stage_done("index")
        hosts.stage_start("rerank")  # not a user of the engine: it is kept for narrow
        assert hosts.is_live(m3) and not hosts.shares(m3)
        hosts.stage_done("rerank")
        ray.kill(first[0], no_restart=False)  # the host's process dies between stages
        hosts.stage_start("narrow")
        again = hosts.handles(m3)
        assert _alive(again)  # restarted by Ray (max_restarts), the call goes through
        assert hosts.starts[host_key(m3)] == 1  # one start in the plan: Ray restarted it
        hosts.stage_done("narrow")
        assert not hosts.live  # its last use is over


def test_two_engines_that_cannot_coexist_are_never_loaded_together(tiny_models, ray_local):
    from xling.core.hosts import host_key, plan_hosts, sharing

    a, b = _m3(tiny_models["bge_m3"]), _m3(tiny_models["bge_m3"], fp16=True)
    assert host_key(a) != host_key(b)
    order = [("index", [a]), ("retrieve", [b]), ("narrow", [b]), ("features", [a])]
    said: list[str] = []
    hosts = plan_hosts(order, log=said.append)
    live_counts = []
    with sharing(hosts):
        for stage, specs in order:
            hosts.stage_start(stage)
            for spec in specs:
                handles = hosts.handles(spec)
                assert handles is not None, said  # what the hosts said about not starting
                assert _alive(handles)
                live_counts.append(len(hosts.live))
            hosts.stage_done(stage)
    # Two hosts of a CPU each would leave the stages no CPU: one at a time, always.
    assert max(live_counts) == 1
    # b made a (next used by features) make room; a starts again once b's last use is over
    assert hosts.starts == {host_key(a): 2, host_key(b): 1}


def test_validate_refuses_engines_that_share_a_gpu_but_do_not_fit(tmp_path, tiny_models):
    from xling.config import load_config
    from xling.pipeline import validate

    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        name: gpu-fit
        run_root: {tmp_path}/run
        stages: [generate]
        generate:
          prompts: [{{name: p, path: {tmp_path}/prompts.jsonl}}]
          models:
            - {{name: a, model: tiny:llama_chat, gpu_memory_utilization: 0.9,
               parallel: {{num_gpus: 0.5, concurrency: [1, 1]}}}}
            - {{name: b, model: tiny:llama_chat, max_model_len: 512,
               gpu_memory_utilization: 0.9, parallel: {{num_gpus: 0.5, concurrency: [1, 1]}}}}
        """))
    (tmp_path / "prompts.jsonl").write_text('{"item_id": "q1", "prompt": "Hi"}\n')
    with pytest.raises(ConfigError) as e:
        validate(load_config(str(cfg), []))
    msg = str(e.value)
    assert "gpu_memory_utilization" in msg and "1.80" in msg and "at most 0.50" in msg
    # Within the GPU's memory, the same plan is accepted.
    fixed = load_config(str(cfg), ["generate.models.0.gpu_memory_utilization=0.45",
                                   "generate.models.1.gpu_memory_utilization=0.45"])
    assert validate(fixed) == 0
