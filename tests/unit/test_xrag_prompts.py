"""XRAG's prompts are the paper's Figures 18, 19 and 20 word for word: each is rendered by
xling/studies/xrag/prompts.py and compared, whitespace normalised, with the figure's text in
../shared/papers/xrag.txt, rendered by Jinja with the same values after the restorations
that xling/studies/xrag/prompts.yaml lists (`pdf_fixes`: where the PDF text lost a
bracket, a quote or a list number)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import load_xrag_items

from xling.studies.base import StudyInputs
from xling.studies.registry import get_study
from xling.studies.xrag import prompts
from xling.studies.xrag.settings import SETTING_SPECS

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_xrag_prompts")

XRAG = get_study("xrag")

PAPER = Path(__file__).resolve().parents[2].parent / "shared" / "papers" / "xrag.txt"
if not PAPER.is_file():
    pytest.skip(f"the XRAG paper's text {PAPER} is absent (../shared next to the repository "
                "holds it): cannot compare the prompts with its figures",
                allow_module_level=True)
jinja2 = pytest.importorskip("jinja2", reason="jinja2 renders the paper's figure templates")

QUESTION = "Wie viele Menschen soll das neue Werk beschäftigen?"
ARTICLES = [{"text": "Nordwind Batteries will build a plant in Lyon.", "date": "2024-11-11"},
            {"text": "Die Fabrik soll 800 Menschen beschäftigen.", "date": "2024-11-03"}]


def norm(text: str) -> str:
    return " ".join(text.split())


def between(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i:text.index(end, i) + len(end)]


@pytest.fixture(scope="module")
def figures() -> dict[str, str]:
    """The figures' prompt text as the PDF gave it (captions and box titles left out)."""
    paper = PAPER.read_text(encoding="utf-8")
    fig18 = between(paper, "You are an AI assistant tasked with answering a given question.",
                    "such as your own knowledge.")          # xrag.txt L624
    fmt18 = between(paper, "Format your response as follows: <answer>[Your generated answer.",
                    "</answer>")                             # xrag.txt L628
    return {"rag_answer": fig18 + " " + fmt18,
            "no_retrieval": between(paper, "You are an AI assistant tasked with answering "
                                           "questions.",
                                    "Otherwise, output: <answer>None</answer>"),  # L634-640
            "judge": between(paper, "You are an AI assistant tasked with result evaluation.",
                             "[correct or incorrect]")}      # xrag.txt L651-676


def paper_prompt(figures, name: str, **values) -> str:
    text = norm(figures[name])
    for pdf, ours in prompts.prompts()["pdf_fixes"][name]:
        assert text.count(norm(pdf)) == 1, f"{name}: {pdf!r} is not in the figure once"
        text = text.replace(norm(pdf), norm(ours))
    return norm(jinja2.Template(text).render(**values))


def test_rag_answer_prompt_is_figure_18(figures):
    (msg,) = prompts.render_prompt(QUESTION, ARTICLES)
    expected = paper_prompt(figures, "rag_answer", question=QUESTION, articles=[
        (i, a["text"], a["date"]) for i, a in enumerate(ARTICLES, 1)])
    assert msg["role"] == "user"
    assert norm(msg["content"]) == expected
    assert "<text_2> Die Fabrik soll 800 Menschen beschäftigen. </text_2> <date_2> 2024-11-03" \
        in expected


def test_no_retrieval_prompt_is_figure_19(figures):
    (msg,) = prompts.render_prompt(QUESTION, None)
    assert norm(msg["content"]) == paper_prompt(figures, "no_retrieval", question=QUESTION)
    assert msg["content"].endswith("Otherwise, output: <answer>None</answer>")


def test_judge_prompt_is_figure_20(figures):
    item = {"question": QUESTION, "answer": "800 Menschen", "en_question": "How many?",
            "en_answer": "800 people", "setting": "multi"}
    (msg,) = prompts.judge_prompt(item, "Etwa 800 Menschen.")
    assert norm(msg["content"]) == paper_prompt(figures, "judge", question=QUESTION,
                                                answer="800 Menschen", pred="Etwa 800 Menschen.")
    # rule 5 (the answer's language) is there, and the reply's keys are the paper's
    assert "5. If the generated answer is in a different language than the golden answer, " \
           "it should be considered as wrong." in norm(msg["content"])
    assert re.search(r'"justification": \[.*\],\s*"answer": \[correct or incorrect\]',
                     msg["content"], re.S)


def test_every_setting_uses_a_paper_prompt():
    """Settings with articles get Figure 18; those without, Figure 19: no other wording."""
    data = Path(__file__).resolve().parents[1] / "data" / "xrag" / "xrag.test.jsonl"
    o = XRAG.validate_options({"data": str(data), "langs": ["zh"]})
    tr = {a["doc_id"]: "An English text." for it in load_xrag_items(data)
          for a in it["articles"]}
    for setting, spec in SETTING_SPECS.items():
        for r in XRAG.build_prompts(o, setting, "zh", inputs=StudyInputs(translations=tr)):
            text = r["prompt"][0]["content"]
            head = ("You are an AI assistant tasked with answering questions."
                    if spec.docs == "none"
                    else "You are an AI assistant tasked with answering a given question.")
            assert text.startswith(head), setting
