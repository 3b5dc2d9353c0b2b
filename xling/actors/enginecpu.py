"""The CPU seconds a process spends inside its engine's calls (Lucene, CTranslate2, BGE-M3,
vLLM, ...), for the benchmarks' overhead figure: (xling's CPU - the engines' CPU) / bare's
CPU (benchmarks/common.py).

Off unless $XLING_ENGINE_CPU_DIR names a folder (the benchmarks set it before Ray starts, so
every worker inherits it); then each process keeps the CPU time (`time.process_time`: all
its threads, as the engines run their own) spent while at least one engine call is open,
and rewrites `<dir>/<pid>` with its total when the outermost call ends, at most every
`WRITE_EVERY` seconds (a vLLM step is milliseconds; what is lost at the end is under that).
Overlapping calls (an async actor's) count once: the union, not the sum. Off, an
`engine_cpu()` block costs one environment lookup.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

ENV = "XLING_ENGINE_CPU_DIR"
WRITE_EVERY = 0.1

_lock = threading.Lock()
_open = 0
_since = 0.0
_total = 0.0
_written = 0.0


@contextlib.contextmanager
def engine_cpu():
    """Count the CPU this process spends in the block as its engine's."""
    folder = os.environ.get(ENV)
    if not folder:
        yield
        return
    global _open, _since, _total, _written
    with _lock:
        if _open == 0:
            _since = time.process_time()
        _open += 1
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            if _open == 0:
                _total += time.process_time() - _since
                if time.monotonic() - _written >= WRITE_EVERY:
                    _save(folder, _total)
                    _written = time.monotonic()


def _save(folder: str, total: float) -> None:
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(repr(total))
    os.replace(tmp, os.path.join(folder, str(os.getpid())))


def read_totals(folder: str, exclude: tuple[int, ...] = ()) -> dict[int, float]:
    """pid -> engine CPU seconds recorded under `folder` (none when nothing ran)."""
    out = {}
    if not os.path.isdir(folder):
        return out
    for name in os.listdir(folder):
        if name.isdigit() and int(name) not in exclude:
            with open(os.path.join(folder, name)) as f:
                out[int(name)] = float(f.read())
    return out
