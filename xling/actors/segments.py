"""Engine-independent steps of sentence-level translation: split, batch, bound, reassemble.

A document is translated sentence by sentence, because NLLB was trained on sentences and
degrades (or loops) on long inputs. The translator actor calls these functions around the
engine:

1. `segment_document`: paragraphs (split on "\\n", empty ones kept) into sentences with a
   per-language segmenter (the text layer, xling/tasks/text.py: sentencex plus rules for
   the scripts it misses; Punkt has no models for many of our languages);
2. `split_long`: a sentence longer than the token limit becomes several pieces;
3. `token_batches`: pieces sorted by length within a window, then cut into batches whose
   padded size (examples x longest) stays under a token budget: the sort cuts padding;
4. `decode_limit`: how long a translation may grow, relative to its source;
5. `reassemble`: translated pieces back into sentences and paragraphs, in the original
   order.

Pure Python with no engine or Ray imports, so each step is unit-tested on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from xling.tasks.text import NO_SPACE_SCRIPTS  # written without spaces between words


def joiner_for(nllb_code: str) -> str:
    """What separates sentences in the target language: nothing for zh/ja/th, else a space."""
    return "" if nllb_code.endswith(tuple(sorted(NO_SPACE_SCRIPTS))) else " "


@dataclass(frozen=True)
class Piece:
    """One unit handed to the engine: part `part` of sentence `sentence` of paragraph `para`."""

    para: int
    sentence: int
    part: int
    tokens: list[str]


def segment_document(text: str, segment: Callable[[str], list[str]]) -> list[list[str]]:
    """Paragraphs (one per line, empty ones kept as []) of sentences, in order."""
    paragraphs = []
    for para in text.split("\n"):
        paragraphs.append([s.strip() for s in segment(para) if s.strip()] if para.strip() else [])
    return paragraphs


def split_long(tokens: Sequence[str], max_tokens: int) -> list[list[str]]:
    """Cut a token sequence into pieces of at most `max_tokens`, preferring word starts.

    SentencePiece marks a word start with "▁"; cutting there keeps words whole. A "word"
    longer than the limit (a 100,000-character string without spaces) is cut anywhere.
    """
    if len(tokens) <= max_tokens:
        return [list(tokens)]
    pieces, start = [], 0
    while start < len(tokens):
        end = min(start + max_tokens, len(tokens))
        if end < len(tokens):
            cut = next((i for i in range(end, start + max_tokens // 2, -1)
                        if tokens[i].startswith("▁")), end)
            end = cut
        pieces.append(list(tokens[start:end]))
        start = end
    return pieces


def token_batches(lengths: Sequence[int], max_tokens: int, window: int = 0) -> list[list[int]]:
    """Indices grouped into batches whose padded size (n x longest) is at most `max_tokens`.

    Items are sorted by length within consecutive windows of `window` items (0: all of
    them), longest first, so each batch holds similar lengths and padding stays small. An
    item longer than the budget gets a batch of its own. Every index appears exactly once.
    """
    n = len(lengths)
    window = window or n or 1
    batches: list[list[int]] = []
    for lo in range(0, n, window):
        order = sorted(range(lo, min(lo + window, n)), key=lambda i: (-lengths[i], i))
        batch: list[int] = []
        longest = 0
        for i in order:
            grown = max(longest, lengths[i])
            if batch and grown * (len(batch) + 1) > max_tokens:
                batches.append(batch)
                batch, grown = [], lengths[i]
            batch.append(i)
            longest = grown
        if batch:
            batches.append(batch)
    return batches


def padding_efficiency(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Real tokens / padded tokens over all batches (1.0 means no padding at all)."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return real / padded if padded else 1.0


def decode_limit(n_source_tokens: int, ratio: float, extra: int, cap: int) -> int:
    """Most target tokens a piece of `n_source_tokens` may produce.

    Proportional to the input, so a model caught in a repetition loop stops after a few
    times the source length instead of running to a fixed global maximum.
    """
    return max(1, min(cap, math.ceil(ratio * n_source_tokens) + extra))


def reassemble(structure: Sequence[int], pieces: Sequence[Piece],
               texts: Sequence[str], joiner: str) -> list[list[str]]:
    """Translated pieces -> paragraphs of translated sentences, in the original order.

    `structure[p]` is the number of sentences in paragraph p; `texts[k]` translates
    `pieces[k]`. The parts of a sentence that `split_long` cut are joined with `joiner`.
    Join sentences with `joiner` and paragraphs with "\\n" to get the document back with its
    paragraph breaks (empty paragraphs included).
    """
    parts: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for piece, text in zip(pieces, texts):
        parts.setdefault((piece.para, piece.sentence), []).append((piece.part, text.strip()))
    return [[joiner.join(t for _, t in sorted(parts.get((p, s), []))).strip() for s in range(n)]
            for p, n in enumerate(structure)]
