"""Following one command on an open SSH channel to its end, and telling a node that went away from one that
is slow. No SSH library here: the channel and transport are whatever :mod:`remote.ssh` opened (paramiko's),
seen through the few methods used.

A node that crashed or rebooted closes its connection (the transport goes inactive); a node that lost power
or whose network was cut sends nothing at all, and TCP can take a quarter of an hour to notice. So after
:data:`SILENCE_CHECK_S` without output, and at the client-side timeout, a second channel is opened beside the
command: a node that cannot open one within :data:`LIVENESS_TIMEOUT_S` is gone.
"""

from __future__ import annotations

import select
import time
from typing import Any, Protocol

from cluster_accept.remote.result import SessionLost

SILENCE_CHECK_S = 60.0  # after this long without output, check that the node still answers
LIVENESS_TIMEOUT_S = 20.0  # a node that cannot open a channel in this long is gone
CLOSE_GRACE_S = 2.0  # a channel closed without a status: how long the transport is given to show it is gone


class Channel(Protocol):
    closed: bool
    eof_received: bool
    status_event: Any
    exit_status: int

    def exec_command(self, command: str) -> None: ...

    def shutdown_write(self) -> None: ...

    def recv_ready(self) -> bool: ...

    def recv_stderr_ready(self) -> bool: ...

    def recv(self, nbytes: int) -> bytes: ...

    def recv_stderr(self, nbytes: int) -> bytes: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...


class Transport(Protocol):
    def is_active(self) -> bool: ...

    def open_session(self, timeout: float | None = None) -> Any: ...


def _wait_inactive(transport: Transport, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while transport.is_active() and time.monotonic() < deadline:
        time.sleep(0.05)


def answers(transport: Transport) -> bool:
    """Whether the node still answers on ``transport``: a second channel opens (and is closed at once)."""
    try:
        probe = transport.open_session(timeout=LIVENESS_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - whatever the SSH library says, the node did not answer
        return False
    probe.close()
    return True


def follow(
    channel: Channel,
    transport: Transport,
    command_line: str,
    timeout_s: float,
    streams: tuple[bytearray, bytearray],
) -> tuple[int | None, bool]:
    """Read ``channel`` until its exit status and EOF (code, False), the client-side timeout (None, True), or
    the session's end (None, False)."""
    out, err = streams
    deadline = time.monotonic() + timeout_s
    heard = time.monotonic()
    channel.exec_command(command_line)
    channel.shutdown_write()  # never interactive: no stdin
    while True:
        select.select([channel], [], [], 0.2)
        before = len(out) + len(err)
        while channel.recv_ready():
            out += channel.recv(1 << 16)
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(1 << 16)
        now = time.monotonic()
        heard = now if len(out) + len(err) > before else heard
        # Done when both the output (EOF) and the exit status are in: sshd may send the status first. paramiko
        # also sets the status event when the channel closes, leaving ``exit_status`` at -1: no status came.
        pending = channel.recv_ready() or channel.recv_stderr_ready()
        if channel.status_event.is_set() and (channel.eof_received or channel.closed) and not pending:
            if channel.exit_status >= 0:
                return channel.exit_status, False
            # Closed without a status: the connection is going (the transport notices within moments), or the
            # command died of a signal.
            _wait_inactive(transport, CLOSE_GRACE_S)
            return None, False
        if not transport.is_active():
            return None, False
        if now > deadline:
            if not answers(transport):
                raise SessionLost("the node stopped answering (no reply to a liveness check at the timeout)")
            return None, True
        if now - heard > SILENCE_CHECK_S:
            if not answers(transport):
                raise SessionLost(
                    f"the node stopped answering (silent for {now - heard:.0f} s, no reply to a liveness check)"
                )
            heard = time.monotonic()
