"""A hang, and the ranks it waits for.

A job hangs when no collective completes: between the last sign of progress (a record's completion time, a
rank's completed sequence number rising between reads) and the latest read, ``hang_after_s`` passed. Measured up
to the latest read, not to now: a watcher that lost its nodes has no evidence that the job stood still.

The wavefront names the node. On the default communicator every healthy rank enters the collective the job is
blocked in (NCCL launches it and the rank waits there); the ranks that never reached it are behind: their last
collective is lower than the highest any rank entered, or they are stopped (state T: they take part in nothing),
or their Flight Recorder did not answer (a rank stuck in Python with the interpreter lock held cannot). A rank
that did not answer but was last seen in the newest collective is taken as waiting where other ranks are behind
for certain: its silence alone must not name a node beside the one the job waits for."""

from __future__ import annotations

from dataclasses import dataclass

from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge.ras_said import ras_gone, ras_line
from cluster_accept.watch.judge.window import NS_PER_S, Window, ago, last_entered, op_of, ranks_said
from cluster_accept.watch.words import FindingKind, RankState, WatchFinding


@dataclass(frozen=True)
class Stall:
    """The last sign that collectives complete, and the latest read that saw nothing newer."""

    last_progress_ns: int
    latest_read_ns: int
    basis: str  # what showed the last progress
    reads_since: int  # reads of one rank after it, at most: how many times nothing newer was seen

    @property
    def stalled_s(self) -> float:
        return max(0, self.latest_read_ns - self.last_progress_ns) / NS_PER_S


def stall(window: Window) -> Stall | None:
    """The stall up to the latest read; None where no row says whether collectives complete."""
    frame = window.collectives
    events: list[tuple[int, str]] = []
    if frame["done_ns"].notna().any():
        events.append((int(frame["done_ns"].max()), "the newest completion of a record"))
    completed = frame[frame["completed"].astype(bool)]
    if not completed.empty:
        events.append((int(completed["arrival_ns"].max()), "the arrival of the newest completed record"))
    signal = bool(events)
    before: dict[int, int] = {}
    for read in window.reads:
        if read.last_completed_seq is None:
            continue
        signal = True
        if read.last_completed_seq > before.get(read.rank, read.last_completed_seq):
            events.append(
                (window.seen_ns(read), f"the read that saw rank {read.rank} complete #{read.last_completed_seq}")
            )
        before[read.rank] = max(before.get(read.rank, read.last_completed_seq), read.last_completed_seq)
    if not signal:
        return None
    if window.reads and not events:  # a completed sequence number that never rose: progress was before the first
        events.append((window.seen_ns(window.reads[0]), "at or before the first read"))
    latest = max((window.seen_ns(r) for r in window.reads), default=window.now_ns)
    progress, basis = max(events)
    counts: dict[int, int] = {}
    for read in window.reads:
        if window.seen_ns(read) > progress:
            counts[read.rank] = counts.get(read.rank, 0) + 1
    return Stall(progress, latest, basis, max(counts.values(), default=0))


@dataclass(frozen=True)
class Wavefront:
    """The newest collective any rank entered on the default communicator, who waits in it, who is missing."""

    seq: int | None
    waiting: list[int]
    missing: dict[int, tuple[str, str]]  # rank -> (reason, what was seen: 'last at #417, stopped')


def wavefront(window: Window) -> Wavefront:
    """Who the job waits for: stopped ranks, ranks behind the newest collective, silent ranks (see the module)."""
    entered = last_entered(window)
    known = [s for s in entered.values() if s is not None]
    newest = max(known) if known else None
    stopped = {r for r, read in window.latest.items() if read.state == RankState.STOPPED}
    silent = {r for r, read in window.latest.items() if not read.answered}
    behind = {r for r, s in entered.items() if newest is not None and (s is None or s < newest)}
    certain = (behind - silent) | stopped
    missing: dict[int, tuple[str, str]] = {}
    for rank in window.ranks:
        last = f"#{entered[rank]}" if entered.get(rank) is not None else "no collective"
        if rank in stopped:
            missing[rank] = ("rank_stopped", f"last at {last}, stopped")
        elif rank in behind and rank not in silent:
            missing[rank] = ("hang_wavefront", f"last at {last}")
        elif rank in silent and (rank in behind or not certain):
            missing[rank] = ("hang_wavefront", f"last at {last}, its Flight Recorder did not answer")
    waiting = sorted(r for r, s in entered.items() if newest is not None and s == newest and r not in missing)
    return Wavefront(newest, waiting, missing)


def _held(window: Window, front: Wavefront) -> Wavefront:
    """The wavefront, or where every rank entered the newest collective, the ranks whose process NCCL's RAS finds
    not answering (unresponsive or dead): the wait is theirs."""
    gone = ras_gone(window)
    if front.missing or not gone:
        return front
    said = "in the collective with the others, its process {} {} by NCCL's RAS"
    held = {rank: ("ras_unresponsive", said.format(s.pid, s.state)) for rank, s in gone.items()}
    return Wavefront(front.seq, [r for r in front.waiting if r not in gone], held)


def _all(window: Window, status: Status, reason: str, observed: str, evidence: str = "") -> list[WatchFinding]:
    expected = f"a collective completes at least every {window.rules.hang_after_s:g} s"
    return [window.finding(FindingKind.HANG, n, status, reason, observed, expected, evidence) for n in window.nodes]


def judge_hang(window: Window, first_dead: set[int]) -> list[WatchFinding]:
    """One ``hang`` row per node."""
    states = {read.state for read in window.latest.values()}
    if states == {RankState.EXITED}:
        return _all(window, Status.PASS, "ok", "every rank exited: the job ended")
    if first_dead:  # the job cannot go on without it: the death names the node
        said = f"rank(s) {ranks_said(first_dead)} died: the job cannot go on"
        return _all(window, Status.NOT_JUDGED, "after_death", said)
    found = stall(window)
    if found is None:
        return _all(window, Status.NOT_JUDGED, "no_progress_signal", "no completion seen by any signal")
    if found.stalled_s < window.rules.hang_after_s:
        said = f"a collective completed {found.stalled_s:.1f} s before the latest read"
        return _all(window, Status.PASS, "ok", said, f"last progress: {found.basis}")
    stalled = f"no collective completed for {found.stalled_s:.0f} s"
    front = _held(window, wavefront(window))
    op = op_of(window, front.seq) if front.seq is not None else "collective"
    entered = f"ranks {ranks_said(front.waiting)} entered {op} #{front.seq}"
    said_by_ras = [line for r in sorted(set(front.missing) | set(ras_gone(window))) if (line := ras_line(window, r))]
    evidence = "; ".join(
        [
            entered,
            *(f"rank {r} ({window.node_of(r)}) {said}" for r, (_, said) in sorted(front.missing.items())),
            *said_by_ras,
        ]
    )
    persistence = (
        f"{stalled}: last progress {ago(window, found.last_progress_ns)} ({found.basis}); "
        f"{found.reads_since} read(s) since saw none, the latest {ago(window, found.latest_read_ns)}"
    )
    if not front.missing:
        return _all(window, Status.WARN, "hang_unlocalized", f"{stalled}; every rank entered {op} #{front.seq}")
    rows = []
    expected = f"a collective completes at least every {window.rules.hang_after_s:g} s"
    for node in window.nodes:
        named = sorted(r for r in front.missing if window.node_of(r) == node)
        if not named:
            observed = f"its ranks wait in {op} #{front.seq}"
            row = window.finding(
                FindingKind.HANG, node, Status.PASS, "waiting", observed, expected, evidence, persistence
            )
        else:
            reasons = {front.missing[r][0] for r in named}
            reason = next(r for r in ("rank_stopped", "hang_wavefront", "ras_unresponsive") if r in reasons)
            rank = min(r for r in named if front.missing[r][0] == reason)
            observed = f"holds the job: {front.missing[rank][1]}, while {entered}; {stalled}"
            row = window.finding(
                FindingKind.HANG, node, Status.FAIL, reason, observed, expected, evidence, persistence, rank
            )
        rows.append(row)
    return rows
