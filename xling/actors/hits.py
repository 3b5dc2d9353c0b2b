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
