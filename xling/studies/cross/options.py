"""CROSS's ``study.options``: a pydantic model whose field descriptions are the user
documentation. ``Options.model_validate(raw).as_options()`` is the dict cell params carry
(and hash); fields are validated in definition order, so ``context_langs`` and
``query_langs``, which check against other options, come last."""

from __future__ import annotations

import functools
import os
import re
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field,
                      StrictBool, ValidationInfo, field_validator, model_validator)

from xling.studies.base import StudyOptions
from xling.tasks.languages import validate_languages

from .data import header_needles, lang_of_file, same_ids_error
from .paper import KS, LANGS, NEEDLES
from .templates import load_templates, prompt_template


def _listed(value: Any) -> Any:
    """A scalar (a string or an integer) stands for a one-element list."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return [value]
    return value


def _sorted_once(values: list) -> list:
    return sorted(dict.fromkeys(values))


def _once(values: list) -> list:
    return list(dict.fromkeys(values))


def _needle_count(count: int) -> int:
    if count not in NEEDLES:
        raise ValueError(f"bad needle count {count}; use one of {list(NEEDLES)} (L281, L283)")
    return count


def _codes(values: list[str]) -> list[str]:
    """Language codes (any alias the language table knows) as dataset codes, in order."""
    return [x.code for x in validate_languages(values)]


PositiveInt = Annotated[int, Field(strict=True, ge=1)]
NeedleCount = Annotated[int, Field(strict=True), AfterValidator(_needle_count)]
Character = Annotated[str, Field(min_length=1, max_length=1)]
Languages = Annotated[list[str], BeforeValidator(_listed), Field(min_length=1)]


class DataEntry(BaseModel):
    """One mLongRR CSV file of ``data``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="A local path (or a URI pyarrow opens) of an mLongRR CSV.")
    lang: str | None = Field(None, description=(
        "The context language; default: from the file name (`Swahili_needles.csv` -> sw)."))
    length_unit: str | None = Field(None, description=(
        "What the lengths count: `tokens:<tokenizer>` (the shared v1 files count GPT-4o "
        "tokens) or `words:<how>` (V2 counts words, s1.3); default: the file's `count_unit` "
        "column."))
    needles: int | None = Field(None, description=(
        "1, 2 or 3; if given, it must match the columns (`label` vs `label1..n`), which say "
        "it anyway."))
    tag: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]+$", description=(
        "A short name put in this file's context ids (`1n.so.<tag>.2k.50.r0`); required to "
        "tell apart two files of one language and needle count (e.g. two mLongRR releases)."))

    @model_validator(mode="before")
    @classmethod
    def _from_path(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"path": value}
        if not isinstance(value, dict):
            raise ValueError(f"a data entry is a path or a mapping with `path`, got {value!r}; "
                             "write `- path: .../English_needles.csv`")
        return value

    @field_validator("path")
    @classmethod
    def _exists(cls, path: str) -> str:
        if "://" not in path and not os.path.isfile(path):
            raise ValueError(f"file not found: {path}; give the path of an mLongRR CSV (get "
                             "them with `git clone https://github.com/PortNLP/mLongRR "
                             "data/mLongRR`)")
        return path

    @field_validator("length_unit")
    @classmethod
    def _unit(cls, unit: str | None) -> str | None:
        if unit is not None and not re.fullmatch(r"(words|tokens):\S+", unit):
            raise ValueError(f"length_unit {unit!r} is not `words:<how>` or "
                             "`tokens:<tokenizer>`; e.g. `tokens:gpt-4o` (v1) or `words:nltk` (V2)")
        return unit

    @field_validator("needles", mode="before")
    @classmethod
    def _needles(cls, needles: Any) -> Any:
        if needles is not None and (type(needles) is not int or needles not in (1, 2, 3)):
            raise ValueError(f"needles must be 1, 2 or 3, got {needles!r}; or leave it out: "
                             "the columns say it")
        return needles

    @model_validator(mode="after")
    def _language(self) -> DataEntry:
        lang = self.lang or lang_of_file(self.path)
        if lang is None:
            raise ValueError(f"no language for {self.path}; add `lang: <code>` (the file name "
                             "is not <Language>_needles.csv)")
        # Any language of the table: the method does not depend on the language; what a
        # language needs (a needle template, prompts) is checked against templates.json.
        self.lang = validate_languages([lang])[0].code
        return self


class Options(StudyOptions):
    """CROSS on mLongRR: the data, the grid (query and context languages, needles, caps k,
    methods), the prompt and selection choices, and the scoring rule. A list option also
    takes one value (`ks: 10` is `ks: [10]`)."""

    data: list[DataEntry] = Field(description=(
        "Required: the mLongRR CSV files, each a path or `{path, lang, length_unit, "
        "needles}`, e.g. `data: [../shared/data/mlongrr/1-needle/English_needles.csv]`."))
    needles: Annotated[list[NeedleCount], BeforeValidator(_listed),
                       AfterValidator(_sorted_once)] = Field(
        default_factory=lambda: list(NEEDLES), min_length=1, description=(
            "Needle counts to run: 1 (at depth 0/25/50/75/100 %, L281) and/or 3 (the largest "
            "is the gold, L295)."))
    ks: Annotated[list[PositiveInt], BeforeValidator(_listed), AfterValidator(_sorted_once)] = \
        Field(default_factory=lambda: list(KS), min_length=1, description=(
            "CROSS's caps: the top k sentences the LLM sees (L55)."))
    methods: Annotated[list[Literal["baseline", "cross", "needle_only"]],
                       BeforeValidator(_listed), AfterValidator(_once)] = Field(
        default_factory=lambda: ["baseline", "cross"], min_length=1, description=(
            "`baseline` (the whole context, L90), `cross` (the top k sentences, L53-55; needs "
            "a `narrow:` section), `needle_only` (the needles alone, the L102 sanity check)."))
    prompt_variant: Literal["paper", "no_unanswerable"] = Field("paper", description=(
        "`paper` (Appendix D.2), or `no_unanswerable` (the UNANSWERABLE sentence removed, "
        "L234)."))
    order: Literal["score", "document"] = Field("score", description=(
        "Order of the selected sentences: `score` (most similar first; the LLM processes "
        "\"the top-ranked segments irrespective of their position\", L27, and L202 names "
        "ranking ambiguity), or `document` (the ablation)."))
    join: Literal[" ", "\n"] = Field(" ", description=(
        "What joins the selected sentences: one space (as v1) or a newline."))
    query_text: Literal["question", "instruction"] = Field("question", description=(
        "What the sentences are ranked against: the question sentence in the query language, "
        "or the whole instruction (the paper says only \"the query\", L55)."))
    splitter: Literal["multilingual", "punkt_english", "punkt_untrained", "oracle"] = Field(
        "multilingual", description=(
            "The sentence splitter. Blind (the text alone, as the paper's method): "
            "`multilingual` (default: xling's text layer, xling/tasks/text.py, which ends "
            "sentences at every script's terminators), `punkt_english` (compat: NLTK Punkt "
            "with the English parameters for every language, v1's choice, s2.1, reproducing "
            "the paper), or untrained Punkt. `oracle` is an ablation that uses gold "
            "knowledge: the text layer's sentences with each needle cut out as a sentence of "
            "its own by its template; every table labels it \"oracle\". Prompt rows and "
            "selections record its fingerprint and, per needle, whether the needle ended up as "
            "a sentence of its own (`needle_isolated`)."))
    extra_terminators: list[Character] = Field(default_factory=list, description=(
        "Punkt splitters only: single characters that also end a sentence, e.g. "
        "`[\"।\", \"؟\", \"۔\"]` (a flagged variant, s2.1)."))
    scoring: Literal["exact", "containment"] = Field("exact", description=(
        "The primary metric (`accuracy`): `exact` (default; the paper's \"exact match\", "
        "L106: the number the model gives as its answer is the gold, L293/L299 \"correctly "
        "identifies ... the largest\"; of several numbers the one named most often, a bare "
        "list of candidates answers nothing; after digit and Chinese-numeral normalization) "
        "or `containment` (compat: the gold string occurs in "
        "the answer, v1's only published scoring code, s1.7). Both are reported "
        "(`exact_accuracy`, `containment_accuracy`)."))
    lengths: list[str] | None = Field(None, description=(
        "Keep only these context lengths (e.g. `[2k, 8k]`); default: all."))
    positions: list[str] | None = Field(None, description=(
        "Keep only these needle depths (e.g. `[0, 50]`); default: all."))
    runs: list[str] | None = Field(None, description="Keep only these runs; default: all.")
    templates: str | None = Field(None, description=(
        "A templates.json laid out like the packaged `xling/studies/cross/data/templates.json` "
        "(the default)."))
    allow_unverified: StrictBool = Field(False, description=(
        "Allow prompts that use unverified strings (`v1_adapted`, `draft`). Only the English "
        "prompts are verified (`paper`); each prompt row records the weakest status it used."))
    embedding_failure: Literal["target", "all"] = Field("target", description=(
        "When a wrong answer is an embedding failure: the target (largest) label is not in "
        "the cap (L180), or any label is not."))
    limit: PositiveInt | None = Field(None, description=(
        "Only the first N contexts of each file (a smoke run); default: all."))
    context_langs: Languages | None = Field(None, validate_default=True, description=(
        "Haystack languages to run; default: every language in `data`."))
    query_langs: Languages = Field(default_factory=lambda: list(LANGS), validate_default=True,
                                   description=(
        "Query (prompt) languages: any language with prompt strings in the templates file; "
        "default the seven of mLongRR-V2 (L271), which need `allow_unverified: true` until "
        "their strings are reviewed."))

    @field_validator("data", mode="before")
    @classmethod
    def _data_list(cls, value: Any) -> Any:
        if isinstance(value, (str, dict)):
            return [value]
        if not isinstance(value, list) or not value:
            raise ValueError(
                "required: a list of mLongRR CSV files; set e.g. `data: [../shared/data/"
                "mlongrr/1-needle/English_needles.csv]` or entries `{path, lang, length_unit}`")
        return value

    @field_validator("extra_terminators", mode="before")
    @classmethod
    def _no_terminators(cls, value: Any) -> Any:
        return value or []  # null (or an empty value) is none

    @field_validator("lengths", "positions", "runs", mode="before")
    @classmethod
    def _filter(cls, value: Any) -> list[str] | None:
        if value is None:
            return None
        if not isinstance(value, list) or not value:
            raise ValueError(f"must be a non-empty list or null, got {value!r}; leave it out "
                             "to keep every value")
        return [str(x) for x in value]

    @field_validator("templates")
    @classmethod
    def _templates(cls, path: str | None) -> str | None:
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"file not found: {path!r}; give a templates.json laid out like "
                             "xling/studies/cross/data/templates.json")
        load_templates(path)  # a malformed file is an error here
        return path

    @field_validator("context_langs")
    @classmethod
    def _context_langs(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if "data" not in info.data:
            return value  # `data` is wrong: that error is the one to show
        data_langs = _once([d.lang for d in info.data["data"]])
        if value is None:
            return data_langs
        codes = _codes(value)
        missing = [c for c in codes if c not in data_langs]
        if missing:
            raise ValueError(f"{missing} have no file in `data`; the data files cover "
                             f"{data_langs}")
        return codes

    @field_validator("query_langs")
    @classmethod
    def _query_langs(cls, value: list[str], info: ValidationInfo) -> list[str]:
        codes = _codes(value)
        if all(k in info.data for k in ("needles", "prompt_variant", "templates",
                                         "allow_unverified")):
            _check_prompts(codes, info.data)
        return _once(codes)


    @model_validator(mode="after")
    def _data_and_needles(self) -> Options:
        """Two files of one language and needle count need distinct tags (their context ids
        would collide); a context language run with `cross` or `needle_only` needs a needle
        template (where the needle is, what the needle-only prompt shows)."""
        if self.splitter in ("multilingual", "oracle") and self.extra_terminators:
            raise ValueError("extra_terminators apply to the Punkt splitters; the multilingual "
                             "splitter already ends sentences at every script's terminators "
                             "(drop extra_terminators or set splitter: punkt_english)")
        seen: dict[tuple, str] = {}
        for entry in self.data:
            needles = entry.needles or header_needles(entry.path)
            if needles is None:
                continue  # a URI: load_contexts checks it when it reads the file
            key = (entry.lang, needles, entry.tag)
            if key in seen and seen[key] != entry.path:
                raise ValueError(same_ids_error(entry.lang, needles, [seen[key], entry.path]))
            seen[key] = entry.path
        if {"cross", "needle_only"} & set(self.methods):
            languages = load_templates(self.templates)["languages"]
            lacking = [c for c in (self.context_langs or [])
                       if "needle" not in languages.get(c, {})]
            if lacking:
                raise ValueError(f"no needle template for context language(s) {lacking} in the "
                                 "templates file: CROSS cannot tell the needle sentence and the "
                                 "needle-only prompt would be the bare number; add "
                                 "`languages.<code>.needle` (and `needle_variants`) or drop the "
                                 "methods cross and needle_only")
            templates = load_templates(self.templates)
            for entry in self.data:
                if entry.lang in (self.context_langs or []):
                    problem = unmatched_needles(entry.path, entry.lang, self.templates,
                                                entry.length_unit, entry.needles, templates)
                    if problem:
                        raise ValueError(problem)
        return self


@functools.lru_cache(maxsize=64)
def _unmatched(path: str, stamp: tuple, lang: str, templates_path: str | None,
               length_unit: str | None, needles: int | None) -> str | None:
    from .data import load_file
    from .split import needle_spans

    templates = load_templates(templates_path)
    bad, total, example = 0, 0, None
    for ctx in load_file(path, lang=lang, length_unit=length_unit, needles=needles):
        if ctx.get("error"):
            continue
        for (_, _, how), label, city in zip(needle_spans(ctx, templates), ctx["labels"],
                                            ctx["cities"]):
            total += 1
            if how != "template":
                bad += 1
                example = example or (ctx["context_id"], city, label)
    if not bad:
        return None
    cid, city, label = example
    return (f"{path}: {bad} of {total} needles match no needle template of {lang!r} (first: "
            f"{cid}, city {city!r}, label {label}); CROSS would not know the needle sentence. "
            f"Fix languages.{lang}.needle / needle_variants in the templates file to the "
            "file's needle wording, or drop the methods cross and needle_only")


def unmatched_needles(path: str, lang: str, templates_path: str | None,
                      length_unit: str | None = None, needles: int | None = None,
                      templates=None) -> str | None:
    """An error message when some needle of a data file matches no needle template of its
    language (read once per file version), else None. A URI is checked when it is read."""
    if "://" in path:
        return None
    st = os.stat(path)
    return _unmatched(path, (st.st_size, st.st_mtime_ns), lang, templates_path, length_unit,
                      needles)


def _check_prompts(qlangs: list[str], given: dict) -> None:
    """Every (query language, needle count) has a prompt, made of verified strings unless
    ``allow_unverified`` (``given``: the fields validated so far)."""
    templates = load_templates(given["templates"])
    for qlang in qlangs:
        for n in given["needles"]:
            try:
                _, status = prompt_template(qlang, n, variant=given["prompt_variant"],
                                            templates=templates)
            except KeyError as e:
                raise ValueError(f"no {n}-needle prompt for {qlang!r} ({e}); add its strings "
                                 "to the templates file") from None
            if status not in templates["_verified"] and not given["allow_unverified"]:
                raise ValueError(f"the {n}-needle prompt for {qlang!r} uses {status!r} strings, "
                                 "which are unverified; have them reviewed (templates.json) or "
                                 "set `allow_unverified: true`")
