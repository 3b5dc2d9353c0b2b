"""XRAG's `study.options`: one field per option, its description the user documentation.

`Options.model_validate(raw).as_options()` is the dict that cell params carry and hash: the
same keys and values the hand-written check of earlier versions returned.
"""

from __future__ import annotations

import os
from typing import Literal, get_args

from pydantic import ConfigDict, Field, field_validator

from xling.studies.base import StudyOptions
from xling.tasks.languages import validate_languages

from .settings import LANGS, PAPER_SETTINGS, RENAMED, SETTINGS

ArticleOrder = Literal["given", "stored", "shuffled", "supporting_first", "supporting_last",
                       "date"]
ARTICLE_ORDERS: tuple[str, ...] = get_args(ArticleOrder)
SettingName = Literal[SETTINGS]  # type: ignore[valid-type]


class Options(StudyOptions):
    """XRAG's options (xrag.txt is the paper's text; README.md has the settings table)."""

    # required, with the fix in its error: validated from a placeholder default, which the
    # JSON schema leaves out (it lists `data` as required)
    model_config = ConfigDict(json_schema_extra={"required": ["data"]})

    data: str = Field(
        None, validate_default=True, json_schema_extra=lambda schema: schema.pop("default"),
        description="Required: the path or URI of an XRAG jsonl file (`xrag.dev.jsonl` or "
                    "`xrag.test.jsonl` of AmazonScience/XRAG on the hub; `hf:` names are "
                    "resolved before validation).")
    langs: list[str] = Field(
        list(LANGS), min_length=1,
        description="The question languages X to run, any of de, es, zh, ar (codes, aliases "
                    "or English names; stored as the codes, duplicates dropped). Every "
                    "setting, English ones included, has one cell per X.")
    settings: list[SettingName] = Field(
        list(PAPER_SETTINGS), min_length=1,
        description="The settings to run (README.md's table); default: the paper's eight. "
                    "The ext_* settings are extensions the paper did not run.")
    article_order: ArticleOrder = Field(
        "given",
        description="How the articles are presented: `given` = the release's "
                    "article_order (falling back to the stored order); `stored`; `shuffled` "
                    "(a per-item seed from shuffle_seed); `supporting_first`; "
                    "`supporting_last`; `date` (oldest first). The paper does not say.")
    shuffle_seed: int = Field(
        0, strict=True,
        description="The seed of `article_order: shuffled` (each item is shuffled with "
                    "`<seed>:<item id>`).")
    max_article_words: int | None = Field(
        None, strict=True, ge=1,
        description="Cut each article to its first N words (a CJK character counts as one "
                    "word); null (the default) gives whole articles, as the paper did.")
    accuracy_over: Literal["all", "judged"] = Field(
        "all",
        description="The items an accuracy is over: `all` (the default, as the paper's "
                    "accuracy over every instance) counts a failed generation (no output, "
                    "e.g. a prompt that could not be built) and "
                    "an answer no judge gave a valid verdict for as wrong; `judged` leaves "
                    "them out. Either way the failed, unjudged and unparsed counts are "
                    "metric rows and the tables' n.")
    flagged_translations: Literal["use", "wrong"] = Field(
        "use",
        description="A translated article that translate's language check flagged "
                    "(translate.documents[].lang_check: flag translates it anyway and keeps "
                    "the finding): `use` (the default: the paper translated with Google "
                    "Translate and answered every item) puts it in the prompt and reports the "
                    "flagged share per setting and language; `wrong` makes the item an error "
                    "row, counted as failed (wrong under accuracy_over: all).")
    translations: str = Field(
        "xrag-articles",
        description="The translate stage's translate.documents entry (format: xrag) whose "
                    "English translations of the X articles the +ES and En+En_X settings "
                    "read.")
    limit: int | None = Field(
        None, strict=True, ge=1,
        description="Run only the first N instances per language and subset (file order); "
                    "null: all of them.")
    expected: str | None = Field(
        "auto",
        description="The published numbers shown beside ours: `auto` reads the checkout's "
                    "configs/xrag.expected.yaml when it exists; a path or URI of such a "
                    "file; or null (or false) for none.")

    @field_validator("data", mode="before")
    @classmethod
    def _data(cls, value):
        if not isinstance(value, str) or not value.strip():
            raise ValueError("required: the path of an XRAG jsonl file; set "
                             "`data: path/to/xrag.test.jsonl` (AmazonScience/XRAG on the hub)")
        if "://" not in value and not os.path.isfile(value):
            raise ValueError(f"file not found: {value}; download xrag.{{dev,test}}.jsonl from "
                             "AmazonScience/XRAG and give its path")
        return value

    @field_validator("langs", mode="before")
    @classmethod
    def _langs(cls, value):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            return value  # the field's type and min_length report it
        resolved = [lang.code for lang in validate_languages(value)]  # UnknownLanguageError
        outside = [code for code, res in zip(value, resolved) if res not in LANGS]
        if outside:
            raise ValueError(f"{outside} not in XRAG; XRAG has {list(LANGS)}")
        return list(dict.fromkeys(resolved))

    @field_validator("settings", mode="before")
    @classmethod
    def _settings(cls, value):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            return value
        bad = [s for s in value if s not in SETTINGS]
        renamed = [s for s in bad if isinstance(s, str) and s in RENAMED]
        if renamed:
            raise ValueError(f"unknown setting(s) {bad}: {renamed[0]!r} {RENAMED[renamed[0]]}; "
                             f"the paper's settings are {list(PAPER_SETTINGS)}")
        if bad:
            raise ValueError(f"unknown setting(s) {bad}; choose from {list(SETTINGS)}")
        return list(dict.fromkeys(value))

    def as_options(self) -> dict:
        """The options dict; ``flagged_translations`` at its default is left out, so that
        the cells planned before the option existed keep their ids."""
        out = super().as_options()
        if out.get("flagged_translations") == "use":
            del out["flagged_translations"]
        return out

    @field_validator("translations", mode="before")
    @classmethod
    def _translations(cls, value):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"must be a source name, got {value!r}; name the translate "
                             "stage's documents source of the XRAG articles")
        return value

    @field_validator("expected", mode="before")
    @classmethod
    def _expected(cls, value):
        if value is False:
            return None
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"must be 'auto', a path or null, got {value!r}; set "
                             "`expected: configs/xrag.expected.yaml`, or null for no "
                             "published numbers")
        if value not in (None, "auto") and "://" not in value and not os.path.isfile(value):
            raise ValueError(f"file not found: {value}; give the path of an "
                             "xrag.expected.yaml (configs/ has the paper's), or null")
        return value
