"""`ingest` stage: corpora in their published formats -> documents rows in the run store.

One cell per (corpus, language). Files are streamed by `core/sources.py` through the parsers
of `tasks/corpora.py` (JSON lines, Parquet, CLEF SGML; a malformed record is an error row),
then measured by an actor pool of `actors.doc_stats.DocumentStats` (sentences and subword
tokens per document, which size the translation work). Later stages read documents from
here instead of from the raw files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from xling.actors.doc_stats import DocumentStats
from xling.core.config import NoHash, Parallelism, Strict, hashable
from xling.core.models import resolve_model
from xling.core.pools import actor_pool, pool_resources
from xling.core.cells import Cell, Source, Stage
from xling.core.sources import CorpusSpec, documents_source, spec_files

if TYPE_CHECKING:
    from xling.config import XlingConfig


# ---------------------------------------------------------------------------------------
# config: the `ingest:` section


class IngestConfig(Strict):
    """`ingest`: read corpora into the documents schema, segmented and token-counted."""

    corpora: list[CorpusSpec] = Field(min_length=1)
    tokenizer: str = Field(
        "tiny:nllb_hf",
        description="tokenizer for n_tokens: a hub id, a local path, or tiny:<name>",
    )
    shards: int = NoHash(8, ge=1, le=100_000, description="deterministic shards per cell")
    # 512 documents a call, read in blocks of four calls: at 64 (Parallelism's generic
    # default) the partition made 781 blocks of 256 rows for 200k documents, and the stage
    # ran at 0.32 of its bare engine against 0.43-0.53 at 512 (benchmarks/ingest.py). Half a
    # CPU an actor, as for index: the pool's actors start beside the reads on a small machine.
    parallel: Parallelism = NoHash(Parallelism(batch_size=512, num_cpus=0.5))




class IngestStage(Stage):
    name = "ingest"
    id_column = "doc_id"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        ic = cfg.ingest
        resolve_model(ic.tokenizer, key="ingest.tokenizer")  # fail now, not on a worker
        cells = []
        for i, spec in enumerate(ic.corpora):
            for lang in spec.langs:
                files = spec_files(spec, lang, f"ingest.corpora[{i}]")
                # The other languages of the corpus are not this cell's business: adding one
                # to `langs` must not invalidate the cells already done.
                corpus = {k: v for k, v in hashable(spec).items() if k != "langs"}
                params = {"corpus": corpus, "lang": lang, "tokenizer": ic.tokenizer}
                cells.append(Cell("ingest", {"corpus": spec.name, "lang": lang}, params,
                                  inputs=files, n_shards=ic.shards))
        return cells

    def read(self, cell: Cell, cfg: XlingConfig):
        return self.source(cell, cfg).read()

    def source(self, cell: Cell, cfg: XlingConfig) -> Source:
        spec = next(s for s in cfg.ingest.corpora if s.name == cell.key["corpus"])
        return documents_source(spec, cell.key["lang"], cell.inputs)

    def resources(self, cells: list[Cell], cfg: XlingConfig) -> dict:
        return pool_resources(cfg.ingest.parallel)

    def read_block_rows(self, cells: list[Cell], cfg: XlingConfig) -> int | None:
        # A CPU pool: 16 of its batches a block (~0.7 s of work). Each block is also a task
        # of the commit writes after the pool; 4 batches a block (112 blocks for 200k
        # documents) ran no faster.
        return 16 * cfg.ingest.parallel.batch_size

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        p = cfg.ingest.parallel
        return ds.map_batches(DocumentStats, fn_constructor_kwargs={
                                  "tokenizer_path": resolve_model(cfg.ingest.tokenizer)},
                              batch_format="pyarrow", batch_size=p.batch_size,
                              compute=actor_pool(p, key="ingest.parallel"),
                              num_cpus=p.num_cpus, num_gpus=p.num_gpus)
