"""Slurm on a running test-bed (:mod:`testbed.slurm`), started for its nodes: which nodes' slurmd can run, the
environment Slurm's own programs get on each node, and a node's slurmd started again after its sshd."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from cluster_accept.testbed import slurm, sshd
from cluster_accept.testbed.faults import FaultPlan


class Testbed(Protocol):
    """What Slurm needs of a running test-bed (:class:`testbed.bed.Testbed`, which starts Slurm through here)."""

    state_dir: Path
    prefix: str
    inventory_path: Path
    nodes: dict[str, str]
    host_ip: str
    faults: FaultPlan
    health_check: str

    def slurm_name(self, node: str) -> str: ...

    def node_dir(self, node: str) -> Path: ...


def _slurm_live(tb: Testbed) -> list[str]:
    """The nodes whose slurmd can start and register: sshd running and the link up."""
    return [n for n in tb.nodes if not {"down", "off"} & {f.kind for f in tb.faults.faults(n)}]


def node_env(tb: Testbed, node: str) -> dict[str, str]:
    """The node's environment as its sshd sessions get it, plus what a node's own programs would find: this
    machine's Python (with cluster-accept) on PATH, Slurm's configuration, a Prefect home of the node's own."""
    env: dict[str, str] = json.loads((tb.node_dir(node) / "env.json").read_text(encoding="utf-8"))
    path = f"{env.get('PATH', sshd.BASE_PATH)}:{Path(sys.executable).parent}"
    return {
        **env, "PATH": path, "HOME": "/root", "PREFECT_HOME": str(tb.node_dir(node) / "prefect"),
        **slurm.client_env(tb.state_dir),
    }  # fmt: skip


def node_marks_env(state_dir: Path) -> dict[str, str]:
    """Where the nodes' own checks keep their marks: in the test-bed's state dir, so that a test-bed never reads
    the marks another left in this machine's ``/var/lib/cluster-accept`` (its nodes share this machine's boot)."""
    return {"CLUSTER_ACCEPT_STATE_DIR": str(state_dir / "node-marks")}


def start_slurm(tb: Testbed, site_env: Mapping[str, str] | None = None) -> None:
    """Slurm for the test-bed's nodes; the health check's site settings name the test-bed's inventory unless
    ``site_env`` names another, and keep the nodes' marks in the test-bed's state dir (not this machine's)."""
    live = _slurm_live(tb)
    site = {"CLUSTER_ACCEPT_INVENTORY": str(tb.inventory_path), **node_marks_env(tb.state_dir), **(site_env or {})}
    pids = {tb.slurm_name(n): sshd.read_pid(tb.node_dir(n)) for n in live}
    slurm.up(
        tb.state_dir, tb.prefix, tb.host_ip, {tb.slurm_name(n): ip for n, ip in tb.nodes.items()},
        {name: pid for name, pid in pids.items() if pid}, {tb.slurm_name(n): node_env(tb, n) for n in tb.nodes},
        tb.health_check or None, site,
    )  # fmt: skip


def start_slurmd(tb: Testbed, node: str) -> None:
    """The node's slurmd again (after its sshd came back): same namespaces as the new sshd."""
    pid = sshd.read_pid(tb.node_dir(node))
    if pid is None:  # a node that is up has its sshd's pid file (sshd.start waits for it)
        raise slurm.SlurmBedError(f"no sshd pid for {node} ({tb.node_dir(node) / 'sshd.pid'}): its slurmd has no node")
    slurm.write_node_env(tb.state_dir, tb.slurm_name(node), node_env(tb, node))
    slurm.restart_slurmd(tb.state_dir, pid, tb.slurm_name(node))
