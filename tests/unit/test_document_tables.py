"""tasks/document_tables: JSON-lines corpora parsed by Arrow a chunk at a time give exactly
the rows of the line parser (tasks/corpora.iter_documents), error rows included."""

import gzip
import io
import random
import sys

import pyarrow as pa
import pytest

from helpers import ROOT, SHARED_DOCS
from xling.core.sources import DOCUMENTS
from xling.tasks import document_tables as dt
from xling.tasks.corpora import iter_documents


DEMO = ROOT / "data" / "demo"


class Trickle(io.RawIOBase):
    """A stream that hands out at most `step` bytes a read, as a network stream may."""

    def __init__(self, data: bytes, step: int):
        self.data, self.pos, self.step = data, 0, step

    def read(self, n=-1):
        out = self.data[self.pos: self.pos + min(self.step, n if n > 0 else self.step)]
        self.pos += len(out)
        return out


def both(data: bytes, *, fmt="mrtydi", encoding="auto", chunk_bytes=dt.CHUNK_BYTES, stream=None,
         **fields) -> tuple[pa.Table, pa.Table]:
    """(the Arrow path's table, the line parser's table) for the same bytes."""
    tables = list(dt.document_tables(stream or io.BytesIO(data), fmt=fmt, lang="fi", source="s",
                                     schema=DOCUMENTS, encoding=encoding,
                                     chunk_bytes=chunk_bytes, **fields))
    rows = list(iter_documents(io.BytesIO(data), fmt=fmt, lang="fi", source="s",
                               encoding=encoding, **fields))
    return pa.concat_tables([dt.rows_table([], DOCUMENTS), *tables]), dt.rows_table(rows, DOCUMENTS)


def no_line_parser(monkeypatch):
    def fail(*a, **kw):
        raise AssertionError("a clean chunk went to the line parser")
    monkeypatch.setattr(dt, "line_row", fail)


@pytest.mark.parametrize("lang", ["ar", "bn", "en", "fi", "id", "ja", "ko", "ru", "sw", "te", "th"])
def test_real_mrtydi_files_read_by_arrow_alone(lang, monkeypatch):
    data = gzip.decompress((DEMO / "mrtydi" / f"{lang}.jsonl.gz").read_bytes())
    expected = both(data)[1]
    no_line_parser(monkeypatch)
    for chunk_bytes in (4096, dt.CHUNK_BYTES):  # records straddle the chunks' reads
        got = both(data, chunk_bytes=chunk_bytes)[0]
        assert got.equals(expected) and got.num_rows == data.count(b"\n")
        assert got["error"].null_count == got.num_rows


@pytest.mark.skipif(not SHARED_DOCS.is_dir(), reason=f"{SHARED_DOCS} not found")
def test_real_shared_samples_equal_the_line_parser():
    paths = sorted(SHARED_DOCS.glob("*/corpus.jsonl.gz"))
    assert paths
    for path in paths:
        got, expected = both(gzip.decompress(path.read_bytes()), chunk_bytes=1 << 16)
        assert got.equals(expected) and got.num_rows > 0
    neu = (SHARED_DOCS.parent / "neuclir-rus" / "sample_rus_collection.jsonl").read_bytes()
    got, expected = both(neu, fmt="neuclir", stream=Trickle(neu, 101), chunk_bytes=4096)
    assert got.equals(expected) and got.num_rows == len(neu.splitlines())


BOM = b"\xef\xbb\xbf"
ODD = [  # lines Arrow reads differently from json.loads, or that are not clean records
    b'{"docid": "dup", "text": "x", "text": "y"}',  # json.loads keeps the last
    b"", b"   \r",  # blank lines are not records
    BOM + b'{"docid": "bom", "text": "x"}',  # json.loads rejects a BOM; Arrow skips one
    b'{"docid": 7, "text": "an int id"}',  # str(7) for json.loads; an error for Arrow
    b'{"docid": "t5", "title": 5, "text": "x"}',
    b'{"docid": "utf", "text": "bad \xff byte"}',  # Arrow does not check UTF-8
    b"[1, 2]", b"garbage", b'{"docid": "a"} {"docid": "b"}',  # Arrow reads two rows here
    b'{"docid": null, "text": "x"}', b'{"docid": "  ", "text": "x"}',
    b'{"docid": "notext"}', b'{"docid": "ws", "text": " \xe3\x80\x80\\u001c\\u0085"}',  # str.isspace
    b'{"docid": "sur", "text": "\\ud83d alone"}',  # an unpaired surrogate escape
    b'{"docid": "pair", "text": "\\ud83d\\ude00 \\u2028 \\u00e9"}',
    b'{"docid": "inf", "text": "x", "n": 1e999}',
]


def test_odd_lines_give_the_line_parsers_rows_wherever_the_chunks_fall():
    clean = [b'{"docid": "d%d", "title": "t", "text": "\xce\xb1 \xce\xb2 %d"}' % (i, i)
             for i in range(40)]
    rnd = random.Random(0)
    for _ in range(200):
        lines = rnd.sample(clean, 12) + rnd.sample(ODD, rnd.randint(0, 4))
        rnd.shuffle(lines)
        data = b"\n".join(lines) + rnd.choice([b"", b"\n", b"\r\n", b"\n\n"])
        got, expected = both(data, chunk_bytes=rnd.choice([16, 200, 1000, 1 << 20]))
        assert got.equals(expected), (got.to_pylist(), expected.to_pylist())
        assert both(data, encoding="latin-1", chunk_bytes=300)[0].equals(
            both(data, encoding="latin-1")[1])


def test_a_reader_that_stops_early_leaves_no_thread_behind():
    """The parse and read-ahead threads end with the generator, whether it ran out or its
    caller stopped after the first table (a Ray task cancelled, a limit reached)."""
    import threading

    data = b"".join(b'{"docid": "d%d", "title": "", "text": "w %d"}\n' % (i, i)
                    for i in range(500))
    before = threading.active_count()
    tables = dt.document_tables(io.BytesIO(data), fmt="mrtydi", lang="en", source="s",
                                schema=DOCUMENTS, chunk_bytes=256)
    assert next(tables).num_rows >= 1
    tables.close()
    assert threading.active_count() == before
    rows = sum(t.num_rows for t in dt.document_tables(
        io.BytesIO(data), fmt="mrtydi", lang="en", source="s", schema=DOCUMENTS,
        chunk_bytes=256))
    assert rows == 500 and threading.active_count() == before

    class Broken(io.BytesIO):  # a store connection lost after the first read
        reads = 0

        def read(self, n=-1):
            self.reads += 1
            if self.reads > 1:
                raise OSError("connection reset")
            return super().read(n)

    tables = dt.document_tables(Broken(data), fmt="mrtydi", lang="en", source="s",
                                schema=DOCUMENTS, chunk_bytes=256)
    with pytest.raises(OSError, match="connection reset"):
        list(tables)
    assert threading.active_count() == before


def test_each_odd_line_is_counted_as_the_line_parser_counts_it():
    data = b"\n".join(ODD) + b"\n"
    got, expected = both(data, chunk_bytes=64)
    assert got.equals(expected)
    errors = dict(zip(got["doc_id"].to_pylist(), got["error"].to_pylist()))
    assert errors["dup"] is None and errors["7"] is None and errors["pair"] is None
    assert sum("invalid UTF-8 at byte 30 of line 7" in (e or "") for e in errors.values()) == 1
    assert "unpaired surrogate" in errors["sur"] and errors["ws"] == "empty text"
    assert errors["notext"].startswith("missing or non-string text")
    # 17 lines: 2 blank, the rest one row each (the two-object line is one malformed row)
    assert got.num_rows == len(ODD) - 2


def test_field_mappings_and_neuclir_dates():
    data = b'{"pid": "1", "body": "x y", "head": "h"}\n{"pid": "2", "body": "z"}\n'
    got, expected = both(data, fmt="jsonl", id_field="pid", title_field="head",
                         text_field="body")
    assert got.equals(expected) and got["title"].to_pylist() == ["h", None]
    got, expected = both(data, fmt="jsonl", id_field="pid", title_field=None, text_field="body")
    assert got.equals(expected) and got["title"].null_count == 2
    # a field named twice: read by the line parser alone
    got, expected = both(data, fmt="jsonl", id_field="pid", title_field="body", text_field="body")
    assert got.equals(expected)
    neu = (b'{"id": "n1", "title": "", "text": "x", "time": "2022-01-01"}\n'
           b'{"id": "n2", "text": "y", "time": 1641000000}\n')
    got, expected = both(neu, fmt="neuclir")
    assert got.equals(expected) and got["date"].to_pylist() == ["2022-01-01", "1641000000"]
    assert both(b"", chunk_bytes=16)[0].num_rows == 0


def test_python_whitespace_is_every_isspace_code_point():
    assert set(dt.PY_SPACES) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}


def test_unknown_format_and_encoding_are_refused():
    with pytest.raises(ValueError, match="encoding"):
        next(dt.document_tables(io.BytesIO(b""), fmt="mrtydi", lang="fi", source="s",
                                schema=DOCUMENTS, encoding="cp1252"))
    with pytest.raises(ValueError, match="format"):
        next(dt.document_tables(io.BytesIO(b""), fmt="clef", lang="fi", source="s",
                                schema=DOCUMENTS))
