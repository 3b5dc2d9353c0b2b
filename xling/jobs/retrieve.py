"""`retrieve` stage: first-stage runs (BM25, dense) in OG/QT/DT and BordIRLines modes, fusion.

One cell per (topic set, query language, document language, run). Queries are the runner's
input rows, sharded; an actor pool of searchers (one Lucene searcher or one BGE-M3 model +
exact FAISS search per actor, each index fetched once per node) maps them to hits rows
`query_id, lang, doc_id, rank, score, doc_lang, system`. Each finished cell also gets a TREC
run file `run.trec` next to its Parquet parts.

Modes (config: retrieve.runs[].mode):
- og: queries as they are, original documents (the document language's index);
- qt: queries translated into the document language by the translate stage;
- dt: queries as they are, documents translated into the query language (a DT index);
- qlang / en / qlang_en / rel_langs / swap (BordIRLines): per query, the language
  partitions of the collection named by its language, English, its `rel_langs` column, or
  rel_langs without its own language; hits of the partitions are merged per query.

Imported runs (retrieve.runs with `trec:`) are TREC files made elsewhere, read into cells of
their own after the searches (`ImportStage`), so that fusion, rerank and evaluate take them
as they take a search's run.

Fusions (retrieve.fusion) run after the runs they fuse, as cells of their own, through the
same runner: their input rows are queries with the hits of each fused run.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator, model_validator

from xling.core.config import ConfigError, NoHash, Parallelism, Strict, check_lang, hashable
from xling.core.hosts import embedder_of, shared_hosts
from xling.core.pools import LIGHT_CPUS, pool_args
from xling.core import upstream
from xling.core.cells import RID, Cell, StageFailed
from xling.core.runs import RunStage, export_trec
from xling.core.status import INDEX_DIR, LUCENE_MARKER, require_done
from xling.core.sources import TopicSpec, read_queries, read_translations, topic_files
from xling.core.store import RunStore

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `retrieve:` section


MODES = ("og", "qt", "dt", "qlang", "rel_langs", "qlang_en", "en", "swap")


class TopicSet(TopicSpec):
    """Queries to search, with the document languages they are searched against."""

    format: Literal["tsv", "clef", "jsonl", "neuclir"] = "tsv"
    doc_langs: list[str] = Field(
        min_length=1, description="document languages searched; `{doc_lang}` in `path` and "
                                  "`qrels` is replaced by each (CIRAL: one topic file each)")
    qrels: str | None = Field(None, description="TREC qrels file, irds:<id> or pyserini:<name>, "
                                                 "for `evaluate`; `{doc_lang}` and `{lang}` are "
                                                 "replaced")
    translations: str | None = Field(
        None, description="name of the translate.topics entry holding this set's QT "
                          "(default: this name); `{doc_lang}` is replaced")

    @field_validator("doc_langs")
    @classmethod
    def _doc_langs(cls, v: list[str]) -> list[str]:
        return [check_lang(c) for c in v]


class RunSpec(Strict):
    """One first-stage system: an engine over an indexed collection, in a cross-lingual mode.

    og: original queries against original documents; qt: queries translated into the
    document language (translate stage) against original documents; dt: original queries
    against the documents translated into the query language. BordIRLines' modes search
    language partitions per query: qlang (the query's language), en, qlang_en (both),
    rel_langs (the languages of the territory's claimants, a `rel_langs` topic column) and
    swap (rel_langs without the query's own language).
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    engine: Literal["bm25", "dense"] = "bm25"
    collection: str = Field(description="an index.collections name; `{doc_lang}` is replaced "
                                        "by each document language (CLEF: one collection per "
                                        "language, clef03-{doc_lang})")
    mode: Literal[MODES] = "og"  # type: ignore[valid-type]
    topics: list[str] | None = Field(None, description="the topic sets it searches (default: all)")
    k1: float = Field(0.9, gt=0, description="BM25 k1 (LLM-CLIR uses 0.9)")
    b: float = Field(0.4, ge=0, le=1, description="BM25 b (LLM-CLIR uses 0.4)")
    weights: dict[Literal["dense", "sparse", "colbert"], float] = Field(
        {"dense": 1.0}, description="dense engine score weights; BordIRLines' M3 hybrid is "
                                    "{dense: 1, sparse: 0.3, colbert: 1}")
    merge: Literal["score", "interleave"] = Field(
        "score", description="how per-partition hits of one query are merged (BordIRLines modes)")
    trec: str | None = Field(
        None, json_schema_extra={"hash": "if_set"},
        description="an imported first stage: a TREC run file made elsewhere (NV-Embed-v2, "
                    "E5, ...), `{lang}` and `{doc_lang}` replaced per pair; it is evaluated "
                    "(with its oracle), fused and reranked as a run of this stage; `collection` "
                    "names the documents it ranked (the rerank texts)")


    def collection_for(self, doc_lang: str) -> str:
        """The index.collections name searched for one document language."""
        return self.collection.replace("{doc_lang}", doc_lang)


class FusionSpec(Strict):
    """A run fused from other runs: RRF (k=60) or weighted score interpolation."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    runs: list[str] = Field(min_length=2)
    method: Literal["rrf", "interpolate"] = "rrf"
    k: int = Field(60, ge=0, description="RRF constant (Cormack et al. 2009)")
    depth: int = Field(1000, ge=1, description="hits of each input run taken into the fusion")
    weights: list[float] | None = Field(None, description="interpolate: one weight per run")
    normalize: Literal["minmax", "none"] = "minmax"


class SearchParallelism(Parallelism):
    """The searcher pool. Unlike other stages, its calls' size depends on the engine."""

    batch_size: int | None = NoHash(
        None, gt=0, description="queries per searcher call; default by engine: BM25 64 "
                                "(Lucene's cost is per query), dense as many as keep a call "
                                "near half a million hits (2,048 at depth 100, 524 "
                                "at depth 1,000)")


class RetrieveConfig(Strict):
    """`retrieve`: first-stage runs (BM25, dense) in OG/QT/DT or BordIRLines modes, fusions."""

    topics: list[TopicSet] = Field(min_length=1)
    runs: list[RunSpec] = Field(min_length=1)
    fusion: list[FusionSpec] = []
    depth: int = Field(100, ge=1, le=10_000, description="hits kept per query")
    shards: int = NoHash(4, ge=1, le=100_000, description="query shards per cell")
    threads: int = NoHash(1, ge=1, description="search threads per actor: Lucene's "
                                              "batch_search; FAISS and torch for dense runs")
    parallel: SearchParallelism = NoHash(SearchParallelism())

    @model_validator(mode="after")
    def _refs(self) -> "RetrieveConfig":
        names = [r.name for r in [*self.runs, *self.fusion]]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"run and fusion names must be unique: {dup}")
        known = {r.name for r in self.runs}
        sets = {t.name for t in self.topics}
        for r in self.runs:
            unknown = sorted(set(r.topics or []) - sets)
            if unknown:
                raise ValueError(f"run '{r.name}' names unknown topic sets {unknown}; "
                                 f"known: {sorted(sets)}")
        for f in self.fusion:
            missing = [r for r in f.runs if r not in known]
            if missing:
                raise ValueError(f"fusion '{f.name}' fuses unknown runs {missing}; "
                                 f"known runs: {sorted(known)}")
            if f.weights is not None and len(f.weights) != len(f.runs):
                raise ValueError(f"fusion '{f.name}': {len(f.weights)} weights for "
                                 f"{len(f.runs)} runs")
        return self


MULTI = "multi"  # doc_lang key of the BordIRLines modes: partitions are chosen per query


def partitions(mode: str, qlang: str, rel_langs: list[str] | None) -> list[str]:
    """The document languages a BordIRLines mode searches for one query."""
    rel = list(dict.fromkeys(rel_langs or []))
    chosen = {"qlang": [qlang], "en": ["en"], "qlang_en": [qlang, "en"], "rel_langs": rel,
              "swap": [l for l in rel if l != qlang]}[mode]
    return list(dict.fromkeys(chosen))


def _run(cfg: XlingConfig, name: str) -> RunSpec:
    return next(r for r in cfg.retrieve.runs if r.name == name)


def _topics(cfg: XlingConfig, name: str) -> TopicSet:
    return next(t for t in cfg.retrieve.topics if t.name == name)


def run_cells(cfg: XlingConfig) -> list[Cell]:
    rc = cfg.retrieve
    cells = []
    for ti, ts in enumerate(rc.topics):
        topics = {k: v for k, v in hashable(ts).items() if k not in ("langs", "doc_langs")}
        for ql in ts.langs:
            for run in rc.runs:
                if run.topics is not None and ts.name not in run.topics or run.trec:
                    continue
                bordir = run.mode not in ("og", "qt", "dt")
                for dl in ([MULTI] if bordir else ts.doc_langs):
                    col = next(c for c in cfg.index.collections
                               if c.name == run.collection_for(dl))
                    where = f"retrieve.topics[{ti}]"
                    if bordir:
                        indexes = {l: _index(cfg, col.name, l, l, run.engine).id
                                   for l in col.langs}
                    else:
                        text_lang = ql if run.mode == "dt" else dl
                        indexes = {dl: _index(cfg, col.name, dl, text_lang, run.engine).id}
                    params = {"topics": {**topics, "path": ts.path.replace("{doc_lang}", dl)},
                              "qlang": ql, "doc_lang": dl, "depth": rc.depth,
                              "run": hashable(run), "indexes": indexes}
                    if run.mode == "qt" and ql != dl:
                        qt = _qt_cell(cfg, ts, ql, dl)
                        params["translation"] = qt.id
                        inputs = [f"{qt.stage}/{qt.id}"]
                    else:
                        inputs = topic_files(ts, ql, dl if not bordir else "", where)
                    cells.append(Cell("retrieve", {"topics": ts.name, "qlang": ql,
                                                   "doc_lang": dl, "run": run.name},
                                      params, inputs=inputs, n_shards=rc.shards))
    return cells


def import_cells(cfg: XlingConfig) -> list[Cell]:
    """One cell per imported run (`trec:`) and pair of its topic sets: the file's hits for
    the pair's queries, cut to retrieve.depth."""
    from pathlib import Path

    rc = cfg.retrieve
    cells = []
    for ti, ts in enumerate(rc.topics):
        topics = {k: v for k, v in hashable(ts).items() if k not in ("langs", "doc_langs")}
        for ql in ts.langs:
            for i, run in enumerate(rc.runs):
                if not run.trec or run.topics is not None and ts.name not in run.topics:
                    continue
                for dl in ts.doc_langs:
                    path = run.trec.replace("{doc_lang}", dl).replace("{lang}", ql)
                    if "://" not in path and not Path(path).is_file():
                        raise ConfigError(f"retrieve.runs[{i}] ('{run.name}'): TREC run file not "
                                          f"found: {path} (for {ql}->{dl}); give the path of "
                                          "the imported run, `{lang}`/`{doc_lang}` replaced")
                    params = {"topics": {**topics, "path": ts.path.replace("{doc_lang}", dl)},
                              "qlang": ql, "doc_lang": dl, "depth": rc.depth,
                              "run": hashable(run), "trec": path}
                    cells.append(Cell("retrieve", {"topics": ts.name, "qlang": ql,
                                                   "doc_lang": dl, "run": run.name}, params,
                                      inputs=[path, *topic_files(ts, ql, dl,
                                                                 f"retrieve.topics[{ti}]")],
                                      n_shards=1))
    return cells


def first_stage_cells(cfg: XlingConfig) -> list[Cell]:
    """The cells of every retrieve.runs entry: searches and imported runs (not fusions)."""
    return [*run_cells(cfg), *import_cells(cfg)]


def _index(cfg: XlingConfig, collection: str, lang: str, text_lang: str, engine: str) -> Cell:
    """The index cell a search reads."""
    return upstream.find(cfg, "index", collection=collection, lang=lang, text_lang=text_lang,
                         engine=engine)


def _qt_cell(cfg: XlingConfig, ts: TopicSet, ql: str, dl: str) -> Cell:
    name = (ts.translations or ts.name).replace("{doc_lang}", dl)
    return upstream.translation(cfg, "query", name, ql, dl)


class RetrieveStage(RunStage):
    name = "retrieve"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        return run_cells(cfg)

    def group(self, cell: Cell) -> str:
        run = cell.params["run"]
        return f"{run['engine']}:{run['k1']}:{run['b']}:{run['merge']}"

    def engines(self, cfg: XlingConfig) -> list:
        dense = [c for c in self.cells(cfg) if _run(cfg, c.key["run"]).engine == "dense"]
        return [self.engine_of(dense, cfg)] if dense else []

    def engine_of(self, cells: list[Cell], cfg: XlingConfig):
        """The query embedder of a dense group: the index's model, shared with index (or
        narrow) when they run next to each other (core/hosts.py)."""
        if _run(cfg, cells[0].key["run"]).engine != "dense":
            return None
        return embedder_of(cfg.index.dense, key="index.dense.model",
                           parallel=cfg.retrieve.parallel)

    def read(self, cell: Cell, cfg: XlingConfig):
        store = RunStore(cfg.run_root)
        ts, run = _topics(cfg, cell.key["topics"]), _run(cfg, cell.key["run"])
        ql, dl = cell.key["qlang"], cell.key["doc_lang"]
        located = {}
        for lang, idx in cell.params["indexes"].items():
            icell = upstream.cell(cfg, "index", idx)
            manifest = require_done(store, icell, f"retrieve cell {cell.id}")
            if run.engine == "bm25":
                located[lang] = (f"{icell.dir}/{INDEX_DIR}", manifest["analyzer"])
            else:
                located[lang] = (icell.dir, "dense")
        if "translation" in cell.params:
            qt = _qt_cell(cfg, ts, ql, dl)
            ds = read_translations(store, qt, f"retrieve cell {cell.id} (mode qt)")
            ds = ds.map_batches(_translated_queries, batch_format="pyarrow")
        else:
            ds = read_queries(ts, ql, cell.inputs)
        return ds.map_batches(functools.partial(_route, mode=run.mode, doc_lang=dl,
                                                located=located), batch_format="pyarrow")

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        rc = cfg.retrieve
        run = _run(cfg, cells[0].key["run"])
        p = rc.parallel
        store = RunStore(cfg.run_root)
        hosts = None
        if run.engine == "bm25":
            cls = StoreBM25Searcher
            kwargs = dict(store_uri=store.uri, k=rc.depth, k1=run.k1, b=run.b,
                          threads=rc.threads, merge=run.merge, heap=cfg.index.bm25.heap)
        else:
            cls = StoreDenseSearcher
            spec, d = self.engine_of(cells, cfg), cfg.index.dense
            hosts = shared_hosts(spec)
            # the index's model, with the query max length
            kwargs = dict(store_uri=store.uri, k=rc.depth, merge=run.merge, threads=rc.threads,
                          embedder={**spec.load, "max_length": d.query_max_length,
                                    "batch_size": d.encode_batch_size, "role": "query",
                                    "hosts": hosts})
        systems = {i: c.key["run"] for i, c in enumerate(cells)}
        weights = {i: _run(cfg, c.key["run"]).weights for i, c in enumerate(cells)}
        if run.engine == "dense":
            ds = ds.map_batches(functools.partial(_with_weights, weights=weights),
                                batch_format="pyarrow", num_cpus=LIGHT_CPUS)
        out = ds.map_batches(cls, fn_constructor_kwargs=kwargs, batch_format="pyarrow",
                             batch_size=query_batch(cfg, run.engine),
                             **pool_args(p, key="retrieve.parallel", hosts=hosts))
        return out.map_batches(functools.partial(_label, systems=systems), batch_format="pyarrow",
                               num_cpus=LIGHT_CPUS)

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        return export_trec(store, cell)

    after_label = "imported runs and fusions"

    def after_run(self, cfg: XlingConfig, runner) -> None:
        if any(r.trec for r in cfg.retrieve.runs):
            runner.run(ImportStage(), cfg)
        if cfg.retrieve.fusion:
            runner.run(FusionStage(), cfg)

    def all_cells(self, cfg: XlingConfig) -> list[Cell]:
        return [*first_stage_cells(cfg), *fusion_cells(cfg)]


# Hits a dense call may return (~100 bytes a row): a bound on a call's output block.
DENSE_HITS_PER_CALL = 1 << 19
BM25_QUERIES_PER_CALL = 64


def query_batch(cfg: XlingConfig, engine: str) -> int:
    """Queries per searcher call: `retrieve.parallel.batch_size` when given, else by engine.

    Dense calls are large. FlagEmbedding's encode() runs each call's first forward batch
    twice (an out-of-memory probe) and sorts by length only within a call, and the exact
    search is one BLAS call per batch: at 64 queries a call the searcher ran 2.4x slower
    than at 2,048 (tiny BGE-M3, 16k queries, one thread). The depth bounds a call by its
    output, `DENSE_HITS_PER_CALL` hits, but never below one forward batch. BM25 costs the
    same per query at any call size (64 to 4,096 measured alike)."""
    rc = cfg.retrieve
    if rc.parallel.batch_size:
        return rc.parallel.batch_size
    if engine != "dense":
        return BM25_QUERIES_PER_CALL
    encode = cfg.index.dense.encode_batch_size
    return max(encode, min(2048, DENSE_HITS_PER_CALL // rc.depth))


def _translated_queries(batch: pa.Table) -> pa.Table:
    """translations rows (QT) -> queries rows in the document language."""
    return pa.table({RID: batch["id"], "query_id": batch["id"], "lang": batch["tgt_lang"],
                     "text": batch["text"], "rel_langs": pa.nulls(batch.num_rows,
                                                                  pa.list_(pa.string())),
                     "error": batch["error"]})


def _route(batch: pa.Table, *, mode: str, doc_lang: str, located: dict) -> pa.Table:
    """Each query's partitions: the index locations it searches, and their analyzers."""
    n = batch.num_rows
    langs = batch["lang"].to_pylist()
    rel = (batch["rel_langs"].to_pylist() if "rel_langs" in batch.column_names else [None] * n)
    errors = batch["error"].to_pylist()
    parts, analyzers, plangs = [], [], []
    for i in range(n):
        wanted = [doc_lang] if mode in ("og", "qt", "dt") else partitions(mode, langs[i], rel[i])
        if mode in ("rel_langs", "swap") and not rel[i] and errors[i] is None:
            errors[i] = f"mode {mode} needs the query's rel_langs (a rel_langs topic column)"
        missing = [l for l in wanted if l not in located]
        if missing and errors[i] is None:
            errors[i] = (f"no index for document language(s) {missing} in this collection "
                         f"(it has {sorted(located)})")
        have = [l for l in wanted if l in located]
        parts.append([located[l][0] for l in have])
        analyzers.append([located[l][1] for l in have])
        plangs.append(have)
    keep = [c for c in (RID, "query_id", "lang", "text") if c in batch.column_names]
    lst = pa.list_(pa.string())
    extra = [c for c in batch.column_names if c.startswith("_") and c not in keep]
    return (batch.select(keep + extra)
            .append_column("partitions", pa.array(parts, lst))
            .append_column("analyzers", pa.array(analyzers, lst))
            .append_column("partition_langs", pa.array(plangs, lst))
            .append_column("error", pa.array(errors, pa.string())))


def _with_weights(batch: pa.Table, *, weights: dict) -> pa.Table:
    for k in ("dense", "sparse", "colbert"):
        batch = batch.append_column(f"w_{k}", _per_cell(batch, {c: float(w.get(k, 0.0))
                                                                for c, w in weights.items()},
                                                        pa.float64()))
    return batch


def _label(batch: pa.Table, *, systems: dict) -> pa.Table:
    drop = [c for c in batch.column_names if c.startswith("w_")]
    return batch.drop_columns(drop).append_column("system",
                                                  _per_cell(batch, systems, pa.string()))


def _per_cell(batch: pa.Table, values: dict, type_: pa.DataType) -> pa.ChunkedArray:
    """Each row's value from its cell, looked up once per distinct cell (a dense batch's
    hits are 100 rows a query)."""
    cells = pc.unique(batch["_cell"])
    return pc.take(pa.array([values[c] for c in cells.to_pylist()], type_),
                   pc.index_in(batch["_cell"], value_set=cells))


class StoreBM25Searcher:
    """BM25Searcher whose index locations are run-store paths, fetched once per node."""

    def __init__(self, *, store_uri: str, **kw):
        from xling.actors.lucene import BM25Searcher

        store = RunStore(store_uri)
        self.inner = BM25Searcher(resolve=lambda rel: store.fetch_tree(rel, LUCENE_MARKER), **kw)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.inner(batch)


# ---------------------------------------------------------------------------------------
# fusion


def fusion_cells(cfg: XlingConfig) -> list[Cell]:
    runs = {}
    for c in first_stage_cells(cfg):
        runs.setdefault((c.key["topics"], c.key["qlang"], c.key["doc_lang"]), {})[c.key["run"]] = c
    cells = []
    for fs in cfg.retrieve.fusion:
        for (topics, ql, dl), have in runs.items():
            if not all(r in have for r in fs.runs):
                continue
            inputs = [have[r].id for r in fs.runs]
            cells.append(Cell("retrieve", {"topics": topics, "qlang": ql, "doc_lang": dl,
                                           "run": fs.name},
                              {"fusion": hashable(fs), "inputs": inputs,
                               "depth": cfg.retrieve.depth},
                              inputs=[f"retrieve/{i}" for i in inputs], n_shards=1))
    return cells


class FusionStage(RunStage):
    """Fused runs (RRF, interpolation), read from the committed cells of the runs they fuse."""

    name = "retrieve"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        return fusion_cells(cfg)

    def read(self, cell: Cell, cfg: XlingConfig):
        import ray.data

        store = RunStore(cfg.run_root)
        tables = []
        for j, rel in enumerate(cell.inputs):
            manifest = store.read_json_or_none(f"{rel}/_manifest.json")
            if manifest is None:
                raise StageFailed(f"fusion {cell.key['run']} needs {rel}, which is not done")
            t = store.read_parquet([f"{rel}/{f}" for f in manifest["files"]],
                                   columns=["query_id", "lang", "doc_id", "rank", "score", "error"])
            t = t.filter(pc.and_(pc.is_null(t["error"]), pc.is_valid(t["doc_id"])))
            tables.append(t.append_column("input", pa.array([j] * t.num_rows, pa.int32())))
        hits = pa.concat_tables(tables)
        grouped = hits.group_by("query_id").aggregate(
            [("lang", "min"), ("doc_id", "list"), ("rank", "list"), ("score", "list"),
             ("input", "list")])
        grouped = grouped.rename_columns(["query_id", "lang", "doc_ids", "ranks", "scores",
                                          "inputs"])
        grouped = grouped.append_column(RID, grouped["query_id"])
        return ray.data.from_arrow(grouped)

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        specs = {i: cfg_fusion(cfg, c.key["run"]) for i, c in enumerate(cells)}
        return ds.map_batches(functools.partial(_fuse, specs=specs, depth=cfg.retrieve.depth),
                              batch_format="pyarrow")

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        return export_trec(store, cell)


class ImportStage(RunStage):
    """Imported runs (`retrieve.runs[].trec`): a TREC file's hits for a pair's queries, cut
    to retrieve.depth, as a retrieve cell (so fusion, rerank and evaluate read it as they
    read a search's)."""

    name = "retrieve"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        return import_cells(cfg)

    def read(self, cell: Cell, cfg: XlingConfig):
        import io

        import ray.data

        from xling.core.sources import _open
        from xling.tasks.runs import read_trec_run

        ts = _topics(cfg, cell.key["topics"])
        ql = cell.key["qlang"]
        wanted = {r["query_id"] for r in read_queries(ts, ql, cell.inputs[1:]).take_all()}
        with _open(cell.params["trec"]) as f:  # local or s3://
            hits = read_trec_run(io.BytesIO(f.read()))
        # the pair's queries only: one file may hold the runs of every pair
        hits = hits.filter(pc.is_in(hits["query_id"], pa.array(sorted(wanted), pa.string())))
        if hits.num_rows == 0:
            raise StageFailed(f"imported run {cell.key['run']}: {cell.params['trec']} has no "
                              f"hits for the {len(wanted)} queries of {cell.id}")
        # each query's hits by rank, stable: the file's order among equal ranks
        hits = hits.take(pc.sort_indices(hits, sort_keys=[("query_id", "ascending"),
                                                          ("rank", "ascending")]))
        grouped = hits.group_by("query_id", use_threads=False).aggregate(
            [("doc_id", "list"), ("rank", "list"), ("score", "list")])
        grouped = grouped.rename_columns(["query_id", "doc_ids", "ranks", "scores"])
        return ray.data.from_arrow(grouped.append_column(RID, grouped["query_id"]))

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        info = {i: (c.key["run"], c.key["qlang"], c.key["doc_lang"]) for i, c in enumerate(cells)}
        return ds.map_batches(functools.partial(_imported, info=info, depth=cfg.retrieve.depth),
                              batch_format="pyarrow")

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        return export_trec(store, cell)


def _imported(batch: pa.Table, *, info: dict, depth: int) -> pa.Table:
    """Query rows of an imported run -> hits rows: each query's `depth` best-ranked hits,
    with the file's own ranks and scores (fusion reads the ranks as pyserini does)."""
    cols: dict[str, list] = {c: [] for c in (RID, "_cell", "_shard", "query_id", "doc_id",
                                             "rank", "score")}
    langs, doc_langs, systems = [], [], []
    for row in batch.to_pylist():
        system, ql, dl = info[row["_cell"]]
        for d, r, s in list(zip(row["doc_ids"], row["ranks"], row["scores"]))[:depth]:
            for c, v in ((RID, row[RID]), ("_cell", row["_cell"]), ("_shard", row["_shard"]),
                         ("query_id", row["query_id"]), ("doc_id", d), ("rank", r),
                         ("score", float(s))):
                cols[c].append(v)
            langs.append(ql)
            doc_langs.append(dl)
            systems.append(system)
    n = len(cols[RID])
    return pa.table({RID: pa.array(cols[RID], pa.string()),
                     "_cell": pa.array(cols["_cell"], pa.int64()),
                     "_shard": pa.array(cols["_shard"], pa.int64()),
                     "query_id": pa.array(cols["query_id"], pa.string()),
                     "lang": pa.array(langs, pa.string()),
                     "doc_id": pa.array(cols["doc_id"], pa.string()),
                     "rank": pa.array(cols["rank"], pa.int32()),
                     "score": pa.array(cols["score"], pa.float64()),
                     "doc_lang": pa.array(doc_langs, pa.string()),
                     "system": pa.array(systems, pa.string()),
                     "error": pa.nulls(n, pa.string())})


def cfg_fusion(cfg: XlingConfig, name: str) -> dict:
    return next(f for f in cfg.retrieve.fusion if f.name == name).model_dump()


def _fuse(batch: pa.Table, *, specs: dict, depth: int) -> pa.Table:
    from xling.tasks.fusion import interpolate, rrf

    out = []
    for row in batch.to_pylist():
        spec = specs[row["_cell"]]
        runs = []
        for j in range(len(spec["runs"])):
            idx = [i for i, inp in enumerate(row["inputs"]) if inp == j]
            runs.append(pa.table({"query_id": [row["query_id"]] * len(idx),
                                  "doc_id": [row["doc_ids"][i] for i in idx],
                                  "rank": pa.array([row["ranks"][i] for i in idx], pa.int32()),
                                  "score": pa.array([row["scores"][i] for i in idx], pa.float64()),
                                  "system": [spec["runs"][j]] * len(idx)}))
        if spec["method"] == "rrf":
            fused = rrf(runs, k=spec["k"], depth=spec["depth"], top=depth, system=spec["name"])
        else:
            weights = spec["weights"] or [1.0] * len(runs)
            fused = interpolate(runs, weights, normalize=spec["normalize"], depth=spec["depth"],
                                top=depth, system=spec["name"])
        n = fused.num_rows
        out.append(pa.table({
            RID: [row[RID]] * n, "_cell": pa.array([row["_cell"]] * n, pa.int64()),
            "_shard": pa.array([row["_shard"]] * n, pa.int64()),
            "query_id": fused["query_id"], "lang": [row["lang"]] * n, "doc_id": fused["doc_id"],
            "rank": pc.cast(fused["rank"], pa.int32()), "score": fused["score"],
            "doc_lang": pa.nulls(n, pa.string()), "system": fused["system"],
            "error": pa.nulls(n, pa.string())}))
    return pa.concat_tables(out) if out else batch.slice(0, 0)


# ---------------------------------------------------------------------------------------
# the dense retriever actor wired to the run store: settings from config, shards from cells


class StoreDenseSearcher:
    """DenseRetriever whose index locations are dense index cells in the run store."""

    def __init__(self, *, store_uri: str, **kw):
        from xling.actors.dense_retriever import DenseRetriever

        store = RunStore(store_uri)

        def load(cell_dir: str):
            manifest = store.read_json(f"{cell_dir}/_manifest.json")
            return [store.read_parquet(f"{cell_dir}/{f}") for f in manifest["files"]]

        self.inner = DenseRetriever(load=load, **kw)

    def __call__(self, batch):
        return self.inner(batch)
