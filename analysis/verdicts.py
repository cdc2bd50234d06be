"""Node verdicts from check rows, and cross-cluster differences folded into node sets. Pure functions.

A node is *unreachable* when no session could be opened, *rejected* when any row failed, errored or timed
out, *accepted* otherwise (warnings are reported, not rejected), *skipped* when the inventory excludes it.
Reasons name the check first (``driver:version_mismatch``) so an operator can filter on the check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cluster_accept.checks.base import BAD_STATUSES, Status
from cluster_accept.inventory.hostlist import describe_folded, fold_values


class Verdict:
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    UNREACHABLE = "unreachable"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    verdict: str
    reasons: list[str]


def node_verdict(node: str, rows: Iterable[Mapping[str, object]], excluded: bool = False) -> NodeVerdict:
    """``rows``: this node's check rows (dicts with check, reason, status)."""
    if excluded:
        return NodeVerdict(node, Verdict.SKIPPED, ["excluded_in_inventory"])
    reasons: list[str] = []
    unreachable = False
    for row in rows:
        status = Status(str(row["status"]))
        if status not in BAD_STATUSES:
            continue
        if status is Status.UNREACHABLE:
            unreachable = True
        reason = f"{row['check']}:{row['reason']}"
        if reason not in reasons:
            reasons.append(reason)
    if unreachable:
        return NodeVerdict(node, Verdict.UNREACHABLE, reasons)
    if reasons:
        return NodeVerdict(node, Verdict.REJECTED, reasons)
    return NodeVerdict(node, Verdict.ACCEPTED, [])


def differences(per_node: Mapping[str, Mapping[str, str]]) -> list[tuple[str, str]]:
    """Keys whose value is not the same on every node: ``[("driver_version", "580.159.04 on node[1-7]; …")]``."""
    keys = sorted({key for values in per_node.values() for key in values})
    found = []
    for key in keys:
        values = {node: vals[key] for node, vals in per_node.items() if key in vals}
        if len(set(values.values())) > 1:
            found.append((key, describe_folded(values)))
    return found


def fold_by(values: Mapping[str, str]) -> list[tuple[str, str]]:
    """``{node: verdict}`` → ``[("accepted", "node[01-05]"), ...]``, ordered by value."""
    return sorted((value, nodes) for value, nodes, _ in fold_values(values))
