"""What the CROSS paper (and the mLongRR v1 code it builds on) fixes: the languages, the grid
of lengths, depths, needle counts and caps, the 23 cities, the two prompt boxes, and the
names of the choices the options offer. Citations: "L<n>" is a line of
``../shared/papers/cross-mlongrr.txt``, "s<n>" a section of ``../shared/specs/cross-mlongrr.md``.
"""

from __future__ import annotations

from pathlib import Path

STUDY = "cross"
LANGS = ("en", "vi", "sw", "fa", "ru", "hi", "ar")  # L271
KS = (3, 5, 10, 20, 50)  # L55
LENGTHS = ("2k", "8k", "16k", "32k", "64k", "128k", "256k", "512k")  # L285
POSITIONS = (0, 25, 50, 75, 100)  # L281, L291
WINDOW_POSITIONS = (0, 25, 50, 75)  # v1 3-needle quartile windows (s1.5)
NEEDLES = (1, 3)
METHODS = ("baseline", "cross", "needle_only")
MID_POSITIONS = (25, 50, 75)  # "mid-context" (L125)
CITIES = ("Chicago", "Yangon", "Antananarivo", "Colombo", "Almaty", "Sydney", "Mexico City",
          "Seattle", "Lagos", "Amsterdam", "Belgrade", "Cairo", "Baghdad", "Damascus", "Kigali",
          "Dakar", "Sofia", "Victoria", "Tashkent", "Mumbai", "Barcelona", "Amman",
          "Toronto")  # L313-335
DATA_DIR = Path(__file__).with_name("data")
TEMPLATES_PATH = DATA_DIR / "templates.json"
PUNKT_ENGLISH_DIR = DATA_DIR / "punkt_tab_english"

# The two boxes of Appendix D.2, verbatim. The 1-needle box (L343-355) is printed with a
# blank line after every line, an artefact of the PDF extraction that the 3-needle box
# (L363-371) does not have; both use the 3-needle layout (s2.4). Note the comma before
# "respond" in the 1-needle box (L355) and none in the 3-needle box (L371).
PAPER_PROMPTS = {
    1: ("You are a helpful AI bot that answers questions for a user. Keep your response short "
        "and direct.\n\n#CONTEXT\n{text}\n#ENDCONTEXT\n\n#QUESTION\nWhat is the special magic "
        "number? Don't give information outside the document or repeat your findings.\nIf the "
        "information is not available in the context, respond UNANSWERABLE."),
    3: ("You are a helpful AI bot that answers questions for a user. Keep your response short "
        "and direct.\n\n#CONTEXT\n{text}\n#ENDCONTEXT\n\n#QUESTION\nWhat is the largest special "
        "magic number? Don't give information outside the document or repeat your findings.\n"
        "If the information is not available in the context respond UNANSWERABLE."),
}
PROMPT_VARIANTS = ("paper", "no_unanswerable")  # L234: the UNANSWERABLE sentence removed
ORDERS = ("score", "document")
JOINS = (" ", "\n")
QUERY_TEXTS = ("question", "instruction")
# "multilingual": the text layer (xling/tasks/text.py), blind, the default; "punkt_english":
# v1's splitter for every language (s2.1), the compat setting that reproduces the paper;
# "oracle": the text layer with each needle cut out by its template (gold knowledge: an
# ablation, labelled "oracle" in every table).
SPLITTERS = ("multilingual", "punkt_english", "punkt_untrained", "punkt_trained", "oracle")
ORACLE_SPLITTERS = ("oracle",)
# "exact": the number the model gives as its answer is the gold (the paper's "exact match",
# L106, "correctly identifies ... the largest", L299; metrics.answer_number), the default;
# "containment": the gold string occurs in the answer (v1's only published scoring code, s1.7).
SCORINGS = ("exact", "containment")
FAILURE_RULES = ("target", "all")
FAILURE_DETAILS = ("correct", "embedding_failure", "llm_unanswerable", "llm_incorrect",
                   "too_long")
