"""A hung engine cannot stall a run: `Watchdog` wraps a local LLM engine, and a call during
which the engine makes no progress for `hang_s` seconds comes back as error rows (one per
prompt, counted like any failed generation; the job goes on), while the engine is closed
and built again for the next calls.

vLLM is known to hang rather than fail, e.g. on CUDA out-of-memory (ray-project/ray#59986,
in Ray Data LLM). Progress is the engine's, not the call's: a call may wait long behind
other batches' requests while the engine steps; only an engine whose last step is older than
`hang_s` (and than the call) is hung. An engine that reports no progress (`progress()` is
None) is hung when the call itself takes longer than `hang_s`.

The hung call's thread cannot be stopped from Python; it is left behind (a daemon) with
the old engine, whose `close()` is asked to release what it holds (vLLM: its engine core
process and with it the GPU memory, so that the new engine fits).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable

from xling.actors.llm import Completion, LLMEngine, Prompt, Sampling

log = logging.getLogger(__name__)

POLL_S = 1.0


class Watchdog(LLMEngine):
    """`make()`'s engine; rebuilt by `make()` when a call finds it hung (see module doc)."""

    def __init__(self, make: Callable[[], LLMEngine], hang_s: float, key: str = "hang_timeout_s"):
        self.make, self.hang_s, self.key = make, float(hang_s), key
        self.engine = make()
        self.model = self.engine.model
        self.restarts = 0
        self.lock = threading.Lock()
        self.poll = min(POLL_S, self.hang_s / 4)

    def settings(self) -> dict:
        return self.engine.settings()

    def truncate(self, texts: list[str], n_tokens: int) -> list[str]:
        return self.engine.truncate(texts, n_tokens)

    def __getattr__(self, name: str):
        """The engine's own tools (vLLM's `tokenize`, `max_model_len`: the listwise
        reranker's prompt fitting asks for them) are the current engine's."""
        if name == "engine":  # not built yet
            raise AttributeError(name)
        return getattr(self.engine, name)

    def _hung(self, engine: LLMEngine, started: float) -> bool:
        progress = getattr(engine, "progress", lambda: None)()
        return time.monotonic() - max(started, progress or started) > self.hang_s

    def _failed(self, n: int, waited: float) -> list[Completion]:
        error = (f"engine hung: no progress for {waited:.0f} s (watchdog limit {self.hang_s:g} s, "
                 f"{self.key}); this batch failed and the engine was restarted. Rerun to retry "
                 "these rows; if it recurs, lower the batch or the memory the engine uses "
                 "(gpu_memory_utilization, max_model_len) or raise the limit")
        return [Completion(error=error, attempts=1) for _ in range(n)]

    def _restart(self, hung: LLMEngine) -> None:
        """Close `hung` and build a new engine, once however many calls found it hung."""
        with self.lock:
            if self.engine is not hung:
                return  # another call restarted it already
            log.error("%s: engine hung (no progress for %g s); restarting it", self.model,
                      self.hang_s)
            close = getattr(hung, "close", None)
            if close is not None:
                threading.Thread(target=close, name="xling-close-hung-engine",
                                 daemon=True).start()
            self.engine = self.make()
            self.restarts += 1

    def complete(self, prompts: list[Prompt], sampling: Sampling, **options) -> list[Completion]:
        engine, started = self.engine, time.monotonic()
        box: Future = Future()

        def run():
            try:
                box.set_result(engine.complete(prompts, sampling, **options))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box.set_exception(e)

        threading.Thread(target=run, name="xling-watched-call", daemon=True).start()
        while True:
            try:
                return box.result(timeout=self.poll)
            except TimeoutError:
                if self._hung(engine, started):
                    self._restart(engine)
                    return self._failed(len(prompts), time.monotonic() - started)

    async def acomplete(self, prompts: list[Prompt], sampling: Sampling,
                        **options) -> list[Completion]:
        engine, started = self.engine, time.monotonic()
        task = asyncio.ensure_future(engine.acomplete(prompts, sampling, **options))
        while True:
            done, _ = await asyncio.wait({task}, timeout=self.poll)
            if done:
                return task.result()
            if self._hung(engine, started):
                task.cancel()
                # Building an engine takes seconds to minutes: off the event loop, so the
                # actor's other calls (cache hits, other engines) go on meanwhile.
                await asyncio.to_thread(self._restart, engine)
                return self._failed(len(prompts), time.monotonic() - started)
