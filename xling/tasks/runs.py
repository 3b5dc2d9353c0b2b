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
    table = table.select(list(HITS_COLUMNS))
    return table if table.schema.equals(HITS_SCHEMA) else table.cast(HITS_SCHEMA)


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
    data = trec_run_bytes(table)
    if isinstance(dest, (str, Path)):
        Path(dest).write_bytes(data)
    elif isinstance(dest, io.TextIOBase):
        dest.write(data.decode("utf-8"))
    else:
        try:
            dest.write(data)
        except TypeError:  # a text stream that is not an io.TextIOBase
            dest.write(data.decode("utf-8"))


def hits_trec_bytes(table: pa.Table) -> bytes:
    """Hit rows, as a stage commits them -> `trec_run_bytes`; error rows and queries without
    hits (no doc_id) are left out."""
    if not table.num_rows or "doc_id" not in table.column_names:
        return b""
    hits = table.select(["query_id", "doc_id", "rank", "score", "system"])
    keep = hit_mask(table)  # filtering copies every column, so only where a row is left out
    return trec_run_bytes(hits if keep is None else hits.filter(keep))


def hit_counts(table: pa.Table) -> dict[str, int]:
    """The hits of committed hit rows (those `hits_trec_bytes` writes) and the queries they
    answer. A query's hits are all in one part, so the sums over a cell's parts are the
    cell's (the stages' `part_counts`)."""
    if not table.num_rows or "doc_id" not in table.column_names:
        return {"hits": 0, "queries_with_hits": 0}
    keep = hit_mask(table)
    queries = table["query_id"] if keep is None else table["query_id"].filter(keep)
    return {"hits": len(queries),
            "queries_with_hits": int(pc.count_distinct(queries).as_py()) if len(queries) else 0}


def hit_mask(table: pa.Table) -> pa.Array | None:
    """Which committed hit rows are hits (a document, no error), or None where all are."""
    errors = "error" in table.column_names and table["error"].null_count < table.num_rows
    if not errors and not table["doc_id"].null_count:
        return None
    keep = pc.is_valid(table["doc_id"])
    return pc.and_(keep, pc.is_null(table["error"])) if "error" in table.column_names else keep


# Rows formatted per Arrow call: each call's lines stay far below a string array's 2 GiB.
_TREC_CHUNK = 1 << 20


def trec_run_bytes(table: pa.Table) -> bytes:
    """`write_trec_run`'s file content, UTF-8. Formatted with Arrow kernels, not per hit in
    Python: a dense run of 100k queries at depth 100 is 10 M lines."""
    t = as_hits(table).combine_chunks()
    nulls = [c for c in HITS_COLUMNS if t[c].null_count]
    if nulls:
        raise ValueError(f"hits with null {nulls} cannot be written as a TREC run")
    if not t.num_rows:
        return b""
    for c in ("query_id", "doc_id", "system"):
        _check_trec_field(t, c)
    # Dictionary codes follow first appearance, which is the query order to keep.
    qorder = pc.dictionary_encode(t["query_id"].chunk(0)).indices.to_numpy()
    rank = t["rank"].to_numpy()
    step = np.diff(qorder)
    # Stages commit each query's hits together and in rank order: then there is nothing to sort.
    if not ((step >= 0).all() and ((step > 0) | (np.diff(rank) > 0)).all()):
        t = t.take(np.lexsort((np.arange(t.num_rows), rank, qorder)))
    out = []
    for at in range(0, t.num_rows, _TREC_CHUNK):
        c = t.slice(at, _TREC_CHUNK).combine_chunks()
        fields = pc.binary_join_element_wise(
            c["query_id"].chunk(0), "Q0", c["doc_id"].chunk(0),
            pc.cast(c["rank"].chunk(0), pa.string()), _scores_6f(c["score"].to_numpy()),
            c["system"].chunk(0), " ")
        out.append(pc.binary_join_element_wise(fields, "\n", ""))
    return b"".join(_string_bytes(a) for a in out)


def _check_trec_field(t: pa.Table, column: str) -> None:
    """Every value non-empty and without whitespace (`str.split` splits on exactly what
    `str.isspace` calls whitespace), checked once per distinct value."""
    bad = next((v for v in pc.unique(t[column]).to_pylist() if v.split() != [v]), None)
    if bad is not None:
        i = t[column].to_pylist().index(bad)
        row = t.slice(i, 1).to_pylist()[0]
        fields = (row["query_id"], row["doc_id"], row["system"])
        raise ValueError(f"row {i}: query_id, doc_id and system must be non-empty "
                         f"and without whitespace in a TREC run: {fields!r}")


def _scores_6f(x: np.ndarray) -> pa.Array:
    """`f"{v:.6f}"` for each float, from whole millionths. Where x * 1e6 might round the
    other way than x's exact decimal value (close to a half, beyond float precision, or not
    finite), that value goes through Python's own formatting instead."""
    y = x * 1e6
    with np.errstate(invalid="ignore"):
        # fl(x * 1e6) is within |y| * 2^-53 of the exact product; keep 8x that, and 1e-6
        tol = 1e-6 + np.abs(y) * 2.0 ** -50
        slow = (np.abs(np.abs(y - np.trunc(y)) - 0.5) <= tol) | ~(np.abs(y) < 2.0 ** 52)
        a = np.where(slow, 0, np.abs(np.rint(y))).astype(np.int64)
    whole = pc.cast(pa.array(a // 1_000_000), pa.string())
    frac = pc.utf8_lpad(pc.cast(pa.array(a % 1_000_000), pa.string()), 6, "0")
    sign = pa.array(np.where(np.signbit(x), "-", ""))
    text = pc.binary_join_element_wise(sign, whole, ".", frac, "")
    if slow.any():
        text = pc.replace_with_mask(text, pa.array(slow),
                                    pa.array([f"{v:.6f}" for v in x[slow]], pa.string()))
    return text


def _string_bytes(a: pa.Array) -> memoryview:
    """A string array's UTF-8 values, concatenated, as a view of its data buffer."""
    offsets = np.frombuffer(a.buffers()[1], np.int32, len(a) + 1, a.offset * 4)
    return memoryview(a.buffers()[2])[offsets[0]:offsets[-1]]
