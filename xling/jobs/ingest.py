"""`ingest` stage: corpora in their published formats -> documents rows in the run store.

One cell per (corpus, language). Lines are streamed with Ray Data, parsed by
`tasks/corpora.py` (a malformed line is an error row), then measured by an actor pool of
`actors.doc_stats.DocumentStats` (sentences and subword tokens per document, which size the
translation work). Later stages read documents from here instead of from the raw files.
"""

from __future__ import annotations

import functools
import glob
import os

import pyarrow as pa

from xling.actors.doc_stats import DocumentStats
from xling.jobs.config import ConfigError, CorpusSpec, XlingConfig, hashable
from xling.jobs.models import resolve_model
from xling.jobs.pools import actor_pool
from xling.jobs.runner import RID, Cell, Stage
from xling.tasks.corpora import parse_document_line

DOCUMENTS = pa.schema([("doc_id", pa.string()), ("lang", pa.string()), ("title", pa.string()),
                       ("text", pa.string()), ("source", pa.string()), ("date", pa.string()),
                       ("error", pa.string())])


def corpus_files(spec: CorpusSpec, lang: str, where: str) -> list[str]:
    pattern = spec.path.replace("{lang}", lang)
    if "://" in pattern:
        return [pattern]  # remote inputs are listed by the reader itself
    files = sorted(os.path.abspath(p) for p in glob.glob(os.path.expanduser(pattern)))
    if not files:
        raise ConfigError(f"{where}.path: no files match '{pattern}' for language '{lang}'. "
                          f"Fix the path (it may use {{lang}}) or remove '{lang}' from langs.")
    return files


def _parse(batch: pa.Table, *, spec: dict, lang: str, source: str) -> pa.Table:
    rows = []
    for line in batch["text"].to_pylist():
        row = parse_document_line(line, fmt=spec["format"], lang=lang, source=source,
                                  id_field=spec["id_field"], title_field=spec["title_field"],
                                  text_field=spec["text_field"])
        if row is not None:
            rows.append(row)
    table = pa.Table.from_pylist(rows, schema=DOCUMENTS)
    return table.append_column(RID, table["doc_id"])


class IngestStage(Stage):
    name = "ingest"
    id_column = "doc_id"

    def cells(self, cfg: XlingConfig) -> list[Cell]:
        ic = cfg.ingest
        resolve_model(ic.tokenizer, key="ingest.tokenizer")  # fail now, not on a worker
        cells = []
        for i, spec in enumerate(ic.corpora):
            for lang in spec.langs:
                files = corpus_files(spec, lang, f"ingest.corpora[{i}]")
                # The other languages of the corpus are not this cell's business: adding one
                # to `langs` must not invalidate the cells already done.
                corpus = {k: v for k, v in hashable(spec).items() if k != "langs"}
                params = {"corpus": corpus, "lang": lang, "tokenizer": ic.tokenizer}
                cells.append(Cell("ingest", {"corpus": spec.name, "lang": lang}, params,
                                  inputs=files, n_shards=ic.shards))
        return cells

    def read(self, cell: Cell, cfg: XlingConfig):
        import ray.data

        spec = next(s for s in cfg.ingest.corpora if s.name == cell.key["corpus"])
        compression = "gzip" if all(f.endswith(".gz") for f in cell.inputs) else None
        ds = ray.data.read_text(cell.inputs, arrow_open_stream_args={"compression": compression}
                                if compression else None)
        parse = functools.partial(_parse, spec=spec.model_dump(), lang=cell.key["lang"],
                                  source=spec.name)
        return ds.map_batches(parse, batch_format="pyarrow")

    def map(self, ds, cells: list[Cell], cfg: XlingConfig):
        p = cfg.ingest.parallel
        return ds.map_batches(DocumentStats, fn_constructor_kwargs={
                                  "tokenizer_path": resolve_model(cfg.ingest.tokenizer)},
                              batch_format="pyarrow", batch_size=p.batch_size,
                              compute=actor_pool(p, key="ingest.parallel"),
                              num_cpus=p.num_cpus, num_gpus=p.num_gpus)
