"""One command, one answer: what planning asks of the file system and of each stage is
computed once per command and reused, while a `run_scope` is open.

Stages find their inputs by asking upstream stages for their cells (core/upstream.py), and
every such question used to list the source files again: validating configs/demo.yaml listed 20 patterns 2,970
times, and on `s3://` each listing is a request. Inside a scope, `remember` keeps each
answer by key; the pipeline opens one scope around a whole `xling` command (core/plan.py),
so each source prefix is listed once per run and each stage's cells are built once per
config. Outside a scope (a Ray worker, a unit test calling a stage) nothing is kept.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

_scope: dict | None = None


@contextlib.contextmanager
def run_scope():
    """Answers are kept until the block ends; a scope inside a scope shares the outer one."""
    global _scope
    if _scope is not None:
        yield _scope
        return
    _scope = {}
    try:
        yield _scope
    finally:
        _scope = None


def remember(key: tuple, compute: Callable[[], Any], *, pin: Any = None) -> Any:
    """`compute()` once per key within the scope. `pin` is an object the answer depends on
    by identity (a config): kept beside the answer, so an id that Python reuses for another
    object never returns the first object's answer."""
    if _scope is None:
        return compute()
    hit = _scope.get(key)
    if hit is not None and hit[0] is pin:
        return hit[1]
    value = compute()
    _scope[key] = (pin, value)
    return value


def listings() -> int:
    """How many distinct listings the open scope holds (for tests and the plan's note)."""
    return sum(1 for k in (_scope or {}) if k and k[0] == "list")


def per_config(method):
    """A `Stage.cells`-like method (self, cfg) -> list, computed once per stage class and
    config within a scope; each caller gets its own list."""

    @functools.wraps(method)
    def cached(self, cfg, *args, **kw):
        if args or kw:
            return method(self, cfg, *args, **kw)
        key = ("cells", type(self).__module__, type(self).__qualname__, method.__name__, id(cfg))
        return list(remember(key, lambda: method(self, cfg), pin=cfg))

    cached.__memoized__ = True
    return cached
