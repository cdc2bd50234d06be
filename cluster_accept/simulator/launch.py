"""Simulated nodes answering the detached-command protocol of multi-node runs (:mod:`remote.detached`).

The multi-node launcher starts one rank per node detached and comes back with short polls, each a typed
operation of the node's session (:class:`~remote.session.NodeSession`): a probe directory, a free port, the
start of the rank's command (a pid), polls (running, then ended with the rank's outputs), a stop (ended with
no status). A simulated node answers each of those in-process, so the launcher, the sweep, isolation and
bisect run unchanged above it.

The ranks of one run find each other here as real ones do at their rendezvous: by the run's tag, rendezvous
endpoint, node count and node rank, which each rank's command carries typed
(:class:`~remote.result.Rendezvous`; :data:`LAUNCHES`, one registry per process). A run
ends once all its nodes have started, after a latency drawn like a batch's (log-normal around the nodes'
median), so polls go on as they would; nothing waits in a loop. Its outputs are a recorded real run's
(:class:`~simulator.recording.Recording` ``launches``), with the group's figures computed from its members
(:func:`group_answers`): scaled by the slowest member's factor, and a member of a broken variant failing the
whole group as the recorded one did. A rank the recording cannot answer fails with exit 127, saying why.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import shlex
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster_accept.remote.detached import ended_answer
from cluster_accept.remote.result import PollAnswer, RemoteCommand, Rendezvous
from cluster_accept.simulator.recording import (
    NODE_TOKEN,
    UNKNOWN_EXIT,
    Answer,
    Recording,
    SimulatedNode,
    scale_figures,
)

NO_STATUS = -1  # a recorded rank that ended without an exit status: stopped with its run
TAG_TOKEN, ADDR_TOKEN, PORT_TOKEN = "@@TAG@@", "@@ADDR@@", "@@PORT@@"
DIR_PREFIX = "/tmp/cluster-accept-probe.sim"
FIRST_PORT = 29500
FIRST_PORT = 29500


def rank_key(command: RemoteCommand) -> str | None:
    """The key of a rank's recorded answers: its command with its run's own values (node count, node rank,
    rendezvous, tag) as tokens; None when the command is no rank of a multi-node run."""
    meet = command.rendezvous
    if meet is None:
        return None
    key = command.script
    for option, token in (
        (f"--nnodes={meet.world}", "--nnodes=@@NNODES@@"),
        (f"--node_rank={meet.rank}", "--node_rank=@@RANK@@"),
        (f"--master_addr={shlex.quote(meet.addr)}", f"--master_addr={ADDR_TOKEN}"),
        (f"--master_port={meet.port}", f"--master_port={PORT_TOKEN}"),
        (f"--tag {shlex.quote(meet.tag)}", f"--tag {TAG_TOKEN}"),
    ):
        key = key.replace(option, token, 1)
    return key


def launch_key(world: int, role: str, key: str) -> str:
    """Where a recording keeps a rank's answer: its run's node count, its role (``0``: the first node, whose
    output carries the figures; ``n``: any other) and its command's key."""
    return f"{world}:{role} {key}"


def tokenize(text: str, node: str, meet: Rendezvous) -> str:
    """A recorded rank's output with its run's own values (tag, node, rendezvous; a port of 0 is not known) as
    tokens."""
    text = text.replace(meet.tag, TAG_TOKEN).replace(node, NODE_TOKEN).replace(meet.addr, ADDR_TOKEN)
    if meet.port <= 0:
        return text
    return re.sub(rf"(?<![\d.]){meet.port}(?![\d.])", PORT_TOKEN, text)


def untokenize(text: str, node: str, meet: Rendezvous) -> str:
    text = text.replace(TAG_TOKEN, meet.tag).replace(NODE_TOKEN, node).replace(ADDR_TOKEN, meet.addr)
    return text.replace(PORT_TOKEN, str(meet.port))


def rescale_world(stdout: str, recorded: int, world: int) -> str:
    """A run recorded on ``recorded`` nodes told as one on ``world`` nodes: bus bandwidth is what stays
    (nccl-tests define it so), the world size and an all-reduce's algorithm bandwidth follow the node count."""
    if recorded == world:
        return stdout
    lines = []
    for line in stdout.split("\n"):
        record: Any = _json(line)
        if isinstance(record, dict) and isinstance(record.get("world_size"), int):
            ranks = max(1, record["world_size"] // recorded) * world
            record["world_size"] = ranks
            if record.get("collective") == "all_reduce" and isinstance(record.get("value"), int | float):
                record["algbw_gbps"] = round(record["value"] * ranks / (2 * (ranks - 1)), 4)
            line = json.dumps(record)
        lines.append(line)
    return "\n".join(lines)


def _json(line: str) -> Any:
    if not line.startswith("{"):
        return None
    try:
        return json.loads(line)
    except ValueError:
        return None


@dataclass(frozen=True)
class Member:
    """One node of a simulated run, in node-rank order."""

    name: str
    variant: str  # ``slow`` answers as ``healthy``, its factor halved
    factor: float


def _unknown(key: str) -> Answer:
    return Answer(UNKNOWN_EXIT, "", f"simulated node: no recorded multi-node answer to {key[:200]!r}")


def broken_member(recording: Recording, key: str, members: Sequence[Member]) -> Member | None:
    """The first member whose variant has a run of its own recorded for this command: it breaks the group."""
    for member in members:
        own = recording.launches.get(member.variant, {})
        if member.variant != "healthy" and launch_key(2, "n", key) in own:
            return member
    return None


def group_answers(recording: Recording, key: str, members: Sequence[Member], meet: Rendezvous) -> list[Answer]:
    """Every member's answer (node-rank order) for one run of the command ``key``.

    A member of a broken variant makes the run fail as its recorded run did (recorded as node rank 1 beside a
    healthy node rank 0): it answers as that node did, every other member as the healthy peer did. Otherwise
    each member answers as that role's rank of the healthy run of fewest nodes recorded, told for this many
    (:func:`rescale_world`: bus bandwidth does not depend on the node count; a test-bed's larger runs share
    its few cores and measure those, not a fabric), every figure scaled by the slowest member's factor."""
    broken = broken_member(recording, key, members)
    if broken is not None:
        own = recording.launches[broken.variant]
        picked = [own.get(launch_key(2, "n" if m is broken else "0", key)) for m in members]
        pairs = zip(picked, members, strict=True)
        return [untokenize_answer(a, m.name, meet) if a else _unknown(key) for a, m in pairs]
    healthy = recording.launches.get("healthy", {})
    worlds = [int(k.split(":", 1)[0]) for k in healthy if k.endswith(f":0 {key}")]
    if not worlds:
        return [_unknown(key) for _ in members]
    recorded = min(worlds)
    factor = min(m.factor for m in members)
    answers = []
    for index, member in enumerate(members):
        found = healthy.get(launch_key(recorded, "0" if index == 0 else "n", key))
        if found is None:
            answers.append(_unknown(key))
            continue
        stdout = scale_figures(rescale_world(found.stdout, recorded, len(members)), factor)
        answers.append(untokenize_answer(Answer(found.exit_code, stdout, found.stderr), member.name, meet))
    return answers


def untokenize_answer(answer: Answer, node: str, meet: Rendezvous) -> Answer:
    return Answer(answer.exit_code, untokenize(answer.stdout, node, meet), untokenize(answer.stderr, node, meet))


def run_seconds(names: Sequence[str], median_s: float) -> float:
    """How long a run takes once all its nodes have started: log-normal around the nodes' median latency,
    the same for the same members."""
    return random.Random(f"run:{','.join(names)}").lognormvariate(0.0, 0.5) * median_s


@dataclass
class _Rank:
    node: SimulatedNode
    dir: str
    started: float


@dataclass
class _Run:
    key: str
    meet: Rendezvous
    recording: Recording
    first: float
    ranks: dict[int, _Rank] = field(default_factory=dict)
    end_at: float | None = None
    answers: list[Answer] | None = None
    open: set[int] = field(default_factory=set)
    stopped: bool = False


@dataclass
class _Dir:
    run: tuple[str, str, int] | None = None  # the run's (tag, address, port) once started
    rank: int = -1
    pid: int = 0


class Launches:
    """Every simulated rank of this process: its directory, its run, its end. One lock: operations are short."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dirs: dict[tuple[str, str], _Dir] = {}
        self.runs: dict[tuple[str, str, int], _Run] = {}
        self.counter = itertools.count(1)

    def make_dir(self) -> str:
        with self.lock:
            return f"{DIR_PREFIX}{next(self.counter)}"

    def free_port(self) -> int:
        """A port for a run's rendezvous: one a run on this node has not taken."""
        with self.lock:
            return FIRST_PORT + next(self.counter) % 30000

    def start(self, node: SimulatedNode, recording: Recording, remote_dir: str, command: RemoteCommand) -> int | str:
        """Join the rank to its run (made by its first rank): its pid, or why it cannot start."""
        key, meet = rank_key(command), command.rendezvous
        if key is None or meet is None:
            return f"simulated node: cannot start {command.script[:200]!r}: not a rank of a multi-node run"
        with self.lock:
            now = time.monotonic()
            where = (meet.tag, meet.addr, meet.port)
            run = self.runs.setdefault(where, _Run(key, meet, recording, now))
            run.ranks[meet.rank] = _Rank(node, remote_dir, now)
            run.open.add(meet.rank)
            own = _Dir(where, meet.rank, next(self.counter))
            self.dirs[(node.name, remote_dir)] = own
            return own.pid

    def poll(self, node: str, remote_dir: str, pid: int, stop: bool) -> PollAnswer:
        """Running, or ended with the rank's outputs (its directory then gone)."""
        with self.lock:
            own = self.dirs.get((node, remote_dir))
            run = self.runs.get(own.run) if own is not None and own.run is not None else None
            if own is None or own.pid != pid or run is None:
                return PollAnswer(False)  # nothing there: as a node whose rank left no status
            answer = self._answer(run, own.rank, time.monotonic())
            ended = answer is not None and answer.exit_code != NO_STATUS
            if not (stop or ended):
                return PollAnswer(True)
            run.stopped |= stop
            self._collected(own, run)
            if answer is None or not ended:  # stopped before it wrote a status
                return PollAnswer(False)
            return ended_answer(answer.exit_code, answer.stdout, answer.stderr)  # as any node's output enters

    def _answer(self, run: _Run, rank: int, now: float) -> Answer | None:
        """The rank's answer once its run has ended; None while it runs (or waits for its peers)."""
        world = run.meet.world
        if len(run.ranks) < world:
            if now - run.first < run.meet.wait_s:
                return None
            said = f"simulated rank: rendezvous timed out after {run.meet.wait_s:g} s ({len(run.ranks)} of {world})"
            return Answer(1, "", said)
        if run.end_at is None:
            nodes = [run.ranks[r].node for r in range(world)]
            median = max(n.median_latency_s for n in nodes)
            run.end_at = max(r.started for r in run.ranks.values()) + run_seconds([n.name for n in nodes], median)
        if now < run.end_at:
            return None
        if run.answers is None:
            members = [Member(n.name, n.variant if n.variant != "slow" else "healthy", n.factor) for n in (
                run.ranks[r].node for r in range(world))]  # fmt: skip
            run.answers = group_answers(run.recording, run.key, members, run.meet)
        return run.answers[rank]

    def _collected(self, own: _Dir, run: _Run) -> None:
        rank = run.ranks[own.rank]
        self.dirs.pop((rank.node.name, rank.dir), None)
        run.open.discard(own.rank)
        if not run.open and (run.stopped or len(run.ranks) >= run.meet.world) and own.run is not None:
            self.runs.pop(own.run, None)

    def remove(self, node: str, remote_dir: str) -> None:
        with self.lock:
            self.dirs.pop((node, remote_dir), None)


LAUNCHES = Launches()
