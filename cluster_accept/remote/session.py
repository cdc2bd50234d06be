"""What a node's session is to everything above it (:class:`NodeSession`: SSH, the controller itself, or a
simulated node): typed operations, never script text. The controller's own session (:class:`LocalSession`)
and SSH's carry them out as shell scripts (:class:`~remote.shell.ShellSession`); a simulated node's, from the
scale simulator loaded by name (:func:`simulated_session`: it is not part of the wheel, and nothing here
imports it), answers them in-process."""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, cast

from cluster_accept.inventory.model import Node
from cluster_accept.inventory.simulation_settings import SIMULATOR
from cluster_accept.remote.batch import (
    CLIENT_MARGIN_S,
    KILL_GRACE_S,
    command_timeout,
    output_limit,
    taken_in,
    under_timeout,
)
from cluster_accept.remote.channel import Keep
from cluster_accept.remote.local import run_local
from cluster_accept.remote.result import CommandResult, NoAnswer, NodeResult, NodeStatus, PollAnswer, RemoteCommand
from cluster_accept.remote.shell import Answer, ShellSession, script_keep

MAX_AT_ONCE = 16  # commands of one reading batch run at once on the controller itself


class NodeSession(Protocol):
    """One open session on a node. A node that went away under it raises
    :class:`~remote.result.SessionLost`; a copy the node refused, :class:`~remote.result.NodeRefused`."""

    def run_batch(self, commands: Sequence[RemoteCommand], default_timeout_s: float) -> NodeResult:
        """Run ``commands`` in order, each under its node-side timeout: the node's result with one per command
        (a node lost mid-batch is ``unreachable``, with what completed), never raised."""
        ...

    def make_probe_dir(self, stale_min: int) -> str:
        """A fresh private directory (probe directories older than ``stale_min`` swept first)."""
        ...

    def put(self, local_path: str, remote_path: str) -> None: ...

    def remove_dir(self, remote_dir: str, kill_tag: str | None = None) -> None:
        """Remove a probe directory; with ``kill_tag`` kill that run's processes on the node first."""
        ...

    def free_port(self, python: str) -> int | NoAnswer: ...

    def start_detached(
        self, remote_dir: str, command: RemoteCommand, default_timeout_s: float, tag: str | None
    ) -> int | NoAnswer:
        """Start ``command`` in ``remote_dir``, outliving this operation: its pid."""
        ...

    def poll_detached(self, remote_dir: str, pid: int, kill_pattern: str | None) -> PollAnswer | NoAnswer:
        """Running, or ended with its outputs (the directory then removed); stopped first with ``kill_pattern``."""
        ...

    def close(self) -> None: ...


class LocalSession(ShellSession):
    """The controller itself, without SSH."""

    def __init__(self, node: Node):
        self.node = node

    @property
    def node_name(self) -> str:
        return self.node.name

    def run_script(self, script: str, timeout_s: float) -> Answer:
        return self.run_kept(script, timeout_s, script_keep())

    def run_kept(self, script: str, timeout_s: float, keep: Keep) -> Answer:
        return run_local(["sh", "-c", script], timeout_s, keep)

    def run_batch(self, commands: Sequence[RemoteCommand], default_timeout_s: float) -> NodeResult:
        """A batch of commands that only read (a node checking itself: Slurm's prolog waits on it) runs them all
        at once, each under its own timeout; any other batch runs in order, as over SSH."""
        if len(commands) < 2 or not all(c.reads_only for c in commands):
            return super().run_batch(commands, default_timeout_s)
        with ThreadPoolExecutor(max_workers=min(MAX_AT_ONCE, len(commands))) as pool:
            results = list(pool.map(lambda c: self._read(c, default_timeout_s), commands))
        return NodeResult(self.node.name, NodeStatus.OK, None, "", results)

    @staticmethod
    def _read(command: RemoteCommand, default_timeout_s: float) -> CommandResult:
        """One command under ``timeout`` as a batch runs it, its output capped and masked where it enters the
        controller (:func:`~remote.batch.taken_in`)."""
        limit = command_timeout(command, default_timeout_s)
        line = under_timeout(command.script, command.env, limit)
        keep = Keep(output_limit(command))
        code, out, err, lost = run_local(["sh", "-c", line], limit + KILL_GRACE_S + CLIENT_MARGIN_S, keep)
        timed_out = lost or code in (124, 137)
        return CommandResult(
            command.name, None if lost else code, taken_in(command, out), taken_in(command, err), timed_out
        )

    def put(self, local_path: str, remote_path: str) -> None:
        shutil.copyfile(local_path, remote_path)


def simulated_session(node: Node) -> NodeSession:
    """The session of a node of a simulated inventory (its ``simulation`` block, refused at load where the
    simulator is not installed), answered in-process from the recording."""
    assert node.simulated is not None, node.name
    simulator = importlib.import_module(SIMULATOR)
    return cast(NodeSession, simulator.simulated_session(node.name, node.simulated))
