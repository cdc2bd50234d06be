"""Commands that outlive the SSH operation that started them: started detached on the node, then watched.

A collective needs every rank running at the same moment, and holding one SSH session (and one controller
thread) per rank for the whole run does not scale to 1,000 nodes. So a rank is started detached (``setsid
nohup``) in its probe directory, under the node-side ``timeout -k``, writing its output and exit status to
files there; the controller comes back with short, bounded polls. The scripts here are those node-side
pieces, as plain text, and the parser of what a poll prints; the scheduling lives with the caller.

Layout of a detached command's directory (made private by ``mktemp -d``):
``run.sh`` (the wrapper, shipped as a file so that no command line but the command's own carries its text),
``pid`` (the wrapper's pid, its first act), ``out`` / ``err`` (the command's streams) and ``rc`` (its exit
status, the wrapper's last act). A wrapper killed by the controller leaves no ``rc``: stopped, no status.
"""

from __future__ import annotations

import re
import shlex

from cluster_accept.remote.batch import PROBE_OUTPUT_CHARS, command_timeout, under_timeout
from cluster_accept.remote.result import PollAnswer, RemoteCommand
from cluster_accept.vocabulary.secrets import masked_cap

WRAPPER = "run.sh"
START_WAIT_S = 10  # how long the start-up waits for the wrapper to report its pid
STOP_TRIES = 10  # kill rounds in one stop poll, 0.2 s apart: a process forked while we kill is caught next round
START_TIMEOUT_S = 60.0
POLL_TIMEOUT_S = 60.0  # a poll is a few shell builtins; collecting an ended command's log takes longest
# Of what a failed start-up or poll printed, in the rank's detail: masked whole, then cut (masked_tail), so that a
# secret straddling the cut cannot survive as a piece the mask no longer recognises.
START_ERROR_CHARS = 500
POLL_ERROR_CHARS = 300
_STARTED = re.compile(r"^started (\d{1,10})$")
_ENDED = re.compile(r"^ended (\d{1,3}|none)$")


def wrapper_script(remote_dir: str, command: RemoteCommand, default_timeout_s: float) -> str:
    """``run.sh``: record the pid, run the command under the node-side timeout, record its exit status."""
    d = shlex.quote(remote_dir)
    timed = under_timeout(
        command.script, {"CA_PROBE_DIR": remote_dir, **command.env}, command_timeout(command, default_timeout_s)
    )
    lines = [
        f"printf '%s\\n' \"$$\" > {d}/pid",
        f"{timed} > {d}/out 2> {d}/err < /dev/null",
        f"printf '%s\\n' \"$?\" > {d}/rc",
    ]
    return "\n".join(lines) + "\n"


def start_script(remote_dir: str, tag: str | None = None) -> str:
    """Start ``run.sh`` in its own session, immune to the SSH session's end; print ``started <pid>``.

    With ``tag`` the wrapper's argv carries ``--tag TAG``, so that a stop by tag (``pkill -f``) takes the
    wrapper with its command and no exit status is written. The tag reaches the argv through a variable:
    this start-up command's own text must not match the pattern (a stop could kill it mid-start)."""
    d = shlex.quote(remote_dir)
    args = ' "--tag" "$t"' if tag is not None else ""
    detach = f"sh {d}/{WRAPPER}{args} < /dev/null > /dev/null 2>&1 &"
    return (
        f"cd {d} || exit 1\n"
        + (f"t={shlex.quote(tag)}\n" if tag is not None else "")
        + f"if command -v setsid > /dev/null 2>&1; then setsid nohup {detach}\nelse nohup {detach}\nfi\n"
        f'i=0; while [ ! -s {d}/pid ] && [ "$i" -lt {START_WAIT_S * 10} ]; do sleep 0.1; i=$((i + 1)); done\n'
        f"p=; [ -s {d}/pid ] && read -r p < {d}/pid\n"
        'case "$p" in ""|*[!0-9]*) echo "the wrapper did not start" >&2; exit 1 ;; esac\n'
        "printf 'started %s\\n' \"$p\"\n"
    )


def tag_pattern(tag: str) -> str:
    """``pkill -f``/``pgrep -f`` pattern for the processes of run ``tag`` (``--tag TAG`` in their argv, the
    wrapper's too); the bracket keeps it from matching the command line that carries the pattern itself."""
    return f"[-]-tag {tag}"


def parse_started(code: int | None, stdout: str) -> int | None:
    """The wrapper's pid from :func:`start_script`'s output; None when it did not start."""
    lines = stdout.strip().splitlines()
    match = _STARTED.match(lines[-1]) if code == 0 and lines else None
    return int(match.group(1)) if match else None


def poll_script(remote_dir: str, pid: int, kill_pattern: str | None = None) -> str:
    """One look at a detached command: ``running``, or ``ended <rc|none>`` followed by its stdout (its stderr
    on stderr), after which the directory is removed.

    With ``kill_pattern`` the command is stopped first: its wrapper (so that no exit status is written) and
    every process whose command line matches the pattern (``pkill -f``), again until none is left or
    :data:`STOP_TRIES` rounds have passed; a process that survives that is reported ``running`` and the
    caller comes back. Only shell builtins run while the command is still running (polls are frequent).
    """
    d = shlex.quote(remote_dir)
    lines = [
        f"p={int(pid)}",
        'alive() { kill -0 "$p" 2> /dev/null || return 1; s=; read -r s 2> /dev/null < "/proc/$p/stat"; '
        'case "$s" in *") Z "*) return 1 ;; esac; return 0; }',
    ]
    if kill_pattern is not None:
        pattern = shlex.quote(kill_pattern)
        lines += [
            "i=0",
            "while :; do",
            f'  kill -KILL "$p" 2> /dev/null; pkill -KILL -f -- {pattern}',
            f"  if ! alive && ! pgrep -f -- {pattern} > /dev/null; then break; fi",
            f'  i=$((i + 1)); [ "$i" -ge {STOP_TRIES} ] && break; sleep 0.2',
            "done",
        ]
    lines += [
        "if alive; then echo running; exit 0; fi",
        f"c=; [ -f {d}/rc ] && read -r c < {d}/rc",
        'case "$c" in ""|*[!0-9]*) c=none ;; esac',
        "printf 'ended %s\\n' \"$c\"",
        f"[ -f {d}/out ] && cat {d}/out",
        f"[ -f {d}/err ] && cat {d}/err >&2",
        f"rm -rf {d}",
        "exit 0",
    ]
    return "\n".join(lines) + "\n"


def parse_poll(code: int | None, stdout: str, stderr: str) -> PollAnswer | None:
    """What :func:`poll_script` printed; None when the poll itself did not complete (no answer).

    Only the first line is ours: the rest is the command's output and cannot forge it; it is capped and masked
    here, where it enters the controller (:data:`~remote.batch.PROBE_OUTPUT_CHARS` a stream)."""
    if code != 0:
        return None
    first, _, rest = stdout.partition("\n")
    if first == "running":
        return PollAnswer(running=True)
    match = _ENDED.match(first)
    if match is None:
        return None
    status = match.group(1)
    return ended_answer(None if status == "none" else int(status), rest, stderr)


def ended_answer(exit_code: int | None, stdout: str, stderr: str) -> PollAnswer:
    """An ended command's answer as it enters the controller: each stream capped at
    :data:`~remote.batch.PROBE_OUTPUT_CHARS` and masked, once (a simulated node's rank comes in here too)."""
    return PollAnswer(False, exit_code, masked_cap(stdout, PROBE_OUTPUT_CHARS), masked_cap(stderr, PROBE_OUTPUT_CHARS))
