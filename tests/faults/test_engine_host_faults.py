"""A shared engine's host process killed mid-call (core/hosts.py): the host starts again and
the call in flight is sent again, so the stages that forward to it lose nothing.

The engine here is an OpenAI-compatible endpoint (tests/llm_server.py, its `slow` model
answers after 2 s), so the kill lands while the call waits for its answer; the run plans
hosts for local engines only, but the host actor, its restart and the forwarding are the
same whatever engine it holds.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from llm_server import LLMServer

from xling.actors.llm import Sampling
from xling.core.hosts import HostedEngine, start_hosts
from xling.core.llm import parse_llm_spec


def _host_pid(actor) -> int:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()))


def test_a_killed_engine_host_starts_again_and_its_call_is_sent_again(ray_local):
    with LLMServer(models=("slow",)) as server:
        spec = parse_llm_spec({"name": "ep", "backend": "openai", "model": "slow",
                               "base_url": server.url, "api_key_env": None})
        [host] = start_hosts(spec, 1, 0, 0)
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
