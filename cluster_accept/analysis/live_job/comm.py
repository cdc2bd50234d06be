"""Communication stragglers: the node common to every slow communicator.

A slow link or NIC slows every collective whose ring or tree crosses it, whichever rank arrives last; arrival
cannot show it, the collectives' own execution time (or bus bandwidth) can. With several communicators (tensor,
pipeline and data parallel groups), each communicator's median over the window is held against the median of the
*other* communicators of the same operation and size (a collective of another size takes another time; leaving
itself out keeps a slow node that sits in half of them from pulling the reference). Those ``comm_slow_factor``
times slower are slow; the node in every slow one and in no fast one is named. One communicator (or none with a
peer of its operation and size) has nothing to be compared with: not judged."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from cluster_accept.analysis.live_job.window import NS_PER_S, Window
from cluster_accept.vocabulary.live_job import FindingKind, WatchFinding
from cluster_accept.vocabulary.status import Status


@dataclass(frozen=True)
class Compared:
    """The communicators compared: each one's slowness (its figure over its peers'), median figure, nodes."""

    ratio: dict[str, float]
    figure: dict[str, float]
    nodes: dict[str, frozenset[str]]
    counts: list[int]  # collectives per communicator
    span_s: float
    metric: str  # 'execution time' or 'bus bandwidth'
    unit: str
    slow_factor: float

    @property
    def slow(self) -> list[str]:
        return sorted(c for c, r in self.ratio.items() if r >= self.slow_factor)


def compare(window: Window) -> Compared | str:
    """The comparison, or the reason code where there is none ('no_exec_time', 'one_communicator')."""
    frame = window.in_window()
    if frame["exec_ms"].notna().any():
        frame, metric, unit = frame.assign(cost=frame["exec_ms"]), "execution time", "ms"
    elif frame["busbw_gbps"].notna().any():
        frame, metric, unit = frame.assign(cost=1.0 / frame["busbw_gbps"]), "bus bandwidth", "GB/s"
    else:
        return "no_exec_time"
    frame = frame.dropna(subset=["cost"]).assign(size=frame["size_bytes"].fillna(-1))
    per = frame.groupby(["op", "size", "communicator"]).agg(cost=("cost", "median"), count=("seq", "nunique"))
    per = per[per["count"] >= window.rules.comm_min_collectives].reset_index()
    ratios: dict[str, list[float]] = {}
    for _, group in per.groupby(["op", "size"]):
        for communicator, cost in zip(group["communicator"], group["cost"], strict=True):
            others = group[group["communicator"] != communicator]["cost"]
            if not others.empty:
                ratios.setdefault(str(communicator), []).append(float(cost) / float(others.median()))
    if not ratios:
        return "one_communicator"
    kept = frame[frame["communicator"].isin(ratios)]
    figure = kept.groupby("communicator")["cost"].median()
    shown = {str(c): (1.0 / float(v) if unit == "GB/s" else float(v)) for c, v in figure.items()}
    nodes = {str(c): frozenset(str(n) for n in g) for c, g in kept.groupby("communicator")["node"]}
    counts = [int(n) for n in kept.groupby("communicator")["seq"].nunique()]
    span = (float(kept["arrival_ns"].max()) - float(kept["arrival_ns"].min())) / NS_PER_S
    ratio = {c: statistics.median(r) for c, r in ratios.items()}
    return Compared(ratio, shown, nodes, counts, span, metric, unit, window.rules.comm_slow_factor)


def _said(compared: Compared, communicators: list[str]) -> str:
    return ", ".join(
        f"{c} ({','.join(sorted(compared.nodes[c]))}) {compared.figure[c]:.3g} {compared.unit}, "
        f"{compared.ratio[c]:.2f}× its peers"
        for c in communicators
    )


def judge_comm(window: Window) -> list[WatchFinding]:
    """One ``comm_straggler`` row per node."""
    kind, rules = FindingKind.COMM_STRAGGLER, window.rules
    expected = f"every communicator under {rules.comm_slow_factor:g}× the others of its operation and size"
    compared = compare(window)
    if isinstance(compared, str):
        observed = {
            "no_exec_time": "no collective carried its execution time or bus bandwidth",
            "one_communicator": "no two communicators of one operation and size with "
            f"{rules.comm_min_collectives} collectives each in the window",
        }[compared]
        return [window.finding(kind, n, Status.NOT_JUDGED, compared, observed, expected) for n in window.nodes]
    slow = compared.slow
    fast = sorted(set(compared.ratio) - set(slow))
    suspects = frozenset.intersection(*(compared.nodes[c] for c in slow)) if slow else frozenset()
    suspects = suspects - frozenset().union(*(compared.nodes[c] for c in fast))
    evidence = f"slow: {_said(compared, slow) or 'none'}; fast: {_said(compared, fast) or 'none'}"
    counts = compared.counts
    persistence = f"medians of {min(counts)} to {max(counts)} collectives per communicator over {compared.span_s:.1f} s"
    rows = []
    for node in window.nodes:
        mine = sorted(c for c in compared.ratio if node in compared.nodes[c])
        worst = max((compared.ratio[c] for c in mine), default=0.0)
        if node in suspects:
            observed = (
                f"its communicators {', '.join(slow)} run {min(compared.ratio[c] for c in slow):.1f}× slower "
                f"than their peers ({compared.metric}), and no fast one includes it"
            )
            status, reason = Status.FAIL, "slow_communicators"
        elif set(mine) & set(slow) and not suspects:
            observed = f"in slow communicator(s) {', '.join(sorted(set(mine) & set(slow)))}, as other nodes are"
            status, reason = Status.NOT_JUDGED, "slow_unlocalized"
        elif set(mine) & set(slow):
            observed = (
                f"in slow communicator(s) {', '.join(sorted(set(mine) & set(slow)))} with {', '.join(sorted(suspects))}"
                f", and in fast one(s) {', '.join(sorted(set(mine) - set(slow)))}"
            )
            status, reason = Status.PASS, "ok"
        elif not mine:
            status, reason, observed = Status.NOT_JUDGED, "not_compared", "in no communicator compared with another"
        else:
            observed = f"its communicators run at {worst:.2f}× their peers' {compared.metric} at most"
            status, reason = Status.PASS, "ok"
        rank = _rank_in(window, node, slow) if status is Status.FAIL else None
        rows.append(window.finding(kind, node, status, reason, observed, expected, evidence, persistence, rank))
    return rows


def _rank_in(window: Window, node: str, communicators: list[str]) -> int | None:
    """The node's rank in every one of the communicators, where one rank is."""
    frame = window.in_window()
    mine = frame[(frame["node"] == node) & frame["communicator"].isin(communicators)]
    per = mine.groupby("rank")["communicator"].nunique()
    common = sorted(int(r) for r, n in zip(per.index, per, strict=True) if n == len(communicators))
    return common[0] if common else None
