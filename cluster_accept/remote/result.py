"""Results of running commands on nodes: data, never exceptions.

A fan-out over 1,000 nodes must come back with one :class:`NodeResult` per node whatever happened there
(ClusterShell's and Fabric's GroupResult lesson): reachable or not, and for each command its exit code,
output, or the fact that it timed out. A command's output is node text: masked where it entered the controller
(:data:`~vocabulary.secrets.MaskedText`), so nothing above masks it again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cluster_accept.vocabulary.secrets import MaskedText


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


class Unreachable(Exception):
    """A node no session could be opened to, and why: raised inside :mod:`remote.ssh` only, handed to callers as
    data by :func:`remote.ssh.open_session`."""

    def __init__(self, cause: UnreachableCause, detail: str):
        super().__init__(f"{cause.value}: {detail}")
        self.cause = cause
        self.detail = detail


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


class ProbeDirError(Exception):
    """The node gave no usable probe directory (its ``mktemp`` output is not one of ours), or a detached command
    did not start there: nothing of it is left running."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of one multi-node run meet, as the rank's command line tells ``torchrun``: the run's node
    count, this node's rank, the first node's address and port, the run's tag and how long a rank waits."""

    world: int
    rank: int
    addr: str
    port: int
    tag: str
    wait_s: float = 600.0


@dataclass(frozen=True)
class RemoteCommand:
    """One command of a node's batch. ``script`` is ours (trusted shell); ``env`` values are quoted.
    ``rendezvous``: the command is one rank of a multi-node run, meeting its peers there."""

    name: str
    script: str
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None  # None: the node's command_timeout_s
    rendezvous: Rendezvous | None = None
    reads_only: bool = False  # it only reads the node's state: it may run beside the batch's other such commands


@dataclass
class CommandResult:
    name: str
    exit_code: int | None  # None when the command never reported (batch cut off)
    stdout: MaskedText  # capped and masked where it entered the controller (remote.batch.taken_in)
    stderr: MaskedText
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class PollAnswer:
    """One look at a detached command: still running, or ended with its exit status and outputs."""

    running: bool
    exit_code: int | None = None  # None once ended: stopped or killed without writing a status
    stdout: MaskedText = MaskedText("")  # capped and masked where it entered the controller
    stderr: MaskedText = MaskedText("")


@dataclass(frozen=True)
class NoAnswer:
    """An operation on an open session that gave no usable answer: why (masked, cut), and whether the client
    stopped waiting for it (that session is then closed, not kept for the node's next operation)."""

    why: str
    timed_out: bool = False


@dataclass
class NodeResult:
    """What one node's operation came back with, whatever happened there: the one node outcome from the session
    up (a batch, a probe directory's run, a checkpoint on disk). ``cause`` says why it was unreachable;
    ``commands`` holds what completed (a command that never reported has no exit code)."""

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
