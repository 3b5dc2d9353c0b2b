"""BordIRLines' `study.options` (a pydantic model; each field's description is its user
documentation), the modes, prompts and retrievers they choose from, and the settings
(`<mode>-<prompt>`) they select."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, ValidationInfo, field_validator

from xling.studies.base import StudyOptions
from xling.studies.bordirlines.data import (
    MODES,
    Mode,
    load_borderlines,
    load_queries,
    queries_file,
    territory_root,
)
from xling.tasks.languages import UnknownLanguageError, validate_languages

STUDY = "bordirlines"
PromptKind = Literal["direct", "citation"]
Retriever = Literal["openai", "m3"]
PROMPTS: tuple[str, ...] = get_args(PromptKind)
RETRIEVERS: tuple[str, ...] = get_args(Retriever)


def split_setting(setting: str) -> tuple[str, str]:
    """``<mode>-<prompt>`` -> (mode, prompt); ValueError for anything else."""
    mode, _, prompt = setting.rpartition("-")
    if mode not in MODES or prompt not in PROMPTS:
        raise ValueError(f"unknown BordIRLines setting {setting!r}; settings are "
                         f"'<mode>-<prompt>' with mode in {MODES} and prompt in {PROMPTS}")
    return mode, prompt


def settings(opts: Options) -> list[str]:
    """The settings the options select: each mode with each prompt, but ``no_ir`` (nothing
    to cite) only as ``no_ir-direct``."""
    out = []
    for mode in opts.modes:
        for prompt in opts.prompts:
            out.append("no_ir-direct" if mode == "no_ir" else f"{mode}-{prompt}")
    return list(dict.fromkeys(out))


def _one_or_more(value):
    """A single string is a one-element list (``modes: qlang``)."""
    return [value] if isinstance(value, str) else value


def _distinct(value: list, choices: tuple[str, ...]) -> list:
    if not value:
        raise ValueError(f"must be a non-empty list; choose from {', '.join(choices)}")
    return list(dict.fromkeys(value))


class Options(StudyOptions):
    """`study.options` of BordIRLines. Fields are validated in this order, and the later
    ones (territories, docs, langs) read the earlier ones' values."""

    data: str | None = Field(
        None, validate_default=True,
        description="(required) Directory in the BordIRLines hub layout (`queries.tsv` and "
                    "`data/<lang>/<retriever>/<mode>/<lang>_query_hits.tsv`).")
    retriever: Retriever = Field(
        "openai",
        # The paper's main results use OpenAI embeddings (text-embedding-3-large): "We mainly
        # report results using OpenAI embeddings" (bordirlines.txt L123); M3 is the
        # alternative.
        description="`openai` (text-embedding-3-large, the hits of the paper's main results, "
                    "bordirlines.txt L123) or `m3` (BGE-M3 hits): the hits of "
                    "`data/<lang>/<retriever>/<mode>/`.")
    modes: list[Mode] = Field(
        default_factory=lambda: ["no_ir", "qlang", "rel_langs"],
        description="Retrieval modes, any of no_ir, qlang, rel_langs, qlang_en, en, swap "
                    "(README.md); default the paper's main comparison.")
    prompts: list[PromptKind] = Field(
        # Every CS metric of the paper (Fig. 3, Table 4) is computed on the direct format
        # (L146, L477); citation is the format of the citation analysis (Section 5.2).
        default_factory=lambda: ["direct"],
        description="`direct` (the format of the paper's CS metrics, Table 4); add "
                    "`citation` for the citation analysis (`no_ir` always uses the direct "
                    "prompt: there is nothing to cite).")
    k: int = Field(
        # The paper's generation runs use the top 10 passages per query (generation.py
        # --num_paragraphs default 10; the hub README loads n_hits=10).
        10, ge=1, strict=True,
        description="Passages per prompt (the paper's top 10).")
    max_doc_words: int | None = Field(
        # The paper passes each retrieved paragraph whole (bordirlines.txt L101: documents
        # are Wikipedia paragraphs; the authors' get_user_prompt_direct writes `doc` uncut).
        None, ge=1, strict=True,
        description="null (the default, as the paper): passages whole. A number cuts each "
                    "passage after that many words (a word is a whitespace-separated token, "
                    "or one character of a script written without spaces: Chinese, Japanese, "
                    "Thai, Lao, Khmer, Burmese, Tibetan), marked ' ...'; an extension that "
                    "bounds a 10-passage prompt, not the paper's setting.")
    unparsed: Literal["authors", "drop"] = Field(
        "authors",
        # The paper is silent; its code (manestay/bordIRlines @ de66e19, generation/
        # gen_response_table.py) turns an answer with no option (claimant_ind -1) into
        # Response "None" and Pick = the territory's first claimant, and calculate_CS.py
        # scores both.
        description="What an answer that names no claimant (no parsed option, or one that "
                    "maps to none) counts as in the CS metrics. `authors` (the default, as "
                    "the authors' gen_response_table.py): the English control answer is "
                    "'None' (wrong for KB CS, one more country in # Country + en), an answer "
                    "in a claimant language is the territory's first claimant. `drop`: left "
                    "out of the CS metrics. Either way counted (`unparsed`) in the table's n.")
    bootstrap: int = Field(
        1000, ge=0, strict=True,
        description="Resamples of territories for the 95% percentile intervals of the CS "
                    "metrics (seed 0); 0 turns the intervals off.")
    expected: str | None = Field(
        None,
        description="The paper's published numbers (`configs/bordirlines.expected.yaml`), "
                    "shown beside xling's in the tables; default none (xling's numbers only).")
    territories: str | None = Field(
        None, validate_default=True,
        description="A BorderLines data directory (or its `disputed_territories.csv`); "
                    "default (null) the packaged copy in xling/studies/bordirlines/data.")
    docs: str | None = Field(
        None, validate_default=True,
        description="The passages JSON `{lang: {doc_id: text}}`; default `<data>/docs.json`, "
                    "or the hub's `<data>/data/all_docs.json` when that is the file present. "
                    "Needed only when a mode other than no_ir is run.")
    langs: list[str] | None = Field(
        None, validate_default=True,
        description="Query languages; default every language in `queries.tsv`. Codes are "
                    "checked against xling/tasks/languages.py (`zhs`, `zht`, `iw` as the data "
                    "writes them; aliases such as `he` become the data's code).")

    @field_validator("data", mode="before")
    @classmethod
    def _data(cls, value):
        if not value or not isinstance(value, (str, os.PathLike)):
            raise ValueError("missing; give the directory of the BordIRLines hub data "
                             "(queries.tsv, data/<lang>/<retriever>/<mode>/<lang>_query_hits.tsv)")
        path = Path(value).expanduser()
        if not path.is_dir():
            raise ValueError(f"{str(path)!r} is not a directory; give the directory that holds "
                             "queries.tsv and data/")
        if not queries_file(path).is_file():
            raise ValueError(f"no queries.tsv in {str(path)!r} (nor in its data/); point it at "
                             "the root of the hub layout (queries.tsv with query_id, query_text, "
                             "territory, language)")
        try:
            queries = load_queries(path)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read queries.tsv ({e}); use the hub's queries.tsv (tab "
                             "separated, with a header)") from None
        try:
            validate_languages(list(dict.fromkeys(q["lang"] for q in queries.values())))
        except UnknownLanguageError as e:
            raise ValueError(f"queries.tsv has language codes that xling does not know ({e}); "
                             "add them to xling/tasks/languages.py or fix the file") from None
        return str(path)

    @field_validator("modes", "prompts", mode="before")
    @classmethod
    def _listed(cls, value):
        return _one_or_more(value)

    @field_validator("modes")
    @classmethod
    def _modes(cls, value: list) -> list:
        return _distinct(value, MODES)

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, value: list) -> list:
        return _distinct(value, PROMPTS)

    @field_validator("expected", mode="before")
    @classmethod
    def _expected(cls, value):
        if not value:
            return None
        import yaml

        from xling.studies.bordirlines.published import load_published

        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"{str(path)!r} does not exist; give "
                             "configs/bordirlines.expected.yaml (the paper's numbers) or null")
        try:
            load_published(path)
        except (ValueError, yaml.YAMLError) as e:
            raise ValueError(f"cannot read {str(path)!r} ({e}); use the layout of "
                             "configs/bordirlines.expected.yaml") from None
        return str(path)

    @field_validator("territories", mode="before")
    @classmethod
    def _territories(cls, value, info: ValidationInfo):
        root = territory_root(value)
        for need in ("disputed_territories.csv", "countries_info.json", "queries/choices.txt"):
            if not (root / need).is_file():
                raise ValueError(f"no {need} in {str(root)!r}; give a BorderLines data "
                                 "directory (disputed_territories.csv, countries_info.json, "
                                 "queries/) or leave it out for the packaged copy")
        try:
            borderlines = load_borderlines(root)
        except (ValueError, KeyError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the BorderLines data ({e}); use an unchanged copy "
                             "of manestay/borderlines' files") from None
        if info.data.get("data"):
            named = {q["territory"] for q in load_queries(info.data["data"]).values()}
            unknown = sorted(t for t in named if borderlines.territory(t) is None)
            if len(unknown) == len(named):
                raise ValueError(f"none of the territories of queries.tsv is in {str(root)!r} "
                                 f"(e.g. {unknown[:3]}); use the BorderLines table the queries "
                                 "were made from")
        # The packaged copy stays None: an absolute path would tie every cell's hash to where
        # the checkout lives, so moving or re-cloning it would re-run finished cells.
        return str(root) if value else None

    @field_validator("docs", mode="before")
    @classmethod
    def _docs(cls, value, info: ValidationInfo):
        if value:
            path = Path(value).expanduser()
            if not path.is_file():
                raise ValueError(f"{str(path)!r} does not exist; give the passages JSON "
                                 "{lang: {doc_id: text}}")
            return str(path)
        if not info.data.get("data"):
            return None  # data's own error says what is wrong
        data = Path(info.data["data"])
        path = data / "docs.json"
        if not path.is_file() and (data / "data" / "all_docs.json").is_file():
            path = data / "data" / "all_docs.json"
        needs_docs = any(m != "no_ir" for m in info.data.get("modes", ()))
        if needs_docs and not path.is_file():
            raise ValueError(f"no passages file: {str(data / 'docs.json')!r} does not exist; "
                             "give `docs:` (JSON {lang: {doc_id: text}}) or run only mode no_ir")
        return str(path) if path.is_file() else None

    @field_validator("langs", mode="before")
    @classmethod
    def _langs(cls, value, info: ValidationInfo):
        if not info.data.get("data"):
            return None  # data's own error says what is wrong
        present = list(dict.fromkeys(q["lang"] for q in load_queries(info.data["data"]).values()))
        if value is None:
            return sorted(present)
        value = _one_or_more(value)
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError(f"must be a non-empty list of language codes, not {value!r}; "
                             "e.g. [en, ru, uk, zhs]; leave it out for every language")
        try:
            resolved = [lang.code for lang in validate_languages(value)]
        except UnknownLanguageError as e:
            raise ValueError(f"{e}; use the codes BordIRLines writes (e.g. zhs, zht, iw)") \
                from None
        absent = [c for c in resolved if c not in present]
        if absent:
            raise ValueError(f"no queries in {absent} in queries.tsv; choose from "
                             f"{', '.join(sorted(present))}")
        return list(dict.fromkeys(resolved))
