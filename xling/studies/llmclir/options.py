"""The LLM-CLIR study's options: which parts of the paper's tables to render."""

from __future__ import annotations

from pydantic import Field

from xling.studies.base import StudyOptions


class Options(StudyOptions):
    headroom: bool = Field(True, description="PRI and Realized % on each table's AVG column, for "
                                             "every reranker whose first stage and its oracle "
                                             "are evaluated (llm-clir.txt L249-257)")
    paper: bool = Field(True, description="the paper's rows beside xling's, from the `paper:` "
                                          "section of evaluate.expected (configs/"
                                          "retrieve-ciral.expected.yaml)")
    settings: bool = Field(True, description="a table of this config's retrieval, rerank and "
                                             "translation settings beside the paper's")
