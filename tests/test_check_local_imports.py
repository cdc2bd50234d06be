"""What the command line imports where its start is the cost: ``check --local`` runs before every job (a Slurm
Prolog), so it loads neither Prefect nor the data frames (pandas, pyarrow) nor the report's templates (jinja2);
``--help`` loads no command's modules (their imports are made when the command runs). Each is the real command
line in a process of its own, read through ``python -X importtime``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# One node, this machine; its probes on the CPU, so that no torch import is waited for on a machine without a GPU.
LOCAL = (
    "cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: here, address: local}]\n"
    "profiles: {p: {probes: {device: cpu}}}\n"
)
NOT_ON_THE_CHECK = {"prefect", "pandas", "pyarrow", "jinja2", "numpy", "fabric", "paramiko"}
_IMPORTED = re.compile(r"import time:\s+\d+ \|\s+\d+ \| +(\S+)")


def imported_by(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``cluster-accept ARGS`` (``python -m cluster_accept.flows.cli``) run once, and every module it imported."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "runtime")}  # the check's kept answers: its own
    argv = [sys.executable, "-X", "importtime", "-m", "cluster_accept.flows.cli", *args]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=180)
    return done, {m[1] for m in map(_IMPORTED.match, done.stderr.splitlines()) if m}


def packages(modules: set[str]) -> set[str]:
    return {module.split(".")[0] for module in modules}


@pytest.mark.integration
def test_check_local_imports_neither_prefect_nor_data_frames_nor_the_report(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(LOCAL)
    state = ["--state-dir", str(tmp_path / "state")]  # not this machine's /var/lib/cluster-accept
    done, modules = imported_by(tmp_path, "check", "--local", "--inventory", str(inventory), *state)
    assert done.returncode in (0, 1), done.stdout + done.stderr[-2000:]  # a verdict: the check ran to its end
    assert done.stdout.startswith("cluster-accept: ")
    assert "cluster_accept.flows.node_check" in modules and "cluster_accept.checks.base" in modules
    assert not packages(modules) & NOT_ON_THE_CHECK
    assert "cluster_accept.reports.render" not in modules and "cluster_accept.reports.summary" not in modules


@pytest.mark.integration
def test_help_imports_no_commands_modules(tmp_path: Path) -> None:
    done, modules = imported_by(tmp_path, "--help")
    assert done.returncode == 0 and "check" in done.stdout
    assert not packages(modules) & (NOT_ON_THE_CHECK | {"pydantic", "yaml", "ClusterShell"})
    ours = {m for m in modules if m.startswith("cluster_accept.")}
    assert "cluster_accept.flows.check_command" in ours  # the commands are there (``-m``: the CLI is __main__)
    heavy = {m for m in ours if m.split(".")[1] not in ("flows", "ops", "vocabulary", "watch")}
    assert not heavy, f"--help imported {sorted(heavy)}"
    assert not {m for m in ours if m.startswith("cluster_accept.ops.") and m != "cluster_accept.ops.defaults"}
    assert not {m for m in ours if m.startswith("cluster_accept.watch.") and m != "cluster_accept.watch.places"}


def test_the_defaults_the_help_spells_are_the_commands_own() -> None:
    """The defaults the help shows without loading the rules they belong to (ops.defaults, watch.places)."""
    from cluster_accept.flows import watch_command
    from cluster_accept.ops import breaker, defaults, repeats
    from cluster_accept.watch import rounds

    assert (watch_command.DEFAULT_WATCH_DIR, watch_command.SHIM_DIR) == (rounds.DEFAULT_WATCH_DIR, rounds.SHIM_DIR)
    assert rounds.READER.parent == rounds.SHIM_DIR
    assert watch_command.SHIM_DIR.is_dir()
    assert breaker.DrainLimits().max_fraction == defaults.DEFAULT_MAX_DRAIN_FRACTION
    rule = repeats.DEFAULT_RULE
    assert (rule.streak, rule.share, rule.window) == (defaults.FAIL_STREAK, defaults.FAIL_SHARE, defaults.FAIL_WINDOW)
