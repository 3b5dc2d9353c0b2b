"""Language identification of generated answers with lingua, restricted to a study's languages.

Restricting the candidate set (XRAG: the question languages plus English) is what the
studies do: an answer is only ever asked "is it in the question's language or in English?",
and a short answer is then far less often mistaken for a related language. The detector
takes lingua enum names (``GERMAN``), so it knows nothing of xling's language table.
"""

from __future__ import annotations

from importlib.metadata import version

# Decimals kept of lingua's confidence values (see LanguageDetector.probabilities).
DECIMALS = 10


class LanguageDetector:
    """``detect(texts)`` -> the lingua name of each text's language, or None (empty text, or
    no candidate language is likely enough). ``probabilities(texts)`` -> each text's
    confidence per candidate language, for features that need a probability rather than a
    decision (MIRAGE-Bench's language detection)."""

    def __init__(self, languages: list[str], *, low_accuracy: bool = False):
        from lingua import Language, LanguageDetectorBuilder

        if len(set(languages)) < 2:
            raise ValueError(f"lingua needs at least two candidate languages, got {languages}")
        unknown = [n for n in languages if not hasattr(Language, n)]
        if unknown:
            raise ValueError(f"lingua has no language named {unknown}")
        builder = LanguageDetectorBuilder.from_languages(*(getattr(Language, n) for n in languages))
        if low_accuracy:
            builder = builder.with_low_accuracy_mode()
        self.detector = builder.build()
        self.setting = {"detector": "lingua", "version": version("lingua-language-detector"),
                        "languages": sorted(set(languages)),
                        "mode": "low_accuracy" if low_accuracy else "high_accuracy"}

    def detect(self, texts: list[str | None]) -> list[str | None]:
        todo = [i for i, t in enumerate(texts) if t and t.strip()]
        found = self.detector.detect_languages_in_parallel_of([texts[i] for i in todo])
        out: list[str | None] = [None] * len(texts)
        for i, lang in zip(todo, found):
            out[i] = lang.name if lang is not None else None
        return out

    def probabilities(self, texts: list[str | None]) -> list[dict[str, float] | None]:
        """lingua's confidence values (``compute_language_confidence_values``) for every
        candidate language, keyed by ISO 639-1 code in lower case (``"de"``), in code order;
        None for an empty text.

        The values of a text sum to 1 (to 1e-9), except for a text with no letters lingua
        knows (digits, punctuation), where all are 0. Values are rounded to 10 decimals:
        lingua 2.1's raw values for the same text differ from call to call in their last
        bits (~1e-17, seen on repeated calls in one process: its summation order is not
        fixed); rounded, the same text gets the same values.
        """
        todo = [i for i, t in enumerate(texts) if t and t.strip()]
        found = self.detector.compute_language_confidence_values_in_parallel(
            [texts[i] for i in todo])
        out: list[dict[str, float] | None] = [None] * len(texts)
        for i, values in zip(todo, found):
            probs = {v.language.iso_code_639_1.name.lower(): round(float(v.value), DECIMALS)
                     for v in values}
            out[i] = dict(sorted(probs.items()))
        return out
