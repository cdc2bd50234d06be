"""What a multi-node rank's own output says about how it ended: whether every process of the node finished its
work, and, when it failed, whether it failed of itself or only because a peer did.

Pure functions over the text a rank printed (``torchrun``'s log with the probe's JSON lines and every worker's
stderr). When one rank of a collective dies, its peers fail too, seconds later, with errors about the
connection to it: gloo's ``Connection reset by peer``, NCCL's ``remote process exited``, the rendezvous store
gone. Those are a victim's words; the rank that failed of itself shows its own cause: a worker killed by a
signal no library sends (``SIGKILL``: the OOM killer, an operator; ``SIGSEGV``/``SIGBUS``: the driver or the
hardware), a Python exception, a non-zero exit with no word about a peer. ``SIGABRT`` is ambiguous — NCCL's
watchdog aborts a rank whose peer vanished — so it is the rank's own only when no peer-loss line stands beside it.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass

DONE = "rank_done"  # the JSON line every rank prints after the run's final barrier (probes/node/allreduce.py)

# Lines that say the connection to another rank, or to the rendezvous store its first node hosts, went away.
_PEER_LOSS = re.compile(
    r"Connection (?:reset|closed) by peer|Broken pipe|remote process exited|ncclRemoteError"
    r"|Got completion from peer|Failed to recv, got 0 bytes|Connection was likely closed"
    r"|DistNetworkError|RendezvousClosedError|RendezvousTimeoutError|Watchdog caught collective operation timeout"
    r"|Timed out waiting|Socket Timeout|Connection refused",
    re.IGNORECASE,
)
# torchrun's report of a worker ended by a signal: "exitcode  : -9 (pid: 1234)" or "Signal 9 (SIGKILL) received".
_WORKER_SIGNAL = re.compile(r"exitcode\s*:\s*-(\d{1,2})\b|Signal (\d{1,2}) \(SIG\w+\) received")
_SELF_INFLICTED = frozenset({signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})
_SHELL_SIGNAL_BASE = 128  # a shell reports a command killed by signal N as exit status 128 + N
LAST_LINES = 6


@dataclass(frozen=True)
class RankEnd:
    """How a failed rank ended, read from its own output: ``own`` when it failed of itself (its node is to
    blame), with ``why`` (exit status, signal) and ``lines`` (the last lines that say so, as masked where the
    output entered the controller)."""

    own: bool
    why: str
    lines: str = ""


def rank_done(stdout: str) -> bool:
    """Whether every process of the node printed its ``rank_done`` line: the node finished its part of the run."""
    seen: set[int] = set()
    expected = None
    for line in stdout.splitlines():
        if DONE not in line or not line.lstrip().startswith("{"):
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and record.get("info") == DONE:
            seen.add(int(record.get("local_rank") or 0))
            expected = int(record.get("local_world_size") or 1)
    return expected is not None and len(seen) >= expected


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def worker_signal(text: str) -> int | None:
    """The signal that ended a worker, as ``torchrun`` reports it; None when none did."""
    for match in _WORKER_SIGNAL.finditer(text):
        return int(match.group(1) or match.group(2))
    return None


def peer_loss_line(text: str) -> str:
    """The first line saying a peer or the rendezvous store went away; empty when none does."""
    found = _PEER_LOSS.search(text)
    if found is None:
        return ""
    start = text.rfind("\n", 0, found.start()) + 1
    end = text.find("\n", found.end())
    return text[start : end if end >= 0 else len(text)].strip()


def _last_lines(text: str) -> str:
    """The last lines that are not a C++ frame or blank: what the rank said as it ended."""
    kept = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("frame #")]
    return "\n".join(kept[-LAST_LINES:])


def rank_end(exit_code: int | None, text: str) -> RankEnd:
    """How a rank that did not finish ended (``exit_code``: its command's status, None when it has none)."""
    number = worker_signal(text)
    if number is None and exit_code is not None and exit_code > _SHELL_SIGNAL_BASE:
        number = exit_code - _SHELL_SIGNAL_BASE  # the whole torchrun was killed, not one of its workers
    peer, lines = peer_loss_line(text), _last_lines(text)
    why = "no exit status" if exit_code is None else f"exit {exit_code}"
    if number is not None:
        why += f", a worker ended by {signal_name(number)}"
    if peer and number not in _SELF_INFLICTED:  # a victim's words, and no signal only its own failure sends
        return RankEnd(False, f"{why} after losing a peer: {peer}", lines)
    return RankEnd(True, why, lines)
