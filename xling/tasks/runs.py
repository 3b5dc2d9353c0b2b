"""Run (hits) tables and TREC run files.

A hits table is a pyarrow Table with the columns of `HITS_SCHEMA`: `query_id`, `doc_id`,
`rank` (int32, 1-based), `score` (float64), `system`. Stage outputs carry more columns
(`lang`, `doc_lang`, `error`); every function here selects the five it needs by name.

TREC run files are the exchange format with trec_eval, pyserini and other groups' runs:
one hit per line, `qid Q0 docid rank score tag`, whitespace separated. `write_trec_run`
formats scores like pyserini (`f"{score:.6f}"`), so a run read back from a file is equal to
the table it was written from only to 1e-6 in its scores.

Orderings: TREC tools ignore the rank column when they evaluate. trec_eval orders a query's
hits by score, descending, and breaks ties by docid in *descending* byte order
(`rerank_by_score` does the same, so the ranks it assigns are the order trec_eval sees;
trec_eval also rounds scores to C `float` first, see `xling.tasks.irmetrics`). pyserini's
fusion breaks ties the other way (ascending docid), which `xling.tasks.fusion` follows.
"""

from __future__ import annotations

import gzip
import io
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xling.tasks.textio import iter_lines

HITS_SCHEMA = pa.schema([("query_id", pa.string()), ("doc_id", pa.string()),
                         ("rank", pa.int32()), ("score", pa.float64()),
                         ("system", pa.string())])
HITS_COLUMNS = tuple(HITS_SCHEMA.names)


def as_hits(table: pa.Table) -> pa.Table:
    """The five hits columns of `table`, cast to `HITS_SCHEMA` (extra columns dropped).

    Casting also types the all-null columns of an empty table built from Python lists.
    """
    missing = [c for c in HITS_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"a hits table needs the columns {list(HITS_COLUMNS)}; "
                         f"missing {missing}")
    return table.select(list(HITS_COLUMNS)).cast(HITS_SCHEMA)


def hits_table(hits: Mapping | Iterable[Mapping[str, Any]], system: str | None = None
               ) -> pa.Table:
    """A hits table from Python data.

    `hits` is one of:
    - `{qid: {docid: score}}` (the form pytrec_eval takes): ranks by `rerank_by_score`;
    - `{qid: [(docid, score), ...]}`: ranks are the list positions;
    - rows `{"query_id", "doc_id", "score"[, "rank", "system"]}`: ranks as given, or by
      `rerank_by_score` when any row has none.
    `system` names the run; it is required unless every row carries its own.
    """
    rerank = False
    cols: dict[str, list] = {c: [] for c in HITS_COLUMNS}
    if isinstance(hits, Mapping):
        for qid, docs in hits.items():
            if isinstance(docs, Mapping):
                items, rerank = list(docs.items()), True
            else:
                items = list(docs)
            for pos, (doc, score) in enumerate(items, 1):
                cols["query_id"].append(str(qid))
                cols["doc_id"].append(str(doc))
                cols["rank"].append(pos)
                cols["score"].append(float(score))
                cols["system"].append(system)
    else:
        for row in hits:
            rank = row.get("rank")
            rerank = rerank or rank is None
            cols["query_id"].append(str(row["query_id"]))
            cols["doc_id"].append(str(row["doc_id"]))
            cols["rank"].append(rank)
            cols["score"].append(float(row["score"]))
            cols["system"].append(row.get("system") or system)
    if any(s is None for s in cols["system"]):
        raise ValueError("hits_table needs `system=` (or a `system` in every row)")
    table = pa.table(cols, schema=HITS_SCHEMA)
    return rerank_by_score(table) if rerank else table


def rerank_by_score(table: pa.Table) -> pa.Table:
    """Each query's hits sorted by score (descending), ties by doc_id descending, ranked 1..n.

    The tie order is trec_eval's (`comp_sim_docno` in its form_res_rels.c compares
    `strcmp(b, a)`). Queries come out in ascending query_id order.
    """
    t = as_hits(table)
    if t.num_rows == 0:
        return t
    _check_scores(t)
    order = pc.sort_indices(t, sort_keys=[("query_id", "ascending"), ("score", "descending"),
                                          ("doc_id", "descending")])
    t = t.take(order)
    ranks = _positions(t["query_id"])
    return t.set_column(t.schema.get_field_index("rank"), "rank", pa.array(ranks, pa.int32()))


def _positions(query_ids: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """1-based position of each row within its run of equal, adjacent query ids."""
    if isinstance(query_ids, pa.ChunkedArray):
        query_ids = query_ids.combine_chunks()
    q = pc.dictionary_encode(query_ids).indices.to_numpy(zero_copy_only=False)
    n = len(q)
    if n == 0:
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
    return np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n])) + 1


def _check_scores(t: pa.Table) -> None:
    if t.num_rows and pc.any(pc.is_nan(t["score"])).as_py():
        raise ValueError("hits with a NaN score cannot be ordered")


def to_dict(table: pa.Table) -> dict[str, dict[str, float]]:
    """`{qid: {docid: score}}`, the run form pytrec_eval takes.

    A doc listed twice for one query raises ValueError: trec_eval refuses such runs, and a
    dict would silently keep one of the two scores.
    """
    t = as_hits(table)
    out: dict[str, dict[str, float]] = {}
    for q, d, s in zip(t["query_id"].to_pylist(), t["doc_id"].to_pylist(),
                       t["score"].to_pylist()):
        docs = out.setdefault(q, {})
        if d in docs:
            raise ValueError(f"query {q!r} lists doc {d!r} more than once")
        docs[d] = s
    return out


def read_trec_run(source: str | Path | IO, *, system: str | None = None) -> pa.Table:
    """A TREC run file (a path, `.gz` too, or a binary or text stream) -> a hits table.

    Lines are `qid Q0 docid rank score tag`; blank lines are skipped. The tag becomes
    `system` unless `system=` overrides it. A line that is not six fields, or whose rank or
    score does not parse, raises ValueError naming its line number: a damaged run must not
    be evaluated as if it were a shorter one.
    """
    if isinstance(source, (str, Path)):
        path = Path(source)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            return _read_run(f, system)
    return _read_run(source, system)


def _read_run(stream: IO, system: str | None) -> pa.Table:
    cols: dict[str, list] = {c: [] for c in HITS_COLUMNS}
    for n, raw in enumerate(iter_lines(stream), 1):
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as e:
            raise ValueError(f"run line {n}: invalid UTF-8 at byte {e.start}") from None
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise ValueError(f"run line {n} has {len(parts)} fields, expected 6 "
                             f"(qid Q0 docid rank score tag): {line[:120]!r}")
        try:
            rank = int(parts[3])
        except ValueError:
            raise ValueError(f"run line {n}: rank {parts[3]!r} is not an integer") from None
        try:
            score = float(parts[4])
        except ValueError:
            raise ValueError(f"run line {n}: score {parts[4]!r} is not a number") from None
        if math.isnan(score):
            raise ValueError(f"run line {n}: score is NaN")
        cols["query_id"].append(parts[0])
        cols["doc_id"].append(parts[2])
        cols["rank"].append(rank)
        cols["score"].append(score)
        cols["system"].append(system or parts[5])
    return pa.table(cols, schema=HITS_SCHEMA)


def write_trec_run(table: pa.Table, dest: str | Path | IO) -> None:
    """Write a hits table as a TREC run file (a path, or a text or binary stream).

    Queries keep the order they first appear in; each query's hits are written in rank
    order (stable), because some readers take a run's first lines per query as its top
    (pyserini's fusion `depth` does). Scores are `f"{score:.6f}"`, as pyserini writes them.
    An id or tag with whitespace, or a null field, cannot be written in this format and
    raises ValueError.
    """
    t = as_hits(table)
    nulls = [c for c in HITS_COLUMNS if t[c].null_count]
    if nulls:
        raise ValueError(f"hits with null {nulls} cannot be written as a TREC run")
    lines = []
    if t.num_rows:
        q = t["query_id"].to_pylist()
        first: dict[str, int] = {}
        for i, qid in enumerate(q):
            first.setdefault(qid, i)
        qorder = np.fromiter((first[x] for x in q), np.int64, len(q))
        rank = t["rank"].to_numpy(zero_copy_only=False)
        order = np.lexsort((np.arange(len(q)), rank, qorder))
        d = t["doc_id"].to_pylist()
        s = t["score"].to_pylist()
        tag = t["system"].to_pylist()
        for i in order:
            fields = (q[i], d[i], tag[i])
            if any(not f or any(c.isspace() for c in f) for f in fields):
                raise ValueError(f"row {i}: query_id, doc_id and system must be non-empty "
                                 f"and without whitespace in a TREC run: {fields!r}")
            lines.append(f"{q[i]} Q0 {d[i]} {rank[i]} {s[i]:.6f} {tag[i]}\n")
    text = "".join(lines)
    if isinstance(dest, (str, Path)):
        Path(dest).write_text(text, encoding="utf-8")
    elif isinstance(dest, io.TextIOBase):
        dest.write(text)
    else:
        try:
            dest.write(text.encode("utf-8"))
        except TypeError:  # a text stream that is not an io.TextIOBase
            dest.write(text)
