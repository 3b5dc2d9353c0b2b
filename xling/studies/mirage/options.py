"""MIRAGE-Bench's options: the pydantic `Options` model of `study.options` (its field
descriptions are the user documentation), and `Knobs`, the typed view of the options that
the pure functions (parsing, features, arena, surrogate) read."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping

from pydantic import Field, ValidationInfo, field_validator, model_validator

from xling.studies.base import StudyOptions
from xling.studies.mirage.constants import (COMPAT_ITEMS, FEATURES, HELD_OUT, LANGS,
                                            REFERENCE_MODEL, REGRESSORS)

Compat = Literal["fixed", "reference"]


@dataclass(frozen=True)
class Knobs:
    """The study's knobs; the ``COMPAT_ITEMS`` fields take ``"fixed"`` or ``"reference"``."""

    answer_parts: str = "fixed"
    comma_citations: str = "fixed"
    citation_ranking: str = "fixed"
    citation_scope: str = "fixed"
    en_detection: str = "fixed"
    nli_rounding: str = "fixed"
    overlap_label: str = "fixed"
    llm_parse_failure: str = "fixed"
    pairwise_parse: str = "fixed"
    seeds: str = "fixed"
    kendall_tau: str = "fixed"
    pairwise_prompt: str = "reference"   # reference (dump text) | paper (Figure 13)
    feature_prompts: str = "reference"   # reference (research code) | paper (Figures 11-12)
    instruction: str = "published"       # published | paper | api_scripts (s2.2)
    reference_model: str = REFERENCE_MODEL
    judge_queries: int = 100             # P L39
    judge_seed: int = 42
    tournaments: int = 200               # P L190
    matches: int = 100
    bootstrap_seed: int = 0
    bt_alpha: float = 0.0
    held_out: tuple[str, ...] = HELD_OUT
    features: tuple[str, ...] = FEATURES
    surrogate: str = "random_forest"
    random_state: int = 0

    def __post_init__(self):
        for name in COMPAT_ITEMS:
            if getattr(self, name) not in ("fixed", "reference"):
                raise ValueError(f"{name}: {getattr(self, name)!r} is not 'fixed' or "
                                 "'reference'")
        for name, allowed in (("pairwise_prompt", ("reference", "paper")),
                              ("feature_prompts", ("reference", "paper")),
                              ("instruction", ("published", "paper", "api_scripts")),
                              ("surrogate", REGRESSORS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: {getattr(self, name)!r}; use one of "
                                 f"{', '.join(allowed)}")
        unknown = set(self.features) - set(FEATURES)
        if unknown:
            raise ValueError(f"features: unknown {sorted(unknown)}; use {FEATURES}")

    @classmethod
    def reference(cls, **overrides) -> Knobs:
        """Every compat item at its reference value (to reproduce the published numbers)."""
        return replace(cls(**{name: "reference" for name in COMPAT_ITEMS}), **overrides)

    @classmethod
    def of(cls, opts: Options) -> Knobs:
        """The knobs of the validated options (lists read as tuples)."""
        values = {name: getattr(opts, name) for name in cls.__dataclass_fields__}
        return cls(**{name: (tuple(value) if isinstance(value, list) else value)
                      for name, value in values.items()})

    def ref(self, name: str) -> bool:
        return getattr(self, name) == "reference"

    @property
    def rf_state(self) -> int | None:
        return None if self.ref("seeds") else self.random_state


def check_names(held_out, roster, what: str) -> None:
    """Held-out names outside the roster are an error naming them and the roster; at least
    two models must remain to train the surrogate."""
    unknown = [m for m in held_out if m not in roster]
    if unknown:
        raise ValueError(f"held_out {unknown} are not among {what}: {sorted(roster)}; name "
                         "held-out models among them")
    if held_out and len(set(roster) - set(held_out)) < 2:
        raise ValueError(f"held_out {list(held_out)} leaves fewer than two of {sorted(roster)} "
                         "to train the surrogate on; hold out fewer")


def is_published(opts: Options) -> bool:
    """True when the hub's answers, features and verdicts stand in for this run's."""
    return opts.source == "published"


def _compat_field(what: str) -> Any:
    return Field("fixed", description=f"{what} (fixed | reference; default: `compat`)")


class Options(StudyOptions):
    """`study.options` of MIRAGE-Bench. Every place where the research code differs from a
    sound choice is a compat item whose ``reference`` value reproduces the published numbers
    and whose ``fixed`` value is the default; `compat` sets all of them at once and an item
    given alone overrides it (README.md has the table)."""

    data: str = Field(description="snapshot of nthakur/mirage-bench ({lang}/dev-*.parquet: "
                                  "query_id, prompt, positive_ids, negative_ids), a local "
                                  "path or s3:// URI")
    source: Literal["run", "published"] = Field(
        "run", description="run: generate, features and arena in this run; published: the "
                           "hub's outputs, features and judgments (needs `outputs` and "
                           "`judgments`)")
    outputs: str | None = Field(None, validate_default=True,
                                description="snapshot of nthakur/mirage-bench-output (read "
                                            "with source: published)")
    judgments: str | None = Field(None, validate_default=True,
                                  description="snapshot of nthakur/mirage-bench-pairwise-"
                                              "judgments (read with source: published)")
    langs: list[str] = Field(list(LANGS), description="subset of the 18 languages (default: "
                                                      "all)")
    split: str = Field("dev", description="the split's file prefix ({lang}/{split}-*.parquet)")
    limit: int | None = Field(None, description="read only the first N queries per language "
                                                "(tiny runs)")
    models: list[str] | None = Field(None, description="the arena roster (default: every "
                                                       "model the judge compared; a model "
                                                       "that was never judged is counted, "
                                                       "not ranked)")
    both_orders: bool = Field(False, description="ask the judge both presentation orders of "
                                                 "a pair; an order-inconsistent pair counts "
                                                 "as a tie")
    ablations: bool = Field(False, description="also Tables 3 (regressors) and 4 (feature "
                                               "sets)")
    compat: Compat = Field("fixed", description="fixed | reference: every research-code "
                                                "quirk at once (each item below overrides it)")
    pairwise_prompt: Literal["reference", "paper"] = Field(
        "reference", description="the pairwise judge's wording: reference (the dump's text, "
                                 "which produced the published verdicts) or paper (Figure 13)")
    feature_prompts: Literal["reference", "paper"] = Field(
        "reference", description="the wording of the LLM features 10 (answer overlap) and 11 "
                                 "(fluency): reference (the research code's prompts, which "
                                 "produced the published features) or paper (Figures 11-12, "
                                 "prompts.yaml answer_overlap_paper / fluency_paper); the "
                                 "features manifest records it")
    instruction: Literal["published", "paper", "api_scripts"] = Field(
        "published", description="the RAG prompt as published (Figure 10), or its instruction "
                                 "replaced by the paper's or the API scripts' (s2.2)")
    reference_model: str = Field(REFERENCE_MODEL, description="the model whose answer is the "
                                 "\"gold\" of BLEU, ROUGE-L and answer overlap (P L102)")
    judge_queries: int = Field(100, description="queries per language judged pairwise (P L39)")
    judge_seed: int = Field(42, description="seed of the judged subset and the pairs' "
                                            "presentation order")
    tournaments: int = Field(200, description="bootstrap tournaments (P L190)")
    matches: int = Field(100, description="queries drawn per tournament")
    bootstrap_seed: int = Field(0, description="seed of the bootstrap draws")
    bt_alpha: float = Field(0.0, description="choix's L2 penalty of the Bradley-Terry fit")
    held_out: list[str] = Field(
        list(HELD_OUT), description="models the surrogate does not train on (P L130; Table "
                                    "5), each a model of the arena (refused otherwise); a "
                                    "list, or {run: [...], published: [...]} to name them "
                                    "for each source (run: generate.models names; published: "
                                    "the hub's model ids)")
    features: list[str] = Field(list(FEATURES), description="the surrogate's features (s3)")
    surrogate: Literal[REGRESSORS] = Field(  # type: ignore[valid-type]
        "random_forest", description="the surrogate's regressor (Table 3's rows)")
    random_state: int = Field(0, description="the regressors' seed (seeds: fixed)")
    language_id: Literal["lingua", "langid"] = Field(
        "lingua", description="features 1-2's detector (xling/tasks/text.py LanguageID): "
        "lingua over the 18 languages (default), or langid (compat: langid.py, the tool the "
        "paper names, P L94, L343, normalized probabilities over its 97 languages; it has no "
        "Yoruba model, so yo answers become error rows). The reference code used langdetect")
    answer_parts: Compat = _compat_field(
        "reference: the dump's Reason/Answer regexes, first paragraph, every ## and : removed; "
        "fixed: ##Reason:/##Answer: markers, whole parts")
    comma_citations: Compat = _compat_field(
        "reference: [a, b] split on ',' unstripped (only a kept); fixed: split and strip")
    citation_ranking: Compat = _compat_field(
        "reference: duplicates kept, an id scores at its last occurrence; fixed: first "
        "occurrence, deduplicated")
    citation_scope: Compat = _compat_field(
        "reference: the first paragraphs of reason and answer; fixed: the whole output")
    en_detection: Compat = _compat_field(
        "reference: P(en) goes to target_language only for en queries; fixed: P(en) always")
    nli_rounding: Compat = _compat_field(
        "reference: each NLI probability rounded to 1 decimal; fixed: full precision")
    overlap_label: Compat = _compat_field(
        "reference: the last model of the query's outputs list; fixed: reference_model")
    llm_parse_failure: Compat = _compat_field(
        "reference: an unparsed LLM score is 0, averaged like a score; fixed: missing, counted")
    pairwise_parse: Compat = _compat_field(
        "reference: [[A]]/[[B]]/[[C]] in the last 25 characters; fixed: the last such token")
    seeds: Compat = _compat_field(
        "reference: the random forest unseeded; fixed: random_state")
    kendall_tau: Compat = _compat_field(
        "the reported tau is always tau-b on the models' aligned scores; reference: also "
        "the reference code's tau of the two argsort index orders, kendall_tau_argsort "
        "(not a rank correlation)")

    def as_options(self) -> dict:
        """The options dict; ``feature_prompts`` at its default is left out, so that the cells
        planned before the option existed keep their ids (tests/unit/test_golden_plan.py).
        Knobs and the features manifest read a missing key as ``reference``."""
        out = super().as_options()
        if out.get("feature_prompts") == "reference":
            del out["feature_prompts"]
        return out

    @model_validator(mode="before")
    @classmethod
    def _compat_defaults(cls, data: Any) -> Any:
        """A compat item not given takes `compat`'s value."""
        if not isinstance(data, dict):
            return data
        compat = data.get("compat", "fixed")
        if compat not in ("fixed", "reference"):
            return data  # the Literal reports it
        return {**{name: compat for name in COMPAT_ITEMS}, **data}

    @field_validator("data", mode="before")
    @classmethod
    def _data(cls, value: Any) -> Any:
        if not value:
            raise ValueError("empty; give the MIRAGE-Bench snapshot (nthakur/mirage-bench: "
                             "{lang}/dev-*.parquet), a local path or s3:// URI")
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("langs", mode="before")
    @classmethod
    def _langs(cls, value: Any) -> Any:
        from xling.tasks.languages import UnknownLanguageError, get_language

        if not value:
            return list(LANGS)
        codes, bad = [], []
        for code in [value] if isinstance(value, str) else value:
            try:
                resolved = get_language(code).code
            except UnknownLanguageError:
                resolved = code
            (codes if resolved in LANGS else bad).append(resolved)
        if bad:
            raise ValueError(f"{bad} are not MIRAGE-Bench languages; use codes among "
                             f"{', '.join(LANGS)}")
        return codes

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"{value} is not a positive number of queries per language; "
                             "give N >= 1, or leave limit out to read every query")
        return value

    @field_validator("models")
    @classmethod
    def _models(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(value) < 2:
            raise ValueError("an arena needs at least two models; list two or more, or leave "
                             "models out to take every model that answered")
        return value

    @field_validator("held_out", mode="before")
    @classmethod
    def _held_out(cls, value: Any, info: ValidationInfo) -> Any:
        """A {run, published} mapping -> the list of the options' source."""
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"run", "published"})
            if unknown:
                raise ValueError(f"unknown source {unknown}; give held_out as a list, or as "
                                 "{run: [...], published: [...]}")
            source = info.data.get("source", "run")
            if source not in value:
                raise ValueError(f"no held-out models for source: {source}; add "
                                 f"held_out.{source}: [...]")
            return value[source]
        return value

    @model_validator(mode="after")
    def _held_out_in_models(self) -> "Options":
        outside = [m for m in self.held_out if self.models and m not in self.models]
        if outside:
            raise ValueError(f"held_out {outside} are not in models {self.models}; hold out "
                             "models of the arena")
        if self.models and len(set(self.models) - set(self.held_out)) < 2:
            raise ValueError(f"held_out {self.held_out} leaves fewer than two of models "
                             f"{self.models} to train the surrogate on; hold out fewer")
        return self

    @field_validator("features")
    @classmethod
    def _features(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown {unknown}; use some of {', '.join(FEATURES)}")
        return value

    @field_validator("outputs", "judgments")
    @classmethod
    def _published_inputs(cls, value: str | None, info: ValidationInfo) -> str | None:
        if not value and info.data.get("source") == "published":
            what, hub = (("answers and features", "output") if info.field_name == "outputs"
                         else ("verdicts", "pairwise-judgments"))
            raise ValueError(f"source: published reads the hub's {what}; point "
                             f"study.options.{info.field_name} at a snapshot of "
                             f"nthakur/mirage-bench-{hub}")
        return value
