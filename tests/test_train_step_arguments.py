"""The training job's node script refuses a count of timed steps it cannot make a figure of, by name, before it
starts a process group (a median over no step raised only after the model was built)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

NODE = Path(__file__).resolve().parent.parent / "cluster_accept" / "probes"


@pytest.mark.integration
@pytest.mark.parametrize("option", ["--solo-steps", "--steps"])
def test_no_timed_step_is_refused_by_name(option: str) -> None:
    env_path = f"{NODE / 'node'}"  # allreduce.py, shipped beside train_step.py on a node
    done = subprocess.run(
        [sys.executable, str(NODE / "training" / "node" / "train_step.py"), "--device", "cpu", option, "0"],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument {option}: 0: give at least 1" in done.stderr, done.stderr[-2000:]
