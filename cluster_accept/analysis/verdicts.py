"""Node verdicts from check rows, and cross-cluster differences folded into node sets. Pure functions.

A node is *unreachable* when no session could be opened (or it went away mid-run), *rejected* when any row
failed, errored or timed out, *accepted* otherwise (warnings are reported, not rejected), *skipped* when the
inventory excludes it, and *tool_error* when the only findings are the tool's own failures on the controller
(``tool:internal_error``): nothing is known against the node, so it is neither accepted nor rejected.
Reasons name the check first (``driver:version_mismatch``) so an operator can filter on the check.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster_accept.analysis.causes import cause_first, causes_of_failures, explain, node_cause
from cluster_accept.checks.base import BAD_STATUSES, NodeRow, Status
from cluster_accept.checks.declarations import Link
from cluster_accept.checks.reasons import TOOL_CHECK
from cluster_accept.inventory.hostlist import describe_folded, fold_values
from cluster_accept.vocabulary.rows import KEY_PREFIX, NodeValue, ValueKind


class Verdict(str, enum.Enum):
    """A node's outcome in a run; its value is what Parquet, JSON and the report say."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    UNREACHABLE = "unreachable"
    SKIPPED = "skipped"
    TOOL_ERROR = "tool_error"  # the tool failed on the controller for this node: not judged, never drained


NOT_ACCEPTED = frozenset({Verdict.REJECTED, Verdict.UNREACHABLE})


@dataclass(frozen=True)
class VerdictRow:
    """One node's verdict in one run, as ``verdicts.parquet`` holds it: typed up to the edge where it becomes
    a record (:meth:`record`)."""

    run_id: str
    cluster: str
    node: str
    profile: str
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)
    cause: str = ""  # the likeliest cause of the worst finding, in words (:mod:`analysis.causes`)

    def record(self) -> dict[str, Any]:
        """The Parquet/JSON record: the verdict as its value."""
        return {
            "run_id": self.run_id,
            "cluster": self.cluster,
            "node": self.node,
            "profile": self.profile,
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "cause": self.cause,
        }


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    verdict: Verdict
    reasons: list[str]
    cause: str = ""

    def row(self, run_id: str, cluster: str, profile: str) -> VerdictRow:
        """This verdict as the run's row for ``verdicts.parquet``."""
        return VerdictRow(run_id, cluster, self.node, profile, self.verdict, list(self.reasons), self.cause)


def node_verdict(node: str, rows: Iterable[NodeRow], links: Sequence[Link], excluded: bool = False) -> NodeVerdict:
    """``rows``: this node's check rows. Reasons come cause first: a finding that explains another (a setting,
    a foreign process) before the figures it explains, by the ``links`` the stages declare
    (:mod:`analysis.causes`)."""
    if excluded:
        return NodeVerdict(node, Verdict.SKIPPED, ["excluded_in_inventory"])
    rows = list(rows)
    bad = [r for r in rows if r.status in BAD_STATUSES]
    if not bad:
        return NodeVerdict(node, Verdict.ACCEPTED, [])
    explained = explain(rows, links)
    named = causes_of_failures(rows, explained)
    ordered = cause_first(rows, explained)
    reasons = list(dict.fromkeys(r.code for r in ordered if r.status in BAD_STATUSES or r in named))
    verdict = Verdict.UNREACHABLE if any(r.status == Status.UNREACHABLE for r in bad) else Verdict.REJECTED
    if all(r.check == TOOL_CHECK for r in bad):
        verdict = Verdict.TOOL_ERROR
    return NodeVerdict(node, verdict, reasons, node_cause(rows, explained))


def is_accepted(rows: Iterable[NodeRow]) -> bool:
    """Whether rows like these leave a node accepted (no fail, error, timeout or unreachable row): the verdict
    without its reasons, for a stage choosing which nodes to measure next."""
    return not any(r.status in BAD_STATUSES for r in rows)


COUNTER = KEY_PREFIX[ValueKind.COUNTER]  # node_values keys holding error counters (compared with the previous run)
MARK = KEY_PREFIX[ValueKind.MARK]  # node_values keys holding where a check's reading ended (read by the next run)


def is_compared(key: str) -> bool:
    """A ``node_values`` key compared across nodes: neither an error counter nor a mark."""
    return not key.startswith((COUNTER, MARK))


def values_by_node(values: Iterable[NodeValue], counters: bool = False) -> dict[str, dict[str, str]]:
    """node -> {``check.key``: value} of a run's node values: the values compared across nodes, or with
    ``counters`` the error counters (keyed ``check.counter:name``), which differ between healthy nodes and are
    compared with each node's own history instead."""
    wanted = ValueKind.COUNTER if counters else ValueKind.COMPARED
    found: dict[str, dict[str, str]] = {}
    for v in values:
        if v.kind is wanted:
            found.setdefault(v.node, {})[f"{v.check}.{v.stored_key}"] = v.value
    return found


def marks_by_node(values: Iterable[NodeValue]) -> dict[str, dict[str, dict[str, str]]]:
    """node -> check -> {mark: value} of node values: where each check's reading of the node ended."""
    found: dict[str, dict[str, dict[str, str]]] = {}
    for v in values:
        if v.kind is ValueKind.MARK:
            found.setdefault(v.node, {}).setdefault(v.check, {})[v.key] = v.value
    return found


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
    """``{node: verdict}`` → ``[("accepted", "node[01-05]"), ...]``, ordered by value (plain strings: a
    verdict's ``.value``)."""
    return sorted((value, nodes) for value, nodes, _ in fold_values(values))
