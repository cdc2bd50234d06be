"""Localizing faults in a running job from its rows: dead ranks, hangs, compute and communication stragglers.

The jobs are synthetic and DDP-like: each step every rank computes (its own time plus noise) and enters several
all_reduce buckets as its gradients become ready; each collective completes when its last rank arrives, so a
rank's own execution time is its wait for the last plus the transfer. Clocks of nodes may run ahead of the
watcher's (their offset is what the reads measured)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.checks.reasons import Action, Reason
from cluster_accept.checks.reasons import FindingKind as ReasonKind
from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge import REASONS, WatchRules, localize, owner_line
from cluster_accept.watch.judge.window import build
from cluster_accept.watch.words import CollectiveSeen, FindingKind, RankSeen, RankState, WatchFinding

pytestmark = pytest.mark.unit

MS = 1_000_000
S = 1_000_000_000
T0 = 1_700_000_000 * S
DEFAULT = "0:default_pg"
KINDS = {k.value for k in FindingKind}
JOBS = Path(__file__).parent / "data" / "watch" / "jobs"


@dataclass
class Job:
    """A DDP-like job of ``nodes`` × ``per_node`` ranks on the watcher's clock; ``slow`` adds compute to a rank
    from a step on; ``groups`` adds communicators that each run one all_gather per step."""

    nodes: int = 2
    per_node: int = 2
    steps: int = 40
    buckets: int = 3
    compute_ms: float = 150.0
    noise_ms: float = 1.5
    exec_ms: float = 4.0
    seed: int = 0
    slow: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (from step, extra ms)
    late_at: Callable[[int], bool] = lambda step: True  # the steps a slow rank is slow at
    offsets_ms: dict[str, float] = field(default_factory=dict)  # node clock minus the watcher's
    errors_ms: dict[str, float] = field(default_factory=dict)
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # communicator -> its ranks
    group_exec_ms: dict[str, float] = field(default_factory=dict)
    end_ns: int = 0  # set by collectives(): the last completion, watcher's clock

    @property
    def ranks(self) -> range:
        return range(self.nodes * self.per_node)

    def node(self, rank: int) -> str:
        return f"node{rank // self.per_node:02d}"

    def offset_ns(self, rank: int) -> int:
        return int(self.offsets_ms.get(self.node(rank), 0.0) * MS)

    def record(
        self, rank: int, communicator: str, op: str, seq: int, at: float, done: float, size: int
    ) -> CollectiveSeen:
        """One rank's record; times in ns on the watcher's clock, stamped on its node's clock."""
        return CollectiveSeen(
            "job1", self.node(rank), rank, communicator, op, seq, int(at) + self.offset_ns(rank), "flight_recorder",
            completed=True, complete_ns=int(done) + self.offset_ns(rank), exec_ms=(done - at) / MS,
            size_bytes=size, gpu=rank % self.per_node,
        )  # fmt: skip

    def collectives(self) -> list[CollectiveSeen]:
        noise = random.Random(self.seed)
        rows, start = [], float(T0)
        for step in range(self.steps):
            compute = {r: self.compute_ms + self._extra(r, step) + noise.gauss(0, self.noise_ms) for r in self.ranks}
            for bucket in range(self.buckets):
                at = {
                    r: start + (compute[r] * (bucket + 1) / self.buckets + noise.gauss(0, 0.3)) * MS for r in self.ranks
                }
                done = max(at.values()) + self.exec_ms * MS
                seq = 1 + step * self.buckets + bucket
                rows += [self.record(r, DEFAULT, "all_reduce", seq, at[r], done, 25 << 20) for r in self.ranks]
            start = done + 2 * MS
            for name, members in self.groups.items():
                at = {r: start + noise.gauss(0, 0.3) * MS for r in members}
                done = max(at.values()) + (self.group_exec_ms.get(name, 10.0) + noise.gauss(0, 0.2)) * MS
                rows += [self.record(r, name, "all_gather", step + 1, at[r], done, 8 << 20) for r in members]
                start = max(start, done)
            start += 10 * MS  # the optimizer step
        self.end_ns = int(start)
        return rows

    def _extra(self, rank: int, step: int) -> float:
        since, extra = self.slow.get(rank, (0, 0.0))
        return extra if rank in self.slow and step >= since and self.late_at(step) else 0.0

    def read(self, rank: int, at_ns: int, state: str = "running", **said: object) -> RankSeen:
        """One read of one rank at ``at_ns`` (watcher's clock), stamped on its node's clock."""
        node = self.node(rank)
        return RankSeen(
            "job1", node, rank, rank % self.per_node, 4000 + rank, RankState(state), at_ns + self.offset_ns(rank),
            clock_offset_ns=self.offset_ns(rank), clock_error_ns=int(self.errors_ms.get(node, 0.5) * MS),
            gpu=rank % self.per_node, **said,  # type: ignore[arg-type]
        )  # fmt: skip

    def reads(self, *times_ns: int) -> list[RankSeen]:
        """Every rank running at each read."""
        return [self.read(r, t) for t in times_ns for r in self.ranks]


def judged(
    job: Job, ranks: list[RankSeen], collectives: list[CollectiveSeen], now_ns: int, **rules: object
) -> list[WatchFinding]:
    """The findings, checked for what every call owes: one row per node and kind, known reason codes."""
    rules = {"persist_min_s": 0.0, **rules}  # these runs are seconds long; the test below holds the duration rule
    rows = localize(ranks, collectives, WatchRules(**rules), now_ns)  # type: ignore[arg-type]
    nodes = {job.node(r) for r in job.ranks}
    assert sorted((r.node, r.kind) for r in rows) == sorted((n, k) for n in nodes for k in KINDS)
    assert all(r.reason in REASONS for r in rows), {r.reason for r in rows} - set(REASONS)
    assert all(r.status is REASONS[r.reason].severity for r in rows)  # each code with the status it declares
    assert all(r.owner_line == owner_line(r) and r.owner_line for r in rows)
    return rows


CODES = {
    "ok", "rank_dead", "torn_down", "rank_missing", "node_unread", "hang_wavefront", "rank_stopped", "waiting",
    "hang_unlocalized", "after_death", "no_progress_signal", "arrives_last", "late_unresolved", "below_clock_error",
    "no_device_time", "late_by_neighbour", "slow_link_neighbour", "ras_dead", "ras_unresponsive",
    "too_few_collectives", "slow_communicators", "slow_nic", "slow_rail", "slow_unlocalized", "one_communicator",
    "not_compared", "no_exec_time",
}  # fmt: skip


def test_the_reasons_are_typed_with_their_status_meaning_and_action() -> None:
    """The watch's reason codes (stable strings) are :class:`Reason`s, as every check's: the status its rows
    carry, one line of what it means, an action; a straggler's is relative (judged against the job's other
    nodes). A code the judgement did not declare is refused where a finding is made."""
    assert set(REASONS) == CODES
    for code, reason in REASONS.items():
        assert isinstance(reason, Reason) and reason.code == code and reason.explanation.endswith(".")
        assert isinstance(reason.severity, Status) and isinstance(reason.action, Action)
    assert REASONS["rank_dead"].severity is Status.FAIL and REASONS["rank_dead"].action is Action.CHECK_NODE
    assert REASONS["no_exec_time"].action is Action.FIX_CONFIG
    relative = {code for code, reason in REASONS.items() if reason.kind is ReasonKind.RELATIVE}
    assert relative == {"arrives_last", "late_unresolved", "below_clock_error", "slow_communicators", "slow_nic",
                        "slow_rail", "slow_unlocalized", "late_by_neighbour", "slow_link_neighbour"}  # fmt: skip
    window = build("job1", [], [], WatchRules(), T0)
    with pytest.raises(KeyError, match="not_a_code"):
        window.finding(FindingKind.HANG, "node00", Status.FAIL, "not_a_code", "observed")


def row(rows: list[WatchFinding], node: str, kind: FindingKind) -> WatchFinding:
    return next(r for r in rows if r.node == node and r.kind == kind.value)


def failed(rows: list[WatchFinding]) -> list[tuple[str, str, str, int | None]]:
    return sorted((r.node, r.kind, r.reason, r.rank) for r in rows if r.status is Status.FAIL)


def healthy_run(job: Job) -> tuple[list[RankSeen], list[CollectiveSeen], int]:
    collectives = job.collectives()
    now = job.end_ns + S
    return job.reads(now - 10 * S, now - 5 * S, now - S // 2), collectives, now


def test_a_healthy_job_with_noise_and_one_outlier_names_nothing() -> None:
    """Four nodes; one collective where rank 5 arrives 400 ms late (one noisy sample) must not name node02."""
    job = Job(nodes=4, seed=1)
    ranks, collectives, now = healthy_run(job)
    outlier = next(i for i, c in enumerate(collectives) if c.seq == 70 and c.rank == 5)
    collectives[outlier] = replace(collectives[outlier], enqueue_ns=collectives[outlier].enqueue_ns + 400 * MS)
    rows = judged(job, ranks, collectives, now)
    assert failed(rows) == []
    for kind in (FindingKind.DEAD_RANK, FindingKind.HANG, FindingKind.COMPUTE_STRAGGLER):
        assert {r.status for r in rows if r.kind == kind.value} == {Status.PASS}, kind
    straggler = row(rows, "node02", FindingKind.COMPUTE_STRAGGLER)
    assert straggler.reason == "ok" and "of 120 collectives" in straggler.observed
    assert "rank 4 running, rank 5 running" == row(rows, "node02", FindingKind.DEAD_RANK).observed
    assert row(rows, "node00", FindingKind.HANG).observed.startswith("a collective completed 0.5 s before")
    # The job has one communicator: a communication straggler is not judged, on every node.
    assert {(r.status, r.reason) for r in rows if r.kind == "comm_straggler"} == {
        (Status.NOT_JUDGED, "one_communicator")
    }


def test_a_straggler_appearing_mid_window_is_named_with_its_node_rank_and_change_point() -> None:
    """Rank 5 (node02, GPU 1) computes 60 ms longer from step 20 (collective #61) on: last at half of the
    window's collectives, so only the change point bounds the run it is judged on. Its buckets are ready a
    third, two thirds and all of its compute in: 20, 40 and 60 ms late, 40 ms the median."""
    job = Job(nodes=4, slow={5: (20, 60.0)}, seed=2)
    ranks, collectives, now = healthy_run(job)
    # An earlier read saw every collective before it completed: one record per rank and collective is kept,
    # with the completion and execution time of the later read.
    earlier = [replace(c, completed=False, complete_ns=None, exec_ms=None) for c in collectives]
    rows = judged(job, ranks, earlier + collectives, now)
    assert rows == judged(job, ranks, collectives, now)
    assert failed(rows) == [("node02", "compute_straggler", "arrives_last", 5)]
    found = row(rows, "node02", FindingKind.COMPUTE_STRAGGLER)
    assert found.gpu == 1 and found.named_ns == now
    assert found.observed == "arrives last at 60 of 60 collectives, 40 ms behind its peers"
    assert "last at 60 of 60 all_reduce #61-#120 over" in found.persistence
    assert "since #61 on 0:default_pg (change point: lag" in found.persistence
    assert "it waits least" in found.evidence  # its own execution time is the shortest: the others wait for it
    assert (
        found.owner_line
        == "exclude node02: rank 5 (GPU 1) arrives last at 60 of 60 collectives, 40 ms behind its peers"
    )
    assert row(rows, "node01", FindingKind.COMPUTE_STRAGGLER).status is Status.PASS


def test_clock_offsets_between_nodes_are_corrected() -> None:
    """node01's clock runs 2 s ahead of the watcher's, node00's 1.5 s behind: uncorrected, node01 would arrive
    last at every collective. Rank 0 (node00) is the one 40 ms slow."""
    offsets = {"node00": -1500.0, "node01": 2000.0}
    healthy = Job(offsets_ms=offsets, seed=3)
    assert failed(judged(healthy, *healthy_run(healthy))) == []
    slow = Job(offsets_ms=offsets, slow={0: (0, 40.0)}, seed=3)
    rows = judged(slow, *healthy_run(slow))
    assert failed(rows) == [("node00", "compute_straggler", "arrives_last", 0)]
    assert "since" not in row(rows, "node00", FindingKind.COMPUTE_STRAGGLER).persistence  # no change point


def test_a_lag_below_the_clocks_error_does_not_name_a_node_across_nodes() -> None:
    """Rank 3 computes 15 ms longer: 10 ms late at the median bucket. With clocks known to 20 ms each, the two
    nodes' clocks can differ by 40 ms: not judged. The same job with clocks known to 1 ms names node01. The
    collectives carry no execution time (gloo): arrival is read from the enqueue times, on the nodes' clocks."""
    loose = Job(slow={3: (0, 15.0)}, errors_ms={"node00": 20.0, "node01": 20.0}, seed=4)
    ranks, collectives, now = healthy_run(loose)
    rows = judged(loose, ranks, [replace(c, exec_ms=None) for c in collectives], now)
    assert failed(rows) == []
    found = row(rows, "node01", FindingKind.COMPUTE_STRAGGLER)
    assert (found.status, found.reason, found.rank) == (Status.NOT_JUDGED, "below_clock_error", 3)
    assert "within the clocks' ±40.0 ms" in found.observed
    tight = Job(slow={3: (0, 15.0)}, errors_ms={"node00": 1.0, "node01": 1.0}, seed=4)
    ranks, collectives, now = healthy_run(tight)
    untimed = [replace(c, exec_ms=None) for c in collectives]
    # named on tight clocks; by enqueue alone, with no CPU figure from its host, compute or a late link unresolved
    assert failed(judged(tight, ranks, untimed, now)) == [("node01", "compute_straggler", "late_unresolved", 3)]


def test_a_persistent_lag_under_the_floor_is_not_named() -> None:
    """Rank 3 computes 4 ms longer: last at 95 % of the collectives, 2.1 ms late at the median, beyond the clocks'
    1 ms but under the floor (the larger of lag_min_ms, 5 ms, and 5 % of the 50 ms between collectives): too
    small a difference to name a node for. With floors of 1.5 ms and 1 % it is named."""
    job = Job(slow={3: (0, 4.0)}, seed=4)
    found = row(judged(job, *healthy_run(job)), "node01", FindingKind.COMPUTE_STRAGGLER)
    assert (found.status, found.observed) == (
        Status.PASS,
        "last at 114 of 120 collectives (95%), median lag 2.1 ms, longest streak 72; last at 8 of the 8 the job "
        "waited 5.0 ms or more at (100%), its peers waiting 0.8% of the window for it",
    )
    named = judged(job, *healthy_run(job), lag_min_ms=1.5, lag_min_share_of_interval=0.01)
    assert failed(named) == [("node01", "compute_straggler", "arrives_last", 3)]


def test_a_rank_late_often_but_not_persistently_is_named_only_at_the_collectives_the_job_waited_at() -> None:
    """Rank 3 is 40 ms late at two steps of three (a slow data loader): over every collective node01 is last at
    74 %, in runs of 17 at most. Judged on every collective alone (``held_share_min`` 1 leaves the waited ones out)
    it is not named under last_share_min (80 %); at 70 % it is; at 70 % with streak_collectives 20 it is not. At the
    collectives the job waited at it is last at all: its peers wait for it at two steps of three, and it is named."""
    job = Job(nodes=4, slow={3: (0, 40.0)}, late_at=lambda step: step % 3 != 2, seed=15)
    run = healthy_run(job)
    found = row(judged(job, *run, held_share_min=1.0), "node01", FindingKind.COMPUTE_STRAGGLER)
    assert (found.status, found.observed.split(";")[0]) == (
        Status.PASS,
        "last at 89 of 120 collectives (74%), median lag 13.7 ms, longest streak 17",
    )
    assert failed(judged(job, *run, last_share_min=0.7, held_share_min=1.0)) == [
        ("node01", "compute_straggler", "arrives_last", 3)
    ]
    assert failed(judged(job, *run, last_share_min=0.7, streak_collectives=20, held_share_min=1.0)) == []
    named = row(judged(job, *run), "node01", FindingKind.COMPUTE_STRAGGLER)
    assert named.status is Status.FAIL and named.observed.startswith("arrives last at 81 of 83 collectives the job")


def test_too_few_collectives_are_not_judged() -> None:
    job = Job(steps=3, seed=5)  # 9 collectives: under min_collectives (16)
    rows = judged(job, *healthy_run(job))
    assert {(r.status, r.reason) for r in rows if r.kind == "compute_straggler"} == {
        (Status.NOT_JUDGED, "too_few_collectives")
    }
    assert row(rows, "node00", FindingKind.COMPUTE_STRAGGLER).observed == "9 complete collective(s) in the last 120 s"


def test_a_dead_rank_names_its_node_and_gpu() -> None:
    job = Job(seed=6)
    ranks, collectives, now = healthy_run(job)
    ranks.append(job.read(1, now - S // 4, "dead"))
    rows = judged(job, ranks, collectives, now)
    assert failed(rows) == [("node00", "dead_rank", "rank_dead", 1)]
    found = row(rows, "node00", FindingKind.DEAD_RANK)
    assert found.gpu == 1
    assert "rank 1 (pid 4001) seen dead 0.2 s ago while ranks 0,2,3 ran" in found.evidence
    assert "its last collective #120" in found.evidence
    assert found.owner_line.startswith("exclude node00: rank 1 (GPU 1) died (dead) first")
    assert row(rows, "node01", FindingKind.DEAD_RANK).status is Status.PASS


def test_a_rank_its_node_no_longer_lists_is_missing() -> None:
    """node01 answered the latest read for rank 2 but not rank 3, whose records stop at #100 while its peers
    entered #120."""
    job = Job(seed=6)
    collectives = [c for c in job.collectives() if c.rank != 3 or c.seq <= 100]
    now = job.end_ns + S
    reads = job.reads(now - 10 * S) + [job.read(r, now - S) for r in (0, 1, 2)]
    rows = judged(job, reads, collectives, now)
    assert failed(rows) == [("node01", "dead_rank", "rank_missing", 3)]
    assert row(rows, "node01", FindingKind.DEAD_RANK).evidence == (
        "rank 3 not listed by node01's latest read (1.0 s ago); its last collective #100, its peers' at least #120"
    )
    reads.append(job.read(3, now - S))  # listed again: nothing is missing
    assert [f for f in failed(judged(job, reads, collectives, now)) if f[1] == "dead_rank"] == []


def _torn_down(job: Job, first_seqs: dict[int, int] | None = None) -> tuple[list[RankSeen], int]:
    """Reads at 30, 20 and 10 s before now: all running; rank 3 dead, the rest running; all dead."""
    now = T0 + 100 * S
    reads = job.reads(now - 30 * S)
    reads += [job.read(r, now - 20 * S, "dead" if r == 3 else "running") for r in job.ranks]
    reads += [job.read(r, now - 10 * S, "dead", last_enqueued_seq=(first_seqs or {}).get(r)) for r in job.ranks]
    return reads, now


def test_a_torn_down_job_names_only_the_rank_that_died_first() -> None:
    """torchrun kills the others after rank 3 (node01) dies: they are consequences, not causes."""
    job = Job(nodes=3, seed=7)
    reads, now = _torn_down(job)
    rows = judged(job, reads, [], now)
    assert failed(rows) == [("node01", "dead_rank", "rank_dead", 3)]
    assert "rank(s) 2 of this node died after it" in row(rows, "node01", FindingKind.DEAD_RANK).evidence
    for node in ("node00", "node02"):
        assert (row(rows, node, FindingKind.DEAD_RANK).status, row(rows, node, FindingKind.DEAD_RANK).reason) == (
            Status.PASS,
            "torn_down",
        )


def test_deaths_seen_in_one_round_are_ordered_by_the_collectives_they_reached() -> None:
    """Every rank first seen dead in one read round: the one whose last collective is behind died first."""
    job = Job(nodes=3, seed=8)
    now = T0 + 100 * S
    reads = job.reads(now - 30 * S)
    seqs = {r: 418 for r in job.ranks} | {4: 417}
    reads += [job.read(r, now - 10 * S, "dead", last_enqueued_seq=seqs[r]) for r in job.ranks]
    assert failed(judged(job, reads, [], now)) == [("node02", "dead_rank", "rank_dead", 4)]
    same = {r: 418 for r in job.ranks}  # nothing tells them apart: every first death is named
    reads = job.reads(now - 30 * S) + [job.read(r, now - 10 * S, "dead", last_enqueued_seq=same[r]) for r in job.ranks]
    assert {f[0] for f in failed(judged(job, reads, [], now))} == {"node00", "node01", "node02"}


def _hung(job: Job, read_at_s: tuple[float, ...], **latest: object) -> tuple[list[RankSeen], list[CollectiveSeen], int]:
    """A job whose ranks 0, 1 and 3 entered all_reduce #61 after #60 completed; rank 2 did not. Reads at
    ``read_at_s`` after the last completion; the last read of rank 2 takes ``latest``."""
    collectives = job.collectives()
    entered = [
        replace(c, seq=61, enqueue_ns=c.enqueue_ns + 300 * MS, completed=False, complete_ns=None, exec_ms=None)
        for c in collectives
        if c.seq == 60 and c.rank != 2
    ]
    reads = []
    for i, after_s in enumerate(read_at_s):
        at = job.end_ns + int(after_s * S)
        for rank in job.ranks:
            said: dict[str, object] = {"last_enqueued_seq": 60 if rank == 2 else 61, "last_completed_seq": 60}
            state = "running"
            if rank == 2 and i == len(read_at_s) - 1:
                said |= latest
                state = str(said.pop("state", "running"))
            reads.append(job.read(rank, at, state, **said))
    return reads, collectives + entered, job.end_ns + int(read_at_s[-1] * S) + S


def test_a_hang_names_the_stopped_rank_behind_the_wavefront() -> None:
    job = Job(steps=20, seed=9)
    reads, collectives, now = _hung(job, (10, 100, 200), state="stopped")
    rows = judged(job, reads, collectives, now)
    assert failed(rows) == [("node01", "hang", "rank_stopped", 2)]
    found = row(rows, "node01", FindingKind.HANG)
    assert found.evidence == "ranks 0,1,3 entered all_reduce #61; rank 2 (node01) last at #60, stopped"
    assert found.persistence.startswith("no collective completed for 200 s: last progress 201.0 s ago")
    assert found.owner_line.startswith("exclude node01: rank 2 (GPU 0) holds the job: last at #60, stopped, while")
    assert (row(rows, "node00", FindingKind.HANG).status, row(rows, "node00", FindingKind.HANG).reason) == (
        Status.PASS,
        "waiting",
    )


def test_a_stall_shorter_than_hang_after_names_nothing() -> None:
    """The same stopped rank, 60 s into the stall: the job may yet go on; nothing is named."""
    job = Job(steps=20, seed=9)
    reads, collectives, now = _hung(job, (10, 60), state="stopped")
    rows = judged(job, reads, collectives, now)
    assert failed(rows) == []
    assert row(rows, "node01", FindingKind.HANG).observed == "a collective completed 60.0 s before the latest read"


def test_a_hang_names_the_rank_whose_flight_recorder_did_not_answer() -> None:
    job = Job(steps=20, seed=10)
    reads, collectives, now = _hung(job, (10, 100, 200), answered=False, last_enqueued_seq=None)
    rows = judged(job, reads, collectives, now)
    assert failed(rows) == [("node01", "hang", "hang_wavefront", 2)]
    assert (
        "rank 2 (node01) last at #60, its Flight Recorder did not answer"
        in row(rows, "node01", FindingKind.HANG).evidence
    )


def _groups(slow: tuple[str, ...], **more: tuple[int, ...]) -> Job:
    """Four nodes of two ranks; four communicators of two nodes each (and ``more``); ``slow`` ones take 25 ms,
    the rest 10."""
    groups = {"1:pair_a": (0, 2), "2:pair_b": (4, 6), "3:pair_c": (1, 5), "4:pair_d": (3, 7)} | more
    timing = {name: 25.0 if name in slow else 10.0 for name in groups}
    return Job(nodes=4, groups=groups, group_exec_ms=timing, seed=11)


def test_the_node_common_to_every_slow_communicator_is_named() -> None:
    """node01 is in pair_a and pair_d, both slow; node00 is also in pair_a but in the fast pair_c too."""
    job = _groups(slow=("1:pair_a", "4:pair_d"))
    rows = judged(job, *healthy_run(job))
    assert failed(rows) == [("node01", "comm_straggler", "slow_communicators", None)]
    found = row(rows, "node01", FindingKind.COMM_STRAGGLER)
    assert found.observed.startswith("its communicators 1:pair_a, 4:pair_d run 2.5× slower than their peers")
    assert found.evidence.startswith(
        "slow: 1:pair_a (node00,node01) 25.2 ms, 2.47× its peers, 4:pair_d (node01,node03)"
    )
    assert found.persistence.startswith("medians of 40 to 40 collectives per communicator")
    assert found.owner_line.startswith("exclude node01: its communicators 1:pair_a, 4:pair_d")
    assert {row(rows, n, FindingKind.COMM_STRAGGLER).status for n in ("node00", "node02", "node03")} == {Status.PASS}


def test_healthy_communicators_pass_and_unlocalized_slowness_names_nothing() -> None:
    job = _groups(slow=())
    rows = judged(job, *healthy_run(job))
    assert failed(rows) == [] and {r.status for r in rows} == {Status.PASS}
    # No node is in both, and a fast pair across nodes on GPU 0 clears the rail: the fabric, not one element of it
    job = _groups(slow=("1:pair_a", "2:pair_b"), **{"5:pair_e": (0, 4)})
    rows = judged(job, *healthy_run(job))
    assert failed(rows) == []
    assert {r.reason for r in rows if r.kind == "comm_straggler"} == {"slow_unlocalized"}
    # node01 is in both slow communicators, but also in a fast one (with node02): its own links are not the cause
    job = _groups(slow=("1:pair_a", "4:pair_d"), **{"5:pair_e": (2, 4)})
    rows = judged(job, *healthy_run(job))
    assert failed(rows) == []
    assert row(rows, "node01", FindingKind.COMM_STRAGGLER).reason == "slow_unlocalized"


def _rails(slow: tuple[str, ...], nvlink_ms: float = 2.0) -> Job:
    """Four nodes of two GPUs; across nodes, two pairs a rail and GPU index (rail 0: GPU 0 of each node, rail 1:
    GPU 1); within each node a pair over NVLink, faster than any pair across nodes. ``slow`` ones take 25 ms."""
    across = {"1:r0_ab": (0, 2), "2:r0_cd": (4, 6), "3:r0_ac": (0, 4), "4:r0_bd": (2, 6)}
    across |= {"5:r1_ab": (1, 3), "6:r1_cd": (5, 7), "7:r1_ac": (1, 5), "8:r1_bd": (3, 7)}
    within = {f"{9 + n}:nvl_{n}": (2 * n, 2 * n + 1) for n in range(4)}
    timing = {name: 10.0 for name in across} | dict.fromkeys(within, nvlink_ms) | dict.fromkeys(slow, 25.0)
    return Job(nodes=4, groups=across | within, group_exec_ms=timing, seed=5)


def test_the_nic_of_one_gpu_is_named_where_the_nodes_other_gpus_talk_across_nodes_at_full_speed() -> None:
    """node01's GPU 0 path is slow: its two rail-0 pairs are slow, its rail-1 pairs and NVLink pair are fast, so
    the node as a whole is cleared and its GPU 0's NIC is named, with the rank on it."""
    job = _rails(slow=("1:r0_ab", "4:r0_bd"))
    rows = judged(job, *healthy_run(job))
    assert failed(rows) == [("node01", "comm_straggler", "slow_nic", 2)]
    found = row(rows, "node01", FindingKind.COMM_STRAGGLER)
    assert found.gpu == 0
    assert found.observed.startswith(
        "the network path of its GPU 0 (the NIC paired with it) is in every slow communicator (1:r0_ab, 4:r0_bd, 2.5×"
    )
    assert (
        ", 2.5× their peers' execution time) and in no fast one across nodes; its other communicators" in found.observed
    )
    assert found.observed.endswith("its other communicators across nodes (5:r1_ab, 8:r1_bd) are fast")
    assert found.owner_line.startswith("exclude node01: the network path of its GPU 0")
    # its peers in the slow pairs are cleared by their own fast pairs on rail 0
    assert row(rows, "node00", FindingKind.COMM_STRAGGLER).observed.startswith(
        "in slow communicator(s) 1:r0_ab with node01 GPU 0, and in fast one(s) 3:r0_ac"
    )
    assert {row(rows, n, FindingKind.COMM_STRAGGLER).status for n in ("node00", "node02", "node03")} == {Status.PASS}


def test_a_node_is_cleared_only_by_fast_groups_of_the_reach_of_its_slow_ones() -> None:
    """A slow NVLink pair names its node though the node's pairs across nodes are fast; every pair across nodes of
    a node slow (all its NICs) names the node though its NVLink pair is fast."""
    job = _rails(slow=("10:nvl_1",))
    rows = judged(job, *healthy_run(job))
    assert failed(rows) == [("node01", "comm_straggler", "slow_communicators", None)]
    assert row(rows, "node01", FindingKind.COMM_STRAGGLER).observed.startswith(
        "its communicators 10:nvl_1 run 12.0× slower than their peers (execution time), and no fast one within a node"
    )
    job = _rails(slow=("1:r0_ab", "4:r0_bd", "5:r1_ab", "8:r1_bd"))
    rows = judged(job, *healthy_run(job))
    assert failed(rows) == [("node01", "comm_straggler", "slow_communicators", None)]
    assert row(rows, "node01", FindingKind.COMM_STRAGGLER).observed.endswith("and no fast one across nodes includes it")


def test_a_gpu_the_reads_do_not_give_is_never_named_as_a_port_or_a_rail() -> None:
    job = _rails(slow=("1:r0_ab", "4:r0_bd"))
    ranks, collectives, now = healthy_run(job)
    rows = judged(job, [replace(r, gpu=None) for r in ranks], [replace(c, gpu=None) for c in collectives], now)
    assert failed(rows) == []
    assert {r.reason for r in rows if r.kind == "comm_straggler" and r.node in ("node00", "node01", "node03")} == {
        "slow_unlocalized"
    }
    assert not any("GPU None" in r.observed for r in rows)
    # records without their GPU (a read that missed the rank's file) take it from the rank's reads
    missing = [replace(c, gpu=None) if c.rank == 2 and c.seq % 2 else c for c in collectives]
    rows = judged(job, ranks, missing, now)
    assert failed(rows) == [("node01", "comm_straggler", "slow_nic", 2)]
    assert row(rows, "node01", FindingKind.COMM_STRAGGLER).gpu == 0


def test_a_group_of_another_shape_is_not_held_against_pairs() -> None:
    """Every rank in one group at 30 ms beside pairs at 10 ms: it has no peer of its shape, so nothing is slow."""
    job = _rails(slow=())
    job.groups["13:world"] = tuple(job.ranks)
    job.group_exec_ms["13:world"] = 30.0
    rows = judged(job, *healthy_run(job))
    assert {(r.status, r.reason) for r in rows if r.kind == "comm_straggler"} == {(Status.PASS, "ok")}
    assert all("13:world" not in r.evidence for r in rows if r.kind == "comm_straggler")


def test_a_slow_rail_is_said_on_its_nodes_and_names_none() -> None:
    job = _rails(slow=("1:r0_ab", "2:r0_cd", "3:r0_ac", "4:r0_bd"))
    rows = judged(job, *healthy_run(job))
    assert failed(rows) == []
    comm = [r for r in rows if r.kind == "comm_straggler"]
    assert {(r.status, r.reason) for r in comm} == {(Status.NOT_JUDGED, "slow_rail")}
    assert all(
        r.observed.endswith("no fast one across nodes entirely on GPU 0 does: rail 0, not this node") for r in comm
    )
    # one pair across nodes on GPU 0 at full speed clears the rail: no element is common to the slow ones
    job = _rails(slow=("1:r0_ab", "2:r0_cd", "4:r0_bd"))
    rows = judged(job, *healthy_run(job))
    assert {r.reason for r in rows if r.kind == "comm_straggler"} == {"slow_unlocalized"}


def test_groups_within_a_node_are_not_held_against_groups_across_nodes() -> None:
    """Four NVLink pairs at 1 ms beside two network pairs at 10 ms of the same operation and size: a healthy job,
    not two communicators ten times slower than the median of their peers."""
    job = _rails(slow=(), nvlink_ms=1.0)
    job.groups = {name: ranks for name, ranks in job.groups.items() if "nvl" in name or name in ("1:r0_ab", "2:r0_cd")}
    rows = judged(job, *healthy_run(job))
    comm = [r for r in rows if r.kind == "comm_straggler"]
    assert {(r.status, r.reason) for r in comm} == {(Status.PASS, "ok")}
    worst = [float(r.observed.removeprefix("its communicators run at ").split("×")[0]) for r in comm]
    assert max(worst) < 1.1, [r.observed for r in comm]


def test_a_straggler_in_a_job_named_once_per_kind_on_every_node() -> None:
    """Several faults at once still give one row per node and kind; the rules say their units."""
    job = Job(nodes=3, slow={1: (0, 50.0)}, seed=12)
    ranks, collectives, now = healthy_run(job)
    ranks.append(job.read(5, now - S // 4, "zombie"))
    rows = judged(job, ranks, collectives, now)
    assert failed(rows) == [("node00", "compute_straggler", "arrives_last", 1), ("node02", "dead_rank", "rank_dead", 5)]
    with pytest.raises(ValueError, match="last_share_min"):
        WatchRules(last_share_min=1.5)
    with pytest.raises(ValueError, match="a window of 15 s can never hold a straggler, which must persist 20 s"):
        WatchRules(window_s=15.0)


def test_a_straggler_must_persist_for_persist_min_s_not_only_over_many_collectives() -> None:
    """The same straggler as above: its 60 collectives span a few seconds of the job, so a rule asking for a
    minute of persistence names nothing yet, and one asking for a second names it."""
    job = Job(nodes=4, slow={5: (20, 60.0)}, seed=2)
    ranks, collectives, now = healthy_run(job)
    assert failed(judged(job, ranks, collectives, now, persist_min_s=60.0)) == []
    assert failed(judged(job, ranks, collectives, now, persist_min_s=1.0)) == [
        ("node02", "compute_straggler", "arrives_last", 5)
    ]


def _on_device(collectives: list[CollectiveSeen]) -> list[CollectiveSeen]:
    """The same arrivals as a GPU job shows them: every rank queues its launch at once (the CPU runs ahead), and
    each rank's execution time holds its wait for the last one to arrive."""
    first: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    for c in collectives:
        key = (c.communicator, c.seq)
        first[key], last[key] = min(first.get(key, c.enqueue_ns), c.enqueue_ns), max(last.get(key, 0), c.enqueue_ns)
    return [
        replace(c, enqueue_ns=first[(c.communicator, c.seq)],
                exec_ms=2.0 + (last[(c.communicator, c.seq)] - c.enqueue_ns) / MS)
        for c in collectives
    ]  # fmt: skip


def test_a_gpu_straggler_is_named_by_who_waits_least_without_clocks() -> None:
    """Launches queued at once on every rank say nothing; execution times say who arrived last, and two of them
    are compared without any clock: node clocks known only to ±500 ms do not stop the naming."""
    job = Job(nodes=4, slow={5: (20, 60.0)}, seed=2)
    ranks, collectives, now = healthy_run(job)
    blurred = [replace(r, clock_error_ns=500 * MS) for r in ranks]
    timed = _on_device(collectives)
    assert failed(judged(job, blurred, timed, now)) == [("node02", "compute_straggler", "arrives_last", 5)]
    untimed = [replace(c, exec_ms=None) for c in timed]
    assert failed(judged(job, blurred, untimed, now)) == []


def _streamed(job: Job, comm_ms: float = 30.0) -> list[CollectiveSeen]:
    """A GPU job bound by its communication: backward readies a gradient bucket every 5 ms, each bucket's all_reduce
    takes ``comm_ms`` and they queue on one stream, so every bucket but the first starts when the one before it
    ends, on every rank at once. A rank slow before its backward (``slow``) is late at each step's first bucket
    only; the CPU queues each launch when its bucket is ready (the enqueue says nothing of the GPU)."""
    noise, rows, start = random.Random(job.seed), [], float(T0)
    for step in range(job.steps):
        forward = {r: job.compute_ms + job._extra(r, step) + noise.gauss(0, job.noise_ms) for r in job.ranks}
        free = dict.fromkeys(job.ranks, 0.0)
        for bucket in range(job.buckets):
            ready = {r: start + (forward[r] + 5.0 * (bucket + 1)) * MS for r in job.ranks}
            begin = {r: max(ready[r], free[r]) + noise.gauss(0, 0.05) * MS for r in job.ranks}
            done = max(begin.values()) + comm_ms * MS
            seq = 1 + step * job.buckets + bucket
            records = [job.record(r, DEFAULT, "all_reduce", seq, ready[r], done, 25 << 20) for r in job.ranks]
            rows += [replace(c, exec_ms=(done - begin[c.rank]) / MS) for c in records]
            free = dict.fromkeys(job.ranks, done)
        start = done + 10 * MS
    job.end_ns = int(start)
    return rows


def test_a_gpu_straggler_late_only_where_the_stream_is_idle_is_named_at_the_collectives_the_job_waited_at() -> None:
    """Rank 5 runs its forward pass 40 ms longer: late at each step's first bucket (1 of 8), on time at the rest,
    which queue behind the stream. Over every collective it is last at too few to name; at the collectives the job
    waited at, at every one, its peers waiting about 9 % of the job's time for it. The same job healthy names
    nothing."""
    job = Job(nodes=4, steps=60, buckets=8, slow={5: (0, 40.0)}, seed=3)
    collectives = _streamed(job)
    now = job.end_ns + S
    rows = judged(job, job.reads(now - 10 * S, now - S), collectives, now)
    assert failed(rows) == [("node02", "compute_straggler", "arrives_last", 5)]
    straggler = row(rows, "node02", FindingKind.COMPUTE_STRAGGLER)
    assert straggler.observed.startswith("arrives last at 60 of 60 collectives the job waited 5.0 ms or more at")
    assert straggler.observed.endswith("its peers waited 9% of the window for it")  # 40 ms of each ~440-ms step
    assert "it waits least" in straggler.evidence
    healthy = Job(nodes=4, steps=60, buckets=8, seed=3)
    collectives = _streamed(healthy)
    now = healthy.end_ns + S
    assert failed(judged(healthy, healthy.reads(now - 10 * S, now - S), collectives, now)) == []


def test_a_rank_late_only_now_and_then_is_not_named_unless_its_peers_wait_long_enough_for_it() -> None:
    """Rank 2 is 10 ms late at the first bucket of every tenth step: last at every collective the job waited at,
    in a streak, but its peers wait for it well under 1 % of the time, so the job loses nothing worth a drain;
    a rule asking for 0.1 % names it."""
    job = Job(nodes=2, steps=200, buckets=8, slow={2: (0, 10.0)}, late_at=lambda step: step % 10 == 0, seed=4)
    collectives = _streamed(job)
    now = job.end_ns + S
    reads = job.reads(now - 10 * S, now - S)
    rare = row(judged(job, reads, collectives, now), "node01", FindingKind.COMPUTE_STRAGGLER)
    assert rare.status is Status.PASS
    assert "last at 20 of the 20 the job waited 5.0 ms or more at (100%)" in rare.observed
    assert failed(judged(job, reads, collectives, now, held_share_min=0.001)) == [
        ("node01", "compute_straggler", "arrives_last", 2)
    ]


def _captured(name: str) -> tuple[list[RankSeen], list[CollectiveSeen], int]:
    """A watch's rows as a real run wrote them (tests/data/watch/jobs/NAME), and the time of its latest read."""

    def records(table: str) -> list[dict[str, object]]:
        frame = pd.read_parquet(JOBS / name / f"{table}.parquet")
        return [
            {str(k): v for k, v in r.items()}
            for r in frame.astype(object).where(frame.notna(), None).to_dict("records")
        ]

    ranks = [RankSeen.from_record(r) for r in records("watch_ranks")]
    collectives = [CollectiveSeen.from_record(r) for r in records("watch_collectives")]
    return ranks, collectives, max(r.read_ns - r.clock_offset_ns for r in ranks)


def test_a_real_gemm_co_tenant_on_one_gpu_of_four_is_named_at_the_collectives_the_job_waited_at() -> None:
    """4 x H200 split into two NCCL "hosts", DDP over NCCL with timing, a bf16 GEMM loop on GPU 3 (half-b): rank 3
    is 145 ms late at each step's first bucket and on time at the 18 queued behind it, so over every collective
    half-b is last at 73 % in streaks of 20 and nothing was named on the machine; at the 106 collectives the job
    waited 5 ms or more at, rank 3 is last at every one, its peers waiting a quarter of the window for it."""
    ranks, collectives, now = _captured("h200x4_cotenant")
    rows = localize(ranks, collectives, WatchRules(window_s=30.0), now)
    assert failed(rows) == [("half-b", "compute_straggler", "arrives_last", 3)]
    named = row(rows, "half-b", FindingKind.COMPUTE_STRAGGLER)
    assert named.gpu == 3 and named.observed == (
        "arrives last at 106 of 106 collectives the job waited 5.0 ms or more at, 10 ms behind its peers; its peers "
        "waited 26% of the window for it"
    )
    assert named.evidence.endswith("its own execution 12.2 ms (median), its peers' 24.3 ms: it waits least")
    every = localize(ranks, collectives, WatchRules(window_s=30.0, held_share_min=1.0), now)
    assert failed(every) == []  # judged on every collective alone, as the machine's watch did


def test_a_real_healthy_job_watched_for_twenty_minutes_names_nothing() -> None:
    """The test-bed's two-node gloo job at the end of its 20-minute healthy watch: each node last at about half
    of the collectives and of those the job waited at, so nothing is named whatever the window."""
    ranks, collectives, now = _captured("testbed_gloo_healthy")
    for window_s in (30.0, 60.0, 120.0):
        assert failed(localize(ranks, collectives, WatchRules(window_s=window_s), now)) == []


def test_an_nccl_job_without_execution_times_is_not_passed_on_its_enqueue_times() -> None:
    """GPU collectives whose execution times NCCL did not give: the enqueue times show nobody late, which says
    nothing of a slow GPU, so no node passes; a host-side straggler (its CPU late, its enqueue late) is still
    named from them."""
    job = Job(nodes=4, slow={5: (20, 60.0)}, seed=2)
    ranks, collectives, now = healthy_run(job)
    untimed = [replace(c, exec_ms=None, backend="nccl") for c in _on_device(collectives)]
    rows = judged(job, ranks, untimed, now)
    compute = [r for r in rows if r.kind == FindingKind.COMPUTE_STRAGGLER.value]
    assert {(r.status, r.reason) for r in compute} == {(Status.NOT_JUDGED, "no_device_time")}
    assert "a slow GPU not (NCCL gave no execution times)" in compute[0].observed
    late_host = [replace(c, exec_ms=None, backend="nccl") for c in collectives]
    assert failed(judged(job, ranks, late_host, now)) == [("node02", "compute_straggler", "arrives_last", 5)]


def test_a_lag_the_clocks_may_have_made_does_not_name_a_node_at_the_collectives_the_job_waited_at() -> None:
    """A healthy job timed by enqueue only, node01's clock 12 ms off what its reads measured (each node's offset
    known to ±3 ms): node01 is last everywhere, about 6 ms behind the median, no more than the ±6 ms the two clocks
    allow. Its collectives picked for waiting 5 ms or more would seem later still; they are picked beyond the
    clocks' uncertainty too, so nothing is named. With clocks known to ±0.5 ms, the same lag names it."""
    job = Job(nodes=2, per_node=1, steps=80, compute_ms=60.0, seed=5, errors_ms={"node00": 3.0, "node01": 3.0})
    ranks, collectives, now = healthy_run(job)
    skew = {"node00": 0, "node01": 12 * MS}
    skewed = [replace(c, exec_ms=None, enqueue_ns=c.enqueue_ns + skew[c.node]) for c in collectives]
    found = row(judged(job, ranks, skewed, now), "node01", FindingKind.COMPUTE_STRAGGLER)
    assert (found.status, found.reason) == (Status.NOT_JUDGED, "below_clock_error")
    tight = [replace(r, clock_error_ns=MS // 2) for r in ranks]
    # named on tight clocks; by enqueue alone, with no CPU figure from its host, compute or a late link unresolved
    assert failed(judged(job, tight, skewed, now)) == [("node01", "compute_straggler", "late_unresolved", 1)]
