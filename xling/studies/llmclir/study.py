"""The LLM-CLIR study: its runs are the retrieve and rerank stages', scored by the evaluate
stage's IR cells; the study renders the paper's tables across those cells."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from xling.studies.base import Ranked
from xling.tasks.irmetrics import RunTable

from . import tables
from .options import Options


class LLMCLIR(Ranked):
    name = "llmclir"
    Options = Options
    paper = "LLM-based Cross-Lingual Information Retrieval: reranking (Zuo et al.)"

    def required_sections(self, opts: Options) -> dict[str, str]:
        return {"retrieve": "study 'llmclir' renders the tables of the retrieve (and rerank) "
                            "stage's runs: add a `retrieve:` section",
                "evaluate": "study 'llmclir' renders the evaluate stage's cells: add an "
                            "`evaluate:` section (its metrics are the tables' measures)"}

    def prompt_files(self) -> list[Path]:
        from xling.tasks import rerank

        # The paper's Figures 3 and 4, which the rerank library runs for every reranker.
        return [Path(rerank.__file__).with_name("rerank_prompts.yaml")]

    def render_runs(self, opts: Options, run_tables: list[RunTable], *, expected: Mapping | None,
                    config: Mapping) -> str:
        paper_tables = ((expected or {}).get("paper") or {}).get("tables") or {}
        return tables.render(run_tables, paper_tables=paper_tables, config=config,
                             show_headroom=opts.headroom, show_paper=opts.paper,
                             show_settings=opts.settings)
