"""A Python the tool starts on a node imports nothing from a directory it did not choose: Slurm starts a step in
the controller's directory, or in ``/tmp`` where the node lacks that one, and ``python -c`` puts its working
directory first on its path, so a ``socket.py`` any user left there would run as the operator."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from cluster_accept.inventory.model import DEFAULT_SSH, Node, Profile
from cluster_accept.inventory.slurm_settings import SrunSettings
from cluster_accept.remote import srun
from cluster_accept.remote.srun_script import srun_argv

PLANTED = """from pathlib import Path
Path(__file__).with_name("ran-as-the-operator").write_text("planted code ran")
"""


def _node() -> Node:
    profile = Profile.model_validate({"probes": {"python": sys.executable}})
    return Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address="10.0.0.1")


def _hostile(directory: Path) -> Path:
    """``directory`` holding modules the port pick and a reader would import; the marker their code writes."""
    for module in ("socket", "json"):
        (directory / f"{module}.py").write_text(PLANTED)
    return directory / "ran-as-the-operator"


def _port_argv(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The argv ``launcher: slurm`` runs to pick the rendezvous port (srun itself stood in for)."""
    seen: list[list[str]] = []

    def answer(argv: Sequence[str], timeout_s: float, stdin: str | None = None, live: object = None) -> object:
        seen.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, "41234\n", "")

    monkeypatch.setattr(srun, "_run", answer)
    assert srun._port("7", _node()) == 41234
    return seen[0]


def test_every_srun_step_starts_in_the_root_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    step = srun_argv("17", ["gpu-a1", "gpu-a2"], SrunSettings(), 17)
    port = _port_argv(monkeypatch)
    for argv in (step, port):
        assert argv[0] == "srun" and "--chdir=/" in argv
        assert argv.index("--chdir=/") < argv.index("/bin/sh")  # an option of srun's, not of the task's


@pytest.mark.integration
def test_the_srun_port_pick_imports_nothing_from_its_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    argv = _port_argv(monkeypatch)
    marker = _hostile(tmp_path)
    task = argv[argv.index("/bin/sh") :]  # what the step runs on the node, there in a directory of another user's
    done = subprocess.run(task, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert not marker.exists(), done.stderr
    assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stderr


@pytest.mark.integration
def test_a_node_of_its_own_picks_a_port_without_importing_from_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from cluster_accept.remote.session import LocalSession

    marker = _hostile(tmp_path)
    monkeypatch.chdir(tmp_path)  # the controller started in a shared directory
    port = LocalSession(_node()).free_port(sys.executable)
    assert not marker.exists()
    assert isinstance(port, int) and 0 < port < 65536
