"""A node that goes away is called unreachable (``ssh:session_lost``), never a failed check or a refused key;
a failure of the controller's own is ``tool:internal_error`` (verdict ``tool_error``, exit 3), never a fact
about the node and never drained. Pure: fakes stand in below the SSH line only."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import paramiko
import pytest

import cluster_accept.remote.channel as channel_module
import cluster_accept.remote.ssh as ssh
from cluster_accept.analysis.verdicts import Verdict, VerdictRow, node_verdict
from cluster_accept.checks.base import NodeRow, Status, discover
from cluster_accept.flows.finish import RunOutcome
from cluster_accept.inventory.model import DEFAULT_SSH, Inventory, Node, Profile
from cluster_accept.ops.slurm import SlurmNode, plan
from cluster_accept.remote.batch import parse_batch
from cluster_accept.remote.result import NodeResult, NodeStatus, RemoteCommand, SessionLost, UnreachableCause
from cluster_accept.remote.shell import ShellSession
from cluster_accept.tasks.preflight.check_batch import commands_for, parse_node_result
from cluster_accept.tasks.preflight.stage import evaluate_preflight
from cluster_accept.tasks.stages import declared_links

LINKS = declared_links()  # the cause links the stages' checks and probes declare


def test_a_connection_that_closes_during_authentication_is_no_refused_key() -> None:
    said = paramiko.AuthenticationException("Authentication failed: transport shut down or saw EOF")
    assert ssh.classify(said).cause is UnreachableCause.SESSION_LOST
    assert ssh.classify(paramiko.AuthenticationException("Authentication failed.")).cause is UnreachableCause.AUTH
    assert ssh.classify(BrokenPipeError(32, "Broken pipe")).cause is UnreachableCause.SESSION_LOST


def test_a_node_refused_after_its_session_closed_is_named_lost() -> None:
    lost = ssh.Unreachable(UnreachableCause.SESSION_LOST, "closed while opening")
    refused = ssh.Unreachable(UnreachableCause.REFUSED, "Connection refused")
    after = ssh._after_loss(lost, refused)
    assert after.cause is UnreachableCause.SESSION_LOST and "then refused: Connection refused" in after.detail
    assert ssh._after_loss(None, refused) is refused
    auth = ssh.Unreachable(UnreachableCause.AUTH, "key refused")
    assert ssh._after_loss(lost, auth) is auth  # it came back and refused the key: that is what it says


@pytest.mark.parametrize(
    "failure", [FileNotFoundError(2, "No such file", "/keys/id"), OSError(24, "Too many"), KeyError("x")]
)
def test_a_failure_of_the_controller_is_raised_not_blamed_on_the_node(failure: BaseException) -> None:
    with pytest.raises(type(failure)):
        ssh.classify(failure)


class _SilentChannel:
    """A channel to a node that lost power: nothing arrives, nothing closes."""

    closed = eof_received = False
    status_event = threading.Event()
    exit_status = -1

    def exec_command(self, command: str) -> None: ...

    def shutdown_write(self) -> None: ...

    def close(self) -> None: ...

    def recv_ready(self) -> bool:
        return False

    def recv_stderr_ready(self) -> bool:
        return False

    def exit_status_ready(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._pair[0].fileno()

    def __init__(self) -> None:
        self._pair = socket.socketpair()


class _Transport:
    def __init__(self, answers: bool) -> None:
        self.answers = answers

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float | None = None) -> Any:
        if not self.answers:
            raise paramiko.SSHException("Timeout opening channel.")
        return _SilentChannel()


def _streams() -> tuple[channel_module.Kept, channel_module.Kept]:
    return channel_module.Keep(1024).streams()


def test_a_silent_node_is_found_gone_by_a_liveness_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel_module, "SILENCE_CHECK_S", 0.3)
    channel: Any = _SilentChannel()
    with pytest.raises(SessionLost, match="stopped answering"):
        channel_module.follow(channel, _Transport(answers=False), "true", 30.0, _streams())
    # A node that still answers but is slow is waited for up to the client-side timeout, then timed out.
    code, timed_out = channel_module.follow(channel, _Transport(answers=True), "true", 0.8, _streams())
    assert (code, timed_out) == (None, True)


def node(name: str = "n1") -> Node:
    return Node(name=name, ssh=DEFAULT_SSH, profile_name="p", profile=Profile(), address="10.0.0.1")


class _LostMidBatch(ShellSession):
    """A session whose node dies after the first command's output: the batch's frames stop there."""

    def __init__(self, commands: list[RemoteCommand]) -> None:
        self.commands = commands

    def run_script(self, script: str, timeout_s: float) -> tuple[int | None, str, str, bool]:
        nonce = script.split("@@CA:", 1)[1].split(":", 1)[0]
        first = self.commands[0].name
        stdout = f"@@CA:{nonce}:0:out\nfirst output\n\n@@CA:{nonce}:0:end:0\n@@CA:{nonce}:1:out\npart"
        raise SessionLost(f"the connection closed (after {first})", stdout, "")

    def put(self, local_path: str, remote_path: str) -> None: ...


def test_a_batch_cut_by_a_lost_session_keeps_what_completed() -> None:
    commands = [RemoteCommand("a", "echo first output"), RemoteCommand("b", "sleep 100"), RemoteCommand("c", "true")]
    batch = _LostMidBatch(commands).run_batch(commands, 120.0)
    assert (batch.status, batch.cause) == (NodeStatus.UNREACHABLE, UnreachableCause.SESSION_LOST)
    assert [r.exit_code for r in batch.commands] == [0, None, None]
    assert batch.commands[0].stdout == "first output\n"
    assert parse_batch(commands, "", "", "x")[0].exit_code is None  # nothing framed: nothing claimed


def _inventory(*nodes: Node) -> Inventory:
    return Inventory("c", list(nodes), {"p": Profile()}, "inv.yaml", "0")


def test_a_node_lost_mid_preflight_is_unreachable_and_its_completed_checks_stand() -> None:
    checks = discover()
    commands = commands_for(checks)
    first = commands[0].name
    nonce = "n"
    stdout = f"@@CA:{nonce}:0:out\n\n@@CA:{nonce}:0:end:0\n"  # the first check ran (empty output), then the node died
    results = parse_batch(commands, stdout, "", nonce)
    lost = NodeResult("n1", NodeStatus.UNREACHABLE, UnreachableCause.SESSION_LOST, "the connection closed", results)
    rows = evaluate_preflight("r", _inventory(node()), [parse_node_result(lost, checks)], checks)
    assert {(r.check, r.reason) for r in rows if r.status == Status.UNREACHABLE} == {("ssh", "session_lost")}
    assert {r.check for r in rows} <= {"ssh", first}  # no check blamed for output it never had the chance to give
    assert not [r for r in rows if r.reason == "no_output"]
    verdict = node_verdict("n1", rows, LINKS)
    assert verdict.verdict is Verdict.UNREACHABLE and verdict.reasons[0] == "ssh:session_lost"


def test_a_tool_failure_is_its_own_verdict_exit_code_and_never_drained() -> None:
    failed = NodeResult("n1", NodeStatus.TOOL_ERROR, None, "KeyError: 'x'\nTraceback (most recent call last): ...")
    rows = evaluate_preflight("r", _inventory(node()), [parse_node_result(failed, discover())], discover())
    assert [(r.check, r.reason, r.status) for r in rows] == [("tool", "internal_error", Status.ERROR)]
    assert rows[0].detail == "KeyError: 'x'" and "Traceback" in rows[0].raw_output
    verdict = node_verdict("n1", rows, LINKS)
    assert verdict.verdict is Verdict.TOOL_ERROR
    # A real finding beside the tool's failure still rejects the node.
    failing = NodeRow("r", "c", "preflight", "n1", "driver", "version", Status.FAIL, "version_mismatch")
    assert node_verdict("n1", [*rows, failing], LINKS).verdict is Verdict.REJECTED

    def row(name: str, outcome: Verdict) -> VerdictRow:
        return VerdictRow("r", "c", name, "p", outcome, ["x:y"])

    verdicts = [row("n1", Verdict.TOOL_ERROR), row("n2", Verdict.REJECTED), row("n3", Verdict.ACCEPTED)]
    slurm = {n: SlurmNode(n, "IDLE") for n in ("n1", "n2", "n3")}
    assert [a.node for a in plan(verdicts, slurm, "r", drain=True, resume_passing=False).actions] == ["n2"]
    assert RunOutcome("r", Path("."), verdicts).exit_code == 3
    assert RunOutcome("r", Path("."), verdicts[1:]).exit_code == 1
    assert RunOutcome("r", Path("."), verdicts[2:]).exit_code == 0
