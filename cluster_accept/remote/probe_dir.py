"""Run probe commands on a node from a private temporary directory that holds the shipped probe scripts.

Shared by the single-node stage and the multi-node launcher: ``mktemp -d`` on the node, the scripts copied
in over SFTP (a copy for the local transport), the commands run as one batch with ``CA_PROBE_DIR`` set,
and the directory removed afterwards whatever happened. Failures come back as data, never raised. The
multi-node launcher starts its ranks with :func:`start_in_probe_dir` instead: they outlive the SSH operation
that starts them, and are watched with short polls.

A controller that dies mid-run (or a node that reboots mid-probe) cannot clean up, so each run first sweeps
this user's probe directories older than any run could last (every command is killed at its timeout).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from cluster_accept.inventory.model import Node
from cluster_accept.remote.fanout import connect, tool_error_detail
from cluster_accept.remote.result import (
    NodeRefused,
    NodeResult,
    NodeStatus,
    ProbeDirError,
    RemoteCommand,
    SessionLost,
    Unreachable,
    UnreachableCause,
)
from cluster_accept.remote.session import NodeSession

PROBES_DIR = Path(__file__).resolve().parent.parent / "probes" / "node"  # node-side scripts
STALE_MARGIN_MIN = 10


def stale_minutes(commands: Sequence[RemoteCommand]) -> int:
    """How old a probe directory must be to belong to a dead run: older than any of ``commands`` could last."""
    longest_s = sum((c.timeout_s or 3600) for c in commands)
    return int(longest_s // 60) + STALE_MARGIN_MIN


def open_probe_dir(session: NodeSession, files: Sequence[str], commands: Sequence[RemoteCommand]) -> str:
    """Create a fresh private directory on the node, ship ``files`` (names in :data:`PROBES_DIR`, or absolute
    paths: a probe from another package ships its own script; each lands under its own name) into it and
    return its path; the caller removes it (:func:`remove_probe_dir`). Raises :class:`ProbeDirError`, or what
    the session raised (the directory is removed again when shipping failed)."""
    remote_dir = session.make_probe_dir(stale_minutes(commands))
    try:
        for name in files:
            session.put(str(PROBES_DIR / name), f"{remote_dir}/{Path(name).name}")
    except BaseException:
        remove_probe_dir(session, remote_dir)
        raise
    return remote_dir


def remove_probe_dir(session: NodeSession, remote_dir: str) -> None:
    session.remove_dir(remote_dir)


def start_in_probe_dir(
    session: NodeSession, node: Node, files: Sequence[str], command: RemoteCommand, tag: str
) -> tuple[str, int]:
    """Ship ``files`` to a fresh directory and start ``command`` there detached (:mod:`remote.detached`), its
    processes marked with ``--tag TAG``: (directory, wrapper pid). The caller polls it; the poll that finds it
    ended removes the directory. Raises :class:`ProbeDirError` when it did not start (whatever did start is
    killed and the directory removed: it would wait for peers that never come), or what the session raised."""
    remote_dir = open_probe_dir(session, files, [command])
    try:
        pid = session.start_detached(remote_dir, command, node.ssh.command_timeout_s or 120.0, tag)
    except BaseException:
        remove_probe_dir(session, remote_dir)
        raise
    if not isinstance(pid, int):
        session.remove_dir(remote_dir, kill_tag=tag)
        raise ProbeDirError(f"the command did not start: {pid.why}")
    return remote_dir, pid


def run_in_probe_dir(node: Node, files: Sequence[str], commands: Sequence[RemoteCommand]) -> NodeResult:
    """Ship ``files`` (names in probes/) to a fresh directory on ``node``, run ``commands`` there, clean up.

    Never raises: a node that went away is ``unreachable`` (``session_lost``, with what completed before), a
    node that refused the directory or a copy is ``error``, a failure of the controller's own ``tool_error``."""
    started = time.monotonic()
    session = connect(node)
    if isinstance(session, Unreachable):
        result = NodeResult(node.name, NodeStatus.UNREACHABLE, session.cause, session.detail)
    else:
        try:
            result = _run_in(session, node, files, commands)
        except SessionLost as lost:
            result = NodeResult(node.name, NodeStatus.UNREACHABLE, UnreachableCause.SESSION_LOST, lost.detail)
        except (ProbeDirError, NodeRefused) as exc:
            result = NodeResult(node.name, NodeStatus.ERROR, None, str(exc))
        except Exception as exc:  # noqa: BLE001 - the controller's failure is data too, never the node's fault
            result = NodeResult(node.name, NodeStatus.TOOL_ERROR, None, tool_error_detail(exc))
        finally:
            session.close()
    result.duration_s = time.monotonic() - started
    return result


def _run_in(session: NodeSession, node: Node, files: Sequence[str], commands: Sequence[RemoteCommand]) -> NodeResult:
    remote_dir = open_probe_dir(session, files, commands)
    jobs = [RemoteCommand(c.name, c.script, {**c.env, "CA_PROBE_DIR": remote_dir}, c.timeout_s) for c in commands]
    try:
        batch = session.run_batch(jobs, node.ssh.command_timeout_s or 120.0)
    except BaseException:
        _remove_quietly(session, remote_dir)
        raise
    if batch.status is not NodeStatus.UNREACHABLE:  # a lost session cannot clean up: the next run's sweep does
        _remove_quietly(session, remote_dir)
    return NodeResult(node.name, batch.status, batch.cause, batch.detail, batch.commands)


def _remove_quietly(session: NodeSession, remote_dir: str) -> None:
    try:
        remove_probe_dir(session, remote_dir)
    except SessionLost:
        pass  # the run's result stands; the next run's sweep removes the directory
