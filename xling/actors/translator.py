"""Ray Data actor that translates documents and queries with NLLB through CTranslate2.

Loaded once per actor: a `ctranslate2.Translator`, the model's own `tokenizer.json` (Rust
`tokenizers`, which loads in milliseconds; importing transformers would cost ~10 s per actor),
the text layer for sentences (xling/tasks/text.py; each row records its `segmenter`
fingerprint) and, optionally, a lingua detector for the language check.

`__call__(batch) -> batch` takes input rows (`_rid, _cell, _shard, id, kind, title, text,
error`) and returns one translations row per input row. All segments of the batch form one
sorting window: they are split, sorted and cut into token batches (actors/segments.py), and
the batches go to CTranslate2 asynchronously so `inter_threads` replicas work in parallel.
A row that cannot be translated (empty, wrong language, an input error) comes back with an
`error` and no text; it is never dropped. With `lang_check="flag"` a document in the wrong
language is translated anyway and the finding is its `lang_flag`.
"""

from __future__ import annotations

import functools
import os
import threading
import time

import pyarrow as pa

from xling.actors.enginecpu import engine_cpu
from xling.actors.llm import HANG_TIMEOUT_S
from xling.actors.segments import (
    Piece,
    decode_limit,
    joiner_for,
    reassemble,
    segment_document,
    split_long,
    token_batches,
)

OUTPUT = pa.schema([
    ("id", pa.string()), ("kind", pa.string()), ("src_lang", pa.string()),
    ("tgt_lang", pa.string()), ("title", pa.string()), ("text", pa.string()),
    ("segments", pa.list_(pa.string())), ("n_segments", pa.int64()),
    ("n_src_tokens", pa.int64()), ("n_tgt_tokens", pa.int64()), ("n_truncated", pa.int64()),
    ("model", pa.string()), ("compute_type", pa.string()), ("beam_size", pa.int64()),
    ("segmenter", pa.string()), ("error", pa.string()),
    # lang_check: flag: the language check's finding on a document that was translated anyway
    ("lang_flag", pa.string()),
])
PASS_THROUGH = ("_rid", "_cell", "_shard")
WRONG_LANGUAGE = "wrong language"


class EngineHung(Exception):
    pass


def cuda_or_cpu(device: str) -> str:
    """The device a translator runs on, checked before any work: `cuda`, or `auto` in an
    actor that Ray gave a GPU, needs CTranslate2 to see a device and CUDA 12 cuBLAS to load
    (actors/cuda.py); otherwise this raises, never falling back to the CPU. `auto` elsewhere
    is cuda where CTranslate2 sees a device, else cpu."""
    import ctranslate2

    from xling.actors.cuda import no_cuda_device, preload_cublas12, ray_gpus

    n = ctranslate2.get_cuda_device_count()
    gpus = ray_gpus()
    if device == "auto":
        device = "cuda" if n > 0 or gpus else "cpu"
    if device == "cuda":
        if n == 0:
            given = f"Ray gave this actor GPU {gpus}, " if gpus else ""
            raise RuntimeError(no_cuda_device(
                f"CTranslate2 {ctranslate2.__version__}",
                f"{given}ctranslate2.get_cuda_device_count() is 0"))
        preload_cublas12()
    return device


class Translator:
    """One NLLB model for every cell of a pipeline.

    `directions[c]` = (src code, src NLLB code, tgt code, tgt NLLB code) of cell c.
    `lingua_names` are the lingua languages to tell apart and `lingua_expected` maps a source
    code to the lingua language its documents should be in (codes lingua lacks are not
    checked).
    """

    def __init__(self, model_dir: str, model_name: str,
                 directions: list[tuple[str, str, str, str]],
                 *, device: str = "auto", compute_type: str = "default", beam_size: int = 4,
                 inter_threads: int = 1, intra_threads: int = 0, max_batch_tokens: int = 4096,
                 max_input_tokens: int = 200, decode_ratio: float = 2.0, decode_extra: int = 10,
                 max_decode_tokens: int = 512, repetition_penalty: float = 1.0,
                 no_repeat_ngram_size: int = 0, lang_check: str = "error",
                 lang_checks: list[str] | None = None,
                 lingua_names: list[str] = (), lingua_expected: dict[str, str] | None = None,
                 lang_check_confidence: float = 0.9, lang_check_min_chars: int = 100,
                 hang_timeout_s: float = HANG_TIMEOUT_S):
        import ctranslate2
        from tokenizers import Tokenizer

        from xling.tasks.text import fingerprint, sentences

        device = cuda_or_cpu(device)
        self.load = functools.partial(ctranslate2.Translator, model_dir, device=device,
                                      compute_type=compute_type, inter_threads=inter_threads,
                                      intra_threads=intra_threads)
        self.engine = self.load()
        self.hang_s, self.restarts = hang_timeout_s, 0
        self.tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.segment, self.segmenter = sentences, fingerprint()
        self.model_name, self.device = model_name, device
        self.compute_type = self.engine.compute_type  # what CT2 actually runs, after fallbacks
        self.directions = [tuple(d) for d in directions]
        self.beam_size, self.max_batch_tokens = beam_size, max_batch_tokens
        self.max_input_tokens = max_input_tokens
        self.decode = (decode_ratio, decode_extra, max_decode_tokens)
        self.options = {"repetition_penalty": repetition_penalty,
                        "no_repeat_ngram_size": no_repeat_ngram_size}
        # per direction (cell): a corpus may set its own (translate.documents[].lang_check)
        self.lang_checks = list(lang_checks or [lang_check] * len(directions))
        self.lang_check_min_chars = lang_check_min_chars
        self.lang_check_confidence = lang_check_confidence
        self.detector = (_detector(lingua_names, lingua_expected or {})
                         if set(self.lang_checks) != {"off"} and lingua_names else None)

    # ---- per row ---------------------------------------------------------------------
    def _check(self, text: str | None, src: str, error: str | None, kind: str,
               lang_check: str = "error") -> str | None:
        if error is not None:
            return f"input record has an error: {error}"
        if text is None or not text.strip():
            return "empty text: nothing to translate"
        # Only documents: on a one-line query lingua's fast mode is wrong too often (an
        # English CIRAL topic read as Turkish at 0.93), and topic files are one language.
        if self.detector is None or kind != "doc" or lang_check == "off":
            return None
        return self._wrong_language(text, src)

    def _wrong_language(self, text: str, src: str) -> str | None:
        detector, expected = self.detector
        want = expected.get(src)
        sample = text[:1000]
        if want is None or len(sample.strip()) < self.lang_check_min_chars:
            return None  # lingua cannot check this language, or too little text to tell
        best = detector.compute_language_confidence_values(sample)[0]
        if best.language != want and best.value >= self.lang_check_confidence:
            return (f"{WRONG_LANGUAGE}: declared '{src}' but the text looks like "
                    f"{best.language.name.title()} (confidence {best.value:.2f}); fix the corpus "
                    f"language or set translate.lang_check=off")
        return None

    def _tokens(self, sentences: list[str]) -> list[list[str]]:
        return [e.tokens for e in self.tokenizer.encode_batch(sentences, add_special_tokens=False)]

    # ---- per batch -------------------------------------------------------------------
    def __call__(self, batch: pa.Table) -> pa.Table:
        cols = {c: batch[c].to_pylist() for c in ("_cell", "id", "kind", "title", "text", "error")}
        n = batch.num_rows
        errors: list[str | None] = [None] * n
        flags: list[str | None] = [None] * n
        docs: list[tuple[list[int], list[Piece]] | None] = [None] * n  # (structure, pieces)
        pieces: list[tuple[int, Piece]] = []  # (row, piece) for the whole batch: one window
        for r in range(n):
            src, src_code, _, _ = self.directions[cols["_cell"][r]]
            check = self.lang_checks[cols["_cell"][r]]
            errors[r] = self._check(cols["text"][r], src, cols["error"][r], cols["kind"][r],
                                    check)
            if errors[r] and check == "flag" and errors[r].startswith(WRONG_LANGUAGE):
                flags[r], errors[r] = errors[r], None  # translated anyway, the finding kept
            if errors[r]:
                continue
            try:
                docs[r] = self._pieces(cols["title"][r], cols["text"][r], src, src_code)
            except Exception as e:  # a segmenter/tokenizer failure is this row's error only
                errors[r] = f"segmentation failed: {type(e).__name__}: {e}"
                continue
            pieces += [(r, p) for p in docs[r][1]]
        try:
            texts, n_out, truncated = self._translate(pieces, cols["_cell"])
        except EngineHung as e:  # every row that reached the engine fails; the rest stand
            self._restart()
            for r in {r for r, _ in pieces}:
                errors[r], docs[r] = str(e), None
            pieces, texts, n_out, truncated = [], [], [], []
        by_row: dict[int, list[int]] = {}
        for k, (r, _) in enumerate(pieces):
            by_row.setdefault(r, []).append(k)
        out = {name: [] for name in OUTPUT.names}
        for r in range(n):
            src, _, tgt, tgt_code = self.directions[cols["_cell"][r]]
            row = {"id": cols["id"][r], "kind": cols["kind"][r], "src_lang": src,
                   "tgt_lang": tgt, "title": None, "text": None, "segments": None,
                   "n_segments": None, "n_src_tokens": None, "n_tgt_tokens": None,
                   "n_truncated": None, "model": self.model_name,
                   "compute_type": self.compute_type, "beam_size": self.beam_size,
                   "segmenter": self.segmenter, "error": errors[r], "lang_flag": flags[r]}
            if docs[r] is not None:
                ks = by_row.get(r, [])
                row.update(self._assemble(docs[r][0], [pieces[k][1] for k in ks],
                                          [texts[k] for k in ks], [n_out[k] for k in ks],
                                          [truncated[k] for k in ks], tgt_code))
            for name in OUTPUT.names:
                out[name].append(row[name])
        table = pa.Table.from_pydict(out, schema=OUTPUT)
        for c in PASS_THROUGH:
            table = table.append_column(c, batch[c])
        return table

    def _pieces(self, title: str | None, text: str, src: str, src_code: str):
        """Title (as paragraph 0, when there is one) and text paragraphs -> engine pieces."""
        seg = lambda para: self.segment(para, src)  # noqa: E731
        # A title is one paragraph (a multi-line title is rare; its lines become sentences).
        title_sents = [s for para in segment_document(title or "", seg) for s in para]
        paragraphs = [title_sents, *segment_document(text, seg)]
        flat = [(p, s, sent) for p, sents in enumerate(paragraphs) for s, sent in enumerate(sents)]
        tokens = self._tokens([sent for _, _, sent in flat])
        pieces = []
        for (p, s, _), toks in zip(flat, tokens):
            for part, chunk in enumerate(split_long(toks, self.max_input_tokens)):
                pieces.append(Piece(p, s, part, [src_code, *chunk, "</s>"]))
        return [len(sents) for sents in paragraphs], pieces

    def _translate(self, pieces: list[tuple[int, Piece]], cells: list[int]):
        """Sort by length, cut into token batches, run them through CT2 asynchronously."""
        if not pieces:
            return [], [], []
        with engine_cpu():
            return self._translate_now(pieces, cells)

    def _translate_now(self, pieces: list[tuple[int, Piece]], cells: list[int]):
        lengths = [len(p.tokens) for _, p in pieces]
        ratio, extra, cap = self.decode
        jobs = []
        for idx in token_batches(lengths, self.max_batch_tokens):
            limit = decode_limit(max(lengths[i] for i in idx) - 2, ratio, extra, cap)
            prefixes = [[self.directions[cells[pieces[i][0]]][3]] for i in idx]
            results = self.engine.translate_batch(
                [pieces[i][1].tokens for i in idx], target_prefix=prefixes, asynchronous=True,
                beam_size=self.beam_size, max_batch_size=0, max_input_length=0,
                max_decoding_length=limit + 1, return_end_token=True, **self.options)
            jobs.append((idx, results))
        self._wait([r for _, results in jobs for r in results])
        texts, n_out, truncated = [""] * len(pieces), [0] * len(pieces), [False] * len(pieces)
        for idx, results in jobs:
            for i, res in zip(idx, results):
                hyp = res.result().hypotheses[0][1:]  # drop the target-language prefix
                own = decode_limit(lengths[i] - 2, ratio, extra, cap)
                ended = bool(hyp) and hyp[-1] == "</s>"
                hyp = [t for t in hyp if t != "</s>"]
                truncated[i] = not ended or len(hyp) > own
                n_out[i] = min(len(hyp), own)
                ids = [self.tokenizer.token_to_id(t) for t in hyp[:own]]
                texts[i] = self.tokenizer.decode([t for t in ids if t is not None],
                                                 skip_special_tokens=True)
        return texts, n_out, truncated

    def _wait(self, results: list) -> None:
        """Until every async result is in; EngineHung when none came for `hang_s` (a CUDA
        call that never returns stalls its replica, and the batch would wait forever)."""
        pending, last, pause = list(results), time.monotonic(), 0.001
        while pending:
            left = [r for r in pending if not r.done()]
            if len(left) < len(pending):
                last, pause = time.monotonic(), 0.001
            elif time.monotonic() - last > self.hang_s:
                raise EngineHung(
                    f"translation engine hung: no progress for {self.hang_s:g} s "
                    "(translate.hang_timeout_s); this batch's rows failed and the engine was "
                    "restarted. Rerun to retry them; if it recurs, lower max_batch_tokens")
            pending = left
            if pending:
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    def _restart(self) -> None:
        """A new engine for the next batches; the hung one is unloaded on a side thread
        (its stuck call may never return)."""
        hung, self.engine = self.engine, None
        threading.Thread(target=hung.unload_model, name="xling-unload-hung-ct2",
                         daemon=True).start()
        self.engine = self.load()
        self.restarts += 1

    def _assemble(self, structure: list[int], pieces: list[Piece], texts: list[str],
                  n_out: list[int], truncated: list[bool], tgt_code: str) -> dict:
        joiner = joiner_for(tgt_code)
        title, *body = reassemble(structure, pieces, texts, joiner)  # paragraph 0: the title
        return {"title": joiner.join(title) if structure[0] else None,
                "text": "\n".join(joiner.join(sents) for sents in body),
                "segments": [s for sents in body for s in sents],
                "n_segments": sum(structure[1:]),
                "n_src_tokens": sum(len(p.tokens) - 2 for p in pieces),
                "n_tgt_tokens": sum(n_out), "n_truncated": sum(truncated)}


def _detector(names: list[str], expected: dict[str, str]):
    """A lingua detector over the given languages, in low-accuracy mode.

    All 75 lingua languages in high-accuracy mode cost ~1 GB and 8 s per actor; the
    languages of our studies in low-accuracy mode load in milliseconds and still tell a
    Russian article from a German one, which is all the check is for.
    """
    from lingua import Language, LanguageDetectorBuilder

    detector = (LanguageDetectorBuilder.from_languages(*[getattr(Language, n) for n in names])
                .with_low_accuracy_mode().build())
    return detector, {src: getattr(Language, name) for src, name in expected.items()}
