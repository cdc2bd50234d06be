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

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster_accept.inventory.model import Node
from cluster_accept.remote.detached import start_detached, tag_pattern
from cluster_accept.remote.fanout import NodeSession, connect, run_batch, tool_error_detail
from cluster_accept.remote.result import (
    CommandResult,
    NodeRefused,
    NodeStatus,
    RemoteCommand,
    SessionLost,
    UnreachableCause,
)
from cluster_accept.remote.ssh import Unreachable

PROBES_DIR = Path(__file__).resolve().parent.parent / "probes" / "node"  # node-side scripts
_TMP_DIR = re.compile(r"^/[\w./-]*cluster-accept-probe\.\w+$")
STALE_MARGIN_MIN = 10


def make_dir_script(commands: Sequence[RemoteCommand]) -> str:
    """Sweep stale probe directories of dead runs, then create this run's (its path is the last line)."""
    longest_s = sum((c.timeout_s or 3600) for c in commands)
    stale_min = int(longest_s // 60) + STALE_MARGIN_MIN
    return (
        'find "${TMPDIR:-/tmp}" -maxdepth 1 -name "cluster-accept-probe.*" -user "$(id -u)" '
        f"-mmin +{stale_min} -exec rm -rf {{}} + 2>/dev/null; "
        'mktemp -d "${TMPDIR:-/tmp}/cluster-accept-probe.XXXXXXXX"'
    )


@dataclass
class ProbeDirRun:
    status: NodeStatus
    cause: str | None = None  # set when the node was unreachable
    detail: str = ""
    results: list[CommandResult] = field(default_factory=list)


class ProbeDirError(Exception):
    """The node gave no usable directory (its ``mktemp`` output is not one of ours): nothing was shipped."""


def open_probe_dir(session: NodeSession, files: Sequence[str], commands: Sequence[RemoteCommand]) -> str:
    """Create a fresh private directory on the node, ship ``files`` (names in :data:`PROBES_DIR`, or absolute
    paths: a probe from another package ships its own script; each lands under its own name) into it and
    return its path; the caller removes it (:func:`remove_probe_dir`). Raises :class:`ProbeDirError`, or what
    the session raised (the directory is removed again when shipping failed)."""
    code, out, err, _ = session.run_script(make_dir_script(commands), 60)
    remote_dir = out.strip().splitlines()[-1] if out.strip() else ""
    if code != 0 or not _TMP_DIR.match(remote_dir):
        raise ProbeDirError(f"mktemp failed on the node: {err.strip() or out}")
    try:
        for name in files:
            session.put(str(PROBES_DIR / name), f"{remote_dir}/{Path(name).name}")
    except BaseException:
        remove_probe_dir(session, remote_dir)
        raise
    return remote_dir


def remove_probe_dir(session: NodeSession, remote_dir: str) -> None:
    session.run_script(f"rm -rf {shlex.quote(remote_dir)}", 30)


def start_in_probe_dir(
    session: NodeSession, node: Node, files: Sequence[str], command: RemoteCommand, tag: str
) -> tuple[str, int]:
    """Ship ``files`` to a fresh directory and start ``command`` there detached (:mod:`remote.detached`), its
    processes marked with ``--tag TAG``: (directory, wrapper pid). The caller polls it; the poll that finds it
    ended removes the directory. Raises :class:`ProbeDirError` when it did not start (whatever did start is
    killed and the directory removed: it would wait for peers that never come), or what the session raised."""
    remote_dir = open_probe_dir(session, files, [command])
    try:
        pid = start_detached(session, remote_dir, command, node.ssh.command_timeout_s or 120.0, tag)
    except BaseException:
        remove_probe_dir(session, remote_dir)
        raise
    if isinstance(pid, str):
        pattern = shlex.quote(tag_pattern(tag))
        session.run_script(f"pkill -KILL -f -- {pattern}; rm -rf {shlex.quote(remote_dir)}", 30)
        raise ProbeDirError(f"the command did not start: {pid}")
    return remote_dir, pid


def run_in_probe_dir(node: Node, files: Sequence[str], commands: Sequence[RemoteCommand]) -> ProbeDirRun:
    """Ship ``files`` (names in probes/) to a fresh directory on ``node``, run ``commands`` there, clean up.

    Never raises: a node that went away is ``unreachable`` (``session_lost``, with what completed before), a
    node that refused the directory or a copy is ``error``, a failure of the controller's own ``tool_error``."""
    session = connect(node)
    if isinstance(session, Unreachable):
        return ProbeDirRun(NodeStatus.UNREACHABLE, session.cause.value, session.detail)
    try:
        return _run_in(session, node, files, commands)
    except SessionLost as lost:
        return ProbeDirRun(NodeStatus.UNREACHABLE, UnreachableCause.SESSION_LOST.value, lost.detail)
    except (ProbeDirError, NodeRefused) as exc:
        return ProbeDirRun(NodeStatus.ERROR, None, str(exc))
    except Exception as exc:  # noqa: BLE001 - the controller's failure is data too, never the node's fault
        return ProbeDirRun(NodeStatus.TOOL_ERROR, None, tool_error_detail(exc))
    finally:
        session.close()


def _run_in(session: NodeSession, node: Node, files: Sequence[str], commands: Sequence[RemoteCommand]) -> ProbeDirRun:
    remote_dir = open_probe_dir(session, files, commands)
    jobs = [RemoteCommand(c.name, c.script, {**c.env, "CA_PROBE_DIR": remote_dir}, c.timeout_s) for c in commands]
    try:
        batch = run_batch(session, node, jobs)
    except BaseException:
        _remove_quietly(session, remote_dir)
        raise
    if batch.status is not NodeStatus.UNREACHABLE:  # a lost session cannot clean up: the next run's sweep does
        _remove_quietly(session, remote_dir)
    cause = batch.cause.value if batch.cause else None
    return ProbeDirRun(batch.status, cause, batch.detail, batch.results)


def _remove_quietly(session: NodeSession, remote_dir: str) -> None:
    try:
        remove_probe_dir(session, remote_dir)
    except SessionLost:
        pass  # the run's result stands; the next run's sweep removes the directory
