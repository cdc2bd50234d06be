"""What the watch keeps between rounds: each collective once per rank, and a bounded record of the ranks' reads
that never loses when a rank was first seen dead or stopped."""

from __future__ import annotations

import pytest

from cluster_accept.watch.read import NodeRead
from cluster_accept.watch.rounds import WatchState, living_nodes
from cluster_accept.watch.words import CollectiveSeen, RankSeen, RankState

pytestmark = pytest.mark.unit

S = 1_000_000_000


def _read(t_s: int, state1: str, seqs: range) -> NodeRead:
    read = NodeRead("n1", node_ns=t_s * S)
    read.ranks = [RankSeen("j", "n1", r, r, 100 + r, RankState(s), t_s * S) for r, s in ((0, "running"), (1, state1))]
    read.collectives = [
        CollectiveSeen("j", "n1", r, "0:default_pg", "all_reduce", q, q * S, "flight_recorder", completed=t_s > q)
        for r in (0, 1) for q in seqs
    ]  # fmt: skip
    return read


def test_old_reads_go_but_the_first_of_each_state_stays() -> None:
    state = WatchState(keep_s=10)
    for t in range(0, 100, 2):
        state.add([_read(t, "dead" if t >= 20 else "running", range(t, t + 2))])
    assert state.rounds == 50
    kept = {(r.rank, r.state, r.read_ns // S) for r in state.ranks}
    assert (1, "dead", 20) in kept and (1, "running", 0) in kept and (0, "running", 0) in kept
    assert min(r.read_ns for r in state.ranks if (r.rank, r.state) == (1, "dead") and r.read_ns // S != 20) >= 88 * S
    assert len(state.ranks) < 20
    assert min(c.seq for c in state.collectives.values()) >= 89 and len(state.collectives) == 2 * 11  # #89-#99


def test_a_collective_read_again_is_kept_once_with_the_later_record() -> None:
    state = WatchState(keep_s=60)
    state.add([_read(5, "running", range(4, 8))])
    state.add([_read(9, "running", range(4, 8))])
    assert len(state.collectives) == 8
    assert all(c.completed for c in state.collectives.values())
    assert state.since["n1"] == 7 * S - S


def test_a_node_clock_that_steps_back_is_read_from_the_start_again() -> None:
    state = WatchState(keep_s=60)
    state.add([_read(50, "running", range(48, 50))])
    assert state.since["n1"] == 48 * S
    state.add([_read(30, "running", range(28, 30))])  # stepped back 20 s: its new records predate the mark
    assert state.since["n1"] == 0
    state.add([_read(32, "running", range(30, 32))])
    assert state.since["n1"] == 30 * S


def test_a_job_has_left_a_node_once_every_rank_there_ended_by_its_latest_read() -> None:
    """A re-test waits for these: a rank running or stopped (a hang) keeps its node busy, and one in another pid
    namespace (``unknown``) while its recorder still answers; one dead, exited, a zombie, or unknown and silent
    does not. A rank's latest read counts, whatever the order the reads come in."""
    seen = [
        RankSeen("j", "n1", 0, 0, 10, RankState.DEAD, 2), RankSeen("j", "n1", 0, 0, 10, RankState.RUNNING, 1),
        RankSeen("j", "n2", 1, 0, 11, RankState.EXITED, 1), RankSeen("j", "n2", 1, 0, 11, RankState.STOPPED, 2),
        RankSeen("j", "n3", 2, 0, 12, RankState.UNKNOWN, 2), RankSeen("j", "n4", 3, 0, 13, RankState.ZOMBIE, 2),
        RankSeen("j", "n5", 4, 0, 14, RankState.UNKNOWN, 2, answered=False),
    ]  # fmt: skip
    assert living_nodes(seen) == ["n2", "n3"]
    assert living_nodes(seen[1:3]) == ["n1"]
    assert living_nodes([]) == []
