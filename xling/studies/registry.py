"""Study names -> study classes, imported only when a study is asked for.

Adding a study is its folder under `xling/studies/` and one line here.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xling.studies.base import Study

# name -> "module:Class"
STUDIES: dict[str, str] = {
    "xrag": "xling.studies.xrag.study:XRAG",
    "bordirlines": "xling.studies.bordirlines.study:BordIRLines",
    "mirage": "xling.studies.mirage.study:MIRAGE",
    "cross": "xling.studies.cross.study:CROSS",
    "llmclir": "xling.studies.llmclir.study:LLMCLIR",
    "ragtime": "xling.studies.ragtime.study:RAGTIME",
}
NAMES = tuple(STUDIES)
# corpus formats a study reads (`format:` of a corpus or translate.documents entry) -> study
DOCUMENT_FORMATS: dict[str, str] = {"xrag": "xrag"}


class UnknownStudy(KeyError):
    def __str__(self) -> str:
        return f"unknown study {self.args[0]!r}; known: {', '.join(NAMES)}"


@cache
def get_study(name: str) -> Study:
    """The study registered as `name` (one instance per process)."""
    try:
        where = STUDIES[name]
    except KeyError:
        raise UnknownStudy(name) from None
    module, _, cls = where.partition(":")
    return getattr(importlib.import_module(module), cls)()


def names_with(capability: type) -> list[str]:
    """The registered studies that have `capability` (a `base` capability type), for error
    messages that name them; imports every study, so only where one is needed."""
    return [name for name in NAMES if isinstance(get_study(name), capability)]


@cache
def all_parsers() -> dict:
    """Every output parser by name: the generic ones (tasks/parsers.py) and each study's."""
    from xling.studies.base import Generative
    from xling.tasks.parsers import PARSERS

    out = dict(PARSERS)
    for name in NAMES:
        study = get_study(name)
        for parser, fn in (study.parsers() if isinstance(study, Generative) else {}).items():
            if parser in out and out[parser] is not fn:
                raise ValueError(f"study {name!r} registers parser {parser!r}, which exists")
            out[parser] = fn
    return out


def find_parser(name: str):
    """The output parser called `name`; a KeyError lists the known names."""
    from xling.tasks.parsers import PARSERS

    if name in PARSERS:  # the generic ones need no study import
        return PARSERS[name]
    parsers = all_parsers()
    if name not in parsers:
        raise KeyError(f"unknown parser {name!r}; known: {', '.join(sorted(parsers))}")
    return parsers[name]
