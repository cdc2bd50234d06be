"""One shell script per node carrying all of that node's commands, and the parser for what it prints.

A node's commands travel as one script over one SSH session (a command on an open connection costs ~50 ms,
twice that when the remote ``.bashrc`` is heavy). Each command runs under ``timeout -k`` on the node so a
hung ``nvidia-smi`` is killed there, not left running after the client gives up; its stdout and stderr are
framed by markers carrying a random nonce, so output from a node cannot forge a frame. Everything that
enters the script from an inventory (env values) is quoted with :func:`shlex.quote`; env names are checked.

A hung driver hangs every ``nvidia-smi``: once one command of a batch times out, the rest get at most
:data:`AFTER_HANG_S` each, so a hung node costs one timeout plus seconds, not one timeout per check.

What a node prints is capped where it enters the controller, each stream of each command on its own, before any
parser reads it (:func:`output_limit`; the cut is said on a line of its own): a check's at
:data:`CHECK_OUTPUT_CHARS`, about twenty times an 8-GPU ``nvidia-smi -q -x``; a probe's or a rank's at
:data:`PROBE_OUTPUT_CHARS`, a day-long burn sampling 8 GPUs every second with room to spare. A node's 30 MB sysfs
file is not stored whole.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Sequence

from cluster_accept.remote.channel import Keep
from cluster_accept.remote.result import CommandResult, RemoteCommand
from cluster_accept.vocabulary.secrets import MaskedText, masked_cap

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CHECK_OUTPUT_CHARS = 4 * 1024 * 1024  # a command that only reads the node's state (a check)
PROBE_OUTPUT_CHARS = 256 * 1024 * 1024  # a probe, a rank of a multi-node run: ~290 characters a GPU sample
KILL_GRACE_S = 5
AFTER_HANG_S = 5
# How long the client waits beyond the sum of the node-side timeouts before it declares the batch lost.
CLIENT_MARGIN_S = 15.0


class UnsafeCommandError(ValueError):
    """An environment name that could not be passed safely."""


def _frame_start(nonce: str) -> str:
    return f"@@CA:{nonce}:"


def _marker(nonce: str, index: int, part: str) -> str:
    return f"{_frame_start(nonce)}{index}:{part}"


def frames_kept(commands: Sequence[RemoteCommand], nonce: str) -> Keep:
    """What of a batch's two streams the controller keeps while they arrive: each command's frame up to its
    :func:`output_limit` and the masking margin, the rest counted (:class:`~remote.channel.Kept`), so that a
    check printing 400 MB costs its cap, not 400 MB; between the frames, the script's own few lines."""
    opens = {_marker(nonce, i, part): output_limit(c) for i, c in enumerate(commands) for part in ("out", "err")}
    return Keep(0, "\n" + _frame_start(nonce), opens)


def output_limit(command: RemoteCommand) -> int:
    """How much of each of ``command``'s streams the controller keeps (:func:`~vocabulary.secrets.masked_cap`)."""
    return CHECK_OUTPUT_CHARS if command.reads_only else PROBE_OUTPUT_CHARS


def taken_in(command: RemoteCommand, text: str) -> MaskedText:
    """One stream of ``command``'s output as it enters the controller: capped at :func:`output_limit` and masked,
    once (:func:`~vocabulary.secrets.masked_cap`). Every session's output comes in through here (a batch's
    frames, the controller's own commands, srun's tasks, a simulated node's answers)."""
    return masked_cap(text, output_limit(command))


def command_timeout(command: RemoteCommand, default_timeout_s: float) -> int:
    return max(1, int(round(command.timeout_s if command.timeout_s is not None else default_timeout_s)))


def under_timeout(script: str, env: dict[str, str], timeout_s: int) -> str:
    """``script`` as the node runs it alone: its environment quoted, killed (with its process group) at
    ``timeout_s`` and :data:`KILL_GRACE_S` later."""
    prefix = f"env {env_prefix(env)} " if env else ""
    return f"{prefix}timeout -k {KILL_GRACE_S} {timeout_s} sh -c {shlex.quote(script)}"


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
    """The POSIX sh script that runs ``commands`` in order and frames each one's stdout and stderr.

    Frames are written with the shell's builtin ``printf`` on both streams, so framing costs no process on
    the node: with hundreds of sessions on a busy node (or a test-bed on one machine) forks add up.
    """
    lines = ["ca_hung=0"]
    for index, command in enumerate(commands):
        timeout_s = command_timeout(command, default_timeout_s)
        after_hang_s = min(timeout_s, AFTER_HANG_S)
        env = env_prefix(command.env)
        start = shlex.quote(_marker(nonce, index, "out"))
        err_start = shlex.quote(_marker(nonce, index, "err"))
        lines += [
            f"printf '%s\\n' {start}; printf '%s\\n' {err_start} >&2",
            f'ca_t={timeout_s}; [ "$ca_hung" = 1 ] && ca_t={after_hang_s}',
            (f"env {env} " if env else "")
            + f'timeout -k {KILL_GRACE_S} "$ca_t" sh -c {shlex.quote(command.script)} </dev/null; ca_rc=$?',
            'case "$ca_rc" in 124|137) ca_hung=1 ;; esac',
            f"printf '\\n%s:%s\\n' {shlex.quote(_marker(nonce, index, 'end'))} \"$ca_rc\"; "
            f"printf '\\n%s\\n' {shlex.quote(_marker(nonce, index, 'errend'))} >&2",
        ]
    return "\n".join(lines) + "\n"


def new_nonce() -> str:
    return secrets.token_hex(8)


def _framed(text: str, begin: str, end_prefix: str, pos: int) -> tuple[str | None, str | None, int]:
    """Find ``begin\\n<body>\\n<end_prefix><tail>\\n`` from ``pos``: (body, tail, next pos).

    body is None when ``begin`` is absent; tail is None when the end frame is missing (body = the rest)."""
    start = text.find(begin + "\n", pos)
    if start < 0:
        return None, None, pos
    body_start = start + len(begin) + 1
    end = text.find("\n" + end_prefix, body_start)
    if end < 0:
        return text[body_start:], None, len(text)
    tail_start = end + 1 + len(end_prefix)
    tail_end = text.find("\n", tail_start)
    tail_end = len(text) if tail_end < 0 else tail_end
    return text[body_start:end], text[tail_start:tail_end], tail_end + 1


def parse_batch(commands: Sequence[RemoteCommand], stdout: str, stderr: str, nonce: str) -> list[CommandResult]:
    """Split the batch's two streams back into one :class:`CommandResult` per command.

    A command whose end frame is missing (the session died or the client timed out) gets ``exit_code`` None
    and whatever output arrived; commands that never started get empty results, also with ``None``. Each
    output is capped and masked here, once, where node text enters the controller (:func:`taken_in`): everything
    above, the checkpoints, rows and reports included, holds it masked.
    """
    results: list[CommandResult] = []
    out_pos = err_pos = 0
    for index, command in enumerate(commands):
        out, tail, out_pos = _framed(stdout, _marker(nonce, index, "out"), _marker(nonce, index, "end") + ":", out_pos)
        err, _, err_pos = _framed(stderr, _marker(nonce, index, "err"), _marker(nonce, index, "errend"), err_pos)
        exit_code = int(tail) if tail is not None and re.fullmatch(r"-?\d+", tail) else None
        results.append(
            CommandResult(
                command.name,
                exit_code,
                taken_in(command, out or ""),
                taken_in(command, err or ""),
                timed_out=exit_code in (124, 137),
            )
        )
    return results
