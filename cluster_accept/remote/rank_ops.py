"""The short SSH operations on one rank's node that the SSH launcher (:mod:`remote.ssh_launcher`) schedules: a
free port for the rendezvous, the detached start, one poll.

Each operation ends as data, never as an exception: the rank's node unreachable or lost mid-session
(``session_lost``), the node refusing a copy (``error``), or the controller failing (``tool_error``: never a
fact about the node).
"""

from __future__ import annotations

import threading

from cluster_accept.inventory.model import Node
from cluster_accept.remote.fanout import tool_error_detail
from cluster_accept.remote.launch import RankRun
from cluster_accept.remote.probe_dir import start_in_probe_dir
from cluster_accept.remote.result import (
    NoAnswer,
    NodeRefused,
    NodeStatus,
    PollAnswer,
    ProbeDirError,
    RemoteCommand,
    SessionLost,
    Unreachable,
    UnreachableCause,
)
from cluster_accept.remote.sessions import SessionCache


def free_port(sessions: SessionCache, master: Node) -> int | RankRun:
    """A port free on the run's first node for its rendezvous, or why there is none."""
    python = master.profile.probes.python
    try:
        answer = sessions.run(master, lambda session: session.free_port(python))
    except Exception as exc:  # noqa: BLE001 - the controller's failure is data, never the node's fault
        return RankRun(master.name, NodeStatus.TOOL_ERROR, None, tool_error_detail(exc))
    if isinstance(answer, Unreachable):
        return RankRun(master.name, NodeStatus.UNREACHABLE, answer.cause.value, answer.detail)
    if isinstance(answer, NoAnswer):
        return RankRun(master.name, NodeStatus.ERROR, None, answer.why)
    return answer


def start_rank(
    sessions: SessionCache,
    node: Node,
    command: RemoteCommand,
    stopping: threading.Event,
    tag: str,
    files: tuple[str, ...] = ("allreduce.py",),
) -> tuple[str, int] | RankRun:
    """Probe directory, wrapper, detached start: (directory, wrapper pid), or why the rank did not start."""
    if stopping.is_set():
        return RankRun(node.name, NodeStatus.ERROR, None, "not started: the run was stopped", stopped=True)
    session, _ = sessions.take(node)
    if isinstance(session, Unreachable):
        return RankRun(node.name, NodeStatus.UNREACHABLE, session.cause.value, session.detail)
    try:
        started = start_in_probe_dir(session, node, files, command, tag)
    except (ProbeDirError, NodeRefused) as exc:
        sessions.give(node, session)
        return RankRun(node.name, NodeStatus.ERROR, None, str(exc))
    except SessionLost as lost:
        session.close()
        return RankRun(node.name, NodeStatus.UNREACHABLE, UnreachableCause.SESSION_LOST.value, lost.detail)
    except Exception as exc:  # noqa: BLE001 - the controller's failure is data, never the node's fault
        session.close()
        return RankRun(node.name, NodeStatus.TOOL_ERROR, None, tool_error_detail(exc))
    sessions.give(node, session)
    return started


def poll_rank(
    sessions: SessionCache, node: Node, remote_dir: str, pid: int, kill_pattern: str | None
) -> PollAnswer | Unreachable | RankRun | str:
    """One look at a started rank (stopping it first with ``kill_pattern``): its answer, the node unreachable,
    why there was no answer (a string), or a failure of the controller's own as the rank's end."""
    try:
        answer = sessions.run(node, lambda session: session.poll_detached(remote_dir, pid, kill_pattern))
    except Exception as exc:  # noqa: BLE001 - the controller's failure is data, never the node's fault
        return RankRun(node.name, NodeStatus.TOOL_ERROR, None, tool_error_detail(exc))
    return answer.why if isinstance(answer, NoAnswer) else answer
