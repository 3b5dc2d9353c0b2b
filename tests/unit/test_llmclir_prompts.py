"""LLM-CLIR (../shared/papers/llm-clir.txt) reranking prompts: each prompt xling sends,
rendered with the figure's own placeholders, equals the figure's text word for word
(whitespace normalised). Figure 3 = listwise (RankZephyr), Figure 4 = pairwise (PRP)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xling.tasks.rerank import (DECODER_PREFIX, LISTWISE_SYSTEM, PASSAGE_PREFIX, listwise_prompt,
                                pairwise_prompt)

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
PAPER = SHARED / "papers" / "llm-clir.txt"

pytestmark = pytest.mark.skipif(
    not PAPER.is_file(), reason=f"the paper texts are not here ({PAPER} is absent): the prompt "
                                "check needs ../shared/papers from the project's shared folder")


def norm(text: str) -> str:
    return " ".join(text.split())


def figure(title: str) -> str:
    """The code block after the figure's title line (`LISTWISE RERANKING PROMPT`, ...)."""
    text = PAPER.read_text("utf-8")
    m = re.search(re.escape(title) + r"\s*```\n(.*?)```", text, re.S)
    assert m, f"{title} not found in {PAPER}"
    return m.group(1)


def test_listwise_prompt_is_figure_3():
    fig = figure("LISTWISE RERANKING PROMPT")
    system, rest = fig.split("<|user|>")
    user = rest.split("<|assistant|>")[0]
    assert norm(system.replace("<|systems|>", "")) == norm(LISTWISE_SYSTEM)
    # The figure shows passages 1, 2, ..., {num}; render three and write the figure so.
    user = user.replace("...\n[{num}] {passage {num}}", "[3] {passage 3}").replace("{num}", "3")
    got = listwise_prompt("{query}", ["{passage 1}", "{passage 2}", "{passage 3}"])
    assert [m["role"] for m in got] == ["system", "user"]
    assert got[0]["content"] == LISTWISE_SYSTEM
    assert norm(got[1]["content"]) == norm(user)
    # The figure's blank lines are kept: after the prefix, around the passages, before "Rank".
    assert "\n\nSearch Query: {query}.\n\nRank the 3 passages" in got[1]["content"]


def test_pairwise_prompt_is_figure_4():
    fig = figure("PAIRWISE RERANKING PROMPT")
    got = pairwise_prompt("{query}", "{document1}", "{document2}")
    assert [m["role"] for m in got] == ["user"]
    assert norm(got[0]["content"]) == norm(fig)
    # llm-rankers' variant: the same words, the query and passages quoted.
    impl = pairwise_prompt("{query}", "{document1}", "{document2}", "llm_rankers")[0]["content"]
    assert norm(impl.replace('"', "")) == norm(fig)
    assert impl.endswith('Passage B: "{document2}"\n\nOutput Passage A or Passage B:')
    # The answers' starts: llm-rankers continues a Llama's chat prompt by " Passage:" and a
    # T5's decoder (after its start token) by "Passage"; both then read "Passage A" or "B".
    assert (PASSAGE_PREFIX, DECODER_PREFIX) == (" Passage:", "Passage")
    assert fig.rstrip().endswith("Output Passage A or Passage B:")
