"""The training probe's part of the report: tokens/s per node (stragglers drawn bad) with the per-node table the
seed reports print, and the scaling table across nodes (nodes, GPUs, tokens/s, per GPU, efficiency, MFU) with
its chart. Pure; drawing is in :mod:`reports.charts`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup

from cluster_accept.probes.contract import GOOD, Bar, Measurement, Ref, ReportSection, ReportView, Table, bar_chart
from cluster_accept.reports import figures

CHECK = "training"
PER_GPU = "training_tokens_per_s_per_gpu"
SCALING_TABLE = "training_scaling"
KEY = "training_tokens_per_s_per_gpu_min"


def _single_node(view: ReportView) -> list[Measurement]:
    return [m for m in view.measurements if m.stage == "single-node" and m.probe == CHECK]


def _per_node(figures: Sequence[Measurement]) -> dict[str, dict[str, Any]]:
    """node -> its figures: node-level ones by metric, and its GPUs' solo throughputs."""
    nodes: dict[str, dict[str, Any]] = {}
    for m in figures:
        entry = nodes.setdefault(m.node, {"solo": {}})
        if m.metric == "training_solo_tokens_per_s" and m.gpu is not None:
            entry["solo"][m.gpu] = m.value
        elif m.gpu is None:
            entry[m.metric] = m.value
            entry["model"] = m.model
            entry["world_size"] = m.world_size
    return nodes


def _bad_nodes(view: ReportView) -> set[str]:
    return {str(r.node) for r in view.rows if r.check == CHECK and r.status not in GOOD}


def node_chart(view: ReportView) -> Markup | None:
    nodes = {n: e for n, e in _per_node(_single_node(view)).items() if PER_GPU in e}
    if not nodes:
        return None
    bad = _bad_nodes(view)
    bars = [Bar(node, e[PER_GPU], node in bad) for node, e in sorted(nodes.items())]
    refs = [Ref("median", statistics.median(b.value for b in bars))]
    floors = {float(t[KEY]) for t in view.thresholds.values() if t.get(KEY) is not None}
    if len(floors) == 1:
        refs.append(Ref("threshold", floors.pop(), "threshold"))
    return bar_chart("training", f"Training tokens/s per GPU, per node ({len(bars)} nodes)", bars, "tokens/s", refs)


def node_table(view: ReportView) -> Table | None:
    """One row per node, slowest first: GPUs, tokens/s, per GPU, TFLOP/s per GPU, MFU, step time, its slowest
    GPU's own throughput against its fastest, and its data-parallel efficiency (together over solo)."""
    nodes = {n: e for n, e in _per_node(_single_node(view)).items() if PER_GPU in e}
    if not nodes:
        return None
    rows = []
    for node, e in nodes.items():
        solo = e["solo"]
        slowest = min(solo, key=lambda g: solo[g]) if solo else None
        spread = 100 * (1 - solo[slowest] / max(solo.values())) if slowest is not None else None
        rows.append(
            (
                node,
                e.get("world_size"),
                e.get("training_tokens_per_s"),
                e[PER_GPU],
                e.get("training_tflops_per_gpu"),
                e.get("training_mfu"),
                e.get("training_step_ms"),
                slowest,
                spread,
                e.get("training_dp_efficiency"),
            )
        )
    rows.sort(key=lambda r: (r[3], r[0]))
    models = sorted({str(e.get("model")) for e in nodes.values()})
    columns = (
        "node", "GPUs", "tokens/s", "per GPU", "TFLOP/s per GPU", "MFU", "step ms", "slowest GPU", "gap %",
        "together / solo",
    )  # fmt: skip
    title = (
        f"Training per node, slowest first ({'; '.join(models)}); gap: slowest GPU's own speed below fastest; "
        "together / solo: per GPU over the slowest GPU's own speed"
    )
    return Table(title, columns, tuple(rows), "training-table")


def scaling_table(scaling: Sequence[Mapping[str, Any]]) -> Table | None:
    if not scaling:
        return None
    rows = tuple(
        (
            str(r["nodes"]),
            r.get("gpus"),
            r.get("tokens_per_s"),
            r.get("tokens_per_s_per_gpu"),
            None if r.get("efficiency") is None else 100 * float(r["efficiency"]),
            r.get("mfu"),
            r.get("step_ms"),
        )
        for r in sorted(scaling, key=lambda r: int(r["nodes"]))
    )
    transports = sorted({str(r.get("transport")) for r in scaling if r.get("transport")})
    models = sorted({str(r.get("model")) for r in scaling if r.get("model")})
    said = f"; NCCL between nodes: {', '.join(transports)}" if transports else ""
    title = f"Training scaling across nodes ({'; '.join(models)}){said}; efficiency = per GPU vs one node, %"
    columns = ("nodes", "GPUs", "tokens/s", "per GPU", "efficiency %", "MFU", "step ms")
    return Table(title, columns, rows, "training-scaling")


def scaling_chart(scaling: Sequence[Mapping[str, Any]], efficiency_min: float | None) -> Markup | None:
    """The sweep's efficiency against one node: drawn from two points on (one point is the baseline itself)."""
    title = "Training scaling efficiency (tokens/s per GPU relative to one node)"
    return figures.scaling_chart(scaling, efficiency_min, "training-scaling", title, "training", min_points=2)


def training_section(view: ReportView) -> ReportSection | None:
    scaling = list(view.tables.get(SCALING_TABLE, ()))
    key = "training_scaling_efficiency_min"
    minimum = next((t[key] for t in view.thresholds.values() if t.get(key) is not None), None)
    charts = tuple(c for c in (node_chart(view), scaling_chart(scaling, minimum)) if c is not None)
    tables = tuple(t for t in (node_table(view), scaling_table(scaling)) if t is not None)
    if not charts and not tables:
        return None
    return ReportSection("training", charts, tables[0] if tables else None, tables[1:])
