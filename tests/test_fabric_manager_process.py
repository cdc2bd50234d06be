"""Where systemctl says nothing of Fabric Manager (no systemd in the node's namespace), the nvswitch check asks
whether its process runs: root's process of that name (the kernel keeps 15 characters of it, and pgrep matches
nothing longer), never another user's program that names itself so."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

import cluster_accept.checks.nvswitch as nvswitch
from cluster_accept.inventory.model import Profile
from tests.capture import NO_CLUSTER

HGX = Profile.model_validate({"nvswitch": {"count": 1}})
NOBODY = 65534


@contextmanager
def _program(user: int | None) -> Iterator[int]:
    """A program named as Fabric Manager's, running as ``user`` (None: as this test), its pid; stopped after."""
    folder = Path(tempfile.mkdtemp(prefix="ca-fm-"))
    folder.chmod(0o755)  # another user runs it from here
    program = folder / "nv-fabricmanager"
    shutil.copy("/bin/sleep", program)
    program.chmod(0o755)
    proc = subprocess.Popen([str(program), "60"], user=user)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(folder)


def _read(tmp_path: Path) -> nvswitch.Fabric:
    """The check run with a systemctl that has no answer (no systemd) and the real pgrep."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho 'System has not been booted with systemd'; exit 1\n")
    (bin_dir / "systemctl").chmod(0o755)
    (tmp_path / "sys").mkdir(exist_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CLUSTER_ACCEPT_SYSFS": str(tmp_path / "sys")}
    done = subprocess.run(
        ["sh", "-c", nvswitch.COMMAND], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    return nvswitch.parse(done.stdout, done.returncode)


def _service_row(model: nvswitch.Fabric) -> tuple[str, str]:
    on_board = replace(model, switches=["0000:a5:00.0"], fm_version="580.159.04")
    (row,) = [r for r in nvswitch.evaluate(on_board, HGX, NO_CLUSTER) if r.item == "fabric_manager"]
    return row.status.value, row.reason


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="starting a program as root needs root")
def test_root_running_fabric_manager_counts_as_running(tmp_path: Path) -> None:
    with _program(None):
        model = _read(tmp_path)
    assert model.service == {} and model.running
    assert _service_row(model) == ("pass", "ok")


@pytest.mark.integration
def test_another_users_program_named_fabric_manager_does_not_count(tmp_path: Path) -> None:
    with _program(NOBODY if os.geteuid() == 0 else None):
        model = _read(tmp_path)
    assert model.service == {} and not model.running
    assert _service_row(model) == ("fail", "fm_stopped")
