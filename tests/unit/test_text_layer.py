"""xling/tasks/text.py, the multilingual text layer: a per-language table of real paragraphs
(every language of the five papers, tests/data/text/paragraphs.json) segmented into their
sentences with the planted needle sentence its own unit; the rules sentencex misses (no
space after a full stop, Thai, Khmer, reference marks); decimals and
abbreviations kept; word counts per unit; digits and Chinese numerals; language ID with
lingua and langid.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xling.tasks.languages import STUDY_LANGUAGES, UnknownLanguageError
from xling.tasks.text import (LanguageID, _sentencex, count_units, count_words, fingerprint,
                              normalize_digits, normalize_numerals, parse_number,
                              sentence_spans, sentences, word_unit)

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "text" / "paragraphs.json")
                  .read_text("utf-8"))["paragraphs"]

# The languages of the five papers (issue 27): XRAG, BordIRLines' 49, MIRAGE's 18, CROSS
# (mLongRR-V2's seven and the first release's Somali and Chinese), LLM-CLIR, and ja th te bn.
PAPER_LANGUAGES = sorted({*STUDY_LANGUAGES["xrag"], *STUDY_LANGUAGES["bordirlines"],
                          *STUDY_LANGUAGES["mirage"],
                          *"en vi sw fa ru hi ar so zh".split(),
                          *"fi it ru de ha so sw yo".split(), *"ja th te bn".split()})
NEEDLE_NUMBER = "4753820"


def test_the_table_covers_every_language_of_the_papers():
    assert sorted(DATA) == PAPER_LANGUAGES
    assert len(PAPER_LANGUAGES) == 55


@pytest.mark.parametrize("lang", PAPER_LANGUAGES)
def test_paragraph_sentences_and_needle(lang):
    para = DATA[lang]
    text = para["joiner"].join(para["sentences"])
    got = sentences(text, lang)
    assert got == para["sentences"]  # the sentence count, and each sentence exactly
    needle = para["sentences"][para["needle"]]
    assert needle in got  # the planted needle is a unit of its own
    assert parse_number_in(needle) == int(NEEDLE_NUMBER)
    spans = sentence_spans(text, lang)
    assert [text[s:e] for s, e in spans] == got
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def parse_number_in(sentence: str) -> int:
    """The needle's number, whatever digits or numerals it is written in."""
    import re

    digits = re.findall(r"[0-9]{7}", normalize_numerals(sentence))
    assert len(digits) == 1, sentence
    return int(digits[0])


@pytest.mark.parametrize("lang", [c for c in PAPER_LANGUAGES
                                  if DATA[c]["sentences"][0].endswith(".")
                                  and word_unit(c) == "words"])
def test_no_space_after_the_full_stop(lang):
    """Scraped text often has no space after a full stop ("end.Next")."""
    para = DATA[lang]
    glued = "".join(para["sentences"])
    assert sentences(glued, lang) == para["sentences"]


def test_decimals_abbreviations_and_lines():
    text = ("It costs 4753820.5 dollars.Then we left. See e.g. the U.S. report. "
            "Dr. Smith came at 5 p.m. on Monday. Visit example.com today.\nA new line")
    assert sentences(text, "en") == [
        "It costs 4753820.5 dollars.", "Then we left.", "See e.g. the U.S. report.",
        "Dr. Smith came at 5 p.m. on Monday.", "Visit example.com today.", "A new line"]
    # Somali needles have no full stop and scraped Somali text no space after one
    so = "Maanta way fiican tahay.waxaan aadaynaa beerta.Lambarka gaarka ah ee Qaahira waa 4753820."
    assert sentences(so, "so")[-1] == "Lambarka gaarka ah ee Qaahira waa 4753820."
    assert sentences("他说：“你好。”然后走了。价格是3.5元", "zh") == ["他说：“你好。”", "然后走了。",
                                                             "价格是3.5元"]
    # scraped CJK text has spaces where markup was removed: a space is no boundary there
    assert sentences("第一句话没有标点 第二句话也没有", "zh") == ["第一句话没有标点 第二句话也没有"]
    # Wikipedia reference marks stay with the sentence they close
    assert sentences("এটি একটি ভাষা।[1][4] এটি পুরানো।", "bn") == ["এটি একটি ভাষা।[1][4]",
                                                              "এটি পুরানো।"]
    # Thai: spaces between Thai words end a sentence, those around numbers and brackets not
    # (a unit of fewer than ten letters joins its neighbour: see test_thai_phrases)
    assert sentences("ในปี 2020 มีผู้ใช้ (ประมาณ) มาก เขาไปตลาดทุกวัน", "th") == [
        "ในปี 2020 มีผู้ใช้ (ประมาณ) มาก", "เขาไปตลาดทุกวัน"]
    assert sentences("आज मौसम अच्छा है।हम चलते हैं।", "hi") == ["आज मौसम अच्छा है।", "हम चलते हैं।"]
    assert sentences("هل تريد الذهاب؟نعم.", "ar") == ["هل تريد الذهاب؟", "نعم."]
    assert sentences("", "en") == [] and sentences("  \n ", "th") == []
    # dataset codes and aliases of the language table
    assert sentences("今天天氣很好。我們走吧。", "zht") == ["今天天氣很好。", "我們走吧。"]
    assert len(sentences("היום יפה. בוא נלך.", "he")) == 2


def test_a_long_piece_sentencex_keeps_whole_is_cut_by_xlings_rules():
    """sentencex reads "kan." as an abbreviation (Kansas) and returns this whole text as one
    piece; the lower-case-word rule cuts it. Each cut looks only at its own word: looking at
    the text before it made a piece of n sentences cost n² (20,000 sentences took 78 s, a
    CROSS haystack of 384k words 38 s; now both are well under a second)."""
    text = " ".join(["Ó rí ewé kan."] * 20_000)
    assert len(_sentencex()("yo", text)) == 1
    got = sentences(text, "yo")
    assert len(got) == 20_000 and set(got) == {"Ó rí ewé kan."}
    # the rule's limits hold in a long piece too: a short or capitalised word before the
    # stop, or a lower-case word after it, is no boundary
    text = " ".join(["Ó rí ewé kan. Ní Dr. Ade rí ewé kan. ọjà ni kan."] * 3_000)
    assert len(_sentencex()("yo", text)) == 1
    assert sentences(text, "yo") == ["Ó rí ewé kan.", "Ní Dr. Ade rí ewé kan. ọjà ni kan."] * 3_000


def test_the_rules_cut_where_their_plain_regex_statement_cuts():
    """`_cuts` finds each stop first and checks the word before it; the rules stated as one
    regex each (lookbehinds, and the word read back from the text before the stop) are the
    reference, on random strings of letters, digits, stops, spaces and several scripts."""
    import random
    import re

    from xling.tasks.text import _cuts

    glued = re.compile(r"(?:(?<=[^\W\d_]{2})|(?<=\d))[.!?]+(?=[^\W\d_]{2})"
                       r"(?!(?:com|org|net|edu|gov|int|info|io|html?|pdf)\b)")
    spaced = re.compile(r"(?<=[^\W\d_]{3})[.!?]+\s+(?=[^\W\d_])")

    def reference(piece):
        cuts = {m.end() for m in glued.finditer(piece)}
        for m in spaced.finditer(piece):
            word = re.search(r"[^\W\d_]+$", piece[:m.start()]).group()
            if word.islower() and piece[m.end()].isupper():
                cuts.add(m.end())
        return sorted(c for c in cuts if 0 < c < len(piece))

    rng = random.Random(7)
    parts = [*"abXYé .!?  ²٣4_", "ni", "Dr.", "kan. Ní", "U.S.", "x.com", ".Wax", "।", "ক", "Ω"]
    for _ in range(5_000):
        piece = "".join(rng.choice(parts) for _ in range(rng.randint(1, 30)))
        strong = _cuts(piece, "Beng")  # an uncased script: the strong terminators only
        assert _cuts(piece, "Latn") == sorted(set(reference(piece)) | set(strong)), piece


def test_pieces_without_a_stop_inside_skip_the_rules_and_lose_no_cut():
    """`_cuts` returns at once for a piece with no stop before its last character (most of
    them); on random pieces of every script's stops, closers, reference marks, Thai spaces
    and Latin words, what it returns is what the rules themselves cut."""
    import random

    from xling.tasks.text import _cuts, _rule_cuts

    rng = random.Random(11)
    parts = [*"abXYé 12.!?。！？।॥؟۔។။」』)]\"' ", "[1]", "\u0e01\u0e32", "\u0e81", "\u4e00",
             "\u3042", "ni", "kan. Ní", "U.S.", "x.com", ".Wax", "e.g."]
    skipped = 0
    for _ in range(4_000):
        piece = "".join(rng.choice(parts) for _ in range(rng.randint(0, 16)))
        for script in ("Latn", "Cyrl", "Hans", "Jpan", "Thai", "Laoo", "Deva", "Arab", "Khmr"):
            assert _cuts(piece, script) == _rule_cuts(piece, script), (piece, script)
        skipped += not any(c in ".!?。！？।॥؟۔។။" for c in piece[:-1])
    assert skipped > 400  # the quick path was taken, and agreed


def test_unknown_languages_are_errors_never_a_fallback():
    for bad in ("xx", "english-ish", ""):
        with pytest.raises(UnknownLanguageError):
            sentences("Hello. World.", bad)
        with pytest.raises(UnknownLanguageError):
            count_words("Hello", bad)


def test_fingerprint_names_segmenter_and_rules():
    fp = fingerprint()
    assert fp.startswith("sentencex-") and "+xling-text-" in fp


def test_word_counts_name_their_unit():
    assert count_units("Hello world, 42 — ok!", "en") == (4, "words")
    assert count_units("我们有GPT 2024年的数据。", "zh") == (9, "characters")
    assert count_units("その村は緑の丘のふもとにあります。", "ja") == (16, "characters")
    assert count_units("วันนี้อากาศดี", "th") == (9, "characters")  # marks not counted
    assert word_unit("hi") == "words" and word_unit("km") == "characters"
    for lang in PAPER_LANGUAGES:
        para = DATA[lang]
        text = para["joiner"].join(para["sentences"])
        n, unit = count_units(text, lang)
        assert unit == word_unit(lang)
        if unit == "words":
            # every whitespace token but a lone dash (ru, uk) has a letter or digit
            assert n == len(text.split()) - text.split().count("—")
        else:
            assert len(text.split()) < n <= len(text)


def test_digits_and_numbers():
    assert normalize_digits("۴۷۵۳۸۲۰ ٤٧٥٣٨٢٠ ४७५३८२० ৪৭৫৩৮২০ ๔๗๕๓๘๒๐ ４７５３８２０") == \
        " ".join(["4753820"] * 6)
    assert normalize_digits("2k, 8k") == "2k, 8k" and normalize_digits("") == ""
    for written in ("4753820", "4,753,820", "۴٬۷۵۳٬۸۲۰", "4 753 820", "四百七十五万三千八百二十",
                    "四七五三八二〇", "475万3820", "肆佰柒拾伍萬叁仟捌佰贰拾"):
        assert parse_number(written) == 4753820, written
    assert parse_number("十") == 10 and parse_number("一千零五") == 1005
    assert parse_number("三亿四千万五千") == 340_005_000
    for bad in ("4753820.5", "abc", "", "四七五百"):
        assert parse_number(bad) is None, bad
    assert normalize_numerals("数字是四百七十五万三千八百二十。") == "数字是4753820。"
    assert normalize_numerals("2024年") == "2024年"


def test_language_id_lingua_default():
    lid = LanguageID(["en", "de", "zh"], low_accuracy=True)
    assert lid.setting["backend"] == "lingua" and lid.setting["version"]
    assert lid.fingerprint.startswith("lingua-") and lid.setting["fingerprint"] == lid.fingerprint
    texts = ["The weather is lovely today and we are going to the park.",
             "Das Wetter ist heute schön und wir gehen in den Park.", "今天天气很好，我们去公园。",
             "", None]
    assert lid.detect(texts) == ["en", "de", "zh", None, None]
    probs = lid.probabilities(texts)
    assert probs[3] is None and probs[4] is None
    assert set(probs[1]) == {"de", "en", "zh"} and max(probs[1], key=probs[1].get) == "de"
    assert sum(probs[0].values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="lingua cannot identify"):
        LanguageID(["en", "ha"])
    with pytest.raises(UnknownLanguageError):
        LanguageID(["en", "xx"])
    with pytest.raises(ValueError, match="backend"):
        LanguageID(["en", "de"], backend="cld3")


def test_language_id_langid_compat():
    lid = LanguageID(["en", "de", "iw"], backend="langid", restrict=False)
    assert lid.setting["backend"] == "langid" and lid.setting["candidates"] == "all"
    assert lid.setting["version"] == "1.1.6"
    texts = ["The weather is lovely today and we are going to the park.",
             "Das Wetter ist heute schön und wir gehen in den Park.",
             "מזג האוויר יפה היום ואנחנו הולכים לפארק.",
             "Il fait beau aujourd'hui et nous allons au parc."]
    assert lid.detect(texts) == ["en", "de", "iw", None]  # French: not a requested language
    probs = lid.probabilities(texts)
    assert max(probs[2], key=probs[2].get) == "iw" and probs[2]["iw"] > 0.9
    assert sum(probs[3].values()) < 0.5  # all 97 languages are candidates: French wins
    restricted = LanguageID(["en", "de"], backend="langid")
    assert sum(restricted.probabilities(texts[:1])[0].values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="langid.py has no model for \\['yo'\\]"):
        LanguageID(["en", "yo"], backend="langid")


def test_identifiable_by_backend():
    from xling.tasks.text import backend_version, identifiable

    assert identifiable(["en", "ha", "yo"], "lingua") == ["en", "yo"]  # lingua has no Hausa
    assert identifiable(["en", "ha", "yo", "iw"], "langid") == ["en", "iw"]
    assert backend_version("langid") == "1.1.6"
    with pytest.raises(ValueError, match="backend"):
        identifiable(["en"], "cld3")


def test_mirage_nli_pairs_split_zh_and_th_sentences():
    """MIRAGE's support feature pairs each cited sentence with its passage: in Chinese and
    Thai (no spaces after sentence ends) each sentence keeps its own citation."""
    from xling.studies.mirage import features

    passages = {"a#1": "赫尔辛基是首都。", "b#2": "芬兰在欧洲。"}
    out = "##Reason: 赫尔辛基是芬兰的首都[a#1]。芬兰位于欧洲[b#2]。\n\n##Answer: 赫尔辛基"
    pairs = features.support_pairs(out, passages, "zh")
    assert [(p["docid"], p["hypothesis"]) for p in pairs] == [
        ("a#1", "赫尔辛基是芬兰的首都。"), ("b#2", "芬兰位于欧洲。")]
    th = {"a#1": "เฮลซิงกิเป็นเมืองหลวง", "b#2": "ฟินแลนด์อยู่ในยุโรป"}
    out = ("##Reason: เฮลซิงกิเป็นเมืองหลวงของฟินแลนด์[a#1] ฟินแลนด์อยู่ในยุโรป[b#2]\n\n"
           "##Answer: เฮลซิงกิ")
    assert [p["docid"] for p in features.support_pairs(out, th, "th")] == ["a#1", "b#2"]
