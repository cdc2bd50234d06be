"""From a run's rows to the report's charts and tables: which metric each chart shows, which bars are bad,
where the median and threshold lines go. Pure; the drawing is in :mod:`reports.charts`.

A GPU node reports ``gemm_bf16_tflops`` and ``hbm_copy_gbps``; a CPU-mode node (the test-bed) reports
``gemm_bf16_gflops`` and ``mem_copy_gbps``: each chart takes the first metric of its family that the run has.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from cluster_accept.checks.base import Status
from cluster_accept.reports.charts import Bar, Ref, Series, bar_chart, line_chart, sparkline
from cluster_accept.vocabulary.rows import Measurement

GOOD = {Status.PASS, Status.SKIP, Status.NOT_JUDGED}  # not a bad bar: nothing said it was bad


@dataclass(frozen=True)
class ReportView:
    """What a probe's report contribution is drawn from: the run's figures, its check rows (to mark the bad
    bars) and each profile's thresholds (the threshold lines)."""

    measurements: Sequence[Measurement] = ()
    rows: Sequence[Any] = ()
    thresholds: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # profile -> Thresholds fields
    tables: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)  # the run's other tables


@dataclass(frozen=True)
class Table:
    """A table for the report: a header row, then rows whose first cell is text and the others numbers."""

    title: str  # the Markdown heading; the HTML caption below the table
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    table_id: str = ""


@dataclass(frozen=True)
class ReportSection:
    """One probe's part of the report's measurements: its charts, then its table (and any more)."""

    section_id: str
    charts: tuple[Markup, ...] = ()
    table: Table | None = None
    more_tables: tuple[Table, ...] = ()

    @property
    def tables(self) -> tuple[Table, ...]:
        return ((self.table,) if self.table is not None else ()) + self.more_tables


def _single_node(measurements: Sequence[Measurement]) -> list[Measurement]:
    return [m for m in measurements if m.stage == "single-node"]


def _pick(measurements: Sequence[Measurement], family: Sequence[str]) -> str | None:
    present = {m.metric for m in measurements}
    return next((metric for metric in family if metric in present), None)


def _bad_items(rows: Sequence[Any], check: str) -> set[tuple[str, int | None]]:
    """(node, gpu) pairs with a non-passing row of ``check``; gpu None marks the whole node."""
    return {(str(r.node), r.gpu) for r in rows if r.check == check and r.status not in GOOD}


def _thresholds(key: str | None, thresholds: Mapping[str, Mapping[str, Any]], profiles: set[str]) -> list[Ref]:
    """Threshold lines from the profiles' ``key`` (one line when every profile agrees)."""
    if key is None:
        return []
    values = {p: thresholds.get(p, {}).get(key) for p in sorted(profiles)}
    found = {v for v in values.values() if v is not None}
    if len(found) == 1:
        return [Ref("threshold", float(found.pop()), "threshold")]
    return [Ref(f"threshold ({p})", float(v), "threshold") for p, v in values.items() if v is not None]


def _label(m: Measurement) -> str:
    return f"{m.node}/gpu{m.gpu}" if m.gpu is not None else m.node


def per_gpu_chart(chart_id: str, family: Mapping[str, str | None], check: str, view: ReportView) -> Markup | None:
    """Bars of the first metric of ``family`` (metric -> the profile key of its threshold) the run has, one
    per GPU; a GPU with a non-passing row of ``check`` drawn bad; median and threshold lines."""
    figures = _single_node(view.measurements)
    metric = _pick(figures, list(family))
    if metric is None:
        return None
    chosen = sorted((m for m in figures if m.metric == metric), key=lambda m: (m.node, m.gpu or 0))
    bad = _bad_items(view.rows, check)
    bars = [Bar(_label(m), m.value, (m.node, m.gpu) in bad or (m.node, None) in bad) for m in chosen]
    refs = [Ref("median", statistics.median(b.value for b in bars))]
    refs += _thresholds(family[metric], view.thresholds, {m.profile or "" for m in chosen})
    unit = chosen[0].unit or ""
    return bar_chart(chart_id, f"{metric} per GPU ({len(bars)} GPUs)", bars, unit, refs)


def size_sweep_chart(
    chart_id: str, title: str, metric: str, threshold: str | None, check: str, view: ReportView
) -> Markup | None:
    """One line per node of ``metric`` against message size (log scale), nodes with a bad ``check`` row
    drawn bad; the profile's threshold as a line."""
    figures = [m for m in _single_node(view.measurements) if m.metric == metric and m.size]
    if not figures:
        return None
    bad_nodes = {node for node, _ in _bad_items(view.rows, check)}
    by_node: dict[str, list[tuple[float, float]]] = {}
    for m in figures:
        by_node.setdefault(m.node, []).append((float(m.size or 0), m.value))
    series = [Series(node, tuple(points), node in bad_nodes) for node, points in sorted(by_node.items())]
    refs = _thresholds(threshold, view.thresholds, {m.profile or "" for m in figures})
    unit = figures[0].unit or ""
    return line_chart(
        chart_id,
        f"{title} ({len(series)} nodes)",
        series,
        unit,
        "message size",
        log2_x=True,
        refs=refs,
        x_text="bytes",
    )


def scaling_chart(
    scaling: Sequence[Mapping[str, Any]],
    efficiency_min: float | None,
    chart_id: str = "scaling",
    title: str = "Scaling efficiency (bus bandwidth relative to 2 nodes)",
    name: str = "efficiency",
    min_points: int = 1,
) -> Markup | None:
    """Efficiency (%) against node count from scaling rows (``nodes``, ``efficiency``, ``below_min``), the
    profile's minimum as a line; None with fewer than ``min_points`` points."""
    points = [(float(r["nodes"]), 100 * float(r["efficiency"])) for r in scaling if r.get("efficiency") is not None]
    if len(points) < max(1, min_points):
        return None
    refs = [Ref("minimum", 100 * efficiency_min, "threshold")] if efficiency_min is not None else []
    bad = any(r.get("below_min") for r in scaling)
    return line_chart(chart_id, title, [Series(name, tuple(sorted(points)), bad)], "%", "nodes", refs=refs)


def isolation_chart(isolation: Sequence[Mapping[str, Any]]) -> Markup | None:
    """Bus bandwidth per all-reduce isolation group (training isolation rounds are in the table: tokens/s)."""
    isolation = [r for r in isolation if (r.get("signal") or "allreduce") == "allreduce"]
    if not isolation:
        return None
    bars = [
        Bar(f"r{r['round']} {r['phase']} {r['nodes']}", float(r["busbw_gbps"] or 0.0), bool(r["bad"]))
        for r in isolation
    ]
    limits = {float(r["threshold_gbps"]) for r in isolation if r.get("threshold_gbps") is not None}
    refs = [Ref("threshold", max(limits), "threshold")] if limits else []
    return bar_chart("isolation", f"Isolation rounds: bus bandwidth per group ({len(bars)} runs)", bars, "GB/s", refs)


def gpu_table(measurements: Sequence[Measurement], family: Sequence[str], table_id: str = "") -> Table | None:
    """The per-node table of the first metric of ``family`` the run has, one column per GPU, worst node
    first (the seed reports found half-speed nodes only with such a table)."""
    figures = _single_node(measurements)
    metric = _pick(figures, family)
    if metric is None:
        return None
    per_node: dict[str, dict[int, float]] = {}
    for m in figures:
        if m.metric == metric:
            per_node.setdefault(m.node, {})[m.gpu or 0] = m.value
    gpus = sorted({g for values in per_node.values() for g in values})
    rows = sorted(
        (
            (node, *[values.get(g) for g in gpus], min(values.values()), statistics.median(values.values()))
            for node, values in per_node.items()
        ),
        key=lambda r: (r[-2], r[0]),
    )
    unit = next(m.unit or "" for m in figures if m.metric == metric)
    columns = ("node", *[f"GPU {g}" for g in gpus], "min", "median")
    return Table(f"{metric} per GPU ({unit}), worst node first", columns, tuple(rows), table_id)


def history_rows(trends: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per node and metric with past runs: previous median, current value, change, sparkline."""
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for t in trends:
        grouped.setdefault((str(t["node"]), str(t["metric"])), []).append(t)
    out = []
    for (node, metric), items in sorted(grouped.items()):
        past = [float(t["value"]) for t in items if not t["current"]]
        now = [float(t["value"]) for t in items if t["current"]]
        if not past:
            continue
        previous = statistics.median(past)
        current = now[-1] if now else None
        change = None if current is None or previous == 0 else 100 * (current - previous) / previous
        out.append(
            {
                "node": node,
                "metric": metric,
                "unit": items[0].get("unit") or "",
                "runs": len(past),
                "previous_median": previous,
                "current": current,
                "change_pct": change,
                "values": past + ([current] if current is not None else []),
                "sparkline": sparkline(past + ([current] if current is not None else []), current is not None),
            }
        )
    return out
