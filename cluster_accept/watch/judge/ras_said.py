"""What NCCL's RAS said of each rank of a job, put on the job's own ranks.

RAS names a job's processes by host address and pid, and its ranks by their rank in each communicator. A rank the
watch has read carries its pid: a RAS process is the watch's rank of the same pid (several ranks of one pid, on
machines that reuse pids: the one of RAS's communicator rank). A process RAS names that no read listed is kept by
its place alone and never guessed onto a rank.

What RAS adds beside the Flight Recorder: it is asked on one node and answers for every node, so a node the
watcher cannot reach (a kernel panic, a partitioned network) still has its processes judged, by the NCCL of its
peers: RAS calls a process dead when it has not answered over the RAS network for 60 s, and unresponsive when it
did not answer this query. Its caveats are kept: a rank ``behind`` on a collective count is evidence only while
the counts stand still (RAS's own note: counts that keep advancing are benign), and a rank in ``error`` reports a
peer's failure more often than its own (``Remote process error``), so neither alone names a node."""

from __future__ import annotations

from dataclasses import dataclass

from cluster_accept.watch.judge.window import NS_PER_S, Window, ago
from cluster_accept.watch.ras import RasRank, RasRankState

GONE = frozenset({RasRankState.DEAD.value, RasRankState.UNRESPONSIVE.value})


@dataclass(frozen=True)
class RasSaid:
    """What RAS said of one of the job's ranks."""

    rank: int
    state: str  # a RasRankState value
    pid: int | None
    host: str
    detail: str


def _rank_of(window: Window, said: RasRank) -> int | None:
    """The job's rank RAS's rank stands for: the one read with its pid; among several, the one of RAS's rank."""
    if said.pid is None:
        return None
    same = [rank for rank, seen in window.latest.items() if seen.pid == said.pid]
    if len(same) == 1:
        return same[0]
    return said.rank if said.rank in same else None


def ras_ranks(window: Window) -> dict[int, RasSaid]:
    """Each of the job's ranks RAS named (dead or unresponsive first, then error, behind, other states)."""
    if window.ras is None or not window.ras.status.available:
        return {}
    order = [s.value for s in RasRankState]
    out: dict[int, RasSaid] = {}
    for said in sorted(window.ras.status.ranks, key=lambda r: order.index(r.state)):
        rank = _rank_of(window, said)
        if rank is not None and rank not in out:
            out[rank] = RasSaid(rank, said.state, said.pid, said.host, said.detail)
    return out


def ras_gone(window: Window) -> dict[int, RasSaid]:
    """The ranks whose process RAS found dead or unresponsive."""
    return {rank: said for rank, said in ras_ranks(window).items() if said.state in GONE}


def ras_dead_unread(window: Window) -> dict[int, RasSaid]:
    """Ranks RAS considers dead that the watch's own reads cannot speak for: the rank's latest read is older than
    RAS's report (its node no longer answers the watcher). A rank read as recently says for itself (a stopped
    rank is the hang's, a dead one the deaths')."""
    if window.ras is None:
        return {}
    tolerance = int(window.rules.same_read_s * NS_PER_S)
    stale_before = window.ras.seen_ns - tolerance
    return {
        rank: said
        for rank, said in ras_ranks(window).items()
        if said.state == RasRankState.DEAD.value
        and (rank not in window.latest or window.seen_ns(window.latest[rank]) < stale_before)
    }


def ras_line(window: Window, rank: int) -> str:
    """RAS's word on ``rank`` for a row's evidence, '' where RAS was not read or said nothing of it."""
    said = ras_ranks(window).get(rank)
    if said is None or window.ras is None:
        return ""
    state = "considered dead (no answer over the RAS network for 60 s)" if said.state == "dead" else said.state
    where = f"process {said.pid} on {said.host}" if said.pid is not None else f"on {said.host}"
    extra = f" ({said.detail})" if said.detail else ""
    asked = f"NCCL RAS (asked on {window.ras.node} {ago(window, window.ras.seen_ns)})"
    return f"{asked}: rank {rank}'s {where} {state}{extra}"
