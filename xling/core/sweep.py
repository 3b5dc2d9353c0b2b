"""Sweeps: a grid of dotted overrides expanded into the configs of one run.

`xling sweep --config F --grid 'rerank.runs.0.doc_tokens=64,128,256'` (or a `sweep:` section
with `grid: {key: [values]}`) makes one config per grid point. Their cells run together,
stage by stage, in one run root: a cell two grid points share (same hash) runs once, a cell
done earlier is skipped, and cells of different grid points that one model serves share its
actor pool (see `Stage.pool_key`). The comparison table has one column per grid point.
"""

from __future__ import annotations

import itertools
from typing import Any

import yaml
from pydantic import Field

from xling.core.config import ConfigError, Strict, parse_override
from xling.tasks.tables import fmt, pipe_table


class SweepConfig(Strict):
    """`sweep:` the grid of a sweep (dotted key -> values), as `--grid` gives it."""

    grid: dict[str, list[Any]] = Field(default_factory=dict, description="dotted key -> values")


def parse_grid(texts: list[str]) -> dict[str, list[Any]]:
    """`KEY=v1,v2,...` options -> {key: [values]}; each value is parsed as YAML, so numbers
    are numbers and `[a,b]` is a list (write lists in a config's `sweep:` section)."""
    grid: dict[str, list[Any]] = {}
    for text in texts:
        keys, _ = parse_override(text)  # the same checks as any override
        key = ".".join(keys)
        values = [yaml.safe_load(v) for v in text.partition("=")[2].split(",")]
        if key in grid:
            raise ConfigError(f"--grid: '{key}' is given twice; list all its values once")
        if len(values) != len(set(map(repr, values))):
            raise ConfigError(f"--grid '{text}': a value repeats")
        grid[key] = values
    return grid


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in the order given (first key slowest)."""
    if not grid:
        raise ConfigError("the sweep has no grid: give --grid KEY=v1,v2 or a `sweep: grid:` "
                          "section")
    for key, values in grid.items():
        if not values:
            raise ConfigError(f"sweep grid '{key}' has no values")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def as_overrides(point: dict[str, Any]) -> list[str]:
    """A grid point as dotted overrides (values written as YAML flow)."""
    return [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
            for k, v in point.items()]


def label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.items())


def comparison_table(points: list[dict[str, Any]], metrics: list[list[dict]]) -> str:
    """Markdown: one row per (topic set or study, setting, language, system, metric), one
    column per grid point; `metrics[i]` are the mean rows (DESIGN's metrics schema) of point
    i's evaluate cells. A blank means the point has no such row."""
    keys, values = [], {}
    for i, rows in enumerate(metrics):
        for r in rows:
            key = tuple(str(r.get(k) or "") for k in ("study", "setting", "lang", "system",
                                                      "model", "metric"))
            if key not in values:
                keys.append(key)
                values[key] = {}
            values[key][i] = r["value"]
    head = ["study", "setting", "lang", "system", "model", "metric",
            *(label(p) for p in points)]
    def cell(value) -> str:
        return fmt(None if value is None else float(value), 4, dash="")

    rows = [[*key, *(cell(values[key].get(i)) for i in range(len(points)))] for key in keys]
    return pipe_table(head, rows, empty=None)
