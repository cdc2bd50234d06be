"""The watcher's conclusions about a running job: per node, one row per kind of fault (a dead rank, a hang, a
compute straggler, a communication straggler), each a pass with its figure, a failure naming the rank and GPU
with its evidence and persistence, or not judged with the reason the data could not decide. Pure: the rows of a
window in, findings out; reading the nodes and acting on the findings are the watcher's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd

from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge.comm import judge_comm
from cluster_accept.watch.judge.compute import judge_compute
from cluster_accept.watch.judge.dead import deaths, first_deaths, judge_dead
from cluster_accept.watch.judge.hang import judge_hang
from cluster_accept.watch.judge.lag import arrivals
from cluster_accept.watch.judge.ras_said import ras_dead_unread
from cluster_accept.watch.judge.rules import WatchRules
from cluster_accept.watch.judge.window import build, span_ns
from cluster_accept.watch.ras import RasSeen
from cluster_accept.watch.words import CollectiveSeen, FindingKind, RankSeen, WatchFinding

KINDS = [FindingKind.DEAD_RANK, FindingKind.HANG, FindingKind.COMPUTE_STRAGGLER, FindingKind.COMM_STRAGGLER]


@dataclass(frozen=True)
class Judgement:
    """One judgement of the rows: the findings, and by job the arrival lags its compute stragglers were judged by
    (:func:`judge.lag.arrivals`) over the window (start, now) on the watcher's clock: what the page and the gauges
    draw."""

    findings: list[WatchFinding]
    lags: dict[str, pd.DataFrame]
    window_ns: tuple[int, int]

    def lags_of(self, job: str) -> pd.DataFrame:
        """The job's lags (none where the rows held none of it)."""
        return self.lags.get(job, pd.DataFrame())


def judge(
    ranks: Sequence[RankSeen],
    collectives: Sequence[CollectiveSeen],
    rules: WatchRules,
    now_ns: int,
    ras: RasSeen | None = None,
) -> Judgement:
    """Every node of every job in the rows gets one finding per :class:`FindingKind`, ordered by job, node, kind.

    ``ranks``: every read of every rank in the window (several reads per rank: deaths and hangs are judged on how
    they changed); ``collectives``: the records the reads returned (repeats of one collective are merged);
    ``now_ns``: the watcher's clock; ``ras``: NCCL RAS's latest report (one job's: the watch reads one). A hang after
    a death is not judged apart from it (the death names the node)."""
    rows: list[WatchFinding] = []
    lags: dict[str, pd.DataFrame] = {}
    for job in sorted({r.job for r in ranks} | {c.job for c in collectives}):
        window = build(job, ranks, collectives, rules, now_ns, ras)
        first = first_deaths(window, deaths(window)) | set(ras_dead_unread(window))
        full = arrivals(window)
        found = [*judge_dead(window), *judge_hang(window, first), *judge_compute(window, full), *judge_comm(window)]
        rows += sorted(
            (replace(row, owner_line=owner_line(row)) for row in found),
            key=lambda row: (row.node, KINDS.index(FindingKind(row.kind))),
        )
        lags[job] = full
    return Judgement(rows, lags, span_ns(rules, now_ns))


def localize(
    ranks: Sequence[RankSeen], collectives: Sequence[CollectiveSeen], rules: WatchRules, now_ns: int
) -> list[WatchFinding]:
    """The findings of :func:`judge`."""
    return judge(ranks, collectives, rules, now_ns).findings


def owner_line(finding: WatchFinding) -> str:
    """One line for the job's owner: which node to exclude and why ('exclude node02: rank 5 (GPU 1) arrives
    last at 27 of 30 collectives, 180 ms behind its peers'); for a row that names nothing, what was found."""
    if finding.status is Status.FAIL:
        who = ""
        if finding.rank is not None and finding.kind != FindingKind.COMM_STRAGGLER.value:
            gpu = f" (GPU {finding.gpu})" if finding.gpu is not None else ""
            who = f"rank {finding.rank}{gpu} "
        if finding.involves:
            return (
                f"exclude {finding.node} and {finding.involves}: {who}{finding.observed}; its host shows no wait for a "
                f"CPU, so its compute or a link of its ring neighbours {finding.involves} made it late (its re-test "
                "says which)"
            )
        return f"exclude {finding.node}: {who}{finding.observed}"
    kind = finding.kind.replace("_", " ")
    return f"{finding.node}, {kind}: {finding.status.value} ({finding.reason}): {finding.observed}"
