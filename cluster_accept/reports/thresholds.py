"""The report's table of relative thresholds: beside each, the noise it rests on and the false rejections to
expect from it per run (:mod:`analysis.thresholds_said`). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from cluster_accept.analysis.thresholds_said import ThresholdSaid
from cluster_accept.reports.figures import ReportSection, Table

SECTION_ID = "thresholds"
TITLE = (
    "Relative thresholds: a figure is below its peers' median only when it falls short by the margin, "
    "max(straggler_pct, noise_k × its noise); between straggler_pct and the margin it is inconclusive (a "
    "warning). False rejections per run: the figures judged × the chance a healthy one of that noise crosses "
    "the margin"
)
COLUMNS = (
    "metric", "stage", "profile", "size tier", "straggler_pct", "noise_k", "noise", "noise source", "margin",
    "figures judged", "false rejections a run",
)  # fmt: skip


def _cells(row: ThresholdSaid) -> tuple[str, ...]:
    noise = f"{row.noise_pct:.2f}%" if row.noise_pct is not None else "unknown"
    expected = f"{row.expected_false_rejections:.2g}" if row.expected_false_rejections is not None else "unknown"
    return (
        row.metric, row.stage, row.profile, row.size_tier or "-", f"{row.straggler_pct:g}%", f"{row.noise_k:g}",
        noise, row.noise_source, f"{row.margin_pct:.1f}%", str(row.comparisons), expected,
    )  # fmt: skip


def thresholds_section(rows: Sequence[ThresholdSaid]) -> ReportSection | None:
    """The table, or None where the run judged no figure against its peers."""
    if not rows:
        return None
    table = Table(TITLE, COLUMNS, tuple(_cells(row) for row in rows), "thresholds-table")
    return ReportSection(SECTION_ID, (), table)
