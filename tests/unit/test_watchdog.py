"""The hang watchdog (core/watchdog.py): a call whose engine makes no progress for the set
time fails its batch's rows with a clear error, the engine is restarted, and the next calls
run on the new engine; an engine that is slow but stepping is left alone.

The engine here is a stand-in made to hang on one prompt (the watchdog's control flow is
what is tested; tests/integration/test_watchdog_vllm.py hangs a real vLLM engine)."""

import asyncio
import threading
import time

import pytest

from xling.actors.llm import Completion, LLMEngine, Sampling
from xling.core.engines import make_engine
from xling.core.llm import CachedEngine
from xling.core.watchdog import Watchdog


class HangingEngine(LLMEngine):
    """Answers each prompt with its upper case; a prompt "hang" blocks its call forever (as
    a vLLM step that never returns), "slow" takes 1 s while reporting progress."""

    built: list["HangingEngine"] = []

    def __init__(self):
        self.model, self.closed, self.stepped = "fake", False, time.monotonic()
        self.release = threading.Event()
        HangingEngine.built.append(self)

    def progress(self) -> float:
        return self.stepped

    def close(self) -> None:
        self.closed = True
        self.release.set()

    def complete(self, prompts, sampling, **options):
        if "hang" in prompts:
            self.release.wait()
            raise RuntimeError("closed while hung")
        if "slow" in prompts:
            for _ in range(10):
                time.sleep(0.1)
                self.stepped = time.monotonic()
        return [Completion(text=p.upper()) for p in prompts]


@pytest.fixture
def watched():
    HangingEngine.built.clear()
    return Watchdog(HangingEngine, hang_s=0.4)


def _check_hung_call(out, watched, n):
    assert len(out) == n and all(c.text is None for c in out)
    assert all(c.error.startswith("engine hung: no progress for ") for c in out)
    assert "watchdog limit 0.4 s, hang_timeout_s" in out[0].error
    assert "the engine was restarted" in out[0].error
    assert watched.restarts == 1 and len(HangingEngine.built) == 2
    first, second = HangingEngine.built
    assert first.closed and not second.closed and watched.engine is second


def test_a_hung_async_call_fails_its_rows_and_the_engine_restarts(watched):
    sampling = Sampling()

    async def calls():
        hung = watched.acomplete(["a", "hang", "b"], sampling)
        fine = watched.acomplete(["c"], sampling)  # beside it: answered, not failed
        return await asyncio.gather(hung, fine)

    t0 = time.monotonic()
    out, fine = asyncio.run(calls())
    assert 0.4 < time.monotonic() - t0 < 5
    _check_hung_call(out, watched, 3)
    assert [c.text for c in fine] == ["C"]
    after = asyncio.run(watched.acomplete(["d", "e"], sampling))  # the new engine
    assert [c.text for c in after] == ["D", "E"] and watched.restarts == 1


def test_the_engines_own_tools_are_the_current_engines(watched):
    """What a stage asks of the engine beyond `complete` (the reranker: `tokenize`,
    `max_model_len`) reaches the engine of the moment, before and after a restart."""
    assert hasattr(watched, "progress") and not hasattr(watched, "tokenize")
    assert watched.release is HangingEngine.built[0].release
    watched.complete(["hang"], Sampling())
    assert watched.release is HangingEngine.built[1].release


def test_a_hung_sync_call_fails_its_rows_and_the_engine_restarts(watched):
    out = watched.complete(["hang", "x"], Sampling())
    _check_hung_call(out, watched, 2)
    assert [c.text for c in watched.complete(["y"], Sampling())] == ["Y"]


def test_a_slow_engine_that_makes_progress_is_not_hung(watched):
    out = watched.complete(["slow", "z"], Sampling())  # 1 s, progress every 0.1 s
    assert [c.text for c in out] == ["SLOW", "Z"] and watched.restarts == 0


def test_the_hung_rows_are_error_rows_and_not_cached(watched):
    """Through the generation cache (as the generate stage calls it): counted error rows,
    nothing stored, so a rerun generates them again."""
    cached = CachedEngine({"backend": "vllm", "model": "fake"}, None, "fake", engine=watched)
    out, hits, keys = cached.complete(["hang", "ok"], Sampling())
    assert [c.error is not None for c in out] == [True, True] and hits == [False, False]
    assert not cached.known
    out, _, _ = cached.complete(["ok"], Sampling())
    assert out[0].text == "OK" and len(cached.known) == 1


def test_make_engine_puts_the_configured_limit_on_the_engine(monkeypatch):
    """`hang_timeout_s` of an entry (its stage's setting) reaches the watchdog; without it
    the engine is bare."""
    from xling.core.engines import spec_class
    from xling.core.llm import engine_spec, parse_llm_spec

    monkeypatch.setattr(spec_class("vllm"), "ENGINE", lambda **kw: HangingEngine())
    entry = parse_llm_spec({"model": "tiny:llama_chat", "hang_timeout_s": 30})
    monkeypatch.setattr("xling.core.engines.vllm.resolve_model", lambda m, key: m)
    engine = make_engine(engine_spec(entry))
    assert isinstance(engine, Watchdog) and engine.hang_s == 30
    assert parse_llm_spec({"model": "m"}).hang_timeout_s == 600
    assert isinstance(make_engine({"backend": "vllm"}), HangingEngine)
