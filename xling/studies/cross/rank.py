"""Exact ranking of a context's sentences by given scores (score descending, ties by
sentence index ascending, s2.3), each needle's rank, and the text the LLM sees for a
selection. Top-k is the prefix of the ranking, so the caps are nested."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .paper import ORDERS


def rank(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Sentence indices by score descending, ties by index ascending (s2.3)."""
    values = np.asarray(scores, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"scores must be one-dimensional, got shape {values.shape}")
    if np.isnan(values).any():
        raise ValueError("scores contain NaN")
    return np.lexsort((np.arange(values.size), -values))


def label_ranks(order: Sequence[int] | np.ndarray, label_idx: Sequence[int]) -> list[int]:
    """1-based rank of each needle's sentence in a full ranking (``order`` from :func:`rank`);
    -1 for a needle that is in no sentence."""
    order = np.asarray(order)
    position = np.empty(order.size, dtype=np.int64)
    position[order] = np.arange(1, order.size + 1)
    return [int(position[i]) if 0 <= i < order.size else -1 for i in label_idx]


def scores_of(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Dot products in float64, row by row: a float32 product is exact in float64 and each
    row is summed alone, so equal sentences score exactly equal wherever they sit in the
    matrix (a BLAS GEMV may round its edge rows differently)."""
    return (np.asarray(vectors, np.float64) * np.asarray(query, np.float64)).sum(axis=1)


def selection_text(text: str, spans: Sequence[tuple[int, int]], top_idx: Sequence[int], *,
                   order: str = "score", join: str = " ") -> str:
    """The text the LLM is given for a selection: the selected sentences (``top_idx`` best
    first) in rank order (``order="score"``) or document order, joined by ``join``."""
    chosen = [int(i) for i in top_idx]
    if order == "document":
        chosen = sorted(chosen)
    elif order != "score":
        raise ValueError(f"order must be one of {list(ORDERS)}, got {order!r}")
    return join.join(text[spans[i][0]:spans[i][1]] for i in chosen)
