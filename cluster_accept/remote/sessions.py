"""Sessions kept open between short commands to the same nodes (start-up, then polls every few seconds).

Connecting costs far more than a command on an open session (key exchange and authentication on both ends,
~15 ms of controller CPU and more on a busy node), and polls come back to the same nodes every few seconds.
But paramiko keeps a thread per open connection, so idle sessions are kept for at most ``capacity`` nodes:
beyond that, a node's poll connects afresh. A kept session that turns out broken (the node's sshd restarted,
the connection dropped) is replaced once by a fresh one before the command counts as failed; a node that
cannot be connected to, or that went away under its session, comes back as :class:`~remote.ssh.Unreachable`,
as data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from cluster_accept.inventory.model import Node
from cluster_accept.remote.result import NoAnswer, SessionLost, Unreachable, UnreachableCause
from cluster_accept.remote.session import NodeSession

T = TypeVar("T")


class SessionCache:
    def __init__(self, capacity: int, connect: Callable[[Node], NodeSession | Unreachable]) -> None:
        self.capacity = capacity
        self._connect = connect
        self._idle: dict[str, NodeSession] = {}
        self._lock = threading.Lock()

    def take(self, node: Node) -> tuple[NodeSession | Unreachable, bool]:
        """A session for ``node`` for the caller alone, and whether it is a kept one (it may have gone stale)."""
        with self._lock:
            session = self._idle.pop(node.name, None)
        if session is not None:
            return session, True
        return self._connect(node), False

    def give(self, node: Node, session: NodeSession) -> None:
        """Keep ``session`` for the node's next command, or close it when enough are kept already."""
        with self._lock:
            if node.name not in self._idle and len(self._idle) < self.capacity:
                self._idle[node.name] = session
                return
        session.close()

    def run(self, node: Node, operation: Callable[[NodeSession], T]) -> T | Unreachable:
        """Run ``operation`` on a session of ``node``. Only a session that answered is kept: one that broke under
        the operation or did not answer in time (:class:`~remote.result.NoAnswer` ``timed_out``) is closed, so
        the node's next operation connects afresh. A kept session that was lost is tried once more on a fresh
        one; when none opens, the node is ``session_lost`` (it went away during the run), with why the fresh
        one did not open."""
        session, kept = self.take(node)
        answer = self._run(node, session, operation)
        if kept and isinstance(answer, Unreachable) and answer.cause is UnreachableCause.SESSION_LOST:
            retried = self._run(node, self._connect(node), operation)
            if isinstance(retried, Unreachable) and retried.cause is not UnreachableCause.SESSION_LOST:
                detail = f"{answer.detail}; a new session did not open either ({retried.cause.value}: {retried.detail})"
                return Unreachable(UnreachableCause.SESSION_LOST, detail)
            answer = retried
        return answer

    def _run(
        self, node: Node, session: NodeSession | Unreachable, operation: Callable[[NodeSession], T]
    ) -> T | Unreachable:
        """Errors of the controller's own (a bug, no file descriptors left) are raised: no fact about the node."""
        if isinstance(session, Unreachable):
            return session
        try:
            answer = operation(session)
        except SessionLost as lost:
            session.close()
            return Unreachable(UnreachableCause.SESSION_LOST, lost.detail)
        except BaseException:
            session.close()
            raise
        if isinstance(answer, NoAnswer) and answer.timed_out:
            session.close()
        else:
            self.give(node, session)
        return answer

    def close(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for session in idle:
            session.close()
