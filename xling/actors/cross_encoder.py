"""Ray Data actor that scores (query, passage) pairs with a cross-encoder through
FlagEmbedding's `FlagReranker` (BAAI/bge-reranker-v2-m3 in MIRAGE-Bench, spec §3.5).

Loaded once per actor: the model (local path or hub id) on one device. `__call__(batch) ->
batch` keeps every input column and row, in order, and adds:

- `score` (float64): `FlagReranker.compute_score(pairs, normalize=False)`, the raw logit
  (MIRAGE-Bench's reranker feature is the mean raw logit, which "can be greater than 1.0");
- `error` (string): null when the row was scored.

A row whose query or passage is null, empty or whitespace gets a null score and the error
"empty query" / "empty passage". A row that arrives with an error keeps it and is not scored.
A batch the model fails on is retried row by row (`actors.nli.PairScorer`).
"""

from __future__ import annotations

import logging

import numpy as np

from xling.actors.nli import PairScorer

log = logging.getLogger(__name__)


class CrossEncoderScorer(PairScorer):
    """A FlagReranker for `map_batches`. Input columns `query`, `passage`; output `score`.

    `max_length` is FlagReranker's: the pair is cut to it (passage side first), the query
    alone to 3/4 of it. `batch_size` is its forward batch; it sorts the pairs of each call by
    length and runs the first (longest) forward batch of every call twice, the first time to
    probe for an out-of-memory-safe batch size, so give map_batches several forward batches.
    `use_fp16` is honoured on CUDA only (FlagReranker switches it off on "cpu" anyway).
    `device=None` means the first GPU if there is one, else the CPU; one device always, so
    FlagEmbedding never starts its multi-process pool inside a Ray actor.

    `info` records what actually runs: model, device, dtype, use_fp16, max_length and a
    `note` when a setting was overridden.
    """

    first, second, outputs, what = "query", "passage", ("score",), "reranking"

    def __init__(self, model: str, *, device: str | None = "cpu", batch_size: int = 32,
                 max_length: int = 512, use_fp16: bool = False):
        import torch
        from FlagEmbedding import FlagReranker

        from xling.actors.embedder import silence_flagembedding_bars

        if device is None:
            device = "cuda:0" if torch.cuda.is_available() else "cpu"
        note = None
        if use_fp16 and not (device.startswith("cuda") and torch.cuda.is_available()):
            note = f"use_fp16 ignored: half precision is only used on CUDA, not on {device}"
            log.warning("CrossEncoderScorer: %s", note)
            use_fp16 = False
        silence_flagembedding_bars()
        self.model = FlagReranker(model, use_fp16=use_fp16, devices=[device],
                                  batch_size=batch_size, max_length=max_length, normalize=False)
        # FlagReranker moves (and halves) the weights on the first compute_score(); doing it
        # here makes a wrong device fail at actor start and puts the transfer in the load.
        self.model.model.to(device).eval()
        if use_fp16:
            self.model.model.half()
        weights = next(self.model.model.parameters())
        self.batch_size, self.max_length = batch_size, max_length
        self.info = {"model": model, "device": str(weights.device),
                     "dtype": str(weights.dtype).removeprefix("torch."),
                     "use_fp16": use_fp16, "max_length": max_length, "note": note}

    def _score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        scores = self.model.compute_score([[q, p] for q, p in pairs], batch_size=self.batch_size,
                                          max_length=self.max_length, normalize=False)
        # A list per call in FlagEmbedding 1.4; older releases returned a bare float for one pair.
        return np.atleast_1d(np.asarray(scores, dtype=np.float64)).reshape(len(pairs), 1)
