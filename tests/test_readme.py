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


def test_untimed_test_bed_modules_keep_their_tests_on_one_worker() -> None:
    """The first command runs the test-bed tests that judge no timing beside another worker: each such module
    holds one xdist group (its tests share test-beds by name, so they must run on one worker), and the command
    distributes by group, without which pytest-xdist ignores the groups."""
    command = (ROOT / ".ci" / "run").read_text().splitlines()[-1]
    first, second = command.split(" && python3 -m pytest ")[-2:]
    assert "--dist loadgroup" in first and '"(not testbed or untimed) and not serial"' in first
    assert '"(testbed and not untimed) or serial"' in second
    untimed = [
        p
        for p in sorted((ROOT / "tests").glob("test_*.py"))
        if "pytest.mark.untimed," in p.read_text().split("\n\n\ndef ")[0]
    ]
    assert len(untimed) >= 6, untimed
    for path in untimed:
        text = path.read_text()
        marks = f'pytestmark = [pytest.mark.testbed, pytest.mark.untimed, pytest.mark.xdist_group("{path.stem}")]'
        assert marks in text, f"{path.name}: mark the whole module testbed, untimed and its own xdist group"
        assert "single-node" not in text and "multi-node" not in text, f"{path.name} runs a stage that judges time"
