"""The README's commands are the ones CI runs."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    command = ci_lines[-1]
    assert "pytest" in command and "mypy" in command and "ruff check" in command
    readme = (ROOT / "README.md").read_text()
    assert f"```\n{command}\n```" in readme


def test_readme_demo_command_installs_and_runs_the_demo() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "python3 -m pip install 'torch==2.13.0+cpu' -e . && cluster-accept demo\n" in readme


def _untimed(path: Path) -> list[tuple[str, str, str]]:
    """(test or module, the marks, the code they cover) of each untimed mark in ``path``: a module's
    ``pytestmark`` (the whole module) or a test's decorators (that test)."""
    text = path.read_text()
    tree = ast.parse(text)
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            if "mark.untimed" in ast.unparse(node.value):
                found.append((path.name, ast.unparse(node.value), text))
        elif isinstance(node, ast.FunctionDef) and any("mark.untimed" in ast.unparse(d) for d in node.decorator_list):
            marks = " ".join(ast.unparse(d) for d in node.decorator_list)
            found.append((f"{path.name}::{node.name}", marks, ast.get_source_segment(text, node) or ""))
    return found


def test_untimed_test_bed_tests_keep_to_one_worker_a_module_and_run_no_timed_stage() -> None:
    """The first command runs the test-bed tests that judge no timing beside another worker: each carries its
    module's xdist group (a module's tests share test-beds by name, so they must run on one worker), the command
    distributes by group (without which pytest-xdist ignores the groups), and none runs a stage whose figures
    are timed."""
    command = (ROOT / ".ci" / "run").read_text().splitlines()[-1]
    first, second = command.split(" && python3 -m pytest ")[-2:]
    assert "--dist loadgroup" in first and '"(not testbed or untimed) and not serial"' in first
    assert '"(testbed and not untimed) or serial"' in second
    untimed = [(p.stem, *found) for p in sorted((ROOT / "tests").glob("test_*.py")) for found in _untimed(p)]
    assert len(untimed) >= 8, untimed
    for stem, name, marks, code in untimed:
        assert f"xdist_group('{stem}')" in marks, f"{name}: give it its module's group, xdist_group({stem!r})"
        timed = [s for s in ("single-node", "multi-node", "multi_node_cli", "launch_group", "burn", "training=True")
                 if s in code]  # fmt: skip
        assert timed == [], f"{name} runs what is timed ({timed}): it is not untimed"
