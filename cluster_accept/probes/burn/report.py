"""The burn in the report: charts per node of each GPU's throughput and temperature over the burn (the GPUs judged
bad drawn on top), and a table of every GPU that did not hold, worst first. Pure; the drawing is in
:mod:`reports.charts`.

A cluster of thousands of nodes would give thousands of charts: up to :data:`ALL_CHARTS_UP_TO` nodes each gets
its chart; beyond that only nodes with a finding do, at most that many (the rest counted in the caption; the
table names every GPU that did not hold).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup

from cluster_accept.probes.contract import GOOD, Reason, ReportSection, ReportView, Series, Status, Table, line_chart

CHECK = "burn"
ALL_CHARTS_UP_TO = 64  # (the stage hands over each GPU's line thinned to 60 points)


def _bad_gpus(rows: Sequence[Any]) -> dict[str, set[int]]:
    bad: dict[str, set[int]] = {}
    for row in rows:
        if row.check == CHECK and row.status not in GOOD and row.gpu is not None:
            bad.setdefault(row.node, set()).add(int(row.gpu))
    return bad


def node_chart(node: str, series: Sequence[Mapping[str, Any]], bad: set[int]) -> Markup | None:
    """Each GPU's throughput over the burn (the GPUs judged bad drawn on top)."""
    lines = _lines(series, "throughput", "value")
    if not lines:
        return None
    unit = next((str(r["unit"]) for r in series if r.get("kind") == "throughput" and r.get("unit")), "")
    drawn = [Series(f"GPU {g}", tuple(sorted(p)), g in bad) for g, p in sorted(lines.items())]
    title = f"{node}: throughput per GPU under sustained load" + (
        f" (GPU {', '.join(map(str, sorted(bad)))} judged bad)" if bad else ""
    )
    return line_chart(f"burn-{node}", title, drawn, unit, "seconds into the burn")


def temperature_chart(node: str, series: Sequence[Mapping[str, Any]], bad: set[int]) -> Markup | None:
    """Each GPU's temperature over the burn: a GPU running hotter than its neighbours stands apart."""
    lines = _lines(series, "sample", "temp_c")
    if len(lines) < 2:
        return None
    drawn = [Series(f"GPU {g}", tuple(sorted(p)), g in bad) for g, p in sorted(lines.items())]
    return line_chart(f"burn-temp-{node}", f"{node}: temperature per GPU under sustained load", drawn, "°C",
                      "seconds into the burn")  # fmt: skip


def _lines(series: Sequence[Mapping[str, Any]], kind: str, column: str) -> dict[int, list[tuple[float, float]]]:
    lines: dict[int, list[tuple[float, float]]] = {}
    for record in series:
        value = record.get(column)
        if record.get("kind") == kind and value is not None and value == value:
            lines.setdefault(int(record["gpu"]), []).append((float(record["t_s"]), float(value)))
    return lines


def burn_section(view: ReportView, reasons: Mapping[str, Reason]) -> ReportSection | None:
    """Charts per node and the table of GPUs that did not hold; None when no burn ran."""
    rows = [r for r in view.rows if r.check == CHECK]
    if not rows:
        return None
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for record in view.tables.get("burn", ()):
        by_node.setdefault(str(record["node"]), []).append(record)
    bad = _bad_gpus(rows)
    chosen = sorted(by_node) if len(by_node) <= ALL_CHARTS_UP_TO else sorted(bad)[:ALL_CHARTS_UP_TO]
    drawn = [(node, by_node[node], bad.get(node, set())) for node in chosen]
    charts = tuple(c for args in drawn for c in (node_chart(*args), temperature_chart(*args)) if c is not None)
    findings = sorted(
        (r for r in rows if r.status not in GOOD),
        key=lambda r: (reasons[r.reason].severity != Status.FAIL if r.reason in reasons else True, r.node, r.gpu or 0),
    )
    table = Table(
        f"Burn: GPUs that did not hold ({len(findings)}; charts for {len(charts)} of {len(by_node)} nodes)",
        ("node", "GPU", "reason", "measured", "expected"),
        tuple((r.node, r.gpu, r.reason, r.observed, r.expected) for r in findings),
        "burn-table",
    )
    return ReportSection("burn", charts, table)
