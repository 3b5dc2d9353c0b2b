"""Ray Data actor that scores (premise, hypothesis) pairs with a transformers NLI classifier.

MIRAGE-Bench's support features (spec §3.4) ask, for each (cited passage, reason sentence)
pair, how likely the passage entails the sentence, with
`MoritzLaurer/mDeBERTa-v3-base-xnli-multilingual-nli-2mil7`. Loaded once per actor: the
model (local path or hub id) on one device. `__call__(batch) -> batch` keeps every input
column and row, in order, and adds:

- `entailment`, `neutral`, `contradiction` (float64): the softmax of the model's logits,
  each taken from the output index the model's own `config.id2label` gives that label
  (checkpoints differ in their label order, so it is never assumed);
- `error` (string): null when the row was scored.

A row whose premise or hypothesis is null, empty or whitespace gets null probabilities and
the error "empty premise" / "empty hypothesis". A row that arrives with an error keeps it and
is not scored. A batch the model fails on is retried row by row, so one bad row becomes an
error row instead of failing the Ray task.

`PairScorer` is the row handling shared with `actors.cross_encoder.CrossEncoderScorer`.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from xling.actors.embedder import _put
from xling.actors.enginecpu import engine_cpu

log = logging.getLogger(__name__)

NLI_LABELS = ("entailment", "neutral", "contradiction")


class PairScorer:
    """What a pair scorer does around its model: read two text columns, skip rows that are
    empty or already failed, score the rest, write float columns and `error`.

    Subclasses set `first`/`second` (input columns), `outputs` (output columns), `what` (a
    word for error messages) and implement `_score(pairs) -> array [len(pairs), len(outputs)]`.
    Batches may be pyarrow tables, pandas frames or dicts of numpy arrays (Ray Data's three
    batch formats); the result has the type of the input.
    """

    first: str
    second: str
    outputs: tuple[str, ...]
    what: str

    def __call__(self, batch):
        table, back = _as_table(batch)
        n = table.num_rows
        firsts = table[self.first].to_pylist()
        seconds = table[self.second].to_pylist()
        errors = (table["error"].to_pylist() if "error" in table.column_names else [None] * n)
        todo = []
        for r in range(n):
            if errors[r] is not None:
                continue
            empty = [c for c, t in ((self.first, firsts[r]), (self.second, seconds[r]))
                     if t is None or (isinstance(t, str) and not t.strip())]
            if empty:
                errors[r] = f"empty {empty[0]}"
                continue
            todo.append(r)
        results = self._score_rows([(firsts[r], seconds[r]) for r in todo])
        values = np.full((n, len(self.outputs)), np.nan)
        scored = np.zeros(n, dtype=bool)
        for r, res in zip(todo, results):
            if isinstance(res, str):
                errors[r] = res
            else:
                values[r] = res
                scored[r] = True
        out = table
        for j, name in enumerate(self.outputs):
            out = _put(out, name, pa.array(values[:, j], pa.float64(), mask=~scored))
        return back(_put(out, "error", pa.array(errors, pa.string())))

    def _score_rows(self, pairs: list[tuple[str, str]]) -> list[np.ndarray | str]:
        """One row of output values per pair, or an error string for a pair that failed."""
        if not pairs:
            return []
        try:
            with engine_cpu():
                return list(self._score(pairs))
        except Exception as e:  # noqa: BLE001 - isolate the rows that fail, keep the rest
            if len(pairs) == 1:
                return [f"{self.what} failed: {type(e).__name__}: {e}"]
            log.warning("%s: a batch of %d failed (%s: %s); retrying row by row",
                        type(self).__name__, len(pairs), type(e).__name__, e)
        out: list[np.ndarray | str] = []
        for pair in pairs:
            try:
                out += list(self._score([pair]))
            except Exception as e:  # noqa: BLE001
                out.append(f"{self.what} failed: {type(e).__name__}: {e}")
        return out

    def _score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        raise NotImplementedError


class NLIScorer(PairScorer):
    """A sequence-pair classifier with entailment/neutral/contradiction labels, for
    `map_batches`. Input columns `premise`, `hypothesis`.

    `max_length` is in tokens for the pair together (longest-first truncation, as the
    tokenizer does by default); MIRAGE-Bench's reference used the tokenizer's
    model_max_length - 2 (510 for mDeBERTa). `batch_size` is the forward batch: within a Ray
    batch, pairs are sorted by length first, so each forward pass pads little. `device=None`
    means the first GPU if there is one, else the CPU.

    `info` records what actually runs: model, device, dtype, max_length and `labels`, the
    label of each output index as the model's config gives it.
    """

    first, second, outputs, what = "premise", "hypothesis", NLI_LABELS, "nli"

    def __init__(self, model: str, *, device: str | None = "cpu", batch_size: int = 32,
                 max_length: int = 512):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if device is None:
            device = "cuda:0" if torch.cuda.is_available() else "cpu"
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForSequenceClassification.from_pretrained(model).to(device).eval()
        labels = [str(self.model.config.id2label[i]).lower()
                  for i in range(self.model.config.num_labels)]
        missing = [name for name in NLI_LABELS if name not in labels]
        if missing or len(set(labels)) != len(labels):
            raise ValueError(f"NLIScorer: {model}'s config.id2label is {labels}; it needs "
                             f"exactly one output labelled each of {list(NLI_LABELS)}")
        # Output column j takes the model's output index column_index[j].
        self.column_index = [labels.index(name) for name in NLI_LABELS]
        self.device, self.batch_size, self.max_length = device, batch_size, max_length
        weights = next(self.model.parameters())
        self.info = {"model": model, "device": str(weights.device),
                     "dtype": str(weights.dtype).removeprefix("torch."),
                     "max_length": max_length, "labels": labels}

    def _score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        import torch

        enc = self.tokenizer([p for p, _ in pairs], [h for _, h in pairs], truncation=True,
                             max_length=self.max_length)
        lengths = np.array([len(ids) for ids in enc["input_ids"]])
        order = np.argsort(-lengths, kind="stable")
        probs = np.empty((len(pairs), self.model.config.num_labels), dtype=np.float32)
        for start in range(0, len(pairs), self.batch_size):
            idx = order[start:start + self.batch_size]
            feats = self.tokenizer.pad({k: [enc[k][i] for i in idx] for k in enc.keys()},
                                       return_tensors="pt").to(self.device)
            with torch.inference_mode():
                logits = self.model(**feats).logits
            probs[idx] = torch.softmax(logits.float(), dim=-1).cpu().numpy()
        return probs[:, self.column_index].astype(np.float64)


def _as_table(batch):
    """A Ray Data batch as a pyarrow table, and the function that turns a table back into
    the batch's own format."""
    if isinstance(batch, pa.Table):
        return batch, lambda t: t
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas comes with Ray Data
        pd = None
    if pd is not None and isinstance(batch, pd.DataFrame):
        index = batch.index

        def to_pandas(t: pa.Table):
            df = t.to_pandas()
            df.index = index
            return df

        return pa.Table.from_pandas(batch, preserve_index=False), to_pandas
    if isinstance(batch, dict):
        table = pa.table({k: pa.array(list(v) if isinstance(v, np.ndarray) and v.ndim > 1
                                      else v) for k, v in batch.items()})
        return table, lambda t: {k: t[k].to_numpy(zero_copy_only=False)
                                 for k in t.column_names}
    raise TypeError(f"unsupported batch type {type(batch).__name__}")
