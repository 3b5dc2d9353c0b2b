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
}
NAMES = tuple(STUDIES)


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


def all_parsers() -> dict:
    """Every study's output parsers by name (tasks/parsers.py adds the generic ones)."""
    out: dict = {}
    for name in NAMES:
        out.update(get_study(name).parsers())
    return out
