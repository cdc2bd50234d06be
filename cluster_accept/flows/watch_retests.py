"""Re-tests beside the read rounds: a suspect's re-test waits for the job to leave its nodes and then runs on a
worker thread, while the watch goes on reading and judging the job's other nodes every interval.

A GPU (or core) measured while the job loads it measures the job, so a re-test starts only once no rank of the
job lives on its nodes and, for a Slurm job, Slurm no longer runs it there (:func:`watch.request.slurm_holds`).
Whether the job has left is read from the round the watch makes anyway (each rank's latest state, the nodes the
round could not read); once the watch's own rounds end, the waiting re-tests read their nodes themselves until
their wait is over. A re-test that fails on the controller is a finding not confirmed, with what failed: one
suspect's failure never stops the watch of the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from cluster_accept.inventory.hostlist import fold
from cluster_accept.watch.policy import NOT_RETESTED, Acted, not_confirmed, retest_nodes, retest_peers
from cluster_accept.watch.request import WatchRequest, slurm_holds
from cluster_accept.watch.rounds import WatchState, occupied_nodes
from cluster_accept.watch.words import RankSeen, WatchFinding

WAITING = "re-test waits for the job to leave"
RUNNING = "re-test running on"
RunRetest = Callable[[WatchRequest, Sequence[WatchFinding], Sequence[str]], list[WatchFinding]]
ReadNodes = Callable[[WatchRequest, Sequence[str]], tuple[list[RankSeen], set[str]]]


@dataclass
class _Group:
    """One kind's suspects re-tested together with their peers: waiting until ``deadline`` (monotonic), then
    running (``future``)."""

    suspects: list[WatchFinding]
    peers: list[str]
    wait_s: float
    deadline: float
    future: Future[list[WatchFinding]] | None = None

    @property
    def nodes(self) -> list[str]:
        return [*dict.fromkeys(n for f in self.suspects for n in retest_nodes(f)), *self.peers]


def still_on(
    request: WatchRequest, nodes: Sequence[str], ranks: Iterable[RankSeen], unread: Iterable[str]
) -> list[str]:
    """Which of ``nodes`` the job may still be on: a living rank read there, a node not read, or Slurm's word."""
    occupied = occupied_nodes(ranks, unread) & set(nodes)
    return sorted(occupied | slurm_holds(request, nodes))


@dataclass
class Retests:
    """The watch's re-tests in flight, and what each left in ``acted`` (the finding as its re-test left it)."""

    request: WatchRequest
    run: RunRetest
    acted: Acted = field(default_factory=dict)
    groups: list[_Group] = field(default_factory=list)
    ended_before: set[int] = field(default_factory=set)  # ranks already ended when a re-test began to wait
    torn_down: set[int] = field(default_factory=set)  # ranks that ended while a re-test waited, and are still down
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="retest"))

    def begin(self, suspects: Sequence[WatchFinding], state: WatchState, wait: bool = True) -> None:
        """``suspects`` (one kind) re-tested once the job has left them and their peers, waiting up to the spec's
        ``retest_wait_s`` (``wait`` off: only if it has left them now)."""
        names = list(dict.fromkeys(n for f in suspects for n in retest_nodes(f)))
        peers = retest_peers(names, [n.name for n in self.request.nodes], state.occupied())
        wait_s = self.request.spec.retest_wait_s if wait else 0.0
        group = _Group(list(suspects), peers, wait_s, time.monotonic() + wait_s)
        self.ended_before |= state.ended_ranks()
        living = still_on(self.request, group.nodes, state.latest_ranks().values(), state.unread)
        for finding in suspects:
            self.acted[(finding.node, finding.kind)] = replace(finding, retest=f"{WAITING} {fold(group.nodes)}")
        if living and wait:
            print(f"re-test of {fold(group.nodes)} waits up to {wait_s:g} s for the job to leave {fold(living)}",
                  flush=True)  # fmt: skip
        self.groups.append(group)

    @property
    def busy(self) -> bool:
        return bool(self.groups)

    @property
    def waiting(self) -> bool:
        """A re-test waits for the job to leave its nodes: the job's owner may be taking it down."""
        return any(g.future is None for g in self.groups)

    def teardown(self, state: WatchState) -> bool:
        """While a re-test waits for the job to leave, a rank that has ended since is the owner taking the job
        down (excluding the node, requeueing): that round is not judged, and its deaths are no findings; nor is
        any later round while such a rank stays down (once the re-test runs, the job it waited for is gone, not
        dead). A torn-down rank seen running again (the job requeued on its nodes) is judged again."""
        ended = state.ended_ranks()
        if self.waiting:
            self.torn_down |= ended - self.ended_before
        self.torn_down &= ended
        return bool(self.torn_down)

    def advance(self, ranks: Iterable[RankSeen], unread: Iterable[str]) -> None:
        """Start each waiting re-test whose nodes the job has left (by ``ranks``' latest states and the nodes not
        read), give up on one whose wait is over, and record each one that has finished."""
        ranks, unread = list(ranks), set(unread)
        for group in list(self.groups):
            if group.future is None:
                self._start_or_expire(group, ranks, unread)
            elif group.future.done():
                self.groups.remove(group)
                self._record(group.suspects, self._outcome(group))

    def _start_or_expire(self, group: _Group, ranks: list[RankSeen], unread: set[str]) -> None:
        living = still_on(self.request, group.nodes, ranks, unread)
        if not living:
            group.future = self.pool.submit(self.run, self.request, group.suspects, group.peers)
            self._record(group.suspects, [replace(f, retest=f"{RUNNING} {fold(group.nodes)}") for f in group.suspects])
        elif time.monotonic() >= group.deadline:
            self.groups.remove(group)
            said = (
                f"{NOT_RETESTED} {fold(living)} after {group.wait_s:g} s, and a GPU measured under the job "
                "measures the job; exclude the node and requeue the job: the watch re-tests the node once the job "
                "has left it"
            )
            self._record(group.suspects, [not_confirmed(f, said) for f in group.suspects])

    def _outcome(self, group: _Group) -> list[WatchFinding]:
        assert group.future is not None
        try:
            return group.future.result()
        except Exception as error:  # noqa: BLE001 - a re-test that failed on the controller is data, not the end
            said = f"re-test of {fold(group.nodes)} failed on the controller: {type(error).__name__}: {error}"
            return [not_confirmed(f, said) for f in group.suspects]

    def _record(self, suspects: Sequence[WatchFinding], done: Sequence[WatchFinding]) -> None:
        for finding in done:
            self.acted[(finding.node, finding.kind)] = finding

    def finish(self, read: ReadNodes) -> None:
        """After the last round: each waiting re-test reads its own nodes every interval until the job has left
        them or its wait is over, and every running one is waited for."""
        while self.groups:
            waiting = [n for g in self.groups if g.future is None for n in g.nodes]
            ranks, unread = read(self.request, list(dict.fromkeys(waiting))) if waiting else ([], set())
            self.advance(ranks, unread)
            if self.groups:
                time.sleep(self.request.spec.interval_s)
        self.pool.shutdown()
