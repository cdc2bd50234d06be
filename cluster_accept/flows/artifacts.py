"""The run's summary on the Prefect flow run: the verdict table as a table artifact, the summary as a
markdown artifact, and a link to the report file, so whoever watches Prefect's UI sees the outcome there.

Artifacts are a view, not the record: Prefect's ephemeral database may lose them, the run directory keeps
everything. A failure to publish is logged and never fails the run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow, fold_by
from cluster_accept.vocabulary.text import visible

log = logging.getLogger(__name__)


def artifact_key(cluster: str, what: str) -> str:
    """Prefect keys allow lowercase letters, digits and dashes; one key per cluster keeps its history."""
    slug = re.sub(r"[^a-z0-9-]+", "-", cluster.lower()).strip("-") or "cluster"
    return f"{slug}-{what}"


def _cell(text: str) -> str:
    """Text from nodes in one Markdown table cell: no row or column breaks, no markup, no raw control characters
    (shown as escapes), kept short."""
    escaped = re.sub(r"([\\`*_\[\]<>])", r"\\\1", " ".join(visible(text).split()))
    return escaped.replace("|", "\\|")[:400]


def summary_markdown(run: Mapping[str, Any], verdicts: Sequence[VerdictRow], report: Path) -> str:
    counts = {v: sum(1 for r in verdicts if r.verdict == v) for v in Verdict}
    lines = [
        f"# Acceptance of {run['cluster']}: run {run['run_id']}",
        "",
        f"accepted **{counts[Verdict.ACCEPTED]}** / rejected **{counts[Verdict.REJECTED]}** / "
        f"unreachable **{counts[Verdict.UNREACHABLE]}**",
        "",
    ]
    bad = [v for v in verdicts if v.verdict in NOT_ACCEPTED or v.verdict == Verdict.TOOL_ERROR]
    if bad:
        lines += ["| node | verdict | reasons | cause |", "|---|---|---|---|"]
        lines += [f"| {v.node} | {v.verdict.value} | {', '.join(v.reasons)} | {_cell(v.cause)} |" for v in bad]
    else:
        lines.append("Every tested node accepted.")
    sets = "; ".join(f"{verdict} {nodes}" for verdict, nodes in fold_by({v.node: v.verdict.value for v in verdicts}))
    lines += ["", f"Nodes: {sets}", "", f"Report: [{report}]({report.resolve().as_uri()})"]
    return "\n".join(lines) + "\n"


def publish(run: Mapping[str, Any], verdicts: Sequence[VerdictRow], report: Path) -> bool:
    """Create the three artifacts on the current flow run; False (and a warning) when Prefect refused."""
    cluster = str(run["cluster"])
    table = [
        {
            "node": v.node,
            "profile": v.profile,
            "verdict": v.verdict.value,
            "reasons": ", ".join(v.reasons),
            "cause": v.cause,
        }
        for v in verdicts
    ]
    try:
        create_table_artifact(
            table=table, key=artifact_key(cluster, "verdicts"), description=f"Node verdicts of run {run['run_id']}"
        )
        create_markdown_artifact(
            markdown=summary_markdown(run, verdicts, report),
            key=artifact_key(cluster, "summary"),
            description=f"Acceptance summary of run {run['run_id']}",
        )
        create_link_artifact(
            link=report.resolve().as_uri(),
            link_text="report.html",
            key=artifact_key(cluster, "report"),
            description=f"The HTML report of run {run['run_id']}",
        )
    except Exception as exc:  # noqa: BLE001 - artifacts are a view; the run directory is the record
        log.warning("could not publish Prefect artifacts: %s", exc)
        return False
    return True
