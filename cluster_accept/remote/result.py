"""Results of running commands on nodes: data, never exceptions.

A fan-out over 1,000 nodes must come back with one :class:`NodeResult` per node whatever happened there
(ClusterShell's and Fabric's GroupResult lesson): reachable or not, and for each command its exit code,
output, or the fact that it timed out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class NodeStatus(str, enum.Enum):
    OK = "ok"  # connected and the batch ran (individual commands may still have failed)
    UNREACHABLE = "unreachable"  # no session could be opened; ``cause`` says why
    ERROR = "error"  # connected, but the batch itself broke on the node (bad output, a copy refused)
    TOOL_ERROR = "tool_error"  # the controller failed (an internal error): the node was not judged


class UnreachableCause(str, enum.Enum):
    DNS = "dns"  # the name does not resolve
    REFUSED = "refused"  # nothing listens (sshd down)
    TIMEOUT = "timeout"  # no answer in connect_timeout_s (node off, packets dropped)
    NO_ROUTE = "no-route"  # the network says the host is unreachable
    AUTH = "auth"  # key refused, passphrase needed, no usable key
    HOST_KEY = "host-key"  # unknown key under 'strict', or a key that changed
    PROTOCOL = "protocol"  # connected but no SSH conversation (banner, reset): often sshd MaxStartups
    JUMP = "jump"  # the jump host itself could not be used
    SESSION_LOST = "session_lost"  # the session ended under us: EOF or reset before the exit status (a crash)
    ERROR = "error"  # anything else, with the exception text in ``detail``


class SessionLost(Exception):
    """The node went away under an open session: the connection closed, was reset, or stopped answering
    before a command's exit status came. Carries what the command printed until then."""

    def __init__(self, detail: str, stdout: str = "", stderr: str = ""):
        super().__init__(detail)
        self.detail = detail
        self.stdout = stdout
        self.stderr = stderr


class NodeRefused(Exception):
    """The node refused an operation on a working session (a file copy failed: its disk is full, a path is
    not writable): the node's fault, not the controller's, and not a lost session."""


@dataclass(frozen=True)
class RemoteCommand:
    """One command of a node's batch. ``script`` is ours (trusted shell); ``env`` values are quoted."""

    name: str
    script: str
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None  # None: the node's command_timeout_s


@dataclass
class CommandResult:
    name: str
    exit_code: int | None  # None when the command never reported (batch cut off)
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class NodeResult:
    node: str
    status: NodeStatus
    cause: UnreachableCause | None = None
    detail: str = ""
    commands: list[CommandResult] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def reachable(self) -> bool:
        return self.status is not NodeStatus.UNREACHABLE

    def command(self, name: str) -> CommandResult | None:
        for result in self.commands:
            if result.name == name:
                return result
        return None
