"""Whether a late rank's host shows its compute was slow: the share of the time its threads were runnable that
they spent waiting for a CPU, from the reads' ``/proc`` schedstat figures.

Arrival by enqueue says a rank entered its collectives late, not why. Where its collectives block the host (gloo
on CPU: the step waits for the last bucket's all-reduce before it goes on), a rank whose previous collective
finished late — its receive over a slow link — enters the next one late by as much, with a compute as fast as
its peers'. What tells them apart on the node is where the time went: a rank slowed by other work on its cores
waits in a run queue for a CPU; one slowed by its network sleeps in a receive and waits for no CPU. So a rank
named by enqueue on such a backend is a compute straggler only where its threads waited for a CPU a large share
of their runnable time, and well over its peers; otherwise the finding cannot tell compute from communication
and says so (``late_unresolved``). NCCL's enqueue never waits for a collective to finish (the host runs ahead
of the GPU), so a late enqueue there is the host's own, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from cluster_accept.watch.judge.window import NS_PER_S, Window
from cluster_accept.watch.words import RankSeen

HOST_ASYNC_BACKENDS = frozenset({"nccl"})  # a collective whose enqueue never waits for the one before it to end


@dataclass(frozen=True)
class CpuWait:
    """A rank's threads over a span of reads: the share of their runnable time spent waiting for a CPU."""

    rank: int
    share: float
    span_s: float

    def said(self) -> str:
        return f"rank {self.rank} waited for a CPU {self.share:.0%} of its runnable time over {self.span_s:.0f} s"


def blocks_host(full: pd.DataFrame, node: str) -> bool:
    """Whether the node's collectives were read by enqueue on a backend whose enqueue waits for the collective
    before it (gloo): a late arrival there may be carried over from a late completion."""
    mine = full[full["node"] == node]
    if mine.empty:
        return False
    by_enqueue = ~mine["on_device"].astype(bool)
    blocking = ~mine["backend"].fillna("").isin(HOST_ASYNC_BACKENDS)
    return bool((by_enqueue & blocking).mean() > 0.5)


def cpu_waits(window: Window, start_ns: float, end_ns: float) -> dict[int, CpuWait]:
    """Each rank's CPU wait between its first and last read with schedstat figures in ``[start_ns, end_ns]``
    (watcher's clock), one process throughout; no entry under two such reads or without runnable time. The
    window's reads are walked once, however many ranks the job has."""
    reads: dict[int, list[RankSeen]] = {}
    for read in window.reads:
        if read.cpu_run_ns is not None and read.cpu_wait_ns is not None and start_ns <= window.seen_ns(read) <= end_ns:
            reads.setdefault(read.rank, []).append(read)
    waits = {}
    for rank, seen in reads.items():
        first, last = seen[0], seen[-1]
        if len(seen) < 2 or first.pid != last.pid:
            continue
        run = (last.cpu_run_ns or 0) - (first.cpu_run_ns or 0)
        wait = (last.cpu_wait_ns or 0) - (first.cpu_wait_ns or 0)
        if run > 0 and wait >= 0:
            span_s = (window.seen_ns(last) - window.seen_ns(first)) / NS_PER_S
            waits[rank] = CpuWait(rank, wait / (run + wait), span_s)
    return waits


@dataclass(frozen=True)
class HostCall:
    """What the late rank's host showed: its CPU wait, its peers' largest, and whether that says compute."""

    own: CpuWait | None
    peers_max: float | None
    contended: bool

    def said(self) -> str:
        if self.own is None:
            return "its host gave no CPU figures (no schedstat read)"
        peers = f"its peers' at most {self.peers_max:.0%}" if self.peers_max is not None else "no peer's figure"
        return f"{self.own.said()}, {peers}"


def host_call(window: Window, full: pd.DataFrame, rank: int, node: str, span: tuple[float, float]) -> HostCall:
    """Whether rank ``rank`` (on ``node``) waited for a CPU over ``span`` (watcher's clock) at least
    ``cpu_wait_share_min`` of its runnable time more than its peers' largest share (ranks on other nodes): a rank's
    threads wait behind each other too (a rank held to one core waits about half its runnable time, healthy), so
    only the wait beyond its peers' is other work on its cores."""
    waits = cpu_waits(window, *span)
    own = waits.get(rank)
    peers = {int(r) for r in full.loc[full["node"] != node, "rank"].unique()}
    shares = [w.share for r, w in waits.items() if r in peers]
    peers_max = max(shares) if shares else None
    excess = (own.share - (peers_max or 0.0)) if own is not None else 0.0
    return HostCall(own, peers_max, excess >= window.rules.cpu_wait_share_min)


def ring_neighbours(window: Window, rank: int) -> tuple[int | None, int | None]:
    """The ranks ``rank`` receives from and sends to in a ring over the job's ranks in order (gloo's ring
    all-reduce): the one before it and the one after, wrapping round; None for both in a job of one rank. Which
    of its links made a collective end late cannot be told from its arrivals: a receive over a slow link ends
    late, and so does a send into one, once the data outgrows the socket's buffer."""
    ranks = window.ranks
    if rank not in ranks or len(ranks) < 2:
        return None, None
    at = ranks.index(rank)
    return ranks[at - 1], ranks[(at + 1) % len(ranks)]
