"""No launch failure ends as accepted: launcher settings that cannot work are refused when the inventory loads
(exit 2, the key named), and a multi-node group that never started fails every one of its nodes with why."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.checks.base import Status
from cluster_accept.remote.launch import GroupRun
from cluster_accept.tasks.multi_node.group_rows import failed_run_rows
from tests.processes import run_cli

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


@pytest.mark.integration
def test_slurm_settings_the_launcher_cannot_act_on_are_refused_at_load(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY.replace("launcher: slurm}", "launcher: slurm, slurm: {srun_args: [mpi=none]}}"))
    proc = run_cli("inventory", "check", str(inventory), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "probes.slurm.srun_args" in said and "holds options only" in said
    good = tmp_path / "good.yaml"
    good.write_text(INVENTORY)
    assert run_cli("inventory", "check", str(good), timeout=120).returncode == 0


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
