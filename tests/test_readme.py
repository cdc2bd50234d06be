"""The README's commands are the ones CI runs."""

from __future__ import annotations

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
