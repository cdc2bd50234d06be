"""The soak tier (docs/development.md): left out of a run unless its ``-m`` expression names it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
SOAK_FILE = "tests/test_noise_testbed.py"  # both of its tests are soak


def collected(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_soak_tests_run_only_when_the_marker_expression_names_them() -> None:
    assert collected(SOAK_FILE) == []
    assert collected("-m", "testbed", SOAK_FILE) == []
    soak = collected("-m", "soak", SOAK_FILE)
    assert len(soak) == 2 and all(t.startswith(SOAK_FILE) for t in soak), soak
    assert collected("-m", "soak", "tests/test_soak_tier.py") == []  # a test in no soak is not in the tier


def _soak_tests(path: Path) -> list[str]:
    """The tests of ``path`` marked soak (every one where its module's ``pytestmark`` names soak), as the docs
    name them: ``file::test`` or ``file`` for a module all soak."""
    tree = ast.parse(path.read_text())
    whole = any(
        isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
        and "soak" in ast.unparse(node.value)
        for node in tree.body
    )  # fmt: skip
    if whole:
        return [path.name]
    tests = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    return [f"{path.name}::{t.name}" for t in tests if any("mark.soak" in ast.unparse(d) for d in t.decorator_list)]


def _listed(name: str, docs: str) -> bool:
    """``file::test`` named in a row as itself, as ``::test`` after its file's, or by a row that begins with its
    file alone (a module whose tests are all soak: by a row beginning with its file)."""
    file, _, test = name.partition("::")
    if not test:
        return f"| `{file}" in docs
    return f"| `{file}` " in docs or any(f"`{form}`" in docs for form in (name, f"::{test}"))


def test_every_soak_test_is_listed_in_the_docs_with_its_claim() -> None:
    """A test moved out of the default run is named in docs/development.md's soak tables, where its claim is said
    (the tier must be run before a change lands, so a reader has to find what it proves)."""
    docs = (ROOT / "docs" / "development.md").read_text()
    soak = [name for path in sorted((ROOT / "tests").glob("test_*.py")) for name in _soak_tests(path)]
    assert len(soak) >= 20, soak
    unlisted = [name for name in soak if not _listed(name, docs)]
    assert unlisted == [], f"soak tests missing from docs/development.md: {unlisted}"
