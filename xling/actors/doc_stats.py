"""Actor that measures documents the way translation will see them.

For each document it splits the text into sentences with the text layer
(xling/tasks/text.py: sentencex, which unlike Punkt covers every language of our studies,
plus rules for the scripts it misses; the translator uses the same) and counts subword
tokens with the translation model's tokenizer. Those numbers size the translation work
(segments to batch, tokens to decode) before a GPU is touched.

Plain constructor arguments; `__call__(batch) -> batch`. Rows that already carry an error
pass through untouched.
"""

from __future__ import annotations

import os

import pyarrow as pa

from xling.actors.enginecpu import engine_cpu


class DocumentStats:
    def __init__(self, tokenizer_path: str):
        from xling.tasks.text import sentences

        self._segment = sentences
        # Loaded once per actor for the life of the pool. The Rust `tokenizers` file that NLLB
        # checkpoints ship loads in milliseconds; importing transformers costs ~10 s per actor.
        path = os.path.join(tokenizer_path, "tokenizer.json")
        if os.path.isfile(path):
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(path)
            # Only the counts: no offsets computed (`_fast`: 63 us a Mr.TyDi passage against
            # 97 us) and no ids copied into Python lists (13 us).
            self.count_tokens = lambda texts: [
                len(e) for e in tok.encode_batch_fast(texts, add_special_tokens=False)]
        else:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(tokenizer_path)
            self.count_tokens = lambda texts: [
                len(i) for i in hf(texts, add_special_tokens=False)["input_ids"]]

    def segments(self, text: str, lang: str) -> list[str]:
        out = []
        # Paragraph breaks are kept as boundaries, as the translator keeps them.
        for para in text.split("\n"):
            out += [s.strip() for s in self._segment(para, lang) if s.strip()]
        return out

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch["text"].to_pylist()
        langs = batch["lang"].to_pylist()
        errors = batch["error"].to_pylist()
        n_chars, n_segments, n_tokens = [], [], []
        ok = [i for i, e in enumerate(errors) if e is None]
        with engine_cpu():
            counts = self.count_tokens([texts[i] for i in ok]) if ok else []
        by_row = dict(zip(ok, counts))
        with engine_cpu():  # the segmenter's, once a batch
            for i, (text, lang) in enumerate(zip(texts, langs)):
                if i not in by_row:
                    n_chars.append(None), n_segments.append(None), n_tokens.append(None)
                    continue
                try:
                    n_segments.append(len(self.segments(text, lang)))
                except Exception as e:  # a segmenter failure is this record's error
                    errors[i] = f"segmentation failed: {type(e).__name__}: {e}"
                    n_segments.append(None)
                n_chars.append(len(text))
                n_tokens.append(by_row[i])
        batch = batch.set_column(batch.column_names.index("error"), "error",
                                 pa.array(errors, pa.string()))
        return (batch.append_column("n_chars", pa.array(n_chars, pa.int64()))
                .append_column("n_segments", pa.array(n_segments, pa.int64()))
                .append_column("n_tokens", pa.array(n_tokens, pa.int64())))
