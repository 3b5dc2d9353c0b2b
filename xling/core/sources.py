"""Corpus and topic files -> Ray Datasets of documents / queries rows, streamed per file.

Paths are local globs or `s3://bucket/prefix/glob` (reached with the same AWS_* variables as
the run store). Each file is one read task that streams it through the parsers in
`tasks/corpora.py` and `tasks/topics.py` and yields blocks of `BLOCK_ROWS` rows, so a file
of any size is never held in memory and a corpus of many files is read in parallel.
`.gz` files are decompressed on the fly. An uncompressed JSON-lines corpus file is read in
ranges of `RANGE_BYTES` (cut at line breaks), a task each: the partition's object-store
use is then what its tasks hold at once, not the size of the largest file (one task per
150 MB file, six at once, held about the whole corpus at 1 M documents).
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import os
import re
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator, model_validator

from xling.core.config import ConfigError, Strict, check_lang
from xling.core.memo import remember
from xling.core.cells import RID, Cell, Source
from xling.core.store import RunStore
from xling.studies.registry import DOCUMENT_FORMATS, get_study

# ---------------------------------------------------------------------------------------
# config: the input file sets every stage reads (corpora, topics)


ENCODING = Literal["auto", "utf-8", "latin-1"]


class _Source(Strict):
    """What every input file set has: a name, and the languages it is written in."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    langs: list[str] = Field(min_length=1, description="the languages the files are written in")

    @field_validator("langs")
    @classmethod
    def _known_langs(cls, v: list[str]) -> list[str]:
        return [check_lang(c) for c in v]


class CorpusSpec(_Source):
    """A document collection in one of the published formats (see tasks/corpora.py)."""

    format: Literal[("mrtydi", "miracl", "ciral", "neuclir", "jsonl", "parquet",  # type: ignore
                     "clef", *DOCUMENT_FORMATS)] = "mrtydi"
    path: str = Field(description="file or glob (local or s3://); `{lang}` is replaced by each "
                                  "language code; .gz files are read compressed")
    # Only for format=jsonl / parquet: which fields hold id / title / text.
    id_field: str = "docid"
    title_field: str | None = "title"
    text_field: str = "text"
    encoding: ENCODING = Field("auto", description="auto: UTF-8, and for clef Latin-1 where a "
                                                   "<DOC> is not valid UTF-8")


class TopicSpec(_Source):
    """Topics (queries): TREC `qid<TAB>text` TSV, CLEF `<top>` SGML or NeuCLIR's topic JSONL
    (tasks/topics.py); or a name, `irds:<ir_datasets id>` or `pyserini:<topics name>`, that
    is fetched into the run store as TSV when the config is validated (core/datasets.py)."""

    format: Literal["tsv", "clef", "neuclir"] = "tsv"
    path: str = Field(description="file or glob (local or s3://), irds:<id> or pyserini:<name>; "
                                  "`{lang}` is replaced")
    fields: list[str] = Field(
        ["title", "desc"],
        description="the fields that make the query. clef: title, desc, narr (default title + "
                    "desc); neuclir and irds: ir_datasets' names, e.g. title (English), "
                    "ht_title, mt_title, description (default: title for en, else ht_title); "
                    "pyserini: the topic's keys (default title)")
    encoding: ENCODING = "auto"

    @model_validator(mode="after")
    def _fields(self) -> "TopicSpec":
        from xling.tasks.topics import NEUCLIR_FIELDS, QUERY_FIELDS

        given = "fields" in self.model_fields_set
        known = {"clef": QUERY_FIELDS, "neuclir": NEUCLIR_FIELDS}.get(self.format)
        if known is None:
            if given and self.fields != ["title", "desc"]:  # the default: a dumped config
                raise ValueError(f"fields apply to clef and neuclir topics (and irds:/pyserini: "
                                 f"names), not format {self.format}: remove `fields:`")
        elif self.format == "neuclir" and (not given or not self.fields):
            object.__setattr__(self, "fields", [])  # per language: title (en), else ht_title
        elif not self.fields:
            raise ValueError(f"fields: name at least one of {list(known)}")
        elif bad := [f for f in self.fields if f not in known]:
            raise ValueError(f"fields {bad} are not {self.format} topic fields; choose from "
                             f"{list(known)}")
        return self



BLOCK_ROWS = 1024

DOCUMENTS = pa.schema([("doc_id", pa.string()), ("lang", pa.string()), ("title", pa.string()),
                       ("text", pa.string()), ("source", pa.string()), ("date", pa.string()),
                       ("error", pa.string())])
QUERIES = pa.schema([("query_id", pa.string()), ("lang", pa.string()), ("text", pa.string()),
                     ("title", pa.string()), ("desc", pa.string()), ("narr", pa.string()),
                     ("rel_langs", pa.list_(pa.string())), ("source", pa.string()),
                     ("error", pa.string())])


def _split_glob(uri: str) -> tuple[str, str]:
    """s3://b/dir/x/*.gz -> ("s3://b/dir/x", "*.gz"): the fixed prefix and the pattern."""
    m = re.search(r"[*?\[{]", uri)
    if not m:
        return uri.rsplit("/", 1)[0], uri.rsplit("/", 1)[1]
    head = uri[: m.start()].rsplit("/", 1)[0]
    return head, uri[len(head) + 1:]


def list_files(pattern: str, *, where: str, lang: str | None = None) -> list[str]:
    """Files matching a local glob or an s3:// glob, sorted. None is a ConfigError. Within a
    command (core/memo.run_scope) each pattern is matched once, and each S3 prefix listed
    once."""
    return list(remember(("list", pattern), lambda: _list_files(pattern, where, lang)))


def _list_files(pattern: str, where: str, lang: str | None) -> list[str]:
    if pattern.startswith("s3://"):
        head, pat = _split_glob(pattern)
        try:
            # one listing per prefix and command: the patterns under one prefix (a topics
            # folder's sets, say) filter the same listing
            listed = remember(("list-prefix", head), lambda: RunStore(head).list(""))
            found = sorted(f"{head}/{rel}" for rel in listed if fnmatch.fnmatchcase(rel, pat))
        except Exception as e:  # noqa: BLE001 - the store's own error says what to fix
            raise ConfigError(f"{where}.path: cannot list {head}: {e}") from None
    elif "://" in pattern:
        raise ConfigError(f"{where}.path: only local paths and s3:// are supported, got {pattern}")
    else:
        found = sorted(os.path.abspath(p) for p in glob.glob(os.path.expanduser(pattern),
                                                              recursive=True)
                       if os.path.isfile(p))
    if not found:
        hint = f" for language '{lang}'. Fix the path (it may use {{lang}}) or remove '{lang}' " \
               f"from langs." if lang else ". Fix the path."
        raise ConfigError(f"{where}.path: no files match '{pattern}'{hint}")
    return found


def spec_files(spec: CorpusSpec | TopicSpec, lang: str, where: str) -> list[str]:
    return list_files(spec.path.replace("{lang}", lang), where=where, lang=lang)


def topic_files(spec: TopicSpec, lang: str, doc_lang: str, where: str) -> list[str]:
    """The topic files of `spec` in `lang` for one document language (`{doc_lang}` in the
    path: CIRAL has a topic file per document language)."""
    spec = spec.model_copy(update={"path": spec.path.replace("{doc_lang}", doc_lang)})
    return spec_files(spec, lang, where)


def _open(path: str, *, random_access: bool = False):
    """A binary stream (or seekable file) for a local path or s3:// URI."""
    if path.startswith("s3://"):
        head, name = path.rsplit("/", 1)
        store = RunStore(head)
        fs, full = store.fs, store.fs_path(name)
    else:
        import pyarrow.fs as pafs

        fs, full = pafs.LocalFileSystem(), path
    if random_access:
        return fs.open_input_file(full)
    return fs.open_input_stream(full, compression="gzip" if path.endswith(".gz") else None)


def _blocks(rows, schema: pa.Schema):
    from xling.tasks.document_tables import rows_table

    buf = []
    for row in rows:
        buf.append(row)
        if len(buf) >= BLOCK_ROWS:
            yield rows_table(buf, schema)
            buf = []
    if buf:
        yield rows_table(buf, schema)


def _read_document_files(batch: pa.Table, *, spec: dict, lang: str):
    from xling.tasks.corpora import iter_documents, iter_parquet_documents
    from xling.tasks.document_tables import document_tables

    fields = {k: spec[k] for k in ("id_field", "title_field", "text_field")}
    fmt = spec["format"]
    parquet = fmt == "parquet"
    ranges = batch["range"].to_pylist() if "range" in batch.column_names else None
    for i, path in enumerate(batch["path"].to_pylist()):
        if ranges and ranges[i]:
            start, end = ranges[i]
            with _open(path, random_access=True) as f:
                yield from document_tables(_LineRange(f, start, end), fmt=fmt, lang=lang,
                                           source=spec["name"], schema=DOCUMENTS,
                                           encoding=spec["encoding"], first_byte=start,
                                           **fields)
            continue
        with _open(path, random_access=parquet) as f:
            if parquet:
                tables = _blocks(iter_parquet_documents(f, lang=lang, source_name=spec["name"],
                                                        **fields), DOCUMENTS)
            elif fmt in DOCUMENT_FORMATS:  # a study's own layout (XRAG's articles)
                tables = _blocks(get_study(DOCUMENT_FORMATS[fmt]).read_documents(
                    fmt, f, lang=lang, source=spec["name"]), DOCUMENTS)
            elif fmt == "clef":
                tables = _blocks(iter_documents(f, fmt=fmt, lang=lang, source=spec["name"],
                                                encoding=spec["encoding"]), DOCUMENTS)
            else:  # JSON lines: parsed by Arrow a chunk at a time
                tables = document_tables(f, fmt=fmt, lang=lang, source=spec["name"],
                                         schema=DOCUMENTS, encoding=spec["encoding"], **fields)
            yield from tables


def _read_topic_files(batch: pa.Table, *, spec: dict, lang: str):
    from xling.tasks.topics import (iter_clef_topics, iter_jsonl_topics, iter_neuclir_topics,
                                    iter_tsv_topics)

    for path in batch["path"].to_pylist():
        with _open(path) as f:
            if spec["format"] == "clef":
                rows = iter_clef_topics(f, lang=lang, fields=tuple(spec["fields"]),
                                        encoding=spec["encoding"])
            elif spec["format"] == "neuclir":
                rows = iter_neuclir_topics(f, lang=lang, fields=tuple(spec["fields"]))
            elif spec["format"] == "jsonl":
                rows = iter_jsonl_topics(f, lang=lang)
            else:
                rows = iter_tsv_topics(f, lang=lang)
            yield from _blocks(({**r, "source": spec["name"]} for r in rows), QUERIES)


def _file_dataset(files: list[str], ranges: bool = False):
    """One read task per item of `_read_items`."""
    import ray.data

    items = _read_items(files, ranges)
    return ray.data.from_items(items, override_num_blocks=len(items))


def _read_items(files: list[str], ranges: bool) -> list[dict]:
    """A read task's input per file; with `ranges`, one per `RANGE_BYTES` of each
    uncompressed file (`range`: [start, end) in bytes, or null for the whole file)."""
    items = []
    for f in files:
        size = _size(f) if ranges and not f.endswith(".gz") else 0
        if size > RANGE_BYTES:
            items += [{"path": f, "range": [a, min(a + RANGE_BYTES, size)]}
                      for a in range(0, size, RANGE_BYTES)]
        else:
            items.append({"path": f, "range": None} if ranges else {"path": f})
    return items


RANGE_BYTES = 32 << 20


def _size(path: str) -> int:
    if path.startswith("s3://"):
        head, name = path.rsplit("/", 1)
        store = RunStore(head)
        return store.fs.get_file_info(store.fs_path(name)).size
    return os.path.getsize(path)


class _LineRange:
    """The lines of a seekable file that start in bytes [start, end): a line that starts
    before `start` belongs to the range before, one that crosses `end` to this one, so the
    ranges of a file hold each line once. A binary stream (`read(size)`)."""

    def __init__(self, f, start: int, end: int):
        self.f, self.end = f, end
        self.done = False
        if start > 0:
            f.seek(start - 1)
            while True:  # to the first line break at or after start - 1
                data = f.read(1 << 16)
                cut = data.find(b"\n")
                if cut >= 0:
                    start += cut
                    break
                if not data:  # no line starts after start - 1
                    self.done = True
                    break
                start += len(data)
            self.done = self.done or start >= end
        self.pos = start
        f.seek(start)

    def read(self, size: int = -1) -> bytes:
        if self.done:
            return b""
        want = self.end - self.pos if size < 0 else min(size, max(self.end - self.pos, 0))
        data = self.f.read(want) if want > 0 else b""
        self.pos += len(data)
        if self.pos >= self.end or not data:  # finish the line that crosses the end
            self.done = True
            tail = b""
            if not data or not data.endswith(b"\n"):
                while chunk := self.f.read(1 << 16):
                    cut = chunk.find(b"\n")
                    if cut >= 0:
                        tail += chunk[:cut + 1]
                        break
                    tail += chunk
            data += tail
        return data


# The fields of a source spec that decide which rows are read (not its name, languages or
# targets): equal values mean equal rows, so stages and cells share one partition.
_READ_FIELDS = ("format", "path", "id_field", "title_field", "text_field", "encoding", "fields")


def documents_source(spec: CorpusSpec, lang: str, files: list[str], adapt=None) -> Source:
    """The documents rows of `spec` in `lang`, as a shareable partition source."""
    key = {"documents": {k: getattr(spec, k) for k in _READ_FIELDS if hasattr(spec, k)},
           "lang": lang, "files": sorted(files)}
    return Source(key, functools.partial(read_documents, spec, lang, files), adapt=adapt,
                  read_items=functools.partial(_read_items, list(files), _ranged(spec)),
                  read_files=_document_reader(spec, lang))


def queries_source(spec: TopicSpec, lang: str, files: list[str], adapt=None) -> Source:
    """The queries rows of `spec` in `lang`, as a shareable partition source."""
    key = {"queries": {k: getattr(spec, k) for k in _READ_FIELDS if hasattr(spec, k)},
           "lang": lang, "files": sorted(files)}
    return Source(key, functools.partial(read_queries, spec, lang, files), adapt=adapt,
                  read_items=functools.partial(_read_items, list(files), False),
                  read_files=_query_reader(spec, lang))


def _ranged(spec: CorpusSpec) -> bool:
    """JSON lines (uncompressed) are read in byte ranges; the other formats file by file."""
    return spec.format not in ("parquet", "clef", *DOCUMENT_FORMATS)


def _document_reader(spec: CorpusSpec, lang: str):
    """A batch of paths -> documents rows (DOCUMENTS schema + `_rid` = doc_id)."""
    return functools.partial(_with_rids, read=functools.partial(
        _read_document_files, spec=spec.model_dump(), lang=lang), column="doc_id")


def _query_reader(spec: TopicSpec, lang: str):
    """A batch of paths -> queries rows (QUERIES schema + `_rid` = query_id)."""
    return functools.partial(_with_rids, read=functools.partial(
        _read_topic_files, spec=spec.model_dump(), lang=lang), column="query_id")


def _with_rids(batch: pa.Table, *, read, column: str):
    for t in read(batch):
        yield _with_rid(t, column=column)


def read_documents(spec: CorpusSpec, lang: str, files: list[str]):
    """A Ray Dataset of documents rows (DOCUMENTS schema + `_rid` = doc_id)."""
    return _file_dataset(files, ranges=_ranged(spec)).map_batches(
        _document_reader(spec, lang), batch_size=1, batch_format="pyarrow")


def read_queries(spec: TopicSpec, lang: str, files: list[str]):
    """A Ray Dataset of queries rows (QUERIES schema + `_rid` = query_id)."""
    return _file_dataset(files).map_batches(_query_reader(spec, lang), batch_size=1,
                                            batch_format="pyarrow")


def _with_rid(batch: pa.Table, *, column: str) -> pa.Table:
    return batch.append_column(RID, batch[column])


# ---------------------------------------------------------------------------------------
# the translate stage's DT, as documents rows; documents rows as passage texts


def translations_as_documents(batch: pa.Table) -> pa.Table:
    """translations rows (DT) -> documents rows in the target language."""
    n = batch.num_rows
    title = batch["title"] if "title" in batch.column_names else pa.nulls(n, pa.string())
    return pa.table({RID: batch["id"], "doc_id": batch["id"], "lang": batch["tgt_lang"],
                     "title": title, "text": batch["text"], "error": batch["error"]})


def read_translations(store: RunStore, cell: Cell, needed_by: str):
    """A Ray Dataset of a committed translate cell's rows (`_rid` = id)."""
    import ray.data

    from xling.core.status import require_done

    manifest = require_done(store, cell, needed_by)
    files = [store.fs_path(f"{cell.dir}/{f}") for f in manifest["files"]]
    return ray.data.read_parquet(files, filesystem=store.fs, shuffle=None).map_batches(
        functools.partial(_with_rid, column="id"), batch_format="pyarrow")


def passage_texts(docs: list, wanted: set[str]) -> dict[str, str]:
    """doc_id -> passage text (title, newline, text, as indexed) of the wanted ids, from Ray
    Datasets of documents rows."""
    out = {}
    for ds in docs:
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=4096):
            keep = batch.filter(pc.is_in(batch["doc_id"], pa.array(sorted(wanted), pa.string())))
            for d, title, text in zip(keep["doc_id"].to_pylist(), keep["title"].to_pylist(),
                                      keep["text"].to_pylist()):
                if text is not None:
                    out[d] = f"{title}\n{text}" if title else text
    return out
