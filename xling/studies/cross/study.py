"""The CROSS study (``Study`` + ``Narrowed``): ties the package's modules to the stages.
Design notes in README.md."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from xling.studies.base import Evidence, Narrowed, PromptSet, Rendered, Rows, StudyInputs

from . import narrow, prompts
from .options import Options
from .paper import TEMPLATES_PATH


class CROSS(Narrowed):
    """CROSS on mLongRR-V2: cross-lingual needle retrieval in long contexts; the narrow
    stage ranks the haystacks' sentences, the LLM sees the top k."""

    name: ClassVar[str] = "cross"
    Options: ClassVar[type[Options]] = Options
    paper: ClassVar[str] = ("CROSS: Analyzing the trade-offs in long-context cross-lingual "
                            "retrieval")
    score_columns: ClassVar[tuple[str, ...]] = ("meta", "n_prompt_tokens", "too_long",
                                                "finish_reason")

    def required_sections(self, opts: Options) -> dict[str, str]:
        if "cross" in opts.methods:
            return {"narrow": "study 'cross' with method cross needs a `narrow:` section (the "
                              "sentence embedder, e.g. `narrow: {model: BAAI/bge-m3}`), or "
                              "study.options.methods without cross"}
        return {}

    # --- prompts ------------------------------------------------------------------------

    def prompt_sets(self, opts: Options) -> list[PromptSet]:
        return [PromptSet(setting, lang) for setting, lang in prompts.prompt_cells(opts)]

    def input_files(self, opts: Options) -> list[str]:
        return [d.path for d in opts.data if d.lang in opts.context_langs]

    def parser_for(self, setting: str) -> str:
        return "none"  # scoring reads the raw output (containment, s1.7)

    def parsers(self) -> dict:
        return {}  # the generic "none"

    def prompt_files(self) -> list[Path]:
        return [TEMPLATES_PATH]  # JSON: the prompt strings of every query language

    def build_prompts(self, opts: Options, setting: str, lang: str, *,
                      inputs: StudyInputs) -> Rows:
        return prompts.prompt_rows(opts, setting, lang, selections=inputs.selections)

    # --- narrowing (jobs/narrow.py) -----------------------------------------------------

    def needs_selection(self, setting: str) -> bool:
        return prompts.needs_selection(setting)

    def selection_lang(self, lang: str) -> str:
        return prompts.split_cell_lang(lang)[1]

    def narrow_langs(self, opts: Options) -> list[str]:
        return narrow.narrow_langs(opts)

    def narrow_options(self, opts: Options, lang: str) -> dict:
        return narrow.narrow_options(opts, lang)

    def narrow_inputs(self, opts: Options, lang: str) -> dict:
        return narrow.narrow_inputs(opts, lang)

    def select(self, opts: Options, lang: str, vectors: Mapping) -> Rows:
        return narrow.select(opts, lang, vectors)

    def hits_at(self, selections: Sequence[Mapping], ks: Sequence[int]) -> dict[str, float]:
        return narrow.hits_at(selections, ks)

    def selection_summary(self, opts: Options, selections: Sequence[Mapping]) -> dict:
        return {"splitter": opts.splitter, "oracle": opts.splitter == "oracle",
                "needle_isolated": narrow.needle_summary(selections)}

    # --- evaluation ---------------------------------------------------------------------

    def score(self, opts: Options, generations: Rows, evidence: Evidence) -> tuple[Rows, Rows]:
        from .metrics import score

        return score(opts, generations)

    def render(self, opts: Options, items: Rows, metrics: Rows) -> Rendered:
        """The paper-shaped tables (markdown) and plots (PNG bytes by file name) of a run."""
        import pandas as pd

        from .plots import plot_accuracy, plot_failures, plot_pair_heatmap
        from .tables import markdown_tables

        frame = pd.DataFrame.from_records([i for i in items if i.get("failure") != "error"])
        errors = sum(1 for i in items if i.get("failure") == "error")
        if frame.empty:
            return Rendered(f"# CROSS\n\nno scored items ({errors} unusable)\n", {})
        markdown = "# CROSS on mLongRR\n\n" + markdown_tables(frame)
        if errors:
            markdown += f"\n{errors} items had no usable prompt (counted as errors, not scored).\n"
        drawn = {"accuracy_by_length.png": lambda p: plot_accuracy(frame, "length", p),
                 "accuracy_by_depth.png": lambda p: plot_accuracy(frame, "depth", p),
                 "failures.png": lambda p: plot_failures(frame, p)}
        if (frame["method"] == "cross").any():
            drawn["accuracy_by_k.png"] = lambda p: plot_accuracy(frame, "k", p)
            for n in sorted(frame["needles"].unique()):
                drawn[f"pairs_{int(n)}n.png"] = (
                    lambda p, n=int(n): plot_pair_heatmap(frame, p, needles=n))
        plots: dict[str, bytes] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name, draw in drawn.items():
                path = os.path.join(tmp, name)
                draw(path)
                plots[name] = Path(path).read_bytes()
        return Rendered(markdown, plots)
