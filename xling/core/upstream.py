"""What a stage reads of the stages before it, asked by stage name: no stage imports another.

A stage's inputs are cells of other stages. It finds them here, naming the stage that makes
them; the stage classes are the pipeline's registry (`use_registry`), so this module, like
the stages that ask it, imports none of them. The answers are the cells the run's plan is
built from (core/plan.py asks the same `cells`), computed once per command and config
(core/memo.py):

    cells(cfg, stage)                 every cell the stage leaves (its `all_cells`); none
                                      when the config has no section for it
    cell(cfg, stage, id)              one of them, by id
    find(cfg, stage, **key)           one of them, by key
    at(cfg, dir)                      the cell in a directory (`retrieve/<id>`: an edge)
    translation(cfg, kind, source, src, tgt)
                                      the translate cell of a DT (kind "doc") or QT ("query")
    documents(cfg, collection, lang, text_lang)
                                      an index collection's documents rows in `lang`: the
                                      originals, or the translate stage's DT into text_lang
                                      (rerank's and a study's passages), read as index reads them

A cell asked for and not planned is a StageFailed naming it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

from xling.core.cells import Cell, StageFailed
from xling.core.memo import remember, run_scope

if TYPE_CHECKING:
    from xling.config import XlingConfig

_registry: Callable[[], dict] | None = None


def use_registry(registry: Callable[[], dict]) -> None:
    """The stage registry (stage name -> class) the lookups use: the pipeline's."""
    global _registry
    _registry = registry


def stage(name: str):
    """An instance of the stage class registered under `name`."""
    if _registry is None:
        # The registry lives a layer above core/ (xling/pipeline.py registers it when it is
        # imported): reached by name, as a study is through studies/registry.py, so no
        # import runs up from here.
        importlib.import_module("xling.pipeline")
    registry = _registry()
    if name not in registry:
        raise StageFailed(f"no stage named {name!r}; stages: {', '.join(registry)}")
    return registry[name]()


def cells(cfg: XlingConfig, name: str) -> list[Cell]:
    """Every cell stage `name` leaves in its folder for `cfg` (its `all_cells`: fusions,
    imports and nugget assignments included), in the stage's order."""
    if getattr(cfg, name, None) is None:
        return []
    return stage(name).all_cells(cfg)


def _lookup(cfg: XlingConfig, name: str) -> tuple[dict, dict]:
    def build():
        by_id, by_key = {}, {}
        for c in cells(cfg, name):
            by_id.setdefault(c.id, c)
            by_key.setdefault(tuple(sorted(c.key.items())), c)
        return by_id, by_key

    # A lookup asks other lookups while it builds (a rerank cell's DT texts ask for the
    # retrieve cells a fusion reads, and so on). Outside a command's scope (a unit test, a
    # stage called alone) nothing would be kept, and each nested question built its stage's
    # cells again: the golden plan of bordirlines.yaml took 95 s. A scope of its own keeps
    # them for the duration of this lookup.
    with run_scope():
        return remember(("upstream", name, id(cfg)), build, pin=cfg)


def cell(cfg: XlingConfig, name: str, cell_id: str) -> Cell:
    """The cell of stage `name` whose id is `cell_id`."""
    found = _lookup(cfg, name)[0].get(cell_id)
    if found is None:
        raise StageFailed(f"the config's {name} section makes no cell {cell_id}")
    return found


def find(cfg: XlingConfig, name: str, **key: str) -> Cell:
    """The cell of stage `name` whose key is `key`."""
    found = _lookup(cfg, name)[1].get(tuple(sorted(key.items())))
    if found is None:
        raise StageFailed(f"no {name} cell {key} in the config's {name} section")
    return found


def at(cfg: XlingConfig, cell_dir: str) -> Cell:
    """The cell whose directory is `cell_dir` ("<stage>/<id>", as a cell's inputs name it)."""
    name, _, cell_id = cell_dir.partition("/")
    return cell(cfg, name, cell_id)


def translation(cfg: XlingConfig, kind: str, source: str, src: str, tgt: str) -> Cell:
    """The translate cell that holds a DT (`kind` "doc") or a QT ("query") of `source`."""
    found = _lookup(cfg, "translate")[1].get(
        tuple(sorted({"source": source, "src": src, "tgt": tgt}.items())))
    if found is None or found.params["kind"] != kind:
        raise StageFailed(f"the config's translate section has no {kind} translation "
                          f"'{source}' {src}->{tgt}")
    return found


def documents(cfg: XlingConfig, collection: str, lang: str, text_lang: str):
    """A Ray Dataset of the documents rows of index collection `collection` in `lang`: the
    originals (text_lang = lang) or their DT into `text_lang`, whether or not an index of
    them is built (the index stage reads them: `documents`)."""
    return stage("index").documents(cfg, collection, lang, text_lang)
