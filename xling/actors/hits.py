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


def hits_rows(batch, drop: set[str], hits: list[list[tuple[str, float, str]]],
              errors: list[str | None]):
    """One output row per hit, carrying the input row's other columns (one row with null
    hit fields, and the error if any, for a query without hits)."""
    import numpy as np
    import pyarrow as pa

    counts = np.array([max(1, len(h)) if e is None else 1 for h, e in zip(hits, errors)])
    take = np.repeat(np.arange(batch.num_rows), counts)
    keep = batch.select([c for c in batch.column_names if c not in drop]).take(pa.array(take))
    docs, scores, langs, ranks, errs = [], [], [], [], []
    for h, e in zip(hits, errors):
        if e is None and h:
            docs += [x[0] for x in h]
            scores += [x[1] for x in h]
            langs += [x[2] for x in h]
            ranks += range(1, len(h) + 1)
            errs += [None] * len(h)
        else:
            docs.append(None), scores.append(None), langs.append(None), ranks.append(None)
            errs.append(e)
    return (keep.append_column("doc_id", pa.array(docs, pa.string()))
            .append_column("rank", pa.array(ranks, pa.int32()))
            .append_column("score", pa.array(scores, pa.float64()))
            .append_column("doc_lang", pa.array(langs, pa.string()))
            .append_column("error", pa.array(errs, pa.string())))
