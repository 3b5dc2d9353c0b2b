"""The BordIRLines prompts are the paper's Table 5, word for word: each prompt xling sends is
rendered and compared with the table's text in ../shared/papers/bordirlines.txt (whitespace
normalised: the PDF text of a table cell has no line breaks). The repairs of the PDF text
are the ones documented in xling/studies/bordirlines/prompts.yaml, and nothing else. Also: the
answer parsers read the paper's own outputs (Table 14)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xling.studies.bordirlines.parse import map_option, parse_citation, parse_direct
from xling.studies.bordirlines.prompts import (
    PROMPT_TEMPLATES,
    SYSTEM_PROMPT,
    build_prompts,
    render_citation,
    render_direct,
)
from xling.studies.registry import get_study

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_bordirlines_prompts")

validate = get_study("bordirlines").validate_options  # study.options -> the options dict

PAPER = Path(__file__).resolve().parents[2].parent / "shared" / "papers" / "bordirlines.txt"


def norm(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def table5() -> dict[str, str]:
    """Table 5's cells (bordirlines.txt L483-493) by row label; the citation prompt's four
    sub-rows (L488-491) as citation_1..citation_4."""
    if not PAPER.is_file():
        pytest.skip(f"the paper text is not here ({PAPER}: ../shared/papers, next to the "
                    "repository, holds the papers; this check needs it)")
    lines = PAPER.read_text("utf-8").splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("Task\tPrompt"))
    end = next(i for i, x in enumerate(lines) if x.startswith("Table 5:"))
    cells: dict[str, str] = {}
    sub = 0
    for line in lines[start + 1:end]:
        label, _, text = line.partition("\t")
        text = text.strip("\t ")
        if label:
            cells[label] = text
        elif text:
            sub += 1
            cells[f"citation_{sub + 1}"] = text
    cells["citation_1"] = cells.pop("Citation-Based RAG Prompt")
    return cells


def test_table5_has_the_rows_we_use(table5):
    assert set(table5) >= {"System Prompt", "Multiple-Choice Generation Prompt Augmented by "
                           "Retrieved Documents", "Multiple-Choice Generation Prompt",
                           "citation_1", "citation_2", "citation_3", "citation_4"}


def test_system_prompt_is_verbatim(table5):
    assert SYSTEM_PROMPT == table5["System Prompt"]
    assert norm(PROMPT_TEMPLATES["system"]) == norm(table5["System Prompt"])


def _source(cell: str) -> str:
    # the paper's "{source: X}" placeholder is the text X
    return re.sub(r"\{source: ([^}]*)\}", r"\1", cell)


def test_direct_prompt_with_documents_is_verbatim(table5):
    system, user = render_direct("{query}", "{options}", ["{document_text}"])
    assert system == {"role": "system", "content": table5["System Prompt"]}
    assert user["role"] == "user"
    # one document, id 0 (the paper's {document_id}; its outputs cite 0-based ids)
    paper = _source(table5["Multiple-Choice Generation Prompt Augmented by Retrieved "
                           "Documents"]).replace("{document_id}", "0")
    assert norm(user["content"]) == norm(paper)
    # two documents: the Document/Text block repeats with ids 0, 1
    _, user2 = render_direct("q", "A) x", ["first", "second"])
    assert user2["content"].startswith("Document: 0\nText: first\n\nDocument: 1\nText: "
                                       "second\n\nInstruction: Considering the provided")


def test_direct_prompt_without_documents_is_verbatim(table5):
    system, user = render_direct("{query}", "{options}", None)
    assert system["content"] == table5["System Prompt"]
    paper = _source(table5["Multiple-Choice Generation Prompt"])
    # no_ir: the document slot of L487 is repeated zero times
    slot = "Document: {document_id} Text: {document_text} "
    assert paper.startswith(slot)
    assert norm(user["content"]) == norm(paper[len(slot):])


def test_citation_prompt_is_verbatim(table5):
    system, user = render_citation("{query}", "{options}", ["{text0}", "{text1}"])
    # System Preamble (L488) + User Preamble (L489) are the system message
    assert norm(system["content"]) == norm(table5["citation_1"] + " " + table5["citation_2"])
    # L490: "{other documents}" stands for the rest of the list (here there is none)
    query_docs = table5["citation_3"].replace(" {other documents}", "")
    # L491, with the two documented repairs of the PDF text: the extraction lower-cased the
    # tag in "<docN>" and appended closing tags after {options}
    instruction = table5["citation_4"]
    assert instruction.endswith("{options}</doc2></doc0></docn>")
    instruction = instruction.replace("</doc2></doc0></docn>", "").replace("<docn>", "<docN>")
    assert norm(user["content"]) == norm(query_docs + " " + instruction)
    # ids run from 0 and the tags are cited from 0
    assert "Document: 0\nText: {text0}\n\nDocument: 1\nText: {text1}" in user["content"]
    assert "for example, <doc0> or <doc2>" in user["content"]


def test_built_prompts_use_the_templates():
    fixture = Path(__file__).resolve().parents[1] / "data" / "bordirlines"
    opts = validate({"data": str(fixture), "retriever": "m3", "k": 3, "bootstrap": 0,
                     "prompts": ["direct", "citation"]})
    (row,) = [r for r in build_prompts(opts, "qlang-citation", "ru")
              if r["item_id"] == "Crimea_ru"]
    system, user = row["prompt"]
    assert system["content"] == PROMPT_TEMPLATES["citation_system"]
    assert user["content"].startswith("Query: Является ли Крым территорией A) Россия или "
                                      "B) Украина?\n\nDocument: 0\nText: ")
    assert user["content"].endswith("Options:\nA) Россия\nB) Украина")
    no_ir = build_prompts(opts, "no_ir-direct", "ru")[0]["prompt"][1]["content"]
    assert no_ir.startswith("Instruction: Considering your prior knowledge, answer the query.")
    assert no_ir.endswith("Option:\nA) Россия\nB) Украина\n\nAnswer:")


# The paper's own citation-format outputs (Table 14, bordirlines.txt L715-722: GPT-4o-mini,
# en_only), shortened; the PDF put each on one line.
PAPER_OUTPUTS = [
    ("Cited Documents: 0 , 1, 2, 4, 5 Chosen Option: A) Việt Nam Explanation: The Spratly "
     "Islands ... in 2012 <doc2>. ... islands <doc1>. ... <doc4>. ... framework <doc0>, "
     "<doc5>.", "0,1,2,4,5", "A) Việt Nam", "2,1,4,0,5"),
    ("Cited Documents: 3, 4, 1, 2, 0 Chosen Option: D) 中華人民共和國 Explanation: The "
     "Spratly Islands ... Hainan province <doc3>. ... nations <doc1>. ... <doc4>. ... <doc0>.",
     "3,4,1,2,0", "D) 中華人民共和國", "3,1,4,0"),
    # the prompt asks for one label a line
    ("Cited Documents: 0, 2\nChosen Option: B) Ukraine\nExplanation: because <doc0> and "
     "<doc2> say so.", "0,2", "B) Ukraine", "0,2"),
]


@pytest.mark.parametrize("text, cited, option, cited_text", PAPER_OUTPUTS)
def test_parsers_read_the_papers_outputs(text, cited, option, cited_text):
    parsed, err = parse_citation(text)
    assert err is None
    assert (parsed["cited"], parsed["option"], parsed["cited_text"]) == (cited, option,
                                                                        cited_text)
    assert parse_direct(text)[0] == {"option": option}


def test_direct_parser_reads_answers_to_the_direct_prompt():
    # the prompt ends "Option:\nA) ...\n\nAnswer:"; a model may echo either label
    assert parse_direct("A) Россия") == ({"option": "A) Россия"}, None)
    assert parse_direct("Answer: B) Украина")[0] == {"option": "B) Украина"}
    assert parse_direct("Option: B) Україна")[0] == {"option": "B) Україна"}
    assert map_option("Option: B) Україна", "uk", "Crimea") == "Ukraine"
