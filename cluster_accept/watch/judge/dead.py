"""Dead or missing ranks, and the node behind the first of them.

A rank whose latest read says its process is gone (DEAD) or a zombie has failed the job. When one rank dies the
launcher (torchrun, srun) kills the rest, so a torn-down job shows every rank dead: only the rank seen dead
*first*, while others still ran, is the cause; ranks seen running in the round it was first seen dead, and dead
only later, are consequences and are not named. Inside one round of reads the order cannot be told from the
reads; the collectives can: the rank that died first stopped entering them first, so among ranks first seen dead
in one round, those whose last collective is behind the others' are named.

A rank its node no longer lists, while the node answered for its other ranks and its peers entered collectives
it did not, vanished without being seen dead: it is named as missing."""

from __future__ import annotations

from dataclasses import dataclass

from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge.ras_said import ras_dead_unread, ras_line
from cluster_accept.watch.judge.window import (
    ALIVE_STATES,
    DEAD_STATES,
    NS_PER_S,
    Window,
    ago,
    last_entered,
    ranks_said,
)
from cluster_accept.watch.words import FindingKind, RankSeen, RankState, WatchFinding


@dataclass(frozen=True)
class Death:
    """A rank whose latest read says it is dead: when it was first seen so, and last seen alive."""

    rank: int
    state: RankState
    pid: int
    first_dead_ns: int
    last_alive_ns: int | None
    dead_reads: int


def deaths(window: Window) -> dict[int, Death]:
    """The ranks whose latest read is DEAD or ZOMBIE."""
    by_rank: dict[int, list[RankSeen]] = {}
    for read in window.reads:
        by_rank.setdefault(read.rank, []).append(read)
    found = {}
    for rank, reads in by_rank.items():
        if reads[-1].state not in DEAD_STATES:
            continue
        alive = [window.seen_ns(r) for r in reads if r.state in ALIVE_STATES]
        last_alive = max(alive) if alive else None
        dead = [window.seen_ns(r) for r in reads if r.state in DEAD_STATES and (last_alive or 0) < window.seen_ns(r)]
        found[rank] = Death(rank, reads[-1].state, reads[-1].pid, min(dead), last_alive, len(dead))
    return found


def _after(death: Death, earlier: Death, tolerance_ns: int) -> bool:
    """Whether ``death`` came after ``earlier``: it was seen alive in the round ``earlier`` was first seen dead
    (or later), and itself first seen dead a round after."""
    if death.last_alive_ns is None:
        return False
    later = death.first_dead_ns - earlier.first_dead_ns > tolerance_ns
    return later and death.last_alive_ns >= earlier.first_dead_ns - tolerance_ns


def first_deaths(window: Window, found: dict[int, Death]) -> set[int]:
    """The deaths no other death preceded; among several (one round of reads), those whose last collective on
    the default communicator is behind the others'."""
    tolerance = int(window.rules.same_read_s * NS_PER_S)
    first = {r for r, d in found.items() if not any(_after(d, e, tolerance) for e in found.values() if e is not d)}
    if len(first) < 2:
        return first
    entered = last_entered(window)
    seqs = {r: entered.get(r) for r in first}
    known = [s for s in seqs.values() if s is not None]
    if len(known) < len(seqs) or min(known) == max(known):
        return first
    return {r for r, s in seqs.items() if s == min(known)}


def missing(window: Window, found: dict[int, Death]) -> dict[int, str]:
    """Ranks its node did not list at its latest read (which listed others), behind every live peer: rank -> why."""
    tolerance = int(window.rules.same_read_s * NS_PER_S)
    entered = last_entered(window)
    out = {}
    for rank in window.ranks:
        node = window.node_of(rank)
        node_reads = [window.seen_ns(r) for r in window.latest.values() if r.node == node]
        if rank in found or not node_reads:
            continue
        if rank in window.latest and window.seen_ns(window.latest[rank]) >= max(node_reads) - tolerance:
            continue
        mine = entered.get(rank)
        others = [s for r, s in entered.items() if r != rank and r not in found and s is not None]
        if others and (mine is None or min(others) > mine):
            last = f"#{mine}" if mine is not None else "none"
            out[rank] = (
                f"rank {rank} not listed by {node}'s latest read ({ago(window, max(node_reads))}); its last "
                f"collective {last}, its peers' at least #{min(others)}"
            )
    return out


def _alive_at(window: Window, at_ns: int) -> list[int]:
    """Ranks seen alive by a read in the round of ``at_ns``."""
    tolerance = int(window.rules.same_read_s * NS_PER_S)
    return sorted(
        {r.rank for r in window.reads if r.state in ALIVE_STATES and abs(window.seen_ns(r) - at_ns) <= tolerance}
    )


def _dead_said(window: Window, death: Death, first: set[int]) -> tuple[str, str]:
    """(evidence, persistence) of a death."""
    alive = [r for r in _alive_at(window, death.first_dead_ns) if r != death.rank]
    seq = last_entered(window).get(death.rank)
    evidence = f"rank {death.rank} (pid {death.pid}) seen {death.state} {ago(window, death.first_dead_ns)}"
    evidence += f" while ranks {ranks_said(alive)} ran" if alive else " (no rank seen running in that round)"
    evidence += f"; its last collective #{seq}" if seq is not None else ""
    if len(first) > 1:
        evidence += f"; ranks {ranks_said(first)} were first seen dead in one round: their order is not known"
    running = ago(window, death.last_alive_ns) if death.last_alive_ns is not None else "never"
    persistence = f"rank {death.rank} {death.state} at its last {death.dead_reads} read(s), last seen running {running}"
    ras = ras_line(window, death.rank)
    return evidence + (f"; {ras}" if ras else ""), persistence


def _ras_dead(window: Window, node: str, rank: int) -> WatchFinding:
    """A rank RAS considers dead whose node the watcher no longer reads: named by its peers' NCCL."""
    latest = window.latest.get(rank)
    last = f"last read {ago(window, window.seen_ns(latest))} ({latest.state})" if latest is not None else "never read"
    observed = f"dead by NCCL's RAS (no answer over its network for 60 s), and its node is not read ({last})"
    evidence = ras_line(window, rank)
    return window.finding(
        FindingKind.DEAD_RANK, node, Status.FAIL, "ras_dead", observed, "every rank running (or exited with the job)",
        evidence, last, rank,
    )  # fmt: skip


def judge_dead(window: Window) -> list[WatchFinding]:
    """One ``dead_rank`` row per node."""
    found = deaths(window)
    first = first_deaths(window, found)
    gone = missing(window, found)
    unread_dead = ras_dead_unread(window)
    rows = []
    read_nodes = {r.node for r in window.reads}
    for node in window.nodes:
        mine = [r for r in window.ranks if window.node_of(r) == node]
        named = sorted(set(mine) & first)
        later = sorted(set(mine) & set(found) - first)
        kind, expected = FindingKind.DEAD_RANK, "every rank running (or exited with the job)"
        if named:
            death = found[named[0]]
            evidence, persistence = _dead_said(window, death, first)
            if later:
                evidence += f"; rank(s) {ranks_said(later)} of this node died after it"
            observed = f"died ({death.state}) first, {ago(window, death.first_dead_ns)}; the job failed with it"
            rows.append(
                window.finding(
                    kind, node, Status.FAIL, "rank_dead", observed, expected, evidence, persistence, named[0]
                )
            )
        elif set(mine) & set(gone):
            rank = min(set(mine) & set(gone))
            observed = "is gone: its node no longer lists it and its peers went on without it"
            ras = ras_line(window, rank)
            evidence = gone[rank] + (f"; {ras}" if ras else "")
            rows.append(window.finding(kind, node, Status.FAIL, "rank_missing", observed, expected, evidence, "", rank))
        elif set(mine) & set(unread_dead):
            rows.append(_ras_dead(window, node, min(set(mine) & set(unread_dead))))
        elif node not in read_nodes:
            observed = "no read of this node listed a rank of the job"
            rows.append(window.finding(kind, node, Status.NOT_JUDGED, "node_unread", observed, expected))
        elif later:
            cause = ranks_said(sorted(first))
            observed = f"rank(s) {ranks_said(later)} died after rank(s) {cause} had: torn down with the job"
            persistence = "; ".join(_dead_said(window, found[r], first)[1] for r in later)
            rows.append(window.finding(kind, node, Status.PASS, "torn_down", observed, expected, "", persistence))
        else:
            states = ", ".join(f"rank {r} {window.latest[r].state}" for r in mine if r in window.latest)
            rows.append(window.finding(kind, node, Status.PASS, "ok", states, expected))
    return rows
