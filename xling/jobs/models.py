"""Resolving model names in configs to something a loader can open.

A config names a model by hub id (`facebook/nllb-200-distilled-600M`), by local path, or as
`tiny:<name>` for the tiny same-architecture models that `xling models tiny` builds for
offline tests and the demo.
"""

from __future__ import annotations

from pathlib import Path

from xling.jobs.config import ConfigError


def resolve_model(name: str, *, key: str = "model") -> str:
    if name.startswith("tiny:"):
        from xling.jobs.tiny_models import tiny_model_paths

        which = name.split(":", 1)[1]
        paths = tiny_model_paths()
        if which not in paths:
            raise ConfigError(f"{key}: unknown tiny model '{which}'; choose one of "
                              f"{', '.join('tiny:' + k for k in paths)}")
        path = paths[which]
        if not path.is_dir():
            raise ConfigError(f"{key}: tiny model '{which}' is not built yet at {path}. "
                              f"Run `xling models tiny` first.")
        return str(path)
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser().resolve())
    return name  # a hub id, downloaded (or found in the HF cache) by the loader
