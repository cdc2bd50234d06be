"""One shell script per node carrying all of that node's commands, and the parser for what it prints.

A node's commands travel as one script over one SSH session (a command on an open connection costs ~50 ms,
twice that when the remote ``.bashrc`` is heavy). Each command runs under ``timeout -k`` on the node so a
hung ``nvidia-smi`` is killed there, not left running after the client gives up; its stdout and stderr are
framed by markers carrying a random nonce, so output from a node cannot forge a frame. Everything that
enters the script from an inventory (env values) is quoted with :func:`shlex.quote`; env names are checked.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Sequence

from remote.result import CommandResult, RemoteCommand

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
KILL_GRACE_S = 5
# How long the client waits beyond the sum of the node-side timeouts before it declares the batch lost.
CLIENT_MARGIN_S = 15.0


class UnsafeCommandError(ValueError):
    """An environment name that could not be passed safely."""


def _marker(nonce: str, index: int, part: str) -> str:
    return f"@@CA:{nonce}:{index}:{part}"


def command_timeout(command: RemoteCommand, default_timeout_s: float) -> int:
    return max(1, int(round(command.timeout_s if command.timeout_s is not None else default_timeout_s)))


def batch_timeout(commands: Sequence[RemoteCommand], default_timeout_s: float) -> float:
    """Client-side limit for the whole batch: every node-side timeout plus its kill grace, plus a margin."""
    total = sum(command_timeout(c, default_timeout_s) + KILL_GRACE_S for c in commands)
    return total + CLIENT_MARGIN_S


def env_prefix(env: dict[str, str]) -> str:
    """``K1='v1' K2='v2'`` with every value quoted; rejects names that are not shell identifiers."""
    parts = []
    for name, value in env.items():
        if not ENV_NAME.match(name):
            raise UnsafeCommandError(f"environment variable name {name!r} is not a valid identifier")
        parts.append(f"{name}={shlex.quote(value)}")
    return " ".join(parts)


def build_batch(commands: Sequence[RemoteCommand], default_timeout_s: float, nonce: str) -> str:
    """The POSIX sh script that runs ``commands`` in order and frames each one's output."""
    lines = [
        'ca_t=$(mktemp -d "${TMPDIR:-/tmp}/cluster-accept.XXXXXXXX") || exit 97',
        "trap 'rm -rf \"$ca_t\"' EXIT HUP INT TERM",
    ]
    for index, command in enumerate(commands):
        timeout_s = command_timeout(command, default_timeout_s)
        env = env_prefix(command.env)
        lines += [
            f"printf '%s\\n' {shlex.quote(_marker(nonce, index, 'out'))}",
            "ca_a=$(date +%s%N 2>/dev/null)",
            f"env {env} timeout -k {KILL_GRACE_S} {timeout_s} sh -c {shlex.quote(command.script)} "
            '</dev/null 2>"$ca_t/err"; ca_rc=$?',
            "ca_b=$(date +%s%N 2>/dev/null)",
            f"printf '\\n%s\\n' {shlex.quote(_marker(nonce, index, 'err'))}",
            'cat "$ca_t/err"',
            f'printf \'\\n%s:%s:%s:%s\\n\' {shlex.quote(_marker(nonce, index, "end"))} "$ca_rc" "$ca_a" "$ca_b"',
        ]
    return "\n".join(lines) + "\n"


def new_nonce() -> str:
    return secrets.token_hex(8)


def _strip_added_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def parse_batch(
    commands: Sequence[RemoteCommand], output: str, nonce: str, stderr_tail: str = ""
) -> list[CommandResult]:
    """Split the batch's stdout back into one :class:`CommandResult` per command.

    A command whose end frame is missing (the session died or the client timed out) gets ``exit_code`` None
    and whatever output arrived; commands that never started get empty results, also with ``None``.
    """
    results: list[CommandResult] = []
    pos = 0
    for index, command in enumerate(commands):
        out_marker = _marker(nonce, index, "out") + "\n"
        start = output.find(out_marker, pos)
        if start < 0:
            results.append(CommandResult(command.name, None, "", stderr_tail, timed_out=False))
            stderr_tail = ""
            continue
        body_start = start + len(out_marker)
        err_marker = "\n" + _marker(nonce, index, "err") + "\n"
        err_at = output.find(err_marker, body_start)
        if err_at < 0:
            results.append(CommandResult(command.name, None, output[body_start:], stderr_tail))
            stderr_tail = ""
            pos = len(output)
            continue
        stdout = output[body_start:err_at]
        end_re = re.compile("\n" + re.escape(_marker(nonce, index, "end")) + r":(-?\d+):(\d*):(\d*)\n")
        end = end_re.search(output, err_at + len(err_marker))
        if end is None:
            results.append(CommandResult(command.name, None, stdout, output[err_at + len(err_marker) :]))
            pos = len(output)
            continue
        stderr = output[err_at + len(err_marker) : end.start() + 1]
        exit_code = int(end.group(1))
        duration = None
        if end.group(2) and end.group(3):
            duration = max(0.0, (int(end.group(3)) - int(end.group(2))) / 1e9)
        results.append(
            CommandResult(
                command.name,
                exit_code,
                stdout,
                _strip_added_newline(stderr),
                duration_s=duration,
                timed_out=exit_code in (124, 137),
            )
        )
        pos = end.end()
    return results
