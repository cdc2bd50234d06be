"""What NCCL's RAS said of each rank of a job, put on the job's own ranks.

RAS names a job's processes by host address and pid, and its ranks by their rank in each communicator; the window
puts them on the job's ranks once (``Window.ras_ranks``, :func:`watch.ras.on_job_ranks`: by pid, by RAS's rank
where a pid repeats across machines, and a process no read listed left out, never guessed onto a rank).

What RAS adds beside the Flight Recorder: it is asked on one node and answers for every node, so a node the
watcher cannot reach (a kernel panic, a partitioned network) still has its processes judged, by the NCCL of its
peers: RAS calls a process dead when it has not answered over the RAS network for 60 s, and unresponsive when it
did not answer this query. Its caveats are kept: a rank ``behind`` on a collective count is evidence only while
the counts stand still (RAS's own note: counts that keep advancing are benign), and a rank in ``error`` reports a
peer's failure more often than its own (``Remote process error``), so neither alone names a node."""

from __future__ import annotations

from cluster_accept.watch.judge.window import NS_PER_S, Window, ago
from cluster_accept.watch.ras import RasRank, RasRankState

GONE = frozenset({RasRankState.DEAD.value, RasRankState.UNRESPONSIVE.value})


def ras_gone(window: Window) -> dict[int, RasRank]:
    """The ranks whose process RAS found dead or unresponsive."""
    return {rank: said for rank, said in window.ras_ranks.items() if said.state in GONE}


def ras_dead_unread(window: Window) -> dict[int, RasRank]:
    """Ranks RAS considers dead that the watch's own reads cannot speak for: the rank's latest read is older than
    RAS's report (its node no longer answers the watcher). A rank read as recently says for itself (a stopped
    rank is the hang's, a dead one the deaths')."""
    if window.ras is None:
        return {}
    tolerance = int(window.rules.same_read_s * NS_PER_S)
    stale_before = window.ras.seen_ns - tolerance
    return {
        rank: said
        for rank, said in window.ras_ranks.items()
        if said.state == RasRankState.DEAD.value
        and (rank not in window.latest or window.seen_ns(window.latest[rank]) < stale_before)
    }


def ras_line(window: Window, rank: int) -> str:
    """RAS's word on ``rank`` for a row's evidence, '' where RAS was not read or said nothing of it."""
    said = window.ras_ranks.get(rank)
    if said is None or window.ras is None:
        return ""
    state = "considered dead (no answer over the RAS network for 60 s)" if said.state == "dead" else said.state
    where = f"process {said.pid} on {said.host}" if said.pid is not None else f"on {said.host}"
    extra = f" ({said.detail})" if said.detail else ""
    asked = f"NCCL RAS (asked on {window.ras.node} {ago(window, window.ras.seen_ns)})"
    return f"{asked}: rank {rank}'s {where} {state}{extra}"
