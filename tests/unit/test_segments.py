"""The engine-independent steps of translation (xling/actors/segments.py), one at a time."""

import random

from sentencex import segment

from xling.actors.segments import (Piece, decode_limit, joiner_for, padding_efficiency,
                                   reassemble, segment_document, split_long, token_batches)


def test_segment_document_keeps_paragraphs_and_empty_lines():
    text = "Hei maailma. Mitä kuuluu?\n\nToinen kappale on tässä.\n   \nViimeinen."
    paras = segment_document(text, lambda p: segment("fi", p))
    assert paras == [["Hei maailma.", "Mitä kuuluu?"], [], ["Toinen kappale on tässä."], [],
                     ["Viimeinen."]]


def test_split_long_prefers_word_starts_and_cuts_anywhere_when_it_must():
    words = [f"▁w{i}" if i % 3 == 0 else f"x{i}" for i in range(50)]
    pieces = split_long(words, 10)
    assert [t for p in pieces for t in p] == words  # nothing lost, order kept
    assert all(len(p) <= 10 for p in pieces)
    assert all(p[0].startswith("▁") for p in pieces[1:])  # cut before a word start
    blob = ["x"] * 25  # one "word" longer than the limit
    assert [len(p) for p in split_long(blob, 10)] == [10, 10, 5]
    assert split_long(words[:5], 10) == [words[:5]]


def test_token_batches_cover_every_item_once_within_budget():
    rng = random.Random(0)
    lengths = [rng.randint(3, 120) for _ in range(1000)] + [500]  # one over the budget
    batches = token_batches(lengths, max_tokens=512, window=256)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 512
    # Sorting within a window cuts padding against the input order.
    unsorted, batch, longest = [], [], 0
    for i, n in enumerate(lengths):
        if batch and max(longest, n) * (len(batch) + 1) > 512:
            unsorted.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, n)
    unsorted.append(batch)
    assert padding_efficiency(lengths, batches) > 0.9 > padding_efficiency(lengths, unsorted)


def test_decode_limit_is_relative_and_capped():
    assert decode_limit(10, 2.0, 10, 512) == 30
    assert decode_limit(400, 2.0, 10, 512) == 512
    assert decode_limit(0, 2.0, 0, 512) == 1


def test_reassemble_restores_order_paragraphs_and_split_sentences():
    structure = [2, 0, 1]  # paragraph 1 is empty
    pieces = [Piece(2, 0, 1, []), Piece(0, 1, 0, []), Piece(2, 0, 0, []), Piece(0, 0, 0, [])]
    texts = ["second half", "B", "first half", "A"]  # engine order is sorted, not original
    assert reassemble(structure, pieces, texts, " ") == [["A", "B"], [], ["first half second half"]]
    assert joiner_for("zho_Hans") == "" and joiner_for("jpn_Jpan") == "" and joiner_for("eng_Latn") == " "
