"""Start all-reduces across several nodes: ``torchrun`` on every node of a group at once, over SSH.

The first node hosts the rendezvous (its address, a port it reports free for this run, node ranks in
order). Every node gets the probe in a private temp directory and runs it under the node-side timeout; a
failure anywhere (unreachable node, crash, timeout) stops the run on every node — found by the run's tag in the
process list and killed, after :data:`FAILURE_GRACE_S` for peers to end of themselves once all started — so
nothing is left waiting on a rendezvous that will never complete, nor a worker its agent's end left behind.
Each node's ``NCCL_DEBUG=INFO`` log comes back and names the transport used between nodes.

All ranks of a group must run at once, and a group may have more ranks than the stage has threads
(``concurrency``): a thread and an SSH session held per rank for the whole run would deadlock under the
bound, or take 1,000 threads for 1,000 nodes. So each rank is started *detached* on its node (a short
operation, :mod:`remote.detached`) and watched with short polls, which collect its log and exit status
when it ends and remove its directory. The calling thread drives every rank of the groups given (an
isolation round's disjoint groups); every SSH operation runs in one pool of ``concurrency`` threads. What one
operation on one rank does (its start, poll) is in :mod:`remote.rank_ops`.

This is the :class:`~remote.launch.Launcher` of profiles whose ``probes.launcher`` is ``ssh``; ``slurm`` (srun
in an allocation, :mod:`remote.srun`) answers the same protocol. A simulated node answers the operations here
through its typed session, so this launcher drives simulated runs unchanged.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from cluster_accept.inventory.model import Node
from cluster_accept.remote.batch import batch_timeout, command_timeout
from cluster_accept.remote.detached import tag_pattern
from cluster_accept.remote.fanout import connect
from cluster_accept.remote.launch import (
    FAILURE_GRACE_S,
    GroupJob,
    GroupRun,
    RankRun,
    killed_at_timeout,
    rendezvous_address,
)
from cluster_accept.remote.rank_end import rank_done
from cluster_accept.remote.rank_ops import free_port, poll_rank, start_rank
from cluster_accept.remote.result import CommandResult, NodeStatus, PollAnswer, RemoteCommand, Unreachable
from cluster_accept.remote.sessions import SessionCache
from cluster_accept.vocabulary.secrets import MaskedText
from cluster_accept.vocabulary.text import keep_tail

DEFAULT_CONCURRENCY = 64
THREAD_PREFIX = "ca-launch"  # the pool's thread names: at most ``concurrency`` of them at any time
POLL_S = 2.0  # a running rank is looked at this often (less often when ranks outnumber threads)
# Polls a thread may make per second, all ranks together: a poll is a short command on an open session (~50 ms),
# so polling keeps ~10 % of the pool and leaves the rest to starts and collection. Bounding the rate by the pool
# alone (concurrency / POLL_S, 32/s for 64 threads) made collecting a round of 16,384 ranks take 8 minutes.
THREAD_POLLS_PER_S = 2.0
# Once every rank of a run has started, the first looks come sooner, doubling up to the poll interval: short runs
# end fast. Before that a run cannot end (its rendezvous waits for the last rank) unless a rank fails, so its
# started ranks are looked at only at the interval: quick looks at 16,384 ranks while the last of them start would
# be ~10 polls each, crowding out the starts they wait for.
FIRST_POLL_S = 0.25
FOLLOW_S = 0.5  # once a rank has ended well its peers are looked at this soon: ranks end together
STOP_RETRY_S = 3.0  # a rank that outlived a stop (a process forked while we killed) is stopped again
POLL_MISSES = 3  # polls in a row without an answer (the node connects but does not reply) make it lost
STOP_GIVE_UP_S = 60.0  # past its deadline a rank that no stop could end is given up on (the node hangs)
ABANDON_WAIT_S = 30.0
SCAN_SHARE = 0.2  # the most of the driving thread's time spent walking every rank for due polls and deadlines


@dataclass
class _Rank:
    node: Node
    command: RemoteCommand
    remote_dir: str = ""
    pid: int = 0
    started_at: float = math.inf
    swept: bool = False  # polled with the run's kill pattern: nothing of it is left on its node
    deadline: float = math.inf  # client side: the node-side timeout, its kill grace and a margin after start
    next_poll: float | None = None  # None: not started yet, or ended
    polls: int = 0  # since every rank of the run started
    busy: bool = False
    misses: int = 0
    client_timed_out: bool = False
    done: RankRun | None = None

    @property
    def live(self) -> bool:
        return self.done is None and self.next_poll is not None


@dataclass
class _Group:
    nodes: Sequence[Node]
    run: GroupRun
    job: GroupJob
    ranks: list[_Rank] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    unstarted: int = 0  # ranks whose start has not come back yet
    followed: bool = False  # a rank ended well and its peers were looked at soon (:data:`FOLLOW_S`)
    failed_at: float | None = None  # a rank failed: the run is stopped at this time plus FAILURE_GRACE_S
    unswept: list[_Rank] = field(default_factory=list)  # ended badly of themselves: workers may outlive them


class _Launcher:
    """Drives every rank of the given groups from the calling thread; the SSH work goes to one bounded pool.

    State changes only here, in the calling thread (completion callbacks run there too), so no locks."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=THREAD_PREFIX)
        self.sessions = SessionCache(concurrency, connect)
        self.inflight: set[Future[Any]] = set()
        self.finished: queue.SimpleQueue[tuple[Future[Any], Callable[[Any], None]]] = queue.SimpleQueue()
        self.interval = POLL_S

    def drive(self, groups: list[_Group]) -> None:
        abandoned = False
        try:
            for group in groups:
                self.submit(partial(self.port_known, group), free_port, self.sessions, group.nodes[0])
            while True:
                scanned = time.monotonic()
                wake = self.schedule(groups, scanned)
                if not self.inflight and wake is None:
                    break
                self.handle_finished(wake, scanned + (time.monotonic() - scanned) / SCAN_SHARE)
        except BaseException:
            abandoned = True
            self.abandon(groups)
            raise
        finally:
            self.pool.shutdown(wait=not abandoned, cancel_futures=True)
            self.sessions.close()

    def handle_finished(self, wake: float | None, until: float) -> None:
        """The operations that finish before a poll is due (in ``wake`` s; None: no poll waits), and every
        one that finishes until ``until``. A scan (:meth:`schedule`) walks every rank: one scan per finished
        operation would make a round of R ranks cost R² of this thread's time; the scans take at most
        ``SCAN_SHARE`` of it, and a poll due meanwhile waits for the next scan."""
        try:
            future, then = self.finished.get(timeout=wake)
        except queue.Empty:
            return  # a poll is due
        while True:
            self.inflight.discard(future)
            then(future.result())
            left = until - time.monotonic()
            try:
                future, then = self.finished.get(timeout=left) if left > 0 else self.finished.get_nowait()
            except queue.Empty:
                return

    def submit(self, then: Callable[[Any], None], fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` in the pool; ``then`` gets its result here, in the driving thread."""
        future = self.pool.submit(fn, *args)
        self.inflight.add(future)
        future.add_done_callback(lambda done: self.finished.put((done, then)))

    def schedule(self, groups: list[_Group], now: float) -> float | None:
        """Client-side deadlines, then the polls that are due; seconds until the next one (None: no rank left)."""
        live = [(group, rank) for group in groups for rank in group.ranks if rank.live]
        self.interval = max(POLL_S, len(live) / (self.concurrency * THREAD_POLLS_PER_S))
        for group in groups:
            if group.failed_at is not None and now >= group.failed_at + FAILURE_GRACE_S:
                self.stop(group, now)
            if group.unswept and (group.stopping.is_set() or not any(r.live for r in group.ranks)):
                self.sweep(group)
        for group, rank in live:
            if now >= rank.deadline + STOP_GIVE_UP_S and not rank.busy:
                result = CommandResult(rank.command.name, None, MaskedText(""), MaskedText(""), timed_out=True)
                self.end(group, rank, RankRun(rank.node.name, NodeStatus.OK, None, "could not be stopped", result))
            elif now >= rank.deadline and not rank.client_timed_out:
                rank.client_timed_out = True
                self.stop(group, now)
        wake: float | None = None
        for group, rank in live:
            if rank.busy or rank.next_poll is None or rank.done is not None:
                continue
            if rank.next_poll <= now:
                rank.busy = True
                pattern = tag_pattern(group.run.tag) if group.stopping.is_set() else None
                then = partial(self.polled, group, rank, pattern is not None)
                self.submit(then, poll_rank, self.sessions, rank.node, rank.remote_dir, rank.pid, pattern)
            else:
                wake = min(wake if wake is not None else math.inf, rank.next_poll - now)
        return wake

    def port_known(self, group: _Group, port: int | RankRun) -> None:
        if isinstance(port, RankRun):
            group.run.ranks[port.node] = port
            group.run.detail = port.detail
            return
        master, world = rendezvous_address(group.nodes[0]), len(group.nodes)
        group.unstarted = world
        for index, node in enumerate(group.nodes):
            rank = _Rank(node, group.job.command(node, index, world, master, port, group.run.tag))
            group.ranks.append(rank)
            then = partial(self.started, group, rank)
            files = group.job.files
            self.submit(then, start_rank, self.sessions, node, rank.command, group.stopping, group.run.tag, files)

    def started(self, group: _Group, rank: _Rank, outcome: tuple[str, int] | RankRun) -> None:
        now = time.monotonic()
        group.unstarted -= 1
        if isinstance(outcome, RankRun):
            self.end(group, rank, outcome)
        else:
            rank.remote_dir, rank.pid = outcome
            rank.started_at = now
            rank.deadline = now + batch_timeout([rank.command], rank.node.ssh.command_timeout_s or 120.0)
            rank.next_poll = now if group.stopping.is_set() else now + self.interval
        if group.unstarted == 0 and not group.stopping.is_set():
            self.all_started(group, now)

    def all_started(self, group: _Group, now: float) -> None:
        """The run can end from now on: its ranks are looked at soon, then less often (:data:`FIRST_POLL_S`)."""
        for peer in group.ranks:
            if peer.live and peer.next_poll is not None:
                peer.polls = 0
                peer.next_poll = min(peer.next_poll, now + FIRST_POLL_S)

    def polled(
        self, group: _Group, rank: _Rank, stopped: bool, answer: PollAnswer | Unreachable | RankRun | str
    ) -> None:
        rank.busy = False
        rank.polls += 1
        rank.swept = rank.swept or stopped
        now = time.monotonic()
        if isinstance(answer, RankRun):  # the controller failed polling it
            self.end(group, rank, answer)
        elif isinstance(answer, Unreachable):  # the node died, or its network did: as at start, a rank cause
            self.end(group, rank, RankRun(rank.node.name, NodeStatus.UNREACHABLE, answer.cause.value, answer.detail))
        elif isinstance(answer, str):
            rank.misses += 1
            if rank.misses < POLL_MISSES:
                rank.next_poll = now + FOLLOW_S
                return
            # why the poll gave no answer: its node's words masked where they entered (remote.shell), the rest ours
            result = CommandResult(rank.command.name, None, MaskedText(""), MaskedText(answer))
            self.end(group, rank, RankRun(rank.node.name, NodeStatus.ERROR, None, f"lost the rank: {answer}", result))
        elif answer.running:
            rank.misses = 0
            if group.stopping.is_set():
                rank.next_poll = now + (STOP_RETRY_S if stopped else 0.0)
            elif group.unstarted:
                rank.next_poll = now + self.interval
            else:
                rank.next_poll = now + min(self.interval, FIRST_POLL_S * 2**rank.polls)
        else:
            self.end(group, rank, self.ended(group, rank, answer))

    def ended(self, group: _Group, rank: _Rank, answer: PollAnswer) -> RankRun:
        """An ended rank as the batch runner reports a command: killed at a timeout (node side: 124, or 137 once
        its time was up; client side: no status) is timed out — a 137 before then is a kill on the node, not a
        timeout. Stopped with the run it has no exit status and says nothing of its node, unless it had
        finished its work (:attr:`RankRun.completed`): then it is complete."""
        code = answer.exit_code
        limit = command_timeout(rank.command, rank.node.ssh.command_timeout_s or 120.0)
        ran_s = time.monotonic() - rank.started_at
        timed_out = killed_at_timeout(code, ran_s, limit) or (code is None and rank.client_timed_out)
        result = CommandResult(rank.command.name, code, answer.stdout, answer.stderr, timed_out=timed_out)
        name = rank.node.name
        if code is not None:
            return RankRun(name, NodeStatus.OK, None, "", result)
        if rank.client_timed_out:
            return RankRun(name, NodeStatus.OK, None, "killed at the client-side timeout", result)
        if rank_done(answer.stdout):
            return RankRun(name, NodeStatus.OK, None, "stopped after it finished its work", result, stopped=True)
        stopped = group.stopping.is_set()
        why = "stopped with the run" if stopped else "ended without an exit status (killed on the node)"
        said = keep_tail(answer.stderr.strip(), 300)  # masked where the poll's answer entered (parse_poll)
        return RankRun(name, NodeStatus.ERROR, None, f"{why}: {said}" if said else why, result, stopped=stopped)

    def end(self, group: _Group, rank: _Rank, outcome: RankRun) -> None:
        rank.done, rank.next_poll = outcome, None
        now = time.monotonic()
        if not outcome.ok:
            if rank.pid and not rank.swept:
                group.unswept.append(rank)
            self.failed(group, outcome, now)
            return
        if group.followed:  # once per run: a walk of every peer at each rank's end made a run of R ranks cost R²
            return
        group.followed = True
        for peer in group.ranks:
            if peer.live and peer.next_poll is not None:
                peer.next_poll = min(peer.next_poll, now + FOLLOW_S)

    def failed(self, group: _Group, outcome: RankRun, now: float) -> None:
        """A rank failed: once every rank has started, its peers get :data:`FAILURE_GRACE_S` to end of
        themselves (looked at soon), then the run is stopped. A rank that did not start, a node lost and a
        failure before the whole run started stop it at once: its peers wait at the rendezvous for nobody."""
        if group.unstarted or outcome.result is None or outcome.cause is not None:
            self.stop(group, now)
            return
        if group.failed_at is None:
            group.failed_at = now
            for peer in group.ranks:
                if peer.live and peer.next_poll is not None:
                    peer.next_poll = min(peer.next_poll, now + FOLLOW_S)

    def stop(self, group: _Group, now: float) -> None:
        """The run cannot complete: every started rank is stopped at its next poll, due now."""
        if group.stopping.is_set():
            return
        group.stopping.set()  # ranks still queued for start-up will not start
        for rank in group.ranks:
            if rank.live:
                rank.next_poll = now

    def sweep(self, group: _Group) -> None:
        """Ranks that ended badly of themselves may leave workers behind: an agent killed at its timeout leaves
        the workers it started in sessions of their own (a hung one among them), holding their GPUs. Once the
        run is stopped, or has no rank left, each such rank's node is cleared by the run's kill pattern."""
        pattern = tag_pattern(group.run.tag)
        for rank in group.unswept:
            rank.swept = True
            self.submit(lambda _: None, poll_rank, self.sessions, rank.node, rank.remote_dir, rank.pid, pattern)
        group.unswept.clear()

    def abandon(self, groups: list[_Group]) -> None:
        """The caller is going away (an error, an interrupt): stop what runs, remove what we can, briefly."""
        for group in groups:
            group.stopping.set()
        stops = [
            self.pool.submit(poll_rank, self.sessions, r.node, r.remote_dir, r.pid, tag_pattern(g.run.tag))
            for g in groups
            for r in g.ranks
            if r.live and not r.busy
        ]
        wait([*stops, *self.inflight], timeout=ABANDON_WAIT_S)


def _outcome(group: _Group) -> None:
    """Each rank's record: its end, or abandoned."""
    for rank in group.ranks:
        abandoned = RankRun(rank.node.name, NodeStatus.ERROR, None, "abandoned", stopped=True)
        group.run.ranks[rank.node.name] = rank.done or abandoned


class SshLauncher:
    """The :class:`~remote.launch.Launcher` of ``torchrun`` over SSH: at most ``concurrency`` SSH operations in
    flight for all groups together, on as many threads (named :data:`THREAD_PREFIX`), however many ranks."""

    def __init__(self, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency

    def launch(self, groups: Sequence[Sequence[Node]], runs: Sequence[GroupRun], job: GroupJob) -> None:
        states = [_Group(nodes, run, job) for nodes, run in zip(groups, runs, strict=True)]
        if states:
            _Launcher(self.concurrency).drive(states)
        for group in states:
            _outcome(group)
