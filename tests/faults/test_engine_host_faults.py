"""A shared engine's host process killed mid-call (core/hosts.py): the host starts again and
the call in flight is sent again, so the stages that forward to it lose nothing; a call
whose host dies every time it is sent fails (its stage fails) instead of hanging the run.

The engine here is an OpenAI-compatible endpoint (tests/llm_server.py, its `slow` model
answers after 2 s), so the kill lands while the call waits for its answer; the run plans
hosts for local engines only, but the host actor, its restart and the forwarding are the
same whatever engine it holds. The embedder host (the tiny BGE-M3) is killed while it
encodes a batch.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from llm_server import LLMServer

from xling.actors.llm import Sampling
from xling.core.hosts import CALL_RETRIES, HostedEngine, start_hosts
from xling.core.llm import parse_llm_spec


def _host_pid(actor) -> int:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()))


def _slow_endpoint(server: LLMServer):
    return parse_llm_spec({"name": "ep", "backend": "openai", "model": "slow",
                           "base_url": server.url, "api_key_env": None})


def test_a_killed_engine_host_starts_again_and_its_call_is_sent_again(ray_local):
    with LLMServer(models=("slow",)) as server:
        [host] = start_hosts(_slow_endpoint(server), 1, 0, 0)
        first_pid = _host_pid(host)
        engine = HostedEngine([host], "slow")

        def kill_mid_call():
            deadline = time.time() + 10
            while server.in_flight == 0 and time.time() < deadline:
                time.sleep(0.05)
            os.kill(first_pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_mid_call)
        killer.start()
        [done] = engine.complete(["Name a city."], Sampling(max_tokens=8))
        killer.join()
        assert done.error is None and done.text
        assert server.calls["slow"] == 2  # the call cut by the kill, then sent again
        second_pid = _host_pid(host)
        assert second_pid and second_pid != first_pid  # the same handle, a new process
        [again] = engine.complete(["Name a river."], Sampling(max_tokens=8))
        assert again.error is None and server.calls["slow"] == 3


def test_a_call_whose_host_dies_every_time_fails_instead_of_hanging(ray_local):
    import ray

    with LLMServer(models=("slow",)) as server:
        [host] = start_hosts(_slow_endpoint(server), 1, 0, 0)
        engine = HostedEngine([host], "slow")

        def kill_every_try():  # as a prompt that crashes the engine would
            for sent in range(1, CALL_RETRIES + 2):
                deadline = time.time() + 30
                while server.calls["slow"] < sent and time.time() < deadline:
                    time.sleep(0.05)
                os.kill(_host_pid(host), signal.SIGKILL)

        killer = threading.Thread(target=kill_every_try)
        killer.start()
        with pytest.raises(ray.exceptions.RayActorError):
            engine.complete(["Name a city."], Sampling(max_tokens=8))
        killer.join()
        assert server.calls["slow"] == CALL_RETRIES + 1
        # the host itself starts again for the next call
        [done] = engine.complete(["Name a river."], Sampling(max_tokens=8))
        assert done.error is None and server.calls["slow"] == CALL_RETRIES + 2


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        utime, stime = f.read().rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def test_a_killed_embedder_host_starts_again_and_its_batch_is_embedded(tiny_models, ray_local):
    """The embedder host (index, retrieve and narrow's shared BGE-M3) is killed while it
    embeds a batch: the batch comes back whole, from the restarted host."""
    import pyarrow as pa

    from xling.actors.embedder import make_embedder
    from xling.core.config import Parallelism
    from xling.core.hosts import embedder_spec

    path = tiny_models["bge_m3"]
    spec = embedder_spec("tiny:bge_m3", path, Parallelism(), use_fp16=False, device="cpu")
    [host] = start_hosts(spec, 1, 1, 0)
    first_pid = _host_pid(host)
    hosted = make_embedder(path, hosts=[host], max_length=512, batch_size=32)
    words = "the river city market bridge tower garden station school harbour".split()
    texts = [" ".join(words[(i + j) % len(words)] for j in range(150)) + f" {i}"
             for i in range(400)]  # seconds of encoding on 1 CPU
    killed_at = []

    def kill_mid_batch():  # once the host burns CPU on the batch
        start = _cpu_s(first_pid)
        deadline = time.time() + 60
        while _cpu_s(first_pid) < start + 0.5 and time.time() < deadline:
            time.sleep(0.02)
        os.kill(first_pid, signal.SIGKILL)
        killed_at.append(time.time())

    killer = threading.Thread(target=kill_mid_batch)
    killer.start()
    out = hosted(pa.table({"text": texts}))
    returned_at = time.time()
    killer.join()
    assert killed_at and killed_at[0] < returned_at
    assert out.num_rows == len(texts) and out["error"].null_count == len(texts)
    assert out["dense"].null_count == 0  # (tests/integration/test_embedder_host.py: values)
    second_pid = _host_pid(host)
    assert second_pid != first_pid
    import ray

    ray.kill(host)
