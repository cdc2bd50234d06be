"""Check rows of every stage in one shape (:class:`~cluster_accept.checks.base.NodeRow`), node text masked."""

from __future__ import annotations

from cluster_accept.analysis.secrets import mask_row
from cluster_accept.checks.base import CheckRow, NodeRow, Status

RAW_OUTPUT_LIMIT = 64 * 1024
NODE_TEXT = ("raw_output", "observed", "expected", "detail")  # node output: secrets masked on the way in


def node_row(
    run_id: str, cluster: str, stage: str, node: str, row: CheckRow, raw: str = "", command: str = ""
) -> NodeRow:
    """``command``: the node-side command whose output is the row's evidence (what reproduces it)."""
    text = {"raw_output": raw[:RAW_OUTPUT_LIMIT], "observed": row.observed, "expected": row.expected}
    masked = mask_row(row.item, {**text, "detail": row.detail})
    return NodeRow(
        run_id=run_id,
        cluster=cluster,
        stage=stage,
        node=node,
        check=row.check,
        item=row.item,
        status=row.status,
        reason=row.reason,
        observed=masked["observed"],
        expected=masked["expected"],
        detail=masked["detail"] or "",
        gpu=row.gpu,
        raw_output=masked["raw_output"] or "",
        command=command,
    )


def unreachable_row(cause: str | None, detail: str) -> CheckRow:
    """The row of a node no session could be opened to, in any stage: the cause is the reason code."""
    reason = cause or "unknown"
    return CheckRow("ssh", "connect", Status.UNREACHABLE, reason, reason, "reachable", detail)
