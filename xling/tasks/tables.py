"""Markdown tables as the studies and the evaluate stage print them, written once.

The pipe table, number formatting (a missing value is a dash, never "nan"), intervals,
significance stars, "ours beside the paper's number" with the difference, and reading a
`*.expected.yaml` of published numbers (pyserini 2CR style).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

MISSING = "–"


def missing(v: Any) -> bool:
    """None or NaN: a value a table shows as a dash."""
    if v is None:
        return True
    try:
        return math.isnan(v)
    except TypeError:
        return False


def fmt(v: Any, digits: int = 2, *, scale: float = 1.0, dash: str = MISSING,
        signed: bool = False) -> str:
    """A number for a table: `digits` decimals after multiplying by `scale` (100 for a
    percentage); a string passes through; None/NaN -> `dash`."""
    if missing(v):
        return dash
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int) and scale == 1.0 and not signed:
        return str(v)
    return f"{float(v) * scale:{'+' if signed else ''}.{digits}f}"


def interval(lo: Any, hi: Any, digits: int = 2, *, scale: float = 1.0) -> str:
    """`[lo, hi]`, or a dash when either end is missing."""
    if missing(lo) or missing(hi):
        return MISSING
    return f"[{fmt(lo, digits, scale=scale)}, {fmt(hi, digits, scale=scale)}]"


def wilson(hits: int, n: int, z: float = 1.959964) -> tuple[float | None, float | None]:
    """The Wilson score interval of the share hits/n, in % ((None, None) for n = 0)."""
    if n == 0:
        return None, None
    share = hits / n
    denominator = 1 + z * z / n
    mid = (share + z * z / (2 * n)) / denominator
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / denominator
    return 100 * max(0.0, mid - half), 100 * min(1.0, mid + half)


def stars(p: float | None, levels: Sequence[float] = (0.05,)) -> str:
    """One star per significance level that p is under (default: p < 0.05 -> "*")."""
    if missing(p):
        return ""
    return "*" * sum(1 for a in levels if p < a)


def beside(ours: Any, paper: Any, digits: int = 2, *, scale: float = 1.0,
           paper_digits: int | None = None) -> str:
    """xling's value and, where the paper has one, `ours (paper; ours - paper)`. `scale`
    applies to ours only: the paper's numbers are taken as printed."""
    text = fmt(ours, digits, scale=scale)
    if missing(paper):
        return text
    pd_ = digits if paper_digits is None else paper_digits
    shown = f"{float(paper):.{pd_}f}"
    if missing(ours):
        return f"{text} ({shown}; {MISSING})"
    return f"{text} ({shown}; {float(ours) * scale - float(paper):+.{pd_}f})"


def delta(ours: Any, paper: Any, digits: int = 2) -> str:
    """`ours - paper`, signed, or a dash."""
    if missing(ours) or missing(paper):
        return MISSING
    return f"{float(ours) - float(paper):+.{digits}f}"


def pipe_table(header: Sequence[str], rows: Iterable[Sequence[Any]], *,
               title: str | None = None, heading: str = "bold", notes: Iterable[str] = (),
               empty: str | None = "(no results)") -> str:
    """A GitHub pipe table. Cells are str()-ed; `title` goes above it (bold, or a `###`
    heading), `notes` below it, and an empty table shows one `empty` row."""
    header = [str(h) for h in header]
    lines: list[str] = []
    if title:
        lines += [f"**{title}**" if heading == "bold" else f"{heading} {title}", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    body = [["" if c is None else str(c) for c in r] for r in rows]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    if not body and empty is not None:
        lines.append("| " + " | ".join([empty] + [""] * (len(header) - 1)) + " |")
    return "\n".join(lines) + "".join(f"\n\n{n}" for n in notes)


def frame_table(df, *, digits: int = 1, title: str | None = None) -> str:
    """A pandas DataFrame as a pipe table: index levels first, floats with `digits`."""
    import numpy as np

    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return fmt(float(v), digits)
        return MISSING if v is None else str(v)

    names = [n if n is not None else "" for n in (df.index.names or [None])]
    rows = []
    for ix, *row in df.itertuples(index=True, name=None):  # keeps each column's type
        ix = ix if isinstance(ix, tuple) else (ix,)
        rows.append([*(cell(v) for v in ix), *(cell(v) for v in row)])
    return pipe_table([*names, *(str(c) for c in df.columns)], rows, title=title)


def read_expected(path: str, opener: Callable[[str], Any] | None = None) -> dict:
    """A `*.expected.yaml` (published numbers) as a mapping; ValueError when it is not one.
    `opener` opens remote paths (the run store's, say); default: a local file."""
    import yaml

    if opener is None:
        with open(path, "rb") as f:
            raw = f.read()
    else:
        with opener(path) as f:
            raw = f.read()
    data = yaml.safe_load(raw.decode("utf-8") if isinstance(raw, bytes) else raw) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping of published numbers")
    return data
