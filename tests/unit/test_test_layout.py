"""Test modules share helpers through tests/helpers.py (or conftest fixtures), never by
importing one another: a test module imported by another runs its module-level code (marks,
fixtures, constants) twice over and ties the two files' lifetimes together."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import parse_python

TESTS = Path(__file__).resolve().parents[1]
LAYERS = ("unit", "integration", "e2e", "faults")


def _test_module(name: str | None) -> str | None:
    """The test module an import names (``test_x``, ``tests.test_x``, ``test_x.sub``), else None."""
    if not name:
        return None
    parts = name.split(".")
    if parts[0] == "tests" and len(parts) > 1:
        parts = parts[1:]
    return parts[0] if parts[0].startswith("test_") else None


def cross_imports(folder: Path) -> list[str]:
    """``file:line: module`` for every import of a ``test_*`` module in ``folder/test_*.py``
    (anywhere in the file, function bodies included)."""
    out = []
    for path in sorted(folder.glob("test_*.py")) + sorted(folder.glob("*/test_*.py")):
        for node in ast.walk(parse_python(path)):
            names: list[str | None] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module]
                if node.level or node.module == "tests":  # `from . import` a test module
                    names += [a.name for a in node.names]
            for mod in filter(None, map(_test_module, names)):
                out.append(f"{path.relative_to(folder)}:{node.lineno}: {mod}")
    return out


def test_no_test_module_imports_another():
    assert cross_imports(TESTS) == [], "import shared helpers from tests/helpers.py instead"


def test_every_test_module_is_in_a_layer_and_named_once():
    """tests/<layer>/test_*.py only; a basename used twice would shadow the other (the
    layers are not packages)."""
    assert sorted(TESTS.glob("test_*.py")) == [], "put the module in one of " + ", ".join(LAYERS)
    names = [p.name for layer in LAYERS for p in (TESTS / layer).glob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert sorted(p.name for p in TESTS.iterdir() if p.is_dir() and p.name not in (
        "data", "__pycache__")) == sorted(LAYERS)


def test_a_planted_cross_import_is_found(tmp_path):
    a = "test" + "_a"  # spelled in two parts so that a grep of tests/ for such imports stays quiet
    (tmp_path / f"{a}.py").write_text("from helpers import ok\nimport json\n")
    (tmp_path / "test_b.py").write_text(
        f"import os\nfrom {a} import x\n\ndef test_f():\n    import tests.{a} as t\n"
        f"    from . import {a}\n")
    (tmp_path / "helpers.py").write_text(f"from {a} import x\n")  # not a test module
    assert cross_imports(tmp_path) == ["test_b.py:2: test_a", "test_b.py:5: test_a",
                                       "test_b.py:6: test_a"]


def test_modules_with_shared_fixtures_keep_their_tests_on_one_worker():
    """`make test` schedules test by test (xdist's loadgroup): a module- or class-scoped
    fixture would be built once per worker that runs one of its tests, unless the module
    marks itself as one group."""
    missing = []
    for layer in LAYERS:
        for path in sorted((TESTS / layer).glob("test_*.py")):
            text = path.read_text(encoding="utf-8")
            if path == Path(__file__).resolve():
                continue  # this test names the pattern it looks for
            if ('scope="module"' in text or 'scope="class"' in text) and (
                    f'xdist_group("{path.stem}")' not in text):
                missing.append(f"{layer}/{path.name}")
    assert missing == [], "add pytestmark = pytest.mark.xdist_group(<module name>)"


def test_no_test_module_imports_ray_when_collected():
    """Collection imports every test module in every xdist worker before any fixture runs.
    Ray read at import the auth settings that the worker's cluster fixture (conftest's
    `worker_ray`: RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH) sets later, so one module-level
    `import ray` made every `ray.init` of the run fail with InvalidAuthToken (64 errors).
    Ray is imported inside the tests that use it."""
    found = []
    for layer in LAYERS:
        for path in sorted((TESTS / layer).glob("test_*.py")):
            for node in parse_python(path).body:
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n == "ray" or n.startswith("ray.") for n in names):
                    found.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert not found, f"module-level ray imports: {found}"
