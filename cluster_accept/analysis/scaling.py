"""The scaling table: all-reduce bus bandwidth at 2, 4, 8, … nodes, and how much of it survives. Pure.

A cluster whose nodes each pass can still lose most of its bandwidth as it grows (the seed report's
per-GPU figure fell 79% from one node to two, and the 8-node run kept 72% of the 2-node one). Bus bandwidth
(busbw) is already a per-rank figure that, for a healthy ring, does not depend on the rank count, so the
*scaling efficiency* of a k-node run is simply busbw(k) / busbw(2): the 2-node run is the first that crosses
the network, so it is the baseline (the one-node figure is NVLink and says nothing about the fabric). The
profile's ``scaling_efficiency_min`` (e.g. 0.90) is the cluster-level check on it.

algbw (buffer bytes reduced per second, what a training step waits on) is derived back from busbw:
``busbw = algbw * 2 (n - 1) / n`` for n ranks, and a node's throughput is its GPUs' algbw together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster_accept.vocabulary.rows import Record

# Efficiencies are ratios of measured floats: one exactly at the minimum must not fail by rounding.
_EPSILON = 1e-9


@dataclass(frozen=True)
class ScalingPoint:
    nodes: int
    busbw_gbps: float  # at the largest message size
    gpus_per_node: int


@dataclass(frozen=True)
class ScalingRow(Record):
    """The all-reduce across one node count, as ``scaling.parquet`` holds it (the run placed by the stage)."""

    nodes: int
    gpus: int
    busbw_gbps: float  # per GPU (rank) already, at the largest message size
    algbw_gbps: float | None
    node_algbw_gbps: float | None  # algorithm bandwidth times GPUs per node: per-node throughput
    vs_one_node: float | None
    efficiency: float | None  # busbw relative to the 2-node run
    below_min: bool  # under the profile's scaling_efficiency_min
    run_id: str = ""
    cluster: str = ""


@dataclass(frozen=True)
class TrainingScalingRow(Record):
    """The profile's model trained across one node count, as ``training_scaling.parquet`` holds it."""

    nodes: int
    gpus: int
    group: str | None  # the nodes of the run, folded
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    step_ms: float | None
    tflops_per_gpu: float | None
    mfu: float | None  # None: the GPU's peak is unknown (or CPU)
    efficiency: float | None  # tokens/s per GPU relative to the one-node run
    below_min: bool  # under the profile's training_scaling_efficiency_min
    transport: str | None  # what NCCL used between nodes (NET/IB, NET/Socket ...)
    model: str | None
    run_id: str = ""
    cluster: str = ""


@dataclass(frozen=True)
class ScalingTable:
    rows: list[ScalingRow]  # one per node count, ascending: for scaling.parquet and the report
    below_min: list[int]  # node counts whose efficiency is under the minimum
    efficiency_min: float | None
    ok: bool | None  # None: no minimum, or no 2-node run to measure efficiency against
    detail: str  # one sentence for the report


def sweep_sizes(n: int) -> list[int]:
    """Node counts to run: powers of two from 2 up to ``n``, then ``n`` itself (6 -> [2, 4, 6])."""
    sizes: list[int] = []
    size = 2
    while size <= n:
        sizes.append(size)
        size *= 2
    if n >= 2 and sizes[-1] != n:
        sizes.append(n)
    return sizes


def algbw_gbps(busbw_gbps: float, ranks: int) -> float | None:
    """All-reduce algorithm bandwidth from bus bandwidth; None for one rank (nothing is exchanged)."""
    if ranks < 2:
        return None
    return busbw_gbps * ranks / (2 * (ranks - 1))


def scaling_table(points: Sequence[ScalingPoint], efficiency_min: float | None = None) -> ScalingTable:
    """Rows by node count, efficiency against the 2-node run, and the node counts under ``efficiency_min``."""
    by_nodes: dict[int, ScalingPoint] = {}
    for point in points:
        if point.nodes < 1 or point.gpus_per_node < 1:
            raise ValueError(f"a scaling point needs at least one node and one GPU: {point}")
        if point.nodes in by_nodes:
            raise ValueError(f"two scaling points for {point.nodes} nodes")
        by_nodes[point.nodes] = point
    one = by_nodes.get(1)
    base = by_nodes.get(2)
    rows: list[ScalingRow] = []
    below: list[int] = []
    for nodes in sorted(by_nodes):
        point = by_nodes[nodes]
        gpus = nodes * point.gpus_per_node
        algbw = algbw_gbps(point.busbw_gbps, gpus)
        efficiency = point.busbw_gbps / base.busbw_gbps if base and nodes >= 2 and base.busbw_gbps > 0 else None
        low = efficiency is not None and efficiency_min is not None and efficiency < efficiency_min - _EPSILON
        if low:
            below.append(nodes)
        rows.append(
            ScalingRow(
                nodes=nodes,
                gpus=gpus,
                busbw_gbps=point.busbw_gbps,
                algbw_gbps=algbw,
                node_algbw_gbps=None if algbw is None else algbw * point.gpus_per_node,
                vs_one_node=point.busbw_gbps / one.busbw_gbps if one and one.busbw_gbps > 0 else None,
                efficiency=efficiency,
                below_min=low,
            )
        )
    compared = [r for r in rows if r.efficiency is not None and r.nodes > 2]
    ok = None if efficiency_min is None or not compared else not below
    return ScalingTable(rows, below, efficiency_min, ok, _detail(rows, below, efficiency_min, base is not None, ok))


def _detail(rows: list[ScalingRow], below: list[int], minimum: float | None, has_base: bool, ok: bool | None) -> str:
    if not rows:
        return "no multi-node all-reduce result."
    if not has_base:
        return "no 2-node run to measure scaling efficiency against."
    largest = rows[-1]
    text = f"busbw {largest.busbw_gbps:.1f} GB/s at {largest.nodes} nodes"
    if largest.efficiency is not None and largest.nodes > 2:
        text += f", {100 * largest.efficiency:.0f}% of the 2-node run"
    if minimum is not None and below:
        worst = min((r for r in rows if r.nodes in below), key=lambda r: r.efficiency or 0.0)
        text += (
            f"; under the {100 * minimum:.0f}% minimum at {', '.join(str(n) for n in below)} nodes "
            f"(lowest {100 * (worst.efficiency or 0.0):.0f}% at {worst.nodes})"
        )
    elif minimum is not None and ok:
        text += f"; every size at or above the {100 * minimum:.0f}% minimum"
    return text + "."


@dataclass(frozen=True)
class StepVerdict:
    """One step of the sweep, judged: against the profile's floor and against what the cluster's own smaller
    groups achieved (busbw per rank should hold as a ring grows; a group far below its parts holds a slow
    node or link, with or without an absolute threshold)."""

    nodes: int
    busbw_gbps: float
    ok: bool
    reason: str  # 'ok', 'below_min', 'below_smaller_groups', 'efficiency_low'
    expected: str
    detail: str


def judge_steps(
    points: Sequence[ScalingPoint],
    busbw_min_gbps: float | None,
    straggler_pct: float,
    efficiency_min: float | None = None,
) -> list[StepVerdict]:
    """Every step of the sweep, ascending, with why it is or is not healthy; pure."""
    verdicts: list[StepVerdict] = []
    best: ScalingPoint | None = None
    base = next((p for p in points if p.nodes == 2), None)
    for point in sorted(points, key=lambda p: p.nodes):
        floor = None if best is None else best.busbw_gbps * (1 - straggler_pct / 100)
        efficiency = point.busbw_gbps / base.busbw_gbps if base and base.busbw_gbps > 0 else None
        expected = " and ".join(
            text
            for text in (
                None if busbw_min_gbps is None else f">= {busbw_min_gbps:g} GB/s",
                None
                if floor is None or best is None
                else f">= {floor:.3g} GB/s ({best.nodes}-node group less {straggler_pct:g}%)",
            )
            if text
        )
        said = f"{point.busbw_gbps:.3g} GB/s per rank at {point.nodes} nodes"
        if busbw_min_gbps is not None and point.busbw_gbps < busbw_min_gbps:
            reason = "below_min"
        elif floor is not None and point.busbw_gbps < floor:
            reason = "below_smaller_groups"
        elif efficiency is not None and efficiency_min is not None and efficiency < efficiency_min - _EPSILON:
            reason, expected = "efficiency_low", f"efficiency >= {efficiency_min:g} of the 2-node run"
            said += f", efficiency {efficiency:.3f}"
        else:
            reason = "ok"
        verdicts.append(
            StepVerdict(point.nodes, point.busbw_gbps, reason == "ok", reason, expected or "completed", said)
        )
        if best is None or point.busbw_gbps > best.busbw_gbps:
            best = point
    return verdicts
