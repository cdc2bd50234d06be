"""Sessions kept open between short commands to the same nodes (start-up, then polls every few seconds).

Connecting costs far more than a command on an open session (key exchange and authentication on both ends,
~15 ms of controller CPU and more on a busy node), and polls come back to the same nodes every few seconds.
But paramiko keeps a thread per open connection, so idle sessions are kept for at most ``capacity`` nodes:
beyond that, a node's poll connects afresh. A kept session that turns out broken (the node's sshd restarted,
the connection dropped) is replaced once by a fresh one before the command counts as failed; a node that
cannot be connected to comes back as :class:`~remote.ssh.Unreachable`, as data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cluster_accept.inventory.model import Node
from cluster_accept.remote.fanout import NodeSession
from cluster_accept.remote.ssh import Unreachable

Answer = tuple[int | None, str, str, bool]  # exit code or None, stdout, stderr, timed out on the client


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

    def run(self, node: Node, script: str, timeout_s: float) -> Answer | Unreachable:
        """Run ``script`` on ``node``. Only a session that answered is kept: one that broke under the command
        (no exit status) or did not answer in time is closed, so the node's next command connects afresh."""
        session, kept = self.take(node)
        answer = self._run(node, session, script, timeout_s)
        if kept and isinstance(answer, tuple) and answer[0] is None and not answer[3]:
            answer = self._run(node, self._connect(node), script, timeout_s)  # a kept one went stale
        return answer

    def _run(
        self, node: Node, session: NodeSession | Unreachable, script: str, timeout_s: float
    ) -> Answer | Unreachable:
        if isinstance(session, Unreachable):
            return session
        try:
            answer = session.run_script(script, timeout_s)
        except Exception as exc:  # noqa: BLE001 - a broken session is data
            answer = (None, "", f"{type(exc).__name__}: {exc}", False)
        if answer[0] is None:
            session.close()
        else:
            self.give(node, session)
        return answer

    def close(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for session in idle:
            session.close()
