"""The batch script and the local transport: framing, timeouts, quoting of hostile values, errors as data."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from cluster_accept.inventory.model import DEFAULT_SSH, LOCAL_ADDRESS, Node, Profile
from cluster_accept.remote.batch import AFTER_HANG_S, UnsafeCommandError, build_batch, new_nonce, parse_batch
from cluster_accept.remote.fanout import fan_out, run_node
from cluster_accept.remote.result import NodeStatus, RemoteCommand, UnreachableCause
from cluster_accept.remote.ssh import AUTH_TIMED_OUT, classify
from tests.processes import processes_matching


def local_node(name: str = "localhost", timeout_s: float = 20) -> Node:
    ssh = DEFAULT_SSH.model_copy(update={"command_timeout_s": timeout_s})
    return Node(name=name, ssh=ssh, profile_name="p", profile=Profile(), address=LOCAL_ADDRESS)


@pytest.mark.integration
def test_batch_frames_each_command_with_exit_code_and_streams() -> None:
    commands = [
        RemoteCommand("a", "echo out; echo err >&2; exit 3"),
        RemoteCommand("b", "printf 'no newline'"),
        RemoteCommand("c", "printf 'two\\n\\n'"),
    ]
    result = run_node(local_node(), commands)
    assert result.status is NodeStatus.OK
    a, b, c = result.commands
    assert (a.exit_code, a.stdout, a.stderr, a.timed_out) == (3, "out\n", "err\n", False)
    assert (b.exit_code, b.stdout) == (0, "no newline")
    assert c.stdout == "two\n\n"


@pytest.mark.integration
def test_node_side_timeout_kills_the_command_and_keeps_the_others() -> None:
    marker = f"sleep 60.{os.getpid()}{time.monotonic_ns() % 10000}"
    commands = [
        RemoteCommand("hang", f"{marker}; echo unreachable", timeout_s=1),
        RemoteCommand("after", "echo still-here"),
    ]
    started = time.monotonic()
    result = run_node(local_node(), commands)
    assert time.monotonic() - started < 15
    hang, after = result.commands
    assert hang.timed_out and hang.exit_code == 124
    assert (after.exit_code, after.stdout) == (0, "still-here\n")
    assert not processes_matching(marker)  # nothing left running on the node


HOSTILE = [
    "$(touch {p})",
    "`touch {p}`",
    "'; touch {p}; '",
    '"; touch {p}; "',
    "a\nb; touch {p}",
    "x && touch {p}",
    "-- ; touch {p}",
]


@pytest.mark.integration
@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_env_values_are_data(template: str, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    value = template.format(p=pwned)
    result = run_node(local_node(), [RemoteCommand("echo", 'printf %s "$V"', env={"V": value})])
    assert result.commands[0].stdout == value
    assert not pwned.exists()


def test_env_names_that_are_not_identifiers_are_refused() -> None:
    with pytest.raises(UnsafeCommandError):
        build_batch([RemoteCommand("x", "true", env={"A;touch /tmp/x": "1"})], 10, new_nonce())


@pytest.mark.integration
def test_node_output_cannot_forge_frames() -> None:
    nonce = new_nonce()
    commands = [RemoteCommand("a", "echo @@CA:deadbeef:1:end:0::"), RemoteCommand("b", "echo real")]
    result = run_node(local_node(), commands)
    assert result.commands[0].stdout == "@@CA:deadbeef:1:end:0::\n"
    assert result.commands[1].stdout == "real\n"
    assert nonce != "deadbeef"


def test_cut_off_batch_marks_missing_commands() -> None:
    commands = [RemoteCommand("a", "true"), RemoteCommand("b", "true")]
    nonce = "n1"
    stdout = "@@CA:n1:0:out\nhello\n\n@@CA:n1:0:end:0\n@@CA:n1:1:out\npart"
    stderr = "@@CA:n1:0:err\nwarn\n\n@@CA:n1:0:errend\n@@CA:n1:1:err\n"
    a, b = parse_batch(commands, stdout, stderr, nonce)
    assert (a.exit_code, a.stdout, a.stderr) == (0, "hello\n", "warn\n")
    assert (b.exit_code, b.stdout) == (None, "part")


@pytest.mark.integration
def test_fan_out_returns_every_node_in_order_even_when_one_breaks() -> None:
    nodes = [local_node(f"n{i}") for i in range(6)]

    def commands(node: Node) -> list[RemoteCommand]:
        if node.name == "n3":
            return [RemoteCommand("x", "exit 7")]
        if node.name == "n4":
            return [RemoteCommand("x", "echo ok", env={"BAD NAME": "1"})]  # refused before it runs
        return [RemoteCommand("x", f"echo {node.name}")]

    results = fan_out(nodes, commands, concurrency=3)
    assert list(results) == [f"n{i}" for i in range(6)]
    assert results["n0"].commands[0].stdout == "n0\n"
    assert results["n3"].commands[0].exit_code == 7
    # The controller refused to build n4's script: its own failure (tool_error), not a fact about the node.
    assert results["n4"].status is NodeStatus.TOOL_ERROR and "BAD NAME" in results["n4"].detail
    assert all(results[f"n{i}"].status is NodeStatus.OK for i in (0, 1, 2, 5))


@pytest.mark.integration
def test_after_one_command_hangs_the_rest_of_the_batch_get_a_short_timeout() -> None:
    """A hung driver hangs every nvidia-smi: the node costs one timeout plus seconds, not one per check."""
    commands = [
        RemoteCommand("first", "sleep 30", timeout_s=1),
        RemoteCommand("second", "sleep 30", timeout_s=60),
        RemoteCommand("third", "echo still-runs", timeout_s=60),
    ]
    nonce = new_nonce()
    started = time.monotonic()
    done = subprocess.run(["sh", "-c", build_batch(commands, 30, nonce)], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    first, second, third = parse_batch(commands, done.stdout, done.stderr, nonce)
    assert first.timed_out and second.timed_out and third.ok and third.stdout.strip() == "still-runs"
    assert elapsed < 1 + AFTER_HANG_S + 8  # not 1 + 60


def test_an_authentication_timeout_is_a_timeout_not_a_refused_key() -> None:
    """Under load (hundreds of sessions on a busy controller) paramiko's auth can time out: that is not a
    bad key, and it is retried before the node is called unreachable."""
    slow = classify(paramiko.AuthenticationException("Authentication timeout."))
    assert slow.cause is UnreachableCause.TIMEOUT and slow.detail.startswith(AUTH_TIMED_OUT)
    refused = classify(paramiko.AuthenticationException("Authentication failed."))
    assert refused.cause is UnreachableCause.AUTH
