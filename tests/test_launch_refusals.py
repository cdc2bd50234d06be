"""No launch failure ends as accepted: a launcher this version cannot run is refused when the inventory loads
(exit 2, the key named), and a multi-node group that never started fails every one of its nodes with why."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.checks.base import Status
from cluster_accept.tasks.group_rows import failed_run_rows
from cluster_accept.tasks.launcher import GroupRun
from tests.processes import run_cli

pytestmark = pytest.mark.pure

INVENTORY = """\
cluster: c
defaults: {profile: p}
nodes:
  - hosts: node01
    address: local
  - hosts: node02
    address: local
profiles:
  p:
    probes: {device: cpu, launcher: slurm}
"""


def test_a_launcher_that_does_not_exist_yet_is_refused_at_load(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    proc = run_cli("inventory", "check", str(inventory), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr
    assert "launcher" in said and "not implemented yet: use 'ssh'" in said
    ssh = tmp_path / "ssh.yaml"
    ssh.write_text(INVENTORY.replace("launcher: slurm", "launcher: ssh"))
    assert run_cli("inventory", "check", str(ssh), timeout=120).returncode == 0


def test_a_group_that_never_started_fails_each_of_its_nodes_with_why() -> None:
    run = GroupRun(("node01", "node02"), "t1", detail="a multi-node run needs at least two nodes")
    rows = failed_run_rows(run)
    assert [(node, row.status, row.reason) for node, row, _ in rows] == [
        ("node01", Status.ERROR, "launch_failed"),
        ("node02", Status.ERROR, "launch_failed"),
    ]
    assert (
        rows[0][1].detail == "the all-reduce of node[01-02] could not start: a multi-node run needs at least two nodes"
    )
