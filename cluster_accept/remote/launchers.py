"""Which :class:`~remote.launch.Launcher` a run gets: the profile's ``probes.launcher``."""

from __future__ import annotations

from cluster_accept.inventory.model import Node
from cluster_accept.remote.launch import Launcher
from cluster_accept.remote.srun import SrunLauncher
from cluster_accept.remote.ssh_launcher import SshLauncher


def launcher_for(node: Node, concurrency: int) -> Launcher:
    """``srun`` in an allocation for ``slurm``, else ``torchrun`` over SSH (detached ranks, polled); at most
    ``concurrency`` operations in flight."""
    if node.profile.probes.launcher == "slurm":
        return SrunLauncher(concurrency)
    return SshLauncher(concurrency)
