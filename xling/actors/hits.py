"""Merging the hits of one query from several language partitions into one ranked list.

BordIRLines' modes (rel_langs, qlang_en, swap) search several language partitions for one
query. Dense scores are comparable across partitions (one embedding space), so the default
merges by score; `interleave` takes ranks round-robin (partition order), for engines whose
scores are not comparable across indexes (BM25 statistics are per index).
"""

from __future__ import annotations


def merge_partitions(parts: list[list[tuple[str, float, str]]], k: int,
                     how: str = "score") -> list[tuple[str, float, str]]:
    """[(doc_id, score, partition)] lists, each ranked -> one list of at most k hits.

    A doc found in two partitions keeps its first (best) occurrence. Ties in score are
    broken by doc id, as Anserini does, so the result does not depend on partition order.
    """
    if len(parts) == 1:
        return parts[0][:k]
    if how == "score":
        ranked = sorted((h for p in parts for h in p), key=lambda h: (-h[1], h[0]))
    elif how == "interleave":
        ranked = [p[i] for i in range(max(map(len, parts), default=0)) for p in parts if i < len(p)]
    else:
        raise ValueError(f"unknown merge {how!r}: use score or interleave")
    out, seen = [], set()
    for hit in ranked:
        if hit[0] not in seen:
            seen.add(hit[0])
            out.append(hit)
            if len(out) == k:
                break
    return out


def merge_ranked(parts: list[tuple], k: int, how: str = "score") -> tuple:
    """`merge_partitions` for hits as arrays, (doc ids, scores, partition language) per
    partition -> (doc ids, scores, languages) arrays. One partition (most queries) is cut
    to k as it is."""
    import numpy as np

    if len(parts) == 1:
        ids, scores, lang = parts[0]
        ids, scores = ids[:k], scores[:k]
        return ids, scores, np.full(len(ids), lang, object)
    hits = merge_partitions([[(d, float(s), lang) for d, s in zip(ids, scores)]
                             for ids, scores, lang in parts], k, how)
    return (np.array([h[0] for h in hits], object), np.array([h[1] for h in hits], np.float64),
            np.array([h[2] for h in hits], object))


def ranked_rows(batch, drop: set[str], ranked: list, errors: list[str | None]):
    """One output row per hit, carrying the input row's other columns (one row with null
    hit fields, and the error if any, for a query without hits). A query's hits come as
    arrays, (doc ids, scores, languages), ranked; the rows are built with numpy, not per hit
    (a dense batch of 6k queries at depth 100 is 600k rows)."""
    import numpy as np
    import pyarrow as pa

    n = batch.num_rows
    lens = np.array([0 if errors[i] is not None else len(ranked[i][0]) for i in range(n)],
                    dtype=np.int64)
    counts = np.maximum(lens, 1)
    keep = batch.select([c for c in batch.column_names if c not in drop])
    keep = keep.take(pa.array(np.repeat(np.arange(n), counts)))
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    none, nan = np.array([None], object), np.array([np.nan])
    pieces = [ranked[i] if lens[i] else (none, nan, none) for i in range(n)]
    docs = np.concatenate([p[0] for p in pieces]) if n else np.array([], object)
    scores = np.concatenate([p[1] for p in pieces]) if n else np.array([], np.float64)
    langs = np.concatenate([p[2] for p in pieces]) if n else np.array([], object)
    miss = np.repeat(lens == 0, counts)  # the one row of a query without hits
    ranks = np.arange(total, dtype=np.int64) - np.repeat(starts, counts) + 1
    errs = np.full(total, None, object)
    errs[starts[lens == 0]] = [errors[i] for i in np.flatnonzero(lens == 0)]
    return (keep.append_column("doc_id", pa.array(docs, pa.string()))
            .append_column("rank", pa.array(ranks.astype(np.int32), pa.int32(), mask=miss))
            .append_column("score", pa.array(scores.astype(np.float64), pa.float64(), mask=miss))
            .append_column("doc_lang", pa.array(langs, pa.string()))
            .append_column("error", pa.array(errs, pa.string())))
