"""`narrow` stage: rank each long context's sentences against a query and keep the top k
(CROSS, cross-mlongrr.txt L53-55), for studies that declare narrowing (`studies.base.Narrowed`).

One cell per (study, context language):

    read      every distinct sentence of that language's contexts (both needle counts) and
              every query text, once each (the study splits the contexts: `narrow_inputs`)
    map       BGE-M3 dense vectors (actors/embedder.py) behind the run store's embedding cache
              (core/vectors.py): a sentence already embedded by any earlier cell, run or
              killed job is read back, never embedded again
    finalize  the exact ranking of every haystack's sentences for every query language (score
              descending, ties by sentence index; `select`), written to `_selections.parquet`
              in the cell: the top `max(ks)` sentence indices and scores, each needle's rank
              in the full ranking, the splitter's fingerprint

A new query language or k makes a new cell whose sentences all come from the cache; the
ranking is recomputed from the stored vectors on the driver, so it depends on neither shard
count nor batch size. The part files hold one row per embedded text (vector, token count,
cached or not); the manifest counts sentences (total and distinct), cache hits, texts over
`max_length` and the target needle's hit rate at each k.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from xling.actors.embedder import shortest_first
from xling.core.config import ConfigError, NoHash, Parallelism, Strict
from xling.core.hosts import embedder_of, shared_hosts
from xling.core.models import resolve_model
from xling.core.pools import pool_args, pool_resources
from xling.core.cells import RID, Cell, Stage
from xling.core.status import SELECTIONS, part_files
from xling.core.store import RunStore
from xling.core.vectors import StoreEmbedder, cache_dir, vector_matrix
from xling.studies.base import Narrowed
from xling.studies.registry import get_study, names_with

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `narrow:` section


class NarrowConfig(Strict):
    """`narrow`: the sentence embedder of a narrowing study (CROSS: BGE-M3, L53)."""

    model: str = Field("BAAI/bge-m3", description="hub id, local path or tiny:bge_m3")
    max_length: int = Field(512, ge=8, description="tokens per sentence (longer: truncated, "
                                                   "counted in the manifest)")
    fp16: bool = Field(False, description="half precision (CUDA only; ignored on CPU)")
    device: str = NoHash("auto", description="auto, cpu or cuda")
    encode_batch_size: int = NoHash(32, ge=1, description="texts per model forward pass")
    cache: bool = NoHash(True, description="reuse vectors stored in the run store")
    shards: int = NoHash(4, ge=1, le=100_000, description="deterministic shards per cell")
    # A call of 1,024 sentences: FlagEmbedding runs each call's first forward batch twice (an
    # out-of-memory probe) and sorts by length only within a call, so small calls pay both.
    parallel: Parallelism = NoHash(Parallelism(batch_size=1024))


def _study(cfg: XlingConfig) -> Narrowed:
    if cfg.study is None:
        raise ConfigError("narrow ranks a study's sentences: add a `study:` section (task: "
                          f"{' or '.join(names_with(Narrowed))})")
    study = get_study(cfg.study.task)
    if not isinstance(study, Narrowed):
        raise ConfigError(f"narrow: study '{cfg.study.task}' declares no narrowing; remove the "
                          "`narrow:` section or use a study that narrows "
                          f"({' or '.join(names_with(Narrowed))})")
    return study


def vector_settings(nc: NarrowConfig) -> dict:
    """What changes a stored vector (the embedding cache's key besides the text)."""
    return {"max_length": nc.max_length, "fp16": nc.fp16}


class NarrowStage(Stage):
    name = "narrow"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        study, opts, nc = _study(cfg), cfg.study.options, cfg.narrow
        out = []
        for clang in study.narrow_langs(opts):
            o = study.narrow_options(opts, clang)
            out.append(Cell("narrow", {"study": cfg.study.task, "lang": clang},
                            {"model": nc.model, "vectors": vector_settings(nc), "options": o},
                            inputs=[d["path"] for d in o["data"]], n_shards=nc.shards))
        return out

    def pool_key(self, cell: Cell, cfg: XlingConfig) -> str:
        return ""  # map reads cell params and the model entry only

    def prepare(self, cfg: XlingConfig, store: RunStore, upstream=()) -> None:
        if self.cells(cfg):
            resolve_model(cfg.narrow.model, key="narrow.model")

    def engines(self, cfg: XlingConfig) -> list:
        cells = self.cells(cfg)
        return [self.engine_of(cells, cfg)] if cells else []

    def engine_of(self, cells: list[Cell], cfg: XlingConfig):
        return embedder_of(cfg.narrow, key="narrow.model")

    def resources(self, cells: list[Cell], cfg: XlingConfig) -> dict:
        return pool_resources(cfg.narrow.parallel)

    def read(self, cell: Cell, cfg: XlingConfig):
        import ray.data

        got = _study(cfg).narrow_inputs(cfg.study.options, cell.key["lang"])
        ids = [*(f"s:{k}" for k in got["sentences"]), *got["queries"]]
        texts = [*got["sentences"].values(), *got["queries"].values()]
        kinds = ["sentence"] * len(got["sentences"]) + ["query"] * len(got["queries"])
        rows = pa.table({RID: pa.array(ids, pa.string()), "kind": pa.array(kinds, pa.string()),
                         "text": pa.array(texts, pa.string())})
        # The partition keeps this order in each shard file; the rows, and so the vectors,
        # are the same in any order.
        return ray.data.from_arrow(shortest_first(rows, "text"))

    def read_block_rows(self, cells: list[Cell], cfg: XlingConfig) -> int | None:
        return cfg.narrow.parallel.batch_size  # a call reads one run of sorted rows

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        nc = cfg.narrow
        p = nc.parallel
        spec = self.engine_of(cells, cfg)
        hosts = shared_hosts(spec)
        load = {k: v for k, v in spec.load.items() if k != "model"}
        embedder = {**load, "max_length": nc.max_length, "batch_size": nc.encode_batch_size,
                    "hosts": hosts}
        return ds.map_batches(
            StoreEmbedder, batch_format="pyarrow", batch_size=p.batch_size,
            fn_constructor_kwargs={
                "store_uri": RunStore(cfg.run_root).uri if nc.cache else None,
                "model": spec.load["model"], "cache_model": nc.model,
                "settings": vector_settings(nc),
                "spaces": [c.key["lang"] for c in cells], "embedder": embedder},
            **pool_args(p, key="narrow.parallel", hosts=hosts))

    def finalize(self, cell: Cell, cfg: XlingConfig, store: RunStore) -> dict:
        study, opts, clang = _study(cfg), cfg.study.options, cell.key["lang"]
        t = store.read_parquet(part_files(store, cell.dir),
                               columns=[RID, "kind", "vector", "n_tokens", "cached", "error"])
        ok = t.filter(pc.is_null(t["error"]))
        vectors = {rid[2:] if rid.startswith("s:") else rid: vec
                   for rid, vec in zip(ok[RID].to_pylist(), vector_matrix(ok["vector"]))}
        selections = study.select(opts, clang, vectors)
        store.write_parquet(f"{cell.dir}/{SELECTIONS}", pa.Table.from_pylist(selections))
        kinds = t["kind"].to_pylist()
        cached = t["cached"].to_pylist()
        ntok = [n for n, k in zip(t["n_tokens"].to_pylist(), kinds) if k == "sentence" and n]
        # The counts come from what read() wrote and select() made; no second pass over the
        # contexts. Every context has a row per query language, each with its sentence count.
        per_context = {s["context_id"]: s for s in selections}
        hits = study.hits_at(selections, opts.ks)
        return {"narrow": {
            "contexts": len(per_context),
            "context_errors": sum(1 for s in per_context.values() if s.get("n_sentences") is None),
            "sentences_total": sum(s.get("n_sentences") or 0 for s in per_context.values()),
            "sentences_distinct": kinds.count("sentence"),
            "sentences_embedded": sum(1 for k, c in zip(kinds, cached)
                                      if k == "sentence" and not c),
            "queries": kinds.count("query"),
            "queries_embedded": sum(1 for k, c in zip(kinds, cached) if k == "query" and not c),
            "failed": int(t.num_rows - ok.num_rows),
            "over_max_length": sum(1 for n in ntok if n > cfg.narrow.max_length),
            "sentence_tokens": {f"p{q}": float(np.percentile(ntok, q)) for q in (50, 90, 99)}
            if ntok else None,
            "selections": {"rows": len(selections),
                           "errors": sum(1 for s in selections if s["error"]),
                           "file": SELECTIONS},
            "hit_at_k": hits,
            "selection": study.selection_summary(opts, selections),
            "cache_dir": cache_dir(cfg.narrow.model, vector_settings(cfg.narrow), clang)}}
