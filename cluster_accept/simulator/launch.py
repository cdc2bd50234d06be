"""Simulated nodes answering the detached-command protocol of multi-node runs (:mod:`remote.detached`).

The multi-node launcher starts one rank per node detached and comes back with short polls: a probe directory
(``mktemp``), the wrapper shipped into it (``run.sh``, which carries the rank's ``torchrun`` command), the
start (a pid), polls (``running``, then ``ended <rc>`` with the rank's outputs), a stop (``ended none``). A
simulated node answers each of those operations in-process, so the launcher, the sweep, isolation and
bisect run unchanged above it.

The ranks of one run find each other here as real ones do at their rendezvous: by the run's tag, rendezvous
endpoint, node count and node rank in their command lines (:data:`LAUNCHES`, one registry per process). A run
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
from pathlib import PurePosixPath
from typing import Any

from cluster_accept.remote.detached import WRAPPER
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
_ARGS = {
    "world": re.compile(r"--nnodes=(\d+)"),
    "rank": re.compile(r"--node_rank=(\d+)"),
    "addr": re.compile(r"--master_addr=(\S+)"),
    "port": re.compile(r"--master_port=(\d+)"),
    "tag": re.compile(r"--tag (\S+)"),
}
_TOKENS = {"world": "@@NNODES@@", "rank": "@@RANK@@", "addr": ADDR_TOKEN, "port": PORT_TOKEN, "tag": TAG_TOKEN}
_WAIT = re.compile(r"--rdzv-conf=timeout=(\d+)")
_POLL_DIR = re.compile(r"\[ -f (\S+)/rc \]")
_CLEANUP = re.compile(r"^(pkill -KILL -f -- \S+; )?rm -rf \S+$")


@dataclass(frozen=True)
class RankArgs:
    """What a rank's command line says of its run: node count, its node rank, the rendezvous, the tag."""

    world: int
    rank: int
    addr: str
    port: str
    tag: str
    wait_s: float = 600.0  # the rendezvous timeout


def rank_args(command: str) -> tuple[str, RankArgs] | None:
    """(the command with its run's own values replaced by tokens: the key of its recorded answers, those
    values); None when ``command`` is no rank of a multi-node run."""
    found = {name: pattern.search(command) for name, pattern in _ARGS.items()}
    if any(match is None for match in found.values()):
        return None
    values = {name: match.group(1) for name, match in found.items() if match is not None}
    spans = sorted((match.span(1), name) for name, match in found.items() if match is not None)
    key, at = "", 0
    for (begin, end), name in spans:
        key, at = key + command[at:begin] + _TOKENS[name], end
    key += command[at:]
    wait = _WAIT.search(command)
    addr, tag = shlex.split(values["addr"])[0], shlex.split(values["tag"])[0]
    args = RankArgs(int(values["world"]), int(values["rank"]), addr, values["port"], tag)
    return key, (args if wait is None else RankArgs(**{**args.__dict__, "wait_s": float(wait.group(1))}))


def launch_key(world: int, role: str, key: str) -> str:
    """Where a recording keeps a rank's answer: its run's node count, its role (``0``: the first node, whose
    output carries the figures; ``n``: any other) and its command's key."""
    return f"{world}:{role} {key}"


def tokenize(text: str, node: str, args: RankArgs) -> str:
    """A recorded rank's output with its run's own values (tag, node, rendezvous) as tokens."""
    text = text.replace(args.tag, TAG_TOKEN).replace(node, NODE_TOKEN).replace(args.addr, ADDR_TOKEN)
    if not args.port:  # not known: left as it is
        return text
    return re.sub(rf"(?<![\d.]){re.escape(args.port)}(?![\d.])", PORT_TOKEN, text)


def untokenize(text: str, node: str, args: RankArgs) -> str:
    text = text.replace(TAG_TOKEN, args.tag).replace(NODE_TOKEN, node).replace(ADDR_TOKEN, args.addr)
    return text.replace(PORT_TOKEN, args.port)


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


def group_answers(recording: Recording, key: str, members: Sequence[Member], args: RankArgs) -> list[Answer]:
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
        return [untokenize_answer(a, m.name, args) if a else _unknown(key) for a, m in pairs]
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
        answers.append(untokenize_answer(Answer(found.exit_code, stdout, found.stderr), member.name, args))
    return answers


def untokenize_answer(answer: Answer, node: str, args: RankArgs) -> Answer:
    return Answer(answer.exit_code, untokenize(answer.stdout, node, args), untokenize(answer.stderr, node, args))


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
    args: RankArgs
    recording: Recording
    first: float
    ranks: dict[int, _Rank] = field(default_factory=dict)
    end_at: float | None = None
    answers: list[Answer] | None = None
    open: set[int] = field(default_factory=set)
    stopped: bool = False


@dataclass
class _Dir:
    command: str = ""
    run: tuple[str, str, str] | None = None  # the run's (tag, address, port) once started
    rank: int = -1
    pid: int = 0


Reply = tuple[int | None, str, str, bool]


class Launches:
    """Every simulated rank of this process: its directory, its run, its end. One lock: operations are short."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dirs: dict[tuple[str, str], _Dir] = {}
        self.runs: dict[tuple[str, str, str], _Run] = {}
        self.counter = itertools.count(1)

    def make_dir(self) -> str:
        with self.lock:
            return f"{DIR_PREFIX}{next(self.counter)}"

    def put_wrapper(self, node: str, remote_dir: str, text: str) -> None:
        """The wrapper's command, read as shipped (``env … timeout … sh -c COMMAND > out …``)."""
        words = shlex.split(text.splitlines()[1]) if len(text.splitlines()) > 1 else []
        at = next((i for i in range(len(words) - 1) if words[i : i + 2] == ["sh", "-c"]), None)
        with self.lock:
            self.dirs[(node, remote_dir)] = _Dir(words[at + 2] if at is not None and at + 2 < len(words) else "")

    def start(self, node: SimulatedNode, recording: Recording, remote_dir: str) -> Reply:
        """Join the rank to its run (made by its first rank); ``started <pid>``, or exit 127 and why."""
        with self.lock:
            own = self.dirs.get((node.name, remote_dir))
            parsed = rank_args(own.command) if own is not None else None
            if own is None or parsed is None:
                what = own.command[:200] if own is not None else "(no wrapper)"
                return UNKNOWN_EXIT, "", f"simulated node: cannot start {what!r}: not a rank of a multi-node run", False
            key, args = parsed
            now = time.monotonic()
            where = (args.tag, args.addr, args.port)
            run = self.runs.setdefault(where, _Run(key, args, recording, now))
            run.ranks[args.rank] = _Rank(node, remote_dir, now)
            run.open.add(args.rank)
            own.run, own.rank, own.pid = where, args.rank, next(self.counter)
            return 0, f"started {own.pid}\n", "", False

    def poll(self, node: str, remote_dir: str, pid: int, stop: bool) -> Reply:
        """``running``, or ``ended <rc>`` and the rank's outputs (its directory then gone)."""
        with self.lock:
            own = self.dirs.get((node, remote_dir))
            run = self.runs.get(own.run) if own is not None and own.run is not None else None
            if own is None or own.pid != pid or run is None:
                return 0, "ended none\n", "", False  # nothing there: as a node whose rank left no status
            answer = self._answer(run, own.rank, time.monotonic())
            ended = answer is not None and answer.exit_code != NO_STATUS
            if not (stop or ended):
                return 0, "running\n", "", False
            run.stopped |= stop
            self._collected(own, run)
            if answer is None or not ended:  # stopped before it wrote a status
                return 0, "ended none\n", "", False
            return 0, f"ended {answer.exit_code}\n{answer.stdout}", answer.stderr, False

    def _answer(self, run: _Run, rank: int, now: float) -> Answer | None:
        """The rank's answer once its run has ended; None while it runs (or waits for its peers)."""
        world = run.args.world
        if len(run.ranks) < world:
            if now - run.first < run.args.wait_s:
                return None
            said = f"simulated rank: rendezvous timed out after {run.args.wait_s:g} s ({len(run.ranks)} of {world})"
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
            run.answers = group_answers(run.recording, run.key, members, run.args)
        return run.answers[rank]

    def _collected(self, own: _Dir, run: _Run) -> None:
        rank = run.ranks[own.rank]
        self.dirs.pop((rank.node.name, rank.dir), None)
        run.open.discard(own.rank)
        if not run.open and (run.stopped or len(run.ranks) >= run.args.world) and own.run is not None:
            self.runs.pop(own.run, None)

    def remove(self, node: str, remote_dir: str) -> None:
        with self.lock:
            self.dirs.pop((node, remote_dir), None)


LAUNCHES = Launches()


def answer_operation(node: SimulatedNode, recording: Recording, script: str) -> Reply:
    """A script that is not a batch: a probe directory made or removed, a free port, a rank's start or poll.
    Anything else is exit 127, saying so."""
    if "mktemp -d" in script:
        return 0, LAUNCHES.make_dir() + "\n", "", False
    if "getsockname" in script:  # a free port for a run's rendezvous: one a run on this node has not taken
        return 0, f"{FIRST_PORT + next(LAUNCHES.counter) % 30000}\n", "", False
    first = script.split("\n", 1)[0]
    if first.startswith("cd ") and "nohup sh " in script:
        return LAUNCHES.start(node, recording, shlex.split(first)[1])
    poll_dir = _POLL_DIR.search(script)
    if first.startswith("p=") and first[2:].isdigit() and poll_dir is not None:
        remote_dir = shlex.split(poll_dir.group(1))[0]
        return LAUNCHES.poll(node.name, remote_dir, int(first[2:]), "pkill -KILL" in script)
    if _CLEANUP.match(script.strip()):
        LAUNCHES.remove(node.name, shlex.split(script.strip())[-1])
        return 0, "", "", False
    return UNKNOWN_EXIT, "", f"simulated node: no recorded answer to {script[:200]!r}", False


def put_file(node: str, local_path: str, remote_path: str) -> None:
    """A file shipped to a simulated node: a rank's wrapper is read (it carries the rank's command); probe
    scripts need nothing (the recording answers for them)."""
    path = PurePosixPath(remote_path)
    if path.name == WRAPPER:
        with open(local_path, encoding="utf-8") as handle:
            LAUNCHES.put_wrapper(node, str(path.parent), handle.read())
