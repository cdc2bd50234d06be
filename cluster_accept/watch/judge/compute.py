"""Compute stragglers: the node whose rank arrives last at the job's collectives.

Data parallelism equalizes step time: every rank waits in each gradient all_reduce for the slowest, so step time
says nothing of who is slow. Arrival does: a rank whose compute (GPU throttled, CPU contended, data loading slow)
takes longer enters each collective late, and its peers wait in it. Each rank's lag at a collective is read by
:mod:`judge.lag` (the rule the page and the gauges draw too): its arrival less the median arrival, on the device
where every rank's execution time is known (the slow rank *waits least*: its own execution time is the shortest,
since the others' includes their wait for it; a GPU slowed by a co-tenant queues its launches on time and runs them
late), else by enqueue on the watcher's clock; a node's lag is its latest rank's. A lag read on the device needs no
clock across nodes, so its uncertainty is none.

A node is named only when, over the window (or since a change point), its rank arrives last at ``last_share_min``
of the collectives, in a streak of ``streak_collectives``, by a median lag beyond three floors: ``lag_min_ms``, a
share of the job's interval between collectives, and the clocks' uncertainty where its peers are on other nodes
(two nodes' clocks can be off by both their errors together; ranks of one node share a clock). Lagging by less
than the clocks can tell apart is not judged: no node is named on a difference the clocks may have made.

A straggler that appears mid-window is last at too few of the whole window's collectives; the change point of
its lag (the split that leaves the least squared error on both sides, with a median shift beyond ``lag_min_ms``)
bounds the judged collectives to those after it, and is stated."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from cluster_accept.inventory.hostlist import fold
from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge.host import blocks_host, host_call, ring_neighbours
from cluster_accept.watch.judge.lag import KEY
from cluster_accept.watch.judge.rules import WatchRules
from cluster_accept.watch.judge.window import NS_PER_MS, NS_PER_S, Window, ranks_said
from cluster_accept.watch.words import FindingKind, WatchFinding


def interval_ms(full: pd.DataFrame) -> float:
    """The median interval between consecutive collectives of one communicator: the job's cadence."""
    starts = full.groupby(KEY)["median_ns"].first().reset_index().sort_values(KEY)
    gaps = starts.groupby("communicator")["median_ns"].diff().dropna()
    return float(gaps.median()) / NS_PER_MS if not gaps.empty else 0.0


def shared(window: Window, full: pd.DataFrame) -> pd.DataFrame:
    """Per collective, what every node's series reads: the last rank and its node, how long the collective waited
    for it (``wait_ms``: its lag behind the median arrival), how many nodes take part, and the two largest clock
    errors among them (with the node of the largest), so that a node's uncertainty against the others is its own
    error plus the largest of theirs."""
    last = full.loc[full.groupby(KEY)["arrived_ns"].idxmax(), [*KEY, "rank", "node", "lag_ms"]]
    last = last.rename(columns={"rank": "last_rank", "node": "last_node", "lag_ms": "wait_ms"}).set_index(KEY)
    pairs = full[[*KEY, "node"]].drop_duplicates()
    errors = pairs["node"].map(lambda n: window.clocks[n].error_ns if n in window.clocks else 0)
    pairs = pairs.assign(error_ns=errors).sort_values([*KEY, "error_ns"], ascending=[True, True, False])
    tops: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for communicator, seq, node, error in zip(
        pairs["communicator"], pairs["seq"], pairs["node"], pairs["error_ns"], strict=True
    ):
        tops.setdefault((str(communicator), int(seq)), []).append((str(node), int(error)))
    keys = list(last.index)
    last["nodes"] = [len(tops[k]) for k in keys]
    last["top_node"] = [tops[k][0][0] for k in keys]
    last["top_error_ns"] = [tops[k][0][1] for k in keys]
    last["second_error_ns"] = [tops[k][1][1] if len(tops[k]) > 1 else 0 for k in keys]
    return last


def node_series(window: Window, full: pd.DataFrame, facts: pd.DataFrame, node: str) -> pd.DataFrame:
    """Per collective the node has a rank in, in order of arrival: the node's lag, whether the last rank is its
    own, which rank was last, and the clocks' uncertainty of the comparison (ms; none among one node's ranks)."""
    mine = full[full["node"] == node]
    per = mine.groupby(KEY).agg(
        lag_ms=("lag_ms", "max"), median_ns=("median_ns", "first"), op=("op", "first"), on_device=("on_device", "all")
    )
    per = per.join(facts)
    per["last"] = per["last_node"] == node
    own = window.clocks[node].error_ns if node in window.clocks else 0
    others = np.where(per["top_node"] != node, per["top_error_ns"], per["second_error_ns"])
    across = (per["nodes"] > 1) & ~per["on_device"]  # execution times are compared without clocks
    per["uncertainty_ms"] = np.where(across, (own + others) / NS_PER_MS, 0.0)
    return per.sort_values("median_ns")


def change_point(per: pd.DataFrame, window: Window, floor_ms: float) -> int | None:
    """The index from which the node's lag shifted: the split leaving the least squared error on both sides, with
    ``change_min_before`` collectives before it and ``streak_collectives`` after, kept where the median lag rose
    by ``lag_min_ms`` or more and the node was no straggler before it (last at under ``last_share_min``, or a lag
    under the floor): a lag that only varies from bucket to bucket has no change point."""
    rules, lags = window.rules, [float(v) for v in per["lag_ms"]]
    low, high = rules.change_min_before, len(lags) - rules.streak_collectives
    if high < low:
        return None
    values = np.asarray(lags, dtype="float64")
    total, squares = np.concatenate([[0.0], np.cumsum(values)]), np.concatenate([[0.0], np.cumsum(values**2)])

    def sse(a: int, b: int) -> float:
        return float(squares[b] - squares[a] - (total[b] - total[a]) ** 2 / (b - a))

    best = min(range(low, high + 1), key=lambda s: sse(0, s) + sse(s, len(lags)))
    before = segment(per.iloc[:best])
    shift = statistics.median(lags[best:]) - before.lag_ms
    was_straggler = before.share >= rules.last_share_min and before.lag_ms >= floor_ms
    return best if shift >= rules.lag_min_ms and not was_straggler else None


@dataclass(frozen=True)
class Segment:
    """A node's figures over a run of collectives."""

    per: pd.DataFrame  # node_series rows
    count: int
    last: int
    streak: int
    lag_ms: float
    uncertainty_ms: float
    rank: int | None  # its rank most often last

    @property
    def share(self) -> float:
        return self.last / self.count if self.count else 0.0


def segment(per: pd.DataFrame) -> Segment:
    run = streak = 0
    for is_last in per["last"]:
        run = run + 1 if is_last else 0
        streak = max(streak, run)
    lasts = per[per["last"]]["last_rank"]
    rank = int(lasts.mode().min()) if not lasts.empty else None
    return Segment(
        per, len(per), int(per["last"].sum()), streak, float(per["lag_ms"].median()),
        float(per["uncertainty_ms"].median()), rank,
    )  # fmt: skip


def label(per: pd.DataFrame) -> str:
    """The collectives of a run: 'all_reduce #412-#441', or first to last where communicators differ."""
    first, last = per.index[0], per.index[-1]
    if per.index.get_level_values("communicator").nunique() == 1 and per["op"].nunique() == 1:
        return f"{per['op'].iloc[0]} #{first[1]}-#{last[1]}"
    return f"{per['op'].iloc[0]} #{first[1]} on {first[0]} to {per['op'].iloc[-1]} #{last[1]} on {last[0]}"


def judge_compute(window: Window, full: pd.DataFrame) -> list[WatchFinding]:
    """One ``compute_straggler`` row per node, from the window's arrival lags (``full``: :func:`judge.lag.arrivals`
    of the window)."""
    collectives = full.groupby(KEY).ngroups if not full.empty else 0
    rules = window.rules
    if collectives < rules.min_collectives:
        observed = f"{collectives} complete collective(s) in the last {rules.window_s:g} s"
        expected = f"at least {rules.min_collectives} to judge"
        return [
            window.finding(
                FindingKind.COMPUTE_STRAGGLER, n, Status.NOT_JUDGED, "too_few_collectives", observed, expected
            )
            for n in window.nodes
        ]
    cadence, facts = interval_ms(full), shared(window, full)
    series = {node: node_series(window, full, facts, node) for node in window.nodes}  # a pair reads its partner's
    return [_judge_node(window, full, node, cadence, series) for node in window.nodes]


def _verdict(seg: Segment, window: Window, floor_ms: float) -> str:
    """'named' (persistent, beyond every floor), 'clock' (persistent, but within the clocks' uncertainty), 'ok'."""
    rules = window.rules
    span_s = (float(seg.per["median_ns"].iloc[-1]) - float(seg.per["median_ns"].iloc[0])) / 1e9 if seg.count else 0.0
    persistent = seg.share >= rules.last_share_min and seg.streak >= rules.streak_collectives
    persistent = persistent and span_s >= rules.persist_min_s
    if not persistent or seg.lag_ms < floor_ms:
        return "ok"
    return "named" if seg.lag_ms > seg.uncertainty_ms else "clock"


def waited(per: pd.DataFrame, floor_ms: float) -> pd.DataFrame:
    """The collectives the job waited at: its last rank arrived ``floor_ms`` or more after the median, beyond the
    clocks' uncertainty where the arrivals are enqueue times on several nodes' clocks (none on the device).

    A GPU job's collectives queue on one stream: each gradient bucket's all_reduce starts when the one before it
    ends, so where communication fills the backward pass a slow rank is late only at the first collective after
    its forward pass, and on time at the others (they wait for the stream, not for it). Over every collective it
    is last at a few; over those the job waited at, at nearly all."""
    return per[per["wait_ms"] >= floor_ms + per["uncertainty_ms"]]


def held_share(seg: Segment, per: pd.DataFrame) -> float:
    """The share of the node's span of the window its peers spent waiting for it: its lag summed over the judged
    collectives it arrived last at, over the time from the node's first collective to its last."""
    span_ns = float(per["median_ns"].iloc[-1]) - float(per["median_ns"].iloc[0])
    held_ms = float(seg.per.loc[seg.per["last"], "lag_ms"].clip(lower=0).sum())
    return held_ms * NS_PER_MS / span_ns if span_ns > 0 else 0.0


def _persistence(seg: Segment, per: pd.DataFrame, cut: int | None, waited_ms: float | None = None) -> str:
    span_s = (float(seg.per["median_ns"].iloc[-1]) - float(seg.per["median_ns"].iloc[0])) / NS_PER_S
    judged = f"{label(seg.per)}" + (f" (those the job waited {waited_ms:.1f} ms or more at)" if waited_ms else "")
    said = f"last at {seg.last} of {seg.count} {judged} over {span_s:.1f} s; longest streak {seg.streak}"
    if cut is not None:
        before = float(per["lag_ms"].iloc[:cut].median())
        communicator, seq = per.index[cut]
        said += (
            f"; since #{seq} on {communicator} (change point: lag {before:.1f} ms before, {seg.lag_ms:.1f} ms after)"
        )
    return said


def _evidence(window: Window, full: pd.DataFrame, seg: Segment, node: str, floor_ms: float) -> str:
    """The rank's lag and its peers' (ranks on other nodes), the floors, and both execution times."""
    sub = full[pd.MultiIndex.from_frame(full[KEY]).isin(seg.per.index)]
    mine = sub[sub["rank"] == seg.rank]
    peers = sub[sub["node"] != node]
    lags = peers.groupby("rank")["lag_ms"].median()
    said = f"rank {seg.rank} lag {float(mine['lag_ms'].median()):.1f} ms (median)"
    if not lags.empty:
        said += f"; peers {lags.min():.1f} to {lags.max():.1f} ms (ranks {ranks_said([int(r) for r in lags.index])})"
    said += f"; floor {floor_ms:.1f} ms, clocks ±{seg.uncertainty_ms:.1f} ms"
    own, theirs = mine["exec_ms"].dropna(), peers["exec_ms"].dropna()
    if not own.empty and not theirs.empty:
        each = peers.groupby("rank")["exec_ms"].median()  # each peer's own median: it waits least below them all
        least = "it waits least" if own.median() < each.min() else "it does not wait least"
        said += f"; its own execution {own.median():.1f} ms (median), its peers' {theirs.median():.1f} ms: {least}"
    return said


@dataclass(frozen=True)
class _Run:
    """A run of a node's collectives judged on its own: since a change point, the whole window, or the collectives
    the job waited at (``waited``)."""

    seg: Segment
    cut: int | None = None
    waited: bool = False


def _runs(per: pd.DataFrame, window: Window, floor_ms: float) -> list[_Run]:
    cut = change_point(per, window, floor_ms)
    runs = [_Run(segment(per.iloc[cut:]), cut)] if cut is not None else []
    runs.append(_Run(segment(per)))
    at_waits = waited(per, floor_ms)
    if not at_waits.empty:
        runs.append(_Run(segment(at_waits), waited=True))
    return runs


def gpu_blind(full: pd.DataFrame, node: str) -> bool:
    """Whether the node's collectives run on GPUs (NCCL) without their execution times: their enqueue says when
    the CPU queued each launch, which runs ahead of the GPU, so a GPU slowed by a co-tenant or its clocks
    arrives late unseen. A straggler the enqueue shows is still named; no straggler is not a pass."""
    mine = full[full["node"] == node]
    return bool(((mine["backend"] == "nccl") & ~mine["on_device"]).mean() > 0.5) if not mine.empty else False


def _run_verdict(run: _Run, per: pd.DataFrame, window: Window, floor_ms: float) -> str:
    """:func:`_verdict`; at the collectives the job waited at, also its peers waiting ``held_share_min`` of the
    window for it: a node late only now and then costs the job nothing worth a drain."""
    verdict = _verdict(run.seg, window, floor_ms)
    if run.waited and verdict != "ok" and held_share(run.seg, per) < window.rules.held_share_min:
        return "ok"
    return verdict


def _expected(rules: WatchRules, floor_ms: float, cadence_ms: float) -> str:
    return (
        f"last at under {rules.last_share_min:.0%} of collectives or in streaks under {rules.streak_collectives}, "
        f"or a median lag under {floor_ms:.1f} ms (the larger of {rules.lag_min_ms:g} ms and "
        f"{rules.lag_min_share_of_interval:.0%} of the {cadence_ms:.1f} ms between collectives); the same at the "
        f"collectives the job waited {floor_ms:.1f} ms or more at, or its peers waiting under "
        f"{rules.held_share_min:.0%} of the window for it"
    )


def _observed(run: _Run, per: pd.DataFrame, floor_ms: float) -> str:
    seg = run.seg
    said = f"arrives last at {seg.last} of {seg.count} collectives"
    if run.waited:
        said += f" the job waited {floor_ms:.1f} ms or more at"
    said += f", {seg.lag_ms:.0f} ms behind its peers"
    if run.waited:
        said += f"; its peers waited {held_share(seg, per):.0%} of the window for it"
    return said


def _named_why(window: Window, full: pd.DataFrame, seg: Segment, node: str) -> tuple[str, str, str]:
    """The reason a node named by its arrivals carries, what its host showed, and the nodes it involves besides:
    ``arrives_last`` (its compute) where the lag was read on the device or its backend's enqueue never waits for a
    collective to end, or where its rank waited for a CPU (:mod:`judge.host`); else ``late_unresolved``, involving
    the nodes of its ring neighbours, whose links may have made it late."""
    if seg.rank is None or not blocks_host(full, node):
        return "arrives_last", "", ""
    span = (float(seg.per["median_ns"].iloc[0]), float(seg.per["median_ns"].iloc[-1]))
    host = host_call(window, full, seg.rank, node, span)
    if host.contended:
        return "arrives_last", host.said(), ""
    before, after = ring_neighbours(window, seg.rank)
    if before is None or after is None:
        return "late_unresolved", host.said(), ""
    said = f"its ring neighbours: rank {before} on {window.node_of(before)} (it receives from)"
    said += f", rank {after} on {window.node_of(after)} (it sends to)"
    others = {window.node_of(before), window.node_of(after)} - {node}
    return "late_unresolved", f"{host.said()}; {said}", fold(others) if others else ""


def _judge_node(
    window: Window, full: pd.DataFrame, node: str, cadence_ms: float, series: dict[str, pd.DataFrame]
) -> WatchFinding:
    rules, kind = window.rules, FindingKind.COMPUTE_STRAGGLER
    floor = max(rules.lag_min_ms, rules.lag_min_share_of_interval * cadence_ms)
    expected = _expected(rules, floor, cadence_ms)
    per = series[node]
    if len(per) < rules.min_collectives:
        observed = f"its ranks are in {len(per)} complete collective(s) of the window"
        return window.finding(kind, node, Status.NOT_JUDGED, "too_few_collectives", observed, expected)
    runs = _runs(per, window, floor)
    for wanted, status, reason in (
        ("named", Status.FAIL, "arrives_last"),
        ("clock", Status.NOT_JUDGED, "below_clock_error"),
    ):
        for run in runs:
            if _run_verdict(run, per, window, floor) != wanted:
                continue
            observed = _observed(run, per, floor)
            if reason == "arrives_last":
                return _named(window, full, run, per, node, floor, observed, expected)
            observed = f"{observed}: within the clocks' ±{run.seg.uncertainty_ms:.1f} ms, no node can be named"
            evidence = _evidence(window, full, run.seg, node, floor)
            persistence = _persistence(run.seg, per, run.cut, floor if run.waited else None)
            return window.finding(kind, node, status, reason, observed, expected, evidence, persistence, run.seg.rank)
    linked = _link_finding(window, full, series, node, floor, expected)
    if linked is not None:
        return linked
    whole = next(r.seg for r in runs if r.cut is None and not r.waited)
    observed = (
        f"last at {whole.last} of {whole.count} collectives ({whole.share:.0%}), median lag {whole.lag_ms:.1f} ms, "
        f"longest streak {whole.streak}"
    )
    if gpu_blind(full, node):
        observed = f"{observed} by enqueue: a slow host would show, a slow GPU not (NCCL gave no execution times)"
        return window.finding(kind, node, Status.NOT_JUDGED, "no_device_time", observed, expected)
    if runs[-1].waited:
        at = runs[-1].seg
        observed += (
            f"; last at {at.last} of the {at.count} the job waited {floor:.1f} ms or more at ({at.share:.0%}), its "
            f"peers waiting {held_share(at, per):.1%} of the window for it"
        )
    return window.finding(kind, node, Status.PASS, "ok", observed, expected)


# A pair of ring neighbours is judged as one only in a job of at least this many nodes: in fewer, the pair is most of
# the job (two of three nodes are last at two thirds of the collectives, healthy).
PAIR_MIN_NODES = 4


def _link_finding(
    window: Window, full: pd.DataFrame, series: dict[str, pd.DataFrame], node: str, floor_ms: float, expected: str
) -> WatchFinding | None:
    """Where the job's collectives block their hosts (gloo, one rank a node) and the node alone is not last
    persistently: the node and a ring neighbour of it last together at most collectives, in a streak, beyond the
    floors, the node the one of the two more often last. A slow link between two ranks makes both late, the sender's
    send stalling and the receiver's receive, so neither alone may reach the share a straggler needs (on the
    test-bed, a node's link limited to 150 Mbit/s: the rank sending into it last at 65 %, the node's own at 26 %).
    Named ``late_unresolved`` (or ``arrives_last`` where its host waited for a CPU), involving its ring neighbours."""
    ranks = sorted({int(r) for r in full.loc[full["node"] == node, "rank"]})
    if len(window.nodes) < PAIR_MIN_NODES or len(ranks) != 1 or not blocks_host(full, node):
        return None
    found: list[tuple[_Run, pd.DataFrame, str]] = []
    for other in dict.fromkeys(ring_neighbours(window, ranks[0])):
        partner = window.node_of(other) if other is not None else node
        if partner == node or partner not in series:
            continue
        pair = _pair_series(series[node], series[partner], node, partner)
        found += [
            (run, pair, partner)
            for run in _runs(pair, window, floor_ms)
            if _run_verdict(run, pair, window, floor_ms) == "named" and _leads(run.seg.per, node, partner)
        ]
    if not found:
        return None
    run, pair, partner = max(found, key=lambda f: f[0].seg.share)  # the pair last together most often
    seg = replace(run.seg, rank=ranks[0])
    alone = int((seg.per["last_node"] == node).sum())
    observed = (
        f"with {partner}, its ring neighbour, last at {seg.last} of {seg.count} collectives ({alone} of them itself), "
        f"{seg.lag_ms:.0f} ms behind their peers: the link between them, or either's compute"
    )
    return _named(window, full, replace(run, seg=seg), pair, node, floor_ms, observed, expected)


def _pair_series(mine: pd.DataFrame, theirs: pd.DataFrame, node: str, partner: str) -> pd.DataFrame:
    """The two nodes' series over the collectives both are in, as one: last where either is, the later lag."""
    partner_figures = theirs[["lag_ms", "uncertainty_ms"]].add_suffix("_partner")
    pair = mine.join(partner_figures, how="inner")
    pair["last"] = pair["last_node"].isin([node, partner])
    pair["lag_ms"] = pair[["lag_ms", "lag_ms_partner"]].max(axis=1)
    pair["uncertainty_ms"] = pair[["uncertainty_ms", "uncertainty_ms_partner"]].max(axis=1)
    return pair.drop(columns=["lag_ms_partner", "uncertainty_ms_partner"]).sort_values("median_ns")


def _leads(per: pd.DataFrame, node: str, partner: str) -> bool:
    """Whether ``node`` is last at more of the pair's collectives than ``partner`` (on a tie, the first by name)."""
    own, theirs = int((per["last_node"] == node).sum()), int((per["last_node"] == partner).sum())
    return own > theirs or (own == theirs and node < partner)


def _named(
    window: Window, full: pd.DataFrame, run: _Run, per: pd.DataFrame, node: str, floor_ms: float, observed: str,
    expected: str,
) -> WatchFinding:  # fmt: skip
    """The failing row of a node named by its arrivals (alone, or with a ring neighbour: ``per`` is the series the
    run was judged on): its evidence, what its host showed and the nodes it involves (:func:`_named_why`)."""
    reason, host, involves = _named_why(window, full, run.seg, node)
    evidence = _evidence(window, full, run.seg, node, floor_ms)
    evidence = f"{evidence}; {host}" if host else evidence
    persistence = _persistence(run.seg, per, run.cut, floor_ms if run.waited else None)
    kind = FindingKind.COMPUTE_STRAGGLER
    return window.finding(
        kind, node, Status.FAIL, reason, observed, expected, evidence, persistence, run.seg.rank, involves
    )
