"""Reading a running job from its nodes, round after round, and keeping what the rounds saw.

Each round runs the node-side reader (``watch/node/job_read.py``) on every node of the job over the usual SSH
fan-out, from outside the job: the ranks are asked over their own sockets, so a slow watcher can never slow the
job. A node that does not answer is data (its problem is kept, its ranks are then missing from the round), never
an exception. :class:`WatchState` holds the rounds: every rank's reads, and each collective once per rank
(an in-flight record is replaced by its completed one), pruned to what the localization's window needs.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from cluster_accept.inventory.model import Node
from cluster_accept.remote.fanout import fan_out
from cluster_accept.remote.result import NodeResult, RemoteCommand
from cluster_accept.watch.arming import NCCL_DIAGNOSTICS, parse_version
from cluster_accept.watch.inspector import parse_inspector_lines
from cluster_accept.watch.inspector_join import join_inspector
from cluster_accept.watch.places import DEFAULT_WATCH_DIR as DEFAULT_WATCH_DIR
from cluster_accept.watch.places import SHIM_DIR as SHIM_DIR
from cluster_accept.watch.ras import RasSeen, RasStatus, parse_ras_answer
from cluster_accept.watch.ras_diagnostics import SIGNAL as DIAGNOSTICS_SIGNAL
from cluster_accept.watch.ras_diagnostics import (
    DiagnosticsReport,
    NcclDiagnostic,
    parse_diagnostics_answer,
    place_on_nodes,
)
from cluster_accept.watch.ras_diagnostics import summary as diagnostics_summary
from cluster_accept.watch.read import NodeRead, ReadWindow, parse_node_read, settle_clocks
from cluster_accept.watch.words import CollectiveSeen, RankSeen, RankState, Signal, SignalCoverage

DEFAULT_RAS_PORT = 28028  # NCCL_RAS_ADDR's port when the job was armed without one
DIAGNOSTICS_TRIES = 3  # rounds RAS's diagnostics are asked in before the watch goes on without them
RAS_CONNECT_S, RAS_EXTRA_S = 1, 5  # the RAS reader's own connect and report margins (watch/node/ras_read.py)

READER = SHIM_DIR / "job_read.py"
RAS_READER = SHIM_DIR / "ras_read.py"
INSPECTOR_READER = SHIM_DIR / "inspector_read.py"


@cache
def reader_source(reader: Path = READER) -> str:
    """A node-side reader, to go with its command (``python3 -c``): a read every few seconds costs one SSH batch,
    no directory made, copied into and removed on the node each time."""
    return reader.read_text()


@dataclass(frozen=True)
class RasAsk:
    """The node whose NCCL RAS is asked this round, its port, and the job's user (a name or uid) whose listener
    alone is asked: RAS answers for the whole job from any node, so one node is asked a round (a job of a thousand
    nodes costs one more command, not a thousand); any local user can listen on a free port, so a listener of
    another user is never read."""

    node: str
    user: str
    port: int = DEFAULT_RAS_PORT


@dataclass(frozen=True)
class InspectorAsk:
    """A node's Inspector files (its job reader found them) and the node time (µs) its last read was made at: the
    records dumped since (a second's margin) are read."""

    path: str
    uid: int
    since_us: int = 0


@dataclass(frozen=True)
class Asks:
    """What a round asks beside each node's read: NCCL's RAS on one node (its status; its diagnostics once a watch,
    where the job's NCCL runs them), the Inspector's files where they are."""

    ras: RasAsk | None = None
    inspector: dict[str, InspectorAsk] = field(default_factory=dict)
    diagnostics: RasAsk | None = None


READ_TIMEOUT_S = 60.0
RAS_WAIT_S = 5  # how long RAS waits for the job's other processes; the command's bound is the reader's own
RANK_ANSWER_S = 5.0
RANKS_BUDGET_S = 40.0  # asking all of a node's ranks, inside READ_TIMEOUT_S: a slow rank costs only the later ones


def job_dir(template: str, node: Node, job: str) -> str:
    """The job's directory on ``node``: the armed ``CA_WATCH_DIR`` (``{node}`` in it is the inventory's name for
    the node, for a directory on shared storage) and the job's name under it, as the shim makes it."""
    return f"{template.replace('{node}', node.name).rstrip('/')}/{job}"


def shipped(node: Node, name: str, reader: Path, args: Sequence[str], timeout_s: float) -> RemoteCommand:
    """A node-side reader run as ``python3 -I -c <its source> ARGS`` behind the node's command prefix (a container
    the job runs in sees the job's sockets and files); ``args`` already quoted. -I: nothing imported from the
    directory the command starts in, nor from PYTHON* variables a job may set."""
    probes = node.profile.probes
    prefix = f"{probes.command_prefix} " if probes.command_prefix else ""
    words = [shlex.quote(probes.python), "-I", "-c", shlex.quote(reader_source(reader)), *args]
    return RemoteCommand(name, prefix + " ".join(words), timeout_s=timeout_s, reads_only=True)


def reader_command(node: Node, directory: str, since_ns: int, limit: int, user: str | None = None) -> RemoteCommand:
    """The job's reader (:func:`shipped`). ``user``: the job's user (a name or uid, as the scheduler says): only its
    directory is then read; without it, the reader takes the owner of the one job directory it finds and names any
    second user's."""
    args = ["--dir", shlex.quote(directory), "--since-ns", str(since_ns), "--limit", str(limit)]
    args += ["--timeout-s", str(RANK_ANSWER_S), "--budget-s", str(RANKS_BUDGET_S)]
    if user:
        args += ["--user", shlex.quote(user)]
    return shipped(node, "job_read", READER, args, READ_TIMEOUT_S)


def ras_command(node: Node, port: int, user: str, diagnostics: bool = False) -> RemoteCommand:
    """NCCL's RAS asked on ``node`` (``watch/node/ras_read.py``, :func:`shipped`) for its status, or with
    ``diagnostics`` for its diagnostics, of a listener of the job's ``user`` only."""
    args = ["--port", str(port), "--timeout-s", str(RAS_WAIT_S), "--user", shlex.quote(user)]
    bound = RAS_CONNECT_S + RAS_WAIT_S + RAS_EXTRA_S + 5  # the reader's own bound and its start
    if diagnostics:
        return shipped(node, "ras_diagnostics", RAS_READER, [*args, "--diagnostics"], bound)
    return shipped(node, "ras_read", RAS_READER, args, bound)


def inspector_command(node: Node, ask: InspectorAsk, limit: int) -> RemoteCommand:
    """NCCL Inspector's records on ``node`` (``watch/node/inspector_read.py``, :func:`shipped`), of the job's user
    only."""
    args = [shlex.quote(ask.path), "--since-us", str(max(0, ask.since_us - 1_000_000)), "--limit", str(limit)]
    args += ["--uid", str(ask.uid)]
    return shipped(node, "inspector_read", INSPECTOR_READER, args, READ_TIMEOUT_S)


def _answer(result: NodeResult, name: str = "job_read") -> tuple[str, str]:
    """(the output of the node's command ``name``, why there is none)."""
    command = result.command(name)
    if command is None:
        return "", f"{result.status.value}: {result.detail or 'no answer'}"
    if command.timed_out or command.exit_code != 0:
        return command.stdout, f"reader exit {command.exit_code}: {command.stderr.strip()[-300:]}"
    return command.stdout, ""


def node_read(node: Node, job: str, result: NodeResult, received_ns: int, asks: Asks | None = None) -> NodeRead:
    """The node's answer as rows of ``job``: its clock measured against the read's round trip, which ended at
    ``received_ns`` and took the result's own duration (its connection and its batch); where ``asks`` asked them
    of this node, the RAS report (or why none) and the Inspector's times put on its records, with their coverage."""
    text, problem = _answer(result)
    sent_ns = received_ns - int(result.duration_s * 1e9)
    read = parse_node_read(text, job, node.name, ReadWindow(sent_ns, received_ns))
    if problem:
        read.problems.insert(0, problem)
    asks = asks or Asks()
    if asks.ras is not None and asks.ras.node == node.name:
        read.ras = ras_seen(result, node.name, received_ns)
        read.coverage.append(ras_coverage(job, read.ras))
    if node.name in asks.inspector:
        inspector_times(read, result, job)
    if asks.diagnostics is not None and asks.diagnostics.node == node.name:
        read.diagnostics, row = ras_diagnostics(result, job, node.name)
        read.coverage.append(row)
    return read


def ras_diagnostics(result: NodeResult, job: str, node: str) -> tuple[DiagnosticsReport, SignalCoverage]:
    """RAS's diagnostics the node's command gave, and its coverage row (what they said to review, or why none)."""
    text, problem = _answer(result, "ras_diagnostics")
    report, why = parse_diagnostics_answer(text, job, node) if not problem else (None, problem)
    if report is None:
        return DiagnosticsReport(()), SignalCoverage(job, node, DIAGNOSTICS_SIGNAL, False, why)
    return report, SignalCoverage(job, node, DIAGNOSTICS_SIGNAL, bool(report.rows), diagnostics_summary(report))


def inspector_times(read: NodeRead, result: NodeResult, job: str) -> None:
    """The Inspector's records of the node's answer put on its Flight Recorder records (:mod:`watch.inspector_join`),
    and the Inspector's coverage row saying how many, or why none."""
    text, problem = _answer(result, "inspector_read")
    inspected = parse_inspector_lines(text, job, read.node) if not problem else []
    read.collectives, alignments = join_inspector(read.collectives, inspected)
    joined = sum(c.source == Signal.INSPECTOR.value for c in read.collectives)
    if problem or not inspected:
        said = problem or "no record dumped since the last read"
    elif not alignments:
        said = f"{len(inspected)} records, none put on the Flight Recorder's: no clear alignment of their sequences"
    else:
        how = ", ".join(f"rank {a.rank} {a.group} +{a.offset} (skew {abs(a.skew_ms):g} ms)" for a in alignments)
        said = f"{len(inspected)} records, {joined} Flight Recorder records timed by them: {how}"
    read.coverage = [c for c in read.coverage if c.signal != Signal.INSPECTOR.value]
    read.coverage.append(SignalCoverage(job, read.node, Signal.INSPECTOR.value, bool(joined), said))


def ras_seen(result: NodeResult, node: str, received_ns: int) -> RasSeen:
    """The RAS report the node's RAS command gave, or why there is none."""
    text, problem = _answer(result, "ras_read")
    status = parse_ras_answer(text) if not problem else RasStatus(False, problem)
    return RasSeen(node, received_ns, status)


def ras_coverage(job: str, seen: RasSeen) -> SignalCoverage:
    return SignalCoverage(job, seen.node, Signal.RAS.value, seen.status.available, seen.summary())


def read_round(
    nodes: Sequence[Node],
    job: str,
    template: str,
    since: dict[str, int],
    limit: int,
    concurrency: int,
    user: str | None = None,
    asks: Asks | None = None,
) -> list[NodeRead]:
    """One read of every node of the job over the fan-out (:func:`remote.fanout.fan_out`: a node that does not
    answer or times out comes back as data), at most ``concurrency`` at once; in the nodes' order, their clocks
    then settled against each other. ``user``: the job's user where the scheduler names it
    (:func:`reader_command`); ``asks``: what else is asked of which node (:class:`Asks`)."""
    received: dict[str, int] = {}
    asks = asks or Asks()

    def commands(node: Node) -> list[RemoteCommand]:
        out = [reader_command(node, job_dir(template, node, job), since.get(node.name, 0), limit, user)]
        if asks.ras is not None and node.name == asks.ras.node:
            out.append(ras_command(node, asks.ras.port, asks.ras.user))
        if asks.diagnostics is not None and node.name == asks.diagnostics.node:
            out.append(ras_command(node, asks.diagnostics.port, asks.diagnostics.user, diagnostics=True))
        if node.name in asks.inspector:
            out.append(inspector_command(node, asks.inspector[node.name], limit))
        return out

    def arrived(result: NodeResult) -> None:
        received[result.node] = time.time_ns()

    results = fan_out(nodes, commands, max(1, concurrency), on_result=arrived)
    return settle_clocks([node_read(n, job, results[n.name], received[n.name], asks) for n in nodes])


LIVING = frozenset({RankState.RUNNING, RankState.STOPPED})
ENDED = frozenset({RankState.EXITED, RankState.DEAD, RankState.ZOMBIE})  # a zombie has ended, not yet reaped


def timed_kept(earlier: CollectiveSeen | None, later: CollectiveSeen) -> CollectiveSeen:
    """A collective read again: the later record, with the times the earlier one had and it lacks (the Inspector's,
    put on a record a later read of the Flight Recorder's ring gives again without them)."""
    if earlier is None or later.exec_ms is not None or earlier.exec_ms is None:
        return later
    return replace(later, exec_ms=earlier.exec_ms, start_ns=earlier.start_ns, complete_ns=earlier.complete_ns,
                   completed=True, busbw_gbps=earlier.busbw_gbps, source=earlier.source)  # fmt: skip


def living_nodes(ranks: Iterable[RankSeen]) -> list[str]:
    """The nodes a rank of the job still lives on, by each rank's latest read: running, stopped, or one the
    reader cannot look up (another pid namespace) while its Flight Recorder still answers on its socket."""
    latest: dict[tuple[str, int], RankSeen] = {}
    for rank in sorted(ranks, key=lambda r: r.read_ns - r.clock_offset_ns):
        latest[(rank.node, rank.rank)] = rank
    alive = [r for r in latest.values() if r.state in LIVING or (r.state == RankState.UNKNOWN and r.answered)]
    return sorted({r.node for r in alive})


def occupied_nodes(ranks: Iterable[RankSeen], unread: Iterable[str]) -> set[str]:
    """Nodes the job may still be on: a rank of it lives there (:func:`living_nodes`), or the node could not be
    read (not known to have left)."""
    return set(living_nodes(ranks)) | set(unread)


@dataclass
class WatchState:
    """What the rounds saw so far; ``keep_s``: how far back collectives are kept (the window and some)."""

    keep_s: float
    ranks: list[RankSeen] = field(default_factory=list)
    collectives: dict[tuple[int, str, int], CollectiveSeen] = field(default_factory=dict)
    coverage: dict[tuple[str, str], SignalCoverage] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)
    since: dict[str, int] = field(default_factory=dict)  # per node: its next read's records begin after this
    clock_seen: dict[str, int] = field(default_factory=dict)  # per node: its clock at its last read
    unread: set[str] = field(default_factory=set)  # nodes the latest round could not read
    rounds: int = 0
    ras: RasSeen | None = None  # NCCL RAS's latest report of the job (answered or not)
    inspector: dict[str, InspectorAsk] = field(default_factory=dict)  # nodes with the job's Inspector files
    job_uid: dict[str, int] = field(default_factory=dict)  # per node: the owner of the job's directory read there
    diagnostics: tuple[NcclDiagnostic, ...] = ()  # RAS's diagnostics of the job, once asked
    diagnostics_asked: int = 0  # times RAS's diagnostics were asked: given up after DIAGNOSTICS_TRIES without a report

    def add(self, reads: Sequence[NodeRead]) -> None:
        self.rounds += 1
        for read in reads:
            self.ranks.extend(read.ranks)
            for c in read.collectives:
                key = (c.rank, c.communicator, c.seq)
                self.collectives[key] = timed_kept(self.collectives.get(key), c)
            if read.job_uid is not None:
                self.job_uid[read.node] = read.job_uid
            elif read.node_ns is not None:
                self.job_uid.pop(read.node, None)  # its directory refused or gone: no owner to ask RAS of
            if read.diagnostics is not None:
                ranks = {rank: seen.node for rank, seen in self.latest_ranks().items()}
                self.diagnostics = place_on_nodes(read.diagnostics.rows, ranks) or self.diagnostics
                self.diagnostics_asked += 1
            if read.inspector_dir is not None and read.node_ns is not None:
                self.inspector[read.node] = InspectorAsk(*read.inspector_dir, read.node_ns // 1000)
            for row in read.coverage:
                self.coverage[(row.node, row.signal)] = row
            if read.problems:
                self.problems[read.node] = read.problems
            else:
                self.problems.pop(read.node, None)
            self._advance(read)
            self.ras = read.ras or self.ras
        self.unread = {read.node for read in reads if read.node_ns is None}
        self._prune()

    def ras_ask(self, nodes: Sequence[str], port: int, user: str | None = None) -> RasAsk | None:
        """The node whose RAS is asked next round: the one asked last while it answered and still holds a rank;
        else the next node holding one after it, in the job's order (a node whose NCCL has no RAS, or a rank of
        another user listening, is passed over in turn); before any rank is seen, the job's first node. ``user``:
        the job's user as the scheduler names it; not named, a node is asked only once its reader found the job's
        directory, of that directory's owner (a listener nobody can tie to the job is never read)."""
        living = set(living_nodes(self.latest_ranks().values())) - self.unread
        order = [n for n in nodes if n in living] or ([] if self.ranks else list(nodes[:1]))
        if user is None:
            order = [n for n in order if n in self.job_uid]
        if not order:
            return None
        last = self.ras
        if last is not None and last.node in order and last.status.available:
            chosen = last.node
        else:
            after = nodes.index(last.node) + 1 if last is not None and last.node in nodes else 0
            chosen = next(n for n in [*nodes[after:], *nodes[:after]] if n in order)
        return RasAsk(chosen, user if user is not None else str(self.job_uid[chosen]), port)

    @property
    def diagnosed(self) -> bool:
        """RAS's diagnostics came back with a report: asked no more."""
        return bool(self.diagnostics)

    def diagnostics_ask(self, status: RasAsk | None) -> RasAsk | None:
        """RAS's diagnostics are asked once a watch, of the node (and listener) whose status is asked this round,
        once a status has come back from that node's NCCL and it runs them (2.31 on): they gather every rank's GPU,
        driver, ECC, NVLink and ``NCCL_*`` settings, more than a round's status needs again and again. An answer
        without a report (a timeout, another report under way) is asked again, up to :data:`DIAGNOSTICS_TRIES`."""
        if self.diagnosed or self.diagnostics_asked >= DIAGNOSTICS_TRIES or status is None or self.ras is None:
            return None
        if not self.ras.status.available or self.ras.node != status.node:  # the NCCL asked is the one checked
            return None
        version = parse_version(self.ras.status.nccl_version)
        return status if version is not None and version >= NCCL_DIAGNOSTICS else None

    def add_states(self, reads: Sequence[NodeRead]) -> None:
        """The ranks' states of reads made outside a round (a re-test waiting for the job to leave): a job that left
        every node while the watch waited is over, and its teardown is not judged as deaths."""
        self.ranks.extend(rank for read in reads for rank in read.ranks)

    def _advance(self, read: NodeRead) -> None:
        """Where the node's next read starts: a second before its newest record (one created just before this read
        may not have been seen), or from the start again when the node's clock went back, since records stamped
        after the step would be older than the mark and never read (their ranks then missing from collectives)."""
        if read.node_ns is None:
            return
        stepped_back = read.node_ns < self.clock_seen.get(read.node, 0)
        self.clock_seen[read.node] = read.node_ns
        if stepped_back:
            self.since[read.node] = 0
        elif read.collectives:
            self.since[read.node] = max(c.enqueue_ns for c in read.collectives) - 1_000_000_000

    def _prune(self) -> None:
        """Collectives and reads older than ``keep_s`` go, but each rank's first read in each state stays: when a
        rank was first seen dead or stopped orders the deaths and dates the hang, however long ago."""
        if self.collectives:
            newest = max(c.enqueue_ns for c in self.collectives.values())
            oldest = newest - int(self.keep_s * 1e9)
            self.collectives = {k: c for k, c in self.collectives.items() if c.enqueue_ns >= oldest}
        if self.ranks:
            since = max(r.read_ns for r in self.ranks) - int(self.keep_s * 1e9)
            first = {(r.rank, r.state): i for i, r in reversed(list(enumerate(self.ranks)))}
            kept = set(first.values())
            self.ranks = [r for i, r in enumerate(self.ranks) if r.read_ns >= since or i in kept]

    def latest_ranks(self) -> dict[int, RankSeen]:
        latest: dict[int, RankSeen] = {}
        for seen in self.ranks:
            latest[seen.rank] = seen
        return latest

    def occupied(self) -> set[str]:
        """Nodes the job may still be on, by each rank's latest read and the latest round's unread nodes."""
        return occupied_nodes(self.latest_ranks().values(), self.unread)

    def ended_ranks(self) -> set[int]:
        """The ranks that have ended (exited or dead) by their latest read."""
        return {r.rank for r in self.latest_ranks().values() if r.state in ENDED}

    def job_over(self) -> bool:
        """Every rank seen has ended (exited or dead): nothing more will happen."""
        latest = self.latest_ranks()
        return bool(latest) and all(r.state in ENDED for r in latest.values())
