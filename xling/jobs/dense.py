"""The dense retriever actor wired to the run store: settings from config, shards from cells."""

from __future__ import annotations

from xling.jobs.config import XlingConfig
from xling.jobs.models import resolve_model
from xling.jobs.store import RunStore


def dense_kwargs(cfg: XlingConfig) -> dict:
    """Query-side BGE-M3 settings: the index's model, with the query max length."""
    d = cfg.index.dense
    return {"embedder": dict(model=resolve_model(d.model, key="index.dense.model"),
                             max_length=d.query_max_length, batch_size=d.encode_batch_size,
                             use_fp16=d.fp16, device=None if d.device == "auto" else d.device)}


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
