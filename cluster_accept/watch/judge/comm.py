"""Communication stragglers: the node, the GPU's network path (its NIC) or the rail common to every slow
communicator.

A slow link or NIC slows every collective whose ring or tree crosses it, whichever rank arrives last; arrival
cannot show it, the collectives' own execution time (or bus bandwidth) can. With several communicators (tensor,
pipeline and data parallel groups), each communicator's median over the window is held against the median of the
*other* communicators of the same operation, size and shape (how many nodes, how many ranks): one within a node
runs over NVLink, one across nodes over the network, a pair and a group of 512 take different times in a healthy
job; leaving itself out keeps a slow node that sits in half of them from pulling the reference. Those
``comm_slow_factor`` times slower are slow.

What every slow one has in common and no fast one of the same reach has (a fast NVLink group says nothing of a
NIC, a fast group across nodes nothing of NVLink) is named, in this order:

- a **node** in every slow communicator and in no fast one (its NVLink, its links, its PCIe switch, its NICs);
- a **port** — one GPU of one node, the path its traffic leaves the node by (the NIC paired with it) — in every
  slow communicator across nodes and in no fast one across nodes, where every slow one crosses nodes: the node's
  other GPUs talk across nodes at full speed, so the node as a whole is not slow, that GPU's NIC is;
- a **rail** — every slow communicator runs between the same GPU index of several nodes, and no fast one across
  nodes entirely on that index does: the rail's switch or cabling, not one node (no node is named; each node on
  it says so).

GPU index stands for the NIC where GPUs and NICs pair by index, as rail-optimized fabrics wire them. One
communicator (or none with a peer of its operation, size and shape) has nothing to be compared with: not judged.
A GPU is each rank's as its reads say; a rank whose GPU is not known has no port and no rail."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge.window import NS_PER_S, Window
from cluster_accept.watch.words import FindingKind, WatchFinding

Port = tuple[str, int | None]  # a node and one of its GPUs (None where the job runs on CPUs)


@dataclass(frozen=True)
class Compared:
    """The communicators compared: each one's slowness (its figure over its peers'), median figure, members."""

    ratio: dict[str, float]
    figure: dict[str, float]
    nodes: dict[str, frozenset[str]]
    ports: dict[str, frozenset[Port]]
    counts: list[int]  # collectives per communicator
    span_s: float
    metric: str  # 'execution time' or 'bus bandwidth'
    unit: str
    slow_factor: float

    @property
    def slow(self) -> list[str]:
        return sorted(c for c, r in self.ratio.items() if r >= self.slow_factor)

    @property
    def fast(self) -> list[str]:
        return sorted(set(self.ratio) - set(self.slow))

    def crosses(self, communicator: str) -> bool:
        """Whether the communicator spans nodes (its traffic leaves them by their NICs)."""
        return len(self.nodes[communicator]) > 1

    @property
    def slow_reach(self) -> str:
        """' across nodes' or ' within a node' where every slow communicator has that reach; '' where mixed."""
        reaches = {self.crosses(c) for c in self.slow}
        return "" if len(reaches) != 1 else " across nodes" if reaches == {True} else " within a node"


@dataclass(frozen=True)
class Culprit:
    """What every slow communicator has and no fast one: nodes, one node's GPU path (port), or a rail; or none."""

    nodes: frozenset[str] = frozenset()
    port: Port | None = None
    rail: int | None = None


def compare(window: Window) -> Compared | str:
    """The comparison, or the reason code where there is none ('no_exec_time', 'one_communicator')."""
    frame = window.in_window()
    if frame["exec_ms"].notna().any():
        frame, metric, unit = frame.assign(cost=frame["exec_ms"]), "execution time", "ms"
    elif frame["busbw_gbps"].notna().any():
        frame, metric, unit = frame.assign(cost=1.0 / frame["busbw_gbps"]), "bus bandwidth", "GB/s"
    else:
        return "no_exec_time"
    members = window.collectives.groupby("communicator")  # every record: a rank without a figure is a member
    shape = members.agg(nodes_n=("node", "nunique"), ranks_n=("rank", "nunique"))
    frame = frame.dropna(subset=["cost"]).assign(size=frame["size_bytes"].fillna(-1)).join(shape, on="communicator")
    ratios = _ratios(frame, window.rules.comm_min_collectives)
    if not ratios:
        return "one_communicator"
    kept = frame[frame["communicator"].isin(ratios)]
    figure = kept.groupby("communicator")["cost"].median()
    shown = {str(c): (1.0 / float(v) if unit == "GB/s" else float(v)) for c, v in figure.items()}
    nodes = {str(c): frozenset(str(n) for n in g) for c, g in members["node"] if c in ratios}
    place = {rank: (window.node_of(rank), window.gpu_of(rank)) for rank in window.ranks}  # each rank looked up once
    ports = {str(c): frozenset(place[int(r)] for r in set(g)) for c, g in members["rank"] if c in ratios}
    counts = [int(n) for n in kept.groupby("communicator")["seq"].nunique()]
    span = (float(kept["arrival_ns"].max()) - float(kept["arrival_ns"].min())) / NS_PER_S
    ratio = {c: statistics.median(r) for c, r in ratios.items()}
    return Compared(ratio, shown, nodes, ports, counts, span, metric, unit, window.rules.comm_slow_factor)


def _ratios(frame: pd.DataFrame, min_collectives: int) -> dict[str, list[float]]:
    """Each communicator's median cost over the median of its peers of one operation, size and shape."""
    peers = ["op", "size", "nodes_n", "ranks_n"]
    per = frame.groupby([*peers, "communicator"]).agg(cost=("cost", "median"), count=("seq", "nunique"))
    per = per[per["count"] >= min_collectives].reset_index()
    ratios: dict[str, list[float]] = {}
    for _, group in per.groupby(peers):
        for communicator, cost in zip(group["communicator"], group["cost"], strict=True):
            others = group[group["communicator"] != communicator]["cost"]
            if not others.empty:
                ratios.setdefault(str(communicator), []).append(float(cost) / float(others.median()))
    return ratios


def culprit(compared: Compared) -> Culprit:
    """The element common to every slow communicator and absent from the fast ones that could have cleared it:
    where every slow one has one reach, only fast ones of that reach clear (a fast NVLink group says nothing of a
    NIC, a fast group across nodes nothing of NVLink); ports and rails only where every slow one crosses nodes."""
    slow = compared.slow
    if not slow:
        return Culprit()
    reaches = {compared.crosses(c) for c in slow}
    clearing = [c for c in compared.fast if len(reaches) > 1 or compared.crosses(c) in reaches]
    nodes = frozenset.intersection(*(compared.nodes[c] for c in slow))
    nodes -= frozenset().union(*(compared.nodes[c] for c in clearing))
    if nodes:
        return Culprit(nodes=nodes)
    if reaches != {True}:
        return Culprit()
    ports = frozenset.intersection(*(compared.ports[c] for c in slow))
    ports -= frozenset().union(*(compared.ports[c] for c in clearing))
    known = [port for port in ports if port[1] is not None]
    if len(known) == 1:
        return Culprit(port=known[0])
    gpus = {gpu for c in slow for _, gpu in compared.ports[c]}
    rail = next(iter(gpus)) if len(gpus) == 1 else None
    if rail is None or any({g for _, g in compared.ports[c]} == {rail} for c in clearing):
        return Culprit()
    return Culprit(rail=rail)


def _said(compared: Compared, communicators: list[str]) -> str:
    return ", ".join(
        f"{c} ({','.join(sorted(compared.nodes[c]))}) {compared.figure[c]:.3g} {compared.unit}, "
        f"{compared.ratio[c]:.2f}× its peers"
        for c in communicators
    )


def judge_comm(window: Window) -> list[WatchFinding]:
    """One ``comm_straggler`` row per node."""
    kind, rules = FindingKind.COMM_STRAGGLER, window.rules
    expected = (
        f"every communicator under {rules.comm_slow_factor:g}× the others of its operation, size and shape "
        "(within a node or across nodes)"
    )
    compared = compare(window)
    if isinstance(compared, str):
        observed = {
            "no_exec_time": "no collective carried its execution time or bus bandwidth",
            "one_communicator": "no two communicators of one operation, size and shape with "
            f"{rules.comm_min_collectives} collectives each in the window",
        }[compared]
        return [window.finding(kind, n, Status.NOT_JUDGED, compared, observed, expected) for n in window.nodes]
    found = culprit(compared)
    evidence = f"slow: {_said(compared, compared.slow) or 'none'}; fast: {_said(compared, compared.fast) or 'none'}"
    counts = compared.counts
    persistence = f"medians of {min(counts)} to {max(counts)} collectives per communicator over {compared.span_s:.1f} s"
    rows = []
    for node in window.nodes:
        status, reason, observed = _node_verdict(compared, found, node)
        rank = _rank_in(window, node, compared.slow) if status is Status.FAIL else None
        rows.append(window.finding(kind, node, status, reason, observed, expected, evidence, persistence, rank))
    return rows


def _node_verdict(compared: Compared, found: Culprit, node: str) -> tuple[Status, str, str]:
    """The node's status, reason and what was observed of it, given what the slow communicators share."""
    slow = compared.slow
    mine = sorted(c for c in compared.ratio if node in compared.nodes[c])
    in_slow = ", ".join(c for c in mine if c in slow)
    slowest = min((compared.ratio[c] for c in slow), default=0.0)
    if node in found.nodes:
        return Status.FAIL, "slow_communicators", (
            f"its communicators {', '.join(slow)} run {slowest:.1f}× slower than their peers ({compared.metric}), "
            f"and no fast one{compared.slow_reach} includes it"
        )  # fmt: skip
    if found.port is not None and found.port[0] == node:
        gpu = found.port[1]
        others = sorted({c for c in mine if compared.crosses(c)} - set(slow))
        return Status.FAIL, "slow_nic", (
            f"the network path of its GPU {gpu} (the NIC paired with it) is in every slow communicator "
            f"({', '.join(slow)}, {slowest:.1f}× their peers' {compared.metric}) and in no fast one across nodes; "
            f"its other communicators across nodes ({', '.join(others) or 'none'}) are fast"
        )  # fmt: skip
    if not in_slow:
        if not mine:
            return Status.NOT_JUDGED, "not_compared", "in no communicator compared with another"
        worst = max(compared.ratio[c] for c in mine)
        return Status.PASS, "ok", f"its communicators run at {worst:.2f}× their peers' {compared.metric} at most"
    if found.rail is not None:
        return Status.NOT_JUDGED, "slow_rail", (
            f"its GPU {found.rail}'s communicators across nodes ({in_slow}) are slow, as every slow one runs between "
            f"GPU {found.rail} of several nodes and no fast one across nodes entirely on GPU {found.rail} does: rail "
            f"{found.rail}, not this node"
        )  # fmt: skip
    named = sorted(found.nodes) or ([f"{found.port[0]} GPU {found.port[1]}"] if found.port else [])
    if not named:
        return Status.NOT_JUDGED, "slow_unlocalized", f"in slow communicator(s) {in_slow}, as other nodes are"
    fast = ", ".join(c for c in mine if c not in slow) or "none"
    return Status.PASS, "ok", f"in slow communicator(s) {in_slow} with {', '.join(named)}, and in fast one(s) {fast}"


def _rank_in(window: Window, node: str, communicators: list[str]) -> int | None:
    """The node's rank in every one of the communicators, where exactly one rank is (two ranks of a node in
    every slow group, as in a slow NVLink pair, name the node, not a rank)."""
    frame = window.in_window()
    mine = frame[(frame["node"] == node) & frame["communicator"].isin(communicators)]
    per = mine.groupby("rank")["communicator"].nunique()
    common = sorted(int(r) for r, n in zip(per.index, per, strict=True) if n == len(communicators))
    return common[0] if len(common) == 1 else None
