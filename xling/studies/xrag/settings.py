"""XRAG's settings: which instances, question language, articles and translations each one
runs (README.md has the table), and the names of earlier xling versions that are refused."""

from __future__ import annotations

from dataclasses import dataclass

STUDY = "xrag"
LANGS = ("de", "es", "zh", "ar")


@dataclass(frozen=True)
class Setting:
    subset: str            # "mono" | "multi": which instances
    question: str          # "x" | "en": the question's language, and so the answer's
                           # (xrag.txt L89 Eq. 1; "+EQ" changes both, L247)
    docs: str              # "all" | "supporting" | "none": which articles are shown
    translate: str         # "none" | "supporting" | "all": which X-language articles are
                           # replaced by their English translation (ES / ES+ED)
    label: str             # the row or column name in the tables
    paper: str | None      # where the paper reports it; None: an extension (ext_*)


SETTING_SPECS: dict[str, Setting] = {
    # the paper's settings (xrag.txt L194-257, L690-712)
    "no_retrieval": Setting("mono", "en", "none", "none", "No Retrieval",
                            "Table 3 (L194-203; Figure 19 prompt)"),
    "oracle": Setting("mono", "en", "supporting", "none", "Oracle Retrieval",
                      "Table 3 (L194-203)"),
    "mono": Setting("mono", "x", "all", "none", "Monolingual retrieval",
                    "Table 4, De/Es/Zh/Ar (L211-219)"),
    "mono_en": Setting("mono", "en", "all", "none", "English baseline (En)",
                       "Table 4, En (L224)"),
    "multi": Setting("multi", "x", "all", "none", "XRAG-MultiR",
                     "Table 5, En+X; Table 6, XRAG-MultiR (L230-255)"),
    "multi_eq": Setting("multi", "en", "all", "none", "+EQ", "Table 6, +EQ (L247-255)"),
    "multi_eq_es": Setting("multi", "en", "all", "supporting", "+EQ, +ES",
                           "Table 6, +EQ, +ES (L247-257)"),
    "multi_en_x": Setting("multi", "en", "all", "all", "MonoRAG (+EQ, +ES, +ED)",
                          "Table 5, En+En_X; Table 6, MonoRAG (L237, L243, L255)"),
    # extensions: not in the paper, never in its tables
    "ext_no_retrieval_xq": Setting("mono", "x", "none", "none",
                                   "[ext] no retrieval, X question", None),
    "ext_oracle_xq": Setting("mono", "x", "supporting", "none",
                             "[ext] oracle (mono), X question", None),
    "ext_multi_oracle_xq": Setting("multi", "x", "supporting", "none",
                                   "[ext] oracle (multi), X question", None),
    "ext_multi_xq_es": Setting("multi", "x", "all", "supporting",
                               "[ext] multi, X question, X supporting article in English", None),
    "ext_multi_xq_es_ed": Setting("multi", "x", "all", "all",
                                  "[ext] multi, X question, all X articles in English", None),
}
SETTINGS = tuple(SETTING_SPECS)
PAPER_SETTINGS = tuple(s for s, spec in SETTING_SPECS.items() if spec.paper)
# Names of earlier xling versions, which misread the paper's ablations.
RENAMED = {
    "multi_es": "it was not a paper setting (X question, English answer) and is gone; "
                "the paper's +EQ, +ES is multi_eq_es",
    "multi_ed": "it was not the paper's MonoRAG; MonoRAG is multi_en_x, and 'X question, "
                "all X articles in English' is ext_multi_xq_es_ed",
    "mono_eq": "it was not a paper setting (English question, X answer) and is gone",
    "multi_oracle": "it is not a paper setting; use ext_multi_oracle_xq",
}
TABLE6_ROWS = ("multi", "multi_eq", "multi_eq_es", "multi_en_x")  # xrag.txt L250-253


def spec_of(setting: str) -> Setting:
    """The setting's spec; ValueError naming the choices for an unknown one."""
    try:
        return SETTING_SPECS[setting]
    except KeyError:
        raise ValueError(f"unknown XRAG setting {setting!r}; choose from {list(SETTINGS)}") \
            from None


def needs_translation(setting: str) -> bool:
    """Does the setting read English translations of X articles (+ES, En+En_X)?"""
    return spec_of(setting).translate != "none"


def expected_language(setting: str, lang: str) -> str:
    """The language an answer in this cell must be in: the question's (xrag.txt L89)."""
    return "en" if spec_of(setting).question == "en" else lang
