"""Embeddings behind a run-store cache: text in, a stored vector out, each text embedded once.

The cache lives under `{run_root}/_cache/emb/<model>/<settings hash>/<space>/`, one Parquet
file per actor call with the vectors that call embedded (`key` = sha256 of the text, `vector`
float32, `n_tokens`). A space is a namespace the stage picks (the narrow stage uses the context
language), so an actor loads only the vectors it may need. A job killed mid-shard keeps what
its actors embedded; the rerun, a new query language or a new k reads them back instead of
embedding again. The key holds only what changes a vector: the model and its output-changing
settings (max_length, fp16, dtype); batch sizes and parallelism do not.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid

import numpy as np
import pyarrow as pa

from xling.actors.embedder import Embedder, make_embedder, vector_lists, vector_matrix
from xling.core.config import stable_hash
from xling.core.store import RunStore

VECTORS = pa.schema([("key", pa.string()), ("vector", pa.list_(pa.float32())),
                     ("n_tokens", pa.int32()), ("created_at", pa.float64())])


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cache_dir(model: str, settings: dict, space: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "--", model).strip("-")
    return f"_cache/emb/{slug}/{stable_hash(settings)[:16]}/{space}"


def load_vectors(store: RunStore, rel_dir: str) -> dict[str, tuple[np.ndarray, int]]:
    """key -> (vector, n_tokens) of every vector stored under `rel_dir` (the first copy
    wins when two actors embedded the same text)."""
    files = sorted(f for f in store.list(rel_dir) if f.endswith(".parquet"))
    out: dict[str, tuple[np.ndarray, int]] = {}
    if not files:
        return out
    t = store.read_parquet(files, columns=["key", "vector", "n_tokens"])
    if not t.num_rows:
        return out
    for key, vec, n in zip(t["key"].to_pylist(), vector_matrix(t["vector"]),
                           t["n_tokens"].to_pylist()):
        out.setdefault(key, (vec, n))
    return out


class StoreEmbedder:
    """Ray Data actor: rows with `text` (and `_cell`) -> the same rows with `vector`,
    `n_tokens`, `cached` and `error`, every vector read from or added to the cache.

    `spaces[c]` is the cache namespace of cell c; `model` is what loads (a path or hub id),
    `cache_model` the name the cache is filed under (the config's, so a moved checkout keeps
    its cache); `settings` the embedder's fingerprint (what changes a vector), which keys
    the cache; `embedder` the rest of `make_embedder`'s settings. The model
    (`actors/embedder.make_embedder`: BGE-M3) loads once, in `__init__`: a cell only
    runs when it has texts to embed or rank, and a load inside the first call would stall the
    pipeline's first batch. Without a store (`store_uri=None`) nothing is cached.
    """

    def __init__(self, *, store_uri: str | None, model: str, cache_model: str, settings: dict,
                 spaces: list[str], embedder: dict):
        self.store = RunStore(store_uri) if store_uri else None
        self.model, self.cache_model = model, cache_model
        self.settings, self.spaces = settings, spaces
        self.embedder_kwargs = embedder
        self._embedder = None
        _ = self.embedder
        self.known: dict[str, dict[str, tuple[np.ndarray, int]]] = {}
        self.embedded = 0

    def _space(self, space: str) -> dict[str, tuple[np.ndarray, int]]:
        if space not in self.known:
            self.known[space] = {} if self.store is None else load_vectors(
                self.store, cache_dir(self.cache_model, self.settings, space))
        return self.known[space]

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = make_embedder(self.model, **self.embedder_kwargs)
            if self._embedder.fingerprint != self.settings:
                raise ValueError(f"vectors would be cached under settings {self.settings}, but "
                                 f"the embedder's are {self._embedder.fingerprint}")
        return self._embedder

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, list[int], list[str | None]]:
        """(vectors as a (len(texts), dim) matrix, token counts, errors) of `texts`."""
        batch = self.embedder(pa.table({"text": pa.array(texts, pa.string())}))
        return (vector_matrix(batch["dense"]),
                self.embedder.count_tokens(texts), batch["error"].to_pylist())

    def __call__(self, batch: pa.Table) -> pa.Table:
        from xling.core.cells import CELL

        # Vectors stay in one float32 matrix from the model to the output column: real BGE-M3
        # has 1,024 dimensions, and a round trip through Python lists cost ~57 ms a call of
        # 1,024 rows, which on a GPU is the order of the encode itself.
        texts = batch["text"].to_pylist()
        cells = batch[CELL].to_pylist()
        n = len(texts)
        prior = batch["error"].to_pylist() if "error" in batch.column_names else [None] * n
        matrix = np.zeros((n, self.embedder.dim), np.float32)
        has_vector = np.zeros(n, bool)
        n_tokens: list = [None] * n
        cached = [False] * n
        errors = list(prior)
        todo: dict[tuple[str, str], list[int]] = {}
        for i, (text, c) in enumerate(zip(texts, cells)):
            if errors[i] is not None:
                continue
            if text is None or not text.strip():
                errors[i] = "empty text"
                continue
            space, k = self.spaces[c], text_key(text)
            hit = self._space(space).get(k)
            if hit is not None:
                matrix[i], n_tokens[i], cached[i], has_vector[i] = hit[0], hit[1], True, True
            else:
                todo.setdefault((space, k), []).append(i)
        if todo:
            first = [idx[0] for idx in todo.values()]
            dense, ntok, errs = self._embed([texts[i] for i in first])
            new: dict[str, list[int]] = {}  # space -> rows of `dense` to add to its cache
            for j, ((space, k), idx) in enumerate(todo.items()):
                for i in idx:
                    n_tokens[i], errors[i] = ntok[j], errs[j]
                if errs[j] is None:
                    matrix[idx] = dense[j]
                    has_vector[idx] = True
                    self.known[space][k] = (dense[j], ntok[j])
                    new.setdefault(space, []).append(j)
            self.embedded += len(first)
            keys = [k for _, k in todo]
            for space, rows in new.items() if self.store is not None else ():
                self.store.write_parquet(
                    f"{cache_dir(self.cache_model, self.settings, space)}/"
                    f"{uuid.uuid4().hex}.parquet",
                    pa.table([pa.array([keys[j] for j in rows], pa.string()),
                              vector_lists(dense[rows], np.ones(len(rows), bool)),
                              pa.array([ntok[j] for j in rows], pa.int32()),
                              pa.array(np.full(len(rows), time.time()))], schema=VECTORS))
        out = batch.drop_columns([c for c in ("text", "error") if c in batch.column_names])
        return (out.append_column("vector", vector_lists(matrix, has_vector))
                .append_column("n_tokens", pa.array(n_tokens, pa.int32()))
                .append_column("cached", pa.array(cached, pa.bool_()))
                .append_column("error", pa.array(errors, pa.string())))

