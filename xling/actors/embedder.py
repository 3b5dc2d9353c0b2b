"""Text embedders: the `Embedder` protocol the index, retrieve and narrow stages use, the
registry of implementations and `make_embedder`, the one place an embedder is built; the row
handling they share (`RowEmbedder`); and BGE-M3 (`M3Embedder`, FlagEmbedding's
`BGEM3FlagModel`). The LLM-CLIR paper's other first stages (E5, mGTE, RepLLaMA,
NV-Embed-v2) are in actors/hf_embedders.py.

Each call says whether its texts are queries or passages (`role`, a per-call setting: index
embeds passages, retrieve queries), for the models that prefix or pool them differently.

An embedder is loaded once per actor, or once per run for stages next to each other that
ask for the same model (`EmbedderHost`, `HostedEmbedder`; core/hosts.py). `__call__(batch)
-> batch` keeps every input column and row, in order, and adds the representations asked
for. BGE-M3's:

- `dense`: fixed_size_list<float32>[dim], L2-normalised CLS vector (as BGE-M3 returns it);
- `sparse_ids` list<int32> + `sparse_weights` list<float32>: BGE-M3's lexical weights, one
  entry per distinct token id (the max over its occurrences, special tokens left out, only
  weights > 0), sorted by token id;
- `colbert` list<float32> (the [colbert_len, dim] matrix, row-major) + `colbert_len` int32:
  one normalised vector per token after [CLS] (the final </s> included, as FlagEmbedding
  does);
- `error` string: null when the row was embedded.

A row whose text is null, empty or whitespace gets null vectors and the error "empty text"
(FlagEmbedding would embed "<s></s>": a dense vector, no lexical weights, one ColBERT
vector for </s>; a document of nothing that still scores against every query). A row
that arrives with an error keeps it and is not embedded. A batch the model fails on is retried
row by row, so one bad row becomes an error row instead of failing the Ray task.
"""

from __future__ import annotations

import copy
import importlib
import logging
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from xling.actors.enginecpu import engine_cpu

log = logging.getLogger(__name__)

EMPTY = "empty text"


@runtime_checkable
class Embedder(Protocol):
    """What the index, retrieve and narrow stages ask of a text embedder."""

    info: dict  # what actually runs (model, dim, device, dtype, ...), for manifests and logs

    @property
    def dim(self) -> int:
        """Length of a dense vector."""

    @property
    def fingerprint(self) -> dict:
        """The settings, as asked for, that change a vector (not batch sizes or devices):
        what a vector cache is keyed by besides the model and the text."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        """The batch with `dense` (fixed_size_list<float32>[dim]) and `error` added, every
        row and input column kept (see the module doc)."""

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Each text's length in the model's tokens, special tokens included, untruncated."""

    def with_settings(self, **per_call) -> "Embedder":
        """The same loaded model with other per-call settings (`PER_CALL` of its class: what
        changes each encode, not the load), without a second load: what lets stages that
        ask for different lengths or outputs share one loaded model (`EmbedderHost`)."""


@runtime_checkable
class MultiVector(Embedder, Protocol):
    """An embedder with lexical (sparse) and per-token (ColBERT) outputs besides the dense
    vector, for the hybrid search of actors/dense_search.py."""

    def with_outputs(self, *, dense: bool | None = None, sparse: bool | None = None,
                     colbert: bool | None = None) -> "MultiVector":
        """The same loaded model with other outputs switched on or off (no second load)."""


# name -> "module:Class" of an Embedder whose constructor takes (model, **settings).
EMBEDDERS = {
    "bge-m3": "xling.actors.embedder:M3Embedder",
    "e5": "xling.actors.hf_embedders:E5Embedder",
    "repllama": "xling.actors.hf_embedders:RepLlamaEmbedder",
    "mgte": "xling.actors.hf_embedders:MGTEEmbedder",
    "nv-embed": "xling.actors.hf_embedders:NVEmbedEmbedder",
}
DEFAULT = "bge-m3"


def embedder_class(kind: str) -> type:
    if kind not in EMBEDDERS:
        raise ValueError(f"unknown embedder {kind!r}; use one of: {', '.join(EMBEDDERS)}")
    module, _, name = EMBEDDERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def make_embedder(model: str, *, kind: str = DEFAULT, hosts: list | None = None,
                  **settings) -> Embedder:
    """The embedder `kind` loaded from `model` (a local path or hub id), with its settings
    (BGE-M3: max_length, batch_size, use_fp16, dense, sparse, colbert, text_column, device).

    With `hosts` (`EmbedderHost` actors that already hold the model, core/hosts.py), nothing
    loads here: the embedder sends its batches to them, with its per-call settings."""
    if hosts:
        per_call = {k: v for k, v in settings.items() if k in embedder_class(kind).PER_CALL}
        return HostedEmbedder(hosts, per_call)
    return embedder_class(kind)(model, **settings)


class _Settings:
    """What M3Embedder and HostedEmbedder answer alike from `info`, `_fingerprint` and
    `with_settings`."""

    info: dict
    _fingerprint: dict

    @property
    def dim(self) -> int:
        return self.info["dim"]

    @property
    def fingerprint(self) -> dict:
        """The settings as asked for (fp16 off the GPU still means the setting)."""
        return dict(self._fingerprint)

    def with_settings(self, **per_call):
        raise NotImplementedError

    def with_outputs(self, *, dense: bool | None = None, sparse: bool | None = None,
                     colbert: bool | None = None):
        """The same loaded model with other outputs switched on or off (no second load)."""
        asked = {"dense": dense, "sparse": sparse, "colbert": colbert}
        return self.with_settings(**{k: v for k, v in asked.items() if v is not None})


class EmbedderHost:
    """A Ray actor that holds one loaded embedder for several stages of a run (index,
    retrieve, narrow; core/hosts.py): each call names its per-call settings."""

    def __init__(self, settings: dict):
        self.embedder = make_embedder(**settings)
        self.views: dict[str, Embedder] = {}

    def _view(self, per_call: dict) -> Embedder:
        key = repr(sorted(per_call.items()))
        if key not in self.views:
            self.views[key] = self.embedder.with_settings(**per_call)
        return self.views[key]

    def ready(self) -> bool:
        """Answers once `__init__` is done: the model is loaded (every host kind has it)."""
        return True

    def embed(self, batch: pa.Table, per_call: dict) -> pa.Table:
        return self._view(per_call)(batch)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.embedder.count_tokens(texts)

    def describe(self, per_call: dict) -> tuple[dict, dict]:
        """(info, fingerprint) of the embedder with these settings; also says it is up."""
        view = self._view(per_call)
        return view.info, view.fingerprint


class HostedEmbedder(_Settings):
    """An `Embedder` whose model lives in `EmbedderHost` actors: batches go to them in turn
    (each host runs one at a time; a caller waits for its own)."""

    def __init__(self, hosts: list, per_call: dict):
        import ray

        self.hosts, self.per_call = hosts, per_call
        self.info, self._fingerprint = ray.get(hosts[0].describe.remote(per_call))
        self._turn = 0

    def _host(self):
        self._turn = (self._turn + 1) % len(self.hosts)
        return self.hosts[self._turn]

    def __call__(self, batch: pa.Table) -> pa.Table:
        import ray

        return ray.get(self._host().embed.remote(batch, self.per_call))

    def count_tokens(self, texts: list[str]) -> list[int]:
        import ray

        return ray.get(self._host().count_tokens.remote(texts))

    def with_settings(self, **per_call) -> "HostedEmbedder":
        return HostedEmbedder(self.hosts, {**self.per_call, **per_call})


def shortest_first(table: pa.Table, column: str) -> pa.Table:
    """The rows ordered by the length of `column` (stable, nulls last). FlagEmbedding sorts
    texts by length only within one `encode` call, so rows ordered before they reach the
    pool make calls of similar lengths, whose forward batches pad little."""
    import pyarrow.compute as pc

    return table.take(pc.sort_indices(pc.utf8_length(table[column])))


class EmbedBatches:
    """Ray Data actor (map_batches) around `make_embedder(**settings)`."""

    def __init__(self, **settings):
        self.embedder = make_embedder(**settings)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.embedder(batch)


def silence_flagembedding_bars() -> None:
    """FlagEmbedding draws a tqdm bar per call of 256 texts or more ("pre tokenize",
    "Inference Embeddings", "Compute Scores"), forcing `disable=` itself. Inside a Ray actor
    each bar becomes log lines that Ray forwards to the driver's console (191 of them in a
    dense search of 200k queries), beside xling's own progress: its modules get bars that
    are always off."""
    import functools
    import sys

    import tqdm

    def off(bar):
        @functools.wraps(bar)
        def quiet(*args, **kwargs):
            return bar(*args, **{**kwargs, "disable": True})
        return quiet

    for name, module in list(sys.modules.items()):
        if name.startswith("FlagEmbedding.") and module is not None:
            for attr, bar in (("tqdm", tqdm.tqdm), ("trange", tqdm.trange)):
                if getattr(module, attr, None) is bar:
                    setattr(module, attr, off(bar))


class RowEmbedder(_Settings):
    """The row handling every embedder shares (see the module doc): rows with an error or
    no text are skipped, the rest encoded by `_encode_batch` (one dict of numpy outputs per
    text), a failed batch retried row by row, and the outputs turned into Arrow columns."""

    dense, sparse, colbert = True, False, False
    text_column = "text"

    # ---- per batch -------------------------------------------------------------------
    def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        texts = batch[self.text_column].to_pylist()
        has_error = "error" in batch.column_names
        errors = batch["error"].to_pylist() if has_error else [None] * n
        todo = []
        for r in range(n):
            if errors[r] is not None:
                continue
            if texts[r] is None or not texts[r].strip():
                errors[r] = EMPTY
                continue
            todo.append(r)
        results = self._encode([texts[r] for r in todo])
        rows: list[dict | None] = [None] * n
        for r, res in zip(todo, results):
            if isinstance(res, str):
                errors[r] = res
            else:
                rows[r] = res
        out = batch
        for name, column in self._columns(rows).items():
            out = _put(out, name, column)
        return _put(out, "error", pa.array(errors, pa.string()))

    def _encode(self, texts: list[str]) -> list[dict | str]:
        """One dict of numpy outputs per text, or an error string for a text that failed."""
        if not texts:
            return []
        try:
            return self._encode_batch(texts)
        except Exception as e:  # noqa: BLE001 - isolate the rows that fail, keep the rest
            if len(texts) == 1:
                return [self._failure(texts[0], e)]
            log.warning("%s: a batch of %d failed (%s: %s); retrying row by row",
                        type(self).__name__, len(texts), type(e).__name__, e)
        out: list[dict | str] = []
        for t in texts:
            try:
                out += self._encode_batch([t])
            except Exception as e:  # noqa: BLE001
                out.append(self._failure(t, e))
        return out

    def _failure(self, text: str, error: Exception) -> str:
        return f"embedding failed: {type(error).__name__}: {error}"

    def _encode_batch(self, texts: list[str]) -> list[dict]:
        raise NotImplementedError

    def _columns(self, rows: list[dict | None]) -> dict[str, pa.Array]:
        n = len(rows)
        mask = pa.array([r is None for r in rows], pa.bool_())
        cols: dict[str, pa.Array] = {}
        if self.dense:
            dim = self.info["dim"]
            mat = np.zeros((n, dim), dtype=np.float32)
            for i, r in enumerate(rows):
                if r is not None:
                    mat[i] = r["dense"]
            cols["dense"] = pa.FixedSizeListArray.from_arrays(pa.array(mat.reshape(-1)), dim,
                                                              mask=mask)
        if self.sparse:
            cols["sparse_ids"] = _lists([None if r is None else r["sparse_ids"] for r in rows],
                                        np.int32, mask)
            cols["sparse_weights"] = _lists(
                [None if r is None else r["sparse_weights"] for r in rows], np.float32, mask)
        if self.colbert:
            vecs = [None if r is None else r["colbert"] for r in rows]
            cols["colbert"] = _lists([None if v is None else v.reshape(-1) for v in vecs],
                                     np.float32, mask)
            cols["colbert_len"] = pa.array([None if v is None else v.shape[0] for v in vecs],
                                           pa.int32())
        return cols


class M3Embedder(RowEmbedder):
    """BGE-M3 for `map_batches`: dense (default), sparse and ColBERT outputs.

    `max_length` is in tokens (longer texts are truncated; 512 as in the BGE-M3 paper's
    passage setting). `use_fp16` is honoured on CUDA only: FlagEmbedding upcasts on "cpu"
    anyway and other devices are not worth the risk, so elsewhere it is switched off with a
    warning. `device=None` means the first GPU if there is one, else the CPU; one device
    always, so FlagEmbedding never starts its multi-process pool inside a Ray actor.

    `info` records what actually runs: model, dim, colbert_dim, device, dtype, use_fp16,
    max_length and a `note` when a setting was overridden.

    `batch_size` is FlagEmbedding's forward batch. Its encode() runs the first (longest) batch
    of every call twice, the first time to probe for an out-of-memory-safe batch size, so a
    Ray batch of one forward batch costs two: give map_batches several (8 cost 9).
    """

    # Settings each encode() takes as arguments; the rest (model, use_fp16, device) load.
    # `role` (query or passage) is taken and ignored: BGE-M3 encodes both alike, with no
    # prefix or instruction (model card, BAAI/bge-m3).
    PER_CALL = ("max_length", "batch_size", "text_column", "role", "dense", "sparse", "colbert")
    OUTPUTS = ("dense", "sparse", "colbert")

    def __init__(self, model: str, max_length: int = 512, batch_size: int = 32,
                 use_fp16: bool = False, dense: bool = True, sparse: bool = False,
                 colbert: bool = False, text_column: str = "text", device: str | None = None,
                 role: str | None = None):
        import torch
        from FlagEmbedding import BGEM3FlagModel

        if not (dense or sparse or colbert):
            raise ValueError("M3Embedder: ask for at least one of dense, sparse, colbert")
        if device is None:
            device = "cuda:0" if torch.cuda.is_available() else "cpu"
        note, asked_fp16 = None, use_fp16
        if use_fp16 and not (device.startswith("cuda") and torch.cuda.is_available()):
            note = f"use_fp16 ignored: half precision is only used on CUDA, not on {device}"
            log.warning("M3Embedder: %s", note)
            use_fp16 = False
        silence_flagembedding_bars()
        self.model = BGEM3FlagModel(model, use_fp16=use_fp16, devices=[device],
                                    normalize_embeddings=True, batch_size=batch_size,
                                    query_max_length=max_length, passage_max_length=max_length)
        # FlagEmbedding moves the weights on the first encode(); doing it here makes a wrong
        # device fail at actor start and puts the transfer in the load, not the first batch.
        self.model.model.to(device).eval()
        weights = next(self.model.model.parameters())
        self.max_length, self.batch_size, self.text_column = max_length, batch_size, text_column
        self.dense, self.sparse, self.colbert, self.role = dense, sparse, colbert, role
        self._fingerprint = {"max_length": max_length, "fp16": asked_fp16}
        self.info = {"model": model,
                     "dim": int(self.model.model.model.config.hidden_size),
                     "colbert_dim": int(self.model.model.colbert_linear.out_features),
                     "device": str(weights.device),
                     "dtype": str(weights.dtype).removeprefix("torch."),
                     "use_fp16": use_fp16, "max_length": max_length, "note": note}

    def count_tokens(self, texts: list[str]) -> list[int]:
        # The Rust tokenizer itself: transformers' wrapper turns every encoding into Python
        # lists first (0.31 s against 0.22 s for 8,192 sentences). FlagEmbedding's calls
        # leave their truncation set on it, and transformers sets its own again each call.
        backend = self.model.tokenizer.backend_tokenizer
        backend.no_truncation()
        backend.no_padding()
        return [len(e) for e in backend.encode_batch_fast(texts, add_special_tokens=True)]

    def with_settings(self, **per_call) -> "M3Embedder":
        """The same loaded model with other `PER_CALL` settings (no second load)."""
        unknown = set(per_call) - set(self.PER_CALL)
        if unknown:
            raise ValueError(f"M3Embedder: {sorted(unknown)} change the loaded model, not a "
                             f"call; per-call settings are {list(self.PER_CALL)}")
        other = copy.copy(self)
        for name, value in per_call.items():
            setattr(other, name, value)
        if not (other.dense or other.sparse or other.colbert):
            raise ValueError("M3Embedder: ask for at least one of dense, sparse, colbert")
        other._fingerprint = {**self._fingerprint, "max_length": other.max_length}
        other.info = {**self.info, "max_length": other.max_length}
        return other

    def _failure(self, text: str, error: Exception) -> str:
        """The error message of a row, with the model's own error where FlagEmbedding hides it.

        encode() takes any RuntimeError in its first forward pass for out-of-memory and retries
        with 3/4 of the batch, down to an empty batch, which then fails with "AttributeError:
        'list' object has no attribute 'keys'". One forward pass of our own shows the cause.
        """
        import torch

        try:
            inputs = self.model.tokenizer([text], truncation=True, max_length=self.max_length,
                                          return_tensors="pt").to(self.info["device"])
            with torch.no_grad():
                self.model.model(inputs, return_dense=True)
        except Exception as e:  # noqa: BLE001
            error = e
        return f"embedding failed: {type(error).__name__}: {error}"

    def _encode_batch(self, texts: list[str]) -> list[dict]:
        with engine_cpu():
            res = self.model.encode(texts, batch_size=self.batch_size, max_length=self.max_length,
                                    return_dense=self.dense, return_sparse=self.sparse,
                                    return_colbert_vecs=self.colbert)
        rows = [{} for _ in texts]
        if self.dense:
            dense = np.asarray(res["dense_vecs"], dtype=np.float32).reshape(len(texts), -1)
            for row, vec in zip(rows, dense):
                row["dense"] = vec
        if self.sparse:
            for row, weights in zip(rows, res["lexical_weights"]):
                # Keys are token ids as strings; values numpy scalars (fp16 on a fp16 model).
                items = sorted((int(t), float(w)) for t, w in weights.items())
                row["sparse_ids"] = np.array([t for t, _ in items], dtype=np.int32)
                row["sparse_weights"] = np.array([w for _, w in items], dtype=np.float32)
        if self.colbert:
            for row, vecs in zip(rows, res["colbert_vecs"]):
                row["colbert"] = np.asarray(vecs, dtype=np.float32)
        return rows


def vector_matrix(column, dim: int | None = None) -> np.ndarray:
    """A (fixed-size) list<float> column of equal-length vectors -> a [rows, dim] float32
    matrix, a null row as zeros; through Arrow's buffers, not one Python list per row.
    `dim` is the width where neither the type nor a row gives it (an empty or all-null
    list column; 0 if not given)."""
    import pyarrow.compute as pc

    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    values = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if pa.types.is_fixed_size_list(col.type):
        dim = col.type.list_size
    else:
        lengths = pc.list_value_length(col).drop_null().to_numpy(zero_copy_only=False)
        dim = int(lengths[0]) if len(lengths) else (dim or 0)
        if (lengths != dim).any():
            raise ValueError(f"dense vectors of different lengths {sorted(set(lengths.tolist()))}")
    mat = np.zeros((len(col), dim), dtype=np.float32)
    mat[valid] = values.reshape(-1, dim) if dim else values.reshape(int(valid.sum()), 0)
    return mat


def vector_lists(matrix: np.ndarray, valid: np.ndarray) -> pa.Array:
    """The rows of a float32 matrix as a `list<float32>` array, null (and empty) where
    `valid` is False: `vector_matrix`'s inverse."""
    return _lists([row if ok else None for row, ok in zip(matrix, valid)], np.float32,
                  pa.array(~np.asarray(valid, bool)))


def _lists(parts: list[np.ndarray | None], dtype, mask: pa.Array) -> pa.Array:
    """Numpy rows -> one list<dtype> array (null where the row is None), without Python lists."""
    lengths = np.array([0 if p is None else len(p) for p in parts], dtype=np.int64)
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError("embedder: batch too large for a list<> column; use smaller batches")
    values = (np.concatenate([p for p in parts if p is not None]).astype(dtype, copy=False)
              if offsets[-1] else np.zeros(0, dtype))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values),
                                    mask=mask)


def _put(table: pa.Table, name: str, column: pa.Array) -> pa.Table:
    """Replace a column in place (same position) or append it."""
    i = table.schema.get_field_index(name)
    if i >= 0:
        return table.set_column(i, name, column)
    return table.append_column(name, column)
