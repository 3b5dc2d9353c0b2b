"""JSON-lines corpus files -> Arrow tables of documents rows, a chunk of lines at a time.

Arrow's JSON reader parses a chunk in C++ while a thread decompresses the next: 1.4 M
documents (3.5 GB of JSON lines, gzip level 1) read in 10.4 s with one Arrow thread (what a
Ray task gets), against 20.8 s through `json.loads` per line; the gzip stream alone takes
5.8 s. The parsing runs in a thread of its own too, up to 128 MB ahead of the caller, so
that a partition task's Parquet writes overlap it (400k documents read and written: 5.5 s
in the caller's thread, 4.0 s beside it). It is a fast path only. Every chunk that Arrow could read differently from the line
parser (`corpora.parse_document_line`) is parsed again line by line, so the rows, error
rows, their ids and their messages are the line parser's:
- Arrow raised (malformed JSON, a non-string id/title/text/date, a duplicate key, a number
  out of range, a lone surrogate), or the bytes are not valid UTF-8 (Arrow does not check);
- a byte-order mark at the start of the chunk (json.loads rejects one at the start of a
  line; Arrow skips one at the start of its input);
- fewer or more rows than lines (blank lines are not records; Arrow also reads two objects
  from one line, which json.loads rejects);
- an id or a text missing, or blank as `str.strip` sees blank (those become error rows).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from xling.tasks.corpora import DATE_FIELDS, FIELDS, ENCODINGS, line_row

CHUNK_BYTES = 8 << 20
AHEAD_BYTES = 128 << 20  # parsed ahead of the caller: about one of Ray Data's blocks

# Python's whitespace (str.isspace, what str.strip() removes), wider than RE2's \s:
# tests/unit/test_document_tables.py checks it against every code point.
PY_SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(
    map(chr, range(0x2000, 0x200b))) + "\u2028\u2029\u202f\u205f\u3000"
# RE2: a character that str.strip() keeps.
NOT_BLANK = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in PY_SPACES) + "]"


def rows_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """`pa.Table.from_pylist(rows, schema=schema)` built a column at a time, which is 3x
    faster (200k documents: 0.34 s against 1.13 s): a key a row lacks is null, and keys
    outside the schema are left out, as there."""
    return pa.table({f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in schema},
                    schema=schema)


def document_tables(stream: BinaryIO, *, fmt: str, lang: str, source: str, schema: pa.Schema,
                    encoding: str = "auto", id_field: str = "docid",
                    title_field: str | None = "title", text_field: str = "text",
                    chunk_bytes: int = CHUNK_BYTES, first_byte: int = 0) -> Iterator[pa.Table]:
    """Documents tables (`schema`: doc_id, lang, title, text, source, date, error) from a
    binary stream of JSON lines in `fmt` (tasks/corpora.FIELDS, or "jsonl" with the given
    fields), the same rows in the same order as `corpora.iter_documents`. `first_byte`: where
    the stream starts in its file (a range of it), which error messages name with the line
    counted from there."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    if fmt not in FIELDS and fmt != "jsonl":
        raise ValueError(f"unknown JSON-lines document format {fmt!r}")
    fields = FIELDS.get(fmt, (id_field, title_field, text_field))
    date = DATE_FIELDS.get(fmt)
    names = [f for f in (*fields, date) if f]
    # Latin-1 lines are not JSON's UTF-8; fields named twice would be read once by Arrow.
    arrow = encoding != "latin-1" and len(set(names)) == len(names)
    options = pj.ParseOptions(explicit_schema=pa.schema([(f, pa.string()) for f in names]),
                              unexpected_field_behavior="ignore")
    kw = dict(fmt=fmt, lang=lang, source=source, id_field=id_field, title_field=title_field,
              text_field=text_field)

    def parse(chunk: memoryview, lines: int, first_line: int) -> pa.Table:
        table = _arrow_table(chunk, lines, options, fields, date, lang, source, schema) \
            if arrow else None
        if table is None:
            rows = (line_row(raw, f"{first_line + i} after byte {first_byte}" if first_byte
                             else first_line + i, encoding=encoding, **kw)
                    for i, raw in enumerate(bytes(chunk).split(b"\n")[:lines], 1))
            table = rows_table([r for r in rows if r is not None], schema)
        return table

    def tables() -> Iterator[pa.Table]:
        # The gzip stream decompresses in a thread of its own (a pyarrow stream's read
        # releases the GIL), while this one parses.
        for chunk, lines, first_line in _chunks(_ahead(_reads(stream, chunk_bytes), 1)):
            table = parse(chunk, lines, first_line)
            if table.num_rows:
                yield table

    # Read, decompressed and parsed in threads while the caller works on what came before:
    # in a partition task, Ray Data hands the tables on in blocks of ~128 MB, and each block's
    # Parquet writes take seconds, in which the parsing goes on.
    yield from _ahead(tables(), max(2, AHEAD_BYTES // chunk_bytes))


def _ahead(items: Iterator, most: int) -> Iterator:
    """`items`, produced in a thread up to `most` ahead of the caller. The thread ends with
    the caller's generator, which re-raises what `items` raised."""
    out: queue.Queue = queue.Queue(most)
    stop = threading.Event()
    done = object()

    def produce():
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        out.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            out.put((done, None))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out.put((done, e))
        finally:
            close = getattr(items, "close", None)
            if close:
                close()  # in the thread that ran it: its own threads and files end here

    worker = threading.Thread(target=produce, name="xling-document-tables", daemon=True)
    worker.start()
    try:
        while True:
            item, error = out.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()
        while worker.is_alive():
            try:
                out.get(timeout=0.1)
            except queue.Empty:
                pass
        worker.join()


def _chunks(reads: Iterator[bytes]) -> Iterator[tuple[memoryview, int, int]]:
    """(chunk, lines in it, lines before it) for the reads of a stream: each chunk ends at
    the last line break of its read, and the rest of the read starts the next one."""
    line_no, tail = 0, b""
    for data in reads:
        buf = tail + data if tail else data
        cut = buf.rfind(b"\n") + 1 if data else len(buf)
        chunk, tail = memoryview(buf)[:cut], buf[cut:]  # the chunk not copied
        if chunk:
            lines = buf.count(b"\n", 0, cut) + (not buf.endswith(b"\n", 0, cut))
            yield chunk, lines, line_no
            line_no += lines


def _reads(stream: BinaryIO, size: int) -> Iterator[bytes]:
    """`stream.read(size)` until b"", which it yields too (the end, for `_chunks`)."""
    while data := stream.read(size):
        yield data
    yield b""


def _arrow_table(chunk: memoryview, lines: int, options: pj.ParseOptions,
                 fields: tuple[str, str | None, str], date: str | None, lang: str, source: str,
                 schema: pa.Schema) -> pa.Table | None:
    """The chunk's documents table as Arrow reads it, or None where the line parser must
    decide (see the module docstring)."""
    if chunk[:3] == b"\xef\xbb\xbf":  # elsewhere Arrow, as json.loads, rejects one
        return None
    data = pa.py_buffer(chunk)
    try:
        offsets = pa.array([0, len(chunk)], pa.int64()).buffers()[1]
        pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, data]).validate(full=True)
        t = pj.read_json(pa.BufferReader(data), parse_options=options)
    except pa.ArrowException:
        return None
    if t.num_rows != lines:
        return None
    id_field, title_field, text_field = fields
    ok = pc.and_(pc.match_substring_regex(t[id_field], NOT_BLANK),
                 pc.match_substring_regex(t[text_field], NOT_BLANK))
    if t.num_rows and not pc.all(pc.fill_null(ok, False)).as_py():
        return None
    n = t.num_rows
    nulls = pa.nulls(n, pa.string())
    return pa.table({"doc_id": t[id_field], "lang": pa.repeat(lang, n),
                     "title": t[title_field] if title_field else nulls, "text": t[text_field],
                     "source": pa.repeat(source, n), "date": t[date] if date else nulls,
                     "error": nulls}, schema=schema)
