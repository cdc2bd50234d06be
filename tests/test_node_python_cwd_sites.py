"""The node-side Python the tool starts with ``-c`` never imports from the directory it starts in: a job's user
may own that directory (a container's working directory, ``/tmp`` where Slurm falls back to it), and ``-c``
puts it first on ``sys.path``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster_accept.checks import probe_python
from cluster_accept.inventory.model import Profile
from cluster_accept.testbed.profile import base_profile

PLANTED = "import pathlib, os\npathlib.Path(os.environ['CA_PLANTED']).write_text('ran')\n"


def _plant(directory: Path) -> Path:
    """Modules the reader and the probe check import first, each writing a marker when imported."""
    for name in ("json", "argparse", "socket", "os", "sys", "platform", "importlib"):
        (directory / f"{name}.py").write_text(PLANTED)
    return directory / "marker"


@pytest.mark.integration
def test_the_watch_reader_imports_nothing_from_its_working_directory(tmp_path: Path) -> None:
    from cluster_accept.inventory.model import DEFAULT_SSH, Node
    from cluster_accept.watch.rounds import reader_command

    marker = _plant(tmp_path)
    profile = Profile.model_validate({**base_profile("h200x4", python=sys.executable)})
    node = Node(name="n1", ssh=DEFAULT_SSH, address="local", profile=profile, profile_name="p")
    command = reader_command(node, str(tmp_path / "nojob"), 0, 10)
    env = {"CA_PLANTED": str(marker), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["sh", "-c", command.script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert not marker.exists(), done.stdout + done.stderr
    assert '"read"' in done.stdout, done.stderr


@pytest.mark.integration
def test_the_probe_interpreter_check_imports_nothing_from_its_working_directory(tmp_path: Path) -> None:
    marker = _plant(tmp_path)
    profile = Profile.model_validate({**base_profile("h200x4", python=sys.executable)})
    command = probe_python.command_for(profile)
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, env={"CA_PLANTED": str(marker), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert not marker.exists(), done.stdout + done.stderr
    assert "found" in done.stdout, done.stdout
