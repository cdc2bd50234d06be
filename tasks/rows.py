"""Check rows as written to ``checks.parquet``: the same shape for every stage."""

from __future__ import annotations

from typing import Any

from cluster_accept.analysis.secrets import mask_row
from cluster_accept.checks.base import CheckRow, Status

RAW_OUTPUT_LIMIT = 64 * 1024
NODE_TEXT = ("raw_output", "observed", "expected", "detail")  # node output: secrets masked on the way in


def row_dict(
    run_id: str, cluster: str, stage: str, node: str, row: CheckRow, raw: str, command: str = ""
) -> dict[str, Any]:
    """``command``: the node-side command whose output is the row's evidence (what reproduces it)."""
    record: dict[str, Any] = {
        "run_id": run_id,
        "cluster": cluster,
        "stage": stage,
        "node": node,
        "gpu": row.gpu,
        "check": row.check,
        "item": row.item,
        "status": row.status.value,
        "reason": row.reason,
        "observed": row.observed,
        "expected": row.expected,
        "detail": row.detail,
        "raw_output": raw[:RAW_OUTPUT_LIMIT],
        "command": command,
    }
    return {**record, **mask_row(row.item, {k: record[k] for k in NODE_TEXT})}


def unreachable_row(cause: str | None, detail: str) -> CheckRow:
    """The row of a node no session could be opened to, in any stage: the cause is the reason code."""
    reason = cause or "unknown"
    return CheckRow("ssh", "connect", Status.UNREACHABLE, reason, reason, "reachable", detail)
