"""Prefect API servers left behind by a controller that was killed, found and stopped on the next start.

Prefect's ephemeral API runs as a child process (uvicorn) that the controller stops when it exits normally
(``atexit``). A controller killed with ``kill -9``, or by the OOM killer, cannot: its ~200 MB server lives
on, orphaned, one per crash. Each controller marks its environment (:data:`MARK`, inherited by the server it
starts), so a later start can tell our orphans from anyone else's servers: a process of this user whose
command line is Prefect's API app, whose environment carries the mark, and whose marking controller is gone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

MARK = "CLUSTER_ACCEPT_CONTROLLER"  # the controller's pid, in its environment and its children's
SERVER_APP = b"prefect.server.api.server:create_app"
STOP_WAIT_S = 5.0


def mark_controller() -> None:
    """Mark this process (and every process it starts) as a controller's: ``MARK=<pid>``."""
    os.environ[MARK] = str(os.getpid())


def _processes() -> Iterator[tuple[int, bytes, dict[bytes, bytes]]]:
    """(pid, command line, environment) of this user's processes that can be read and run Prefect's API app: the
    environment of no other process is read (a node's own check starts here too, among root's many processes)."""
    uid = os.getuid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            cmdline = (entry / "cmdline").read_bytes()
            if SERVER_APP not in cmdline:
                continue
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        pairs = (item.partition(b"=") for item in environ.split(b"\0") if item)
        yield int(entry.name), cmdline, {key: value for key, _, value in pairs}


def _started(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def orphans() -> list[int]:
    """PIDs of Prefect API servers started by controllers that are gone. A controller is there while its pid
    runs a process that started before its server (a pid reused since is a later process). The mark lives in
    the servers' environments: a controller's own ``/proc/PID/environ`` shows only what it was started with."""
    found = []
    for pid, cmdline, environ in _processes():
        owner = environ.get(MARK.encode(), b"")
        if pid == os.getpid() or SERVER_APP not in cmdline or not owner.isdigit() or int(owner) == os.getpid():
            continue
        owner_started, server_started = _started(int(owner)), _started(pid)
        if server_started is not None and (owner_started is None or owner_started > server_started):
            found.append(pid)
    return found


def reap_orphans() -> list[int]:
    """Stop every orphaned server (:func:`orphans`): SIGTERM, then SIGKILL after :data:`STOP_WAIT_S`.
    Returns the PIDs stopped."""
    pids = orphans()
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    return pids


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
