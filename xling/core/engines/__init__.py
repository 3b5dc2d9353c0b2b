"""LLM backends, one module each, and the registry that names them.

A backend module (`vllm.py`, `openai.py`, `ctranslate2.py`) holds everything that differs
between backends: its config entry (an `EngineSpec` subclass with `backend:
Literal["<name>"]`, exported as `Spec`), the `LLMEngine` that generates (`Spec.ENGINE`), its
start-up checks and actor settings. The stages never ask which backend an entry is; they call the entry's methods
(core/llm.py). Adding a backend is one module here plus one line in `BACKENDS`.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xling.actors.llm import LLMEngine
    from xling.core.engines.base import EngineSpec

# backend name -> the module that implements it. The first is the default: an entry without
# `backend:` is one of its.
BACKENDS = {
    "vllm": "xling.core.engines.vllm",
    "openai": "xling.core.engines.openai",
    "ctranslate2": "xling.core.engines.ctranslate2",
}
DEFAULT = next(iter(BACKENDS))


@cache
def spec_class(backend: str) -> type[EngineSpec]:
    if backend not in BACKENDS:
        raise ValueError(f"unknown LLM backend {backend!r}; use one of: {', '.join(BACKENDS)}")
    spec = importlib.import_module(BACKENDS[backend]).Spec
    if spec.backend_name() != backend:
        raise TypeError(f"{BACKENDS[backend]}.Spec is backend {spec.backend_name()!r}, "
                        f"registered as {backend!r}")
    return spec


def spec_classes() -> dict[str, type[EngineSpec]]:
    return {name: spec_class(name) for name in BACKENDS}


def make_engine(spec: dict) -> LLMEngine:
    """An engine from plain data: {"backend": <name>, **the Spec's engine_args()}. With
    `hang_timeout_s` in it, the engine runs under a watchdog (core/watchdog.py) that fails a
    call whose engine stops making progress and restarts the engine."""
    spec = dict(spec)
    engine = spec_class(spec.pop("backend")).ENGINE
    hang_s = spec.pop("hang_timeout_s", None)
    if hang_s is None:
        return engine(**spec)
    from xling.core.watchdog import Watchdog

    return Watchdog(lambda: engine(**spec), hang_s)
