"""The layer rules of docs/design.md, enforced on the source: a broken rule fails here.

    cli.py, config.py,  know every stage (the top)
    pipeline.py
    jobs/               one module per stage, plus the study glue
    core/               config machinery, run store, runner, pools, sources, LLM calls
    studies/            one package per paper behind studies/base.py's interface
    actors/             engines (may use tasks/)
    tasks/              the study-independent library (the bottom)
    dev/                tiny models, local S3 and Ray for tests, benchmarks and the demo

Imports only point down. Imports under `if TYPE_CHECKING:` are for type checkers, never run,
and are left out (jobs/ annotates with the top-level `XlingConfig` that way). Nothing above
studies/ names a study: it reaches them through `xling.studies.base` and
`xling.studies.registry` only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import parse_python

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "xling"

HEAVY = ("ray", "torch", "transformers", "vllm", "ctranslate2", "FlagEmbedding", "pyserini")
# layer -> what its modules may not import
FORBIDDEN = {
    "tasks": ("xling.jobs", "xling.core", "xling.actors", "xling.dev", "xling.cli",
              "xling.config", "xling.pipeline", "xling.studies", *HEAVY),
    "studies": ("xling.jobs", "xling.core", "xling.actors", "xling.dev", "xling.cli",
                "xling.config", "xling.pipeline", *HEAVY),
    "actors": ("xling.jobs", "xling.core", "xling.dev", "xling.cli",
               "xling.config", "xling.pipeline", "xling.studies"),
    "core": ("xling.jobs", "xling.cli", "xling.config", "xling.pipeline", "xling.dev"),
    "jobs": ("xling.cli", "xling.config", "xling.pipeline", "xling.dev"),
}
# What code outside studies/ may import of it: the interface and the registry, no study.
STUDY_API = ("xling.studies.base", "xling.studies.registry")
STUDY_USERS = ("jobs", "core", "config.py", "cli.py", "pipeline.py")
# The only modules outside dev/ that may import dev/: the CLI commands that build tiny models
# or start local services.
DEV_USERS = ("xling/cli.py",)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import that runs, at any depth of the file."""
    tree = parse_python(path)
    skip = _type_checking_lines(tree)
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                parts = path.relative_to(root).with_suffix("").parts[: -node.level]
                base = ".".join(parts)
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            # `from xling.dev import devstore` imports the module xling.dev.devstore
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return out


def _hits(name: str, banned: str) -> bool:
    return name == banned or name.startswith(banned + ".")


def violations(layer: str, root: Path = PKG) -> list[str]:
    bad = []
    for path in sorted((root / layer).rglob("*.py")):
        for line, name in imports_of(path, root.parent):
            for banned in FORBIDDEN[layer]:
                if _hits(name, banned):
                    bad.append(f"{path.relative_to(root.parent)}:{line} imports {name}")
    return sorted(set(bad))


def study_violations(root: Path = PKG) -> list[str]:
    """Imports of a study package (or anything of studies/ but its interface) from jobs/,
    core/, config.py, cli.py and pipeline.py."""
    bad = []
    for where in STUDY_USERS:
        paths = sorted((root / where).rglob("*.py")) if (root / where).is_dir() else \
            [root / where] if (root / where).is_file() else []
        for path in paths:
            for line, name in imports_of(path, root.parent):
                if _hits(name, "xling.studies") and name != "xling.studies" and not any(
                        _hits(name, api) for api in STUDY_API):
                    bad.append(f"{path.relative_to(root.parent)}:{line} imports {name}")
    return sorted(set(bad))


def dev_violations(root: Path = PKG) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith("xling/dev/") or rel in DEV_USERS:
            continue
        bad += [f"{rel}:{line} imports {name}" for line, name in imports_of(path, root.parent)
                if _hits(name, "xling.dev")]
    return sorted(set(bad))


# The extension points behind a registry: a backend is known only under core/engines/, an
# embedder class only in actors/embedder.py; everything else asks the registry.
BACKEND_HOME = "xling/core/engines/"
EMBEDDER_HOME = "xling/actors/embedder.py"


def extension_violations(root: Path = PKG) -> list[str]:
    """Outside their homes: an import of a backend module or of an embedder class, or a
    comparison of a `backend` with a backend's name (`spec.backend == "vllm"`)."""
    from xling.actors.embedder import EMBEDDERS
    from xling.core.engines import BACKENDS

    embedders = [target.replace(":", ".") for target in EMBEDDERS.values()]
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        for line, name in imports_of(path, root.parent):
            if not rel.startswith(BACKEND_HOME) and any(_hits(name, m) for m in BACKENDS.values()):
                bad.append(f"{rel}:{line} imports the backend module {name}")
            if rel != EMBEDDER_HOME and name in embedders:
                bad.append(f"{rel}:{line} imports the embedder {name} (use make_embedder)")
        if rel.startswith(BACKEND_HOME):
            continue
        for node in ast.walk(parse_python(path)):
            if isinstance(node, ast.Compare) and "backend" in ast.unparse(node) and any(
                    isinstance(c, ast.Constant) and c.value in BACKENDS
                    for c in ast.walk(node)):
                bad.append(f"{rel}:{node.lineno} asks which backend: {ast.unparse(node)}")
    return sorted(set(bad))


def module_graph(root: Path = PKG) -> dict[str, set[str]]:
    """module -> the xling modules it imports (packages resolved to their modules)."""
    mods = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        deps = set()
        for _, name in imports_of(path, root.parent):
            while name and name not in mods:  # `from x.y import f`: the module is x.y
                name = name.rpartition(".")[0]
            if name and name != mod and not mod.startswith(name + "."):
                deps.add(name)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_rules_hold(layer):
    assert violations(layer) == []


def test_nothing_outside_studies_names_a_study():
    assert study_violations() == []


def test_study_checker_catches_each_planted_violation(tmp_path):
    pkg = _plant(tmp_path, {
        "jobs/leak.py": "from xling.studies.mirage.study import LANGS\n",
        "core/leak.py": "def f():\n    import xling.studies.cross\n",
        "config.py": "from xling.studies.xrag import study\n",
        "pipeline.py": "from xling.studies import cross\n",
        "jobs/fine.py": "from xling.studies.base import Judged\n"
                        "from xling.studies.registry import get_study\nimport xling.studies\n",
        "tasks/leak.py": "from xling.studies.registry import get_study\n",
        "studies/xrag/bad.py": "from xling.core.store import RunStore\n",
    })
    found = study_violations(pkg)
    assert any(v.startswith("xling/jobs/leak.py:1") for v in found)
    assert any(v.startswith("xling/core/leak.py:2") for v in found)  # inside a function too
    assert any(v.startswith("xling/config.py:1") for v in found)
    assert any(v.startswith("xling/pipeline.py:1") for v in found)
    assert not any("fine.py" in v for v in found)
    assert any("xling.studies.registry" in v for v in violations("tasks", pkg))
    assert any("xling.core.store" in v for v in violations("studies", pkg))


def test_only_the_cli_imports_dev():
    assert dev_violations() == []


def test_backends_and_embedders_are_known_only_to_their_registries():
    assert extension_violations() == []


def test_extension_checker_catches_each_planted_violation(tmp_path):
    pkg = _plant(tmp_path, {
        "jobs/which.py": "def f(spec):\n    return spec.backend != 'vllm'\n",
        "core/which.py": "def f(d):\n    return d.get('backend') in ('openai',)\n",
        "jobs/engine.py": "from xling.core.engines.openai import OpenAIEngine\n",
        "core/embed.py": "def f():\n    from xling.actors.embedder import M3Embedder\n",
        "core/engines/fine.py": "def f(spec):\n    return spec.backend == 'vllm'\n",
        "core/fine.py": "from xling.actors.embedder import make_embedder\n"
                        "from xling.core.engines import spec_class\n"
                        "def f(kind):\n    return kind == 'vllm'\n",
    })
    found = extension_violations(pkg)
    assert any(v.startswith("xling/jobs/which.py:2 asks which backend") for v in found)
    assert any(v.startswith("xling/core/which.py:2 asks which backend") for v in found)
    assert any(v.startswith("xling/jobs/engine.py:1 imports the backend module") for v in found)
    assert any(v.startswith("xling/core/embed.py:2 imports the embedder") for v in found)
    assert not any("fine.py" in v for v in found)


# A stage finds another stage's cells by its name (core/upstream.py), never by importing it;
# the only module of jobs/ a stage imports is the study glue, and the glue imports none.
STUDY_GLUE = "xling.jobs.study"


def stage_violations(root: Path = PKG) -> list[str]:
    """Imports of a jobs/ module from another jobs/ module, other than of the study glue."""
    bad = []
    for path in sorted((root / "jobs").glob("*.py")):
        rel = path.relative_to(root.parent)
        me = ".".join(rel.with_suffix("").parts)
        for line, name in imports_of(path, root.parent):
            if not _hits(name, "xling.jobs") or name == "xling.jobs" or _hits(name, me):
                continue
            if me != STUDY_GLUE and _hits(name, STUDY_GLUE):
                continue
            bad.append(f"{rel}:{line} imports {name}")
    return sorted(set(bad))


def test_no_stage_imports_another():
    assert stage_violations() == []


def test_stage_checker_catches_each_planted_violation(tmp_path):
    pkg = _plant(tmp_path, {
        "jobs/retrieve.py": "def f():\n    from xling.jobs.index import index_cells\n",
        "jobs/rerank.py": "import xling.jobs.retrieve\n",
        "jobs/study.py": "from xling.jobs.translate import TranslateStage\n",
        "jobs/judge.py": "from xling.jobs.study import study_of\nfrom xling.core import upstream\n",
    })
    found = stage_violations(pkg)
    assert any(v.startswith("xling/jobs/retrieve.py:2 imports xling.jobs.index") for v in found)
    assert any(v.startswith("xling/jobs/rerank.py:1 imports xling.jobs.retrieve") for v in found)
    assert any(v.startswith("xling/jobs/study.py:1 imports xling.jobs.translate") for v in found)
    assert not any("judge.py" in v for v in found)


def test_no_import_cycles():
    assert cycles(module_graph()) == []


def test_jobs_holds_only_stages_and_the_study_glue():
    stages = {"ingest", "translate", "index", "retrieve", "rerank", "narrow", "generate",
              "features", "judge", "nuggets", "evaluate", "report", "study"}
    assert {p.stem for p in (PKG / "jobs").glob("*.py")} - {"__init__"} <= stages


def test_nothing_imports_tests():
    bad = [f"{p}:{l}" for p in PKG.rglob("*.py") for l, n in imports_of(p)
           if n == "tests" or n.startswith("tests.")]
    assert bad == []


def _plant(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "xling"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in [pkg, *[p for p in pkg.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return pkg


def test_checker_catches_each_planted_violation(tmp_path):
    pkg = _plant(tmp_path, {
        "tasks/bad.py": "import os\nfrom ..core.store import RunStore\nimport ray.data\n"
                        "def f():\n    from xling.actors.llm import Sampling\n",
        "actors/bad.py": "from xling.core import store\nfrom xling.jobs.index import X\n",
        "core/bad.py": "from xling.jobs.translate import TranslateStage\n",
        "jobs/bad.py": "from xling.dev import tiny_models\n",
        "jobs/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from xling.config import XlingConfig\n",
        "cli.py": "from xling.dev.devstore import start\n",
    })
    tasks = violations("tasks", pkg)
    assert any("xling.core.store" in v for v in tasks)
    assert any("ray.data" in v for v in tasks)
    assert any("xling.actors.llm" in v for v in tasks)  # a function-level import counts
    actors = violations("actors", pkg)
    assert any("xling.core" in v for v in actors) and any("xling.jobs" in v for v in actors)
    assert any("xling.jobs.translate" in v for v in violations("core", pkg))
    jobs = violations("jobs", pkg)
    assert any("jobs/bad.py" in v and "xling.dev" in v for v in jobs)
    assert not any("typed.py" in v for v in jobs)  # TYPE_CHECKING imports never run
    assert dev_violations(pkg) == ["xling/jobs/bad.py:1 imports xling.dev",
                                   "xling/jobs/bad.py:1 imports xling.dev.tiny_models"]


def test_checker_catches_a_planted_cycle(tmp_path):
    pkg = _plant(tmp_path, {
        "jobs/generate.py": "from xling.jobs.study import prompt_rows\n",
        "jobs/study.py": "def f():\n    from xling.jobs.judge import judge_cells\n",
        "jobs/judge.py": "from xling.jobs.generate import GenerateStage\n",
        "tasks/corpora.py": "from xling.tasks import xrag\n",
        "tasks/xrag.py": "from xling.tasks.corpora import iter_lines\n",
        "tasks/fine.py": "from xling.tasks.corpora import iter_lines\n",
    })
    found = cycles(module_graph(pkg))
    assert ["xling.jobs.generate", "xling.jobs.judge", "xling.jobs.study"] in found
    assert ["xling.tasks.corpora", "xling.tasks.xrag"] in found
    assert len(found) == 2
