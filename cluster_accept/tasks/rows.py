"""Check rows of every stage in one shape (:class:`~cluster_accept.checks.base.NodeRow`), node text cut to fit.

Node text reaches a row masked where it entered the controller (``remote/``: ``vocabulary.secrets.MaskedText``),
and a check's own words around it quote the profile only as the check masked it where it wrote it: a row cuts,
it does not mask again."""

from __future__ import annotations

import functools

from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.reasons import TOOL_CHECK
from cluster_accept.vocabulary.text import keep_head

RAW_OUTPUT_LIMIT = 64 * 1024
# A row's observed, expected and detail: a value or a sentence, never a file. A node's file read whole (a
# sysfs or proc file gone wrong) is cut here, the cut said, so a row never carries megabytes in each column.
FIELD_LIMIT = 16 * 1024
NODE_TEXT = ("raw_output", "observed", "expected", "detail")  # node output: secrets masked where it entered


def node_row(
    run_id: str, cluster: str, stage: str, node: str, row: CheckRow, raw: str = "", command: str = ""
) -> NodeRow:
    """``command``: the node-side command whose output is the row's evidence (what reproduces it)."""
    cut = {
        name: None if text is None else keep_head(text, FIELD_LIMIT)
        for name, text in {"observed": row.observed, "expected": row.expected, "detail": row.detail}.items()
    }
    return NodeRow(
        run_id=run_id,
        cluster=cluster,
        stage=stage,
        node=node,
        check=row.check,
        item=row.item,
        status=row.status,
        reason=row.reason,
        observed=cut["observed"],
        expected=cut["expected"],
        detail=cut["detail"] or "",
        gpu=row.gpu,
        raw_output=_evidence(raw),
        command=command,
    )


@functools.lru_cache(maxsize=16)
def _evidence(raw: str) -> str:
    """A command's output as a row keeps it: cut (masked where it entered the controller, so that no secret is
    cut in two). Every row of a check shares its command's output, so it is cut once."""
    return keep_head(raw, RAW_OUTPUT_LIMIT)


def tool_error_row(detail: str) -> tuple[CheckRow, str]:
    """The row of a node the controller failed on (:data:`~checks.reasons.TOOL_CHECK`), and its evidence: the
    first line of ``detail`` (the exception) says what, the rest (the traceback) is kept as the raw output."""
    what, _, traceback = detail.partition("\n")
    return CheckRow(TOOL_CHECK, "controller", Status.ERROR, "internal_error", None, None, what), traceback


def unreachable_row(cause: str | None, detail: str) -> CheckRow:
    """The row of a node no session could be opened to, in any stage: the cause is the reason code."""
    reason = cause or "unknown"
    return CheckRow("ssh", "connect", Status.UNREACHABLE, reason, reason, "reachable", detail)
