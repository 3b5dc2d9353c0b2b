"""LLM-CLIR's derived numbers: PRI and Realized % on a table's AVG column (Eq. 1 and 2 as
the paper applies them, llm-clir.txt L249-257), and its printed cells read back."""

from __future__ import annotations

from collections.abc import Iterable

from xling.tasks.irmetrics import average, pri, realized


def parse_published(value) -> tuple[float, bool]:
    """A number as a paper's table prints it -> (value, marked): "0.419*" -> (0.419, True)."""
    if isinstance(value, (int, float)):
        return float(value), False
    text = str(value).strip()
    return float(text.rstrip("* ").strip()), text.endswith("*")


def pri_on_average(first: Iterable[float], oracle: Iterable[float],
                   reranked: Iterable[float]) -> dict[str, float]:
    """PRI and Realized % as the paper computes them (llm-clir.txt L249-257): on the AVG
    column, s1 = AVG of the first stage, s* = AVG of its oracle, s2 = AVG of the reranker,
    not as a mean of per-pair ratios. E.g. CLEF, NV-Embed-v2 and RankGPT-4.1 (DT):
    PRI = 0.586 - 0.323 = 0.263, Realized = (0.443 - 0.323) / 0.263 = 45.6 %."""
    s1, s_star, s2 = average(first), average(oracle), average(reranked)
    return {"s1": s1, "s_star": s_star, "s2": s2, "pri": pri(s_star, s1),
            "realized_pct": realized(s1, s2, s_star)}
