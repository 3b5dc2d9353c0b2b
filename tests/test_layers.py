"""The layer rules of docs/design.md, enforced on the source: a broken rule fails here."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "xling"

# tasks/ is pure Python + numpy/pyarrow: no Ray, no models.
FORBIDDEN = {
    "tasks": ("xling.jobs", "xling.actors", "ray", "torch", "transformers", "vllm",
              "ctranslate2", "FlagEmbedding", "pyserini"),
    "actors": ("xling.jobs", "xling.tasks"),
}


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                parts = path.relative_to(root).with_suffix("").parts[: -node.level]
                base = ".".join(parts)
                out.append((node.lineno, f"{base}.{node.module}" if node.module else base))
            else:
                out.append((node.lineno, node.module or ""))
    return out


def violations(layer: str, root: Path = PKG) -> list[str]:
    bad = []
    for path in sorted((root / layer).rglob("*.py")):
        for line, name in imports_of(path, root.parent):
            for banned in FORBIDDEN[layer]:
                if name == banned or name.startswith(banned + "."):
                    bad.append(f"{path.relative_to(root.parent)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_rules_hold(layer):
    assert violations(layer) == []


def test_nothing_imports_tests():
    bad = [f"{p}:{l}" for p in PKG.rglob("*.py") for l, n in imports_of(p)
           if n == "tests" or n.startswith("tests.")]
    assert bad == []


def test_checker_catches_a_violation(tmp_path):
    # The rule checker itself must see through `from ... import` and relative imports.
    (tmp_path / "xling" / "tasks").mkdir(parents=True)
    (tmp_path / "xling" / "tasks" / "bad.py").write_text(
        "import os\nfrom ..jobs.store import RunStore\nimport ray.data\n")
    found = violations("tasks", tmp_path / "xling")
    assert any("xling.jobs.store" in v for v in found)
    assert any("ray.data" in v for v in found)
